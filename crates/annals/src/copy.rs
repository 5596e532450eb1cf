//! Moving a store between backends (a directory and PostgreSQL, either way): its appends are
//! read whole and in order from one store and appended to the other with their positions, their
//! append times, their tracking and their boundaries (a multi-event append stays one atomic
//! append), then both logs are compared append by append.
//!
//! Each append is written with the condition "no event after the position before it", so it
//! lands at its own position or not at all: a copy into a store that someone else writes to
//! meanwhile stops with a clear error rather than shifting positions. A copy that stopped part
//! way (or ran to the end) is resumed by running it again: a target holding a prefix of the
//! source goes on after it, once the prefix's last append is found equal to the source's.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::error::{AppendError, InputError, ReadError, StoreError};
use crate::query::{AppendCondition, Query, ReadOptions};
use crate::read::ReadIter;
use crate::record::{EncodedAppend, StoredAppend};
use crate::shared::store_error;
use crate::store::Store;

/// The appends of a store in log order (see [`Store::appends`]).
pub struct Appends {
    iter: ReadIter,
}

impl Iterator for Appends {
    type Item = Result<StoredAppend, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.iter.next_record().map_err(ReadError::from).transpose()
    }
}

impl Store {
    /// The appends from the one holding position `after + 1`, whole and in order, up to the
    /// head when this is called: what a copy of the log reads.
    pub fn appends(&self, after: u64) -> Result<Appends, ReadError> {
        let head = self.head();
        let iter = ReadIter::new(
            self.shared_arc().clone(),
            &Query::all(),
            ReadOptions::forwards().from(after + 1),
            head,
        )?;
        Ok(Appends { iter })
    }

    /// Appends `append` at its own positions, with its append time and tracking, or not at
    /// all: it fails with [`AppendError::ConditionFailed`] when the log does not end just
    /// before it. `done` is called with the outcome (its last position) on one of the store's
    /// threads; appends handed over in order are applied in order.
    pub fn append_stored_then(
        &self,
        append: &StoredAppend,
        done: impl FnOnce(Result<u64, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        let encoded = EncodedAppend::from_stored(append.body().to_vec(), append.event_count())
            .map_err(|why| InputError::MalformedStoredAppend {
                position: append.first_position(),
                why: why.to_string(),
            })?;
        let condition = AppendCondition::new(Query::all(), Some(append.first_position() - 1));
        self.submit_stored(encoded, condition, append.appended_at_us(), Box::new(done))
    }
}

/// What [`copy`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CopyReport {
    /// The target's head before the copy: the prefix it already held (0 for an empty target).
    pub resumed_after: u64,
    /// Appends and events written to the target.
    pub copied_appends: u64,
    pub copied_events: u64,
    /// The source's head when the copy started, and the target's after it.
    pub head: u64,
    /// Appends found equal in both logs by the final comparison.
    pub verified_appends: u64,
}

/// What a copy is doing, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPhase {
    Copying,
    Verifying,
}

/// Appends in flight at once, and their bytes: enough for the target to group its commits.
const IN_FLIGHT_APPENDS: usize = 4096;
const IN_FLIGHT_BYTES: usize = 64 << 20;

/// Copies every append of `from` up to its head now into `to`, positions preserved, then
/// compares both logs append by append through that head. `to` must be empty or hold a prefix
/// of `from` (a copy resumed). `progress` is told the phase, the position reached and the
/// source's head.
pub fn copy(
    from: &Store,
    to: &Store,
    progress: &mut dyn FnMut(CopyPhase, u64, u64),
) -> Result<CopyReport, StoreError> {
    let head = from.refresh()?;
    let start = to.refresh()?;
    if start > head {
        return Err(StoreError::Copy(format!(
            "the target's log ends at position {start}, after the source's at {head}: it is \
             not a copy of this source"
        )));
    }
    if start > 0 {
        // The prefix's last append must be the source's, boundaries included.
        let theirs = append_holding(to, start)?;
        let ours = append_holding(from, start)?;
        if theirs.is_none() || theirs != ours {
            return Err(StoreError::Copy(format!(
                "the target holds {start} events that differ from the source's (the append \
                 ending at position {start} is not the same): copy into an empty store"
            )));
        }
    }
    let mut report = CopyReport {
        resumed_after: start,
        head,
        ..CopyReport::default()
    };
    let appends = from
        .appends(start)
        .map_err(store_error)?
        .map(|a| a.map_err(store_error))
        .take_while(|a| a.as_ref().map_or(true, |a| a.first_position() <= head));
    let (copied_appends, copied_events) =
        append_all(to, appends, &mut |p| progress(CopyPhase::Copying, p, head))?;
    report.copied_appends = copied_appends;
    report.copied_events = copied_events;
    progress(CopyPhase::Copying, head, head);
    report.verified_appends = compare(from, to, head, &mut |p| {
        progress(CopyPhase::Verifying, p, head)
    })?;
    Ok(report)
}

