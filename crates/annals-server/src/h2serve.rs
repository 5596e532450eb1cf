//! The gRPC listener's own HTTP/2 server connection (RFC 9113): one task per connection reads
//! frames in place, hands each request to the same axum router as hyper would (tonic's
//! services and our unary routes, so routing, auth and every answer are unchanged), and writes
//! the answers' frames out, a round of them in one write.
//!
//! Why not hyper: a gRPC client with one call at a time on its own connection paid about a
//! third more server CPU per call through hyper's HTTP/2 server than an HTTP/1.1 request did
//! (its connection task, stream store, per-stream executor hand-offs and frame queues are
//! built for many concurrent streams with priorities). This connection keeps only what a gRPC
//! server needs: request headers decoded with HPACK (`loona-hpack`), answers' headers written
//! as literals its decoder does not index, flow control both ways, answers' bodies pumped as
//! far as the windows allow and parked until the client widens them, CONTINUATION, PING,
//! RST_STREAM, GOAWAY (sent on shutdown, honoured when received), a keep-alive ping for idle
//! connections and a deadline for request bodies.
//!
//! A request's body is gathered until the client ends its side, then the request is
//! dispatched with it whole: every method of the DCB and health services takes one message.
//! A body larger than the message limit is dispatched as soon as it passes the limit, cut
//! there (the handler answers from the length prefix that the message is too large, as it
//! would have through hyper), and the rest is discarded.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::{AbortHandle, Abortable, Aborted};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::h2wire::*;

/// Streams one connection may have open at once (advertised in SETTINGS).
const MAX_STREAMS: usize = 256;
/// The window each stream and the connection get from us: large, as gRPC clients use, so that
/// requests never wait for WINDOW_UPDATE frames.
const STREAM_WINDOW: u32 = 4 << 20;
/// The connection's window: at least this, and twice the largest request body. The bytes of
/// bodies still arriving are handed back only once their request is dispatched, so that a
/// connection holds at most its window in bodies however many streams it opens.
const CONNECTION_WINDOW: u32 = 8 << 20;
/// The largest header list a request may have (advertised), and the most a header block may
/// take on the wire across its CONTINUATION frames.
const HEADER_LIST_MAX: usize = 64 << 10;
const HEADER_BLOCK_MAX: usize = 2 * HEADER_LIST_MAX;
/// How often a connection looks at its clocks, after how long without a byte from the client
/// it sends a PING, and how long the answer may take before the connection is dropped.
const TICK: Duration = Duration::from_secs(1);
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// What a connection needs from the server's configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// The largest request message (the handlers check it; bodies are cut a little past it).
    pub body_bytes_max: usize,
    /// How long the client may take to send the connection preface.
    pub preface_timeout: Duration,
    /// How long a request's body may take to arrive whole.
    pub body_timeout: Duration,
}

/// Serves one HTTP/2 connection on `io` until the client closes it, a protocol error ends it,
/// or `shutdown` turns true and the streams then open have finished.
pub(crate) async fn serve<I>(
    mut io: I,
    router: axum::Router,
    settings: Settings,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let mut input = BytesMut::with_capacity(16 << 10);
    let preface = async {
        while input.len() < PREFACE.len() {
            if io.read_buf(&mut input).await.ok()? == 0 {
                return None;
            }
        }
        (&input[..PREFACE.len()] == PREFACE).then_some(())
    };
    if !matches!(
        tokio::time::timeout(settings.preface_timeout, preface).await,
        Ok(Some(()))
    ) {
        return;
    }
    input.advance(PREFACE.len());
    let mut connection = Connection::new(router, settings);
    connection.start();
    connection.on_input(&mut input);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if !connection.out.is_empty() {
            if io.write_all(&connection.out).await.is_err() || io.flush().await.is_err() {
                return;
            }
            connection.out.clear();
            if connection.out.capacity() > 4 << 20 {
                connection.out = Vec::with_capacity(64 << 10);
            }
        }
        if connection.closed || connection.finished() {
            let _ = io.shutdown().await;
            return;
        }
        if input.capacity() - input.len() < 4 << 10 {
            input.reserve(16 << 10);
        }
        tokio::select! {
            biased;
            Some(event) = connection.work.next(), if !connection.work.is_empty() => {
                connection.on_event(event);
                // Whatever else is ready goes out in the same write.
                while let Some(Some(event)) = connection.work.next().now_or_never() {
                    connection.on_event(event);
                }
            }
            read = io.read_buf(&mut input) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    connection.heard = true;
                    connection.on_input(&mut input);
                }
            },
            _ = shutdown.changed(), if !connection.goaway_sent => connection.go_away(),
            _ = tick.tick() => connection.on_tick(),
        }
    }
}

type Boxed = Pin<Box<dyn Future<Output = Event> + Send>>;

/// What the work of a stream yields: the handler's answer, or the next frame of its body.
enum Event {
    Answer(u32, http::Response<Body>),
    Frame(
        u32,
        Option<Result<http_body::Frame<Bytes>, axum::Error>>,
        Body,
    ),
}

/// The request side of a stream. (Held in the stream map, not moved about: boxing the large
/// variant would cost an allocation per request for nothing.)
#[allow(clippy::large_enum_variant)]
enum Receiving {
    /// Headers received; the body is being gathered.
    Open {
        request: http::Request<()>,
        body: BytesMut,
        since: Instant,
    },
    /// Dispatched before the client ended its side (the body passed the limit): what else
    /// comes is dropped.
    Discarding,
    /// The client has ended its side.
    Done,
}

struct Stream {
    receiving: Receiving,
    /// What the client still lets us send on this stream, and what it has sent us that we have
    /// not handed back.
    send_window: i64,
    recv_window: i64,
    recv_unacked: u32,
    /// Bytes of this stream's body, still being gathered, not yet handed back on the
    /// connection.
    held: u32,
    /// Stops the handler or the body pump when the stream goes away.
    abort: Option<AbortHandle>,
    /// Data that did not fit the windows, and the body to go on with once it has gone out.
    parked: Option<(Bytes, Body)>,
}

