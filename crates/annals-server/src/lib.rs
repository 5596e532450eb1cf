//! The Annals server: HTTP (`/v1`, JSON and NDJSON, SSE subscriptions) and gRPC (the UmaDB
//! protocol, `umadb.v1.DCB`) over one [`annals::Store`], with API keys, TLS, limits and
//! Prometheus metrics.
//!
//! The HTTP and gRPC layers translate requests into store calls and answers back; they never
//! see a file or an offset. Appends from both go through `AppState::append`, which awaits
//! [`annals::Store::append_async`], so no runtime thread ever blocks on the writer or an fsync.

pub mod alloc;
pub mod answers;
pub mod auth;
mod budget;
pub mod config;
mod console;
mod exchange;
mod grpc;
mod guard;
mod http;
mod kinds;
pub mod metrics;
mod openapi;
pub mod otlp_metrics;
mod peers;
mod process;
pub mod readmodels;
mod schemas;
mod serve;
#[cfg(test)]
mod snapshot;
mod snapshots;
mod start;
mod state;
pub mod stats;
pub mod subjects;
pub mod telemetry;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::{Options, Store};
use tokio::sync::watch;

pub use config::{Config, ServerLimits, TlsFiles};
pub use metrics::Metrics;
pub use readmodels::{HostedModels, ReadModelSpec};
pub use start::StartError;
// The handlers' shared state is the crate's own (its fields are not an API), so it is
// re-exported within the crate only, where the front ends name it `crate::AppState`.
pub(crate) use state::AppState;

/// A running server: its bound addresses and the handle that stops it.
pub struct Server {
    pub http_addr: SocketAddr,
    pub grpc_addr: Option<SocketAddr>,
    pub store: Arc<Store>,
    read_models: Arc<HostedModels>,
    exchange: Option<Arc<annals_exchange::hosted::Hosted>>,
    shutdown_tx: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    drain_timeout: Duration,
    /// The push of the metrics over OTLP, when one is configured.
    metrics_push: Option<otlp_metrics::MetricsPush>,
}

impl Server {
    /// Binds the listeners, then opens the store. Call from within a Tokio runtime. A start
    /// that fails leaves no store behind that it made: what can fail before the store is
    /// opened is checked first, and a data directory this start made (or found empty) is
    /// removed again when the start fails after opening it.
    pub async fn start(config: Config) -> Result<Server, StartError> {
        // A configuration refused, a port in use or unreadable TLS files are refused before
        // the store is made (and its directory locked).
        let bound = Bound::bind(&config).await?;
        let mut options = Options {
            durability: config.durability,
            ..Options::default()
        };
        options.limits = config.limits.store();
        options.disk_reserve_bytes = config.disk_reserve_bytes;
        options.backup = config.backup.as_ref().map(|url| annals::BackupOptions {
            lease: config.backup_lease(),
            ..annals::BackupOptions::new(url)
        });
        options.scrub = config.scrub();
        options.subjects = config.subjects().map_err(StartError::Config)?;
        // The hosted exchange's journal is the server's own: never judged by a schema.
        let registry = Arc::new(match config.exchange {
            Some(_) => {
                annals::registry::Registry::exempting(annals_exchange::codec::RESERVED_TYPES)
            }
            None => annals::registry::Registry::new(),
        });
        options.admission = Some(registry.clone());
        // On PostgreSQL or as a replica, the copy of the log is kept in `--mirror` when given.
        let location = match (&config.replica_of, config.postgres()) {
            (Some(url), _) => annals::Location::Replica {
                backup: annals::BackupOptions::new(url),
                copy: config.mirror.clone(),
            },
            (None, Some(url)) => annals::Location::Postgres {
                url: url.to_owned(),
                mirror: config.mirror.clone(),
            },
            (None, None) => annals::Location::Directory(PathBuf::from(&config.store)),
        };
        // What the backup's checks refuse (a prefix holding another store, say) is known only
        // once the store is open: a directory made by this start is removed if it fails.
        // On PostgreSQL or as a replica, the directory made is the kept copy's (`--mirror`).
        let made = match (&location, &config.mirror) {
            (annals::Location::Directory(dir), _) => Made::before_open(dir),
            (_, Some(mirror)) => Made::before_open(mirror),
            _ => Made::Nothing,
        };
        let opened = tokio::task::spawn_blocking(move || Store::open_at(&location, options))
            .await
            .map_err(|e| StartError::Hosted(format!("the store's opening panicked: {e}")))?;
        let store = match opened {
            Ok(store) => Arc::new(store),
            Err(source) => {
                // Another process holds the directory (it may have made it a moment ago):
                // what is there is its own.
                let locked = matches!(source, annals::OpenError::Locked { .. });
                let e = StartError::Open {
                    store: config.store_description(),
                    source,
                };
                return Err(if locked { e } else { made.remove_after(e) });
            }
        };
        match Self::serve_store(config, store.clone(), Some(registry), bound).await {
            Ok(server) => Ok(server),
            Err(e) => {
                // The store is closed before its directory goes; one still in use after the
                // wait keeps its directory.
                let closed = close_when_unused(store).await;
                Err(match closed {
                    Ok(()) => made.remove_after(e),
                    Err(why) => {
                        StartError::Hosted(format!("{e} (the store was left in place: {why})"))
                    }
                })
            }
        }
    }

