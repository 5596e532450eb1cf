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
use crate::pgconnect::Target;
use crate::query::Query;
use crate::record::{EncodedAppend, Entries};
use crate::store::Shared;
use crate::writer::{checked, now_us, Reply, ReplyTo, Request, WriterRole};

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i32 = 3;

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
        body bytea COMPRESSION lz4 NOT NULL,
        keys bigint[])",
    "INSERT INTO annals_schema (id, version) VALUES (1, 3) ON CONFLICT (id) DO NOTHING",
];

/// The table of appends on a server without lz4 compression.
const APPENDS_PLAIN: &str = "CREATE TABLE IF NOT EXISTS annals_appends (
        first_position bigint PRIMARY KEY,
        last_position bigint NOT NULL,
        appended_at_us bigint NOT NULL,
        body bytea NOT NULL,
        keys bigint[])";

/// From version 1, which kept the head in a row of its own, moved by compare in each commit:
/// the first position's key serialises writers as well, for less work per commit.
const MIGRATE_FROM_1: &str = "BEGIN;
    ALTER TABLE annals_appends DROP CONSTRAINT IF EXISTS annals_appends_check;
    DROP TABLE IF EXISTS annals_head;
    UPDATE annals_schema SET version = 2 WHERE id = 1 AND version = 1;
    COMMIT";

/// From version 2: each row also holds its append's keys (see [`PASS_FUNCTION`]). Rows
/// written before, or by servers of version 2 still running, hold none (NULL), which every
/// probe counts as a match.
const MIGRATE_FROM_2: &str = "BEGIN;
    ALTER TABLE annals_appends ADD COLUMN IF NOT EXISTS keys bigint[];
    UPDATE annals_schema SET version = 3 WHERE id = 1 AND version = 2;
    COMMIT";

/// A group of one append: inserts its row unless a row already starts at its first position
/// (another server committed first). Answers the rows inserted (0 or 1). The notification
/// says the new head and which server committed ($5), so that a server's listener passes over
/// its own commits; it is a wake-up only, and a spurious one (after a lost race) costs a look.
const COMMIT_ONE: &str =
    "INSERT INTO annals_appends (first_position, last_position, appended_at_us, body, keys)
    SELECT $1, $2, $3, $4, $6
    FROM (SELECT pg_notify('annals_appended', $2::int8::text || ' ' || $5::int8::text)) AS wake
    ON CONFLICT (first_position) DO NOTHING";

/// The statement of a lone append (`COMMIT_ONE`) aimed at another table and notification
/// channel: the database's own work for a lone append, without the server. The benchmark
/// measures it beside its commit floor, on a table made `LIKE annals_appends INCLUDING ALL`,
/// so that a lone client's figure can be told apart from what the database costs per append
/// row.
pub fn lone_commit_statement(table: &str, channel: &str) -> String {
    assert!(
        COMMIT_ONE.contains("annals_appends") && COMMIT_ONE.contains("'annals_appended'"),
        "the statement names its table and channel"
    );
    COMMIT_ONE
        .replace("annals_appends", table)
        .replace("'annals_appended'", &format!("'{channel}'"))
}

/// A group of several appends: the first row as in [`COMMIT_ONE`], the others only if it went
/// in. They cannot collide once it did: a row starting later was written by a server that had
/// read a row covering the first one's position. Answers the rows inserted.
const COMMIT_GROUP: &str = "WITH lead AS (
        INSERT INTO annals_appends (first_position, last_position, appended_at_us, body, keys)
        VALUES ($1, $2, $3, $4, $11) ON CONFLICT (first_position) DO NOTHING RETURNING 1
    ), rest AS (
        INSERT INTO annals_appends (first_position, last_position, appended_at_us, body, keys)
        SELECT f, l, t, b, CASE WHEN kf IS NULL THEN NULL ELSE ($12::int8[])[kf:kt] END
        FROM unnest($5::int8[], $6::int8[], $7::int8[], $8::bytea[], $13::int4[], $14::int4[])
            AS a(f, l, t, b, kf, kt)
        WHERE EXISTS (SELECT 1 FROM lead) RETURNING 1
    )
    SELECT (SELECT count(*) FROM lead) + (SELECT count(*) FROM rest),
        (SELECT pg_notify('annals_appended', $9::int8::text || ' ' || $10::int8::text)
         WHERE EXISTS (SELECT 1 FROM lead))";

