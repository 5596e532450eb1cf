//! The continuous backup, shipping: into `object_store`'s local directory (the tests against a
//! real S3 server are the command line's) and into a real S3 server, in chunks, runs put again
//! and sealed segments; a prefix refused to another store and to a store behind it; a D4
//! append acknowledged only once it is in the backup; the servers of one PostgreSQL database
//! standing by while one ships, and taking over.
mod common;

use std::time::Duration;

use annals::backup::verify_backup;
use annals::{BackupOptions, Durability, InputError, NewEvent, OpenError, Store};
use annals_testkit::eventually;
use common::backup::*;

/// Goal: a segment shipped in large chunks (a store under load) is not shipped a second time
/// whole; its chunks are its copy, and a restore and a verify read through them.
#[test]
fn large_chunks_stand_for_their_sealed_segment() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let mut opts = options(&url);
    opts.segment_bytes = 8 << 20;
    opts.limits.append_bytes_max = 4 << 20;
    opts.limits.event_bytes_max = 2 << 20;
    opts.group_bytes_max = 4 << 20;
    opts.unsynced_bytes_max = 4 << 20;
    let source = Store::open(dir.path().join("source"), opts.clone()).unwrap();
    let big = |i: u64| NewEvent::new("Big", vec![b'a' + (i % 26) as u8; (1 << 20) + 7]);
    // Three appends of 1.5 MiB, each shipped alone: three chunks of the first segment.
    for i in 0..3 {
        source.append(&[big(i)], None).unwrap();
        eventually("the chunk is shipped", WAIT, || {
            source.stats().backup.unwrap().lag_positions == 0
        });
    }
    // Then enough to seal it, and a little more.
    for i in 3..12 {
        source.append(&[big(i)], None).unwrap();
    }
    fill(&source, 50);
    eventually("the backup ships everything", WAIT, || {
        source.stats().backup.unwrap().lag_positions == 0
    });
    assert!(source.stats().segments >= 2);
    let head = source.head();
    let shipped = source.stats().backup.unwrap().bytes_shipped;
    source.close().unwrap();

    let report = verify_backup(&BackupOptions::new(&url), &mut |_, _| {}).unwrap();
    assert_eq!(report.head, head, "{report:?}");
    assert_eq!(report.covered_chunks, 0, "{report:?}");
    // No byte shipped twice: what was put is what the backup holds.
    assert_eq!(shipped, report.bytes, "{report:?}");
    assert!(report.chunks >= 3, "{report:?}");

    let source = Store::open(dir.path().join("source"), plain(&opts)).unwrap();
    assert_eq!(source.head(), head);
    restores_whole(&source, &dir.path().join("whole"), &url, &opts);
}

/// Goal: small chunks shipped one by one are put again as larger objects, their chunks then
/// deleted, and sealed segments shipped late go out in pieces: no object of the backup is
/// much larger than the piece size, and a restore reads through them.
#[test]
fn small_chunks_are_put_again_in_pieces_and_no_object_is_large() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let mut opts = options(&url);
    opts.segment_bytes = 1 << 20;
    let piece = 64 << 10;
    opts.backup.as_mut().unwrap().object_bytes_max = piece;
    let source = Store::open(dir.path().join("source"), opts.clone()).unwrap();
    // Appends each shipped alone: small chunks, consolidated once 64 KiB of them are put,
    // while the segment is still written.
    for i in 0..400 {
        source.append(&events(i, 1), None).unwrap();
        eventually("the chunk is shipped", WAIT, || {
            source.stats().backup.unwrap().lag_positions == 0
        });
    }
    eventually(
        "two runs of 64 KiB are put again as one object each",
        WAIT,
        || source.stats().backup.unwrap().segments_shipped >= 2,
    );
    assert_eq!(source.stats().segments, 1, "still one segment");
    source.close().unwrap();
    let first_400 = |names: &[(String, u64)]| {
        names
            .iter()
            .filter(|(n, _)| n.parse::<u64>().unwrap() <= 400)
            .count()
    };
    let pieces = listed(&dir.path().join("backup/segments"));
    let chunks = listed(&dir.path().join("backup/log"));
    assert!(first_400(&pieces) >= 2, "{pieces:?}");
    assert!(
        first_400(&chunks) < 200,
        "the runs' chunks are deleted: {chunks:?}"
    );
    // Then the store goes on without its backup across several segments, and the backup
    // catches up with sealed segments: they go out in pieces.
    let alone = Store::open(dir.path().join("source"), plain(&opts)).unwrap();
    fill(&alone, 6000);
    alone.close().unwrap();
    let source = Store::open(dir.path().join("source"), opts.clone()).unwrap();
    eventually("the backup ships everything", WAIT, || {
        source.stats().backup.unwrap().lag_positions == 0
    });
    let head = source.head();
    let segments = source.stats().segments;
    assert!(segments >= 3, "{segments}");
    source.close().unwrap();

    let report = verify_backup(&BackupOptions::new(&url), &mut |_, _| {}).unwrap();
    assert_eq!(report.head, head, "{report:?}");
    assert_eq!(report.covered_chunks, 0, "{report:?}");
    let pieces = listed(&dir.path().join("backup/segments"));
    let chunks = listed(&dir.path().join("backup/log"));
    // A record of the test's events is under 1 KiB: an object ends with the record that
    // crossed the limit.
    for (name, size) in pieces.iter().chain(&chunks) {
        assert!(*size < piece as u64 + 2048, "{name} is {size} bytes");
    }
    // The last run of the first appends was found again after the restart and put again.
    assert!(first_400(&pieces) >= 3, "{pieces:?}");
    assert_eq!(first_400(&chunks), 0, "{chunks:?}");
    assert!(
        pieces.len() > 3 + 8 * (segments - 2),
        "sealed segments of 1 MiB in pieces of 64 KiB: {pieces:?}"
    );

    let source = Store::open(dir.path().join("source"), plain(&opts)).unwrap();
    assert_eq!(source.head(), head);
    restores_whole(&source, &dir.path().join("whole"), &url, &opts);
}

