//! The HTTP API, base path `/v1` (docs/SERVER.md), plus `/health`, `/ready` and `/metrics`.
//!
//! Every answer that is not a success carries `{"error": message, "kind": machine-readable
//! kind}`. Reads answer a JSON array, or NDJSON when the client accepts
//! `application/x-ndjson`; a read larger than one buffer is streamed chunk by chunk from the
//! store's iterator, never collected whole.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::{
    AppendError, AppendOptions, Durability, Event, InputError, NewEvent, ReadError, ReadIter,
    StoreError,
};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;

use crate::answers;
use crate::auth::Scopes;
use crate::budget::StreamBudget;
use crate::metrics::{Api, Op, Outcome};
use crate::wire::{self, ApiError, AppendBody};
use crate::AppState;

/// A read answer is sent whole when it fits in this many bytes, streamed otherwise.
const READ_CHUNK_BYTES: usize = 64 << 10;
/// Events per subscription batch.
const SUBSCRIBE_BATCH: usize = 256;
/// Stored bytes of events per chunk of a live stream (at least one event): what one stream
/// holds in memory for its client, whatever the events' size.
pub(crate) const STREAM_CHUNK_BYTES: usize = 1 << 20;
/// How often an idle SSE stream sends a comment, so dead clients are noticed.
pub(crate) const SSE_KEEPALIVE: Duration = Duration::from_secs(15);

pub(crate) const JSON: &str = "application/json";
pub(crate) const NDJSON: &str = "application/x-ndjson";
pub(crate) const SSE: &str = "text/event-stream";

/// The HTTP API's routes added to `routes`, the ones other modules own (the exchange, data
/// subjects, the OpenAPI document, the console). The crate root gathers those: they use this
/// module's helpers, so this module names none of them. Every route passes `edge`.
pub(crate) fn router(state: Arc<AppState>, routes: Router<Arc<AppState>>) -> Router {
    let read = |op| Guard::new(&state, Scopes::READ, Some(op));
    let admin = Guard::new(&state, Scopes::ADMIN, None);
    let metrics = Guard::new(&state, Scopes::METRICS, None);
    routes
        .route("/v1/read", read(Op::Read).on(get(read_events)))
        .route(
            "/v1/append",
            Guard::new(&state, Scopes::APPEND, Some(Op::Append)).on(post(append)),
        )
        .route("/v1/head", read(Op::Head).on(get(head)))
        .route("/v1/subscribe", read(Op::Subscribe).on(get(subscribe)))
        .route("/v1/tracking", read(Op::Tracking).on(get(tracking)))
        .route("/v1/admin/check", admin.on(get(check)))
        .route("/v1/admin/stats", metrics.on(get(admin_stats)))
        .route("/v1/readmodels", read(Op::ReadModel).on(get(read_models)))
        .route(
            "/v1/readmodels/{name}",
            read(Op::ReadModel).on(get(read_model)),
        )
        .route(
            "/v1/admin/readmodels/{name}/rebuild",
            Guard::new(&state, Scopes::ADMIN, Some(Op::ReadModel)).on(post(rebuild_read_model)),
        )
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", metrics.on(get(metrics_exposition)))
        .route("/favicon.ico", get(favicon))
        // Every route that matched, guarded or open, names its request's span.
        .route_layer(tower::util::MapRequestLayer::new(name_span))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), edge))
        .with_state(state)
}

/// Names a traced request's span by the route it matched (OpenTelemetry's HTTP conventions).
fn name_span(request: Request) -> Request {
    if crate::telemetry::active() {
        if let Some(route) = request.extensions().get::<axum::extract::MatchedPath>() {
            crate::telemetry::record_route(request.method(), route.as_str());
        }
    }
    request
}

/// What a route asks of a request before its handler runs: a key holding `scope`, and the
/// operation its requests are timed and counted under (None: not counted). Every route but
/// the open ones (`/health`, `/ready`, `/favicon.ico`) is served through one, so that a new
/// handler can forget neither.
#[derive(Clone)]
pub(crate) struct Guard {
    state: Arc<AppState>,
    scope: Scopes,
    op: Option<Op>,
    /// Whether the key's grant goes into the request's extensions (for handlers that act for
    /// exchange accounts; the others need none, and the insertion allocates).
    lends_grant: bool,
}

impl Guard {
    pub(crate) fn new(state: &Arc<AppState>, scope: Scopes, op: Option<Op>) -> Guard {
        Guard {
            state: state.clone(),
            scope,
            op,
            lends_grant: false,
        }
    }

    /// This guard, putting the key's grant into each request's extensions.
    pub(crate) fn lending_grant(mut self) -> Guard {
        self.lends_grant = true;
        self
    }

    /// `route` behind this guard: authorized before any extractor runs (the key's grant in
    /// the request's extensions when the guard lends it), then timed to its answer (for a
    /// stream: its first response) and counted by outcome.
    pub(crate) fn on(
        &self,
        route: axum::routing::MethodRouter<Arc<AppState>>,
    ) -> axum::routing::MethodRouter<Arc<AppState>> {
        route.route_layer(self.clone())
    }

