//! The sequencer: the matcher and its journal on one thread.
//!
//! [`Sequencer::execute`] applies a command to the engine and writes it (and the trades it
//! printed) into the current [`EventBatch`]; [`Sequencer::flush`] hands the batch to the store
//! and registers what to do once it is acknowledged. The matcher never waits for the disk in
//! the pipelined mode: it goes on with the next command while the store writes and syncs the
//! batches behind it, and each batch's acknowledgements are released, in order, once the
//! store has acknowledged it (in D3: after the fdatasync that covers it).
//!
//! The engine runs ahead of the journal, so a failed append leaves it holding commands the log
//! may not: the sequencer then refuses everything until the exchange is reopened, which
//! replays the log. Nothing whose batch failed is ever acknowledged.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use annals::{AppendError, AppendOptions, Durability, EventBatch, InputError, Store};
use parking_lot::{Condvar, Mutex};

use crate::codec;
use crate::engine::Engine;
use crate::recovery::{self, Recovered, Snapshot};
use crate::types::*;

/// How the exchange makes its journal durable; each mode is labelled with its durability class
/// (the README's durability table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// D0: nothing is journaled; the books live in memory only (the exchange benchmark's
    /// `--compare-seed` sets it beside an earlier engine's `event_sourcing` mode).
    Memory,
    /// D3, one append and one fdatasync per command; the matcher waits for each (beside the
    /// earlier engine's `production_safe`).
    PerOrder,
    /// D2: a command is acknowledged once its batch is written, before the fdatasync, which
    /// background group commit issues later; a batch holding a critical command (one that
    /// trades, or of at least `critical_qty`) waits for the fdatasync (beside the earlier
    /// engine's `production_safe_optimized`).
    Critical { critical_qty: Qty },
    /// D3 pipelined (the default): the matcher runs ahead, the journal syncs batches behind it,
    /// and each acknowledgement is released once the batch holding its command is durable.
    Pipelined,
}

impl Mode {
    /// The critical quantity of [`Mode::Critical`] when none is given.
    pub const DEFAULT_CRITICAL_QTY: Qty = 1_000;

    /// The short name used on the command line and in benchmark output.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Memory => "d0",
            Mode::PerOrder => "d3-per-order",
            Mode::Critical { .. } => "d2-critical",
            Mode::Pipelined => "d3-pipelined",
        }
    }

    /// What an acknowledgement means in this mode.
    pub fn class(self) -> &'static str {
        match self {
            Mode::Memory => "D0 in memory: nothing journaled, nothing survives the process",
            Mode::PerOrder => "D3 fsynced before acknowledgement: one fdatasync per command",
            Mode::Critical { .. } => {
                "D2 acknowledged once written, fsynced later by group commit; critical \
                 commands (trading or large) wait for the fsync (D3)"
            }
            Mode::Pipelined => {
                "D3 fsynced before acknowledgement: batches synced behind a matcher that runs ahead"
            }
        }
    }

    /// The durability the journal's store must be opened with (None: no store).
    pub fn store_durability(self) -> Option<Durability> {
        match self {
            Mode::Memory => None,
            Mode::PerOrder | Mode::Pipelined => Some(Durability::Synced),
            Mode::Critical { .. } => Some(Durability::SyncedLater),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "d0" | "memory" => Ok(Mode::Memory),
            "d3-per-order" | "per-order" => Ok(Mode::PerOrder),
            "d2" | "d2-critical" | "critical" => Ok(Mode::Critical {
                critical_qty: Mode::DEFAULT_CRITICAL_QTY,
            }),
            "d3" | "d3-pipelined" | "pipelined" => Ok(Mode::Pipelined),
            other => Err(format!(
                "unknown exchange durability {other:?}: expected d0, d3-per-order, d2-critical \
                 or d3-pipelined"
            )),
        }
    }
}

