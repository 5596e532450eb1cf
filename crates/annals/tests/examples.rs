//! The DCB examples (crates/annals/examples), each as given / when / then: given these events,
//! when this command runs, then these events are appended (or the command is refused).

use std::sync::Arc;

use annals::{Event, NewEvent, Options, Query, ReadOptions, Store};

#[path = "../examples/unique_username/main.rs"]
mod unique_username;

#[path = "../examples/idempotency_token/main.rs"]
mod idempotency_token;

fn given(events: &[NewEvent]) -> Store {
    let store = Store::open_in_memory(Options::default()).unwrap();
    for e in events {
        store.append(std::slice::from_ref(e), None).unwrap();
    }
    store
}

fn events_after(store: &Store, after: u64) -> Vec<Event> {
    store
        .read(&Query::all(), ReadOptions::forwards().after(after))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Runs `command` on 16 threads at once (each given its index) and collects the outcomes.
fn race<T: Send + 'static>(
    store: &Arc<Store>,
    command: impl Fn(&Store, usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let command = Arc::new(command);
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let (store, command) = (store.clone(), command.clone());
            std::thread::spawn(move || command(&store, i))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// How many of a race's outcomes succeeded.
fn successes(outcomes: &[bool]) -> usize {
    outcomes.iter().filter(|&&ok| ok).count()
}

fn types(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.event_type()).collect()
}

mod username {
    use super::unique_username::{delete_account, register};
    use super::*;

    fn claimed(account: &str, name: &str) -> NewEvent {
        NewEvent::new("UsernameClaimed", name.to_string())
            .tag(format!("username:{name}"))
            .tag(format!("account:{account}"))
    }

    /// Goal: the unique username example claims a name nobody holds: registering appends one claim
    /// carrying the name.
    #[test]
    fn a_free_name_is_claimed() {
        let store = given(&[claimed("a1", "other")]);
        register(&store, "b2", "ada").unwrap();
        let new = events_after(&store, 1);
        assert_eq!(types(&new), ["UsernameClaimed"]);
        assert_eq!(new[0].data(), b"ada");
    }

    /// Goal: the unique username example refuses a name another account holds, and appends nothing.
    #[test]
    fn a_taken_name_is_refused() {
        let store = given(&[claimed("a1", "ada")]);
        let err = register(&store, "b2", "ada").unwrap_err();
        assert!(err.to_string().contains("taken"));
        assert!(events_after(&store, 1).is_empty());
    }

    /// Goal: deleting an account releases its username, and another account can then claim it.
    #[test]
    fn a_released_name_is_claimable_again() {
        let store = given(&[claimed("a1", "ada")]);
        delete_account(&store, "a1").unwrap();
        assert_eq!(
            types(&events_after(&store, 1)),
            ["AccountDeleted", "UsernameReleased"]
        );
        register(&store, "b2", "ada").unwrap();
        assert_eq!(types(&events_after(&store, 3)), ["UsernameClaimed"]);
    }

    /// Goal: accounts racing to claim one name never share it: exactly one claim succeeds and only
    /// it is appended. Method: many threads register the same name at once.
    #[test]
    fn racing_claims_for_one_name_give_one_owner() {
        let store = Arc::new(given(&[]));
        let outcomes = race(&store, |store, i| {
            register(store, &format!("acct{i}"), "popular").is_ok()
        });
        assert_eq!(successes(&outcomes), 1);
        assert_eq!(store.head(), 1);
    }
}

mod idempotency {
    use super::idempotency_token::{place_order, Placed};
    use super::*;

    /// Goal: the idempotency token example records an order placed with a token it has not seen.
    #[test]
    fn a_new_token_records_the_order() {
        let store = given(&[]);
        assert_eq!(place_order(&store, "t-1", "o-1").unwrap(), Placed::New(1));
        assert_eq!(types(&events_after(&store, 0)), ["OrderPlaced"]);
    }

    /// Goal: a request repeated with a token already used answers with the order first placed under
    /// it, and records nothing new.
    #[test]
    fn a_repeated_token_answers_with_the_original_and_records_nothing() {
        let store = given(&[NewEvent::new("OrderPlaced", "o-1")
            .tag("idempotency:t-1")
            .tag("order:o-1")]);
        assert_eq!(
            place_order(&store, "t-1", "o-2").unwrap(),
            Placed::Duplicate("o-1".into())
        );
        assert!(events_after(&store, 1).is_empty());
    }

    /// Goal: copies of one request sent at once with one token record the order once; the others
    /// are told it is a duplicate. Method: many threads place an order with the same token.
    #[test]
    fn racing_copies_of_one_request_record_it_once() {
        let store = Arc::new(given(&[]));
        let outcomes = race(&store, |store, i| {
            place_order(store, "t-9", &format!("o-{i}")).unwrap()
        });
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| matches!(o, Placed::New(_)))
                .count(),
            1
        );
        assert_eq!(store.head(), 1);
    }
}

