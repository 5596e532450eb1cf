//! The hosted exchange in this server: started from the configuration, its routes
//! (`annals_exchange::hosted`) served behind the server's guards, and what the server lends
//! them ([`Host`]): bodies within its limits, the key's accounts, its streams and its answer
//! to a failed read.

use std::convert::Infallible;
use std::sync::Arc;

use annals_exchange::hosted::{self, Access, Chunks, Host, Hosted};
use axum::body::Body;
use axum::extract::Request;
use axum::http::Extensions;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::auth::{Grant, Scopes};
use crate::budget::{ConnectionBudget, StreamBudget};
use crate::config::ExchangeConfig;
use crate::http::{check_subscribers, live_response, read_body, read_error, Guard};
use crate::metrics::Op;
use crate::AppState;

/// Starts the exchange `config` describes over `store`.
pub(crate) async fn start(
    config: &ExchangeConfig,
    store: Arc<annals::Store>,
) -> Result<Hosted, String> {
    config.check(store.durability())?;
    let options = annals_exchange::ServiceOptions {
        mode: config.mode(),
        symbols: config.symbols(),
        snapshot_every: config.snapshot_every,
        queue_depth: config.queue_depth,
        ..annals_exchange::ServiceOptions::default()
    };
    Hosted::start(options, store).await
}

/// The exchange's routes added to `router`, each behind its guard: commands need the append
/// scope, adding a symbol the admin scope, the rest the read scope; commands are timed as
/// orders, the rest as market data.
pub(crate) fn routes(
    state: &Arc<AppState>,
    mut router: axum::Router<Arc<AppState>>,
) -> axum::Router<Arc<AppState>> {
    // The exchange's handlers act for the key's accounts: they read its grant.
    let order = Guard::new(state, Scopes::APPEND, Some(Op::Order)).lending_grant();
    let admin = Guard::new(state, Scopes::ADMIN, Some(Op::Order)).lending_grant();
    let market = Guard::new(state, Scopes::READ, Some(Op::Market)).lending_grant();
    for (path, access, route) in hosted::routes::<AppState>() {
        let guard = match access {
            Access::Command => &order,
            Access::Admin => &admin,
            Access::Market => &market,
        };
        router = router.route(path, guard.on(route));
    }
    router
}

impl Host for AppState {
    fn hosted(&self) -> Option<&Hosted> {
        self.exchange.as_deref()
    }

    fn store(&self) -> &annals::Store {
        &self.store
    }

    async fn body(&self, request: Request) -> Result<Bytes, Response> {
        read_body(self, request)
            .await
            .map_err(IntoResponse::into_response)
    }

    fn allows(&self, extensions: &Extensions, account: u64) -> bool {
        let grant = extensions.get::<Grant>();
        debug_assert!(grant.is_some(), "exchange routes are served behind a guard");
        grant.is_some_and(|grant| grant.allows(account))
    }

    fn refuses_stream(&self) -> Option<Response> {
        check_subscribers(self)
            .err()
            .map(IntoResponse::into_response)
    }

    fn read_refused(&self, error: &annals::ReadError) -> Response {
        read_error(error).into_response()
    }

    fn stream(&self, extensions: &Extensions, chunks: Chunks, sse: bool) -> Response {
        if let Err(refused) = check_subscribers(self) {
            return refused.into_response();
        }
        // The gauge counts the stream for as long as it lives; each chunk (one batch's outputs
        // for one client, small) is held within the budget until written out, room reserved
        // once it is made.
        let gauge = self.metrics.subscriber();
        let budget = StreamBudget::of(self, extensions.get::<ConnectionBudget>());
        let body = futures_util::stream::unfold((chunks, gauge), move |(mut chunks, gauge)| {
            let budget = budget.clone();
            async move {
                let chunk = chunks.next().await?;
                let held = budget.reserve(chunk.len()).await.ok()?;
                Some((Ok::<_, Infallible>(held.attach(chunk)), (chunks, gauge)))
            }
        });
        live_response(Body::from_stream(body), sse)
    }

    fn shutdown(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.clone()
    }
}
