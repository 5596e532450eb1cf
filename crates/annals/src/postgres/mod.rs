//! The PostgreSQL backend: the log lives in a database that people already run with
//! replication, failover and backups, and several Annals servers may serve it at once.
//!
//! The seam is where an append becomes durable. On files, the writer checks an append's
//! condition against the in-memory index, stages it and makes it durable with an fdatasync. Here
//! a committer thread checks it against the same index, makes it durable with one database
//! statement per group of appends, and only then hands it to the same writer, which runs over a
//! memory-only log that mirrors the database (positions included). So conditions, the index,
//! reads, subscriptions and decisions are the file store's own code; what differs is who
//! decides that an append is stored, and that the mirror also takes in what other servers
//! commit.
//!
//! The database holds two tables (created on first use; see `SCHEMA`): `annals_appends`, one
//! row per append (its first and last position, its append time, its events encoded exactly
//! as in a segment's record body, tracking trailer included, and its keys), keyed by its first
//! position, and `annals_schema`, the schema's version. A third, `annals_companions` (kind,
//! name, bytes), holds read models' checkpoints and the exchange's snapshots (companions.rs);
//! it is created by the first server that writes one and is not part of the log's schema
//! version.
//!
//! A group commits with one statement, run outside an explicit transaction (so one round trip
//! and the statement's own commit): it inserts the group's first row unless a row already
//! starts at that position, and the others only if the first went in. The key serialises
//! writers on every server: a group starts right after the last position its server holds, so
//! a concurrent group from the same head waits for the other's key, then finds it taken and
//! inserts nothing, and a group from a stale head finds the row that follows it. Its retry
//! ([`PASS_FUNCTION`]) reads in the database what the others committed, and goes in right
//! after it when none of those appends holds a key the group's checks concern; otherwise its
//! server reads them, checks its appends again and retries. A row starting
//! at position p + 1 is written only by a server that has read the row ending at p, so
//! committed rows always form a dense prefix of positions, committed in order, any snapshot of
//! the table is gapless, and a condition is checked against every append committed before it,
//! by any server.
//!
//! Nothing here needs locking of PostgreSQL's own (advisory locks, `SELECT ... FOR UPDATE`,
//! serializable isolation): a unique key, which PostgreSQL-compatible distributed databases
//! also offer. The PostgreSQL-only parts are `ON CONFLICT DO NOTHING` (an insert that skips a
//! taken key rather than fail; elsewhere, a unique violation would be the lost race),
//! `pg_notify` in the commit with `LISTEN` on a second connection, a wake-up for followers
//! whose correctness never depends on it (they also poll), and the retry's PL/pgSQL function
//! (elsewhere, the server's own read and check, which it falls back on anyway).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::{Condvar, Mutex};
use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, Statement};

use crate::error::StoreError;
use crate::event::Tags;
pub(crate) use crate::kept::AppendStamp;
use crate::log::Log;
use crate::options::Durability;
use crate::query::Query;
use crate::record::{EncodedAppend, Entries};
use crate::request::{Reply, ReplyTo, Request};
use crate::route::Backend;
use crate::route::Route;
use crate::shared::Shared;
use crate::writer::{checked, count_settled, now_us, FileLog, WriterRole};
use connect::Target;

mod committer;
pub(crate) mod companions;
pub(crate) mod connect;
mod follow;
pub(crate) mod keys;
mod settle;
pub(crate) mod snapshots;
mod sql;

use committer::*;
use settle::*;
pub use sql::lone_commit_statement;
use sql::*;

/// Rows read per statement while following the database.
const FETCH_ROWS: i64 = 65536;

/// Rows, and their bodies' bytes, the mirror takes in at a time while more are streamed.
const TAKE_IN_ROWS: usize = 1024;

const TAKE_IN_BYTES: usize = 8 << 20;

/// How long a group goes on trying while other servers' commits take its position first (or
/// the database rolls it back as a serialization failure) before its appends are refused as
/// unavailable. Each lost race is another server's progress. Two busy servers, each with a
/// group always in flight, can make one lose a hundred races in a row: the winner's next group
/// needs no read, the loser's retry does. A limit of 100 tries refused a group of 32 appends
/// in about half of the benchmark's two-server runs (2026-11-26), appends that later tries
/// would have committed.
const RACING_MAX: Duration = Duration::from_secs(10);

