//! The PostgreSQL backend's own cases (the suite both backends run is backends.rs): its schema
//! and its versions, the mirror (stale ones removed, a long log taken in by chunks, one kept
//! across closes), a failover that loses an append, TLS and the Unix socket, serialization
//! failures, busy servers of one database, and the database's own full disk. Each test
//! starts a throwaway cluster (annals-testkit) and skips without PostgreSQL unless the test
//! command requires it.
mod common;

use std::path::Path;
use std::time::Duration;

use annals::{
    AppendCondition, AppendError, NewEvent, Options, Query, QueryItem, ReadOptions, Store,
};
use annals_testkit::{eventually, Cluster};
use common::api::{append_numbered, event};
use common::harness::small_options;
use common::{event_list, read_all};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Goal: with the database's transactions at serializable isolation (as on PostgreSQL-compatible
/// distributed databases), a group rolled back as a serialization failure (SQLSTATE 40001) is
/// taken as a lost race and tried again: racing stores still never both win, and nothing is
/// refused.
#[test]
fn serialization_failures_are_lost_races() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    cluster.sql("ALTER DATABASE postgres SET default_transaction_isolation TO 'serializable'");
    let first = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    let second = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    common::harness::claim_race_over(&[&first, &second], 32, 25).unwrap();
    let conflicts =
        first.stats().database.unwrap().conflicts + second.stats().database.unwrap().conflicts;
    assert!(conflicts > 0, "the two stores raced");
}

/// Goal: the schema in PostgreSQL is versioned: created at version 3 on first use (each row
/// with its append's keys); a database of version 2 (rows without keys) or 1 (the head kept
/// in a row of its own) is migrated at open, its log intact; a version newer than the build
/// is refused with a message, nothing changed.
#[test]
fn the_database_schema_is_versioned() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let store = Store::open_postgres(&url, small_options()).unwrap();
    append_numbered(&store, 0..5, |i| format!("n:{i}"));
    let before = event_list(&store);
    store.close().unwrap();
    assert_eq!(cluster.sql_value("SELECT version FROM annals_schema"), "3");
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_appends WHERE keys IS NULL"),
        "0"
    );
    // Bodies compressed with lz4 (Debian's PostgreSQL has it).
    assert_eq!(
        cluster.sql_value(
            "SELECT attcompression FROM pg_attribute \
             WHERE attrelid = 'annals_appends'::regclass AND attname = 'body'"
        ),
        "l"
    );
    // Opened again after a migration: the same log, at version 3.
    let reopened = || {
        let store = Store::open_postgres(&url, small_options()).unwrap();
        assert_eq!(event_list(&store), before);
        assert_eq!(cluster.sql_value("SELECT version FROM annals_schema"), "3");
        store
    };
    // The same log as version 2 laid it out: no keys.
    cluster
        .sql("ALTER TABLE annals_appends DROP COLUMN keys; UPDATE annals_schema SET version = 2");
    let store = reopened();
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_appends WHERE keys IS NULL"),
        "5"
    );
    store.close().unwrap();
    // As version 1 laid it out.
    cluster.sql(
        "ALTER TABLE annals_appends DROP COLUMN keys; \
         ALTER TABLE annals_appends ADD CONSTRAINT annals_appends_check \
             CHECK (first_position >= 1 AND last_position >= first_position); \
         CREATE TABLE annals_head (id integer PRIMARY KEY CHECK (id = 1), \
             position bigint NOT NULL CHECK (position >= 0)); \
         INSERT INTO annals_head VALUES (1, 5); \
         UPDATE annals_schema SET version = 1",
    );
    let store = reopened();
    assert_eq!(
        cluster.sql_value("SELECT to_regclass('annals_head') IS NULL"),
        "t"
    );
    assert_eq!(
        cluster
            .sql_value("SELECT count(*) FROM pg_constraint WHERE conname = 'annals_appends_check'"),
        "0"
    );
    store.append(&[event()], None).unwrap();
    assert_eq!(store.head(), 6);
    store.close().unwrap();
    // A newer version: refused, and the database left as it was.
    cluster.sql("UPDATE annals_schema SET version = 4");
    let refused = match Store::open_postgres(&url, small_options()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a schema newer than the build was opened"),
    };
    assert!(
        refused.contains("version 4, newer than this build's (3)"),
        "{refused}"
    );
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_appends"),
        "6"
    );
    assert_eq!(cluster.sql_value("SELECT version FROM annals_schema"), "4");
}

