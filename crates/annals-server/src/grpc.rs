//! gRPC: the UmaDB protocol (service `umadb.v1.DCB` from the `umadb-proto` crate, and its
//! legacy name `umadb.UmaDBService`), so UmaDB's own clients work against Annals unchanged.
//!
//! Semantics follow UmaDB's server where the protocol leaves room: `start` is inclusive (the
//! maximum when reading backwards); a read streams batches (default 100 events, at most 5,000)
//! up to the head it saw when it began, and each batch carries that head (or, when a limit was
//! given, the position of the batch's last event); errors carry an `ErrorResponse` in the
//! status details, with a failed condition as `FAILED_PRECONDITION` / `INTEGRITY`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use annals::{
    AppendCondition, AppendError, Event, NewEvent, Query, QueryItem, ReadError, ReadOptions,
    StoreError,
};
use bytes::Bytes;
use futures_util::Stream;
use prost::Message;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};
use umadb_proto::v1;
use umadb_proto::v1::dcb_server::{Dcb, DcbServer};
use umadb_proto::v1::error_response::ErrorType;

use crate::auth::{Denied, Scopes};
use crate::budget::{Held, StreamBudget};
use crate::metrics::{Api, Op, Outcome};
use crate::wire;
use crate::AppState;

const BATCH_DEFAULT: u32 = 100;
const BATCH_MAX: u32 = 5000;
/// Stored bytes of events in one streamed message (at least one event): a batch of large
/// events is cut into several messages, so what a stream holds for its client is bounded
/// whatever the events' size, and each message stays within what clients decode by default
/// (4 MiB).
const MESSAGE_BYTES_MAX: usize = 2 << 20;
/// A sequenced event's bytes in a message beyond what the store holds of it (position, field
/// keys, lengths), for reserving room.
const EVENT_OVERHEAD: usize = 32;

/// The status ending a stream whose budget stayed full.
fn exhausted(e: crate::budget::Exhausted) -> Status {
    status(Code::Unavailable, ErrorType::Io, e.to_string())
}

/// Serves the DCB service (under both names) and gRPC health on `listener`, through the same
/// accept loop, limits and graceful shutdown as HTTP (`serve.rs`): tonic's routes become one
/// more axum router, answered by hyper.
pub(crate) async fn serve(listener: TcpListener, tls: Option<TlsAcceptor>, state: Arc<AppState>) {
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in SERVICE_NAMES {
        reporter
            .set_service_status(name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let service = Arc::new(Service {
        state: state.clone(),
    });
    let dcb = DcbServer::from_arc(service.clone())
        .max_decoding_message_size(state.config.limits.body_bytes_max)
        .max_encoding_message_size(usize::MAX);
    let router = tonic::service::Routes::new(health)
        .add_service(Legacy(dcb.clone()))
        .add_service(dcb.clone())
        .prepare()
        .into_axum_router()
        .merge(unary_routes(service, dcb));
    let mut shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        let _ = shutdown.changed().await;
        for name in SERVICE_NAMES {
            reporter
                .set_service_status(name, tonic_health::ServingStatus::NotServing)
                .await;
        }
    });
    crate::serve::serve_http(listener, router, tls, state, crate::serve::Protocols::Http2).await;
}

const SERVICE_NAMES: [&str; 3] = ["", "umadb.v1.DCB", "umadb.UmaDBService"];

/// A status with UmaDB's structured `ErrorResponse` in its details, which its clients decode
/// into typed errors.
fn status(code: Code, error_type: ErrorType, message: impl Into<String>) -> Status {
    let message = message.into();
    let details = v1::ErrorResponse {
        message: message.clone(),
        error_type: error_type as i32,
    };
    Status::with_details(code, message, Bytes::from(details.encode_to_vec()))
}

fn invalid(message: impl Into<String>) -> Status {
    status(Code::InvalidArgument, ErrorType::InvalidArgument, message)
}