    /// Counts a request that ended with `response`, begun at `started`.
    fn count(&self, response: &Response, started: Instant) {
        let Some(op) = self.op else {
            return;
        };
        // A handler marks an answer whose status does not tell (a failed condition is a 200).
        let outcome = match response.extensions().get::<Outcome>() {
            Some(outcome) => *outcome,
            None if response.status().is_server_error() => Outcome::ServerError,
            None if response.status().is_client_error() => Outcome::ClientError,
            None => Outcome::Ok,
        };
        self.state
            .metrics
            .record(Api::Http, op, outcome, started.elapsed());
    }
}

// The guard is a tower layer of its own rather than `axum::middleware::from_fn`, whose `Next`
// boxes and clones the route's service on every request (docs/DECISIONS.md, R41).
impl<S> tower::Layer<S> for Guard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            guard: self.clone(),
            inner,
        }
    }
}

/// A route's service behind its [`Guard`].
#[derive(Clone)]
pub(crate) struct Guarded<S> {
    guard: Guard,
    inner: S,
}

impl<S> tower::Service<Request> for Guarded<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = GuardedFuture<S::Future>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let started = Instant::now();
        let guard = self.guard.clone();
        match grant(&guard.state, request.headers(), guard.scope) {
            Ok(grant) => {
                if guard.lends_grant {
                    request.extensions_mut().insert(grant);
                }
                GuardedFuture {
                    inner: Some(self.inner.call(request)),
                    refused: None,
                    guard,
                    started,
                }
            }
            Err(refused) => GuardedFuture {
                inner: None,
                refused: Some(refused.into_response()),
                guard,
                started,
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// A guarded route's answer: the route's own, or the guard's refusal; counted when ready.
    pub(crate) struct GuardedFuture<F> {
        #[pin]
        inner: Option<F>,
        refused: Option<Response>,
        guard: Guard,
        started: Instant,
    }
}

impl<F> std::future::Future for GuardedFuture<F>
where
    F: std::future::Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.project();
        let response = match this.inner.as_pin_mut() {
            Some(inner) => std::task::ready!(inner.poll(cx))?,
            None => this.refused.take().expect("a refusal is answered once"),
        };
        this.guard.count(&response, *this.started);
        std::task::Poll::Ready(Ok(response))
    }
}

/// What every request passes through on its way in and out: a browser page of another
/// origin is refused, and every refusal leaves with a JSON body, whoever made it.
async fn edge(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(refusal) = other_origin(&state, &request) {
        return refusal.into_response();
    }
    json_refusal(next.run(request).await).await
}

/// Refuses a browser's request sent by a page of another origin (its `Origin` header names
/// neither this server nor a configured origin): with no API keys configured, any page open
/// in a local browser could otherwise append events or read them.
fn other_origin(state: &AppState, request: &Request) -> Option<ApiError> {
    let origin = request.headers().get(http::header::ORIGIN)?;
    let allowed = origin.to_str().ok().is_some_and(|origin| {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        same_origin(&origin, request.headers()) || state.config.allowed_origins.contains(&origin)
    });
    (!allowed).then(|| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "origin_not_allowed",
            format!(
                "requests from pages of {} are not allowed; allow an origin with \
                 --allow-origin",
                String::from_utf8_lossy(origin.as_bytes())
            ),
        )
    })
}

/// The most bytes of a refusal's text kept when it is wrapped in a JSON body: rejections say
/// what was wrong in a line.
const REFUSAL_TEXT_BYTES_MAX: usize = 4096;

/// Gives a refusal made before any handler of ours ran (an extractor's rejection, such as a
/// path segment that does not decode to UTF-8) the JSON error body every refusal of ours
/// carries, keeping its status, its text as the message, and its other headers. Every answer
/// of ours that is not a success is JSON already, so only those without a JSON content type
/// are rewritten.
async fn json_refusal(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let json = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(JSON.as_bytes()));
    if json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, REFUSAL_TEXT_BYTES_MAX)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("refused").to_string()
    } else {
        text
    };
    let kind = match status {
        StatusCode::BAD_REQUEST => "invalid_request",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid_body",
        status if status.is_server_error() => "internal_error",
        _ => "refused",
    };
    let mut answer = ApiError::new(status, kind, message).into_response();
    for (name, value) in &parts.headers {
        if name != CONTENT_TYPE && name != CONTENT_LENGTH {
            answer
                .headers_mut()
                .entry(name)
                .or_insert_with(|| value.clone());
        }
    }
    answer
}

/// Browsers ask every server for an icon; the answer is that there is none, rather than a
/// refusal in their console.
async fn favicon() -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=86400"),
    );
    response
}

