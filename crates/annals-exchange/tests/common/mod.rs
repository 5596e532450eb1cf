//! A naive reference matcher, written from the matching rules in docs/EXCHANGE.md (M1-M12) and
//! to be obviously correct rather than fast: live orders in one vector, every match a sort of
//! the crossing orders by price then arrival, self-trade prevention as the rules' table, fill or
//! kill as a dry run of the match. The engine must produce exactly its reports and books.
#![allow(dead_code)]

use std::collections::HashMap;

use annals_exchange::*;

#[derive(Debug, Clone)]
struct Resting {
    id: OrderId,
    client_id: u64,
    account: AccountId,
    symbol: SymbolId,
    side: Side,
    price: Price,
    leaves: Qty,
    post_only: bool,
    stp: Stp,
    /// Arrival in the queue: lower goes first at a price.
    seq: u64,
    /// When the order was placed: cancel-all goes in this order.
    placed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    Filled,
    Cancelled,
}

pub struct Reference {
    specs: Vec<SymbolSpec>,
    live: Vec<Resting>,
    done: HashMap<OrderId, Done>,
    seq: u64,
}

fn better(side: Side, a: Price, b: Price) -> bool {
    match side {
        Side::Buy => a > b,
        Side::Sell => a < b,
    }
}

fn crosses(taker: Side, limit: Price, resting: Price) -> bool {
    match taker {
        Side::Buy => resting <= limit,
        Side::Sell => resting >= limit,
    }
}

/// What a self-trade does (M9's table): quantity cancelled from the resting order and from the
/// taker, and whether the taker stops matching (it is then cancelled).
struct SelfTrade {
    resting_cut: Qty,
    taker_cut: Qty,
    taker_stops: bool,
}

fn self_trade(mode: Stp, resting: Qty, taker: Qty) -> SelfTrade {
    let (resting_cut, taker_cut) = match mode {
        Stp::Allow => unreachable!("Allow trades"),
        Stp::CancelNewest => (0, taker),
        Stp::CancelOldest => (resting, 0),
        Stp::CancelBoth => (resting, taker),
        Stp::Decrement => (resting.min(taker), resting.min(taker)),
    };
    SelfTrade {
        resting_cut,
        taker_cut,
        taker_stops: taker_cut == taker,
    }
}

impl Reference {
    pub fn new(specs: &[SymbolSpec]) -> Self {
        Reference {
            specs: specs.to_vec(),
            live: Vec::new(),
            done: HashMap::new(),
            seq: 0,
        }
    }

    /// The resting orders of one side in priority order: (id, account, price, leaves).
    pub fn queue(&self, symbol: SymbolId, side: Side) -> Vec<(OrderId, AccountId, Price, Qty)> {
        let mut orders: Vec<&Resting> = self
            .live
            .iter()
            .filter(|o| o.symbol == symbol && o.side == side)
            .collect();
        orders.sort_by(|a, b| {
            if a.price == b.price {
                a.seq.cmp(&b.seq)
            } else if better(side, a.price, b.price) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        });
        orders
            .iter()
            .map(|o| (o.id, o.account, o.price, o.leaves))
            .collect()
    }

    /// Every live order in arrival order.
    pub fn live(&self) -> Vec<OrderView> {
        let mut orders: Vec<&Resting> = self.live.iter().collect();
        orders.sort_by_key(|o| o.seq);
        orders
            .iter()
            .map(|o| OrderView {
                id: o.id,
                client_id: o.client_id,
                account: o.account,
                symbol: o.symbol,
                side: o.side,
                price: o.price,
                leaves: o.leaves,
            })
            .collect()
    }

    fn index(&self, id: OrderId) -> Option<usize> {
        self.live.iter().position(|o| o.id == id)
    }

    fn not_live(&self, id: OrderId) -> Reject {
        match self.done.get(&id) {
            Some(Done::Filled) => Reject::AlreadyFilled,
            Some(Done::Cancelled) => Reject::AlreadyCancelled,
            None => Reject::UnknownOrder,
        }
    }