    /// Serves an already opened store; `registry`: its schema registry, when it was opened
    /// with one as its admission check (otherwise the schema endpoints answer that it has
    /// none).
    pub async fn start_with_store(
        config: Config,
        store: Arc<Store>,
        registry: Option<Arc<annals::registry::Registry>>,
    ) -> Result<Server, StartError> {
        let bound = Bound::bind(&config).await?;
        Self::serve_store(config, store, registry, bound).await
    }

    /// Serves `store` on listeners already bound. Every step that can fail comes before the
    /// first task is spawned, so that a failure leaves the store with no other user.
    async fn serve_store(
        config: Config,
        store: Arc<Store>,
        registry: Option<Arc<annals::registry::Registry>>,
        bound: Bound,
    ) -> Result<Server, StartError> {
        let Bound {
            http: http_listener,
            grpc: grpc_listener,
            tls,
            keys,
            metrics_export,
        } = bound;
        if let Some(registry) = &registry {
            let (store, registry, config) = (store.clone(), registry.clone(), config.clone());
            tokio::task::spawn_blocking(move || schemas::load(&config, &store, &registry))
                .await
                .map_err(|e| e.to_string())
                .and_then(|loaded| loaded)
                .map_err(StartError::Config)?;
        }
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let metrics = Arc::new(Metrics::default());
        let read_models = {
            let (store, specs) = (store.clone(), config.read_models.clone());
            tokio::task::spawn_blocking(move || HostedModels::start(&store, &specs).map(Arc::new))
                .await
                .map_err(|e| e.to_string())
                .and_then(|started| started)
                .map_err(StartError::Hosted)?
        };
        let exchange = match &config.exchange {
            Some(exchange) => match exchange::start(exchange, store.clone()).await {
                Ok(hosted) => Some(Arc::new(hosted)),
                Err(e) => {
                    // The read models let go of the store, so that the caller can close it.
                    let models = read_models.clone();
                    let _ = tokio::task::spawn_blocking(move || models.stop()).await;
                    return Err(StartError::Hosted(e));
                }
            },
            None => None,
        };
        let state = Arc::new(AppState {
            store: store.clone(),
            config: config.clone(),
            keys,
            metrics,
            read_models: read_models.clone(),
            registry,
            exchange: exchange.clone(),
            shutdown: shutdown_rx.clone(),
            stream_bytes: budget::Budget::new(config.limits.stream_bytes_max),
        });
        let listening = |api, addr, source| StartError::Listen { api, addr, source };
        let http_addr = http_listener
            .local_addr()
            .map_err(|e| listening("http", config.http_listen, e))?;
        let grpc_addr = match (&grpc_listener, config.grpc_listen) {
            (Some(listener), Some(addr)) => Some(
                listener
                    .local_addr()
                    .map_err(|e| listening("grpc", addr, e))?,
            ),
            _ => None,
        };
        let metrics_push = match metrics_export {
            Some(export) => {
                let state = state.clone();
                let scrape = move || http::scrape(&state, state.store.snapshots().stats().ok());
                // A push that cannot begin is reported, and the server serves without it:
                // what could be refused was refused with the configuration.
                match otlp_metrics::MetricsPush::start(export, scrape) {
                    Ok(push) => Some(push),
                    Err(e) => {
                        tracing::error!("the metrics are not pushed over OTLP: {e}");
                        None
                    }
                }
            }
            None => None,
        };
        let mut tasks = Vec::new();
        // The routes other modules own join the HTTP API's here, at the root: they use
        // `http`'s helpers, so `http` names none of them.
        let mut routes = openapi::routes(
            &state,
            schemas::routes(
                &state,
                snapshots::routes(
                    &state,
                    subjects::routes(&state, exchange::routes(&state, axum::Router::new())),
                ),
            ),
        );
        if state.config.console {
            routes = console::routes(routes);
        }
        let router = http::router(state.clone(), routes);
        tasks.push(tokio::spawn(serve::serve_http(
            http_listener,
            router,
            tls.as_ref().map(|t| t.acceptor.clone()),
            state.clone(),
            serve::Protocols::Both,
        )));
        if let Some(listener) = grpc_listener {
            tasks.push(tokio::spawn(grpc::serve(
                listener,
                tls.as_ref().map(|t| t.acceptor.clone()),
                state.clone(),
            )));
        }
        Ok(Server {
            http_addr,
            grpc_addr,
            store,
            read_models,
            exchange,
            shutdown_tx,
            tasks,
            drain_timeout: config.limits.drain_timeout,
            metrics_push,
        })
    }