/// Goal: mirrors left in the temporary directory by processes killed before closing their
/// PostgreSQL stores are removed when a store opens; a mirror in use is kept.
#[test]
fn stale_mirrors_are_removed() {
    use annals::io::{Io, RealIo};
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let tmp = std::env::temp_dir();
    let stale = tmp.join(format!("annals-mirror-stale-{}", std::process::id()));
    let live = tmp.join(format!("annals-mirror-live-{}", std::process::id()));
    // A mirror of a running process whose lock is not taken yet (it is being opened).
    let opening = tmp.join(format!("annals-mirror-{}-999999", std::process::id()));
    for dir in [&stale, &live, &opening] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("LOCK"), b"").unwrap();
        std::fs::write(dir.join("0000000001.seg"), b"left behind").unwrap();
    }
    let held = RealIo.lock(&live.join("LOCK")).unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let store = Store::open_postgres(&url, small_options()).unwrap();
    assert!(!stale.exists(), "a stale mirror is removed");
    assert!(live.exists(), "a mirror in use is kept");
    assert!(opening.exists(), "a mirror of a running process is kept");
    store.close().unwrap();
    drop(held);
    std::fs::remove_dir_all(&live).unwrap();
    std::fs::remove_dir_all(&opening).unwrap();
}

/// Goal: a store opened on a log longer than one chunk of rows, and heavier than one chunk of
/// bytes, takes in all of it, in order: the rows are streamed from the database to the mirror
/// a chunk at a time.
#[test]
fn a_long_log_is_taken_in_chunk_by_chunk() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let writer = Store::open_postgres(&cluster.url(), Options::default()).unwrap();
    let big = vec![b'x'; 1 << 20];
    for i in 0..10u64 {
        let mut data = big.clone();
        data[0] = b'0' + i as u8;
        writer
            .append(&[NewEvent::new("Big", data).tag("big")], None)
            .unwrap();
    }
    // Sent without waiting, so that they share commits.
    let (done, answers) = std::sync::mpsc::channel();
    for i in 0..2500u64 {
        let event = NewEvent::new("E", format!("{i}").into_bytes()).tag(format!("n{i}"));
        let done = done.clone();
        writer
            .appending(&[event])
            .then(move |outcome| done.send(outcome.map(|_| ())).unwrap())
            .unwrap();
    }
    for _ in 0..2500 {
        answers.recv().unwrap().unwrap();
    }
    let expected = read_all(&writer, &Query::all(), ReadOptions::forwards()).unwrap();
    assert_eq!(expected.len(), 2510);
    writer.close().unwrap();
    let reader = Store::open_postgres(&cluster.url(), Options::default()).unwrap();
    assert_eq!(reader.head(), 2510);
    assert_eq!(reader.open_report().mirror.as_ref().unwrap().followed, 2510);
    let got = read_all(&reader, &Query::all(), ReadOptions::forwards()).unwrap();
    assert_eq!(got.len(), expected.len());
    for (a, b) in got.iter().zip(&expected) {
        assert_eq!((a.position(), a.data()), (b.position(), b.data()));
    }
    reader.close().unwrap();
}

