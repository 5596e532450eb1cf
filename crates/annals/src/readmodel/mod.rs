//! Read models: named projections kept up to date outside any request.
//!
//! A runner owns one model and follows the store through a [`Subscription`] on the model's
//! query, so catching up after a restart and following live appends are one path. Two kinds:
//!
//! - A [`ReadModel`] folds events into state held in memory. Its runner saves the state and the
//!   position it reflects together in one checkpoint file (written aside, synced, renamed), so a
//!   restart resumes exactly where the last checkpoint stopped and folds the rest again. The
//!   checkpoint is a saved state ([`crate::state`]): one that does not fit any more (another
//!   model version, another query, a log that no longer holds the event it was taken at, or
//!   a data subject it saw erased since) is discarded and the model rebuilt.
//! - A [`Reactor`] turns events into new events appended to the store (an effect). Its
//!   checkpoint is the store's tracking position for its name, written in the same record as
//!   the effects, so a crash can neither lose an effect nor write one twice.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use annals::readmodel::{Folded, ReadModelRunner, RunnerOptions};
//! use annals::{NewEvent, Options, Query, QueryItem, Store};
//!
//! let store = Arc::new(Store::open_in_memory(Options::default()).unwrap());
//! let seats = Folded::new(
//!     "seats-taken",
//!     Query::item(QueryItem::types(["StudentEnrolled"])),
//!     0u64,
//!     |taken: &mut u64, _event| *taken += 1,
//! );
//! let runner = ReadModelRunner::start(&store, seats, RunnerOptions::default()).unwrap();
//! let position = store
//!     .append(&[NewEvent::new("StudentEnrolled", "").tag("course:c1")], None)
//!     .unwrap();
//! assert!(runner.wait_for(position, Duration::from_secs(5)));
//! assert_eq!(runner.read(|model| *model.state()), 1);
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::append::{AppendOptions, Tracking};
use crate::companions::InDirectory;
use crate::error::{AppendError, ReadError, StoreError};
use crate::event::{Event, NewEvent};
use crate::options::Durability;
use crate::query::{Query, QueryItem, ReadOptions};
use crate::state::{now_us, StateId, Subjects};
use crate::store::Store;
use crate::subscription::Subscription;

mod checkpoints;
mod runners;

use checkpoints::*;
pub use checkpoints::{list_checkpoints, remove_checkpoint, SavedCheckpoint};
pub use runners::{ReactorRunner, ReadModelRunner};

/// The directory, inside a store's data directory, that holds read-model checkpoints.
pub const CHECKPOINT_DIR: &str = "readmodels";

const EXTENSION: &str = ".model";

/// Longest read-model name, in bytes.
pub const NAME_MAX: usize = 64;

/// State folded from the events of a query, kept up to date by a [`ReadModelRunner`].
pub trait ReadModel: Send + 'static {
    /// A stable name: 1 to 64 ASCII letters, digits, '-', '_' or '.'. It names the checkpoint.
    fn name(&self) -> &str;
    fn query(&self) -> Query;
    /// Raise it when the fold changes meaning: a checkpoint of another version is discarded
    /// and the model rebuilt from the first event.
    fn version(&self) -> u32 {
        1
    }
    fn apply(&mut self, event: &Event);
    /// Back to the state before any event.
    fn reset(&mut self);
    /// The state as bytes, for the checkpoint.
    fn save(&self, out: &mut Vec<u8>);
    /// The state from the bytes [`ReadModel::save`] wrote. An error discards the checkpoint
    /// (its message is the reason the model reports) and the model is rebuilt.
    fn load(&mut self, bytes: &[u8]) -> Result<(), LoadError>;
}

/// Why a read model's saved state does not load: any error, boxed (a `String` or `&str`
/// converts into it with `?` or `.into()`).
pub type LoadError = Box<dyn std::error::Error + Send + Sync>;

/// A read model made of a name, a query, an initial state and a fold; the state is
/// checkpointed as JSON.
pub struct Folded<S, F> {
    name: String,
    query: Query,
    version: u32,
    initial: S,
    state: S,
    fold: F,
}

