//! The DCB semantics, the embedded API's edges and subscriptions, run against both backends:
//! segment files (on the simulated disk) and PostgreSQL (a throwaway cluster per test, see
//! annals-testkit). Each test is one function over a `Backend`; the backend decides only how a
//! store is opened and reopened. What only PostgreSQL has is in postgres.rs and
//! postgres_subjects.rs.
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
use common::api::{append_numbered, event};
use common::harness::{claim_race, small_options, DIR};
use common::{check_against_model, event_list, read_all, Model};
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
    /// only what the database committed since (`Location::Postgres`'s `mirror`).
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
                let location = annals::Location::Postgres {
                    url: cluster.url(),
                    mirror: Some(kept.path().join("mirror")),
                };
                // The first open fills the directory from the database (or takes in what was
                // committed since an earlier round closed it); the second uses it as closed.
                let first = Store::open_at(&location, small_options()).unwrap();
                assert_eq!(first.head(), head);
                first.close().unwrap();
                let store = Store::open_at(&location, small_options()).unwrap();
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
