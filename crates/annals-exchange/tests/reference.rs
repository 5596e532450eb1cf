//! The engine against the naive reference matcher on random command streams.
mod common;

use annals_exchange::*;
use common::Reference;
use proptest::prelude::*;

const SPECS: [SymbolSpec; 2] = [
    SymbolSpec { tick: 1, lot: 1 },
    SymbolSpec { tick: 5, lot: 10 },
];

/// One generated command, mapped onto small domains so that orders meet, collide on client
/// ids, self-trade, and name filled, cancelled and unknown orders.
#[derive(Debug, Clone)]
struct Spec {
    op: u8,
    side: bool,
    kind: u8,
    price: u64,
    qty: u64,
    account: u64,
    target: u64,
    stp: u8,
    symbol: u32,
    client: u64,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0u8..20,
        any::<bool>(),
        0u8..10,
        0u64..24,
        0u64..12,
        0u64..4,
        0u64..80,
        0u8..5,
        0u32..3,
        0u64..10,
    )
        .prop_map(
            |(op, side, kind, price, qty, account, target, stp, symbol, client)| Spec {
                op,
                side,
                kind,
                price,
                qty,
                account,
                target,
                stp,
                symbol,
                client,
            },
        )
}

fn command(s: &Spec, next_id: &mut u64, reference: &Reference) -> Command {
    // Half the cancels and amends name a live order, with its own account most of the time;
    // relative amends keep or move the price by a tick and change the quantity by a lot.
    let live = reference.live();
    if (10..=18).contains(&s.op) && s.target.is_multiple_of(2) && !live.is_empty() {
        let order = live[(s.target / 2) as usize % live.len()];
        let (id, price, leaves) = (order.id, order.price, order.leaves);
        let account = if s.account == 3 {
            (order.account + 1) % 4
        } else {
            order.account
        };
        if s.op <= 13 {
            return Command::Cancel { id, account };
        }
        let symbol_spec = SPECS[order.symbol as usize];
        let price = match s.kind % 3 {
            0 => price,
            1 => price + symbol_spec.tick * (1 + s.price % 3),
            _ => price.saturating_sub(symbol_spec.tick * (1 + s.price % 3)),
        };
        let qty = match s.qty % 3 {
            0 => leaves.saturating_sub(symbol_spec.lot).max(symbol_spec.lot),
            1 => leaves + symbol_spec.lot,
            _ => leaves,
        };
        return Command::Amend {
            id,
            account,
            price,
            qty,
        };
    }
    // Symbol 2 does not exist; keep it rare.
    let symbol = if s.symbol == 2 && !s.op.is_multiple_of(7) {
        0
    } else {
        s.symbol
    };
    let spec = SPECS.get(symbol as usize).copied().unwrap_or(SPECS[0]);
    let stp = [
        Stp::Allow,
        Stp::CancelNewest,
        Stp::CancelOldest,
        Stp::CancelBoth,
        Stp::Decrement,
    ][s.stp as usize];
    // Mostly valid prices around 100 ticks; sometimes off-tick or zero.
    let price = if s.price == 23 {
        0
    } else if s.price == 22 {
        spec.tick * 100 + spec.tick / 2 + 1
    } else {
        spec.tick * (90 + s.price)
    };
    let qty = if s.qty == 11 {
        spec.lot / 2 + 1
    } else {
        spec.lot * (1 + s.qty)
    };
    match s.op {
        0..=9 => {
            let id = if s.op == 9 { s.target } else { *next_id };
            *next_id += 1;
            let kind = match s.kind {
                0..=4 => Kind::Limit,
                5 => Kind::Market,
                6 => Kind::Ioc,
                7 => Kind::Fok,
                _ => Kind::PostOnly,
            };
            Command::Place(Place {
                id,
                client_id: s.client,
                account: s.account,
                symbol,
                side: if s.side { Side::Buy } else { Side::Sell },
                kind,
                price,
                qty,
                stp,
            })
        }
        10..=13 => Command::Cancel {
            id: s.target,
            account: s.account,
        },
        14..=18 => Command::Amend {
            id: s.target,
            account: s.account,
            price,
            qty,
        },
        _ => Command::CancelAll {
            account: s.account,
            symbol: if s.side { Some(symbol) } else { None },
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Goal: on random command streams the engine's reports, books, best prices and order
    /// views equal the reference's after every message.
    #[test]
    fn engine_matches_reference(specs in prop::collection::vec(spec(), 1..300)) {
        let mut engine = Engine::new(&SPECS);
        let mut reference = Reference::new(&SPECS);
        let mut next_id = 1;
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (time, s) in specs.iter().enumerate() {
            let command = command(s, &mut next_id, &reference);
            got.clear();
            want.clear();
            engine.apply(time as u64, &command, &mut got);
            reference.apply(time as u64, &command, &mut want);
            prop_assert_eq!(&got, &want, "command {} {:?}", time, command);
            for symbol in 0..2 {
                for side in [Side::Buy, Side::Sell] {
                    prop_assert_eq!(
                        engine.queue(symbol, side),
                        reference.queue(symbol, side),
                        "book {} {:?} after {:?}", symbol, side, command
                    );
                }
                let bbo = engine.bbo(symbol);
                let top = |side| {
                    let queue = reference.queue(symbol, side);
                    queue.first().map(|&(_, _, price, _)| {
                        (price, queue.iter().filter(|o| o.2 == price).map(|o| o.3).sum::<u64>())
                    })
                };
                prop_assert_eq!(bbo.bid, top(Side::Buy));
                prop_assert_eq!(bbo.ask, top(Side::Sell));
            }
            for order in reference.live() {
                prop_assert_eq!(engine.order(order.id), Some(order));
            }
            prop_assert_eq!(engine.live_orders(), reference.live().len());
        }
    }
}

/// Goal: the generator reaches what the comparison is meant to check (trades, every kind of
/// refusal, self-trade cancels and decrements, amends, unfilled remainders); otherwise the
/// property above would pass vacuously.
#[test]
fn generator_covers_the_rules() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use std::collections::HashSet;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let mut reference = Reference::new(&SPECS);
    let mut next_id = 1;
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    for time in 0..5000 {
        let s = spec().new_tree(&mut runner).unwrap().current();
        let command = command(&s, &mut next_id, &reference);
        out.clear();
        reference.apply(time, &command, &mut out);
        for report in &out {
            let name = match report {
                Report::Rejected { reason, .. } => format!("rejected {reason:?}"),
                Report::Cancelled { reason, leaves, .. } => {
                    format!(
                        "cancelled {reason:?} {}",
                        if *leaves > 0 { "part" } else { "whole" }
                    )
                }
                Report::Fill { leaves, role, .. } => {
                    format!(
                        "fill {role:?} {}",
                        if *leaves > 0 { "part" } else { "whole" }
                    )
                }
                other => format!("{other:?}").split(' ').next().unwrap().to_owned(),
            };
            seen.insert(name);
        }
    }
    for wanted in [
        "Accepted",
        "Trade",
        "Amended",
        "fill Maker part",
        "fill Maker whole",
        "fill Taker part",
        "fill Taker whole",
        "cancelled Requested whole",
        "cancelled SelfTrade whole",
        "cancelled SelfTrade part",
        "cancelled Unfilled whole",
        "rejected UnknownSymbol",
        "rejected InvalidPrice",
        "rejected InvalidQuantity",
        "rejected DuplicateOrderId",
        "rejected DuplicateClientOrderId",
        "rejected WouldTake",
        "rejected NotFillable",
        "rejected UnknownOrder",
        "rejected AlreadyFilled",
        "rejected AlreadyCancelled",
        "rejected NotOwner",
    ] {
        assert!(seen.contains(wanted), "never seen: {wanted}; seen {seen:?}");
    }
}