/// Whether `origin` (lower case) is this server as the request addressed it (`Host`).
fn same_origin(origin: &str, headers: &HeaderMap) -> bool {
    let Some(host) = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let host = host.to_ascii_lowercase();
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|rest| rest == host)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body()).into_response();
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"annals\""),
            );
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
        }
        response
    }
}

/// Checks the request's key for `needed`, answering what the key may do (the exchange
/// accounts it is bound to).
fn grant(
    state: &AppState,
    headers: &HeaderMap,
    needed: Scopes,
) -> Result<crate::auth::Grant, ApiError> {
    state
        .keys
        .grant(headers.get(AUTHORIZATION).map(|v| v.as_bytes()), needed)
        .map_err(|denied| {
            state.metrics.auth_failure();
            let status = match denied {
                crate::auth::Denied::Unauthenticated => StatusCode::UNAUTHORIZED,
                crate::auth::Denied::Forbidden(_) => StatusCode::FORBIDDEN,
            };
            let kind = if status == StatusCode::UNAUTHORIZED {
                "unauthenticated"
            } else {
                "forbidden"
            };
            ApiError::new(status, kind, denied.message())
        })
}

/// How the table of kinds answers a request the store refused (`kinds.rs`).
pub(crate) fn input_error(e: &InputError) -> ApiError {
    let answer = crate::kinds::refused(e);
    let error = ApiError::new(answer.http, answer.http_kind, e.to_string());
    match e {
        InputError::NotAdmitted(refusal) => error.with_violations(
            refusal
                .violations
                .iter()
                .map(|v| answers::Violation::of(v, None))
                .collect(),
        ),
        _ => error,
    }
}

/// How the table of kinds answers a fault of the store (`kinds.rs`).
pub(crate) fn store_error(e: &StoreError) -> ApiError {
    let answer = crate::kinds::answer(e.kind());
    let message = match e {
        StoreError::Closed => "the store is closing; retry against the restarted server".into(),
        _ => e.to_string(),
    };
    ApiError::new(answer.http, answer.http_kind, message)
}

pub(crate) fn read_error(e: &ReadError) -> ApiError {
    match e {
        ReadError::Input(e) => input_error(e),
        ReadError::Unavailable { .. } => by_kind(e.kind(), e.to_string()),
        ReadError::Store(e) => store_error(e),
    }
}

/// How the table of kinds answers an append that did not happen (`kinds.rs`). A failed
/// condition is an answer of its own to an append (200, `appendConditionFailed`), never this.
pub(crate) fn append_error(e: &AppendError) -> ApiError {
    match e {
        AppendError::ConditionFailed { .. }
        | AppendError::TrackingNotIncreasing { .. }
        | AppendError::OutcomeUnknown { .. }
        | AppendError::DiskFull { .. }
        | AppendError::Unavailable { .. }
        | AppendError::QueueFull { .. }
        | AppendError::SubjectErased { .. }
        | AppendError::AdmissionChanged { .. } => by_kind(e.kind(), e.to_string()),
        AppendError::Input(e) => input_error(e),
        AppendError::Store(e) => store_error(e),
    }
}

fn by_kind(kind: &'static str, message: String) -> ApiError {
    let answer = crate::kinds::answer(kind);
    ApiError::new(answer.http, answer.http_kind, message)
}

/// A typed answer (`answers.rs`) as JSON.
pub(crate) fn answer_response(status: StatusCode, answer: &impl serde::Serialize) -> Response {
    // The answers hold numbers, text, lists and maps keyed by text: they always serialize.
    json_response(
        status,
        serde_json::to_vec(answer).expect("an answer serializes"),
    )
}

pub(crate) fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut response = Response::new(body.into());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    response
}

/// The `query` and `options` (read) or `after` (subscribe) parameters.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Params {
    query: Option<String>,
    options: Option<String>,
    after: Option<String>,
}

/// How a JSON body that does not parse is refused: malformed JSON, or JSON of another shape.
pub(crate) fn body_error(what: &'static str) -> impl Fn(serde_json::Error) -> ApiError {
    move |e| {
        let kind = if e.is_syntax() || e.is_eof() {
            "malformed_json"
        } else {
            "invalid_body"
        };
        ApiError::bad_request(kind, format!("{what}: {e}"))
    }
}

/// The request's query string ("" when it has none), refused over the configured limit.
pub(crate) fn query_string<'r>(
    state: &AppState,
    request: &'r Request,
) -> Result<&'r str, ApiError> {
    let raw = request.uri().query().unwrap_or("");
    let max = state.config.limits.query_param_bytes_max;
    if raw.len() > max {
        return Err(ApiError::new(
            StatusCode::URI_TOO_LONG,
            "query_too_large",
            format!(
                "the query string has {} bytes (the limit is {max})",
                raw.len()
            ),
        ));
    }
    Ok(raw)
}