    /// What starting the hosted exchange found, when there is one.
    pub fn exchange_started(&self) -> Option<annals_exchange::StartReport> {
        self.exchange
            .as_ref()
            .map(|h| h.exchange.start_report().clone())
    }

    /// Stops accepting connections, lets in-flight requests finish (appends are answered after
    /// their fsync), ends subscriptions, then closes the store: drains its queue, syncs and
    /// writes the index checkpoint.
    pub async fn shutdown(self) -> Result<(), String> {
        let _ = self.shutdown_tx.send(true);
        let drain = async {
            for task in self.tasks {
                let _ = task.await;
            }
        };
        if tokio::time::timeout(self.drain_timeout + Duration::from_secs(1), drain)
            .await
            .is_err()
        {
            tracing::warn!("shutdown: some connections did not finish in time; closing anyway");
        }
        // The series as they end are pushed once more.
        if let Some(push) = self.metrics_push {
            let _ = tokio::task::spawn_blocking(move || push.stop()).await;
        }
        // The exchange answers what it holds, syncs its journal, saves a snapshot and lets
        // go of the store.
        if let Some(hosted) = self.exchange.clone() {
            match tokio::task::spawn_blocking(move || hosted.exchange.stop()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "shutdown: the exchange did not stop cleanly")
                }
                Err(e) => tracing::error!(error = %e, "shutdown: the exchange's stop panicked"),
            }
        }
        // Read models write a last checkpoint and let go of the store.
        let models = self.read_models.clone();
        if let Ok(stopped) = tokio::task::spawn_blocking(move || models.stop()).await {
            for (name, error) in stopped {
                if let Some(error) = error {
                    tracing::error!(model = %name, %error, "shutdown: a read model did not stop cleanly");
                }
            }
        }
        // Handlers still holding the store drop it as they finish.
        close_when_unused(self.store).await
    }
}