/// Goal: a mirror kept across closes (`Location::Postgres`'s `mirror`) is used as its clean
/// close left it, taking in only what other stores committed since, and only while the
/// database holds its last append; otherwise (that append lost and another written in its
/// place, or no clean close) it is filled from the database again. One directory serves one
/// store at a time (a store on files cannot be given a mirror: `Location::Directory` has none).
#[test]
fn a_kept_mirror_is_used_only_as_the_database_holds_it() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let kept = tempfile::tempdir().unwrap();
    let options = small_options();
    let location = annals::Location::Postgres {
        url: cluster.url(),
        mirror: Some(kept.path().join("mirror")),
    };
    let open = || Store::open_at(&location, options.clone());
    let data = |store: &Store| -> Vec<(u64, Vec<u8>)> {
        read_all(store, &Query::all(), ReadOptions::forwards())
            .unwrap()
            .iter()
            .map(|e| (e.position(), e.data().to_vec()))
            .collect()
    };
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert!(mirror.rebuilt.unwrap().contains("none was kept"));
    append_numbered(&store, 0..5, |i| format!("n{i}"));
    assert!(
        matches!(open(), Err(annals::OpenError::Locked { .. })),
        "one store per directory"
    );
    store.close().unwrap();

    let other = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    append_numbered(&other, 5..8, |i| format!("n{i}"));
    let expected = data(&other);
    other.close().unwrap();
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert_eq!(mirror.resumed_at, Some(5), "{mirror:?}");
    assert_eq!(mirror.followed, 3, "only what was committed since is read");
    assert_eq!(data(&store), expected);
    store.close().unwrap();

    // An open that cannot reach the database leaves the mirror as trusted as it found it.
    let unreachable = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?connect_timeout=2",
        annals_testkit::free_port()
    );
    let unreachable = annals::Location::Postgres {
        url: unreachable,
        mirror: Some(kept.path().join("mirror")),
    };
    assert!(Store::open_at(&unreachable, options.clone()).is_err());
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert_eq!(mirror.resumed_at, Some(8), "{mirror:?}");
    assert_eq!(mirror.followed, 0);
    store.close().unwrap();

    // The database loses the mirror's last append (as a failover to a standby that lacked it
    // would), and another store writes a different one at its position.
    cluster.sql("DELETE FROM annals_appends WHERE first_position = 8");
    let other = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    assert_eq!(other.head(), 7);
    other
        .append(&[NewEvent::new("E", "in its place").tag("n8")], None)
        .unwrap();
    let expected = data(&other);
    other.close().unwrap();
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert_eq!(mirror.resumed_at, None, "{mirror:?}");
    assert!(
        mirror
            .rebuilt
            .as_deref()
            .unwrap()
            .contains("does not hold its last append"),
        "{mirror:?}"
    );
    assert_eq!(mirror.followed, 8);
    assert_eq!(data(&store), expected);
    assert_eq!(expected[7].1, b"in its place");
    store.close().unwrap();

    // No record of a clean close, as after a crash: filled again.
    std::fs::remove_file(kept.path().join("mirror").join("closed")).unwrap();
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert!(mirror.rebuilt.unwrap().contains("not closed cleanly"));
    assert_eq!(data(&store), expected);
    store.close().unwrap();
}