/// How the table of kinds answers a fault of the store (`kinds.rs`).
fn store_status(e: &StoreError) -> Status {
    let answer = crate::kinds::answer(e.kind());
    status(answer.grpc, answer.error_type, e.to_string())
}

/// How the table of kinds answers a request the store refused (`kinds.rs`).
fn input_status(e: &annals::InputError) -> Status {
    let answer = crate::kinds::refused(e);
    status(answer.grpc, answer.error_type, e.to_string())
}

fn read_status(e: &ReadError) -> Status {
    match e {
        ReadError::Input(e) => input_status(e),
        ReadError::Unavailable { .. } => by_kind(e.kind(), e.to_string()),
        ReadError::Store(e) => store_status(e),
    }
}

/// How the table of kinds answers an append that did not happen (`kinds.rs`). UmaDB's
/// integrity errors read "integrity error: ..." (adapters match on the word); an erased
/// subject's refusal names its kind first, as UmaDB's clients show only the message.
pub(crate) fn append_status(e: &AppendError) -> Status {
    match e {
        AppendError::ConditionFailed { .. } | AppendError::TrackingNotIncreasing { .. } => {
            by_kind(e.kind(), format!("Integrity error: {e}"))
        }
        AppendError::SubjectErased { .. } => by_kind(e.kind(), format!("subject_erased: {e}")),
        AppendError::OutcomeUnknown { .. }
        | AppendError::DiskFull { .. }
        | AppendError::Unavailable { .. }
        | AppendError::QueueFull { .. }
        | AppendError::AdmissionChanged { .. } => by_kind(e.kind(), e.to_string()),
        AppendError::Input(e) => input_status(e),
        AppendError::Store(e) => store_status(e),
    }
}

fn by_kind(kind: &'static str, message: String) -> Status {
    let answer = crate::kinds::answer(kind);
    status(answer.grpc, answer.error_type, message)
}

fn outcome_of(status: &Status) -> Outcome {
    match status.code() {
        Code::FailedPrecondition => Outcome::Conflict,
        Code::Internal | Code::Unavailable | Code::DataLoss | Code::Unknown => Outcome::ServerError,
        _ => Outcome::ClientError,
    }
}

fn to_query(query: Option<v1::Query>) -> Query {
    match query {
        None => Query::all(),
        Some(q) => Query {
            items: q
                .items
                .into_iter()
                .map(|i| QueryItem {
                    types: i.types,
                    tags: i.tags,
                })
                .collect(),
        },
    }
}

/// The metadata entry that marks an event whose data subject was erased (its data is empty).
pub(crate) const ERASED_KEY: &str = "annals.erased";

fn to_sequenced(event: &Event) -> v1::SequencedEvent {
    v1::SequencedEvent {
        position: event.position(),
        event: Some(v1::Event {
            event_type: event.event_type().to_owned(),
            tags: event.tags().map(str::to_owned).collect(),
            data: event.data().to_vec(),
            uuid: event.id().map(|id| id.to_string()).unwrap_or_default(),
            metadata: wire::metadata_entries(event.metadata())
                .into_iter()
                .map(|(key, value)| v1::MetadataEntry { key, value })
                .chain(event.is_erased().then(|| v1::MetadataEntry {
                    key: ERASED_KEY.to_owned(),
                    value: "true".to_owned(),
                }))
                .collect(),
        }),
        tracking_info: None,
    }
}

