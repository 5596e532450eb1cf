//! The exchange's routes under `/v1/exchange` and their handlers (the module above says what
//! they answer and when): request bodies parsed with unknown fields refused, commands through
//! the matcher's queue, queries answered once what they reflect is durable, recent trades read
//! from the journal, and the two live streams fed from the broadcast channel.

use std::sync::Arc;
use std::time::Duration;

use annals::{Query, QueryItem, ReadOptions};
use axum::extract::{Path, Request, State};
use axum::http::{Extensions, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::broadcast;

use super::answers::{
    Book, CancelledBecause, CommandResult, ExchangeStarted, ExchangeStatus, ExecutionReport, Level,
    OrderStanding, OrderState, Quote, SideName, SymbolAdded, SymbolQuote, Symbols, Trade, Trades,
};
use super::{Host, Hosted, Published};
use crate::codec::{self, TradeRecord};
use crate::{
    Bbo, CancelReason, Command, ExchangeError, Executed, Kind, Mode, OrderStatus, Output, Place,
    Reject, Report, Role, Side, Stp, SymbolSpec,
};

/// The most price levels or trades one request may ask for.
const LEVELS_MAX: usize = 1_000;
const TRADES_MAX: usize = 1_000;

/// What a route asks of the request's key: commands act for accounts, adding a symbol is
/// the operator's, the rest reads market data and orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Command,
    Admin,
    Market,
}

/// The exchange's routes, each with the access it needs; the server serves each behind its
/// authorization, and times and counts it.
pub fn routes<H: Host>() -> Vec<(&'static str, Access, MethodRouter<Arc<H>>)> {
    use Access::{Admin, Command, Market};
    vec![
        ("/v1/exchange", Market, get(status::<H>)),
        ("/v1/exchange/orders", Command, post(place::<H>)),
        ("/v1/exchange/orders/{id}", Market, get(order::<H>)),
        (
            "/v1/exchange/orders/{id}/cancel",
            Command,
            post(cancel::<H>),
        ),
        ("/v1/exchange/orders/{id}/amend", Command, post(amend::<H>)),
        (
            "/v1/exchange/accounts/{account}/cancel-all",
            Command,
            post(cancel_all::<H>),
        ),
        (
            "/v1/exchange/accounts/{account}/reports",
            Market,
            get(account_reports::<H>),
        ),
        ("/v1/exchange/symbols", Market, get(symbols::<H>)),
        ("/v1/admin/exchange/symbols", Admin, post(add_symbol::<H>)),
        (
            "/v1/exchange/symbols/{symbol}/depth",
            Market,
            get(depth::<H>),
        ),
        (
            "/v1/exchange/symbols/{symbol}/trades",
            Market,
            get(trades::<H>),
        ),
        (
            "/v1/exchange/symbols/{symbol}/stream",
            Market,
            get(market_stream::<H>),
        ),
    ]
}

/// A refusal: a status, a stable kind and a message, answered as the JSON error body every
/// refusal of the server carries; or an answer the server made (its body's or its streams'
/// refusals).
pub enum Refusal {
    Plain {
        status: StatusCode,
        kind: &'static str,
        message: String,
    },
    Answered(Box<Response>),
}

impl Refusal {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Refusal {
        Refusal::Plain {
            status,
            kind,
            message: message.into(),
        }
    }

    fn bad_request(kind: &'static str, message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, kind, message)
    }
}

impl From<Response> for Refusal {
    fn from(answer: Response) -> Refusal {
        Refusal::Answered(Box::new(answer))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Answered(answer) => *answer,
            Refusal::Plain {
                status,
                kind,
                message,
            } => {
                let body = json!({ "error": message, "kind": kind }).to_string();
                let mut answer = (status, body).into_response();
                let headers = answer.headers_mut();
                headers.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    headers.insert("retry-after", http::HeaderValue::from_static("1"));
                }
                answer
            }
        }
    }
}

