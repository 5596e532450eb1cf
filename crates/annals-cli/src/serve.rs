//! `annals serve`: the server on an embedded data directory.

use std::path::PathBuf;

use annals_server::config::Layer;
use annals_server::{Config, Server};

use crate::failure::Failure;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Data directory (created if missing). Env: ANNALS_DATA_DIR. Default: ./annals-data
    #[arg(long, value_name = "DIR", conflicts_with = "store")]
    data_dir: Option<PathBuf>,
    /// Where the log lives: a data directory, or a PostgreSQL database
    /// (postgres://user:password@host:port/db; several hosts as host1:port1,host2:port2 with
    /// ?target_session_attrs=read-write to follow the primary; ?sslmode=require for TLS that
    /// checks the server's certificate, &sslrootcert=PATH for the roots to trust). Several
    /// servers may serve one database. Env: ANNALS_STORE
    #[arg(long, value_name = "DIR|URL")]
    store: Option<String>,
    /// With a store on PostgreSQL, or a replica (--replica-of): keep the server's copy of the
    /// log in DIR across restarts, so that a restart after a clean stop reads only what the
    /// database committed (or the backup took in) since (it is filled again after a crash, a
    /// kill, or a source that lost its last append). One server per directory.
    /// Env: ANNALS_MIRROR. Default: a temporary directory, filled at every start.
    #[arg(long, value_name = "DIR")]
    mirror: Option<PathBuf>,
    /// Free space of the data directory's file system that the store leaves alone, for
    /// checkpoints, other programs and you: appends that need a new segment are refused
    /// (507 disk_full) while less would be left, and taken again once there is room.
    /// Env: ANNALS_DISK_RESERVE_BYTES. Default: one segment (64 MiB).
    #[arg(long, value_name = "BYTES")]
    disk_reserve: Option<u64>,
    /// Ship the log continuously into object storage: s3://bucket/prefix, gs://bucket/prefix,
    /// az://container/prefix or file:///directory. Credentials and endpoints come from each
    /// provider's environment variables (for S3: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP). One store per prefix; restore
    /// with `annals restore`. Env: ANNALS_BACKUP
    #[arg(long, value_name = "URL")]
    backup: Option<String>,
    /// How long the backup's lease holds after the shipping server last renewed it: how soon
    /// another server may take the backup over once this one is gone.
    /// Env: ANNALS_BACKUP_LEASE_SECONDS. Default: 30
    #[arg(long, value_name = "SECONDS")]
    backup_lease_seconds: Option<u64>,
    /// The background scrub's rate, re-reading sealed segments to find damage early; 0 turns
    /// it off. Env: ANNALS_SCRUB_BYTES_PER_SECOND. Default: 8 MiB
    #[arg(long, value_name = "BYTES")]
    scrub_bytes_per_second: Option<u64>,
    /// The scrub's pause before each pass. Env: ANNALS_SCRUB_PAUSE_SECONDS. Default: 600
    #[arg(long, value_name = "SECONDS")]
    scrub_pause_seconds: Option<f64>,
    /// Serve as a read replica of the backup another server writes at URL (as --backup
    /// names it): reads, subscriptions, read models and the console, following the backup as
    /// it grows; appends are refused, naming the primary. No data directory: the log's copy
    /// is filled from the backup at start. Env: ANNALS_REPLICA_OF
    #[arg(long, value_name = "URL")]
    replica_of: Option<String>,
    /// Tag prefixes that name data subjects, comma separated (customer:,employee:): the data
    /// and metadata of their events are stored encrypted under a key per subject, and
    /// `annals erase TAG` deletes it. Tags stay in the clear: make subject tags opaque ids.
    /// Needs --master-key-file. Env: ANNALS_SUBJECT_TAGS
    #[arg(long, value_name = "PREFIXES")]
    subject_tags: Option<String>,
    /// The file holding the master key (64 hexadecimal characters; `annals master-key new`)
    /// that encrypts the subjects' keys. A store started with another master key than its
    /// own is refused. Env: ANNALS_MASTER_KEY_FILE
    #[arg(long, value_name = "FILE")]
    master_key_file: Option<PathBuf>,
    /// HTTP listen address. Env: ANNALS_HTTP_LISTEN. Default: 127.0.0.1:7400
    #[arg(long, value_name = "HOST:PORT")]
    http: Option<String>,
    /// gRPC (UmaDB protocol) listen address, or "off". Env: ANNALS_GRPC_LISTEN.
    /// Default: 127.0.0.1:50051
    #[arg(long, value_name = "HOST:PORT|off")]
    grpc: Option<String>,
    /// Durability class: d3 (fsync before acknowledgement, the default), d4 (also in object
    /// storage before acknowledgement; needs --backup), d2, d1 or d0. Env: ANNALS_DURABILITY
    #[arg(long, value_name = "CLASS")]
    durability: Option<String>,
    /// A TOML configuration file (every setting, limits included). Env: ANNALS_CONFIG
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// API keys, one `key scope,scope` per line (scopes: read, append, admin). With keys
    /// configured, every request needs `Authorization: Bearer <key>`. Env: ANNALS_API_KEYS_FILE,
    /// or ANNALS_API_KEYS=key=scope,scope;key2=scope
    #[arg(long, value_name = "FILE")]
    api_keys_file: Option<PathBuf>,
    /// Threads serving the network. Env: ANNALS_WORKER_THREADS. Default: one fewer than the
    /// cores (at least one), leaving a core to the store's writer.
    #[arg(long, value_name = "N")]
    worker_threads: Option<usize>,
    /// Host the matching engine, journaled in this store, under /v1/exchange: d3-pipelined
    /// (the default mode: every answer durable, fsyncs shared by batches), d3-per-order,
    /// d2-critical (needs --durability d2), d0 (nothing journaled), or off. Symbols come from
    /// the configuration file's [exchange] section or POST /v1/admin/exchange/symbols.
    /// Env: ANNALS_EXCHANGE
    #[arg(long, value_name = "MODE")]
    exchange: Option<String>,
    /// TLS certificate chain (PEM); serves HTTPS and gRPC over TLS. Env: ANNALS_TLS_CERT
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM). Env: ANNALS_TLS_KEY
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A web origin (scheme://host:port) whose pages may call the HTTP API from a browser,
    /// besides the server's own; repeat for several. Env: ANNALS_ALLOWED_ORIGINS (comma
    /// separated). Default: none.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    allow_origin: Vec<String>,
    /// Serve everyone who can connect when listening beyond loopback without API keys
    /// (refused otherwise). Env: ANNALS_ALLOW_UNAUTHENTICATED_NETWORK=1. Default: off.
    #[arg(long)]
    allow_unauthenticated_network: bool,
    /// Do not serve the web console at / on the HTTP listener. Env: ANNALS_CONSOLE=off.
    /// Default: served (it uses the API, with the same keys).
    #[arg(long)]
    no_console: bool,
}

