//! What readers see of the log: the published head (and where the log ends at it) and how far
//! the log is durable. Readers, subscriptions and checkpoints read them; only the writer's
//! side moves them, and moving them takes a [`PublishRight`], which only the writer module (`writer/`) can make.
//! So "only the writer publishes" is checked by the compiler, and the order of the two (in
//! D3, nothing is published past the synced position) by an assertion.

use std::sync::atomic::{AtomicU64, Ordering};

use event_listener::EventListener;
use parking_lot::Mutex;

use crate::checkpoint::Mark;
use crate::writer::PublishRight;

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
    /// At open: everything the log holds is published and synced.
    pub(crate) fn new(mark: Mark, synced_first: bool) -> Self {
        Published {
            head: AtomicU64::new(mark.head),
            synced: AtomicU64::new(mark.head),
            mark: Mutex::new(mark),
            changed: event_listener::Event::new(),
            synced_first,
        }
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
