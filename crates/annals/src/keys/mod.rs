//! The data subjects' keys of a store on files: one file beside the segments, `subjects.keys`,
//! every key wrapped under the master key (`seal.rs`). A new key is appended and synced before
//! any event sealed under it goes on to the log (callers that need new keys at once share one
//! fdatasync); erasing a subject rewrites the file without its key (aside, synced, renamed),
//! keeping a record that the subject was erased.
//!
//! ```text
//! header: magic "ANNKEYS1", version u32 (1), epoch u64 (rewrites so far: each erasure
//!         begins a new one), check_len u32, check (16 zero bytes sealed under the master
//!         key: proves a master key is the store's)
//! records, back to back: len u32 (of what follows the crc), crc32c u32, kind u8,
//!         tag_len u16, tag, then for kind 1 (a key) the wrapped key (60 bytes),
//!         for kind 2 (erased) the erasure's time u64 (microseconds since the epoch)
//! ```
//!
//! A record torn by a crash (short, or failing its CRC, at the end) is cut off at open: no
//! event was sealed under a key that was not synced.
//!
//! On PostgreSQL the keys live in a table of the database instead ([`KeyTable`], implemented
//! in `postgres/keys.rs`): a new key is inserted (committed) before its event is, unless
//! another server made one for the subject first, whose key is then used; an erasure deletes
//! the key's row's bytes, keeping the time it was erased.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::error::{InputError, StoreError};
use crate::event::Event;
use crate::io::{read_file, write_file_durably, Io, IoFile, OpenMode};
use crate::seal::{
    master_check, master_matches, open_entry, unwrap_key, wrap_key, KeySource, KeyState, Opened,
    SealError, SubjectKey, WRAPPED_KEY_BYTES,
};
use crate::subject::{MasterKey, SubjectOptions};

mod table;
pub(crate) use table::KeyTable;
#[cfg(feature = "postgres")]
pub(crate) use table::TableRow;

pub(crate) const KEYS_FILE: &str = "subjects.keys";
const MAGIC: &[u8; 8] = b"ANNKEYS1";
const VERSION: u32 = 1;
const KIND_KEY: u8 = 1;
const KIND_ERASED: u8 = 2;

/// The subjects' keys by tag (foldhash: a lookup on every sealed event read).
type KeyMap = HashMap<Box<str>, Slot, foldhash::fast::RandomState>;

enum Slot {
    /// The key, and its wrapped bytes as the file holds them.
    Live(SubjectKey, Box<[u8]>),
    /// Erased at this time (microseconds since the epoch).
    Erased(u64),
}

/// A key made and not yet synced: the key, its wrapped bytes, the batch that writes it.
struct NewKey {
    key: SubjectKey,
    wrapped: Box<[u8]>,
    batch: u64,
}

/// Keys made but not yet synced, and the one writer of the file.
struct Pending {
    /// The key file (None: the keys live in a table).
    file: Option<Arc<dyn IoFile>>,
    len: u64,
    /// The file's epoch (its header's).
    epoch: u64,
    /// New keys by tag.
    unsynced: HashMap<Box<str>, NewKey>,
    /// The tags of the next batch, in order.
    next: Vec<Box<str>>,
    /// Batches begun and batches synced.
    begun: u64,
    synced: u64,
    writing: bool,
    /// A write or sync that failed: no key is made after it (the store is poisoned too).
    failed: Option<String>,
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
    keys: RwLock<KeyMap>,
    pending: Mutex<Pending>,
    synced: Condvar,
    /// Where the keys live when not in the key file.
    table: Option<Arc<dyn KeyTable>>,
}

fn subjects_error(path: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::Subjects(format!("{}: {what}", path.display()))
}

fn io_error(path: &Path, op: &'static str, e: std::io::Error) -> StoreError {
    StoreError::io(op, path, 0, e)
}

fn encode_record(out: &mut Vec<u8>, kind: u8, tag: &str, payload: &[u8]) {
    let mut rest = Vec::with_capacity(3 + tag.len() + payload.len());
    rest.push(kind);
    rest.extend_from_slice(&(tag.len() as u16).to_le_bytes());
    rest.extend_from_slice(tag.as_bytes());
    rest.extend_from_slice(payload);
    out.extend_from_slice(&(rest.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&rest).to_le_bytes());
    out.extend_from_slice(&rest);
}

