//! The journal's events: each command the sequencer applied, and each trade it printed, as an
//! Annals event whose tags make the audit trail of one order, one account or one symbol a plain
//! DCB read (`order:<id>`, `account:<id>`, `symbol:<id>`).
//!
//! Commands are the truth: replaying them in order rebuilds the books. Trades are derived
//! (replay recomputes them) and are journaled so that an order's or an account's history shows
//! what filled it, including the fills of its resting orders by other accounts' commands.
//!
//! Data is little-endian binary, first byte the encoding version (1):
//!
//! ```text
//! PlaceOrder       time, id, client id, account, price, qty (u64), symbol u32, side, kind, stp
//! CancelOrder      time, id, account
//! AmendOrder       time, id, account, price, qty
//! CancelAllOrders  time, account, has-symbol u8, symbol u32
//! SymbolAdded      symbol u32, tick, lot
//! TradeExecuted    time, symbol u32, price, qty, maker, taker, maker account, taker account,
//!                  taker side u8
//! ```

use annals::{Event, EventBatch, InputError};

use crate::types::*;
use crate::wire::{kind_code, put_u32, put_u64, put_u8, side_code, stp_code, Reader};
use crate::DecodeError;

pub const PLACE_ORDER: &str = "PlaceOrder";
pub const CANCEL_ORDER: &str = "CancelOrder";
pub const AMEND_ORDER: &str = "AmendOrder";
pub const CANCEL_ALL_ORDERS: &str = "CancelAllOrders";
pub const SYMBOL_ADDED: &str = "SymbolAdded";
pub const TRADE_EXECUTED: &str = "TradeExecuted";

/// The event types replay reads, in the order they were applied.
pub const REPLAYED_TYPES: [&str; 5] = [
    PLACE_ORDER,
    CANCEL_ORDER,
    AMEND_ORDER,
    CANCEL_ALL_ORDERS,
    SYMBOL_ADDED,
];

/// Every type the journal writes: no one else may append these to an exchange's store.
pub const RESERVED_TYPES: [&str; 6] = [
    PLACE_ORDER,
    CANCEL_ORDER,
    AMEND_ORDER,
    CANCEL_ALL_ORDERS,
    SYMBOL_ADDED,
    TRADE_EXECUTED,
];

const VERSION: u8 = 1;

/// What replay does with one journaled event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Command { time: u64, command: Command },
    Symbol { symbol: SymbolId, spec: SymbolSpec },
}

/// Tags of the order, account and symbol a command names.
fn command_tags(
    event: &mut annals::EventWriter<'_>,
    order: Option<OrderId>,
    account: AccountId,
    symbol: Option<SymbolId>,
) -> Result<(), InputError> {
    if let Some(order) = order {
        event.tag_number("order:", order)?;
    }
    event.tag_number("account:", account)?;
    if let Some(symbol) = symbol {
        event.tag_number("symbol:", u64::from(symbol))?;
    }
    Ok(())
}

/// Writes one command as an event. `symbol` is the symbol of the order a cancel or an amend
/// names, when the engine knew it.
pub fn put_command(
    batch: &mut EventBatch,
    time: u64,
    command: &Command,
    symbol: Option<SymbolId>,
) -> Result<(), InputError> {
    match *command {
        Command::Place(p) => {
            let mut event = batch.event(PLACE_ORDER)?;
            command_tags(&mut event, Some(p.id), p.account, Some(p.symbol))?;
            event.finish_with(|out| {
                put_u8(out, VERSION);
                for v in [time, p.id, p.client_id, p.account, p.price, p.qty] {
                    put_u64(out, v);
                }
                put_u32(out, p.symbol);
                put_u8(out, side_code(p.side));
                put_u8(out, kind_code(p.kind));
                put_u8(out, stp_code(p.stp));
            })
        }
        Command::Cancel { id, account } => {
            let mut event = batch.event(CANCEL_ORDER)?;
            command_tags(&mut event, Some(id), account, symbol)?;
            event.finish_with(|out| {
                put_u8(out, VERSION);
                for v in [time, id, account] {
                    put_u64(out, v);
                }
            })
        }
        Command::Amend {
            id,
            account,
            price,
            qty,
        } => {
            let mut event = batch.event(AMEND_ORDER)?;
            command_tags(&mut event, Some(id), account, symbol)?;
            event.finish_with(|out| {
                put_u8(out, VERSION);
                for v in [time, id, account, price, qty] {
                    put_u64(out, v);
                }
            })
        }
        Command::CancelAll { account, symbol } => {
            let mut event = batch.event(CANCEL_ALL_ORDERS)?;
            command_tags(&mut event, None, account, symbol)?;
            event.finish_with(|out| {
                put_u8(out, VERSION);
                put_u64(out, time);
                put_u64(out, account);
                put_u8(out, u8::from(symbol.is_some()));
                put_u32(out, symbol.unwrap_or(0));
            })
        }
    }
}

