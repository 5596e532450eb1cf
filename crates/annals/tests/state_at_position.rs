//! State at a position (`annals::state`): the canonical key of a query, a saved state refused
//! after an erasure of a subject it saw or against another log, a read model that refuses its
//! own checkpoint after such an erasure, and the decision cache keyed by the canonical key.

use std::sync::Arc;
use std::time::Duration;

use annals::decide::{Projection, StateCache};
use annals::readmodel::{self, Folded, ReadModelRunner, RunnerOptions};
use annals::state::{Loaded, SavedState, StateId, StateKey, States, Subjects, Unfit};
use annals::{Event, MasterKey, NewEvent, Options, Query, QueryItem, Store, SubjectOptions};
use proptest::prelude::*;

const WAIT: Duration = Duration::from_secs(20);

fn with_subjects() -> Options {
    Options {
        subjects: Some(SubjectOptions::new(
            ["customer:"],
            MasterKey::generate().unwrap(),
        )),
        ..Options::default()
    }
}

fn moved(tag: &str, street: &str) -> NewEvent {
    NewEvent::new("Moved", street.to_string()).tag(tag)
}

fn moves() -> Query {
    Query::item(QueryItem::types(["Moved"]))
}

/// The saved state of the fold `id` through the head of `store`, noting the subjects of every
/// event it folded.
fn fold_and_save(store: &Store, states: &States, id: &StateId) -> SavedState {
    let mut subjects = Subjects::of(store);
    let mut addresses = Vec::new();
    for event in store
        .read(id.query(), annals::ReadOptions::forwards())
        .unwrap()
    {
        let event = event.unwrap();
        subjects.see(&event);
        addresses.extend_from_slice(event.data());
    }
    let head = store.head();
    let at = annals::state::appended_at(store, head).unwrap().unwrap();
    let saved = SavedState::new(id, head, at, subjects.to_vec(), addresses);
    states.save("moves", &saved).unwrap();
    saved
}