impl<S, F> Folded<S, F>
where
    S: Clone + Serialize + DeserializeOwned + Send + 'static,
    F: FnMut(&mut S, &Event) + Send + 'static,
{
    pub fn new(name: impl Into<String>, query: Query, initial: S, fold: F) -> Self {
        Folded {
            name: name.into(),
            query,
            version: 1,
            state: initial.clone(),
            initial,
            fold,
        }
    }

    /// See [`ReadModel::version`].
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    pub fn state(&self) -> &S {
        &self.state
    }
}

impl<S, F> ReadModel for Folded<S, F>
where
    S: Clone + Serialize + DeserializeOwned + Send + 'static,
    F: FnMut(&mut S, &Event) + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn query(&self) -> Query {
        self.query.clone()
    }

    fn version(&self) -> u32 {
        self.version
    }

    fn apply(&mut self, event: &Event) {
        (self.fold)(&mut self.state, event)
    }

    fn reset(&mut self) {
        self.state = self.initial.clone();
    }

    fn save(&self, out: &mut Vec<u8>) {
        // Serializing plain data into a Vec cannot fail; a state that refuses to serialize is
        // a programming error in the state type.
        serde_json::to_writer(out, &self.state).expect("read-model state serializes as JSON");
    }

    fn load(&mut self, bytes: &[u8]) -> Result<(), LoadError> {
        self.state = serde_json::from_slice(bytes)?;
        Ok(())
    }
}

/// Turns events into effects appended to the store, each exactly once (see the module
/// documentation). `react` must depend only on the event (and on what it reads from the
/// store): after a crash, events after the last effect are reacted to again.
pub trait Reactor: Send + 'static {
    /// A stable name: it is the tracking source in the store (1 to 64 bytes as for
    /// [`ReadModel::name`]).
    fn name(&self) -> &str;
    fn query(&self) -> Query;
    /// Pushes the effects of `event` (none is fine) onto `effects`.
    fn react(&mut self, event: &Event, effects: &mut Vec<NewEvent>);
}

/// Why a runner could not start or do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ReadModelError {
    #[error(
        "invalid read-model name {0:?}: use 1 to {NAME_MAX} ASCII letters, digits, '-', '_' or '.'"
    )]
    InvalidName(String),
    #[error("read model {0:?} is already running on this store")]
    AlreadyRunning(String),
    #[error("read model {0:?}: a reactor's effects are in the store and cannot be rebuilt")]
    CannotRebuild(String),
    #[error("read model {name:?}: damaged checkpoint {path}: {reason}")]
    Damaged {
        name: String,
        path: PathBuf,
        reason: String,
    },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Append(#[from] AppendError),
}

/// Checks a read-model name (see [`ReadModel::name`]).
pub fn validate_name(name: &str) -> Result<(), ReadModelError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ReadModelError::InvalidName(name.to_owned()))
    }
}

/// How a runner batches and checkpoints.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// Most events folded per step (the model's lock is held for one step).
    pub batch_max: usize,
    /// Write a checkpoint after this many events have been folded since the last one...
    pub checkpoint_events: u64,
    /// ...or when this much time has passed with something new folded.
    pub checkpoint_interval: Duration,
    /// How often an idle runner looks for a stop or rebuild request.
    pub poll: Duration,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            batch_max: 1024,
            checkpoint_events: 50_000,
            checkpoint_interval: Duration::from_secs(1),
            poll: Duration::from_millis(50),
        }
    }
}

/// What a runner keeps up to date.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunnerKind {
    /// A [`ReadModel`]: state in memory, checkpoint file.
    State,
    /// A [`Reactor`]: effects appended to the store, checkpoint = tracking position.
    Effects,
}

/// A runner's progress, for status commands and metrics.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadModelStatus {
    pub name: String,
    pub kind: RunnerKind,
    pub running: bool,
    /// Every matching event at or below this position has been folded (or reacted to).
    pub position: u64,
    /// The position the durable checkpoint holds: a restart resumes after it.
    pub checkpoint_position: u64,
    /// The store's head when the status was taken.
    pub head: u64,
    /// Store positions still to be scanned: head - position.
    pub lag: u64,
    /// Events folded (or reacted to) by this runner since it started.
    pub events_applied: u64,
    /// Checkpoints written (for a reactor: appends of effects) since it started.
    pub checkpoints: u64,
    /// Effects appended since it started (reactors only).
    pub effects_appended: u64,
    /// Times the model was folded again from the first event since the runner started: asked
    /// for, or because a data subject it saw was erased (a checkpoint refused at the start for
    /// an erasure counts as one).
    pub rebuilds: u64,
    /// Where the runner started: after this position.
    pub resumed_from: u64,
    /// Why the runner last started from scratch, if it did.
    pub rebuilt_because: Option<String>,
    /// The last error; a runner with an error keeps retrying unless the store is poisoned or
    /// closed.
    pub error: Option<String>,
    /// Steps that failed and were retried: a checkpoint that could not be written (a full
    /// disk, say) or an effect not appended. They never stop the store's appends.
    pub failures: u64,
}

