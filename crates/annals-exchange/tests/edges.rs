//! The matcher's edge cases, one test each.

use annals_exchange::*;

struct Bench {
    engine: Engine,
    time: u64,
}

fn bench() -> Bench {
    Bench {
        engine: Engine::new(&[SymbolSpec { tick: 1, lot: 1 }]),
        time: 0,
    }
}

fn place(
    id: OrderId,
    account: AccountId,
    side: Side,
    kind: Kind,
    price: Price,
    qty: Qty,
) -> Command {
    Command::Place(Place {
        kind,
        stp: Stp::Allow,
        ..Place::limit(id, account, 0, side, price, qty)
    })
}

fn limit(id: OrderId, account: AccountId, side: Side, price: Price, qty: Qty) -> Command {
    place(id, account, side, Kind::Limit, price, qty)
}

fn amend(id: OrderId, account: AccountId, price: Price, qty: Qty) -> Command {
    Command::Amend {
        id,
        account,
        price,
        qty,
    }
}

use Side::{Buy, Sell};

impl Bench {
    fn run(&mut self, command: Command) -> Vec<Report> {
        self.time += 1;
        let mut out = Vec::new();
        self.engine.apply(self.time, &command, &mut out);
        out
    }

    fn trades(&mut self, command: Command) -> Vec<(OrderId, OrderId, Price, Qty)> {
        self.run(command)
            .into_iter()
            .filter_map(|r| match r {
                Report::Trade {
                    maker,
                    taker,
                    price,
                    qty,
                    ..
                } => Some((maker, taker, price, qty)),
                _ => None,
            })
            .collect()
    }

    fn queue(&self, side: Side) -> Vec<(OrderId, Price, Qty)> {
        self.engine
            .queue(0, side)
            .into_iter()
            .map(|(id, _, price, qty)| (id, price, qty))
            .collect()
    }
}

fn rejected(reports: &[Report]) -> Option<Reject> {
    match reports {
        [Report::Rejected { reason, .. }] => Some(*reason),
        _ => None,
    }
}

#[test]
fn cancel_the_head_of_a_queue_then_sweep() {
    let mut b = bench();
    for id in 1..=3 {
        b.run(limit(id, id, Sell, 100, 5));
    }
    b.run(Command::Cancel { id: 1, account: 1 });
    assert_eq!(
        b.trades(limit(9, 9, Buy, 100, 10)),
        [(2, 9, 100, 5), (3, 9, 100, 5)]
    );
    assert!(b.queue(Sell).is_empty());
}

#[test]
fn cancel_the_middle_of_a_queue_then_sweep() {
    let mut b = bench();
    for id in 1..=3 {
        b.run(limit(id, id, Sell, 100, 5));
    }
    b.run(Command::Cancel { id: 2, account: 2 });
    assert_eq!(
        b.trades(limit(9, 9, Buy, 100, 7)),
        [(1, 9, 100, 5), (3, 9, 100, 2)]
    );
    assert_eq!(b.queue(Sell), [(3, 100, 3)]);
}

#[test]
fn ioc_sweep_ending_exactly_on_a_level_boundary() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 100, 5));
    b.run(limit(2, 2, Sell, 101, 5));
    b.run(limit(3, 3, Sell, 102, 5));
    let out = b.run(place(9, 9, Buy, Kind::Ioc, 102, 10));
    let trades: Vec<_> = out
        .iter()
        .filter(|r| matches!(r, Report::Trade { .. }))
        .collect();
    assert_eq!(trades.len(), 2);
    // Filled exactly: nothing cancelled, the next level untouched and now the best.
    assert!(!out.iter().any(|r| matches!(r, Report::Cancelled { .. })));
    assert_eq!(b.queue(Sell), [(3, 102, 5)]);
    assert_eq!(b.engine.bbo(0).ask, Some((102, 5)));
}

#[test]
fn a_resting_residual_becomes_the_best_and_is_fillable() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 100, 5));
    b.run(limit(2, 2, Buy, 101, 8));
    // 5 traded at 100; 3 rest at 101 as the new best bid.
    assert_eq!(b.engine.bbo(0).bid, Some((101, 3)));
    assert_eq!(b.engine.bbo(0).ask, None);
    assert_eq!(b.trades(limit(3, 3, Sell, 101, 3)), [(2, 3, 101, 3)]);
    assert_eq!(b.engine.bbo(0), Bbo::default());
}

#[test]
fn amend_into_a_cross_trades_at_the_makers_price_buying() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 105, 5));
    b.run(limit(2, 2, Buy, 100, 5));
    let trades = b.trades(amend(2, 2, 107, 5));
    assert_eq!(trades, [(1, 2, 105, 5)]);
    assert!(b.engine.order(2).is_none());
}