/// Goal: a server that took in an append which a failover then lost stops answering for the
/// log, even when another server has since committed a different append at the same positions
/// (same size, so only the append time tells them apart). Method: a primary with a synchronous
/// standby; the standby stopped, so that a commit waits on the primary; that wait cancelled,
/// which leaves the append committed on the primary alone (its writer is told the outcome is
/// unknown); a second store takes it in; the primary killed, the standby promoted; a third
/// store commits another append at that position. The second store must refuse to append (and
/// so to write after a position the database does not hold as it does), and the database
/// stays a gapless log holding the third store's append. Regression: when the store's own
/// polling thread reached the new primary first, it found the difference and poisoned the
/// store, but kept the connection that failed the check; a refresh then read on it and
/// answered the head as true.
#[test]
fn a_store_holding_an_append_a_failover_lost_stops() {
    use annals::{AppendError, StoreError};
    let Some(primary) = Cluster::start() else {
        return;
    };
    let standby = primary.synchronous_standby();
    let both = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let writer = Store::open_postgres(&both, small_options()).unwrap();
    let reader = Store::open_postgres(&both, small_options()).unwrap();
    writer.append(&[event()], None).unwrap();
    assert_eq!(reader.refresh().unwrap(), 1);
    standby.stop();
    let waiting = std::thread::spawn(move || {
        let outcome = writer.append(&[event()], None);
        (writer, outcome)
    });
    eventually(
        "a commit to wait for the standby",
        Duration::from_secs(30),
        || {
            primary.sql_value("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
                != "0"
        },
    );
    primary.sql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
    let (writer, outcome) = waiting.join().unwrap();
    assert!(
        matches!(outcome, Err(AppendError::OutcomeUnknown { .. })),
        "{outcome:?}"
    );
    // Committed on the primary alone, and visible there: the reader takes it in.
    assert_eq!(reader.refresh().unwrap(), 2);
    drop(writer);
    primary.kill9();
    standby.restart();
    standby.promote();
    let other = Store::open_postgres(&standby.url(), small_options()).unwrap();
    assert_eq!(
        other.head(),
        1,
        "the promoted standby lacks the second append"
    );
    assert_eq!(other.append(&[event()], None).unwrap(), 2);
    // The reader's connection went with the primary: once it reaches the new one, it must
    // find that the database no longer holds its last append. Its own thread polls every half
    // second: after a second it has reached the new primary first, as it did in the run that
    // found it answering Ok(2) (that thread's finding was dropped, and the next refresh read
    // on the connection that failed the check).
    std::thread::sleep(Duration::from_secs(1));
    let looked = eventually(
        "the reader to reach the new primary",
        Duration::from_secs(5),
        || match reader.refresh() {
            Err(e @ StoreError::Unavailable { .. }) => Err(e),
            looked => Ok(looked),
        },
    );
    assert!(
        matches!(looked, Err(StoreError::Poisoned { .. })),
        "a store whose last append the database no longer holds went on: {looked:?}"
    );
    let refused = reader.append(&[event()], None);
    assert!(
        matches!(
            refused,
            Err(AppendError::Store(StoreError::Poisoned { .. }))
        ),
        "a store whose log the database no longer holds appended: {refused:?}"
    );
    drop(reader);
    other.close().unwrap();
    let fresh = Store::open_postgres(&standby.url(), small_options()).unwrap();
    assert_eq!(fresh.head(), 2);
    assert_eq!(
        standby.sql_value(
            "SELECT string_agg(first_position::text, ',' ORDER BY 1) FROM annals_appends"
        ),
        "1,2"
    );
}

/// Goal: a store reaches a database that takes only encrypted connections, over TLS that checks
/// the server's certificate; without TLS, with a root that did not issue the certificate, or
/// with a host name the certificate does not carry, it is refused with a message and nothing
/// is written. Method: a cluster whose pg_hba.conf rejects connections without TLS, its
/// certificate for 127.0.0.1 issued by a CA made for the test.
#[test]
fn tls_to_the_database_checks_the_server() {
    let Some((cluster, ca)) = Cluster::start_tls() else {
        return;
    };
    let base = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let ca = ca.to_str().unwrap();
    let refusal = |url: &str| match Store::open_postgres(url, small_options()) {
        Ok(_) => panic!("{url}: opened"),
        Err(e) => e.to_string(),
    };
    let plain = refusal(&base);
    assert!(
        plain.contains("no encryption") || plain.contains("pg_hba"),
        "{plain}"
    );
    // The system's roots did not issue the test CA's certificate.
    let unknown = refusal(&format!("{base}?sslmode=require"));
    assert!(unknown.to_lowercase().contains("certificate"), "{unknown}");
    let other_name = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={ca}",
        cluster.port()
    );
    let name = refusal(&other_name);
    assert!(name.to_lowercase().contains("certificate"), "{name}");
    assert_eq!(
        cluster.sql_value("SELECT to_regclass('annals_appends') IS NULL"),
        "t",
        "nothing was written by a refused store"
    );
    let store = Store::open_postgres(
        &format!("{base}?sslmode=verify-full&sslrootcert={ca}"),
        small_options(),
    )
    .unwrap();
    assert_eq!(store.append(&[event()], None).unwrap(), 1);
    assert_eq!(
        cluster.sql_value(
            "SELECT bool_and(ssl) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
             WHERE application_name = 'annals'"
        ),
        "t"
    );
    store.close().unwrap();
    // libpq's key=value form, the root given by PGSSLROOTCERT's place in the string.
    let pairs = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-ca sslrootcert={ca}",
        cluster.port()
    );
    let store = Store::open_postgres(&pairs, small_options()).unwrap();
    assert_eq!(store.head(), 1);
}

