//! The matching engine: price-time priority books for many symbols, no I/O.
//!
//! Orders live in one pool (a vector with a free list) and are linked twice: into their price
//! level's queue (time priority) and into their account's list (for cancel-all). Levels live in
//! a second pool; each side of a book is a vector of (rank, level) sorted so that the best level
//! is last: the top of the book is a `last()`, removing it a `pop()`, and new levels mostly land
//! near the end. A cancel finds its order through the id map and unlinks it in O(1); only a
//! level that empties is removed from its side's vector. After warm-up nothing is allocated per
//! order: pools, maps and the report buffer are reused.

use std::collections::HashMap;

use crate::types::*;

use crate::wire::stp_code;

mod snapshot;

type Map<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    id: OrderId,
    client_id: u64,
    account: AccountId,
    price: Price,
    leaves: Qty,
    symbol: SymbolId,
    side: Side,
    post_only: bool,
    stp: Stp,
    level: u32,
    prev: u32,
    next: u32,
    account_prev: u32,
    account_next: u32,
}

#[derive(Debug, Clone, Copy)]
struct Level {
    price: Price,
    total: Qty,
    count: u32,
    head: u32,
    tail: u32,
}

/// One side of a book: levels sorted by rank, best last.
#[derive(Debug, Clone, Default)]
struct Ladder {
    ranks: Vec<(u64, u32)>,
}

/// Higher is better on both sides: a bid's price, an ask's complement.
fn rank(side: Side, price: Price) -> u64 {
    match side {
        Side::Buy => price,
        Side::Sell => !price,
    }
}

/// A positive multiple of `step` (a price of whole ticks, a quantity of whole lots).
fn on_grid(value: u64, step: u64) -> bool {
    value != 0 && value.is_multiple_of(step.max(1))
}

/// Whether a resting price on the other side crosses a taker's limit.
fn crosses(taker: Side, limit: Price, resting: Price) -> bool {
    match taker {
        Side::Buy => resting <= limit,
        Side::Sell => resting >= limit,
    }
}

#[derive(Debug, Clone)]
struct Book {
    spec: SymbolSpec,
    bids: Ladder,
    asks: Ladder,
}

impl Book {
    fn ladder(&self, side: Side) -> &Ladder {
        match side {
            Side::Buy => &self.bids,
            Side::Sell => &self.asks,
        }
    }

    fn ladder_mut(&mut self, side: Side) -> &mut Ladder {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    Filled = 1,
    Cancelled = 2,
}

/// Ids per page of the done set: two bits each.
const DONE_PAGE_IDS: u64 = 512;
const DONE_PAGE_WORDS: usize = (DONE_PAGE_IDS as usize * 2) / 64;

/// How each finished order ended, for the reason a later cancel or amend naming it is refused.
/// Two bits per id in pages of 512 consecutive ids: ids handed out in sequence fill pages
/// densely, and the table of pages grows by one entry per 512 orders, so it never rehashes
/// a large table in the middle of a burst (a map of every done order did: a 13 ms stall).
#[derive(Debug, Clone, Default)]
struct DoneSet {
    pages: Map<u64, Box<[u64; DONE_PAGE_WORDS]>>,
    count: u64,
}

impl DoneSet {
    fn slot(id: OrderId) -> (u64, usize, u32) {
        let page = id / DONE_PAGE_IDS;
        let bit = (id % DONE_PAGE_IDS) * 2;
        (page, (bit / 64) as usize, (bit % 64) as u32)
    }

    fn get(&self, id: OrderId) -> Option<Done> {
        let (page, word, shift) = Self::slot(id);
        let bits = (self.pages.get(&page)?[word] >> shift) & 3;
        match bits {
            1 => Some(Done::Filled),
            2 => Some(Done::Cancelled),
            _ => None,
        }
    }

