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
//! row per append (its first and last position, its append time and its events encoded exactly
//! as in a segment's record body, tracking trailer included), keyed by its first position, and
//! `annals_schema`, the schema's version. A third, `annals_companions` (kind, name, bytes),
//! holds read models' checkpoints and the exchange's snapshots (companions.rs); it is created
//! by the first server that writes one and is not part of the log's schema version.
//!
//! A group commits with one statement, run outside an explicit transaction (so one round trip
//! and the statement's own commit): it inserts the group's first row unless a row already
//! starts at that position, and the others only if the first went in. The key serialises
//! writers on every server: a group starts right after the last position its server holds, so
//! a concurrent group from the same head waits for the other's key, then finds it taken and
//! inserts nothing, and a group from a stale head finds the row that follows it. Its server
//! then reads what the others committed, checks its appends again and retries. A row starting
//! at position p + 1 is written only by a server that has read the row ending at p, so
//! committed rows always form a dense prefix of positions, committed in order, any snapshot of
//! the table is gapless, and a condition is checked against every append committed before it,
//! by any server.
//!
//! Nothing here needs locking of PostgreSQL's own (advisory locks, `SELECT ... FOR UPDATE`,
//! serializable isolation): a unique key, which PostgreSQL-compatible distributed databases
//! also offer. The PostgreSQL-only parts are `ON CONFLICT DO NOTHING` (an insert that skips a
//! taken key rather than fail; elsewhere, a unique violation would be the lost race), and
//! `pg_notify` in the commit with `LISTEN` on a second connection, a wake-up for followers
//! whose correctness never depends on it (they also poll).

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
use crate::pgconnect::Target;
use crate::query::Query;
use crate::record::{EncodedAppend, Entries};
use crate::store::Shared;
use crate::writer::{checked, now_us, Reply, ReplyTo, Request, WriterRole};

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i32 = 2;

/// The statements that create the schema; each is idempotent.
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS annals_schema (
        id integer PRIMARY KEY CHECK (id = 1),
        version integer NOT NULL)",
    // No CHECK constraints: PostgreSQL parses each again in every insert, a tenth of a lone
    // commit's time; a row is checked when read instead (`Committer::follow_once`). Bodies
    // over 2 KB are compressed with lz4 where the server has it (PostgreSQL 14 and later,
    // built with lz4): 64 writers of 512 events went from 0.31M to 0.45M events/s against
    // pglz, the default. Without it, `APPENDS_PLAIN` instead.
    "CREATE TABLE IF NOT EXISTS annals_appends (
        first_position bigint PRIMARY KEY,
        last_position bigint NOT NULL,
        appended_at_us bigint NOT NULL,
        body bytea COMPRESSION lz4 NOT NULL)",
    "INSERT INTO annals_schema (id, version) VALUES (1, 2) ON CONFLICT (id) DO NOTHING",
];

/// The table of appends on a server without lz4 compression.
const APPENDS_PLAIN: &str = "CREATE TABLE IF NOT EXISTS annals_appends (
        first_position bigint PRIMARY KEY,
        last_position bigint NOT NULL,
        appended_at_us bigint NOT NULL,
        body bytea NOT NULL)";

/// From version 1, which kept the head in a row of its own, moved by compare in each commit:
/// the first position's key serialises writers as well, for less work per commit.
const MIGRATE_FROM_1: &str = "BEGIN;
    ALTER TABLE annals_appends DROP CONSTRAINT IF EXISTS annals_appends_check;
    DROP TABLE IF EXISTS annals_head;
    UPDATE annals_schema SET version = 2 WHERE id = 1 AND version = 1;
    COMMIT";

/// A group of one append: inserts its row unless a row already starts at its first position
/// (another server committed first). Answers the rows inserted (0 or 1). The notification
/// says the new head and which server committed ($5), so that a server's listener passes over
/// its own commits; it is a wake-up only, and a spurious one (after a lost race) costs a look.
const COMMIT_ONE: &str =
    "INSERT INTO annals_appends (first_position, last_position, appended_at_us, body)
    SELECT $1, $2, $3, $4
    FROM (SELECT pg_notify('annals_appended', $2::int8::text || ' ' || $5::int8::text)) AS wake
    ON CONFLICT (first_position) DO NOTHING";

