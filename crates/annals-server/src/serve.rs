//! The HTTP accept loop: a connection limit and a share of it per peer, a deadline for a
//! connection's first bytes, header and TLS handshake timeouts, HTTP/1.1 and HTTP/2 on one
//! port (hyper), and graceful shutdown (in-flight requests finish, idle connections close).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::AtomicWaker;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;
use crate::AppState;

/// TLS material, loaded once and shared by the HTTP and gRPC listeners.
#[derive(Clone)]
pub(crate) struct Tls {
    pub acceptor: TlsAcceptor,
}

pub(crate) fn load_tls(files: &TlsFiles) -> Result<Tls, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert_pem = std::fs::read(&files.cert)
        .map_err(|e| format!("cannot read TLS certificate {}: {e}", files.cert.display()))?;
    let key_pem = std::fs::read(&files.key)
        .map_err(|e| format!("cannot read TLS key {}: {e}", files.key.display()))?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("TLS certificate {}: {e}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "TLS certificate {}: no certificate found",
            files.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("TLS key {}: {e}", files.key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| format!("TLS certificate and key do not fit: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Tls {
        acceptor: TlsAcceptor::from(Arc::new(config)),
    })
}

/// What a listener speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocols {
    /// HTTP/1.1 and HTTP/2, as the client speaks (the HTTP port).
    Both,
    /// HTTP/2 alone (the gRPC port): anything else is not a client of ours, and a connection
    /// that does not open with the HTTP/2 preface is closed.
    Http2,
}

/// Serves `router` on `listener` until shutdown: hyper answers HTTP/1.1 and HTTP/2 as the
/// client speaks (or HTTP/2 alone), with its protections on (see [`builder`]).
pub(crate) async fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<TlsAcceptor>,
    state: Arc<AppState>,
    protocols: Protocols,
) {
    let limits = state.config.limits.clone();
    let graceful = GracefulShutdown::new();
    let mut shutdown = state.shutdown.clone();
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.connections_max));
    let peers = Arc::new(crate::peers::PeerSlots::new(
        limits.connections_per_peer_max,
    ));
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!(error = %e, "http: accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        // Over the connection limit, or over this peer's share of it: close at once.
        let Some(peer_slot) = peers.take(peer.ip()) else {
            drop(stream);
            continue;
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Each connection's streamed answers draw from a budget of its own (see `budget`).
        let connection_budget =
            crate::budget::ConnectionBudget::new(limits.stream_bytes_per_connection_max);
        let service = TowerToHyperService::new(WithBudget {
            router: router.clone(),
            budget: connection_budget,
            grpc: protocols == Protocols::Http2,
        });
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let gauge = state.metrics.connection();
        let limits = limits.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _peer_slot = peer_slot;
            let _gauge = gauge;
            let deadline = limits.header_timeout;
            match tls {
                None => {
                    let io = crate::guard::Guarded::new(stream, deadline);
                    serve_io(io, service, watcher, &limits, protocols).await
                }
                Some(acceptor) => {
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(deadline, acceptor.accept(stream)).await
                    else {
                        return;
                    };
                    let io = crate::guard::Guarded::new(stream, deadline);
                    serve_io(io, service, watcher, &limits, protocols).await
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("http: connections still open after the drain timeout");
    }
}

/// The router, each request carrying its connection's stream budget and run in its span
/// (when traces are exported; see `telemetry::request_span`).
#[derive(Clone)]
pub(crate) struct WithBudget {
    router: axum::Router,
    budget: crate::budget::ConnectionBudget,
    /// The gRPC listener's: its requests' spans follow the RPC conventions.
    grpc: bool,
}

impl tower::Service<http::Request<hyper::body::Incoming>> for WithBudget {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = crate::telemetry::Traced<
        <axum::Router as tower::Service<http::Request<hyper::body::Incoming>>>::Future,
    >;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::<http::Request<hyper::body::Incoming>>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, mut request: http::Request<hyper::body::Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.budget.clone());
        let span = crate::telemetry::request_span(&request, self.grpc);
        // Entered while the router routes: a route's guard records the route on it.
        let routed = span.in_scope(|| self.router.call(request));
        crate::telemetry::Traced::new(routed, span, self.grpc)
    }
}