fn header(master: &MasterKey, epoch: u64) -> Result<Vec<u8>, String> {
    let check = master_check(master)?;
    let mut out = Vec::with_capacity(24 + check.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&(check.len() as u32).to_le_bytes());
    out.extend_from_slice(&check);
    Ok(out)
}

/// One decoded record: kind, tag, payload; None when short or failing its CRC.
fn decode_record(bytes: &[u8]) -> Option<(u8, &str, &[u8], usize)> {
    let len = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    let rest = bytes.get(8..8 + len)?;
    if crc32c::crc32c(rest) != crc || rest.len() < 3 {
        return None;
    }
    let tag_len = u16::from_le_bytes([rest[1], rest[2]]) as usize;
    let tag = std::str::from_utf8(rest.get(3..3 + tag_len)?).ok()?;
    Some((rest[0], tag, &rest[3 + tag_len..], 8 + len))
}

/// The subjects a key file names, each with whether it was erased: read without the master
/// key (tags are in the clear), for `annals verify`.
pub(crate) fn key_tags(bytes: &[u8]) -> Result<HashMap<String, bool>, String> {
    if bytes.get(..8) != Some(MAGIC.as_slice()) {
        return Err("not a key file (its magic is wrong)".into());
    }
    let check_len = bytes.get(20..24).map_or(0, |b| {
        u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize
    });
    let mut at = 24 + check_len;
    let mut tags = HashMap::new();
    while at < bytes.len() {
        let Some((kind, tag, _, used)) = decode_record(&bytes[at..]) else {
            break;
        };
        tags.insert(tag.to_string(), kind == KIND_ERASED);
        at += used;
    }
    Ok(tags)
}