    pub fn apply(&mut self, time: u64, command: &Command, out: &mut Vec<Report>) {
        match *command {
            Command::Place(p) => self.place(time, p, out),
            Command::Cancel { id, account } => match self.index(id) {
                None => out.push(Report::Rejected {
                    id,
                    reason: self.not_live(id),
                }),
                Some(i) if self.live[i].account != account => out.push(Report::Rejected {
                    id,
                    reason: Reject::NotOwner,
                }),
                Some(i) => self.cancel_whole(i, CancelReason::Requested, out),
            },
            Command::Amend {
                id,
                account,
                price,
                qty,
            } => self.amend(time, id, account, price, qty, out),
            Command::CancelAll { account, symbol } => {
                let mut mine: Vec<(u64, OrderId)> = self
                    .live
                    .iter()
                    .filter(|o| o.account == account && symbol.is_none_or(|s| s == o.symbol))
                    .map(|o| (o.placed, o.id))
                    .collect();
                mine.sort();
                for (_, id) in mine {
                    let i = self.index(id).unwrap();
                    self.cancel_whole(i, CancelReason::Requested, out);
                }
            }
        }
    }

    fn cancel_whole(&mut self, i: usize, reason: CancelReason, out: &mut Vec<Report>) {
        let o = self.live.remove(i);
        out.push(Report::Cancelled {
            id: o.id,
            qty: o.leaves,
            leaves: 0,
            reason,
        });
        self.done.insert(o.id, Done::Cancelled);
    }