/// Writes the creation of a symbol.
pub fn put_symbol(
    batch: &mut EventBatch,
    symbol: SymbolId,
    spec: SymbolSpec,
) -> Result<(), InputError> {
    let mut event = batch.event(SYMBOL_ADDED)?;
    event.tag_number("symbol:", u64::from(symbol))?;
    event.finish_with(|out| {
        put_u8(out, VERSION);
        put_u32(out, symbol);
        put_u64(out, spec.tick);
        put_u64(out, spec.lot);
    })
}

/// One trade with the accounts of both sides (from the fills that follow it in the reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TradeRecord {
    pub time: u64,
    pub symbol: SymbolId,
    pub price: Price,
    pub qty: Qty,
    pub maker: OrderId,
    pub taker: OrderId,
    pub maker_account: AccountId,
    pub taker_account: AccountId,
    pub taker_side: Side,
}

/// The trades among a command's reports: each `Trade` is followed by the maker's and the
/// taker's `Fill`, which carry the accounts.
pub fn trades(reports: &[Report]) -> impl Iterator<Item = TradeRecord> + '_ {
    reports.iter().enumerate().filter_map(|(i, report)| {
        let Report::Trade {
            symbol,
            price,
            qty,
            maker,
            taker,
            taker_side,
            time,
        } = *report
        else {
            return None;
        };
        let account_of = |at: usize, id: OrderId| match reports.get(at) {
            Some(&Report::Fill { id: f, account, .. }) if f == id => account,
            _ => 0,
        };
        Some(TradeRecord {
            time,
            symbol,
            price,
            qty,
            maker,
            taker,
            maker_account: account_of(i + 1, maker),
            taker_account: account_of(i + 2, taker),
            taker_side,
        })
    })
}

/// Writes one trade, tagged with both orders, both accounts and the symbol.
pub fn put_trade(batch: &mut EventBatch, t: &TradeRecord) -> Result<(), InputError> {
    let mut event = batch.event(TRADE_EXECUTED)?;
    event.tag_number("order:", t.maker)?;
    if t.taker != t.maker {
        event.tag_number("order:", t.taker)?;
    }
    event.tag_number("account:", t.maker_account)?;
    if t.taker_account != t.maker_account {
        event.tag_number("account:", t.taker_account)?;
    }
    event.tag_number("symbol:", u64::from(t.symbol))?;
    event.finish_with(|out| {
        put_u8(out, VERSION);
        put_u64(out, t.time);
        put_u32(out, t.symbol);
        for v in [
            t.price,
            t.qty,
            t.maker,
            t.taker,
            t.maker_account,
            t.taker_account,
        ] {
            put_u64(out, v);
        }
        put_u8(out, side_code(t.taker_side));
    })
}

/// Reads a journaled trade.
pub fn decode_trade(event: &Event) -> Result<TradeRecord, DecodeError> {
    trade_of(event).map_err(DecodeError)
}

fn trade_of(event: &Event) -> Result<TradeRecord, String> {
    if event.event_type() != TRADE_EXECUTED {
        return Err(format!("{} is not a trade", event.event_type()));
    }
    let mut r = versioned(event.data())?;
    let time = r.u64()?;
    let symbol = r.u32()?;
    let trade = TradeRecord {
        time,
        symbol,
        price: r.u64()?,
        qty: r.u64()?,
        maker: r.u64()?,
        taker: r.u64()?,
        maker_account: r.u64()?,
        taker_account: r.u64()?,
        taker_side: r.side()?,
    };
    r.finish()?;
    Ok(trade)
}

fn versioned(data: &[u8]) -> Result<Reader<'_>, String> {
    let mut r = Reader::new(data);
    let version = r.u8()?;
    if version != VERSION {
        return Err(format!("encoding version {version} is not {VERSION}"));
    }
    Ok(r)
}

/// Decodes a journaled event for replay: `None` for events replay skips (trades and types
/// that are not the exchange's).
pub fn decode(event_type: &str, data: &[u8]) -> Result<Option<Entry>, DecodeError> {
    entry_of(event_type, data).map_err(DecodeError)
}