/// The effective configuration: the defaults, then the config file, then the environment,
/// then the flags, each replacing what the one before set; `warn` hears of each variable
/// beginning `ANNALS_` that names no setting (a misspelt one would otherwise do nothing).
fn resolve(args: &ServeArgs, warn: impl Fn(String)) -> Result<Config, String> {
    let file = args
        .config
        .clone()
        .or_else(|| std::env::var_os("ANNALS_CONFIG").map(PathBuf::from));
    let (env, unknown) = Layer::env(std::env::vars())?;
    for name in unknown {
        warn(format!(
            "{name} names no setting of annals serve; it is ignored"
        ));
    }
    let file = file.map(|f| Layer::file(&f)).transpose()?;
    Config::load(file.into_iter().chain([env, flags(args)?]))
}

/// The HTTP listener and whether it serves TLS, as the configuration file (ANNALS_CONFIG) and
/// the environment configure `annals serve` without flags: the server `annals health` asks.
pub fn configured_http() -> Result<(std::net::SocketAddr, bool), String> {
    let file = std::env::var_os("ANNALS_CONFIG").map(PathBuf::from);
    let (env, _) = Layer::env(std::env::vars())?;
    let file = file.map(|f| Layer::file(&f)).transpose()?;
    let config = Config::load(file.into_iter().chain([env]))?;
    Ok((config.http_listen, config.tls.is_some()))
}