/// What the generic runner loop drives: a read model or a reactor.
trait Driver: Send + 'static {
    /// Where to resume: after this position. `rebuild` asks to start from scratch.
    fn start(&mut self, store: &Store, rebuild: bool) -> Result<Start, ReadModelError>;
    /// Folds or reacts to one batch; `position` is where the subscription stands after it.
    fn apply(
        &mut self,
        store: &Store,
        events: &[Event],
        position: u64,
    ) -> Result<(), ReadModelError>;
    /// Called when caught up or after each batch: writes a checkpoint if one is due (`force`:
    /// whenever there is something new).
    fn checkpoint(&mut self, store: &Store, force: bool) -> Result<(), ReadModelError>;
    fn position(&self) -> u64;
    fn checkpoint_position(&self) -> u64;
    /// Checkpoints written (for a reactor: appends of effects) and effects appended.
    fn counters(&self) -> (u64, u64);
    /// Whether what it holds is derived from events' data, and must be built again when a
    /// data subject it saw is erased (a read model's state; not a reactor's, whose effects are
    /// in the log already and would be appended twice).
    fn forgets_erased(&self) -> bool {
        false
    }
}

/// The first data subject erased by a receipt after `*receipts_after` whose events the model
/// of `query` folded (at or before `position`); `*receipts_after` moves past the receipts
/// looked at. An erased subject's events read back without data, so a model built again no
/// longer holds what it derived from them.
fn erased_subject_seen(
    store: &Store,
    query: &Query,
    receipts_after: &mut u64,
    position: u64,
) -> Result<Option<String>, ReadError> {
    let receipts = Query::item(QueryItem::types([crate::subject::SUBJECT_ERASED_TYPE]));
    for receipt in store.read(&receipts, ReadOptions::forwards().after(*receipts_after))? {
        let receipt = receipt?;
        for tag in receipt.tags() {
            let items: Vec<QueryItem> = match query.items.is_empty() {
                true => vec![QueryItem::tags([tag])],
                false => query
                    .items
                    .iter()
                    .map(|item| match item.tags.iter().any(|t| t == tag) {
                        true => item.clone(),
                        false => item.clone().and_tags([tag]),
                    })
                    .collect(),
            };
            let first = store
                .read(&Query { items }, ReadOptions::forwards().limit(1))?
                .next()
                .transpose()?;
            // Folded by the model, and before the receipt (a model that matches receipts
            // themselves did not see the subject's data in one).
            if first.is_some_and(|e| e.position() <= position && e.position() < receipt.position())
            {
                *receipts_after = receipt.position();
                return Ok(Some(tag.to_string()));
            }
        }
        // Moved past only once every tag of the receipt was looked at.
        *receipts_after = receipt.position();
    }
    Ok(None)
}

/// A read model's watch over erasures (off for a reactor, and on a store without data
/// subjects): the receipts looked at so far, and why the next rebuild happens when an erasure
/// asked for it.
struct Erasures {
    on: bool,
    receipts_after: u64,
    because: Option<String>,
}

impl Erasures {
    /// Looks at the receipts since the last look; true when one erased a subject the model
    /// folded through `position`, and then a rebuild is asked for, saying why.
    fn erased_since(
        &mut self,
        store: &Store,
        query: &Query,
        position: u64,
        rebuild: &AtomicBool,
    ) -> Result<bool, ReadError> {
        if !self.on {
            return Ok(false);
        }
        let Some(tag) = erased_subject_seen(store, query, &mut self.receipts_after, position)?
        else {
            return Ok(false);
        };
        self.because = Some(format!(
            "the data subject {tag}, whose events it folded, was erased"
        ));
        rebuild.store(true, Ordering::Release);
        Ok(true)
    }