fn params(state: &AppState, request: &Request, allowed: &[&str]) -> Result<Params, ApiError> {
    if request.uri().query().is_none() {
        return Ok(Params::default());
    }
    let raw = query_string(state, request)?;
    let params: Params = serde_urlencoded::from_str(raw)
        .map_err(|e| ApiError::bad_request("invalid_parameter", format!("query string: {e}")))?;
    for (name, present) in [
        ("query", params.query.is_some()),
        ("options", params.options.is_some()),
        ("after", params.after.is_some()),
    ] {
        if present && !allowed.contains(&name) {
            return Err(ApiError::bad_request(
                "invalid_parameter",
                format!(
                    "unknown parameter `{name}`: expected {}",
                    allowed.join(", ")
                ),
            ));
        }
    }
    Ok(params)
}

pub(crate) fn accepts(headers: &HeaderMap, media: &str) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|m| m.trim().starts_with(media)))
}

async fn read_events(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    read_inner(&state, &request)
}

fn read_inner(state: &Arc<AppState>, request: &Request) -> Result<Response, ApiError> {
    let params = params(state, request, &["query", "options"])?;
    let query = wire::parse_query(params.query.as_deref())?;
    // The options parse straight into the store's type, unknown fields refused.
    let options: annals::ReadOptions = match params.options.as_deref() {
        None => annals::ReadOptions::default(),
        Some(t) if t.trim().is_empty() => annals::ReadOptions::default(),
        Some(t) => wire::parse_param("options", t)?,
    };
    let iter = state
        .store
        .read(&query, options)
        .map_err(|e| read_error(&e))?;
    let ndjson = accepts(request.headers(), NDJSON);
    let head = iter.head();
    let mut response = ReadEncoder::new(state, iter, ndjson)
        .into_response(state, request)
        .map_err(|e| read_error(&e))?;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(if ndjson { NDJSON } else { JSON }),
    );
    headers.insert("annals-head", HeaderValue::from(head));
    Ok(response)
}

/// Turns a read iterator into chunks of a JSON array or of NDJSON, between a prefix and a
/// suffix of its caller's (none for a plain read).
pub(crate) struct ReadEncoder {
    iter: ReadIter,
    ndjson: bool,
    /// The prefix (and the array's opening) is written.
    started: bool,
    /// An event is written (the next one follows a comma in an array).
    wrote_event: bool,
    done: bool,
    state: Arc<AppState>,
    schema: crate::schemas::SchemaNotes,
    prefix: Vec<u8>,
    suffix: &'static [u8],
}

impl ReadEncoder {
    pub(crate) fn new(state: &Arc<AppState>, iter: ReadIter, ndjson: bool) -> ReadEncoder {
        ReadEncoder {
            iter,
            ndjson,
            started: false,
            wrote_event: false,
            done: false,
            state: state.clone(),
            schema: crate::schemas::SchemaNotes::new(state),
            prefix: Vec::new(),
            suffix: b"",
        }
    }

    /// The events written after `prefix` and followed by `suffix`.
    pub(crate) fn framed(mut self, prefix: Vec<u8>, suffix: &'static [u8]) -> ReadEncoder {
        self.prefix = prefix;
        self.suffix = suffix;
        self
    }

    /// The answer: its first chunk written now (so that a failed read is an error status),
    /// the rest streamed within the request's budget of held bytes.
    pub(crate) fn into_response(
        mut self,
        state: &Arc<AppState>,
        request: &Request,
    ) -> Result<Response, ReadError> {
        let first = self.next_chunk()?;
        let body = if self.done {
            Body::from(first)
        } else {
            let budget = StreamBudget::of(state, request.extensions().get());
            let rest = futures_util::stream::unfold(self, move |mut encoder| {
                let budget = budget.clone();
                async move {
                    if encoder.done {
                        return None;
                    }
                    // An error after the status is sent (a read that fails, a budget that stays
                    // full) fails the body: the answer is cut off without its last chunk, so
                    // that no client takes what it got for the whole answer (NDJSON has no
                    // closing bracket to miss).
                    let chunk = async {
                        let mut held = budget.reserve(READ_CHUNK_BYTES).await.map_err(|e| {
                            std::io::Error::other(format!("the stream's budget: {e:?}"))
                        })?;
                        let chunk = encoder
                            .next_chunk()
                            .map_err(|e| std::io::Error::other(e.to_string()))?;
                        held.fit(chunk.len()).await.map_err(|e| {
                            std::io::Error::other(format!("the stream's budget: {e:?}"))
                        })?;
                        Ok(held.attach(chunk))
                    }
                    .await;
                    if chunk.is_err() {
                        encoder.done = true;
                    }
                    Some((chunk, encoder))
                }
            });
            Body::from_stream(futures_util::StreamExt::chain(
                futures_util::stream::once(async move { Ok::<_, std::io::Error>(first) }),
                rest,
            ))
        };
        Ok(Response::new(body))
    }