/// The flags given, as the last layer.
fn flags(args: &ServeArgs) -> Result<Layer, String> {
    fn put<T: serde::Serialize>(l: &mut Layer, key: &str, v: &Option<T>) -> Result<(), String> {
        match v {
            Some(v) => l.set(key, v),
            None => Ok(()),
        }
    }
    let mut l = Layer::new("the command line");
    let store = args
        .store
        .clone()
        .or(args.data_dir.clone().map(|d| d.display().to_string()));
    put(&mut l, "store", &store)?;
    put(&mut l, "mirror", &args.mirror)?;
    put(&mut l, "disk_reserve_bytes", &args.disk_reserve)?;
    put(&mut l, "backup", &args.backup)?;
    put(&mut l, "backup_lease_seconds", &args.backup_lease_seconds)?;
    put(&mut l, "replica_of", &args.replica_of)?;
    put(
        &mut l,
        "scrub_bytes_per_second",
        &args.scrub_bytes_per_second,
    )?;
    put(&mut l, "scrub_pause_seconds", &args.scrub_pause_seconds)?;
    put(&mut l, "subject_tags", &args.subject_tags)?;
    put(&mut l, "master_key_file", &args.master_key_file)?;
    put(&mut l, "http_listen", &args.http)?;
    put(&mut l, "grpc_listen", &args.grpc)?;
    put(&mut l, "durability", &args.durability)?;
    put(&mut l, "api_keys_file", &args.api_keys_file)?;
    put(&mut l, "worker_threads", &args.worker_threads)?;
    put(&mut l, "exchange.mode", &args.exchange)?;
    put(&mut l, "tls.cert", &args.tls_cert)?;
    put(&mut l, "tls.key", &args.tls_key)?;
    if !args.allow_origin.is_empty() {
        l.set("allowed_origins", &args.allow_origin)?;
    }
    if args.allow_unauthenticated_network {
        l.set("allow_unauthenticated_network", true)?;
    }
    if args.no_console {
        l.set("console", false)?;
    }
    Ok(l)
}

/// `annals config`: the configuration `annals serve` runs with.
#[derive(clap::Subcommand)]
pub enum ConfigCommand {
    /// Print the configuration that `annals serve` with these flags would run with (the
    /// defaults, the file, the environment and the flags), as TOML a config file takes, with
    /// passwords in URLs and API keys shown as ***. A configuration the server would refuse
    /// is refused here, with the same reason and exit status.
    Show(ServeArgs),
}

pub fn config(command: ConfigCommand) -> Result<(), Failure> {
    let ConfigCommand::Show(args) = command;
    let checked = resolve(&args, |w| eprintln!("warning: {w}")).and_then(|config| {
        let keys = config.keys()?;
        if let Some(refusal) = config.refusal(&keys) {
            return Err(refusal);
        }
        config.subjects()?;
        Ok(config)
    });
    let config = checked.map_err(|e| Failure::of_kind("config", e))?;
    let text = toml::to_string(&config.redacted()).map_err(|e| e.to_string())?;
    print!("{text}");
    Ok(())
}

/// The server's log: events (a failed accept, a slow shutdown, a component that did not stop
/// cleanly) go to stderr as lines of `tracing`'s text format, at the level `ANNALS_LOG` names
/// (`error`, `warn`, `info` (the default), `debug`, `trace`) for Annals' own crates and at
/// `warn` for its libraries'. With `telemetry` (traces exported over OTLP), the spans of
/// Annals' crates go to the export; the log takes events only, so that a server exporting
/// nothing makes no spans at all.
fn start_log(telemetry: Option<&annals_server::telemetry::Telemetry>) -> Result<(), String> {
    use tracing_subscriber::filter::{filter_fn, LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer as _;
    let level = match std::env::var("ANNALS_LOG").as_deref() {
        Err(_) | Ok("") | Ok("info") => LevelFilter::INFO,
        Ok("error") => LevelFilter::ERROR,
        Ok("warn") => LevelFilter::WARN,
        Ok("debug") => LevelFilter::DEBUG,
        Ok("trace") => LevelFilter::TRACE,
        Ok("off") => LevelFilter::OFF,
        Ok(other) => {
            return Err(format!(
                "ANNALS_LOG={other:?}: expected error, warn, info, debug, trace or off"
            ))
        }
    };
    let targets = Targets::new()
        .with_default(LevelFilter::WARN.min(level))
        .with_target("annals", level)
        .with_target("annals_server", level)
        .with_target("annals_exchange", level);
    let format = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_filter(targets)
        .with_filter(filter_fn(|metadata| metadata.is_event()));
    // Another subscriber already set (the process's embedder's) is kept. Two branches rather
    // than an `Option` layer: an absent layer reports interest in every callsite, which made
    // the libraries' trace-level events (h2's, per frame) reach the subscriber.
    let registry = tracing_subscriber::registry().with(format);
    let _ = match telemetry {
        Some(t) => registry.with(t.layer()).try_init(),
        None => registry.try_init(),
    };
    Ok(())
}

pub fn run(args: ServeArgs) -> Result<(), Failure> {
    // What the flags, the environment and the file say is the configuration: a refusal of it
    // exits as one (78), so that a supervisor does not restart a start that cannot succeed.
    // Its warnings wait for the log, which starts once the configuration says what to export.
    let warnings = std::cell::RefCell::new(Vec::new());
    let resolved = resolve(&args, |w| warnings.borrow_mut().push(w));
    // The metrics' push is made by the server, from the same variables; what it would refuse
    // is refused here, before anything starts.
    let export = resolved.as_ref().ok().map(|config| {
        let env = |name: &str| std::env::var(name).ok();
        config
            .telemetry
            .metrics(env)
            .and_then(|_| config.telemetry.resolve(env))
    });
    let telemetry = match export {
        Some(Ok(Some(export))) => Some(
            annals_server::telemetry::Telemetry::start(&export)
                .map_err(|e| Failure::of_kind("config", e))?,
        ),
        Some(Err(e)) => {
            start_log(None).map_err(|e| Failure::of_kind("config", e))?;
            return Err(Failure::of_kind("config", e));
        }
        _ => None,
    };
    start_log(telemetry.as_ref()).map_err(|e| Failure::of_kind("config", e))?;
    for w in warnings.into_inner() {
        tracing::warn!("{w}");
    }
    let config = resolved.map_err(|e| Failure::of_kind("config", e))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.runtime_threads())
        .enable_all()
        .thread_name("annals-rt")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let served = runtime.block_on(serve(config));
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    served
}

