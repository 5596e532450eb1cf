//! The embedded API's edges on files: limits on both sides, the directory lock,
//! durability classes, the writer's routes (the semantics both backends share are in
//! tests/backends.rs).
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use annals::sim::{FaultKind, SimIo};
use annals::{
    AppendCondition, AppendError, AppendOptions, Durability, InputError, Limits, NewEvent, Options,
    Preallocation, Query, QueryItem, ReadOptions, Store, StoreError,
};
use common::harness::{small_options, DIR};
use common::read_all;

fn sim_store(options: Options) -> Store {
    Store::open_with_io(Arc::new(SimIo::new(3)), Path::new(DIR), options).unwrap()
}

/// Appends one event per number in `numbers`, its data the number, with the tag `tag(number)`.
fn append_numbered(store: &Store, numbers: std::ops::Range<u64>, tag: impl Fn(u64) -> String) {
    for i in numbers {
        let event = NewEvent::new("E", format!("{i}").into_bytes()).tag(tag(i));
        store.append(&[event], None).unwrap();
    }
}

fn event() -> NewEvent {
    NewEvent::new("E", "data").tag("a")
}

/// Holds a D0 store's writer inside an append's callback (in D0 the writer runs callbacks
/// itself) until the returned sender sends or is dropped; returns once the writer is held.
fn hold_writer(store: &Store) -> std::sync::mpsc::Sender<()> {
    let (release, hold) = std::sync::mpsc::channel::<()>();
    let (entered, in_callback) = std::sync::mpsc::channel::<()>();
    store
        .append_then(&[event()], None, AppendOptions::default(), move |_| {
            let _ = entered.send(());
            let _ = hold.recv();
        })
        .unwrap();
    in_callback.recv().unwrap();
    release
}

/// Appends `events` through a callback, so that the writer thread commits them (a blocking
/// caller alone on an idle store would commit on its own thread); the receiver gets the outcome.
fn append_via_writer(
    store: &Store,
    events: &[NewEvent],
) -> std::sync::mpsc::Receiver<Result<u64, AppendError>> {
    let (sender, receiver) = std::sync::mpsc::channel();
    store
        .append_then(events, None, AppendOptions::default(), move |outcome| {
            let _ = sender.send(outcome);
        })
        .unwrap();
    receiver
}

/// A D3 store with 1 MiB segments on a simulated disk, returned with the disk so that a test
/// can hold its syncs.
fn store_on_held_disk(seed: u64) -> (SimIo, Arc<Store>) {
    let io = SimIo::new(seed);
    let options = Options {
        segment_bytes: 1 << 20,
        ..small_options()
    };
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options).unwrap();
    (io, Arc::new(store))
}