#[test]
fn amend_into_a_cross_trades_at_the_makers_price_selling() {
    let mut b = bench();
    b.run(limit(1, 1, Buy, 95, 5));
    b.run(limit(2, 2, Sell, 100, 8));
    let trades = b.trades(amend(2, 2, 90, 8));
    assert_eq!(trades, [(1, 2, 95, 5)]);
    // The rest of the amended order rests at its new price.
    assert_eq!(b.queue(Sell), [(2, 90, 3)]);
}

#[test]
fn repricing_one_of_two_keeps_the_others_priority() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 100, 5));
    b.run(limit(2, 2, Sell, 100, 5));
    b.run(limit(3, 3, Sell, 100, 5));
    // 1 moves away and back: it loses its place; 2 and 3 keep theirs.
    b.run(amend(1, 1, 101, 5));
    b.run(amend(1, 1, 100, 5));
    assert_eq!(b.queue(Sell), [(2, 100, 5), (3, 100, 5), (1, 100, 5)]);
    // A decrease in place keeps priority; an increase loses it.
    b.run(amend(2, 2, 100, 4));
    assert_eq!(b.queue(Sell)[0], (2, 100, 4));
    b.run(amend(3, 3, 100, 6));
    assert_eq!(b.queue(Sell), [(2, 100, 4), (1, 100, 5), (3, 100, 6)]);
}

#[test]
fn cancel_and_amend_of_a_partially_filled_order() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 100, 10));
    b.run(limit(2, 2, Buy, 100, 4));
    assert_eq!(b.engine.order(1).unwrap().leaves, 6);
    let out = b.run(amend(1, 1, 100, 3));
    assert_eq!(
        out,
        [Report::Amended {
            id: 1,
            price: 100,
            qty: 3
        }]
    );
    assert_eq!(b.engine.bbo(0).ask, Some((100, 3)));
    let out = b.run(Command::Cancel { id: 1, account: 1 });
    assert_eq!(
        out,
        [Report::Cancelled {
            id: 1,
            qty: 3,
            leaves: 0,
            reason: CancelReason::Requested
        }]
    );
}

#[test]
fn cancel_and_amend_of_done_or_unknown_orders_are_refused() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 100, 5));
    b.run(limit(2, 2, Buy, 100, 5)); // fills 1 and 2
    b.run(limit(3, 3, Sell, 110, 5));
    b.run(Command::Cancel { id: 3, account: 3 });
    for (id, account, reason) in [
        (1, 1, Reject::AlreadyFilled),
        (2, 2, Reject::AlreadyFilled),
        (3, 3, Reject::AlreadyCancelled),
        (99, 1, Reject::UnknownOrder),
    ] {
        assert_eq!(
            rejected(&b.run(Command::Cancel { id, account })),
            Some(reason)
        );
        assert_eq!(rejected(&b.run(amend(id, account, 120, 1))), Some(reason));
    }
    b.run(limit(4, 4, Sell, 110, 5));
    assert_eq!(
        rejected(&b.run(Command::Cancel { id: 4, account: 5 })),
        Some(Reject::NotOwner)
    );
}

#[test]
fn client_ids_are_reusable_once_their_order_is_done() {
    let mut b = bench();
    let with_client = |id, client, side, price| {
        Command::Place(Place {
            id,
            client_id: client,
            account: 7,
            symbol: 0,
            side,
            kind: Kind::Limit,
            price,
            qty: 5,
            stp: Stp::Allow,
        })
    };
    b.run(with_client(1, 42, Sell, 100));
    assert_eq!(
        rejected(&b.run(with_client(2, 42, Sell, 101))),
        Some(Reject::DuplicateClientOrderId)
    );
    b.run(Command::Cancel { id: 1, account: 7 });
    assert_eq!(
        b.run(with_client(3, 42, Sell, 101)),
        [Report::Accepted { id: 3 }],
        "reuse after cancel"
    );
    b.run(limit(4, 8, Buy, 101, 5)); // fills 3
    assert_eq!(
        b.run(with_client(5, 42, Sell, 102)),
        [Report::Accepted { id: 5 }],
        "reuse after fill"
    );
    // Order ids are never reused.
    assert_eq!(
        rejected(&b.run(limit(3, 9, Sell, 105, 1))),
        Some(Reject::DuplicateOrderId)
    );
}

#[test]
fn a_marketable_limit_stops_at_its_own_limit() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 100, 5));
    b.run(limit(2, 2, Sell, 101, 5));
    b.run(limit(3, 3, Sell, 102, 5));
    let trades = b.trades(limit(9, 9, Buy, 101, 20));
    assert_eq!(trades, [(1, 9, 100, 5), (2, 9, 101, 5)]);
    assert_eq!(b.engine.bbo(0).bid, Some((101, 10)));
    assert_eq!(b.engine.bbo(0).ask, Some((102, 5)));
}

