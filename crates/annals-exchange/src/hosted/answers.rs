//! The exchange's answers over HTTP: every one that is not a stream is one of these types, and
//! its streams send the same shapes. The server's OpenAPI document takes their schemas from
//! here ([`register_schemas`]).

use schemars::JsonSchema;
use serde::Serialize;

/// The hosted exchange: its mode and durability class, what starting it found, and its
/// counters.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExchangeStatus {
    pub mode: &'static str,
    pub durability: &'static str,
    pub started: ExchangeStarted,
    pub commands: u64,
    pub trades: u64,
    pub queries: u64,
    pub snapshots: u64,
    pub snapshot_position: u64,
    pub snapshot_error: Option<String>,
    pub snapshot_failures: u64,
}

/// What starting the exchange found.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExchangeStarted {
    /// The journal head the books include.
    pub position: u64,
    /// The snapshot replay started from, and why newer ones were skipped.
    pub snapshot_position: Option<u64>,
    pub skipped_snapshots: Vec<String>,
    /// Commands replayed after the snapshot, and in the whole journal.
    pub replayed: u64,
    pub commands: u64,
    pub live_orders: u64,
    pub millis: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SideName {
    Buy,
    Sell,
}

/// Where an order stands after a command, or when asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStanding {
    Live,
    Filled,
    Cancelled,
    Rejected,
}

/// An order's state: live (with what is left), filled or cancelled.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderState {
    pub order_id: u64,
    pub status: OrderStanding,
    /// The rest is given for a live order only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symbol: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub side: Option<SideName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaves: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_order_id: Option<u64>,
}

impl OrderState {
    /// An order that is no longer live.
    pub fn done(order_id: u64, status: OrderStanding) -> OrderState {
        OrderState {
            order_id,
            status,
            account: None,
            symbol: None,
            side: None,
            price: None,
            leaves: None,
            client_order_id: None,
        }
    }
}

/// Every symbol with its rules and best bid and offer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Symbols {
    pub symbols: Vec<SymbolQuote>,
}

/// A symbol's rules and best bid and offer; `bbo` events of a market stream carry its
/// symbol, bid and ask.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SymbolQuote {
    pub symbol: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lot: Option<u64>,
    pub bid: Option<Quote>,
    pub ask: Option<Quote>,
}

/// A best price and the quantity at it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Quote {
    pub price: u64,
    pub qty: u64,
}

/// A symbol added: its id and rules.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SymbolAdded {
    pub symbol: u32,
    pub tick: u64,
    pub lot: u64,
}

/// A book's depth, best first on each side.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Book {
    pub symbol: u32,
    /// Best (highest) first.
    pub bids: Vec<Level>,
    /// Best (lowest) first.
    pub asks: Vec<Level>,
}

/// One price level.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Level {
    pub price: u64,
    pub qty: u64,
    pub orders: u32,
}

/// The latest trades of a symbol, newest first.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Trades {
    pub symbol: u32,
    pub trades: Vec<Trade>,
}

/// A trade; as a trades answer gives it, with its journal position.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Trade {
    pub symbol: u32,
    pub price: u64,
    pub qty: u64,
    pub taker_side: SideName,
    /// Nanoseconds since the Unix epoch.
    pub time: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
}

/// The answer to a command, sent once it is durable in the exchange's mode (for d3 modes:
/// after the fdatasync that covers it). A cancel-all names no order: it answers cancelled
/// instead of orderId and status.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandResult {
    /// The order named; for a place, the id the exchange gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<u64>,
    /// Cancel-all only: the orders it cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<u64>,
    /// Where the named order stands after the command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<OrderStanding>,
    /// Why it was rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// Quantity still open, when live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaves: Option<u64>,
    /// The journal position through which the command is durable (0 in d0).
    pub position: u64,
    /// The time the exchange gave the command, nanoseconds since the Unix epoch.
    pub time: u64,
    pub reports: Vec<ExecutionReport>,
}

/// One thing a command did.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum ExecutionReport {
    Accepted {
        order_id: u64,
    },
    Rejected {
        order_id: u64,
        /// unknown_symbol, invalid_price, invalid_quantity, duplicate_order_id,
        /// duplicate_client_order_id, would_take, not_fillable, unknown_order,
        /// already_filled, already_cancelled or not_owner.
        reason: &'static str,
    },
    Trade {
        symbol: u32,
        price: u64,
        qty: u64,
        maker: u64,
        taker: u64,
        taker_side: SideName,
        time: u64,
    },
    Fill {
        order_id: u64,
        account: u64,
        price: u64,
        qty: u64,
        leaves: u64,
        role: Role,
    },
    Cancelled {
        order_id: u64,
        qty: u64,
        leaves: u64,
        reason: CancelledBecause,
    },
    Amended {
        order_id: u64,
        price: u64,
        qty: u64,
    },
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Maker,
    Taker,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancelledBecause {
    Requested,
    SelfTrade,
    Unfilled,
}

/// Registers the schemas of the exchange's request bodies and answers with `generator`, each
/// under its type's name.
pub fn register_schemas(generator: &mut schemars::SchemaGenerator) {
    for schema in [
        generator.subschema_for::<super::routes::PlaceBody>(),
        generator.subschema_for::<super::routes::CancelBody>(),
        generator.subschema_for::<super::routes::AmendBody>(),
        generator.subschema_for::<super::routes::CancelAllBody>(),
        generator.subschema_for::<super::routes::SymbolBody>(),
        generator.subschema_for::<ExchangeStatus>(),
        generator.subschema_for::<OrderState>(),
        generator.subschema_for::<Symbols>(),
        generator.subschema_for::<SymbolAdded>(),
        generator.subschema_for::<Book>(),
        generator.subschema_for::<Trades>(),
        generator.subschema_for::<CommandResult>(),
    ] {
        debug_assert!(schema.get("$ref").is_some(), "{schema:?} is a named schema");
    }
}
