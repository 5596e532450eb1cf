//! The exchange as a service: ids and times assigned by the exchange, answers and market data
//! released only once durable, a restart that resumes from the stop's snapshot, many callers
//! at once, and a failed journal that answers nothing more and publishes nothing.

use std::sync::{Arc, Mutex};

use annals::sim::{FaultKind, SimIo};
use annals::{Options, Store};
use annals_exchange::*;

fn collecting_sink() -> (Sink, Arc<Mutex<Vec<Output>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink_seen = seen.clone();
    let sink: Sink = Arc::new(move |first: u64, outputs: Vec<Output>| {
        let mut seen = sink_seen.lock().unwrap();
        assert_eq!(
            first,
            seen.len() as u64,
            "outputs are numbered without gaps"
        );
        seen.extend(outputs)
    });
    (sink, seen)
}

fn options(mode: Mode) -> ServiceOptions {
    ServiceOptions {
        mode,
        symbols: vec![
            SymbolSpec { tick: 1, lot: 1 },
            SymbolSpec { tick: 5, lot: 10 },
        ],
        ..ServiceOptions::default()
    }
}

fn place(account: AccountId, symbol: SymbolId, side: Side, price: Price, qty: Qty) -> Command {
    Command::Place(Place {
        client_id: 0,
        ..Place::limit(0, account, symbol, side, price, qty)
    })
}

