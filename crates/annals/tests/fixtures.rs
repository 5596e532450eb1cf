//! Format fixtures: for every on-disk format version the code still reads, a small data
//! directory under tests/fixtures/<format>-v<N>/, written once by the generator at the end of
//! this file and committed. Each test opens a copy of one with the code of the day and checks
//! what it holds exactly: events, tags, positions, ids, tracking positions and the indexes'
//! answers. A format that gains a version gets a directory of its own beside the old one, which
//! stays for as long as the code reads that version.
//!
//! The fixtures are written anew only when a format gains a version (a fixture rewritten by a
//! later build proves nothing about the files an earlier build left), with
//! `ANNALS_UPDATE_FIXTURES=<format> cargo test -p annals --test fixtures -- --ignored`
//! (`segment`, `checkpoint`, `keys`, `readmodel`, `state`, `backup`, `mirror`, or `1` for every
//! one); the generator names each directory after the version it finds in the files it wrote.
//! A format the code reads but no longer writes (the older read-model checkpoint, a key file of
//! version 1) is written as that format was, by hand.
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use annals::backup::{restore, verify_backup, RestoreLimit};
use annals::readmodel::{Folded, ReadModel, ReadModelRunner, RunnerOptions};
use annals::{
    AppendCondition, AppendError, BackupOptions, Event, IndexSource, Limits, MasterKey, NewEvent,
    Options, Query, QueryItem, ReadOptions, Store, SubjectOptions, Tracking, SUBJECT_ERASED_TYPE,
};
use annals_testkit::{eventually, fixtures};
use common::{check_against_model, read_all, Model, ModelEvent};

/// The fixtures this file opens, each by a test of its own.
const ALL: [&str; 9] = [
    "segment-v1",
    "checkpoint-v3",
    "keys-v1",
    "keys-v2",
    "readmodel-v1",
    "state-v1",
    "backup-v1",
    "backup-v2",
    "mirror-v1",
];

/// The fixtures' master key, made for them: it guards nothing but their test data.
const MASTER: &str = "7d1c0a5e93b2f4c8a6e1d0b9c7f3a2e5b8d4c1f0a9e7b6d3c2f1e0a8b7c6d5e4";

/// The most bytes one fixture file may hold: a fixture is read by a person too, and lives in
/// the repository's history for good.
const FILE_BYTES_MAX: u64 = 16 << 10;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// Small segments, groups and appends, so that a fixture's log spans several segment files of
/// a few KiB each (a segment is preallocated whole); nothing runs in the background.
fn small() -> Options {
    Options {
        segment_bytes: 2 << 10,
        group_bytes_max: 1 << 10,
        unsynced_bytes_max: 1 << 10,
        limits: Limits {
            append_bytes_max: 1 << 10,
            event_bytes_max: 512,
            ..Limits::default()
        },
        checkpoint_interval_events: 0,
        checkpoint_on_close: false,
        scrub: None,
        ..Options::default()
    }
}

fn with_subjects(options: Options) -> Options {
    let master = MasterKey::from_hex(MASTER).unwrap();
    Options {
        subjects: Some(SubjectOptions::new(["customer:"], master)),
        ..options
    }
}

/// One append of a fixture's log: its events and the tracking position it records.
struct Shape {
    events: Vec<NewEvent>,
    tracking: Option<Tracking>,
}

/// The log of the fixtures on files: appends of every shape a record keeps (one event and
/// several, tags and none, empty data, metadata, ids, tracking positions, names beyond ASCII),
/// enough to fill several small segments.
fn log() -> Vec<Shape> {
    (0..24u64)
        .map(|i| {
            let events = (0..1 + i % 3)
                .map(|k| {
                    let n = i * 3 + k;
                    let kind = ["Opened", "Deposited", "Überwiesen"][(n % 3) as usize];
                    let data = if n == 13 {
                        String::new()
                    } else {
                        format!(
                            "event {n} of append {i} {}",
                            "x".repeat((n % 5) as usize * 9)
                        )
                    };
                    let mut event = NewEvent::new(kind, data);
                    if i % 4 != 3 {
                        event = event.tag(format!("account:{}", i % 4));
                        if n % 2 == 0 {
                            event = event.tag(format!("city:Zürich-{}", n % 3));
                        }
                    }
                    if i % 5 == 4 {
                        event = event.metadata(format!("{{\"clerk\":{n}}}"));
                    }
                    if i % 4 == 1 {
                        event = event.id(uuid::Uuid::from_u128(0xf1c7_0000 + u128::from(n)));
                    }
                    event
                })
                .collect();
            let tracking = (i % 6 == 5).then(|| Tracking::new("upstream", i * 10));
            Shape { events, tracking }
        })
        .collect()
}