fn unfit(loaded: Loaded) -> Unfit {
    match loaded {
        Loaded::Unfit(unfit) => unfit,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Goal: equal queries have one canonical key whatever the order of their items, types and
/// tags and however often one is repeated; a query that matches everything has one key in
/// every form; another query, name or version has another key.
#[test]
fn equal_queries_share_a_key_and_others_do_not() {
    let key = |query: &Query| StateKey::new("courses", 1, query);
    let query = Query::item(QueryItem::types(["Enrolled", "Left"]).and_tags(["course:1"]))
        .or(QueryItem::tags(["student:7", "course:2"]));
    let reordered = Query::item(QueryItem::tags(["course:2", "student:7", "course:2"]))
        .or(QueryItem::types(["Left", "Enrolled"]).and_tags(["course:1"]))
        .or(QueryItem::tags(["student:7", "course:2"]));
    assert_eq!(query.canonical_bytes(), reordered.canonical_bytes());
    assert_eq!(key(&query), key(&reordered));

    let everything = [
        Query::all(),
        Query::item(QueryItem::default()),
        Query::item(QueryItem::types(["Left"])).or(QueryItem::default()),
    ];
    for query in &everything {
        assert_eq!(key(query), key(&Query::all()), "{query:?}");
    }

    let others = [
        Query::item(QueryItem::types(["Enrolled", "Left"]).and_tags(["course:1"])),
        Query::item(QueryItem::types(["Enrolled"]).and_tags(["course:1"]))
            .or(QueryItem::tags(["student:7", "course:2"])),
        Query::item(QueryItem::types(["Enrolled", "Left"]).and_tags(["course:1"]))
            .or(QueryItem::tags(["student:7", "course:3"])),
        // The same strings in other places: a type is not a tag, and items do not merge.
        Query::item(QueryItem::tags(["Enrolled", "Left", "course:1"]))
            .or(QueryItem::tags(["student:7", "course:2"])),
        Query::item(QueryItem::types(["Enrolled", "Left"])).or(QueryItem::tags([
            "course:1",
            "student:7",
            "course:2",
        ])),
        Query::all(),
    ];
    for other in &others {
        assert_ne!(key(other), key(&query), "{other:?}");
    }
    assert_ne!(StateKey::new("courses", 2, &query), key(&query));
    assert_ne!(StateKey::new("course", 1, &query), key(&query));
    assert_eq!(StateKey::of_query(&query), StateKey::of_query(&reordered));
}

/// A query of one to three items over a few types and tags (so that random ones collide).
fn queries() -> impl Strategy<Value = Query> {
    let values = |prefix: &'static str| {
        prop::collection::vec((0..4u8).prop_map(move |n| format!("{prefix}{n}")), 0..3)
    };
    let item = (values("T"), values("t:")).prop_map(|(types, tags)| QueryItem { types, tags });
    prop::collection::vec(item, 1..4).prop_map(|items| Query { items })
}

/// The events a query matches among every event of one type and two tags of the strategy's
/// alphabet: two queries with different keys and the same events here would say the key
/// tells apart what DCB does not.
fn matched(query: &Query) -> Vec<(String, Vec<String>)> {
    let mut matched = Vec::new();
    for t in 0..4 {
        for a in 0..4 {
            for b in a..4 {
                let event_type = format!("T{t}");
                let tags = vec![format!("t:{a}"), format!("t:{b}")];
                if query.matches(&event_type, tags.iter().map(String::as_str)) {
                    matched.push((event_type, tags));
                }
            }
        }
    }
    matched
}

proptest! {
    /// Goal: a query's key does not change when its items, types and tags are shuffled and
    /// repeated; two queries with one key match the same events.
    #[test]
    fn keys_ignore_order_and_repeats(query in queries(), other in queries(), seed: u64) {
        let mut shuffled = query.clone();
        let mut state = seed | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for item in &mut shuffled.items {
            if let Some(first) = item.tags.first().cloned() {
                item.tags.push(first);
            }
            let turn = (next() as usize) % item.types.len().max(1);
            item.types.rotate_left(turn);
            item.tags.reverse();
        }
        let repeated = shuffled.items[(next() as usize) % shuffled.items.len()].clone();
        shuffled.items.push(repeated);
        let turn = (next() as usize) % shuffled.items.len();
        shuffled.items.rotate_left(turn);
        prop_assert_eq!(StateKey::of_query(&shuffled), StateKey::of_query(&query));
        if StateKey::of_query(&other) == StateKey::of_query(&query) {
            prop_assert_eq!(matched(&other), matched(&query));
        }
    }
}

/// Goal: a saved state that folded a data subject's events is refused once that subject is
/// erased after its position, naming the subject and the receipt; a state that never saw the
/// subject still fits. Method: a store with data subjects; two folds saved at the head, one
/// over every move (customer:1's and customer:2's) and one over customer:2's only; customer:1
/// erased; each loaded again.
#[test]
fn a_state_that_saw_an_erased_subject_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), with_subjects()).unwrap();
    store
        .append(&[moved("customer:1", "1 First")], None)
        .unwrap();
    store
        .append(&[moved("customer:2", "2 Second")], None)
        .unwrap();
    let states = States::of_store(&store, "folds");
    let everyone = StateId::new("everyone", 1, moves());
    let saved = fold_and_save(&store, &states, &everyone);
    assert_eq!(saved.subjects, ["customer:1", "customer:2"]);
    let second = StateId::new("second", 1, Query::item(QueryItem::tags(["customer:2"])));
    let second_states = States::of_store(&store, "second");
    fold_and_save(&store, &second_states, &second);
    assert!(matches!(
        states.load(&store, "moves", &everyone).unwrap(),
        Loaded::Fit(fit) if fit == saved
    ));

    let erasure = store.erase_subject("customer:1").unwrap();
    assert_eq!(
        unfit(states.load(&store, "moves", &everyone).unwrap()),
        Unfit::SubjectErased {
            subject: "customer:1".into(),
            receipt: erasure.receipt
        }
    );
    assert!(matches!(
        second_states.load(&store, "moves", &second).unwrap(),
        Loaded::Fit(_)
    ));
    // Folded again, it no longer holds customer:1's data nor names it.
    let again = fold_and_save(&store, &states, &everyone);
    assert_eq!(again.state, b"2 Second");
    assert_eq!(again.subjects, ["customer:2"]);
    assert!(matches!(
        states.load(&store, "moves", &everyone).unwrap(),
        Loaded::Fit(_)
    ));
}

