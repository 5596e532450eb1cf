//! Goal: a data subject's events are stored encrypted and erased by deleting the subject's
//! key: the data never lies in the clear in the data directory, reads back whole before the
//! erasure and without data after it (position, type and tags kept), the erasure leaves a
//! receipt and refuses later appends naming the subject, and it all holds across a restart.

use annals::{
    AppendCondition, AppendError, InputError, MasterKey, NewEvent, Options, Query, QueryItem,
    ReadOptions, Store, SubjectOptions, SUBJECT_ERASED_TYPE,
};
use annals_testkit::eventually;

const MARKER: &str = "MARKER-personal-data-7f3a";

fn options(master: &MasterKey) -> Options {
    Options {
        subjects: Some(SubjectOptions::new(
            ["customer:", "employee:"],
            master.clone(),
        )),
        ..Options::default()
    }
}

fn raw_files_hold(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in walk(dir) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        if bytes.windows(needle.len()).any(|w| w == needle) {
            found.push(entry.display().to_string());
        }
    }
    found
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn all(store: &Store) -> Vec<annals::Event> {
    store
        .read(&Query::all(), ReadOptions::forwards())
        .unwrap()
        .map(|e| e.unwrap())
        .collect()
}

/// Goal: a subject's events read back whole while its key lives, and an erasure hides the data of
/// every event naming it (for either of two subjects), leaves a receipt, refuses later appends
/// naming the subject and holds across a restart; the data is never in the data directory's bytes,
/// and verification finds a key or an erasure for every sealed event.
#[test]
fn a_subjects_events_are_sealed_read_back_and_erased_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterKey::generate().unwrap();
    let store = Store::open(dir.path(), options(&master)).unwrap();
    store
        .append(
            &[
                NewEvent::new("AddressChanged", format!("{MARKER} 1 Main St"))
                    .tag("customer:42")
                    .metadata(format!("{MARKER} meta")),
                NewEvent::new("OrderPlaced", "order 9, no personal data").tag("order:9"),
                NewEvent::new("Married", format!("{MARKER} both"))
                    .tags(["customer:42", "customer:43"]),
                NewEvent::new("Hired", format!("{MARKER} salary")).tag("employee:7"),
            ],
            None,
        )
        .unwrap();
    let events = all(&store);
    assert_eq!(events[0].data(), format!("{MARKER} 1 Main St").as_bytes());
    assert_eq!(events[0].metadata(), format!("{MARKER} meta").as_bytes());
    assert_eq!(events[2].data(), format!("{MARKER} both").as_bytes());
    assert!(events.iter().all(|e| !e.is_erased()));
    store.close().unwrap();
    assert_eq!(
        raw_files_hold(dir.path(), MARKER.as_bytes()),
        Vec::<String>::new()
    );

    let store = Store::open(dir.path(), options(&master)).unwrap();
    assert_eq!(all(&store)[3].data(), format!("{MARKER} salary").as_bytes());
    let erasure = store.erase_subject("customer:43").unwrap();
    assert_eq!(erasure.events, 1);
    assert!(!erasure.already);
    let events = all(&store);
    assert!(!events[0].is_erased(), "customer:42 alone stays readable");
    assert!(
        events[2].is_erased(),
        "either subject's erasure hides the event of both"
    );
    assert!(events[2].data().is_empty() && events[2].metadata().is_empty());
    assert_eq!(events[2].event_type(), "Married");
    assert_eq!(
        events[2].tags().collect::<Vec<_>>(),
        ["customer:42", "customer:43"]
    );
    let receipt = &events[erasure.receipt as usize - 1];
    assert_eq!(receipt.event_type(), SUBJECT_ERASED_TYPE);
    assert_eq!(receipt.tags().collect::<Vec<_>>(), ["customer:43"]);

    // Idempotent; later appends naming the subject are refused and change nothing.
    let head = store.head();
    let again = store.erase_subject("customer:43").unwrap();
    assert!(again.already);
    assert_eq!(again.receipt, erasure.receipt);
    let refused = store
        .append(&[NewEvent::new("Moved", "x").tag("customer:43")], None)
        .unwrap_err();
    assert!(
        matches!(refused, AppendError::SubjectErased { .. }),
        "{refused}"
    );
    assert_eq!(store.head(), head);

    // A condition over erased events still sees them.
    let condition = AppendCondition::new(Query::item(QueryItem::tags(["customer:43"])), Some(0));
    let failed = store
        .append(
            &[NewEvent::new("Checked", "y").tag("order:10")],
            Some(&condition),
        )
        .unwrap_err();
    assert!(matches!(failed, AppendError::ConditionFailed { .. }));

    // A subject with no events: 0, recorded, later appends refused.
    let none = store.erase_subject("employee:99").unwrap();
    assert_eq!(none.events, 0);
    assert!(store
        .append(&[NewEvent::new("Hired", "z").tag("employee:99")], None)
        .is_err());

    // Bad input: clear errors, nothing changed.
    let head = store.head();
    for tag in ["order:9", "", "customer:"] {
        let e = store.erase_subject(tag).unwrap_err();
        assert!(matches!(e, AppendError::Input(_)), "{tag}: {e}");
    }
    let e = store
        .append(
            &[NewEvent::new(SUBJECT_ERASED_TYPE, "{}").tag("customer:42")],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(e, AppendError::Input(InputError::ReservedType { .. })),
        "{e}"
    );
    assert_eq!(store.head(), head);
    store.close().unwrap();
    assert_eq!(
        raw_files_hold(dir.path(), MARKER.as_bytes()),
        Vec::<String>::new()
    );

    // After a restart: the same.
    let store = Store::open(dir.path(), options(&master)).unwrap();
    let events = all(&store);
    assert!(events[2].is_erased() && !events[0].is_erased());
    assert_eq!(events[0].data(), format!("{MARKER} 1 Main St").as_bytes());
    assert_eq!(store.subject_counts(), Some((2, 2)));
    let receipts = store
        .read(
            &Query::item(QueryItem::types([SUBJECT_ERASED_TYPE])),
            ReadOptions::forwards(),
        )
        .unwrap()
        .count();
    assert_eq!(
        receipts, 2,
        "one receipt per erasure, none added by the restart"
    );
    store.close().unwrap();

    // verify: every sealed event has a key or an erasure; without the key file it says so.
    let report = annals::verify(dir.path()).unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.sealed_events, 3);
    let keys = dir.path().join("subjects.keys");
    let saved = std::fs::read(&keys).unwrap();
    std::fs::remove_file(&keys).unwrap();
    let report = annals::verify(dir.path()).unwrap();
    assert!(!report.is_clean());
    assert!(report
        .subject_problem
        .unwrap()
        .contains("neither a key nor an erasure"));
    std::fs::write(&keys, saved).unwrap();
}

