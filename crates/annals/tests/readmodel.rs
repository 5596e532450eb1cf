//! Read models and reactors: catch-up and live, checkpoints, resume, rebuild, exactly-once
//! effects.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use annals::readmodel::{
    self, Folded, Reactor, ReactorRunner, ReadModel, ReadModelError, ReadModelRunner, RunnerOptions,
};
use annals::{Event, Limits, NewEvent, Options, Query, QueryItem, ReadOptions, Store};
use annals_testkit::eventually;

const WAIT: Duration = Duration::from_secs(20);

type Seats = BTreeMap<String, u64>;

fn count_seats(seats: &mut Seats, event: &Event) {
    for tag in event.tags() {
        if let Some(course) = tag.strip_prefix("course:") {
            *seats.entry(course.to_owned()).or_default() += 1;
        }
    }
}

fn seats_model(name: &str) -> Folded<Seats, fn(&mut Seats, &Event)> {
    Folded::new(
        name,
        Query::item(QueryItem::types(["StudentEnrolled"])),
        Seats::new(),
        count_seats as fn(&mut Seats, &Event),
    )
}

fn enrol(store: &Store, course: u64, student: u64) -> u64 {
    store
        .append(
            &[NewEvent::new("StudentEnrolled", "")
                .tag(format!("course:c{course}"))
                .tag(format!("student:s{student}"))],
            None,
        )
        .unwrap()
}

/// The state folded from scratch by a plain read: what any runner must end with.
fn seats_from_scratch(store: &Store) -> Seats {
    let mut seats = Seats::new();
    for event in store
        .read(
            &Query::item(QueryItem::types(["StudentEnrolled"])),
            ReadOptions::forwards(),
        )
        .unwrap()
    {
        count_seats(&mut seats, &event.unwrap());
    }
    seats
}

fn frequent() -> RunnerOptions {
    RunnerOptions {
        batch_max: 16,
        checkpoint_events: 50,
        checkpoint_interval: Duration::from_millis(10),
        ..RunnerOptions::default()
    }
}

/// Goal: a runner catches up with what is already stored, then follows live appends, skipping
/// events outside its query; status reports position, head and lag.
#[test]
fn catches_up_then_follows() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    for i in 0..100 {
        enrol(&store, i % 7, i);
        store
            .append(&[NewEvent::new("CourseRenamed", "").tag("course:c1")], None)
            .unwrap();
    }
    let runner = ReadModelRunner::start(&store, seats_model("seats"), frequent()).unwrap();
    assert!(runner.wait_for(store.head(), WAIT));
    assert_eq!(
        runner.read(|m| m.state().clone()),
        seats_from_scratch(&store)
    );
    let status = runner.status();
    assert_eq!(status.rebuilt_because.as_deref(), Some("no checkpoint"));
    assert_eq!(status.resumed_from, 0);
    assert_eq!(status.events_applied, 100);
    let before = runner.read(|m| m.state()["c3"]);
    for i in 0..50 {
        let position = enrol(&store, 3, 1000 + i);
        assert!(runner.wait_for(position, WAIT));
        assert_eq!(runner.read(|m| m.state()["c3"]), before + i + 1);
    }
    let status = runner.status();
    assert_eq!(status.position, store.head());
    assert_eq!(status.lag, 0);
    assert!(status.running);
    assert!(status.error.is_none());
    let stopped = runner.stop();
    assert!(!stopped.running);
    assert_eq!(stopped.checkpoint_position, store.head());
}

