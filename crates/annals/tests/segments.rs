//! Segments and buffers: rolling and preparing the next segment, preallocation, reused batch
//! buffers, the bound on unsynced bytes.
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use annals::sim::SimIo;
use annals::{Durability, Limits, NewEvent, Options, Preallocation, Query, ReadOptions, Store};
use annals_testkit::eventually;
use common::api::*;
use common::harness::{small_options, DIR};
use common::read_all;

/// Goal: once a segment has filled, its successor's successor is prepared at once, so that a
/// fast writer never waits for zeros at the next roll; the segment the store opened with
/// waits until it is half used. Method: 8 KiB segments; one small append (no preparation
/// yet), then appends until segment 2 is in use, then no more appends: segment 3's file must
/// appear while segment 2 holds one record.
#[test]
fn a_roll_prepares_the_next_segment_at_once() {
    let io = SimIo::new(41);
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap();
    let segments = || {
        io.file_names(Path::new(DIR))
            .into_iter()
            .filter(|n| n.ends_with(".seg"))
            .count()
    };
    append_numbered(&store, 0..1, |_| "t".into());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        segments(),
        1,
        "a barely used first segment prepares nothing"
    );
    let mut i = 1;
    while store.stats().segments < 2 {
        append_numbered(&store, i..i + 1, |_| "t".into());
        i += 1;
    }
    eventually(
        "segment 3 to be prepared after the roll into segment 2",
        Duration::from_secs(10),
        || segments() >= 3,
    );
    assert_eq!(store.stats().segments, 2, "still writing segment 2");
}

/// Goal: the buffer of an appended batch is reused by the next `batch_with_capacity` and
/// carries nothing of the batch before it. Method: a 100-event batch (about 10 KiB, worth
/// keeping), then a batch of one event from the same store; the log must hold exactly the
/// 101 events written, each with its own type, tag and data.
#[test]
fn a_reused_batch_buffer_starts_empty() {
    let store = Store::open_in_memory(Options::default()).unwrap();
    let mut first = store.batch_with_capacity(16 << 10);
    for i in 0..100u64 {
        let mut event = first.event("Big").unwrap();
        event.tag_number("n:", i).unwrap();
        event.finish(&[b'x'; 80]).unwrap();
    }
    store.appending_batch(first).wait().unwrap();
    for round in 0..3u64 {
        let mut next = store.batch_with_capacity(1 << 10);
        assert!(next.is_empty() && next.encoded_bytes() == store.batch().encoded_bytes());
        let mut event = next.event("Small").unwrap();
        event.tag_number("round:", round).unwrap();
        event.finish(b"small").unwrap();
        assert_eq!(store.appending_batch(next).wait().unwrap(), 101 + round);
    }
    let events = read_all(&store, &Query::all(), ReadOptions::default()).unwrap();
    assert_eq!(events.len(), 103);
    for (i, e) in events.iter().enumerate() {
        let tags: Vec<&str> = e.tags().collect();
        if i < 100 {
            assert_eq!((e.event_type(), e.data()), ("Big", &[b'x'; 80][..]));
            assert_eq!(tags, [format!("n:{i}")]);
        } else {
            assert_eq!((e.event_type(), e.data()), ("Small", &b"small"[..]));
            assert_eq!(tags, [format!("round:{}", i - 100)]);
        }
    }
}