/// A group of several appends: the first row as in [`COMMIT_ONE`], the others only if it went
/// in. They cannot collide once it did: a row starting later was written by a server that had
/// read a row covering the first one's position. Answers the rows inserted.
const COMMIT_GROUP: &str = "WITH lead AS (
        INSERT INTO annals_appends (first_position, last_position, appended_at_us, body)
        VALUES ($1, $2, $3, $4) ON CONFLICT (first_position) DO NOTHING RETURNING 1
    ), rest AS (
        INSERT INTO annals_appends (first_position, last_position, appended_at_us, body)
        SELECT f, l, t, b FROM unnest($5::int8[], $6::int8[], $7::int8[], $8::bytea[]) AS a(f, l, t, b)
        WHERE EXISTS (SELECT 1 FROM lead) RETURNING 1
    )
    SELECT (SELECT count(*) FROM lead) + (SELECT count(*) FROM rest),
        (SELECT pg_notify('annals_appended', $9::int8::text || ' ' || $10::int8::text)
         WHERE EXISTS (SELECT 1 FROM lead))";

/// The last position committed (no row: none).
const HEAD: &str = "SELECT last_position FROM annals_appends ORDER BY first_position DESC LIMIT 1";

const FETCH: &str = "SELECT first_position, last_position, appended_at_us, body FROM annals_appends
    WHERE first_position > $1 ORDER BY first_position LIMIT $2";

/// Rows fetched per round trip while following the database.
const FETCH_ROWS: i64 = 2048;

/// Attempts at committing one group (each after a lost race or a serialization failure)
/// before its appends are refused as unavailable.
const ATTEMPTS_MAX: u32 = 100;

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

/// Counters of the database backend, for [`crate::Stats`].
#[derive(Default)]
pub(crate) struct RemoteCounters {
    /// Group commits that succeeded.
    pub(crate) commits: AtomicU64,
    /// Group commits that found the head moved by another server and were checked again.
    pub(crate) conflicts: AtomicU64,
    /// Appends of other servers taken into this one's log.
    pub(crate) followed: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    /// Appends answered with an unknown outcome.
    pub(crate) unknown: AtomicU64,
    /// When this server's last group committed, in microseconds since the epoch (see
    /// [`BUSY`]).
    pub(crate) committed_at_us: AtomicU64,
}

/// The database backend of an open [`crate::Store`].
pub(crate) struct Remote {
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
}

