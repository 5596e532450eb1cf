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

/// What the map says of a subject's key.
pub(super) fn state_of(slot: Option<&Slot>) -> KeyState {
    match slot {
        Some(Slot::Live(l)) => KeyState::Live(l.key.clone()),
        Some(Slot::Erased(_)) => KeyState::Erased,
        None => KeyState::Missing,
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
            let key = cipher_key(tags.iter().map(|&t| (t, state_of(map.get(t)))));
            drop(map);
            let key = key.inspect_err(|_| memo.cipher = None)?;
            // The tags' buffers are kept from one subject to the next (a scan changes subject
            // at nearly every event).
            memo.tags.resize_with(tags.len(), String::new);
            for (held, tag) in memo.tags.iter_mut().zip(tags) {
                held.clear();
                held.push_str(tag);
            }
            memo.changes = changes;
            memo.cipher = Some(key.cipher());
        }
        Ok(memo.cipher.as_ref().expect("set above"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::event::NewEvent;
    use crate::io::RealIo;
    use crate::limits::Limits;
    use crate::record::{encode_append_tracked, Entries};
    use crate::seal::{open_entry, seal_append, Opened};
    use crate::subject::{MasterKey, SubjectOptions};

    /// Goal: a reader that remembered a subject's cipher does not open the subject's next
    /// event once the subject is erased, and a reader's memo of one subject never opens
    /// another's events.
    #[test]
    fn a_remembered_cipher_opens_nothing_after_an_erasure() {
        let dir = tempfile::tempdir().unwrap();
        let options = SubjectOptions::new(["customer:"], MasterKey::generate().unwrap());
        let store = KeyStore::open(Arc::new(RealIo), dir.path(), options.clone(), false).unwrap();
        let events = [
            NewEvent::new("Moved", "first address").tag("customer:1"),
            NewEvent::new("Moved", "second address").tag("customer:1"),
            NewEvent::new("Moved", "another's address").tag("customer:2"),
        ];
        let append = encode_append_tracked(&events, None, &Limits::default()).unwrap();
        let sealed = seal_append(append, &options, &store, false).unwrap();
        let entries: Vec<_> = Entries::new(sealed.entries(), 3).collect();
        let mut memo = OpenMemo::default();
        let open = |i: usize, memo: &mut OpenMemo| {
            let (_, entry, layout) = &entries[i];
            let mut opener = Opener {
                keys: Some(&store),
                memo,
            };
            match open_entry(entry, layout, &mut opener) {
                Opened::Clear(_) => "clear",
                Opened::Erased(_) => "erased",
                Opened::Damaged(why) => panic!("{why}"),
            }
        };
        assert_eq!(open(0, &mut memo), "clear");
        assert_eq!(open(1, &mut memo), "clear");
        assert_eq!(open(2, &mut memo), "clear");
        assert_eq!(open(0, &mut memo), "clear");
        store.erase("customer:1", 1, 3).unwrap();
        assert_eq!(
            open(1, &mut memo),
            "erased",
            "the memo held customer:1's cipher"
        );
        assert_eq!(open(2, &mut memo), "clear");
        assert_eq!(open(0, &mut OpenMemo::default()), "erased");
    }
}