#[path = "../examples/opt_in_token/main.rs"]
mod opt_in_token;

#[path = "../examples/product_price/main.rs"]
mod product_price;

#[path = "../examples/aggregate/main.rs"]
mod aggregate;

mod opt_in {
    use super::opt_in_token::{confirm, issue};
    use super::*;

    /// Goal: the opt-in token example confirms a sign-up with the token it issued, and refuses the
    /// token when it is used again.
    #[test]
    fn an_issued_token_confirms_once() {
        let store = given(&[]);
        issue(&store, "ada@example.com", "t1").unwrap();
        confirm(&store, "t1").unwrap();
        assert_eq!(types(&events_after(&store, 1)), ["SignUpConfirmed"]);
        let err = confirm(&store, "t1").unwrap_err();
        assert!(err.to_string().contains("already used"));
        assert_eq!(store.head(), 2);
    }

    /// Goal: a confirmation with a token that was never issued is refused, and appends nothing.
    #[test]
    fn an_unknown_token_is_refused() {
        let store = given(&[]);
        assert!(confirm(&store, "nope")
            .unwrap_err()
            .to_string()
            .contains("unknown"));
        assert_eq!(store.head(), 0);
    }

    /// Goal: confirmations racing with one token confirm the sign-up once. Method: many threads
    /// confirm the same issued token at once.
    #[test]
    fn racing_confirmations_confirm_once() {
        let store = Arc::new(given(&[]));
        issue(&store, "ada@example.com", "t2").unwrap();
        let outcomes = race(&store, |store, _| confirm(store, "t2").is_ok());
        assert_eq!(successes(&outcomes), 1);
        assert_eq!(store.head(), 2);
    }
}

mod price {
    use super::product_price::{change_price, order};
    use super::*;

    const GRACE: u64 = 60_000_000;

    fn price_changes() -> Store {
        let store = given(&[]);
        change_price(&store, "p1", 100).unwrap();
        change_price(&store, "p1", 120).unwrap();
        store
    }

    fn changed_at(store: &Store) -> u64 {
        events_after(store, 1)[0].appended_at_us()
    }

    /// Goal: the product price example accepts an order at the product's current price, however
    /// long after the change.
    #[test]
    fn the_current_price_is_accepted() {
        let store = price_changes();
        let now = changed_at(&store) + 10 * GRACE;
        order(&store, "p1", 120, now, GRACE).unwrap();
        assert_eq!(types(&events_after(&store, 2)), ["OrderPlaced"]);
    }

    /// Goal: an order at the price a product had just before its last change is still accepted
    /// within the grace period after the change.
    #[test]
    fn the_previous_price_is_honoured_within_the_grace_period() {
        let store = price_changes();
        order(&store, "p1", 100, changed_at(&store) + GRACE / 2, GRACE).unwrap();
        assert_eq!(store.head(), 3);
    }

    /// Goal: an order at the previous price is refused once the grace period after the change is
    /// over, and appends nothing.
    #[test]
    fn the_previous_price_is_refused_after_the_grace_period() {
        let store = price_changes();
        let err = order(&store, "p1", 100, changed_at(&store) + 2 * GRACE, GRACE).unwrap_err();
        assert!(err.to_string().contains("not valid"));
        assert_eq!(store.head(), 2);
    }