    fn next_chunk(&mut self) -> Result<Bytes, ReadError> {
        let mut out = Vec::with_capacity(4096);
        if !self.started {
            out.append(&mut self.prefix);
            if !self.ndjson {
                out.push(b'[');
            }
        }
        let mut events = 0;
        while out.len() < READ_CHUNK_BYTES {
            match self.iter.next() {
                Some(Ok(event)) => {
                    let schema =
                        self.schema
                            .of(self.state.store.as_ref(), &event)
                            .map_err(|e| ReadError::Unavailable {
                                reason: e.to_string(),
                            })?;
                    if !self.ndjson && self.wrote_event {
                        out.push(b',');
                    }
                    wire::write_event_checked(&mut out, &event, schema);
                    if self.ndjson {
                        out.push(b'\n');
                    }
                    self.wrote_event = true;
                    events += 1;
                }
                Some(Err(e)) => return Err(e),
                None => {
                    self.done = true;
                    if !self.ndjson {
                        out.push(b']');
                    }
                    out.extend_from_slice(self.suffix);
                    break;
                }
            }
        }
        self.started = true;
        self.state.metrics.events_read(events);
        Ok(Bytes::from(out))
    }
}

async fn append(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let started = Instant::now();
    match append_inner(&state, request, started).await {
        Ok((mut response, conflict)) => {
            if conflict {
                response.extensions_mut().insert(Outcome::Conflict);
            }
            response
        }
        Err(e) => e.into_response(),
    }
}

async fn append_inner(
    state: &Arc<AppState>,
    request: Request,
    started: Instant,
) -> Result<(Response, bool), ApiError> {
    if request.uri().query().is_some() {
        return Err(ApiError::bad_request(
            "invalid_parameter",
            "append takes no query parameters; send the events and condition in the body",
        ));
    }
    let trace = match state.config.telemetry.store_trace_context {
        Some(true) => crate::telemetry::TraceContext::of(request.headers()),
        _ => None,
    };
    let body = read_body(state, request).await?;
    let parsed: AppendBody = serde_json::from_slice(&body).map_err(body_error("append body"))?;
    // Every event is decoded before any is appended, so that a bad one changes nothing.
    let mut events: Vec<NewEvent> = parsed
        .events
        .into_iter()
        .enumerate()
        .map(|(index, e)| {
            e.into_new_event(&body)
                .map_err(|e| ApiError::bad_request("invalid_body", format!("event {index}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    if let Some(trace) = &trace {
        trace.stamp(&mut events);
    }
    let tracking = parsed
        .tracking
        .map(|t| annals::Tracking::new(t.source, t.position));
    let options = AppendOptions {
        tracking,
        ..append_class(parsed.durability.as_deref(), state.store.durability())?
    };
    let result = state
        .append(&events, parsed.condition.as_ref(), options)
        .await;
    let micros = started.elapsed().as_micros() as u64;
    let (answer, conflict) = match result {
        Ok(position) => (
            answers::Appended {
                duration_in_microseconds: micros,
                append_condition_failed: false,
                position: Some(position),
                conflict_position: None,
            },
            false,
        ),
        Err(AppendError::ConditionFailed { position }) => (
            answers::Appended {
                duration_in_microseconds: micros,
                append_condition_failed: true,
                position: None,
                conflict_position: Some(position),
            },
            true,
        ),
        Err(e) => return Err(append_error(&e)),
    };
    Ok((answer_response(StatusCode::OK, &answer), conflict))
}

/// The options an append's `durability` field asks for. A class is a minimum: an append is
/// never made weaker than the server's class, so asking for a weaker one gets the server's.
fn append_class(asked: Option<&str>, store: Durability) -> Result<AppendOptions, ApiError> {
    let Some(asked) = asked else {
        return Ok(AppendOptions::default());
    };
    let class: Durability = asked
        .parse()
        .map_err(|e: String| ApiError::bad_request("invalid_durability", e))?;
    let class = class.max(store);
    Ok(AppendOptions {
        require_synced: class >= Durability::Synced && store < Durability::Synced,
        off_machine: class == Durability::OffMachine,
        ..AppendOptions::default()
    })
}

/// Reads a request body within the configured size and time limits.
pub(crate) async fn read_body(state: &AppState, request: Request) -> Result<Bytes, ApiError> {
    let limits = &state.config.limits;
    // A JSON body must say so: a browser sends a page's form or text/plain body to any origin
    // without asking first, but never application/json.
    let json = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let media = v
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            media == JSON || (media.starts_with("application/") && media.ends_with("+json"))
        });
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be JSON sent with Content-Type: application/json",
        ));
    }
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = |bytes: String| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!(
                "the request body has {bytes} bytes (the limit is {})",
                limits.body_bytes_max
            ),
        )
    };
    if let Some(length) = declared {
        if length > limits.body_bytes_max as u64 {
            return Err(too_large(length.to_string()));
        }
    }
    tokio::time::timeout(
        limits.body_timeout,
        axum::body::to_bytes(request.into_body(), limits.body_bytes_max),
    )
    .await
    .map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {} ms",
                limits.body_timeout.as_millis()
            ),
        )
    })?
    .map_err(|e| {
        let text = e.to_string();
        if text.contains("length limit") {
            too_large(format!("more than {}", limits.body_bytes_max))
        } else {
            ApiError::bad_request("invalid_body", format!("reading the body: {text}"))
        }
    })
}