    fn place(&mut self, time: u64, p: Place, out: &mut Vec<Report>) {
        let reject =
            |out: &mut Vec<Report>, reason| out.push(Report::Rejected { id: p.id, reason });
        let Some(&spec) = self.specs.get(p.symbol as usize) else {
            return reject(out, Reject::UnknownSymbol);
        };
        if self.index(p.id).is_some() || self.done.contains_key(&p.id) {
            return reject(out, Reject::DuplicateOrderId);
        }
        if self
            .live
            .iter()
            .any(|o| o.account == p.account && o.client_id == p.client_id)
        {
            return reject(out, Reject::DuplicateClientOrderId);
        }
        if p.qty == 0 || !p.qty.is_multiple_of(spec.lot) {
            return reject(out, Reject::InvalidQuantity);
        }
        if p.kind != Kind::Market && (p.price == 0 || !p.price.is_multiple_of(spec.tick)) {
            return reject(out, Reject::InvalidPrice);
        }
        let limit = match (p.kind, p.side) {
            (Kind::Market, Side::Buy) => Price::MAX,
            (Kind::Market, Side::Sell) => 0,
            _ => p.price,
        };
        let crossing = self.crossing(p.symbol, p.side, limit);
        if p.kind == Kind::PostOnly && !crossing.is_empty() {
            return reject(out, Reject::WouldTake);
        }
        // M8: a dry run of the match on a copy of the book must trade the whole quantity.
        if p.kind == Kind::Fok {
            let mut dry = Reference {
                specs: self.specs.clone(),
                live: self.live.clone(),
                done: HashMap::new(),
                seq: self.seq,
            };
            let mut reports = Vec::new();
            dry.take(
                time,
                p.symbol,
                p.id,
                p.account,
                p.side,
                limit,
                p.qty,
                p.stp,
                &mut reports,
            );
            let traded: Qty = reports
                .iter()
                .filter_map(|r| match r {
                    Report::Trade { taker, qty, .. } if *taker == p.id => Some(*qty),
                    _ => None,
                })
                .sum();
            if traded != p.qty {
                return reject(out, Reject::NotFillable);
            }
        }
        out.push(Report::Accepted { id: p.id });
        let outcome = self.take(
            time, p.symbol, p.id, p.account, p.side, limit, p.qty, p.stp, out,
        );
        match outcome {
            Some(0) => {
                self.done.insert(p.id, Done::Filled);
            }
            None => {
                self.done.insert(p.id, Done::Cancelled);
            }
            Some(leaves) => match p.kind {
                Kind::Limit | Kind::PostOnly => {
                    self.seq += 1;
                    self.live.push(Resting {
                        id: p.id,
                        client_id: p.client_id,
                        account: p.account,
                        symbol: p.symbol,
                        side: p.side,
                        price: p.price,
                        leaves,
                        post_only: p.kind == Kind::PostOnly,
                        stp: p.stp,
                        seq: self.seq,
                        placed: self.seq,
                    });
                }
                _ => {
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

    /// Ids of the orders a taker on `side` with `limit` meets, in priority order.
    fn crossing(&self, symbol: SymbolId, side: Side, limit: Price) -> Vec<OrderId> {
        self.queue(symbol, side.opposite())
            .into_iter()
            .filter(|&(_, _, price, _)| crosses(side, limit, price))
            .map(|(id, _, _, _)| id)
            .collect()
    }

    /// Matches; `Some(leaves)` when the taker is still open (0: filled), `None` when
    /// self-trade prevention cancelled it.
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
    ) -> Option<Qty> {
        let mut remaining = qty;
        for maker_id in self.crossing(symbol, side, limit) {
            if remaining == 0 {
                break;
            }
            let i = self.index(maker_id).unwrap();
            let maker = self.live[i].clone();
            if maker.account == account && stp != Stp::Allow {
                let rule = self_trade(stp, maker.leaves, remaining);
                if rule.resting_cut > 0 {
                    out.push(Report::Cancelled {
                        id: maker.id,
                        qty: rule.resting_cut,
                        leaves: maker.leaves - rule.resting_cut,
                        reason: CancelReason::SelfTrade,
                    });
                    if rule.resting_cut == maker.leaves {
                        self.live.remove(i);
                        self.done.insert(maker.id, Done::Cancelled);
                    } else {
                        self.live[i].leaves -= rule.resting_cut;
                    }
                }
                if rule.taker_cut > 0 {
                    remaining -= rule.taker_cut;
                    out.push(Report::Cancelled {
                        id,
                        qty: rule.taker_cut,
                        leaves: remaining,
                        reason: CancelReason::SelfTrade,
                    });
                }
                if rule.taker_stops {
                    return None;
                }
                continue;
            }
            let traded = maker.leaves.min(remaining);
            remaining -= traded;
            out.push(Report::Trade {
                symbol,
                price: maker.price,
                qty: traded,
                maker: maker.id,
                taker: id,
                taker_side: side,
                time,
            });
            out.push(Report::Fill {
                id: maker.id,
                account: maker.account,
                price: maker.price,
                qty: traded,
                leaves: maker.leaves - traded,
                role: Role::Maker,
            });
            out.push(Report::Fill {
                id,
                account,
                price: maker.price,
                qty: traded,
                leaves: remaining,
                role: Role::Taker,
            });
            if traded == maker.leaves {
                self.live.remove(i);
                self.done.insert(maker.id, Done::Filled);
            } else {
                self.live[i].leaves -= traded;
            }
        }
        Some(remaining)
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
        let Some(i) = self.index(id) else {
            return reject(out, self.not_live(id));
        };
        let o = self.live[i].clone();
        if o.account != account {
            return reject(out, Reject::NotOwner);
        }
        let spec = self.specs[o.symbol as usize];
        if qty == 0 || !qty.is_multiple_of(spec.lot) {
            return reject(out, Reject::InvalidQuantity);
        }
        if price == 0 || !price.is_multiple_of(spec.tick) {
            return reject(out, Reject::InvalidPrice);
        }
        if price == o.price && qty <= o.leaves {
            self.live[i].leaves = qty;
            return out.push(Report::Amended { id, price, qty });
        }
        if o.post_only && !self.crossing(o.symbol, o.side, price).is_empty() {
            return reject(out, Reject::WouldTake);
        }
        out.push(Report::Amended { id, price, qty });
        self.live.remove(i);
        match self.take(
            time, o.symbol, id, o.account, o.side, price, qty, o.stp, out,
        ) {
            Some(0) => {
                self.done.insert(id, Done::Filled);
            }
            None => {
                self.done.insert(id, Done::Cancelled);
            }
            Some(leaves) => {
                self.seq += 1;
                self.live.push(Resting {
                    price,
                    leaves,
                    seq: self.seq,
                    ..o
                });
            }
        }
    }
}
