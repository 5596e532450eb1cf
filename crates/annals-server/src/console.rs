//! The web console: one page and its script and style, served at `/` on the HTTP listener and
//! built into the binary (no build step, nothing fetched at run time). The page calls only the
//! public API, with the API key the user gives it (kept for the browser tab), so whatever it
//! can do, a client can. Its files are in `console/` beside this crate's sources.

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::StatusCode;

use crate::wire::ApiError;

const INDEX: &str = include_str!("../console/index.html");
const SCRIPT: &str = include_str!("../console/app.js");
const STYLE: &str = include_str!("../console/app.css");

/// Scripts and styles from the server's own origin only (none inline), no frames, no
/// requests elsewhere: the page can be embedded nowhere and can talk only to this server.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The console's routes, added to the HTTP router when the console is on.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .route(
            "/",
            get(|| async { page(INDEX, "text/html; charset=utf-8") }),
        )
        .route("/console/{file}", get(asset))
}

async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "app.js" => page(SCRIPT, "text/javascript; charset=utf-8"),
        "app.css" => page(STYLE, "text/css; charset=utf-8"),
        _ => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("the console has no file {file:?}"),
        )
        .into_response(),
    }
}

fn page(body: &'static str, kind: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert("content-security-policy", HeaderValue::from_static(POLICY));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    // A new binary may bring a new console: the browser asks again each time.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
