//! Decision snapshots (`annals::snapshot`): a snapshotted decision is the decision a full read
//! gives, across saves and reopenings; a snapshot is never used for another query or version;
//! bad saves change nothing; a torn shelf keeps the previous snapshot; an erasure leaves no
//! snapshot that folded the subject, served or on disk.

use std::collections::BTreeMap;
use std::path::Path;

use annals::decide::{Project, Projection, Retry};
use annals::snapshot::{Lookup, Saved, SnapshotError, SnapshotFilter, SnapshotPolicy, Snapshotted};
use annals::state::{StateId, Unfit};
use annals::{Event, MasterKey, NewEvent, Options, Query, QueryItem, Store, SubjectOptions};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

/// A course's state: who is enrolled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Course {
    enrolled: BTreeMap<String, u32>,
    events: u64,
}

fn course_query(course: &str) -> Query {
    Query::item(QueryItem::types(["Enrolled", "Left"]).and_tags([format!("course:{course}")]))
}

fn fold(state: &mut Course, event: &Event) {
    let student = String::from_utf8_lossy(event.data()).into_owned();
    state.events += 1;
    match event.event_type() {
        "Enrolled" => *state.enrolled.entry(student).or_default() += 1,
        _ => {
            state.enrolled.remove(&student);
        }
    }
}

fn course(course: &str) -> impl Project<State = Course> {
    Projection::new(course_query(course), Course::default(), fold)
}

fn snapshotted(name: &str, every: u64) -> Snapshotted<impl Project<State = Course>> {
    let policy = SnapshotPolicy {
        every,
        slower_than: None,
    };
    Snapshotted::new("course", 1, course(name)).policy(policy)
}

fn enrolled(course: &str, student: &str) -> NewEvent {
    NewEvent::new("Enrolled", student.to_string())
        .tag(format!("course:{course}"))
        .tag(format!("student:{student}"))
}

fn left(course: &str, student: &str) -> NewEvent {
    NewEvent::new("Left", student.to_string())
        .tag(format!("course:{course}"))
        .tag(format!("student:{student}"))
}

fn open(dir: &Path, options: Options) -> Store {
    Store::open(dir, options).unwrap()
}

#[derive(Debug, Clone)]
enum Step {
    Append {
        course: u8,
        student: u8,
        enrol: bool,
    },
    Decide {
        course: u8,
    },
    Reopen,
    Remove {
        course: u8,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..3, 0u8..6, any::<bool>())
            .prop_map(|(course, student, enrol)| Step::Append { course, student, enrol }),
        4 => (0u8..3).prop_map(|course| Step::Decide { course }),
        1 => Just(Step::Reopen),
        1 => (0u8..3).prop_map(|course| Step::Remove { course }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Goal: whatever the appends, saves, removals and reopenings, a snapshotted decision
    /// builds the state and the condition a full read builds, and appending under its
    /// condition succeeds exactly when appending under the full read's does.
    #[test]
    fn a_snapshotted_decision_is_the_full_reads_decision(
        steps in proptest::collection::vec(step(), 1..60),
        every in 1u64..4,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), Options::default());
        for step in steps {
            match step {
                Step::Append { course: c, student, enrol } => {
                    let (c, s) = (c.to_string(), student.to_string());
                    let event = if enrol { enrolled(&c, &s) } else { left(&c, &s) };
                    store.append(&[event], None).unwrap();
                }
                Step::Decide { course: c } => {
                    let name = c.to_string();
                    let full = store.decide(&course(&name)).unwrap();
                    let snapped = store.decide(&snapshotted(&name, every)).unwrap();
                    prop_assert_eq!(&snapped.state, &full.state);
                    prop_assert_eq!(&snapped.condition, &full.condition);
                    prop_assert!(snapped.events_read <= full.events_read);
                }
                Step::Reopen => {
                    store.close().unwrap();
                    store = open(dir.path(), Options::default());
                }
                Step::Remove { course: c } => {
                    let id = snapshotted(&c.to_string(), every).id().clone();
                    store.snapshots().remove(&SnapshotFilter::key(id.key())).unwrap();
                }
            }
        }
    }
}