fn append_all(store: &Store, shapes: &[Shape]) {
    for shape in shapes {
        let append = store.appending(&shape.events);
        match &shape.tracking {
            Some(tracking) => append.tracking(tracking.clone()).wait(),
            None => append.wait(),
        }
        .unwrap();
    }
}

/// Checks that `store` holds exactly the appends `shapes` and nothing else: every event at its
/// position with its type, tags, data, metadata and id; the events of one append sharing its
/// append time; the last tracking position; every query of the model answered as the model
/// does, forwards and backwards, from every start; and each append with ids recognised as
/// retried by those ids.
fn check_log(store: &Store, shapes: &[Shape]) {
    let want: Vec<&NewEvent> = shapes.iter().flat_map(|s| &s.events).collect();
    let all = read_all(store, &Query::all(), ReadOptions::forwards()).unwrap();
    assert_eq!(store.head(), want.len() as u64);
    assert_eq!(all.len(), want.len());
    for (i, (got, want)) in all.iter().zip(&want).enumerate() {
        assert_eq!(got.position(), i as u64 + 1);
        assert_eq!(
            ModelEvent::from_stored(got),
            ModelEvent::from_new(want),
            "at {i}"
        );
        assert_eq!(got.metadata(), &want.metadata[..], "metadata at {i}");
        assert_eq!(got.id(), want.id, "id at {i}");
    }
    let mut at = 0;
    let mut time = 0;
    for shape in shapes {
        let times: Vec<u64> = all[at..at + shape.events.len()]
            .iter()
            .map(Event::appended_at_us)
            .collect();
        assert!(
            times.iter().all(|t| *t == times[0] && *t >= time),
            "{times:?}"
        );
        time = times[0];
        at += shape.events.len();
    }
    let tracked = shapes.iter().rev().find_map(|s| s.tracking.as_ref());
    assert_eq!(
        store.tracking("upstream"),
        tracked.map(|t| t.position),
        "the last tracking position"
    );
    let model = Model {
        events: want.iter().map(|e| ModelEvent::from_new(e)).collect(),
    };
    check_against_model(store, &model).unwrap();
    let head = store.head();
    let mut last = 0;
    for shape in shapes {
        let first = last + 1;
        last += shape.events.len() as u64;
        if shape.events[0].id.is_none() {
            continue;
        }
        let tag = shape.events[0].tags[0].clone();
        let condition = AppendCondition::new(Query::item(QueryItem::tags([tag])), Some(first - 1));
        assert_eq!(
            store.append(&shape.events, Some(&condition)).unwrap(),
            last,
            "the append at {first} retried, known by its ids"
        );
    }
    assert_eq!(store.head(), head, "a retry appends nothing");
}