const GIB: f64 = (1u64 << 30) as f64;

async fn serve(config: Config) -> Result<(), Failure> {
    let keys = config
        .keys()
        .map_err(|e| Failure::of_kind("config", e))?
        .len();
    let threads = config.runtime_threads();
    let tls = config.tls.is_some();
    let exposed = config.exposed();
    let durability = config.durability;
    let location = config.store_description();
    let exchange = config.exchange.clone();
    let console = config.console;
    let (source, read) = match config.replica_of.is_some() {
        true => ("backup", "objects read from the backup"),
        false => ("database", "appends read from the database"),
    };
    // The handler is in place before the server says it listens: a SIGTERM sent as soon as it
    // answers stops it cleanly rather than by the signal's default action.
    let stop = Stop::listen();
    let server = Server::start(config).await?;
    let report = server.store.open_report().clone();
    let scheme = if tls { "https" } else { "http" };
    // A replica acknowledges no appends: its class is what it serves, whatever the flag says.
    let class = match server.store.backend() {
        annals::Backend::Replica => server.store.stats().durability_description,
        _ => durability.description(),
    };
    println!(
        "annals: serving {} ({}), head {}, opened in {:.1} ms ({})",
        location,
        class,
        server.store.head(),
        report.open_ms,
        match (&report.index, &report.mirror) {
            // A copy of the log filled from its source has no checkpoint to speak of.
            (_, Some(mirror)) if mirror.resumed_at.is_none() =>
                format!("index built from the {source}"),
            (annals::IndexSource::Checkpoint { scanned_events }, _) =>
                format!("index from checkpoint, {scanned_events} events scanned after it"),
            (annals::IndexSource::New, _) => "new store".to_string(),
            (annals::IndexSource::Rebuilt { reason }, _) => format!("index rebuilt: {reason}"),
        }
    );
    match (
        server.store.subject_prefixes(),
        server.store.subject_counts(),
    ) {
        (Some(prefixes), Some((live, erased))) => println!(
            "annals: data subjects on: tags beginning {} are sealed under their subject's key \
             ({live} subjects with a key, {erased} erased)",
            prefixes.join(", ")
        ),
        _ => println!("annals: data subjects off: events are stored as given"),
    }
    if let Some(mirror) = &report.mirror {
        let kept = match (&mirror.kept, mirror.resumed_at, &mirror.rebuilt) {
            // Named, with the room left there: the copy is as large as the log, and the
            // file system of temporary files is often small.
            (None, _, _) => format!(
                "in the temporary directory {}{}, removed at stop (--mirror DIR keeps it \
                 elsewhere, across restarts)",
                server.store.dir().display(),
                match server.store.io().available_bytes(server.store.dir()) {
                    Ok(Some(free)) => format!(" ({:.1} GiB free there)", free as f64 / GIB),
                    _ => String::new(),
                }
            ),
            (Some(dir), Some(at), _) => {
                format!("kept in {}, used as closed at position {at}", dir.display())
            }
            (Some(dir), None, why) => format!(
                "kept in {}, filled from the {source}: {}",
                dir.display(),
                why.as_deref().unwrap_or("")
            ),
        };
        println!("annals: the log's copy {kept}; {} {read}", mirror.followed);
    }
    if let Some(backup) = server.store.stats().backup {
        match &backup.holder {
            Some(holder) => println!(
                "annals: standing by for the backup ({holder}); this server ships once that \
                 server's lease lapses"
            ),
            None => println!(
                "annals: backing up to {} (shipped through position {})",
                backup.url, backup.shipped_through
            ),
        }
    }
    if let Some((path, offset, why)) = &report.torn_tail {
        println!(
            "annals: cut a torn tail in {} at offset {offset}: {why}",
            path.display()
        );
    }
    println!(
        "annals: http {scheme}://{}/v1 ({threads} network threads)",
        server.http_addr
    );
    if console {
        println!("annals: console {scheme}://{}/", server.http_addr);
    }
    if let (Some(started), Some(exchange)) = (server.exchange_started(), &exchange) {
        println!(
            "annals: exchange {} ({}): {} commands in the journal, {} replayed{}, {} live \
             orders, {} symbols added, ready in {:.1} ms; http {scheme}://{}/v1/exchange",
            exchange.mode(),
            exchange.mode().class(),
            started.commands,
            started.replayed,
            started
                .snapshot_position
                .map_or_else(String::new, |p| format!(" after the snapshot at {p}")),
            started.live_orders,
            started.symbols_added,
            started.millis,
            server.http_addr
        );
        for skipped in &started.skipped_snapshots {
            println!("annals: exchange: skipped snapshot {skipped}");
        }
    }
    if let Some(grpc) = server.grpc_addr {
        println!("annals: grpc {scheme}://{grpc} (UmaDB protocol, service umadb.v1.DCB)");
    }
    println!(
        "annals: {}{}",
        if keys == 0 {
            "no API keys: every request is allowed".to_string()
        } else {
            format!("{keys} API keys: requests need Authorization: Bearer <key>")
        },
        if exposed {
            "; listening beyond loopback"
        } else {
            "; loopback only"
        }
    );
    println!(
        "annals: listening http={} grpc={}",
        server.http_addr,
        server
            .grpc_addr
            .map_or_else(|| "off".to_string(), |a| a.to_string())
    );
    let watcher = tokio::spawn(watch_disk(server.store.clone()));
    stop.wait().await;
    watcher.abort();
    println!("annals: shutting down: finishing in-flight requests, then syncing and closing");
    server.shutdown().await?;
    println!("annals: stopped cleanly");
    Ok(())
}

