//! The exchange as a service: one matcher thread that owns a [`Sequencer`], fed through a
//! bounded queue by any number of callers (the HTTP server's tasks, an embedding program).
//!
//! The exchange assigns each command its time (the wall clock, never going backwards) and
//! each new order its id, so clients cannot break determinism: the journal holds both, and a
//! replay rebuilds the same books. Every answer, a query's included, is released only once
//! the journal holds everything the matcher had done when it was computed, so no client ever
//! sees state that a crash could take back. Market data and execution reports (the
//! [`Output`]s) go to a sink in journal order, as their batch becomes durable.
//!
//! The matcher drains whatever is waiting, then hands the batch to the store and goes on
//! without waiting for it (in the pipelined mode); under load a batch holds many commands and
//! costs one fdatasync, with no timer anywhere.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use annals::Store;
use parking_lot::Mutex;

use crate::codec::{self, TradeRecord};
use crate::engine::Engine;
use crate::journal::{ExchangeError, Mode, Released, Sequencer, SequencerOptions};
use crate::recovery::{self, Snapshots};
use crate::types::*;

/// How a [`Exchange`] runs.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    pub mode: Mode,
    pub sequencer: SequencerOptions,
    /// Requests waiting for the matcher before [`Exchange::try_submit`] refuses more.
    pub queue_depth: usize,
    /// A snapshot is saved after every this many commands (0: never), and at a clean stop
    /// when commands came since the last one. Journaled modes only.
    pub snapshot_every: u64,
    /// Symbols the exchange must have: those the journal lacks are added (and journaled) at
    /// start, in order. Symbol ids are their places in this list.
    pub symbols: Vec<SymbolSpec>,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            mode: Mode::Pipelined,
            sequencer: SequencerOptions::default(),
            queue_depth: 16_384,
            snapshot_every: 1_000_000,
            symbols: Vec::new(),
        }
    }
}

/// A command as the exchange executed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executed {
    /// The order the command named; for a place, the id the exchange gave it (0 for a
    /// cancel-all).
    pub id: OrderId,
    /// The time the exchange gave the command (nanoseconds since the Unix epoch).
    pub time: u64,
    /// The journal position through which the command is durable (0 in d0).
    pub position: u64,
    pub reports: Vec<Report>,
}

/// What the exchange publishes, in journal order, once durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// An execution report for the account that owns the order it names.
    Execution { account: AccountId, report: Report },
    /// A trade (market data; it names both orders and accounts, for the owner's use).
    Trade(TradeRecord),
    /// A symbol's best bid and offer changed.
    Bbo { symbol: SymbolId, bbo: Bbo },
}

impl Output {
    /// The symbol a market-data output is about.
    pub fn symbol(&self) -> Option<SymbolId> {
        match self {
            Output::Trade(t) => Some(t.symbol),
            Output::Bbo { symbol, .. } => Some(*symbol),
            Output::Execution { .. } => None,
        }
    }
}

/// Receives each durable batch's outputs, on a store thread: keep it short. The number is
/// the sequence number of the first output: every output gets the next one, from 0 at each
/// start, so a reader can line a stream up with a query ([`Exchange::try_query_seq`]).
pub type Sink = Arc<dyn Fn(u64, Vec<Output>) + Send + Sync>;

/// What starting the exchange found.
#[derive(Debug, Clone, Default)]
pub struct StartReport {
    /// The journal head the books include.
    pub position: u64,
    /// The snapshot replay started from, and why newer ones were skipped.
    pub snapshot_position: Option<u64>,
    pub skipped_snapshots: Vec<String>,
    /// Commands replayed after the snapshot, and in the whole journal.
    pub replayed: u64,
    pub commands: u64,
    pub symbols_added: usize,
    pub live_orders: usize,
    pub millis: f64,
}

/// Counters the matcher keeps, readable from any thread.
#[derive(Debug, Default)]
pub struct ServiceStats {
    pub commands: AtomicU64,
    pub queries: AtomicU64,
    pub trades: AtomicU64,
    pub flushes: AtomicU64,
    pub snapshots: AtomicU64,
    /// The journal position of the newest snapshot saved (0: none).
    pub snapshot_position: AtomicU64,
    pub snapshot_error: Mutex<Option<String>>,
    /// Snapshots that could not be saved (a full disk, say); the next one due tries again.
    /// They never stop matching or journaling.
    pub snapshot_failures: AtomicU64,
    /// Trades and the quantity traded, by symbol (its place here), since the start.
    pub symbols: parking_lot::RwLock<Vec<SymbolStats>>,
}