/// Goal: every fixture directory is opened by a test here, and none holds a file larger than a
/// few KiB (a segment is preallocated whole: the fixtures' segments are small).
#[test]
fn every_fixture_is_opened_and_small() {
    let mut found: Vec<String> = std::fs::read_dir(fixture(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    let mut known = ALL.map(str::to_owned).to_vec();
    known.sort();
    assert_eq!(
        found, known,
        "a fixture directory without a test, or a test without one"
    );
    for name in ALL {
        for (file, bytes) in fixtures::files(&fixture(name)) {
            assert!(bytes <= FILE_BYTES_MAX, "{name}/{file} holds {bytes} bytes");
        }
    }
}

/// Goal: segment files of version 1 (records of version 1) are read as written: the index is
/// rebuilt from them alone (no checkpoint), and the log answers exactly.
#[test]
fn segments_of_version_1_are_read() {
    let dir = fixtures::copy(&fixture("segment-v1"));
    let segment = std::fs::read(dir.path().join(annals::files::segment(1))).unwrap();
    assert_eq!(&segment[..8], b"ANNALSEG");
    assert_eq!(u32_at(&segment, 8), 1, "the segment's version");
    assert_eq!(&segment[64..68], b"ANRC");
    assert_eq!(segment[68], 1, "the first record's version");
    assert!(!dir.path().join(annals::files::CHECKPOINT).exists());
    let store = Store::open(dir.path(), small()).unwrap();
    assert!(
        matches!(store.open_report().index, IndexSource::Rebuilt { .. }),
        "{:?}",
        store.open_report().index
    );
    assert!(store.stats().segments >= 3, "the log spans segments");
    check_log(&store, &log());
    store.close().unwrap();
}

/// Goal: an index checkpoint of version 3 is used as written, not rebuilt, and answers exactly
/// as the log does.
#[test]
fn an_index_checkpoint_of_version_3_is_used() {
    let dir = fixtures::copy(&fixture("checkpoint-v3"));
    let checkpoint = std::fs::read(dir.path().join(annals::files::CHECKPOINT)).unwrap();
    assert_eq!(&checkpoint[..8], b"ANNALCKP");
    assert_eq!(u32_at(&checkpoint, 8), 3, "the checkpoint's version");
    let store = Store::open(dir.path(), small()).unwrap();
    assert!(
        matches!(
            store.open_report().index,
            IndexSource::Checkpoint { scanned_events: 0 }
        ),
        "{:?}",
        store.open_report().index
    );
    check_log(&store, &log());
    store.close().unwrap();
}

type Counts = std::collections::BTreeMap<String, u64>;

/// The fold of the read model of `readmodel-v1`: events per account.
fn count(counts: &mut Counts, event: &Event) {
    let account = event.tags().next().unwrap_or("none").to_owned();
    *counts.entry(account).or_default() += 1;
}

/// The read model of `readmodel-v1`: events of two types, counted per account.
fn per_account() -> Folded<Counts, fn(&mut Counts, &Event)> {
    Folded::new(
        "per-account",
        Query::item(QueryItem::types(["Deposited", "Überwiesen"])),
        Counts::new(),
        count as fn(&mut Counts, &Event),
    )
}

/// Where the read model's checkpoint stands in `readmodel-v1`: after this many appends of the
/// log.
const MODEL_APPENDS: usize = 16;

/// Opens the fixture `name`, whose read model's checkpoint begins with `magic` and its format
/// version 1, and checks that the model resumes from it: it starts after the checkpoint's
/// position with the state the checkpoint holds, folds only the events after it, and ends as a
/// fold of the whole log.
fn check_read_model(name: &str, magic: &[u8; 8]) {
    let dir = fixtures::copy(&fixture(name));
    let file = std::fs::read(dir.path().join("readmodels/per-account.model")).unwrap();
    assert_eq!(&file[..8], magic);
    assert_eq!(u32_at(&file, 8), 1, "the checkpoint's format version");
    let shapes = log();
    let store = Arc::new(Store::open(dir.path(), small()).unwrap());
    check_log(&store, &shapes);
    let saved_at = events_in(&shapes[..MODEL_APPENDS]);
    let mut whole = Counts::new();
    let mut after = 0;
    let query = ReadModel::query(&per_account());
    for event in read_all(&store, &query, ReadOptions::forwards()).unwrap() {
        count(&mut whole, &event);
        after += u64::from(event.position() > saved_at);
    }
    let runner = ReadModelRunner::start(&store, per_account(), RunnerOptions::default()).unwrap();
    assert!(runner.wait_for(store.head(), Duration::from_secs(20)));
    let status = runner.status();
    assert_eq!(status.rebuilt_because, None, "{status:?}");
    assert_eq!(status.resumed_from, saved_at, "{status:?}");
    assert_eq!(status.events_applied, after, "{status:?}");
    assert_eq!(runner.read(|m| m.state().clone()), whole);
    runner.stop();
}

fn events_in(shapes: &[Shape]) -> u64 {
    shapes.iter().map(|s| s.events.len() as u64).sum()
}

/// Goal: a read model's checkpoint of the older format (magic `ANNALSRM`, version 1, a hash of
/// the query) is resumed from, not rebuilt.
#[test]
fn a_read_model_checkpoint_of_the_older_format_is_resumed() {
    check_read_model("readmodel-v1", b"ANNALSRM");
}

/// Goal: a read model's checkpoint kept as a saved state of version 1 (magic `ANNALSST`) is
/// resumed from, not rebuilt.
#[test]
fn a_read_model_checkpoint_as_a_saved_state_of_version_1_is_resumed() {
    check_read_model("state-v1", b"ANNALSST");
}

/// The events of one open of the store in the subjects' fixtures, one per append: an address
/// of each customer in `customers` (its data the subject's own), and between them events of no
/// subject.
fn subject_round(round: u64, customers: &[u64]) -> Vec<NewEvent> {
    let mut events = Vec::new();
    for (k, c) in customers.iter().enumerate() {
        let address = format!("customer {c} lives at {round} {k} Long Street");
        events.push(
            NewEvent::new("AddressChanged", address)
                .tag(format!("customer:{c}"))
                .tag("kind:address"),
        );
        if k % 2 == 1 {
            events.push(NewEvent::new("Noted", format!("note {round} {k}")).tag("kind:note"));
        }
    }
    events
}

fn append_each(store: &Store, events: &[NewEvent]) {
    for event in events {
        store.append(std::slice::from_ref(event), None).unwrap();
    }
}

/// Checks that `store` holds exactly `want` (None: an erasure's receipt for the subject
/// `erased`): each event at its position with its type and tags, the data of every subject but
/// `erased` in the clear and the erased one's events erased, and every query of the model
/// answered as the model does.
fn check_subjects(store: &Store, want: &[Option<NewEvent>], erased: Option<&str>) {
    let all = read_all(store, &Query::all(), ReadOptions::forwards()).unwrap();
    assert_eq!(all.len(), want.len());
    let mut model = Model::default();
    for (i, (got, want)) in all.iter().zip(want).enumerate() {
        assert_eq!(got.position(), i as u64 + 1);
        let tags: Vec<&str> = got.tags().collect();
        match want {
            None => {
                assert_eq!(got.event_type(), SUBJECT_ERASED_TYPE, "at {i}");
                assert_eq!(tags, [erased.unwrap()], "at {i}");
            }
            Some(want) => {
                assert_eq!(got.event_type(), want.event_type, "at {i}");
                assert_eq!(tags, want.tags, "at {i}");
                if erased.is_some_and(|subject| want.tags.iter().any(|t| t == subject)) {
                    assert!(got.is_erased(), "at {i}");
                } else {
                    assert!(!got.is_erased(), "at {i}");
                    assert_eq!(got.data(), &want.data[..], "at {i}");
                }
            }
        }
        // The model takes the data as read: what is checked above.
        model.events.push(ModelEvent::from_stored(got));
    }
    check_against_model(store, &model).unwrap();
}

/// The events of `keys-v2`: two opens of the store; customer:2 erased in the second.
fn keys_v2_log() -> Vec<Option<NewEvent>> {
    let mut want: Vec<Option<NewEvent>> = subject_round(0, &[1, 2, 3])
        .into_iter()
        .chain(subject_round(1, &[1, 2, 3, 4]))
        .map(Some)
        .collect();
    want.push(None);
    want.extend(subject_round(2, &[1, 3, 4]).into_iter().map(Some));
    want
}

/// Goal: a key file of version 2, with events sealed both with their keys carried along (the
/// appends made before the key file took their keys in) and without (after), and an erasure:
/// every subject's events read back in the clear but the erased one's, which stay erased and
/// take no appends; another master key is refused; a new subject's key is made and kept.
#[test]
fn a_key_file_of_version_2_opens_its_subjects() {
    let dir = fixtures::copy(&fixture("keys-v2"));
    let file = std::fs::read(dir.path().join("subjects.keys")).unwrap();
    assert_eq!(&file[..8], b"ANNKEYS1");
    assert_eq!(u32_at(&file, 8), 2, "the key file's version");
    assert_eq!(
        file[12..20],
        1u64.to_le_bytes(),
        "one erasure, one epoch after the first"
    );
    let other = MasterKey::from_hex(&"5e".repeat(32)).unwrap();
    let refused = Store::open(
        dir.path(),
        Options {
            subjects: Some(SubjectOptions::new(["customer:"], other)),
            ..small()
        },
    );
    assert!(refused.is_err(), "another master key is refused");
    let store = Store::open(dir.path(), with_subjects(small())).unwrap();
    let mut want = keys_v2_log();
    check_subjects(&store, &want, Some("customer:2"));
    let again = NewEvent::new("AddressChanged", "back again").tag("customer:2");
    assert!(matches!(
        store.append(&[again], None),
        Err(AppendError::SubjectErased { .. })
    ));
    let new = subject_round(3, &[5]);
    append_each(&store, &new);
    store.close().unwrap();
    want.extend(new.into_iter().map(Some));
    let store = Store::open(dir.path(), with_subjects(small())).unwrap();
    check_subjects(&store, &want, Some("customer:2"));
    store.close().unwrap();
}

/// The events of `keys-v1`: sealed under keys the key file held, no key carried along.
fn keys_v1_log() -> Vec<NewEvent> {
    subject_round(1, &[1, 2])
}

/// Goal: a key file of version 1 (from before keys were carried in the log, so without a
/// wrapping key) opens with its subjects' keys, is written anew as version 2 at open, and then
/// takes a new subject's key.
#[test]
fn a_key_file_of_version_1_is_read_and_written_anew() {
    let dir = fixtures::copy(&fixture("keys-v1"));
    let path = dir.path().join("subjects.keys");
    let file = std::fs::read(&path).unwrap();
    assert_eq!(&file[..8], b"ANNKEYS1");
    assert_eq!(u32_at(&file, 8), 1, "the key file's version");
    let store = Store::open(dir.path(), with_subjects(small())).unwrap();
    let mut want: Vec<Option<NewEvent>> = keys_v1_log().into_iter().map(Some).collect();
    check_subjects(&store, &want, None);
    assert_eq!(u32_at(&std::fs::read(&path).unwrap(), 8), 2, "written anew");
    let new = subject_round(2, &[3]);
    append_each(&store, &new);
    store.close().unwrap();
    want.extend(new.into_iter().map(Some));
    let store = Store::open(dir.path(), with_subjects(small())).unwrap();
    check_subjects(&store, &want, None);
    store.close().unwrap();
}

/// The log of the backup fixtures, one event per append: data that does not compress (the
/// backup's objects then hold the records as written, object version 1) or that does (the
/// records in LZ4, object version 2).
fn backup_log(compressible: bool) -> Vec<Shape> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 32) as u8
    };
    (0..10u64)
        .map(|i| {
            let data: Vec<u8> = if compressible {
                format!("shelf entry {i}; ").repeat(24).into_bytes()
            } else {
                (0..480).map(|_| noise()).collect()
            };
            let event = NewEvent::new("Stored", data).tag(format!("shelf:{}", i % 3));
            Shape {
                events: vec![event],
                tracking: None,
            }
        })
        .collect()
}

