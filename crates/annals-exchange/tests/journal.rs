//! The exchange journaled through the store: replay equals the live books (with and without a
//! snapshot), every mode ends in the same state, snapshots that do not fit are skipped, a
//! failed journal acknowledges nothing more, and the audit trail is a plain DCB read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use annals::sim::{FaultKind, SimIo};
use annals::{Durability, Options, Query, QueryItem, ReadOptions, Store};
use annals_exchange::codec;
use annals_exchange::scenario::{self, Scenario};
use annals_exchange::*;

fn store_at(dir: &std::path::Path, durability: Durability) -> Arc<Store> {
    let options = Options {
        durability,
        ..Options::default()
    };
    Arc::new(Store::open(dir, options).unwrap())
}

/// Runs the scenario's symbols, warm-up and messages through a sequencer, flushing as a
/// pipelined caller does; returns the number of commands whose release said Ok.
fn run(sequencer: &mut Sequencer, scenario: &Scenario, upto: usize) -> Arc<AtomicU64> {
    let acked = Arc::new(AtomicU64::new(0));
    let mut out = Vec::new();
    let commands: Vec<_> = scenario
        .warmup
        .iter()
        .chain(&scenario.messages)
        .take(upto)
        .collect();
    let mut pending = 0u64;
    for (i, command) in commands.iter().enumerate() {
        sequencer.execute(i as u64, command, &mut out).unwrap();
        out.clear();
        pending += 1;
        if sequencer.batch_full() || i + 1 == commands.len() {
            let acked = acked.clone();
            let n = std::mem::take(&mut pending);
            sequencer.flush(move |outcome| {
                if outcome.is_ok() {
                    acked.fetch_add(n, Ordering::Relaxed);
                }
            });
        }
    }
    acked
}

fn fresh_sequencer(store: Option<Arc<Store>>, mode: Mode, scenario: &Scenario) -> Sequencer {
    let options = SequencerOptions {
        batch_events: 64,
        ..SequencerOptions::default()
    };
    let mut sequencer = Sequencer::new(Engine::new(&[]), store, mode, options).unwrap();
    for &spec in &scenario.symbols {
        sequencer.add_symbol(spec).unwrap();
    }
    sequencer
}

/// The engine after applying the first `n` commands directly, as the journal's times give.
fn reference(scenario: &Scenario, n: usize) -> Engine {
    let mut engine = Engine::new(&scenario.symbols);
    let mut out = Vec::new();
    for (i, command) in scenario
        .warmup
        .iter()
        .chain(&scenario.messages)
        .take(n)
        .enumerate()
    {
        engine.apply(i as u64, command, &mut out);
        out.clear();
    }
    engine
}

/// Goal: the books rebuilt from the journal equal the live ones, with and without a snapshot.
/// Method: 30,000 messages of `normal` in the pipelined mode with a snapshot after 12,000
/// commands; reopen and recover without snapshots (full replay) and with them (replay after
/// the snapshot only); compare state hashes with the live engine and a direct replay.
#[test]
fn replay_rebuilds_the_live_books_with_and_without_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = scenario::generate("normal", 30_000, 3).unwrap();
    let total = scenario.warmup.len() + scenario.messages.len();
    let store = store_at(dir.path(), Durability::Synced);
    let snapshots = Snapshots::for_store(&store);
    let mut sequencer = fresh_sequencer(Some(store.clone()), Mode::Pipelined, &scenario);
    run(&mut sequencer, &scenario, 12_000);
    let snapshot = sequencer.snapshot().unwrap();
    assert_eq!(snapshot.commands, 12_000);
    snapshots.save(&snapshot).unwrap();
    // Go on from the same engine: run the rest with times continuing.
    let mut out = Vec::new();
    for (i, command) in scenario
        .warmup
        .iter()
        .chain(&scenario.messages)
        .enumerate()
        .skip(12_000)
    {
        sequencer.execute(i as u64, command, &mut out).unwrap();
        out.clear();
        if sequencer.batch_full() {
            sequencer.flush(|_| {});
        }
    }
    sequencer.sync().unwrap();
    let live = sequencer.engine().state_hash();
    assert_eq!(live, reference(&scenario, total).state_hash());
    drop(sequencer);
    Arc::try_unwrap(store).ok().unwrap().close().unwrap();

    let store = Store::open(dir.path(), Options::default()).unwrap();
    let full = recover(&store, None).unwrap();
    assert_eq!(full.snapshot_position, None);
    assert_eq!(full.replayed as usize, total);
    assert_eq!(full.engine.state_hash(), live);

    let from_snapshot = recover(&store, Some(&Snapshots::for_store(&store))).unwrap();
    assert_eq!(from_snapshot.snapshot_position, Some(snapshot.position));
    assert_eq!(from_snapshot.replayed as usize, total - 12_000);
    assert_eq!(from_snapshot.commands as usize, total);
    assert_eq!(from_snapshot.engine.state_hash(), live);
    assert_eq!(from_snapshot.next_order_id, full.next_order_id);
}