/// A header block still arriving in CONTINUATION frames.
struct HeaderBlock {
    stream_id: u32,
    end_stream: bool,
    block: Vec<u8>,
}

struct Connection {
    router: axum::Router,
    settings: Settings,
    /// Frames to write, in order.
    out: Vec<u8>,
    /// A scratch buffer for encoding header blocks.
    block: Vec<u8>,
    decoder: loona_hpack::Decoder<'static>,
    streams: HashMap<u32, Stream>,
    work: FuturesUnordered<Abortable<Boxed>>,
    /// Streams with parked data, in the order they parked.
    blocked: Vec<u32>,
    last_stream_id: u32,
    /// The connection's window for sending, and the client's settings.
    send_window: i64,
    peer_initial_window: i64,
    peer_max_frame: usize,
    /// What the client may still send on the connection, and what we have not handed back.
    recv_window: i64,
    recv_unacked: u32,
    /// The window we give the connection.
    connection_window: u32,
    headers_in: Option<HeaderBlock>,
    /// We sent GOAWAY (no new streams); the client did; a connection error ended it.
    goaway_sent: bool,
    peer_gone: bool,
    closed: bool,
    /// Whether anything arrived since the last tick; when we last heard from the client; the
    /// keep-alive PING in flight.
    heard: bool,
    last_heard: Instant,
    ping_sent: Option<Instant>,
}

impl Connection {
    fn new(router: axum::Router, settings: Settings) -> Self {
        Connection {
            router,
            settings,
            out: Vec::with_capacity(16 << 10),
            block: Vec::with_capacity(256),
            decoder: loona_hpack::Decoder::new(),
            streams: HashMap::new(),
            work: FuturesUnordered::new(),
            blocked: Vec::new(),
            last_stream_id: 0,
            send_window: DEFAULT_WINDOW,
            peer_initial_window: DEFAULT_WINDOW,
            peer_max_frame: DEFAULT_MAX_FRAME,
            recv_window: DEFAULT_WINDOW,
            recv_unacked: 0,
            connection_window: settings
                .body_bytes_max
                .saturating_add(5)
                .saturating_mul(2)
                .clamp(CONNECTION_WINDOW as usize, MAX_WINDOW as usize)
                as u32,
            headers_in: None,
            goaway_sent: false,
            peer_gone: false,
            closed: false,
            heard: false,
            last_heard: Instant::now(),
            ping_sent: None,
        }
    }