fn backup_options(prefix: &Path) -> BackupOptions {
    let mut backup = BackupOptions::new(format!("file://{}", prefix.display()));
    backup.interval = Duration::from_millis(5);
    backup
}

/// The object version of every object under `prefix`'s `segments/` and `log/`.
fn object_versions(prefix: &Path) -> Vec<u32> {
    let mut versions = Vec::new();
    for (file, _) in fixtures::files(prefix) {
        if file.starts_with("segments/") || file.starts_with("log/") {
            let bytes = std::fs::read(prefix.join(&file)).unwrap();
            assert_eq!(&bytes[..8], b"ANNALSBK", "{file}");
            versions.push(u32_at(&bytes, 8));
        }
    }
    versions
}

/// Checks the backup fixture `name`: its manifest of format 1, every object of `version`, and
/// a verify and a restore that give back its log exactly.
fn check_backup(name: &str, version: u32) {
    let dir = fixtures::copy(&fixture(name));
    let prefix = dir.path().join("backup");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(prefix.join("annals-backup.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], 1, "{manifest}");
    let versions = object_versions(&prefix);
    assert!(
        !versions.is_empty() && versions.iter().all(|v| *v == version),
        "{versions:?}"
    );
    let shapes = backup_log(version == 2);
    let from = backup_options(&prefix);
    let report = verify_backup(&from, &mut |_, _| {}).unwrap();
    assert_eq!(report.head, shapes.len() as u64, "{report:?}");
    let target = Store::open(dir.path().join("restored"), small()).unwrap();
    let restored = restore(&from, &target, RestoreLimit::default(), &mut |_, _| {}).unwrap();
    assert_eq!(restored.head, shapes.len() as u64);
    check_log(&target, &shapes);
    target.close().unwrap();
}

/// Goal: a backup of object version 1 (records as written) and manifest format 1 verifies and
/// restores to its log exactly.
#[test]
fn a_backup_of_object_version_1_restores() {
    check_backup("backup-v1", 1);
}

/// Goal: a backup of object version 2 (records in LZ4) and manifest format 1 verifies and
/// restores to its log exactly.
#[test]
fn a_backup_of_object_version_2_restores() {
    check_backup("backup-v2", 2);
}

/// Goal: a read replica's copy kept across a clean close, its marker of version 1, is used as
/// it was closed (not filled from the backup again) and serves its log exactly.
#[test]
fn a_kept_copy_of_version_1_is_resumed() {
    let dir = fixtures::copy(&fixture("mirror-v1"));
    let copy = dir.path().join("copy");
    let marker = std::fs::read_to_string(copy.join("closed")).unwrap();
    assert!(marker.starts_with("annals-mirror 1 "), "{marker}");
    let shapes = backup_log(false);
    let location = annals::Location::Replica {
        backup: backup_options(&dir.path().join("backup")),
        copy: Some(copy),
    };
    let replica = Store::open_at(&location, small()).unwrap();
    let report = replica.open_report().mirror.clone().unwrap();
    assert_eq!(report.resumed_at, Some(shapes.len() as u64), "{report:?}");
    assert_eq!(report.rebuilt, None, "{report:?}");
    check_log(&replica, &shapes);
    replica.close().unwrap();
}

// The generator: run only to write the fixtures anew (see the file's documentation).

/// A key file of version 2 as version 1 held it: the header without the wrapping key, and the
/// records of keys and erasures only (version 1 had no record of what the log's grants cover).
fn as_version_1(file: &[u8]) -> Vec<u8> {
    assert_eq!((&file[..8], u32_at(file, 8)), (&b"ANNKEYS1"[..], 2));
    let check_end = 24 + u32_at(file, 20) as usize;
    // The wrapping key: its id, then nonce, sealed key and tag.
    let records = check_end + 8 + 12 + 32 + 16;
    let mut out = file[..check_end].to_vec();
    out[8..12].copy_from_slice(&1u32.to_le_bytes());
    let mut at = records;
    while at < file.len() {
        let end = at + 8 + u32_at(file, at) as usize;
        const COVERED: u8 = 3;
        if file[at + 8] != COVERED {
            out.extend_from_slice(&file[at..end]);
        }
        at = end;
    }
    out
}

/// Writes `written` as the fixture `<format>-v<version>`, and answers its name.
fn keep(format: &str, version: u32, written: &Path) -> String {
    let name = format!("{format}-v{version}");
    fixtures::write(&fixture(&name), written);
    eprintln!("wrote tests/fixtures/{name}");
    name
}

fn write_log_fixtures() {
    let shapes = log();
    if fixtures::updating("segment") {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), small()).unwrap();
        append_all(&store, &shapes);
        store.close().unwrap();
        let segment = std::fs::read(dir.path().join(annals::files::segment(1))).unwrap();
        keep("segment", u32_at(&segment, 8), dir.path());
    }
    if fixtures::updating("checkpoint") {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            checkpoint_on_close: true,
            ..small()
        };
        let store = Store::open(dir.path(), options).unwrap();
        append_all(&store, &shapes);
        store.close().unwrap();
        let checkpoint = std::fs::read(dir.path().join(annals::files::CHECKPOINT)).unwrap();
        keep("checkpoint", u32_at(&checkpoint, 8), dir.path());
    }
}

