//! Server configuration: defaults, then a TOML file, then `ANNALS_*` environment variables,
//! then command-line flags (applied by the caller), each overriding the one before.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use annals::{Durability, Limits};
use serde::Deserialize;

use crate::auth::{ApiKeys, Scopes};
use crate::readmodels::ReadModelSpec;

pub use annals::is_database_url as is_postgres_url;

/// A connection URL with its password, if any, replaced by `***`.
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user_info, hosts)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{hosts}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Everything `annals serve` needs to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    /// A PostgreSQL connection string: the log lives in that database instead of `data_dir`
    /// (see `annals::Store::open_postgres`).
    pub postgres: Option<String>,
    /// With `postgres` or `replica_of`: where the store keeps its copy of the log across
    /// restarts (`annals::Location`'s `mirror`); None: a temporary directory.
    pub mirror: Option<PathBuf>,
    /// Free space the store leaves alone (`annals::Options::disk_reserve_bytes`); None: one
    /// segment's size.
    pub disk_reserve_bytes: Option<u64>,
    /// Where the log is shipped continuously (`annals::Options::backup`): s3://, gs://, az://
    /// or file:// URL; None: no backup.
    pub backup: Option<String>,
    /// How long the backup's lease holds after its last renewal (`annals::BackupOptions::
    /// lease`): how soon another server may take the backup over once this one is gone.
    pub backup_lease: Duration,
    /// Serve as a read replica of the backup at this URL (`annals::Store::open_replica`)
    /// instead of a store of its own.
    pub replica_of: Option<String>,
    /// The background scrub of sealed segments (`annals::Options::scrub`); None: off.
    pub scrub: Option<annals::ScrubOptions>,
    /// Tag prefixes naming data subjects, whose events are stored encrypted
    /// (`annals::Options::subjects`); empty: none.
    pub subject_tags: Vec<String>,
    /// The file holding the master key (64 hexadecimal characters) that encrypts the
    /// subjects' keys.
    pub master_key_file: Option<PathBuf>,
    /// HTTP listen address; loopback unless asked otherwise.
    pub http_listen: SocketAddr,
    /// gRPC (UmaDB protocol) listen address; `None` disables gRPC.
    pub grpc_listen: Option<SocketAddr>,
    pub durability: Durability,
    pub api_keys: ApiKeys,
    pub tls: Option<TlsFiles>,
    pub limits: ServerLimits,
    /// Threads of the network runtime; `None` means one fewer than the cores (at least one),
    /// leaving a core to the store's writer and syncer threads, which a second runtime thread
    /// would fight for the CPU (docs/DECISIONS.md, R1).
    pub worker_threads: Option<usize>,
    /// Read models the server keeps up to date (see [`crate::readmodels`]).
    pub read_models: Vec<ReadModelSpec>,
    /// Web origins (`scheme://host:port`) whose pages may call the HTTP API from a browser,
    /// besides the server's own. Other origins are refused.
    pub allowed_origins: Vec<String>,
    /// Listen beyond loopback with no API keys, serving anyone who can connect. Refused
    /// unless set.
    pub allow_unauthenticated_network: bool,
    /// Serve the web console at `/` on the HTTP listener (see `console.rs`). Default: on.
    pub console: bool,
    /// The matching engine the server hosts, journaled in its store; `None`: no exchange.
    pub exchange: Option<ExchangeConfig>,
}

/// The hosted exchange (`[exchange]` in the file, `--exchange MODE` on the command line).
#[derive(Debug, Clone)]
pub struct ExchangeConfig {
    /// How the journal is made durable. The store's durability must fit: d3-pipelined and
    /// d3-per-order need d3, d2-critical needs d2; d0 journals nothing.
    pub mode: annals_exchange::Mode,
    /// Symbols the exchange must have (their ids are their places here); more can be added
    /// through `POST /v1/admin/exchange/symbols`.
    pub symbols: Vec<annals_exchange::SymbolSpec>,
    /// A snapshot after this many commands (0: never), and at a clean stop.
    pub snapshot_every: u64,
    /// Requests waiting for the matcher before new ones get 503.
    pub queue_depth: usize,
}