    /// Goal: an order is refused at a price the product had before its previous one, at a price it
    /// never had, and for a product that does not exist.
    #[test]
    fn an_older_or_invented_price_is_refused() {
        let store = price_changes();
        change_price(&store, "p1", 130).unwrap();
        let now = events_after(&store, 2)[0].appended_at_us();
        assert!(
            order(&store, "p1", 100, now, GRACE).is_err(),
            "two changes ago"
        );
        assert!(order(&store, "p1", 1, now, GRACE).is_err());
        assert!(
            order(&store, "p2", 100, now, GRACE).is_err(),
            "no such product"
        );
    }
}

mod account {
    use super::aggregate::{balance, deposit, open, withdraw, Account};
    use super::*;

    /// Goal: the aggregate example keeps an account's rules: a withdrawal beyond the balance is
    /// refused, money moves only in an opened account, and an account opens once.
    #[test]
    fn deposits_and_withdrawals_keep_the_balance_non_negative() {
        let store = given(&[]);
        open(&store, "a").unwrap();
        deposit(&store, "a", 100).unwrap();
        withdraw(&store, "a", 70).unwrap();
        assert!(withdraw(&store, "a", 70)
            .unwrap_err()
            .to_string()
            .contains("insufficient"));
        assert_eq!(
            balance(&store, "a"),
            Account {
                opened: true,
                balance: 30
            }
        );
        assert!(deposit(&store, "nobody", 5).is_err());
        assert!(open(&store, "a").is_err());
    }

    /// Goal: withdrawals racing on one account never take it below zero: as many succeed as the
    /// balance covers, and the balance is what is left. Method: many threads withdraw from one
    /// account at once.
    #[test]
    fn racing_withdrawals_never_overdraw() {
        let store = Arc::new(given(&[]));
        open(&store, "b").unwrap();
        deposit(&store, "b", 100).unwrap();
        let outcomes = race(&store, |store, _| withdraw(store, "b", 30).is_ok());
        assert_eq!(
            successes(&outcomes),
            3,
            "100 covers three withdrawals of 30"
        );
        assert_eq!(balance(&store, "b").balance, 10);
    }
}

#[path = "../examples/course_subscriptions/main.rs"]
mod course_subscriptions;

#[path = "../examples/invoice_numbers/main.rs"]
mod invoice_numbers;

mod courses {
    use super::course_subscriptions::{
        change_capacity, define_course, subscribe, unsubscribe, Refusal,
    };
    use super::*;
    use annals::decide::DecideError;

    fn defined(course: &str, capacity: u32) -> NewEvent {
        NewEvent::new("CourseDefined", capacity.to_string()).tag(format!("course:{course}"))
    }

    fn subscribed(course: &str, student: &str) -> NewEvent {
        NewEvent::new("StudentSubscribed", "")
            .tag(format!("course:{course}"))
            .tag(format!("student:{student}"))
    }

