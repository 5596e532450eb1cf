//! The map of a store's keys as readers use it: every change is counted, so that a reader
//! opening a run of one subject's events (a read by the subject's tag) looks the key up once and
//! uses it again only while the map did not change. An erasure changes the map before it
//! answers, so no event is opened under an erased key once the erasure has answered.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{KeyMap, KeyStore, Slot};
use crate::aead::Aes256;
use crate::seal::{cipher_key, Ciphers, KeyState, Unopenable};

/// The key map and the count of its changes.
pub(super) struct Held {
    map: RwLock<KeyMap>,
    /// Moved under the write lock, before the map changes.
    changes: AtomicU64,
}

impl Held {
    pub(super) fn new(map: KeyMap) -> Held {
        Held {
            map: RwLock::new(map),
            changes: AtomicU64::new(0),
        }
    }

    pub(super) fn read(&self) -> RwLockReadGuard<'_, KeyMap> {
        self.map.read()
    }

    /// The map to change: counted as changed whatever the caller does with it.
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, KeyMap> {
        let map = self.map.write();
        self.changes.fetch_add(1, Ordering::SeqCst);
        map
    }
}

/// What one reader keeps from one sealed event to the next: the subjects it opened last, the
/// map's change count it looked their keys up at, and their cipher.
#[derive(Default)]
pub(crate) struct OpenMemo {
    tags: Vec<String>,
    changes: u64,
    cipher: Option<Aes256>,
}

impl OpenMemo {
    fn holds(&self, tags: &[&str], changes: u64) -> bool {
        self.cipher.is_some()
            && self.changes == changes
            && self.tags.len() == tags.len()
            && self.tags.iter().zip(tags).all(|(a, b)| a == b)
    }
}

/// The store's keys (none: every sealed event is missing its key) as one reader asks them.
pub(crate) struct Opener<'a> {
    pub(crate) keys: Option<&'a KeyStore>,
    pub(crate) memo: &'a mut OpenMemo,
}

impl Ciphers for Opener<'_> {
    fn cipher(&mut self, tags: &[&str]) -> Result<&Aes256, Unopenable> {
        let Some(store) = self.keys else {
            return Err(Unopenable::Missing(tags.first().unwrap_or(&"").to_string()));
        };
        let memo = &mut *self.memo;
        if !memo.holds(tags, store.keys.changes.load(Ordering::SeqCst)) {
            let map = store.keys.read();
            // Read under the lock: the count that goes with the map as it is now.
            let changes = store.keys.changes.load(Ordering::SeqCst);
            let key = cipher_key(tags.iter().map(|&t| {
                let state = match map.get(t) {
                    Some(Slot::Live(l)) => KeyState::Live(l.key.clone()),
                    Some(Slot::Erased(_)) => KeyState::Erased,
                    None => KeyState::Missing,
                };
                (t, state)
            }));
            drop(map);
            let key = key.inspect_err(|_| memo.cipher = None)?;
            memo.tags.clear();
            memo.tags.extend(tags.iter().map(|t| t.to_string()));
            memo.changes = changes;
            memo.cipher = Some(key.cipher());
        }
        Ok(memo.cipher.as_ref().expect("set above"))
    }
}
