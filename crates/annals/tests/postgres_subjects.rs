//! Data subjects on PostgreSQL: the keys in the database's table, shared by every server of it;
//! erasures that hold on every server; servers started with other subject prefixes than the
//! database holds; a store on files copied in with its keys. Each test starts a throwaway
//! cluster (annals-testkit) and skips without PostgreSQL unless the test command requires
//! it.
mod common;

use annals::{AppendError, NewEvent, Options, Query, ReadOptions, Store};
use annals_testkit::Cluster;
use common::harness::small_options;
use common::read_all;

/// Goal: data subjects on PostgreSQL. Two servers share one database and its keys table: a
/// key one server made is the other's too (learned from the table), a subject's data is in
/// no file of the database's directory, no `pg_dump` and no kept mirror, before or after its
/// erasure; an erasure on one server holds on the other at once: the other's append naming
/// the subject is refused (though it still held the key), and its reads show the events
/// erased once it has taken the receipt in; a third server opening later sees the same. A
/// wrong master key is refused at open and writes nothing.
#[test]
fn subjects_on_postgres_hold_on_every_server() {
    use annals::{MasterKey, SubjectOptions};
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let kept = tempfile::tempdir().unwrap();
    let master = MasterKey::generate().unwrap();
    let options = Options {
        subjects: Some(SubjectOptions::new(["customer:"], master.clone())),
        ..small_options()
    };
    let a = Store::open_at(
        &annals::Location::Postgres {
            url: cluster.url(),
            mirror: Some(kept.path().join("mirror")),
        },
        options.clone(),
    )
    .unwrap();
    let b = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    let moved = |customer: u64, what: &str| {
        NewEvent::new("Moved", format!("MARKER-{what}")).tag(format!("customer:{customer}"))
    };
    a.append(&[moved(1, "a1")], None).unwrap();
    // b makes no key of its own for customer:1: it takes a's from the table.
    b.append(&[moved(1, "b1")], None).unwrap();
    b.append(&[moved(2, "b2")], None).unwrap();
    a.append(&[NewEvent::new("Plain", "MARKER-plain")], None)
        .unwrap();
    let data = |store: &Store| -> Vec<(bool, Vec<u8>)> {
        store.refresh().unwrap();
        read_all(store, &Query::all(), ReadOptions::forwards())
            .unwrap()
            .iter()
            .map(|e| (e.is_erased(), e.data().to_vec()))
            .collect()
    };
    let full = vec![
        (false, b"MARKER-a1".to_vec()),
        (false, b"MARKER-b1".to_vec()),
        (false, b"MARKER-b2".to_vec()),
        (false, b"MARKER-plain".to_vec()),
    ];
    assert_eq!(data(&a), full);
    assert_eq!(data(&b), full);
    let nowhere = |when: &str| {
        cluster.sql("CHECKPOINT");
        let text = cluster.dump();
        // A plain event's data is in the dump, as bytea in hex: the dump holds the log.
        let plain: String = b"MARKER-plain".iter().map(|b| format!("{b:02x}")).collect();
        assert!(text.contains(&plain));
        for marker in ["MARKER-a1", "MARKER-b1", "MARKER-b2"] {
            let hex: String = marker.bytes().map(|b| format!("{b:02x}")).collect();
            assert!(
                !text.contains(marker) && !text.contains(&hex),
                "{marker} in pg_dump {when}"
            );
            assert_eq!(
                annals_testkit::files_holding(cluster.path(), marker.as_bytes()),
                Vec::<std::path::PathBuf>::new(),
                "{marker} in the database's files {when}"
            );
            assert_eq!(
                annals_testkit::files_holding(kept.path(), marker.as_bytes()),
                Vec::<std::path::PathBuf>::new(),
                "{marker} in the kept mirror {when}"
            );
        }
    };
    nowhere("before the erasure");

    // The erasure on a; b still holds customer:1's key in memory.
    cluster.sql(
        "CREATE TABLE saved_key AS SELECT * FROM annals_subject_keys WHERE tag = 'customer:1'",
    );
    let erasure = a.erase_subject("customer:1").unwrap();
    assert_eq!(erasure.events, 2);
    assert!(!erasure.already);
    let refused = b.append(&[moved(1, "late")], None).unwrap_err();
    assert!(
        matches!(
            refused,
            AppendError::SubjectErased { ref tag } if tag == "customer:1"
        ),
        "{refused:?}"
    );
    let erased: Vec<(bool, Vec<u8>)> = data(&b).into_iter().take(4).collect();
    assert_eq!(
        erased,
        vec![
            (true, Vec::new()),
            (true, Vec::new()),
            (false, b"MARKER-b2".to_vec()),
            (false, b"MARKER-plain".to_vec()),
        ]
    );
    assert_eq!(data(&a), data(&b));
    // Erasing again on b answers the same receipt.
    let again = b.erase_subject("customer:1").unwrap();
    assert!(again.already);
    assert_eq!(again.receipt, erasure.receipt);
    a.close().unwrap();
    b.close().unwrap();
    nowhere("after the erasure");

    // As if a's process had died after the receipt and before the key's row was erased
    // (PostgreSQL takes the receipt first): the next server to open finishes the erasure.
    cluster.sql(
        "UPDATE annals_subject_keys k SET wrapped = s.wrapped, erased_at_us = NULL \
         FROM saved_key s WHERE k.tag = s.tag",
    );
    assert_eq!(
        cluster.sql_value(
            "SELECT count(*) FROM annals_subject_keys WHERE wrapped IS NOT NULL \
             AND tag = 'customer:1'"
        ),
        "1"
    );
    // A server opened later: the erasure holds; customer:2 reads in full.
    let c = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    assert_eq!(
        cluster.sql_value(
            "SELECT count(*) FROM annals_subject_keys WHERE wrapped IS NULL \
             AND tag = 'customer:1'"
        ),
        "1"
    );
    assert_eq!(data(&c)[0], (true, Vec::new()));
    assert_eq!(data(&c)[2], (false, b"MARKER-b2".to_vec()));
    c.close().unwrap();

    // Another master key: refused, nothing written.
    let keys_before = cluster.sql_value("SELECT count(*) FROM annals_subject_keys");
    let wrong = Options {
        subjects: Some(SubjectOptions::new(
            ["customer:"],
            MasterKey::generate().unwrap(),
        )),
        ..small_options()
    };
    let e = Store::open_postgres(&cluster.url(), wrong).err().unwrap();
    assert!(e.to_string().contains("master key"), "{e}");
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_subject_keys"),
        keys_before
    );
    // Without subjects, a database holding sealed events is refused too.
    let e = Store::open_postgres(&cluster.url(), small_options())
        .err()
        .unwrap();
    assert!(e.to_string().contains("master key"), "{e}");

    // Rotating the master key on one server: every key of the table wrapped again in one
    // transaction. The other server, still on the old master key, reads on with the keys it
    // holds and makes no new key; a server started with the new master key reads and
    // appends; the old master key is refused from then on.
    let d = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    let e = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    let new_master = MasterKey::generate().unwrap();
    let wrapped_before = cluster.sql_value(
        "SELECT encode(wrapped, 'hex') FROM annals_subject_keys WHERE tag = 'customer:2'",
    );
    assert_eq!(d.rotate_master_key(&new_master).unwrap(), 1);
    assert_ne!(
        cluster.sql_value(
            "SELECT encode(wrapped, 'hex') FROM annals_subject_keys WHERE tag = 'customer:2'"
        ),
        wrapped_before
    );
    assert_eq!(data(&e)[2], (false, b"MARKER-b2".to_vec()));
    let refused = e.append(&[moved(4, "e4")], None).unwrap_err();
    assert!(refused.to_string().contains("rotated"), "{refused}");
    // A new subject's key under the new master key stops the old server's following, and
    // says why.
    d.append(&[moved(3, "d3")], None).unwrap();
    let stopped = e.refresh().unwrap_err();
    assert!(stopped.to_string().contains("new master key"), "{stopped}");
    d.close().unwrap();
    e.close().unwrap();
    let e = Store::open_postgres(&cluster.url(), options.clone())
        .err()
        .unwrap();
    assert!(e.to_string().contains("master key"), "{e}");
    let rotated = Options {
        subjects: Some(SubjectOptions::new(["customer:"], new_master)),
        ..small_options()
    };
    let f = Store::open_postgres(&cluster.url(), rotated).unwrap();
    let after = data(&f);
    assert_eq!(after[2], (false, b"MARKER-b2".to_vec()));
    assert!(after.contains(&(false, b"MARKER-d3".to_vec())));
    f.append(&[moved(4, "f4")], None).unwrap();
    f.close().unwrap();
}