async fn head(State(state): State<Arc<AppState>>) -> Response {
    let head = answers::Head {
        head: state.store.head(),
    };
    answer_response(StatusCode::OK, &head)
}

async fn tracking(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct TrackingParams {
            source: String,
        }
        let params: TrackingParams =
            serde_urlencoded::from_str(request.uri().query().unwrap_or("")).map_err(|e| {
                ApiError::bad_request(
                    "invalid_parameter",
                    format!("query string: {e} (expected source=<name>)"),
                )
            })?;
        let position = state.store.tracking(&params.source);
        let answer = answers::TrackingPosition {
            source: params.source,
            position,
        };
        Ok(answer_response(StatusCode::OK, &answer))
    }
}

async fn subscribe(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    subscribe_inner(&state, &request)
}

fn subscribe_inner(state: &Arc<AppState>, request: &Request) -> Result<Response, ApiError> {
    let params = params(state, request, &["query", "after"])?;
    let query = wire::parse_query(params.query.as_deref())?;
    let sse = accepts(request.headers(), SSE);
    // An SSE client that reconnects says where it was.
    let resume = request
        .headers()
        .get("last-event-id")
        .filter(|_| sse)
        .and_then(|v| v.to_str().ok());
    let after = match resume.or(params.after.as_deref()) {
        None => 0,
        Some(text) => text.trim().parse::<u64>().map_err(|_| {
            ApiError::bad_request(
                "invalid_parameter",
                format!(
                    "parameter `after`: expected a position (an unsigned integer), got {text:?}"
                ),
            )
        })?,
    };
    check_subscribers(state)?;
    let subscription = state
        .store
        .subscribe(&query, after)
        .map_err(|e| read_error(&e))?;
    let follower = Follower {
        position: state.metrics.follower(subscription.position()),
        subscription,
        budget: StreamBudget::of(state, request.extensions().get()),
        shutdown: state.shutdown.clone(),
        state: state.clone(),
        schema: crate::schemas::SchemaNotes::new(state),
        _gauge: state.metrics.subscriber(),
        sse,
    };
    let stream = futures_util::stream::unfold(follower, |mut f| async move {
        let chunk = f.next_chunk().await?;
        Some((Ok::<_, Infallible>(chunk), f))
    });
    Ok(live_response(Body::from_stream(stream), sse))
}

/// Refuses a new live stream (subscription, market data, reports) beyond the limit.
pub(crate) fn check_subscribers(state: &AppState) -> Result<(), ApiError> {
    if state.metrics.subscribers() >= state.config.limits.subscribers_max as i64 {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_subscribers",
            format!(
                "the server already serves {} live streams (the limit)",
                state.config.limits.subscribers_max
            ),
        ));
    }
    Ok(())
}

/// The answer carrying a live stream: SSE or NDJSON, never cached.
pub(crate) fn live_response(body: Body, sse: bool) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(if sse { SSE } else { NDJSON }),
    );
    headers.insert("cache-control", HeaderValue::from_static("no-store"));
    response
}

/// One subscriber's stream: batches of events as NDJSON lines or SSE messages.
struct Follower {
    subscription: annals::Subscription,
    /// Its position, for the lag of the slowest subscription (`Metrics::follower`).
    position: Arc<std::sync::atomic::AtomicU64>,
    budget: StreamBudget,
    shutdown: tokio::sync::watch::Receiver<bool>,
    state: Arc<AppState>,
    schema: crate::schemas::SchemaNotes,
    _gauge: crate::metrics::Gauge,
    sse: bool,
}

