//! Decision models under concurrency: course capacity with a per-student limit, and gapless
//! invoice numbers, each decided by many threads at once through `Store::decide_and_append`.

use std::collections::HashMap;
use std::sync::Arc;

use annals::decide::{DecideError, Retry};
use annals::{NewEvent, Options, Query, QueryItem, ReadOptions, Store};

fn store(dir: &std::path::Path) -> Arc<Store> {
    Arc::new(Store::open(dir, Options::default()).unwrap())
}

#[path = "../examples/course_subscriptions/main.rs"]
#[allow(dead_code)]
mod course_subscriptions;

#[path = "../examples/invoice_numbers/main.rs"]
#[allow(dead_code)]
mod invoice_numbers;

use course_subscriptions::{
    course, student_courses, subscribe_cached, subscribe_with, Course, CourseCache, Refusal,
};

/// The subscriptions in the store: how many, and how many per course and per student.
fn subscriptions(store: &Store) -> (u32, HashMap<String, u32>, HashMap<String, u32>) {
    let mut per_course: HashMap<String, u32> = HashMap::new();
    let mut per_student: HashMap<String, u32> = HashMap::new();
    let mut events = 0;
    for event in store
        .read(
            &Query::item(QueryItem::types(["StudentSubscribed"])),
            ReadOptions::forwards(),
        )
        .unwrap()
    {
        let event = event.unwrap();
        events += 1;
        let tags: Vec<&str> = event.tags().collect();
        *per_course.entry(tags[0].to_string()).or_default() += 1;
        *per_student.entry(tags[1].to_string()).or_default() += 1;
    }
    (events, per_course, per_student)
}

/// Goal: 32 threads enrol students into courses of 10 seats, each student into at most 3
/// courses; afterwards no course is over capacity, no student over the limit, and every
/// successful enrolment is exactly one event.
#[test]
fn course_subscriptions_under_concurrency() {
    enrol_concurrently(None);
}

/// Goal: the same, with the threads sharing one cache of course states, so that most decisions
/// start from a state another thread built.
#[test]
fn course_subscriptions_under_concurrency_with_a_shared_state_cache() {
    enrol_concurrently(Some(Arc::new(CourseCache::new(1000))));
}

