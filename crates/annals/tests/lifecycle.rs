//! A store's life on files: the directory lock, durability classes, checkpoints (periodic, at
//! close, failed, ahead of the log), the live check and rebuilds.
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use annals::sim::SimIo;
use annals::{Durability, Limits, NewEvent, Options, Query, QueryItem, ReadOptions, Store};
use annals_testkit::eventually;
use common::api::*;
use common::harness::{small_options, DIR};
use common::read_all;

/// Goal: a second open of the same directory fails with a clear error while the first is open,
/// on the real file system (flock) and on the simulated one.
#[test]
fn directory_lock() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        segment_bytes: 1 << 20,
        limits: Limits {
            append_bytes_max: 1 << 16,
            ..Limits::default()
        },
        ..Options::default()
    };
    let first = Store::open(dir.path(), options.clone()).unwrap();
    match Store::open(dir.path(), options.clone()) {
        Err(annals::OpenError::Locked { .. }) => {}
        other => panic!("expected Locked, got {:?}", other.map(|_| ())),
    }
    drop(first);
    Store::open(dir.path(), options).unwrap();
}

/// Goal: the durability class is reported, D0 keeps nothing on disk, and a D3 request in a D1
/// store is acknowledged only after a sync.
#[test]
fn durability_classes() {
    let store = Store::open_in_memory(small_options()).unwrap();
    assert_eq!(store.stats().durability, "d0");
    store.append(&[event()], None).unwrap();
    assert!(matches!(
        store.appending(&[event()]).require_synced().wait(),
        Err(annals::AppendError::Input(
            annals::InputError::SyncUnavailable
        ))
    ));
    let io = SimIo::new(4);
    let options = Options {
        durability: Durability::Written,
        ..small_options()
    };
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options.clone()).unwrap();
    assert_eq!(store.stats().durability, "d1");
    let (_, syncs_before) = io.counts();
    store.append(&[event()], None).unwrap();
    assert_eq!(io.counts().1, syncs_before, "D1 must not sync on append");
    store.appending(&[event()]).require_synced().wait().unwrap();
    assert!(
        io.counts().1 > syncs_before,
        "a D3 request must be synced before it is acknowledged"
    );
    let after = io.crash(annals::sim::CrashMode::DropUnsynced);
    drop(store);
    let store = Store::open_with_io(Arc::new(after), Path::new(DIR), options).unwrap();
    assert_eq!(
        store.head(),
        2,
        "the synced append (and the one before it) survive"
    );
}

/// Goal: background checkpoints keep a crashed store's open short: after a crash, opening scans
/// only the events after the last checkpoint. Method: interval 100, 350 appends, crash, reopen.
#[test]
fn periodic_checkpoints() {
    let io = SimIo::new(12);
    let options = Options {
        checkpoint_interval_events: 100,
        checkpoint_on_close: false,
        ..small_options()
    };
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options.clone()).unwrap();
    append_numbered(&store, 0..350, |_| "t".into());
    // Let a running background checkpoint finish, then lose everything unsynced.
    let after = {
        drop(store);
        io.crash(annals::sim::CrashMode::DropUnsynced)
    };
    let store = Store::open_with_io(Arc::new(after), Path::new(DIR), options).unwrap();
    assert_eq!(store.head(), 350);
    match &store.open_report().index {
        annals::IndexSource::Checkpoint { scanned_events } => {
            assert!(*scanned_events < 350, "scanned {scanned_events}")
        }
        other => panic!("expected a checkpoint, got {other:?}"),
    }
    common::check_index_matches_scan(&store).unwrap();
}

/// Goal: a store reopened and closed without appends keeps a checkpoint the next open uses.
/// Regression: a store opened from its checkpoint and closed without new appends wrote a checkpoint
/// whose "last record" offset was zero, so the next open judged it stale and rebuilt the whole
/// index. Method: open, append, close; then open and close again a few times without appending;
/// every open must use the checkpoint.
#[test]
fn reopening_without_appends_keeps_the_checkpoint() {
    let io = SimIo::new(21);
    let open =
        || Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap();
    let store = open();
    append_numbered(&store, 0..30, |_| "t".into());
    store.close().unwrap();
    for round in 0..3 {
        let store = open();
        assert_eq!(store.head(), 30);
        assert!(
            matches!(
                store.open_report().index,
                annals::IndexSource::Checkpoint { scanned_events: 0 }
            ),
            "round {round}: {:?}",
            store.open_report().index
        );
        store.close().unwrap();
    }
}