    /// Our settings and the connection's larger window.
    fn start(&mut self) {
        settings(
            &mut self.out,
            &[
                (SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS as u32),
                (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (SETTINGS_MAX_HEADER_LIST_SIZE, HEADER_LIST_MAX as u32),
                (SETTINGS_ENABLE_PUSH, 0),
            ],
        );
        let more = self.connection_window - DEFAULT_WINDOW as u32;
        window_update(&mut self.out, 0, more);
        self.recv_window += i64::from(more);
    }

    /// Done once nothing more will come: GOAWAY went one way or the other and every stream
    /// has finished.
    fn finished(&self) -> bool {
        (self.goaway_sent || self.peer_gone) && self.streams.is_empty()
    }

    /// Handles every whole frame at the front of `input`, and drops them from it.
    fn on_input(&mut self, input: &mut BytesMut) {
        let mut at = 0;
        while !self.closed {
            match next_frame(&input[at..], DEFAULT_MAX_FRAME) {
                Err(_) => self.fail(FRAME_SIZE_ERROR),
                Ok(None) => break,
                Ok(Some(frame)) => {
                    at += frame.wire_len();
                    self.on_frame(frame);
                }
            }
        }
        input.advance(at.min(input.len()));
    }

    fn on_frame(&mut self, frame: Frame<'_>) {
        if let Some(pending) = &self.headers_in {
            if frame.kind != CONTINUATION || frame.stream_id != pending.stream_id {
                return self.fail(PROTOCOL_ERROR);
            }
        }
        match frame.kind {
            DATA => self.on_data(frame),
            HEADERS => self.on_headers(frame),
            CONTINUATION => self.on_continuation(frame),
            RST_STREAM => {
                if frame.stream_id == 0 {
                    return self.fail(PROTOCOL_ERROR);
                }
                if frame.payload.len() != 4 {
                    return self.fail(FRAME_SIZE_ERROR);
                }
                if frame.stream_id > self.last_stream_id {
                    return self.fail(PROTOCOL_ERROR);
                }
                self.forget(frame.stream_id);
            }
            SETTINGS => self.on_settings(frame),
            PUSH_PROMISE => self.fail(PROTOCOL_ERROR),
            PING => {
                if frame.stream_id != 0 {
                    return self.fail(PROTOCOL_ERROR);
                }
                if frame.payload.len() != 8 {
                    return self.fail(FRAME_SIZE_ERROR);
                }
                if frame.flags & ACK == 0 {
                    frame_head(&mut self.out, 8, PING, ACK, 0);
                    self.out.extend_from_slice(frame.payload);
                } else {
                    self.ping_sent = None;
                }
            }
            GOAWAY => self.peer_gone = true,
            WINDOW_UPDATE => self.on_window_update(frame),
            // PRIORITY is advice this server does not take; unknown types are to be ignored.
            _ => {}
        }
    }

    fn on_headers(&mut self, frame: Frame<'_>) {
        if frame.stream_id == 0 {
            return self.fail(PROTOCOL_ERROR);
        }
        let Some(mut block) = unpadded(frame.flags, frame.payload) else {
            return self.fail(PROTOCOL_ERROR);
        };
        if frame.flags & PRIORITY != 0 {
            let Some(rest) = block.get(5..) else {
                return self.fail(FRAME_SIZE_ERROR);
            };
            block = rest;
        }
        let end_stream = frame.flags & END_STREAM != 0;
        if frame.flags & END_HEADERS == 0 {
            self.headers_in = Some(HeaderBlock {
                stream_id: frame.stream_id,
                end_stream,
                block: block.to_vec(),
            });
            return;
        }
        self.on_header_block(frame.stream_id, end_stream, block);
    }

    fn on_continuation(&mut self, frame: Frame<'_>) {
        let Some(pending) = &mut self.headers_in else {
            return self.fail(PROTOCOL_ERROR);
        };
        pending.block.extend_from_slice(frame.payload);
        if pending.block.len() > HEADER_BLOCK_MAX {
            return self.fail(ENHANCE_YOUR_CALM);
        }
        if frame.flags & END_HEADERS != 0 {
            let pending = self.headers_in.take().expect("checked above");
            self.on_header_block(pending.stream_id, pending.end_stream, &pending.block);
        }
    }

    fn on_header_block(&mut self, id: u32, end_stream: bool, block: &[u8]) {
        // Decoded whatever becomes of the stream: the decoder's table must follow the client's.
        let Ok(request) = self.decode(block) else {
            return self.fail(COMPRESSION_ERROR);
        };
        if let Some(stream) = self.streams.get_mut(&id) {
            // Trailers of a request: they end its body.
            let open = matches!(stream.receiving, Receiving::Open { .. });
            let discarding = matches!(stream.receiving, Receiving::Discarding);
            if !end_stream || !(open || discarding) {
                self.reset(id, PROTOCOL_ERROR);
            } else if open {
                self.end_request(id);
            } else {
                stream.receiving = Receiving::Done;
            }
            return;
        }
        if id.is_multiple_of(2) || id <= self.last_stream_id {
            return self.fail(PROTOCOL_ERROR);
        }
        self.last_stream_id = id;
        if self.goaway_sent || self.peer_gone || self.streams.len() >= MAX_STREAMS {
            rst_stream(&mut self.out, id, REFUSED_STREAM);
            return;
        }
        let Some(request) = request else {
            rst_stream(&mut self.out, id, PROTOCOL_ERROR);
            return;
        };
        self.streams.insert(
            id,
            Stream {
                receiving: Receiving::Open {
                    request,
                    body: BytesMut::new(),
                    since: Instant::now(),
                },
                send_window: self.peer_initial_window,
                recv_window: i64::from(STREAM_WINDOW),
                recv_unacked: 0,
                held: 0,
                abort: None,
                parked: None,
            },
        );
        if end_stream {
            self.end_request(id);
        }
    }

    /// A request from a header block: `Err` when HPACK cannot decode it (a connection error),
    /// `Ok(None)` when it decodes to a malformed request (a stream error).
    fn decode(&mut self, block: &[u8]) -> Result<Option<http::Request<()>>, ()> {
        let mut request = http::Request::new(());
        *request.version_mut() = http::Version::HTTP_2;
        let (mut method, mut scheme, mut authority, mut path) = (None, None, None, None);
        let mut malformed = false;
        let mut regular = false;
        let mut size = 0;
        let headers = request.headers_mut();
        self.decoder
            .decode_with_cb(block, |name, value| {
                size += name.len() + value.len() + 32;
                if malformed || size > HEADER_LIST_MAX {
                    malformed = true;
                    return;
                }
                if let Some(pseudo) = name.strip_prefix(b":") {
                    let slot = match pseudo {
                        b"method" => &mut method,
                        b"scheme" => &mut scheme,
                        b"authority" => &mut authority,
                        b"path" => &mut path,
                        _ => {
                            malformed = true;
                            return;
                        }
                    };
                    malformed |= regular || slot.is_some();
                    *slot = Some(Bytes::copy_from_slice(&value));
                    return;
                }
                regular = true;
                let connection_specific = matches!(
                    &*name,
                    b"connection"
                        | b"keep-alive"
                        | b"proxy-connection"
                        | b"transfer-encoding"
                        | b"upgrade"
                ) || (&*name == b"te" && &*value != b"trailers");
                if connection_specific || name.iter().any(u8::is_ascii_uppercase) {
                    malformed = true;
                    return;
                }
                match (
                    http::HeaderName::from_bytes(&name),
                    http::HeaderValue::from_bytes(&value),
                ) {
                    (Ok(name), Ok(value)) => {
                        headers.append(name, value);
                    }
                    _ => malformed = true,
                }
            })
            .map_err(|_| ())?;
        let (Some(method), Some(scheme), Some(path), false) = (method, scheme, path, malformed)
        else {
            return Ok(None);
        };
        let Ok(method) = http::Method::from_bytes(&method) else {
            return Ok(None);
        };
        let mut uri = http::uri::Parts::default();
        uri.path_and_query = http::uri::PathAndQuery::from_maybe_shared(path).ok();
        if let Some(authority) = authority {
            uri.scheme = http::uri::Scheme::try_from(&scheme[..]).ok();
            uri.authority = http::uri::Authority::from_maybe_shared(authority).ok();
        }
        let Ok(uri) = http::Uri::from_parts(uri) else {
            return Ok(None);
        };
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        Ok(Some(request))
    }

    fn on_data(&mut self, frame: Frame<'_>) {
        let id = frame.stream_id;
        if id == 0 {
            return self.fail(PROTOCOL_ERROR);
        }
        let len = frame.payload.len() as u32;
        self.recv_window -= i64::from(len);
        if self.recv_window < 0 {
            return self.fail(FLOW_CONTROL_ERROR);
        }
        match self.streams.get_mut(&id) {
            Some(stream) if matches!(stream.receiving, Receiving::Open { .. }) => {
                stream.held += len
            }
            _ => self.release(len),
        }
        let Some(data) = unpadded(frame.flags, frame.payload) else {
            return self.fail(PROTOCOL_ERROR);
        };
        let end_stream = frame.flags & END_STREAM != 0;
        let cap = self.settings.body_bytes_max.saturating_add(5);
        let Some(stream) = self.streams.get_mut(&id) else {
            if id > self.last_stream_id {
                return self.fail(PROTOCOL_ERROR);
            }
            rst_stream(&mut self.out, id, STREAM_CLOSED);
            return;
        };
        stream.recv_window -= i64::from(len);
        if stream.recv_window < 0 {
            return self.reset(id, FLOW_CONTROL_ERROR);
        }
        let over = match &mut stream.receiving {
            Receiving::Open { body, .. } => {
                let room = cap - body.len().min(cap);
                body.extend_from_slice(&data[..data.len().min(room)]);
                data.len() > room
            }
            Receiving::Discarding => {
                if end_stream {
                    stream.receiving = Receiving::Done;
                }
                // Handed back below, so that the client can finish and read the answer.
                false
            }
            Receiving::Done => return self.reset(id, STREAM_CLOSED),
        };
        if over || (end_stream && matches!(stream.receiving, Receiving::Open { .. })) {
            self.end_request(id);
            if !over {
                return;
            }
            let Some(stream) = self.streams.get_mut(&id) else {
                return;
            };
            if !end_stream {
                stream.receiving = Receiving::Discarding;
            }
        }
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.recv_unacked += len;
        if stream.recv_unacked >= STREAM_WINDOW / 2 {
            window_update(&mut self.out, id, stream.recv_unacked);
            stream.recv_window += i64::from(stream.recv_unacked);
            stream.recv_unacked = 0;
        }
    }

    fn on_settings(&mut self, frame: Frame<'_>) {
        if frame.stream_id != 0 {
            return self.fail(PROTOCOL_ERROR);
        }
        if frame.flags & ACK != 0 {
            if !frame.payload.is_empty() {
                self.fail(FRAME_SIZE_ERROR);
            }
            return;
        }
        if !frame.payload.len().is_multiple_of(6) {
            return self.fail(FRAME_SIZE_ERROR);
        }
        for setting in frame.payload.chunks_exact(6) {
            let id = u16::from_be_bytes([setting[0], setting[1]]);
            let value = be_u32(&setting[2..]).expect("four bytes");
            match id {
                SETTINGS_INITIAL_WINDOW_SIZE => {
                    let value = i64::from(value);
                    if value > MAX_WINDOW {
                        return self.fail(FLOW_CONTROL_ERROR);
                    }
                    let delta = value - self.peer_initial_window;
                    self.peer_initial_window = value;
                    for stream in self.streams.values_mut() {
                        stream.send_window += delta;
                        if stream.send_window > MAX_WINDOW {
                            return self.fail(FLOW_CONTROL_ERROR);
                        }
                    }
                }
                SETTINGS_MAX_FRAME_SIZE => {
                    let value = value as usize;
                    if !(DEFAULT_MAX_FRAME..=MAX_FRAME_LIMIT).contains(&value) {
                        return self.fail(PROTOCOL_ERROR);
                    }
                    self.peer_max_frame = value;
                }
                SETTINGS_ENABLE_PUSH if value > 1 => return self.fail(PROTOCOL_ERROR),
                // This server indexes nothing in its answers' header blocks, so the client's
                // table size does not concern it; the rest do not apply to a server.
                _ => {}
            }
        }
        frame_head(&mut self.out, 0, SETTINGS, ACK, 0);
        self.resume();
    }

    fn on_window_update(&mut self, frame: Frame<'_>) {
        let Some(increment) = be_u32(frame.payload).filter(|_| frame.payload.len() == 4) else {
            return self.fail(FRAME_SIZE_ERROR);
        };
        let increment = i64::from(increment & LAST_STREAM_ID);
        let id = frame.stream_id;
        if id == 0 {
            if increment == 0 {
                return self.fail(PROTOCOL_ERROR);
            }
            self.send_window += increment;
            if self.send_window > MAX_WINDOW {
                return self.fail(FLOW_CONTROL_ERROR);
            }
        } else if let Some(stream) = self.streams.get_mut(&id) {
            stream.send_window += increment;
            if increment == 0 {
                return self.reset(id, PROTOCOL_ERROR);
            }
            if stream.send_window > MAX_WINDOW {
                return self.reset(id, FLOW_CONTROL_ERROR);
            }
        }
        self.resume();
    }

    /// Hands `n` bytes back to the client on the connection (in one WINDOW_UPDATE once half
    /// the window has come back).
    fn release(&mut self, n: u32) {
        self.recv_unacked += n;
        if self.recv_unacked >= self.connection_window / 2 {
            window_update(&mut self.out, 0, self.recv_unacked);
            self.recv_window += i64::from(self.recv_unacked);
            self.recv_unacked = 0;
        }
    }

    /// The client has sent the whole request (or as much of its body as is read): hands it to
    /// the router.
    fn end_request(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let Receiving::Open { request, body, .. } =
            std::mem::replace(&mut stream.receiving, Receiving::Done)
        else {
            return;
        };
        let held = std::mem::take(&mut stream.held);
        self.release(held);
        let request = request.map(|()| Body::from(body.freeze()));
        let answer = tower::ServiceExt::oneshot(self.router.clone(), request);
        let work: Boxed = Box::pin(async move {
            match answer.await {
                Ok(response) => Event::Answer(id, response),
                Err(never) => match never {},
            }
        });
        self.push(id, work);
    }

    /// Runs `work` for stream `id`, to be stopped if the stream goes away.
    fn push(&mut self, id: u32, work: Boxed) {
        let (handle, registration) = AbortHandle::new_pair();
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.abort = Some(handle);
        }
        self.work.push(Abortable::new(work, registration));
    }