/// Goal: every server of a database keeps the subjects the database sealed events for and
/// erased, whatever prefixes it is started with. Regression: a server started with other
/// subject tag prefixes than the store was used with stored a subject's data in clear and
/// took appends naming an erased subject. Method: a server without subjects starts first, on
/// a database that holds no key yet; a server erases customer:42; a server started with
/// `employee:` alone is refused, naming it, and writes nothing to the keys table; one started
/// with both prefixes runs, and a server still running with `customer:` alone, once it takes
/// in that server's first employee event, appends nothing more (it would store employee data
/// in clear) and says why, while it reads on; the server without subjects stopped appending
/// once it took in the first sealed event, and is not ready, saying why.
#[test]
fn a_server_with_fewer_subject_prefixes_than_the_database_never_stores_in_clear() {
    use annals::{MasterKey, SubjectOptions};
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let master = MasterKey::generate().unwrap();
    let with = |prefixes: &[&str]| Options {
        subjects: Some(SubjectOptions::new(
            prefixes.iter().copied(),
            master.clone(),
        )),
        ..small_options()
    };
    let plain = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    plain
        .append(&[NewEvent::new("Opened", "before any subject")], None)
        .unwrap();
    let a = Store::open_postgres(&cluster.url(), with(&["customer:"])).unwrap();
    a.append(&[NewEvent::new("Moved", "street").tag("customer:42")], None)
        .unwrap();
    a.erase_subject("customer:42").unwrap();
    let rows = cluster.sql_value("SELECT count(*) FROM annals_subject_keys");

    let e = Store::open_postgres(&cluster.url(), with(&["employee:"]))
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("customer:42 (erased)")
            && e.to_string().contains("--subject-tags employee:,customer:"),
        "{e}"
    );
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_subject_keys"),
        rows
    );

    let both = Store::open_postgres(&cluster.url(), with(&["customer:", "employee:"])).unwrap();
    let refused = both
        .append(&[NewEvent::new("Moved", "again").tag("customer:42")], None)
        .unwrap_err();
    assert!(
        matches!(refused, AppendError::SubjectErased { .. }),
        "{refused:?}"
    );
    both.append(
        &[NewEvent::new("Hired", "MARKER-e7").tag("employee:7")],
        None,
    )
    .unwrap();
    // `a` learns of a subject under a prefix it was not given: it stops appending.
    a.refresh().unwrap();
    let stopped = a
        .append(
            &[NewEvent::new("Hired", "MARKER-e8").tag("employee:8")],
            None,
        )
        .unwrap_err();
    assert!(
        stopped.to_string().contains("employee:7")
            && stopped.to_string().contains("--subject-tags"),
        "{stopped}"
    );
    let last = read_all(&a, &Query::all(), ReadOptions::backwards()).unwrap();
    assert_eq!(last[0].data(), b"MARKER-e7");
    assert!(
        a.stats().unready_reasons()[0].starts_with("subjects_differ:"),
        "{:?}",
        a.stats().unready_reasons()
    );
    a.close().unwrap();
    // The server without subjects took in sealed events: it appends nothing more.
    plain.refresh().unwrap();
    let stopped = plain
        .append(
            &[NewEvent::new("Moved", "MARKER-e9").tag("customer:9")],
            None,
        )
        .unwrap_err();
    assert!(
        stopped
            .to_string()
            .contains("started without data subjects"),
        "{stopped}"
    );
    assert!(plain
        .stats()
        .unready_reasons()
        .iter()
        .any(|r| r.starts_with("subjects_differ:")));
    plain.close().unwrap();
    both.close().unwrap();
    let hex: String = b"MARKER-e".iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        !cluster.dump().contains(&hex),
        "employee data in clear in the database"
    );
}

