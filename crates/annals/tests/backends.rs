//! The DCB semantics, the embedded API's edges and subscriptions, run against both backends:
//! segment files (on the simulated disk) and PostgreSQL (a throwaway cluster per test, see
//! annals-testkit). Each test is one function over a `Backend`; the backend decides only how a
//! store is opened and reopened.
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use annals::sim::{CrashMode, SimIo};
use annals::{
    AppendCondition, AppendError, InputError, NewEvent, Options, Query, QueryItem, ReadOptions,
    Store, Tracking,
};
use annals_testkit::Cluster;
use common::harness::{claim_race, small_options, DIR};
use common::{check_against_model, read_all, Model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Where a test's store lives.
enum Backend {
    Files(SimIo),
    /// The cluster, and a directory for a mirror kept across closes ([`Reopen::Kept`]).
    Postgres(Cluster, tempfile::TempDir),
}

/// How a store is opened again, to show that what a test checks survives it.
#[derive(Debug, Clone, Copy)]
enum Reopen {
    /// Files: from the index checkpoint written at close.
    Checkpoint,
    /// Files: with the checkpoint deleted, the index rebuilt from the log.
    Rebuild,
    /// Files: after a crash that drops what was not synced.
    Crash,
    /// PostgreSQL: a new store loads the log from the database.
    Reload,
    /// PostgreSQL: a new store uses a mirror kept in a directory across closes, taking in
    /// only what the database committed since (`Options::mirror`).
    Kept,
}

impl Backend {
    /// Every backend this machine has: files always, PostgreSQL when installed (required by the
    /// test command).
    fn all(seed: u64) -> Vec<Backend> {
        let mut backends = vec![Backend::Files(SimIo::new(seed))];
        if let Some(cluster) = Cluster::start() {
            backends.push(Backend::Postgres(cluster, tempfile::tempdir().unwrap()));
        }
        backends
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Files(_) => "files",
            Backend::Postgres(..) => "postgres",
        }
    }

    fn open(&self) -> Store {
        let options = Options {
            checkpoint_on_close: true,
            ..small_options()
        };
        match self {
            Backend::Files(io) => {
                Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options).unwrap()
            }
            Backend::Postgres(cluster, _) => Store::open_postgres(&cluster.url(), options).unwrap(),
        }
    }

    fn reopens(&self) -> &'static [Reopen] {
        match self {
            Backend::Files(_) => &[Reopen::Checkpoint, Reopen::Rebuild, Reopen::Crash],
            Backend::Postgres(..) => &[Reopen::Reload, Reopen::Kept],
        }
    }

    /// Closes `store` (or crashes it) and opens it again as `how` says.
    fn reopen(&self, store: Store, how: Reopen) -> Store {
        match (self, how) {
            (Backend::Files(io), Reopen::Crash) => {
                drop(store);
                let after = io.crash(CrashMode::DropUnsynced);
                Store::open_with_io(Arc::new(after), Path::new(DIR), small_options()).unwrap()
            }
            (Backend::Files(io), Reopen::Rebuild) => {
                store.close().unwrap();
                io.delete_file(&Path::new(DIR).join(annals::files::CHECKPOINT));
                let store = self.open();
                assert!(matches!(
                    store.open_report().index,
                    annals::IndexSource::Rebuilt { .. }
                ));
                store
            }
            (Backend::Postgres(cluster, kept), Reopen::Kept) => {
                let head = store.head();
                store.close().unwrap();
                let options = Options {
                    mirror: Some(kept.path().join("mirror")),
                    ..small_options()
                };
                // The first open fills the directory from the database (or takes in what was
                // committed since an earlier round closed it); the second uses it as closed.
                let first = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
                assert_eq!(first.head(), head);
                first.close().unwrap();
                let store = Store::open_postgres(&cluster.url(), options).unwrap();
                let mirror = store.open_report().mirror.clone().unwrap();
                assert_eq!(mirror.resumed_at, Some(head), "{mirror:?}");
                assert_eq!(mirror.followed, 0, "{mirror:?}");
                assert_eq!(store.head(), head);
                store
            }
            _ => {
                store.close().unwrap();
                self.open()
            }
        }
    }
}

/// Runs `test` on every backend, naming the backend in a failure.
fn on_each_backend(seed: u64, test: impl Fn(&Backend)) {
    for backend in Backend::all(seed) {
        eprintln!("backend: {}", backend.name());
        test(&backend);
    }
}

fn event() -> NewEvent {
    NewEvent::new("E", "data").tag("a")
}

/// Appends one event per number in `numbers`, its data the number, with the tag `tag(number)`.
fn append_numbered(store: &Store, numbers: std::ops::Range<u64>, tag: impl Fn(u64) -> String) {
    for i in numbers {
        let event = NewEvent::new("E", format!("{i}").into_bytes()).tag(tag(i));
        store.append(&[event], None).unwrap();
    }
}

/// Goal: DCB edge cases: empty store, `after` beyond the head, match-all items, limit 0, the
/// append time.
#[test]
fn dcb_edges() {
    on_each_backend(1, |backend| {
        let store = backend.open();
        assert!(read_all(&store, &Query::all(), ReadOptions::forwards())
            .unwrap()
            .is_empty());
        assert!(read_all(&store, &Query::all(), ReadOptions::backwards())
            .unwrap()
            .is_empty());
        let beyond = AppendCondition::new(Query::all(), Some(1000));
        assert_eq!(store.append(&[event()], Some(&beyond)).unwrap(), 1);
        let any = AppendCondition::new(Query::all(), None);
        assert_eq!(
            store
                .append(&[event()], Some(&any))
                .unwrap_err()
                .conflict_position(),
            Some(1)
        );
        let any_item = Query::item(QueryItem::default());
        assert_eq!(
            read_all(&store, &any_item, ReadOptions::forwards())
                .unwrap()
                .len(),
            1
        );
        assert!(
            read_all(&store, &Query::all(), ReadOptions::forwards().limit(0))
                .unwrap()
                .is_empty()
        );
        let unknown_type = AppendCondition::new(Query::item(QueryItem::types(["Nope"])), None);
        assert_eq!(store.append(&[event()], Some(&unknown_type)).unwrap(), 2);
        let e = &read_all(&store, &Query::all(), ReadOptions::forwards()).unwrap()[0];
        assert!(e.appended_at_us() > 1_600_000_000_000_000);
        // An append refused for its input changes nothing.
        assert!(matches!(
            store.append(&[], None),
            Err(AppendError::Input(InputError::NoEvents))
        ));
        assert_eq!(store.head(), 2);
    });
}

/// Goal: random appends, conditional or not, from one client agree with the brute-force model
/// in every outcome and every read, before and after reopening.
#[test]
fn random_appends_agree_with_the_model() {
    on_each_backend(2, |backend| {
        let mut rng = StdRng::seed_from_u64(7);
        let mut store = backend.open();
        let mut model = Model::default();
        let tag = |rng: &mut StdRng| format!("t{}", rng.gen_range(0..5));
        for round in 0..3 {
            for _ in 0..120 {
                let count = rng.gen_range(1..=3);
                let events: Vec<NewEvent> = (0..count)
                    .map(|i| {
                        let mut e = NewEvent::new(
                            ["A", "B", "C"][rng.gen_range(0..3)],
                            format!("{round}-{i}").into_bytes(),
                        );
                        for _ in 0..rng.gen_range(0..3) {
                            let t = tag(&mut rng);
                            if !e.tags.contains(&t) {
                                e = e.tag(t);
                            }
                        }
                        e
                    })
                    .collect();
                let condition = rng.gen_bool(0.6).then(|| {
                    let item = if rng.gen_bool(0.5) {
                        QueryItem::tags([tag(&mut rng)])
                    } else {
                        QueryItem::types([["A", "B", "C"][rng.gen_range(0..3)]])
                    };
                    let head = model.events.len() as u64;
                    AppendCondition::new(
                        Query::item(item),
                        Some(head.saturating_sub(rng.gen_range(0..6))),
                    )
                });
                let expected = model.append(&events, condition.as_ref());
                let got = store.append(&events, condition.as_ref());
                match (expected, got) {
                    (Ok(p), Ok(q)) => assert_eq!(p, q),
                    (Err(p), Err(AppendError::ConditionFailed { position })) => {
                        assert_eq!(p, position)
                    }
                    (e, g) => panic!("model {e:?}, store {g:?}"),
                }
            }
            check_against_model(&store, &model).unwrap();
            let how = backend.reopens()[round % backend.reopens().len()];
            store = backend.reopen(store, how);
            check_against_model(&store, &model).unwrap();
        }
    });
}