fn rejects(store: &Store, events: &[NewEvent], check: impl Fn(&InputError) -> bool) {
    let head = store.head();
    match store.append(events, None) {
        Err(AppendError::Input(e)) => assert!(check(&e), "unexpected error {e}"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(store.head(), head, "a rejected append changed the store");
}

/// Goal: each append limit accepts exactly its maximum and rejects one more, with a typed error
/// and no change to the store.
#[test]
fn append_limits_on_both_sides() {
    let limits = Limits {
        event_bytes_max: 100,
        events_per_append_max: 5,
        append_bytes_max: 1024,
        tags_per_event_max: 3,
        tag_bytes_max: 10,
        type_bytes_max: 8,
        ..Limits::default()
    };
    let store = sim_store(Options {
        limits,
        ..small_options()
    });
    // Event size: data plus metadata.
    store
        .append(
            &[NewEvent::new("E", vec![1u8; 60]).metadata(vec![2u8; 40])],
            None,
        )
        .unwrap();
    rejects(
        &store,
        &[NewEvent::new("E", vec![1u8; 61]).metadata(vec![2u8; 40])],
        |e| {
            matches!(
                e,
                InputError::EventTooLarge {
                    bytes: 101,
                    max: 100,
                    ..
                }
            )
        },
    );
    // Events per append.
    store.append(&vec![event(); 5], None).unwrap();
    rejects(&store, &vec![event(); 6], |e| {
        matches!(e, InputError::TooManyEvents { count: 6, max: 5 })
    });
    rejects(&store, &[], |e| matches!(e, InputError::NoEvents));
    // Tags per event, tag length, duplicates, empty and control characters.
    store
        .append(&[NewEvent::new("E", "").tags(["a", "b", "c"])], None)
        .unwrap();
    rejects(
        &store,
        &[NewEvent::new("E", "").tags(["a", "b", "c", "d"])],
        |e| {
            matches!(
                e,
                InputError::TooManyTags {
                    count: 4,
                    max: 3,
                    ..
                }
            )
        },
    );
    store
        .append(&[NewEvent::new("E", "").tag("0123456789")], None)
        .unwrap();
    rejects(&store, &[NewEvent::new("E", "").tag("0123456789x")], |e| {
        matches!(
            e,
            InputError::TagTooLong {
                bytes: 11,
                max: 10,
                ..
            }
        )
    });
    rejects(&store, &[NewEvent::new("E", "").tags(["a", "a"])], |e| {
        matches!(e, InputError::DuplicateTag { .. })
    });
    rejects(&store, &[NewEvent::new("E", "").tag("")], |e| {
        matches!(e, InputError::EmptyTag { .. })
    });
    rejects(&store, &[NewEvent::new("E", "").tag("a\nb")], |e| {
        matches!(e, InputError::ControlCharacter { .. })
    });
    // Type length and emptiness.
    store
        .append(&[NewEvent::new("12345678", "")], None)
        .unwrap();
    rejects(&store, &[NewEvent::new("123456789", "")], |e| {
        matches!(e, InputError::TypeTooLong { bytes: 9, .. })
    });
    rejects(&store, &[NewEvent::new("", "")], |e| {
        matches!(e, InputError::EmptyType { .. })
    });
    // Encoded append size: five events of 100 bytes fit in 1024, with the headers; a sixth
    // kind of overflow comes from bigger events.
    store
        .append(&vec![NewEvent::new("E", vec![0u8; 100]); 5], None)
        .unwrap();
    let limits = Limits {
        append_bytes_max: 600,
        events_per_append_max: 10,
        ..store.options().limits.clone()
    };
    let small = sim_store(Options {
        limits,
        ..small_options()
    });
    small
        .append(&vec![NewEvent::new("E", vec![0u8; 100]); 4], None)
        .unwrap();
    rejects(&small, &vec![NewEvent::new("E", vec![0u8; 100]); 5], |e| {
        matches!(e, InputError::AppendTooLarge { .. })
    });
}

/// Goal: query limits (items, values per item, tag validity) are enforced for reads and
/// conditions alike.
#[test]
fn query_limits_on_both_sides() {
    let limits = Limits {
        query_items_max: 2,
        query_item_values_max: 2,
        ..small_options().limits
    };
    let store = sim_store(Options {
        limits,
        ..small_options()
    });
    let two = Query::item(QueryItem::tags(["a", "b"])).or(QueryItem::types(["X", "Y"]));
    assert!(store.read(&two, ReadOptions::forwards()).is_ok());
    let three = two.clone().or(QueryItem::tags(["c"]));
    assert!(matches!(
        store.read(&three, ReadOptions::forwards()).err(),
        Some(annals::ReadError::Input(InputError::TooManyQueryItems {
            count: 3,
            max: 2
        }))
    ));
    let wide = Query::item(QueryItem::tags(["a", "b", "c"]));
    assert!(store.read(&wide, ReadOptions::forwards()).is_err());
    let condition = AppendCondition::new(three, None);
    assert!(matches!(
        store.append(&[event()], Some(&condition)),
        Err(AppendError::Input(_))
    ));
    assert_eq!(store.head(), 0);
    assert!(store
        .read(&Query::item(QueryItem::tags([""])), ReadOptions::forwards())
        .is_err());
    assert!(store
        .read(
            &Query::all(),
            ReadOptions {
                from: Some(1),
                after: Some(1),
                ..Default::default()
            }
        )
        .is_err());
}

/// Goal: a full queue applies backpressure: `try_append` says so with a typed error, and
/// `append` waits instead. Method: a one-slot queue held full by a writer stuck in a callback;
/// in D0 the writer itself runs callbacks (in D3 the notifier thread may), and the second append
/// is queued only once the writer is inside the callback, so the queue surely stays full.
#[test]
fn queue_depth_limit() {
    let limits = Limits {
        queue_depth_max: 1,
        ..small_options().limits
    };
    let store = Store::open_in_memory(Options {
        limits,
        ..small_options()
    })
    .unwrap();
    let release = hold_writer(&store);
    store
        .append_then(&[event()], None, AppendOptions::default(), |_| {})
        .unwrap();
    match store.try_append(&[event()], None) {
        Err(AppendError::Input(InputError::QueueFull { depth: 1 })) => {}
        other => panic!("expected QueueFull, got {other:?}"),
    }
    release.send(()).unwrap();
    assert_eq!(store.append(&[event()], None).unwrap(), 3);
}

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
        Err(StoreError::Locked { .. }) => {}
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
    assert!(store
        .append_with(
            &[event()],
            None,
            AppendOptions {
                require_synced: true,
                ..AppendOptions::default()
            }
        )
        .is_err());
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
    store
        .append_with(
            &[event()],
            None,
            AppendOptions {
                require_synced: true,
                ..AppendOptions::default()
            },
        )
        .unwrap();
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

/// Regression: a rejected append (bad input, or a full queue with `try_append`) once left an
/// "unanswered" error in the calling thread's reusable completion slot, and the thread's next,
/// valid append returned that stale error. Replies are now armed only when a request is queued
/// and disarmed if it never reaches the writer. Method: alternate rejections and appends on
/// one thread.
#[test]
fn rejected_append_leaves_no_stale_outcome() {
    let store = sim_store(small_options());
    for i in 0..20u64 {
        assert!(store.append(&[NewEvent::new("", "")], None).is_err());
        assert_eq!(store.append(&[event()], None).unwrap(), i + 1);
    }
}

/// Regression: a store opened from its checkpoint and closed without new appends wrote a
/// checkpoint whose "last record" offset was 0, so the next open judged it stale and rebuilt
/// the whole index. Method: open, append, close; then open and close twice more without
/// appending; every open must use the checkpoint.
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
    std::thread::sleep(std::time::Duration::from_millis(50));
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while segments() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "segment 3 was not prepared after the roll into segment 2"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
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
    store.append_batch(first, None).unwrap();
    for round in 0..3u64 {
        let mut next = store.batch_with_capacity(1 << 10);
        assert!(next.is_empty() && next.encoded_bytes() == store.batch().encoded_bytes());
        let mut event = next.event("Small").unwrap();
        event.tag_number("round:", round).unwrap();
        event.finish(b"small").unwrap();
        assert_eq!(store.append_batch(next, None).unwrap(), 101 + round);
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

/// `Stats::waiting` counts callers until their outcome is in, whether they polled for it or
/// slept, blocked or awaited, succeeded or failed, and an async append dropped while waiting
/// stops counting.
#[test]
fn waiting_callers_are_counted_until_their_outcome_is_in() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    store.append(&[event()], None).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(store.head(), 400);
    assert_eq!(store.stats().waiting, 0);
    // A refused append waited too.
    let refuse = AppendCondition::new(Query::all(), Some(0));
    assert!(store.append(&[event()], Some(&refuse)).is_err());
    assert_eq!(store.stats().waiting, 0);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        for _ in 0..20 {
            store
                .append_async(&[event()], None, AppendOptions::default())
                .await
                .unwrap();
        }
        // Polled once, then dropped while its append is in flight.
        let events = [event()];
        let mut pending = Box::pin(store.append_async(&events, None, AppendOptions::default()));
        let _ = futures_poll_once(pending.as_mut());
        drop(pending);
    });
    assert_eq!(store.stats().waiting, 0);
    store.append(&[event()], None).unwrap();
    assert_eq!(store.head(), 422);

    // A caller that has stopped polling and sleeps still counts: hold the writer in a callback
    // (in D0 the writer runs callbacks itself) while another thread's append waits behind it.
    let store = Arc::new(Store::open_in_memory(small_options()).unwrap());
    let release = hold_writer(&store);
    let blocked = {
        let store = store.clone();
        std::thread::spawn(move || store.append(&[event()], None).unwrap())
    };
    let started = std::time::Instant::now();
    while store.stats().waiting == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never counted");
        std::thread::yield_now();
    }
    // Well past any polling budget.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(store.stats().waiting, 1);
    release.send(()).unwrap();
    assert_eq!(blocked.join().unwrap(), 2);
    assert_eq!(store.stats().waiting, 0);
}

