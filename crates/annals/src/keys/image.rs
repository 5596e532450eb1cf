//! The backup's copy of the keys of a store whose keys live in a database's table: a key file
//! image (the format of `file.rs`), made from what this server holds in memory, since the
//! backup holds no table.
//!
//! Every record this server's mirror holds is sealed under a key the server took in first
//! (its own, inserted before its append committed; another server's, learned from the table
//! before the mirror takes that append in), so an image of the keys held when a put begins
//! covers every record the put carries. The shipper puts a whole image in a new epoch, then
//! the keys taken in since as records after it; an erasure (or a master key rotation) ends
//! the generation, and the next image is whole again, in the next epoch, after which the
//! older epochs' objects are deleted, so that an erased subject's key leaves the backup.
//!
//! The image's wrapping key is a fresh one that wraps nothing: a table's appends carry no
//! grants.
//!
//! The other way, a key file (a directory store's, or a backup's) goes into a table after a
//! restore or a copy into a database: its keys, those the copied log carries as grants under
//! its wrapping key, and its erasures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::file::{encode_record, header, KIND_ERASED, KIND_KEY};
use super::{KeyMap, KeyStore, Slot};
use crate::error::StoreError;
use crate::seal::WrapKey;
use crate::subject::SubjectOptions;

/// The keys taken in since the last image, while a backup records them.
#[derive(Default)]
pub(super) struct Journal {
    /// Whether a backup records them (nothing is kept without one).
    on: bool,
    /// The tags given a key, in order.
    tags: Vec<Box<str>>,
}

/// Ends a generation: an erasure or a rotation changed keys the backup may hold.
#[derive(Default)]
pub(super) struct Generation(AtomicU64);

impl Generation {
    pub(super) fn next(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

impl KeyStore {
    /// Notes keys just taken into `keys` for the backup (the key map's write lock held, so
    /// that an image sees each key either in the map or here after it).
    pub(super) fn journal_keys<'a>(&self, tags: impl Iterator<Item = &'a Box<str>>) {
        let mut journal = self.journal.lock();
        if journal.on {
            journal.tags.extend(tags.cloned());
        }
    }

    /// Keeps no more keys aside for the backup (it stopped, or another server ships): the
    /// next image is whole and starts the noting again.
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn stop_noting(&self) {
        let mut journal = self.journal.lock();
        journal.on = false;
        journal.tags = Vec::new();
    }

    /// The generation of the keys (the next whole image is due when it moved).
    pub(crate) fn image_generation(&self) -> u64 {
        self.generation.get()
    }

    /// A whole image in `epoch`: every key and erasure this store holds, with its generation.
    /// For the backup (`note`), the keys noted so far are in it and those noted later follow
    /// it: the first such call starts the noting.
    pub(crate) fn image_whole(
        &self,
        epoch: u64,
        covered: u64,
        note: bool,
    ) -> Result<(u64, Vec<u8>), StoreError> {
        let keys = self.keys.read();
        let mut journal = self.journal.lock();
        let generation = self.generation.get();
        let master = self.master.read().clone();
        let wrap = WrapKey::generate(epoch).map_err(StoreError::Subjects)?;
        let mut bytes = header(&master, epoch, &wrap, covered).map_err(StoreError::Subjects)?;
        let mut tags: Vec<&Box<str>> = keys.keys().collect();
        tags.sort();
        for tag in tags {
            encode_slot(&mut bytes, tag, &keys[tag]);
        }
        if note {
            journal.on = true;
            journal.tags.clear();
        }
        Ok((generation, bytes))
    }

    /// The records of the keys noted since the last image or call, and the generation they
    /// belong to (None when there are none).
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn image_since(&self) -> Option<(u64, Vec<u8>)> {
        let keys = self.keys.read();
        let mut journal = self.journal.lock();
        if journal.tags.is_empty() {
            return None;
        }
        let mut bytes = Vec::new();
        for tag in journal.tags.drain(..) {
            if let Some(slot) = keys.get(&tag) {
                encode_slot(&mut bytes, &tag, slot);
            }
        }
        Some((self.generation.get(), bytes))
    }
}

impl KeyStore {
    /// The keys of `bytes` (a key file: a directory store's, or the one a backup holds),
    /// held in memory only, to take the grants of a log in and hand them all to a table
    /// ([`KeyStore::import`]).
    pub(crate) fn from_key_file(
        options: SubjectOptions,
        bytes: &[u8],
    ) -> Result<KeyStore, StoreError> {
        let mut keys = KeyMap::default();
        let path = std::path::Path::new(super::KEYS_FILE);
        let loaded = super::file::load(path, bytes, &options.master_key, &mut keys)?;
        let io = Arc::new(crate::io::RealIo);
        Ok(Self::loaded(io, path, options, keys, None, loaded, true))
    }

    /// Puts the keys and erasures `from` holds into this store's table (a restore or a copy
    /// into a database): a subject the table holds a row for already keeps it. Answers how
    /// many keys `from` held.
    pub(crate) fn import(&self, from: &KeyStore) -> Result<u64, StoreError> {
        let table = self.table.clone().ok_or_else(|| {
            StoreError::InvalidOption("this store keeps its subjects' keys in a key file".into())
        })?;
        let unavailable = |reason| StoreError::Unavailable { reason };
        let mut live: Vec<(Box<str>, Box<[u8]>)> = Vec::new();
        let mut erased: Vec<(Box<str>, u64)> = Vec::new();
        for (tag, slot) in from.keys.read().iter() {
            match slot {
                Slot::Live(l) => live.push((tag.clone(), l.wrapped.clone())),
                Slot::Erased(at) => erased.push((tag.clone(), *at)),
            }
        }
        let mut p = self.pending.lock();
        self.wait_idle(&mut p);
        for batch in live.chunks(IMPORT_BATCH) {
            let refs: Vec<(&str, &[u8])> = batch.iter().map(|(t, w)| (&**t, &**w)).collect();
            table.insert(&refs).map_err(unavailable)?;
        }
        for (tag, at) in &erased {
            table.erase(tag, *at).map_err(unavailable)?;
        }
        let rows = table.load().map_err(unavailable)?;
        self.take_rows(rows, None).map_err(StoreError::Subjects)?;
        Ok(live.len() as u64)
    }
}

/// How many keys one insert of an import carries.
const IMPORT_BATCH: usize = 10_000;

fn encode_slot(bytes: &mut Vec<u8>, tag: &str, slot: &Slot) {
    match slot {
        Slot::Live(live) => encode_record(bytes, KIND_KEY, tag, &live.wrapped),
        Slot::Erased(at) => encode_record(bytes, KIND_ERASED, tag, &at.to_le_bytes()),
    }
}

/// Sets `tag` erased at `at_us` in `keys`; whether it was not erased before (a new
/// generation is due).
pub(super) fn set_erased(keys: &mut KeyMap, tag: &str, at_us: u64) -> bool {
    let before = keys.insert(tag.into(), Slot::Erased(at_us));
    !matches!(before, Some(Slot::Erased(_)))
}