impl ExchangeConfig {
    pub fn new(mode: annals_exchange::Mode) -> ExchangeConfig {
        let defaults = annals_exchange::ServiceOptions::default();
        ExchangeConfig {
            mode,
            symbols: Vec::new(),
            snapshot_every: defaults.snapshot_every,
            queue_depth: defaults.queue_depth,
        }
    }

    /// Checks the mode against the store's durability.
    pub fn check(&self, durability: Durability) -> Result<(), String> {
        match self.mode.store_durability() {
            None => Ok(()),
            Some(needed) if needed == durability => Ok(()),
            Some(needed) => Err(format!(
                "exchange mode {} needs the store in {} (--durability {}), not {}",
                self.mode,
                needed,
                match needed {
                    Durability::Synced => "d3",
                    _ => "d2",
                },
                durability
            )),
        }
    }
}

/// The `[exchange]` section of the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeFile {
    pub mode: Option<String>,
    pub critical_qty: Option<u64>,
    #[serde(default)]
    pub symbols: Vec<SymbolFile>,
    pub snapshot_every: Option<u64>,
    pub queue_depth: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SymbolFile {
    pub tick: u64,
    pub lot: u64,
}

/// Parses an exchange mode, with a critical quantity for d2-critical.
pub fn parse_exchange_mode(
    text: &str,
    critical_qty: Option<u64>,
) -> Result<annals_exchange::Mode, String> {
    let mode: annals_exchange::Mode = text.parse()?;
    match (mode, critical_qty) {
        (annals_exchange::Mode::Critical { .. }, Some(critical_qty)) => {
            Ok(annals_exchange::Mode::Critical { critical_qty })
        }
        (_, Some(_)) => Err("exchange critical_qty applies only to mode d2-critical".into()),
        (mode, None) => Ok(mode),
    }
}

impl Config {
    /// The runtime threads to start (see [`Config::worker_threads`]).
    pub fn runtime_threads(&self) -> usize {
        self.worker_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
        })
    }
}

/// A PEM certificate chain and its private key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Limits the server enforces on clients, on top of the store's own [`Limits`].
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Bytes in one HTTP request body (also the largest gRPC message accepted).
    pub body_bytes_max: usize,
    /// Bytes of the URL-encoded `query` and `options` parameters of a read or subscribe.
    pub query_param_bytes_max: usize,
    /// Open connections per listener; further connections are closed at once.
    pub connections_max: usize,
    /// Open connections per listener from one IP address, so that a few peers cannot take
    /// every slot.
    pub connections_per_peer_max: usize,
    /// Bytes of one request's headers (HTTP/1.1 head, HTTP/2 header list), URL included.
    pub header_list_bytes_max: usize,
    /// HTTP/2 streams open at once on one connection.
    pub streams_per_connection_max: u32,
    /// Live subscriptions (HTTP and gRPC together); further ones get 503 / UNAVAILABLE.
    pub subscribers_max: usize,
    /// Bytes of streamed answers (long reads, subscriptions, market data) the server holds
    /// at once, all connections together; a stream waits for room, and ends after a while.
    pub stream_bytes_max: usize,
    /// The same, for one connection.
    pub stream_bytes_per_connection_max: usize,
    /// Time a client has to send its request headers.
    pub header_timeout: Duration,
    /// Time a client has to send its whole request body.
    pub body_timeout: Duration,
    /// Time in-flight requests get to finish on shutdown before connections are cut.
    pub drain_timeout: Duration,
    /// The store's limits: event size, events per append, tags, query size, queue depth.
    pub store: Limits,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            body_bytes_max: 16 << 20,
            query_param_bytes_max: 64 << 10,
            connections_max: 4096,
            connections_per_peer_max: 1024,
            header_list_bytes_max: 160 << 10,
            streams_per_connection_max: 256,
            subscribers_max: 1024,
            stream_bytes_max: 256 << 20,
            stream_bytes_per_connection_max: 16 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(10),
            store: Limits::default(),
        }
    }
}

