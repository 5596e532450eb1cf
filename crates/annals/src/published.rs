//! What readers see of the log: the published head (and where the log ends at it) and how far
//! the log is durable. Readers, subscriptions and checkpoints read them; only the writer's
//! side moves them, and moving them takes the one [`PublishRight`], which the store hands to the
//! writer at open.
//! So "only the writer publishes" is checked by the compiler, and the order of the two (in
//! D3, nothing is published past the synced position) by an assertion.

use std::sync::atomic::{AtomicU64, Ordering};

use event_listener::EventListener;
use parking_lot::Mutex;

/// Where the log stands at a published head: the head, and where its last record is and ends
/// (what an index checkpoint records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) head: u64,
    pub(crate) segment: u32,
    pub(crate) end_offset: u64,
    pub(crate) last_record_offset: u64,
}

/// The right to move what readers see. Its field is private to this module and
/// [`Published::new`] makes the only one, which the store hands to the writer's side (the
/// role's holder, the syncer, the notifier) at open: so "only the writer publishes" is
/// checked by the compiler.
#[derive(Clone, Copy)]
pub(crate) struct PublishRight {
    _private: (),
}

pub(crate) struct Published {
    /// Every event at or below it is acknowledged (and, in D3, durable).
    head: AtomicU64,
    /// The log is durable through this position (a lower bound; records carry it).
    synced: AtomicU64,
    /// Where the log ends at `head`, for checkpoints.
    mark: Mutex<Mark>,
    /// Notified when the head moves, and when the store is poisoned or closed.
    changed: event_listener::Event,
    /// D3: a head is published only once it is synced.
    synced_first: bool,
}

impl Published {
    /// At open: everything the log holds is published and synced. Returns the one right to
    /// move it.
    pub(crate) fn new(mark: Mark, synced_first: bool) -> (Self, PublishRight) {
        let published = Published {
            head: AtomicU64::new(mark.head),
            synced: AtomicU64::new(mark.head),
            mark: Mutex::new(mark),
            changed: event_listener::Event::new(),
            synced_first,
        };
        (published, PublishRight { _private: () })
    }

    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    pub(crate) fn synced(&self) -> u64 {
        self.synced.load(Ordering::Acquire)
    }

    /// The published head with where the log ends at it.
    pub(crate) fn mark(&self) -> Mark {
        *self.mark.lock()
    }

    /// A listener to register before looking at the head, so that no move is missed.
    pub(crate) fn listen(&self) -> EventListener {
        self.changed.listen()
    }

    /// Wakes every listener (the store was poisoned or closed).
    pub(crate) fn wake_all(&self) {
        self.changed.notify(usize::MAX);
    }

    /// Moves the published head forward (never back: the writer and the syncer may both
    /// publish, and the later of two marks wins).
    pub(crate) fn publish(&self, _: &PublishRight, mark: Mark) {
        if self.synced_first {
            let synced = self.synced();
            assert!(
                mark.head <= synced,
                "publishing {} in D3 with the log synced through {synced}",
                mark.head
            );
        }
        {
            let mut current = self.mark.lock();
            if mark.head <= current.head {
                return;
            }
            *current = mark;
            self.head.store(mark.head, Ordering::Release);
        }
        self.changed.notify(usize::MAX);
    }

    /// Records that the log is durable through `through`; it only moves forward.
    pub(crate) fn set_synced(&self, _: &PublishRight, through: u64) {
        let before = self.synced.swap(through, Ordering::AcqRel);
        assert!(
            through >= before,
            "the synced position moved back from {before} to {through}"
        );
    }
}
