//! Test helper for the read-model kill -9 test (crates/annals/tests/readmodel_kill9.rs).
//!
//! `annals-readmodel-child DIR run`: appends enrolments from two threads while a read model
//! (seats taken per course) and a reactor (one receipt per enrolment) follow the store; the
//! parent kills it at a random moment.
//! `annals-readmodel-child DIR settle`: no appends; waits until both have caught up with the
//! head, then prints the model's status and state as JSON lines and exits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use annals::readmodel::{Folded, Reactor, ReactorRunner, ReadModelRunner, RunnerOptions};
use annals::{Event, NewEvent, Options, Query, QueryItem, Store};

/// One receipt per enrolment, tagged with the enrolment's position.
struct Receipts;

impl Reactor for Receipts {
    fn name(&self) -> &str {
        "receipts"
    }

    fn query(&self) -> Query {
        Query::item(QueryItem::types(["StudentEnrolled"]))
    }

    fn react(&mut self, event: &Event, effects: &mut Vec<NewEvent>) {
        effects.push(
            NewEvent::new("ReceiptIssued", event.data_bytes())
                .tag(format!("enrolment:{}", event.position())),
        );
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .expect("usage: annals-readmodel-child DIR run|settle");
    let mode = args.next().unwrap_or_else(|| "run".into());
    let store = Arc::new(Store::open(&dir, Options::default()).expect("open"));
    let seats = Folded::new(
        "seats",
        Query::item(QueryItem::types(["StudentEnrolled"])),
        BTreeMap::<String, u64>::new(),
        |seats: &mut BTreeMap<String, u64>, event: &Event| {
            for tag in event.tags() {
                if let Some(course) = tag.strip_prefix("course:") {
                    *seats.entry(course.to_owned()).or_default() += 1;
                }
            }
        },
    );
    let options = RunnerOptions {
        batch_max: 64,
        checkpoint_events: 300,
        checkpoint_interval: Duration::from_millis(20),
        ..RunnerOptions::default()
    };
    let model = ReadModelRunner::start(&store, seats, options.clone()).expect("start model");
    let reactor = ReactorRunner::start(&store, Receipts, options).expect("start reactor");
    let status = model.status();
    println!(
        "S resumed_from={} rebuilt_because={:?}",
        status.resumed_from, status.rebuilt_because
    );
    if mode == "settle" {
        loop {
            let head = store.head();
            if model.wait_for(head, Duration::from_secs(30))
                && reactor.wait_for(head, Duration::from_secs(30))
                && store.head() == head
            {
                break;
            }
        }
        let state = model.read(|m| m.state().clone());
        println!("STATE {}", serde_json::to_string(&state).unwrap());
        println!(
            "STATUS {}",
            serde_json::to_string(&model.stop()).expect("status")
        );
        println!(
            "REACTOR {}",
            serde_json::to_string(&reactor.stop()).expect("status")
        );
        return;
    }
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for k in 0u64.. {
                    let n = t * 1_000_003 + k * 7919;
                    let event = NewEvent::new("StudentEnrolled", format!("{t}/{k}").into_bytes())
                        .tag(format!("course:c{}", n % 23))
                        .tag(format!("student:s{}", n % 101));
                    // Unrelated traffic the model must skip.
                    let other =
                        NewEvent::new("CourseRenamed", "").tag(format!("course:c{}", n % 23));
                    let events = if k % 5 == 0 {
                        vec![event, other]
                    } else {
                        vec![event]
                    };
                    store.append(&events, None).expect("append");
                }
            })
        })
        .collect();
    for w in writers {
        let _ = w.join();
    }
}