    fn on_event(&mut self, event: Result<Event, Aborted>) {
        match event {
            Err(Aborted) => {}
            Ok(Event::Answer(id, response)) => self.answer(id, response),
            Ok(Event::Frame(id, frame, body)) => {
                if self.streams.contains_key(&id) {
                    if let Some(body) = self.on_body_frame(id, frame, body) {
                        self.pump(id, body);
                    }
                }
            }
        }
    }

    /// Writes the answer's headers and as much of its body as is ready and the windows allow.
    fn answer(&mut self, id: u32, response: http::Response<Body>) {
        if !self.streams.contains_key(&id) {
            return;
        }
        let (parts, body) = response.into_parts();
        let end_stream = body.is_end_stream();
        self.block.clear();
        if parts.status == http::StatusCode::OK {
            // `:status 200` is entry 8 of the static table.
            integer(&mut self.block, 7, 0x80, 8);
        } else {
            literal(
                &mut self.block,
                0x00,
                8,
                b"",
                parts.status.as_str().as_bytes(),
            );
        }
        encode_fields(&mut self.block, &parts.headers);
        self.header_frames(id, end_stream);
        if end_stream {
            self.finish(id);
        } else {
            self.pump(id, body);
        }
    }

    /// Sends the body's frames while they are ready; when one is not, waits for it as work.
    fn pump(&mut self, id: u32, mut body: Body) {
        loop {
            let Some(frame) = body.frame().now_or_never() else {
                let work: Boxed = Box::pin(async move {
                    let frame = body.frame().await;
                    Event::Frame(id, frame, body)
                });
                return self.push(id, work);
            };
            match self.on_body_frame(id, frame, body) {
                Some(rest) => body = rest,
                None => return,
            }
        }
    }