/// Why the exchange refused to go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    #[error(
        "the exchange's journal failed ({0}); nothing more is acknowledged until the exchange \
         is reopened, which replays the journal"
    )]
    Journal(String),
    #[error("the exchange's journal holds an event it cannot replay: {0}")]
    Replay(String),
    #[error("{0}")]
    Invalid(String),
    #[error("the exchange is stopped")]
    Stopped,
    #[error("the exchange's queue is full ({0} requests wait for the matcher); retry shortly")]
    Busy(usize),
}

/// What a release is told: the journal position through which its batch is acknowledged.
pub type Released = Result<u64, ExchangeError>;

type Release = Box<dyn FnOnce(Released) + Send>;

/// Releases acknowledgements in batch order as the store acknowledges batches.
#[derive(Default)]
struct Releases {
    state: Mutex<ReleaseState>,
    done: Condvar,
    /// Set with `ReleaseState::failure`, so that the matcher checks it without the lock.
    failed: AtomicBool,
    /// Copies of `submitted` and `completed`, read without the lock.
    submitted: AtomicU64,
    completed: AtomicU64,
}

#[derive(Default)]
struct ReleaseState {
    /// Batches handed to the store, and the highest acknowledged one.
    submitted: u64,
    completed: u64,
    /// The last acknowledged position.
    position: u64,
    failure: Option<String>,
    waiting: VecDeque<(u64, Release)>,
}

impl Releases {
    /// Batch `seq` was acknowledged (or failed): runs every release registered up to it, in
    /// order, under the lock so that two store threads cannot interleave them.
    fn complete(&self, seq: u64, outcome: Result<u64, AppendError>) {
        let mut state = self.state.lock();
        match outcome {
            Ok(position) => state.position = state.position.max(position),
            Err(e) => {
                state.failure.get_or_insert_with(|| e.to_string());
                self.failed.store(true, Ordering::Release);
            }
        }
        state.completed = state.completed.max(seq);
        self.completed.store(state.completed, Ordering::Release);
        while state.waiting.front().is_some_and(|(s, _)| *s <= seq) {
            let (_, release) = state.waiting.pop_front().expect("checked");
            release(state.outcome());
        }
        drop(state);
        self.done.notify_all();
    }

    /// Calls `release` once batch `seq` (and every one before it) is acknowledged: now, if it
    /// already is.
    fn register(&self, seq: u64, release: Release) {
        let mut state = self.state.lock();
        if state.completed >= seq {
            let outcome = state.outcome();
            drop(state);
            release(outcome);
        } else {
            state.waiting.push_back((seq, release));
        }
    }
}

impl ReleaseState {
    /// What a release of an acknowledged batch is told.
    fn outcome(&self) -> Released {
        match &self.failure {
            Some(reason) => Err(ExchangeError::Journal(reason.clone())),
            None => Ok(self.position),
        }
    }
}

/// Tunables of a [`Sequencer`].
#[derive(Debug, Clone)]
pub struct SequencerOptions {
    /// A batch is handed to the store once it holds this many events (sooner when the caller
    /// flushes, as it does whenever its input runs dry).
    pub batch_events: usize,
    /// Batches handed to the store and not yet acknowledged before the matcher waits: bounds
    /// the memory the queue holds when the matcher outruns the disk, and with it the
    /// acknowledgement latency. The queue must be deep enough to ride out the disk's slow
    /// fdatasyncs, and no deeper: more batches in flight raise the acknowledgement latency
    /// without raising throughput (docs/DECISIONS.md, R5).
    pub batches_in_flight: u64,
}

impl Default for SequencerOptions {
    fn default() -> Self {
        SequencerOptions {
            batch_events: 512,
            batches_in_flight: 32,
        }
    }
}

/// An empty batch with room for a full one (commands encode to well under 96 bytes).
fn fresh_batch(store: &Store, options: &SequencerOptions) -> EventBatch {
    store.batch_with_capacity(options.batch_events * 96)
}

