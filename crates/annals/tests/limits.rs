//! Limits on both sides of every bound, and bad input that changes nothing: append limits,
//! query limits, the queue's depth.
mod common;

use annals::{
    AppendCondition, AppendError, InputError, Limits, NewEvent, Options, Query, QueryItem,
    ReadOptions, Store,
};
use common::api::*;
use common::harness::small_options;

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

/// Goal: a full queue applies backpressure: an append sent with `fail_when_full` says so with a
/// typed error, and
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
    store.appending(&[event()]).then(|_| {}).unwrap();
    match store.appending(&[event()]).fail_when_full().wait() {
        Err(AppendError::QueueFull { depth: 1 }) => {}
        other => panic!("expected QueueFull, got {other:?}"),
    }
    release.send(()).unwrap();
    assert_eq!(store.append(&[event()], None).unwrap(), 3);
}

/// Goal: a thread's valid append answers with its own outcome after a rejected one. Regression: a
/// rejected append (bad input, or a full queue with `fail_when_full`) once left an "unanswered"
/// error in the calling thread's reusable completion slot, and the thread's next, valid append
/// returned that stale error. Replies are now armed only when a request is queued and disarmed if
/// it never reaches the writer. Method: alternate rejections and appends on one thread.
#[test]
fn rejected_append_leaves_no_stale_outcome() {
    let store = sim_store(small_options());
    for i in 0..20u64 {
        assert!(store.append(&[NewEvent::new("", "")], None).is_err());
        assert_eq!(store.append(&[event()], None).unwrap(), i + 1);
    }
}

/// Goal: a batch tells truly whether one more event fits, on both sides of each append limit:
/// `EventBatch::has_room` says yes exactly when the push that follows succeeds. Method: events
/// of one size pushed while `has_room` says one more fits, under a bytes limit and then under
/// a count limit; the push it refuses fails with that limit's typed error.
#[test]
fn a_batch_says_whether_one_more_event_fits() {
    let event = NewEvent::new("E", vec![0u8; 100]);
    let by_bytes = Limits {
        append_bytes_max: 1024,
        events_per_append_max: 100,
        ..Limits::default()
    };
    let by_count = Limits {
        append_bytes_max: 1 << 20,
        events_per_append_max: 3,
        ..Limits::default()
    };
    for limits in [by_bytes, by_count] {
        let mut batch = annals::EventBatch::new(&limits);
        let empty = batch.encoded_bytes();
        batch.push(&event).unwrap();
        let bytes = batch.encoded_bytes() - empty;
        while batch.has_room(1, bytes) {
            batch.push(&event).unwrap();
        }
        assert!(batch.has_room(0, 0), "a full batch holds what it holds");
        match batch.push(&event) {
            Err(InputError::AppendTooLarge { max: 1024, .. })
                if limits.append_bytes_max == 1024 => {}
            Err(InputError::TooManyEvents { count: 4, max: 3 })
                if limits.events_per_append_max == 3 => {}
            other => panic!("the push has_room refused: {other:?}"),
        }
    }
}

/// Refuses an event whose data holds "forbidden", and counts what it saw.
#[derive(Debug, Default)]
struct NoForbidden {
    seen: std::sync::atomic::AtomicUsize,
}

impl annals::admission::Admission for NoForbidden {
    fn admit(
        &self,
        append: &annals::admission::Admitting<'_>,
    ) -> Result<annals::admission::Admitted, annals::admission::Refusal> {
        for event in &append.events {
            self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if event.data.windows(9).any(|w| w == b"forbidden") {
                return Err(annals::admission::Refusal::event(
                    event.index,
                    "forbidden_data",
                    format!("{} data says forbidden", event.event_type),
                ));
            }
        }
        Ok(annals::admission::Admitted::default())
    }
}

/// Goal: the admission check (`Options::admission`) sees every append made through the store
/// as the client gave it, data subjects' data in the clear before it is sealed, refuses it
/// whole with its kind and the event concerned, and is not run again on what is carried from
/// another log. Method: a check refusing data that says "forbidden", on a store with data
/// subjects; appends through `append`, the builder and a batch, one refused in the middle of
/// an append; then a copy into a store with the check of a log holding such an event.
#[test]
fn the_admission_check_refuses_a_whole_append_and_is_not_run_on_history() {
    let check = std::sync::Arc::new(NoForbidden::default());
    let master = annals::MasterKey::generate().unwrap();
    let options = Options {
        admission: Some(check.clone()),
        subjects: Some(annals::SubjectOptions::new(["customer:"], master)),
        ..small_options()
    };
    let store = sim_store(options.clone());
    store
        .append(&[NewEvent::new("Moved", "fine").tag("customer:1")], None)
        .unwrap();
    let refused = store
        .append(
            &[
                NewEvent::new("Moved", "fine"),
                NewEvent::new("Moved", "forbidden street").tag("customer:1"),
            ],
            None,
        )
        .unwrap_err();
    match &refused {
        AppendError::Input(InputError::NotAdmitted(r)) => {
            assert_eq!((r.kind, r.index), ("forbidden_data", Some(1)));
            assert_eq!(refused.to_string(), "event 1: Moved data says forbidden");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.head(), 1, "nothing of a refused append is stored");
    let mut batch = store.batch();
    batch.push(&NewEvent::new("Moved", "forbidden")).unwrap();
    assert!(matches!(
        store.appending_batch(batch).wait(),
        Err(AppendError::Input(InputError::NotAdmitted(_)))
    ));
    assert_eq!(store.head(), 1);
    // Erasing appends the store's own receipt, which is not admitted again.
    let seen = check.seen.load(std::sync::atomic::Ordering::Relaxed);
    store.erase_subject("customer:1").unwrap();
    assert_eq!(check.seen.load(std::sync::atomic::Ordering::Relaxed), seen);

    // A log made without the check, copied into a store with it: carried as it is.
    let old = sim_store(small_options());
    old.append(&[NewEvent::new("Moved", "forbidden once")], None)
        .unwrap();
    let checked = sim_store(Options {
        admission: Some(check.clone()),
        ..small_options()
    });
    annals::copy(&old, &checked, &mut |_, _, _| {}).unwrap();
    assert_eq!(checked.head(), 1);
}