/// How long a group whose commit's outcome is unknown (the session ended while the commit ran)
/// waits for the database to tell whether it is in the log (see [`Committer::settle`]) before
/// its appends are answered with an unknown outcome. A database restart or a failover to a
/// standby promoted at once fits in it.
pub(crate) const SETTLE_MAX: Duration = Duration::from_secs(10);

/// Appends committed with one statement at most.
const GROUP_APPENDS_MAX: usize = 4096;

/// How often a server with nothing to append looks for what others committed, when no
/// notification wakes it sooner.
const POLL: Duration = Duration::from_millis(500);

/// A server that committed within this long is busy: it holds every append committed before
/// its last commit (a group goes in only right after the last position committed), so it
/// does not listen for other servers' notifications, and PostgreSQL does not deliver every
/// commit's notification to it (decision record R24). An idle server listens.
const BUSY: Duration = Duration::from_millis(50);

/// How often a listener that does not listen looks whether its server turned idle (a bound on
/// how late it listens again), and how long one that listens waits for a notification before
/// it looks whether its server turned busy (only a cost while it still listens).
const IDLE_TICK: Duration = Duration::from_millis(10);

const LISTEN_TICK: Duration = Duration::from_millis(100);

/// Whether the database at `url` holds `last`, a kept mirror's last append (see kept.rs),
/// as the mirror holds it: None when it does, else why the mirror cannot be used.
pub(crate) fn holds(url: &str, last: AppendStamp) -> Result<Option<String>, StoreError> {
    let target = Target::parse(url)?;
    let mut client = target
        .connect(None)
        .map_err(|e| unavailable("connect", &e))?;
    let exists = client
        .query_one("SELECT to_regclass('annals_appends') IS NOT NULL", &[])
        .map_err(|e| unavailable("look for the log", &e))?
        .get::<_, bool>(0);
    let found = if exists {
        client
            .query_opt(VERIFY, &[&(last.last as i64)])
            .map_err(|e| unavailable("verify the log", &e))?
            .map(|r| stored(&r))
    } else {
        None
    };
    connect::close(client);
    Ok((found != Some(last)).then(|| {
        format!(
            "the database does not hold its last append ({last:?}; found {found:?}): another \
             database, or one that lost appends"
        )
    }))
}

fn stored(row: &postgres::Row) -> AppendStamp {
    AppendStamp {
        first: row.get::<_, i64>(0) as u64,
        last: row.get::<_, i64>(1) as u64,
        at: row.get::<_, i64>(2) as u64,
        bytes: row.get::<_, i32>(3) as u64,
    }
}

/// Counters of the database backend, for [`crate::Stats`].
#[derive(Default)]
pub(crate) struct RemoteCounters {
    /// Group commits that succeeded.
    pub(crate) commits: AtomicU64,
    /// Group commits that found the head moved by another server and were checked again.
    pub(crate) conflicts: AtomicU64,
    /// Retries of groups that went in right after other servers' appends, none of which
    /// mattered to the group's checks.
    pub(crate) passed: AtomicU64,
    /// Appends of other servers taken into this one's log.
    pub(crate) followed: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    /// Appends answered with an unknown outcome.
    pub(crate) unknown: AtomicU64,
    /// Appends whose commit's outcome was unknown and then settled by reading the log: found
    /// committed (and answered so), or found absent (and tried again).
    pub(crate) settled: AtomicU64,
    /// When this server's last group committed, in microseconds since the epoch (see
    /// [`BUSY`]).
    pub(crate) committed_at_us: AtomicU64,
}