/// Goal: a failed conditional append whose first matching events are exactly its own (same ids,
/// same order, as many) is a retry, answered with their last position; anything else fails as
/// before; ids are no key without a failing condition. Survives reopening.
#[test]
fn retries_recognised_by_ids() {
    on_each_backend(9, |backend| {
        let id1 = uuid::Uuid::from_u128(1);
        let id2 = uuid::Uuid::from_u128(2);
        let invoice = || Query::item(QueryItem::tags(["invoice:1"]));
        let batch = vec![
            NewEvent::new("E", "one").tag("invoice:1").id(id1),
            NewEvent::new("E", "two").tag("invoice:1").id(id2),
        ];
        let condition = AppendCondition::new(invoice(), Some(1));
        let mut store = backend.open();
        store.append(&[event()], None).unwrap();
        assert_eq!(store.append(&batch, Some(&condition)).unwrap(), 3);
        // The same append again: its condition fails on exactly its own events.
        assert_eq!(store.append(&batch, Some(&condition)).unwrap(), 3);
        assert_eq!(store.head(), 3);
        // Content is not compared: the ids and their order decide.
        let changed = vec![
            NewEvent::new("E", "ONE").tag("invoice:1").id(id1),
            NewEvent::new("E", "TWO").tag("invoice:1").id(id2),
        ];
        assert_eq!(store.append(&changed, Some(&condition)).unwrap(), 3);
        let conflict =
            |store: &Store, events: &[NewEvent]| match store.append(events, Some(&condition)) {
                Err(AppendError::ConditionFailed { position }) => position,
                other => panic!("expected the condition to fail, got {other:?}"),
            };
        // The first events matching are compared, as many as the append has: the first one
        // alone is a retry of its own.
        assert_eq!(store.append(&batch[..1], Some(&condition)).unwrap(), 2);
        // Order, a missing id or a different id: the failure stands.
        assert_eq!(conflict(&store, &[batch[1].clone(), batch[0].clone()]), 2);
        assert_eq!(conflict(&store, &batch[1..]), 2);
        let mut no_id = batch.clone();
        no_id[1].id = None;
        assert_eq!(conflict(&store, &no_id), 2);
        let mut nil = batch.clone();
        nil[1].id = Some(uuid::Uuid::nil());
        assert_eq!(conflict(&store, &nil), 2);
        let mut other = batch.clone();
        other[1].id = Some(uuid::Uuid::from_u128(3));
        assert_eq!(conflict(&store, &other), 2);
        // Without a failing condition, ids are no obstacle: the same ids are stored again, and
        // the same id twice in one append too.
        assert_eq!(store.append(&batch, None).unwrap(), 5);
        let twice = vec![
            NewEvent::new("E", "x").id(id1),
            NewEvent::new("E", "x").id(id1),
        ];
        assert_eq!(store.append(&twice, None).unwrap(), 7);
        // The nil UUID is stored as no id.
        let nil_event = NewEvent::new("E", "nil").id(uuid::Uuid::nil());
        assert_eq!(store.append(&[nil_event], None).unwrap(), 8);
        let events = read_all(&store, &Query::all(), ReadOptions::forwards()).unwrap();
        assert_eq!(events[1].id(), Some(id1));
        assert_eq!(events[0].id(), None);
        assert_eq!(events[7].id(), None);
        for &how in backend.reopens() {
            store = backend.reopen(store, how);
            assert_eq!(
                store.append(&batch, Some(&condition)).unwrap(),
                3,
                "{how:?}"
            );
            assert_eq!(store.stats().idempotent_retries, 1, "counted since {how:?}");
        }
    });
}

/// Goal: a tracking position is recorded atomically with its append, only increases (a
/// repeated or lower one fails with a typed error and appends nothing), is independent per
/// source, and survives every way of reopening.
#[test]
fn tracking_positions() {
    on_each_backend(41, |backend| {
        let mut store = backend.open();
        assert_eq!(store.tracking("projector"), None);
        store
            .appending(&[event()])
            .tracking(Tracking::new("projector", 3))
            .wait()
            .unwrap();
        assert_eq!(store.tracking("projector"), Some(3));
        for stale in [3, 2] {
            match store
                .appending(&[event()])
                .tracking(Tracking::new("projector", stale))
                .wait()
            {
                Err(AppendError::TrackingNotIncreasing {
                    name,
                    recorded,
                    given,
                }) => {
                    assert_eq!((name.as_str(), recorded, given), ("projector", 3, stale));
                }
                other => panic!("expected a tracking error, got {other:?}"),
            }
        }
        assert_eq!(
            store.head(),
            1,
            "a refused tracking position appends nothing"
        );
        store
            .appending(&[event(), event()])
            .tracking(Tracking::new("projector", 10))
            .wait()
            .unwrap();
        store
            .appending(&[event()])
            .tracking(Tracking::new("other", 1))
            .wait()
            .unwrap();
        // A failed condition records nothing either.
        let condition = AppendCondition::new(Query::all(), Some(0));
        assert!(store
            .appending(&[event()])
            .condition(&condition)
            .tracking(Tracking::new("projector", 11))
            .wait()
            .is_err());
        assert_eq!(store.tracking("projector"), Some(10));
        for bad in ["", "a\u{1}b"] {
            assert!(matches!(
                store
                    .appending(&[event()])
                    .tracking(Tracking::new(bad, 1))
                    .wait(),
                Err(AppendError::Input(InputError::InvalidTrackingSource { .. }))
            ));
        }
        let mut expected = 10;
        for &how in backend.reopens() {
            expected += 10;
            store
                .appending(&[event()])
                .tracking(Tracking::new("projector", expected))
                .wait()
                .unwrap();
            store = backend.reopen(store, how);
            assert_eq!(store.tracking("projector"), Some(expected), "{how:?}");
            assert_eq!(store.tracking("other"), Some(1), "{how:?}");
            common::check_index_matches_scan(&store).unwrap();
        }
    });
}

/// Goal: readers never see a tracking position whose append is not acknowledged.
#[test]
fn tracking_is_visible_only_when_acknowledged() {
    on_each_backend(5, |backend| {
        let store = Arc::new(backend.open());
        let mut last_seen = 0;
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                for p in 1..=300u64 {
                    store
                        .appending(&[event()])
                        .tracking(Tracking::new("feed", p))
                        .wait()
                        .unwrap();
                }
            })
        };
        while !writer.is_finished() {
            let seen = store.tracking("feed").unwrap_or(0);
            // Each append carries position == its own log position here, so what is visible
            // can never run ahead of the published head it was read after.
            assert!(seen <= store.head(), "tracking {seen} ahead of the head");
            assert!(seen >= last_seen, "tracking went backwards");
            last_seen = seen;
        }
        writer.join().unwrap();
        assert_eq!(store.tracking("feed"), Some(300));
    });
}