/// Goal: every mode journals the same commands and ends in the same books as memory alone.
#[test]
fn every_mode_ends_in_the_same_state() {
    let scenario = scenario::generate("normal", 3_000, 11).unwrap();
    let total = scenario.warmup.len() + scenario.messages.len();
    let expected = reference(&scenario, total).state_hash();
    for mode in [
        Mode::Memory,
        Mode::PerOrder,
        Mode::Critical { critical_qty: 50 },
        Mode::Pipelined,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = mode.store_durability().map(|d| store_at(dir.path(), d));
        let mut sequencer = fresh_sequencer(store.clone(), mode, &scenario);
        let acked = run(&mut sequencer, &scenario, total);
        sequencer.sync().unwrap();
        assert_eq!(acked.load(Ordering::Relaxed) as usize, total, "{mode}");
        assert_eq!(sequencer.engine().state_hash(), expected, "{mode}");
        if let Some(store) = store {
            let stats = store.stats();
            if mode == Mode::PerOrder {
                // One append, and one fsync, per command.
                assert!(stats.appends as usize >= total, "{stats:?}");
                assert!(stats.fsyncs as usize >= total, "{stats:?}");
            }
            let recovered = recover(&store, None).unwrap();
            assert_eq!(recovered.engine.state_hash(), expected, "{mode}");
        }
    }
}