/// Goal: a restart resumes after the checkpoint, folding only what came after it, and ends in
/// the same state as a fold from scratch.
#[test]
fn restart_resumes_from_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    for i in 0..300 {
        enrol(&store, i % 11, i);
    }
    let runner = ReadModelRunner::start(&store, seats_model("seats"), frequent()).unwrap();
    assert!(runner.wait_for(300, WAIT));
    let stopped = runner.stop();
    assert_eq!(stopped.checkpoint_position, 300);
    for i in 0..40 {
        enrol(&store, 5, 500 + i);
    }
    let runner = ReadModelRunner::start(&store, seats_model("seats"), frequent()).unwrap();
    assert!(runner.wait_for(340, WAIT));
    let status = runner.status();
    assert_eq!(status.resumed_from, 300);
    assert_eq!(status.rebuilt_because, None);
    assert_eq!(
        status.events_applied, 40,
        "only what came after the checkpoint"
    );
    assert_eq!(
        runner.read(|m| m.state().clone()),
        seats_from_scratch(&store)
    );
    drop(runner);

    // Reopening the store keeps it all.
    let store = Arc::try_unwrap(store).ok().unwrap();
    store.close().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let runner = ReadModelRunner::start(&store, seats_model("seats"), frequent()).unwrap();
    assert_eq!(runner.status().resumed_from, 340);
    assert_eq!(
        runner.read(|m| m.state().clone()),
        seats_from_scratch(&store)
    );
    let listed = readmodel::list_checkpoints(dir.path()).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "seats");
    assert_eq!(listed[0].position, 340);
}

/// Goal: a checkpoint that does not fit any more is discarded and the model rebuilt, with the
/// reason reported: another model version, another query, damage, a log that lost the event
/// the checkpoint was taken at.
#[test]
fn unfit_checkpoints_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    for i in 0..60 {
        enrol(&store, i % 3, i);
    }
    let expected = seats_from_scratch(&store);
    let fresh = |model: Folded<Seats, fn(&mut Seats, &Event)>| {
        let runner = ReadModelRunner::start(&store, model, frequent()).unwrap();
        assert!(runner.wait_for(60, WAIT));
        assert_eq!(runner.read(|m| m.state().clone()), expected);
        let reason = runner.status().rebuilt_because;
        runner.stop();
        reason
    };
    assert_eq!(
        fresh(seats_model("seats")).as_deref(),
        Some("no checkpoint")
    );
    assert_eq!(fresh(seats_model("seats")), None);
    let reason = fresh(seats_model("seats").version(2)).unwrap();
    assert!(reason.contains("model version 1, this is 2"), "{reason}");
    let other_query = Folded::new(
        "seats",
        Query::item(QueryItem::types(["StudentEnrolled", "StudentLeft"])),
        Seats::new(),
        count_seats as fn(&mut Seats, &Event),
    )
    .version(2);
    let v2 = || seats_model("seats").version(2);
    assert!(fresh(other_query).unwrap().contains("another query"));
    assert_eq!(fresh(v2()).unwrap(), "the checkpoint is of another query");
    assert_eq!(fresh(v2()), None);

    let file = dir
        .path()
        .join(readmodel::CHECKPOINT_DIR)
        .join("seats.model");
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    assert!(fresh(v2()).unwrap().contains("damaged"));

    // A checkpoint from another log (a store that lost events and was refilled).
    let saved = std::fs::read(&file).unwrap();
    let store = Arc::try_unwrap(store).ok().unwrap();
    store.close().unwrap();
    let other = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(other.path(), Options::default()).unwrap());
    for i in 0..80 {
        enrol(&store, i % 2, i);
    }
    std::fs::create_dir_all(other.path().join(readmodel::CHECKPOINT_DIR)).unwrap();
    std::fs::write(
        other
            .path()
            .join(readmodel::CHECKPOINT_DIR)
            .join("seats.model"),
        saved,
    )
    .unwrap();
    let runner = ReadModelRunner::start(&store, v2(), frequent()).unwrap();
    assert!(runner.wait_for(80, WAIT));
    let reason = runner.status().rebuilt_because.unwrap();
    assert!(reason.contains("no longer holds"), "{reason}");
    assert_eq!(
        runner.read(|m| m.state().clone()),
        seats_from_scratch(&store)
    );
}

