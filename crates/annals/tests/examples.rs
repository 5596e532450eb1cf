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

    #[test]
    fn a_free_name_is_claimed() {
        let store = given(&[claimed("a1", "other")]);
        register(&store, "b2", "ada").unwrap();
        let new = events_after(&store, 1);
        assert_eq!(types(&new), ["UsernameClaimed"]);
        assert_eq!(new[0].data(), b"ada");
    }

    #[test]
    fn a_taken_name_is_refused() {
        let store = given(&[claimed("a1", "ada")]);
        let err = register(&store, "b2", "ada").unwrap_err();
        assert!(err.to_string().contains("taken"));
        assert!(events_after(&store, 1).is_empty());
    }

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

    #[test]
    fn racing_claims_for_one_name_give_one_owner() {
        let store = Arc::new(given(&[]));
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                std::thread::spawn(move || register(&store, &format!("acct{i}"), "popular").is_ok())
            })
            .collect();
        let winners = threads
            .into_iter()
            .filter(|_| true)
            .map(|t| t.join().unwrap())
            .filter(|&ok| ok)
            .count();
        assert_eq!(winners, 1);
        assert_eq!(store.head(), 1);
    }
}

mod idempotency {
    use super::idempotency_token::{place_order, Placed};
    use super::*;

    #[test]
    fn a_new_token_records_the_order() {
        let store = given(&[]);
        assert_eq!(place_order(&store, "t-1", "o-1").unwrap(), Placed::New(1));
        assert_eq!(types(&events_after(&store, 0)), ["OrderPlaced"]);
    }

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

    #[test]
    fn racing_copies_of_one_request_record_it_once() {
        let store = Arc::new(given(&[]));
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                std::thread::spawn(move || place_order(&store, "t-9", &format!("o-{i}")).unwrap())
            })
            .collect();
        let outcomes: Vec<Placed> = threads.into_iter().map(|t| t.join().unwrap()).collect();
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
