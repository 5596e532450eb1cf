//! The SQL of the PostgreSQL backend: the schema and its migrations, the commit statements
//! (one append, a group, a group passing over others' appends), the reads, and what a
//! database error means for an append.

use super::*;

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i32 = 3;

/// The statements that create the schema; each is idempotent.
pub(super) const SCHEMA: &[&str] = &[
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
pub(super) const APPENDS_PLAIN: &str = "CREATE TABLE IF NOT EXISTS annals_appends (
        first_position bigint PRIMARY KEY,
        last_position bigint NOT NULL,
        appended_at_us bigint NOT NULL,
        body bytea NOT NULL,
        keys bigint[])";

/// From version 1, which kept the head in a row of its own, moved by compare in each commit:
/// the first position's key serialises writers as well, for less work per commit.
pub(super) const MIGRATE_FROM_1: &str = "BEGIN;
    ALTER TABLE annals_appends DROP CONSTRAINT IF EXISTS annals_appends_check;
    DROP TABLE IF EXISTS annals_head;
    UPDATE annals_schema SET version = 2 WHERE id = 1 AND version = 1;
    COMMIT";

/// From version 2: each row also holds its append's keys (see [`PASS_FUNCTION`]). Rows
/// written before, or by servers of version 2 still running, hold none (NULL), which every
/// probe counts as a match.
pub(super) const MIGRATE_FROM_2: &str = "BEGIN;
    ALTER TABLE annals_appends ADD COLUMN IF NOT EXISTS keys bigint[];
    UPDATE annals_schema SET version = 3 WHERE id = 1 AND version = 2;
    COMMIT";

/// A group of one append: inserts its row unless a row already starts at its first position
/// (another server committed first). Answers the rows inserted (0 or 1). The notification
/// says the new head and which server committed ($5), so that a server's listener passes over
/// its own commits; it is a wake-up only, and a spurious one (after a lost race) costs a look.
pub(super) const COMMIT_ONE: &str =
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
pub(super) const COMMIT_GROUP: &str = "WITH lead AS (
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
pub(super) const PASS_FUNCTION: &str = "CREATE OR REPLACE FUNCTION annals_commit_after(
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
pub(super) const COMMIT_AFTER: &str =
    "SELECT o_first, o_last, o_at, o_body FROM annals_commit_after(
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// Keys an append's row holds at most; one with more holds none (NULL), and so matches every
/// probe: passing over is an optimisation, and a large append is rarely passed over.
pub(super) const KEYS_MAX: usize = 64;

/// The last position committed (no row: none).
pub(super) const HEAD: &str =
    "SELECT last_position FROM annals_appends ORDER BY first_position DESC LIMIT 1";

pub(super) const FETCH: &str =
    "SELECT first_position, last_position, appended_at_us, body FROM annals_appends
    WHERE first_position > $1 ORDER BY first_position LIMIT $2";

/// The row holding `$1` or the last before it, as [`AppendStamp`]'s fields.
pub(super) const VERIFY: &str =
    "SELECT first_position, last_position, appended_at_us, octet_length(body) \
    FROM annals_appends WHERE first_position <= $1 ORDER BY first_position DESC LIMIT 1";

pub(super) const SESSION: &str = "SELECT pid, backend_start::text FROM pg_stat_activity \
    WHERE pid = pg_backend_pid()";

/// Ends the session `$1`, `$2` if it is still there (a statement of a lost connection may still
/// be running in it); answers whether it was there.
pub(super) const END_SESSION: &str = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
    WHERE pid = $1 AND backend_start::text = $2";

/// A write whose commit waits, as any commit does, for the WAL before it to be flushed and,
/// with a synchronous standby, confirmed by it: a settled append's commit is then as durable
/// as one answered at once. (A statement timeout does not bound that wait, which comes after
/// the statement; a cancel does, and is reported as a warning.)
pub(super) const CONFIRM: &str = "UPDATE annals_schema SET version = version WHERE id = 1";

pub(super) fn unavailable(what: &str, e: &postgres::Error) -> StoreError {
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
pub(super) fn statement_failed(e: &postgres::Error) -> bool {
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
pub(super) fn is_serialization_failure(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// The database does not know a feature or a clause.
pub(super) fn is_unsupported(e: &postgres::Error) -> bool {
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
pub(super) fn describe(e: &postgres::Error) -> String {
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
pub(super) fn ensure_schema(client: &mut Client) -> Result<(), StoreError> {
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

/// What a row's keys and a group's probe are made of: a name with its kind, hashed to 64
/// bits (FNV-1a) the same way by every server and every version, since rows keep them.
/// Two names with one hash only make a probe match where it need not.
pub(super) fn key(kind: u8, name: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in std::iter::once(&kind).chain(name.as_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash as i64
}

pub(super) const KEY_TYPE: u8 = 1;

pub(super) const KEY_TAG: u8 = 2;

pub(super) const KEY_TRACKING: u8 = 3;

/// Adds an append's keys to `keys`: each of its events' type and tags and its tracking
/// source, each once. False, with `keys` as it was, when they are more than [`KEYS_MAX`]:
/// the row then holds none.
pub(super) fn append_keys(append: &EncodedAppend, keys: &mut Vec<i64>) -> bool {
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
/// each item of each condition's query (and each admission fence's), the first of its tags (an event it matches holds
/// them all) or else each of its types; and each tracking source. None when any append
/// could matter: a query that matches every event, or a condition reaching past `head`,
/// whose `after` counts positions this server has not seen, among which the group's own
/// appends would move. With `subjects`, also the tags of the subjects of sealed events.
pub(super) fn probe(head: u64, accepted: &[Accepted], subjects: bool) -> Option<Vec<i64>> {
    let mut keys = Vec::new();
    for a in accepted {
        for condition in a.request.condition.iter().chain(&a.request.fence) {
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
        // An append sealed for a subject must not go in after that subject's erasure receipt
        // (tagged with it): another server's append naming the subject is read and checked.
        if subjects {
            keys.extend(
                sealed_tags(&a.request.append)
                    .iter()
                    .map(|tag| key(KEY_TAG, tag)),
            );
        }
    }
    keys.sort_unstable();
    keys.dedup();
    Some(keys)
}