/// Polls a future once with a waker that does nothing.
fn futures_poll_once<F: std::future::Future>(future: std::pin::Pin<&mut F>) -> bool {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    future.poll(&mut cx).is_ready()
}

/// Polls `done` every millisecond for up to ten seconds.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Goal: in D3 small appends that arrive while the writer thread syncs a group are staged by
/// their callers meanwhile (checked, copied into the next group, indexed), but neither written
/// nor acknowledged before that sync ends; then the writer thread writes them as one group and
/// syncs it at once, and what arrives during that sync goes the same way. Method: syncs held on
/// a simulated disk; the store's counters of groups, caller stages, bytes written and queue
/// depth at each step. A writer that stages each arrival as its own group, or writes it while
/// the sync runs, or leaves it queued for the writer thread, fails.
#[test]
fn appends_arriving_during_a_sync_are_staged_meanwhile_and_go_as_one_group() {
    let (io, store) = store_on_held_disk(5);
    let append = |n: u64| {
        let store = store.clone();
        std::thread::spawn(move || {
            let event = NewEvent::new("E", format!("{n}").into_bytes()).tag("a");
            store.append(&[event], None).unwrap()
        })
    };
    io.hold_syncs();
    // A lone append handed to the writer (a blocking caller alone would commit it on its own
    // thread): the writer syncs it itself, and stops in that sync.
    let first = append_via_writer(&store, &[NewEvent::new("E", b"0".to_vec()).tag("a")]);
    wait_until("the first sync", || io.syncs_waiting() == 1);
    let written = store.stats().bytes_written;
    // Two arrive meanwhile: their callers stage them, nothing is queued or written. They are
    // started one after the other: two callers racing for the writer at the same instant may
    // leave one queued for the writer thread (which then takes it into the same group), a
    // legitimate outcome this test does not look at.
    let staged_one_by_one = |range: std::ops::Range<u64>| -> Vec<_> {
        range
            .map(|n| {
                let before = store.stats().caller_stages;
                let handle = append(n);
                wait_until("a staged append", || {
                    store.stats().caller_stages == before + 1
                });
                handle
            })
            .collect()
    };
    let pair = staged_one_by_one(1..3);
    assert_eq!(store.stats().caller_stages, 2);
    let stats = store.stats();
    assert_eq!(
        (stats.queue_depth, stats.groups, stats.bytes_written),
        (0, 1, written),
        "staged, not queued, not written while the sync runs"
    );
    assert!(
        pair.iter().all(|h| !h.is_finished()),
        "nothing acknowledged"
    );
    io.let_syncs_through(1);
    assert_eq!(first.recv().unwrap().unwrap(), 1);
    wait_until("the pair's sync", || io.syncs_waiting() == 1);
    let stats = store.stats();
    assert_eq!(stats.groups, 2, "the pair went as one group");
    assert!(
        stats.bytes_written > written,
        "the pair written before its sync"
    );
    // Eight arrive while the pair's sync runs: all eight are staged, none written meanwhile.
    let written = stats.bytes_written;
    let later = staged_one_by_one(3..11);
    assert_eq!(store.stats().caller_stages, 10);
    let stats = store.stats();
    assert_eq!((stats.groups, stats.bytes_written), (2, written));
    io.release_syncs();
    let mut positions: Vec<u64> = pair
        .into_iter()
        .chain(later)
        .map(|h| h.join().unwrap())
        .collect();
    positions.sort_unstable();
    assert_eq!(positions, (2..=11).collect::<Vec<_>>());
    let stats = store.stats();
    assert_eq!(stats.head, 11);
    assert_eq!(stats.groups, 3, "the eight went as one group");
    assert_eq!(stats.fsyncs, 3);
}

