//! Restoring from the continuous backup: what a store ships restores to the same log, whole,
//! to a position or to a time, from a local directory and from a real S3 server; the data
//! subjects' keys travel with the backup, and an erasure holds in it, on files and on
//! PostgreSQL.
mod common;

use std::time::Duration;

use annals::backup::{restore, verify_backup, RestoreLimit};
use annals::{compare, BackupOptions, Durability, NewEvent, Options, Store};
use annals_testkit::eventually;
use common::backup::*;

/// Goal: what a store ships restores to the same log, whole (compared append by append), to a
/// position (the append that holds it, no further) or to a time; a position beyond the backup
/// is refused, nothing restored.
#[test]
fn a_shipped_store_restores_whole_to_a_position_and_to_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let opts = options(&url);
    let source = Store::open(dir.path().join("source"), opts.clone()).unwrap();
    fill(&source, 1500);
    let middle_time = {
        let e = source
            .read(
                &annals::Query::all(),
                annals::ReadOptions::forwards().from(1000),
            )
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        e.appended_at_us()
    };
    std::thread::sleep(Duration::from_millis(2));
    fill(&source, 500);
    let head = source.head();
    let stats = source.stats();
    assert!(
        stats.segments > 3,
        "the log spans segments: {}",
        stats.segments
    );
    source.close().unwrap();

    let report = verify_backup(&BackupOptions::new(&url), &mut |_, _| {}).unwrap();
    assert_eq!(report.head, head, "{report:?}");
    assert!(
        report.segments >= 3,
        "sealed segments shipped whole: {report:?}"
    );
    assert_eq!(report.covered_chunks, 0, "{report:?}");

    let source = Store::open(dir.path().join("source"), plain(&opts)).unwrap();
    let whole = Store::open(dir.path().join("whole"), plain(&opts)).unwrap();
    let restored = restore(
        &BackupOptions::new(&url),
        &whole,
        RestoreLimit::default(),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(restored.head, head);
    assert_eq!(compare(&source, &whole, head, &mut |_| {}).unwrap(), 2000);

    let to = 1234;
    let part = Store::open(dir.path().join("part"), plain(&opts)).unwrap();
    let limit = RestoreLimit {
        position: Some(to),
        ..RestoreLimit::default()
    };
    let restored = restore(&BackupOptions::new(&url), &part, limit, &mut |_, _| {}).unwrap();
    assert!(
        restored.head <= to && restored.head + 3 > to,
        "{restored:?}"
    );
    assert_eq!(
        compare(&part, &source, restored.head, &mut |_| {}).unwrap(),
        restored.appends
    );

    let timed = Store::open(dir.path().join("timed"), plain(&opts)).unwrap();
    let limit = RestoreLimit {
        time_us: Some(middle_time),
        ..RestoreLimit::default()
    };
    let restored = restore(&BackupOptions::new(&url), &timed, limit, &mut |_, _| {}).unwrap();
    let last = timed
        .read(&annals::Query::all(), annals::ReadOptions::backwards())
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert!(last.appended_at_us() <= middle_time);
    assert!(
        restored.head >= 1000 && restored.head < head,
        "{restored:?}"
    );

    let beyond = Store::open(dir.path().join("beyond"), plain(&opts)).unwrap();
    let limit = RestoreLimit {
        position: Some(head + 1),
        ..RestoreLimit::default()
    };
    let e = restore(&BackupOptions::new(&url), &beyond, limit, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("cannot restore to position"), "{e}");
    assert_eq!(beyond.head(), 0);
}

/// Goal: the same on a real S3 server (SeaweedFS), its endpoint and key given as settings
/// rather than in the environment.
#[test]
fn a_store_ships_to_s3_and_restores_from_it() {
    let Some(s3) = annals_testkit::s3::S3Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&s3.url("library"));
    let backup = opts.backup.as_mut().unwrap();
    for (k, v) in s3.env() {
        backup.settings.push((k.to_string(), v));
    }
    let source = Store::open(dir.path().join("source"), opts.clone()).unwrap();
    fill(&source, 800);
    let head = source.head();
    source.close().unwrap();
    let from = opts.backup.clone().unwrap();
    assert_eq!(verify_backup(&from, &mut |_, _| {}).unwrap().head, head);
    let restored = Store::open(dir.path().join("restored"), plain(&opts)).unwrap();
    restore(&from, &restored, RestoreLimit::default(), &mut |_, _| {}).unwrap();
    let source = Store::open(dir.path().join("source"), plain(&opts)).unwrap();
    assert_eq!(compare(&source, &restored, head, &mut |_| {}).unwrap(), 800);
}