/// Goal: a rebuild asked of a running model starts again from the first event and ends in the
/// same state; names that cannot name a file are refused.
#[test]
fn rebuild_on_request_and_names() {
    let store = Arc::new(Store::open_in_memory(Options::default()).unwrap());
    for i in 0..500 {
        enrol(&store, i % 13, i);
    }
    let runner = ReadModelRunner::start(&store, seats_model("seats"), frequent()).unwrap();
    assert!(runner.wait_for(500, WAIT));
    runner.rebuild();
    eventually("the rebuild to begin", WAIT, || {
        runner.status().rebuilds > 0
    });
    assert!(runner.wait_for(500, WAIT));
    let status = runner.status();
    assert_eq!(status.rebuilds, 1);
    assert_eq!(
        status.rebuilt_because.as_deref(),
        Some("a rebuild was asked for")
    );
    assert_eq!(status.events_applied, 1000);
    assert_eq!(
        runner.read(|m| m.state().clone()),
        seats_from_scratch(&store)
    );

    for bad in ["", "..", "a/b", "with space", &"x".repeat(65)] {
        assert!(matches!(
            ReadModelRunner::start(&store, seats_model(bad), frequent()),
            Err(ReadModelError::InvalidName(_))
        ));
    }
}

/// One receipt per enrolment.
struct Receipts {
    /// Receipts per enrolment, to test splitting effects across appends.
    per_event: usize,
}

impl Reactor for Receipts {
    fn name(&self) -> &str {
        "receipts"
    }

    fn query(&self) -> Query {
        Query::item(QueryItem::types(["StudentEnrolled"]))
    }

    fn react(&mut self, event: &Event, effects: &mut Vec<NewEvent>) {
        for part in 0..self.per_event {
            effects.push(
                NewEvent::new("ReceiptIssued", format!("{part}").into_bytes())
                    .tag(format!("enrolment:{}", event.position())),
            );
        }
    }
}

/// Every enrolment has exactly `per_event` receipts, and nothing else is a receipt.
fn check_receipts(store: &Store, per_event: usize) {
    let enrolments: Vec<u64> = store
        .read(
            &Query::item(QueryItem::types(["StudentEnrolled"])),
            ReadOptions::forwards(),
        )
        .unwrap()
        .map(|e| e.unwrap().position())
        .collect();
    let receipts = common::receipts_per_enrolment(store);
    assert_eq!(receipts.len(), enrolments.len());
    for position in enrolments {
        assert_eq!(
            receipts.get(&position),
            Some(&per_event),
            "enrolment {position}"
        );
    }
}

/// Goal: a reactor appends each effect exactly once with its tracking position, resumes after
/// it on restart, splits effects that exceed one append's limits, and two runners of the same
/// name still write each effect once.
#[test]
fn reactor_effects_exactly_once() {
    let options = Options {
        limits: Limits {
            events_per_append_max: 10,
            ..Limits::default()
        },
        ..Options::default()
    };
    let store = Arc::new(Store::open_in_memory(options).unwrap());
    for i in 0..40 {
        enrol(&store, i % 3, i);
    }
    let runner = ReactorRunner::start(&store, Receipts { per_event: 3 }, frequent()).unwrap();
    let wait_quiet = |runner: &ReactorRunner| {
        // Effects move the head, so wait until the head stops moving.
        loop {
            let head = store.head();
            assert!(runner.wait_for(head, WAIT), "{:?}", runner.status());
            if store.head() == head {
                break;
            }
        }
    };
    wait_quiet(&runner);
    check_receipts(&store, 3);
    let status = runner.stop();
    assert_eq!(status.effects_appended, 120);
    assert!(status.checkpoints >= 12, "10 events per append at most");
    let recorded = store.tracking("receipts").unwrap();
    assert_eq!(recorded, status.checkpoint_position);

    for i in 0..25 {
        enrol(&store, 1, 100 + i);
    }
    let a = ReactorRunner::start(&store, Receipts { per_event: 3 }, frequent()).unwrap();
    assert!(matches!(
        ReactorRunner::start(&store, Receipts { per_event: 3 }, frequent()),
        Err(ReadModelError::AlreadyRunning(name)) if name == "receipts"
    ));
    assert_eq!(a.status().resumed_from, recorded);
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    enrol(&store, 2, 1000 + t * 100 + i);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    wait_quiet(&a);
    check_receipts(&store, 3);
    assert_eq!(a.stop().effects_appended, 675);

    // Someone else appending with the reactor's tracking source moves it on: the reactor
    // resumes after what was recorded.
    let head = store.head();
    enrol(&store, 9, 9);
    store
        .appending(&[NewEvent::new("Manual", "")])
        .tracking(annals::Tracking::new("receipts", head + 1))
        .wait()
        .unwrap();
    let c = ReactorRunner::start(&store, Receipts { per_event: 1 }, frequent()).unwrap();
    assert_eq!(c.status().resumed_from, head + 1);
    wait_quiet(&c);
    assert_eq!(c.stop().effects_appended, 0);
}