/// The read model's checkpoint as the code of the day writes it, in the middle of the log.
fn write_state_fixture() {
    let shapes = log();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), small()).unwrap());
    append_all(&store, &shapes[..MODEL_APPENDS]);
    let runner = ReadModelRunner::start(&store, per_account(), RunnerOptions::default()).unwrap();
    assert!(runner.wait_for(store.head(), Duration::from_secs(20)));
    assert_eq!(runner.stop().checkpoint_position, store.head());
    append_all(&store, &shapes[MODEL_APPENDS..]);
    Arc::try_unwrap(store).ok().unwrap().close().unwrap();
    let file = std::fs::read(dir.path().join("readmodels/per-account.model")).unwrap();
    assert_eq!(&file[..8], b"ANNALSST");
    keep("state", u32_at(&file, 8), dir.path());
}

/// A read model's checkpoint of the older format, which the code reads but no longer writes,
/// written by hand as that format was: magic "ANNALSRM", format version u32, model version u32,
/// query hash u32 (CRC32C of the query as JSON), name length u32, name, position u64, the
/// append time of the event there u64, saved-at u64, state length u64, the state (JSON), and
/// a CRC32C of all before it.
fn write_older_read_model_fixture() {
    let shapes = log();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), small()).unwrap();
    append_all(&store, &shapes);
    let position = events_in(&shapes[..MODEL_APPENDS]);
    let model = per_account();
    let mut state = Counts::new();
    let mut appended_at = 0;
    for event in read_all(&store, &Query::all(), ReadOptions::forwards()).unwrap() {
        let query = ReadModel::query(&model);
        if event.position() <= position && query.matches(event.event_type(), event.tags()) {
            count(&mut state, &event);
        }
        if event.position() == position {
            appended_at = event.appended_at_us();
        }
    }
    store.close().unwrap();
    let name = ReadModel::name(&model).as_bytes();
    let state = serde_json::to_vec(&state).unwrap();
    let mut file = b"ANNALSRM".to_vec();
    file.extend_from_slice(&1u32.to_le_bytes());
    file.extend_from_slice(&ReadModel::version(&model).to_le_bytes());
    let query = serde_json::to_vec(&ReadModel::query(&model)).unwrap();
    file.extend_from_slice(&crc32c::crc32c(&query).to_le_bytes());
    file.extend_from_slice(&(name.len() as u32).to_le_bytes());
    file.extend_from_slice(name);
    file.extend_from_slice(&position.to_le_bytes());
    file.extend_from_slice(&appended_at.to_le_bytes());
    file.extend_from_slice(&(appended_at + 1_000).to_le_bytes());
    file.extend_from_slice(&(state.len() as u64).to_le_bytes());
    file.extend_from_slice(&state);
    let crc = crc32c::crc32c(&file);
    file.extend_from_slice(&crc.to_le_bytes());
    std::fs::create_dir(dir.path().join("readmodels")).unwrap();
    std::fs::write(dir.path().join("readmodels/per-account.model"), file).unwrap();
    keep("readmodel", 1, dir.path());
}

