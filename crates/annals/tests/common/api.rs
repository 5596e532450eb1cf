//! Helpers of the embedded API's tests on files (limits, lifecycle, segments, commit_path).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use annals::sim::SimIo;
use annals::{AppendError, InputError, NewEvent, Options, Store};

use super::harness::{small_options, DIR};

pub fn sim_store(options: Options) -> Store {
    Store::open_with_io(Arc::new(SimIo::new(3)), Path::new(DIR), options).unwrap()
}

/// Appends one event per number in `numbers`, its data the number, with the tag `tag(number)`.
pub fn append_numbered(store: &Store, numbers: std::ops::Range<u64>, tag: impl Fn(u64) -> String) {
    for i in numbers {
        let event = NewEvent::new("E", format!("{i}").into_bytes()).tag(tag(i));
        store.append(&[event], None).unwrap();
    }
}

pub fn event() -> NewEvent {
    NewEvent::new("E", "data").tag("a")
}

/// Holds a D0 store's writer inside an append's callback (in D0 the writer runs callbacks
/// itself) until the returned sender sends or is dropped; returns once the writer is held.
pub fn hold_writer(store: &Store) -> std::sync::mpsc::Sender<()> {
    let (release, hold) = std::sync::mpsc::channel::<()>();
    let (entered, in_callback) = std::sync::mpsc::channel::<()>();
    store
        .appending(&[event()])
        .then(move |_| {
            let _ = entered.send(());
            let _ = hold.recv();
        })
        .unwrap();
    in_callback.recv().unwrap();
    release
}

/// Appends `events` through a callback, so that the writer thread commits them (a blocking
/// caller alone on an idle store would commit on its own thread); the receiver gets the outcome.
pub fn append_via_writer(
    store: &Store,
    events: &[NewEvent],
) -> std::sync::mpsc::Receiver<Result<u64, AppendError>> {
    let (sender, receiver) = std::sync::mpsc::channel();
    store
        .appending(events)
        .then(move |outcome| {
            let _ = sender.send(outcome);
        })
        .unwrap();
    receiver
}

/// A D3 store with 1 MiB segments on a simulated disk, returned with the disk so that a test
/// can hold its syncs.
pub fn store_on_held_disk(seed: u64) -> (SimIo, Arc<Store>) {
    let io = SimIo::new(seed);
    let options = Options {
        segment_bytes: 1 << 20,
        ..small_options()
    };
    let store = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options).unwrap();
    (io, Arc::new(store))
}

pub fn rejects(store: &Store, events: &[NewEvent], check: impl Fn(&InputError) -> bool) {
    let head = store.head();
    match store.append(events, None) {
        Err(AppendError::Input(e)) => assert!(check(&e), "unexpected error {e}"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(store.head(), head, "a rejected append changed the store");
}

/// Polls a future once with a waker that does nothing.
pub fn futures_poll_once<F: std::future::Future>(future: std::pin::Pin<&mut F>) -> bool {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    future.poll(&mut cx).is_ready()
}

/// How long a test waits for a state of the commit path (a sync held, a caller waiting).
pub const WAIT: Duration = Duration::from_secs(10);