/// Goal: a store with data subjects ships their keys with its records, so that a restore reads
/// them back; an erasure replaces the backup's keys before it answers, so that the erased
/// subject's key is in no object, and the restored store has the subject erased too.
#[test]
fn subjects_keys_travel_with_the_backup_and_erasure_holds_in_it() {
    use annals::{MasterKey, SubjectOptions};
    const MARKER: &str = "MARKER-backup-subject-55e1";
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let master = MasterKey::generate().unwrap();
    let mut opts = options(&url);
    opts.subjects = Some(SubjectOptions::new(["customer:"], master.clone()));
    let source = Store::open(dir.path().join("source"), opts.clone()).unwrap();
    for i in 0..300u64 {
        let event =
            NewEvent::new("Moved", format!("{MARKER} {i}")).tag(format!("customer:{}", i % 10));
        source.append(&[event], None).unwrap();
    }
    fill(&source, 200);
    let erasure = source.erase_subject("customer:3").unwrap();
    assert_eq!(erasure.events, 30);
    assert_eq!(erasure.in_backup, Some(true));
    eventually("the backup ships everything", WAIT, || {
        source.stats().backup.unwrap().lag_positions == 0
    });
    let head = source.head();
    source.close().unwrap();

    // No marker in any object; only the newest epoch of keys is left.
    let key_objects = key_objects(&dir.path().join("backup"), MARKER);
    assert!(!key_objects.is_empty());
    assert!(
        key_objects
            .iter()
            .all(|n| n.starts_with("00000000000000000001-")),
        "only the epoch after the erasure: {key_objects:?}"
    );

    // A restore without the keys is refused; with them it reads back, customer:3 erased.
    let plain_target = Store::open(dir.path().join("refused"), plain(&options(&url))).unwrap();
    let e = restore(
        &BackupOptions::new(&url),
        &plain_target,
        RestoreLimit::default(),
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("keys"), "{e}");
    let target_dir = dir.path().join("restored");
    let mut target_opts = plain(&opts);
    target_opts.subjects = Some(SubjectOptions::new(["customer:"], master));
    let target = Store::open(&target_dir, target_opts.clone()).unwrap();
    let restored = restore(
        &BackupOptions::new(&url),
        &target,
        RestoreLimit::default(),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(restored.head, head);
    target.close().unwrap();
    assert!(annals::backup::restore_keys(&BackupOptions::new(&url), &target_dir).unwrap());
    let target = Store::open(&target_dir, target_opts).unwrap();
    assert_eq!(target.head(), head, "the receipt was restored, none added");
    let events: Vec<annals::Event> = target
        .read(&annals::Query::all(), annals::ReadOptions::forwards())
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    for (i, e) in events.iter().take(300).enumerate() {
        if i % 10 == 3 {
            assert!(e.is_erased(), "{i}");
        } else {
            assert_eq!(e.data(), format!("{MARKER} {i}").as_bytes());
        }
    }
    assert!(target
        .append(&[NewEvent::new("Moved", "x").tag("customer:3")], None)
        .is_err());
    target.close().unwrap();
}

/// Goal: a store on PostgreSQL with data subjects has a backup too: it holds an image of the
/// database's keys (still under the master key) and never the clear data; keys made by
/// another server of the database reach it; an erasure answers once the backup's keys no
/// longer hold the subject's, older images gone; a replica and a restore read every other
/// subject back, the erased one erased.
#[test]
fn a_store_on_postgres_with_subjects_is_backed_up_with_its_keys() {
    use annals::{MasterKey, SubjectOptions};
    const MARKER: &str = "MARKER-pg-backup-subject-a41c";
    let Some(cluster) = annals_testkit::Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let master = MasterKey::generate().unwrap();
    let mut opts = options(&url);
    opts.durability = Durability::Synced;
    opts.subjects = Some(SubjectOptions::new(["customer:"], master.clone()));
    let first = Store::open_postgres(&cluster.url(), opts.clone()).unwrap();
    let second = Store::open_postgres(&cluster.url(), opts.clone()).unwrap();
    assert_eq!(second.stats().backup.unwrap().state, "standby");
    // Subjects 0-9 get their keys from the first server, 10-19 from the second.
    let moved = |i: u64| {
        NewEvent::new("Moved", format!("{MARKER} {i}")).tag(format!("customer:{}", i % 20))
    };
    for i in 0..200u64 {
        let store = if i % 20 < 10 { &first } else { &second };
        store.append(&[moved(i)], None).unwrap();
    }
    fill(&first, 50);
    first.refresh().unwrap();
    let erasure = first.erase_subject("customer:13").unwrap();
    assert_eq!(erasure.events, 10);
    assert_eq!(erasure.in_backup, Some(true), "{erasure:?}");
    // More keys after the erasure: the image goes on in the new epoch.
    for i in 200..240u64 {
        let store = if i % 20 < 10 { &first } else { &second };
        let event = NewEvent::new("Moved", format!("{MARKER} {i}")).tag(format!("customer:n{i}"));
        store.append(&[event], None).unwrap();
    }
    // An erasure on the server standing by: it does not wait for the backup; the shipping
    // server replaces the backup's keys once it takes the receipt in.
    let on_standby = second.erase_subject("customer:17").unwrap();
    assert_eq!(on_standby.events, 10);
    assert_eq!(on_standby.in_backup, Some(false));
    let head = first.refresh().unwrap();
    eventually("the backup ships everything", WAIT, || {
        first.stats().backup.unwrap().shipped_through == head
    });
    let read = |store: &Store| -> Vec<(bool, Vec<u8>)> {
        store
            .read(&annals::Query::all(), annals::ReadOptions::forwards())
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.is_erased(), e.data().to_vec()))
            .collect()
    };
    let expected = read(&first);
    let replica = Store::open_replica(opts.backup.as_ref().unwrap(), plain(&opts)).unwrap();
    eventually("the replica follows", WAIT, || replica.head() == head);
    assert_eq!(read(&replica), expected);
    replica.close().unwrap();
    second.close().unwrap();
    first.close().unwrap();

    // No marker in any object; the keys of one epoch only, after the first image.
    let keys = key_objects(&dir.path().join("backup"), MARKER);
    let epochs: std::collections::BTreeSet<&str> = keys.iter().map(|k| &k[..20]).collect();
    assert_eq!(epochs.len(), 1, "{keys:?}");
    assert!(!epochs.contains("00000000000000000000"), "{keys:?}");

    // Restored into a directory (with the master key): every other subject reads back.
    let target_dir = dir.path().join("restored");
    let target_opts = Options {
        durability: Durability::Synced,
        ..plain(&opts)
    };
    let target = Store::open(&target_dir, target_opts.clone()).unwrap();
    let restored = restore(
        &BackupOptions::new(&url),
        &target,
        RestoreLimit::default(),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(restored.head, head);
    target.close().unwrap();
    assert!(annals::backup::restore_keys(&BackupOptions::new(&url), &target_dir).unwrap());
    let target = Store::open(&target_dir, target_opts).unwrap();
    assert_eq!(read(&target), expected);
    assert!(read(&target)[13].0, "customer:13 is erased");
    assert!(read(&target)[17].0, "customer:17 is erased");
    assert_eq!(read(&target)[12].1, format!("{MARKER} 12").as_bytes());
    assert!(target
        .append(&[NewEvent::new("Moved", "x").tag("customer:13")], None)
        .is_err());
    target.close().unwrap();

    // Restored into another database, the keys put into its table: the same, on every
    // server of that database.
    cluster.sql("CREATE DATABASE restored");
    let database = format!(
        "host=127.0.0.1 port={} user=postgres dbname=restored",
        cluster.port()
    );
    let target_opts = Options {
        backup: None,
        ..opts.clone()
    };
    let target = Store::open_postgres(&database, target_opts.clone()).unwrap();
    restore(
        &BackupOptions::new(&url),
        &target,
        RestoreLimit::default(),
        &mut |_, _| {},
    )
    .unwrap();
    let key_file = annals::backup::key_file(&BackupOptions::new(&url))
        .unwrap()
        .unwrap();
    assert_eq!(target.import_subject_keys(&key_file).unwrap(), 20 + 40 - 2);
    assert_eq!(read(&target), expected);
    target.close().unwrap();
    let other = Store::open_postgres(&database, target_opts).unwrap();
    assert_eq!(read(&other), expected);
    let e = other
        .append(&[NewEvent::new("Moved", "x").tag("customer:13")], None)
        .unwrap_err();
    assert!(
        matches!(e, annals::AppendError::SubjectErased { .. }),
        "{e}"
    );
    other.close().unwrap();
}