/// Goal: subscriptions started at different positions see every matching event once, in order,
/// while appends go on: first what is stored, then what arrives.
#[test]
fn subscriptions_catch_up_then_follow() {
    on_each_backend(3, |backend| {
        let store = Arc::new(backend.open());
        append_numbered(&store, 0..50, |i| format!("k{}", i % 3));
        let total = 400u64;
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                append_numbered(&store, 50..total, |i| format!("k{}", i % 3));
            })
        };
        let subscribers: Vec<_> = (0..4u64)
            .map(|s| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let (query, expected): (Query, Vec<u64>) = if s == 0 {
                        (Query::all(), (s * 10 + 1..=total).collect())
                    } else {
                        let tag = format!("k{}", s % 3);
                        (
                            Query::item(QueryItem::tags([tag])),
                            (s * 10 + 1..=total)
                                .filter(|p| (p - 1) % 3 == s % 3)
                                .collect(),
                        )
                    };
                    let mut sub = store.subscribe(&query, s * 10).unwrap();
                    let mut got = Vec::new();
                    while got.len() < expected.len() {
                        let e = sub
                            .next_timeout(Some(Duration::from_secs(20)))
                            .unwrap()
                            .expect("subscription stalled");
                        got.push(e.position());
                    }
                    assert_eq!(got, expected, "subscriber {s}");
                    assert!(sub
                        .next_timeout(Some(Duration::from_millis(20)))
                        .unwrap()
                        .is_none());
                })
            })
            .collect();
        writer.join().unwrap();
        for s in subscribers {
            s.join().unwrap();
        }
    });
}

/// Goal: threads racing on the same conditions (unique usernames, an optimistic counter) never
/// both win, and every acknowledged append is stored. On PostgreSQL the threads go through two
/// stores on one database, as two servers would.
#[test]
fn racing_conditions_hold() {
    on_each_backend(11, |backend| {
        let first = backend.open();
        match backend {
            Backend::Files(_) => claim_race(&first, 16, 40).unwrap(),
            Backend::Postgres(..) => {
                let second = backend.open();
                let stores = [&first, &second];
                common::harness::claim_race_over(&stores, 32, 25).unwrap();
                assert!(
                    first.stats().database.unwrap().conflicts
                        + second.stats().database.unwrap().conflicts
                        > 0,
                    "the two stores raced"
                );
            }
        }
    });
}

/// Goal: with the database's transactions at serializable isolation (as on PostgreSQL-compatible
/// distributed databases), a group rolled back as a serialization failure (SQLSTATE 40001) is
/// taken as a lost race and tried again: racing stores still never both win, and nothing is
/// refused.
#[test]
fn serialization_failures_are_lost_races() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    cluster.sql("ALTER DATABASE postgres SET default_transaction_isolation TO 'serializable'");
    let first = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    let second = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    common::harness::claim_race_over(&[&first, &second], 32, 25).unwrap();
    let conflicts =
        first.stats().database.unwrap().conflicts + second.stats().database.unwrap().conflicts;
    assert!(conflicts > 0, "the two stores raced");
}

/// Every event of `store` as (position, append time, type, tags, data, id).
#[allow(clippy::type_complexity)]
fn event_list(store: &Store) -> Vec<(u64, u64, String, Vec<String>, Vec<u8>, Option<uuid::Uuid>)> {
    store
        .read(&Query::all(), ReadOptions::forwards())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.position(),
                e.appended_at_us(),
                e.event_type().to_owned(),
                e.tags().map(str::to_owned).collect(),
                e.data().to_vec(),
                e.id(),
            )
        })
        .collect()
}

/// Appends of every shape a copy must keep: single events, multi-event appends (atomic, one
/// record), events with ids, tracking positions; `round` varies them.
fn append_shapes(store: &Store, round: u64) {
    for i in 0..40u64 {
        let n = round * 100 + i;
        let single = NewEvent::new("Single", format!("{n}").into_bytes()).tag(format!("n:{n}"));
        match i % 4 {
            0 => {
                store.append(&[single], None).unwrap();
            }
            1 => {
                let events: Vec<NewEvent> = (0..1 + i % 7)
                    .map(|k| NewEvent::new("Multi", vec![k as u8; k as usize]).tag("m"))
                    .collect();
                store.append(&events, None).unwrap();
            }
            2 => {
                let id = uuid::Uuid::from_u128(u128::from(n) + 1);
                store.append(&[single.id(id)], None).unwrap();
            }
            _ => {
                store
                    .appending(&[single])
                    .tracking(Tracking::new("projector", n + 1))
                    .wait()
                    .unwrap();
            }
        }
    }
}

/// A directory's store, on the real disk (a copy is a user's command, not a simulation).
fn dir_store(dir: &Path) -> Store {
    Store::open(dir, small_options()).unwrap()
}

/// Goal: a store copied between backends, both ways, keeps its positions, append boundaries,
/// append times, ids and tracking; a copy resumes after a prefix, and refuses a target that is
/// not one.
#[test]
fn copies_between_backends() {
    let dirs = tempfile::tempdir().unwrap();
    let source = dir_store(&dirs.path().join("source"));
    append_shapes(&source, 0);
    // The database when this machine has one (the test command requires it), else a second
    // directory: the copy's code is the same.
    let cluster = Cluster::start();
    let open_middle = || match &cluster {
        Some(c) => Store::open_postgres(&c.url(), small_options()).unwrap(),
        None => dir_store(&dirs.path().join("middle")),
    };
    let middle = open_middle();
    let mut phases = Vec::new();
    let report = annals::copy(&source, &middle, &mut |phase, reached, head| {
        assert!(reached <= head);
        phases.push(phase);
    })
    .unwrap();
    assert_eq!(report.resumed_after, 0);
    assert_eq!(report.copied_events, source.head());
    assert_eq!(report.copied_appends, 40);
    assert_eq!(report.verified_appends, 40);
    assert!(phases.contains(&annals::CopyPhase::Verifying));
    assert_eq!(event_list(&middle), event_list(&source));
    assert_eq!(middle.tracking("projector"), source.tracking("projector"));

    // More appends, and the copy again: it goes on after what the target holds.
    append_shapes(&source, 1);
    let report = annals::copy(&source, &middle, &mut |_, _, _| {}).unwrap();
    assert_eq!(report.copied_appends, 40);
    assert_eq!(report.verified_appends, 80);
    assert_eq!(
        report.resumed_after,
        event_list(&middle)[..].len() as u64 - report.copied_events
    );
    // Nothing new: nothing copied, everything compared.
    let report = annals::copy(&source, &middle, &mut |_, _, _| {}).unwrap();
    assert_eq!((report.copied_appends, report.verified_appends), (0, 80));

    // And back into a directory, then reopened: the same log.
    let back_dir = dirs.path().join("back");
    let back = dir_store(&back_dir);
    annals::copy(&middle, &back, &mut |_, _, _| {}).unwrap();
    back.close().unwrap();
    let back = dir_store(&back_dir);
    assert_eq!(event_list(&back), event_list(&source));
    assert_eq!(back.tracking("projector"), source.tracking("projector"));
    assert_eq!(
        annals::compare(&source, &back, source.head(), &mut |_| {}).unwrap(),
        80
    );
    let bounds = |store: &Store| -> Vec<(u64, u64)> {
        store
            .appends(0)
            .unwrap()
            .map(|a| {
                let a = a.unwrap();
                (a.first_position(), a.last_position())
            })
            .collect()
    };
    assert_eq!(bounds(&back), bounds(&source), "append boundaries kept");
    assert_eq!(bounds(&source).len(), 80);

    // Refused: a target holding other events, and a target ahead of the source.
    let other = dir_store(&dirs.path().join("other"));
    other
        .append(&[NewEvent::new("Other", "x").tag("n:0")], None)
        .unwrap();
    let refused = annals::copy(&source, &other, &mut |_, _, _| {}).unwrap_err();
    assert!(matches!(refused, annals::StoreError::Copy(_)), "{refused}");
    assert_eq!(other.head(), 1, "a refused copy writes nothing");
    let empty = dir_store(&dirs.path().join("empty"));
    let refused = annals::copy(&empty, &source, &mut |_, _, _| {}).unwrap_err();
    assert!(
        refused.to_string().contains("after the source's"),
        "{refused}"
    );
    drop(middle);
}

