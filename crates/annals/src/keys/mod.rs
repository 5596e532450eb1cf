//! The data subjects' keys of a store on files: one file beside the segments, `subjects.keys`
//! (`file.rs`), every key wrapped under the master key (`seal.rs`).
//!
//! A new key reaches the disk in the log first: every append sealed under a key that the key
//! file does not hold yet carries it as a grant, wrapped under the key file's wrapping key, so
//! that one fdatasync makes the events and their key durable together (`grants.rs`). The
//! key file takes the new keys in the background (within about a second of their making),
//! with each index checkpoint and at close, with the position through which it holds every
//! grant; an open takes in the grants after that position from the log. Erasing a subject rewrites the file (aside, synced, renamed)
//! without its key, keeping a record that the subject was erased, under a new wrapping key:
//! the grants in the log can no longer be opened, and the file holds every other key.
//!
//! A record torn by a crash (short, or failing its CRC, at the end) is cut off at open: its
//! key is in the log as a grant, or no event was sealed under it.
//!
//! On PostgreSQL the keys live in a table of the database instead ([`KeyTable`], implemented
//! in `postgres/keys.rs`): a new key is inserted (committed) before its event is, unless
//! another server made one for the subject first, whose key is then used; an erasure deletes
//! the key's row's bytes, keeping the time it was erased. No grants there.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::error::StoreError;
use crate::event::Event;
use crate::io::{read_file, write_file_durably, Io, IoFile, OpenMode};
use crate::seal::{
    open_entry, wrap_key, GivenKey, Grant, KeySource, Opened, SealError, SubjectKey, WrapKey,
};
use crate::subject::{MasterKey, SubjectOptions};

mod file;
mod grants;
mod held;
mod image;
mod table;
use file::{encode_record, KIND_ERASED, KIND_KEY};
pub(crate) use file::{key_tags, KEYS_FILE};
pub(crate) use grants::TakenIn;
use held::Held;
pub(crate) use held::{OpenMemo, Opener};
pub(crate) use table::KeyTable;
#[cfg(feature = "postgres")]
pub(crate) use table::{Rewrap, TableRow};

/// The subjects' keys by tag (foldhash: a lookup on every sealed event read).
type KeyMap = HashMap<Box<str>, Slot, foldhash::fast::RandomState>;

enum Slot {
    Live(Live),
    /// Erased at this time (microseconds since the epoch).
    Erased(u64),
}

/// A subject's key as the store holds it.
struct Live {
    key: SubjectKey,
    /// Wrapped under the master key, as the key file (or the table) holds it.
    wrapped: Box<[u8]>,
    /// Whether the key file holds it (always, in a table).
    kept: bool,
    /// While the key file does not hold it: the grant every append sealed under it carries.
    /// None for a key taken in from a grant the log holds already.
    grant: Option<Arc<Grant>>,
}

impl Live {
    fn kept(key: SubjectKey, wrapped: Box<[u8]>) -> Live {
        Live {
            key,
            wrapped,
            kept: true,
            grant: None,
        }
    }

    /// The key file holds it now: appends carry it no more.
    fn mark_kept(&mut self) {
        self.kept = true;
        self.grant = None;
    }
}

/// A key made and not yet stored in a table: the key, its wrapped bytes, the batch that
/// inserts it.
struct NewKey {
    key: SubjectKey,
    wrapped: Box<[u8]>,
    batch: u64,
}

/// The writer's side of the keys: the key file and what it holds, or the batches of a table.
struct Pending {
    /// The key file (None: the keys live in a table).
    file: Option<Arc<dyn IoFile>>,
    len: u64,
    /// The file's epoch (its header's).
    epoch: u64,
    /// The wrapping key of the grants (None: a version 1 key file, until it is written anew;
    /// or a table).
    wrap: Option<WrapKey>,
    /// Through which position the key file holds every grant in the log (None: version 1).
    covered: Option<u64>,
    /// A read replica's keys: taken in from its primary's, never written or made here.
    following: bool,
    /// New keys of a table, by tag.
    unsynced: HashMap<Box<str>, NewKey>,
    /// The tags of the next batch, in order.
    next: Vec<Box<str>>,
    /// Batches begun and batches stored.
    begun: u64,
    synced: u64,
    /// The key file is being written, or a batch inserted, with the lock released.
    writing: bool,
    /// The last batch a table did not take, and why (a later batch may succeed).
    refused: Option<(u64, String)>,
}