/// One symbol's counters.
#[derive(Debug, Default)]
pub struct SymbolStats {
    pub trades: AtomicU64,
    pub volume: AtomicU64,
}

impl ServiceStats {
    /// Counters for every symbol up to `symbols`, so that each is there from its start.
    fn add_symbols(&self, symbols: usize) {
        let mut all = self.symbols.write();
        if all.len() < symbols {
            all.resize_with(symbols, SymbolStats::default);
        }
    }

    /// Counts `trades` printed by one command.
    fn count_trades<'a>(&self, trades: impl Iterator<Item = &'a TradeRecord>) {
        let mut symbols = self.symbols.upgradable_read();
        for trade in trades {
            let at = trade.symbol as usize;
            if at >= symbols.len() {
                symbols.with_upgraded(|all| all.resize_with(at + 1, SymbolStats::default));
            }
            symbols[at].trades.fetch_add(1, Ordering::Relaxed);
            symbols[at].volume.fetch_add(trade.qty, Ordering::Relaxed);
        }
    }
}

type Reply<T> = Box<dyn FnOnce(Result<T, ExchangeError>) + Send>;
type Release = Box<dyn FnOnce(Released) + Send>;
type Ask = Box<dyn FnOnce(&Engine, u64) -> Release + Send>;

enum Request {
    Command {
        command: Command,
        reply: Reply<Executed>,
    },
    AddSymbol {
        spec: SymbolSpec,
        reply: Reply<SymbolId>,
    },
    Query(Ask),
    Stop,
}

/// The running exchange: see the module documentation.
pub struct Exchange {
    requests: SyncSender<Request>,
    matcher: Mutex<Option<JoinHandle<Result<(), ExchangeError>>>>,
    stats: Arc<ServiceStats>,
    mode: Mode,
    queue_depth: usize,
    start: StartReport,
}