/// Goal: the schema in PostgreSQL is versioned: created at version 3 on first use (each row
/// with its append's keys); a database of version 2 (rows without keys) or 1 (the head kept
/// in a row of its own) is migrated at open, its log intact; a version newer than the build
/// is refused with a message, nothing changed.
#[test]
fn the_database_schema_is_versioned() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let store = Store::open_postgres(&url, small_options()).unwrap();
    append_numbered(&store, 0..5, |i| format!("n:{i}"));
    let before = event_list(&store);
    store.close().unwrap();
    assert_eq!(cluster.sql_value("SELECT version FROM annals_schema"), "3");
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_appends WHERE keys IS NULL"),
        "0"
    );
    // Bodies compressed with lz4 (Debian's PostgreSQL has it).
    assert_eq!(
        cluster.sql_value(
            "SELECT attcompression FROM pg_attribute \
             WHERE attrelid = 'annals_appends'::regclass AND attname = 'body'"
        ),
        "l"
    );
    // Opened again after a migration: the same log, at version 3.
    let reopened = || {
        let store = Store::open_postgres(&url, small_options()).unwrap();
        assert_eq!(event_list(&store), before);
        assert_eq!(cluster.sql_value("SELECT version FROM annals_schema"), "3");
        store
    };
    // The same log as version 2 laid it out: no keys.
    cluster
        .sql("ALTER TABLE annals_appends DROP COLUMN keys; UPDATE annals_schema SET version = 2");
    let store = reopened();
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_appends WHERE keys IS NULL"),
        "5"
    );
    store.close().unwrap();
    // As version 1 laid it out.
    cluster.sql(
        "ALTER TABLE annals_appends DROP COLUMN keys; \
         ALTER TABLE annals_appends ADD CONSTRAINT annals_appends_check \
             CHECK (first_position >= 1 AND last_position >= first_position); \
         CREATE TABLE annals_head (id integer PRIMARY KEY CHECK (id = 1), \
             position bigint NOT NULL CHECK (position >= 0)); \
         INSERT INTO annals_head VALUES (1, 5); \
         UPDATE annals_schema SET version = 1",
    );
    let store = reopened();
    assert_eq!(
        cluster.sql_value("SELECT to_regclass('annals_head') IS NULL"),
        "t"
    );
    assert_eq!(
        cluster
            .sql_value("SELECT count(*) FROM pg_constraint WHERE conname = 'annals_appends_check'"),
        "0"
    );
    store.append(&[event()], None).unwrap();
    assert_eq!(store.head(), 6);
    store.close().unwrap();
    // A newer version: refused, and the database left as it was.
    cluster.sql("UPDATE annals_schema SET version = 4");
    let refused = match Store::open_postgres(&url, small_options()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a schema newer than the build was opened"),
    };
    assert!(
        refused.contains("version 4, newer than this build's (3)"),
        "{refused}"
    );
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_appends"),
        "6"
    );
    assert_eq!(cluster.sql_value("SELECT version FROM annals_schema"), "4");
}

/// Goal: mirrors left in the temporary directory by processes killed before closing their
/// PostgreSQL stores are removed when a store opens; a mirror in use is kept.
#[test]
fn stale_mirrors_are_removed() {
    use annals::io::{Io, RealIo};
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let tmp = std::env::temp_dir();
    let stale = tmp.join(format!("annals-mirror-stale-{}", std::process::id()));
    let live = tmp.join(format!("annals-mirror-live-{}", std::process::id()));
    // A mirror of a running process whose lock is not taken yet (it is being opened).
    let opening = tmp.join(format!("annals-mirror-{}-999999", std::process::id()));
    for dir in [&stale, &live, &opening] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("LOCK"), b"").unwrap();
        std::fs::write(dir.join("0000000001.seg"), b"left behind").unwrap();
    }
    let held = RealIo.lock(&live.join("LOCK")).unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let store = Store::open_postgres(&url, small_options()).unwrap();
    assert!(!stale.exists(), "a stale mirror is removed");
    assert!(live.exists(), "a mirror in use is kept");
    assert!(opening.exists(), "a mirror of a running process is kept");
    store.close().unwrap();
    drop(held);
    std::fs::remove_dir_all(&live).unwrap();
    std::fs::remove_dir_all(&opening).unwrap();
}

/// Goal: a store opened on a log longer than one chunk of rows, and heavier than one chunk of
/// bytes, takes in all of it, in order: the rows are streamed from the database to the mirror
/// a chunk at a time.
#[test]
fn a_long_log_is_taken_in_chunk_by_chunk() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let writer = Store::open_postgres(&cluster.url(), Options::default()).unwrap();
    let big = vec![b'x'; 1 << 20];
    for i in 0..10u64 {
        let mut data = big.clone();
        data[0] = b'0' + i as u8;
        writer
            .append(&[NewEvent::new("Big", data).tag("big")], None)
            .unwrap();
    }
    // Sent without waiting, so that they share commits.
    let (done, answers) = std::sync::mpsc::channel();
    for i in 0..2500u64 {
        let event = NewEvent::new("E", format!("{i}").into_bytes()).tag(format!("n{i}"));
        let done = done.clone();
        writer
            .appending(&[event])
            .then(move |outcome| done.send(outcome.map(|_| ())).unwrap())
            .unwrap();
    }
    for _ in 0..2500 {
        answers.recv().unwrap().unwrap();
    }
    let expected = read_all(&writer, &Query::all(), ReadOptions::forwards()).unwrap();
    assert_eq!(expected.len(), 2510);
    writer.close().unwrap();
    let reader = Store::open_postgres(&cluster.url(), Options::default()).unwrap();
    assert_eq!(reader.head(), 2510);
    assert_eq!(reader.open_report().mirror.as_ref().unwrap().followed, 2510);
    let got = read_all(&reader, &Query::all(), ReadOptions::forwards()).unwrap();
    assert_eq!(got.len(), expected.len());
    for (a, b) in got.iter().zip(&expected) {
        assert_eq!((a.position(), a.data()), (b.position(), b.data()));
    }
    reader.close().unwrap();
}

/// Goal: a mirror kept across closes (`Options::mirror`) is used as its clean close left it,
/// taking in only what other stores committed since, and only while the database holds its
/// last append; otherwise (that append lost and another written in its place, or no clean
/// close) it is filled from the database again. One directory serves one store at a time, and
/// a store on files refuses the option.
#[test]
fn a_kept_mirror_is_used_only_as_the_database_holds_it() {
    use annals::StoreError;
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let kept = tempfile::tempdir().unwrap();
    let options = Options {
        mirror: Some(kept.path().join("mirror")),
        ..small_options()
    };
    let open = || Store::open_postgres(&cluster.url(), options.clone());
    let data = |store: &Store| -> Vec<(u64, Vec<u8>)> {
        read_all(store, &Query::all(), ReadOptions::forwards())
            .unwrap()
            .iter()
            .map(|e| (e.position(), e.data().to_vec()))
            .collect()
    };
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert!(mirror.rebuilt.unwrap().contains("none was kept"));
    append_numbered(&store, 0..5, |i| format!("n{i}"));
    assert!(
        matches!(open(), Err(StoreError::Locked { .. })),
        "one store per directory"
    );
    store.close().unwrap();

    let other = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    append_numbered(&other, 5..8, |i| format!("n{i}"));
    let expected = data(&other);
    other.close().unwrap();
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert_eq!(mirror.resumed_at, Some(5), "{mirror:?}");
    assert_eq!(mirror.followed, 3, "only what was committed since is read");
    assert_eq!(data(&store), expected);
    store.close().unwrap();

    // An open that cannot reach the database leaves the mirror as trusted as it found it.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unreachable = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?connect_timeout=2",
        free.local_addr().unwrap().port()
    );
    drop(free);
    assert!(Store::open_postgres(&unreachable, options.clone()).is_err());
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert_eq!(mirror.resumed_at, Some(8), "{mirror:?}");
    assert_eq!(mirror.followed, 0);
    store.close().unwrap();

    // The database loses the mirror's last append (as a failover to a standby that lacked it
    // would), and another store writes a different one at its position.
    cluster.sql("DELETE FROM annals_appends WHERE first_position = 8");
    let other = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    assert_eq!(other.head(), 7);
    other
        .append(&[NewEvent::new("E", "in its place").tag("n8")], None)
        .unwrap();
    let expected = data(&other);
    other.close().unwrap();
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert_eq!(mirror.resumed_at, None, "{mirror:?}");
    assert!(
        mirror
            .rebuilt
            .as_deref()
            .unwrap()
            .contains("does not hold its last append"),
        "{mirror:?}"
    );
    assert_eq!(mirror.followed, 8);
    assert_eq!(data(&store), expected);
    assert_eq!(expected[7].1, b"in its place");
    store.close().unwrap();

    // No record of a clean close, as after a crash: filled again.
    std::fs::remove_file(kept.path().join("mirror").join("closed")).unwrap();
    let store = open().unwrap();
    let mirror = store.open_report().mirror.clone().unwrap();
    assert!(mirror.rebuilt.unwrap().contains("not closed cleanly"));
    assert_eq!(data(&store), expected);
    store.close().unwrap();

    let files = tempfile::tempdir().unwrap();
    assert!(matches!(
        Store::open(files.path(), options.clone()),
        Err(StoreError::InvalidOption(_))
    ));
}