/// What an erasure did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Erased {
    /// The subject was erased before: nothing changed.
    pub already: bool,
    pub at_us: u64,
}

pub(crate) struct KeyStore {
    io: Arc<dyn Io>,
    dir: PathBuf,
    options: SubjectOptions,
    /// The master key the file's keys are wrapped under now (rotation replaces it).
    master: RwLock<MasterKey>,
    keys: Held,
    pending: Mutex<Pending>,
    synced: Condvar,
    /// Where the keys live when not in the key file.
    table: Option<Arc<dyn KeyTable>>,
    /// Keys made that the key file does not hold yet, and since when the oldest of them
    /// waits (`grants.rs`).
    fresh: std::sync::atomic::AtomicUsize,
    fresh_since: Mutex<Option<std::time::Instant>>,
    /// For the backup of keys in a table (`image.rs`): the keys taken in since its last
    /// image, and the generation an erasure or a rotation ends.
    journal: Mutex<image::Journal>,
    generation: image::Generation,
}

fn subjects_error(path: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::Subjects(format!("{}: {what}", path.display()))
}

fn io_error(path: &Path, op: &'static str, e: std::io::Error) -> StoreError {
    StoreError::io(op, path, 0, e)
}

impl KeyStore {
    /// Opens (or creates) the key file of the store in `dir`, checking the master key.
    /// `following`: a read replica's, whose file is its primary's (never written here).
    pub(crate) fn open(
        io: Arc<dyn Io>,
        dir: &Path,
        options: SubjectOptions,
        following: bool,
    ) -> Result<KeyStore, StoreError> {
        options.validate().map_err(StoreError::InvalidOption)?;
        let path = dir.join(KEYS_FILE);
        let mut keys = KeyMap::default();
        let bytes = read_file(io.as_ref(), &path).map_err(|e| io_error(&path, "read", e))?;
        let loaded = match bytes {
            None => {
                let wrap = WrapKey::generate(0).map_err(|e| subjects_error(&path, e))?;
                let head = file::header(&options.master_key, 0, &wrap, 0)
                    .map_err(|e| subjects_error(&path, e))?;
                write_file_durably(io.as_ref(), dir, KEYS_FILE, &head)
                    .map_err(|e| io_error(&path, "create", e))?;
                file::KeyFile {
                    valid: head.len(),
                    epoch: 0,
                    wrap: Some(wrap),
                    covered: Some(0),
                }
            }
            Some(bytes) => {
                let loaded = file::load(&path, &bytes, &options.master_key, &mut keys)?;
                if loaded.valid < bytes.len() {
                    tracing::warn!(
                        path = %path.display(),
                        cut = bytes.len() - loaded.valid,
                        "subjects: a key record torn by a crash was cut off (its key is in \
                         the log, or no event used it)"
                    );
                }
                loaded
            }
        };
        let len = loaded.valid as u64;
        let file = io
            .open(&path, OpenMode::Existing)
            .map_err(|e| io_error(&path, "open", e))?;
        if !following && file.len().map_err(|e| io_error(&path, "stat", e))? != len {
            file.set_len(len)
                .map_err(|e| io_error(&path, "truncate", e))?;
            file.sync_data().map_err(|e| io_error(&path, "sync", e))?;
        }
        Ok(Self::loaded(
            io,
            dir,
            options,
            keys,
            Some(file),
            loaded,
            following,
        ))
    }