/// Goal: a prefix is one store's: a store reopened resumes shipping where it left off, while
/// a store on files is refused a prefix another server ships into, another store's prefix, a
/// prefix it is behind, and a malformed URL.
#[test]
fn a_prefix_is_refused_to_another_store_and_to_a_store_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let opts = options(&url);
    let store = Store::open(dir.path().join("one"), opts.clone()).unwrap();
    fill(&store, 20);
    store.close().unwrap();
    // Reopened, it resumes where it left off.
    let store = Store::open(dir.path().join("one"), opts.clone()).unwrap();
    fill(&store, 20);
    let head = store.head();
    store.close().unwrap();
    assert_eq!(
        verify_backup(&BackupOptions::new(&url), &mut |_, _| {})
            .unwrap()
            .head,
        head
    );

    // While a server ships into the prefix, a store on files is refused it.
    let holder = Store::open(dir.path().join("one"), opts.clone()).unwrap();
    let e = Store::open(dir.path().join("two"), opts.clone())
        .err()
        .expect("a prefix another server ships into is refused");
    assert!(
        matches!(&e, OpenError::Backup(m) if m.contains("another server ships into this prefix")
            && m.contains("own prefix")),
        "{e}"
    );
    holder.close().unwrap();

    let other = Store::open(dir.path().join("other"), plain(&opts)).unwrap();
    other.append(&events(99, 1), None).unwrap();
    other.close().unwrap();
    let e = Store::open(dir.path().join("other"), opts.clone())
        .err()
        .expect("another store's prefix is refused");
    assert!(
        matches!(&e, OpenError::Backup(m) if m.contains("backs up another store")),
        "{e}"
    );

    let e = Store::open(dir.path().join("empty"), opts.clone())
        .err()
        .expect("a store behind its backup is refused");
    assert!(
        matches!(&e, OpenError::Backup(m) if m.contains("behind its backup")),
        "{e}"
    );

    let e = Store::open(dir.path().join("bad"), options("nonsense://x"))
        .err()
        .expect("a malformed URL is refused");
    assert!(
        matches!(&e, OpenError::Backup(m) if m.contains("backup URL")),
        "{e}"
    );
}

/// Goal: a D4 append is acknowledged only once it is in the backup, asked for per append or
/// as the store's class; without a backup there is no D4, per append or per store.
#[test]
fn an_off_machine_append_is_acknowledged_once_in_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let mut opts = options(&url);
    // Nothing would be shipped for a minute but for the appends that wait for it.
    opts.backup.as_mut().unwrap().interval = Duration::from_secs(60);
    let store = Store::open(dir.path().join("store"), opts.clone()).unwrap();
    for i in 0..20 {
        let p = store
            .appending(&events(i, 1))
            .require_off_machine()
            .wait()
            .unwrap();
        let backup = store.stats().backup.unwrap();
        assert!(backup.shipped_through >= p, "{backup:?}");
    }
    store.close().unwrap();

    // A store opened in D4 makes every append wait for the backup.
    opts.durability = Durability::OffMachine;
    let store = Store::open(dir.path().join("store"), opts.clone()).unwrap();
    assert_eq!(store.durability(), Durability::OffMachine);
    let p = store.append(&events(100, 2), None).unwrap();
    assert!(store.stats().backup.unwrap().shipped_through >= p);
    store.close().unwrap();

    // Without a backup there is no D4.
    let plain_store = Store::open(dir.path().join("plain"), plain(&opts_d3(&opts))).unwrap();
    let e = plain_store
        .appending(&events(1, 1))
        .require_off_machine()
        .wait()
        .unwrap_err();
    assert!(
        matches!(
            e,
            annals::AppendError::Input(InputError::OffMachineUnavailable)
        ),
        "{e}"
    );
    let e = Store::open(dir.path().join("d4"), plain(&opts))
        .err()
        .expect("d4 without a backup is refused");
    assert!(e.to_string().contains("needs a backup"), "{e}");
}