/// The matcher and its journal: see the module documentation.
pub struct Sequencer {
    engine: Engine,
    store: Option<Arc<Store>>,
    mode: Mode,
    options: SequencerOptions,
    batch: EventBatch,
    critical: bool,
    releases: Arc<Releases>,
    /// Set when the engine holds a command the journal could not take.
    broken: Option<String>,
    /// Commands executed (in the journal, or in flight to it), since the beginning.
    commands: u64,
    next_order_id: OrderId,
    last_time: u64,
    /// The data subjects whose events the engine applied through `subjects_through` (on a
    /// store with data subjects), for the next snapshot.
    subjects: annals::state::Subjects,
    subjects_through: u64,
}

impl Sequencer {
    /// A sequencer journaling into `store` (None only in [`Mode::Memory`]). The store must run
    /// at the mode's durability ([`Mode::store_durability`]).
    pub fn new(
        engine: Engine,
        store: Option<Arc<Store>>,
        mode: Mode,
        options: SequencerOptions,
    ) -> Result<Sequencer, ExchangeError> {
        match (&store, mode.store_durability()) {
            (None, None) => {}
            (Some(store), Some(needed)) if store.durability() == needed => {}
            (Some(store), Some(needed)) => {
                return Err(ExchangeError::Invalid(format!(
                    "mode {mode} needs a store opened in {needed}, not {}",
                    store.durability()
                )))
            }
            (None, Some(_)) => {
                return Err(ExchangeError::Invalid(format!("mode {mode} needs a store")))
            }
            (Some(_), None) => {
                return Err(ExchangeError::Invalid(
                    "mode d0 journals nothing: give it no store".into(),
                ))
            }
        }
        let batch = match &store {
            Some(store) => fresh_batch(store, &options),
            None => EventBatch::new(&annals::Limits::default()),
        };
        let position = store.as_ref().map_or(0, |s| s.head());
        let subjects = store
            .as_deref()
            .map(annals::state::Subjects::of)
            .unwrap_or_default();
        let releases = Arc::new(Releases::default());
        releases.state.lock().position = position;
        Ok(Sequencer {
            engine,
            store,
            mode,
            options,
            batch,
            critical: false,
            releases,
            broken: None,
            commands: 0,
            next_order_id: 1,
            last_time: 0,
            subjects,
            subjects_through: 0,
        })
    }

    /// A sequencer that goes on from what [`crate::recover`] rebuilt from `store`.
    pub fn resume(
        recovered: Recovered,
        store: Arc<Store>,
        mode: Mode,
        options: SequencerOptions,
    ) -> Result<Sequencer, ExchangeError> {
        let mut sequencer = Sequencer::new(recovered.engine, Some(store), mode, options)?;
        sequencer.commands = recovered.commands;
        sequencer.next_order_id = recovered.next_order_id;
        sequencer.last_time = recovered.last_time;
        sequencer.subjects = recovered.subjects;
        sequencer.subjects_through = recovered.position;
        Ok(sequencer)
    }

    /// One more than the largest order id placed so far: the next id to hand out.
    pub fn next_order_id(&self) -> OrderId {
        self.next_order_id
    }

    /// The latest command time seen.
    pub fn last_time(&self) -> u64 {
        self.last_time
    }

