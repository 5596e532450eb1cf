//! Deterministic command streams for benchmarks and tests: the same name, size and seed give
//! the same commands on every machine.
//!
//! Each stream is generated against a shadow engine, so that cancels and amends name orders
//! that are live when they arrive (as a real client's would), and a warm-up fills the book
//! before the measured messages start.

use crate::engine::Engine;
use crate::types::*;

/// A stream: the symbols, a warm-up to apply first (not measured), the measured messages, and
/// each message's time.
pub struct Scenario {
    pub name: &'static str,
    pub symbols: Vec<SymbolSpec>,
    pub warmup: Vec<Command>,
    pub messages: Vec<Command>,
}

/// The scenarios `generate` knows.
pub const SCENARIOS: [&str; 2] = ["seed50k", "normal"];

/// xorshift64*: small, fast, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Generates `name` with `messages` measured messages.
pub fn generate(name: &str, messages: usize, seed: u64) -> Result<Scenario, String> {
    match name {
        "seed50k" => Ok(seed50k(messages, seed)),
        "normal" => Ok(normal(messages, seed)),
        _ => Err(format!(
            "unknown scenario {name:?}; known: {}",
            SCENARIOS.join(", ")
        )),
    }
}

fn limit(
    id: OrderId,
    account: AccountId,
    side: Side,
    kind: Kind,
    price: Price,
    qty: Qty,
) -> Command {
    Command::Place(Place {
        id,
        client_id: id,
        account,
        symbol: 0,
        side,
        kind,
        price,
        qty,
        stp: Stp::CancelNewest,
    })
}

/// The seed documents' benchmark: limit orders on both sides of a mid price that do not
/// cross, so almost nothing trades and the book only grows.
fn seed50k(messages: usize, seed: u64) -> Scenario {
    let mut rng = Rng::new(seed);
    let mid = 100_000;
    let out = (1..=messages as u64)
        .map(|id| {
            let side = if rng.chance(50) {
                Side::Buy
            } else {
                Side::Sell
            };
            let offset = 1 + rng.below(500);
            let price = match side {
                Side::Buy => mid - offset,
                Side::Sell => mid + offset,
            };
            limit(
                id,
                1 + rng.below(1000),
                side,
                Kind::Limit,
                price,
                1 + rng.below(100),
            )
        })
        .collect();
    Scenario {
        name: "seed50k",
        symbols: vec![SymbolSpec { tick: 1, lot: 1 }],
        warmup: Vec::new(),
        messages: out,
    }
}

/// Cancel-and-replace heavy, like a market maker's flow: 9% new limit orders, 3% IOC
/// orders that cross, 6% cancels, 82% moves (amends to a new passive price). About 2-6% of
/// messages trade; the book holds a few thousand orders over hundreds of levels.
fn normal(messages: usize, seed: u64) -> Scenario {
    let mut rng = Rng::new(seed);
    let symbols = vec![SymbolSpec { tick: 1, lot: 1 }];
    let mut shadow = Engine::new(&symbols);
    shadow.reserve(8192);
    let mut out = Vec::new();
    let mut live: Vec<OrderId> = Vec::with_capacity(8192);
    let mut next_id = 1;
    let mut mid: u64 = 100_000;
    let accounts = 2000;
    let make = |rng: &mut Rng, mid: u64, live: &mut Vec<OrderId>, next_id: &mut u64| {
        let id = *next_id;
        *next_id += 1;
        let side = if rng.chance(50) {
            Side::Buy
        } else {
            Side::Sell
        };
        let offset = 1 + rng.below(250);
        let price = match side {
            Side::Buy => mid - offset,
            Side::Sell => mid + offset,
        };
        live.push(id);
        limit(
            id,
            1 + rng.below(accounts),
            side,
            Kind::Limit,
            price,
            1 + rng.below(50),
        )
    };
    let mut warmup = Vec::new();
    for _ in 0..4000 {
        let command = make(&mut rng, mid, &mut live, &mut next_id);
        shadow.apply(0, &command, &mut out);
        out.clear();
        warmup.push(command);
    }
    let mut stream = Vec::with_capacity(messages);
    while stream.len() < messages {
        // The mid price wanders a tick at a time.
        if rng.chance(5) {
            mid = if rng.chance(50) { mid + 1 } else { mid - 1 };
        }
        let roll = rng.below(100);
        let command = if roll < 9 || live.is_empty() {
            make(&mut rng, mid, &mut live, &mut next_id)
        } else if roll < 12 {
            let id = next_id;
            next_id += 1;
            let side = if rng.chance(50) {
                Side::Buy
            } else {
                Side::Sell
            };
            let price = match side {
                Side::Buy => mid + rng.below(3),
                Side::Sell => mid - rng.below(3),
            };
            limit(
                id,
                1 + rng.below(accounts),
                side,
                Kind::Ioc,
                price,
                1 + rng.below(30),
            )
        } else {
            let at = rng.below(live.len() as u64) as usize;
            let id = live[at];
            let Some(order) = shadow.order(id) else {
                live.swap_remove(at);
                continue;
            };
            if roll < 18 {
                live.swap_remove(at);
                Command::Cancel {
                    id,
                    account: order.account,
                }
            } else {
                let offset = 1 + rng.below(250);
                let price = match order.side {
                    Side::Buy => mid - offset,
                    Side::Sell => mid + offset,
                };
                Command::Amend {
                    id,
                    account: order.account,
                    price,
                    qty: order.leaves,
                }
            }
        };
        shadow.apply(0, &command, &mut out);
        out.clear();
        stream.push(command);
    }
    Scenario {
        name: "normal",
        symbols,
        warmup,
        messages: stream,
    }
}