/// An event of an append request. An empty uuid and the nil UUID both mean "no id".
fn to_new_event(index: usize, event: v1::Event) -> Result<NewEvent, Status> {
    let id = if event.uuid.is_empty() {
        None
    } else {
        // UmaDB answers an unreadable UUID as a deserialization error (DATA_LOSS, CORRUPTION);
        // its clients expect that.
        let id = uuid::Uuid::parse_str(&event.uuid).map_err(|_| {
            status(
                Code::DataLoss,
                ErrorType::Corruption,
                format!(
                    "deserialization error: event {index}: invalid UUID {:?}",
                    event.uuid
                ),
            )
        })?;
        Some(id).filter(|id| !id.is_nil())
    };
    let metadata = if event.metadata.is_empty() {
        Bytes::new()
    } else {
        wire::metadata_from_entries(
            event
                .metadata
                .iter()
                .map(|m| (m.key.as_str(), m.value.as_str())),
        )
    };
    Ok(NewEvent {
        event_type: event.event_type,
        tags: event.tags,
        data: Bytes::from(event.data),
        metadata,
        id,
    })
}

struct Service {
    state: Arc<AppState>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

impl Service {
    fn authorize(&self, metadata: &MetadataMap, needed: Scopes) -> Result<(), Status> {
        let header = metadata.get("authorization").map(|v| v.as_bytes());
        self.state.keys.check(header, needed).map_err(|denied| {
            self.state.metrics.auth_failure();
            match denied {
                Denied::Unauthenticated => status(
                    Code::Unauthenticated,
                    ErrorType::Authentication,
                    denied.message(),
                ),
                Denied::Forbidden(_) => status(
                    Code::PermissionDenied,
                    ErrorType::Authentication,
                    denied.message(),
                ),
            }
        })
    }

    fn record<T>(&self, op: Op, started: Instant, result: &Result<T, Status>) {
        let outcome = match result {
            Ok(_) => Outcome::Ok,
            Err(s) => outcome_of(s),
        };
        self.state
            .metrics
            .record(Api::Grpc, op, outcome, started.elapsed());
    }

    fn read_stream(
        &self,
        request: v1::ReadRequest,
        budget: StreamBudget,
    ) -> Result<BoxStream<v1::ReadResponse>, Status> {
        #[allow(deprecated)]
        if request.subscribe.unwrap_or(false) {
            return Err(invalid(
                "the `subscribe` argument of read is deprecated: call Subscribe instead",
            ));
        }
        let backwards = request.backwards.unwrap_or(false);
        let mut options = if backwards {
            ReadOptions::backwards()
        } else {
            ReadOptions::forwards()
        };
        options.from = request.start;
        options.limit = request.limit.map(u64::from);
        let limited = request.limit.is_some();
        if request.limit == Some(0) {
            // Nothing may be sent: no message at all, as UmaDB answers.
            return Ok(Box::pin(futures_util::stream::empty()));
        }
        let batch = request
            .batch_size
            .unwrap_or(BATCH_DEFAULT)
            .clamp(1, BATCH_MAX) as usize;
        let iter = self
            .state
            .store
            .read(&to_query(request.query), options)
            .map_err(|e| read_status(&e))?;
        let head = Some(iter.head()).filter(|&h| h > 0);
        let state = self.state.clone();
        struct Reading {
            iter: annals::ReadIter,
            sent_any: bool,
            done: bool,
            /// Room of the message last sent: tonic has encoded it once it asks for the next.
            held: Option<Held>,
        }
        let reading = Reading {
            iter,
            sent_any: false,
            done: false,
            held: None,
        };
        let stream = futures_util::stream::unfold(reading, move |mut r| {
            let state = state.clone();
            let budget = budget.clone();
            async move {
                r.held = None;
                if r.done {
                    return None;
                }
                let mut held = match budget.reserve(MESSAGE_BYTES_MAX).await {
                    Ok(held) => held,
                    Err(e) => {
                        r.done = true;
                        return Some((Err(exhausted(e)), r));
                    }
                };
                let mut events = Vec::with_capacity(batch.min(1024));
                let mut bytes = 0usize;
                while events.len() < batch && bytes < MESSAGE_BYTES_MAX {
                    match r.iter.next() {
                        Some(Ok(event)) => {
                            bytes += event.stored_bytes() + EVENT_OVERHEAD;
                            events.push(to_sequenced(&event));
                        }
                        Some(Err(e)) => {
                            r.done = true;
                            return Some((Err(read_status(&e)), r));
                        }
                        None => {
                            r.done = true;
                            break;
                        }
                    }
                }
                if events.is_empty() && r.sent_any {
                    return None;
                }
                if let Err(e) = held.fit(bytes).await {
                    r.done = true;
                    return Some((Err(exhausted(e)), r));
                }
                r.held = Some(held);
                r.sent_any = true;
                state.metrics.events_read(events.len() as u64);
                let batch_head = if limited {
                    events.last().map(|e| e.position)
                } else {
                    head
                };
                Some((
                    Ok(v1::ReadResponse {
                        events,
                        head: batch_head,
                    }),
                    r,
                ))
            }
        });
        Ok(Box::pin(stream))
    }