/// The retry of a group that lost a race, in one call (replaced at every open, so that it is
/// this build's). The group was checked against its server's log up to `head`, and its
/// appends' positions (`firsts`, `lasts`) follow `head`; a row's keys are
/// `keys[key_from:key_to]`, none where those are NULL.
///
/// It inserts the group as [`COMMIT_GROUP`] does. When the first position is taken, it reads,
/// with a snapshot of its own (each statement of a VOLATILE function takes one at read
/// committed), what was committed after the position it tried, and compares each row's keys
/// with the group's `probe`: the keys a row must hold to matter to one of the group's
/// conditions or tracking positions. When none does, it tries again right after those rows,
/// its positions moved by as much, without the round trip to the server that a read and a
/// second check would take; otherwise (or after 8 tries, or 256 rows) it gives up, and the
/// server reads and checks the group again itself. A NULL probe gives up at the first row
/// taken; a row with NULL keys matches every probe but an empty one.
///
/// Answers the rows it passed over (body not NULL), for the server's mirror, then one row
/// whose body is NULL: how far the group's positions moved and how many rows it inserted
/// (0: it gave up).
const PASS_FUNCTION: &str = "CREATE OR REPLACE FUNCTION annals_commit_after(
        head bigint, probe bigint[], firsts bigint[], lasts bigint[], times bigint[],
        bodies bytea[], keys bigint[], key_from integer[], key_to integer[], server bigint)
    RETURNS TABLE (o_first bigint, o_last bigint, o_at bigint, o_body bytea)
    LANGUAGE plpgsql VOLATILE AS $fn$
    DECLARE
        at bigint := head;
        inserted bigint;
        passed integer := 0;
        r record;
    BEGIN
        FOR attempt IN 1..8 LOOP
            INSERT INTO annals_appends (first_position, last_position, appended_at_us, body, keys)
            VALUES (firsts[1] + at - head, lasts[1] + at - head, times[1], bodies[1],
                CASE WHEN key_from[1] IS NULL THEN NULL ELSE keys[key_from[1]:key_to[1]] END)
            ON CONFLICT (first_position) DO NOTHING;
            GET DIAGNOSTICS inserted = ROW_COUNT;
            IF inserted = 1 THEN
                IF cardinality(firsts) > 1 THEN
                    INSERT INTO annals_appends
                        (first_position, last_position, appended_at_us, body, keys)
                    SELECT f + at - head, l + at - head, t, b,
                        CASE WHEN kf IS NULL THEN NULL ELSE keys[kf:kt] END
                    FROM unnest(firsts[2:], lasts[2:], times[2:], bodies[2:], key_from[2:],
                        key_to[2:]) AS x(f, l, t, b, kf, kt);
                    GET DIAGNOSTICS inserted = ROW_COUNT;
                    inserted := inserted + 1;
                END IF;
                PERFORM pg_notify('annals_appended',
                    (lasts[cardinality(lasts)] + at - head)::text || ' ' || server::text);
                RETURN QUERY SELECT at - head, inserted, NULL::bigint, NULL::bytea;
                RETURN;
            END IF;
            FOR r IN SELECT a.first_position, a.last_position, a.appended_at_us, a.body, a.keys
                FROM annals_appends a WHERE a.first_position > at
                ORDER BY a.first_position LIMIT 256 - passed
            LOOP
                IF r.first_position <> at + 1 OR probe IS NULL
                    OR (cardinality(probe) > 0 AND (r.keys IS NULL OR r.keys && probe)) THEN
                    RETURN QUERY SELECT at - head, 0::bigint, NULL::bigint, NULL::bytea;
                    RETURN;
                END IF;
                RETURN QUERY SELECT r.first_position, r.last_position, r.appended_at_us, r.body;
                at := r.last_position;
                passed := passed + 1;
            END LOOP;
            EXIT WHEN passed >= 256;
        END LOOP;
        RETURN QUERY SELECT at - head, 0::bigint, NULL::bigint, NULL::bytea;
    END $fn$";

/// Calls [`PASS_FUNCTION`].
const COMMIT_AFTER: &str = "SELECT o_first, o_last, o_at, o_body FROM annals_commit_after(
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// Keys an append's row holds at most; one with more holds none (NULL), and so matches every
/// probe: passing over is an optimisation, and a large append is rarely passed over.
const KEYS_MAX: usize = 64;

/// The last position committed (no row: none).
const HEAD: &str = "SELECT last_position FROM annals_appends ORDER BY first_position DESC LIMIT 1";

const FETCH: &str = "SELECT first_position, last_position, appended_at_us, body FROM annals_appends
    WHERE first_position > $1 ORDER BY first_position LIMIT $2";

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

/// Whether the database at `url` holds `last`, a kept mirror's last append (see mirror.rs),
/// as the mirror holds it: None when it does, else why the mirror cannot be used.
pub(crate) fn holds(url: &str, last: StoredAppend) -> Result<Option<String>, StoreError> {
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
    crate::pgconnect::close(client);
    Ok((found != Some(last)).then(|| {
        format!(
            "the database does not hold its last append ({last:?}; found {found:?}): another \
             database, or one that lost appends"
        )
    }))
}

/// The row holding `$1` or the last before it, as [`StoredAppend`]'s fields.
const VERIFY: &str = "SELECT first_position, last_position, appended_at_us, octet_length(body) \
    FROM annals_appends WHERE first_position <= $1 ORDER BY first_position DESC LIMIT 1";