/// Goal: a decision that finds a snapshot reads only the events after it, and saves the next
/// one by the policy: after the stated number of events.
#[test]
fn a_decision_reads_only_the_events_after_its_snapshot() {
    let store = Store::open_in_memory(Options::default()).unwrap();
    for i in 0..100 {
        store
            .append(&[enrolled("c", &format!("s{i}"))], None)
            .unwrap();
    }
    let model = snapshotted("c", 50);
    let first = store.decide(&model).unwrap();
    assert_eq!(first.events_read, 100);
    let Lookup::Hit(saved) = store.snapshots().load(model.id()).unwrap() else {
        panic!("a snapshot after 100 events read");
    };
    assert_eq!(saved.position, 100);
    for i in 100..110 {
        store
            .append(&[enrolled("c", &format!("s{i}"))], None)
            .unwrap();
    }
    let second = store.decide(&model).unwrap();
    assert_eq!(second.events_read, 10);
    assert_eq!(second.state.enrolled.len(), 110);
    assert_eq!(second.state, store.decide(&course("c")).unwrap().state);
    // Fewer than 50 events since: the snapshot stays where it was.
    let Lookup::Hit(again) = store.snapshots().load(model.id()).unwrap() else {
        panic!("still a snapshot");
    };
    assert_eq!(again.position, 100);
    let counts = store.snapshots().counts();
    assert_eq!((counts.saved, counts.hits >= 2), (1, true));
}

/// Goal: a snapshot of one version is never used by another: the other version's decision is
/// told it is stale and reads everything; a snapshot of one query is never returned for
/// another query, even of the same model and version.
#[test]
fn another_version_or_query_never_gets_the_snapshot() {
    let store = Store::open_in_memory(Options::default()).unwrap();
    for i in 0..20 {
        store
            .append(&[enrolled("a", &format!("s{i}"))], None)
            .unwrap();
        store
            .append(&[enrolled("b", &format!("s{i}"))], None)
            .unwrap();
    }
    let v1 = Snapshotted::new("course", 1, course("a")).policy(SnapshotPolicy {
        every: 1,
        slower_than: None,
    });
    store.decide(&v1).unwrap();
    let v2 = StateId::new("course", 2, course_query("a"));
    assert_eq!(
        store.snapshots().load(&v2).unwrap(),
        Lookup::OtherVersion { versions: vec![1] }
    );
    let v2_model = Snapshotted::new("course", 2, course("a"));
    assert_eq!(store.decide(&v2_model).unwrap().events_read, 20);
    let other_query = StateId::new("course", 1, course_query("b"));
    assert_eq!(store.snapshots().load(&other_query).unwrap(), Lookup::Miss);
    // Saved under one query's id, the state is found under that id alone.
    let b = StateId::new("course", 1, course_query("b"));
    store.snapshots().save(&b, 10, b"{}".to_vec()).unwrap();
    let Lookup::Hit(found) = store.snapshots().load(&b).unwrap() else {
        panic!("b's snapshot");
    };
    assert_eq!((found.position, found.key), (10, b.key()));
    let Lookup::Hit(a) = store.snapshots().load(v1.id()).unwrap() else {
        panic!("a's snapshot");
    };
    assert_eq!(a.position, 40);
}