/// Goal: a server that took in an append which a failover then lost stops answering for the
/// log, even when another server has since committed a different append at the same positions
/// (same size, so only the append time tells them apart). Method: a primary with a synchronous
/// standby; the standby stopped, so that a commit waits on the primary; that wait cancelled,
/// which leaves the append committed on the primary alone (its writer is told the outcome is
/// unknown); a second store takes it in; the primary killed, the standby promoted; a third
/// store commits another append at that position. The second store must refuse to append (and
/// so to write after a position the database does not hold as it does), and the database
/// stays a gapless log holding the third store's append.
#[test]
fn a_store_holding_an_append_a_failover_lost_stops() {
    use annals::{AppendError, StoreError};
    let Some(primary) = Cluster::start() else {
        return;
    };
    let standby = primary.synchronous_standby();
    let both = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let writer = Store::open_postgres(&both, small_options()).unwrap();
    let reader = Store::open_postgres(&both, small_options()).unwrap();
    writer.append(&[event()], None).unwrap();
    assert_eq!(reader.refresh().unwrap(), 1);
    standby.stop();
    let waiting = std::thread::spawn(move || {
        let outcome = writer.append(&[event()], None);
        (writer, outcome)
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while primary.sql_value("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
        == "0"
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no commit waits for the standby"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    primary.sql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
    let (writer, outcome) = waiting.join().unwrap();
    assert!(
        matches!(
            outcome,
            Err(AppendError::Store(StoreError::OutcomeUnknown { .. }))
        ),
        "{outcome:?}"
    );
    // Committed on the primary alone, and visible there: the reader takes it in.
    assert_eq!(reader.refresh().unwrap(), 2);
    drop(writer);
    primary.kill9();
    standby.restart();
    standby.promote();
    let other = Store::open_postgres(&standby.url(), small_options()).unwrap();
    assert_eq!(
        other.head(),
        1,
        "the promoted standby lacks the second append"
    );
    assert_eq!(other.append(&[event()], None).unwrap(), 2);
    // The reader's connection went with the primary: once it reaches the new one, it must
    // find that the database no longer holds its last append.
    let mut looked = reader.refresh();
    for _ in 0..50 {
        if !matches!(looked, Err(StoreError::Unavailable { .. })) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        looked = reader.refresh();
    }
    assert!(
        matches!(looked, Err(StoreError::Poisoned { .. })),
        "a store whose last append the database no longer holds went on: {looked:?}"
    );
    let refused = reader.append(&[event()], None);
    assert!(
        matches!(
            refused,
            Err(AppendError::Store(StoreError::Poisoned { .. }))
        ),
        "a store whose log the database no longer holds appended: {refused:?}"
    );
    drop(reader);
    other.close().unwrap();
    let fresh = Store::open_postgres(&standby.url(), small_options()).unwrap();
    assert_eq!(fresh.head(), 2);
    assert_eq!(
        standby.sql_value(
            "SELECT string_agg(first_position::text, ',' ORDER BY 1) FROM annals_appends"
        ),
        "1,2"
    );
}

/// Goal: a store reaches a database that takes only encrypted connections, over TLS that checks
/// the server's certificate; without TLS, with a root that did not issue the certificate, or
/// with a host name the certificate does not carry, it is refused with a message and nothing
/// is written. Method: a cluster whose pg_hba.conf rejects connections without TLS, its
/// certificate for 127.0.0.1 issued by a CA made for the test.
#[test]
fn tls_to_the_database_checks_the_server() {
    let Some((cluster, ca)) = Cluster::start_tls() else {
        return;
    };
    let base = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port());
    let ca = ca.to_str().unwrap();
    let refusal = |url: &str| match Store::open_postgres(url, small_options()) {
        Ok(_) => panic!("{url}: opened"),
        Err(e) => e.to_string(),
    };
    let plain = refusal(&base);
    assert!(
        plain.contains("no encryption") || plain.contains("pg_hba"),
        "{plain}"
    );
    // The system's roots did not issue the test CA's certificate.
    let unknown = refusal(&format!("{base}?sslmode=require"));
    assert!(unknown.to_lowercase().contains("certificate"), "{unknown}");
    let other_name = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={ca}",
        cluster.port()
    );
    let name = refusal(&other_name);
    assert!(name.to_lowercase().contains("certificate"), "{name}");
    assert_eq!(
        cluster.sql_value("SELECT to_regclass('annals_appends') IS NULL"),
        "t",
        "nothing was written by a refused store"
    );
    let store = Store::open_postgres(
        &format!("{base}?sslmode=verify-full&sslrootcert={ca}"),
        small_options(),
    )
    .unwrap();
    assert_eq!(store.append(&[event()], None).unwrap(), 1);
    assert_eq!(
        cluster.sql_value(
            "SELECT bool_and(ssl) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
             WHERE application_name = 'annals'"
        ),
        "t"
    );
    store.close().unwrap();
    // libpq's key=value form, the root given by PGSSLROOTCERT's place in the string.
    let pairs = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-ca sslrootcert={ca}",
        cluster.port()
    );
    let store = Store::open_postgres(&pairs, small_options()).unwrap();
    assert_eq!(store.head(), 1);
}

/// Goal: the files companions keep beside the log (read models' checkpoints, the exchange's
/// snapshots) live where the log lives and outlive every kind of reopen: on PostgreSQL they
/// are in the database, not in the server's temporary mirror, so a read model resumes from its
/// checkpoint rather than rebuilding. Method: a counting read model checkpointed at the head,
/// companion files written, replaced and removed; after each reopen the model resumes exactly
/// at its checkpoint and the files read back as left.
#[test]
fn companion_files_live_with_the_log() {
    use annals::readmodel::{Folded, ReadModelRunner, RunnerOptions};
    fn counter() -> Folded<u64, fn(&mut u64, &annals::Event)> {
        Folded::new(
            "counter",
            Query::item(QueryItem::types(["E"])),
            0u64,
            (|n: &mut u64, _: &annals::Event| *n += 1) as fn(&mut u64, &annals::Event),
        )
    }
    const WAIT: Duration = Duration::from_secs(20);
    on_each_backend(31, |backend| {
        let mut store = Arc::new(backend.open());
        append_numbered(&store, 0..40, |i| format!("n:{}", i % 5));
        let companions = store.companions();
        companions.write("test", "kept", b"first").unwrap();
        companions.write("test", "kept", b"second").unwrap();
        companions.write("test", "gone", b"x").unwrap();
        companions.remove("test", "gone").unwrap();
        companions.remove("test", "never").unwrap();
        for (round, &how) in backend.reopens().iter().enumerate() {
            let runner =
                ReadModelRunner::start(&store, counter(), RunnerOptions::default()).unwrap();
            assert!(runner.wait_for(store.head(), WAIT));
            let stopped = runner.stop();
            assert_eq!(stopped.checkpoint_position, store.head(), "{how:?}");
            let head = store.head();
            let owned = Arc::try_unwrap(store)
                .ok()
                .expect("the runner let go of the store");
            store = Arc::new(backend.reopen(owned, how));
            let companions = store.companions();
            assert_eq!(
                companions.read("test", "kept").unwrap().as_deref(),
                Some(&b"second"[..]),
                "{how:?}"
            );
            assert_eq!(companions.read("test", "gone").unwrap(), None, "{how:?}");
            assert_eq!(companions.list("test").unwrap(), ["kept"], "{how:?}");
            let runner =
                ReadModelRunner::start(&store, counter(), RunnerOptions::default()).unwrap();
            assert!(runner.wait_for(store.head(), WAIT));
            let status = runner.status();
            assert_eq!(status.rebuilt_because, None, "{how:?}");
            assert_eq!(status.resumed_from, head, "{how:?}");
            assert_eq!(
                runner.read(|m| *m.state()),
                head,
                "{how:?}: one event per position"
            );
            runner.stop();
            append_numbered(
                &store,
                100 + round as u64 * 10..110 + round as u64 * 10,
                |i| format!("n:{}", i % 5),
            );
        }
    });
}