/// Goal: several servers of one PostgreSQL database, each started with the same backup: one
/// ships, the others stand by. A standby answers its D4 appends once the shipping server has
/// put them, and takes over when that server stops; the backup then holds every append of
/// both, gapless.
#[test]
fn a_second_server_of_a_database_stands_by_and_takes_over() {
    let Some(cluster) = annals_testkit::Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let mut opts = options(&url);
    opts.durability = Durability::Synced;
    let first = Store::open_postgres(&cluster.url(), opts.clone()).unwrap();
    let second = Store::open_postgres(&cluster.url(), opts.clone()).unwrap();
    fill(&first, 50);
    let backup = first.stats().backup.unwrap();
    assert_eq!(backup.state, "shipping", "{backup:?}");
    let standing = second.stats().backup.unwrap();
    assert_eq!(standing.state, "standby", "{standing:?}");
    assert!(
        standing
            .holder
            .as_deref()
            .is_some_and(|h| h.contains("another server ships")),
        "{standing:?}"
    );
    // A D4 append on the standby is answered once the first server has shipped it.
    for i in 0..10 {
        let p = second
            .appending(&events(1000 + i, 1))
            .require_off_machine()
            .wait()
            .unwrap();
        let seen = second.stats().backup.unwrap();
        assert!(seen.shipped_through >= p, "{seen:?}");
        assert_eq!(seen.state, "standby");
    }
    // The first server stops (releasing its lease): the standby takes over.
    first.close().unwrap();
    eventually("the standby to take over", Duration::from_secs(20), || {
        let backup = second.stats().backup.unwrap();
        if backup.state == "shipping" {
            Ok(())
        } else {
            Err(Box::new(backup))
        }
    });
    fill(&second, 30);
    let p = second
        .appending(&events(2000, 2))
        .require_off_machine()
        .wait()
        .unwrap();
    let head = second.head();
    assert_eq!(p, head);
    assert_eq!(
        restores_whole(&second, &dir.path().join("whole"), &url, &opts),
        50 + 10 + 30 + 1
    );
    second.close().unwrap();
}

/// Goal: a server of a PostgreSQL store whose lease another server took over (as after a
/// pause longer than the lease) stands by instead of stopping: its D4 appends are still
/// answered once in object storage, and it ships again once that other lease lapses.
#[test]
fn a_server_whose_lease_was_taken_stands_by_and_ships_again() {
    let Some(s3) = annals_testkit::s3::S3Server::start() else {
        return;
    };
    let Some(cluster) = annals_testkit::Cluster::start() else {
        return;
    };
    let mut opts = options(&s3.url("taken"));
    opts.durability = Durability::Synced;
    let backup = opts.backup.as_mut().unwrap();
    backup.lease = Duration::from_secs(1);
    for (k, v) in s3.env() {
        backup.settings.push((k.to_string(), v));
    }
    let store = Store::open_postgres(&cluster.url(), opts.clone()).unwrap();
    fill(&store, 30);
    assert_eq!(store.stats().backup.unwrap().state, "shipping");
    // Another holder takes the lease over, as a server would after this one paused.
    let backup = opts.backup.as_ref().unwrap();
    let objects = annals::objects::Objects::open_with(&backup.url, &backup.settings).unwrap();
    let lease = annals::archive::Lease {
        host: "elsewhere".into(),
        dir: "/elsewhere".into(),
        pid: 1,
        holder: "1-1".into(),
        renewed_at_us: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64,
        ttl_s: 3,
    };
    let bytes = serde_json::to_vec(&lease).unwrap();
    let (_, version) = objects.get(annals::archive::LEASE).unwrap().unwrap();
    objects
        .put_over(annals::archive::LEASE, bytes.into(), version)
        .unwrap();
    eventually("the server stands by", WAIT, || {
        store.stats().backup.unwrap().state == "standby"
    });
    // Nobody ships while the other lease holds: a D4 append waits, and is answered once this
    // server has taken the lease back (the other holder never renews) and shipped it.
    let p = store
        .appending(&events(5000, 1))
        .require_off_machine()
        .wait()
        .unwrap();
    let stats = store.stats().backup.unwrap();
    assert_eq!(stats.state, "shipping", "{stats:?}");
    assert!(stats.shipped_through >= p, "{stats:?}");
    fill(&store, 10);
    let head = store.head();
    store.close().unwrap();
    let from = opts.backup.clone().unwrap();
    assert_eq!(verify_backup(&from, &mut |_, _| {}).unwrap().head, head);
}