/// The database backend of an open [`crate::Store`].
pub(crate) struct Remote {
    /// The mirror's shared state.
    shared: Arc<Shared>,
    sender: Option<Sender<Request>>,
    /// The committer's state, taken by its thread for each group, or by a lone caller that
    /// commits its own append (see [`Remote::commit_alone`]).
    state: Arc<Mutex<Committer>>,
    /// Asks the committer to take in what the database holds now; it answers with its head.
    refresh: Sender<Sender<Result<u64, StoreError>>>,
    committer: Option<JoinHandle<()>>,
    listener: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    pub(crate) counters: Arc<RemoteCounters>,
    /// The mirror's log on files, whose writer takes what the database committed; its queue
    /// closes when the remote stops.
    files: Option<FileLog>,
}

impl Remote {
    /// Connects, creates or checks the schema, takes the database's log into the store's
    /// mirror (`inner`, written by `files`: empty, or a kept mirror whose last append,
    /// `last_append`, the database holds) and starts the committer and the listener.
    pub(crate) fn start(
        url: &str,
        inner: Arc<Shared>,
        files: FileLog,
        last_append: AppendStamp,
    ) -> Result<Remote, StoreError> {
        let role = files.role().clone();
        debug_assert_eq!(
            last_append.last,
            inner.head(),
            "the mirror ends with its last append"
        );
        let target = Target::parse(url)?;
        let warned = Arc::new(AtomicBool::new(false));
        let mut client = target
            .connect(Some(warned.clone()))
            .map_err(|e| unavailable("connect", &e))?;
        ensure_schema(&mut client)?;
        let counters = Arc::new(RemoteCounters::default());
        let mut committer = Committer {
            target: target.clone(),
            connection: None,
            inner,
            role,
            counters: counters.clone(),
            warned,
            verify_on_connect: false,
            group_time: 0,
            last_append,
            server_id: server_id(),
            awaited: None,
        };
        committer.adopt(client)?;
        committer.follow()?;
        let limit = committer.inner.options.limits.queue_depth_max;
        let (sender, receiver) = crossbeam_channel::bounded(limit);
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let (refresh, refresh_rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let inner = committer.inner.clone();
        let shared = inner.clone();
        let server_id = committer.server_id;
        let state = Arc::new(Mutex::new(committer));
        let committer = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("annals-pg-committer".into())
                .spawn(move || run(&state, receiver, wake_rx, refresh_rx))
                .map_err(|e| StoreError::Unavailable {
                    reason: format!("spawn the committer thread: {e}"),
                })?
        };
        let listener = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("annals-pg-listener".into())
                .spawn({
                    let counters = counters.clone();
                    move || listen(target, inner, server_id, &counters, wake_tx, stop)
                })
                .map_err(|e| StoreError::Unavailable {
                    reason: format!("spawn the listener thread: {e}"),
                })?
        };
        Ok(Remote {
            shared,
            sender: Some(sender),
            state,
            refresh,
            committer: Some(committer),
            listener: Some(listener),
            stop,
            counters,
            files: Some(files),
        })
    }

    /// Hands an append to the committer; the request comes back when the queue is full or
    /// closed.
    #[allow(clippy::result_large_err)] // handed back by value, as the writer's routes do
    pub(crate) fn submit(&self, request: Request, wait: bool) -> Result<(), TrySendError<Request>> {
        let Some(sender) = &self.sender else {
            return Err(TrySendError::Disconnected(request));
        };
        if wait {
            sender
                .send(request)
                .map_err(|e| TrySendError::Disconnected(e.into_inner()))
        } else {
            sender.try_send(request)
        }
    }

    /// Commits `request` on the calling thread, a blocking caller that is the only one waiting
    /// on the store, when nothing is queued for the committer and its state is free: the
    /// database's round trip and the hand-over to the mirror run here, so a lone client waits
    /// on PostgreSQL alone, as one waits on an fdatasync on files (`WriterRole::commit_alone`),
    /// without waking the committer thread and being woken by it. Otherwise hands the request
    /// back, to be queued.
    #[allow(clippy::result_large_err)] // handed back by value, as the writer's routes do
    pub(crate) fn commit_alone(&self, request: Request) -> Result<(), Request> {
        let queued = self.sender.as_ref().is_none_or(|s| !s.is_empty());
        if queued {
            return Err(request);
        }
        let Some(mut committer) = self.state.try_lock() else {
            return Err(request);
        };
        committer.commit_group(&mut vec![request], None);
        Ok(())
    }

    pub(crate) fn stats(&self) -> crate::stats::DatabaseStats {
        let c = &self.counters;
        crate::stats::DatabaseStats {
            commits: c.commits.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            passed: c.passed.load(Ordering::Relaxed),
            followed: c.followed.load(Ordering::Relaxed),
            reconnects: c.reconnects.load(Ordering::Relaxed),
            unknown_outcomes: c.unknown.load(Ordering::Relaxed),
            settled_outcomes: c.settled.load(Ordering::Relaxed),
        }
    }

    /// Takes in what the database holds now (what other servers committed until this call);
    /// answers the head after that.
    pub(crate) fn refresh(&self) -> Result<u64, StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.refresh.send(tx).map_err(|_| StoreError::Closed)?;
        rx.recv().map_err(|_| StoreError::Closed)?
    }

    pub(crate) fn queue_depth(&self) -> usize {
        self.sender.as_ref().map_or(0, |s| s.len())
    }

    /// The mirror's last append as the database stored it (for a kept mirror's close).
    pub(crate) fn last_append(&self) -> AppendStamp {
        self.state.lock().last_append
    }

    /// Stops taking appends, lets the committer finish what it holds, stops the listener.
    pub(crate) fn stop(&mut self) {
        self.sender = None;
        if let Some(handle) = self.committer.take() {
            let _ = handle.join();
        }
        self.stop.store(true, Ordering::Release);
        if let Some(handle) = self.listener.take() {
            let _ = handle.join();
        }
        self.files = None;
    }
}