async fn serve_io<I>(
    io: I,
    service: TowerToHyperService<WithBudget>,
    watcher: hyper_util::server::graceful::Watcher,
    limits: &crate::config::ServerLimits,
    protocols: Protocols,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let streams = ConnectionStreams::for_this_runtime();
    let builder = builder(streams.clone(), limits);
    match protocols {
        Protocols::Both => {
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
            streams.drive(watcher.watch(connection.into_owned())).await;
        }
        Protocols::Http2 => {
            // (`serve_connection_with_upgrades` would detect the version whatever the builder
            // says.)
            let builder = builder.http2_only();
            let connection = builder.serve_connection(TokioIo::new(io), service);
            streams.drive(watcher.watch(connection.into_owned())).await;
        }
    }
}

/// A connection's server: HTTP/1.1 or HTTP/2 as the client speaks, its HTTP/2 streams run by
/// `streams`. hyper's protections stay on at their defaults (reset-flood accounting, pending
/// accept resets, CONTINUATION and header-list limits); on top of them: a header list of at
/// most `header_list_bytes_max`, at most `streams_per_connection_max` streams at once, and a
/// keep-alive PING whose answer must come within `header_timeout`.
fn builder(
    streams: ConnectionStreams,
    limits: &crate::config::ServerLimits,
) -> Builder<ConnectionStreams> {
    let mut builder = Builder::new(streams);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.header_list_bytes_max.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.streams_per_connection_max)
        .max_header_list_size(limits.header_list_bytes_max as u32)
        // Large windows, as gRPC clients use: fewer WINDOW_UPDATE frames per request.
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(8 << 20)
        .max_send_buf_size(1 << 20)
        .auto_date_header(false)
        .keep_alive_interval(Some(std::time::Duration::from_secs(20)))
        .keep_alive_timeout(limits.header_timeout);
    builder
}

type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs an HTTP/2 connection's streams (each request's handler and answer) in the
/// connection's own task rather than in a task each, when the server has one network thread
/// (`--worker-threads`, by default one fewer than the cores): hyper hands each new stream to
/// its executor, which then queues it for [`ConnectionStreams::drive`]. A stream's task of its
/// own buys no parallelism on one thread, only a spawn, a schedule and a wake-up between the
/// task that answers and the task that writes the answer out; run in the connection's task,
/// the store's answer wakes the one task that does both, and a round of answers goes out in
/// one write (docs/DECISIONS.md, R6). With several network threads
/// each stream gets its own task as before, so that one connection's calls (a gRPC client
/// usually has one) can run on all of them.
#[derive(Clone)]
pub(crate) struct ConnectionStreams {
    queue: Arc<StreamQueue>,
    inline: bool,
}

#[derive(Default)]
struct StreamQueue {
    new: parking_lot::Mutex<Vec<StreamFuture>>,
    waker: AtomicWaker,
}

impl<F> hyper::rt::Executor<F> for ConnectionStreams
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, future: F) {
        if !self.inline {
            tokio::spawn(future);
            return;
        }
        self.queue.new.lock().push(Box::pin(future));
        self.queue.waker.wake();
    }
}

impl ConnectionStreams {
    /// Streams run inline when the current runtime has one worker thread.
    fn for_this_runtime() -> Self {
        let workers = tokio::runtime::Handle::try_current()
            .map(|h| h.metrics().num_workers())
            .unwrap_or(1);
        ConnectionStreams {
            queue: Arc::default(),
            inline: workers <= 1,
        }
    }

    /// Drives `connection` and the streams it starts, until the connection has ended and
    /// every stream has finished.
    async fn drive<C: Future>(self, connection: C) {
        let mut connection = std::pin::pin!(connection);
        let mut running: FuturesUnordered<StreamFuture> = FuturesUnordered::new();
        let mut ended = false;
        std::future::poll_fn(|cx| {
            self.queue.waker.register(cx.waker());
            loop {
                if !ended && connection.as_mut().poll(cx).is_ready() {
                    ended = true;
                }
                let new = std::mem::take(&mut *self.queue.new.lock());
                let started = !new.is_empty();
                running.extend(new);
                let mut finished = false;
                while let Poll::Ready(Some(())) = running.poll_next_unpin(cx) {
                    finished = true;
                }
                // A stream that finished has its answer queued on the connection, and a new
                // one may have too: the connection writes them out on its next poll.
                if !(started || finished) || ended {
                    break;
                }
            }
            if ended && running.is_empty() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}
