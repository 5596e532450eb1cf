//! A caller waiting for its outcome: counted while it waits, polling briefly when alone.

use super::*;

/// The longest a lone caller polls for its outcome (see [`Waiting`]).
const LONE_POLL_MAX: Duration = Duration::from_millis(2);

/// A caller waiting for its append's outcome, counted in `Shared::waiting` until it has it.
///
/// A caller that waits alone polls for its outcome, for about one and a half recent
/// fdatasyncs, before it sleeps. Nothing else then wants the CPU, and on a virtual machine
/// whose idle cores halt, waking a sleeping caller costs tens of microseconds, a good part
/// of a decision (docs/DECISIONS.md, R8). When other callers wait too, or the disk is slow enough
/// that the wake-up is noise, it sleeps at once: polling would take a core from the others.
pub(crate) struct Waiting<'a> {
    shared: &'a Shared,
    until: Option<Instant>,
    alone: bool,
}

impl<'a> Waiting<'a> {
    pub(crate) fn start(shared: &'a Shared) -> Self {
        let others = shared.waiting.fetch_add(1, Ordering::Relaxed);
        let alone = others == 0;
        let until = if alone {
            lone_poll_budget(shared).map(|budget| Instant::now() + budget)
        } else {
            None
        };
        Waiting {
            shared,
            until,
            alone,
        }
    }

    /// No other caller was waiting on the store when this one began.
    pub(crate) fn alone(&self) -> bool {
        self.alone
    }

    /// Whether to poll once more: while alone and within the budget.
    pub(crate) fn keep_polling(&self) -> bool {
        match self.until {
            Some(until) => {
                self.shared.waiting.load(Ordering::Relaxed) == 1 && Instant::now() < until
            }
            None => false,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a lone caller polls: one and a half recent fdatasyncs in D3, plus 100 us for the
/// writer's own work; none when that exceeds [`LONE_POLL_MAX`] (a disk that slow makes the
/// wake-up noise, and polling would hold a core for milliseconds per append).
fn lone_poll_budget(shared: &Shared) -> Option<Duration> {
    let expected_us = match shared.options.durability {
        Durability::Synced | Durability::OffMachine => {
            shared.counters.fsync_recent_us.load(Ordering::Relaxed)
        }
        _ => 0,
    };
    let budget = Duration::from_micros(expected_us * 3 / 2 + 100);
    (budget <= LONE_POLL_MAX).then_some(budget)
}