fn enrol_concurrently(cache: Option<Arc<CourseCache>>) {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    const COURSES: u32 = 8;
    const STUDENTS: u32 = 60;
    for c in 0..COURSES {
        course_subscriptions::define_course(&store, &c.to_string(), 10).unwrap();
    }
    let threads: Vec<_> = (0..32u32)
        .map(|t| {
            let store = store.clone();
            let cache = cache.clone();
            std::thread::spawn(move || {
                let mut ok = 0u32;
                for i in 0..20u32 {
                    let student = (t * 7 + i * 13) % STUDENTS;
                    let course = (t + i * 3) % COURSES;
                    let retry = Retry {
                        attempts: 50,
                        ..Retry::default()
                    };
                    let (course, student) = (course.to_string(), student.to_string());
                    let outcome = match &cache {
                        Some(cache) => subscribe_cached(&store, cache, &course, &student, retry),
                        None => subscribe_with(&store, &course, &student, retry),
                    };
                    match outcome {
                        Ok(_) => ok += 1,
                        Err(DecideError::Rejected(
                            Refusal::CourseFull { .. }
                            | Refusal::StudentAtLimit
                            | Refusal::AlreadySubscribed,
                        )) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                ok
            })
        })
        .collect();
    let successes: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let (events, per_course, per_student) = subscriptions(&store);
    assert_eq!(events, successes, "each success is exactly one event");
    assert!(per_course.values().all(|&n| n <= 10), "{per_course:?}");
    assert!(per_student.values().all(|&n| n <= 3), "{per_student:?}");
    assert!(
        successes >= 60,
        "too few enrolments ({successes}) to mean much"
    );
}

/// Goal: 16 threads each take 500 invoice numbers; the result is exactly 1..=8000.
#[test]
fn gapless_invoice_numbers_under_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut attempts = 0;
                for _ in 0..500 {
                    let retry = Retry {
                        attempts: 1000,
                        ..Retry::default()
                    };
                    let created =
                        invoice_numbers::create_invoice(&store, &format!("c{t}"), retry).unwrap();
                    attempts += created.decided.attempts;
                }
                attempts
            })
        })
        .collect();
    let attempts: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let numbers: Vec<u64> = store
        .read(&Query::all(), ReadOptions::forwards())
        .unwrap()
        .map(|e| {
            std::str::from_utf8(e.unwrap().data())
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(numbers, (1..=8000).collect::<Vec<_>>());
    assert!(attempts >= 8000);
}

/// Goal: a decision over two projections reads once (the union of their queries) and each
/// projection sees only its own events.
#[test]
fn composed_projections_fold_only_their_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store
        .append(&[NewEvent::new("CourseDefined", "2").tag("course:1")], None)
        .unwrap();
    store
        .append(
            &[NewEvent::new("StudentSubscribed", "")
                .tag("course:1")
                .tag("student:1")],
            None,
        )
        .unwrap();
    store
        .append(
            &[NewEvent::new("StudentSubscribed", "")
                .tag("course:2")
                .tag("student:1")],
            None,
        )
        .unwrap();
    store
        .append(&[NewEvent::new("Unrelated", "")], None)
        .unwrap();
    let decision = store.decide(&(course("1"), student_courses("1"))).unwrap();
    assert_eq!(
        decision.state,
        (
            Course {
                capacity: Some(2),
                subscribed: 1
            },
            vec!["1".to_owned(), "2".to_owned()]
        )
    );
    assert_eq!(decision.events_read, 3, "one read over the union");
    assert_eq!(decision.condition.after, Some(4));
    // The condition fails once anything either projection reads changes, and only then.
    store
        .append(&[NewEvent::new("Unrelated", "")], None)
        .unwrap();
    assert!(store
        .append(&[NewEvent::new("X", "")], Some(&decision.condition))
        .is_ok());
    store
        .append(
            &[NewEvent::new("StudentSubscribed", "")
                .tag("course:3")
                .tag("student:1")],
            None,
        )
        .unwrap();
    assert!(store
        .append(&[NewEvent::new("X", "")], Some(&decision.condition))
        .is_err());
}

/// Goal: the async decision loop keeps the same guarantees with many decisions in flight on
/// one thread: 200 tasks enrol into 4 courses of 10 seats, each student into at most 3; no
/// course over capacity, no student over the limit, every success exactly one event. The
/// course states go through a cache of two entries, so entries are dropped and rebuilt
/// throughout.
#[test]
fn async_decisions_on_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let cache = Arc::new(CourseCache::new(2));
    for c in 0..4 {
        course_subscriptions::define_course(&store, &c.to_string(), 10).unwrap();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let successes: u32 = runtime.block_on(async {
        let tasks: Vec<_> = (0..200u32)
            .map(|t| {
                let store = store.clone();
                let cache = cache.clone();
                tokio::spawn(async move {
                    let retry = Retry {
                        attempts: 100,
                        ..Retry::default()
                    };
                    let course = (t % 4).to_string();
                    let student = (t % 15).to_string();
                    let outcome = course_subscriptions::subscribe_async(
                        &store,
                        &cache,
                        &course,
                        &student,
                        retry,
                        tokio::time::sleep,
                    )
                    .await;
                    match outcome {
                        Ok(_) => 1,
                        Err(DecideError::Rejected(_)) => 0,
                        Err(e) => panic!("{e}"),
                    }
                })
            })
            .collect();
        let mut sum = 0;
        for task in tasks {
            sum += task.await.unwrap();
        }
        sum
    });
    let (events, per_course, per_student) = subscriptions(&store);
    assert_eq!(events, successes);
    assert!(per_course.values().all(|&n| n <= 10), "{per_course:?}");
    assert!(per_student.values().all(|&n| n <= 3), "{per_student:?}");
    // 15 students x 3 courses could take 45 seats; there are 40, and nearly all fill.
    assert!(successes >= 35, "too few enrolments: {per_course:?}");
}