    fn subscribe_stream(
        &self,
        request: v1::SubscribeRequest,
        budget: StreamBudget,
    ) -> Result<BoxStream<v1::SubscribeResponse>, Status> {
        let limits = &self.state.config.limits;
        if self.state.metrics.subscribers() >= limits.subscribers_max as i64 {
            return Err(status(
                Code::Unavailable,
                ErrorType::Io,
                format!(
                    "the server already serves {} subscriptions (the limit)",
                    limits.subscribers_max
                ),
            ));
        }
        let batch = request
            .batch_size
            .unwrap_or(BATCH_DEFAULT)
            .clamp(1, BATCH_MAX) as usize;
        let subscription = self
            .state
            .store
            .subscribe(&to_query(request.query), request.after.unwrap_or(0))
            .map_err(|e| read_status(&e))?;
        struct Following {
            subscription: annals::Subscription,
            position: Arc<std::sync::atomic::AtomicU64>,
            shutdown: tokio::sync::watch::Receiver<bool>,
            state: Arc<AppState>,
            _gauge: crate::metrics::Gauge,
            budget: StreamBudget,
            /// Room of the message last sent: tonic has encoded it once it asks for the next.
            held: Option<Held>,
            done: bool,
        }
        let following = Following {
            position: self.state.metrics.follower(subscription.position()),
            subscription,
            shutdown: self.state.shutdown.clone(),
            state: self.state.clone(),
            _gauge: self.state.metrics.subscriber(),
            budget,
            held: None,
            done: false,
        };
        let stream = futures_util::stream::unfold(following, move |mut f| async move {
            f.held = None;
            loop {
                if f.done || *f.shutdown.borrow() {
                    return None;
                }
                // Wait for new events, reserve room, then read them.
                let ready = tokio::select! {
                    ready = f.subscription.ready() => ready,
                    _ = f.shutdown.changed() => return None,
                };
                match ready {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(e) => {
                        f.done = true;
                        return Some((Err(read_status(&e)), f));
                    }
                }
                let mut held = match f.budget.reserve(MESSAGE_BYTES_MAX).await {
                    Ok(held) => held,
                    Err(e) => {
                        f.done = true;
                        return Some((Err(exhausted(e)), f));
                    }
                };
                let mut events = Vec::new();
                if let Err(e) =
                    f.subscription
                        .try_next_batch_bytes(batch, MESSAGE_BYTES_MAX / 2, &mut events)
                {
                    f.done = true;
                    return Some((Err(read_status(&e)), f));
                }
                f.position.store(
                    f.subscription.position(),
                    std::sync::atomic::Ordering::Relaxed,
                );
                if events.is_empty() {
                    continue; // the new events do not match
                }
                f.state.metrics.events_read(events.len() as u64);
                let bytes = events
                    .iter()
                    .map(|e| e.stored_bytes() + EVENT_OVERHEAD)
                    .sum();
                if let Err(e) = held.fit(bytes).await {
                    f.done = true;
                    return Some((Err(exhausted(e)), f));
                }
                f.held = Some(held);
                let events = events.iter().map(to_sequenced).collect();
                return Some((Ok(v1::SubscribeResponse { events }), f));
            }
        });
        Ok(Box::pin(stream))
    }

