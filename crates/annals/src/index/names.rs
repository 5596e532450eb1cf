//! Type and tag names to ids: a map split into shards, and interning.

use super::*;

pub(super) type Map<K, V> = HashMap<K, V, RandomState>;

/// Tables a [`NameMap`] is split into.
pub(super) const NAME_SHARDS: usize = 64;

/// Type or tag names to ids, split by hash into [`NAME_SHARDS`] tables. A hash table doubles
/// when it fills, moving every entry while the writer holds the index lock (readers wait): one
/// table of 229,000 tags took 19 ms to double, and a store with millions of tags would stop
/// for a second. A shard holds a sixty-fourth of the names, and doubles alone.
pub(crate) struct NameMap {
    pub(super) hasher: RandomState,
    pub(super) shards: Box<[Map<NameKey, u32>]>,
}

impl Default for NameMap {
    fn default() -> Self {
        let hasher = RandomState::default();
        NameMap {
            shards: (0..NAME_SHARDS)
                .map(|_| HashMap::with_hasher(hasher.clone()))
                .collect(),
            hasher,
        }
    }
}

impl NameMap {
    /// The hash of a name (also what the tag cache is indexed by).
    pub(crate) fn hash<Q: std::hash::Hash + ?Sized>(&self, name: &Q) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, name)
    }

    /// The shard of a name: bits of its hash that a shard's own table never uses (it takes
    /// the low bits for the bucket and the top seven for the control byte), so that the names
    /// of one shard still spread over its table.
    pub(super) fn shard<Q: std::hash::Hash + ?Sized>(&self, name: &Q) -> usize {
        (self.hash(name) >> 40) as usize % NAME_SHARDS
    }

    pub(crate) fn get<Q>(&self, name: &Q) -> Option<&u32>
    where
        NameKey: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.shards[self.shard(name)].get(name)
    }

    pub(crate) fn insert(&mut self, name: NameKey, id: u32) -> Option<u32> {
        let shard = self.shard(&name);
        self.shards[shard].insert(name, id)
    }

    pub(super) fn entry(
        &mut self,
        name: NameKey,
    ) -> std::collections::hash_map::Entry<'_, NameKey, u32> {
        let shard = self.shard(&name);
        self.shards[shard].entry(name)
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }

    /// Room for `additional` more names, spread over the shards (with a margin for the
    /// unevenness of the spread).
    pub(crate) fn reserve(&mut self, additional: usize) {
        let each = additional / NAME_SHARDS + additional / NAME_SHARDS / 4 + 1;
        for shard in self.shards.iter_mut() {
            shard.reserve(each);
        }
    }
}

/// A type or tag name as a hash-map key: names up to 22 bytes are stored inline, so a lookup
/// compares bytes in the table itself instead of following a pointer to the heap (the lookup
/// of a tag among a hundred thousand is otherwise two cache misses, not one).
#[derive(Clone)]
pub(crate) enum NameKey {
    Inline { len: u8, bytes: [u8; 22] },
    Heap(Box<[u8]>),
}

impl NameKey {
    pub(crate) fn new(name: &[u8]) -> Self {
        Self::new_inline(name).unwrap_or_else(|| NameKey::Heap(name.into()))
    }

    /// The key of a name short enough to be stored inline (no allocation).
    pub(crate) fn new_inline(name: &[u8]) -> Option<Self> {
        (name.len() <= 22).then(|| {
            let mut bytes = [0u8; 22];
            bytes[..name.len()].copy_from_slice(name);
            NameKey::Inline {
                len: name.len() as u8,
                bytes,
            }
        })
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            NameKey::Inline { len, bytes } => &bytes[..*len as usize],
            NameKey::Heap(b) => b,
        }
    }
}

impl std::borrow::Borrow<[u8]> for NameKey {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::hash::Hash for NameKey {
    // Must hash exactly as `[u8]` does, so lookups by `&[u8]` find the key.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq for NameKey {
    fn eq(&self, other: &Self) -> bool {
        same_bytes(self.as_bytes(), other.as_bytes())
    }
}

impl Eq for NameKey {}

impl std::ops::Deref for NameKey {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

pub(super) fn intern(
    ids: &mut NameMap,
    names: &mut Vec<NameKey>,
    postings: &mut Vec<Vec<u64>>,
    name: &[u8],
) -> u32 {
    let key = match NameKey::new_inline(name) {
        Some(key) => key,
        // A long name is looked up by reference first, so that a known one costs no copy.
        None => match ids.get(name) {
            Some(&id) => return id,
            None => NameKey::Heap(name.into()),
        },
    };
    // One hash and one probe whether the name is new (a new order's tag, in an exchange's
    // journal) or known.
    match ids.entry(key) {
        std::collections::hash_map::Entry::Occupied(known) => *known.get(),
        std::collections::hash_map::Entry::Vacant(new) => {
            let id = names.len() as u32;
            names.push(new.key().clone());
            new.insert(id);
            postings.push(Vec::new());
            id
        }
    }
}