pub const DEFAULT_HTTP_PORT: u16 = 7400;
/// The port UmaDB's clients and documentation use.
pub const DEFAULT_GRPC_PORT: u16 = 50051;

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("annals-data"),
            postgres: None,
            mirror: None,
            disk_reserve_bytes: None,
            backup: None,
            backup_lease: annals::BackupOptions::new("").lease,
            replica_of: None,
            scrub: Some(annals::ScrubOptions::default()),
            subject_tags: Vec::new(),
            master_key_file: None,
            http_listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT)),
            grpc_listen: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_GRPC_PORT))),
            durability: Durability::Synced,
            api_keys: ApiKeys::default(),
            tls: None,
            limits: ServerLimits::default(),
            worker_threads: None,
            read_models: Vec::new(),
            allowed_origins: Vec::new(),
            allow_unauthenticated_network: false,
            console: true,
            exchange: None,
        }
    }
}

/// The configuration file, every field optional.
///
/// ```toml
/// data_dir = "/var/lib/annals"     # or store = "postgres://...", with
/// # mirror = "/var/lib/annals-mirror"  # where a PostgreSQL store's (or replica's) copy is kept
/// disk_reserve_bytes = 67108864     # free space left alone; default: one segment
/// backup = "s3://bucket/prefix"      # ship the log there continuously (s3://, gs://, az://, file://)
/// # replica_of = "s3://bucket/prefix"  # serve reads from the backup another server writes
/// scrub_bytes_per_second = 8388608   # re-read sealed segments at most this fast; 0: no scrub
/// scrub_pause_seconds = 600          # the wait before each pass of the scrub
/// backup_lease_seconds = 30          # how soon another server may take a backup over
/// subject_tags = ["customer:"]       # tags naming data subjects: their events are encrypted
/// master_key_file = "/etc/annals/master.key"  # 64 hex characters (annals master-key new)
/// http_listen = "127.0.0.1:7400"
/// grpc_listen = "127.0.0.1:50051"   # "off" disables gRPC
/// durability = "d3"
/// worker_threads = 1                 # network threads; default: cores - 1
/// api_keys_file = "/etc/annals/keys"
/// [tls]
/// cert = "/etc/annals/cert.pem"
/// key = "/etc/annals/key.pem"
/// [limits]
/// body_bytes_max = 16777216
/// event_bytes_max = 1048576
/// [[read_models]]
/// name = "seats-by-course"
/// types = ["StudentEnrolled"]
/// group_by = "course:"
/// [exchange]
/// mode = "d3-pipelined"
/// symbols = [{ tick = 1, lot = 1 }, { tick = 5, lot = 100 }]
/// snapshot_every = 1000000
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub data_dir: Option<PathBuf>,
    /// A directory, or a PostgreSQL URL (postgres://...) for the database backend.
    pub store: Option<String>,
    /// With a store on PostgreSQL: the directory its copy of the log is kept in.
    pub mirror: Option<PathBuf>,
    /// Free space of the log's file system left alone; appends that need a new segment are
    /// refused below it.
    pub disk_reserve_bytes: Option<u64>,
    /// Ship the log continuously into this object storage URL.
    pub backup: Option<String>,
    /// Serve reads from the backup another server writes at this URL.
    pub replica_of: Option<String>,
    /// The scrub's rate (0: no scrub) and its pause before each pass.
    pub scrub_bytes_per_second: Option<u64>,
    pub scrub_pause_seconds: Option<f64>,
    pub backup_lease_seconds: Option<u64>,
    /// Tag prefixes naming data subjects, and the file with the master key.
    pub subject_tags: Option<Vec<String>>,
    pub master_key_file: Option<PathBuf>,
    pub http_listen: Option<String>,
    pub grpc_listen: Option<String>,
    pub durability: Option<String>,
    /// Inline keys: `{ key = "...", scopes = ["read", "append"], accounts = [7] }` (accounts,
    /// optional, binds the key to those exchange accounts).
    #[serde(default)]
    pub api_keys: Vec<KeyEntry>,
    pub api_keys_file: Option<PathBuf>,
    pub tls: Option<TlsFiles>,
    pub worker_threads: Option<usize>,
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    pub allow_unauthenticated_network: Option<bool>,
    /// Serve the web console at `/` (default true).
    pub console: Option<bool>,
    #[serde(default)]
    pub limits: LimitsFile,
    #[serde(default)]
    pub read_models: Vec<ReadModelSpec>,
    pub exchange: Option<ExchangeFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub key: String,
    pub scopes: Vec<String>,
    /// Exchange accounts the key may act for and watch; absent: any.
    pub accounts: Option<Vec<u64>>,
}