/// The listeners and TLS material of a server, made before its store is opened so that a
/// port in use or an unreadable certificate is refused before anything is written.
struct Bound {
    http: tokio::net::TcpListener,
    grpc: Option<tokio::net::TcpListener>,
    tls: Option<serve::Tls>,
    keys: auth::ApiKeys,
    metrics_export: Option<telemetry::MetricsExport>,
}

impl Bound {
    /// Checks the configuration (the keys read, a start it refuses), then binds.
    async fn bind(config: &Config) -> Result<Bound, StartError> {
        let keys = config.keys().map_err(StartError::Config)?;
        if let Some(refusal) = config.refusal(&keys) {
            return Err(StartError::Config(refusal));
        }
        let tls = match &config.tls {
            Some(files) => Some(serve::load_tls(files).map_err(StartError::Tls)?),
            None => None,
        };
        // The push of the metrics reads the `OTEL_*` variables, as the trace export does.
        let metrics_export = config
            .telemetry
            .metrics(|name| std::env::var(name).ok())
            .map_err(StartError::Config)?;
        let listen = |api, addr| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Listen { api, addr, source })
        };
        let http = listen("http", config.http_listen).await?;
        let grpc = match config.grpc_listen {
            Some(addr) => Some(listen("grpc", addr).await?),
            None => None,
        };
        Ok(Bound {
            http,
            grpc,
            tls,
            keys,
            metrics_export,
        })
    }
}

/// What opening a store on files is about to make, so that a start that then fails can
/// remove it: only a directory that did not exist or was empty, never one that held anything.
enum Made {
    /// The directory held something (or could not be looked at): nothing is removed.
    Nothing,
    /// The first missing directory on the way to the data directory (so that no empty parent
    /// made by `create_dir_all` is left either).
    Tree(PathBuf),
    /// An empty data directory: what it will hold is removed, the directory stays.
    Contents(PathBuf),
}

impl Made {
    fn before_open(dir: &std::path::Path) -> Made {
        match std::fs::read_dir(dir) {
            Ok(mut entries) => match entries.next() {
                None => Made::Contents(dir.to_path_buf()),
                Some(_) => Made::Nothing,
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Anything at a path (a dangling link included) counts as there.
                let there = |p: &std::path::Path| {
                    p.as_os_str().is_empty() || std::fs::symlink_metadata(p).is_ok()
                };
                let mut top = dir;
                for parent in dir.ancestors().skip(1) {
                    if there(parent) {
                        break;
                    }
                    top = parent;
                }
                Made::Tree(top.to_path_buf())
            }
            Err(_) => Made::Nothing,
        }
    }

    /// Removes what the failed start made; answers the start's error, with a word on what
    /// could not be removed.
    fn remove_after(&self, error: StartError) -> StartError {
        let removed = match self {
            Made::Nothing => Ok(()),
            Made::Tree(top) => match std::fs::remove_dir_all(top) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err((top, e)),
                _ => Ok(()),
            },
            Made::Contents(dir) => std::fs::read_dir(dir)
                .and_then(|entries| {
                    for entry in entries {
                        let path = entry?.path();
                        if std::fs::symlink_metadata(&path)?.is_dir() {
                            std::fs::remove_dir_all(&path)?;
                        } else {
                            std::fs::remove_file(&path)?;
                        }
                    }
                    Ok(())
                })
                .map_err(|e| (dir, e)),
        };
        match removed {
            Ok(()) => error,
            Err((path, source)) => StartError::LeftBehind {
                error: Box::new(error),
                path: path.clone(),
                source,
            },
        }
    }
}

/// Closes a store once nothing else holds it (a failed start's), waiting a little for other
/// holders to let go.
async fn close_when_unused(mut store: Arc<Store>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Arc::try_unwrap(store) {
            Ok(owned) => {
                return tokio::task::spawn_blocking(move || owned.close())
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("closing the store: {e}"));
            }
            Err(shared) if Instant::now() < deadline => {
                store = shared;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => {
                return Err(
                    "the store is still in use; it closes (drains, syncs, checkpoints) \
                            when its last user drops it"
                        .into(),
                )
            }
        }
    }
}