/// A typed answer as JSON.
fn answer(status: StatusCode, answer: &impl serde::Serialize) -> Response {
    // The answers hold numbers, text and lists: they always serialize.
    let body = serde_json::to_vec(answer).expect("an answer serializes");
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn hosted<H: Host>(host: &H) -> Result<&Hosted, Refusal> {
    host.hosted().ok_or_else(|| {
        Refusal::new(
            StatusCode::NOT_FOUND,
            "no_exchange",
            "this server hosts no exchange; start it with --exchange d3-pipelined (or an \
             [exchange] section in the configuration file)",
        )
    })
}

fn exchange_error(e: &ExchangeError) -> Refusal {
    let (status, kind) = match e {
        ExchangeError::Journal(_) => (StatusCode::SERVICE_UNAVAILABLE, "exchange_journal_failed"),
        ExchangeError::Replay(_) => (StatusCode::INTERNAL_SERVER_ERROR, "exchange_replay"),
        ExchangeError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_input"),
        ExchangeError::Stopped => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        ExchangeError::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "exchange_busy"),
    };
    Refusal::new(status, kind, e.to_string())
}

/// Refuses a key bound to other accounts.
fn check_account<H: Host>(host: &H, extensions: &Extensions, account: u64) -> Result<(), Refusal> {
    if host.allows(extensions, account) {
        Ok(())
    } else {
        Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "forbidden_account",
            format!("this API key may not act for or watch account {account}"),
        ))
    }
}

fn id_param(name: &str, text: &str) -> Result<u64, Refusal> {
    text.parse().map_err(|_| {
        Refusal::bad_request(
            "invalid_parameter",
            format!("`{name}` must be an unsigned integer, not {text:?}"),
        )
    })
}

fn symbol_param(text: &str) -> Result<u32, Refusal> {
    text.parse().map_err(|_| {
        Refusal::bad_request(
            "invalid_parameter",
            format!("the symbol must be its number (0, 1, ...), not {text:?}"),
        )
    })
}

/// Parses a JSON body into `T`, unknown fields refused.
async fn body<H: Host, T: for<'de> Deserialize<'de>>(
    host: &H,
    request: Request,
    what: &str,
) -> Result<T, Refusal> {
    let bytes = host.body(request).await?;
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    serde_json::from_slice(bytes).map_err(|e| {
        let kind = if e.is_syntax() || e.is_eof() {
            "malformed_json"
        } else {
            "invalid_body"
        };
        Refusal::bad_request(kind, format!("{what}: {e}"))
    })
}

/// Runs a command and waits for its durable answer.
async fn submit(hosted: &Hosted, command: Command) -> Result<Executed, Refusal> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    hosted
        .exchange
        .try_submit(command, move |r| {
            let _ = tx.send(r);
        })
        .map_err(|e| exchange_error(&e))?;
    rx.await
        .unwrap_or(Err(ExchangeError::Stopped))
        .map_err(|e| exchange_error(&e))
}

/// Asks the matcher and waits for the durable answer.
async fn ask<T: Send + 'static>(
    hosted: &Hosted,
    question: impl FnOnce(&crate::Engine) -> T + Send + 'static,
) -> Result<(T, u64), Refusal> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    hosted
        .exchange
        .try_query_seq(question, move |r| {
            let _ = tx.send(r);
        })
        .map_err(|e| exchange_error(&e))?;
    rx.await
        .unwrap_or(Err(ExchangeError::Stopped))
        .map_err(|e| exchange_error(&e))
}

fn side_name(side: Side) -> SideName {
    match side {
        Side::Buy => SideName::Buy,
        Side::Sell => SideName::Sell,
    }
}

fn reject_name(reason: Reject) -> &'static str {
    match reason {
        Reject::UnknownSymbol => "unknown_symbol",
        Reject::InvalidPrice => "invalid_price",
        Reject::InvalidQuantity => "invalid_quantity",
        Reject::DuplicateOrderId => "duplicate_order_id",
        Reject::DuplicateClientOrderId => "duplicate_client_order_id",
        Reject::WouldTake => "would_take",
        Reject::NotFillable => "not_fillable",
        Reject::UnknownOrder => "unknown_order",
        Reject::AlreadyFilled => "already_filled",
        Reject::AlreadyCancelled => "already_cancelled",
        Reject::NotOwner => "not_owner",
    }
}