/// Limits that may be set in the file; absent ones keep their defaults.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    pub body_bytes_max: Option<usize>,
    pub query_param_bytes_max: Option<usize>,
    pub connections_max: Option<usize>,
    pub connections_per_peer_max: Option<usize>,
    pub header_list_bytes_max: Option<usize>,
    pub streams_per_connection_max: Option<u32>,
    pub subscribers_max: Option<usize>,
    pub stream_bytes_max: Option<usize>,
    pub stream_bytes_per_connection_max: Option<usize>,
    pub header_timeout_ms: Option<u64>,
    pub body_timeout_ms: Option<u64>,
    pub drain_timeout_ms: Option<u64>,
    pub event_bytes_max: Option<usize>,
    pub events_per_append_max: Option<usize>,
    pub append_bytes_max: Option<usize>,
    pub tags_per_event_max: Option<usize>,
    pub tag_bytes_max: Option<usize>,
    pub type_bytes_max: Option<usize>,
    pub query_items_max: Option<usize>,
    pub query_item_values_max: Option<usize>,
    pub queue_depth_max: Option<usize>,
}

/// An environment variable that turns something on or off.
fn switch(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(format!(
            "{name}: {value:?} is not true or false (on or off)"
        )),
    }
}

/// Parses a listen address; `off` (for gRPC) disables the listener.
pub fn parse_listen(value: &str) -> Result<Option<SocketAddr>, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| {
        format!("invalid listen address {value:?}: expected host:port, like 127.0.0.1:7400")
    })
}

fn required_listen(value: &str, what: &str) -> Result<SocketAddr, String> {
    parse_listen(value)?.ok_or_else(|| format!("{what} cannot be off"))
}

impl Config {
    /// Where the log lives: a directory, or a PostgreSQL URL (`postgres://` or
    /// `postgresql://`).
    pub fn set_store(&mut self, store: &str) {
        if is_postgres_url(store) {
            self.postgres = Some(store.to_owned());
        } else {
            self.postgres = None;
            self.data_dir = PathBuf::from(store);
        }
    }

    /// Where the log lives, for messages: the directory, or the database without its password.
    pub fn store_description(&self) -> String {
        match (&self.replica_of, &self.postgres) {
            (Some(url), _) => format!("a read replica of the backup at {url}"),
            (None, Some(url)) => format!("PostgreSQL {}", redact_password(url)),
            (None, None) => self.data_dir.display().to_string(),
        }
    }

