//! The commit path's routes (docs/ARCHITECTURE.md, "The commit path"): callers staging during a
//! sync, large appends staged at once, a lone blocking caller committing alone, async callers
//! never doing so, and waiting callers counted.
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use annals::sim::{FaultKind, SimIo};
use annals::{
    AppendCondition, AppendError, AppendOptions, NewEvent, Options, Query, ReadOptions, Store,
    StoreError,
};
use annals_testkit::eventually;
use common::api::*;
use common::harness::{small_options, DIR};
use common::read_all;

/// Goal: `Stats::waiting` counts callers until their outcome is in, whether they polled for it or
/// slept, blocked or awaited, succeeded or failed, and an async append dropped while waiting stops
/// counting.
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
    eventually("the first sync", WAIT, || io.syncs_waiting() == 1);
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
                eventually("a staged append", WAIT, || {
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
    eventually("the pair's sync", WAIT, || io.syncs_waiting() == 1);
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
    assert_eq!(routes(&store), taken(&[("held", 1), ("staged", 10)]));
}

/// The routes the store's appends took (`Stats::commits`), those taken at least once.
fn routes(store: &Store) -> Vec<(String, u64)> {
    let commits = store.stats().commits;
    assert!(
        commits.len() >= 6,
        "every route is listed, taken or not: {commits:?}"
    );
    commits.into_iter().filter(|(_, n)| *n > 0).collect()
}

fn taken(routes: &[(&str, u64)]) -> Vec<(String, u64)> {
    routes.iter().map(|(r, n)| (r.to_string(), *n)).collect()
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
    eventually("the first sync", WAIT, || io.syncs_waiting() == 1);
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
    eventually("the first sync", WAIT, || io.syncs_waiting() == 1);
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
    eventually("the first sync", WAIT, || io.syncs_waiting() == 1);
    assert_eq!(store.stats().groups, 1);
    let written = store.stats().bytes_written;
    let second = append_large("b");
    eventually("the second append staged", WAIT, || {
        store.stats().groups == 2
    });
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
    eventually("the lone caller's sync", WAIT, || io.syncs_waiting() == 1);
    let syncing = io.threads_in_sync();
    assert_eq!(syncing.len(), 1);
    assert_eq!(store.stats().caller_commits, 1);
    // Another caller while that sync runs: queued, taken by the writer, held for the sync.
    let second = append(2);
    eventually("the second caller waiting", WAIT, || {
        store.stats().waiting == 2
    });
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
    eventually("no caller waiting", WAIT, || store.stats().waiting == 0);
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
    // Each append counted on its route: two callers alone; one held for their sync, and the
    // callback's and the async caller's taken from the queue by the writer, or staged by
    // their callers when they arrive while the writer thread still runs the sync before.
    let commits = store.stats().commits;
    assert_eq!(commits["alone"], 2);
    assert_eq!(commits["held"] + commits["staged"], 3, "{commits:?}");
    assert_eq!(commits.values().sum::<u64>(), 5, "{commits:?}");
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
    // Taken from the queue by the writer thread, or staged by the caller when it arrives while
    // the writer thread still runs the sync before; never alone.
    let commits = store.stats().commits;
    assert_eq!(commits["held"] + commits["staged"], 3, "{commits:?}");
    assert_eq!(commits.values().sum::<u64>(), 3, "{commits:?}");
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
    eventually("the lone caller's sync", WAIT, || io.syncs_waiting() == 1);
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
    eventually("the async caller waiting", WAIT, || {
        store.stats().waiting == 2
    });
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