/// Says when the store enters the disk-full state (appends that need a new segment refused)
/// and when there is room again, looking once a second.
async fn watch_disk(store: std::sync::Arc<annals::Store>) {
    let mut full = false;
    loop {
        let stats = {
            let store = store.clone();
            match tokio::task::spawn_blocking(move || store.stats()).await {
                Ok(stats) => stats,
                Err(_) => return,
            }
        };
        match (&stats.disk_full, full) {
            (Some(reason), false) => {
                println!(
                    "annals: disk full: appends that need a new segment are refused (507 \
                     disk_full) until there is room; reads go on: {reason}"
                );
                full = true;
            }
            (None, true) => {
                let free = stats
                    .disk_free_bytes
                    .map_or_else(String::new, |b| format!(" ({b} bytes free)"));
                println!("annals: room on the disk again: appends are taken{free}");
                full = false;
            }
            _ => {}
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// SIGTERM or Ctrl-C (SIGINT), listened for from the start.
struct Stop {
    term: Option<tokio::signal::unix::Signal>,
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl Stop {
    fn listen() -> Stop {
        use tokio::signal::unix::{signal, SignalKind};
        Stop {
            term: signal(SignalKind::terminate()).ok(),
            interrupt: signal(SignalKind::interrupt()).ok(),
        }
    }

    async fn wait(mut self) {
        async fn on(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        if self.term.is_none() && self.interrupt.is_none() {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
        tokio::select! {
            _ = on(&mut self.term) => {}
            _ = on(&mut self.interrupt) => {}
        }
    }
}