    /// Applies a configuration file on top of `self`.
    pub fn apply_file(&mut self, path: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        let file: ConfigFile =
            toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
        if let Some(dir) = file.data_dir {
            self.data_dir = dir;
        }
        if let Some(store) = file.store {
            self.set_store(&store);
        }
        if let Some(mirror) = file.mirror {
            self.mirror = Some(mirror);
        }
        if let Some(reserve) = file.disk_reserve_bytes {
            self.disk_reserve_bytes = Some(reserve);
        }
        if let Some(url) = file.backup {
            self.backup = Some(url);
        }
        if let Some(url) = file.replica_of {
            self.replica_of = Some(url);
        }
        if let Some(rate) = file.scrub_bytes_per_second {
            self.set_scrub_rate(rate);
        }
        if let Some(pause) = file.scrub_pause_seconds {
            self.set_scrub_pause(pause)?;
        }
        if let Some(seconds) = file.backup_lease_seconds {
            self.set_backup_lease(seconds)?;
        }
        if let Some(tags) = file.subject_tags {
            self.subject_tags = tags;
        }
        if let Some(file) = file.master_key_file {
            self.master_key_file = Some(file);
        }
        if let Some(v) = file.http_listen {
            self.http_listen = required_listen(&v, "http_listen")?;
        }
        if let Some(v) = file.grpc_listen {
            self.grpc_listen = parse_listen(&v)?;
        }
        if let Some(v) = file.durability {
            self.durability = v.parse()?;
        }
        for entry in file.api_keys {
            let scopes = Scopes::parse_list(entry.scopes.iter().map(String::as_str))?;
            self.api_keys
                .insert_bound(entry.key, scopes, entry.accounts)?;
        }
        if let Some(keys) = file.api_keys_file {
            self.api_keys.load_file(&keys)?;
        }
        if let Some(tls) = file.tls {
            self.tls = Some(tls);
        }
        if let Some(n) = file.worker_threads {
            self.worker_threads = Some(n.max(1));
        }
        for origin in file.allowed_origins {
            self.add_allowed_origin(&origin)
                .map_err(|e| format!("config file {}: {e}", path.display()))?;
        }
        if let Some(console) = file.console {
            self.console = console;
        }
        if let Some(allow) = file.allow_unauthenticated_network {
            self.allow_unauthenticated_network = allow;
        }
        self.limits.apply(&file.limits);
        for spec in file.read_models {
            spec.validate()
                .map_err(|e| format!("config file {}: {e}", path.display()))?;
            if self.read_models.iter().any(|s| s.name == spec.name) {
                return Err(format!(
                    "config file {}: read model {:?} is declared twice",
                    path.display(),
                    spec.name
                ));
            }
            self.read_models.push(spec);
        }
        if let Some(file) = file.exchange {
            let mode = parse_exchange_mode(file.mode.as_deref().unwrap_or("d3"), file.critical_qty)
                .map_err(|e| format!("config file {}: {e}", path.display()))?;
            let mut exchange = ExchangeConfig::new(mode);
            for (i, s) in file.symbols.iter().enumerate() {
                if s.tick == 0 || s.lot == 0 {
                    return Err(format!(
                        "config file {}: exchange symbol {i}: tick and lot must be positive",
                        path.display()
                    ));
                }
                exchange.symbols.push(annals_exchange::SymbolSpec {
                    tick: s.tick,
                    lot: s.lot,
                });
            }
            if let Some(n) = file.snapshot_every {
                exchange.snapshot_every = n;
            }
            if let Some(n) = file.queue_depth {
                exchange.queue_depth = n.max(1);
            }
            self.exchange = Some(exchange);
        }
        Ok(())
    }

    /// The scrub's rate; 0 turns it off.
    fn set_scrub_rate(&mut self, bytes_per_second: u64) {
        if bytes_per_second == 0 {
            self.scrub = None;
        } else {
            self.scrub
                .get_or_insert_with(Default::default)
                .bytes_per_second = bytes_per_second;
        }
    }

    fn set_backup_lease(&mut self, seconds: u64) -> Result<(), String> {
        if seconds == 0 {
            return Err("the backup's lease must hold for at least one second".into());
        }
        self.backup_lease = Duration::from_secs(seconds);
        Ok(())
    }