/// Goal: a store reaches its database over a Unix socket when the URL's host is the socket's
/// directory, percent-encoded, as servers on the database's machine connect; and a libpq
/// `key=value` connection string given where a store's location is expected is refused with a
/// clear message rather than made into a directory of that name.
#[test]
fn the_database_over_its_unix_socket() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let Some(url) = cluster.socket_url("postgres") else {
        panic!("the temporary directory's path is too long for a Unix socket; set TMPDIR shorter");
    };
    assert!(url.starts_with("postgres://postgres@%2F"), "{url}");
    let store = Store::open_location(&url, small_options()).unwrap();
    append_numbered(&store, 0..3, |i| format!("n:{i}"));
    assert_eq!(store.head(), 3);
    // Every session of the store's (application annals) came over the socket: no client
    // address.
    assert_eq!(
        cluster.sql_value(
            "SELECT count(*) FILTER (WHERE client_addr IS NULL) || '/' || count(*) \
             FROM pg_stat_activity WHERE application_name = 'annals'"
        ),
        "2/2",
        "the committer's session and the listener's"
    );
    store.close().unwrap();

    let tcp = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        cluster.port()
    );
    for given in [
        tcp.as_str(),
        "dbname=annals",
        "host=/var/run/postgresql dbname=annals",
    ] {
        let refused = match Store::open_location(given, small_options()) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{given:?} was opened as a directory"),
        };
        assert!(
            refused.contains("reads as a PostgreSQL connection string")
                && refused.contains("postgres://"),
            "{refused}"
        );
        assert!(!Path::new(given).exists(), "{given:?} was created");
    }
    // A directory whose name merely contains '=' is still a directory.
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("run=1");
    Store::open(&plain, small_options())
        .unwrap()
        .close()
        .unwrap();
    assert!(plain.join("LOCK").exists());
}

/// Goal: two busy stores on one database both make progress. Each loads its own writers'
/// conditional appends (conditions on keys of their own, which never fail) for a few seconds;
/// no append may be refused because its group kept finding the other store's commits first,
/// and a group that lost a race goes in right after the winner's appends, which its
/// conditions do not concern, without a second check.
#[test]
fn busy_servers_do_not_starve_each_other() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let stores = [
        Store::open_postgres(&cluster.url(), small_options()).unwrap(),
        Store::open_postgres(&cluster.url(), small_options()).unwrap(),
    ];
    let until = std::time::Instant::now() + Duration::from_secs(4);
    let refused = std::sync::Mutex::new(Vec::new());
    let appended = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for t in 0..48 {
            let (store, refused, appended) = (&stores[t % 2], &refused, &appended);
            scope.spawn(move || {
                let mut n = 0;
                while std::time::Instant::now() < until {
                    let key = format!("key:{t}-{n}");
                    let condition =
                        AppendCondition::new(Query::item(QueryItem::tags([key.clone()])), None);
                    let event = NewEvent::new("E", "data").tag(key).tag("shared");
                    match store.append(&[event], Some(&condition)) {
                        Ok(_) => {
                            appended.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => refused.lock().unwrap().push(e.to_string()),
                    }
                    n += 1;
                }
            });
        }
    });
    let refused = refused.into_inner().unwrap();
    assert!(
        refused.is_empty(),
        "{} appends refused, the first: {}",
        refused.len(),
        refused[0]
    );
    let stats: Vec<_> = stores.iter().map(|s| s.stats().database.unwrap()).collect();
    let conflicts: u64 = stats.iter().map(|d| d.conflicts).sum();
    let passed: u64 = stats.iter().map(|d| d.passed).sum();
    let appended = appended.into_inner();
    eprintln!("{appended} appends, {conflicts} lost races, {passed} retries passed over");
    // The retries went in after the other store's appends, whose keys are not theirs.
    assert!(passed > 0, "no retry passed over the other store's appends");
    for store in &stores {
        store.refresh().unwrap();
        assert_eq!(store.head(), appended, "every append is in both stores");
    }
}