/// Goal: `Preallocation::Adaptive` fallocates a new segment once the log's fdatasyncs cover
/// 256 KiB or more each and zero-fills it while they cover less (and for a store's first
/// segment); `Zeros` and `Fallocate` do as they say; a log over both kinds of segment reads
/// back whole after a reopen.
#[test]
fn adaptive_preallocation_follows_the_bytes_per_fdatasync() {
    const SEGMENT: u64 = 1 << 20;
    let zeros_per_segment = SEGMENT - 64;
    let options = |preallocation| Options {
        preallocation,
        segment_bytes: SEGMENT,
        limits: Limits {
            append_bytes_max: 512 << 10,
            event_bytes_max: 64 << 10,
            ..Limits::default()
        },
        ..Options::default()
    };
    // Seven events of 60 KiB: one append of 420 KiB, two to a segment, each synced alone (a
    // lone caller), and a third fdatasync as the segment ends: 280 KiB per fdatasync.
    let big = || -> Vec<NewEvent> {
        (0..7)
            .map(|i| NewEvent::new("Big", vec![b'x'; 60 << 10]).tag(format!("b{i}")))
            .collect()
    };
    let small = || NewEvent::new("Small", vec![b'y'; 1000]).tag("s");

    let io = SimIo::new(5);
    let open = |io: &SimIo, preallocation| {
        Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options(preallocation)).unwrap()
    };
    let store = open(&io, Preallocation::Adaptive);
    assert_eq!(
        store.stats().zero_fill_bytes,
        zeros_per_segment,
        "first segment: zeros"
    );
    assert_eq!(io.allocations(), 0);
    for _ in 0..12 {
        store.append(&big(), None).unwrap();
    }
    let stats = store.stats();
    assert!(
        stats.segments_created >= 4,
        "{} segments",
        stats.segments_created
    );
    assert_eq!(
        stats.zero_fill_bytes, zeros_per_segment,
        "large fdatasyncs: every later segment fallocated"
    );
    assert!(io.allocations() >= stats.segments_created - 1);
    let zeros_before = stats.zero_fill_bytes;
    for _ in 0..4000 {
        store.append(&[small()], None).unwrap();
    }
    let stats = store.stats();
    assert!(
        stats.zero_fill_bytes >= zeros_before + 2 * zeros_per_segment,
        "small fdatasyncs bring zeros back: {} of {} segments zero-filled",
        stats.zero_fill_bytes / zeros_per_segment,
        stats.segments_created
    );
    drop(store);
    let store = open(&io, Preallocation::Adaptive);
    let events = read_all(&store, &Query::all(), ReadOptions::forwards()).unwrap();
    assert_eq!(events.len(), 12 * 7 + 4000);
    assert!(events[..84].iter().all(|e| e.data().len() == 60 << 10));
    assert!(events[84..].iter().all(|e| e.data().len() == 1000));

    for (preallocation, zero_filled) in [
        (Preallocation::Zeros, true),
        (Preallocation::Fallocate, false),
    ] {
        let io = SimIo::new(6);
        let store = open(&io, preallocation);
        for _ in 0..12 {
            store.append(&big(), None).unwrap();
        }
        let stats = store.stats();
        assert!(stats.segments_created >= 4);
        if zero_filled {
            assert_eq!(
                stats.zero_fill_bytes,
                stats.segments_created * zeros_per_segment
            );
            assert_eq!(io.allocations(), 0);
        } else {
            assert_eq!(stats.zero_fill_bytes, 0);
            assert!(io.allocations() >= stats.segments_created);
        }
    }
}

/// Goal: a D1 store, in which no append asks for a sync, never leaves its writer waiting for
/// one: past half the unsynced-bytes bound the syncer syncs by itself. (Before, the writer
/// waited beyond the bound for a sync nobody would run, and appends stopped for good.)
#[test]
fn a_written_store_keeps_appending_past_the_unsynced_bound() {
    let options = Options {
        durability: Durability::Written,
        unsynced_bytes_max: 64 << 10,
        ..small_options()
    };
    let store = Arc::new(sim_store(options));
    let (done, finished) = std::sync::mpsc::channel();
    {
        let store = store.clone();
        std::thread::spawn(move || {
            for i in 0..2_000u64 {
                let event = NewEvent::new("E", vec![b'x'; 400]).tag(format!("t{}", i % 7));
                store.append(&[event], None).unwrap();
            }
            done.send(()).unwrap();
        });
    }
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("800 KB appended in D1 within a minute");
    assert_eq!(store.head(), 2_000);
    assert!(
        store.stats().fsyncs > 0,
        "the syncer kept the backlog bounded"
    );
}

