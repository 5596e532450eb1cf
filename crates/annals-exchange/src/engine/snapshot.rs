//! The engine's state as bytes, and back: what a snapshot holds so that recovery replays only
//! the journal after it.
//!
//! ```text
//! magic "ANXS", version u32
//! symbols: count u32, then tick u64, lot u64 each
//! accounts (ascending id): count u32, then account u64, orders u32 and, in the account's
//!   placement order, each order: id, client id, price, leaves (u64), symbol u32, side u8,
//!   post-only u8, self-trade mode u8
//! books: per symbol, bids then asks: levels u32, then best first: price u64, orders u32,
//!   order ids in time priority
//! done: finished orders u64, pages u32, then page key u64 and its words
//! ```
//!
//! Both orders that matter are kept: each level's queue (time priority) and each account's
//! list (the order of cancel-all reports), which differ once an amend has moved an order.

use std::collections::HashSet;

use super::*;
use crate::wire::{put_u32, put_u64, put_u8, side_code, stp_code, Reader};

const MAGIC: &[u8; 4] = b"ANXS";
const VERSION: u32 = 1;
/// The bytes of one order in the accounts section.
const ORDER_BYTES: usize = 8 * 4 + 4 + 3;

impl Engine {
    /// Appends the engine's state to `out` (see the module documentation for the layout).
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        put_u32(out, VERSION);
        put_u32(out, self.books.len() as u32);
        for book in &self.books {
            put_u64(out, book.spec.tick);
            put_u64(out, book.spec.lot);
        }
        let mut accounts: Vec<_> = self.accounts.iter().map(|(&a, &(f, _))| (a, f)).collect();
        accounts.sort_unstable();
        put_u32(out, accounts.len() as u32);
        for (account, first) in accounts {
            put_u64(out, account);
            let count_at = out.len();
            put_u32(out, 0);
            let mut count = 0u32;
            let mut at = first;
            while at != NIL {
                let node = &self.nodes[at as usize];
                put_u64(out, node.id);
                put_u64(out, node.client_id);
                put_u64(out, node.price);
                put_u64(out, node.leaves);
                put_u32(out, node.symbol);
                put_u8(out, side_code(node.side));
                put_u8(out, u8::from(node.post_only));
                put_u8(out, stp_code(node.stp));
                count += 1;
                at = node.account_next;
            }
            out[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        }
        for book in &self.books {
            for ladder in [&book.bids, &book.asks] {
                put_u32(out, ladder.ranks.len() as u32);
                for &(_, level) in ladder.ranks.iter().rev() {
                    let level = &self.levels[level as usize];
                    put_u64(out, level.price);
                    put_u32(out, level.count);
                    let mut at = level.head;
                    while at != NIL {
                        put_u64(out, self.nodes[at as usize].id);
                        at = self.nodes[at as usize].next;
                    }
                }
            }
        }
        put_u64(out, self.done.count);
        let pages = self.done.sorted_pages();
        put_u32(out, pages.len() as u32);
        for (page, words) in pages {
            put_u64(out, page);
            for &word in words {
                put_u64(out, word);
            }
        }
    }

    /// Rebuilds an engine from [`Engine::snapshot`]'s bytes, checking that they describe a
    /// consistent state (every live order in exactly one level of its own price and side).
    pub fn from_snapshot(bytes: &[u8]) -> Result<Engine, crate::DecodeError> {
        Self::restore(bytes).map_err(crate::DecodeError)
    }

