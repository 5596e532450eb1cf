//! The OpenAPI 3.1 document served at `/v1/openapi.json`. It describes what `http.rs` does;
//! a test walks every path here against the running server. The server serves the copy
//! committed beside the tests, which a test holds to what `generate.rs` makes from the types,
//! so the server carries no schema generator.

use std::sync::Arc;

use axum::response::Response;
use http::StatusCode;

use crate::auth::Scopes;
use crate::http::{json_response, Guard};
use crate::AppState;

#[cfg(test)]
mod generate;

/// The document, as committed (`ANNALS_UPDATE_SNAPSHOTS=1` writes it anew from the types).
const DOCUMENT: &str = include_str!("../tests/snapshots/openapi.json");

/// The document's route, `GET /v1/openapi.json` (read scope).
pub(crate) fn routes(
    state: &Arc<AppState>,
    router: axum::Router<Arc<AppState>>,
) -> axum::Router<Arc<AppState>> {
    let read = Guard::new(state, Scopes::READ, None);
    router.route("/v1/openapi.json", read.on(axum::routing::get(serve)))
}

async fn serve() -> Response {
    json_response(StatusCode::OK, DOCUMENT)
}