/// Goal: a store with sealed subjects refuses to open with another master key or with none, and
/// changes no byte of its files in refusing.
#[test]
fn a_wrong_or_missing_master_key_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterKey::generate().unwrap();
    let store = Store::open(dir.path(), options(&master)).unwrap();
    store
        .append(&[NewEvent::new("Moved", MARKER).tag("customer:1")], None)
        .unwrap();
    store.close().unwrap();
    let before: Vec<(String, Vec<u8>)> = walk(dir.path())
        .into_iter()
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    let other = MasterKey::generate().unwrap();
    let e = Store::open(dir.path(), options(&other)).err().unwrap();
    assert!(matches!(e, annals::OpenError::Subjects(_)), "{e}");
    assert!(e.to_string().contains("master key"), "{e}");
    let e = Store::open(dir.path(), Options::default()).err().unwrap();
    assert!(e.to_string().contains("master key"), "{e}");
    let after: Vec<(String, Vec<u8>)> = walk(dir.path())
        .into_iter()
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(&after) {
        if !b.0.ends_with("LOCK") {
            assert_eq!(b, a, "{} changed", b.0);
        }
    }
}

fn files_of(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    walk(dir)
        .into_iter()
        .filter(|p| !p.display().to_string().ends_with("LOCK"))
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

/// Goal: a store remembers the subjects it sealed events for and erased, whatever a later
/// opening is told. Regression: a store made with the prefix `customer:`, with customer:42
/// erased, was opened again with `employee:` alone: it opened without a word, stored a new
/// customer:50 event's data in clear, and took an append naming the erased customer:42,
/// which read back in clear after a reopening with `customer:` again. Method: that sequence;
/// the opening that leaves `customer:` out is now refused, names the subjects and the
/// prefixes to give, and changes no file; an opening with the store's prefix and another
/// goes on sealing and refusing as before.
#[test]
fn an_opening_that_leaves_out_a_used_prefix_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterKey::generate().unwrap();
    let only = |prefix: &str| Options {
        subjects: Some(SubjectOptions::new([prefix], master.clone())),
        ..Options::default()
    };
    let store = Store::open(dir.path(), only("customer:")).unwrap();
    store
        .append(&[NewEvent::new("Moved", MARKER).tag("customer:42")], None)
        .unwrap();
    store
        .append(
            &[NewEvent::new("Moved", "elsewhere").tag("customer:43")],
            None,
        )
        .unwrap();
    store.erase_subject("customer:42").unwrap();
    store.close().unwrap();
    let before = files_of(dir.path());

    let e = Store::open(dir.path(), only("employee:")).err().unwrap();
    assert!(matches!(e, annals::OpenError::Subjects(_)), "{e}");
    let message = e.to_string();
    for needle in [
        "customer:42 (erased)",
        "customer:43",
        "--subject-tags employee:,customer:",
    ] {
        assert!(message.contains(needle), "{needle} not in: {message}");
    }
    assert_eq!(
        files_of(dir.path()),
        before,
        "a refused opening changed files"
    );

    // With the store's prefix (and a new one): sealed and refused as ever.
    let store = Store::open(dir.path(), options(&master)).unwrap();
    let e = store
        .append(&[NewEvent::new("Moved", "again").tag("customer:42")], None)
        .unwrap_err();
    assert!(matches!(e, AppendError::SubjectErased { .. }), "{e}");
    let marker = format!("{MARKER}-50");
    store
        .append(
            &[NewEvent::new("Moved", marker.clone().into_bytes()).tag("customer:50")],
            None,
        )
        .unwrap();
    store.close().unwrap();
    assert!(raw_files_hold(dir.path(), marker.as_bytes()).is_empty());
}

