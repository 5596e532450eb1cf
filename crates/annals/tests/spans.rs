//! The store's spans as a subscriber records them (a server exports these over OTLP): a
//! decision and its retries, each read and append under it; the group commit (a segment's
//! fdatasync) linked both ways with the append it carried; a D4 append linked with the backup
//! put that shipped it. Spans are made only under a caller's span, so each test makes one of
//! its own, named for it, and reads what was recorded under it.
mod common;

use annals::decide::{Projection, Retry};
use annals::{Event, NewEvent, Options, Query, QueryItem, Store};
use annals_testkit::spans::{self, Recorded};

fn query() -> Query {
    Query::item(QueryItem::types(["Reserved"]).and_tags(["seat:1"]))
}

fn seats() -> Projection<u32, impl Fn(&mut u32, &Event)> {
    Projection::new(query(), 0u32, |n: &mut u32, _: &Event| *n += 1)
}

fn named<'a>(spans: &'a [Recorded], name: &str) -> Vec<&'a Recorded> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// Goal: a decision is a span under its caller's with the attempts it took and the position
/// it appended at; each attempt's read (`annals.decide`, with the events it read and the head
/// it read to) and append are under it, the first append's failed condition recorded as its
/// outcome. Method: the command, on its first call, appends a matching event itself, so the
/// first attempt conflicts and the second succeeds.
#[test]
fn a_decision_and_its_retries_are_spans() {
    spans::record();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    store
        .append(&[NewEvent::new("Reserved", "{}").tag("seat:1")], None)
        .unwrap();
    let mut calls = 0;
    let decided = tracing::info_span!("test.decision").in_scope(|| {
        store.decide_and_append(&seats(), Retry::default(), |reserved| {
            calls += 1;
            if calls == 1 {
                // Another writer takes a seat between the read and the append.
                let other = NewEvent::new("Reserved", "{}").tag("seat:1");
                store.append(&[other], None).unwrap();
            }
            Ok::<_, String>(vec![
                NewEvent::new("Reserved", format!("{reserved}")).tag("seat:1")
            ])
        })
    });
    let decided = decided.unwrap();
    assert_eq!(decided.attempts, 2);
    let inside = spans::under("test.decision");
    let decision = named(&inside, "annals.decision");
    assert_eq!(decision.len(), 1, "{inside:#?}");
    let decision = decision[0];
    assert_eq!(decision.number("annals.attempts"), Some(2));
    assert_eq!(decision.field("annals.outcome"), Some("appended"));
    assert_eq!(
        decision.number("annals.position"),
        Some(decided.position as i64)
    );
    let reads = named(&inside, "annals.decide");
    assert_eq!(reads.len(), 2, "{inside:#?}");
    assert!(reads.iter().all(|r| r.parent == Some(decision.id)));
    assert_eq!(reads[0].number("annals.events_read"), Some(1));
    assert_eq!(reads[0].number("annals.head"), Some(1));
    assert_eq!(reads[1].number("annals.events_read"), Some(2));
    assert_eq!(reads[1].field("annals.rebuilt"), Some("false"));
    let appends = named(&inside, "annals.append");
    let outcomes: Vec<_> = appends
        .iter()
        .map(|a| a.field("annals.outcome").unwrap_or("none"))
        .collect();
    // The other writer's, the conflicting one, the one that went in.
    assert_eq!(
        outcomes,
        ["appended", "condition_failed", "appended"],
        "{appends:#?}"
    );
    assert!(appends[1].number("annals.after").is_some());
    store.close().unwrap();
}

/// Goal: the async decision is the same span, its attempts and outcome recorded, with a
/// command that refuses recorded as `rejected` (an answer, not a fault).
#[test]
fn an_async_decision_is_a_span_too() {
    spans::record();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let root = tracing::info_span!("test.async_decision");
    let (appended, refused) = runtime.block_on(tracing::Instrument::instrument(
        async {
            let sleep = |d| tokio::time::sleep(d);
            let appended = store
                .decide_and_append_async(
                    &seats(),
                    Retry::default(),
                    |_| Ok::<_, String>(vec![NewEvent::new("Reserved", "{}").tag("seat:1")]),
                    sleep,
                )
                .await;
            let refused = store
                .decide_and_append_async(
                    &seats(),
                    Retry::default(),
                    |n| Err::<Vec<NewEvent>, _>(format!("{n} seat taken")),
                    sleep,
                )
                .await;
            (appended, refused)
        },
        root,
    ));
    assert_eq!(appended.unwrap().attempts, 1);
    assert!(refused.is_err());
    let inside = spans::under("test.async_decision");
    let decisions = named(&inside, "annals.decision");
    assert_eq!(decisions.len(), 2, "{inside:#?}");
    assert_eq!(decisions[0].field("annals.outcome"), Some("appended"));
    assert_eq!(decisions[0].number("annals.attempts"), Some(1));
    assert_eq!(decisions[1].field("annals.outcome"), Some("rejected"));
    assert_eq!(decisions[1].field("otel.status_code"), None);
    let reads = named(&inside, "annals.decide");
    assert_eq!(reads.len(), 2);
    assert_eq!(reads[0].parent, Some(decisions[0].id));
    assert_eq!(reads[1].parent, Some(decisions[1].id));
    store.close().unwrap();
}