fn report(report: &Report) -> ExecutionReport {
    match *report {
        Report::Accepted { id } => ExecutionReport::Accepted { order_id: id },
        Report::Rejected { id, reason } => ExecutionReport::Rejected {
            order_id: id,
            reason: reject_name(reason),
        },
        Report::Trade {
            symbol,
            price,
            qty,
            maker,
            taker,
            taker_side,
            time,
        } => ExecutionReport::Trade {
            symbol,
            price,
            qty,
            maker,
            taker,
            taker_side: side_name(taker_side),
            time,
        },
        Report::Fill {
            id,
            account,
            price,
            qty,
            leaves,
            role,
        } => ExecutionReport::Fill {
            order_id: id,
            account,
            price,
            qty,
            leaves,
            role: match role {
                Role::Maker => super::answers::Role::Maker,
                Role::Taker => super::answers::Role::Taker,
            },
        },
        Report::Cancelled {
            id,
            qty,
            leaves,
            reason,
        } => ExecutionReport::Cancelled {
            order_id: id,
            qty,
            leaves,
            reason: match reason {
                CancelReason::Requested => CancelledBecause::Requested,
                CancelReason::SelfTrade => CancelledBecause::SelfTrade,
                CancelReason::Unfilled => CancelledBecause::Unfilled,
            },
        },
        Report::Amended { id, price, qty } => ExecutionReport::Amended {
            order_id: id,
            price,
            qty,
        },
    }
}

/// The answer to a command: the order it named, where that order stands after it, and every
/// report it produced.
fn command_result(executed: &Executed, qty: Option<u64>) -> CommandResult {
    let id = executed.id;
    let mut status = OrderStanding::Live;
    let mut leaves = qty;
    let mut reason = None;
    for r in &executed.reports {
        match *r {
            Report::Rejected { id: r, reason: why } if r == id => {
                status = OrderStanding::Rejected;
                reason = Some(reject_name(why));
            }
            Report::Fill {
                id: f, leaves: l, ..
            } if f == id => {
                leaves = Some(l);
                if l == 0 {
                    status = OrderStanding::Filled;
                }
            }
            Report::Cancelled {
                id: c, leaves: l, ..
            } if c == id => {
                leaves = Some(l);
                if l == 0 {
                    status = OrderStanding::Cancelled;
                }
            }
            Report::Amended { id: a, qty: q, .. } if a == id => leaves = Some(q),
            _ => {}
        }
    }
    let reports = executed.reports.iter().map(report).collect();
    let mut result = CommandResult {
        order_id: Some(id),
        cancelled: None,
        status: Some(status),
        reason,
        leaves: leaves.filter(|_| status == OrderStanding::Live),
        position: executed.position,
        time: executed.time,
        reports,
    };
    if id == 0 {
        // A cancel-all names no order: it says how many it cancelled.
        let cancelled = executed
            .reports
            .iter()
            .filter(|r| matches!(r, Report::Cancelled { leaves: 0, .. }))
            .count();
        result = CommandResult {
            order_id: None,
            cancelled: Some(cancelled as u64),
            status: None,
            reason: None,
            leaves: None,
            ..result
        };
    }
    result
}

/// A symbol's best bid and offer, with its rules when given.
fn quote(symbol: u32, bbo: &Bbo, spec: Option<&SymbolSpec>) -> SymbolQuote {
    let level = |l: Option<(u64, u64)>| l.map(|(price, qty)| Quote { price, qty });
    SymbolQuote {
        symbol,
        tick: spec.map(|s| s.tick),
        lot: spec.map(|s| s.lot),
        bid: level(bbo.bid),
        ask: level(bbo.ask),
    }
}

/// Counts a command request and answers it.
async fn run_command<H: Host>(
    host: Arc<H>,
    request: Request,
    parse: impl AsyncFnOnce(&H, Request) -> Result<(Command, Option<u64>), Refusal>,
) -> Result<Response, Refusal> {
    let extensions = request.extensions().clone();
    let hosted = hosted(&*host)?;
    if request.uri().query().is_some() {
        return Err(Refusal::bad_request(
            "invalid_parameter",
            "exchange commands take no query parameters; send them in the JSON body",
        ));
    }
    let (command, qty) = parse(&*host, request).await?;
    let account = match command {
        Command::Place(p) => p.account,
        Command::Cancel { account, .. }
        | Command::Amend { account, .. }
        | Command::CancelAll { account, .. } => account,
    };
    check_account(&*host, &extensions, account)?;
    let executed = submit(hosted, command).await?;
    Ok(answer(StatusCode::OK, &command_result(&executed, qty)))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "OrderKind")]
#[serde(rename_all = "snake_case")]
pub(crate) enum KindField {
    Limit,
    Market,
    Ioc,
    Fok,
    PostOnly,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Side")]
#[serde(rename_all = "snake_case")]
pub(crate) enum SideField {
    Buy,
    Sell,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "SelfTrade")]
