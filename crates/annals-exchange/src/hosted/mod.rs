//! The exchange as a server hosts it: started over a store ([`Hosted::start`]), its durable
//! outputs fanned out to live streams, and its HTTP face under `/v1/exchange` ([`routes`]),
//! with its answers' types and schemas ([`answers`]). It uses the store's public API and what
//! the server lends through [`Host`]: request bodies read within the server's limits, which
//! accounts the request's key may act for, how the server sends a stream, and how it answers
//! a failed read. The server serves each route behind its own authorization (by [`Access`]),
//! timing and counting.
//!
//! Commands (place, cancel, amend, cancel-all) are answered once the journal holds them in the
//! exchange's durability class, with every execution report the command produced. Queries
//! (an order, a book's depth, the symbols) are answered by the matcher between commands and
//! released only once everything they reflect is durable. Recent trades are a DCB read of the
//! journal. Two live streams, as Server-Sent Events or NDJSON: a symbol's market data (the
//! book first, then trades and best-price changes) and an account's execution reports.

pub mod answers;
mod routes;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::http::Extensions;
use axum::response::Response;
use bytes::Bytes;
use tokio::sync::{broadcast, watch};

pub use answers::register_schemas;
pub use routes::{routes, Access, AmendBody, CancelAllBody, CancelBody, PlaceBody, SymbolBody};

use crate::{Exchange, Mode, Output, ServiceOptions, Sink};

/// Batches of outputs a slow stream may fall behind before it is told it lagged and closed.
const MARKET_CHANNEL_BATCHES: usize = 4_096;

/// The exchange a server hosts, and the channel its durable outputs fan out through.
pub struct Hosted {
    pub exchange: Exchange,
    pub outputs: broadcast::Sender<Arc<Published>>,
}

/// One durable batch's outputs; the first is numbered `first`.
pub struct Published {
    pub first: u64,
    pub outputs: Vec<Output>,
}

impl Hosted {
    /// Recovers and starts the exchange (journaled in `store` unless its mode is d0) on a
    /// blocking thread.
    pub async fn start(
        options: ServiceOptions,
        store: Arc<annals::Store>,
    ) -> Result<Hosted, String> {
        let (outputs, _) = broadcast::channel(MARKET_CHANNEL_BATCHES);
        let sender = outputs.clone();
        let sink: Sink = Arc::new(move |first, outputs| {
            // No receiver is not an error: nobody is watching.
            let _ = sender.send(Arc::new(Published { first, outputs }));
        });
        let journal = (options.mode != Mode::Memory).then_some(store);
        let exchange = tokio::task::spawn_blocking(move || Exchange::start(journal, options, sink))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot start the exchange: {e}"))?;
        Ok(Hosted { exchange, outputs })
    }
}

/// The chunks of a live stream, NDJSON lines or SSE messages, each one batch's outputs.
pub type Chunks = Pin<Box<dyn futures_util::Stream<Item = Bytes> + Send>>;

/// What the server lends the exchange's routes.
pub trait Host: Send + Sync + 'static {
    /// The exchange the server hosts, if any.
    fn hosted(&self) -> Option<&Hosted>;
    /// The store the exchange journals into (recent trades are read back from it).
    fn store(&self) -> &annals::Store;
    /// A request's body, read within the server's limits of size and time; a refusal is the
    /// server's answer.
    fn body(
        &self,
        request: axum::extract::Request,
    ) -> impl Future<Output = Result<Bytes, Response>> + Send;
    /// Whether the key the request was authorized with (its `extensions`) may act for or
    /// watch `account`.
    fn allows(&self, extensions: &Extensions, account: u64) -> bool;
    /// The server's refusal of one more live stream (its limit reached), if it refuses it;
    /// asked before a stream's first answer is made.
    fn refuses_stream(&self) -> Option<Response>;
    /// The server's answer to a read of the store that failed.
    fn read_refused(&self, error: &annals::ReadError) -> Response;
    /// Sends `chunks` as the server sends its live streams (`sse`: Server-Sent Events, else
    /// NDJSON): within its limit of live streams, each chunk held within its budgets of bytes
    /// until written; or the server's refusal (too many live streams).
    fn stream(&self, extensions: &Extensions, chunks: Chunks, sse: bool) -> Response;
    /// Turns true when the server starts shutting down; the streams end.
    fn shutdown(&self) -> watch::Receiver<bool>;
}