/// Goal: a caller that stages its append while the writer thread syncs first stages whatever
/// was queued before it, so one caller's appends keep the order it submitted them in. Method:
/// during a held sync, one thread queues a large append (large appends are never staged by
/// their caller) and then a small one; the small one's caller must stage the large one first.
#[test]
fn a_caller_staging_during_a_sync_stages_what_was_queued_before_it() {
    let (io, store) = store_on_held_disk(7);
    io.hold_syncs();
    let first = append_via_writer(&store, &[NewEvent::new("E", b"0".to_vec()).tag("a")]);
    wait_until("the first sync", || io.syncs_waiting() == 1);
    let large: Vec<NewEvent> = (0..64)
        .map(|n| NewEvent::new("L", format!("{n}").into_bytes()).tag("b"))
        .collect();
    let large = append_via_writer(&store, &large);
    assert_eq!(store.stats().queue_depth, 1, "the large append is queued");
    let small = append_via_writer(&store, &[NewEvent::new("S", b"x".to_vec()).tag("b")]);
    assert_eq!(store.stats().queue_depth, 0);
    assert_eq!(
        store.stats().caller_stages,
        2,
        "both staged by the small one's caller"
    );
    io.release_syncs();
    assert_eq!(first.recv().unwrap().unwrap(), 1);
    assert_eq!(large.recv().unwrap().unwrap(), 65);
    assert_eq!(small.recv().unwrap().unwrap(), 66);
    let types: Vec<String> = store
        .read(&Query::all(), ReadOptions::default())
        .unwrap()
        .map(|e| e.unwrap().event_type().to_owned())
        .collect();
    assert_eq!(types.len(), 66);
    assert_eq!(types[64], "L");
    assert_eq!(types[65], "S");
}

