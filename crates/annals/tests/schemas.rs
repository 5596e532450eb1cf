//! Event schemas (`annals::registry`): appends judged against their type's newest version,
//! refused whole with one error per fault; a new version checked against the stored events;
//! the registry carried by the log (a reopening, a copy); an append judged by a version that a
//! newer one replaced before it was stored stores nothing; bad registrations change nothing.

use std::sync::{Arc, Barrier};

use annals::admission::{Admission, Admitted, Admitting, Refusal, Violation};
use annals::registry::{
    Enforcement, HistoryCheck, Registration, Registry, RegistryError, UnknownTypes,
};
use annals::{AppendError, InputError, NewEvent, Options, Query, ReadOptions, Store};
use serde_json::json;

fn open(dir: &std::path::Path, registry: &Arc<Registry>) -> Store {
    let options = Options {
        admission: Some(registry.clone()),
        ..Options::default()
    };
    Store::open(dir, options).unwrap()
}

fn opened() -> serde_json::Value {
    json!({
        "type": "object",
        "required": ["id", "owner"],
        "properties": {"id": {"type": "integer"}, "owner": {"type": "string"}}
    })
}

fn register(
    registry: &Registry,
    store: &Store,
    event_type: &str,
    schema: serde_json::Value,
) -> u32 {
    registry
        .register(store, Registration::new(event_type, schema), &mut |_| {})
        .unwrap()
        .version
}

fn violations(e: AppendError) -> Vec<Violation> {
    match e {
        AppendError::Input(InputError::NotAdmitted(r)) => {
            assert_eq!(r.kind, "schema_violation", "{r}");
            r.violations
        }
        other => panic!("not a schema refusal: {other:?}"),
    }
}