    /// Sends one frame of a stream's answer; the body back when there may be more to send now.
    fn on_body_frame(
        &mut self,
        id: u32,
        frame: Option<Result<http_body::Frame<Bytes>, axum::Error>>,
        body: Body,
    ) -> Option<Body> {
        match frame {
            None => {
                frame_head(&mut self.out, 0, DATA, END_STREAM, id);
                self.finish(id);
                None
            }
            Some(Err(_)) => {
                self.reset(id, INTERNAL_ERROR);
                None
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let rest = self.send_data(id, data);
                    if rest.is_empty() {
                        return Some(body);
                    }
                    if let Some(stream) = self.streams.get_mut(&id) {
                        stream.parked = Some((rest, body));
                        self.blocked.push(id);
                    }
                    None
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        self.block.clear();
                        encode_fields(&mut self.block, &trailers);
                        self.header_frames(id, true);
                        self.finish(id);
                        None
                    } else {
                        // A frame of a kind HTTP/2 does not carry.
                        Some(body)
                    }
                }
            },
        }
    }

    /// Writes as much of `data` as the windows allow, in frames the client accepts; what is
    /// left over.
    fn send_data(&mut self, id: u32, mut data: Bytes) -> Bytes {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Bytes::new();
        };
        while !data.is_empty() {
            let room = self.send_window.min(stream.send_window).max(0) as usize;
            let n = data.len().min(room).min(self.peer_max_frame);
            if n == 0 {
                break;
            }
            frame_head(&mut self.out, n, DATA, 0, id);
            self.out.extend_from_slice(&data[..n]);
            data.advance(n);
            self.send_window -= n as i64;
            stream.send_window -= n as i64;
        }
        data
    }

    /// Sends what parked streams can now send, in the order they parked.
    fn resume(&mut self) {
        if self.blocked.is_empty() || self.send_window <= 0 {
            return;
        }
        for id in std::mem::take(&mut self.blocked) {
            let Some((data, body)) = self.streams.get_mut(&id).and_then(|s| s.parked.take()) else {
                continue;
            };
            let rest = self.send_data(id, data);
            if rest.is_empty() {
                self.pump(id, body);
            } else if let Some(stream) = self.streams.get_mut(&id) {
                stream.parked = Some((rest, body));
                self.blocked.push(id);
            }
        }
    }

    /// The header block in `self.block` as HEADERS and CONTINUATION frames.
    fn header_frames(&mut self, id: u32, end_stream: bool) {
        let max = self.peer_max_frame;
        let mut chunks = self.block.chunks(max).peekable();
        let mut kind = HEADERS;
        let mut flags = if end_stream { END_STREAM } else { 0 };
        loop {
            let chunk = chunks.next().unwrap_or(&[]);
            let last = chunks.peek().is_none();
            if last {
                flags |= END_HEADERS;
            }
            frame_head(&mut self.out, chunk.len(), kind, flags, id);
            self.out.extend_from_slice(chunk);
            if last {
                return;
            }
            kind = CONTINUATION;
            flags = 0;
        }
    }

    /// Our side of the stream has ended: the stream is done, and if the client is still
    /// sending, it is told to stop.
    fn finish(&mut self, id: u32) {
        if let Some(stream) = self.streams.remove(&id) {
            if !matches!(stream.receiving, Receiving::Done) {
                rst_stream(&mut self.out, id, NO_ERROR);
            }
        }
    }

    /// Ends a stream with an error.
    fn reset(&mut self, id: u32, code: u32) {
        rst_stream(&mut self.out, id, code);
        self.forget(id);
    }

    /// Drops a stream and stops its work.
    fn forget(&mut self, id: u32) {
        if let Some(stream) = self.streams.remove(&id) {
            if let Some(abort) = stream.abort {
                abort.abort();
            }
            self.release(stream.held);
        }
    }

    /// A connection error: GOAWAY with `code`, then the connection closes.
    fn fail(&mut self, code: u32) {
        goaway(&mut self.out, self.last_stream_id, code);
        self.closed = true;
    }

    /// The server is shutting down: no new streams, the open ones finish.
    fn go_away(&mut self) {
        goaway(&mut self.out, self.last_stream_id, NO_ERROR);
        self.goaway_sent = true;
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        let deadline = self.settings.body_timeout;
        let late: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| {
                matches!(s.receiving, Receiving::Open { since, .. } if now.duration_since(since) > deadline)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.reset(id, CANCEL);
        }
        if std::mem::take(&mut self.heard) {
            self.last_heard = now;
            self.ping_sent = None;
        } else if let Some(sent) = self.ping_sent {
            if now.duration_since(sent) > KEEP_ALIVE_TIMEOUT {
                self.closed = true;
            }
        } else if now.duration_since(self.last_heard) > KEEP_ALIVE_INTERVAL {
            frame_head(&mut self.out, 8, PING, 0, 0);
            self.out.extend_from_slice(b"keepaliv");
            self.ping_sent = Some(now);
        }
    }
}