/// Goal: a store on files with data subjects copied into PostgreSQL takes its keys along:
/// those of its key file, and those only its log carries (here all of them: the store kept
/// no key file up to date, as after a crash), and its erasures; the database's servers then
/// read every subject back, the erased one erased, and refuse appends naming it.
#[test]
fn a_copy_into_postgres_takes_the_subjects_keys_along() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let master = annals::MasterKey::generate().unwrap();
    let subjects = annals::SubjectOptions::new(["customer:"], master);
    let dir = tempfile::tempdir().unwrap();
    let files = Options {
        subjects: Some(subjects.clone()),
        checkpoint_interval_events: 0,
        checkpoint_on_close: false,
        ..Options::default()
    };
    let source = Store::open(dir.path(), files.clone()).unwrap();
    source.erase_subject("customer:7").unwrap();
    for i in 0..60u64 {
        let event =
            NewEvent::new("Moved", format!("address {i}")).tag(format!("customer:{}", i % 6));
        source.append(&[event], None).unwrap();
    }
    source.close().unwrap();
    let key_file = std::fs::read(dir.path().join("subjects.keys")).unwrap();
    let source = Store::open(dir.path(), files).unwrap();
    let on_postgres = Options {
        subjects: Some(subjects),
        ..small_options()
    };
    let target = Store::open_postgres(&cluster.url(), on_postgres.clone()).unwrap();
    annals::copy(&source, &target, &mut |_, _, _| {}).unwrap();
    assert_eq!(target.import_subject_keys(&key_file).unwrap(), 6);
    let data = |store: &Store| -> Vec<(bool, Vec<u8>)> {
        read_all(store, &Query::all(), ReadOptions::forwards())
            .unwrap()
            .into_iter()
            .map(|e| (e.is_erased(), e.data().to_vec()))
            .collect()
    };
    assert_eq!(data(&target), data(&source));
    assert_eq!(data(&target)[1].1, b"address 0");
    target.close().unwrap();
    source.close().unwrap();
    let other = Store::open_postgres(&cluster.url(), on_postgres).unwrap();
    assert_eq!(data(&other)[60].1, b"address 59");
    let e = other
        .append(&[NewEvent::new("Moved", "x").tag("customer:7")], None)
        .unwrap_err();
    assert!(matches!(e, AppendError::SubjectErased { .. }), "{e}");
    other.close().unwrap();
}