    fn insert(&mut self, id: OrderId, done: Done) {
        let (page, word, shift) = Self::slot(id);
        let words = self
            .pages
            .entry(page)
            .or_insert_with(|| Box::new([0; DONE_PAGE_WORDS]));
        if (words[word] >> shift) & 3 == 0 {
            self.count += 1;
        }
        words[word] = (words[word] & !(3 << shift)) | ((done as u64) << shift);
    }

    /// Pages in key order (for snapshots and hashes that must not depend on the table).
    fn sorted_pages(&self) -> Vec<(u64, &[u64; DONE_PAGE_WORDS])> {
        let mut pages: Vec<_> = self.pages.iter().map(|(&k, v)| (k, &**v)).collect();
        pages.sort_unstable_by_key(|&(k, _)| k);
        pages
    }
}

/// How a taker's pass through the book ended.
enum Taken {
    Open(Qty),
    Filled,
    Cancelled,
}

/// The matching engine for a set of symbols.
#[derive(Debug, Clone)]
pub struct Engine {
    books: Vec<Book>,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    levels: Vec<Level>,
    free_levels: Vec<u32>,
    live: Map<OrderId, u32>,
    clients: Map<(AccountId, u64), OrderId>,
    /// Each account's live orders: (first, last) of a list through the nodes.
    accounts: Map<AccountId, (u32, u32)>,
    done: DoneSet,
    /// See [`Engine::named_symbol`]; not part of the state.
    named_symbol: Option<SymbolId>,
}

impl Engine {
    /// An engine for `symbols` (symbol id = index).
    pub fn new(symbols: &[SymbolSpec]) -> Engine {
        Engine {
            books: symbols
                .iter()
                .map(|&spec| Book {
                    spec,
                    bids: Ladder::default(),
                    asks: Ladder::default(),
                })
                .collect(),
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            levels: Vec::new(),
            free_levels: Vec::new(),
            live: Map::default(),
            clients: Map::default(),
            accounts: Map::default(),
            done: DoneSet::default(),
            named_symbol: None,
        }
    }

    /// Reserves room for `orders` live orders at once, so that a book of that size allocates
    /// nothing more. Size it to the live orders expected, not to the messages: a larger table
    /// only spreads the same orders over more cache lines.
    pub fn reserve(&mut self, orders: usize) {
        self.nodes.reserve(orders);
        self.levels.reserve(orders.min(1 << 20));
        self.live.reserve(orders);
        self.clients.reserve(orders);
    }

    pub fn symbols(&self) -> usize {
        self.books.len()
    }

    /// The rules of every symbol, by symbol id.
    pub fn specs(&self) -> Vec<SymbolSpec> {
        self.books.iter().map(|b| b.spec).collect()
    }

    /// Adds a symbol with an empty book; returns its id.
    pub fn add_symbol(&mut self, spec: SymbolSpec) -> SymbolId {
        self.books.push(Book {
            spec,
            bids: Ladder::default(),
            asks: Ladder::default(),
        });
        (self.books.len() - 1) as SymbolId
    }

    /// How many orders have finished (filled or cancelled) since the beginning.
    pub fn done_orders(&self) -> u64 {
        self.done.count
    }

    /// Applies one command at `time`, appending what happened to `out`.
    pub fn apply(&mut self, time: u64, command: &Command, out: &mut Vec<Report>) {
        self.named_symbol = None;
        match *command {
            Command::Place(ref place) => self.place(time, place, out),
            Command::Cancel { id, account } => self.cancel(id, account, out),
            Command::Amend {
                id,
                account,
                price,
                qty,
            } => self.amend(time, id, account, price, qty, out),
            Command::CancelAll { account, symbol } => self.cancel_all(account, symbol, out),
        }
    }