impl KeyStore {
    /// Opens (or creates) the key file of the store in `dir`, checking the master key.
    pub(crate) fn open(
        io: Arc<dyn Io>,
        dir: &Path,
        options: SubjectOptions,
    ) -> Result<KeyStore, StoreError> {
        options.validate().map_err(StoreError::InvalidOption)?;
        let path = dir.join(KEYS_FILE);
        let mut keys = KeyMap::default();
        let bytes = read_file(io.as_ref(), &path).map_err(|e| io_error(&path, "read", e))?;
        let (len, epoch) = match bytes {
            None => {
                let head = header(&options.master_key, 0).map_err(|e| subjects_error(&path, e))?;
                write_file_durably(io.as_ref(), dir, KEYS_FILE, &head)
                    .map_err(|e| io_error(&path, "create", e))?;
                (head.len() as u64, 0)
            }
            Some(bytes) => {
                let (valid, epoch) = Self::load(&path, &bytes, &options.master_key, &mut keys)?;
                if valid < bytes.len() {
                    tracing::warn!(
                        path = %path.display(),
                        cut = bytes.len() - valid,
                        "subjects: a key record torn by a crash was cut off (no event used it)"
                    );
                }
                (valid as u64, epoch)
            }
        };
        let file = io
            .open(&path, OpenMode::Existing)
            .map_err(|e| io_error(&path, "open", e))?;
        if file.len().map_err(|e| io_error(&path, "stat", e))? != len {
            file.set_len(len)
                .map_err(|e| io_error(&path, "truncate", e))?;
            file.sync_data().map_err(|e| io_error(&path, "sync", e))?;
        }
        Ok(Self::with(
            io,
            dir,
            options,
            keys,
            Some(file),
            (len, epoch),
            None,
        ))
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
            keys: RwLock::new(keys),
            pending: Mutex::new(Pending {
                file,
                len,
                epoch,
                unsynced: HashMap::new(),
                next: Vec::new(),
                begun: 0,
                synced: 0,
                writing: false,
                failed: None,
                refused: None,
            }),
            synced: Condvar::new(),
            table,
        }
    }

    /// Records that another server erased `tag` at `at_us` (its receipt was taken in): the key
    /// is dropped from memory, as the table dropped it.
    pub(crate) fn mark_erased(&self, tag: &str, at_us: u64) {
        let mut keys = self.keys.write();
        if !matches!(keys.get(tag), Some(Slot::Erased(_))) {
            keys.insert(tag.into(), Slot::Erased(at_us));
        }
    }

    /// Whether the keys live in a database's table (several servers share them).
    pub(crate) fn in_table(&self) -> bool {
        self.table.is_some()
    }

    /// Whether `tag` was erased, as this store knows.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn is_erased(&self, tag: &str) -> bool {
        matches!(self.keys.read().get(tag), Some(Slot::Erased(_)))
    }

    /// Reads the file's keys into `keys`; answers how many bytes of it are valid, and its
    /// epoch.
    fn load(
        path: &Path,
        bytes: &[u8],
        master: &MasterKey,
        keys: &mut KeyMap,
    ) -> Result<(usize, u64), StoreError> {
        if bytes.get(..8) != Some(MAGIC.as_slice()) {
            return Err(subjects_error(path, "not a key file (its magic is wrong)"));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(subjects_error(
                path,
                format!("key file version {version}; this build reads {VERSION}"),
            ));
        }
        let epoch = bytes
            .get(12..20)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        let check_len = bytes
            .get(20..24)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .unwrap_or(0);
        let Some(check) = bytes.get(24..24 + check_len) else {
            return Err(subjects_error(path, "a key file cut short in its header"));
        };
        if !master_matches(master, check) {
            return Err(subjects_error(
                path,
                "the master key given is not this store's (the store's keys were made under \
                 another); start with the store's master key file",
            ));
        }
        let mut at = 24 + check_len;
        while at < bytes.len() {
            let Some((kind, tag, payload, used)) = decode_record(&bytes[at..]) else {
                break;
            };
            match kind {
                KIND_KEY if payload.len() == WRAPPED_KEY_BYTES => {
                    let key = unwrap_key(master, tag, payload).ok_or_else(|| {
                        subjects_error(path, format!("the key of {tag} does not unwrap"))
                    })?;
                    keys.insert(tag.into(), Slot::Live(key, payload.into()));
                }
                KIND_ERASED if payload.len() == 8 => {
                    let at_us = u64::from_le_bytes(payload.try_into().expect("8 bytes"));
                    keys.insert(tag.into(), Slot::Erased(at_us));
                }
                _ => {
                    return Err(subjects_error(
                        path,
                        format!("a record of kind {kind} for {tag} at offset {at}"),
                    ))
                }
            }
            at += used;
        }
        Ok((at, epoch))
    }

    pub(crate) fn options(&self) -> &SubjectOptions {
        &self.options
    }

    /// The key of `tag` as far as the store knows.
    pub(crate) fn state(&self, tag: &str) -> KeyState {
        match self.keys.read().get(tag) {
            Some(Slot::Live(k, _)) => KeyState::Live(k.clone()),
            Some(Slot::Erased(_)) => KeyState::Erased,
            None => KeyState::Missing,
        }
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

    /// Takes the keys of `bytes` (a key file, as a backup holds it) in place of those held:
    /// a read replica following its primary's keys. Its own file is not written.
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn replace(&self, bytes: &[u8]) -> Result<(), StoreError> {
        let mut keys = KeyMap::default();
        let (valid, epoch) = Self::load(&self.path(), bytes, &self.master.read(), &mut keys)?;
        let mut p = self.pending.lock();
        debug_assert!(p.file.is_some(), "a replica's keys are a key file's");
        *self.keys.write() = keys;
        p.epoch = epoch;
        p.len = valid as u64;
        Ok(())
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

    /// Writes the next batch of new keys and syncs it, with the pending lock released.
    fn write_batch(&self, p: &mut parking_lot::MutexGuard<'_, Pending>) {
        p.writing = true;
        p.begun += 1;
        let batch = p.begun;
        let tags = std::mem::take(&mut p.next);
        if let Some(table) = self.table.clone() {
            self.insert_batch(p, table.as_ref(), batch, tags);
            return;
        }
        let mut bytes = Vec::new();
        for t in &tags {
            encode_record(&mut bytes, KIND_KEY, t, &p.unsynced[t].wrapped);
        }
        let file = p.file.clone().expect("keys on files have a key file");
        let at = p.len;
        let outcome = parking_lot::MutexGuard::unlocked(p, || {
            file.write_at(&bytes, at)?;
            file.sync_data()
        });
        match outcome {
            Ok(()) => {
                p.len += bytes.len() as u64;
                let mut keys = self.keys.write();
                for t in tags {
                    if let Some(new) = p.unsynced.remove(&t) {
                        keys.insert(t, Slot::Live(new.key, new.wrapped));
                    }
                }
                p.synced = batch;
            }
            Err(e) => {
                let reason = format!("writing new keys to {} failed: {e}", self.path().display());
                tracing::error!(reason = reason.as_str(), "subjects: keys not stored");
                p.failed = Some(reason);
            }
        }
        p.writing = false;
        self.synced.notify_all();
    }

    /// Writes the file anew, in the next epoch (aside, synced, renamed): every key wrapped
    /// under `new_master` (or the current master key), `erased` recorded as erased in place
    /// of its key.
    fn rewrite(
        &self,
        p: &mut Pending,
        new_master: Option<&MasterKey>,
        erased: Option<(&str, u64)>,
    ) -> Result<(), StoreError> {
        let path = self.path();
        let master = self.master.read().clone();
        let wrap_under = new_master.unwrap_or(&master);
        let epoch = p.epoch + 1;
        let mut bytes = header(wrap_under, epoch).map_err(|e| subjects_error(&path, e))?;
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
                    Slot::Live(key, wrapped) => match new_master {
                        Some(new) => {
                            let again =
                                wrap_key(new, t, key).map_err(|e| subjects_error(&path, e))?;
                            encode_record(&mut bytes, KIND_KEY, t, &again);
                            rewrapped.push((t.clone(), again));
                        }
                        None => encode_record(&mut bytes, KIND_KEY, t, wrapped),
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
        if let Some(new) = new_master {
            *self.master.write() = new.clone();
            let mut keys = self.keys.write();
            for (t, again) in rewrapped {
                if let Some(Slot::Live(_, wrapped)) = keys.get_mut(&t) {
                    *wrapped = again.into();
                }
            }
        }
        Ok(())
    }

    /// Wraps every key under `new` instead of the master key it is under now: the key file
    /// only is written anew (the log is untouched). Answers how many keys were wrapped again.
    pub(crate) fn rotate(&self, new: &MasterKey) -> Result<u64, StoreError> {
        if self.table.is_some() {
            return Err(StoreError::InvalidOption(
                "rotating the master key of a store on PostgreSQL is not built yet (every \
                 server holds the master key in memory and wraps new keys under it)"
                    .into(),
            ));
        }
        let mut p = self.pending.lock();
        while p.writing || !p.next.is_empty() {
            if p.writing {
                self.synced.wait(&mut p);
            } else {
                self.write_batch(&mut p);
            }
        }
        self.rewrite(&mut p, Some(new), None)?;
        Ok(self.counts().0)
    }

    /// Erases `tag`'s key: the file is rewritten without it (aside, synced, renamed), with a
    /// record of the erasure. Idempotent.
    pub(crate) fn erase(&self, tag: &str, at_us: u64) -> Result<Erased, StoreError> {
        let mut p = self.pending.lock();
        while p.writing {
            self.synced.wait(&mut p);
        }
        // A key made but not yet written is dropped: no event was sealed under it yet (its
        // appender waits for the batch, then finds the subject erased).
        if p.unsynced.remove(tag).is_some() {
            p.next.retain(|t| &**t != tag);
        }
        if let Some(table) = &self.table {
            // The table decides (this store may have marked the subject erased already, as
            // its receipt went in); another server may have erased it first, and the table
            // keeps the first time.
            let at = table
                .erase(tag, at_us)
                .map_err(|reason| StoreError::Unavailable { reason })?;
            self.keys.write().insert(tag.into(), Slot::Erased(at));
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
        self.rewrite(&mut p, None, Some((tag, at_us)))?;
        self.keys.write().insert(tag.into(), Slot::Erased(at_us));
        Ok(Erased {
            already: false,
            at_us,
        })
    }
}

impl KeySource for KeyStore {
    fn keys_for(&self, tags: &[&str]) -> Result<Vec<SubjectKey>, SealError> {
        let known = |keys: &KeyMap| -> Result<Option<Vec<SubjectKey>>, SealError> {
            let mut out = Vec::with_capacity(tags.len());
            for t in tags {
                match keys.get(*t) {
                    Some(Slot::Live(k, _)) => out.push(k.clone()),
                    Some(Slot::Erased(_)) => {
                        return Err(InputError::SubjectErased { tag: t.to_string() }.into())
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some(out))
        };
        if let Some(keys) = known(&self.keys.read())? {
            return Ok(keys);
        }
        let mut p = self.pending.lock();
        let mut wait_for = 0;
        for t in tags {
            if self.keys.read().contains_key(*t) {
                continue;
            }
            if let Some(new) = p.unsynced.get(*t) {
                wait_for = wait_for.max(new.batch);
                continue;
            }
            let key = SubjectKey::generate().map_err(SealError::Keys)?;
            let wrapped = wrap_key(&self.master.read(), t, &key).map_err(SealError::Keys)?;
            let batch = p.begun + 1;
            let wrapped = wrapped.into();
            p.unsynced.insert(
                (*t).into(),
                NewKey {
                    key,
                    wrapped,
                    batch,
                },
            );
            p.next.push((*t).into());
            wait_for = wait_for.max(batch);
        }
        loop {
            if let Some(reason) = &p.failed {
                return Err(SealError::Keys(reason.clone()));
            }
            if p.synced >= wait_for {
                if let Some((batch, reason)) = &p.refused {
                    if *batch >= wait_for {
                        return Err(SealError::Unavailable(reason.clone()));
                    }
                }
                break;
            }
            if p.writing {
                self.synced.wait(&mut p);
            } else {
                self.write_batch(&mut p);
            }
        }
        drop(p);
        match known(&self.keys.read())? {
            Some(keys) => Ok(keys),
            // Erased while this append waited for its new key.
            None => Err(SealError::Keys("a key vanished while it was made".into())),
        }
    }
}

/// A sealed entry opened with the store's keys: its data back, or marked erased.
pub(crate) fn open_sealed(
    keys: Option<&KeyStore>,
    position: u64,
    appended_at_us: u64,
    entry: bytes::Bytes,
    layout: crate::record::EntryLayout,
) -> Result<Event, StoreError> {
    let state = |tag: &str| match keys {
        Some(keys) => keys.state(tag),
        None => KeyState::Missing,
    };
    let (bytes, erased) = match open_entry(&entry, &layout, &state) {
        Opened::Clear(bytes) => (bytes, false),
        Opened::Erased(bytes) => (bytes, true),
        Opened::Damaged(why) => {
            return Err(StoreError::Subjects(format!(
                "the event at position {position} cannot be opened: {why}"
            )))
        }
    };
    let layout = crate::record::EntryLayout::parse_checked(&bytes, false).ok_or_else(|| {
        StoreError::Subjects(format!("the event at position {position} opened malformed"))
    })?;
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

    fn subjects(master: &MasterKey) -> SubjectOptions {
        SubjectOptions::new(["customer:"], master.clone())
    }

    #[test]
    fn keys_survive_a_reopen_and_an_erasure_removes_the_key_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let master = MasterKey::generate().unwrap();
        let io: Arc<dyn Io> = Arc::new(RealIo);
        let store = KeyStore::open(io.clone(), dir.path(), subjects(&master)).unwrap();
        let a = store.keys_for(&["customer:1", "customer:2"]).unwrap();
        let again = store.keys_for(&["customer:1"]).unwrap();
        assert_eq!(a[0].clone_bytes(), again[0].clone_bytes());
        drop(store);
        let store = KeyStore::open(io.clone(), dir.path(), subjects(&master)).unwrap();
        let b = store.keys_for(&["customer:2"]).unwrap();
        assert_eq!(a[1].clone_bytes(), b[0].clone_bytes());
        let e = store.erase("customer:2", 99).unwrap();
        assert!(!e.already);
        assert!(store.erase("customer:2", 100).unwrap().already);
        assert!(matches!(store.state("customer:2"), KeyState::Erased));
        assert!(matches!(
            store.keys_for(&["customer:2"]),
            Err(SealError::Input(InputError::SubjectErased { .. }))
        ));
        // The key's bytes are gone from the file.
        let file = std::fs::read(dir.path().join(KEYS_FILE)).unwrap();
        let wrapped = wrap_key(&master, "customer:2", &b[0]).unwrap();
        assert!(!file.windows(24).any(|w| w == &wrapped[..24]));
        drop(store);
        let store = KeyStore::open(io.clone(), dir.path(), subjects(&master)).unwrap();
        assert!(matches!(store.state("customer:2"), KeyState::Erased));
        assert!(matches!(store.state("customer:1"), KeyState::Live(_)));
        assert_eq!(store.erased(), vec![("customer:2".to_string(), 99)]);
        drop(store);
        // Another master key is refused, and changes nothing.
        let before = std::fs::read(dir.path().join(KEYS_FILE)).unwrap();
        let other = MasterKey::generate().unwrap();
        let e = KeyStore::open(io.clone(), dir.path(), subjects(&other))
            .err()
            .unwrap();
        assert!(e.to_string().contains("not this store's"), "{e}");
        assert_eq!(std::fs::read(dir.path().join(KEYS_FILE)).unwrap(), before);
    }

    #[test]
    fn a_rotated_master_key_wraps_the_same_keys_and_the_old_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let old = MasterKey::generate().unwrap();
        let new = MasterKey::generate().unwrap();
        let io: Arc<dyn Io> = Arc::new(RealIo);
        let store = KeyStore::open(io.clone(), dir.path(), subjects(&old)).unwrap();
        let a = store.keys_for(&["customer:1", "customer:2"]).unwrap();
        store.erase("customer:2", 7).unwrap();
        assert_eq!(store.rotate(&new).unwrap(), 1);
        // New keys made after the rotation are wrapped under the new master key too.
        let c = store.keys_for(&["customer:3"]).unwrap();
        drop(store);
        assert!(KeyStore::open(io.clone(), dir.path(), subjects(&old)).is_err());
        let store = KeyStore::open(io, dir.path(), subjects(&new)).unwrap();
        match store.state("customer:1") {
            KeyState::Live(k) => assert_eq!(k.clone_bytes(), a[0].clone_bytes()),
            _ => panic!("customer:1 lost its key"),
        }
        match store.state("customer:3") {
            KeyState::Live(k) => assert_eq!(k.clone_bytes(), c[0].clone_bytes()),
            _ => panic!("customer:3 lost its key"),
        }
        assert!(matches!(store.state("customer:2"), KeyState::Erased));
        assert_eq!(
            store.position().0,
            2,
            "the erasure and the rotation each began an epoch"
        );
    }

    #[test]
    fn a_torn_key_record_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let master = MasterKey::generate().unwrap();
        let io: Arc<dyn Io> = Arc::new(RealIo);
        let store = KeyStore::open(io.clone(), dir.path(), subjects(&master)).unwrap();
        store.keys_for(&["customer:1"]).unwrap();
        store.keys_for(&["customer:2"]).unwrap();
        drop(store);
        let path = dir.path().join(KEYS_FILE);
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 5).unwrap();
        let store = KeyStore::open(io.clone(), dir.path(), subjects(&master)).unwrap();
        assert!(matches!(store.state("customer:1"), KeyState::Live(_)));
        assert!(matches!(store.state("customer:2"), KeyState::Missing));
        store.keys_for(&["customer:3"]).unwrap();
        drop(store);
        let store = KeyStore::open(io, dir.path(), subjects(&master)).unwrap();
        assert!(matches!(store.state("customer:3"), KeyState::Live(_)));
    }

    #[test]
    fn concurrent_new_keys_share_syncs_and_each_tag_gets_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let master = MasterKey::generate().unwrap();
        let io: Arc<dyn Io> = Arc::new(RealIo);
        let store = Arc::new(KeyStore::open(io.clone(), dir.path(), subjects(&master)).unwrap());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let tag = format!("customer:{}", (i * 7 + t) % 300);
                        let k = store.keys_for(&[tag.as_str()]).unwrap();
                        let again = store.keys_for(&[tag.as_str()]).unwrap();
                        assert_eq!(k[0].clone_bytes(), again[0].clone_bytes());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let batches = store.pending.lock().synced;
        assert_eq!(store.counts().0, 300);
        drop(store);
        let store = KeyStore::open(io, dir.path(), subjects(&master)).unwrap();
        assert_eq!(store.counts().0, 300);
        assert!(batches <= 300, "{batches}");
    }
}