/// Goal: an append whose events break their type's schema is refused whole, with one error per
/// fault naming the event's index, type, version, the path in the event and in the schema; a
/// valid append is stored; types without a schema pass by default and are refused once the
/// store says so; `warn` stores and counts; `off` checks nothing. Method: a store with one
/// schema, appends of mixed events.
#[test]
fn appends_are_judged_against_the_newest_version() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(Registry::new());
    let store = open(dir.path(), &registry);
    assert_eq!(register(&registry, &store, "Opened", opened()), 1);
    let head = store.head();
    store
        .append(
            &[NewEvent::new("Opened", r#"{"id":1,"owner":"ann"}"#)],
            None,
        )
        .unwrap();
    let refused = store
        .append(
            &[
                NewEvent::new("Opened", r#"{"id":2,"owner":"bo"}"#),
                NewEvent::new("Other", "not json at all"),
                NewEvent::new("Opened", r#"{"id":"three"}"#),
                NewEvent::new("Opened", "[1"),
            ],
            None,
        )
        .unwrap_err();
    let found = violations(refused);
    assert_eq!(
        store.head(),
        head + 1,
        "nothing of a refused append is stored"
    );
    let at = |index: usize| found.iter().filter(move |v| v.index == index);
    assert_eq!(at(0).count() + at(1).count(), 0, "{found:?}");
    let third: Vec<&Violation> = at(2).collect();
    assert!(third
        .iter()
        .all(|v| v.event_type == "Opened" && v.version == 1));
    assert!(
        third
            .iter()
            .any(|v| v.instance_path == "/id" && v.schema_path == "/properties/id/type"),
        "{third:?}"
    );
    assert!(
        third
            .iter()
            .any(|v| v.instance_path.is_empty() && v.schema_path == "/required"),
        "{third:?}"
    );
    let fourth: Vec<&Violation> = at(3).collect();
    assert_eq!(fourth.len(), 1);
    assert!(fourth[0].message.contains("not JSON"), "{fourth:?}");

    // Types without a schema: refused once the store says so.
    registry
        .set_unknown_types(&store, UnknownTypes::Refuse)
        .unwrap();
    let found = violations(
        store
            .append(&[NewEvent::new("Other", "{}")], None)
            .unwrap_err(),
    );
    assert_eq!((found[0].index, found[0].version), (0, 0));
    registry
        .set_unknown_types(&store, UnknownTypes::Allow)
        .unwrap();
    store.append(&[NewEvent::new("Other", "{}")], None).unwrap();

    // Warn: stored, counted; off: not even checked.
    registry
        .set_enforcement(&store, "Opened", Enforcement::Warn)
        .unwrap();
    let before = registry.stats();
    let warned = store
        .append(&[NewEvent::new("Opened", r#"{"id":"x"}"#)], None)
        .unwrap();
    assert_eq!(registry.stats().warned, before.warned + 1);
    registry
        .set_enforcement(&store, "Opened", Enforcement::Off)
        .unwrap();
    let unchecked = store
        .append(&[NewEvent::new("Opened", "nope")], None)
        .unwrap();
    assert_eq!(registry.stats().checked, before.checked + 1);
    registry
        .set_enforcement(&store, "Opened", Enforcement::Reject)
        .unwrap();
    assert!(store
        .append(&[NewEvent::new("Opened", "nope")], None)
        .is_err());

    // What each event was checked against.
    let against = |p| registry.checked_against(&store, "Opened", p).unwrap();
    assert_eq!(
        against(head + 1).map(|c| (c.version, c.enforcement)),
        Some((1, Enforcement::Reject))
    );
    assert_eq!(
        against(warned).map(|c| c.enforcement),
        Some(Enforcement::Warn)
    );
    assert_eq!(against(unchecked), None);
    let checked = registry.checked(&store).unwrap();
    assert_eq!(checked.through(), store.head());
    assert_eq!(checked.of("Opened", warned), against(warned));
    assert_eq!(
        checked.of("Opened", 1),
        None,
        "nothing before the first version"
    );
    // The event asked about must be stored, and of the type named.
    let e = registry.checked_against(&store, "Opened", 1).unwrap_err();
    assert_eq!(
        e.kind(),
        "other_type",
        "position 1 is the registration: {e}"
    );
    let e = registry
        .checked_against(&store, "Opened", store.head() + 1)
        .unwrap_err();
    assert_eq!(e.kind(), "no_event", "{e}");

    // A client cannot write the registry's events.
    for t in annals::admission::REGISTRY_TYPES {
        let e = store.append(&[NewEvent::new(t, "{}")], None).unwrap_err();
        assert_eq!(e.kind(), "reserved_type", "{e}");
    }
}

/// Goal: a new version that stored events do not satisfy is refused naming them, and registers
/// nothing; one they satisfy is accepted; a dry run checks and changes nothing;
/// `previously_accepted` passes over events the previous version refused; the same schema
/// again registers nothing. Method: a history with events of two shapes, versions tried on it.
#[test]
fn a_new_version_is_checked_against_the_stored_events() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(Registry::new());
    let store = open(dir.path(), &registry);
    for i in 0..50 {
        let data = format!(r#"{{"id":{i},"owner":"o{i}"}}"#);
        store
            .append(&[NewEvent::new("Opened", data)], None)
            .unwrap();
    }
    store
        .append(&[NewEvent::new("Opened", r#"{"id":"odd"}"#)], None)
        .unwrap();
    let odd = store.head();
    let refused = registry
        .register(&store, Registration::new("Opened", opened()), &mut |_| {})
        .unwrap_err();
    let RegistryError::History(failure) = &refused else {
        panic!("{refused:?}")
    };
    assert_eq!((failure.checked, failure.failed), (51, 1));
    assert_eq!(failure.events[0].position, odd);
    assert!(
        refused.to_string().contains(&format!("position {odd}")),
        "{refused}"
    );
    assert!(
        registry.types(&store).unwrap().is_empty(),
        "nothing registered"
    );
    assert_eq!(store.head(), odd);

    // Looser: accepted, after a dry run that registers nothing.
    let loose = json!({"type": "object", "required": ["id"]});
    let mut dry = Registration::new("Opened", loose.clone());
    dry.dry_run = true;
    let mut last = None;
    let done = registry
        .register(&store, dry, &mut |p| {
            assert!(p.position <= p.head);
            last = Some(p);
        })
        .unwrap();
    assert!(done.dry_run && done.position.is_none() && done.checked_events == 51);
    let last = last.expect("progress reported");
    assert_eq!((last.checked, last.failed, last.position), (51, 0, odd));
    assert_eq!(store.head(), odd, "a dry run appends nothing");
    assert_eq!(register(&registry, &store, "Opened", loose.clone()), 1);
    let again = registry
        .register(&store, Registration::new("Opened", loose), &mut |_| {})
        .unwrap();
    assert!(again.unchanged && again.version == 1);

    // The strict one, checked only against what version 1 accepted, still fails on the odd
    // event; with a version 1 that refused it, it would pass over it.
    let mut strict = Registration::new("Opened", opened());
    strict.check = HistoryCheck::PreviouslyAccepted;
    assert!(registry.register(&store, strict, &mut |_| {}).is_err());
    let dir2 = tempfile::tempdir().unwrap();
    let registry2 = Arc::new(Registry::new());
    let store2 = open(dir2.path(), &registry2);
    store2
        .append(&[NewEvent::new("T", r#"{"a":"x"}"#)], None)
        .unwrap();
    store2
        .append(&[NewEvent::new("T", r#"{"a":1}"#)], None)
        .unwrap();
    let mut v1 = Registration::new("T", json!({"type": "object"}));
    v1.check = HistoryCheck::PreviouslyAccepted;
    registry2.register(&store2, v1, &mut |_| {}).unwrap();
    registry2
        .set_enforcement(&store2, "T", Enforcement::Warn)
        .unwrap();
    store2.append(&[NewEvent::new("T", "5")], None).unwrap();
    let mut v2 = Registration::new("T", json!({"type": "object", "properties": {"a": {}}}));
    v2.check = HistoryCheck::PreviouslyAccepted;
    let done = registry2.register(&store2, v2, &mut |_| {}).unwrap();
    assert_eq!(
        (done.version, done.checked_events, done.passed_over),
        (2, 2, 1)
    );
}

/// Goal: the registry is in the log: a reopened store, a new registry on the same files and a
/// copy of the log into another store enforce the same schemas, with the same positions.
/// Method: register, close, reopen with a fresh registry; copy into a third store.
#[test]
fn the_registry_survives_reopening_and_travels_with_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(Registry::new());
    let store = open(dir.path(), &registry);
    register(&registry, &store, "Opened", opened());
    store
        .append(&[NewEvent::new("Opened", r#"{"id":1,"owner":"a"}"#)], None)
        .unwrap();
    let listed = registry.types(&store).unwrap();
    store.close().unwrap();

    let registry = Arc::new(Registry::new());
    let store = open(dir.path(), &registry);
    let again = registry.types(&store).unwrap();
    assert_eq!(
        again[0].versions[0].position,
        listed[0].versions[0].position
    );
    violations(
        store
            .append(&[NewEvent::new("Opened", "{}")], None)
            .unwrap_err(),
    );

    let copy_dir = tempfile::tempdir().unwrap();
    let copied_registry = Arc::new(Registry::new());
    let copied = open(copy_dir.path(), &copied_registry);
    annals::copy(&store, &copied, &mut |_, _, _| {}).unwrap();
    assert_eq!(copied_registry.types(&copied).unwrap()[0].versions.len(), 1);
    violations(
        copied
            .append(&[NewEvent::new("Opened", "{}")], None)
            .unwrap_err(),
    );
}

/// Goal: bad registrations get a clear error and change nothing: a schema that breaks its
/// meta-schema, an unknown draft, a reference outside the schema, a huge schema, an empty or
/// reserved type, an enforcement on a type without a schema; two registrations of the same
/// version at once: exactly one wins. Draft 7 is taken. Method: each tried; the log's head
/// compared.
#[test]
fn bad_registrations_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(Registry::new());
    let store = open(dir.path(), &registry);
    let huge: serde_json::Map<String, serde_json::Value> = (0..5000)
        .map(|i| (format!("property_{i}"), json!({"type": "string"})))
        .collect();
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        ("T", json!({"type": "no-such-type"}), "invalid_schema"),
        ("T", json!({"minLength": -1}), "invalid_schema"),
        ("T", json!(["not", "a", "schema"]), "invalid_schema"),
        (
            "T",
            json!({"$schema": "http://json-schema.org/draft-03/schema#"}),
            "unknown_draft",
        ),
        (
            "T",
            json!({"$ref": "https://example.com/elsewhere.json"}),
            "invalid_schema",
        ),
        (
            "T",
            json!({"type": "object", "properties": huge}),
            "schema_too_large",
        ),
        ("", json!({}), "invalid_type"),
        ("annals.SchemaVersion", json!({}), "invalid_type"),
        ("annals.SubjectErased", json!({}), "invalid_type"),
        ("bad\u{1}type", json!({}), "invalid_type"),
    ];
    let head = store.head();
    for (event_type, schema, kind) in cases {
        let e = registry
            .register(
                &store,
                Registration::new(event_type, schema.clone()),
                &mut |_| {},
            )
            .unwrap_err();
        assert_eq!(e.kind(), kind, "{event_type:?} {e}");
        assert!(!e.to_string().is_empty());
    }
    let e = registry
        .set_enforcement(&store, "T", Enforcement::Warn)
        .unwrap_err();
    assert_eq!(e.kind(), "schema_not_found");
    assert_eq!(store.head(), head, "nothing appended");
    assert!(registry.types(&store).unwrap().is_empty());
    let draft7 = json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"});
    register(&registry, &store, "Seven", draft7);
    assert_eq!(
        registry.types(&store).unwrap()[0].versions[0].draft,
        "draft-07"
    );

    // Two registrations of version 1 at once, through two registries on one store (as two
    // servers of one database would be): one wins, the other is told.
    let other = Arc::new(Registry::new());
    let barrier = Barrier::new(2);
    let outcomes: Vec<Result<u32, RegistryError>> = std::thread::scope(|s| {
        let tries: Vec<_> = [(&registry, "a"), (&other, "b")]
            .into_iter()
            .map(|(r, name)| {
                let (store, barrier) = (&store, &barrier);
                s.spawn(move || {
                    let mut asked =
                        Registration::new("Raced", json!({"type": "object", "title": name}));
                    asked.version = Some(1);
                    barrier.wait();
                    r.register(store, asked, &mut |_| {}).map(|r| r.version)
                })
            })
            .collect();
        tries.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let won = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(won, 1, "{outcomes:?}");
    assert!(outcomes.iter().any(|o| matches!(
        o,
        Err(RegistryError::VersionTaken {
            asked: 1,
            newest: 1,
            ..
        })
    )));
    assert_eq!(
        registry
            .schemas_of(&store, "Raced")
            .unwrap()
            .unwrap()
            .versions
            .len(),
        1
    );
}

/// Admits after the registry, then waits at a barrier twice when an event's data says so:
/// lets a test register a version between an append's admission and its storing.
#[derive(Debug)]
struct Pause(Arc<Barrier>);

impl Admission for Pause {
    fn admit(&self, append: &Admitting<'_>) -> Result<Admitted, Refusal> {
        if append.events.iter().any(|e| e.data.ends_with(b"pause\"}")) {
            self.0.wait();
            self.0.wait();
        }
        Ok(Admitted::default())
    }
}

/// Goal: an append judged by a version that a newer one replaced before it was stored stores
/// nothing (`AdmissionChanged`), so that every event fits the version in force at its position.
/// Method: an append admitted under version 1, held in admission while a version of another
/// type is registered, then let go, then sent again; one held while version 2 (which it breaks)
/// is registered.
#[test]
fn an_append_judged_by_a_replaced_version_is_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(Registry::new());
    let barrier = Arc::new(Barrier::new(2));
    let checks: Vec<Arc<dyn Admission>> = vec![registry.clone(), Arc::new(Pause(barrier.clone()))];
    let options = Options {
        admission: Some(Arc::new(checks)),
        ..Options::default()
    };
    let store = Store::open(dir.path(), options).unwrap();
    register(&registry, &store, "Paused", json!({"type": "object"}));
    let held_while = |data: &'static str, event_type: &str, schema: serde_json::Value| {
        std::thread::scope(|s| {
            let append = s.spawn(|| store.append(&[NewEvent::new("Paused", data)], None));
            barrier.wait();
            // A registration that fails must not leave the append waiting at the barrier.
            let registered =
                registry.register(&store, Registration::new(event_type, schema), &mut |_| {});
            barrier.wait();
            registered.unwrap();
            append.join().unwrap()
        })
    };
    // Any registration overtaking it sends it back to be judged again; sent again, it is
    // stored.
    let other = held_while(r#"{"a":"pause"}"#, "Unrelated", json!({"type": "object"}));
    assert!(
        matches!(other, Err(AppendError::AdmissionChanged { .. })),
        "{other:?}"
    );
    store
        .append(&[NewEvent::new("Paused", r#"{"a":1}"#)], None)
        .unwrap();
    // Version 2 refuses a field "c", which the held append has and the stored one has not.
    let v2 = json!({"type": "object", "not": {"required": ["c"]}});
    let outcome = held_while(r#"{"c":"pause"}"#, "Paused", v2);
    assert!(
        matches!(outcome, Err(AppendError::AdmissionChanged { .. })),
        "{outcome:?}"
    );
    assert_eq!(outcome.unwrap_err().kind(), "admission_changed");
    let stored: Vec<_> = store
        .read(&Query::all(), ReadOptions::forwards())
        .unwrap()
        .map(|e| e.unwrap().event_type().to_owned())
        .collect();
    let paused = stored.iter().filter(|t| *t == "Paused").count();
    assert_eq!(
        paused, 1,
        "only the first held append is stored: {stored:?}"
    );
}

/// Goal: a registry made `exempting` a journal's types never judges nor fences their events
/// and takes no schema for them, while other types are judged as before. Method: a store whose
/// registry exempts "Journaled", with types without a schema refused.
#[test]
fn exempt_types_are_never_judged() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(Registry::exempting(["Journaled"]));
    let store = open(dir.path(), &registry);
    registry
        .set_unknown_types(&store, UnknownTypes::Refuse)
        .unwrap();
    store
        .append(&[NewEvent::new("Journaled", "not json")], None)
        .unwrap();
    let e = registry
        .register(
            &store,
            Registration::new("Journaled", json!({})),
            &mut |_| {},
        )
        .unwrap_err();
    assert_eq!(e.kind(), "invalid_type", "{e}");
    violations(
        store
            .append(&[NewEvent::new("Other", "{}")], None)
            .unwrap_err(),
    );
}

/// Goal: an event of a type the registry exempts (a journal the store's own code writes) is
/// never said to have been checked, even when a schema for its type was registered by a
/// registry that did not exempt it. Method: a schema and an event of the type through a plain
/// registry; the store opened again with one exempting the type.
#[test]
fn exempt_types_are_never_said_to_be_checked() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Arc::new(Registry::new());
    let store = open(dir.path(), &plain);
    register(&plain, &store, "Journal", json!({"type": "object"}));
    let position = store
        .append(&[NewEvent::new("Journal", "{}")], None)
        .unwrap();
    let checked = plain.checked(&store).unwrap();
    assert_eq!(checked.of("Journal", position).map(|c| c.version), Some(1));
    drop(store);
    let exempting = Arc::new(Registry::exempting(["Journal"]));
    let store = open(dir.path(), &exempting);
    assert_eq!(
        exempting.checked(&store).unwrap().of("Journal", position),
        None
    );
    assert_eq!(
        exempting
            .checked_against(&store, "Journal", position)
            .unwrap(),
        None
    );
}
