//! Goal: the basic embedded API works end to end on a real directory and in memory.
mod common;

use annals::{AppendCondition, NewEvent, Options, Query, QueryItem, ReadOptions, Store};
use common::*;

/// Goal: appends, reads and a failing append condition give what a simple model of the log gives,
/// on a real directory, and a store reopened after a clean close takes its index from the
/// checkpoint and reads the same. Method: numbered events with a few types and tags, compared with
/// the model before and after the reopening.
#[test]
fn append_read_condition_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::default();
    {
        let store = Store::open(dir.path(), Options::default()).unwrap();
        for i in 0..50u32 {
            let events = vec![NewEvent::new(
                if i % 3 == 0 { "A" } else { "B" },
                format!("{i}").into_bytes(),
            )
            .tag(format!("t{}", i % 5))
            .tag("all")];
            let p = store.append(&events, None).unwrap();
            assert_eq!(Ok(p), model.append(&events, None));
        }
        let c = AppendCondition::new(Query::item(QueryItem::tags(["t1"])), Some(10));
        let e = store
            .append(&[NewEvent::new("X", "x")], Some(&c))
            .unwrap_err();
        assert_eq!(
            Some(
                model
                    .append(&[NewEvent::new("X", "x")], Some(&c))
                    .unwrap_err()
            ),
            e.conflict_position()
        );
        check_against_model(&store, &model).unwrap();
        store.close().unwrap();
    }
    let store = Store::open(dir.path(), Options::default()).unwrap();
    assert!(
        matches!(
            store.open_report().index,
            annals::IndexSource::Checkpoint { .. }
        ),
        "{:?}",
        store.open_report()
    );
    check_against_model(&store, &model).unwrap();
    let got = read_all(
        &store,
        &Query::item(QueryItem::types(["A"])),
        ReadOptions::backwards().limit(2),
    )
    .unwrap();
    assert_eq!(
        got.iter().map(|e| e.position()).collect::<Vec<_>>(),
        vec![49, 46]
    );
}

/// Goal: the one append API reaches every way of waiting, for events and for batches: blocking
/// with a condition, async (a batch, which no shorthand offers), and a callback with a tracking
/// position; its checks refuse what the store refuses however an append is sent.
#[test]
fn one_append_api_for_every_way_of_waiting() {
    use annals::{AppendError, Tracking};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let claim = AppendCondition::new(Query::item(QueryItem::tags(["user:ada"])), None);
    let claimed = NewEvent::new("UsernameClaimed", "ada").tag("user:ada");
    let first = store
        .appending(std::slice::from_ref(&claimed))
        .condition(&claim)
        .wait()
        .unwrap();
    assert_eq!(first, 1);
    let again = store
        .appending(std::slice::from_ref(&claimed))
        .condition(&claim)
        .wait();
    assert!(matches!(
        again,
        Err(AppendError::ConditionFailed { position: 1 })
    ));

    // A batch, awaited.
    let mut batch = store.batch();
    for i in 0..3 {
        batch
            .push(&NewEvent::new("Batched", format!("{i}")).tag("b"))
            .unwrap();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let last = runtime
        .block_on(store.appending_batch(batch).fail_when_full().submit())
        .unwrap();
    assert_eq!(last, 4);

    // A callback, with a tracking position recorded in the same append.
    let (tx, rx) = std::sync::mpsc::channel();
    store
        .appending(&[NewEvent::new("Projected", "x")])
        .tracking(Tracking::new("upstream", 7))
        .require_synced()
        .then(move |outcome| tx.send(outcome).unwrap())
        .unwrap();
    assert_eq!(rx.recv().unwrap().unwrap(), 5);
    assert_eq!(store.tracking("upstream"), Some(7));

    // A batch carries no tracking position: refused before anything is queued.
    let mut batch = store.batch();
    batch.push(&NewEvent::new("Batched", "y")).unwrap();
    let refused = store
        .appending_batch(batch)
        .tracking(Tracking::new("upstream", 8))
        .wait();
    assert!(
        matches!(
            refused,
            Err(AppendError::Input(annals::InputError::TrackingInBatch))
        ),
        "{refused:?}"
    );
    assert_eq!(store.head(), 5);
    let read = store
        .read(&Query::all(), ReadOptions::forwards())
        .unwrap()
        .count();
    assert_eq!(read, 5);
}

/// Goal: a subscription delivers through each of its ways of waiting, and tells each how the
/// store closed. Method: one event taken with the blocking `next_event`, then two appended
/// later taken with the async `next_batch`; once the store is closed, `next_event` reports the
/// closed store and `next_batch` answers an empty batch.
#[test]
fn a_subscription_delivers_through_each_way_of_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let wanted = Query::item(QueryItem::types(["Wanted"]));
    store
        .append(
            &[NewEvent::new("Other", "x"), NewEvent::new("Wanted", "1")],
            None,
        )
        .unwrap();
    let mut subscription = store.subscribe(&wanted, 0).unwrap();
    assert_eq!(subscription.next_event().unwrap().position(), 2);
    store
        .append(
            &[NewEvent::new("Wanted", "2"), NewEvent::new("Wanted", "3")],
            None,
        )
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let batch = runtime.block_on(subscription.next_batch(16)).unwrap();
    let positions: Vec<u64> = batch.iter().map(|e| e.position()).collect();
    assert_eq!(positions, vec![3, 4]);
    store.close().unwrap();
    assert!(
        matches!(
            subscription.next_event(),
            Err(annals::ReadError::Store(annals::StoreError::Closed))
        ),
        "a closed store ends the blocking wait with an error"
    );
    assert!(runtime
        .block_on(subscription.next_batch(16))
        .unwrap()
        .is_empty());
}