impl Exchange {
    /// Recovers the books from `store` (the newest fitting snapshot, then the journal after
    /// it), adds the configured symbols it lacks and starts the matcher thread. `store` is
    /// None only in [`Mode::Memory`], which starts empty.
    pub fn start(
        store: Option<Arc<Store>>,
        options: ServiceOptions,
        sink: Sink,
    ) -> Result<Exchange, ExchangeError> {
        let began = Instant::now();
        let mut start = StartReport::default();
        let snapshots = store.as_ref().map(|s| Snapshots::for_store(s));
        let mut sequencer = match (&store, options.mode) {
            (_, Mode::Memory) => {
                Sequencer::new(Engine::new(&[]), None, Mode::Memory, options.sequencer)?
            }
            (Some(store), mode) => {
                let recovered = recovery::recover(store, snapshots.as_ref())?;
                start.position = recovered.position;
                start.snapshot_position = recovered.snapshot_position;
                start.skipped_snapshots = recovered.skipped_snapshots.clone();
                start.replayed = recovered.replayed;
                start.commands = recovered.commands;
                Sequencer::resume(recovered, store.clone(), mode, options.sequencer)?
            }
            (None, mode) => {
                return Err(ExchangeError::Invalid(format!("mode {mode} needs a store")))
            }
        };
        let known = sequencer.engine().specs();
        for (i, spec) in options.symbols.iter().enumerate() {
            match known.get(i) {
                Some(existing) if existing == spec => {}
                Some(existing) => {
                    return Err(ExchangeError::Invalid(format!(
                        "symbol {i} is configured with tick {} and lot {}, but the journal \
                         defines it with tick {} and lot {}",
                        spec.tick, spec.lot, existing.tick, existing.lot
                    )))
                }
                None => {
                    sequencer.add_symbol(*spec)?;
                    start.symbols_added += 1;
                }
            }
        }
        if start.symbols_added > 0 {
            sequencer.sync()?;
        }
        start.live_orders = sequencer.engine().live_orders();
        start.millis = began.elapsed().as_secs_f64() * 1e3;
        let (requests, inbox) = std::sync::mpsc::sync_channel(options.queue_depth.max(1));
        let stats = Arc::new(ServiceStats::default());
        stats.add_symbols(sequencer.engine().symbols());
        let mut matcher = Matcher {
            last_bbo: (0..sequencer.engine().symbols())
                .map(|s| sequencer.engine().bbo(s as SymbolId))
                .collect(),
            sequencer,
            sink,
            stats: stats.clone(),
            snapshots,
            snapshot_every: options.snapshot_every,
            snapshot_commands: 0,
            saving: None,
            pending: Vec::new(),
            outputs: Vec::new(),
            output_seq: 0,
            reports: Vec::new(),
        };
        matcher.snapshot_commands = matcher.sequencer.commands();
        let thread = std::thread::Builder::new()
            .name("annals-matcher".into())
            .spawn(move || matcher.run(inbox))
            .map_err(|e| ExchangeError::Invalid(format!("cannot start the matcher: {e}")))?;
        Ok(Exchange {
            requests,
            matcher: Mutex::new(Some(thread)),
            stats,
            mode: options.mode,
            queue_depth: options.queue_depth.max(1),
            start,
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn start_report(&self) -> &StartReport {
        &self.start
    }

    pub fn stats(&self) -> &ServiceStats {
        &self.stats
    }

    /// Queues `command` without waiting; `reply` runs once it is durable (on a store
    /// thread) or refused. A place's id is ignored: the exchange gives each order the next
    /// id (and a client id of 0 becomes that id). Fails at once when the queue is full or the exchange stopped.
    pub fn try_submit(
        &self,
        command: Command,
        reply: impl FnOnce(Result<Executed, ExchangeError>) + Send + 'static,
    ) -> Result<(), ExchangeError> {
        self.offer(Request::Command {
            command,
            reply: Box::new(reply),
        })
    }

    /// Adds a symbol (journaled); `reply` gets its id once durable.
    pub fn try_add_symbol(
        &self,
        spec: SymbolSpec,
        reply: impl FnOnce(Result<SymbolId, ExchangeError>) + Send + 'static,
    ) -> Result<(), ExchangeError> {
        self.offer(Request::AddSymbol {
            spec,
            reply: Box::new(reply),
        })
    }

    /// Runs `ask` on the matcher thread, between commands; `reply` gets its answer once
    /// everything the matcher had done by then is durable. Keep `ask` short: the matcher
    /// waits for it.
    pub fn try_query<T: Send + 'static>(
        &self,
        ask: impl FnOnce(&Engine) -> T + Send + 'static,
        reply: impl FnOnce(Result<T, ExchangeError>) + Send + 'static,
    ) -> Result<(), ExchangeError> {
        self.offer(Request::Query(Box::new(move |engine, _| {
            let answer = ask(engine);
            Box::new(move |released: Released| reply(released.map(|_| answer)))
        })))
    }

    /// Like [`Exchange::try_query`], with the sequence number the next output will get: the
    /// outputs numbered below it are already in the answer, those from it on are not.
    pub fn try_query_seq<T: Send + 'static>(
        &self,
        ask: impl FnOnce(&Engine) -> T + Send + 'static,
        reply: impl FnOnce(Result<(T, u64), ExchangeError>) + Send + 'static,
    ) -> Result<(), ExchangeError> {
        self.offer(Request::Query(Box::new(move |engine, seq| {
            let answer = ask(engine);
            Box::new(move |released: Released| reply(released.map(|_| (answer, seq))))
        })))
    }

    fn offer(&self, request: Request) -> Result<(), ExchangeError> {
        self.requests.try_send(request).map_err(|e| match e {
            TrySendError::Full(_) => ExchangeError::Busy(self.queue_depth),
            TrySendError::Disconnected(_) => ExchangeError::Stopped,
        })
    }

    /// Submits and waits for the answer (for embedding programs and tests).
    pub fn execute(&self, command: Command) -> Result<Executed, ExchangeError> {
        self.wait(|reply| Request::Command { command, reply })
    }

    /// Queries and waits for the answer (see [`Exchange::try_query`]).
    pub fn query<T: Send + 'static>(
        &self,
        ask: impl FnOnce(&Engine) -> T + Send + 'static,
    ) -> Result<T, ExchangeError> {
        self.wait(|reply: Reply<T>| {
            Request::Query(Box::new(move |engine, _| {
                let answer = ask(engine);
                Box::new(move |released: Released| reply(released.map(|_| answer)))
            }))
        })
    }

    /// Adds a symbol and waits for its id.
    pub fn add_symbol(&self, spec: SymbolSpec) -> Result<SymbolId, ExchangeError> {
        self.wait(|reply| Request::AddSymbol { spec, reply })
    }