/// Header fields as HPACK literals the client's decoder does not index; fields HTTP/2 does
/// not carry are left out.
fn encode_fields(out: &mut Vec<u8>, headers: &http::HeaderMap) {
    // Static table entry of `content-type` (RFC 7541 appendix A).
    const CONTENT_TYPE: usize = 31;
    for (name, value) in headers {
        let name = name.as_str().as_bytes();
        match name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => {}
            b"content-type" => literal(out, 0x00, CONTENT_TYPE, b"", value.as_bytes()),
            _ => literal(out, 0x00, 0, name, value.as_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tokio::io::DuplexStream;

    fn settings() -> Settings {
        Settings {
            body_bytes_max: 100,
            preface_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_millis(200),
        }
    }

    /// Sets its flag when dropped.
    struct Guard(Arc<AtomicBool>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    struct Routes {
        /// The body of `/never` was dropped.
        dropped: Arc<AtomicBool>,
        /// `/slow` answers once notified.
        release: Arc<tokio::sync::Notify>,
    }

    fn router() -> (axum::Router, Routes) {
        use axum::routing::post;
        let routes = Routes {
            dropped: Arc::default(),
            release: Arc::default(),
        };
        let (dropped, release) = (routes.dropped.clone(), routes.release.clone());
        let router = axum::Router::new()
            .route("/echo", post(|body: Bytes| async move { body }))
            .route(
                "/len",
                post(|body: Bytes| async move { body.len().to_string() }),
            )
            .route(
                "/stream",
                post(|| async {
                    // Ten chunks of 10,000 bytes, then trailers.
                    let mut frames: Vec<Result<_, std::convert::Infallible>> = (0..10u8)
                        .map(|i| Ok(http_body::Frame::data(Bytes::from(vec![i; 10_000]))))
                        .collect();
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                    frames.push(Ok(http_body::Frame::trailers(trailers)));
                    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
                    Body::new(body)
                }),
            )
            .route(
                "/never",
                post(move || async move {
                    let guard = Guard(dropped);
                    let stream = futures_util::stream::pending::<
                        Result<http_body::Frame<Bytes>, std::convert::Infallible>,
                    >()
                    .map(move |frame| {
                        let _ = &guard;
                        frame
                    });
                    Body::new(http_body_util::StreamBody::new(stream))
                }),
            )
            .route(
                "/slow",
                post(move || async move {
                    release.notified().await;
                    "done"
                }),
            );
        (router, routes)
    }

    /// A server connection on one end of an in-memory pipe; the other end, the routes' probes,
    /// the shutdown switch and the connection's task.
    fn start() -> (
        DuplexStream,
        Routes,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        start_with(settings())
    }

    fn start_with(
        settings: Settings,
    ) -> (
        DuplexStream,
        Routes,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (router, routes) = router();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(serve(server, router, settings, shutdown_rx));
        (client, routes, shutdown, task)
    }

    async fn h2_client(io: DuplexStream, window: u32) -> h2::client::SendRequest<Bytes> {
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(window)
            .handshake::<_, Bytes>(io)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    }

    fn post_to(path: &str) -> http::Request<()> {
        http::Request::builder()
            .method("POST")
            .uri(format!("http://test{path}"))
            .body(())
            .unwrap()
    }

    /// Sends `body` to `path` and reads the whole answer, handing the window back as it goes.
    async fn call(
        client: &mut h2::client::SendRequest<Bytes>,
        path: &str,
        body: Bytes,
    ) -> (http::StatusCode, Vec<u8>, Option<http::HeaderMap>) {
        let answer = async {
            let mut client = client.clone().ready().await.unwrap();
            let (response, mut send) = client.send_request(post_to(path), false).unwrap();
            send.reserve_capacity(body.len());
            send.send_data(body, true).unwrap();
            let response = response.await.unwrap();
            let status = response.status();
            let mut body = response.into_body();
            let mut data = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                body.flow_control().release_capacity(chunk.len()).unwrap();
                data.extend_from_slice(&chunk);
            }
            let trailers = body.trailers().await.unwrap();
            (status, data, trailers)
        };
        tokio::time::timeout(Duration::from_secs(10), answer)
            .await
            .expect("the whole answer within 10 s")
    }

    #[tokio::test]
    async fn answers_go_out_as_the_clients_windows_allow() {
        let (io, _routes, _shutdown, _task) = start();
        // A stream window of 1,000 bytes: every answer below waits for WINDOW_UPDATEs.
        let mut client = h2_client(io, 1_000).await;
        let (status, data, trailers) = call(&mut client, "/stream", Bytes::new()).await;
        assert_eq!(status, http::StatusCode::OK);
        assert_eq!(data.len(), 100_000);
        assert!(data
            .chunks(10_000)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == i as u8)));
        assert_eq!(trailers.unwrap()["grpc-status"], "0");
        // Several at once on the one connection, each with its own window.
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let mut client = client.clone();
                tokio::spawn(async move { call(&mut client, "/stream", Bytes::new()).await })
            })
            .collect();
        for call in calls {
            assert_eq!(call.await.unwrap().1.len(), 100_000);
        }
        // A request body within the limit comes back whole.
        let body = Bytes::from((0..90u8).collect::<Vec<_>>());
        let (status, data, _) = call(&mut client, "/echo", body.clone()).await;
        assert_eq!((status, &data[..]), (http::StatusCode::OK, &body[..]));
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_cut_and_the_rest_refused() {
        let (io, _routes, _shutdown, _task) = start();
        let mut client = h2_client(io, 1 << 20).await;
        let mut ready = client.clone().ready().await.unwrap();
        let (response, mut send) = ready.send_request(post_to("/len"), false).unwrap();
        send.reserve_capacity(1_000);
        send.send_data(Bytes::from(vec![7u8; 1_000]), false)
            .unwrap();
        let response = response.await.unwrap();
        let mut body = response.into_body();
        let data = body.data().await.unwrap().unwrap();
        // The limit (100) and the five bytes of a gRPC message's prefix.
        assert_eq!(&data[..], b"105");
        // The connection serves on.
        let (status, data, _) = call(&mut client, "/len", Bytes::from_static(b"abc")).await;
        assert_eq!((status, &data[..]), (http::StatusCode::OK, &b"3"[..]));
    }

    #[tokio::test]
    async fn a_reset_stream_stops_its_work() {
        let (io, routes, _shutdown, _task) = start();
        let client = h2_client(io, 1 << 20).await;
        let mut ready = client.clone().ready().await.unwrap();
        let (response, mut send) = ready.send_request(post_to("/never"), false).unwrap();
        send.send_data(Bytes::new(), true).unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        assert!(!routes.dropped.load(Ordering::SeqCst));
        send.send_reset(h2::Reason::CANCEL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !routes.dropped.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the body outlived its stream");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(response);
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_cancelled() {
        let (io, _routes, _shutdown, _task) = start();
        let client = h2_client(io, 1 << 20).await;
        let mut ready = client.clone().ready().await.unwrap();
        let (response, _send) = ready.send_request(post_to("/echo"), false).unwrap();
        let error = tokio::time::timeout(Duration::from_secs(5), response)
            .await
            .expect("the stream is reset within a tick of the deadline")
            .unwrap_err();
        assert_eq!(error.reason(), Some(h2::Reason::CANCEL));
    }

    #[tokio::test]
    async fn shutdown_sends_goaway_and_open_streams_finish() {
        let (io, routes, shutdown, task) = start();
        let client = h2_client(io, 1 << 20).await;
        let mut ready = client.clone().ready().await.unwrap();
        let (response, mut send) = ready.send_request(post_to("/slow"), false).unwrap();
        send.send_data(Bytes::new(), true).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        shutdown.send(true).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A new stream after GOAWAY is refused.
        let refused = async {
            let mut ready = client.clone().ready().await?;
            let (response, _) = ready.send_request(post_to("/len"), true)?;
            response.await
        }
        .await;
        assert!(refused.is_err());
        assert!(!task.is_finished());
        routes.release.notify_one();
        let mut body = response.await.unwrap().into_body();
        assert_eq!(&body.data().await.unwrap().unwrap()[..], b"done");
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the connection ends once its streams have")
            .unwrap();
    }

    // Raw frames, for what a well-behaved client never sends.

    /// `POST path` as a header block of literals.
    fn request_block(path: &str) -> Vec<u8> {
        let mut block = Vec::new();
        integer(&mut block, 7, 0x80, 3); // :method POST
        integer(&mut block, 7, 0x80, 6); // :scheme http
        literal(&mut block, 0x00, 4, b"", path.as_bytes());
        literal(&mut block, 0x00, 1, b"", b"test");
        block
    }

    /// Frames as (kind, flags, stream, payload) until the server closes the connection or
    /// `last` says enough.
    async fn frames_until(
        io: &mut DuplexStream,
        last: impl Fn(u8, u8) -> bool,
    ) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut input = Vec::new();
        let mut frames = Vec::new();
        loop {
            while let Some(frame) = next_frame(&input, 1 << 24).unwrap() {
                let done = last(frame.kind, frame.flags);
                let len = frame.wire_len();
                frames.push((
                    frame.kind,
                    frame.flags,
                    frame.stream_id,
                    frame.payload.to_vec(),
                ));
                input.drain(..len);
                if done {
                    return frames;
                }
            }
            let mut buffer = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(5), io.read(&mut buffer))
                .await
                .expect("the server answers")
                .unwrap();
            if n == 0 {
                return frames;
            }
            input.extend_from_slice(&buffer[..n]);
        }
    }

    #[tokio::test]
    async fn continuation_ping_and_unknown_frames() {
        let (mut io, _routes, _shutdown, _task) = start();
        let mut out = PREFACE.to_vec();
        crate::h2wire::settings(&mut out, &[]);
        // A frame of a type this server does not know, to be ignored.
        frame_head(&mut out, 3, 0xfa, 0, 0);
        out.extend_from_slice(b"???");
        frame_head(&mut out, 8, PING, 0, 0);
        out.extend_from_slice(b"12345678");
        // The request's header block split over HEADERS and a CONTINUATION.
        let block = request_block("/echo");
        let (first, second) = block.split_at(3);
        frame_head(&mut out, first.len(), HEADERS, 0, 1);
        out.extend_from_slice(first);
        frame_head(&mut out, second.len(), CONTINUATION, END_HEADERS, 1);
        out.extend_from_slice(second);
        frame_head(&mut out, 5, DATA, END_STREAM, 1);
        out.extend_from_slice(b"hello");
        io.write_all(&out).await.unwrap();
        let frames = frames_until(&mut io, |kind, flags| {
            kind == DATA && flags & END_STREAM != 0
        })
        .await;
        assert!(frames
            .iter()
            .any(|f| f.0 == PING && f.1 == ACK && f.3 == b"12345678"));
        let headers = frames.iter().find(|f| f.0 == HEADERS && f.2 == 1).unwrap();
        let mut decoder = loona_hpack::Decoder::new();
        let fields = decoder.decode(&headers.3).unwrap();
        assert!(fields.contains(&(b":status".to_vec(), b"200".to_vec())));
        let data: Vec<u8> = frames
            .iter()
            .filter(|f| f.0 == DATA && f.2 == 1)
            .flat_map(|f| f.3.clone())
            .collect();
        assert_eq!(data, b"hello");
    }

    #[tokio::test]
    async fn protocol_errors_end_the_connection_with_goaway() {
        // A frame a client may not send.
        let (mut io, _routes, _shutdown, task) = start();
        let mut out = PREFACE.to_vec();
        crate::h2wire::settings(&mut out, &[]);
        frame_head(&mut out, 4, PUSH_PROMISE, END_HEADERS, 1);
        out.extend_from_slice(&[0, 0, 0, 2]);
        io.write_all(&out).await.unwrap();
        let frames = frames_until(&mut io, |_, _| false).await;
        let goaway = frames.iter().find(|f| f.0 == GOAWAY).expect("GOAWAY");
        assert_eq!(be_u32(&goaway.3[4..]), Some(PROTOCOL_ERROR));
        task.await.unwrap();

        // A frame larger than this server accepts.
        let (mut io, _routes, _shutdown, task) = start();
        let mut out = PREFACE.to_vec();
        frame_head(&mut out, DEFAULT_MAX_FRAME + 1, DATA, 0, 1);
        io.write_all(&out).await.unwrap();
        let frames = frames_until(&mut io, |_, _| false).await;
        let goaway = frames.iter().find(|f| f.0 == GOAWAY).expect("GOAWAY");
        assert_eq!(be_u32(&goaway.3[4..]), Some(FRAME_SIZE_ERROR));
        task.await.unwrap();

        // A header block HPACK cannot decode (an index past both tables).
        let (mut io, _routes, _shutdown, task) = start();
        let mut out = PREFACE.to_vec();
        frame_head(&mut out, 2, HEADERS, END_HEADERS | END_STREAM, 1);
        out.extend_from_slice(&[0xff, 0x7f]);
        io.write_all(&out).await.unwrap();
        let frames = frames_until(&mut io, |_, _| false).await;
        let goaway = frames.iter().find(|f| f.0 == GOAWAY).expect("GOAWAY");
        assert_eq!(be_u32(&goaway.3[4..]), Some(COMPRESSION_ERROR));
        task.await.unwrap();

        // Not HTTP/2 at all: closed without a word.
        let (mut io, _routes, _shutdown, task) = start();
        io.write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .unwrap();
        assert!(frames_until(&mut io, |_, _| false).await.is_empty());
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_malformed_request_resets_its_stream_only() {
        let (mut io, _routes, _shutdown, _task) = start();
        let mut out = PREFACE.to_vec();
        // No :path.
        let mut block = Vec::new();
        integer(&mut block, 7, 0x80, 3);
        integer(&mut block, 7, 0x80, 6);
        frame_head(&mut out, block.len(), HEADERS, END_HEADERS | END_STREAM, 1);
        out.extend_from_slice(&block);
        // A pseudo-header after a regular one.
        let mut block = request_block("/len");
        literal(&mut block, 0x00, 0, b"x-late", b"1");
        literal(&mut block, 0x00, 0, b":path", b"/len");
        frame_head(&mut out, block.len(), HEADERS, END_HEADERS | END_STREAM, 3);
        out.extend_from_slice(&block);
        // Then a good one.
        let block = request_block("/len");
        frame_head(&mut out, block.len(), HEADERS, END_HEADERS | END_STREAM, 5);
        out.extend_from_slice(&block);
        io.write_all(&out).await.unwrap();
        let frames = frames_until(&mut io, |kind, flags| {
            kind == DATA && flags & END_STREAM != 0
        })
        .await;
        for stream in [1, 3] {
            let reset = frames
                .iter()
                .find(|f| f.0 == RST_STREAM && f.2 == stream)
                .expect("the malformed request's stream is reset");
            assert_eq!(be_u32(&reset.3), Some(PROTOCOL_ERROR));
        }
        let data: Vec<u8> = frames
            .iter()
            .filter(|f| f.0 == DATA && f.2 == 5)
            .flat_map(|f| f.3.clone())
            .collect();
        assert_eq!(data, b"0");
    }

    #[tokio::test]
    async fn bodies_still_arriving_hold_the_connections_window() {
        let mut settings = settings();
        settings.body_bytes_max = 4 << 20;
        settings.body_timeout = Duration::from_secs(60);
        let (mut io, _routes, _shutdown, _task) = start_with(settings);
        let connection_increments = |frames: &[(u8, u8, u32, Vec<u8>)]| -> Vec<u32> {
            frames
                .iter()
                .filter(|f| f.0 == WINDOW_UPDATE && f.2 == 0)
                .map(|f| be_u32(&f.3).unwrap())
                .collect()
        };
        let ping = |out: &mut Vec<u8>, payload: &[u8; 8]| {
            frame_head(out, 8, PING, 0, 0);
            out.extend_from_slice(payload);
        };
        let mut out = PREFACE.to_vec();
        for id in [1, 3] {
            let block = request_block("/len");
            frame_head(&mut out, block.len(), HEADERS, END_HEADERS, id);
            out.extend_from_slice(&block);
        }
        io.write_all(&out).await.unwrap();
        // Two bodies of 3 MiB each, neither ended: 6 MiB, more than half the window.
        let chunk = vec![1u8; DEFAULT_MAX_FRAME];
        for _ in 0..(3 << 20) / DEFAULT_MAX_FRAME {
            for id in [1, 3] {
                let mut out = Vec::new();
                frame_head(&mut out, chunk.len(), DATA, 0, id);
                out.extend_from_slice(&chunk);
                io.write_all(&out).await.unwrap();
            }
        }
        let mut out = Vec::new();
        ping(&mut out, b"gathered");
        io.write_all(&out).await.unwrap();
        let frames = frames_until(&mut io, |kind, flags| kind == PING && flags == ACK).await;
        // Twice the largest body (more than the 8 MiB least).
        let window = 2 * ((4u32 << 20) + 5);
        // Only the first widening, in the server's preface.
        assert_eq!(connection_increments(&frames), [window - 65_535]);
        // Both requests end: their bodies are dispatched and their bytes handed back.
        let mut out = Vec::new();
        for id in [1, 3] {
            frame_head(&mut out, 0, DATA, END_STREAM, id);
        }
        ping(&mut out, b"finished");
        io.write_all(&out).await.unwrap();
        let frames = frames_until(&mut io, |kind, flags| kind == PING && flags == ACK).await;
        assert_eq!(connection_increments(&frames), [6 << 20]);
    }
}
