//! Goal: the basic embedded API works end to end on a real directory and in memory.
mod common;

use annals::{AppendCondition, NewEvent, Options, Query, QueryItem, ReadOptions, Store};
use common::*;

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