    /// Waits until everything journaled so far is durable and captures the engine's state at
    /// that journal position, for [`crate::Snapshots::save`].
    pub fn snapshot(&mut self) -> Result<Snapshot, ExchangeError> {
        let position = self.sync()?;
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| ExchangeError::Invalid("a d0 exchange keeps no snapshots".into()))?;
        let appended_at_us = annals::state::appended_at(store, position)
            .map_err(|e| ExchangeError::Journal(e.to_string()))?
            .ok_or_else(|| ExchangeError::Invalid("nothing journaled to snapshot yet".into()))?;
        // The subjects of what was journaled since the last look (nothing is read on a store
        // without data subjects).
        self.subjects
            .read(
                store,
                &recovery::replayed(),
                self.subjects_through,
                position,
            )
            .map_err(|e| ExchangeError::Journal(e.to_string()))?;
        self.subjects_through = self.subjects_through.max(position);
        let mut engine = Vec::new();
        self.engine.snapshot(&mut engine);
        Ok(Snapshot {
            position,
            appended_at_us,
            next_order_id: self.next_order_id,
            last_time: self.last_time,
            commands: self.commands,
            subjects: self.subjects.to_vec(),
            engine,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// Commands executed since the sequencer was made.
    pub fn commands(&self) -> u64 {
        self.commands
    }

    /// Why the sequencer refuses commands, if it does.
    pub fn failure(&self) -> Option<ExchangeError> {
        if let Some(reason) = &self.broken {
            return Some(ExchangeError::Journal(reason.clone()));
        }
        if !self.releases.failed.load(Ordering::Acquire) {
            return None;
        }
        self.releases.state.lock().outcome().err()
    }

    /// Events written into the current batch and not yet handed to the store.
    pub fn pending_events(&self) -> usize {
        self.batch.len()
    }

    /// Whether the current batch should be handed to the store now: it reached its size (in
    /// [`Mode::PerOrder`], one command).
    pub fn batch_full(&self) -> bool {
        match self.mode {
            Mode::PerOrder => !self.batch.is_empty(),
            _ => self.batch.len() >= self.options.batch_events,
        }
    }

    /// Batches handed to the store and not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        let submitted = self.releases.submitted.load(Ordering::Acquire);
        submitted.saturating_sub(self.releases.completed.load(Ordering::Acquire))
    }

    /// Whether a caller whose input ran dry should flush now: something is pending and the
    /// store is nearly idle (at most one batch in flight). While the store is busy, commands
    /// keep gathering into the current batch, so that each append carries a group and the
    /// writer is never flooded with tiny records.
    pub fn idle_flush_due(&self) -> bool {
        !self.batch.is_empty() && self.in_flight() <= 1
    }

    /// Adds a symbol, journaled as a `SymbolAdded` event; returns its id.
    pub fn add_symbol(&mut self, spec: SymbolSpec) -> Result<SymbolId, ExchangeError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        if spec.tick == 0 || spec.lot == 0 {
            return Err(ExchangeError::Invalid(
                "a symbol's tick and lot must be positive".into(),
            ));
        }
        let symbol = self.engine.symbols() as SymbolId;
        if self.store.is_some() {
            self.put(|batch| codec::put_symbol(batch, symbol, spec))?;
        }
        Ok(self.engine.add_symbol(spec))
    }