    /// Whether the model may be checkpointed at `position`: every receipt up to now was looked
    /// at and none named a subject it folded. A checkpoint written past a receipt not looked
    /// at would keep the subject's data across a restart.
    fn clear_to_checkpoint(
        &mut self,
        store: &Store,
        query: &Query,
        position: u64,
        rebuild: &AtomicBool,
    ) -> bool {
        matches!(
            self.erased_since(store, query, position, rebuild),
            Ok(false)
        )
    }
}

struct Start {
    after: u64,
    rebuilt_because: Option<String>,
    /// The checkpoint was refused because a data subject it saw was erased since: a rebuild
    /// the erasure caused, counted as one.
    after_erasure: bool,
}

struct RunnerState {
    status: Mutex<ReadModelStatus>,
    progressed: Condvar,
    stop: AtomicBool,
    rebuild: AtomicBool,
}

/// Runs a driver on its own thread.
struct Runner {
    shared: Arc<RunnerState>,
    store: Arc<Store>,
    thread: Option<JoinHandle<()>>,
}

impl Runner {
    fn start<D: Driver>(
        store: &Arc<Store>,
        name: &str,
        kind: RunnerKind,
        query: Query,
        mut driver: D,
        options: RunnerOptions,
    ) -> Result<Runner, ReadModelError> {
        validate_name(name)?;
        query
            .validate(&store.options().limits)
            .map_err(ReadError::from)?;
        if !store.claim_runner(name) {
            return Err(ReadModelError::AlreadyRunning(name.to_owned()));
        }
        let mut claim = Claim {
            store,
            name,
            kept: false,
        };
        let start = driver.start(store, false)?;
        let shared = Arc::new(RunnerState {
            status: Mutex::new(ReadModelStatus {
                name: name.to_owned(),
                kind,
                running: true,
                position: driver.position(),
                checkpoint_position: driver.checkpoint_position(),
                head: store.head(),
                lag: store.head().saturating_sub(driver.position()),
                events_applied: 0,
                checkpoints: 0,
                effects_appended: 0,
                rebuilds: u64::from(start.after_erasure),
                resumed_from: start.after,
                rebuilt_because: start.rebuilt_because,
                error: None,
                failures: 0,
            }),
            progressed: Condvar::new(),
            stop: AtomicBool::new(false),
            rebuild: AtomicBool::new(false),
        });
        let thread = {
            let shared = shared.clone();
            let store = store.clone();
            std::thread::Builder::new()
                .name(format!("annals-model-{name}"))
                .spawn(move || run(&store, &shared, driver, query, start.after, options))
                .map_err(|e| StoreError::io("start read-model thread", PathBuf::new(), 0, e))?
        };
        claim.kept = true;
        Ok(Runner {
            shared,
            store: store.clone(),
            thread: Some(thread),
        })
    }

    fn status(&self) -> ReadModelStatus {
        let mut status = self.shared.status.lock().clone();
        status.head = self.store.head();
        status.lag = status.head.saturating_sub(status.position);
        status
    }

    fn wait_for(&self, position: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut status = self.shared.status.lock();
        while status.position < position {
            if !status.running
                || self
                    .shared
                    .progressed
                    .wait_until(&mut status, deadline)
                    .timed_out()
            {
                return status.position >= position;
            }
        }
        true
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
            let name = self.shared.status.lock().name.clone();
            self.store.release_runner(&name);
        }
    }
}