impl Follower {
    /// The next chunk to send; `None` ends the stream (shutdown, closed or failed store, or a
    /// stream budget that stayed full). Room for the chunk is reserved before its events are
    /// read, once there are new ones.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        let keepalive = tokio::time::sleep(SSE_KEEPALIVE);
        tokio::pin!(keepalive);
        loop {
            if *self.shutdown.borrow() {
                return None;
            }
            let ready = tokio::select! {
                ready = self.subscription.ready() => ready.ok()?,
                _ = self.shutdown.changed() => return None,
                _ = &mut keepalive, if self.sse => return Some(Bytes::from_static(b": keepalive\n\n")),
            };
            if !ready {
                return None; // the store closed
            }
            let mut held = self.budget.reserve(STREAM_CHUNK_BYTES).await.ok()?;
            let mut batch = Vec::new();
            self.subscription
                .try_next_batch_bytes(SUBSCRIBE_BATCH, STREAM_CHUNK_BYTES / 2, &mut batch)
                .ok()?;
            self.position.store(
                self.subscription.position(),
                std::sync::atomic::Ordering::Relaxed,
            );
            if batch.is_empty() {
                continue; // the new events do not match
            }
            self.state.metrics.events_read(batch.len() as u64);
            let chunk = self.encode(&batch)?;
            drop(batch);
            held.fit(chunk.len()).await.ok()?;
            return Some(held.attach(chunk));
        }
    }

    /// None when the registry could not read the log: the stream ends, to be resumed.
    fn encode(&mut self, batch: &[Event]) -> Option<Bytes> {
        let mut out = Vec::with_capacity(batch.len() * 256);
        for event in batch {
            let schema = match self.schema.of(self.state.store.as_ref(), event) {
                Ok(schema) => schema,
                Err(e) => {
                    tracing::warn!(error = %e, "a stream ends: its events' schema versions could not be read");
                    return None;
                }
            };
            if self.sse {
                out.extend_from_slice(b"id: ");
                wire::write_u64(&mut out, event.position());
                out.extend_from_slice(b"\nevent: event\ndata: ");
            }
            wire::write_event_checked(&mut out, event, schema);
            out.extend_from_slice(if self.sse { b"\n\n" } else { b"\n" });
        }
        Some(Bytes::from(out))
    }
}

/// Checks the live log (every record's CRC and sequence, the index against the log) up to the
/// current head, on a blocking thread; appends go on meanwhile. Admin scope.
async fn check(State(state): State<Arc<AppState>>) -> Response {
    let store = state.store.clone();
    match tokio::task::spawn_blocking(move || store.check(&mut |_, _| {})).await {
        Ok(Ok(report)) => {
            let answer = answers::Check {
                ok: report.problem.is_none(),
                head: Some(report.head),
                events: Some(report.events),
                problem: report.problem,
                seconds: Some(report.seconds),
            };
            answer_response(StatusCode::OK, &answer)
        }
        Ok(Err(e)) => {
            let answer = answers::Check {
                ok: false,
                head: None,
                events: None,
                problem: Some(e.to_string()),
                seconds: None,
            };
            answer_response(StatusCode::OK, &answer)
        }
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "check_failed",
            e.to_string(),
        )
        .into_response(),
    }
}

/// Every read model's status: position, checkpoint, head, lag, counters.
async fn read_models(State(state): State<Arc<AppState>>) -> Response {
    let answer = answers::ReadModels {
        read_models: state.read_models.statuses(),
    };
    answer_response(StatusCode::OK, &answer)
}

/// Longest wait a client may ask for with `waitMs`.
const READ_MODEL_WAIT_MAX: Duration = Duration::from_secs(10);

/// One read model: its status, total and number of keys; with `key`, that key's count; with
/// `minPosition`, waits (up to `waitMs`) until the model has reached that position, for
/// reading one's own writes, and answers 504 with the status if it has not.
async fn read_model(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    uri: http::Uri,
) -> Result<Response, ApiError> {
    read_model_inner(&state, &name, uri.query().unwrap_or("")).await
}

async fn read_model_inner(state: &AppState, name: &str, query: &str) -> Result<Response, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct ModelParams {
        key: Option<String>,
        min_position: Option<u64>,
        wait_ms: Option<u64>,
    }
    let params: ModelParams = serde_urlencoded::from_str(query).map_err(|e| {
        ApiError::bad_request(
            "invalid_parameter",
            format!("query string: {e} (expected key, minPosition, waitMs)"),
        )
    })?;
    let unknown = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_read_model",
            format!("no read model named {name:?}; GET /v1/readmodels lists them"),
        )
    };
    let mut reached = true;
    if let Some(wanted) = params.min_position {
        let wait = Duration::from_millis(params.wait_ms.unwrap_or(0)).min(READ_MODEL_WAIT_MAX);
        let deadline = Instant::now() + wait;
        let mut shutdown = state.shutdown.clone();
        loop {
            let position = state.read_models.position(name).ok_or_else(unknown)?;
            if position >= wanted {
                break;
            }
            let stopping = *shutdown.borrow();
            if Instant::now() >= deadline || stopping {
                reached = false;
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(2)) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    let view = state
        .read_models
        .get(name, params.key.as_deref())
        .ok_or_else(unknown)?;
    let status = if reached {
        StatusCode::OK
    } else {
        StatusCode::GATEWAY_TIMEOUT
    };
    Ok(answer_response(status, &view))
}

/// Asks a read model to fold again from the first event (admin scope); answers 202 at once.
async fn rebuild_read_model(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    if !state.read_models.rebuild(&name) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_read_model",
            format!("no read model named {name:?}; GET /v1/readmodels lists them"),
        ));
    }
    let answer = answers::Rebuilding {
        name,
        rebuilding: true,
    };
    Ok(answer_response(StatusCode::ACCEPTED, &answer))
}