impl Log for Remote {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn durability(&self) -> Durability {
        // Acknowledged once the database has committed.
        Durability::Synced
    }

    fn commit_alone(&self, request: Request) -> Result<(), Request> {
        Remote::commit_alone(self, request)
    }

    fn submit(&self, request: Request, wait_when_full: bool) -> Result<(), TrySendError<Request>> {
        Remote::submit(self, request, wait_when_full)
    }

    fn refresh(&self) -> Result<u64, StoreError> {
        Remote::refresh(self)
    }

    fn queue_depth(&self) -> usize {
        Remote::queue_depth(self)
    }

    fn synced(&self) -> u64 {
        // Everything the mirror holds was committed by the database first.
        self.shared.head()
    }

    fn on_local_disk(&self) -> bool {
        false
    }

    fn database_stats(&self) -> Option<crate::stats::DatabaseStats> {
        Some(self.stats())
    }

    /// Stops the committer and the listener, then closes the mirror writer's queue.
    fn stop(mut self: Box<Self>) -> Option<AppendStamp> {
        Remote::stop(&mut self);
        Some(self.last_append())
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The committer thread: takes each append from the queue with whatever waits behind it and
/// commits them as one group; between groups, follows what other servers commit.
fn run(
    state: &Mutex<Committer>,
    receiver: Receiver<Request>,
    wake: Receiver<u64>,
    refresh: Receiver<Sender<Result<u64, StoreError>>>,
) {
    let group_bytes_max = state.lock().inner.options.group_bytes_max;
    let mut group = Vec::new();
    loop {
        crossbeam_channel::select! {
            recv(receiver) -> request => match request {
                Ok(request) => {
                    group.push(request);
                    take_queued(&mut group, &receiver, group_bytes_max);
                    state.lock().commit_group(&mut group, Some(&receiver));
                }
                Err(_) => return,
            },
            recv(refresh) -> asked => {
                if let Ok(answer) = asked {
                    let mut committer = state.lock();
                    let outcome = committer.follow().map(|()| committer.inner.head());
                    let _ = answer.send(outcome.map_err(|e| clone_error(&e)));
                }
            }
            recv(wake) -> head => {
                let mut committer = state.lock();
                let behind = head.map_or(true, |h| h > committer.inner.head());
                if behind {
                    let _ = committer.follow();
                }
            }
            default(POLL) => {
                let _ = state.lock().follow();
            }
        }
    }
}

/// Adds the queued requests to `group`, within its limits.
fn take_queued(group: &mut Vec<Request>, receiver: &Receiver<Request>, bytes_max: usize) {
    let mut bytes: usize = group.iter().map(|r| r.append.body.len()).sum();
    while group.len() < GROUP_APPENDS_MAX && bytes < bytes_max {
        match receiver.try_recv() {
            Ok(request) => {
                bytes += request.append.body.len();
                group.push(request);
            }
            Err(_) => break,
        }
    }
}

/// StoreError is not Clone (it may hold an io::Error); the backend's own errors are.
fn clone_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable { reason } => StoreError::Unavailable {
            reason: reason.clone(),
        },
        StoreError::OutcomeUnknown { reason } => StoreError::OutcomeUnknown {
            reason: reason.clone(),
        },
        StoreError::Database(reason) => StoreError::Poisoned {
            reason: reason.clone(),
        },
        StoreError::Poisoned { reason } => StoreError::Poisoned {
            reason: reason.clone(),
        },
        StoreError::DiskFull { reason } => StoreError::DiskFull {
            reason: reason.clone(),
        },
        other => StoreError::Unavailable {
            reason: other.to_string(),
        },
    }
}