#[serde(rename_all = "snake_case")]
pub(crate) enum StpField {
    Allow,
    CancelNewest,
    CancelOldest,
    CancelBoth,
    Decrement,
}

/// A client order id: positive, or none.
fn client_order_id_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": ["integer", "null"], "minimum": 1, "maximum": u64::MAX })
}

/// An order to place.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "PlaceOrder")]
// A market order has no price; every other kind (limit by default) needs one.
#[schemars(extend(
    "if" = { "required": ["kind"], "properties": { "kind": { "const": "market" } } },
    "then" = { "properties": { "price": { "type": "null" } } },
    "else" = { "required": ["price"], "properties": { "price": { "type": "integer" } } }
))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PlaceBody {
    #[serde(deserialize_with = "annals::numbers::u64")]
    #[schemars(schema_with = "annals::schema::unsigned")]
    account: u64,
    #[serde(deserialize_with = "annals::numbers::u32")]
    #[schemars(range(max = u32::MAX))]
    symbol: u32,
    side: SideField,
    /// limit (the default: good till cancelled), market (no price), ioc, fok, post_only.
    #[serde(default)]
    kind: Option<KindField>,
    /// A multiple of the symbol's tick; none for a market order.
    #[serde(default, deserialize_with = "annals::numbers::opt_u64")]
    #[schemars(schema_with = "annals::schema::opt_unsigned")]
    price: Option<u64>,
    /// A multiple of the symbol's lot.
    #[serde(deserialize_with = "annals::numbers::u64")]
    #[schemars(schema_with = "annals::schema::unsigned")]
    qty: u64,
    /// Unique among the account's live orders, not 0; defaults to the order's id.
    #[serde(default, deserialize_with = "annals::numbers::opt_u64")]
    #[schemars(schema_with = "client_order_id_schema")]
    client_order_id: Option<u64>,
    /// The taker's rule against trading with its own account: cancel_newest by default.
    #[serde(default)]
    self_trade: Option<StpField>,
}

async fn place<H: Host>(State(host): State<Arc<H>>, request: Request) -> Result<Response, Refusal> {
    run_command(host, request, async |host, request| {
        let b: PlaceBody = body(host, request, "order").await?;
        let kind = match b.kind.unwrap_or(KindField::Limit) {
            KindField::Limit => Kind::Limit,
            KindField::Market => Kind::Market,
            KindField::Ioc => Kind::Ioc,
            KindField::Fok => Kind::Fok,
            KindField::PostOnly => Kind::PostOnly,
        };
        let price = match (kind, b.price) {
            (Kind::Market, Some(_)) => {
                return Err(Refusal::bad_request(
                    "invalid_body",
                    "a market order takes no price",
                ))
            }
            (Kind::Market, None) => 0,
            (_, Some(price)) => price,
            (_, None) => {
                return Err(Refusal::bad_request(
                    "invalid_body",
                    "a limit, ioc, fok or post_only order needs a price",
                ))
            }
        };
        if b.client_order_id == Some(0) {
            return Err(Refusal::bad_request(
                "invalid_body",
                "clientOrderId must be positive (omit it and the order's id serves)",
            ));
        }
        let side = match b.side {
            SideField::Buy => Side::Buy,
            SideField::Sell => Side::Sell,
        };
        let stp = match b.self_trade.unwrap_or(StpField::CancelNewest) {
            StpField::Allow => Stp::Allow,
            StpField::CancelNewest => Stp::CancelNewest,
            StpField::CancelOldest => Stp::CancelOldest,
            StpField::CancelBoth => Stp::CancelBoth,
            StpField::Decrement => Stp::Decrement,
        };
        let place = Place {
            client_id: b.client_order_id.unwrap_or(0),
            kind,
            stp,
            ..Place::limit(0, b.account, b.symbol, side, price, b.qty)
        };
        Ok((Command::Place(place), Some(b.qty)))
    })
    .await
}

/// Whose order to cancel.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CancelOrder")]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    #[serde(deserialize_with = "annals::numbers::u64")]
    #[schemars(schema_with = "annals::schema::unsigned")]
    account: u64,
}