/// Liveness: the process serves. 503 only while the store is poisoned, which a restart (a
/// reopen) cures; every other state is told in the body with 200, and readiness is `/ready`.
/// Open without a key, so load balancers can probe it; it reveals only the head, the
/// durability class, and the states of the store, its backup and its replication.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let stats = state.store.stats();
    // A full disk refuses appends but serves everything else: the process is live (readiness,
    // which a full disk does fail, is `/ready`).
    // Damage the scrub found and could not repair: reads that cross it fail, the rest serves.
    let damaged = stats
        .scrub
        .as_ref()
        .and_then(|s| (!s.damaged.is_empty()).then(|| s.damaged.join("; ")));
    use answers::HealthStatus;
    let status = match (&stats.poisoned, &stats.disk_full, &damaged) {
        (Some(_), _, _) => HealthStatus::Poisoned,
        (None, _, Some(_)) => HealthStatus::Damaged,
        (None, Some(_), None) => HealthStatus::DiskFull,
        (None, None, None) => HealthStatus::Ok,
    };
    let answer = answers::Health {
        status,
        head: stats.head,
        durability: stats.durability,
        reason: (stats.poisoned.clone().or(damaged)).or(stats.disk_full.clone()),
        disk_free_bytes: stats.disk_free_bytes,
        backup: stats.backup.as_ref().map(|b| answers::HealthBackup {
            state: b.state,
            lag_positions: b.lag_positions,
            lag_seconds: b.lag_seconds,
        }),
        replica: stats.replica.as_ref().map(|r| answers::HealthReplica {
            state: r.state,
            lag_positions: r.lag_positions,
            lag_seconds: r.lag_seconds,
            last_poll_age_seconds: r.last_poll_age_seconds,
        }),
    };
    let code = match status {
        HealthStatus::Poisoned => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    };
    answer_response(code, &answer)
}

/// Readiness: whether the server can now keep what it promises, for a load balancer to send
/// it traffic or not. 503 with the reasons while it cannot (`Stats::unready_reasons`, and a
/// server shutting down). Open without a key, as `/health` is, and for the same probes.
/// Why the server cannot keep what it promises now (empty: ready).
fn unready_reasons(state: &AppState) -> Vec<String> {
    let mut reasons = state.store.stats().unready_reasons();
    if *state.shutdown.borrow() {
        reasons.push("shutting_down: the server finishes its requests and stops".into());
    }
    reasons
}

/// The store's statistics as JSON (metrics scope): the shape `annals stats --store` prints, with
/// the server's readiness, subscribers and connections.
async fn admin_stats(State(state): State<Arc<AppState>>) -> Response {
    let reasons = unready_reasons(&state);
    let answer = answers::ServerStats {
        store: crate::stats::store_stats(&state.store),
        ready: reasons.is_empty(),
        unready_reasons: reasons,
        subscribers: state.metrics.subscribers(),
        connections: state.metrics.connections(),
    };
    answer_response(StatusCode::OK, &answer)
}

async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let reasons = unready_reasons(&state);
    let (code, status) = match reasons.is_empty() {
        true => (StatusCode::OK, answers::ReadyStatus::Ok),
        false => (
            StatusCode::SERVICE_UNAVAILABLE,
            answers::ReadyStatus::Unavailable,
        ),
    };
    answer_response(code, &answers::Ready { status, reasons })
}

async fn metrics_exposition(State(state): State<Arc<AppState>>) -> Response {
    // The shelf's count may be a database's answer: off the runtime's threads.
    let store = state.store.clone();
    let shelf = tokio::task::spawn_blocking(move || store.snapshots().stats().ok())
        .await
        .ok()
        .flatten();
    let text = scrape(&state, shelf).exposition();
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(prometheus_client::encoding::prometheus_text::CONTENT_TYPE),
    );
    response
}

/// Every series the server reports, read now (`/metrics`, and the push over OTLP); `shelf`:
/// the snapshots' count, read by the caller off the runtime's threads.
pub(crate) fn scrape(
    state: &AppState,
    shelf: Option<annals::snapshot::SnapshotStats>,
) -> crate::metrics::Scrape {
    crate::metrics::Scrape {
        snapshots: (shelf, state.store.snapshots().counts()),
        schemas: state.registry.as_ref().map(|r| r.stats()),
        server: state.metrics.counts(),
        stats: state.store.stats(),
        stream_bytes: (
            state.stream_bytes.held() as u64,
            state.config.limits.stream_bytes_max as u64,
        ),
        read_models: state.read_models.counts(),
        exchange: state
            .exchange
            .as_ref()
            .map(|hosted| crate::metrics::ExchangeCounts::of(hosted.exchange.stats())),
        process: crate::process::ProcessStats::read(),
    }
}

async fn not_found(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no endpoint at {}; see /v1/openapi.json",
            request.uri().path()
        ),
    )
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} is not allowed on {}; see /v1/openapi.json",
            request.method(),
            request.uri().path()
        ),
    )
}
