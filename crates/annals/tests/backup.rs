//! Goal: the continuous backup into object storage, on `object_store`'s local directory (the
//! tests against a real S3 server are the command line's): what a store ships restores to the
//! same log, whole, to a position or to a time; a prefix is refused to another store and to a
//! store behind it; a D4 append is acknowledged only once it is in the backup.

use std::time::Duration;

use annals::backup::{restore, verify_backup, RestoreLimit};
use annals::{
    compare, BackupOptions, Durability, InputError, Limits, NewEvent, Options, Store, StoreError,
};

fn options(url: &str) -> Options {
    let limits = Limits {
        append_bytes_max: 64 << 10,
        event_bytes_max: 16 << 10,
        ..Limits::default()
    };
    let mut backup = BackupOptions::new(url);
    backup.interval = Duration::from_millis(5);
    Options {
        limits,
        segment_bytes: 256 << 10,
        group_bytes_max: 64 << 10,
        unsynced_bytes_max: 64 << 10,
        backup: Some(backup),
        ..Options::default()
    }
}

fn plain(options: &Options) -> Options {
    Options {
        backup: None,
        ..options.clone()
    }
}

fn events(from: u64, n: u64) -> Vec<NewEvent> {
    (from..from + n)
        .map(|i| {
            NewEvent::new("Happened", format!("event {i} {}", "x".repeat(300)))
                .tag(format!("k:{}", i % 7))
        })
        .collect()
}

fn fill(store: &Store, appends: u64) {
    for i in 0..appends {
        store.append(&events(i * 3, 1 + i % 3), None).unwrap();
    }
}