/// Goal: appends their callers staged while the writer thread synced are refused with the
/// store's poisoning when that sync fails: never acknowledged, nothing readable, and the store
/// takes nothing more until it is reopened, when none of them is there. Method: a held sync
/// of the writer thread, two small appends staged meanwhile by their callers, then the held
/// sync fails (EIO).
#[test]
fn appends_staged_during_a_failing_sync_are_refused_with_it() {
    let (io, store) = store_on_held_disk(8);
    io.hold_syncs();
    let first = append_via_writer(&store, &[NewEvent::new("E", b"0".to_vec()).tag("a")]);
    wait_until("the first sync", || io.syncs_waiting() == 1);
    let staged: Vec<_> = (0..2)
        .map(|_| append_via_writer(&store, &[NewEvent::new("S", b"x".to_vec()).tag("b")]))
        .collect();
    assert_eq!(store.stats().caller_stages, 2);
    io.fail_sync(0, FaultKind::Eio, false);
    io.release_syncs();
    assert!(first.recv().unwrap().is_err(), "its sync failed");
    for outcome in staged {
        match outcome.recv().unwrap() {
            Err(AppendError::Store(StoreError::Poisoned { .. })) => {}
            other => panic!("a staged append after a failed sync: {other:?}"),
        }
    }
    assert_eq!(store.head(), 0);
    assert!(read_all(&store, &Query::all(), ReadOptions::forwards())
        .unwrap()
        .is_empty());
    assert!(matches!(
        store.append(&[event()], None),
        Err(AppendError::Store(StoreError::Poisoned { .. }))
    ));
    drop(store);
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap();
    let types: Vec<String> = read_all(&store, &Query::all(), ReadOptions::forwards())
        .unwrap()
        .iter()
        .map(|e| e.event_type().to_owned())
        .collect();
    assert!(
        !types.iter().any(|t| t == "S"),
        "nothing staged after a failed sync is there: {types:?}"
    );
}