#[test]
fn no_phantom_best_price_after_the_top_level_empties() {
    let mut b = bench();
    b.run(limit(1, 1, Buy, 100, 5));
    b.run(limit(2, 2, Buy, 99, 5));
    b.run(Command::Cancel { id: 1, account: 1 });
    assert_eq!(b.engine.bbo(0).bid, Some((99, 5)));
    b.run(limit(3, 3, Sell, 99, 5));
    assert_eq!(b.engine.bbo(0), Bbo::default());
    assert!(b.engine.depth(0, Buy, 10).is_empty());
    // A new order at the old top price starts a fresh level.
    b.run(limit(4, 4, Buy, 100, 1));
    assert_eq!(b.engine.depth(0, Buy, 10), [(100, 1, 1)]);
}

#[test]
fn prices_near_the_largest_representable_value() {
    let mut b = bench();
    let top = Price::MAX;
    b.run(limit(1, 1, Sell, top, 5));
    b.run(limit(2, 2, Sell, top - 1, 5));
    b.run(limit(3, 3, Buy, top - 2, 5));
    assert_eq!(b.engine.bbo(0).ask, Some((top - 1, 5)));
    // A market buy's limit is the largest price: it reaches the very top level.
    let trades = b.trades(place(9, 9, Buy, Kind::Market, 0, 10));
    assert_eq!(trades, [(2, 9, top - 1, 5), (1, 9, top, 5)]);
    let trades = b.trades(limit(10, 10, Sell, 1, 5));
    assert_eq!(trades, [(3, 10, top - 2, 5)]);
}

#[test]
fn one_taker_sweeps_5000_makers_at_one_price() {
    let mut b = bench();
    for id in 1..=5000 {
        b.run(limit(id, id, Sell, 100, 2));
    }
    let out = b.run(limit(10_000, 10_000, Buy, 100, 10_000));
    let trades = out
        .iter()
        .filter(|r| matches!(r, Report::Trade { .. }))
        .count();
    assert_eq!(trades, 5000);
    assert!(matches!(
        out.last(),
        Some(Report::Fill {
            id: 10_000,
            leaves: 0,
            ..
        })
    ));
    assert_eq!(b.engine.live_orders(), 0);
    assert_eq!(b.engine.bbo(0), Bbo::default());
}

#[test]
fn a_partial_fok_leaves_the_book_untouched() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 100, 5));
    b.run(limit(2, 2, Sell, 101, 5));
    let before = b.engine.state_hash();
    let out = b.run(place(9, 9, Buy, Kind::Fok, 101, 11));
    assert_eq!(rejected(&out), Some(Reject::NotFillable));
    assert_eq!(b.engine.state_hash(), before);
    // Exactly reachable: filled whole.
    let trades = b.trades(place(10, 9, Buy, Kind::Fok, 101, 10));
    assert_eq!(trades.len(), 2);
}

#[test]
fn post_only_rests_or_is_refused() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 100, 5));
    assert_eq!(
        rejected(&b.run(place(2, 2, Buy, Kind::PostOnly, 100, 1))),
        Some(Reject::WouldTake)
    );
    assert_eq!(
        b.run(place(3, 2, Buy, Kind::PostOnly, 99, 1)),
        [Report::Accepted { id: 3 }]
    );
    // Amending it into a cross is refused and leaves it as it was.
    let amend = amend(3, 2, 100, 1);
    assert_eq!(rejected(&b.run(amend)), Some(Reject::WouldTake));
    assert_eq!(b.queue(Buy), [(3, 99, 1)]);
}

#[test]
fn invalid_ticks_lots_and_symbols_are_refused() {
    let mut engine = Engine::new(&[SymbolSpec { tick: 5, lot: 10 }]);
    let mut out = Vec::new();
    let mut try_place = |symbol, price, qty| {
        out.clear();
        engine.apply(
            0,
            &Command::Place(Place {
                id: 1,
                client_id: 1,
                account: 1,
                symbol,
                side: Buy,
                kind: Kind::Limit,
                price,
                qty,
                stp: Stp::Allow,
            }),
            &mut out,
        );
        rejected(&out)
    };
    assert_eq!(try_place(0, 102, 10), Some(Reject::InvalidPrice));
    assert_eq!(try_place(0, 0, 10), Some(Reject::InvalidPrice));
    assert_eq!(try_place(0, 100, 15), Some(Reject::InvalidQuantity));
    assert_eq!(try_place(0, 100, 0), Some(Reject::InvalidQuantity));
    assert_eq!(try_place(1, 100, 10), Some(Reject::UnknownSymbol));
    assert_eq!(try_place(0, 100, 10), None);
}