    /// The store of keys a key file held (`file`: None when held in memory only).
    fn loaded(
        io: Arc<dyn Io>,
        dir: &Path,
        options: SubjectOptions,
        keys: KeyMap,
        file: Option<Arc<dyn IoFile>>,
        loaded: file::KeyFile,
        following: bool,
    ) -> KeyStore {
        let len = loaded.valid as u64;
        let store = Self::with(io, dir, options, keys, file, (len, loaded.epoch), None);
        {
            let mut p = store.pending.lock();
            p.wrap = loaded.wrap;
            p.covered = loaded.covered;
            p.following = following;
        }
        store
    }

    fn with(
        io: Arc<dyn Io>,
        dir: &Path,
        options: SubjectOptions,
        keys: KeyMap,
        file: Option<Arc<dyn IoFile>>,
        (len, epoch): (u64, u64),
        table: Option<Arc<dyn KeyTable>>,
    ) -> KeyStore {
        KeyStore {
            io,
            dir: dir.to_path_buf(),
            master: RwLock::new(options.master_key.clone()),
            options,
            keys: Held::new(keys),
            pending: Mutex::new(Pending {
                file,
                len,
                epoch,
                wrap: None,
                covered: None,
                following: false,
                unsynced: HashMap::new(),
                next: Vec::new(),
                begun: 0,
                synced: 0,
                writing: false,
                refused: None,
            }),
            synced: Condvar::new(),
            table,
            fresh: Default::default(),
            fresh_since: Mutex::new(None),
            journal: Mutex::new(image::Journal::default()),
            generation: image::Generation::default(),
        }
    }

    /// Records that another server erased `tag` at `at_us` (its receipt was taken in): the key
    /// is dropped from memory, as the table dropped it.
    pub(crate) fn mark_erased(&self, tag: &str, at_us: u64) {
        let mut keys = self.keys.write();
        if !matches!(keys.get(tag), Some(Slot::Erased(_))) {
            keys.insert(tag.into(), Slot::Erased(at_us));
            self.generation.next();
        }
    }

    /// Whether the keys live in a database's table (several servers share them).
    pub(crate) fn in_table(&self) -> bool {
        self.table.is_some()
    }