/// Restores the whole backup at `url` into a new store in `into` and compares it with
/// `source`: answers the appends compared.
fn restores_whole(source: &Store, into: &std::path::Path, url: &str, opts: &Options) -> u64 {
    let head = source.head();
    let whole = Store::open(into, plain(opts)).unwrap();
    let restored = restore(
        &BackupOptions::new(url),
        &whole,
        RestoreLimit::default(),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(restored.head, head);
    let compared = compare(source, &whole, head, &mut |_| {}).unwrap();
    assert_eq!(compared, restored.appends);
    compared
}

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
        wait_for("the chunk is shipped", || {
            source.stats().backup.unwrap().lag_positions == 0
        });
    }
    // Then enough to seal it, and a little more.
    for i in 3..12 {
        source.append(&[big(i)], None).unwrap();
    }
    fill(&source, 50);
    wait_for("the backup ships everything", || {
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

/// The objects under `dir` of a backup, by name, with their sizes.
fn listed(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut found: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap())
                .map(|e| {
                    let size = e.metadata().unwrap().len();
                    (e.file_name().to_string_lossy().into_owned(), size)
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

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
        wait_for("the chunk is shipped", || {
            source.stats().backup.unwrap().lag_positions == 0
        });
    }
    wait_for(
        "two runs of 64 KiB are put again as one object each",
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
    wait_for("the backup ships everything", || {
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
        matches!(&e, StoreError::Backup(m) if m.contains("another server ships into this prefix")
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
        matches!(&e, StoreError::Backup(m) if m.contains("backs up another store")),
        "{e}"
    );

    let e = Store::open(dir.path().join("empty"), opts.clone())
        .err()
        .expect("a store behind its backup is refused");
    assert!(
        matches!(&e, StoreError::Backup(m) if m.contains("behind its backup")),
        "{e}"
    );

    let e = Store::open(dir.path().join("bad"), options("nonsense://x"))
        .err()
        .expect("a malformed URL is refused");
    assert!(
        matches!(&e, StoreError::Backup(m) if m.contains("backup URL")),
        "{e}"
    );
}

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

fn opts_d3(opts: &Options) -> Options {
    Options {
        durability: Durability::Synced,
        ..opts.clone()
    }
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

/// Flips one byte in the middle of the store's second segment file, on disk.
fn flip_a_byte(dir: &std::path::Path) {
    use std::os::unix::fs::FileExt;
    let path = dir.join(annals::files::segment(2));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let at = 100_000;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    assert_ne!(byte[0], 0, "the byte is inside a record");
    file.write_all_at(&[byte[0] ^ 0x20], at).unwrap();
}

fn all_data(store: &Store) -> Result<Vec<Vec<u8>>, annals::ReadError> {
    store
        .read(&annals::Query::all(), annals::ReadOptions::forwards())?
        .map(|e| e.map(|e| e.data().to_vec()))
        .collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn scrubbing(mut opts: Options) -> Options {
    opts.scrub = Some(annals::ScrubOptions {
        bytes_per_second: 256 << 20,
        pause: Duration::from_millis(20),
    });
    opts
}

/// Goal: a byte flipped in a sealed segment is found by the scrub and, with a backup, put
/// back online from the backup's copy: every read afterwards returns the original bytes, and
/// the stats say what was repaired.
#[test]
fn a_flipped_byte_is_found_by_the_scrub_and_repaired_from_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let opts = scrubbing(options(&url));
    let path = dir.path().join("store");
    let store = Store::open(&path, opts).unwrap();
    fill(&store, 2000);
    let original = all_data(&store).unwrap();
    wait_for("the backup ships everything", || {
        store.stats().backup.unwrap().lag_positions == 0
    });
    flip_a_byte(&path);
    wait_for("the scrub repairs the damage", || {
        store.stats().scrub.unwrap().repaired >= 1
    });
    let scrub = store.stats().scrub.unwrap();
    assert!(scrub.damaged.is_empty(), "{scrub:?}");
    assert!(
        scrub.last_repair.as_deref().unwrap().contains("segments/"),
        "{scrub:?}"
    );
    assert_eq!(all_data(&store).unwrap(), original);
    store.close().unwrap();
    assert!(annals::verify(&path).unwrap().is_clean());
}

/// Goal: without a backup the damage is reported and stays reported (never hidden), and a
/// read that crosses it fails rather than return wrong bytes.
#[test]
fn without_a_backup_the_scrub_reports_the_damage() {
    let dir = tempfile::tempdir().unwrap();
    let opts = scrubbing(plain(&options("file:///unused")));
    let path = dir.path().join("store");
    let store = Store::open(&path, opts).unwrap();
    fill(&store, 2000);
    flip_a_byte(&path);
    wait_for("the scrub finds the damage", || {
        !store.stats().scrub.unwrap().damaged.is_empty()
    });
    let scrub = store.stats().scrub.unwrap();
    assert!(scrub.damaged[0].contains("0000000002.seg"), "{scrub:?}");
    assert_eq!(scrub.repaired, 0);
    assert!(all_data(&store).is_err(), "a read across the damage fails");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        store.stats().scrub.unwrap().damaged.len(),
        1,
        "still reported"
    );
}

/// Goal: a read replica serves what the primary's backup holds, follows it as it grows (a
/// subscription on the replica sees the new events), answers the same reads, and refuses
/// appends naming the primary.
#[test]
fn a_replica_follows_the_primary_through_its_backup() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let opts = options(&url);
    let primary = Store::open(dir.path().join("primary"), opts.clone()).unwrap();
    fill(&primary, 700);
    wait_for("the backup ships everything", || {
        primary.stats().backup.unwrap().lag_positions == 0
    });
    let backup = opts.backup.clone().unwrap();
    let replica = Store::open_replica(&backup, plain(&opts)).unwrap();
    assert_eq!(replica.head(), primary.head(), "caught up at open");
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    let opened_at = replica.head();
    let mut subscription = replica.subscribe(&annals::Query::all(), opened_at).unwrap();

    // The primary goes on, across several segments; the replica follows.
    fill(&primary, 1500);
    wait_for("the backup ships everything", || {
        primary.stats().backup.unwrap().lag_positions == 0
    });
    wait_for("the replica follows", || replica.head() == primary.head());
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    let next = subscription
        .next_timeout(Some(Duration::from_secs(5)))
        .unwrap()
        .expect("the subscription sees the next event");
    assert_eq!(next.position(), opened_at + 1);
    let stats = replica.stats();
    assert_eq!(stats.backend, "replica");
    assert_eq!(stats.replica.as_ref().unwrap().head, primary.head());

    let e = replica.append(&events(1, 1), None).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(
            e,
            annals::AppendError::Input(InputError::ReadOnlyReplica { .. })
        ) && text.contains(&url)
            && text.contains("directory"),
        "{text}"
    );
    assert_eq!(replica.head(), primary.head(), "nothing was appended");
    replica.close().unwrap();
    primary.close().unwrap();
}

/// Goal: a read replica tells how far behind its backup it is, and when it cannot read it.
/// Story: a replica whose backup became unreadable said nothing: its stats read as those of a
/// backup that had stopped growing, nothing made it not ready, and what it took in was
/// counted on no commit route. Method: a primary ships to a local directory and a replica
/// follows it; the directory is swapped for a plain file while the primary goes on appending:
/// the replica's stats say failing with the reason, its lag in seconds grows, and its
/// readiness names it; swapped back, the replica follows again, catches up with the primary,
/// is ready, and has counted every append it took in on the `replicated` route.
#[test]
fn a_replica_reports_its_lag_and_a_backup_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("backup");
    let url = format!("file://{}", location.display());
    let opts = options(&url);
    let primary = Store::open(dir.path().join("primary"), opts.clone()).unwrap();
    fill(&primary, 50);
    wait_for("the backup ships everything", || {
        primary.stats().backup.unwrap().lag_positions == 0
    });
    let shipped = primary.head();
    let replica = Store::open_replica(opts.backup.as_ref().unwrap(), plain(&opts)).unwrap();
    let stats = replica.stats();
    let following = stats.replica.clone().unwrap();
    assert_eq!(following.state, "following", "{following:?}");
    assert_eq!(
        (
            following.head,
            following.backup_head,
            following.lag_positions
        ),
        (shipped, shipped, 0),
        "{following:?}"
    );
    assert!(following.last_poll_at_us > 0, "{following:?}");
    assert!(stats.unready_reasons().is_empty(), "{stats:?}");
    assert_eq!(stats.commits["replicated"], 50, "{:?}", stats.commits);
    assert_eq!(stats.durability, "replica");
    assert!(
        stats
            .durability_description
            .contains("acknowledges no appends"),
        "{}",
        stats.durability_description
    );

    // The backup becomes unreadable, to the primary too, which goes on appending.
    let blocked = dir.path().join("blocked");
    std::fs::write(&blocked, "not a backup").unwrap();
    annals_testkit::exchange(&location, &blocked);
    fill(&primary, 20);
    wait_for("the replica fails", || {
        replica.stats().replica.unwrap().state == "failing"
    });
    let lag = replica.stats().replica.unwrap().lag_seconds;
    wait_for("its lag grows", || {
        replica.stats().replica.unwrap().lag_seconds > lag + 0.5
    });
    let stats = replica.stats();
    let failing = stats.replica.clone().unwrap();
    assert!(
        failing.failures > 0
            && failing
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains(&url))
            && failing.last_poll_age_seconds > 0.5,
        "{failing:?}"
    );
    assert_eq!(replica.head(), shipped, "nothing new could be read");
    let reasons = stats.unready_reasons();
    assert!(
        reasons.len() == 1 && reasons[0].starts_with("replica_failing:"),
        "{reasons:?}"
    );

    // The backup is back: the primary ships what it held, the replica takes it in.
    annals_testkit::exchange(&location, &blocked);
    wait_for("the backup ships everything", || {
        primary.stats().backup.unwrap().lag_positions == 0
    });
    wait_for("the replica catches up", || {
        let r = replica.stats().replica.unwrap();
        r.head == primary.head() && r.backup_head == r.head && r.state == "following"
    });
    let stats = replica.stats();
    let caught_up = stats.replica.clone().unwrap();
    assert_eq!(caught_up.lag_positions, 0, "{caught_up:?}");
    assert!(caught_up.last_error.is_none(), "{caught_up:?}");
    assert!(stats.unready_reasons().is_empty(), "{stats:?}");
    assert_eq!(stats.commits["replicated"], 70, "{:?}", stats.commits);
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    replica.close().unwrap();
    primary.close().unwrap();
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
    wait_for("the backup ships everything", || {
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

/// Goal: a read replica of a primary with data subjects reads their events (keys taken from
/// the backup, followed as the primary makes more), sees an erasure on the primary, and
/// refuses erasures itself; without the master key it is refused at open.
#[test]
fn a_replica_follows_the_subjects_keys_and_erasures() {
    use annals::{MasterKey, SubjectOptions};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let master = MasterKey::generate().unwrap();
    let mut opts = options(&url);
    opts.subjects = Some(SubjectOptions::new(["customer:"], master));
    let primary = Store::open(dir.path().join("primary"), opts.clone()).unwrap();
    let moved =
        |i: u64| NewEvent::new("Moved", format!("address {i}")).tag(format!("customer:{i}"));
    for i in 0..20 {
        primary.append(&[moved(i)], None).unwrap();
    }
    let shipped = |primary: &Store| {
        wait_for("the backup ships everything", || {
            primary.stats().backup.unwrap().lag_positions == 0
        })
    };
    shipped(&primary);
    let backup = opts.backup.clone().unwrap();
    let e = Store::open_replica(&backup, plain(&options(&url)))
        .err()
        .unwrap();
    assert!(e.to_string().contains("master key"), "{e}");
    let replica = Store::open_replica(&backup, plain(&opts)).unwrap();
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());

    // New subjects on the primary: their keys follow their events.
    for i in 20..40 {
        primary.append(&[moved(i)], None).unwrap();
    }
    primary.erase_subject("customer:3").unwrap();
    shipped(&primary);
    wait_for("the replica follows", || replica.head() == primary.head());
    let read = |store: &Store| -> Vec<(bool, Vec<u8>)> {
        store
            .read(&annals::Query::all(), annals::ReadOptions::forwards())
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.is_erased(), e.data().to_vec()))
            .collect()
    };
    assert_eq!(read(&replica), read(&primary));
    assert!(read(&replica)[3].0, "the erasure holds on the replica");
    assert_eq!(read(&replica)[30].1, b"address 30");
    let e = replica.erase_subject("customer:5").unwrap_err();
    assert!(
        matches!(
            e,
            annals::AppendError::Input(InputError::ReadOnlyReplica { .. })
        ),
        "{e}"
    );
    replica.close().unwrap();
    primary.close().unwrap();
}

/// Goal: a replica whose copy is kept (`Options::mirror`) takes in, after a clean close, only
/// what the backup holds beyond the copy; a copy left by a replica that did not close (no
/// record of a clean close), or one whose last append the backup does not hold (another
/// store's backup), is filled again from the backup; either way it serves the primary's log.
#[test]
fn a_kept_replica_copy_resumes_after_a_clean_close_and_is_refilled_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let opts = options(&url);
    let primary = Store::open(dir.path().join("primary"), opts.clone()).unwrap();
    fill(&primary, 1500);
    let shipped = |primary: &Store| {
        wait_for("the backup ships everything", || {
            primary.stats().backup.unwrap().lag_positions == 0
        })
    };
    shipped(&primary);
    let backup = opts.backup.clone().unwrap();
    let kept = dir.path().join("copy");
    let replica_options = Options {
        mirror: Some(kept.clone()),
        ..plain(&opts)
    };
    let replica = Store::open_replica(&backup, replica_options.clone()).unwrap();
    let report = replica.open_report().mirror.clone().unwrap();
    assert_eq!(report.resumed_at, None);
    assert!(report.rebuilt.unwrap().contains("none was kept"));
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    let objects_first = replica.stats().replica.unwrap().objects_read;
    assert!(objects_first > 1, "filled from {objects_first} objects");
    let closed_at = replica.head();
    replica.close().unwrap();

    // Reopened after a clean close: the copy is used; what the primary shipped since is
    // taken in.
    fill(&primary, 5);
    shipped(&primary);
    let replica = Store::open_replica(&backup, replica_options.clone()).unwrap();
    let report = replica.open_report().mirror.clone().unwrap();
    assert_eq!(report.resumed_at, Some(closed_at), "{report:?}");
    assert_eq!(replica.head(), primary.head());
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    let objects = replica.stats().replica.unwrap().objects_read;
    assert!(
        objects < objects_first,
        "{objects} objects read after a clean close, {objects_first} to fill"
    );
    // One replica per copy: a second is refused while the first holds it.
    let second = Store::open_replica(&backup, replica_options.clone());
    assert!(
        matches!(second, Err(StoreError::Locked { .. })),
        "{:?}",
        second.err()
    );
    replica.close().unwrap();
    let other_kept = dir.path().join("copy-2");
    let other_options = Options {
        mirror: Some(other_kept.clone()),
        ..replica_options.clone()
    };
    let replica = Store::open_replica(&backup, other_options.clone()).unwrap();
    replica.close().unwrap();
    // Its segments cut short as a crash would leave them and the record of its close gone:
    // filled again.
    std::fs::remove_file(other_kept.join("closed")).unwrap();
    let replica = Store::open_replica(&backup, other_options.clone()).unwrap();
    let report = replica.open_report().mirror.clone().unwrap();
    assert_eq!(report.resumed_at, None);
    assert!(
        report
            .rebuilt
            .as_deref()
            .unwrap()
            .contains("not closed cleanly"),
        "{report:?}"
    );
    assert_eq!(all_data(&replica).unwrap(), all_data(&primary).unwrap());
    replica.close().unwrap();

    // Another store's backup at another prefix, followed with this copy: the backup does not
    // hold the copy's last append, so the copy is filled from it again.
    let other_url = format!("file://{}/backup-other", dir.path().display());
    let other_opts = options(&other_url);
    let other = Store::open(dir.path().join("other"), other_opts.clone()).unwrap();
    fill(&other, 50);
    shipped(&other);
    let other_backup = other_opts.backup.clone().unwrap();
    let replica = Store::open_replica(&other_backup, other_options).unwrap();
    let report = replica.open_report().mirror.clone().unwrap();
    assert_eq!(report.resumed_at, None);
    assert!(report.rebuilt.is_some(), "{report:?}");
    assert_eq!(all_data(&replica).unwrap(), all_data(&other).unwrap());
    replica.close().unwrap();
    other.close().unwrap();
    primary.close().unwrap();
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
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while second.stats().backup.unwrap().state != "shipping" {
        assert!(
            std::time::Instant::now() < deadline,
            "the standby never took over: {:?}",
            second.stats().backup
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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

/// The names of the key objects of the backup in `dir`, failing when any object holds
/// `marker`.
fn key_objects(dir: &std::path::Path, marker: &str) -> Vec<String> {
    let mut stack = vec![dir.to_path_buf()];
    let mut files = Vec::new();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes.windows(marker.len()).any(|w| w == marker.as_bytes()),
                "{} holds the clear data",
                p.display()
            );
            if p.parent().unwrap().ends_with("keys") {
                files.push(p.file_name().unwrap().to_string_lossy().to_string());
            }
        }
    }
    files
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
    wait_for("the backup ships everything", || {
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
    wait_for("the replica follows", || replica.head() == head);
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
        matches!(
            e,
            annals::AppendError::Input(InputError::SubjectErased { .. })
        ),
        "{e}"
    );
    other.close().unwrap();
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
    wait_for("the server stands by", || {
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