/// Goal: a store reaches its database over a Unix socket when the URL's host is the socket's
/// directory, percent-encoded, as servers on the database's machine connect; and a libpq
/// `key=value` connection string given where a store's location is expected is refused with a
/// clear message rather than made into a directory of that name.
#[test]
fn the_database_over_its_unix_socket() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let Some(url) = cluster.socket_url("postgres") else {
        panic!("the temporary directory's path is too long for a Unix socket; set TMPDIR shorter");
    };
    assert!(url.starts_with("postgres://postgres@%2F"), "{url}");
    let store = Store::open_location(&url, small_options()).unwrap();
    append_numbered(&store, 0..3, |i| format!("n:{i}"));
    assert_eq!(store.head(), 3);
    // Every session of the store's (application annals) came over the socket: no client
    // address.
    assert_eq!(
        cluster.sql_value(
            "SELECT count(*) FILTER (WHERE client_addr IS NULL) || '/' || count(*) \
             FROM pg_stat_activity WHERE application_name = 'annals'"
        ),
        "2/2",
        "the committer's session and the listener's"
    );
    store.close().unwrap();

    let tcp = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        cluster.port()
    );
    for given in [
        tcp.as_str(),
        "dbname=annals",
        "host=/var/run/postgresql dbname=annals",
    ] {
        let refused = match Store::open_location(given, small_options()) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{given:?} was opened as a directory"),
        };
        assert!(
            refused.contains("reads as a PostgreSQL connection string")
                && refused.contains("postgres://"),
            "{refused}"
        );
        assert!(!Path::new(given).exists(), "{given:?} was created");
    }
    // A directory whose name merely contains '=' is still a directory.
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("run=1");
    Store::open(&plain, small_options())
        .unwrap()
        .close()
        .unwrap();
    assert!(plain.join("LOCK").exists());
}

/// Goal: two busy stores on one database both make progress. Each loads its own writers'
/// conditional appends (conditions on keys of their own, which never fail) for a few seconds;
/// no append may be refused because its group kept finding the other store's commits first,
/// and a group that lost a race goes in right after the winner's appends, which its
/// conditions do not concern, without a second check.
#[test]
fn busy_servers_do_not_starve_each_other() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let stores = [
        Store::open_postgres(&cluster.url(), small_options()).unwrap(),
        Store::open_postgres(&cluster.url(), small_options()).unwrap(),
    ];
    let until = std::time::Instant::now() + Duration::from_secs(4);
    let refused = std::sync::Mutex::new(Vec::new());
    let appended = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for t in 0..48 {
            let (store, refused, appended) = (&stores[t % 2], &refused, &appended);
            scope.spawn(move || {
                let mut n = 0;
                while std::time::Instant::now() < until {
                    let key = format!("key:{t}-{n}");
                    let condition =
                        AppendCondition::new(Query::item(QueryItem::tags([key.clone()])), None);
                    let event = NewEvent::new("E", "data").tag(key).tag("shared");
                    match store.append(&[event], Some(&condition)) {
                        Ok(_) => {
                            appended.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => refused.lock().unwrap().push(e.to_string()),
                    }
                    n += 1;
                }
            });
        }
    });
    let refused = refused.into_inner().unwrap();
    assert!(
        refused.is_empty(),
        "{} appends refused, the first: {}",
        refused.len(),
        refused[0]
    );
    let stats: Vec<_> = stores.iter().map(|s| s.stats().database.unwrap()).collect();
    let conflicts: u64 = stats.iter().map(|d| d.conflicts).sum();
    let passed: u64 = stats.iter().map(|d| d.passed).sum();
    let appended = appended.into_inner();
    eprintln!("{appended} appends, {conflicts} lost races, {passed} retries passed over");
    // The retries went in after the other store's appends, whose keys are not theirs.
    assert!(passed > 0, "no retry passed over the other store's appends");
    for store in &stores {
        store.refresh().unwrap();
        assert_eq!(store.head(), appended, "every append is in both stores");
    }
}

/// Goal: on PostgreSQL, the database's own full disk (SQLSTATE 53100, the statement rolled
/// back) is answered as on files: `DiskFull`, nothing appended, nothing poisoned, reads go on,
/// and appends resume once the database has room. Method: the log's table and its key moved
/// to a tablespace on an 8 MiB tmpfs (as root, as CI runs); appends of 64 KiB that does not
/// compress until refused; the tmpfs grown.
#[test]
fn a_full_database_disk_refuses_appends_cleanly() {
    use annals::StoreError;
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let Some(disk) = annals_testkit::Tmpfs::mount(8) else {
        return;
    };
    disk.give_to_postgres();
    let store = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    cluster.sql(&format!(
        "CREATE TABLESPACE small LOCATION '{}'",
        disk.path().display()
    ));
    cluster.sql("ALTER TABLE annals_appends SET TABLESPACE small");
    cluster.sql("ALTER INDEX annals_appends_pkey SET TABLESPACE small");
    let mut rng = StdRng::seed_from_u64(53100);
    let mut event = || {
        let data: Vec<u8> = (0..64 << 10).map(|_| rng.gen()).collect();
        NewEvent::new("Filled", data).tag("fill")
    };
    drop(store);
    let store = Store::open_postgres(&cluster.url(), Options::default()).unwrap();
    let mut acknowledged = 0u64;
    let refusal = loop {
        match store.append(&[event()], None) {
            Ok(position) => {
                acknowledged += 1;
                assert_eq!(position, acknowledged);
            }
            Err(e) => break e,
        }
        assert!(acknowledged < 1000, "the tablespace never filled");
    };
    assert!(
        matches!(refusal, AppendError::Store(StoreError::DiskFull { .. })),
        "{refusal:?}"
    );
    assert!(acknowledged > 10, "only {acknowledged} appends fit");
    assert!(store.stats().poisoned.is_none());
    assert_eq!(store.head(), acknowledged);
    assert_eq!(
        read_all(&store, &Query::all(), ReadOptions::forwards())
            .unwrap()
            .len() as u64,
        acknowledged
    );
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_appends"),
        acknowledged.to_string(),
        "the refused append is not in the database"
    );
    disk.resize(64);
    assert_eq!(store.append(&[event()], None).unwrap(), acknowledged + 1);
    drop(store);
    cluster.sql("ALTER TABLE annals_appends SET TABLESPACE pg_default");
    cluster.sql("ALTER INDEX annals_appends_pkey SET TABLESPACE pg_default");
    cluster.sql("DROP TABLESPACE small");
}