/// Goal: on PostgreSQL, the database's own full disk (SQLSTATE 53100, the statement rolled
/// back) is answered as on files: `DiskFull`, nothing appended, nothing poisoned, reads go on,
/// and appends resume once the database has room. Method: the log's table and its key moved
/// to a tablespace on an 8 MiB tmpfs (as root, as CI runs); appends of 64 KiB that does not
/// compress until refused; the tmpfs grown.
#[test]
fn a_full_database_disk_refuses_appends_cleanly() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let Some(disk) = annals_testkit::Tmpfs::mount(8) else {
        return;
    };
    disk.give_to_postgres();
    let store = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    cluster.sql(&format!(
        "CREATE TABLESPACE small LOCATION '{}'",
        disk.path().display()
    ));
    cluster.sql("ALTER TABLE annals_appends SET TABLESPACE small");
    cluster.sql("ALTER INDEX annals_appends_pkey SET TABLESPACE small");
    let mut rng = StdRng::seed_from_u64(53100);
    let mut event = || {
        let data: Vec<u8> = (0..64 << 10).map(|_| rng.gen()).collect();
        NewEvent::new("Filled", data).tag("fill")
    };
    drop(store);
    let store = Store::open_postgres(&cluster.url(), Options::default()).unwrap();
    let mut acknowledged = 0u64;
    let refusal = loop {
        match store.append(&[event()], None) {
            Ok(position) => {
                acknowledged += 1;
                assert_eq!(position, acknowledged);
            }
            Err(e) => break e,
        }
        assert!(acknowledged < 1000, "the tablespace never filled");
    };
    assert!(
        matches!(refusal, AppendError::DiskFull { .. }),
        "{refusal:?}"
    );
    assert!(acknowledged > 10, "only {acknowledged} appends fit");
    assert!(store.stats().poisoned.is_none());
    assert_eq!(store.head(), acknowledged);
    assert_eq!(
        read_all(&store, &Query::all(), ReadOptions::forwards())
            .unwrap()
            .len() as u64,
        acknowledged
    );
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_appends"),
        acknowledged.to_string(),
        "the refused append is not in the database"
    );
    disk.resize(64);
    assert_eq!(store.append(&[event()], None).unwrap(), acknowledged + 1);
    drop(store);
    cluster.sql("ALTER TABLE annals_appends SET TABLESPACE pg_default");
    cluster.sql("ALTER INDEX annals_appends_pkey SET TABLESPACE pg_default");
    cluster.sql("DROP TABLESPACE small");
}

/// Goal: the PostgreSQL commit that carried a traced append is a span of its own (a trace of
/// its own, as a segment's sync is), naming the database, with its tries, the time of its
/// statements, how many appends it committed and the head it made durable, linked both ways
/// with the append's span.
#[test]
fn the_database_commit_that_carried_an_append_is_linked_with_it() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    annals_testkit::spans::record();
    let store = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    let position = tracing::info_span!("test.database_commit")
        .in_scope(|| store.append(&[event()], None))
        .unwrap();
    let inside = annals_testkit::spans::under("test.database_commit");
    let append = inside
        .iter()
        .find(|s| s.name == "annals.append")
        .unwrap_or_else(|| panic!("{inside:#?}"));
    assert_eq!(append.follows.len(), 1, "{append:#?}");
    let commit = annals_testkit::spans::span(append.follows[0]);
    assert_eq!(commit.name, "annals.commit");
    assert_eq!(commit.parent, None);
    assert!(commit.follows.contains(&append.id));
    assert_eq!(commit.field("db.system.name"), Some("postgresql"));
    assert_eq!(commit.number("annals.tries"), Some(1));
    assert_eq!(commit.number("annals.appends"), Some(1));
    assert_eq!(commit.number("annals.head"), Some(position as i64));
    assert!(commit.number("annals.commit_us").is_some_and(|us| us > 0));
    store.close().unwrap();
}