/// Goal: the exchange numbers orders itself, answers with durable positions, publishes
/// execution reports per account, trades and best-price changes in journal order, and a
/// restart resumes from the snapshot written at the stop with the same books and the next id.
#[test]
fn orders_trade_publish_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let (sink, seen) = collecting_sink();
    let exchange = Exchange::start(Some(store.clone()), options(Mode::Pipelined), sink).unwrap();
    assert_eq!(exchange.start_report().symbols_added, 2);
    let sell = exchange.execute(place(7, 0, Side::Sell, 101, 5)).unwrap();
    assert_eq!(sell.id, 1);
    assert_eq!(sell.reports, [Report::Accepted { id: 1 }]);
    assert!(
        sell.position >= 3,
        "two symbols and the order are journaled"
    );
    assert!(sell.position <= store.head());
    let buy = exchange.execute(place(8, 0, Side::Buy, 102, 3)).unwrap();
    assert_eq!(buy.id, 2);
    assert!(buy.time >= sell.time);
    assert!(buy.reports.contains(&Report::Trade {
        symbol: 0,
        price: 101,
        qty: 3,
        maker: 1,
        taker: 2,
        taker_side: Side::Buy,
        time: buy.time,
    }));
    // Invalid prices are refused by the engine, with a reason, and journaled like any command.
    let bad = exchange.execute(place(8, 1, Side::Buy, 7, 10)).unwrap();
    assert_eq!(
        bad.reports,
        [Report::Rejected {
            id: 3,
            reason: Reject::InvalidPrice
        }]
    );
    let depth = exchange
        .query(|engine| engine.depth(0, Side::Sell, 10))
        .unwrap();
    assert_eq!(depth, [(101, 2, 1)]);
    let status = exchange.query(|engine| engine.status(1)).unwrap();
    assert!(matches!(status, OrderStatus::Live(v) if v.leaves == 2 && v.account == 7));
    let cancel = exchange
        .execute(Command::Cancel { id: 1, account: 7 })
        .unwrap();
    assert!(matches!(
        cancel.reports[..],
        [Report::Cancelled {
            id: 1,
            qty: 2,
            leaves: 0,
            ..
        }]
    ));
    assert_eq!(
        exchange.query(|engine| engine.status(1)).unwrap(),
        OrderStatus::Cancelled
    );
    assert_eq!(
        exchange.query(|engine| engine.status(2)).unwrap(),
        OrderStatus::Filled
    );
    assert_eq!(
        exchange.query(|engine| engine.status(99)).unwrap(),
        OrderStatus::Unknown
    );
    let hash = exchange.query(|engine| engine.state_hash()).unwrap();
    exchange.stop().unwrap();
    assert!(matches!(
        exchange.execute(place(1, 0, Side::Buy, 1, 1)),
        Err(ExchangeError::Stopped)
    ));
    {
        let outputs = seen.lock().unwrap();
        let for_account = |a| {
            outputs
                .iter()
                .filter_map(move |o| match o {
                    Output::Execution { account, report } if *account == a => Some(*report),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        assert!(matches!(
            for_account(7)[..],
            [
                Report::Accepted { id: 1 },
                Report::Fill {
                    id: 1,
                    leaves: 2,
                    role: Role::Maker,
                    ..
                },
                Report::Cancelled { id: 1, .. }
            ]
        ));
        assert!(matches!(
            for_account(8)[..],
            [
                Report::Accepted { id: 2 },
                Report::Fill {
                    id: 2,
                    leaves: 0,
                    role: Role::Taker,
                    ..
                },
                Report::Rejected { id: 3, .. }
            ]
        ));
        let market: Vec<_> = outputs.iter().filter(|o| o.symbol() == Some(0)).collect();
        let ask = |p, q| Bbo {
            bid: None,
            ask: Some((p, q)),
        };
        assert!(matches!(
            market[..],
            [
                Output::Bbo { bbo: a, .. },
                Output::Trade(t),
                Output::Bbo { bbo: b, .. },
                Output::Bbo { bbo: c, .. },
            ] if *a == ask(101, 5) && t.qty == 3 && t.maker_account == 7 && t.taker_account == 8
                && *b == ask(101, 2) && *c == Bbo::default()
        ));
    }
    drop(exchange);
    drop(store);
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let (sink, _) = collecting_sink();
    let exchange = Exchange::start(Some(store), options(Mode::Pipelined), sink).unwrap();
    let report = exchange.start_report();
    assert_eq!(report.symbols_added, 0);
    assert!(report.snapshot_position.is_some(), "{report:?}");
    assert_eq!(report.replayed, 0);
    assert_eq!(report.commands, 4);
    assert_eq!(exchange.query(|engine| engine.state_hash()).unwrap(), hash);
    let next = exchange.execute(place(9, 1, Side::Sell, 50, 20)).unwrap();
    assert_eq!(next.id, 4, "ids go on after the journal's last order");
    // Configured symbols that contradict the journal are refused.
    exchange.stop().unwrap();
    drop(exchange);
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let mut wrong = options(Mode::Pipelined);
    wrong.symbols[1].lot = 1;
    let (sink, _) = collecting_sink();
    match Exchange::start(Some(store), wrong, sink) {
        Err(ExchangeError::Invalid(e)) => assert!(e.contains("symbol 1"), "{e}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}

/// Goal: many callers at once get every command answered exactly once, in one consistent
/// order (ids strictly increasing with journal positions), with fewer fsyncs than commands.
#[test]
fn concurrent_callers_share_batches() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    let (sink, seen) = collecting_sink();
    let exchange =
        Arc::new(Exchange::start(Some(store.clone()), options(Mode::Pipelined), sink).unwrap());
    let syncs_before = store.stats().fsyncs;
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let exchange = exchange.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                for i in 0..200u64 {
                    let side = if (t + i) % 2 == 0 {
                        Side::Buy
                    } else {
                        Side::Sell
                    };
                    let price = 100 + (i % 7);
                    let (tx, rx) = std::sync::mpsc::channel();
                    loop {
                        let tx = tx.clone();
                        match exchange.try_submit(place(t, 0, side, price, 1 + i % 3), move |r| {
                            let _ = tx.send(r);
                        }) {
                            Ok(()) => break,
                            Err(ExchangeError::Busy(_)) => std::thread::yield_now(),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    answers.push(rx.recv().unwrap().unwrap());
                }
                answers
            })
        })
        .collect();
    let mut all: Vec<Executed> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(all.len(), 1_600);
    all.sort_by_key(|e| e.id);
    for (i, e) in all.iter().enumerate() {
        assert_eq!(e.id, i as u64 + 1);
    }
    assert!(all.windows(2).all(|w| w[0].position <= w[1].position));
    let fsyncs = store.stats().fsyncs - syncs_before;
    assert!(fsyncs < 1_600, "{fsyncs} fsyncs for 1,600 commands");
    let stats = exchange.stats();
    assert_eq!(
        stats.commands.load(std::sync::atomic::Ordering::Relaxed),
        1_600
    );
    exchange.stop().unwrap();
    // Every accepted order has its report on its account's stream, in id order.
    let outputs = seen.lock().unwrap();
    for account in 0..8u64 {
        let accepted: Vec<_> = outputs
            .iter()
            .filter_map(|o| match o {
                Output::Execution {
                    account: a,
                    report: Report::Accepted { id },
                } if *a == account => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(accepted.len(), 200);
        assert!(accepted.windows(2).all(|w| w[0] < w[1]));
    }
}

/// Goal: once the journal fails, nothing more is answered as done or published, and every
/// later request is refused with the journal's error until the exchange is reopened.
#[test]
fn a_failed_journal_answers_and_publishes_nothing_more() {
    let io = Arc::new(SimIo::new(21));
    let dir = std::path::Path::new("/sim/exchange-service");
    let store = Arc::new(Store::open_with_io(io.clone(), dir, Options::default()).unwrap());
    let (sink, seen) = collecting_sink();
    let exchange = Exchange::start(Some(store.clone()), options(Mode::Pipelined), sink).unwrap();
    exchange.execute(place(1, 0, Side::Sell, 100, 5)).unwrap();
    let published = seen.lock().unwrap().len();
    io.fail_sync(0, FaultKind::Eio, true);
    let failed = exchange.execute(place(2, 0, Side::Buy, 100, 5));
    assert!(
        matches!(failed, Err(ExchangeError::Journal(_))),
        "{failed:?}"
    );
    assert!(matches!(
        exchange.query(|engine| engine.live_orders()),
        Err(ExchangeError::Journal(_))
    ));
    assert!(matches!(
        exchange.execute(Command::Cancel { id: 1, account: 1 }),
        Err(ExchangeError::Journal(_))
    ));
    assert_eq!(seen.lock().unwrap().len(), published, "nothing published");
    assert!(exchange.stop().is_err());
    drop(exchange);
    drop(store);
    io.clear_faults();
    let store = Arc::new(Store::open_with_io(io, dir, Options::default()).unwrap());
    let (sink, _) = collecting_sink();
    let exchange = Exchange::start(Some(store), options(Mode::Pipelined), sink).unwrap();
    // The resting sell survived; whatever the failed batch held is either whole or gone.
    let live = exchange.query(|engine| engine.status(1)).unwrap();
    assert!(matches!(live, OrderStatus::Live(_) | OrderStatus::Filled));
}

/// Goal: every mode answers the same commands the same way; d0 journals nothing and
/// per-order syncs each command.
#[test]
fn every_mode_answers_alike() {
    let mut answers = Vec::new();
    for mode in [Mode::Memory, Mode::PerOrder, Mode::Pipelined] {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
        let (sink, _) = collecting_sink();
        let journal = (mode != Mode::Memory).then(|| store.clone());
        let exchange = Exchange::start(journal, options(mode), sink).unwrap();
        let before = store.stats().fsyncs;
        let mut reports = Vec::new();
        for i in 0..40u64 {
            let side = if i % 3 == 0 { Side::Buy } else { Side::Sell };
            let e = exchange
                .execute(place(i % 4, 0, side, 100 + i % 5, 2))
                .unwrap();
            reports.push(
                e.reports
                    .iter()
                    .map(|r| match *r {
                        // Times come from the clock: compare everything else.
                        Report::Trade {
                            symbol,
                            price,
                            qty,
                            maker,
                            taker,
                            taker_side,
                            ..
                        } => Report::Trade {
                            symbol,
                            price,
                            qty,
                            maker,
                            taker,
                            taker_side,
                            time: 0,
                        },
                        other => other,
                    })
                    .collect::<Vec<_>>(),
            );
        }
        let synced = store.stats().fsyncs - before;
        match mode {
            Mode::Memory => assert_eq!(store.head(), 0),
            Mode::PerOrder => assert!(synced >= 40, "{synced}"),
            _ => {}
        }
        exchange.stop().unwrap();
        answers.push(reports);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0], answers[2]);
}

/// Goal: a power loss in the middle of a busy run (callers on several threads, the disk
/// losing whatever was not synced) takes back no acknowledged command: after reopening, every
/// acknowledged order is known, and one acknowledged as done is still done.
#[test]
fn a_power_loss_takes_back_nothing_acknowledged() {
    for (round, mode) in [
        annals::sim::CrashMode::DropUnsynced,
        annals::sim::CrashMode::KeepPrefix,
        annals::sim::CrashMode::TearWrite,
        annals::sim::CrashMode::GarbageTail,
    ]
    .into_iter()
    .enumerate()
    {
        let io = Arc::new(SimIo::new(40 + round as u64));
        let dir = std::path::Path::new("/sim/exchange-power");
        let store = Arc::new(Store::open_with_io(io.clone(), dir, Options::default()).unwrap());
        let (sink, _) = collecting_sink();
        let exchange =
            Arc::new(Exchange::start(Some(store.clone()), options(Mode::Pipelined), sink).unwrap());
        let acked = Arc::new(Mutex::new(Vec::new()));
        let callers: Vec<_> = (0..4u64)
            .map(|t| {
                let (exchange, acked) = (exchange.clone(), acked.clone());
                std::thread::spawn(move || {
                    for i in 0..2_000u64 {
                        let side = if (t + i) % 2 == 0 {
                            Side::Buy
                        } else {
                            Side::Sell
                        };
                        let acked = acked.clone();
                        let queued = exchange.try_submit(
                            place(t, 0, side, 100 + i % 5, 1 + i % 3),
                            move |r| {
                                if let Ok(e) = r {
                                    acked.lock().unwrap().push(e);
                                }
                            },
                        );
                        if queued.is_err() {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        // Cut the power while the callers are busy.
        while acked.lock().unwrap().len() < 1_500 {
            std::thread::yield_now();
        }
        let crashed = io.crash(mode);
        for caller in callers {
            caller.join().unwrap();
        }
        let acked: Vec<Executed> = acked.lock().unwrap().clone();
        drop(exchange);
        drop(store);
        let store =
            Arc::new(Store::open_with_io(Arc::new(crashed), dir, Options::default()).unwrap());
        let (sink, _) = collecting_sink();
        let exchange =
            Exchange::start(Some(store.clone()), options(Mode::Pipelined), sink).unwrap();
        assert!(exchange.start_report().commands >= acked.len() as u64);
        for e in &acked {
            assert!(
                e.position <= store.head(),
                "{mode:?}: position {} lost",
                e.position
            );
            let id = e.id;
            let now = exchange.query(move |engine| engine.status(id)).unwrap();
            assert_ne!(
                now,
                OrderStatus::Unknown,
                "{mode:?}: acknowledged order {id} lost"
            );
            let done = e
                .reports
                .iter()
                .any(|r| matches!(r, Report::Fill { id: f, leaves: 0, .. } if *f == id));
            if done {
                assert_eq!(now, OrderStatus::Filled, "{mode:?}: order {id}");
            }
        }
    }
}