fn stored(row: &postgres::Row) -> StoredAppend {
    StoredAppend {
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
    /// Connects, creates or checks the schema, takes the database's log into the store's
    /// mirror (`inner`: empty, or a kept mirror whose last append, `last_append`, the
    /// database holds) and starts the committer and the listener.
    pub(crate) fn start(
        url: &str,
        inner: Arc<Shared>,
        role: Arc<WriterRole>,
        last_append: StoredAppend,
    ) -> Result<Remote, StoreError> {
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
    pub(crate) fn last_append(&self) -> StoredAppend {
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

/// The database reported that the statement itself failed (severity ERROR): the statement's
/// transaction rolled back, so nothing of it was committed, whatever happens to the
/// connection next. A report of severity FATAL or PANIC ends the session instead, and may come
/// after the commit: a session terminated while its commit was under way (by
/// `pg_terminate_backend`, a fast shutdown or a pooler) commits, then reports FATAL instead of
/// the statement's end. Such a report, like a connection lost without one, says nothing of
/// whether the statement committed.
fn statement_failed(e: &postgres::Error) -> bool {
    use postgres::error::Severity;
    e.as_db_error()
        .is_some_and(|db| match db.parsed_severity() {
            Some(severity) => severity == Severity::Error,
            // Servers before 9.6 send only the localised severity.
            None => db.severity() == "ERROR",
        })
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
    // Two servers creating the schema (or replacing the function) at once may collide in the
    // catalog: try again. The function's body names the column `keys` but is not checked
    // against the table until it runs, so it may precede the migration to version 3.
    for _ in 0..5 {
        let created = SCHEMA
            .iter()
            .chain([&PASS_FUNCTION])
            .try_for_each(|&statement| {
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
    if version <= 2 {
        // Servers of version 2 may go on: their rows hold no keys, which every probe matches.
        client
            .batch_execute(MIGRATE_FROM_2)
            .map_err(|e| unavailable("migrate the schema from version 2", &e))?;
    }
    Ok(())
}

/// One connection with its prepared statements.
struct Connection {
    client: Client,
    /// The database session serving it, to make sure, after the connection is lost with a
    /// statement in flight, that the session has ended and cannot commit it later.
    session: Session,
    commit_one: Statement,
    commit_group: Statement,
    commit_after: Statement,
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

/// A database session as `pg_stat_activity` names it: its process id and when it started
/// (as text), which together name one session on one server.
#[derive(Clone, Debug)]
struct Session {
    pid: i32,
    started: String,
}

const SESSION: &str = "SELECT pid, backend_start::text FROM pg_stat_activity \
    WHERE pid = pg_backend_pid()";

/// Ends the session `$1`, `$2` if it is still there (a statement of a lost connection may still
/// be running in it); answers whether it was there.
const END_SESSION: &str = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
    WHERE pid = $1 AND backend_start::text = $2";

/// A write whose commit waits, as any commit does, for the WAL before it to be flushed and,
/// with a synchronous standby, confirmed by it: a settled append's commit is then as durable
/// as one answered at once. (A statement timeout does not bound that wait, which comes after
/// the statement; a cancel does, and is reported as a warning.)
const CONFIRM: &str = "UPDATE annals_schema SET version = version WHERE id = 1";

/// What identifies an append stored in the database: positions, append time, body size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StoredAppend {
    pub(crate) first: u64,
    pub(crate) last: u64,
    pub(crate) at: u64,
    pub(crate) bytes: u64,
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

/// Why streaming the rows after the mirror's head stopped early.
enum Stopped {
    /// The database or the connection failed.
    Read(postgres::Error),
    /// The mirror refused a row (not a continuation of the log, or malformed).
    Refused(StoreError),
}

/// Why a group's statement did not answer with its outcome.
enum Failed {
    /// The statement may have committed or not: its session ended while it ran (a FATAL
    /// report or a lost connection), or the primary committed it without its synchronous
    /// standby's confirmation. `session` ran it; `time` is the group's append time.
    Unsettled {
        reason: String,
        session: Session,
        time: u64,
    },
    /// Nothing was committed (the database reported the statement's failure, or it was never
    /// sent), or this server can no longer tell (it is poisoned).
    Known(StoreError),
}

/// What [`Committer::settle`] found of a group.
enum Settled {
    /// In the log, each append with the positions where it was found.
    Committed(Vec<(Accepted, (u64, u64))>),
    /// Not in the log, and it cannot get there any more: the group's requests, to try again.
    Absent(Vec<Request>),
    /// Not known within [`SETTLE_MAX`].
    Unknown(Vec<Accepted>, StoreError),
}

/// A group whose commit is being settled, and what of it the log was found to hold.
struct Awaited {
    group: Vec<Accepted>,
    /// The group's append time (an append read from another log keeps its own).
    time: u64,
    /// Where each of the group's first appends was found, in order.
    found: Vec<(u64, u64)>,
    /// Why the log cannot hold what this server wrote (set when part of the group was found,
    /// then a row that is not the next of it).
    broken: Option<String>,
}

impl Awaited {
    /// Takes a row the log holds after the mirror's head (first and last position, append
    /// time, body), in order.
    fn see(&mut self, first: u64, last: u64, at: u64, body: &[u8]) {
        let Some(next) = self.group.get(self.found.len()) else {
            return;
        };
        let request = &next.request;
        let same = at == request.appended_at.unwrap_or(self.time)
            && last.checked_sub(first) == Some(next.last - next.first)
            && body == request.append.body.as_slice();
        if same {
            self.found.push((first, last));
        } else if !self.found.is_empty() && self.broken.is_none() {
            self.broken = Some(format!(
                "the append at positions {first}..={last} follows the first {} of the group",
                self.found.len()
            ));
        }
    }
}

/// What a group's statement answered.
enum Answered {
    /// [`COMMIT_ONE`] or [`COMMIT_GROUP`]: the rows inserted, none or the whole group.
    Plain(u64),
    /// [`COMMIT_AFTER`]'s rows.
    After(Vec<postgres::Row>),
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
    /// The group whose commit is being settled (see [`Committer::settle`]).
    awaited: Option<Awaited>,
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
        let commit_after = prepare(&mut client, COMMIT_AFTER)?;
        let head = prepare(&mut client, HEAD)?;
        let fetch = prepare(&mut client, FETCH)?;
        let session = client
            .query_one(SESSION, &[])
            .map_err(|e| unavailable("name the session", &e))?;
        let session = Session {
            pid: session.get(0),
            started: session.get(1),
        };
        self.connection = Some(Connection {
            client,
            session,
            commit_one,
            commit_group,
            commit_after,
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
        if !statement_failed(e) || e.is_closed() {
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

    /// Reads the rows after the mirror's head until there are none: one round trip when
    /// another server committed a group (after a lost race, say). The rows are streamed: the
    /// database sends the next while the mirror takes in the last, a chunk at a time (at most
    /// [`TAKE_IN_ROWS`] rows, [`TAKE_IN_BYTES`] bytes). Finding none, it reads the head as
    /// well, to notice a database that lost what the mirror holds.
    fn follow_once(&mut self) -> Result<(), StoreError> {
        loop {
            let local = self.inner.head();
            self.connection()?;
            let mut connection = self.connection.take().expect("connected above");
            let mut chunk = Vec::new();
            let mut chunk_bytes = 0;
            let mut read = 0i64;
            let streamed = match connection
                .client
                .query_raw(&connection.fetch, [&(local as i64), &FETCH_ROWS])
            {
                Err(e) => Err(Stopped::Read(e)),
                Ok(mut rows) => loop {
                    match rows.next() {
                        Err(e) => break Err(Stopped::Read(e)),
                        Ok(row) => {
                            let last_row = row.is_none();
                            if let Some(row) = row {
                                let body = row.get::<_, Vec<u8>>(3);
                                chunk_bytes += body.len();
                                chunk.push((row.get(0), row.get(1), row.get(2), body));
                                read += 1;
                            }
                            let full = chunk.len() >= TAKE_IN_ROWS || chunk_bytes >= TAKE_IN_BYTES;
                            if (full || last_row) && !chunk.is_empty() {
                                if let Err(e) = self.take_in(chunk.drain(..)) {
                                    break Err(Stopped::Refused(e));
                                }
                                chunk_bytes = 0;
                            }
                            if last_row {
                                break Ok(());
                            }
                        }
                    }
                },
            };
            match streamed {
                Ok(()) => self.connection = Some(connection),
                // The mirror refused a row: what came before it is in.
                Err(Stopped::Refused(e)) => return Err(e),
                Err(Stopped::Read(e)) => {
                    if statement_failed(&e) && !e.is_closed() {
                        self.connection = Some(connection);
                    } else {
                        self.verify_on_connect = true;
                    }
                    return Err(unavailable("read appends", &e));
                }
            }
            if read == 0 {
                return self.check_not_behind(local);
            }
            if read < FETCH_ROWS {
                return Ok(());
            }
        }
    }

    /// Hands rows of other servers' appends (first and last position, append time, body)
    /// that follow the mirror's head to the mirror's writer, and waits until it holds them.
    /// Fails on a row that does not continue the log or that is malformed; what came before
    /// it is committed and sound, and the mirror takes it.
    fn take_in(
        &mut self,
        rows: impl Iterator<Item = (i64, i64, i64, Vec<u8>)>,
    ) -> Result<(), StoreError> {
        let mut local = self.inner.head();
        let applied = Arc::new(Applied::default());
        let mut handed = Vec::new();
        let mut bad = None;
        for (first, last, at, body) in rows {
            let (first, last, at) = (first as u64, last as u64, at as u64);
            if let Some(awaited) = &mut self.awaited {
                awaited.see(first, last, at, &body);
            }
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
            self.last_append = StoredAppend::of(first, last, at, &append);
            applied.expect(1);
            let done = applied.clone();
            let reply = ReplyTo::Callback(Box::new(move |outcome| {
                done.answer(match outcome {
                    Ok(p) if p == last => None,
                    other => Some(format!(
                        "the mirror took the append at {first}..={last} as {other:?}"
                    )),
                })
            }));
            handed.push(committed(append, at, reply));
            local = last;
            self.counters.followed.fetch_add(1, Ordering::Relaxed);
        }
        if !handed.is_empty() {
            self.role.commit_committed(handed);
        }
        match applied.wait().or(bad) {
            Some(error) => Err(StoreError::Database(error)),
            None => Ok(()),
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
            .query_opt(VERIFY, &[&(head as i64)])
            .map_err(|e| unavailable("verify the log", &e))?;
        let found = row.map(|r| stored(&r));
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
        let started = Instant::now();
        while !pending.is_empty() {
            attempts += 1;
            if attempts > 1 && started.elapsed() > RACING_MAX {
                // Every try before ended with nothing committed: a race lost to another
                // server's commit, or a commit settled as not made.
                let e = StoreError::Unavailable {
                    reason: format!(
                        "PostgreSQL: the group was not committed in {} s ({} tries): other \
                         servers' commits took its position first, or the database ended its \
                         sessions",
                        RACING_MAX.as_secs(),
                        attempts - 1
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
            // After a plain statement lost, the retry passes over what the winner committed
            // in the database when it can (`COMMIT_AFTER`), which reads it for the mirror;
            // after that gave up, the committer reads and checks again itself.
            let after_lost_race = attempts > 1;
            if attempts > 2 || self.connection.is_none() {
                if let Err(e) = self.follow() {
                    for request in pending.drain(..) {
                        request.reply.send(Err(clone_error(&e).into()));
                    }
                    return;
                }
            }
            let head = self.inner.head();
            let mut accepted = check(&self.inner, head, &mut pending);
            if accepted.is_empty() {
                return;
            }
            match self.commit(head, &accepted, after_lost_race) {
                Ok(Some(moved)) => {
                    for a in &mut accepted {
                        a.first += moved;
                        a.last += moved;
                    }
                    self.counters.commits.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .committed_at_us
                        .store(now_us(), Ordering::Relaxed);
                    self.hand_over(accepted);
                    return;
                }
                Ok(None) => {
                    self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                    pending = accepted.into_iter().map(|a| a.request).collect();
                    if let Some(queue) = queue {
                        take_queued(&mut pending, queue, self.inner.options.group_bytes_max);
                    }
                }
                Err(Failed::Known(error)) => {
                    self.refuse(accepted, &error);
                    return;
                }
                Err(Failed::Unsettled {
                    reason,
                    session,
                    time,
                }) => match self.settle(head, accepted, time, &session, &reason) {
                    Settled::Committed(found) => {
                        self.counters.commits.fetch_add(1, Ordering::Relaxed);
                        self.counters
                            .committed_at_us
                            .store(now_us(), Ordering::Relaxed);
                        for (a, (_, last)) in found {
                            a.request.reply.send(Ok(last));
                        }
                        return;
                    }
                    // Nothing of it was committed and nothing can be: try again, as after a
                    // lost race.
                    Settled::Absent(requests) => pending = requests,
                    Settled::Unknown(accepted, error) => {
                        self.refuse(accepted, &error);
                        return;
                    }
                },
            }
        }
    }

    /// Answers every append of a group with `error`.
    fn refuse(&self, accepted: Vec<Accepted>, error: &StoreError) {
        if matches!(error, StoreError::OutcomeUnknown { .. }) {
            self.counters
                .unknown
                .fetch_add(accepted.len() as u64, Ordering::Relaxed);
        }
        for a in accepted {
            a.request.reply.send(Err(clone_error(error).into()));
        }
    }

    /// Finds out whether a group whose statement may or may not have committed (`reason`) is
    /// in the log. The statement ran in `session`, for appends checked at the mirror's `head`
    /// and stamped with `time`. Reconnects; makes sure that session has ended, so that nothing
    /// of it can commit later; then reads what the database holds after `head` into the mirror,
    /// as any follow does, looking for the group's rows: each append's length, time and bytes,
    /// in order (after a lost race they may have moved past other servers' appends). Found
    /// whole, the commit is confirmed as durable as an answered one ([`confirm_statement`]).
    /// Tries until [`SETTLE_MAX`] has passed; the group's outcome stays unknown only when the
    /// database cannot tell within that time.
    fn settle(
        &mut self,
        head: u64,
        accepted: Vec<Accepted>,
        time: u64,
        session: &Session,
        reason: &str,
    ) -> Settled {
        debug_assert_eq!(
            self.inner.head(),
            head,
            "nothing moved the mirror meanwhile"
        );
        let deadline = Instant::now() + SETTLE_MAX;
        self.awaited = Some(Awaited {
            group: accepted,
            time,
            found: Vec::new(),
            broken: None,
        });
        let mut ended = false;
        let mut pause = Duration::from_millis(10);
        let outcome = loop {
            match self.settle_once(session, &mut ended, deadline) {
                Ok(()) => break Ok(()),
                Err(e) => {
                    let poisoned = self.inner.poison_error().is_some();
                    if poisoned || Instant::now() + pause >= deadline {
                        break Err(e);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        };
        let awaited = self.awaited.take().expect("set above");
        let unknown = |why: String| StoreError::OutcomeUnknown {
            reason: format!("{reason}; {why}"),
        };
        if let Some(broken) = awaited.broken {
            // The group commits whole or not at all: the log holds something this server
            // did not write.
            let why = format!("the log holds part of the group: {broken}");
            self.inner.poison(why.clone());
            return Settled::Unknown(awaited.group, unknown(why));
        }
        let found_whole = awaited.found.len() == awaited.group.len();
        match outcome {
            Ok(()) if found_whole => {
                self.counters
                    .settled
                    .fetch_add(awaited.group.len() as u64, Ordering::Relaxed);
                Settled::Committed(awaited.group.into_iter().zip(awaited.found).collect())
            }
            Ok(()) if awaited.found.is_empty() => {
                self.counters
                    .settled
                    .fetch_add(awaited.group.len() as u64, Ordering::Relaxed);
                Settled::Absent(awaited.group.into_iter().map(|a| a.request).collect())
            }
            Ok(()) => unreachable!("settle_once ends with the group found whole or not at all"),
            Err(e) => {
                let why = if found_whole {
                    format!(
                        "it is in the log, but its durability was not confirmed within {} s: {e}",
                        SETTLE_MAX.as_secs()
                    )
                } else {
                    format!(
                        "the database could not be asked within {} s: {e}",
                        SETTLE_MAX.as_secs()
                    )
                };
                Settled::Unknown(awaited.group, unknown(why))
            }
        }
    }

    /// One try of [`Committer::settle`]: Ok once the group is found whole (and confirmed) or
    /// known absent.
    fn settle_once(
        &mut self,
        session: &Session,
        ended: &mut bool,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        self.connection()?;
        if !*ended {
            self.end_session(session, deadline)?;
            *ended = true;
        }
        self.follow()?;
        let awaited = self.awaited.as_ref().expect("settling");
        if let Some(broken) = &awaited.broken {
            return Err(StoreError::Database(broken.clone()));
        }
        if awaited.found.is_empty() {
            return Ok(());
        }
        if awaited.found.len() < awaited.group.len() {
            let why = format!(
                "{} of the group's {} appends are in the log, the others not after them",
                awaited.found.len(),
                awaited.group.len()
            );
            self.awaited.as_mut().expect("settling").broken = Some(why.clone());
            return Err(StoreError::Database(why));
        }
        self.confirm(deadline)
    }

    /// Ends `session` if it is still there, and waits until it has gone: a statement of a
    /// lost connection may still run in it. A session ended has committed or rolled back for
    /// good (its transaction is ended before it leaves `pg_stat_activity`). After a failover
    /// the session was on another server, and no session here has its name.
    fn end_session(&mut self, session: &Session, deadline: Instant) -> Result<(), StoreError> {
        loop {
            let connection = self.connection()?;
            let there = match connection
                .client
                .query(END_SESSION, &[&session.pid, &session.started])
            {
                Ok(rows) => !rows.is_empty(),
                Err(e) => {
                    let error = unavailable("end the session of a lost connection", &e);
                    self.lost(&e);
                    return Err(error);
                }
            };
            if !there {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Unavailable {
                    reason: format!(
                        "PostgreSQL session {} (started {}) that ran the commit did not end",
                        session.pid, session.started
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Makes sure that what the log holds is durable as configured: a commit that waits, as
    /// every commit does, for the WAL before it to be flushed and confirmed by a synchronous
    /// standby ([`CONFIRM`]). The wait is cancelled at `deadline`.
    fn confirm(&mut self, deadline: Instant) -> Result<(), StoreError> {
        self.warned.store(false, Ordering::Release);
        let target = self.target.clone();
        let connection = self.connection()?;
        let token = connection.client.cancel_token();
        let (done, finished) = crossbeam_channel::bounded::<()>(0);
        let canceller = std::thread::spawn(move || {
            let left = deadline.saturating_duration_since(Instant::now());
            let late = matches!(
                finished.recv_timeout(left),
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            );
            if late {
                let _ = target.cancel(&token);
            }
            late
        });
        let confirmed = connection.client.batch_execute(CONFIRM);
        drop(done);
        let cancelled = canceller.join().unwrap_or(true);
        if cancelled {
            // A cancel that came late must not meet a later statement on this connection.
            self.connection = None;
            self.verify_on_connect = true;
        }
        if let Err(e) = confirmed {
            let error = unavailable("confirm a commit", &e);
            self.lost(&e);
            return Err(error);
        }
        if self.warned.load(Ordering::Acquire) {
            self.connection = None;
            self.verify_on_connect = true;
            return Err(StoreError::Unavailable {
                reason: "PostgreSQL committed locally but its synchronous standby did not \
                         confirm"
                    .into(),
            });
        }
        Ok(())
    }

    /// Runs the group's statement: [`COMMIT_ONE`] or [`COMMIT_GROUP`], or after a lost race
    /// ([`COMMIT_AFTER`]) one that may pass over other servers' appends. Answers how far the
    /// group's positions moved past other servers' appends (the mirror holds those when it
    /// returns), or None when another server committed first and the group must be checked
    /// again (nothing was inserted, or the database rolled the statement back as a
    /// serialization failure). An error whose outcome cannot be known is
    /// [`StoreError::OutcomeUnknown`]; one the database reported is [`StoreError::Unavailable`]
    /// (the statement, and so its transaction, failed: nothing was committed).
    fn commit(
        &mut self,
        head: u64,
        accepted: &[Accepted],
        after_lost_race: bool,
    ) -> Result<Option<u64>, Failed> {
        let now = now_us();
        assert_eq!(
            accepted.first().expect("a group").first,
            head + 1,
            "a group starts right after the head"
        );
        // An append read from another log (a copy's) keeps its time.
        let time = |a: &Accepted| a.request.appended_at.unwrap_or(now) as i64;
        let firsts: Vec<i64> = accepted.iter().map(|a| a.first as i64).collect();
        let lasts: Vec<i64> = accepted.iter().map(|a| a.last as i64).collect();
        let times: Vec<i64> = accepted.iter().map(time).collect();
        let bodies: Vec<&[u8]> = accepted
            .iter()
            .map(|a| a.request.append.body.as_slice())
            .collect();
        // Each row's keys: keys[from..=to], counted from 1 as SQL does; none when NULL.
        let mut keys = Vec::new();
        let (mut key_from, mut key_to) = (Vec::new(), Vec::new());
        for a in accepted {
            let from = keys.len() as i32 + 1;
            let kept = append_keys(&a.request.append, &mut keys);
            key_from.push(kept.then_some(from));
            key_to.push(kept.then_some(keys.len() as i32));
        }
        self.warned.store(false, Ordering::Release);
        let server_id = self.server_id;
        let connection = self.connection().map_err(Failed::Known)?;
        let session = connection.session.clone();
        let outcome = if after_lost_race {
            let probe = probe(head, accepted);
            connection
                .client
                .query(
                    &connection.commit_after,
                    &[
                        &(head as i64),
                        &probe,
                        &firsts,
                        &lasts,
                        &times,
                        &bodies,
                        &keys,
                        &key_from,
                        &key_to,
                        &server_id,
                    ],
                )
                .map(Answered::After)
        } else if accepted.len() == 1 {
            let lead_keys = key_from[0].map(|_| keys.as_slice());
            connection
                .client
                .execute(
                    &connection.commit_one,
                    &[
                        &firsts[0], &lasts[0], &times[0], &bodies[0], &server_id, &lead_keys,
                    ],
                )
                .map(Answered::Plain)
        } else {
            let lead_keys = key_to[0].map(|to| &keys[..to as usize]);
            // The other rows' key ranges, counted within the keys that follow the first's.
            let skip = key_to[0].unwrap_or(0);
            let rest_keys = &keys[skip as usize..];
            let rest_from: Vec<Option<i32>> =
                key_from[1..].iter().map(|f| f.map(|f| f - skip)).collect();
            let rest_to: Vec<Option<i32>> =
                key_to[1..].iter().map(|t| t.map(|t| t - skip)).collect();
            connection
                .client
                .query_one(
                    &connection.commit_group,
                    &[
                        &firsts[0],
                        &lasts[0],
                        &times[0],
                        &bodies[0],
                        &&firsts[1..],
                        &&lasts[1..],
                        &&times[1..],
                        &&bodies[1..],
                        &lasts[lasts.len() - 1],
                        &server_id,
                        &lead_keys,
                        &rest_keys,
                        &rest_from,
                        &rest_to,
                    ],
                )
                .map(|row| Answered::Plain(row.get::<_, i64>(0) as u64))
        };
        let answered = match outcome {
            Ok(answered) => answered,
            // The database rolled the statement back for a concurrent one (a distributed
            // database's optimistic transactions, or isolation set above read committed):
            // nothing was committed, as in a lost race.
            Err(e) if is_serialization_failure(&e) => return Ok(None),
            // The statement failed, and its transaction with it: nothing was committed.
            Err(e) if statement_failed(&e) => {
                let error = if e.code() == Some(&postgres::error::SqlState::DISK_FULL) {
                    StoreError::DiskFull {
                        reason: format!("PostgreSQL commit: {}", describe(&e)),
                    }
                } else {
                    unavailable("commit", &e)
                };
                self.lost(&e);
                return Err(Failed::Known(error));
            }
            Err(e) => {
                self.lost(&e);
                return Err(Failed::Unsettled {
                    reason: format!(
                        "the PostgreSQL session ended during the commit: {}",
                        describe(&e)
                    ),
                    session,
                    time: now,
                });
            }
        };
        if self.warned.load(Ordering::Acquire) {
            // Committed on the primary, not confirmed by its synchronous standby: a
            // failover may lose it. Neither success nor failure can be promised yet.
            self.connection = None;
            self.verify_on_connect = true;
            return Err(Failed::Unsettled {
                reason: "PostgreSQL committed locally but did not confirm replication".into(),
                session,
                time: now,
            });
        }
        let moved = match answered {
            Answered::Plain(inserted) => {
                let fits = inserted == 0 || inserted as usize == accepted.len();
                debug_assert!(fits, "a group's statement inserts none of it or all");
                if !fits {
                    let reason = format!(
                        "a group of {} appends after position {head} committed {inserted} rows",
                        accepted.len()
                    );
                    // Some of the group is in the log, where this server cannot tell.
                    self.inner.poison(reason.clone());
                    return Err(Failed::Known(StoreError::OutcomeUnknown { reason }));
                }
                (inserted > 0).then_some(0)
            }
            Answered::After(rows) => self
                .passed_over(head, accepted.len(), &rows)
                .map_err(Failed::Known)?,
        };
        // The appends' time, for the mirror: the one the database holds.
        self.group_time = now;
        Ok(moved)
    }

    /// Takes in the answer of [`COMMIT_AFTER`] for a group of `appends` checked at `head`:
    /// the other servers' appends it passed over go to the mirror (they are committed,
    /// whatever became of the group), and how far the group moved, None when it gave up.
    fn passed_over(
        &mut self,
        head: u64,
        appends: usize,
        rows: &[postgres::Row],
    ) -> Result<Option<u64>, StoreError> {
        let Some((status, passed)) = rows.split_last() else {
            return Err(StoreError::Database(
                "annals_commit_after answered no rows".into(),
            ));
        };
        let (moved, inserted) = (status.get::<_, i64>(0), status.get::<_, i64>(1));
        let stray = status.get::<_, Option<Vec<u8>>>(3).is_some()
            || passed
                .iter()
                .any(|r| r.get::<_, Option<Vec<u8>>>(3).is_none());
        let taken = if stray {
            Ok(())
        } else {
            self.take_in(passed.iter().map(|row| {
                (
                    row.get::<_, i64>(0),
                    row.get::<_, i64>(1),
                    row.get::<_, i64>(2),
                    row.get::<_, Option<Vec<u8>>>(3).unwrap_or_default(),
                )
            }))
        };
        let fits = !stray
            && moved >= 0
            && taken.is_ok()
            && self.inner.head() == head + moved as u64
            && (inserted == 0 || inserted as usize == appends);
        debug_assert!(fits, "annals_commit_after's answer fits the group");
        if !fits {
            let reason = format!(
                "a group of {appends} appends after position {head}, retried after a lost race, \
                 was answered with {} rows passed over, a move of {moved} and {inserted} rows \
                 inserted, which the mirror took as {taken:?}, at its head {}",
                passed.len(),
                self.inner.head()
            );
            // The database holds the log as it is; this server no longer knows it.
            self.inner.poison(reason.clone());
            if inserted > 0 {
                // The group may well be committed, but not where this server can tell.
                return Err(StoreError::OutcomeUnknown { reason });
            }
            return Err(StoreError::Database(reason));
        }
        if moved > 0 && inserted > 0 {
            self.counters.passed.fetch_add(1, Ordering::Relaxed);
        }
        Ok((inserted > 0).then_some(moved as u64))
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

/// What a row's keys and a group's probe are made of: a name with its kind, hashed to 64
/// bits (FNV-1a) the same way by every server and every version, since rows keep them.
/// Two names with one hash only make a probe match where it need not.
fn key(kind: u8, name: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in std::iter::once(&kind).chain(name.as_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash as i64
}

const KEY_TYPE: u8 = 1;
const KEY_TAG: u8 = 2;
const KEY_TRACKING: u8 = 3;

/// Adds an append's keys to `keys`: each of its events' type and tags and its tracking
/// source, each once. False, with `keys` as it was, when they are more than [`KEYS_MAX`]:
/// the row then holds none.
fn append_keys(append: &EncodedAppend, keys: &mut Vec<i64>) -> bool {
    let start = keys.len();
    for (_, entry, layout) in Entries::new(append.entries(), append.event_count).trusted() {
        keys.push(key(KEY_TYPE, layout.event_type(entry)));
        keys.extend(Tags::of(entry, &layout).map(|tag| key(KEY_TAG, tag)));
        if keys.len() - start > 4 * KEYS_MAX {
            keys.truncate(start);
            return false;
        }
    }
    if let Some((source, _)) = append.tracking() {
        keys.push(key(KEY_TRACKING, source));
    }
    keys[start..].sort_unstable();
    let mut kept = start;
    for i in start..keys.len() {
        if kept == start || keys[i] != keys[kept - 1] {
            keys[kept] = keys[i];
            kept += 1;
        }
    }
    keys.truncate(kept);
    if kept - start > KEYS_MAX {
        keys.truncate(start);
        return false;
    }
    true
}

/// The keys that another server's append must hold to matter to the group's checks: for
/// each item of each condition's query, the first of its tags (an event it matches holds
/// them all) or else each of its types; and each tracking source. None when any append
/// could matter: a query that matches every event, or a condition reaching past `head`,
/// whose `after` counts positions this server has not seen, among which the group's own
/// appends would move.
fn probe(head: u64, accepted: &[Accepted]) -> Option<Vec<i64>> {
    let mut keys = Vec::new();
    for a in accepted {
        if let Some(condition) = &a.request.condition {
            if condition.after.unwrap_or(0) > head {
                return None;
            }
            let query = &condition.fail_if_events_match;
            if query.matches_all() {
                return None;
            }
            for item in &query.items {
                match item.tags.first() {
                    Some(tag) => keys.push(key(KEY_TAG, tag)),
                    None => keys.extend(item.types.iter().map(|t| key(KEY_TYPE, t))),
                }
            }
        }
        if let Some((source, _)) = a.request.append.tracking() {
            keys.push(key(KEY_TRACKING, source));
        }
    }
    keys.sort_unstable();
    keys.dedup();
    Some(keys)
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