    async fn append_inner(
        &self,
        request: v1::AppendRequest,
        trace: Option<crate::telemetry::TraceContext>,
    ) -> Result<u64, Status> {
        let mut events = request
            .events
            .into_iter()
            .enumerate()
            .map(|(i, e)| to_new_event(i, e))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(trace) = &trace {
            trace.stamp(&mut events);
        }
        let condition = request.condition.map(|c| AppendCondition {
            fail_if_events_match: to_query(c.fail_if_events_match),
            after: c.after,
        });
        let options = annals::AppendOptions {
            tracking: request
                .tracking_info
                .map(|t| annals::Tracking::new(t.source, t.position)),
            ..annals::AppendOptions::default()
        };
        match self
            .state
            .append(&events, condition.as_ref(), options)
            .await
        {
            Ok(position) => Ok(position),
            Err(e) => Err(append_status(&e)),
        }
    }
}

#[tonic::async_trait]
impl Dcb for Service {
    type ReadStream = BoxStream<v1::ReadResponse>;
    type SubscribeStream = BoxStream<v1::SubscribeResponse>;

    async fn read(
        &self,
        request: Request<v1::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        let started = Instant::now();
        let result = self
            .authorize(request.metadata(), Scopes::READ)
            .and_then(|()| {
                let budget = StreamBudget::of(&self.state, request.extensions().get());
                self.read_stream(request.into_inner(), budget)
            });
        self.record(Op::Read, started, &result);
        result.map(Response::new)
    }

    async fn subscribe(
        &self,
        request: Request<v1::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let started = Instant::now();
        let result = self
            .authorize(request.metadata(), Scopes::READ)
            .and_then(|()| {
                let budget = StreamBudget::of(&self.state, request.extensions().get());
                self.subscribe_stream(request.into_inner(), budget)
            });
        self.record(Op::Subscribe, started, &result);
        result.map(Response::new)
    }

    // The unary calls are answered by `unary_routes` before tonic sees them, unless a request
    // is compressed; these serve those, through the same functions.
    async fn append(
        &self,
        request: Request<v1::AppendRequest>,
    ) -> Result<Response<v1::AppendResponse>, Status> {
        let started = Instant::now();
        let (metadata, _, message) = request.into_parts();
        let result = self.append_call(&metadata, message).await;
        self.record(Op::Append, started, &result);
        result.map(Response::new)
    }

    async fn head(
        &self,
        request: Request<v1::HeadRequest>,
    ) -> Result<Response<v1::HeadResponse>, Status> {
        let started = Instant::now();
        let result = self.head_call(request.metadata());
        self.record(Op::Head, started, &result);
        result.map(Response::new)
    }

    async fn get_tracking_info(
        &self,
        request: Request<v1::TrackingRequest>,
    ) -> Result<Response<v1::TrackingResponse>, Status> {
        let started = Instant::now();
        let result = self.tracking_call(request.metadata(), request.get_ref());
        self.record(Op::Tracking, started, &result);
        result.map(Response::new)
    }
}

impl Service {
    async fn append_call(
        &self,
        metadata: &MetadataMap,
        request: v1::AppendRequest,
    ) -> Result<v1::AppendResponse, Status> {
        self.authorize(metadata, Scopes::APPEND)?;
        let trace = match self.state.config.telemetry.store_trace_context {
            Some(true) => crate::telemetry::TraceContext::of(&metadata.clone().into_headers()),
            _ => None,
        };
        let position = self.append_inner(request, trace).await?;
        Ok(v1::AppendResponse { position })
    }