/// Goal: a file system without room for the next segment is a state the store lives through:
/// the appends that need the segment are refused with `DiskFull`, nothing is poisoned, reads
/// and subscriptions go on, appends resume by themselves once there is room, and every
/// acknowledged append is there after a reopen. Method: 8 KiB segments on a simulated file
/// system that holds 40 KiB; appends until refused; then the file system grown. Twice: on a
/// file system that tells how much room is left (the store does not begin a segment that
/// cannot fit), and on one that does not (the store begins it, meets ENOSPC while filling it
/// with zeros, and removes it).
#[test]
fn a_full_disk_refuses_appends_cleanly_and_resumes() {
    for tells in [true, false] {
        full_disk_round(tells);
    }
}

fn full_disk_round(tells: bool) {
    use annals::AppendError;
    let io = SimIo::new(43);
    io.set_capacity(Some(40 << 10));
    io.tell_available(tells);
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap();
    let subscription = store.subscribe(&Query::all(), 0).unwrap();
    let event = |i: u64| NewEvent::new("Filled", format!("{i:0>200}").into_bytes()).tag("fill");
    let mut acknowledged = 0u64;
    let refusal = loop {
        match store.append(&[event(acknowledged)], None) {
            Ok(position) => {
                acknowledged += 1;
                assert_eq!(position, acknowledged);
            }
            Err(e) => break e,
        }
        assert!(acknowledged < 10_000, "the file system never filled");
    };
    assert!(
        matches!(refusal, AppendError::DiskFull { .. }),
        "{refusal:?}"
    );
    let stats = store.stats();
    assert!(stats.poisoned.is_none(), "a full disk poisons nothing");
    assert!(stats.disk_full.is_some());
    if tells {
        // A segment (8 KiB) and the reserve (one segment) no longer fit; the reserve was kept.
        let free = stats.disk_free_bytes.unwrap();
        assert!((6 << 10..16 << 10).contains(&free), "{free} bytes free");
    } else {
        assert!(
            stats
                .disk_full
                .as_deref()
                .unwrap()
                .contains("No space left"),
            "{:?}",
            stats.disk_full
        );
    }
    assert!(acknowledged > 20, "only {acknowledged} appends fit");
    // Refused again, at once, with nothing written; reads and the subscription go on.
    for _ in 0..3 {
        assert!(matches!(
            store.append(&[event(0)], None),
            Err(AppendError::DiskFull { .. })
        ));
    }
    assert_eq!(store.head(), acknowledged);
    let read = read_all(&store, &Query::all(), ReadOptions::forwards()).unwrap();
    assert_eq!(read.len() as u64, acknowledged);
    let mut subscription = subscription;
    for position in 1..=acknowledged {
        let seen = subscription.next().unwrap().unwrap();
        assert_eq!(seen.position(), position);
    }
    // No segment file was left begun.
    let segments = io
        .file_names(Path::new(DIR))
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .count();
    assert_eq!(segments, store.stats().segments);

    // Killed while full: the store opens on the still full disk, serves every acknowledged
    // append, and refuses appends until there is room.
    drop(subscription);
    let io = io.crash(annals::sim::CrashMode::DropUnsynced);
    drop(store);
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap();
    assert_eq!(store.head(), acknowledged);
    let read = read_all(&store, &Query::all(), ReadOptions::forwards()).unwrap();
    assert_eq!(read.len() as u64, acknowledged);
    let mut refused = 0;
    while refused == 0 {
        match store.append(&[event(acknowledged)], None) {
            Ok(position) => {
                acknowledged += 1;
                assert_eq!(position, acknowledged);
            }
            Err(AppendError::DiskFull { .. }) => refused += 1,
            Err(other) => panic!("{other}"),
        }
    }
    let mut subscription = store.subscribe(&Query::all(), acknowledged).unwrap();

    // Room again: appends resume without a reopen, and the state is left.
    io.set_capacity(None);
    let position = store.append(&[event(acknowledged)], None).unwrap();
    assert_eq!(position, acknowledged + 1);
    assert!(store.stats().disk_full.is_none());
    assert_eq!(store.stats().disk_full_refusals, 1);
    let seen = subscription.next().unwrap().unwrap();
    assert_eq!(seen.position(), position);
    drop(subscription);
    store.close().unwrap();
    let store = Store::open_with_io(Arc::new(io), Path::new(DIR), small_options()).unwrap();
    assert_eq!(store.head(), acknowledged + 1);
}
