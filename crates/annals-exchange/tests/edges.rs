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

/// Goal: cancelling the first order in a price level's queue takes it out for good: a taker
/// sweeping the level trades with the orders behind it, in time order.
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

/// Goal: cancelling an order in the middle of a queue keeps the orders around it in time order: a
/// taker fills the first, then part of the last, whose rest stays in the book.
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

/// Goal: an immediate-or-cancel order filled exactly at the end of a price level has nothing to
/// cancel, and leaves the next level untouched and now the best ask.
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

/// Goal: the unfilled rest of a crossing order rests in the book as the new best price, and a later
/// order fills it.
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

/// Goal: a buy order amended to a price that crosses the book trades at the resting seller's price,
/// not its own.
#[test]
fn amend_into_a_cross_trades_at_the_makers_price_buying() {
    let mut b = bench();
    b.run(limit(1, 1, Sell, 105, 5));
    b.run(limit(2, 2, Buy, 100, 5));
    let trades = b.trades(amend(2, 2, 107, 5));
    assert_eq!(trades, [(1, 2, 105, 5)]);
    assert!(b.engine.order(2).is_none());
}

/// Goal: a sell order amended to a price that crosses the book trades at the resting buyer's price,
/// and its rest then rests at its new price.
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

/// Goal: amending one order at a price level keeps the time priority of the others. An order moved
/// away and back goes to the end of the queue; a smaller quantity keeps its place, a larger one
/// loses it.
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

/// Goal: a partly filled order can be amended down to a quantity below what is left and then
/// cancelled, and the book and the reports show what it has left.
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

/// Goal: a cancel or an amend of an order that is filled, already cancelled or unknown is refused
/// with the reason, and a cancel from an account that does not own the order is refused.
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

/// Goal: an account's client order id is refused while its order is live and may be used again once
/// the order is cancelled or filled; exchange order ids are never reused.
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

/// Goal: a limit order that crosses the book trades only at prices up to its limit, and its rest
/// then rests at its limit.
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

/// Goal: once the top price level empties, the best price is the next level's, and an emptied book
/// shows no level at all; a new order at the old top price starts a fresh level.
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

/// Goal: the book orders and matches prices at the top of the price range without overflow: a
/// market buy reaches the highest level, and a sell reaches a bid just below it.
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

/// Goal: one taker filling a very long queue at one price trades with every maker, ends filled and
/// leaves an empty book.
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

/// Goal: a fill-or-kill order the book cannot fill whole is refused and leaves the book exactly as
/// it was; one the book can just fill trades whole.
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

/// Goal: a post-only order that would trade is refused, one that would not rests, and amending it
/// into a cross is refused and leaves it as it was.
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

/// Goal: an order whose price is off the symbol's tick or not positive, whose quantity is off its
/// lot or zero, or whose symbol is unknown is refused with the reason.
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

/// Goal: with self-trade prevention cancelling the newest, a taker that would trade with its own
/// account's resting order is cancelled whole, and the book keeps both resting orders.
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

/// Goal: with self-trade prevention cancelling the oldest, the own resting order is cancelled, the
/// taker trades with another account's order, and its rest rests.
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

/// Goal: with self-trade prevention cancelling both, the own resting order and the taker are both
/// cancelled, and another account's order stays in the book.
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

/// Goal: with self-trade prevention by decrement, the taker and the own resting order both lose the
/// quantity they would have traded, without a trade, and the taker's rest trades with another
/// account.
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

/// Goal: an order that allows self-trades trades with its own account's resting order.
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

/// Goal: cancel-all cancels every live order of one account in the symbol given, or in every symbol
/// when none is given, and leaves other accounts' orders alone.
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