    fn place(&mut self, time: u64, p: &Place, out: &mut Vec<Report>) {
        let reject = |out: &mut Vec<Report>, reason| {
            out.push(Report::Rejected { id: p.id, reason });
        };
        let Some(book) = self.books.get(p.symbol as usize) else {
            return reject(out, Reject::UnknownSymbol);
        };
        let spec = book.spec;
        if self.live.contains_key(&p.id) || self.done.get(p.id).is_some() {
            return reject(out, Reject::DuplicateOrderId);
        }
        if self.clients.contains_key(&(p.account, p.client_id)) {
            return reject(out, Reject::DuplicateClientOrderId);
        }
        if !on_grid(p.qty, spec.lot) {
            return reject(out, Reject::InvalidQuantity);
        }
        if p.kind != Kind::Market && !on_grid(p.price, spec.tick) {
            return reject(out, Reject::InvalidPrice);
        }
        let limit = match (p.kind, p.side) {
            (Kind::Market, Side::Buy) => Price::MAX,
            (Kind::Market, Side::Sell) => 0,
            _ => p.price,
        };
        if p.kind == Kind::PostOnly && self.would_take(p.symbol, p.side, limit) {
            return reject(out, Reject::WouldTake);
        }
        if p.kind == Kind::Fok && !self.fillable(p, limit) {
            return reject(out, Reject::NotFillable);
        }
        out.push(Report::Accepted { id: p.id });
        let taken = self.take(
            time, p.symbol, p.id, p.account, p.side, limit, p.qty, p.stp, out,
        );
        match taken {
            Taken::Filled => {
                self.done.insert(p.id, Done::Filled);
            }
            Taken::Cancelled => {
                self.done.insert(p.id, Done::Cancelled);
            }
            Taken::Open(leaves) => match p.kind {
                Kind::Limit | Kind::PostOnly => self.rest(Node {
                    id: p.id,
                    client_id: p.client_id,
                    account: p.account,
                    price: p.price,
                    leaves,
                    symbol: p.symbol,
                    side: p.side,
                    post_only: p.kind == Kind::PostOnly,
                    stp: p.stp,
                    level: NIL,
                    prev: NIL,
                    next: NIL,
                    account_prev: NIL,
                    account_next: NIL,
                }),
                Kind::Market | Kind::Ioc | Kind::Fok => {
                    out.push(Report::Cancelled {
                        id: p.id,
                        qty: leaves,
                        leaves: 0,
                        reason: CancelReason::Unfilled,
                    });
                    self.done.insert(p.id, Done::Cancelled);
                }
            },
        }
    }

    /// Whether an order on `side` with `limit` would meet a resting order.
    fn would_take(&self, symbol: SymbolId, side: Side, limit: Price) -> bool {
        let book = &self.books[symbol as usize];
        match book.ladder(side.opposite()).ranks.last() {
            Some(&(_, level)) => crosses(side, limit, self.levels[level as usize].price),
            None => false,
        }
    }

    /// Whether a fill-or-kill order can fill whole: the crossing quantity, in priority order,
    /// reaches its quantity before any own order that self-trade prevention would stop at.
    fn fillable(&self, p: &Place, limit: Price) -> bool {
        let book = &self.books[p.symbol as usize];
        let mut need = p.qty;
        for &(_, level) in book.ladder(p.side.opposite()).ranks.iter().rev() {
            let level = &self.levels[level as usize];
            if !crosses(p.side, limit, level.price) {
                return false;
            }
            let mut at = level.head;
            while at != NIL {
                let node = &self.nodes[at as usize];
                if node.account == p.account && p.stp != Stp::Allow {
                    if p.stp != Stp::CancelOldest {
                        return false;
                    }
                } else if node.leaves >= need {
                    return true;
                } else {
                    need -= node.leaves;
                }
                at = node.next;
            }
        }
        false
    }