/// Goal: an append of many events is synced by the syncer thread, and one that arrives while
/// that sync runs is staged and written at once, not held for the sync: staging it is worth
/// overlapping with the sync. Method: syncs held on a simulated disk; a lone 64-event append
/// (from a callback, so the writer thread commits it) must leave the writer thread free while
/// its sync runs; a second arrives meanwhile and must be staged (a group more) and written to
/// the log while that sync still runs, then be acknowledged only after a sync of its own. Held
/// like a small append, or synced by the writer itself, it fails.
#[test]
fn a_large_append_arriving_during_a_sync_is_staged_at_once() {
    let (io, store) = store_on_held_disk(6);
    let append_large = |tag: &str| {
        let events: Vec<NewEvent> = (0..64)
            .map(|n| NewEvent::new("E", format!("{n}").into_bytes()).tag(tag))
            .collect();
        append_via_writer(&store, &events)
    };
    io.hold_syncs();
    let first = append_large("a");
    wait_until("the first sync", || io.syncs_waiting() == 1);
    assert_eq!(store.stats().groups, 1);
    let written = store.stats().bytes_written;
    let second = append_large("b");
    wait_until("the second append staged", || store.stats().groups == 2);
    assert!(
        store.stats().bytes_written > written,
        "written while the first sync runs"
    );
    assert_eq!(io.syncs_waiting(), 1, "the first sync still runs");
    assert!(
        first.try_recv().is_err() && second.try_recv().is_err(),
        "nothing acknowledged before its sync"
    );
    io.let_syncs_through(1);
    assert_eq!(first.recv().unwrap().unwrap(), 64);
    assert!(
        second.recv_timeout(Duration::from_millis(200)).is_err(),
        "the second append waits for a sync that covers it"
    );
    io.release_syncs();
    assert_eq!(second.recv().unwrap().unwrap(), 128);
}

/// Goal: a blocking caller that finds the store idle (no other caller waiting, nothing queued,
/// no sync running) commits its append on its own thread, its fdatasync included, without a
/// hand-over to the writer thread; an append that arrives meanwhile is queued to the writer,
/// which holds it for the running sync; callbacks and async callers never commit on their own
/// thread.
#[test]
fn a_lone_blocking_caller_commits_on_its_own_thread() {
    let io = SimIo::new(7);
    let store = Arc::new(
        Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap(),
    );
    let append = |n: u64| {
        let store = store.clone();
        std::thread::spawn(move || {
            let event = NewEvent::new("E", format!("{n}").into_bytes()).tag("a");
            let position = store.append(&[event], None).unwrap();
            (position, std::thread::current().id())
        })
    };
    io.hold_syncs();
    let lone = append(1);
    wait_until("the lone caller's sync", || io.syncs_waiting() == 1);
    let syncing = io.threads_in_sync();
    assert_eq!(syncing.len(), 1);
    assert_eq!(store.stats().caller_commits, 1);
    // Another caller while that sync runs: queued, taken by the writer, held for the sync.
    let second = append(2);
    wait_until("the second caller waiting", || store.stats().waiting == 2);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        store.stats().head,
        0,
        "nothing acknowledged before its fdatasync"
    );
    assert_eq!(
        store.stats().groups,
        1,
        "the second is not staged while the sync runs"
    );
    io.release_syncs();
    let (position, lone_thread) = lone.join().unwrap();
    assert_eq!(position, 1);
    assert_eq!(
        syncing[0], lone_thread,
        "the lone caller ran its own fdatasync"
    );
    assert_eq!(second.join().unwrap().0, 2);
    let stats = store.stats();
    assert_eq!(
        (stats.groups, stats.caller_commits, stats.fsyncs),
        (2, 1, 2)
    );

    // Idle again: the next blocking append commits on its caller's thread. (The writer thread
    // answers the second caller while it still holds the writer role, and lets go of it just
    // after; a caller arriving in between is queued, so give it that moment.)
    wait_until("no caller waiting", || store.stats().waiting == 0);
    std::thread::sleep(Duration::from_millis(50));
    store.append(&[event()], None).unwrap();
    assert_eq!(store.stats().caller_commits, 2);
    // A callback's append goes to the writer thread.
    let receiver = append_via_writer(&store, &[event()]);
    assert_eq!(receiver.recv().unwrap().unwrap(), 4);
    // An async caller leaves its append to the writer thread, like a callback.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let position = runtime
        .block_on(store.append_async(&[event()], None, AppendOptions::default()))
        .unwrap();
    assert_eq!(position, 5);
    let stats = store.stats();
    assert_eq!((stats.groups, stats.caller_commits), (5, 2));
    // A failed fdatasync on the caller's thread poisons the store as on the writer's.
    io.fail_sync(0, FaultKind::Eio, false);
    assert!(store.append(&[event()], None).is_err());
    assert_eq!(store.head(), 5);
    assert!(matches!(
        store.append(&[event()], None),
        Err(AppendError::Store(StoreError::Poisoned { .. }))
    ));
    drop(store);
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap();
    let events = read_all(&store, &Query::all(), ReadOptions::forwards()).unwrap();
    assert!(store.head() >= 5, "every acknowledged append is there");
    assert_eq!(events.len() as u64, store.head());
}