/// Goal: a checkpoint that claims more than the log holds (the log was cut behind its back) is
/// judged stale and the index is rebuilt from what the log does hold. Method: 40 events, close
/// (checkpoint at 40), cut the segment in the middle of the last records, reopen.
#[test]
fn checkpoint_ahead_of_the_log_is_rebuilt() {
    let io = SimIo::new(33);
    let options = small_options();
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options.clone()).unwrap();
    append_numbered(&store, 0..40, |_| "t".into());
    store.close().unwrap();
    let last_segment = io
        .file_names(Path::new(DIR))
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .max()
        .unwrap();
    let path = Path::new(DIR).join(last_segment);
    let mut bytes = io.read_file(&path).unwrap();
    let used = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    for b in &mut bytes[used - 100..] {
        *b = 0;
    }
    io.write_file(&path, &bytes);
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options).unwrap();
    assert!(store.head() < 40, "the cut records must be gone");
    assert!(
        matches!(
            store.open_report().index,
            annals::IndexSource::Rebuilt { .. }
        ),
        "{:?}",
        store.open_report().index
    );
    common::check_index_matches_scan(&store).unwrap();
}

/// Goal: `Store::check` verifies a live store (records, sequence, index against the log) while
/// appends go on, and reports every event up to the head it started from.
#[test]
fn live_check_while_appending() {
    let store = Arc::new(sim_store(small_options()));
    append_numbered(&store, 0..500, |i| format!("t:{}", i % 7));
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || append_numbered(&store, 500..1500, |i| format!("t:{}", i % 7)))
    };
    let mut calls = 0;
    let report = store.check(&mut |_, _| calls += 1).unwrap();
    assert_eq!(report.problem, None);
    assert!(report.head >= 500);
    assert_eq!(report.events, report.head);
    assert!(calls >= 1);
    writer.join().unwrap();
    let report = store.check(&mut |_, _| {}).unwrap();
    assert_eq!((report.events, report.problem), (1500, None));
}

/// Goal: a full rebuild (tags indexed on helper threads, thousands of distinct tags, short ones
/// and ones too long to be kept inline, names sharing their first and last bytes) gives the
/// index a scan gives, and every tag reads back exactly its own events.
#[test]
fn a_rebuild_with_many_tags_matches_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let tag = |i: u32| match i % 3 {
        0 => format!("t:{i}"),
        1 => format!("customer:{i:0>6}:order"),
        _ => format!("a-tag-name-longer-than-twenty-two-bytes:{i}:end"),
    };
    {
        let store = Store::open(dir.path(), Options::default()).unwrap();
        for chunk in 0..40u32 {
            let batch: Vec<NewEvent> = (0..500u32)
                .map(|k| {
                    let n = chunk * 500 + k;
                    NewEvent::new(["A", "B", "C"][(n % 3) as usize], "")
                        .tag(tag(n % 5000))
                        .tag(format!("r:{}", n % 7))
                })
                .collect();
            store.append(&batch, None).unwrap();
        }
        store.close().unwrap();
    }
    std::fs::remove_file(dir.path().join(annals::files::CHECKPOINT)).unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    assert!(matches!(
        store.open_report().index,
        annals::IndexSource::Rebuilt { .. }
    ));
    common::check_index_matches_scan(&store).unwrap();
    for i in [0u32, 1, 2, 1234, 4999] {
        let events = read_all(
            &store,
            &Query::item(QueryItem::tags([tag(i)])),
            ReadOptions::forwards(),
        )
        .unwrap();
        assert_eq!(events.len(), 4, "tag {}", tag(i));
        assert!(events.iter().all(|e| e.tags().any(|t| t == tag(i))));
        assert!(events.windows(2).all(|w| w[0].position() < w[1].position()));
    }
}

/// Goal: a background checkpoint that fails is counted and visible in the stats, and changes
/// nothing else: appends go on and the store reopens whole from its log. Method: a directory
/// standing where the checkpoint's temporary file is written, so every background checkpoint
/// fails, on the real file system; appends past the checkpoint interval; the counter is read.
#[test]
fn failed_background_checkpoints_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("index.checkpoint.tmp")).unwrap();
    let options = || Options {
        checkpoint_interval_events: 10,
        ..Options::default()
    };
    let store = Store::open(dir.path(), options()).unwrap();
    let mut appended = 0;
    eventually(
        "a failed checkpoint to be counted",
        Duration::from_secs(30),
        || {
            if store.stats().checkpoints_failed > 0 {
                return true;
            }
            store.append(&[event()], None).unwrap();
            appended += 1;
            false
        },
    );
    assert_eq!(store.head(), appended);
    drop(store);
    std::fs::remove_dir(dir.path().join("index.checkpoint.tmp")).unwrap();
    let store = Store::open(dir.path(), options()).unwrap();
    assert_eq!(store.head(), appended);
}
