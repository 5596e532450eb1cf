//! The subjects' keys of a store on a database: the table's side of [`KeyStore`] (opening
//! from the table, taking its rows in, inserting new keys, learning other servers' keys).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::{known, KeyMap, KeyStore, Live, NewKey, Pending, Slot};
use crate::error::StoreError;
use crate::io::Io;
use crate::seal::{
    master_check, master_matches, unwrap_key, wrap_key, GivenKey, SealError, SubjectKey,
};
use crate::subject::{MasterKey, SubjectOptions};

/// How a rotation wraps a key again: from its tag and its bytes under the old master key.
pub(crate) type Rewrap<'a> = &'a (dyn Fn(&str, &[u8]) -> Result<Vec<u8>, String> + Sync);

/// Where a store on a database keeps its subjects' keys (PostgreSQL's `annals_subject_keys`).
pub(crate) trait KeyTable: Send + Sync {
    /// The check of the master key as the table holds it, storing `check` first when it
    /// holds none.
    fn master_check(&self, check: &[u8]) -> Result<Vec<u8>, String>;
    /// Every subject's row.
    fn load(&self) -> Result<Vec<(String, TableRow)>, String>;
    /// Stores each wrapped key unless its subject has a row already (another server's key,
    /// or an erasure), durably; answers the rows of these tags as stored.
    fn insert(&self, keys: &[(&str, &[u8])]) -> Result<Vec<(String, TableRow)>, String>;
    /// The rows of `tags` that are stored.
    fn fetch(&self, tags: &[&str]) -> Result<Vec<(String, TableRow)>, String>;
    /// Deletes the subject's key and records its erasure at `at_us` (also for a subject that
    /// has no key), durably; answers when it was erased (earlier, when it already was).
    fn erase(&self, tag: &str, at_us: u64) -> Result<u64, String>;
    /// Replaces, in one transaction, every key with `rewrap` of it and the master key's check
    /// with `check`, provided the table's check is still `is_ours`; no key is inserted under
    /// the old check meanwhile, nor after. Answers how many keys were wrapped again.
    fn rotate(
        &self,
        is_ours: &(dyn Fn(&[u8]) -> bool + Sync),
        check: &[u8],
        rewrap: Rewrap<'_>,
    ) -> Result<u64, String>;
}

/// A subject's row in a [`KeyTable`].
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum TableRow {
    /// Its key, wrapped under the master key.
    Key(Vec<u8>),
    /// Erased at this time (microseconds since the epoch).
    Erased(u64),
}

impl KeyStore {
    /// Opens the keys a database's `table` holds, checking the master key (and storing its
    /// check, for a table that holds none). `dir`: the mirror's, for messages only.
    pub(crate) fn open_table(
        io: Arc<dyn Io>,
        dir: &Path,
        options: SubjectOptions,
        table: Arc<dyn KeyTable>,
    ) -> Result<KeyStore, StoreError> {
        options.validate().map_err(StoreError::InvalidOption)?;
        let unavailable = |reason| StoreError::Unavailable { reason };
        let check = master_check(&options.master_key).map_err(StoreError::Subjects)?;
        let stored = table.master_check(&check).map_err(unavailable)?;
        if !master_matches(&options.master_key, &stored) {
            return Err(StoreError::Subjects(
                "the master key given is not this database's (its subjects' keys were made \
                 under another); start with the store's master key file"
                    .into(),
            ));
        }
        let store = Self::with(
            io,
            dir,
            options,
            KeyMap::default(),
            None,
            (0, 0),
            Some(table),
        );
        let rows = store
            .table
            .as_ref()
            .expect("a table")
            .load()
            .map_err(unavailable)?;
        store.take_rows(rows, None).map_err(StoreError::Subjects)?;
        Ok(store)
    }

    /// Takes a table's rows into the key map; `ours`: keys this store made, by tag, used as
    /// they are when the table holds them (not unwrapped again).
    pub(super) fn take_rows(
        &self,
        rows: Vec<(String, TableRow)>,
        mut ours: Option<&mut HashMap<Box<str>, NewKey>>,
    ) -> Result<(), String> {
        let master = self.master.read().clone();
        let mut taken = Vec::with_capacity(rows.len());
        for (tag, row) in rows {
            let slot = match row {
                TableRow::Erased(at) => Slot::Erased(at),
                TableRow::Key(wrapped) => {
                    let mine = ours.as_deref_mut().and_then(|o| o.remove(tag.as_str()));
                    match mine {
                        Some(new) if *new.wrapped == *wrapped => {
                            Slot::Live(Live::kept(new.key, new.wrapped))
                        }
                        _ => match unwrap_key(&master, &tag, &wrapped) {
                            Some(key) => Slot::Live(Live::kept(key, wrapped.into())),
                            None => {
                                return Err(format!(
                                    "the key of {tag} does not unwrap under this server's \
                                     master key (if another server rotated it, start this \
                                     server with the new master key file)"
                                ))
                            }
                        },
                    }
                }
            };
            taken.push((tag, slot));
        }
        let mut keys = self.keys.write();
        let mut new_keys: Vec<Box<str>> = Vec::new();
        let mut erased = false;
        for (tag, slot) in taken {
            let tag: Box<str> = tag.into();
            let live = matches!(slot, Slot::Live(_));
            match keys.insert(tag.clone(), slot) {
                Some(Slot::Live(_)) if live => {}
                Some(Slot::Erased(_)) if !live => {}
                _ if live => new_keys.push(tag),
                _ => erased = true,
            }
        }
        self.journal_keys(new_keys.iter());
        drop(keys);
        if erased {
            self.generation.next();
        }
        Ok(())
    }