/// Goal: a folded model's state is saved as JSON and loads back; a reset returns to the
/// initial state.
#[test]
fn folded_state_round_trips() {
    let mut model = seats_model("seats");
    let store = Store::open_in_memory(Options::default()).unwrap();
    enrol(&store, 1, 1);
    enrol(&store, 1, 2);
    for event in store.read(&Query::all(), ReadOptions::forwards()).unwrap() {
        model.apply(&event.unwrap());
    }
    let mut bytes = Vec::new();
    model.save(&mut bytes);
    assert_eq!(std::str::from_utf8(&bytes).unwrap(), r#"{"c1":2}"#);
    let mut other = seats_model("seats");
    other.load(&bytes).unwrap();
    assert_eq!(other.state(), model.state());
    assert!(other.load(b"not json").is_err());
    other.reset();
    assert!(other.state().is_empty());
}

/// Goal: a read model whose checkpoint finds no room on the disk counts the failure, goes on
/// folding and retries, never stops the store's appends, and writes its checkpoint once there
/// is room. Method: a store on the simulated disk, the file system then bounded to exactly
/// what it holds (appends still fit in the segment already allocated; a checkpoint does not);
/// appends followed by the runner; then the bound lifted.
#[test]
fn a_checkpoint_without_room_is_counted_and_retried() {
    use annals::sim::SimIo;
    let io = SimIo::new(7);
    let options = Options {
        segment_bytes: 1 << 20,
        limits: Limits {
            append_bytes_max: 64 << 10,
            ..Limits::default()
        },
        ..Options::default()
    };
    let store = Arc::new(
        Store::open_with_io(Arc::new(io.clone()), std::path::Path::new("/data"), options).unwrap(),
    );
    let runner = ReadModelRunner::start(&store, seats_model("seats"), frequent()).unwrap();
    enrol(&store, 1, 1);
    assert!(runner.wait_for(store.head(), WAIT));
    // Bound the file system to what it holds now.
    io.set_capacity(Some(u64::MAX));
    let free = store.stats().disk_free_bytes.unwrap();
    io.set_capacity(Some(u64::MAX - free));
    assert_eq!(store.stats().disk_free_bytes, Some(0));
    for i in 0..200 {
        enrol(&store, i % 3, 100 + i);
    }
    assert!(runner.wait_for(store.head(), WAIT));
    assert_eq!(
        runner.read(|m| m.state().clone()),
        seats_from_scratch(&store)
    );
    eventually("a checkpoint to fail", WAIT, || {
        runner.status().failures > 0
    });
    let status = runner.status();
    assert!(status.checkpoint_position < store.head());
    assert!(status.error.unwrap().contains("No space left"));
    assert!(store.stats().poisoned.is_none());
    // Room again: the checkpoint is written, and the error is gone.
    io.set_capacity(None);
    let position = enrol(&store, 1, 999);
    eventually("the checkpoint to be written", WAIT, || {
        let status = runner.status();
        if status.checkpoint_position >= position {
            Ok(())
        } else {
            Err(Box::new(status))
        }
    });
    assert!(runner.status().error.is_none());
}

type Addresses = Vec<String>;

fn note_address(addresses: &mut Addresses, event: &Event) {
    addresses.push(String::from_utf8_lossy(event.data()).into_owned());
}

fn addresses_model(name: &str, query: Query) -> Folded<Addresses, fn(&mut Addresses, &Event)> {
    Folded::new(
        name,
        query,
        Addresses::new(),
        note_address as fn(&mut Addresses, &Event),
    )
}

/// Goal: an embedded read model keeps no state derived from an erased data subject's data,
/// whether the erasure comes while it runs or while it is stopped, and a model that never saw
/// the subject is left alone. Method: a model folding every address (the events' data) and
/// one folding only customer:2's, on a store with data subjects; customer:1 erased while both
/// run: the first is rebuilt, saying why, and holds no customer:1 address; the second is not
/// rebuilt. Then the first stopped with a checkpoint, customer:2 erased, the model started
/// again: rebuilt from its checkpoint's state, without customer:2's address.
#[test]
fn a_model_that_saw_an_erased_subject_is_rebuilt_without_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        subjects: Some(annals::SubjectOptions::new(
            ["customer:"],
            annals::MasterKey::generate().unwrap(),
        )),
        ..Options::default()
    };
    let store = Arc::new(Store::open(dir.path(), options).unwrap());
    let moved = |customer: u64, street: &str| {
        NewEvent::new("Moved", street.to_string()).tag(format!("customer:{customer}"))
    };
    store.append(&[moved(1, "1 First Street")], None).unwrap();
    store.append(&[moved(2, "2 Second Street")], None).unwrap();
    let all = Query::item(QueryItem::types(["Moved"]));
    let everyone =
        ReadModelRunner::start(&store, addresses_model("all", all.clone()), frequent()).unwrap();
    let second = ReadModelRunner::start(
        &store,
        addresses_model("second", Query::item(QueryItem::tags(["customer:2"]))),
        frequent(),
    )
    .unwrap();
    assert!(everyone.wait_for(2, WAIT) && second.wait_for(2, WAIT));
    assert_eq!(
        everyone.read(|m| m.state().clone()),
        ["1 First Street", "2 Second Street"]
    );

    store.erase_subject("customer:1").unwrap();
    eventually("the model that saw customer:1 is rebuilt", WAIT, || {
        everyone.status().rebuilds == 1 && everyone.wait_for(2, Duration::ZERO)
    });
    assert_eq!(
        everyone.read(|m| m.state().clone()),
        ["", "2 Second Street"],
        "customer:1's address is gone"
    );
    assert!(
        everyone
            .status()
            .rebuilt_because
            .is_some_and(|why| why.contains("customer:1")),
        "{:?}",
        everyone.status()
    );
    assert!(second.wait_for(store.head(), WAIT));
    assert_eq!(second.status().rebuilds, 0, "it never saw customer:1");
    second.stop();
    let stopped = everyone.stop();
    assert_eq!(stopped.error, None);

    // Erased while the model is stopped: its checkpoint holds customer:2's address.
    store.erase_subject("customer:2").unwrap();
    let everyone = ReadModelRunner::start(&store, addresses_model("all", all), frequent()).unwrap();
    eventually(
        "the model resumed from its checkpoint is rebuilt",
        WAIT,
        || everyone.status().rebuilds == 1 && everyone.wait_for(store.head(), Duration::ZERO),
    );
    assert_eq!(everyone.read(|m| m.state().clone()), ["", ""]);
    everyone.stop();
}
