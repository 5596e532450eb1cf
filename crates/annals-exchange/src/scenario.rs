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
    /// The most orders resting at once while the warm-up and the messages are applied in
    /// order: what an engine running the scenario should reserve room for.
    pub peak_live_orders: usize,
}

/// The scenarios `generate` knows.
pub const SCENARIOS: [&str; 4] = ["seed50k", "normal", "flash-crash", "many-symbols"];

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

/// A scenario name [`generate`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scenario {0:?}; known: {known}", known = SCENARIOS.join(", "))]
pub struct UnknownScenario(pub String);

/// Generates `name` with `messages` measured messages.
pub fn generate(name: &str, messages: usize, seed: u64) -> Result<Scenario, UnknownScenario> {
    match name {
        "seed50k" => Ok(seed50k(messages, seed)),
        "normal" => Ok(normal(messages, seed)),
        "flash-crash" => Ok(flash_crash(messages, seed)),
        "many-symbols" => Ok(many_symbols(messages, seed)),
        _ => Err(UnknownScenario(name.to_string())),
    }
}

/// The benchmark an earlier exchange engine (the seed engine) published its figures on, which
/// `annals-bench exchange --compare-seed` runs: limit orders on both sides of a mid price that
/// do not cross, so almost nothing trades and the book only grows.
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
            Command::Place(Place::limit(
                id,
                1 + rng.below(1000),
                0,
                side,
                price,
                1 + rng.below(100),
            ))
        })
        .collect();
    Scenario {
        name: "seed50k",
        symbols: vec![SymbolSpec { tick: 1, lot: 1 }],
        warmup: Vec::new(),
        // Nothing crosses: every order rests.
        peak_live_orders: messages,
        messages: out,
    }
}

/// What shapes a cancel-and-replace flow.
struct Flow {
    name: &'static str,
    symbols: u32,
    /// Popular symbols get most of the flow (a cube-root-like skew) instead of an even share.
    skewed: bool,
    /// Prices fall fast through the second fifth of the stream and climb back through the
    /// third, with aggressive selling, heavy cancels and thin books meanwhile.
    crash: bool,
    warmup: usize,
}

/// Cancel-and-replace heavy, like a market maker's flow: 9% new limit orders, 3% IOC
/// orders that cross, 6% cancels, 82% moves (amends to a new passive price). About 2-6% of
/// messages trade; the book holds a few thousand orders over hundreds of levels.
fn normal(messages: usize, seed: u64) -> Scenario {
    flow(
        messages,
        seed,
        &Flow {
            name: "normal",
            symbols: 1,
            skewed: false,
            crash: false,
            warmup: 4000,
        },
    )
}

/// `normal`'s mix through a crash: prices swing by half and back, IOC and market sells sweep
/// several levels, cancels triple, and new orders rest far from the mid, so books thin out.
fn flash_crash(messages: usize, seed: u64) -> Scenario {
    flow(
        messages,
        seed,
        &Flow {
            name: "flash-crash",
            symbols: 1,
            skewed: false,
            crash: true,
            warmup: 4000,
        },
    )
}

/// `normal`'s mix over 1,000 symbols of skewed popularity (the busiest symbol takes about a
/// tenth of the flow, most take a few hundredths of a percent).
fn many_symbols(messages: usize, seed: u64) -> Scenario {
    flow(
        messages,
        seed,
        &Flow {
            name: "many-symbols",
            symbols: 1000,
            skewed: true,
            crash: false,
            warmup: 20_000,
        },
    )
}