    /// Learns, from the table, the keys of `tags` that this store does not hold yet: subjects
    /// that another server made keys for (or erased). Nothing to learn on files.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn learn(&self, tags: &[&str]) -> Result<(), StoreError> {
        let Some(table) = &self.table else {
            return Ok(());
        };
        let unknown = self.unknown(tags);
        if unknown.is_empty() {
            return Ok(());
        }
        let rows = table
            .fetch(&unknown)
            .map_err(|reason| StoreError::Unavailable { reason })?;
        self.take_rows(rows, None).map_err(StoreError::Subjects)
    }

    /// Wraps every key of the table under `new`, and its master key check, in one
    /// transaction. Another server still holding the old master key reads on with the keys
    /// it holds and makes no new key (the table refuses keys under the old check) until it is
    /// started with `new`.
    pub(super) fn rotate_table(&self, new: &MasterKey) -> Result<u64, StoreError> {
        let table = self.table.clone().expect("keys in a table");
        let mut p = self.pending.lock();
        self.wait_idle(&mut p);
        let old = self.master.read().clone();
        let check = master_check(new).map_err(StoreError::Subjects)?;
        let rewrap = |tag: &str, wrapped: &[u8]| -> Result<Vec<u8>, String> {
            let key = unwrap_key(&old, tag, wrapped)
                .ok_or_else(|| format!("the key of {tag} does not unwrap under the master key"))?;
            wrap_key(new, tag, &key)
        };
        let is_ours = |stored: &[u8]| master_matches(&old, stored);
        let count = table
            .rotate(&is_ours, &check, &rewrap)
            .map_err(StoreError::Subjects)?;
        *self.master.write() = new.clone();
        let mut keys = self.keys.write();
        for (tag, slot) in keys.iter_mut() {
            if let Slot::Live(live) = slot {
                live.wrapped = wrap_key(new, tag, &live.key)
                    .map_err(StoreError::Subjects)?
                    .into();
            }
        }
        drop(keys);
        // The backup's keys are wrapped under the old master key: an image anew.
        self.generation.next();
        drop(p);
        Ok(count)
    }

    /// Those of `tags` whose key is still where the store keeps it (in the table, or on
    /// files in the key file), whatever this store marked in memory.
    pub(crate) fn still_kept(&self, tags: &[&str]) -> Result<Vec<String>, StoreError> {
        let Some(table) = &self.table else {
            let keys = self.keys.read();
            return Ok(tags
                .iter()
                .filter(|t| matches!(keys.get(**t), Some(Slot::Live(..))))
                .map(|t| t.to_string())
                .collect());
        };
        let rows = table
            .fetch(tags)
            .map_err(|reason| StoreError::Unavailable { reason })?;
        Ok(rows
            .into_iter()
            .filter(|(_, row)| matches!(row, TableRow::Key(_)))
            .map(|(tag, _)| tag)
            .collect())
    }

    /// The keys of `tags`, those the table does not hold made and inserted first (callers
    /// that need new keys at once share one insert), or taken from the table when another
    /// server made them first.
    pub(super) fn insert_keys(&self, tags: &[&str]) -> Result<Vec<GivenKey>, SealError> {
        let table = self.table.clone().expect("keys in a table");
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
                p.writing = true;
                p.begun += 1;
                let batch = p.begun;
                let tags = std::mem::take(&mut p.next);
                self.insert_batch(&mut p, table.as_ref(), batch, tags);
            }
        }
        drop(p);
        match known(&self.keys.read(), tags)? {
            Some(keys) => Ok(keys),
            // Erased while this append waited for its new key.
            None => Err(SealError::Keys("a key vanished while it was made".into())),
        }
    }

    /// Inserts the next batch of new keys into the table, with the pending lock released; a
    /// subject another server made a key for (or erased) first takes the table's row.
    fn insert_batch(
        &self,
        p: &mut parking_lot::MutexGuard<'_, Pending>,
        table: &dyn KeyTable,
        batch: u64,
        tags: Vec<Box<str>>,
    ) {
        let new: Vec<(Box<str>, Box<[u8]>)> = tags
            .iter()
            .map(|t| (t.clone(), p.unsynced[t].wrapped.clone()))
            .collect();
        let outcome = parking_lot::MutexGuard::unlocked(p, || {
            let refs: Vec<(&str, &[u8])> = new.iter().map(|(t, w)| (&**t, &**w)).collect();
            table.insert(&refs)
        });
        let mut ours: HashMap<Box<str>, NewKey> = tags
            .iter()
            .filter_map(|t| p.unsynced.remove(t).map(|k| (t.clone(), k)))
            .collect();
        let taken = outcome.and_then(|rows| self.take_rows(rows, Some(&mut ours)));
        if let Err(reason) = taken {
            tracing::warn!(reason = reason.as_str(), "subjects: new keys not stored");
            p.refused = Some((batch, reason));
        }
        p.synced = batch;
        p.writing = false;
        self.synced.notify_all();
    }
}