    /// Those of `tags` the store holds neither a key nor an erasure for.
    fn unknown<'a>(&self, tags: &[&'a str]) -> Vec<&'a str> {
        let keys = self.keys.read();
        tags.iter()
            .copied()
            .filter(|t| !keys.contains_key(*t))
            .collect()
    }

    /// Whether `tag` was erased, as this store knows.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn is_erased(&self, tag: &str) -> bool {
        matches!(self.keys.read().get(tag), Some(Slot::Erased(_)))
    }

    pub(crate) fn options(&self) -> &SubjectOptions {
        &self.options
    }

    /// The key of `tag` as far as the store knows (readers ask through an `Opener`).
    #[cfg(test)]
    pub(crate) fn state(&self, tag: &str) -> crate::seal::KeyState {
        held::state_of(self.keys.read().get(tag))
    }

    /// The subjects erased, with when.
    pub(crate) fn erased(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .keys
            .read()
            .iter()
            .filter_map(|(t, s)| match s {
                Slot::Erased(at) => Some((t.to_string(), *at)),
                Slot::Live(..) => None,
            })
            .collect();
        out.sort();
        out
    }

    /// The subjects this store holds a key or an erasure for whose tags none of the prefixes
    /// in force names, sorted (at most `most` of them, each with whether it was erased), how
    /// many there are in all, and the prefixes they show (each tag up to and including its
    /// first colon, where it has one). Each is a subject that events were sealed for: an
    /// opening without its prefix would store its later events' data in clear and take
    /// appends naming it after its erasure.
    pub(crate) fn uncovered(&self, most: usize) -> (usize, Vec<(String, bool)>, Vec<String>) {
        let keys = self.keys.read();
        let mut found: Vec<(String, bool)> = Vec::new();
        let mut prefixes = std::collections::BTreeSet::new();
        let mut count = 0;
        for (tag, slot) in keys.iter() {
            if self.options.is_subject(tag) {
                continue;
            }
            count += 1;
            if let Some(end) = tag.find(':').filter(|&i| i + 1 < tag.len()) {
                prefixes.insert(tag[..=end].to_string());
            }
            found.push((tag.to_string(), matches!(slot, Slot::Erased(_))));
        }
        found.sort();
        found.truncate(most);
        (count, found, prefixes.into_iter().collect())
    }

    /// How many subjects have a key, and how many were erased.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let keys = self.keys.read();
        let erased = keys
            .values()
            .filter(|s| matches!(s, Slot::Erased(_)))
            .count() as u64;
        (keys.len() as u64 - erased, erased)
    }

    fn path(&self) -> PathBuf {
        self.dir.join(KEYS_FILE)
    }

    /// The key file's epoch and the length of it that is synced.
    pub(crate) fn position(&self) -> (u64, u64) {
        let p = self.pending.lock();
        (p.epoch, p.len)
    }

    /// The synced bytes of the key file from `from` on, while it is still in `epoch` (None
    /// once an erasure began another): for the backup.
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn read_since(&self, epoch: u64, from: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let p = self.pending.lock();
        let Some(file) = &p.file else {
            return Ok(None);
        };
        if p.epoch != epoch || from > p.len {
            return Ok(None);
        }
        let mut bytes = vec![0; (p.len - from) as usize];
        crate::io::read_exact_at(file.as_ref(), &mut bytes, from)
            .map_err(|e| io_error(&self.path(), "read", e))?;
        Ok(Some(bytes))
    }

    /// Waits while the key file is written (or a batch inserted) with the lock released.
    fn wait_idle(&self, p: &mut parking_lot::MutexGuard<'_, Pending>) {
        while p.writing {
            self.synced.wait(p);
        }
    }

    /// Writes the file anew, in the next epoch (aside, synced, renamed): every key wrapped
    /// under `new_master` (or the current master key), `erased` recorded as erased in place
    /// of its key; under a new wrapping key when a subject is erased (or the file had none),
    /// the same one otherwise. `covered`: the head, read before this was called (every
    /// grant through it was made before, and its key is among those written).
    fn rewrite(
        &self,
        p: &mut Pending,
        new_master: Option<&MasterKey>,
        erased: Option<(&str, u64)>,
        covered: u64,
    ) -> Result<(), StoreError> {
        debug_assert!(!p.writing && !p.following);
        let path = self.path();
        let master = self.master.read().clone();
        let wrap_under = new_master.unwrap_or(&master);
        let epoch = p.epoch + 1;
        let new_wrap = match (&p.wrap, erased) {
            (Some(_), None) => None,
            _ => Some(WrapKey::generate(epoch).map_err(|e| subjects_error(&path, e))?),
        };
        let wrap = new_wrap
            .as_ref()
            .or(p.wrap.as_ref())
            .expect("a wrapping key");
        let mut bytes =
            file::header(wrap_under, epoch, wrap, covered).map_err(|e| subjects_error(&path, e))?;
        let mut rewrapped = Vec::new();
        {
            let keys = self.keys.read();
            let mut tags: Vec<&Box<str>> = keys.keys().collect();
            tags.sort();
            for t in tags {
                if erased.is_some_and(|(tag, _)| &**t == tag) {
                    continue;
                }
                match &keys[t] {
                    Slot::Live(live) => match new_master {
                        Some(new) => {
                            let again = wrap_key(new, t, &live.key)
                                .map_err(|e| subjects_error(&path, e))?;
                            encode_record(&mut bytes, KIND_KEY, t, &again);
                            rewrapped.push((t.clone(), again));
                        }
                        None => encode_record(&mut bytes, KIND_KEY, t, &live.wrapped),
                    },
                    Slot::Erased(at) => {
                        encode_record(&mut bytes, KIND_ERASED, t, &at.to_le_bytes())
                    }
                }
            }
        }
        if let Some((tag, at_us)) = erased {
            encode_record(&mut bytes, KIND_ERASED, tag, &at_us.to_le_bytes());
        }
        write_file_durably(self.io.as_ref(), &self.dir, KEYS_FILE, &bytes)
            .map_err(|e| io_error(&path, "rewrite", e))?;
        p.file = Some(
            self.io
                .open(&path, OpenMode::Existing)
                .map_err(|e| io_error(&path, "open", e))?,
        );
        p.len = bytes.len() as u64;
        p.epoch = epoch;
        p.covered = Some(covered);
        if let Some(wrap) = new_wrap {
            p.wrap = Some(wrap);
        }
        if let Some(new) = new_master {
            *self.master.write() = new.clone();
        }
        let mut keys = self.keys.write();
        for slot in keys.values_mut() {
            if let Slot::Live(live) = slot {
                live.mark_kept();
            }
        }
        self.fresh.store(0, std::sync::atomic::Ordering::Relaxed);
        *self.fresh_since.lock() = None;
        for (t, again) in rewrapped {
            if let Some(Slot::Live(live)) = keys.get_mut(&t) {
                live.wrapped = again.into();
            }
        }
        Ok(())
    }

    /// Wraps every key under `new` instead of the master key it is under now: the key file
    /// only is written anew (the log is untouched; its grants stay under the same wrapping
    /// key, now wrapped under `new`). `covered`: the head, read before this is called.
    /// Answers how many keys were wrapped again.
    pub(crate) fn rotate(&self, new: &MasterKey, covered: u64) -> Result<u64, StoreError> {
        if self.table.is_some() {
            return self.rotate_table(new);
        }
        let mut p = self.pending.lock();
        self.wait_idle(&mut p);
        if p.following {
            return Err(StoreError::InvalidOption(
                "a read replica's keys are its primary's: rotate the master key there".into(),
            ));
        }
        self.rewrite(&mut p, Some(new), None, covered)?;
        Ok(self.counts().0)
    }

    /// Erases `tag`'s key: the file is rewritten without it (aside, synced, renamed), with a
    /// record of the erasure, under a new wrapping key. Idempotent. `covered`: the head,
    /// read before this is called.
    pub(crate) fn erase(&self, tag: &str, at_us: u64, covered: u64) -> Result<Erased, StoreError> {
        let mut p = self.pending.lock();
        self.wait_idle(&mut p);
        if let Some(table) = &self.table {
            // A key made but not yet inserted is dropped: no event was sealed under it yet
            // (its appender waits for the batch, then finds the subject erased).
            if p.unsynced.remove(tag).is_some() {
                p.next.retain(|t| &**t != tag);
            }
            // The table decides (this store may have marked the subject erased already, as
            // its receipt went in); another server may have erased it first, and the table
            // keeps the first time.
            let at = table
                .erase(tag, at_us)
                .map_err(|reason| StoreError::Unavailable { reason })?;
            if image::set_erased(&mut self.keys.write(), tag, at) {
                self.generation.next();
            }
            return Ok(Erased {
                already: at != at_us,
                at_us: at,
            });
        }
        if let Some(Slot::Erased(at)) = self.keys.read().get(tag) {
            return Ok(Erased {
                already: true,
                at_us: *at,
            });
        }
        if p.following {
            return Err(StoreError::InvalidOption(
                "a read replica's keys are its primary's: erase there".into(),
            ));
        }
        self.rewrite(&mut p, None, Some((tag, at_us)), covered)?;
        self.keys.write().insert(tag.into(), Slot::Erased(at_us));
        Ok(Erased {
            already: false,
            at_us,
        })
    }
}