/// The head a notification announces, None when this server committed it. A payload that
/// cannot be read wakes the committer (to read the head from the database).
fn notified(payload: &str, server_id: i64) -> Option<u64> {
    let (head, from) = payload.split_once(' ').unwrap_or((payload, ""));
    if from.parse::<i64>() == Ok(server_id) {
        return None;
    }
    Some(head.parse().unwrap_or(u64::MAX))
}

/// A number naming this server among those on one database: random, not a configured name, so
/// that two servers started alike never share one.
fn server_id() -> i64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    static STARTED: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    std::process::id().hash(&mut hasher);
    now_us().hash(&mut hasher);
    STARTED.fetch_add(1, Ordering::Relaxed).hash(&mut hasher);
    hasher.finish() as i64
}

/// The listener thread: wakes the committer when another server commits. A wake-up only; the
/// committer polls as well. It listens only while its server is idle (see [`BUSY`]); when the
/// server turns idle it listens again and wakes the committer once, to take in what others
/// committed since its last commit.
fn listen(
    target: Target,
    inner: Arc<Shared>,
    server_id: i64,
    counters: &RemoteCounters,
    wake: Sender<u64>,
    stop: Arc<AtomicBool>,
) {
    let mut client: Option<Client> = None;
    let mut listening = false;
    let mut retry_at = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let Some(c) = client.as_mut() else {
            if Instant::now() < retry_at {
                std::thread::sleep(IDLE_TICK);
                continue;
            }
            match target.connect(None) {
                Ok(c) => {
                    client = Some(c);
                    listening = false;
                }
                Err(_) => retry_at = Instant::now() + Duration::from_secs(1),
            }
            continue;
        };
        let since_commit =
            now_us().saturating_sub(counters.committed_at_us.load(Ordering::Relaxed));
        let busy = since_commit < BUSY.as_micros() as u64;

        if busy == listening {
            let statement = if busy {
                "UNLISTEN annals_appended"
            } else {
                "LISTEN annals_appended"
            };
            if c.batch_execute(statement).is_err() {
                client = None;
                retry_at = Instant::now() + Duration::from_millis(200);
                continue;
            }
            listening = !busy;
            if listening {
                // Whatever others committed while this server did not listen.
                let _ = wake.try_send(u64::MAX);
            }
        }
        if !listening {
            std::thread::sleep(IDLE_TICK);
            continue;
        }
        let next = c
            .notifications()
            .timeout_iter(LISTEN_TICK)
            .next()
            .map(|n| n.map(|n| notified(n.payload(), server_id)));
        match next {
            // This server's own commits are in its mirror already: no wake-up for them.
            Ok(Some(Some(head))) if head > inner.head() => {
                let _ = wake.try_send(head);
            }
            Ok(Some(_)) => {}
            Ok(None) => {}
            Err(_) => {
                client = None;
                retry_at = Instant::now() + Duration::from_millis(200);
            }
        }
    }
}