/// Goal: snapshots that do not fit the log are skipped with a reason, never trusted.
#[test]
fn unfit_snapshots_are_skipped() {
    let io = Arc::new(SimIo::new(5));
    let dir = std::path::Path::new("/sim/exchange");
    let store = Arc::new(Store::open_with_io(io.clone(), dir, Options::default()).unwrap());
    let scenario = scenario::generate("normal", 2_000, 5).unwrap();
    let mut sequencer = fresh_sequencer(Some(store.clone()), Mode::Pipelined, &scenario);
    run(&mut sequencer, &scenario, 3_000);
    let snapshots = Snapshots::for_store(&store);
    let good = sequencer.snapshot().unwrap();
    snapshots.save(&good).unwrap();
    // A snapshot claiming a position the log does not hold.
    let mut ahead = good.clone();
    ahead.position = store.head() + 10;
    snapshots.save(&ahead).unwrap();
    let (found, skipped) = snapshots.latest_fit(&store).unwrap();
    assert_eq!(found.unwrap().0.position, good.position);
    assert!(skipped[0].contains("ends before"), "{skipped:?}");

    // A damaged newest snapshot: the CRC catches it.
    let name = format!("snapshot-{:020}.anxs", ahead.position);
    let path = dir.join("exchange").join(&name);
    let mut bytes = io.read_file(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    io.write_file(&path, &bytes);
    let (found, skipped) = snapshots.latest_fit(&store).unwrap();
    assert_eq!(found.unwrap().0.position, good.position);
    assert!(skipped[0].contains("CRC"), "{skipped:?}");

    // A snapshot of another event at its position (the log was refilled after a loss).
    let mut other = good.clone();
    other.appended_at_us += 1;
    snapshots.save(&other).unwrap();
    let (found, skipped) = snapshots.latest_fit(&store).unwrap();
    assert!(found.is_none() || found.as_ref().unwrap().0.appended_at_us == good.appended_at_us);
    assert!(
        skipped.iter().any(|s| s.contains("another event")),
        "{skipped:?}"
    );
    let recovered = recover(&store, Some(&snapshots)).unwrap();
    assert_eq!(
        recovered.engine.state_hash(),
        sequencer.engine().state_hash()
    );
}

/// Goal: a failed fsync acknowledges nothing of the failed batch or after it, and the
/// sequencer refuses further commands until reopened; the reopened exchange replays exactly
/// what the log holds.
#[test]
fn a_failed_journal_acknowledges_nothing_more() {
    let io = Arc::new(SimIo::new(9));
    let dir = std::path::Path::new("/sim/exchange-fail");
    let store = Arc::new(Store::open_with_io(io.clone(), dir, Options::default()).unwrap());
    let scenario = scenario::generate("normal", 2_000, 9).unwrap();
    let mut sequencer = fresh_sequencer(Some(store.clone()), Mode::Pipelined, &scenario);
    let acked = run(&mut sequencer, &scenario, 1_000);
    sequencer.sync().unwrap();
    assert_eq!(acked.load(Ordering::Relaxed), 1_000);
    io.fail_sync(0, FaultKind::Eio, true);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let mut out = Vec::new();
    let commands: Vec<_> = scenario.warmup.iter().chain(&scenario.messages).collect();
    let mut refused = None;
    for (i, command) in commands.iter().enumerate().skip(1_000).take(500) {
        match sequencer.execute(i as u64, command, &mut out) {
            Ok(()) => {}
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
        out.clear();
        if sequencer.batch_full() {
            let outcomes = outcomes.clone();
            sequencer.flush(move |o| outcomes.lock().unwrap().push(o.is_ok()));
        }
    }
    let last = sequencer.sync();
    assert!(last.is_err(), "sync after a failed fsync: {last:?}");
    assert!(
        outcomes.lock().unwrap().iter().all(|ok| !ok),
        "a batch was acknowledged after the failed fsync"
    );
    assert!(matches!(
        sequencer.execute(0, commands[1_600], &mut out),
        Err(ExchangeError::Journal(_))
    ));
    if let Some(e) = refused {
        assert!(matches!(e, ExchangeError::Journal(_)));
    }
    drop(sequencer);
    drop(store);
    io.clear_faults();
    let store = Store::open_with_io(io.clone(), dir, Options::default()).unwrap();
    let recovered = recover(&store, None).unwrap();
    let n = recovered.commands as usize;
    assert!(n >= 1_000, "acknowledged commands lost: {n}");
    assert_eq!(
        recovered.engine.state_hash(),
        reference(&scenario, n).state_hash()
    );
}

/// Goal: one order's audit trail (its commands and the trades that filled it, including those
/// another account's command caused) is a plain DCB read by tag.
#[test]
fn an_orders_history_is_one_tag_read() {
    let store = Arc::new(Store::open_in_memory(Options::default()).unwrap());
    let sequencer = Sequencer::new(
        Engine::new(&[]),
        Some(store.clone()),
        Mode::Pipelined,
        SequencerOptions::default(),
    );
    assert!(sequencer.is_err(), "a D0 store does not suit the D3 mode");
    let dir = tempfile::tempdir().unwrap();
    let store = store_at(dir.path(), Durability::Synced);
    let mut sequencer = Sequencer::new(
        Engine::new(&[]),
        Some(store.clone()),
        Mode::Pipelined,
        SequencerOptions::default(),
    )
    .unwrap();
    sequencer
        .add_symbol(SymbolSpec { tick: 1, lot: 1 })
        .unwrap();
    let place = |id, account, side, price, qty| {
        Command::Place(Place::limit(id, account, 0, side, price, qty))
    };
    let mut out = Vec::new();
    for (time, command) in [
        place(1, 10, Side::Sell, 100, 5),
        Command::Amend {
            id: 1,
            account: 10,
            price: 100,
            qty: 4,
        },
        place(2, 20, Side::Buy, 100, 3),
        Command::Cancel { id: 1, account: 10 },
    ]
    .iter()
    .enumerate()
    {
        sequencer.execute(time as u64, command, &mut out).unwrap();
    }
    sequencer.sync().unwrap();
    let read = |tag: &str| -> Vec<String> {
        store
            .read(
                &Query::item(QueryItem::tags([tag])),
                ReadOptions::forwards(),
            )
            .unwrap()
            .map(|e| e.unwrap().event_type().to_owned())
            .collect()
    };
    assert_eq!(
        read("order:1"),
        [
            codec::PLACE_ORDER,
            codec::AMEND_ORDER,
            codec::TRADE_EXECUTED,
            codec::CANCEL_ORDER
        ]
    );
    assert_eq!(
        read("account:20"),
        [codec::PLACE_ORDER, codec::TRADE_EXECUTED]
    );
    assert_eq!(read("symbol:0").len(), 6);
}

/// Goal: a snapshot restores an engine that behaves exactly as the original from then on
/// (reports included), and damaged snapshot bytes are refused rather than misread.
#[test]
fn engine_snapshots_round_trip_and_refuse_damage() {
    let scenario = scenario::generate("normal", 20_000, 21).unwrap();
    let mut engine = Engine::new(&scenario.symbols);
    let mut out = Vec::new();
    let commands: Vec<_> = scenario.warmup.iter().chain(&scenario.messages).collect();
    for (i, command) in commands.iter().take(12_000).enumerate() {
        engine.apply(i as u64, command, &mut out);
    }
    let mut bytes = Vec::new();
    engine.snapshot(&mut bytes);
    let mut restored = Engine::from_snapshot(&bytes).unwrap();
    assert_eq!(restored.state_hash(), engine.state_hash());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (i, command) in commands.iter().enumerate().skip(12_000) {
        engine.apply(i as u64, command, &mut a);
        restored.apply(i as u64, command, &mut b);
        assert_eq!(a, b, "reports differ after command {i}");
        a.clear();
        b.clear();
    }
    assert_eq!(restored.state_hash(), engine.state_hash());
    for cut in [0, 3, 8, bytes.len() / 2, bytes.len() - 1] {
        assert!(Engine::from_snapshot(&bytes[..cut]).is_err(), "cut {cut}");
    }
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(Engine::from_snapshot(&extra).is_err());
}