fn self_trade(stp: Stp) -> (Vec<Report>, Bench) {
    let mut b = bench();
    b.run(limit(1, 7, Sell, 100, 5)); // own
    b.run(limit(2, 8, Sell, 100, 5)); // someone else's
    let out = b.run(Command::Place(Place {
        id: 3,
        client_id: 3,
        account: 7,
        symbol: 0,
        side: Buy,
        kind: Kind::Limit,
        price: 100,
        qty: 8,
        stp,
    }));
    (out, b)
}

#[test]
fn self_trade_cancel_newest() {
    let (out, b) = self_trade(Stp::CancelNewest);
    assert_eq!(
        out,
        [
            Report::Accepted { id: 3 },
            Report::Cancelled {
                id: 3,
                qty: 8,
                leaves: 0,
                reason: CancelReason::SelfTrade
            }
        ]
    );
    assert_eq!(b.queue(Sell), [(1, 100, 5), (2, 100, 5)]);
}

#[test]
fn self_trade_cancel_oldest() {
    let (out, b) = self_trade(Stp::CancelOldest);
    assert_eq!(
        out[1],
        Report::Cancelled {
            id: 1,
            qty: 5,
            leaves: 0,
            reason: CancelReason::SelfTrade
        }
    );
    assert!(out.contains(&Report::Trade {
        symbol: 0,
        price: 100,
        qty: 5,
        maker: 2,
        taker: 3,
        taker_side: Buy,
        time: 3
    }));
    // 3 of the taker rest.
    assert_eq!(b.queue(Buy), [(3, 100, 3)]);
    assert!(b.queue(Sell).is_empty());
}

#[test]
fn self_trade_cancel_both() {
    let (out, b) = self_trade(Stp::CancelBoth);
    assert_eq!(
        &out[1..],
        [
            Report::Cancelled {
                id: 1,
                qty: 5,
                leaves: 0,
                reason: CancelReason::SelfTrade
            },
            Report::Cancelled {
                id: 3,
                qty: 8,
                leaves: 0,
                reason: CancelReason::SelfTrade
            }
        ]
    );
    assert_eq!(b.queue(Sell), [(2, 100, 5)]);
    assert!(b.queue(Buy).is_empty());
}

#[test]
fn self_trade_decrement() {
    let (out, b) = self_trade(Stp::Decrement);
    // Both lose 5 without a trade; the taker's other 3 trade with the other account.
    assert_eq!(
        &out[1..3],
        [
            Report::Cancelled {
                id: 1,
                qty: 5,
                leaves: 0,
                reason: CancelReason::SelfTrade
            },
            Report::Cancelled {
                id: 3,
                qty: 5,
                leaves: 3,
                reason: CancelReason::SelfTrade
            }
        ]
    );
    assert!(out.contains(&Report::Trade {
        symbol: 0,
        price: 100,
        qty: 3,
        maker: 2,
        taker: 3,
        taker_side: Buy,
        time: 3
    }));
    assert_eq!(b.queue(Sell), [(2, 100, 2)]);
}

#[test]
fn self_trade_allowed_when_asked() {
    let (out, _) = self_trade(Stp::Allow);
    assert!(out.contains(&Report::Trade {
        symbol: 0,
        price: 100,
        qty: 5,
        maker: 1,
        taker: 3,
        taker_side: Buy,
        time: 3
    }));
}

#[test]
fn cancel_all_cancels_an_accounts_orders_in_one_symbol_or_all() {
    let mut engine = Engine::new(&[SymbolSpec { tick: 1, lot: 1 }; 2]);
    let mut out = Vec::new();
    for (id, symbol, account) in [(1, 0, 7), (2, 1, 7), (3, 0, 8), (4, 0, 7)] {
        engine.apply(
            0,
            &Command::Place(Place {
                id,
                client_id: id,
                account,
                symbol,
                side: Buy,
                kind: Kind::Limit,
                price: 100 - id,
                qty: 1,
                stp: Stp::Allow,
            }),
            &mut out,
        );
    }
    out.clear();
    engine.apply(
        1,
        &Command::CancelAll {
            account: 7,
            symbol: Some(0),
        },
        &mut out,
    );
    let cancelled: Vec<_> = out
        .iter()
        .map(|r| match r {
            Report::Cancelled { id, .. } => *id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(cancelled, [1, 4]);
    assert!(engine.order(2).is_some() && engine.order(3).is_some());
    out.clear();
    engine.apply(
        2,
        &Command::CancelAll {
            account: 7,
            symbol: None,
        },
        &mut out,
    );
    assert_eq!(out.len(), 1);
    assert_eq!(engine.live_orders(), 1);
}
