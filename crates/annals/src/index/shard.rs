//! The tags of one shard of a parallel rebuild.

use super::*;

/// The tags of one shard of a parallel rebuild: the tags whose hash falls in the shard, with
/// their postings. Shards work on the same events at once; each owns its tags, so there is no
/// sharing and no lock.
///
/// A rebuild looks up tens of millions of tags among many distinct ones, and each lookup is a
/// cache miss on the table and another on the tag's posting list. A shard therefore takes its
/// tags a batch at a time with their hashes computed first ([`TagShard::add_batch`]): it starts
/// loading the table slot of the tag some way ahead and the posting list of a tag just looked
/// up, so the misses overlap instead of following one another.
pub(crate) struct TagShard {
    /// Open addressing, linear probing, at most half full; names up to 22 bytes are compared
    /// in the slot itself.
    pub(super) slots: Vec<ShardSlot>,
    pub(super) names: Vec<NameKey>,
    pub(super) postings: Vec<Vec<u64>>,
}

#[derive(Clone)]
pub(super) struct ShardSlot {
    pub(super) hash: u64,
    /// `u32::MAX`: empty.
    pub(super) id: u32,
    pub(super) key: NameKey,
}

pub(super) const EMPTY_SLOT: u32 = u32::MAX;

/// How many tags ahead a shard starts loading table slots, and how many lookups it lets pass
/// before pushing a position onto the posting list it started loading.
pub(super) const SLOT_AHEAD: usize = 16;
pub(super) const PUSH_BEHIND: usize = 8;

/// One tag of a batch: its hash (from the rebuild's [`TagHasher`]), its bytes and position.
pub(crate) type ShardTag<'a> = (u64, &'a [u8], u64);

/// The hash every shard thread of one rebuild computes for every tag: it picks the shard and
/// the slot. Seeded at random per rebuild, so that tags written to the log cannot be chosen to
/// collide.
#[derive(Clone)]
pub(crate) struct TagHasher(foldhash::fast::FixedState);

impl TagHasher {
    pub(crate) fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
        seed.write_u64(0x5eed);
        TagHasher(foldhash::fast::FixedState::with_seed(seed.finish()))
    }

    pub(crate) fn hash(&self, tag: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.0.hash_one(tag)
    }

    /// Which of `count` shards a tag with this hash belongs to (the table uses the low bits).
    pub(crate) fn shard(hash: u64, count: usize) -> usize {
        (((hash >> 32) * count as u64) >> 32) as usize
    }
}

impl Default for TagShard {
    fn default() -> Self {
        TagShard {
            slots: vec![ShardSlot::empty(); 1024],
            names: Vec::new(),
            postings: Vec::new(),
        }
    }
}

impl ShardSlot {
    pub(super) fn empty() -> Self {
        ShardSlot {
            hash: 0,
            id: EMPTY_SLOT,
            key: NameKey::Inline {
                len: 0,
                bytes: [0; 22],
            },
        }
    }
}

impl TagShard {
    /// Adds the positions of a batch of tags, in order (positions ascending).
    pub(crate) fn add_batch(&mut self, tags: &[ShardTag<'_>]) {
        let mut behind = [(0u32, 0u64); PUSH_BEHIND];
        for (i, &(hash, tag, position)) in tags.iter().enumerate() {
            if let Some(&(ahead, _, _)) = tags.get(i + SLOT_AHEAD) {
                let mask = self.slots.len() - 1;
                crate::segment::prefetch(&self.slots[ahead as usize & mask]);
            }
            let id = self.intern(hash, tag);
            crate::segment::prefetch(&self.postings[id as usize]);
            // The position looked up PUSH_BEHIND tags ago goes onto its list now; its header
            // has had time to arrive. Lists keep ascending order: pushes stay in tag order.
            let slot = &mut behind[i % PUSH_BEHIND];
            if i >= PUSH_BEHIND {
                self.postings[slot.0 as usize].push(slot.1);
            }
            *slot = (id, position);
        }
        let n = tags.len();
        for i in n.saturating_sub(PUSH_BEHIND)..n {
            let (id, position) = behind[i % PUSH_BEHIND];
            self.postings[id as usize].push(position);
        }
    }

    pub(super) fn intern(&mut self, hash: u64, tag: &[u8]) -> u32 {
        let mask = self.slots.len() - 1;
        let mut at = hash as usize & mask;
        loop {
            let slot = &self.slots[at];
            if slot.id == EMPTY_SLOT {
                break;
            }
            if slot.hash == hash && same_bytes(slot.key.as_bytes(), tag) {
                return slot.id;
            }
            at = (at + 1) & mask;
        }
        let id = self.names.len() as u32;
        let key = NameKey::new(tag);
        self.slots[at] = ShardSlot {
            hash,
            id,
            key: key.clone(),
        };
        self.names.push(key);
        self.postings.push(Vec::new());
        if self.names.len() * 2 > self.slots.len() {
            self.grow();
        }
        id
    }

    pub(super) fn grow(&mut self) {
        let doubled = vec![ShardSlot::empty(); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        let mask = self.slots.len() - 1;
        for slot in old.into_iter().filter(|s| s.id != EMPTY_SLOT) {
            let mut at = slot.hash as usize & mask;
            while self.slots[at].id != EMPTY_SLOT {
                at = (at + 1) & mask;
            }
            self.slots[at] = slot;
        }
    }
}

/// Byte equality for the short names of types and tags, without a call into `memcmp`: up to
/// 16 bytes are compared as two overlapping words (the rebuild compares one name per tag).
#[inline]
pub(super) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap_or([0; 8]));
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().unwrap_or([0; 4]));
    match n {
        0..=3 => a.iter().zip(b).all(|(x, y)| x == y),
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}