/// Goal: a store opened without data subjects stores data as given, not sealed, and refuses to
/// erase a subject.
#[test]
fn a_store_without_subjects_stores_data_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    store
        .append(&[NewEvent::new("Moved", MARKER).tag("customer:1")], None)
        .unwrap();
    let e = store.erase_subject("customer:1").unwrap_err();
    assert!(
        matches!(e, AppendError::Input(InputError::NoSubjects)),
        "{e}"
    );
    store.close().unwrap();
    assert!(!raw_files_hold(dir.path(), MARKER.as_bytes()).is_empty());
}

/// Goal: a client cannot append an event of the erasure receipts' type to a store without
/// data subjects either. Regression: such a store took it (as `NewEvent` and in a batch), and
/// it would have read as the receipt of an erasure once subjects were configured. Method: both
/// ways refused as `ReservedType`, the head unchanged; then the store opened with subjects
/// appends the subject's events.
#[test]
fn a_store_without_subjects_refuses_a_forged_erasure_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let forged = NewEvent::new(SUBJECT_ERASED_TYPE, r#"{"tag":"customer:1"}"#).tag("customer:1");
    let e = store.append(&[forged], None).unwrap_err();
    assert!(
        matches!(
            e,
            AppendError::Input(InputError::ReservedType { index: 0, .. })
        ),
        "{e}"
    );
    let mut batch = store.batch();
    batch.event("Moved").unwrap().finish(b"{}").unwrap();
    let e = batch.event(SUBJECT_ERASED_TYPE).err().unwrap();
    assert!(
        matches!(e, InputError::ReservedType { index: 1, .. }),
        "{e}"
    );
    assert_eq!(store.head(), 0);
    store.close().unwrap();
    let store = Store::open(dir.path(), options(&MasterKey::generate().unwrap())).unwrap();
    store
        .append(&[NewEvent::new("Moved", MARKER).tag("customer:1")], None)
        .unwrap();
    store.close().unwrap();
}