/// Goal: an async caller never commits on its runtime's thread, not even alone on an idle
/// store with fast fdatasyncs, where a blocking caller would: a server's other requests may be
/// waiting in its runtime, out of the store's sight, and a runtime thread held in fdatasync
/// delays them all (each then reached the store alone in turn, one fdatasync per append).
#[test]
fn an_async_caller_never_commits_on_its_runtimes_thread() {
    let io = SimIo::new(9);
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for expected in 1..=3 {
        let position = runtime
            .block_on(store.append_async(&[event()], None, AppendOptions::default()))
            .unwrap();
        assert_eq!(position, expected);
    }
    let stats = store.stats();
    assert_eq!((stats.groups, stats.caller_commits), (3, 0));
}

/// Goal: an async caller that finds another caller waiting does not commit on its runtime's
/// thread: it is queued to the writer thread, held for the running sync, and acknowledged
/// after the next one.
#[test]
fn an_async_caller_behind_another_goes_to_the_writer() {
    let io = SimIo::new(8);
    let store = Arc::new(
        Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap(),
    );
    io.hold_syncs();
    let lone = {
        let store = store.clone();
        std::thread::spawn(move || store.append(&[event()], None).unwrap())
    };
    wait_until("the lone caller's sync", || io.syncs_waiting() == 1);
    assert_eq!(store.stats().caller_commits, 1);
    let behind = {
        let store = store.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime
                .block_on(store.append_async(&[event()], None, AppendOptions::default()))
                .unwrap()
        })
    };
    wait_until("the async caller waiting", || store.stats().waiting == 2);
    assert_eq!(
        store.stats().head,
        0,
        "nothing acknowledged before its sync"
    );
    io.release_syncs();
    assert_eq!(lone.join().unwrap(), 1);
    assert_eq!(behind.join().unwrap(), 2);
    let stats = store.stats();
    assert_eq!(
        (stats.groups, stats.caller_commits),
        (2, 1),
        "the async append was committed by the writer thread"
    );
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
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut appended = 0;
    while store.stats().checkpoints_failed == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no failed checkpoint counted"
        );
        store.append(&[event()], None).unwrap();
        appended += 1;
    }
    assert_eq!(store.head(), appended);
    drop(store);
    std::fs::remove_dir(dir.path().join("index.checkpoint.tmp")).unwrap();
    let store = Store::open(dir.path(), options()).unwrap();
    assert_eq!(store.head(), appended);
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