/// Releases a runner's name if starting it fails half-way.
/// A read model's name claimed in its store: released when dropped, unless the runner
/// started and keeps it (`kept`).
struct Claim<'a> {
    store: &'a Store,
    name: &'a str,
    kept: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.store.release_runner(self.name);
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run<D: Driver>(
    store: &Store,
    shared: &RunnerState,
    mut driver: D,
    query: Query,
    after: u64,
    options: RunnerOptions,
) {
    let mut subscription = store.subscribe(&query, after);
    let mut batch = Vec::with_capacity(options.batch_max);
    let mut failures = 0u32;
    // Erasures' receipts after this position are still to be looked at, for a read model of a
    // store with data subjects; and why the next rebuild happens, when an erasure asked.
    let mut erasures = Erasures {
        on: driver.forgets_erased() && store.has_subjects(),
        receipts_after: after,
        because: None,
    };
    let finish = |error: Option<String>| {
        let mut status = shared.status.lock();
        status.running = false;
        if error.is_some() {
            status.error = error;
        }
        shared.progressed.notify_all();
    };
    loop {
        if shared.stop.load(Ordering::Acquire) {
            let clear =
                erasures.clear_to_checkpoint(store, &query, driver.position(), &shared.rebuild);
            let error = match clear {
                true => driver.checkpoint(store, true).err().map(|e| e.to_string()),
                // The checkpoint on disk is older: a restart looks at the erasure again.
                false => None,
            };
            let mut status = shared.status.lock();
            status.checkpoint_position = driver.checkpoint_position();
            drop(status);
            return finish(error);
        }
        if shared.rebuild.swap(false, Ordering::AcqRel) {
            // A rebuild reads every event as it reads now: the erasures made so far are in
            // it, whoever asked for it.
            let head = store.head();
            match driver.start(store, true) {
                Ok(start) => {
                    erasures.receipts_after = erasures.receipts_after.max(head);
                    subscription = store.subscribe(&query, start.after);
                    let mut status = shared.status.lock();
                    status.rebuilds += 1;
                    status.position = driver.position();
                    status.checkpoint_position = driver.checkpoint_position();
                    status.resumed_from = start.after;
                    status.rebuilt_because = erasures.because.take().or(start.rebuilt_because);
                    status.error = None;
                }
                Err(e) => shared.status.lock().error = Some(e.to_string()),
            }
        }
        match erasures.erased_since(store, &query, driver.position(), &shared.rebuild) {
            Ok(true) => continue,
            Ok(false) => {}
            Err(_) if store.is_closed() => return finish(None),
            // Looked at again on the next turn; the model is served as it is meanwhile.
            Err(e) => shared.status.lock().error = Some(e.to_string()),
        }
        let sub = match &mut subscription {
            Ok(sub) => sub,
            Err(e) => return finish(Some(e.to_string())),
        };
        batch.clear();
        let step = sub
            .try_next_batch(options.batch_max, &mut batch)
            .and_then(|n| {
                if n == 0 {
                    // Caught up: a good moment for a checkpoint, then wait for the head to move.
                    let clear = erasures.clear_to_checkpoint(
                        store,
                        &query,
                        driver.position(),
                        &shared.rebuild,
                    );
                    if let Err(e) = clear.then(|| driver.checkpoint(store, false)).transpose() {
                        let mut status = shared.status.lock();
                        status.error = Some(e.to_string());
                        status.failures += 1;
                    }
                    if let Some(event) = sub.next_timeout(Some(options.poll))? {
                        batch.push(event);
                    }
                }
                Ok(())
            });
        if let Err(e) = step {
            // A poisoned or closed store does not come back; stop with the reason.
            return finish(Some(e.to_string()));
        }
        let position = batch
            .last()
            .map_or(0, Event::position)
            .max(Subscription::position(sub));
        if position <= driver.position() && batch.is_empty() {
            if store.is_closed() {
                return finish(None);
            }
            continue;
        }
        match driver.apply(store, &batch, position).and_then(|()| {
            let clear =
                erasures.clear_to_checkpoint(store, &query, driver.position(), &shared.rebuild);
            match clear {
                true => driver.checkpoint(store, false),
                false => Ok(()),
            }
        }) {
            Ok(()) => {
                failures = 0;
                let mut status = shared.status.lock();
                status.events_applied += batch.len() as u64;
                status.position = driver.position();
                status.checkpoint_position = driver.checkpoint_position();
                status.error = None;
                shared.progressed.notify_all();
            }
            Err(e) => {
                {
                    let mut status = shared.status.lock();
                    status.error = Some(e.to_string());
                    status.failures += 1;
                    // What was folded before the step failed (a checkpoint that found no room
                    // comes after the fold) is served.
                    status.position = driver.position();
                    shared.progressed.notify_all();
                }
                // A poisoned or closed store fails every step from now on.
                if store.poison_reason().is_some() || store.is_closed() {
                    return finish(Some(e.to_string()));
                }
                // Retry the same events: resume after what the driver holds.
                failures = failures.saturating_add(1);
                std::thread::sleep(Duration::from_millis(10 << failures.min(6)));
                subscription = store.subscribe(&query, driver.position());
            }
        }
        let (checkpoints, effects) = driver.counters();
        let mut status = shared.status.lock();
        status.checkpoints = checkpoints;
        status.effects_appended = effects;
        status.checkpoint_position = driver.checkpoint_position();
    }
}