    fn refusal(outcome: course_subscriptions::Outcome) -> Refusal {
        match outcome {
            Err(DecideError::Rejected(r)) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Goal: the course subscriptions example defines a course once; defining it again is refused
    /// and appends nothing.
    #[test]
    fn a_course_is_defined_once() {
        let store = given(&[]);
        define_course(&store, "c1", 10).unwrap();
        assert_eq!(types(&events_after(&store, 0)), ["CourseDefined"]);
        assert_eq!(
            refusal(define_course(&store, "c1", 5)),
            Refusal::CourseExists
        );
        assert_eq!(events_after(&store, 1).len(), 0);
    }

    /// Goal: a student joins a course that has a free seat, the subscription tagged with both the
    /// course and the student.
    #[test]
    fn a_student_joins_a_course_with_a_free_seat() {
        let store = given(&[defined("c1", 2), subscribed("c1", "ada")]);
        subscribe(&store, "c1", "bob").unwrap();
        let new = events_after(&store, 2);
        assert_eq!(types(&new), ["StudentSubscribed"]);
        assert_eq!(
            new[0].tags().collect::<Vec<_>>(),
            ["course:c1", "student:bob"]
        );
    }

    /// Goal: subscribing to a course that was never defined is refused.
    #[test]
    fn a_course_that_does_not_exist_is_refused() {
        let store = given(&[defined("c1", 2)]);
        assert_eq!(
            refusal(subscribe(&store, "c2", "ada")),
            Refusal::NoSuchCourse
        );
    }

    /// Goal: subscribing to a course whose seats are all taken is refused with its capacity, and
    /// appends nothing.
    #[test]
    fn a_full_course_is_refused() {
        let store = given(&[
            defined("c1", 2),
            subscribed("c1", "ada"),
            subscribed("c1", "bob"),
        ]);
        assert_eq!(
            refusal(subscribe(&store, "c1", "cy")),
            Refusal::CourseFull { capacity: 2 }
        );
        assert!(events_after(&store, 3).is_empty());
    }

    /// Goal: a student already subscribed to a course cannot subscribe to it again.
    #[test]
    fn joining_twice_is_refused() {
        let store = given(&[defined("c1", 5), subscribed("c1", "ada")]);
        assert_eq!(
            refusal(subscribe(&store, "c1", "ada")),
            Refusal::AlreadySubscribed
        );
    }

    /// Goal: a student at the limit of courses is refused one more, and leaving one course makes
    /// room for another.
    #[test]
    fn a_fourth_course_is_refused() {
        let store = given(&[
            defined("c1", 5),
            defined("c2", 5),
            defined("c3", 5),
            defined("c4", 5),
            subscribed("c1", "ada"),
            subscribed("c2", "ada"),
            subscribed("c3", "ada"),
        ]);
        assert_eq!(
            refusal(subscribe(&store, "c4", "ada")),
            Refusal::StudentAtLimit
        );
        // Leaving one course makes room for another.
        unsubscribe(&store, "c2", "ada").unwrap();
        subscribe(&store, "c4", "ada").unwrap();
        assert_eq!(
            types(&events_after(&store, 7)),
            ["StudentUnsubscribed", "StudentSubscribed"]
        );
    }

    /// Goal: a student leaving a full course frees the seat for another student, and leaving a
    /// course one is not in is refused.
    #[test]
    fn leaving_frees_a_seat_and_leaving_twice_is_refused() {
        let store = given(&[defined("c1", 1), subscribed("c1", "ada")]);
        assert!(subscribe(&store, "c1", "bob").is_err());
        unsubscribe(&store, "c1", "ada").unwrap();
        assert_eq!(
            refusal(unsubscribe(&store, "c1", "ada")),
            Refusal::NotSubscribed
        );
        subscribe(&store, "c1", "bob").unwrap();
    }

    /// Goal: a course's capacity can be raised or lowered but not below the students subscribed,
    /// subscriptions follow the new capacity, and a course that does not exist is refused.
    #[test]
    fn capacity_changes_but_not_below_the_subscribed() {
        let store = given(&[
            defined("c1", 3),
            subscribed("c1", "ada"),
            subscribed("c1", "bob"),
        ]);
        assert_eq!(
            refusal(change_capacity(&store, "c1", 1)),
            Refusal::CapacityBelowSubscriptions { subscribed: 2 }
        );
        change_capacity(&store, "c1", 2).unwrap();
        assert_eq!(
            refusal(subscribe(&store, "c1", "cy")),
            Refusal::CourseFull { capacity: 2 }
        );
        change_capacity(&store, "c1", 4).unwrap();
        subscribe(&store, "c1", "cy").unwrap();
        assert_eq!(
            refusal(change_capacity(&store, "c9", 4)),
            Refusal::NoSuchCourse
        );
    }

    /// Goal: the async form of the subscribe command decides as the blocking one does: it takes the
    /// last seat and refuses a full course. A cache that keeps nothing still works.
    #[test]
    fn the_async_command_decides_alike() {
        use super::course_subscriptions::subscribe_async;
        let store = given(&[defined("c1", 1)]);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let retry = annals::decide::Retry::default();
        let courses = course_subscriptions::CourseCache::new(0);
        runtime.block_on(async {
            subscribe_async(&store, &courses, "c1", "ada", retry, tokio::time::sleep)
                .await
                .unwrap();
            let full =
                subscribe_async(&store, &courses, "c1", "bob", retry, tokio::time::sleep).await;
            assert_eq!(refusal(full), Refusal::CourseFull { capacity: 1 });
        });
        assert_eq!(types(&events_after(&store, 1)), ["StudentSubscribed"]);
        assert!(courses.is_empty(), "a cache of capacity 0 keeps nothing");
    }

    /// Goal: the subscribe command that keeps course states in a cache still decides on the whole
    /// log: what others appended since the state was kept (a student leaving, a capacity change) is
    /// read on top of it. Method: subscribe through the cache, change the course without it, and
    /// check each decision and the events appended.
    #[test]
    fn the_cached_command_sees_what_others_appended_since() {
        use super::course_subscriptions::{subscribe_cached, CourseCache};
        use annals::decide::Project;
        let store = given(&[defined("c1", 2), subscribed("c1", "ada")]);
        let courses = CourseCache::new(10);
        let retry = annals::decide::Retry::default();
        subscribe_cached(&store, &courses, "c1", "bob", retry).unwrap();
        // Kept: the course as read before bob's subscription.
        let query = course_subscriptions::course("c1").query();
        let (head, kept) = courses.get(&query).unwrap();
        assert_eq!((head, kept.subscribed), (2, 1));
        // Changes made without the cache are read on top of the kept state.
        unsubscribe(&store, "c1", "ada").unwrap();
        subscribe_cached(&store, &courses, "c1", "cy", retry).unwrap();
        assert_eq!(
            refusal(subscribe_cached(&store, &courses, "c1", "dan", retry)),
            Refusal::CourseFull { capacity: 2 }
        );
        assert_eq!(courses.get(&query).unwrap().1.subscribed, 2);
        change_capacity(&store, "c1", 3).unwrap();
        subscribe_cached(&store, &courses, "c1", "dan", retry).unwrap();
        assert_eq!(
            types(&events_after(&store, 2)),
            [
                "StudentSubscribed",
                "StudentUnsubscribed",
                "StudentSubscribed",
                "CourseCapacityChanged",
                "StudentSubscribed"
            ]
        );
    }

    /// Goal: the subscribe command that starts the course from the store's snapshot decides as
    /// the plain one does, blocking and async: a snapshot saved every two events, changes made
    /// without it read on top, the course never overfilled, the snapshot's state the course's.
    #[test]
    fn the_snapshotted_command_decides_alike() {
        use super::course_subscriptions::{
            snapshotted_course, subscribe_snapshotted, subscribe_snapshotted_async,
        };
        use annals::snapshot::{Lookup, SnapshotPolicy};
        let store = given(&[defined("c1", 4)]);
        let policy = SnapshotPolicy {
            every: 2,
            slower_than: None,
        };
        let retry = annals::decide::Retry::default();
        subscribe_snapshotted(&store, "c1", "ada", policy, retry).unwrap();
        subscribe_snapshotted(&store, "c1", "bob", policy, retry).unwrap();
        unsubscribe(&store, "c1", "ada").unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            for student in ["cy", "dan", "eve"] {
                subscribe_snapshotted_async(
                    &store,
                    "c1",
                    student,
                    policy,
                    retry,
                    tokio::time::sleep,
                )
                .await
                .unwrap();
            }
            let full =
                subscribe_snapshotted_async(&store, "c1", "fay", policy, retry, tokio::time::sleep)
                    .await;
            assert_eq!(refusal(full), Refusal::CourseFull { capacity: 4 });
        });
        let model = snapshotted_course("c1", policy);
        let Lookup::Hit(saved) = store.snapshots().load(model.id()).unwrap() else {
            panic!("a snapshot of the course");
        };
        assert!(saved.position > 1);
        let full = store.decide(&course_subscriptions::course("c1")).unwrap();
        assert_eq!(store.decide(&model).unwrap().state, full.state);
        assert_eq!(full.state.subscribed, 4);
    }