async fn cancel<H: Host>(
    State(host): State<Arc<H>>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, Refusal> {
    run_command(host, request, async |host, request| {
        let id = id_param("id", &id)?;
        let b: CancelBody = body(host, request, "cancel").await?;
        Ok((
            Command::Cancel {
                id,
                account: b.account,
            },
            None,
        ))
    })
    .await
}

/// An order's new price and open quantity.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "AmendOrder")]
#[serde(deny_unknown_fields)]
pub struct AmendBody {
    #[serde(deserialize_with = "annals::numbers::u64")]
    #[schemars(schema_with = "annals::schema::unsigned")]
    account: u64,
    #[serde(deserialize_with = "annals::numbers::u64")]
    #[schemars(schema_with = "annals::schema::unsigned")]
    price: u64,
    #[serde(deserialize_with = "annals::numbers::u64")]
    #[schemars(schema_with = "annals::schema::unsigned")]
    qty: u64,
}

async fn amend<H: Host>(
    State(host): State<Arc<H>>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, Refusal> {
    run_command(host, request, async |host, request| {
        let id = id_param("id", &id)?;
        let b: AmendBody = body(host, request, "amend").await?;
        Ok((
            Command::Amend {
                id,
                account: b.account,
                price: b.price,
                qty: b.qty,
            },
            Some(b.qty),
        ))
    })
    .await
}

/// Which orders to cancel: one symbol's, or all (no symbol).
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CancelAll")]
#[serde(deny_unknown_fields)]
pub struct CancelAllBody {
    #[serde(default, deserialize_with = "annals::numbers::opt_u32")]
    #[schemars(range(max = u32::MAX))]
    symbol: Option<u32>,
}

async fn cancel_all<H: Host>(
    State(host): State<Arc<H>>,
    Path(account): Path<String>,
    request: Request,
) -> Result<Response, Refusal> {
    run_command(host, request, async |host, request| {
        let account = id_param("account", &account)?;
        let b: CancelAllBody = body(host, request, "cancel-all").await?;
        Ok((
            Command::CancelAll {
                account,
                symbol: b.symbol,
            },
            None,
        ))
    })
    .await
}

/// A new symbol's tick and lot sizes.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "AddSymbol")]
#[serde(deny_unknown_fields)]
pub struct SymbolBody {
    #[serde(deserialize_with = "annals::numbers::u64")]
    #[schemars(range(min = 1))]
    tick: u64,
    #[serde(deserialize_with = "annals::numbers::u64")]
    #[schemars(range(min = 1))]
    lot: u64,
}

/// Adds a symbol (admin scope); answers its id once journaled.
async fn add_symbol<H: Host>(
    State(host): State<Arc<H>>,
    request: Request,
) -> Result<Response, Refusal> {
    let hosted = hosted(&*host)?;
    let b: SymbolBody = body(&*host, request, "symbol").await?;
    if b.tick == 0 || b.lot == 0 {
        return Err(Refusal::bad_request(
            "invalid_body",
            "a symbol's tick and lot must be positive",
        ));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    hosted
        .exchange
        .try_add_symbol(
            SymbolSpec {
                tick: b.tick,
                lot: b.lot,
            },
            move |r| {
                let _ = tx.send(r);
            },
        )
        .map_err(|e| exchange_error(&e))?;
    let symbol = rx
        .await
        .unwrap_or(Err(ExchangeError::Stopped))
        .map_err(|e| exchange_error(&e))?;
    let added = SymbolAdded {
        symbol,
        tick: b.tick,
        lot: b.lot,
    };
    Ok(answer(StatusCode::CREATED, &added))
}

/// The exchange's mode, what starting it found, and its counters (scope read).
async fn status<H: Host>(State(host): State<Arc<H>>) -> Result<Response, Refusal> {
    let hosted = hosted(&*host)?;
    let start = hosted.exchange.start_report();
    let stats = hosted.exchange.stats();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let mode = hosted.exchange.mode();
    let status = ExchangeStatus {
        mode: mode.label(),
        durability: mode.class(),
        started: ExchangeStarted {
            position: start.position,
            snapshot_position: start.snapshot_position,
            skipped_snapshots: start.skipped_snapshots.clone(),
            replayed: start.replayed,
            commands: start.commands,
            live_orders: start.live_orders as u64,
            millis: start.millis,
        },
        commands: load(&stats.commands),
        trades: load(&stats.trades),
        queries: load(&stats.queries),
        snapshots: load(&stats.snapshots),
        snapshot_position: load(&stats.snapshot_position),
        snapshot_error: stats.snapshot_error.lock().clone(),
        snapshot_failures: load(&stats.snapshot_failures),
    };
    Ok(answer(StatusCode::OK, &status))
}

/// An order's state: live (with what is left), filled, cancelled; 404 when never accepted.
async fn order<H: Host>(
    State(host): State<Arc<H>>,
    extensions: Extensions,
    Path(id): Path<String>,
) -> Result<Response, Refusal> {
    let hosted = hosted(&*host)?;
    let id = id_param("id", &id)?;
    let (status, _) = ask(hosted, move |engine| engine.status(id)).await?;
    let body = match status {
        // A key bound to accounts does not see other accounts' live orders.
        OrderStatus::Live(v) if !host.allows(&extensions, v.account) => {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                "unknown_order",
                format!("no order {id} of this key's accounts is live"),
            ))
        }
        OrderStatus::Live(v) => OrderState {
            order_id: v.id,
            status: OrderStanding::Live,
            account: Some(v.account),
            symbol: Some(v.symbol),
            side: Some(side_name(v.side)),
            price: Some(v.price),
            leaves: Some(v.leaves),
            client_order_id: Some(v.client_id),
        },
        OrderStatus::Filled => OrderState::done(id, OrderStanding::Filled),
        OrderStatus::Cancelled => OrderState::done(id, OrderStanding::Cancelled),
        OrderStatus::Unknown => {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                "unknown_order",
                format!("no order {id} was ever accepted"),
            ))
        }
    };
    Ok(answer(StatusCode::OK, &body))
}