/// Appends `appends` to `to` at their own positions, many in flight at once, and waits for
/// the last; `progress` is told the highest position answered. Answers the appends and events
/// written. Stops at the first error, the source's or the target's.
pub(crate) fn append_all(
    to: &Store,
    appends: impl Iterator<Item = Result<StoredAppend, StoreError>>,
    progress: &mut dyn FnMut(u64),
) -> Result<(u64, u64), StoreError> {
    let flight = Arc::new(Flight::default());
    let (mut count, mut events) = (0u64, 0u64);
    for append in appends {
        let append = match append {
            Ok(a) => a,
            Err(e) => {
                flight.wait_all()?;
                return Err(e);
            }
        };
        flight.wait_for_room(append.body().len())?;
        let expected = append.last_position();
        let bytes = append.body().len();
        let done = flight.clone();
        done.sent(bytes);
        let outcome = to.append_stored_then(&append, move |outcome| {
            let error = match outcome {
                Ok(p) if p == expected => None,
                Ok(p) => Some(format!(
                    "the target took the append ending at {expected} at position {p}"
                )),
                Err(AppendError::ConditionFailed { position }) => Some(format!(
                    "the target holds an event at position {position}, where the append \
                     ending at {expected} belongs: something else writes to the target"
                )),
                Err(e) => Some(format!("the append ending at {expected}: {e}")),
            };
            done.answered(bytes, expected, error);
        });
        if let Err(e) = outcome {
            // Never handed over, so never answered: count it out here.
            flight.answered(bytes, 0, Some(e.to_string()));
            flight.wait_all()?;
            unreachable!("an error was recorded");
        }
        count += 1;
        events += u64::from(append.event_count());
        progress(flight.reached());
    }
    flight.wait_all()?;
    Ok((count, events))
}

/// Compares the appends of both stores through position `through`: positions, boundaries,
/// append times, events and tracking. Answers how many appends were compared.
pub fn compare(
    a: &Store,
    b: &Store,
    through: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<u64, StoreError> {
    let mut theirs = b.appends(0).map_err(store_error)?;
    let mut count = 0u64;
    for ours in a.appends(0).map_err(store_error)? {
        let ours = ours.map_err(store_error)?;
        if ours.first_position() > through {
            break;
        }
        let Some(other) = theirs.next().transpose().map_err(store_error)? else {
            return Err(differ(ours.first_position(), "the copy ends before it"));
        };
        if other != ours {
            return Err(differ(
                ours.first_position(),
                &format!(
                    "positions {}..={} at {} us against {}..={} at {} us, or their events",
                    ours.first_position(),
                    ours.last_position(),
                    ours.appended_at_us(),
                    other.first_position(),
                    other.last_position(),
                    other.appended_at_us()
                ),
            ));
        }
        count += 1;
        if count.is_multiple_of(4096) {
            progress(ours.last_position());
        }
    }
    progress(through);
    Ok(count)
}

fn differ(position: u64, what: &str) -> StoreError {
    StoreError::Copy(format!(
        "the copy differs from the source at position {position}: {what}"
    ))
}

/// The append of `store` that holds `position`.
fn append_holding(store: &Store, position: u64) -> Result<Option<StoredAppend>, StoreError> {
    store
        .appends(position - 1)
        .map_err(store_error)?
        .next()
        .transpose()
        .map_err(store_error)
}

/// The appends a copy has handed to the target and not yet seen answered.
#[derive(Default)]
struct Flight {
    state: Mutex<FlightState>,
    changed: Condvar,
}

#[derive(Default)]
struct FlightState {
    appends: usize,
    bytes: usize,
    /// The highest position the target has answered for.
    reached: u64,
    error: Option<String>,
}

impl Flight {
    fn sent(&self, bytes: usize) {
        let mut state = self.state.lock();
        state.appends += 1;
        state.bytes += bytes;
    }

    fn answered(&self, bytes: usize, position: u64, error: Option<String>) {
        let mut state = self.state.lock();
        state.appends -= 1;
        state.bytes -= bytes;
        state.reached = state.reached.max(position);
        if state.error.is_none() {
            state.error = error;
        }
        self.changed.notify_all();
    }

    fn reached(&self) -> u64 {
        self.state.lock().reached
    }

    fn wait_for_room(&self, bytes: usize) -> Result<(), StoreError> {
        let mut state = self.state.lock();
        while state.error.is_none()
            && state.appends > 0
            && (state.appends >= IN_FLIGHT_APPENDS || state.bytes + bytes > IN_FLIGHT_BYTES)
        {
            self.changed.wait(&mut state);
        }
        match &state.error {
            Some(e) => Err(StoreError::Copy(e.clone())),
            None => Ok(()),
        }
    }

    fn wait_all(&self) -> Result<(), StoreError> {
        let mut state = self.state.lock();
        while state.appends > 0 {
            self.changed.wait(&mut state);
        }
        match &state.error {
            Some(e) => Err(StoreError::Copy(e.clone())),
            None => Ok(()),
        }
    }
}