    /// Goal: students racing for a course's seats never overfill it: exactly as many succeed as
    /// there are seats. Method: more threads than seats subscribe at once.
    #[test]
    fn racing_for_the_last_seats() {
        let store = Arc::new(given(&[defined("c1", 5)]));
        let outcomes = race(&store, |store, i| {
            subscribe(store, "c1", &format!("s{i}")).is_ok()
        });
        assert_eq!(successes(&outcomes), 5);
        assert_eq!(events_after(&store, 1).len(), 5);
    }

    /// Goal: one student subscribing to many courses at once still stops at the limit of courses.
    /// Method: threads subscribe the same student to a different course each.
    #[test]
    fn one_student_racing_past_the_limit() {
        let store = Arc::new(given(
            &(0..16)
                .map(|c| defined(&format!("c{c}"), 10))
                .collect::<Vec<_>>(),
        ));
        let outcomes = race(&store, |store, i| {
            subscribe(store, &format!("c{i}"), "ada").is_ok()
        });
        assert_eq!(successes(&outcomes), 3);
    }
}

mod invoices {
    use super::invoice_numbers::create_invoice;
    use super::*;
    use annals::decide::Retry;

    fn invoice(number: u64) -> NewEvent {
        NewEvent::new("InvoiceCreated", number.to_string()).tag(format!("invoice:{number}"))
    }