/// Every symbol with its rules and best bid and offer.
async fn symbols<H: Host>(State(host): State<Arc<H>>) -> Result<Response, Refusal> {
    let hosted = hosted(&*host)?;
    let (list, _) = ask(hosted, |engine| {
        engine
            .specs()
            .into_iter()
            .enumerate()
            .map(|(i, spec)| (i as u32, spec, engine.bbo(i as u32)))
            .collect::<Vec<_>>()
    })
    .await?;
    let symbols = list
        .iter()
        .map(|(symbol, spec, bbo)| quote(*symbol, bbo, Some(spec)))
        .collect();
    Ok(answer(StatusCode::OK, &Symbols { symbols }))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LevelsParams {
    levels: Option<usize>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LimitParams {
    limit: Option<usize>,
}

fn query_params<T: for<'de> Deserialize<'de> + Default>(
    uri: &Uri,
    expected: &str,
) -> Result<T, Refusal> {
    match uri.query() {
        None => Ok(T::default()),
        Some(q) => serde_urlencoded::from_str(q).map_err(|e| {
            Refusal::bad_request(
                "invalid_parameter",
                format!("query string: {e} (expected {expected})"),
            )
        }),
    }
}

fn bounded(value: Option<usize>, default: usize, max: usize, name: &str) -> Result<usize, Refusal> {
    let value = value.unwrap_or(default);
    if value == 0 || value > max {
        return Err(Refusal::bad_request(
            "invalid_parameter",
            format!("`{name}` must be between 1 and {max}, not {value}"),
        ));
    }
    Ok(value)
}

/// The symbol of a book's path and the `levels` a side it asks for (default 10).
fn symbol_and_levels(symbol: &str, uri: &Uri) -> Result<(u32, usize), Refusal> {
    let symbol = symbol_param(symbol)?;
    let params: LevelsParams = query_params(uri, "levels")?;
    Ok((symbol, bounded(params.levels, 10, LEVELS_MAX, "levels")?))
}

type Levels = Vec<(u64, u64, u32)>;

/// Both sides of a book, best first, or None for an unknown symbol.
fn book(engine: &crate::Engine, symbol: u32, levels: usize) -> Option<(Levels, Levels)> {
    ((symbol as usize) < engine.symbols()).then(|| {
        (
            engine.depth(symbol, Side::Buy, levels),
            engine.depth(symbol, Side::Sell, levels),
        )
    })
}

fn unknown_symbol(symbol: u32) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "unknown_symbol",
        format!("no symbol {symbol}; GET /v1/exchange/symbols lists them"),
    )
}

fn book_of(symbol: u32, (bids, asks): &(Levels, Levels)) -> Book {
    let side = |levels: &Levels| {
        let level = |&(price, qty, orders)| Level { price, qty, orders };
        levels.iter().map(level).collect()
    };
    Book {
        symbol,
        bids: side(bids),
        asks: side(asks),
    }
}