/// Goal: a decision that starts from a kept state reads, for that projection, only the events
/// after the head the state was built at; the other projections are read in full, in the same
/// read.
#[test]
fn a_kept_state_is_read_on_from_where_it_was_built() {
    let store = Store::open_in_memory(Options::default()).unwrap();
    course_subscriptions::define_course(&store, "1", 10).unwrap();
    for s in 0..5 {
        subscribe_with(&store, "1", &format!("s{s}"), Retry::default()).unwrap();
    }
    let cache = CourseCache::new(8);
    let decide = || {
        store
            .decide(&(cache.cached(course("1")), student_courses("s0")))
            .unwrap()
    };
    let first = decide();
    assert_eq!(
        first.events_read, 6,
        "the definition and five subscriptions"
    );
    let second = decide();
    assert_eq!(second.events_read, 1, "only the student's own subscription");
    assert_eq!(second.state, first.state);
    subscribe_with(&store, "1", "s9", Retry::default()).unwrap();
    let third = decide();
    assert_eq!(
        third.events_read, 2,
        "the student's subscription and the new one"
    );
    let full = store.decide(&(course("1"), student_courses("s0"))).unwrap();
    assert_eq!(third.state, full.state);
    assert_eq!(third.state.0.subscribed, 6);
    assert_eq!(third.condition, full.condition);
}

/// Goal: a projection that does not lend its query (a tuple) is kept by its union query, and
/// read on from where its state was built, as a lone projection is. Method: a cached pair of
/// courses decided twice with a subscription to one of them in between, against a full read.
#[test]
fn a_kept_tuple_state_is_read_on_from_where_it_was_built() {
    let store = Store::open_in_memory(Options::default()).unwrap();
    for c in ["1", "2"] {
        course_subscriptions::define_course(&store, c, 10).unwrap();
    }
    subscribe_with(&store, "1", "s0", Retry::default()).unwrap();
    let cache = annals::decide::StateCache::new(4);
    let pair = || cache.cached((course("1"), course("2")));
    let first = store.decide(&pair()).unwrap();
    assert_eq!(first.events_read, 3, "two definitions and a subscription");
    assert_eq!(cache.len(), 1);
    subscribe_with(&store, "2", "s1", Retry::default()).unwrap();
    let second = store.decide(&pair()).unwrap();
    assert_eq!(second.events_read, 1, "only the new subscription");
    let full = store.decide(&(course("1"), course("2"))).unwrap();
    assert_eq!(second.state, full.state);
    assert_eq!(
        (second.state.0.subscribed, second.state.1.subscribed),
        (1, 1)
    );
    assert_eq!(second.condition, full.condition);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Goal: a decision that starts from kept states builds exactly the states and the
    /// condition a full read builds, and never reads more, whatever was appended in between,
    /// with or without the cache, and however small the cache (entries dropped and rebuilt).
    #[test]
    fn cached_decisions_equal_full_reads(
        ops in proptest::collection::vec((0u8..5, 0u8..4, 0u8..6), 1..60),
        capacity in 0usize..4,
    ) {
        let store = Store::open_in_memory(Options::default()).unwrap();
        let cache = CourseCache::new(capacity);
        let retry = Retry { attempts: 1, ..Retry::default() };
        for (op, c, s) in ops {
            let (c, s) = (c.to_string(), s.to_string());
            let _ = match op {
                0 => course_subscriptions::define_course(&store, &c, 1 + u32::from(s.as_bytes()[0] % 3)),
                1 => subscribe_with(&store, &c, &s, retry),
                2 => subscribe_cached(&store, &cache, &c, &s, retry),
                3 => course_subscriptions::unsubscribe(&store, &c, &s),
                _ => course_subscriptions::change_capacity(&store, &c, 4),
            };
            for course_id in ["0", "1", "2", "3"] {
                let full = store.decide(&(course(course_id), student_courses(&s))).unwrap();
                let cached = store
                    .decide(&(cache.cached(course(course_id)), student_courses(&s)))
                    .unwrap();
                proptest::prop_assert_eq!(&cached.state, &full.state);
                proptest::prop_assert_eq!(&cached.condition, &full.condition);
                proptest::prop_assert!(cached.events_read <= full.events_read);
            }
        }
    }
}