fn flow(messages: usize, seed: u64, flow: &Flow) -> Scenario {
    let mut rng = Rng::new(seed);
    let symbols = vec![SymbolSpec { tick: 1, lot: 1 }; flow.symbols as usize];
    let mut shadow = Engine::new(&symbols);
    shadow.reserve(flow.warmup * 2);
    let mut out = Vec::new();
    let mut live: Vec<OrderId> = Vec::with_capacity(flow.warmup * 2);
    let mut next_id = 1;
    let start_mid: u64 = 100_000;
    let mut mids = vec![start_mid; flow.symbols as usize];
    let accounts = 2000;
    let pick_symbol = |rng: &mut Rng| -> SymbolId {
        if flow.symbols == 1 {
            return 0;
        }
        if !flow.skewed {
            return rng.below(u64::from(flow.symbols)) as SymbolId;
        }
        // Three nested uniform draws: small ids are far more likely than large ones.
        let a = rng.below(u64::from(flow.symbols));
        let b = rng.below(a + 1);
        rng.below(b + 1) as SymbolId
    };
    let make = |rng: &mut Rng,
                symbol: SymbolId,
                mid: u64,
                spread: u64,
                live: &mut Vec<OrderId>,
                next_id: &mut u64| {
        let id = *next_id;
        *next_id += 1;
        let side = if rng.chance(50) {
            Side::Buy
        } else {
            Side::Sell
        };
        let offset = 1 + rng.below(spread);
        let price = match side {
            Side::Buy => mid - offset,
            Side::Sell => mid + offset,
        };
        live.push(id);
        Command::Place(Place::limit(
            id,
            1 + rng.below(accounts),
            symbol,
            side,
            price,
            1 + rng.below(50),
        ))
    };
    let mut warmup = Vec::new();
    for _ in 0..flow.warmup {
        let symbol = pick_symbol(&mut rng);
        let mid = mids[symbol as usize];
        let command = make(&mut rng, symbol, mid, 250, &mut live, &mut next_id);
        shadow.apply(0, &command, &mut out);
        out.clear();
        warmup.push(command);
    }
    let mut peak_live_orders = shadow.live_orders();
    let mut stream = Vec::with_capacity(messages);
    while stream.len() < messages {
        let phase = stream.len() * 5 / messages.max(1);
        let crashing = flow.crash && phase == 1;
        let rebounding = flow.crash && phase == 2;
        let symbol = pick_symbol(&mut rng);
        let mid = &mut mids[symbol as usize];
        // The mid price wanders a tick at a time, or falls and climbs back in a crash.
        if crashing {
            if rng.chance(40) && *mid > start_mid / 2 {
                *mid -= 1 + rng.below(3);
            }
        } else if rebounding {
            if rng.chance(40) && *mid < start_mid {
                *mid += 1 + rng.below(3);
            }
        } else if rng.chance(5) {
            *mid = if rng.chance(50) { *mid + 1 } else { *mid - 1 };
        }
        let mid = *mid;
        let (new_share, ioc_share, cancel_share, spread) = if crashing || rebounding {
            (6, 16, 24, 1000)
        } else {
            (9, 12, 18, 250)
        };
        let roll = rng.below(100);
        let command = if roll < new_share || live.is_empty() {
            make(&mut rng, symbol, mid, spread, &mut live, &mut next_id)
        } else if roll < ioc_share {
            let id = next_id;
            next_id += 1;
            // In a crash most aggressive orders sell, and some sell at any price.
            let buy = if crashing {
                rng.chance(15)
            } else if rebounding {
                rng.chance(85)
            } else {
                rng.chance(50)
            };
            let side = if buy { Side::Buy } else { Side::Sell };
            let reach = if crashing || rebounding { 40 } else { 3 };
            let price = match side {
                Side::Buy => mid + rng.below(reach),
                Side::Sell => mid - rng.below(reach),
            };
            let kind = if (crashing || rebounding) && rng.chance(25) {
                Kind::Market
            } else {
                Kind::Ioc
            };
            // Drawn in this order (account, then quantity) so that `normal` stays the stream
            // it has always been for a given seed.
            let account = 1 + rng.below(accounts);
            let qty = if crashing || rebounding {
                1 + rng.below(200)
            } else {
                1 + rng.below(30)
            };
            Command::Place(Place {
                kind,
                ..Place::limit(id, account, symbol, side, price, qty)
            })
        } else {
            let at = rng.below(live.len() as u64) as usize;
            let id = live[at];
            let Some(order) = shadow.order(id) else {
                live.swap_remove(at);
                continue;
            };
            if roll < cancel_share {
                live.swap_remove(at);
                Command::Cancel {
                    id,
                    account: order.account,
                }
            } else {
                let order_mid = mids[order.symbol as usize];
                let offset = 1 + rng.below(spread);
                let price = match order.side {
                    Side::Buy => order_mid - offset,
                    Side::Sell => order_mid + offset,
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
        peak_live_orders = peak_live_orders.max(shadow.live_orders());
        stream.push(command);
    }
    Scenario {
        name: flow.name,
        symbols,
        warmup,
        messages: stream,
        peak_live_orders,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a scenario's peak of resting orders is what an engine applying it in order holds
    /// at most.
    #[test]
    fn the_peak_of_resting_orders_is_what_an_engine_holds_at_most() {
        for name in SCENARIOS {
            let scenario = generate(name, 20_000, 7).unwrap();
            let mut engine = Engine::new(&scenario.symbols);
            let mut out = Vec::new();
            let mut peak = 0;
            for command in scenario.warmup.iter().chain(&scenario.messages) {
                engine.apply(0, command, &mut out);
                out.clear();
                peak = peak.max(engine.live_orders());
            }
            assert_eq!(scenario.peak_live_orders, peak, "{name}");
            assert!(peak > 0, "{name}");
        }
    }
}