    /// Sends the request `make` builds around a reply, waiting for room in the queue, then
    /// for the reply.
    fn wait<T: Send + 'static>(
        &self,
        make: impl FnOnce(Reply<T>) -> Request,
    ) -> Result<T, ExchangeError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let request = make(Box::new(move |r| {
            let _ = tx.send(r);
        }));
        self.requests
            .send(request)
            .map_err(|_| ExchangeError::Stopped)?;
        rx.recv().unwrap_or(Err(ExchangeError::Stopped))
    }

    /// Answers what is queued, waits until the journal holds it durably, saves a last
    /// snapshot (when commands came since the previous one) and stops the matcher. Later
    /// requests fail with [`ExchangeError::Stopped`].
    pub fn stop(&self) -> Result<(), ExchangeError> {
        let Some(thread) = self.matcher.lock().take() else {
            return Ok(());
        };
        let _ = self.requests.send(Request::Stop);
        thread.join().unwrap_or_else(|_| {
            Err(ExchangeError::Invalid(
                "the matcher thread panicked".to_string(),
            ))
        })
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The matcher thread's state.
struct Matcher {
    sequencer: Sequencer,
    sink: Sink,
    stats: Arc<ServiceStats>,
    snapshots: Option<Snapshots>,
    snapshot_every: u64,
    /// Commands at the last snapshot.
    snapshot_commands: u64,
    saving: Option<JoinHandle<()>>,
    /// Answers to release with the next flush.
    pending: Vec<Release>,
    /// Outputs to publish with the next flush, and the sequence number of the first.
    outputs: Vec<Output>,
    output_seq: u64,
    /// The last best bid and offer published per symbol.
    last_bbo: Vec<Bbo>,
    reports: Vec<Report>,
}

/// Answers gathered before a flush is forced, when requests keep arriving without filling a
/// batch (queries add no events).
const PENDING_MAX: usize = 4_096;

impl Matcher {
    fn run(mut self, inbox: Receiver<Request>) -> Result<(), ExchangeError> {
        let mut stopping = false;
        while !stopping {
            let Ok(first) = inbox.recv() else { break };
            stopping = self.handle(first);
            // Drain what is waiting: under load one batch carries many commands.
            while !stopping {
                if self.sequencer.batch_full() || self.pending.len() >= PENDING_MAX {
                    self.flush();
                }
                match inbox.try_recv() {
                    Ok(request) => stopping = self.handle(request),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => stopping = true,
                }
            }
            self.flush();
            self.maybe_snapshot(false);
        }
        // Answer anything that raced with the stop, then make everything durable.
        while let Ok(request) = inbox.try_recv() {
            self.handle(request);
        }
        self.flush();
        let synced = self.sequencer.sync().map(|_| ());
        if synced.is_ok() {
            self.maybe_snapshot(true);
        }
        if let Some(saving) = self.saving.take() {
            let _ = saving.join();
        }
        synced
    }

    /// Handles one request; true when it asks the matcher to stop.
    fn handle(&mut self, request: Request) -> bool {
        match request {
            Request::Command { command, reply } => self.command(command, reply),
            Request::AddSymbol { spec, reply } => match self.sequencer.add_symbol(spec) {
                Ok(symbol) => {
                    self.last_bbo.push(Bbo::default());
                    self.stats.add_symbols(self.last_bbo.len());
                    self.pending.push(Box::new(move |released: Released| {
                        reply(released.map(|_| symbol))
                    }));
                }
                Err(e) => reply(Err(e)),
            },
            Request::Query(ask) => {
                self.stats.queries.fetch_add(1, Ordering::Relaxed);
                let seq = self.output_seq + self.outputs.len() as u64;
                let release = ask(self.sequencer.engine(), seq);
                self.pending.push(release);
            }
            Request::Stop => return true,
        }
        false
    }

    fn command(&mut self, mut command: Command, reply: Reply<Executed>) {
        let time = wall_clock_ns().max(self.sequencer.last_time());
        let (id, account) = match &mut command {
            Command::Place(p) => {
                p.id = self.sequencer.next_order_id();
                if p.client_id == 0 {
                    p.client_id = p.id;
                }
                (p.id, p.account)
            }
            Command::Cancel { id, account } | Command::Amend { id, account, .. } => (*id, *account),
            Command::CancelAll { account, .. } => (0, *account),
        };
        let all_symbols = matches!(command, Command::CancelAll { symbol: None, .. });
        self.reports.clear();
        if let Err(e) = self.sequencer.execute(time, &command, &mut self.reports) {
            return reply(Err(e));
        }
        // The symbols whose best prices the command may have moved.
        let touched = match command {
            Command::Place(p) => Some(p.symbol),
            Command::Cancel { .. } | Command::Amend { .. } => {
                self.sequencer.engine().named_symbol()
            }
            Command::CancelAll { symbol, .. } => symbol,
        };
        self.stats.commands.fetch_add(1, Ordering::Relaxed);
        for report in &self.reports {
            match *report {
                Report::Trade { .. } => {}
                Report::Fill { account, .. } => {
                    self.outputs.push(Output::Execution {
                        account,
                        report: *report,
                    });
                }
                _ => self.outputs.push(Output::Execution {
                    account,
                    report: *report,
                }),
            }
        }
        let trades_before = self.outputs.len();
        self.outputs
            .extend(codec::trades(&self.reports).map(Output::Trade));
        let trades = (self.outputs.len() - trades_before) as u64;
        if trades > 0 {
            self.stats.trades.fetch_add(trades, Ordering::Relaxed);
            self.stats.count_trades(
                self.outputs[trades_before..]
                    .iter()
                    .filter_map(|o| match o {
                        Output::Trade(t) => Some(t),
                        _ => None,
                    }),
            );
        }
        if all_symbols {
            for symbol in 0..self.last_bbo.len() {
                self.publish_bbo(symbol as SymbolId);
            }
        } else if let Some(symbol) = touched {
            self.publish_bbo(symbol);
        }
        let reports = self.reports.clone();
        self.pending.push(Box::new(move |released: Released| {
            reply(released.map(|position| Executed {
                id,
                time,
                position,
                reports,
            }))
        }));
    }

    fn publish_bbo(&mut self, symbol: SymbolId) {
        let Some(last) = self.last_bbo.get_mut(symbol as usize) else {
            return;
        };
        let bbo = self.sequencer.engine().bbo(symbol);
        if bbo != *last {
            *last = bbo;
            self.outputs.push(Output::Bbo { symbol, bbo });
        }
    }

    /// Hands the batch to the journal; its answers and outputs are released once durable.
    fn flush(&mut self) {
        if self.pending.is_empty()
            && self.outputs.is_empty()
            && self.sequencer.pending_events() == 0
        {
            return;
        }
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        let pending = std::mem::take(&mut self.pending);
        let outputs = std::mem::take(&mut self.outputs);
        let first = self.output_seq;
        self.output_seq += outputs.len() as u64;
        let sink = self.sink.clone();
        self.sequencer.flush(move |released| {
            if released.is_ok() && !outputs.is_empty() {
                sink(first, outputs);
            }
            for release in pending {
                release(released.clone());
            }
        });
    }

    /// Saves a snapshot when `snapshot_every` commands came since the last one (or, at a
    /// stop, when any did). The engine is captured here; the file is written on another
    /// thread so that matching goes on.
    fn maybe_snapshot(&mut self, stopping: bool) {
        let Some(snapshots) = self.snapshots.clone() else {
            return;
        };
        if self.sequencer.mode() == Mode::Memory {
            return;
        }
        let since = self.sequencer.commands() - self.snapshot_commands;
        let due = if stopping {
            since > 0 && self.snapshot_every > 0
        } else {
            self.snapshot_every > 0 && since >= self.snapshot_every
        };
        if !due || self.saving.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        self.snapshot_commands = self.sequencer.commands();
        let snapshot = match self.sequencer.snapshot() {
            Ok(snapshot) => snapshot,
            Err(e) => {
                *self.stats.snapshot_error.lock() = Some(e.to_string());
                return;
            }
        };
        let stats = self.stats.clone();
        let save = move || match snapshots.save(&snapshot) {
            Ok(()) => {
                stats.snapshots.fetch_add(1, Ordering::Relaxed);
                stats
                    .snapshot_position
                    .store(snapshot.position, Ordering::Relaxed);
                *stats.snapshot_error.lock() = None;
            }
            Err(e) => {
                stats.snapshot_failures.fetch_add(1, Ordering::Relaxed);
                *stats.snapshot_error.lock() = Some(e.to_string());
            }
        };
        if stopping {
            save();
        } else {
            self.saving = std::thread::Builder::new()
                .name("annals-snapshot".into())
                .spawn(save)
                .ok();
        }
    }
}

fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