fn write_key_fixtures() {
    // Version 2: keys carried in the first open's appends, taken into the key file with the
    // index checkpoint at its close (the checkpoint then removed: the fixture is the key
    // file's); the second open's appends under keys the file holds but a new subject's, which
    // carries its key, and an erasure, which writes the file anew.
    let persisting = || Options {
        checkpoint_on_close: true,
        ..with_subjects(small())
    };
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), persisting()).unwrap();
    append_each(&store, &subject_round(0, &[1, 2, 3]));
    store.close().unwrap();
    std::fs::remove_file(dir.path().join(annals::files::CHECKPOINT)).unwrap();
    let store = Store::open(dir.path(), with_subjects(small())).unwrap();
    append_each(&store, &subject_round(1, &[1, 2, 3, 4]));
    store.erase_subject("customer:2").unwrap();
    append_each(&store, &subject_round(2, &[1, 3, 4]));
    store.close().unwrap();
    let file = std::fs::read(dir.path().join("subjects.keys")).unwrap();
    keep("keys", u32_at(&file, 8), dir.path());

    // Version 1: a store whose key file held its subjects' keys before any of their events
    // (taken from another store's), so that no append carries a key, its key file then
    // written as version 1 held it.
    let source = tempfile::tempdir().unwrap();
    let store = Store::open(source.path(), persisting()).unwrap();
    append_each(&store, &subject_round(0, &[1, 2]));
    store.close().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        source.path().join("subjects.keys"),
        dir.path().join("subjects.keys"),
    )
    .unwrap();
    let store = Store::open(dir.path(), with_subjects(small())).unwrap();
    append_each(&store, &keys_v1_log());
    store.close().unwrap();
    let path = dir.path().join("subjects.keys");
    let file = as_version_1(&std::fs::read(&path).unwrap());
    assert!(
        file.windows(b"customer:2".len())
            .any(|w| w == b"customer:2"),
        "the key file holds the keys"
    );
    std::fs::write(&path, file).unwrap();
    keep("keys", 1, dir.path());
}