    fn set_scrub_pause(&mut self, seconds: f64) -> Result<(), String> {
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(format!(
                "the scrub's pause must be a positive number of seconds, not {seconds}"
            ));
        }
        if let Some(scrub) = &mut self.scrub {
            scrub.pause = Duration::from_secs_f64(seconds);
        }
        Ok(())
    }

    /// Applies `ANNALS_*` variables from `vars` (normally `std::env::vars()`).
    pub fn apply_env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), String> {
        let mut cert = None;
        let mut key = None;
        for (name, value) in vars {
            match name.as_str() {
                "ANNALS_DATA_DIR" => self.data_dir = PathBuf::from(value),
                "ANNALS_STORE" => self.set_store(&value),
                "ANNALS_MIRROR" => self.mirror = Some(PathBuf::from(value)),
                "ANNALS_BACKUP" => self.backup = Some(value),
                "ANNALS_REPLICA_OF" => self.replica_of = Some(value),
                "ANNALS_SUBJECT_TAGS" => self.subject_tags = split_list(&value),
                "ANNALS_MASTER_KEY_FILE" => self.master_key_file = Some(PathBuf::from(value)),
                "ANNALS_SCRUB_BYTES_PER_SECOND" => self.set_scrub_rate(
                    value
                        .parse()
                        .map_err(|_| format!("{name}: {value:?} is not a number of bytes"))?,
                ),
                "ANNALS_BACKUP_LEASE_SECONDS" => {
                    self.set_backup_lease(value.parse().map_err(|_| {
                        format!("{name}: {value:?} is not a whole number of seconds")
                    })?)?
                }
                "ANNALS_SCRUB_PAUSE_SECONDS" => self.set_scrub_pause(
                    value
                        .parse()
                        .map_err(|_| format!("{name}: {value:?} is not a number of seconds"))?,
                )?,
                "ANNALS_DISK_RESERVE_BYTES" => {
                    self.disk_reserve_bytes = Some(
                        value
                            .parse()
                            .map_err(|_| format!("{name}: {value:?} is not a number of bytes"))?,
                    )
                }
                "ANNALS_HTTP_LISTEN" => self.http_listen = required_listen(&value, &name)?,
                "ANNALS_GRPC_LISTEN" => self.grpc_listen = parse_listen(&value)?,
                "ANNALS_DURABILITY" => self.durability = value.parse()?,
                "ANNALS_API_KEYS" => self.api_keys.parse_inline(&value)?,
                "ANNALS_API_KEYS_FILE" => self.api_keys.load_file(Path::new(&value))?,
                "ANNALS_TLS_CERT" => cert = Some(PathBuf::from(value)),
                "ANNALS_TLS_KEY" => key = Some(PathBuf::from(value)),
                "ANNALS_EXCHANGE" => self.set_exchange_mode(&value)?,
                "ANNALS_ALLOWED_ORIGINS" => {
                    for origin in value.split(',').filter(|o| !o.trim().is_empty()) {
                        self.add_allowed_origin(origin)?;
                    }
                }
                "ANNALS_CONSOLE" => self.console = switch(&name, &value)?,
                "ANNALS_ALLOW_UNAUTHENTICATED_NETWORK" => {
                    self.allow_unauthenticated_network = switch(&name, &value)?
                }
                "ANNALS_WORKER_THREADS" => {
                    let n: usize = value
                        .parse()
                        .map_err(|_| format!("ANNALS_WORKER_THREADS: not a number: {value:?}"))?;
                    self.worker_threads = Some(n.max(1));
                }
                _ => {}
            }
        }
        match (cert, key) {
            (Some(cert), Some(key)) => self.tls = Some(TlsFiles { cert, key }),
            (None, None) => {}
            _ => return Err("ANNALS_TLS_CERT and ANNALS_TLS_KEY must be given together".into()),
        }
        Ok(())
    }

    /// Hosts the exchange in `mode` ("off" removes it), keeping other exchange settings.
    pub fn set_exchange_mode(&mut self, mode: &str) -> Result<(), String> {
        if mode.eq_ignore_ascii_case("off") {
            self.exchange = None;
            return Ok(());
        }
        let mode = parse_exchange_mode(mode, None)?;
        match &mut self.exchange {
            Some(exchange) => {
                // Keep a configured critical quantity when the mode stays d2-critical.
                if !matches!(
                    (exchange.mode, mode),
                    (
                        annals_exchange::Mode::Critical { .. },
                        annals_exchange::Mode::Critical { .. }
                    )
                ) {
                    exchange.mode = mode;
                }
            }
            None => self.exchange = Some(ExchangeConfig::new(mode)),
        }
        Ok(())
    }

    /// Adds a web origin allowed to call the API from a browser: `scheme://host[:port]`.
    pub fn add_allowed_origin(&mut self, origin: &str) -> Result<(), String> {
        let origin = origin.trim().trim_end_matches('/');
        let valid = (origin.starts_with("http://") || origin.starts_with("https://"))
            && !origin["https://".len().min(origin.len())..].contains('/');
        if !valid {
            return Err(format!(
                "allowed origin {origin:?}: expected scheme://host[:port], as a browser sends it"
            ));
        }
        self.allowed_origins.push(origin.to_ascii_lowercase());
        Ok(())
    }

    /// The data subjects the store is opened with: the tag prefixes and the master key read
    /// from its file. Tags without a key file, or a key file without tags, are refused.
    pub fn subjects(&self) -> Result<Option<annals::SubjectOptions>, String> {
        match (&self.master_key_file, self.subject_tags.is_empty()) {
            (None, true) => Ok(None),
            (None, false) => Err("subject tags need the master key that encrypts the \
                 subjects' keys: --master-key-file FILE (annals master-key new prints one)"
                .into()),
            (Some(file), true) => Err(format!(
                "a master key file ({}) without subject tags: name the tag prefixes of data \
                 subjects (--subject-tags customer:,employee:)",
                file.display()
            )),
            (Some(file), false) => {
                let text = std::fs::read_to_string(file).map_err(|e| {
                    format!("cannot read the master key file {}: {e}", file.display())
                })?;
                let key = annals::MasterKey::from_hex(&text)
                    .map_err(|e| format!("the master key file {}: {e}", file.display()))?;
                let subjects = annals::SubjectOptions::new(self.subject_tags.clone(), key);
                Ok(Some(subjects))
            }
        }
    }

    /// The reason to refuse this configuration at start, if any: a listener beyond loopback
    /// with no API keys, unless explicitly allowed.
    pub fn refusal(&self) -> Option<String> {
        if self.replica_of.is_some() && (self.backup.is_some() || self.exchange.is_some()) {
            return Some(
                "a read replica serves reads only: it ships no backup of its own and hosts no \
                 exchange (drop --backup and --exchange)"
                    .into(),
            );
        }
        if self.exposed() && self.api_keys.is_empty() && !self.allow_unauthenticated_network {
            return Some(format!(
                "refusing to listen beyond loopback (http {}, grpc {}) without API keys: anyone \
                 who can connect could read and append. Configure keys (--api-keys-file FILE, \
                 ANNALS_API_KEYS=key=read,append or api_keys in the config file), or pass \
                 --allow-unauthenticated-network to serve everyone on purpose",
                self.http_listen,
                self.grpc_listen
                    .map_or_else(|| "off".to_string(), |a| a.to_string())
            ));
        }
        None
    }

    /// True when a listener is bound beyond loopback.
    pub fn exposed(&self) -> bool {
        !self.http_listen.ip().is_loopback()
            || self.grpc_listen.is_some_and(|a| !a.ip().is_loopback())
    }
}