/// Goal: a saved state is refused against another log: one whose event at the state's
/// position has another append time (a different log, or one restored and refilled), and one
/// that ends before the position; and against another model, version or query. Method: a
/// state saved on one store, its bytes put where a second store (other events, at other
/// times) and a third (a shorter log) keep their states.
#[test]
fn a_stale_state_is_refused_against_another_log() {
    let first = tempfile::tempdir().unwrap();
    let store = Store::open(first.path(), Options::default()).unwrap();
    for street in ["a", "b", "c"] {
        store.append(&[moved("order:1", street)], None).unwrap();
    }
    let id = StateId::new("moves", 1, moves());
    let states = States::of_store(&store, "folds");
    let saved = fold_and_save(&store, &states, &id);
    let bytes = store.companions().read("folds", "moves").unwrap().unwrap();
    let refused = |id: &StateId| unfit(states.load(&store, "moves", id).unwrap());
    assert_eq!(
        refused(&StateId::new("moves", 2, moves())),
        Unfit::OtherVersion {
            saved: 1,
            wanted: 2
        }
    );
    let other_query = StateId::new("moves", 1, Query::item(QueryItem::types(["Left"])));
    assert_eq!(refused(&other_query), Unfit::OtherQuery);
    store.close().unwrap();

    std::thread::sleep(Duration::from_millis(2));
    let second = tempfile::tempdir().unwrap();
    let other = Store::open(second.path(), Options::default()).unwrap();
    for street in ["x", "y", "z", "w"] {
        other.append(&[moved("order:1", street)], None).unwrap();
    }
    other.companions().write("folds", "moves", &bytes).unwrap();
    let loaded = States::of_store(&other, "folds")
        .load(&other, "moves", &id)
        .unwrap();
    match unfit(loaded) {
        Unfit::Stale {
            position,
            saved_us,
            found_us,
        } => {
            assert_eq!((position, saved_us), (saved.position, saved.appended_at_us));
            assert_ne!(found_us, Some(saved_us));
        }
        other => panic!("{other:?}"),
    }

    let shorter = Store::open_in_memory(Options::default()).unwrap();
    shorter.append(&[moved("order:1", "a")], None).unwrap();
    shorter
        .companions()
        .write("folds", "moves", &bytes)
        .unwrap();
    let loaded = States::of_store(&shorter, "folds")
        .load(&shorter, "moves", &id)
        .unwrap();
    assert_eq!(
        unfit(loaded),
        Unfit::BeyondHead {
            position: saved.position,
            head: 1
        }
    );
}

type Addresses = Vec<String>;

fn addresses(name: &str) -> Folded<Addresses, fn(&mut Addresses, &Event)> {
    fn note(addresses: &mut Addresses, event: &Event) {
        addresses.push(String::from_utf8_lossy(event.data()).into_owned());
    }
    Folded::new(
        name,
        moves(),
        Addresses::new(),
        note as fn(&mut Addresses, &Event),
    )
}

/// Goal: an embedded read model never serves a checkpoint that saw a subject erased while it
/// was stopped: the library refuses the checkpoint when the model starts, saying which
/// subject, and the model is folded again from the first event without the subject's data.
/// Method: a model folding every address, stopped with a checkpoint that names customer:1;
/// customer:1 erased; the model started again.
#[test]
fn a_read_model_refuses_its_checkpoint_after_an_erasure() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), with_subjects()).unwrap());
    store
        .append(&[moved("customer:1", "1 First")], None)
        .unwrap();
    store
        .append(&[moved("customer:2", "2 Second")], None)
        .unwrap();
    let runner =
        ReadModelRunner::start(&store, addresses("all"), RunnerOptions::default()).unwrap();
    assert!(runner.wait_for(2, WAIT));
    assert_eq!(runner.stop().checkpoint_position, 2);
    let listed = readmodel::list_checkpoints(dir.path()).unwrap();
    assert_eq!((listed[0].position, listed[0].subjects), (2, 2));

    store.erase_subject("customer:1").unwrap();
    let runner =
        ReadModelRunner::start(&store, addresses("all"), RunnerOptions::default()).unwrap();
    let status = runner.status();
    assert_eq!(status.resumed_from, 0);
    assert_eq!(status.rebuilds, 1);
    let why = status.rebuilt_because.unwrap();
    assert!(
        why.contains("customer:1") && why.contains("erased"),
        "{why}"
    );
    assert!(runner.wait_for(store.head(), WAIT));
    assert_eq!(runner.read(|m| m.state().clone()), ["", "2 Second"]);
    runner.stop();
}

/// Goal: the decision cache keeps a state under its query's canonical key: a decision on an
/// equal query written in another order starts from the state the first one built and reads
/// only what came after it.
#[test]
fn the_decision_cache_finds_an_equal_query_in_another_order() {
    let store = Store::open_in_memory(Options::default()).unwrap();
    for course in ["course:1", "course:2", "course:1"] {
        store
            .append(&[NewEvent::new("Enrolled", "").tag(course)], None)
            .unwrap();
    }
    let count = |n: &mut u64, _: &Event| *n += 1;
    let one_then_two = Query::item(QueryItem::tags(["course:1"])).or(QueryItem::tags(["course:2"]));
    let two_then_one = Query::item(QueryItem::tags(["course:2"])).or(QueryItem::tags(["course:1"]));
    let cache = StateCache::new(8);
    let first = store
        .decide(&cache.cached(Projection::new(one_then_two, 0u64, count)))
        .unwrap();
    assert_eq!((first.state, first.events_read), (3, 3));
    assert_eq!(cache.get(&two_then_one), Some((3, 3)));

    store
        .append(&[NewEvent::new("Enrolled", "").tag("course:2")], None)
        .unwrap();
    let second = store
        .decide(&cache.cached(Projection::new(two_then_one.clone(), 0u64, count)))
        .unwrap();
    assert_eq!((second.state, second.events_read), (4, 1));
    assert_eq!(cache.len(), 1);
    assert_eq!(cache.get(&two_then_one), Some((4, 4)));
}