/// Goal: the fdatasync that makes a traced append durable is a span of its own (a trace of
/// its own, carrying many appends), with its head, size and fsync time, linked both ways with
/// the append's span; an append nobody traces makes no commit span.
#[test]
fn the_commit_that_carried_an_append_is_linked_with_it() {
    spans::record();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let position = tracing::info_span!("test.commit").in_scope(|| {
        store
            .appending(&[NewEvent::new("Noted", "{}").tag("n:1")])
            .require_synced()
            .wait()
            .unwrap()
    });
    let inside = spans::under("test.commit");
    let append = named(&inside, "annals.append");
    assert_eq!(append.len(), 1, "{inside:#?}");
    let append = append[0];
    assert_eq!(append.number("annals.position"), Some(position as i64));
    assert_eq!(append.follows.len(), 1, "{append:#?}");
    let commit = spans::span(append.follows[0]);
    assert_eq!(commit.name, "annals.commit");
    assert_eq!(commit.parent, None, "a trace of its own");
    assert!(commit.follows.contains(&append.id), "{commit:#?}");
    assert!(commit.number("annals.head").unwrap() >= position as i64);
    assert!(commit.number("annals.appends").unwrap() >= 1);
    assert!(commit.number("annals.bytes").unwrap() > 0);
    assert!(commit.number("annals.fsync_us").is_some());
    // An append nobody traces makes no span, and no commit is made for it alone: every
    // append span recorded (by any test here) has a caller, and every commit links an append.
    store
        .appending(&[NewEvent::new("Noted", "{}").tag("n:2")])
        .require_synced()
        .wait()
        .unwrap();
    for s in spans::recorded() {
        match s.name.as_str() {
            "annals.append" => assert!(s.parent.is_some(), "{s:#?}"),
            "annals.commit" => assert!(!s.follows.is_empty(), "{s:#?}"),
            _ => {}
        }
    }
    store.close().unwrap();
}

/// Goal: a D4 append is linked with the backup put that shipped it, a span of its own with
/// the object's kind, the positions and bytes it holds and how long the put took.
#[test]
fn a_d4_append_is_linked_with_the_put_that_shipped_it() {
    spans::record();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/backup", dir.path().display());
    let store = Store::open(dir.path().join("data"), common::backup::options(&url)).unwrap();
    let position = tracing::info_span!("test.put").in_scope(|| {
        store
            .appending(&[NewEvent::new("Noted", "{}").tag("n:1")])
            .require_off_machine()
            .wait()
            .unwrap()
    });
    let inside = spans::under("test.put");
    let append = named(&inside, "annals.append")[0];
    assert_eq!(append.field("annals.durability"), Some("d4"));
    let linked: Vec<Recorded> = append.follows.iter().map(|&id| spans::span(id)).collect();
    let put = linked
        .iter()
        .find(|s| s.name == "annals.backup.put")
        .unwrap_or_else(|| panic!("no put linked: {linked:#?}"));
    assert!(put.follows.contains(&append.id), "{put:#?}");
    assert_eq!(put.parent, None);
    assert!(["chunk", "segment"].contains(&put.field("annals.object").unwrap()));
    assert!(put.number("annals.first").unwrap() <= position as i64);
    assert!(put.number("annals.last").unwrap() >= position as i64);
    assert!(put.number("annals.bytes").unwrap() > 0);
    assert!(put.number("annals.put_us").is_some());
    assert!(put.number("annals.appends").unwrap() >= 1);
    // The sync before it is linked too.
    assert!(linked.iter().any(|s| s.name == "annals.commit"));
    store.close().unwrap();
}