/// Goal: a save beyond the head, or larger than the limit, is refused with its reason and
/// changes nothing; a save behind the one kept is not kept.
#[test]
fn bad_saves_are_refused_and_change_nothing() {
    let options = Options {
        limits: annals::Limits {
            snapshot_bytes_max: 1024,
            ..annals::Limits::default()
        },
        ..Options::default()
    };
    let store = Store::open_in_memory(options).unwrap();
    store
        .append(&[enrolled("c", "s1"), enrolled("c", "s2")], None)
        .unwrap();
    let id = StateId::new("course", 1, course_query("c"));
    let beyond = store.snapshots().save(&id, 3, b"{}".to_vec()).unwrap_err();
    assert!(matches!(
        beyond,
        SnapshotError::BeyondHead {
            position: 3,
            head: 2
        }
    ));
    assert_eq!(beyond.kind(), "snapshot_beyond_head");
    let large = store
        .snapshots()
        .save(&id, 2, vec![b' '; 1025])
        .unwrap_err();
    assert!(matches!(
        large,
        SnapshotError::TooLarge {
            bytes: 1025,
            max: 1024
        }
    ));
    assert_eq!(store.snapshots().load(&id).unwrap(), Lookup::Miss);
    assert_eq!(store.snapshots().stats().unwrap().count, 0);
    assert_eq!(
        store.snapshots().save(&id, 2, b"2".to_vec()).unwrap(),
        Saved::Saved
    );
    assert_eq!(
        store.snapshots().save(&id, 1, b"1".to_vec()).unwrap(),
        Saved::Behind { kept: 2 }
    );
    let Lookup::Hit(kept) = store.snapshots().load(&id).unwrap() else {
        panic!("the snapshot at 2");
    };
    assert_eq!(kept.state, b"2");
}

/// Goal: snapshots are listed and removed by model and by version, and a removal lasts across
/// a reopening; the shelf's count and bytes follow.
#[test]
fn snapshots_are_listed_and_removed_by_model_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Options::default());
    store
        .append(&[enrolled("a", "s"), enrolled("b", "s")], None)
        .unwrap();
    for (name, version, course) in [("course", 1, "a"), ("course", 1, "b"), ("course", 2, "a")] {
        let id = StateId::new(name, version, course_query(course));
        store.snapshots().save(&id, 2, b"{}".to_vec()).unwrap();
    }
    let other = StateId::new("student", 1, Query::item(QueryItem::tags(["student:s"])));
    store.snapshots().save(&other, 2, b"[]".to_vec()).unwrap();
    let all = store.snapshots().list(&SnapshotFilter::all()).unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(
        store
            .snapshots()
            .list(&SnapshotFilter::model("course"))
            .unwrap()
            .len(),
        3
    );
    let v1 = SnapshotFilter::model("course").version(1);
    assert_eq!(store.snapshots().remove(&v1).unwrap(), 2);
    store.close().unwrap();
    let store = open(dir.path(), Options::default());
    let left: Vec<(String, u32)> = store
        .snapshots()
        .list(&SnapshotFilter::all())
        .unwrap()
        .into_iter()
        .map(|s| (s.name, s.version))
        .collect();
    assert_eq!(
        left,
        [("course".to_string(), 2), ("student".to_string(), 1)]
    );
    assert_eq!(store.snapshots().stats().unwrap().count, 2);
}

/// Goal: a shelf whose last entry a crash tore opens with the snapshot that entry would have
/// replaced, and takes new ones after it.
#[test]
fn a_torn_save_leaves_the_previous_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Options::default());
    store
        .append(&[enrolled("c", "s1"), enrolled("c", "s2")], None)
        .unwrap();
    let id = StateId::new("course", 1, course_query("c"));
    store.snapshots().save(&id, 1, b"first".to_vec()).unwrap();
    store.snapshots().save(&id, 2, b"second".to_vec()).unwrap();
    store.close().unwrap();
    let shelf = std::fs::read_dir(dir.path().join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .unwrap();
    let bytes = std::fs::read(&shelf).unwrap();
    // Cut inside the last entry, and leave garbage after it.
    let mut torn = bytes[..bytes.len() - 7].to_vec();
    torn.extend_from_slice(&[0xAB; 5]);
    std::fs::write(&shelf, &torn).unwrap();
    let store = open(dir.path(), Options::default());
    let Lookup::Hit(kept) = store.snapshots().load(&id).unwrap() else {
        panic!("the first snapshot");
    };
    assert_eq!((kept.position, kept.state.as_slice()), (1, &b"first"[..]));
    store.snapshots().save(&id, 2, b"third".to_vec()).unwrap();
    store.close().unwrap();
    let store = open(dir.path(), Options::default());
    let Lookup::Hit(kept) = store.snapshots().load(&id).unwrap() else {
        panic!("the third snapshot");
    };
    assert_eq!(kept.state, b"third");
}