    /// Matches a taker against the other side of its book, as far as its limit allows.
    #[allow(clippy::too_many_arguments)]
    fn take(
        &mut self,
        time: u64,
        symbol: SymbolId,
        id: OrderId,
        account: AccountId,
        side: Side,
        limit: Price,
        qty: Qty,
        stp: Stp,
        out: &mut Vec<Report>,
    ) -> Taken {
        let mut remaining = qty;
        let other = side.opposite();
        while remaining > 0 {
            let Some(&(_, level_at)) = self.books[symbol as usize].ladder(other).ranks.last()
            else {
                break;
            };
            let level_price = self.levels[level_at as usize].price;
            if !crosses(side, limit, level_price) {
                break;
            }
            let mut at = self.levels[level_at as usize].head;
            while at != NIL && remaining > 0 {
                let maker = self.nodes[at as usize];
                let next = maker.next;
                if maker.account == account && stp != Stp::Allow {
                    match stp {
                        Stp::CancelOldest => self.cancel_resting(at, CancelReason::SelfTrade, out),
                        Stp::CancelNewest | Stp::CancelBoth => {
                            if stp == Stp::CancelBoth {
                                self.cancel_resting(at, CancelReason::SelfTrade, out);
                            }
                            out.push(Report::Cancelled {
                                id,
                                qty: remaining,
                                leaves: 0,
                                reason: CancelReason::SelfTrade,
                            });
                            return Taken::Cancelled;
                        }
                        Stp::Decrement => {
                            let cut = maker.leaves.min(remaining);
                            remaining -= cut;
                            if cut == maker.leaves {
                                self.cancel_resting(at, CancelReason::SelfTrade, out);
                            } else {
                                self.nodes[at as usize].leaves -= cut;
                                self.levels[level_at as usize].total -= cut;
                                out.push(Report::Cancelled {
                                    id: maker.id,
                                    qty: cut,
                                    leaves: maker.leaves - cut,
                                    reason: CancelReason::SelfTrade,
                                });
                            }
                            out.push(Report::Cancelled {
                                id,
                                qty: cut,
                                leaves: remaining,
                                reason: CancelReason::SelfTrade,
                            });
                            if remaining == 0 {
                                return Taken::Cancelled;
                            }
                        }
                        Stp::Allow => unreachable!(),
                    }
                } else {
                    let traded = maker.leaves.min(remaining);
                    remaining -= traded;
                    let maker_leaves = maker.leaves - traded;
                    out.push(Report::Trade {
                        symbol,
                        price: level_price,
                        qty: traded,
                        maker: maker.id,
                        taker: id,
                        taker_side: side,
                        time,
                    });
                    out.push(Report::Fill {
                        id: maker.id,
                        account: maker.account,
                        price: level_price,
                        qty: traded,
                        leaves: maker_leaves,
                        role: Role::Maker,
                    });
                    out.push(Report::Fill {
                        id,
                        account,
                        price: level_price,
                        qty: traded,
                        leaves: remaining,
                        role: Role::Taker,
                    });
                    self.levels[level_at as usize].total -= traded;
                    self.nodes[at as usize].leaves = maker_leaves;
                    if maker_leaves == 0 {
                        self.unlink(at);
                        self.done.insert(maker.id, Done::Filled);
                    }
                }
                at = next;
            }
        }
        if remaining == 0 {
            Taken::Filled
        } else {
            Taken::Open(remaining)
        }
    }

    /// Cancels a resting order whole, reporting it.
    fn cancel_resting(&mut self, at: u32, reason: CancelReason, out: &mut Vec<Report>) {
        let node = self.nodes[at as usize];
        out.push(Report::Cancelled {
            id: node.id,
            qty: node.leaves,
            leaves: 0,
            reason,
        });
        self.unlink(at);
        self.done.insert(node.id, Done::Cancelled);
    }

    /// A new resting order: a node, the back of its price level, its account's list, the maps.
    fn rest(&mut self, node: Node) {
        let at = self.enlist(node);
        self.attach(at);
    }