/// Goal: a new key is as durable as the events sealed under it, before the key file holds
/// it: a store closed without writing its key file (as a crash leaves it) reads every event
/// back, `annals verify` finds every event's key (in the key file or carried by the log), and
/// an erasure after that removes the key from the log's reach as well (every other subject
/// still reads back).
#[test]
fn new_keys_travel_in_the_log_until_the_key_file_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterKey::generate().unwrap();
    let unkept = Options {
        checkpoint_on_close: false,
        checkpoint_interval_events: 0,
        ..options(&master)
    };
    let append = |store: &Store, customer: u32, what: &str| {
        let event =
            NewEvent::new("Moved", format!("{MARKER} {what}")).tag(format!("customer:{customer}"));
        store.append(&[event], None).unwrap()
    };
    let store = Store::open(dir.path(), unkept.clone()).unwrap();
    // A first append whose condition fails: its key is made, and the append is not stored;
    // the next append carries the key again.
    let taken = Query::item(QueryItem::tags(["customer:1"]));
    append(&store, 9, "other");
    let refused = store.append(
        &[NewEvent::new("Moved", "x").tag("customer:1")],
        Some(&AppendCondition::new(Query::all(), Some(0))),
    );
    assert!(matches!(refused, Err(AppendError::ConditionFailed { .. })));
    append(&store, 1, "first");
    for c in 2..6 {
        append(&store, c, "first");
    }
    drop(store);
    let keys = std::fs::read(dir.path().join("subjects.keys")).unwrap();
    assert!(
        keys.len() < 300,
        "the key file holds no key yet ({} bytes)",
        keys.len()
    );
    let report = annals::verify(dir.path()).unwrap();
    assert_eq!(report.subject_problem, None);
    assert_eq!(report.sealed_events, 6);
    // Reopened: the keys are taken in from the log; later appends carry none.
    let store = Store::open(dir.path(), unkept.clone()).unwrap();
    append(&store, 1, "second");
    assert_eq!(
        store
            .read(&taken, ReadOptions::forwards())
            .unwrap()
            .map(|e| String::from_utf8(e.unwrap().data().to_vec()).unwrap())
            .collect::<Vec<_>>(),
        [format!("{MARKER} first"), format!("{MARKER} second")]
    );
    drop(store);
    assert_eq!(annals::verify(dir.path()).unwrap().subject_problem, None);
    // An erasure: the key file is written anew with every other key, under a new wrapping
    // key, so the grants in the log open no more.
    let store = Store::open(dir.path(), unkept.clone()).unwrap();
    assert_eq!(store.erase_subject("customer:1").unwrap().events, 2);
    drop(store);
    let store = Store::open(dir.path(), options(&master)).unwrap();
    let events = all(&store);
    assert_eq!(events.len(), 8);
    for e in &events {
        let erased = e.tags().any(|t| t == "customer:1") && e.event_type() == "Moved";
        assert_eq!(e.is_erased(), erased, "{}", e.position());
    }
    store.close().unwrap();
    assert_eq!(annals::verify(dir.path()).unwrap().subject_problem, None);
    assert_eq!(
        raw_files_hold(dir.path(), MARKER.as_bytes()),
        Vec::<String>::new()
    );
}

/// Goal: the key file takes new keys in within about a second of their making, without a
/// checkpoint, so that appends carry them for no longer.
#[test]
fn new_keys_reach_the_key_file_within_about_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let master = MasterKey::generate().unwrap();
    let options = Options {
        checkpoint_on_close: false,
        ..options(&master)
    };
    let store = Store::open(dir.path(), options).unwrap();
    let key_file = || {
        std::fs::read(dir.path().join("subjects.keys"))
            .unwrap()
            .len()
    };
    let empty = key_file();
    store
        .append(&[NewEvent::new("Moved", "x").tag("customer:1")], None)
        .unwrap();
    eventually(
        "the key to reach the key file",
        std::time::Duration::from_secs(20),
        || {
            let done = key_file() != empty;
            // Each append gives the store its chance to start the background write.
            if !done {
                store.append(&[NewEvent::new("Plain", "y")], None).unwrap();
            }
            done
        },
    );
    drop(store);
}
