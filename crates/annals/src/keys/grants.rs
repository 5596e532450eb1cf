//! Grants on files: new keys made for the log to carry, the key file taking them in behind
//! the log, and the keys taken in from the grants a log holds (at open, and on a read replica
//! as it follows its primary).
//!
//! Why a key in the log is as safe as one in the key file: an append sealed under a key the
//! key file does not hold carries the key, so it is durable exactly when the append is; the
//! key file records through which position it holds every grant, and an open reads the grants
//! after that. Why an erasure still removes every copy: the grants are wrapped under the key
//! file's wrapping key, which the erasure replaces after writing every other key into the new
//! file; a grant under an older wrapping key is never needed again.

use std::cmp::Ordering;
use std::sync::atomic::Ordering as Atomic;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::file::{encode_record, load, KIND_COVERED, KIND_KEY};
use super::{io_error, known, KeyMap, KeyStore, Live, Slot};
use crate::error::StoreError;
use crate::record::Entries;
use crate::seal::{entry_grants, wrap_key, GivenKey, SealError, SubjectKey};

/// How long a new key waits, at most, before the key file takes it in (appends carry it
/// meanwhile), and how many may wait.
const FRESH_FOR: Duration = Duration::from_secs(1);
const FRESH_MAX: usize = 1 << 16;

/// What [`KeyStore::take_in`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TakenIn {
    /// This many keys were new to the store.
    Keys(usize),
    /// A grant under a wrapping key newer than the key file's: the key file is older than
    /// the log (a replica's, whose primary erased a subject since).
    NewerWrap(u64),
}

impl KeyStore {
    /// The keys of `tags`, made for those that have none: each new key wrapped under the
    /// master key (for the key file, later) and under the wrapping key (the grant its appends
    /// carry). Nothing is written here.
    pub(super) fn make_keys(&self, tags: &[&str]) -> Result<Vec<GivenKey>, SealError> {
        let p = self.pending.lock();
        let wrap = match (&p.wrap, p.following) {
            (Some(wrap), false) => wrap,
            _ => {
                return Err(SealError::Keys(
                    "this store makes no keys: it follows another's".into(),
                ))
            }
        };
        // Made with only the pending lock held (it keeps makers and the key file's writers
        // apart); the map, which every sealed read looks in, is locked to insert them only.
        let missing = self.unknown(tags);
        let master = self.master.read();
        let mut made = Vec::with_capacity(missing.len());
        for t in missing {
            let key = SubjectKey::generate().map_err(SealError::Keys)?;
            let wrapped = wrap_key(&master, t, &key).map_err(SealError::Keys)?;
            let grant = wrap.grant(t, &key).map_err(SealError::Keys)?;
            let live = Live {
                key,
                wrapped: wrapped.into(),
                kept: false,
                grant: Some(Arc::new(grant)),
            };
            made.push((t, live));
        }
        let mut keys = self.keys.write();
        for (t, live) in made {
            keys.insert(t.into(), Slot::Live(live));
            self.count_fresh();
        }
        known(&keys, tags)?.ok_or_else(|| SealError::Keys("a key vanished as it was made".into()))
    }

    /// Counts one more key that the key file does not hold, noting when the first waited.
    fn count_fresh(&self) {
        if self.fresh.fetch_add(1, Atomic::Relaxed) == 0 {
            self.fresh_since.lock().get_or_insert_with(Instant::now);
        }
    }

    /// Whether the key file should take in the new keys now: the oldest has waited
    /// [`FRESH_FOR`], or [`FRESH_MAX`] wait.
    pub(crate) fn persist_due(&self) -> bool {
        match self.fresh.load(Atomic::Relaxed) {
            0 => false,
            n if n >= FRESH_MAX => true,
            _ => self
                .fresh_since
                .lock()
                .is_some_and(|since| since.elapsed() >= FRESH_FOR),
        }
    }

    /// Writes the keys the key file does not hold yet, then a record that it holds every
    /// grant through `covered`, and syncs: from then on those keys travel in no append.
    /// `covered`: the head, read before this is called (every grant through it was made
    /// before, so its key is among those written). Nothing to do in a table or on a replica.
    pub(crate) fn persist(&self, covered: u64) -> Result<(), StoreError> {
        if self.table.is_some() {
            return Ok(());
        }
        let mut p = self.pending.lock();
        self.wait_idle(&mut p);
        let Some(file) = p.file.clone().filter(|_| !p.following && p.wrap.is_some()) else {
            return Ok(());
        };
        let mut bytes = Vec::new();
        let mut written = Vec::new();
        for (t, slot) in self.keys.read().iter() {
            if let Slot::Live(live) = slot {
                if !live.kept {
                    encode_record(&mut bytes, KIND_KEY, t, &live.wrapped);
                    written.push(t.clone());
                }
            }
        }
        if written.is_empty() && p.covered.is_some_and(|c| c >= covered) {
            return Ok(());
        }
        encode_record(&mut bytes, KIND_COVERED, "", &covered.to_le_bytes());
        let at = p.len;
        p.writing = true;
        let outcome = parking_lot::MutexGuard::unlocked(&mut p, || {
            file.write_at(&bytes, at)?;
            file.sync_data()
        });
        p.writing = false;
        self.synced.notify_all();
        // Not written: the keys go on travelling as grants, and the next try writes them at
        // the same offset.
        outcome.map_err(|e| io_error(&self.path(), "write", e))?;
        p.len += bytes.len() as u64;
        p.covered = p.covered.max(Some(covered));
        let mut keys = self.keys.write();
        let kept = written.len();
        for t in written {
            if let Some(Slot::Live(live)) = keys.get_mut(&t) {
                live.mark_kept();
            }
        }
        // Keys made while the file was written wait on, from now.
        let before = self.fresh.fetch_sub(kept, Atomic::Relaxed);
        debug_assert!(before >= kept, "every key written was counted as waiting");
        *self.fresh_since.lock() = (before > kept).then(Instant::now);
        Ok(())
    }