impl Remote {
    /// Connects, creates or checks the schema, loads the database's log into the store's
    /// memory-only log (`inner`, still empty) and starts the committer and the listener.
    pub(crate) fn start(
        url: &str,
        inner: Arc<Shared>,
        role: Arc<WriterRole>,
    ) -> Result<Remote, StoreError> {
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
            last_append: StoredAppend::default(),
            server_id: server_id(),
        };
        committer.adopt(client)?;
        committer.follow()?;
        let limit = committer.inner.options.limits.queue_depth_max;
        let (sender, receiver) = crossbeam_channel::bounded(limit);
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let (refresh, refresh_rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let inner = committer.inner.clone();
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
            sender: Some(sender),
            state,
            refresh,
            committer: Some(committer),
            listener: Some(listener),
            stop,
            counters,
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

    pub(crate) fn stats(&self) -> crate::store::DatabaseStats {
        let c = &self.counters;
        crate::store::DatabaseStats {
            commits: c.commits.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            followed: c.followed.load(Ordering::Relaxed),
            reconnects: c.reconnects.load(Ordering::Relaxed),
            unknown_outcomes: c.unknown.load(Ordering::Relaxed),
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
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.stop();
    }
}

fn unavailable(what: &str, e: &postgres::Error) -> StoreError {
    StoreError::Unavailable {
        reason: format!("PostgreSQL {what}: {}", describe(e)),
    }
}

/// The database rolled a transaction back because of a concurrent one; trying it again may
/// succeed (SQLSTATE 40001 and 40P01).
fn is_serialization_failure(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// The database does not know a feature or a clause.
fn is_unsupported(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::FEATURE_NOT_SUPPORTED
            || *c == SqlState::SYNTAX_ERROR
            || *c == SqlState::UNDEFINED_OBJECT
    })
}

/// The error with the database's own message when it sent one.
/// Otherwise the error and its causes ("error performing TLS handshake: invalid peer
/// certificate: UnknownIssuer").
fn describe(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

/// Creates the schema when missing; refuses one newer than this build.
fn ensure_schema(client: &mut Client) -> Result<(), StoreError> {
    let mut last = None;
    // Two servers creating the schema at once may collide in the catalog: try again.
    for _ in 0..5 {
        let created = SCHEMA.iter().try_for_each(|&statement| {
            match client.batch_execute(statement) {
                // No lz4 in this server (or no COMPRESSION clause before PostgreSQL 14).
                Err(e) if statement.contains("lz4") && is_unsupported(&e) => {
                    client.batch_execute(APPENDS_PLAIN)
                }
                other => other,
            }
        });
        match created {
            Ok(()) => {
                last = None;
                break;
            }
            Err(e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    if let Some(e) = last {
        return Err(unavailable("create the schema", &e));
    }
    let version: i32 = client
        .query_one("SELECT version FROM annals_schema WHERE id = 1", &[])
        .map_err(|e| unavailable("read the schema version", &e))?
        .get(0);
    if version > SCHEMA_VERSION {
        return Err(StoreError::Database(format!(
            "the database holds an Annals schema of version {version}, newer than this build's \
             ({SCHEMA_VERSION}); run a newer Annals"
        )));
    }
    if version == 1 {
        // Servers of the version before must be stopped first: they would wait for a head
        // row that is gone, refusing every append, rather than do harm.
        client
            .batch_execute(MIGRATE_FROM_1)
            .map_err(|e| unavailable("migrate the schema from version 1", &e))?;
    }
    Ok(())
}

/// One connection with its prepared statements.
struct Connection {
    client: Client,
    commit_one: Statement,
    commit_group: Statement,
    head: Statement,
    fetch: Statement,
}

/// Answers that the mirror log must give, counted down as its writer answers them.
#[derive(Default)]
struct Applied {
    state: Mutex<(usize, Option<String>)>,
    done: Condvar,
}

impl Applied {
    fn expect(&self, n: usize) {
        self.state.lock().0 += n;
    }

    fn answer(&self, error: Option<String>) {
        let mut state = self.state.lock();
        state.0 -= 1;
        if state.1.is_none() {
            state.1 = error;
        }
        if state.0 == 0 {
            self.done.notify_all();
        }
    }

    /// Waits until every expected answer is in; the first error, if any.
    fn wait(&self) -> Option<String> {
        let mut state = self.state.lock();
        while state.0 > 0 {
            self.done.wait(&mut state);
        }
        state.1.take()
    }
}

/// What identifies an append stored in the database: positions, append time, body size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct StoredAppend {
    first: u64,
    last: u64,
    at: u64,
    bytes: u64,
}

impl StoredAppend {
    fn of(first: u64, last: u64, at: u64, append: &EncodedAppend) -> StoredAppend {
        StoredAppend {
            first,
            last,
            at,
            bytes: append.body.len() as u64,
        }
    }
}

/// An append of this server's group that passed its checks.
struct Accepted {
    request: Request,
    first: u64,
    last: u64,
}

/// The committer thread's state.
struct Committer {
    target: Target,
    connection: Option<Connection>,
    /// The memory-only log that mirrors the database, and its writer's role, taken to hand
    /// committed appends over.
    inner: Arc<Shared>,
    role: Arc<WriterRole>,
    counters: Arc<RemoteCounters>,
    /// Set by the connection's notice callback (see [`connect`]).
    warned: Arc<AtomicBool>,
    /// After a lost connection: check on reconnecting that the database still holds the
    /// mirror's last append (a failover to a standby that lacks it would leave the mirror
    /// ahead of the log).
    verify_on_connect: bool,
    /// The append time of the group last committed.
    group_time: u64,
    /// The mirror's last append as the database stored it, to recognise it after a failover.
    last_append: StoredAppend,
    /// Names this server's commits in their notifications (see [`COMMIT`]).
    server_id: i64,
}

impl Drop for Committer {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            crate::pgconnect::close(connection);
        }
    }
}

impl Committer {
    fn adopt(&mut self, client: Client) -> Result<(), StoreError> {
        let mut client = client;
        let prepare = |client: &mut Client, sql: &str| {
            client
                .prepare(sql)
                .map_err(|e| unavailable("prepare a statement", &e))
        };
        let commit_one = prepare(&mut client, COMMIT_ONE)?;
        let commit_group = prepare(&mut client, COMMIT_GROUP)?;
        let head = prepare(&mut client, HEAD)?;
        let fetch = prepare(&mut client, FETCH)?;
        self.connection = Some(Connection {
            client,
            commit_one,
            commit_group,
            head,
            fetch,
        });
        Ok(())
    }

    /// The connection, made anew if the last one was lost.
    fn connection(&mut self) -> Result<&mut Connection, StoreError> {
        if self.connection.is_none() {
            let client = self
                .target
                .connect(Some(self.warned.clone()))
                .map_err(|e| unavailable("connect", &e))?;
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            self.adopt(client)?;
            if self.verify_on_connect {
                self.verify_mirror()?;
                self.verify_on_connect = false;
            }
        }
        Ok(self.connection.as_mut().expect("connected above"))
    }

    /// Drops the connection after an error that may have left it unusable.
    fn lost(&mut self, e: &postgres::Error) {
        if e.as_db_error().is_none() || e.is_closed() {
            self.connection = None;
            self.verify_on_connect = true;
        }
    }

    /// Takes into the mirror what the database holds beyond it.
    fn follow(&mut self) -> Result<(), StoreError> {
        let result = self.follow_once();
        if let Err(StoreError::Database(reason)) = &result {
            // The mirror can no longer be trusted to hold what the database holds.
            self.inner.poison(reason.clone());
        }
        result
    }

    /// Reads the rows after the mirror's head, a chunk at a time, until there are none: one
    /// round trip when another server committed a group (after a lost race, say). Finding none,
    /// it reads the head as well, to notice a database that lost what the mirror holds.
    fn follow_once(&mut self) -> Result<(), StoreError> {
        let mut local = self.inner.head();
        loop {
            let connection = self.connection()?;
            let rows = connection
                .client
                .query(&connection.fetch, &[&(local as i64), &FETCH_ROWS]);
            let rows = match rows {
                Ok(rows) => rows,
                Err(e) => {
                    let error = unavailable("read appends", &e);
                    self.lost(&e);
                    return Err(error);
                }
            };
            if rows.is_empty() {
                return self.check_not_behind(local);
            }
            let complete = (rows.len() as i64) < FETCH_ROWS;
            let applied = Arc::new(Applied::default());
            let mut handed = Vec::with_capacity(rows.len());
            let mut bad = None;
            for row in rows {
                let (first, last, at, body) = (
                    row.get::<_, i64>(0) as u64,
                    row.get::<_, i64>(1) as u64,
                    row.get::<_, i64>(2) as u64,
                    row.get::<_, Vec<u8>>(3),
                );
                if first != local + 1 || last < first || last - first >= u64::from(u32::MAX) {
                    bad = Some(format!(
                        "an append at positions {first}..={last} follows position {local}: the \
                         table annals_appends is not a gapless log"
                    ));
                    break;
                }
                let append = match EncodedAppend::from_stored(body, (last - first + 1) as u32) {
                    Ok(append) => append,
                    Err(why) => {
                        bad = Some(format!(
                            "the append at position {first} is malformed: {why}"
                        ));
                        break;
                    }
                };
                let expected = last;
                self.last_append = StoredAppend::of(first, last, at, &append);
                applied.expect(1);
                let done = applied.clone();
                let reply = ReplyTo::Callback(Box::new(move |outcome| {
                    done.answer(match outcome {
                        Ok(p) if p == expected => None,
                        other => Some(format!(
                            "the mirror took the append at {first}..={expected} as {other:?}"
                        )),
                    })
                }));
                handed.push(committed(append, at, reply));
                local = last;
                self.counters.followed.fetch_add(1, Ordering::Relaxed);
            }
            // What came before a bad row is committed and sound: the mirror takes it.
            self.role.commit_committed(handed);
            if let Some(error) = applied.wait().or(bad) {
                return Err(StoreError::Database(error));
            }
            if complete {
                return Ok(());
            }
        }
    }

    /// Fails when the database's log ends before the mirror's.
    fn check_not_behind(&mut self, local: u64) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let target = match connection.client.query_opt(&connection.head, &[]) {
            Ok(row) => row.map_or(0, |r| r.get::<_, i64>(0) as u64),
            Err(e) => {
                let error = unavailable("read the head", &e);
                self.lost(&e);
                return Err(error);
            }
        };
        if target < local {
            return Err(StoreError::Database(format!(
                "the database's log ends at position {target}, before this server's at {local}: \
                 it lost committed appends (a failover to a standby that did not have them?); \
                 restart this server to follow the database as it is"
            )));
        }
        Ok(())
    }

    /// Checks that the database holds the mirror's last append: the same positions, append
    /// time and size. After a failover to a standby that lacked it, another server may have
    /// committed a different append at the same positions since; its time tells them apart
    /// (two servers committing the same positions in the same microsecond with bodies of one
    /// size is what this cannot tell).
    fn verify_mirror(&mut self) -> Result<(), StoreError> {
        let head = self.inner.head();
        if head == 0 {
            return Ok(());
        }
        let mine = self.last_append;
        debug_assert_eq!(mine.last, head, "the mirror's last append ends at its head");
        let connection = self.connection.as_mut().expect("connected");
        let row = connection
            .client
            .query_opt(
                "SELECT first_position, last_position, appended_at_us, octet_length(body) \
                 FROM annals_appends WHERE first_position <= $1 \
                 ORDER BY first_position DESC LIMIT 1",
                &[&(head as i64)],
            )
            .map_err(|e| unavailable("verify the log", &e))?;
        let found = row.map(|r| StoredAppend {
            first: r.get::<_, i64>(0) as u64,
            last: r.get::<_, i64>(1) as u64,
            at: r.get::<_, i64>(2) as u64,
            bytes: r.get::<_, i32>(3) as u64,
        });
        if found == Some(mine) && mine.last == head {
            return Ok(());
        }
        let reason = format!(
            "after reconnecting, the database does not hold the append this server holds last \
             ({mine:?}; found {found:?}): it lost committed appends, and another server may \
             have written others in their place; restart this server to follow the database \
             as it is"
        );
        self.inner.poison(reason.clone());
        Err(StoreError::Database(reason))
    }

    /// Checks, commits and hands to the mirror one group of this server's appends; answers
    /// every request of the group. After a lost race the group takes in what was queued
    /// meanwhile (from `queue`), so that the next attempt commits it too.
    fn commit_group(&mut self, group: &mut Vec<Request>, queue: Option<&Receiver<Request>>) {
        let mut pending: Vec<Request> = std::mem::take(group);
        let mut attempts = 0u32;
        while !pending.is_empty() {
            attempts += 1;
            if attempts > ATTEMPTS_MAX {
                let e = StoreError::Unavailable {
                    reason: format!(
                        "PostgreSQL: the group lost {ATTEMPTS_MAX} races in a row to other \
                         servers' commits"
                    ),
                };
                for request in pending.drain(..) {
                    request.reply.send(Err(clone_error(&e).into()));
                }
                return;
            }
            if let Some(e) = self.inner.poison_error() {
                for request in pending.drain(..) {
                    request.reply.send(Err(StoreError::Poisoned {
                        reason: e.to_string(),
                    }
                    .into()));
                }
                return;
            }
            // The mirror must hold what the database holds before a condition is checked: a
            // fresh connection or a lost race means another server may have committed.
            if attempts > 1 || self.connection.is_none() {
                if let Err(e) = self.follow() {
                    for request in pending.drain(..) {
                        request.reply.send(Err(clone_error(&e).into()));
                    }
                    return;
                }
            }
            let head = self.inner.head();
            let accepted = check(&self.inner, head, &mut pending);
            if accepted.is_empty() {
                return;
            }
            match self.commit(head, &accepted) {
                Ok(true) => {
                    self.counters.commits.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .committed_at_us
                        .store(now_us(), Ordering::Relaxed);
                    self.hand_over(accepted);
                    return;
                }
                Ok(false) => {
                    self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                    pending = accepted.into_iter().map(|a| a.request).collect();
                    if let Some(queue) = queue {
                        take_queued(&mut pending, queue, self.inner.options.group_bytes_max);
                    }
                }
                Err(error) => {
                    if matches!(error, StoreError::OutcomeUnknown { .. }) {
                        self.counters
                            .unknown
                            .fetch_add(accepted.len() as u64, Ordering::Relaxed);
                    }
                    for a in accepted {
                        a.request.reply.send(Err(clone_error(&error).into()));
                    }
                    return;
                }
            }
        }
    }

    /// Runs the group's statement: true when committed, false when another server committed
    /// first (nothing was inserted, or the database rolled the statement back as a
    /// serialization failure). An error whose outcome cannot be known is
    /// [`StoreError::OutcomeUnknown`]; one the database reported is [`StoreError::Unavailable`]
    /// (the statement, and so its transaction, failed: nothing was committed).
    fn commit(&mut self, head: u64, accepted: &[Accepted]) -> Result<bool, StoreError> {
        let now = now_us();
        let (lead, rest) = accepted.split_first().expect("a group");
        assert_eq!(lead.first, head + 1, "a group starts right after the head");
        let last = accepted.last().expect("a group").last as i64;
        // An append read from another log (a copy's) keeps its time.
        let time = |a: &Accepted| a.request.appended_at.unwrap_or(now) as i64;
        let (lead_first, lead_last, lead_time) = (lead.first as i64, lead.last as i64, time(lead));
        let lead_body = lead.request.append.body.as_slice();
        self.warned.store(false, Ordering::Release);
        let server_id = self.server_id;
        let connection = self.connection()?;
        let outcome = if rest.is_empty() {
            connection.client.execute(
                &connection.commit_one,
                &[&lead_first, &lead_last, &lead_time, &lead_body, &server_id],
            )
        } else {
            let firsts: Vec<i64> = rest.iter().map(|a| a.first as i64).collect();
            let lasts: Vec<i64> = rest.iter().map(|a| a.last as i64).collect();
            let times: Vec<i64> = rest.iter().map(time).collect();
            let bodies: Vec<&[u8]> = rest
                .iter()
                .map(|a| a.request.append.body.as_slice())
                .collect();
            connection
                .client
                .query_one(
                    &connection.commit_group,
                    &[
                        &lead_first,
                        &lead_last,
                        &lead_time,
                        &lead_body,
                        &firsts,
                        &lasts,
                        &times,
                        &bodies,
                        &last,
                        &server_id,
                    ],
                )
                .map(|row| row.get::<_, i64>(0) as u64)
        };
        match outcome {
            Ok(inserted) => {
                if self.warned.load(Ordering::Acquire) {
                    // Committed on the primary, not confirmed by its synchronous standby: a
                    // failover may lose it. Neither success nor failure can be promised.
                    self.connection = None;
                    self.verify_on_connect = true;
                    return Err(StoreError::OutcomeUnknown {
                        reason: "PostgreSQL committed locally but did not confirm replication"
                            .into(),
                    });
                }
                debug_assert!(inserted == 0 || inserted as usize == accepted.len());
                if inserted != 0 && inserted as usize != accepted.len() {
                    return Err(StoreError::Database(format!(
                        "a group of {} appends committed {inserted} rows",
                        accepted.len()
                    )));
                }
                // The appends' time, for the mirror: the one the database holds.
                self.group_time = now;
                Ok(inserted > 0)
            }
            // The database rolled the statement back for a concurrent one (a distributed
            // database's optimistic transactions, or isolation set above read committed):
            // nothing was committed, as in a lost race.
            Err(e) if is_serialization_failure(&e) => Ok(false),
            Err(e) if e.as_db_error().is_some() => {
                let error = unavailable("commit", &e);
                self.lost(&e);
                Err(error)
            }
            Err(e) => {
                self.lost(&e);
                Err(StoreError::OutcomeUnknown {
                    reason: format!("the connection to PostgreSQL failed during the commit: {e}"),
                })
            }
        }
    }

    /// Hands a committed group to the mirror, each append answered from there; waits until
    /// the mirror holds it, so that the next group is checked against it.
    fn hand_over(&mut self, accepted: Vec<Accepted>) {
        let applied = Arc::new(Applied::default());
        applied.expect(accepted.len());
        let at = self.group_time;
        let mut handed = Vec::with_capacity(accepted.len());
        for a in accepted {
            let Accepted {
                request,
                first,
                last,
            } = a;
            let Request {
                append,
                reply,
                appended_at,
                ..
            } = request;
            let at = appended_at.unwrap_or(at);
            self.last_append = StoredAppend::of(first, last, at, &append);
            let done = applied.clone();
            let inner = self.inner.clone();
            let answer = ReplyTo::Callback(Box::new(move |outcome| {
                let fits = matches!(outcome, Ok(p) if p == last);
                if !fits {
                    // Committed in the database, but the mirror disagrees: this server can no
                    // longer answer for the log until it is restarted.
                    inner.poison(format!(
                        "the mirror took the committed append at {first}..={last} as {outcome:?}"
                    ));
                }
                done.answer(None);
                // The database committed it: that is the append's outcome.
                reply.send(Ok(last));
            }));
            handed.push(committed(append, at, answer));
        }
        self.role.commit_committed(handed);
        // The mirror answers in its writer's call (D1): nothing is left to wait for, but the
        // next group must be checked against this one.
        applied.wait();
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

/// A request handing an append the database committed to the mirror's writer.
fn committed(append: EncodedAppend, appended_at: u64, reply: ReplyTo) -> Request {
    Request {
        append,
        condition: None,
        require_synced: false,
        reply: Reply::new(reply),
        appended_at: Some(appended_at),
    }
}

/// Checks each pending append against the mirror at `head` and against the appends of the
/// group accepted before it; answers those whose outcome is already known (a failed
/// condition, a retry recognised, a tracking position not above the recorded one) and
/// returns the others with their positions.
fn check(inner: &Shared, head: u64, pending: &mut Vec<Request>) -> Vec<Accepted> {
    let index = inner.index.read();
    debug_assert_eq!(index.len(), head, "the mirror's index is at its head");
    let mut accepted: Vec<Accepted> = Vec::with_capacity(pending.len());
    let mut next = head + 1;
    for request in pending.drain(..) {
        let outcome = checked(
            &index,
            &inner.counters,
            &request,
            |query, after| first_match_in_group(&accepted, query, after),
            |source| {
                accepted
                    .iter()
                    .filter_map(|a| a.request.append.tracking())
                    .filter(|(s, _)| *s == source)
                    .map(|(_, p)| p)
                    .max()
            },
        );
        if let Some(outcome) = outcome {
            request.reply.send(outcome);
            continue;
        }
        let first = next;
        let last = first + u64::from(request.append.event_count) - 1;
        next = last + 1;
        accepted.push(Accepted {
            request,
            first,
            last,
        });
    }
    accepted
}

/// The first event of the group's accepted appends after `after` that `query` matches.
fn first_match_in_group(accepted: &[Accepted], query: &Query, after: u64) -> Option<u64> {
    accepted.iter().find_map(|a| {
        let append = &a.request.append;
        Entries::new(append.entries(), append.event_count)
            .trusted()
            .zip(a.first..)
            .find(|((_, entry, layout), position)| {
                *position > after
                    && query.matches(layout.event_type(entry), Tags::of(entry, layout))
            })
            .map(|(_, position)| position)
    })
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