/// A book's depth: up to `levels` price levels a side (default 10).
async fn depth<H: Host>(
    State(host): State<Arc<H>>,
    Path(symbol): Path<String>,
    uri: Uri,
) -> Result<Response, Refusal> {
    let hosted = hosted(&*host)?;
    let (symbol, levels) = symbol_and_levels(&symbol, &uri)?;
    let (found, _) = ask(hosted, move |engine| book(engine, symbol, levels)).await?;
    let found = found.ok_or_else(|| unknown_symbol(symbol))?;
    Ok(answer(StatusCode::OK, &book_of(symbol, &found)))
}

fn trade(t: &TradeRecord, position: Option<u64>) -> Trade {
    Trade {
        symbol: t.symbol,
        price: t.price,
        qty: t.qty,
        taker_side: side_name(t.taker_side),
        time: t.time,
        position,
    }
}

/// The latest trades of a symbol, newest first: a backwards DCB read of the journal's
/// `TradeExecuted` events tagged with the symbol.
async fn trades<H: Host>(
    State(host): State<Arc<H>>,
    Path(symbol): Path<String>,
    uri: Uri,
) -> Result<Response, Refusal> {
    let hosted = hosted(&*host)?;
    let symbol = symbol_param(&symbol)?;
    let params: LimitParams = query_params(&uri, "limit")?;
    let limit = bounded(params.limit, 50, TRADES_MAX, "limit")?;
    if hosted.exchange.mode() == Mode::Memory {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            "not_journaled",
            "the exchange runs in d0 and journals no trades",
        ));
    }
    let query = Query::item(
        QueryItem::types([codec::TRADE_EXECUTED]).and_tags([format!("symbol:{symbol}")]),
    );
    let events = host
        .store()
        .read(&query, ReadOptions::backwards().limit(limit as u64))
        .map_err(|e| host.read_refused(&e))?;
    let mut out = Vec::with_capacity(limit);
    for event in events {
        let event = event.map_err(|e| host.read_refused(&e))?;
        let trade = codec::decode_trade(&event).map_err(|e| {
            Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "exchange_replay",
                e.to_string(),
            )
        })?;
        out.push(self::trade(&trade, Some(event.position())));
    }
    let found = Trades {
        symbol,
        trades: out,
    };
    Ok(answer(StatusCode::OK, &found))
}

/// What a stream sends: one symbol's market data, or one account's execution reports.
#[derive(Clone, Copy)]
enum Filter {
    Symbol(u32),
    Account(u64),
}

/// One live stream: outputs numbered from `next` on, filtered, as SSE or NDJSON.
struct Watcher {
    outputs: broadcast::Receiver<Arc<Published>>,
    filter: Filter,
    next: u64,
    sse: bool,
    shutdown: tokio::sync::watch::Receiver<bool>,
    first: Option<Bytes>,
    ended: bool,
}