    fn restore(bytes: &[u8]) -> Result<Engine, String> {
        let mut r = Reader::new(bytes);
        if bytes.get(..4) != Some(&MAGIC[..]) {
            return Err("not an engine snapshot (bad magic)".into());
        }
        r.u32()?;
        let version = r.u32()?;
        if version != VERSION {
            return Err(format!(
                "engine snapshot version {version} is not {VERSION}"
            ));
        }
        let symbols = r.count(16)?;
        let mut specs = Vec::with_capacity(symbols);
        for _ in 0..symbols {
            specs.push(SymbolSpec {
                tick: r.u64()?,
                lot: r.u64()?,
            });
        }
        let mut engine = Engine::new(&specs);
        let accounts = r.count(12)?;
        let mut previous_account = None;
        for _ in 0..accounts {
            let account = r.u64()?;
            if previous_account.is_some_and(|p| p >= account) {
                return Err("accounts out of order".into());
            }
            previous_account = Some(account);
            let orders = r.count(ORDER_BYTES)?;
            if orders == 0 {
                return Err(format!("account {account} is listed with no orders"));
            }
            for _ in 0..orders {
                let id = r.u64()?;
                let client_id = r.u64()?;
                let price = r.u64()?;
                let leaves = r.u64()?;
                let symbol = r.u32()?;
                let side = r.side()?;
                let post_only = match r.u8()? {
                    0 => false,
                    1 => true,
                    other => return Err(format!("bad post-only flag {other}")),
                };
                let stp = r.stp()?;
                let spec = specs
                    .get(symbol as usize)
                    .ok_or_else(|| format!("order {id} names unknown symbol {symbol}"))?;
                if !on_grid(price, spec.tick) || !on_grid(leaves, spec.lot) {
                    return Err(format!("order {id} is off its symbol's tick or lot"));
                }
                if engine.live.contains_key(&id)
                    || engine.clients.contains_key(&(account, client_id))
                {
                    return Err(format!("order {id} or its client id appears twice"));
                }
                engine.enlist(Node {
                    id,
                    client_id,
                    account,
                    price,
                    leaves,
                    symbol,
                    side,
                    post_only,
                    stp,
                    level: NIL,
                    prev: NIL,
                    next: NIL,
                    account_prev: NIL,
                    account_next: NIL,
                });
            }
        }
        let mut queued = HashSet::with_capacity(engine.live.len());
        for symbol in 0..symbols as u32 {
            for side in [Side::Buy, Side::Sell] {
                let levels = r.count(12)?;
                let mut previous_rank = None;
                for _ in 0..levels {
                    let price = r.u64()?;
                    let r_now = rank(side, price);
                    if previous_rank.is_some_and(|p| p <= r_now) {
                        return Err(format!("levels of symbol {symbol} out of order"));
                    }
                    previous_rank = Some(r_now);
                    let orders = r.count(8)?;
                    if orders == 0 {
                        return Err(format!("an empty level at {price} in symbol {symbol}"));
                    }
                    for _ in 0..orders {
                        let id = r.u64()?;
                        let at = *engine
                            .live
                            .get(&id)
                            .ok_or_else(|| format!("level {price} names unknown order {id}"))?;
                        let node = engine.nodes[at as usize];
                        if node.symbol != symbol || node.side != side || node.price != price {
                            return Err(format!("order {id} sits in a level not its own"));
                        }
                        if !queued.insert(id) {
                            return Err(format!("order {id} is queued twice"));
                        }
                        engine.attach(at);
                    }
                }
            }
        }
        if queued.len() != engine.live.len() {
            return Err(format!(
                "{} live orders but {} in the books",
                engine.live.len(),
                queued.len()
            ));
        }
        let done = r.u64()?;
        let pages = r.count(8 * (DONE_PAGE_WORDS + 1))?;
        let mut counted = 0u64;
        for _ in 0..pages {
            let page = r.u64()?;
            let mut words = Box::new([0u64; DONE_PAGE_WORDS]);
            for word in words.iter_mut() {
                *word = r.u64()?;
                let mut w = *word;
                while w != 0 {
                    let pair = w & 3;
                    if pair == 3 {
                        return Err("a finished order with an unknown ending".into());
                    }
                    counted += u64::from(pair != 0);
                    w >>= 2;
                }
            }
            if engine.done.pages.insert(page, words).is_some() {
                return Err(format!("done page {page} appears twice"));
            }
        }
        if counted != done {
            return Err(format!("{done} finished orders announced, {counted} found"));
        }
        engine.done.count = done;
        r.finish()?;
        Ok(engine)
    }
}