impl KeySource for KeyStore {
    fn keys_for(&self, tags: &[&str]) -> Result<Vec<GivenKey>, SealError> {
        if let Some(keys) = known(&self.keys.read(), tags)? {
            return Ok(keys);
        }
        match self.table {
            Some(_) => self.insert_keys(tags),
            None => self.make_keys(tags),
        }
    }
}

/// The keys of `tags` when the map holds them all (None when one is missing); an erased
/// subject's is refused.
fn known(keys: &KeyMap, tags: &[&str]) -> Result<Option<Vec<GivenKey>>, SealError> {
    let mut out = Vec::with_capacity(tags.len());
    for t in tags {
        match keys.get(*t) {
            Some(Slot::Live(l)) => out.push((l.key.clone(), l.grant.clone())),
            Some(Slot::Erased(_)) => return Err(SealError::Erased(t.to_string())),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// A sealed entry opened with the store's keys: its data back, or marked erased.
pub(crate) fn open_sealed(
    keys: Option<&KeyStore>,
    position: u64,
    appended_at_us: u64,
    entry: bytes::Bytes,
    layout: crate::record::EntryLayout,
    memo: &mut OpenMemo,
) -> Result<Event, StoreError> {
    let (bytes, erased) = match open_entry(&entry, &layout, &mut Opener { keys, memo }) {
        Opened::Clear(bytes) => (bytes, false),
        Opened::Erased(bytes) => (bytes, true),
        Opened::Damaged(why) => {
            return Err(StoreError::Subjects(format!(
                "the event at position {position} cannot be opened: {why}"
            )))
        }
    };
    let layout = layout.opened(&bytes);
    debug_assert_eq!(
        Some(layout),
        crate::record::EntryLayout::parse_checked(&bytes, false),
        "the event at position {position} opened malformed"
    );
    Ok(Event::opened(
        position,
        appended_at_us,
        bytes.into(),
        layout,
        erased,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::RealIo;
    use crate::seal::KeyState;

    fn subjects(master: &MasterKey) -> SubjectOptions {
        SubjectOptions::new(["customer:"], master.clone())
    }

    fn open(dir: &Path, master: &MasterKey) -> KeyStore {
        KeyStore::open(Arc::new(RealIo), dir, subjects(master), false).unwrap()
    }

    fn key_of(store: &KeyStore, tag: &str) -> [u8; 32] {
        match store.state(tag) {
            KeyState::Live(k) => k.clone_bytes(),
            _ => panic!("{tag} has no key"),
        }
    }

    /// Goal: a new key travels as a grant until the key file holds it, and then no more; the
    /// file keeps it across a reopen; an erasure removes it for good, under a new wrapping
    /// key.
    #[test]
    fn keys_travel_as_grants_until_kept_and_an_erasure_removes_one_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let master = MasterKey::generate().unwrap();
        let store = open(dir.path(), &master);
        let a = store.keys_for(&["customer:1", "customer:2"]).unwrap();
        assert!(a.iter().all(|(_, grant)| grant.is_some()));
        let again = store.keys_for(&["customer:1"]).unwrap();
        assert_eq!(a[0].0.clone_bytes(), again[0].0.clone_bytes());
        assert!(again[0].1.is_some(), "carried until the key file holds it");
        let wrap_id = a[0].1.as_ref().unwrap().wrap_id;
        store.persist(7).unwrap();
        assert!(store.keys_for(&["customer:1"]).unwrap()[0].1.is_none());
        assert_eq!(store.covered(), Some(7));
        drop(store);
        let store = open(dir.path(), &master);
        assert_eq!(store.covered(), Some(7));
        assert_eq!(key_of(&store, "customer:2"), a[1].0.clone_bytes());
        let e = store.erase("customer:2", 99, 8).unwrap();
        assert!(!e.already);
        assert!(store.erase("customer:2", 100, 8).unwrap().already);
        assert!(matches!(store.state("customer:2"), KeyState::Erased));
        assert!(matches!(
            store.keys_for(&["customer:2"]),
            Err(SealError::Erased(_))
        ));
        // New keys are granted under the erasure's new wrapping key.
        let c = store.keys_for(&["customer:3"]).unwrap();
        assert!(c[0].1.as_ref().unwrap().wrap_id > wrap_id);
        // The key's bytes are gone from the file.
        let file = std::fs::read(dir.path().join(KEYS_FILE)).unwrap();
        let wrapped = wrap_key(&master, "customer:2", &a[1].0).unwrap();
        assert!(!file.windows(24).any(|w| w == &wrapped[..24]));
        drop(store);
        let store = open(dir.path(), &master);
        assert!(matches!(store.state("customer:2"), KeyState::Erased));
        assert!(matches!(store.state("customer:1"), KeyState::Live(_)));
        // Made and never kept nor carried by an append that reached a log: gone.
        assert!(matches!(store.state("customer:3"), KeyState::Missing));
        assert_eq!(store.erased(), vec![("customer:2".to_string(), 99)]);
        drop(store);
        // Another master key is refused, and changes nothing.
        let before = std::fs::read(dir.path().join(KEYS_FILE)).unwrap();
        let other = MasterKey::generate().unwrap();
        let e = KeyStore::open(Arc::new(RealIo), dir.path(), subjects(&other), false)
            .err()
            .unwrap();
        assert!(e.to_string().contains("not this store's"), "{e}");
        assert_eq!(std::fs::read(dir.path().join(KEYS_FILE)).unwrap(), before);
    }

    /// Goal: a grant opens to its key under the wrapping key of its epoch only; an older one
    /// is passed over and a newer one is reported, never guessed at.
    #[test]
    fn grants_are_taken_in_under_their_own_wrapping_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let master = MasterKey::generate().unwrap();
        let store = open(dir.path(), &master);
        let options = subjects(&master);
        let limits = crate::limits::Limits::default();
        let sealed = |tag: &str| {
            let event = crate::event::NewEvent::new("Moved", "street").tag(tag);
            let append = crate::record::encode_append_tracked(&[event], None, &limits).unwrap();
            crate::seal::seal_append(append, &options, &store, false).unwrap()
        };
        let first = sealed("customer:1");
        let key = key_of(&store, "customer:1");
        let other = tempfile::tempdir().unwrap();
        let reader = open(other.path(), &master);
        // Another key file's wrapping key: the grant is not this store's to open.
        let taken = reader.take_in(first.entries(), first.event_count);
        assert!(taken.is_err() || taken.unwrap() == TakenIn::Keys(0));
        drop(reader);
        // The same key file, reopened: taken in.
        store.persist(0).unwrap();
        std::fs::copy(dir.path().join(KEYS_FILE), other.path().join(KEYS_FILE)).unwrap();
        let reader = open(other.path(), &master);
        let second = sealed("customer:2");
        assert_eq!(
            reader
                .take_in(second.entries(), second.event_count)
                .unwrap(),
            TakenIn::Keys(1)
        );
        assert_eq!(key_of(&reader, "customer:2"), key_of(&store, "customer:2"));
        assert_eq!(key_of(&reader, "customer:1"), key);
        // After an erasure: old grants passed over, new ones newer than the reader's file.
        store.erase("customer:9", 1, 0).unwrap();
        let third = sealed("customer:3");
        assert_eq!(
            store.take_in(second.entries(), second.event_count).unwrap(),
            TakenIn::Keys(0)
        );
        assert!(matches!(
            reader.take_in(third.entries(), third.event_count).unwrap(),
            TakenIn::NewerWrap(_)
        ));
    }

    /// Goal: a key file from before grants (version 1, no wrapping key) opens with its keys,
    /// and is written anew as version 2 before a key is made.
    #[test]
    fn a_key_file_of_version_1_is_read_and_written_anew() {
        let dir = tempfile::tempdir().unwrap();
        let master = MasterKey::generate().unwrap();
        let key = SubjectKey::generate().unwrap();
        let mut bytes = b"ANNKEYS1".to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        let check = crate::seal::master_check(&master).unwrap();
        bytes.extend_from_slice(&(check.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&check);
        let wrapped = wrap_key(&master, "customer:1", &key).unwrap();
        encode_record(&mut bytes, KIND_KEY, "customer:1", &wrapped);
        std::fs::write(dir.path().join(KEYS_FILE), &bytes).unwrap();
        let store = open(dir.path(), &master);
        assert_eq!(key_of(&store, "customer:1"), key.clone_bytes());
        assert_eq!(store.covered(), None);
        assert!(
            store.keys_for(&["customer:2"]).is_err(),
            "no wrapping key yet"
        );
        store.upgrade(5).unwrap();
        assert!(store.keys_for(&["customer:2"]).unwrap()[0].1.is_some());
        drop(store);
        let store = open(dir.path(), &master);
        assert_eq!(store.covered(), Some(5));
        assert_eq!(key_of(&store, "customer:1"), key.clone_bytes());
        let file = std::fs::read(dir.path().join(KEYS_FILE)).unwrap();
        assert_eq!(file[8..12], 2u32.to_le_bytes());
    }

    /// Goal: rotating the master key keeps every subject's key and every erasure, wraps keys made
    /// afterwards under the new master key, and the old master key is refused from then on.
    #[test]
    fn a_rotated_master_key_wraps_the_same_keys_and_the_old_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let old = MasterKey::generate().unwrap();
        let new = MasterKey::generate().unwrap();
        let store = open(dir.path(), &old);
        let a = store.keys_for(&["customer:1", "customer:2"]).unwrap();
        store.erase("customer:2", 7, 0).unwrap();
        assert_eq!(store.rotate(&new, 0).unwrap(), 1);
        // New keys made after the rotation are wrapped under the new master key too.
        let c = store.keys_for(&["customer:3"]).unwrap();
        store.persist(0).unwrap();
        drop(store);
        assert!(KeyStore::open(Arc::new(RealIo), dir.path(), subjects(&old), false).is_err());
        let store = open(dir.path(), &new);
        assert_eq!(key_of(&store, "customer:1"), a[0].0.clone_bytes());
        assert_eq!(key_of(&store, "customer:3"), c[0].0.clone_bytes());
        assert!(matches!(store.state("customer:2"), KeyState::Erased));
        assert_eq!(
            store.position().0,
            2,
            "the erasure and the rotation each began an epoch"
        );
    }

    /// Goal: a key file whose end was torn by a crash opens with the records before the tear, and
    /// new keys are written after them. Method: the file cut in its last record, then in a key
    /// record.
    #[test]
    fn a_torn_key_record_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let master = MasterKey::generate().unwrap();
        let store = open(dir.path(), &master);
        store.keys_for(&["customer:1"]).unwrap();
        store.persist(1).unwrap();
        store.keys_for(&["customer:2"]).unwrap();
        store.persist(2).unwrap();
        drop(store);
        let path = dir.path().join(KEYS_FILE);
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        // The last covered record torn: the one before counts.
        f.set_len(len - 5).unwrap();
        let store = open(dir.path(), &master);
        assert_eq!(store.covered(), Some(1));
        assert!(matches!(store.state("customer:2"), KeyState::Live(_)));
        drop(store);
        // The key record torn too.
        let len = std::fs::metadata(&path).unwrap().len();
        f.set_len(len - 20).unwrap();
        let store = open(dir.path(), &master);
        assert!(matches!(store.state("customer:1"), KeyState::Live(_)));
        assert!(matches!(store.state("customer:2"), KeyState::Missing));
        store.keys_for(&["customer:3"]).unwrap();
        store.persist(3).unwrap();
        drop(store);
        let store = open(dir.path(), &master);
        assert!(matches!(store.state("customer:3"), KeyState::Live(_)));
    }

    /// Goal: threads asking at once for keys of the same tags get one key per tag, the same key
    /// each time, before and after a reopening.
    #[test]
    fn concurrent_new_keys_get_one_key_per_tag() {
        let dir = tempfile::tempdir().unwrap();
        let master = MasterKey::generate().unwrap();
        let store = Arc::new(open(dir.path(), &master));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let tag = format!("customer:{}", (i * 7 + t) % 300);
                        let k = store.keys_for(&[tag.as_str()]).unwrap();
                        if i % 50 == 0 {
                            store.persist(i).unwrap();
                        }
                        let again = store.keys_for(&[tag.as_str()]).unwrap();
                        assert_eq!(k[0].0.clone_bytes(), again[0].0.clone_bytes());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(store.counts().0, 300);
        store.persist(1000).unwrap();
        drop(store);
        let store = open(dir.path(), &master);
        assert_eq!(store.counts().0, 300);
    }
}