impl ServerLimits {
    fn apply(&mut self, file: &LimitsFile) {
        fn set<T: Copy>(target: &mut T, value: Option<T>) {
            if let Some(v) = value {
                *target = v;
            }
        }
        set(&mut self.body_bytes_max, file.body_bytes_max);
        set(&mut self.query_param_bytes_max, file.query_param_bytes_max);
        set(&mut self.connections_max, file.connections_max);
        set(
            &mut self.connections_per_peer_max,
            file.connections_per_peer_max,
        );
        set(&mut self.header_list_bytes_max, file.header_list_bytes_max);
        set(
            &mut self.streams_per_connection_max,
            file.streams_per_connection_max,
        );
        set(&mut self.subscribers_max, file.subscribers_max);
        set(&mut self.stream_bytes_max, file.stream_bytes_max);
        set(
            &mut self.stream_bytes_per_connection_max,
            file.stream_bytes_per_connection_max,
        );
        if let Some(ms) = file.header_timeout_ms {
            self.header_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = file.body_timeout_ms {
            self.body_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = file.drain_timeout_ms {
            self.drain_timeout = Duration::from_millis(ms);
        }
        let s = &mut self.store;
        set(&mut s.event_bytes_max, file.event_bytes_max);
        set(&mut s.events_per_append_max, file.events_per_append_max);
        set(&mut s.append_bytes_max, file.append_bytes_max);
        set(&mut s.tags_per_event_max, file.tags_per_event_max);
        set(&mut s.tag_bytes_max, file.tag_bytes_max);
        set(&mut s.type_bytes_max, file.type_bytes_max);
        set(&mut s.query_items_max, file.query_items_max);
        set(&mut s.query_item_values_max, file.query_item_values_max);
        set(&mut s.queue_depth_max, file.queue_depth_max);
    }
}

/// A comma-separated list, trimmed, empty items dropped.
pub fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the server's settings come from the defaults, then the configuration file, then the
    /// environment, each overriding the one before, and unrelated variables are ignored.
    #[test]
    fn file_then_env_override_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("annals.toml");
        std::fs::write(
            &path,
            r#"
data_dir = "/srv/annals"
grpc_listen = "off"
durability = "d2"
mirror = "/srv/mirror"
backup_lease_seconds = 12
api_keys = [{ key = "file-key-0123456789", scopes = ["read"] }]
[limits]
tags_per_event_max = 4
body_timeout_ms = 500
"#,
        )
        .unwrap();
        let mut config = Config::default();
        config.apply_file(&path).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/srv/annals"));
        assert_eq!(config.grpc_listen, None);
        assert_eq!(config.durability, Durability::SyncedLater);
        assert_eq!(config.mirror, Some(PathBuf::from("/srv/mirror")));
        assert_eq!(config.backup_lease, Duration::from_secs(12));
        assert_eq!(config.limits.store.tags_per_event_max, 4);
        assert_eq!(config.limits.body_timeout, Duration::from_millis(500));
        assert!(!config.api_keys.is_empty());
        config
            .apply_env([
                ("ANNALS_DURABILITY".to_string(), "d3".to_string()),
                ("ANNALS_HTTP_LISTEN".to_string(), "0.0.0.0:9000".to_string()),
                ("ANNALS_MIRROR".to_string(), "/var/mirror".to_string()),
                ("ANNALS_BACKUP_LEASE_SECONDS".to_string(), "5".to_string()),
                ("UNRELATED".to_string(), "x".to_string()),
            ])
            .unwrap();
        assert_eq!(config.durability, Durability::Synced);
        assert_eq!(config.backup_lease, Duration::from_secs(5));
        assert_eq!(config.mirror, Some(PathBuf::from("/var/mirror")));
        assert!(config.exposed());
    }

