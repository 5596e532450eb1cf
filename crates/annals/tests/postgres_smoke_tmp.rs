use annals::*;
#[test]
fn smoke() {
    let Some(pg) = annals_testkit::Cluster::start() else { return };
    let store = Store::open_postgres(&pg.url(), Options::default()).unwrap();
    let e = || NewEvent::new("E", b"x".to_vec()).tag("a");
    assert_eq!(store.append(&[e(), e()], None).unwrap(), 2);
    let cond = AppendCondition { fail_if_events_match: Query::item(QueryItem::tags(["a"])), after: Some(1) };
    assert!(store.append(&[e()], Some(&cond)).is_err());
    let other = Store::open_postgres(&pg.url(), Options::default()).unwrap();
    assert_eq!(other.head(), 2);
    let cond = AppendCondition { fail_if_events_match: Query::item(QueryItem::tags(["a"])), after: Some(2) };
    assert_eq!(other.append(&[e()], Some(&cond)).unwrap(), 3);
    // the first store has not followed yet: its condition must still fail
    assert!(matches!(store.append(&[e()], Some(&cond)), Err(AppendError::ConditionFailed{position: 3})), "{:?}", store.append(&[e()], Some(&cond)));
    assert_eq!(store.head(), 3);
    let all: Vec<_> = store.read(&Query::all(), ReadOptions::default()).unwrap().collect::<Result<_,_>>().unwrap();
    assert_eq!(all.len(), 3);
    println!("{:?}", store.stats().backend);
}