    /// Through which position the key file holds every grant in the log (None: a key file
    /// of version 1, made before grants, or a table).
    pub(crate) fn covered(&self) -> Option<u64> {
        self.pending.lock().covered
    }

    /// Writes a key file of version 1 anew, with a wrapping key, before the store makes a
    /// key. `covered`: the head.
    pub(crate) fn upgrade(&self, covered: u64) -> Result<(), StoreError> {
        if self.table.is_some() {
            return Ok(());
        }
        let mut p = self.pending.lock();
        self.wait_idle(&mut p);
        if p.wrap.is_some() || p.following {
            return Ok(());
        }
        self.rewrite(&mut p, None, None, covered)
    }

    /// Takes in the keys that the `count` entries of `entries` (an append from the log)
    /// carry and the store does not hold: at open, from the log after the key file's
    /// covered position; on a replica, from each append it follows. A grant under an older
    /// wrapping key is passed over: an erasure wrote its key into the key file (or the key
    /// was the one erased).
    pub(crate) fn take_in(&self, entries: &[u8], count: u32) -> Result<TakenIn, StoreError> {
        let p = self.pending.lock();
        let master = self.master.read();
        let mut taken = 0;
        for (_, entry, layout) in Entries::new(entries, count).trusted() {
            if !layout.sealed {
                continue;
            }
            let grants = entry_grants(entry, &layout).ok_or_else(|| {
                StoreError::Subjects("a sealed event in the log has a malformed envelope".into())
            })?;
            for grant in grants {
                let Some(wrap) = &p.wrap else {
                    return Ok(TakenIn::NewerWrap(grant.wrap_id));
                };
                match grant.wrap_id.cmp(&wrap.id()) {
                    Ordering::Less => continue,
                    Ordering::Greater => return Ok(TakenIn::NewerWrap(grant.wrap_id)),
                    Ordering::Equal => {}
                }
                if self.keys.read().contains_key(grant.tag) {
                    continue;
                }
                let key = wrap.open_grant(grant.tag, grant.wrapped).ok_or_else(|| {
                    StoreError::Subjects(format!(
                        "the key of {} that the log carries does not open under the key \
                         file's wrapping key",
                        grant.tag
                    ))
                })?;
                let wrapped = wrap_key(&master, grant.tag, &key).map_err(StoreError::Subjects)?;
                let live = Live {
                    key,
                    wrapped: wrapped.into(),
                    kept: false,
                    grant: None,
                };
                self.keys.write().insert(grant.tag.into(), Slot::Live(live));
                taken += 1;
                // A replica's keys go to no key file of its own.
                if !p.following {
                    self.count_fresh();
                }
            }
        }
        Ok(TakenIn::Keys(taken))
    }

    /// Takes the keys of `bytes` (a key file, as a backup holds it) in place of those held:
    /// a read replica following its primary's keys. The keys it took in from grants and the
    /// file does not hold yet stay. Its own file is not written.
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn replace(&self, bytes: &[u8]) -> Result<(), StoreError> {
        let mut keys = KeyMap::default();
        let loaded = load(&self.path(), bytes, &self.master.read(), &mut keys)?;
        let mut p = self.pending.lock();
        debug_assert!(p.following, "a replica's keys are its primary's");
        let mut held = self.keys.write();
        for (tag, slot) in held.drain() {
            match slot {
                // A key the file does not hold yet (learned from the log since).
                Slot::Live(live) if !keys.contains_key(&tag) => {
                    keys.insert(tag, Slot::Live(live));
                }
                // An erasure is for good: a receipt taken in before the primary's new key
                // file reached the backup outranks the older file's key.
                Slot::Erased(at) => {
                    keys.insert(tag, Slot::Erased(at));
                }
                Slot::Live(_) => {}
            }
        }
        *held = keys;
        p.epoch = loaded.epoch;
        p.len = loaded.valid as u64;
        p.wrap = loaded.wrap;
        p.covered = loaded.covered;
        Ok(())
    }
}