    /// Goal: a mistyped configuration key or a bad value from the environment is refused with a
    /// reason that says what is wrong, rather than ignored.
    #[test]
    fn bad_files_and_values_are_rejected_with_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("annals.toml");
        std::fs::write(&path, "data_dri = \"x\"\n").unwrap();
        let err = Config::default().apply_file(&path).unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
        let err = Config::default()
            .apply_env([("ANNALS_DURABILITY".to_string(), "d9".to_string())])
            .unwrap_err();
        assert!(err.contains("unknown durability"), "{err}");
        let err = Config::default()
            .apply_env([("ANNALS_TLS_CERT".to_string(), "c.pem".to_string())])
            .unwrap_err();
        assert!(err.contains("together"), "{err}");
        let err = Config::default()
            .apply_env([(
                "ANNALS_ALLOW_UNAUTHENTICATED_NETWORK".to_string(),
                "maybe".to_string(),
            )])
            .unwrap_err();
        assert!(err.contains("not true or false"), "{err}");
        let err = Config::default()
            .apply_env([(
                "ANNALS_ALLOWED_ORIGINS".to_string(),
                "evil.example".to_string(),
            )])
            .unwrap_err();
        assert!(err.contains("scheme://host"), "{err}");
        for lease in ["0", "-1", "soon"] {
            let err = Config::default()
                .apply_env([("ANNALS_BACKUP_LEASE_SECONDS".to_string(), lease.to_string())])
                .unwrap_err();
            assert!(err.contains("second"), "{lease}: {err}");
        }
        assert!(parse_listen("nowhere").is_err());
        assert_eq!(parse_listen("OFF").unwrap(), None);
    }
}