/// Goal: decisions' snapshots on PostgreSQL are shared by every server of the database and do
/// not outlive an erasure: a snapshot one server saved is another's hit; after an erasure on one
/// server, no server is served a snapshot that folded the subject (the other server too, though
/// its mirror had not yet taken the receipt in), the table holds none and pg_dump shows none of
/// the state's bytes, and a save of a state folded before the erasure is refused on either.
#[test]
fn snapshots_on_postgres_are_shared_and_do_not_outlive_an_erasure() {
    use annals::decide::Projection;
    use annals::snapshot::{Lookup, SnapshotError, SnapshotPolicy, Snapshotted};
    use annals::{MasterKey, QueryItem, SubjectOptions};
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let options = Options {
        subjects: Some(SubjectOptions::new(
            ["customer:"],
            MasterKey::generate().unwrap(),
        )),
        ..small_options()
    };
    let a = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    let b = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    let names = || {
        Projection::new(
            Query::item(QueryItem::types(["Named"])),
            Vec::<String>::new(),
            |names: &mut Vec<String>, event| {
                names.push(String::from_utf8_lossy(event.data()).into_owned())
            },
        )
    };
    let policy = SnapshotPolicy {
        every: 1,
        slower_than: None,
    };
    let model = Snapshotted::new("names", 1, names()).policy(policy);
    let named = |customer: u64, name: &str| {
        NewEvent::new("Named", name.to_string()).tag(format!("customer:{customer}"))
    };
    a.append(&[named(1, "SNAPSHOT-MARKER-one")], None).unwrap();
    a.append(&[named(2, "two")], None).unwrap();
    assert_eq!(a.decide(&model).unwrap().state.len(), 2);
    b.refresh().unwrap();
    let Lookup::Hit(shared) = b.snapshots().load(model.id()).unwrap() else {
        panic!("a's snapshot is b's");
    };
    assert_eq!(shared.position, 2);
    assert_eq!(shared.subjects, ["customer:1", "customer:2"]);
    let hex: String = b"SNAPSHOT-MARKER-one"
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    cluster.sql("CHECKPOINT");
    assert!(
        cluster.dump().contains(&hex),
        "the snapshot's state is in the table"
    );

    // b erases; a's mirror has not necessarily taken the receipt in yet.
    let erasure = b.erase_subject("customer:1").unwrap();
    let found = a.snapshots().load(model.id()).unwrap();
    assert!(
        matches!(found, Lookup::Miss | Lookup::Unfit(_)),
        "{found:?}"
    );
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_snapshots"),
        "0"
    );
    cluster.sql("CHECKPOINT");
    assert!(
        !cluster.dump().contains(&hex),
        "the snapshot's state is gone"
    );
    for store in [&a, &b] {
        let refused = store
            .snapshots()
            .save_with_subjects(
                model.id(),
                erasure.receipt - 1,
                vec!["customer:1".into(), "customer:2".into()],
                b"[\"SNAPSHOT-MARKER-one\"]".to_vec(),
            )
            .unwrap_err();
        assert!(
            matches!(refused, SnapshotError::SubjectErased { .. }),
            "{refused}"
        );
    }
    // A decision after the erasure folds the erased event without its data, and saves that.
    a.refresh().unwrap();
    let after = a.decide(&model).unwrap();
    assert_eq!(after.state, ["", "two"]);
    let Lookup::Hit(saved) = b.snapshots().load(model.id()).unwrap() else {
        panic!("the snapshot saved after the erasure");
    };
    assert!(
        saved.position >= erasure.receipt,
        "{} {}",
        saved.position,
        erasure.receipt
    );
    a.close().unwrap();
    b.close().unwrap();
}