    fn head_call(&self, metadata: &MetadataMap) -> Result<v1::HeadResponse, Status> {
        self.authorize(metadata, Scopes::READ)?;
        let head = self.state.store.head();
        Ok(v1::HeadResponse {
            position: Some(head).filter(|&h| h > 0),
        })
    }

    fn tracking_call(
        &self,
        metadata: &MetadataMap,
        request: &v1::TrackingRequest,
    ) -> Result<v1::TrackingResponse, Status> {
        self.authorize(metadata, Scopes::READ)?;
        Ok(v1::TrackingResponse {
            position: self.state.store.tracking(&request.source),
        })
    }
}

/// The unary calls (Append, Head, GetTrackingInfo, under both service names) answered without
/// tonic's codec and routing layers: the one request message is decoded straight from the body
/// and the answer goes out as one frame and the status trailers. Per call, tonic sets up a
/// streaming decoder and an encoder (an 8 KiB buffer each) and routes twice; on the append
/// path that was most of what made a gRPC call cost the server more than an HTTP one. Codes,
/// messages, limits and metrics are tonic's. A compressed request (`grpc-encoding`) is handed
/// to tonic, which answers it.
fn unary_routes(service: Arc<Service>, dcb: DcbServer<Service>) -> axum::Router {
    let mut router = axum::Router::new();
    for name in SERVICE_NAMES.iter().filter(|n| !n.is_empty()) {
        let route = |method: &str| (format!("/{name}/{method}"), service.clone(), dcb.clone());
        router = unary_route(
            router,
            route("Append"),
            Op::Append,
            |s, metadata, message| async move { s.append_call(&metadata, message).await },
        );
        router = unary_route(
            router,
            route("Head"),
            Op::Head,
            |s, metadata, _: v1::HeadRequest| std::future::ready(s.head_call(&metadata)),
        );
        router = unary_route(
            router,
            route("GetTrackingInfo"),
            Op::Tracking,
            |s, metadata, message| std::future::ready(s.tracking_call(&metadata, &message)),
        );
    }
    router
}

/// Adds the route `path` answered by [`unary`] with `call`.
fn unary_route<M, R, F, Fut>(
    router: axum::Router,
    (path, service, dcb): (String, Arc<Service>, DcbServer<Service>),
    op: Op,
    call: F,
) -> axum::Router
where
    M: Message + Default + Send + 'static,
    R: Message + 'static,
    F: FnOnce(Arc<Service>, MetadataMap, M) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<R, Status>> + Send + 'static,
{
    router.route(
        &path,
        axum::routing::post(move |request: axum::extract::Request| {
            unary(service, dcb, request, op, call)
        }),
    )
}

/// One unary call: decode, `call`, record, answer.
async fn unary<M, R, F, Fut>(
    service: Arc<Service>,
    dcb: DcbServer<Service>,
    request: axum::extract::Request,
    op: Op,
    call: F,
) -> axum::response::Response
where
    M: Message + Default,
    R: Message,
    F: FnOnce(Arc<Service>, MetadataMap, M) -> Fut,
    Fut: std::future::Future<Output = Result<R, Status>>,
{
    let compressed = request
        .headers()
        .get("grpc-encoding")
        .is_some_and(|e| e.as_bytes() != b"identity");
    if compressed {
        let mut request = request;
        rewrite_legacy_path(&mut request);
        return match tower::ServiceExt::oneshot(dcb, request).await {
            Ok(response) => response.map(axum::body::Body::new),
            Err(never) => match never {},
        };
    }
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let metadata = MetadataMap::from_headers(parts.headers);
    let limit = service.state.config.limits.body_bytes_max;
    let result = match unary_message::<M>(body, limit).await {
        Ok(message) => call(service.clone(), metadata, message).await,
        Err(e) => Err(e),
    };
    service.record(op, started, &result);
    match result {
        Ok(answer) => {
            let len = answer.encoded_len();
            let mut frame = bytes::BytesMut::with_capacity(5 + len);
            frame.extend_from_slice(&[0]);
            frame.extend_from_slice(&(len as u32).to_be_bytes());
            answer
                .encode(&mut frame)
                .expect("a buffer with room for the message");
            let mut trailers = http::HeaderMap::new();
            trailers.insert(Status::GRPC_STATUS, http::HeaderValue::from_static("0"));
            let frames = [
                Ok::<_, std::convert::Infallible>(http_body::Frame::data(frame.freeze())),
                Ok(http_body::Frame::trailers(trailers)),
            ];
            let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
            let mut response = http::Response::new(axum::body::Body::new(body));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            response
        }
        Err(status) => status.into_http(),
    }
}

/// The one message of a unary request's body (gRPC framing: a compressed flag, a big-endian
/// length, the message), with tonic's codes and messages for what can go wrong.
async fn unary_message<M: Message + Default>(
    mut body: axum::body::Body,
    limit: usize,
) -> Result<M, Status> {
    use http_body_util::BodyExt;
    let mut buffer = bytes::BytesMut::new();
    let mut length: Option<usize> = None;
    loop {
        if length.is_none() && buffer.len() >= 5 {
            match buffer[0] {
                0 => {}
                1 => {
                    return Err(Status::internal(
                        "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                    ))
                }
                f => {
                    return Err(Status::internal(format!(
                        "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
                    )))
                }
            }
            let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
            if len > limit {
                return Err(Status::out_of_range(format!(
                    "Error, decoded message length too large: found {len} bytes, the limit is: {limit} bytes"
                )));
            }
            length = Some(len);
        }
        if let Some(len) = length {
            if buffer.len() >= 5 + len {
                let message =
                    M::decode(&buffer[5..5 + len]).map_err(|e| Status::internal(e.to_string()))?;
                // Read the body to its end, as tonic does: answering a stream whose request is
                // still open makes HTTP/2 reset it, and the client's end-of-stream then arrives
                // on a reset stream, which hyper counts against the connection as an error
                // reset (and sends GOAWAY after too many).
                let mut extra = buffer.len() - (5 + len);
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(|e| Status::from_error(e.into()))?;
                    if let Ok(data) = frame.into_data() {
                        extra += data.len();
                        if extra > limit {
                            return Err(Status::out_of_range(
                                "the request body goes on past its one message",
                            ));
                        }
                    }
                }
                return Ok(message);
            }
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buffer.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => return Err(Status::from_error(e.into())),
            None if buffer.is_empty() => return Err(Status::internal("Missing request message.")),
            None => return Err(Status::internal("Unexpected EOF decoding stream.")),
        }
    }
}

/// The DCB service under its legacy name, `umadb.UmaDBService`: paths are rewritten to
/// `umadb.v1.DCB` and handled by the same service.
#[derive(Clone)]
struct Legacy(DcbServer<Service>);

impl tonic::server::NamedService for Legacy {
    const NAME: &'static str = "umadb.UmaDBService";
}

impl tower::Service<http::Request<tonic::body::Body>> for Legacy {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = <DcbServer<Service> as tower::Service<http::Request<tonic::body::Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        <DcbServer<Service> as tower::Service<http::Request<tonic::body::Body>>>::poll_ready(
            &mut self.0,
            cx,
        )
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        rewrite_legacy_path(&mut request);
        tower::Service::call(&mut self.0, request)
    }
}

/// Rewrites a path under the legacy service name to `umadb.v1.DCB`.
fn rewrite_legacy_path<B>(request: &mut http::Request<B>) {
    let path = request.uri().path();
    if let Some(method) = path.strip_prefix("/umadb.UmaDBService/") {
        let rewritten = format!("/umadb.v1.DCB/{method}");
        let mut parts = request.uri().clone().into_parts();
        if let Ok(pq) = rewritten.parse() {
            parts.path_and_query = Some(pq);
            if let Ok(uri) = http::Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
    }
}