fn entry_of(event_type: &str, data: &[u8]) -> Result<Option<Entry>, String> {
    let entry = match event_type {
        PLACE_ORDER => {
            let mut r = versioned(data)?;
            let time = r.u64()?;
            let (id, client_id, account, price, qty) =
                (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let place = Place {
                id,
                client_id,
                account,
                price,
                qty,
                symbol: r.u32()?,
                side: r.side()?,
                kind: r.kind()?,
                stp: r.stp()?,
            };
            r.finish()?;
            Entry::Command {
                time,
                command: Command::Place(place),
            }
        }
        CANCEL_ORDER => {
            let mut r = versioned(data)?;
            let (time, id, account) = (r.u64()?, r.u64()?, r.u64()?);
            r.finish()?;
            Entry::Command {
                time,
                command: Command::Cancel { id, account },
            }
        }
        AMEND_ORDER => {
            let mut r = versioned(data)?;
            let (time, id, account, price, qty) =
                (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            r.finish()?;
            Entry::Command {
                time,
                command: Command::Amend {
                    id,
                    account,
                    price,
                    qty,
                },
            }
        }
        CANCEL_ALL_ORDERS => {
            let mut r = versioned(data)?;
            let (time, account) = (r.u64()?, r.u64()?);
            let has_symbol = r.u8()?;
            let symbol = r.u32()?;
            r.finish()?;
            let symbol = match has_symbol {
                0 => None,
                1 => Some(symbol),
                other => return Err(format!("bad symbol flag {other}")),
            };
            Entry::Command {
                time,
                command: Command::CancelAll { account, symbol },
            }
        }
        SYMBOL_ADDED => {
            let mut r = versioned(data)?;
            let symbol = r.u32()?;
            let spec = SymbolSpec {
                tick: r.u64()?,
                lot: r.u64()?,
            };
            r.finish()?;
            Entry::Symbol { symbol, spec }
        }
        _ => return Ok(None),
    };
    Ok(Some(entry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use annals::{Options, Query, QueryItem, ReadOptions, Store};

    /// Goal: every kind of exchange command, and a symbol's definition, appended as events decodes
    /// back to what was appended, each tagged so that an order's events can be read by its tag.
    #[test]
    fn every_command_round_trips_with_its_tags() {
        let store = Store::open_in_memory(Options::default()).unwrap();
        let commands = [
            Command::Place(Place {
                id: 7,
                client_id: 70,
                account: 3,
                symbol: 2,
                side: Side::Sell,
                kind: Kind::PostOnly,
                price: u64::MAX - 1,
                qty: 5,
                stp: Stp::Decrement,
            }),
            Command::Cancel { id: 7, account: 3 },
            Command::Amend {
                id: 7,
                account: 3,
                price: 10,
                qty: 4,
            },
            Command::CancelAll {
                account: 3,
                symbol: None,
            },
            Command::CancelAll {
                account: 3,
                symbol: Some(0),
            },
        ];
        let mut batch = store.batch();
        for (i, command) in commands.iter().enumerate() {
            put_command(&mut batch, 100 + i as u64, command, Some(2)).unwrap();
        }
        put_symbol(&mut batch, 4, SymbolSpec { tick: 5, lot: 100 }).unwrap();
        store.appending_batch(batch).wait().unwrap();
        let events: Vec<_> = store
            .read(&Query::all(), ReadOptions::default())
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        for (i, command) in commands.iter().enumerate() {
            let entry = decode(events[i].event_type(), events[i].data()).unwrap();
            assert_eq!(
                entry,
                Some(Entry::Command {
                    time: 100 + i as u64,
                    command: *command
                })
            );
        }
        assert_eq!(
            decode(events[5].event_type(), events[5].data()).unwrap(),
            Some(Entry::Symbol {
                symbol: 4,
                spec: SymbolSpec { tick: 5, lot: 100 }
            })
        );
        let order7 = Query::item(QueryItem::tags(["order:7"]));
        assert_eq!(
            store.read(&order7, ReadOptions::default()).unwrap().count(),
            3
        );
        let account3 = Query::item(QueryItem::tags(["account:3", "symbol:2"]));
        assert_eq!(
            store
                .read(&account3, ReadOptions::default())
                .unwrap()
                .count(),
            3
        );
        // Damaged data is refused, never misread.
        assert!(decode(PLACE_ORDER, &events[0].data()[..20]).is_err());
        assert!(decode(CANCEL_ORDER, &[9; 25]).is_err());
        assert_eq!(decode("SomethingElse", b"").unwrap(), None);
    }

    /// Goal: a trade record names both orders and both accounts, is tagged with each, and decodes
    /// back from its event as it was.
    #[test]
    fn trades_carry_both_orders_and_accounts() {
        let mut engine = crate::Engine::new(&[SymbolSpec { tick: 1, lot: 1 }]);
        let mut out = Vec::new();
        let place = |id, account, side, price| {
            Command::Place(Place {
                stp: Stp::Allow,
                ..Place::limit(id, account, 0, side, price, 1)
            })
        };
        engine.apply(1, &place(1, 10, Side::Sell, 5), &mut out);
        engine.apply(2, &place(2, 20, Side::Buy, 6), &mut out);
        let trades: Vec<_> = trades(&out).collect();
        assert_eq!(
            trades,
            [TradeRecord {
                time: 2,
                symbol: 0,
                price: 5,
                qty: 1,
                maker: 1,
                taker: 2,
                maker_account: 10,
                taker_account: 20,
                taker_side: Side::Buy,
            }]
        );
        let store = Store::open_in_memory(Options::default()).unwrap();
        let mut batch = store.batch();
        put_trade(&mut batch, &trades[0]).unwrap();
        store.appending_batch(batch).wait().unwrap();
        let event = store
            .read(
                &Query::item(QueryItem::tags(["account:10"])),
                ReadOptions::default(),
            )
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(decode_trade(&event).unwrap(), trades[0]);
        let tags: Vec<_> = event.tags().collect();
        assert_eq!(
            tags,
            ["order:1", "order:2", "account:10", "account:20", "symbol:0"]
        );
    }
}