/// Ships `shapes` into a backup at `staging/backup` from a store that is then closed.
fn ship(staging: &Path, shapes: &[Shape]) {
    let data = tempfile::tempdir().unwrap();
    let options = Options {
        backup: Some(backup_options(&staging.join("backup"))),
        ..small()
    };
    let store = Store::open(data.path(), options).unwrap();
    append_all(&store, shapes);
    eventually(
        "the backup to ship everything",
        Duration::from_secs(30),
        || store.stats().backup.unwrap().lag_positions == 0,
    );
    store.close().unwrap();
    // Who shipped last, from which host and directory: nothing a reader needs.
    std::fs::remove_file(staging.join("backup").join(annals::archive::LEASE)).unwrap();
}

fn write_backup_fixtures() {
    for compressible in [false, true] {
        if !fixtures::updating("backup") {
            break;
        }
        let staging = tempfile::tempdir().unwrap();
        ship(staging.path(), &backup_log(compressible));
        let versions = object_versions(&staging.path().join("backup"));
        assert!(versions.iter().all(|v| *v == versions[0]), "{versions:?}");
        let name = keep("backup", versions[0], staging.path());
        assert_eq!(name, ["backup-v1", "backup-v2"][usize::from(compressible)]);
    }

    if !fixtures::updating("mirror") {
        return;
    }
    let staging = tempfile::tempdir().unwrap();
    let shapes = backup_log(false);
    ship(staging.path(), &shapes);
    let copy = staging.path().join("copy");
    let location = annals::Location::Replica {
        backup: backup_options(&staging.path().join("backup")),
        copy: Some(copy.clone()),
    };
    let replica = Store::open_at(&location, small()).unwrap();
    assert_eq!(replica.head(), shapes.len() as u64);
    replica.close().unwrap();
    let marker = std::fs::read_to_string(copy.join("closed")).unwrap();
    let version = marker
        .strip_prefix("annals-mirror ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    keep("mirror", version, staging.path());
}

/// Goal: (a generator, not a check) the fixtures written anew with the code of the day (see
/// the file's documentation), each directory named after the version found in the files
/// written.
#[test]
#[ignore = "writes the fixtures: run with ANNALS_UPDATE_FIXTURES=<format> when a format gains a version"]
fn write_fixtures() {
    if !fixtures::updating_any() {
        eprintln!("skipped: set ANNALS_UPDATE_FIXTURES to write the fixtures anew");
        return;
    }
    write_log_fixtures();
    if fixtures::updating("state") {
        write_state_fixture();
    }
    if fixtures::updating("readmodel") {
        write_older_read_model_fixture();
    }
    if fixtures::updating("keys") {
        write_key_fixtures();
    }
    write_backup_fixtures();
}