fn with_subjects(master: &MasterKey) -> Options {
    Options {
        subjects: Some(SubjectOptions::new(["student:"], master.clone())),
        ..Options::default()
    }
}

/// Whether any file under `dir` holds `needle`.
fn on_disk(dir: &Path, needle: &[u8]) -> bool {
    std::fs::read_dir(dir).unwrap().any(|entry| {
        let path = entry.unwrap().path();
        if path.is_dir() {
            return on_disk(&path, needle);
        }
        let bytes = std::fs::read(&path).unwrap_or_default();
        bytes.windows(needle.len()).any(|w| w == needle)
    })
}

/// Goal: after a data subject is erased, no snapshot that folded the subject's events is
/// served, its bytes are gone from the data directory (in superseded entries too), a save of
/// a state that folded them is refused, and a new decision folds the erased events as erased.
#[test]
fn an_erasure_leaves_no_snapshot_of_the_subject() {
    let master = MasterKey::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), with_subjects(&master));
    store
        .append(&[enrolled("c", "alice-unique-name")], None)
        .unwrap();
    store.append(&[enrolled("c", "bob")], None).unwrap();
    let model = snapshotted("c", 1);
    store.decide(&model).unwrap();
    store.append(&[enrolled("c", "carol")], None).unwrap();
    store.decide(&model).unwrap();
    let other = snapshotted("d", 1);
    store.append(&[enrolled("d", "dave")], None).unwrap();
    store.decide(&other).unwrap();
    assert!(on_disk(&dir.path().join("snapshots"), b"alice-unique-name"));
    let Lookup::Hit(before) = store.snapshots().load(model.id()).unwrap() else {
        panic!("a snapshot of c");
    };
    assert!(before
        .subjects
        .contains(&"student:alice-unique-name".to_string()));

    let erasure = store.erase_subject("student:alice-unique-name").unwrap();
    assert!(!on_disk(
        &dir.path().join("snapshots"),
        b"alice-unique-name"
    ));
    assert_eq!(store.snapshots().load(model.id()).unwrap(), Lookup::Miss);
    // The other course's snapshot did not fold the subject: it stays.
    assert!(matches!(
        store.snapshots().load(other.id()).unwrap(),
        Lookup::Hit(_)
    ));
    // A state folded before the erasure is not saved after it.
    let refused = store
        .snapshots()
        .save_with_subjects(
            model.id(),
            erasure.receipt - 1,
            vec!["student:alice-unique-name".into()],
            b"{}".to_vec(),
        )
        .unwrap_err();
    assert!(
        matches!(refused, SnapshotError::SubjectErased { .. }),
        "{refused}"
    );
    let after = store.decide(&model).unwrap();
    assert!(!after.state.enrolled.contains_key("alice-unique-name"));
    assert_eq!(after.state, store.decide(&course("c")).unwrap().state);
    store.close().unwrap();
    // (The log keeps the subject's tag in clear, as erasure does: only its data is gone.)
    assert!(!on_disk(
        &dir.path().join("snapshots"),
        b"alice-unique-name"
    ));
}

