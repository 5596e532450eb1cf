//! The HTTP accept loop: a connection limit, header and TLS handshake timeouts, HTTP/1.1 and
//! HTTP/2 on one port, and graceful shutdown (in-flight requests finish, idle connections
//! close).

use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
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

pub(crate) async fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<TlsAcceptor>,
    state: Arc<AppState>,
) {
    let limits = state.config.limits.clone();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        // Large windows, as gRPC clients use: fewer WINDOW_UPDATE frames per request.
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(8 << 20)
        .auto_date_header(false)
        .keep_alive_interval(Some(std::time::Duration::from_secs(20)));
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let mut shutdown = state.shutdown.clone();
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.connections_max));
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    eprintln!("annals: http accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            // Over the connection limit: close at once.
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let gauge = state.metrics.connection();
        let handshake_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let _gauge = gauge;
            match tls {
                None => serve_connection(stream, &builder, service, watcher).await,
                Some(acceptor) => {
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await
                    else {
                        return;
                    };
                    serve_connection(stream, &builder, service, watcher).await
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!("annals: http: connections still open after the drain timeout");
    }
}

async fn serve_connection<I>(
    io: I,
    builder: &Builder<TokioExecutor>,
    service: TowerToHyperService<axum::Router>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let _ = watcher.watch(connection.into_owned()).await;
}