    /// A new order's node, at the end of its account's list and in the maps (not yet in a
    /// level).
    fn enlist(&mut self, mut node: Node) -> u32 {
        let account = self.accounts.entry(node.account).or_insert((NIL, NIL));
        node.account_prev = account.1;
        node.account_next = NIL;
        let at = match self.free_nodes.pop() {
            Some(at) => {
                self.nodes[at as usize] = node;
                at
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if account.1 == NIL {
            account.0 = at;
        } else {
            self.nodes[account.1 as usize].account_next = at;
        }
        account.1 = at;
        self.live.insert(node.id, at);
        self.clients.insert((node.account, node.client_id), node.id);
        at
    }

    /// Puts a node at the back of the level of its price (creating the level if needed).
    fn attach(&mut self, at: u32) {
        let node = self.nodes[at as usize];
        let ladder = self.books[node.symbol as usize].ladder_mut(node.side);
        let r = rank(node.side, node.price);
        let level_at = match ladder.ranks.binary_search_by_key(&r, |&(rank, _)| rank) {
            Ok(i) => ladder.ranks[i].1,
            Err(i) => {
                let level = Level {
                    price: node.price,
                    total: 0,
                    count: 0,
                    head: NIL,
                    tail: NIL,
                };
                let level_at = match self.free_levels.pop() {
                    Some(level_at) => {
                        self.levels[level_at as usize] = level;
                        level_at
                    }
                    None => {
                        self.levels.push(level);
                        (self.levels.len() - 1) as u32
                    }
                };
                ladder.ranks.insert(i, (r, level_at));
                level_at
            }
        };
        let level = &mut self.levels[level_at as usize];
        let tail = level.tail;
        if tail == NIL {
            level.head = at;
        } else {
            self.nodes[tail as usize].next = at;
        }
        level.tail = at;
        level.count += 1;
        level.total += node.leaves;
        let node = &mut self.nodes[at as usize];
        node.level = level_at;
        node.prev = tail;
        node.next = NIL;
    }

    /// Takes a node out of its level's queue (removing the level if it empties); the order
    /// stays known (maps, account list).
    fn detach(&mut self, at: u32) {
        let node = self.nodes[at as usize];
        let level_at = node.level;
        let level = &mut self.levels[level_at as usize];
        level.total -= node.leaves;
        level.count -= 1;
        if node.prev == NIL {
            level.head = node.next;
        } else {
            self.nodes[node.prev as usize].next = node.next;
        }
        if node.next == NIL {
            self.levels[level_at as usize].tail = node.prev;
        } else {
            self.nodes[node.next as usize].prev = node.prev;
        }
        if self.levels[level_at as usize].count == 0 {
            let ladder = self.books[node.symbol as usize].ladder_mut(node.side);
            let r = rank(node.side, node.price);
            if ladder.ranks.last().map(|&(rank, _)| rank) == Some(r) {
                ladder.ranks.pop();
            } else if let Ok(i) = ladder.ranks.binary_search_by_key(&r, |&(rank, _)| rank) {
                ladder.ranks.remove(i);
            }
            self.free_levels.push(level_at);
        }
    }

    /// Forgets a detached order: out of its account's list and the maps, its node freed.
    fn forget(&mut self, at: u32) {
        let node = self.nodes[at as usize];
        let mut emptied = false;
        if let Some(account) = self.accounts.get_mut(&node.account) {
            if node.account_prev == NIL {
                account.0 = node.account_next;
            } else {
                self.nodes[node.account_prev as usize].account_next = node.account_next;
            }
            if node.account_next == NIL {
                account.1 = node.account_prev;
            } else {
                self.nodes[node.account_next as usize].account_prev = node.account_prev;
            }
            emptied = account.0 == NIL;
        }
        if emptied {
            self.accounts.remove(&node.account);
        }
        self.live.remove(&node.id);
        self.clients.remove(&(node.account, node.client_id));
        self.free_nodes.push(at);
    }

    /// Takes a resting order out of the book for good.
    fn unlink(&mut self, at: u32) {
        self.detach(at);
        self.forget(at);
    }

    /// Why a command naming `id` cannot touch it, when it is not live.
    fn not_live(&self, id: OrderId) -> Reject {
        match self.done.get(id) {
            Some(Done::Filled) => Reject::AlreadyFilled,
            Some(Done::Cancelled) => Reject::AlreadyCancelled,
            None => Reject::UnknownOrder,
        }
    }

    fn cancel(&mut self, id: OrderId, account: AccountId, out: &mut Vec<Report>) {
        let Some(&at) = self.live.get(&id) else {
            let reason = self.not_live(id);
            return out.push(Report::Rejected { id, reason });
        };
        self.named_symbol = Some(self.nodes[at as usize].symbol);
        if self.nodes[at as usize].account != account {
            return out.push(Report::Rejected {
                id,
                reason: Reject::NotOwner,
            });
        }
        self.cancel_resting(at, CancelReason::Requested, out);
    }

    fn amend(
        &mut self,
        time: u64,
        id: OrderId,
        account: AccountId,
        price: Price,
        qty: Qty,
        out: &mut Vec<Report>,
    ) {
        let reject = |out: &mut Vec<Report>, reason| out.push(Report::Rejected { id, reason });
        let Some(&at) = self.live.get(&id) else {
            let reason = self.not_live(id);
            return reject(out, reason);
        };
        self.named_symbol = Some(self.nodes[at as usize].symbol);
        let node = self.nodes[at as usize];
        if node.account != account {
            return reject(out, Reject::NotOwner);
        }
        let spec = self.books[node.symbol as usize].spec;
        if !on_grid(qty, spec.lot) {
            return reject(out, Reject::InvalidQuantity);
        }
        if !on_grid(price, spec.tick) {
            return reject(out, Reject::InvalidPrice);
        }
        if price == node.price && qty <= node.leaves {
            // A decrease in place keeps the order's priority.
            self.nodes[at as usize].leaves = qty;
            self.levels[node.level as usize].total -= node.leaves - qty;
            return out.push(Report::Amended { id, price, qty });
        }
        if node.post_only && self.would_take(node.symbol, node.side, price) {
            return reject(out, Reject::WouldTake);
        }
        out.push(Report::Amended { id, price, qty });
        // Out of the queue, then in again as a taker at the new price: it may trade, and what
        // is left goes to the back of its level. The order keeps its node, its place in its
        // account's list and its map entries.
        self.detach(at);
        let taken = self.take(
            time,
            node.symbol,
            id,
            node.account,
            node.side,
            price,
            qty,
            node.stp,
            out,
        );
        match taken {
            Taken::Filled => {
                self.forget(at);
                self.done.insert(id, Done::Filled);
            }
            Taken::Cancelled => {
                self.forget(at);
                self.done.insert(id, Done::Cancelled);
            }
            Taken::Open(leaves) => {
                let node = &mut self.nodes[at as usize];
                node.price = price;
                node.leaves = leaves;
                self.attach(at);
            }
        }
    }

    fn cancel_all(&mut self, account: AccountId, symbol: Option<SymbolId>, out: &mut Vec<Report>) {
        let mut at = match self.accounts.get(&account) {
            Some(&(first, _)) => first,
            None => return,
        };
        while at != NIL {
            let node = self.nodes[at as usize];
            match symbol {
                Some(s) if s != node.symbol => {}
                _ => self.cancel_resting(at, CancelReason::Requested, out),
            }
            at = node.account_next;
        }
    }

    /// A live order.
    pub fn order(&self, id: OrderId) -> Option<OrderView> {
        let node = &self.nodes[*self.live.get(&id)? as usize];
        Some(OrderView {
            id: node.id,
            client_id: node.client_id,
            account: node.account,
            symbol: node.symbol,
            side: node.side,
            price: node.price,
            leaves: node.leaves,
        })
    }

    /// Where an order stands: live (with what is left), filled, cancelled (or rejected after
    /// its id was seen), or never seen.
    pub fn status(&self, id: OrderId) -> OrderStatus {
        if let Some(view) = self.order(id) {
            return OrderStatus::Live(view);
        }
        match self.done.get(id) {
            Some(Done::Filled) => OrderStatus::Filled,
            Some(Done::Cancelled) => OrderStatus::Cancelled,
            None => OrderStatus::Unknown,
        }
    }

    /// The symbol of the live order the last cancel or amend named (None for other commands,
    /// and for one that named no live order): what the command was about, without a second
    /// lookup of an order it may have removed.
    pub fn named_symbol(&self) -> Option<SymbolId> {
        self.named_symbol
    }

    /// The number of live orders.
    pub fn live_orders(&self) -> usize {
        self.live.len()
    }

    pub fn bbo(&self, symbol: SymbolId) -> Bbo {
        let Some(book) = self.books.get(symbol as usize) else {
            return Bbo::default();
        };
        let top = |ladder: &Ladder| {
            ladder.ranks.last().map(|&(_, at)| {
                let level = &self.levels[at as usize];
                (level.price, level.total)
            })
        };
        Bbo {
            bid: top(&book.bids),
            ask: top(&book.asks),
        }
    }

    /// Up to `levels` price levels of one side, best first: (price, total quantity, orders).
    pub fn depth(&self, symbol: SymbolId, side: Side, levels: usize) -> Vec<(Price, Qty, u32)> {
        let Some(book) = self.books.get(symbol as usize) else {
            return Vec::new();
        };
        book.ladder(side)
            .ranks
            .iter()
            .rev()
            .take(levels)
            .map(|&(_, at)| {
                let level = &self.levels[at as usize];
                (level.price, level.total, level.count)
            })
            .collect()
    }

    /// The orders of one side of a book in priority order: (id, account, price, leaves).
    pub fn queue(&self, symbol: SymbolId, side: Side) -> Vec<(OrderId, AccountId, Price, Qty)> {
        let mut out = Vec::new();
        if let Some(book) = self.books.get(symbol as usize) {
            for &(_, level) in book.ladder(side).ranks.iter().rev() {
                let mut at = self.levels[level as usize].head;
                while at != NIL {
                    let node = &self.nodes[at as usize];
                    out.push((node.id, node.account, node.price, node.leaves));
                    at = node.next;
                }
            }
        }
        out
    }

    /// A hash of everything that decides what the engine does next: every book (each order's
    /// id, account, client id, price and quantity, in priority order), each account's orders in
    /// placement order (cancel-all reports follow it) and how every finished order ended. Two
    /// engines that applied the same commands have the same hash.
    pub fn state_hash(&self) -> u64 {
        let mut hash = Fnv::default();
        let mut accounts: Vec<_> = self
            .accounts
            .iter()
            .map(|(&a, &(first, _))| (a, first))
            .collect();
        accounts.sort_unstable();
        for (account, first) in accounts {
            hash.word(account);
            let mut at = first;
            while at != NIL {
                let node = &self.nodes[at as usize];
                hash.word(node.id);
                hash.word(u64::from(node.post_only) | (stp_code(node.stp) as u64) << 8);
                at = node.account_next;
            }
        }
        hash.word(self.done.count);
        for (page, words) in self.done.sorted_pages() {
            hash.word(page);
            for &word in words {
                hash.word(word);
            }
        }
        for (symbol, book) in self.books.iter().enumerate() {
            hash.word(symbol as u64);
            for ladder in [&book.bids, &book.asks] {
                hash.word(ladder.ranks.len() as u64);
                for &(_, level) in ladder.ranks.iter().rev() {
                    let level = &self.levels[level as usize];
                    hash.word(level.price);
                    hash.word(level.total);
                    let mut at = level.head;
                    while at != NIL {
                        let node = &self.nodes[at as usize];
                        hash.word(node.id);
                        hash.word(node.account);
                        hash.word(node.client_id);
                        hash.word(node.leaves);
                        at = node.next;
                    }
                }
            }
        }
        hash.0
    }
}

/// FNV-1a over 64-bit words: stable across runs and machines.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn word(&mut self, word: u64) {
        for byte in word.to_le_bytes() {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