    /// Goal: the invoice numbers example gives the first invoice number one, tagged with the
    /// invoice and the customer.
    #[test]
    fn the_first_invoice_is_number_one() {
        let store = given(&[NewEvent::new("CustomerRegistered", "")]);
        let created = create_invoice(&store, "c1", Retry::default()).unwrap();
        assert_eq!(created.number, 1);
        let new = events_after(&store, 1);
        assert_eq!(types(&new), ["InvoiceCreated"]);
        assert_eq!(new[0].data(), b"1");
        assert_eq!(
            new[0].tags().collect::<Vec<_>>(),
            ["invoice:1", "customer:c1"]
        );
    }

    /// Goal: a new invoice takes the number after the last invoice's, whatever other events came
    /// between.
    #[test]
    fn the_next_invoice_follows_the_last() {
        let store = given(&[invoice(1), invoice(2), NewEvent::new("Other", "9")]);
        assert_eq!(
            create_invoice(&store, "c1", Retry::default())
                .unwrap()
                .number,
            3
        );
    }

    /// Goal: a creator whose number was taken by an invoice appended meanwhile has its append
    /// refused by the condition, and creating again takes the next free number.
    #[test]
    fn a_condition_that_fails_is_decided_again() {
        // A creator that read 2 as the last number meets invoice 3 appended meanwhile.
        let store = given(&[invoice(1), invoice(2)]);
        let stale = store.decide(&invoice_numbers::last_number()).unwrap();
        assert_eq!(stale.state, 2);
        create_invoice(&store, "c1", Retry::default()).unwrap();
        assert!(store.append(&[invoice(3)], Some(&stale.condition)).is_err());
        assert_eq!(
            create_invoice(&store, "c2", Retry::default())
                .unwrap()
                .number,
            4
        );
    }

    /// Goal: invoices created at once take distinct numbers with no gap, each retried until it
    /// succeeds. Method: many threads create an invoice at once, with retries enough for all.
    #[test]
    fn racing_creators_take_distinct_numbers() {
        let store = Arc::new(given(&[]));
        let mut numbers = race(&store, |store, i| {
            create_invoice(
                store,
                &format!("c{i}"),
                Retry {
                    attempts: 100,
                    ..Retry::default()
                },
            )
            .unwrap()
            .number
        });
        numbers.sort_unstable();
        assert_eq!(numbers, (1..=16).collect::<Vec<_>>());
    }
}
