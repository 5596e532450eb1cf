//! Whether a store can still answer: poisoned (a write or sync failed, or its outcome is
//! unknown: every later append is refused until the store is reopened) or closed.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::error::StoreError;

#[derive(Default)]
pub(crate) struct Health {
    /// Why the store was poisoned: the first reason given.
    reason: Mutex<Option<String>>,
    poisoned: AtomicBool,
    closed: AtomicBool,
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

    /// The error every append answers once the store is poisoned.
    pub(crate) fn poison_error(&self) -> Option<StoreError> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        Some(StoreError::Poisoned {
            reason: self.reason.lock().clone().unwrap_or_default(),
        })
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}