impl Watcher {
    fn frame(&self, out: &mut Vec<u8>, seq: u64, event: &str, data: &impl serde::Serialize) {
        // The answers hold numbers, text and lists: they always serialize.
        let data = serde_json::to_value(data).expect("an answer serializes");
        if self.sse {
            out.extend_from_slice(format!("id: {seq}\nevent: {event}\ndata: ").as_bytes());
            out.extend_from_slice(data.to_string().as_bytes());
            out.extend_from_slice(b"\n\n");
        } else {
            let mut line = data.clone();
            line["event"] = json!(event);
            line["seq"] = json!(seq);
            out.extend_from_slice(line.to_string().as_bytes());
            out.push(b'\n');
        }
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        if self.ended || *self.shutdown.borrow() {
            return None;
        }
        loop {
            let keepalive = tokio::time::sleep(SSE_KEEPALIVE);
            tokio::pin!(keepalive);
            let received = tokio::select! {
                r = self.outputs.recv() => r,
                _ = self.shutdown.changed() => return None,
                _ = &mut keepalive, if self.sse => {
                    return Some(Bytes::from_static(b": keepalive\n\n"))
                }
            };
            let published = match received {
                Ok(published) => published,
                Err(broadcast::error::RecvError::Lagged(batches)) => {
                    // The stream fell behind: say so and end, so the client reconnects and
                    // starts again from a fresh book.
                    self.ended = true;
                    let mut out = Vec::new();
                    let data = json!({ "lagged": true, "batchesMissed": batches });
                    self.frame(&mut out, self.next, "lagged", &data);
                    return Some(Bytes::from(out));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            let mut out = Vec::new();
            for (i, output) in published.outputs.iter().enumerate() {
                let seq = published.first + i as u64;
                if seq < self.next {
                    continue; // already in the book this stream began with
                }
                match (self.filter, output) {
                    (Filter::Symbol(s), Output::Trade(t)) if t.symbol == s => {
                        self.frame(&mut out, seq, "trade", &trade(t, None))
                    }
                    (Filter::Symbol(s), Output::Bbo { symbol, bbo }) if *symbol == s => {
                        self.frame(&mut out, seq, "bbo", &quote(s, bbo, None))
                    }
                    (Filter::Account(a), Output::Execution { account, report })
                        if *account == a =>
                    {
                        self.frame(&mut out, seq, "report", &self::report(report))
                    }
                    _ => {}
                }
            }
            self.next = self
                .next
                .max(published.first + published.outputs.len() as u64);
            if !out.is_empty() {
                return Some(Bytes::from(out));
            }
        }
    }
}

/// The answer carrying `watcher`'s chunks, sent as the server sends its streams.
fn stream_response<H: Host>(
    host: &H,
    extensions: &Extensions,
    watcher: Watcher,
) -> Result<Response, Refusal> {
    let sse = watcher.sse;
    let chunks = futures_util::stream::unfold(watcher, |mut w| async move {
        let chunk = w.next_chunk().await?;
        Some((chunk, w))
    });
    Ok(host.stream(extensions, Box::pin(chunks), sse))
}

/// Whether the request accepts `media` (an SSE client says `text/event-stream`).
fn accepts(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|m| m.trim().starts_with(media)))
}

const SSE: &str = "text/event-stream";

/// How long an idle SSE stream waits before it sends a comment, as the server's streams do,
/// so that proxies keep it open.
const SSE_KEEPALIVE: Duration = Duration::from_secs(15);

/// A symbol's live market data: the book (`levels` a side), then every trade and best-price
/// change after it, with no gap and no repeat between the two.
async fn market_stream<H: Host>(
    State(host): State<Arc<H>>,
    extensions: Extensions,
    Path(symbol): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, Refusal> {
    let hosted = hosted(&*host)?;
    let (symbol, levels) = symbol_and_levels(&symbol, &uri)?;
    if let Some(refused) = host.refuses_stream() {
        return Err(refused.into());
    }
    // Subscribe before asking, so nothing published after the book is missed.
    let outputs = hosted.outputs.subscribe();
    let (found, next) = ask(hosted, move |engine| book(engine, symbol, levels)).await?;
    let found = found.ok_or_else(|| unknown_symbol(symbol))?;
    let mut watcher = Watcher {
        outputs,
        filter: Filter::Symbol(symbol),
        next,
        sse: accepts(&headers, SSE),
        shutdown: host.shutdown(),
        first: None,
        ended: false,
    };
    let mut first = Vec::new();
    watcher.frame(&mut first, next, "book", &book_of(symbol, &found));
    watcher.first = Some(Bytes::from(first));
    stream_response(&*host, &extensions, watcher)
}

/// An account's execution reports as they become durable.
async fn account_reports<H: Host>(
    State(host): State<Arc<H>>,
    extensions: Extensions,
    Path(account): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, Refusal> {
    let hosted = hosted(&*host)?;
    let account = id_param("account", &account)?;
    check_account(&*host, &extensions, account)?;
    if uri.query().is_some() {
        return Err(Refusal::bad_request(
            "invalid_parameter",
            "the reports stream takes no query parameters",
        ));
    }
    if let Some(refused) = host.refuses_stream() {
        return Err(refused.into());
    }
    let outputs = hosted.outputs.subscribe();
    // Line the stream up with the matcher: reports from the next output on.
    let ((), next) = ask(hosted, |_| ()).await?;
    let sse = accepts(&headers, SSE);
    let first = sse.then(|| Bytes::from(format!(": reports of account {account}\n\n")));
    stream_response(
        &*host,
        &extensions,
        Watcher {
            outputs,
            filter: Filter::Account(account),
            next,
            sse,
            shutdown: host.shutdown(),
            first,
            ended: false,
        },
    )
}