/// Goal: every committed append is counted once, on the route it took into the log
/// (`Stats::commits`): a blocking caller alone on an idle store commits on its own thread
/// (`alone` on files, `database_alone` on PostgreSQL), callbacks go through the writer or the
/// committer (`held`, `database`), and on PostgreSQL the mirror's writer counts none again.
/// A failed condition commits nothing and is not counted.
#[test]
fn appends_are_counted_on_their_routes() {
    for backend in Backend::all(31) {
        let store = backend.open();
        for _ in 0..3 {
            store
                .append(&[NewEvent::new("E", b"{}".to_vec()).tag("r")], None)
                .unwrap();
        }
        let (sender, receiver) = std::sync::mpsc::channel();
        store
            .appending(&[NewEvent::new("E", b"{}".to_vec())])
            .then(move |outcome| {
                let _ = sender.send(outcome);
            })
            .unwrap();
        receiver.recv().unwrap().unwrap();
        let claim = AppendCondition::new(Query::item(QueryItem::tags(["r"])), Some(0));
        assert!(store
            .append(&[NewEvent::new("E", b"{}".to_vec())], Some(&claim))
            .is_err());
        let taken: Vec<(String, u64)> = store
            .stats()
            .commits
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        match backend {
            Backend::Files(_) => {
                assert_eq!(taken, [("alone".to_string(), 3), ("held".to_string(), 1)])
            }
            // A blocking caller commits alone unless the committer thread holds its state
            // (following the database, every 500 ms): then its append is queued.
            Backend::Postgres(..) => {
                assert!(
                    taken.iter().all(|(r, _)| r.starts_with("database")),
                    "{taken:?}"
                );
                assert_eq!(taken.iter().map(|(_, n)| n).sum::<u64>(), 4, "{taken:?}");
                assert!(
                    taken.iter().any(|(r, _)| r == "database_alone"),
                    "{taken:?}"
                );
            }
        }
        store.close().unwrap();
    }
}

/// Goal: data subjects on PostgreSQL. Two servers share one database and its keys table: a
/// key one server made is the other's too (learned from the table), a subject's data is in
/// no file of the database's directory, no `pg_dump` and no kept mirror, before or after its
/// erasure; an erasure on one server holds on the other at once: the other's append naming
/// the subject is refused (though it still held the key), and its reads show the events
/// erased once it has taken the receipt in; a third server opening later sees the same. A
/// wrong master key is refused at open and writes nothing.
#[test]
fn subjects_on_postgres_hold_on_every_server() {
    use annals::{MasterKey, SubjectOptions};
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let kept = tempfile::tempdir().unwrap();
    let master = MasterKey::generate().unwrap();
    let options = Options {
        subjects: Some(SubjectOptions::new(["customer:"], master.clone())),
        ..small_options()
    };
    let a = Store::open_postgres(
        &cluster.url(),
        Options {
            mirror: Some(kept.path().join("mirror")),
            ..options.clone()
        },
    )
    .unwrap();
    let b = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    let moved = |customer: u64, what: &str| {
        NewEvent::new("Moved", format!("MARKER-{what}")).tag(format!("customer:{customer}"))
    };
    a.append(&[moved(1, "a1")], None).unwrap();
    // b makes no key of its own for customer:1: it takes a's from the table.
    b.append(&[moved(1, "b1")], None).unwrap();
    b.append(&[moved(2, "b2")], None).unwrap();
    a.append(&[NewEvent::new("Plain", "MARKER-plain")], None)
        .unwrap();
    let data = |store: &Store| -> Vec<(bool, Vec<u8>)> {
        store.refresh().unwrap();
        read_all(store, &Query::all(), ReadOptions::forwards())
            .unwrap()
            .iter()
            .map(|e| (e.is_erased(), e.data().to_vec()))
            .collect()
    };
    let full = vec![
        (false, b"MARKER-a1".to_vec()),
        (false, b"MARKER-b1".to_vec()),
        (false, b"MARKER-b2".to_vec()),
        (false, b"MARKER-plain".to_vec()),
    ];
    assert_eq!(data(&a), full);
    assert_eq!(data(&b), full);
    let nowhere = |when: &str| {
        cluster.sql("CHECKPOINT");
        let text = cluster.dump();
        // A plain event's data is in the dump, as bytea in hex: the dump holds the log.
        let plain: String = b"MARKER-plain".iter().map(|b| format!("{b:02x}")).collect();
        assert!(text.contains(&plain));
        for marker in ["MARKER-a1", "MARKER-b1", "MARKER-b2"] {
            let hex: String = marker.bytes().map(|b| format!("{b:02x}")).collect();
            assert!(
                !text.contains(marker) && !text.contains(&hex),
                "{marker} in pg_dump {when}"
            );
            assert_eq!(
                annals_testkit::files_holding(cluster.path(), marker.as_bytes()),
                Vec::<std::path::PathBuf>::new(),
                "{marker} in the database's files {when}"
            );
            assert_eq!(
                annals_testkit::files_holding(kept.path(), marker.as_bytes()),
                Vec::<std::path::PathBuf>::new(),
                "{marker} in the kept mirror {when}"
            );
        }
    };
    nowhere("before the erasure");

    // The erasure on a; b still holds customer:1's key in memory.
    cluster.sql(
        "CREATE TABLE saved_key AS SELECT * FROM annals_subject_keys WHERE tag = 'customer:1'",
    );
    let erasure = a.erase_subject("customer:1").unwrap();
    assert_eq!(erasure.events, 2);
    assert!(!erasure.already);
    let refused = b.append(&[moved(1, "late")], None).unwrap_err();
    assert!(
        matches!(
            refused,
            AppendError::Input(InputError::SubjectErased { ref tag }) if tag == "customer:1"
        ),
        "{refused:?}"
    );
    let erased: Vec<(bool, Vec<u8>)> = data(&b).into_iter().take(4).collect();
    assert_eq!(
        erased,
        vec![
            (true, Vec::new()),
            (true, Vec::new()),
            (false, b"MARKER-b2".to_vec()),
            (false, b"MARKER-plain".to_vec()),
        ]
    );
    assert_eq!(data(&a), data(&b));
    // Erasing again on b answers the same receipt.
    let again = b.erase_subject("customer:1").unwrap();
    assert!(again.already);
    assert_eq!(again.receipt, erasure.receipt);
    a.close().unwrap();
    b.close().unwrap();
    nowhere("after the erasure");

    // As if a's process had died after the receipt and before the key's row was erased
    // (PostgreSQL takes the receipt first): the next server to open finishes the erasure.
    cluster.sql(
        "UPDATE annals_subject_keys k SET wrapped = s.wrapped, erased_at_us = NULL \
         FROM saved_key s WHERE k.tag = s.tag",
    );
    assert_eq!(
        cluster.sql_value(
            "SELECT count(*) FROM annals_subject_keys WHERE wrapped IS NOT NULL \
             AND tag = 'customer:1'"
        ),
        "1"
    );
    // A server opened later: the erasure holds; customer:2 reads in full.
    let c = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    assert_eq!(
        cluster.sql_value(
            "SELECT count(*) FROM annals_subject_keys WHERE wrapped IS NULL \
             AND tag = 'customer:1'"
        ),
        "1"
    );
    assert_eq!(data(&c)[0], (true, Vec::new()));
    assert_eq!(data(&c)[2], (false, b"MARKER-b2".to_vec()));
    c.close().unwrap();

    // Another master key: refused, nothing written.
    let keys_before = cluster.sql_value("SELECT count(*) FROM annals_subject_keys");
    let wrong = Options {
        subjects: Some(SubjectOptions::new(
            ["customer:"],
            MasterKey::generate().unwrap(),
        )),
        ..small_options()
    };
    let e = Store::open_postgres(&cluster.url(), wrong).err().unwrap();
    assert!(e.to_string().contains("master key"), "{e}");
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_subject_keys"),
        keys_before
    );
    // Without subjects, a database holding sealed events is refused too.
    let e = Store::open_postgres(&cluster.url(), small_options())
        .err()
        .unwrap();
    assert!(e.to_string().contains("master key"), "{e}");

    // Rotating the master key on one server: every key of the table wrapped again in one
    // transaction. The other server, still on the old master key, reads on with the keys it
    // holds and makes no new key; a server started with the new master key reads and
    // appends; the old master key is refused from then on.
    let d = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    let e = Store::open_postgres(&cluster.url(), options.clone()).unwrap();
    let new_master = MasterKey::generate().unwrap();
    let wrapped_before = cluster.sql_value(
        "SELECT encode(wrapped, 'hex') FROM annals_subject_keys WHERE tag = 'customer:2'",
    );
    assert_eq!(d.rotate_master_key(&new_master).unwrap(), 1);
    assert_ne!(
        cluster.sql_value(
            "SELECT encode(wrapped, 'hex') FROM annals_subject_keys WHERE tag = 'customer:2'"
        ),
        wrapped_before
    );
    assert_eq!(data(&e)[2], (false, b"MARKER-b2".to_vec()));
    let refused = e.append(&[moved(4, "e4")], None).unwrap_err();
    assert!(refused.to_string().contains("rotated"), "{refused}");
    // A new subject's key under the new master key stops the old server's following, and
    // says why.
    d.append(&[moved(3, "d3")], None).unwrap();
    let stopped = e.refresh().unwrap_err();
    assert!(stopped.to_string().contains("new master key"), "{stopped}");
    d.close().unwrap();
    e.close().unwrap();
    let e = Store::open_postgres(&cluster.url(), options.clone())
        .err()
        .unwrap();
    assert!(e.to_string().contains("master key"), "{e}");
    let rotated = Options {
        subjects: Some(SubjectOptions::new(["customer:"], new_master)),
        ..small_options()
    };
    let f = Store::open_postgres(&cluster.url(), rotated).unwrap();
    let after = data(&f);
    assert_eq!(after[2], (false, b"MARKER-b2".to_vec()));
    assert!(after.contains(&(false, b"MARKER-d3".to_vec())));
    f.append(&[moved(4, "f4")], None).unwrap();
    f.close().unwrap();
}