    /// Applies `command` at `time`, appending its reports to `out`, and journals it. In
    /// [`Mode::PerOrder`] it returns once the command is durable and released; otherwise the
    /// caller releases acknowledgements through [`Sequencer::flush`].
    pub fn execute(
        &mut self,
        time: u64,
        command: &Command,
        out: &mut Vec<Report>,
    ) -> Result<(), ExchangeError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        self.commands += 1;
        self.last_time = self.last_time.max(time);
        if let Command::Place(p) = command {
            self.next_order_id = self.next_order_id.max(p.id.saturating_add(1));
        }
        if self.store.is_none() {
            self.engine.apply(time, command, out);
            return Ok(());
        }
        let start = out.len();
        self.engine.apply(time, command, out);
        let symbol = self.engine.named_symbol();
        let result = self.journal(time, command, symbol, &out[start..]);
        if let Err(e) = result {
            // The engine applied a command the log does not hold.
            let reason = format!("a command could not be journaled: {e}");
            self.broken = Some(reason.clone());
            return Err(ExchangeError::Journal(reason));
        }
        if let Mode::Critical { critical_qty } = self.mode {
            let qty = match *command {
                Command::Place(p) => p.qty,
                Command::Amend { qty, .. } => qty,
                _ => 0,
            };
            let traded = out[start..]
                .iter()
                .any(|r| matches!(r, Report::Trade { .. }));
            self.critical |= traded || qty >= critical_qty;
        }
        Ok(())
    }

    fn journal(
        &mut self,
        time: u64,
        command: &Command,
        symbol: Option<SymbolId>,
        reports: &[Report],
    ) -> Result<(), ExchangeError> {
        self.put(|batch| codec::put_command(batch, time, command, symbol))?;
        for trade in codec::trades(reports) {
            self.put(|batch| codec::put_trade(batch, &trade))?;
        }
        Ok(())
    }

    /// Writes one event, handing the batch to the store first when it has no room left.
    fn put(
        &mut self,
        mut write: impl FnMut(&mut EventBatch) -> Result<(), InputError>,
    ) -> Result<(), ExchangeError> {
        match write(&mut self.batch) {
            Ok(()) => Ok(()),
            Err(InputError::TooManyEvents { .. } | InputError::AppendTooLarge { .. })
                if !self.batch.is_empty() =>
            {
                // Nothing to release for this batch: releases wait for the batch the caller
                // flushes next, which is acknowledged only after every earlier one.
                self.submit()?;
                write(&mut self.batch).map_err(|e| ExchangeError::Invalid(e.to_string()))
            }
            Err(e) => Err(ExchangeError::Invalid(e.to_string())),
        }
    }

    /// Hands the current batch to the store (if it holds anything) and calls `release` once
    /// it, and every batch before it, is acknowledged: at once in [`Mode::Memory`], before
    /// returning in [`Mode::PerOrder`]. `release` runs on a store thread: keep it short.
    pub fn flush(&mut self, release: impl FnOnce(Released) + Send + 'static) {
        let release: Release = Box::new(release);
        if self.store.is_none() {
            return release(Ok(0));
        }
        if let Some(e) = self.failure() {
            return release(Err(e));
        }
        let seq = if self.batch.is_empty() {
            self.releases.submitted.load(Ordering::Acquire)
        } else {
            match self.submit() {
                Ok(seq) => seq,
                Err(e) => return release(Err(e)),
            }
        };
        self.releases.register(seq, release);
        if self.mode == Mode::PerOrder {
            self.wait_for(seq, 0);
        }
    }

    /// Appends the current batch; returns its sequence number.
    fn submit(&mut self) -> Result<u64, ExchangeError> {
        let store = self.store.clone().expect("only journaled modes submit");
        let submitted = self.releases.submitted.load(Ordering::Acquire);
        self.wait_for(submitted, self.options.batches_in_flight);
        let fresh = fresh_batch(&store, &self.options);
        let batch = std::mem::replace(&mut self.batch, fresh);
        let options = AppendOptions {
            require_synced: std::mem::take(&mut self.critical),
            ..AppendOptions::default()
        };
        let seq = {
            let mut state = self.releases.state.lock();
            state.submitted += 1;
            let seq = state.submitted;
            self.releases.submitted.store(seq, Ordering::Release);
            seq
        };
        if self.mode == Mode::PerOrder {
            // The matcher waits for each command anyway: the store's own blocking append
            // wakes it with the least hand-over.
            let outcome = store.appending_batch(batch).wait();
            self.releases.complete(seq, outcome);
        } else {
            let releases = self.releases.clone();
            let submitted = store
                .appending_batch(batch)
                .options(options)
                .then(move |outcome| releases.complete(seq, outcome));
            if let Err(e) = submitted {
                self.releases.complete(seq, Err(e));
            }
        }
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(seq),
        }
    }

    /// Waits until no more than `lag` batches before `seq` are unacknowledged.
    fn wait_for(&self, seq: u64, lag: u64) {
        let mut state = self.releases.state.lock();
        while state.completed + lag < seq && state.failure.is_none() {
            self.releases.done.wait(&mut state);
        }
    }

    /// Flushes and waits until everything journaled so far is acknowledged.
    pub fn sync(&mut self) -> Result<u64, ExchangeError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.flush(move |outcome| {
            let _ = tx.send(outcome);
        });
        rx.recv().unwrap_or(Err(ExchangeError::Stopped))
    }

    /// Takes the engine back (for snapshots and tests).
    pub fn into_engine(self) -> Engine {
        self.engine
    }
}
