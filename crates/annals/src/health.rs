//! Whether a store can still answer: poisoned (a write or sync failed, or its outcome is
//! unknown: every later append is refused until the store is reopened), short of disk space
//! (appends that need a new segment are refused until there is room; nothing else stops), or
//! closed.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::error::StoreError;

#[derive(Default)]
pub(crate) struct Health {
    /// Why the store was poisoned: the first reason given.
    reason: Mutex<Option<String>>,
    poisoned: AtomicBool,
    closed: AtomicBool,
    /// Why the last segment could not be had for lack of space, until one could.
    disk_full: Mutex<Option<String>>,
    full: AtomicBool,
    /// Set once a server of a database finds another sealing for data subjects that its own
    /// tag prefixes do not name: why it takes no more appends (it would store their data in
    /// clear) until it is started again with the database's prefixes. Reads go on.
    refusing: std::sync::OnceLock<String>,
}

impl Health {
    /// Poisons the store; the first reason is kept. Never undone.
    pub(crate) fn poison(&self, reason: String) {
        let mut kept = self.reason.lock();
        if kept.is_none() {
            *kept = Some(reason);
        }
        self.poisoned.store(true, Ordering::Release);
    }

    /// From now on, appends are refused for `reason` (the first reason given is kept).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn refuse_appends(&self, reason: String) {
        if self.refusing.set(reason).is_ok() {
            tracing::error!(
                reason = %self.refusing.get().map_or("", String::as_str),
                "appends refused until this server is started again"
            );
        }
    }

    /// Why appends are refused, when they are ([`Health::refuse_appends`]).
    pub(crate) fn appends_refused(&self) -> Option<&str> {
        self.refusing.get().map(String::as_str)
    }

    /// The error every append answers once the store is poisoned.
    pub(crate) fn poison_error(&self) -> Option<StoreError> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        Some(StoreError::Poisoned {
            reason: self.reason.lock().clone().unwrap_or_default(),
        })
    }

    /// Enters the disk-full state (or says why again); true when it was not in it.
    pub(crate) fn enter_disk_full(&self, reason: &str) -> bool {
        *self.disk_full.lock() = Some(reason.to_owned());
        !self.full.swap(true, Ordering::AcqRel)
    }

    /// Leaves the disk-full state; true when it was in it.
    pub(crate) fn leave_disk_full(&self) -> bool {
        if !self.full.load(Ordering::Acquire) {
            return false;
        }
        *self.disk_full.lock() = None;
        self.full.swap(false, Ordering::AcqRel)
    }

    /// Why appends that need a new segment are refused, while the disk is full.
    pub(crate) fn disk_full(&self) -> Option<String> {
        if !self.full.load(Ordering::Acquire) {
            return None;
        }
        self.disk_full.lock().clone()
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}