/// Goal: every server of a database keeps the subjects the database sealed events for and
/// erased, whatever prefixes it is started with. Regression: a server started with other
/// subject tag prefixes than the store was used with stored a subject's data in clear and
/// took appends naming an erased subject. Method: a server without subjects starts first, on
/// a database that holds no key yet; a server erases customer:42; a server started with
/// `employee:` alone is refused, naming it, and writes nothing to the keys table; one started
/// with both prefixes runs, and a server still running with `customer:` alone, once it takes
/// in that server's first employee event, appends nothing more (it would store employee data
/// in clear) and says why, while it reads on; the server without subjects stopped appending
/// once it took in the first sealed event, and is not ready, saying why.
#[test]
fn a_server_with_fewer_subject_prefixes_than_the_database_never_stores_in_clear() {
    use annals::{MasterKey, SubjectOptions};
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let master = MasterKey::generate().unwrap();
    let with = |prefixes: &[&str]| Options {
        subjects: Some(SubjectOptions::new(
            prefixes.iter().copied(),
            master.clone(),
        )),
        ..small_options()
    };
    let plain = Store::open_postgres(&cluster.url(), small_options()).unwrap();
    plain
        .append(&[NewEvent::new("Opened", "before any subject")], None)
        .unwrap();
    let a = Store::open_postgres(&cluster.url(), with(&["customer:"])).unwrap();
    a.append(&[NewEvent::new("Moved", "street").tag("customer:42")], None)
        .unwrap();
    a.erase_subject("customer:42").unwrap();
    let rows = cluster.sql_value("SELECT count(*) FROM annals_subject_keys");

    let e = Store::open_postgres(&cluster.url(), with(&["employee:"]))
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("customer:42 (erased)")
            && e.to_string().contains("--subject-tags employee:,customer:"),
        "{e}"
    );
    assert_eq!(
        cluster.sql_value("SELECT count(*) FROM annals_subject_keys"),
        rows
    );

    let both = Store::open_postgres(&cluster.url(), with(&["customer:", "employee:"])).unwrap();
    let refused = both
        .append(&[NewEvent::new("Moved", "again").tag("customer:42")], None)
        .unwrap_err();
    assert!(
        matches!(
            refused,
            AppendError::Input(InputError::SubjectErased { .. })
        ),
        "{refused:?}"
    );
    both.append(
        &[NewEvent::new("Hired", "MARKER-e7").tag("employee:7")],
        None,
    )
    .unwrap();
    // `a` learns of a subject under a prefix it was not given: it stops appending.
    a.refresh().unwrap();
    let stopped = a
        .append(
            &[NewEvent::new("Hired", "MARKER-e8").tag("employee:8")],
            None,
        )
        .unwrap_err();
    assert!(
        stopped.to_string().contains("employee:7")
            && stopped.to_string().contains("--subject-tags"),
        "{stopped}"
    );
    let last = read_all(&a, &Query::all(), ReadOptions::backwards()).unwrap();
    assert_eq!(last[0].data(), b"MARKER-e7");
    assert!(
        a.stats().unready_reasons()[0].starts_with("subjects_differ:"),
        "{:?}",
        a.stats().unready_reasons()
    );
    a.close().unwrap();
    // The server without subjects took in sealed events: it appends nothing more.
    plain.refresh().unwrap();
    let stopped = plain
        .append(
            &[NewEvent::new("Moved", "MARKER-e9").tag("customer:9")],
            None,
        )
        .unwrap_err();
    assert!(
        stopped
            .to_string()
            .contains("started without data subjects"),
        "{stopped}"
    );
    assert!(plain
        .stats()
        .unready_reasons()
        .iter()
        .any(|r| r.starts_with("subjects_differ:")));
    plain.close().unwrap();
    both.close().unwrap();
    let hex: String = b"MARKER-e".iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        !cluster.dump().contains(&hex),
        "employee data in clear in the database"
    );
}

/// Goal: a store on files with data subjects copied into PostgreSQL takes its keys along:
/// those of its key file, and those only its log carries (here all of them: the store kept
/// no key file up to date, as after a crash), and its erasures; the database's servers then
/// read every subject back, the erased one erased, and refuse appends naming it.
#[test]
fn a_copy_into_postgres_takes_the_subjects_keys_along() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let master = annals::MasterKey::generate().unwrap();
    let subjects = annals::SubjectOptions::new(["customer:"], master);
    let dir = tempfile::tempdir().unwrap();
    let files = Options {
        subjects: Some(subjects.clone()),
        checkpoint_interval_events: 0,
        checkpoint_on_close: false,
        ..Options::default()
    };
    let source = Store::open(dir.path(), files.clone()).unwrap();
    source.erase_subject("customer:7").unwrap();
    for i in 0..60u64 {
        let event =
            NewEvent::new("Moved", format!("address {i}")).tag(format!("customer:{}", i % 6));
        source.append(&[event], None).unwrap();
    }
    source.close().unwrap();
    let key_file = std::fs::read(dir.path().join("subjects.keys")).unwrap();
    let source = Store::open(dir.path(), files).unwrap();
    let on_postgres = Options {
        subjects: Some(subjects),
        ..small_options()
    };
    let target = Store::open_postgres(&cluster.url(), on_postgres.clone()).unwrap();
    annals::copy(&source, &target, &mut |_, _, _| {}).unwrap();
    assert_eq!(target.import_subject_keys(&key_file).unwrap(), 6);
    let data = |store: &Store| -> Vec<(bool, Vec<u8>)> {
        read_all(store, &Query::all(), ReadOptions::forwards())
            .unwrap()
            .into_iter()
            .map(|e| (e.is_erased(), e.data().to_vec()))
            .collect()
    };
    assert_eq!(data(&target), data(&source));
    assert_eq!(data(&target)[1].1, b"address 0");
    target.close().unwrap();
    source.close().unwrap();
    let other = Store::open_postgres(&cluster.url(), on_postgres).unwrap();
    assert_eq!(data(&other)[60].1, b"address 59");
    let e = other
        .append(&[NewEvent::new("Moved", "x").tag("customer:7")], None)
        .unwrap_err();
    assert!(
        matches!(e, AppendError::Input(InputError::SubjectErased { .. })),
        "{e}"
    );
    other.close().unwrap();
}