/// Goal: a snapshot copied with the data directory before an erasure, into a copy that takes
/// in the erasure's receipt later (as a replica or another server does), is refused there and
/// purged by the copy's first use of its snapshots.
#[test]
fn a_copy_that_learns_of_an_erasure_purges_its_snapshots() {
    let master = MasterKey::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), with_subjects(&master));
    store
        .append(&[enrolled("c", "erin-unique-name")], None)
        .unwrap();
    let model = snapshotted("c", 1);
    store.decide(&model).unwrap();
    store.close().unwrap();
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), copy.path());
    let store = open(dir.path(), with_subjects(&master));
    let erasure = store.erase_subject("student:erin-unique-name").unwrap();
    store.close().unwrap();
    // The copy's log is given the receipt (the shelf it has still holds the snapshot).
    for name in std::fs::read_dir(dir.path()).unwrap() {
        let path = name.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    assert!(on_disk(&copy.path().join("snapshots"), b"erin-unique-name"));
    let store = open(copy.path(), with_subjects(&master));
    let found = store.snapshots().load(model.id()).unwrap();
    assert!(
        matches!(
            &found,
            Lookup::Miss | Lookup::Unfit(Unfit::SubjectErased { .. })
        ),
        "{found:?} (receipt at {})",
        erasure.receipt
    );
    assert!(!on_disk(
        &copy.path().join("snapshots"),
        b"erin-unique-name"
    ));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else if path.file_name().is_some_and(|n| n != "LOCK") {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// Goal: decide_and_append on a snapshotted projection keeps the business rule across
/// snapshots: a course of ten seats takes exactly ten students.
#[test]
fn the_rule_holds_across_snapshots() {
    let store = Store::open_in_memory(Options::default()).unwrap();
    let model = snapshotted("c", 3);
    let mut taken = 0;
    for i in 0..25 {
        let student = format!("s{i}");
        let decided = store.decide_and_append(&model, Retry::default(), |course| {
            match course.enrolled.len() < 10 {
                true => Ok(vec![enrolled("c", &student)]),
                false => Err("full"),
            }
        });
        taken += u32::from(decided.is_ok());
    }
    assert_eq!(taken, 10);
    assert_eq!(store.decide(&course("c")).unwrap().state.enrolled.len(), 10);
}

/// A projection that erases a data subject right after its inner projection started (loaded
/// its snapshot), before the decision's read: the race of an erasure with a decision.
struct ErasingAfterStart<P> {
    inner: P,
    tag: &'static str,
}

impl<P: Project> Project for ErasingAfterStart<P> {
    type State = P::State;
    fn query(&self) -> Query {
        self.inner.query()
    }
    fn initial(&self) -> P::State {
        self.inner.initial()
    }
    fn apply(&self, state: &mut P::State, event: &Event) {
        self.inner.apply(state, event);
    }
    fn start<'a>(&'a self, store: &Store, parts: &mut Vec<annals::decide::Part<'a>>) -> P::State {
        let state = self.inner.start(store, parts);
        store.erase_subject(self.tag).unwrap();
        state
    }
    fn parts(&self) -> usize {
        self.inner.parts()
    }
    fn apply_part(&self, state: &mut P::State, event: &Event, parts: &[annals::decide::Part<'_>]) {
        self.inner.apply_part(state, event, parts);
    }
    fn built(&self, state: &P::State, built: &annals::decide::Built<'_>) {
        self.inner.built(state, built);
    }
    fn needs_subjects(&self) -> bool {
        self.inner.needs_subjects()
    }
}

/// Goal: a subject erased after a decision loaded its snapshot and before its read does not
/// reach the decision's state through the snapshot: the decision reads everything instead,
/// its state is the full read's, and the snapshot it saves names no erased subject's data.
#[test]
fn an_erasure_while_a_decision_reads_sends_it_back_to_the_start() {
    let master = MasterKey::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), with_subjects(&master));
    store
        .append(&[enrolled("c", "gus-unique-name")], None)
        .unwrap();
    store.append(&[enrolled("c", "hal")], None).unwrap();
    store.decide(&snapshotted("c", 1)).unwrap();
    let racing = ErasingAfterStart {
        inner: snapshotted("c", 1),
        tag: "student:gus-unique-name",
    };
    let decided = store.decide(&racing).unwrap();
    assert!(
        !decided.state.enrolled.contains_key("gus-unique-name"),
        "{:?}",
        decided.state
    );
    assert_eq!(decided.state, store.decide(&course("c")).unwrap().state);
    assert_eq!(decided.events_read, 2, "it read everything");
    assert!(!on_disk(&dir.path().join("snapshots"), b"gus-unique-name"));
}
