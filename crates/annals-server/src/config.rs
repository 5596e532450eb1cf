//! Server configuration: every setting of `annals serve` in one struct, [`Config`], layered by
//! figment: the defaults, then a TOML file, then `ANNALS_*` environment variables, then
//! command-line flags, each replacing what the one before set. A setting has one name,
//! dotted where it sits in a table (`limits.body_bytes_max`): that is its key in the file;
//! its variable is `ANNALS_` and the name in capitals with `_` for the dots
//! (`ANNALS_LIMITS_BODY_BYTES_MAX`). docs/SERVER.md has the table of every setting with its
//! four names, which a test holds to [`settings`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use annals::{Durability, Limits};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};

use crate::auth::{ApiKeys, Scopes};
use crate::readmodels::ReadModelSpec;

pub use annals::is_database_url as is_postgres_url;

pub const DEFAULT_HTTP_PORT: u16 = 7400;
/// The port UmaDB's clients and documentation use.
pub const DEFAULT_GRPC_PORT: u16 = 50051;

/// Everything `annals serve` needs to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the log lives: a data directory, or a PostgreSQL URL (`postgres://` or
    /// `postgresql://`; see `annals::Store::open_postgres`). `data_dir` is its other name.
    pub store: String,
    /// With a store on PostgreSQL or a replica: where the store keeps its copy of the log
    /// across restarts (`annals::Location`'s `mirror`); None: a temporary directory.
    pub mirror: Option<PathBuf>,
    /// Free space the store leaves alone (`annals::Options::disk_reserve_bytes`); None: one
    /// segment's size.
    pub disk_reserve_bytes: Option<u64>,
    /// Where the log is shipped continuously (`annals::Options::backup`): s3://, gs://, az://
    /// or file:// URL; None: no backup.
    pub backup: Option<String>,
    /// How long the backup's lease holds after its last renewal (`annals::BackupOptions::
    /// lease`): how soon another server may take the backup over once this one is gone.
    pub backup_lease_seconds: u64,
    /// Serve as a read replica of the backup at this URL (`annals::Store::open_replica`)
    /// instead of a store of its own.
    pub replica_of: Option<String>,
    /// The background scrub of sealed segments (`annals::Options::scrub`): its rate, 0 for
    /// none, and its pause before each pass.
    pub scrub_bytes_per_second: u64,
    pub scrub_pause_seconds: f64,
    /// Tag prefixes naming data subjects, whose events are stored encrypted
    /// (`annals::Options::subjects`); empty: none. A list, or one comma-separated string.
    #[serde(deserialize_with = "list")]
    pub subject_tags: Vec<String>,
    /// The file holding the master key (64 hexadecimal characters) that encrypts the
    /// subjects' keys.
    pub master_key_file: Option<PathBuf>,
    /// HTTP listen address; loopback unless asked otherwise.
    #[serde(with = "listen")]
    pub http_listen: SocketAddr,
    /// gRPC (UmaDB protocol) listen address; `off` (None) disables gRPC.
    #[serde(with = "optional_listen")]
    pub grpc_listen: Option<SocketAddr>,
    #[serde(with = "text")]
    pub durability: Durability,
    /// API keys given inline: a list of `{ key, scopes, accounts }` tables, or one string
    /// `key=scope,scope;key2=scope` (the form for the environment).
    #[serde(deserialize_with = "keys")]
    pub api_keys: Vec<KeyEntry>,
    /// A file of API keys, one `key scope,scope [accounts=1,2]` per line.
    pub api_keys_file: Option<PathBuf>,
    pub tls: Option<TlsFiles>,
    /// Threads of the network runtime; `None` means one fewer than the cores (at least one),
    /// leaving a core to the store's writer and syncer threads, which a second runtime thread
    /// would fight for the CPU (docs/DECISIONS.md, R1).
    pub worker_threads: Option<usize>,
    /// Web origins (`scheme://host:port`) whose pages may call the HTTP API from a browser,
    /// besides the server's own. Other origins are refused.
    #[serde(deserialize_with = "list")]
    pub allowed_origins: Vec<String>,
    /// Listen beyond loopback with no API keys, serving anyone who can connect. Refused
    /// unless set.
    pub allow_unauthenticated_network: bool,
    /// Serve the web console at `/` on the HTTP listener (see `console.rs`).
    pub console: bool,
    pub limits: ServerLimits,
    /// Read models the server keeps up to date (see [`crate::readmodels`]).
    pub read_models: Vec<ReadModelSpec>,
    /// The matching engine the server hosts, journaled in its store; `None`: no exchange.
    pub exchange: Option<ExchangeConfig>,
    /// Event schemas registered at start: a JSON Schema file per event type. A file equal to
    /// its type's newest version registers nothing; a new one is checked against the stored
    /// events like any registration, and a start whose schema they break fails.
    pub schemas: Vec<SchemaFile>,
    /// Set at start: whether events of types without a schema are taken (`allow`) or
    /// refused (`refuse`); None leaves the store's setting as it is (`allow` at first).
    pub schema_unknown_types: Option<annals::registry::UnknownTypes>,
    /// Traces exported over OTLP (see [`crate::telemetry`]): the `[telemetry]` table, whose
    /// values the standard `OTEL_*` variables override. Nothing is exported without an
    /// endpoint.
    pub telemetry: crate::telemetry::TelemetryConfig,
}

impl Default for Config {
    fn default() -> Self {
        let scrub = annals::ScrubOptions::default();
        Config {
            store: "annals-data".into(),
            mirror: None,
            disk_reserve_bytes: None,
            backup: None,
            backup_lease_seconds: annals::BackupOptions::new("").lease.as_secs(),
            replica_of: None,
            scrub_bytes_per_second: scrub.bytes_per_second,
            scrub_pause_seconds: scrub.pause.as_secs_f64(),
            subject_tags: Vec::new(),
            master_key_file: None,
            http_listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT)),
            grpc_listen: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_GRPC_PORT))),
            durability: Durability::Synced,
            api_keys: Vec::new(),
            api_keys_file: None,
            tls: None,
            worker_threads: None,
            allowed_origins: Vec::new(),
            allow_unauthenticated_network: false,
            console: true,
            limits: ServerLimits::default(),
            read_models: Vec::new(),
            exchange: None,
            schemas: Vec::new(),
            schema_unknown_types: None,
            telemetry: Default::default(),
        }
    }
}

/// An event type's schema, registered at start (see [`Config::schemas`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaFile {
    #[serde(rename = "type")]
    pub event_type: String,
    pub file: PathBuf,
}

/// An API key given in the configuration.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub key: String,
    pub scopes: Vec<String>,
    /// Exchange accounts the key may act for and watch; absent: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accounts: Option<Vec<u64>>,
}

impl std::fmt::Debug for KeyEntry {
    /// The key itself is never written, so that a logged configuration does not give it away.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyEntry")
            .field("key", &"***")
            .field("scopes", &self.scopes)
            .field("accounts", &self.accounts)
            .finish()
    }
}

/// A PEM certificate chain and its private key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The hosted exchange (`[exchange]` in the file, `--exchange MODE` on the command line).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExchangeConfig {
    /// How the journal is made durable; `off` hosts no exchange. The store's durability
    /// must fit: d3-pipelined and d3-per-order need d3, d2-critical needs d2; d0 journals
    /// nothing.
    #[serde(with = "exchange_mode")]
    pub mode: Option<annals_exchange::Mode>,
    /// For d2-critical: orders of at least this quantity are journaled before their answer;
    /// other modes leave it aside.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critical_qty: Option<u64>,
    /// Symbols the exchange must have (their ids are their places here); more can be added
    /// through `POST /v1/admin/exchange/symbols`.
    pub symbols: Vec<SymbolEntry>,
    /// A snapshot after this many commands (0: never), and at a clean stop.
    pub snapshot_every: u64,
    /// Requests waiting for the matcher before new ones get 503.
    pub queue_depth: usize,
}

/// A symbol's trading rules as the configuration gives them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SymbolEntry {
    pub tick: u64,
    pub lot: u64,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        let defaults = annals_exchange::ServiceOptions::default();
        ExchangeConfig {
            mode: Some(annals_exchange::Mode::Pipelined),
            critical_qty: None,
            symbols: Vec::new(),
            snapshot_every: defaults.snapshot_every,
            queue_depth: defaults.queue_depth,
        }
    }
}

impl ExchangeConfig {
    pub fn new(mode: annals_exchange::Mode) -> ExchangeConfig {
        ExchangeConfig {
            mode: Some(mode),
            ..ExchangeConfig::default()
        }
    }

    /// The journal's mode, with its critical quantity for d2-critical.
    pub fn mode(&self) -> annals_exchange::Mode {
        match (self.mode, self.critical_qty) {
            (Some(annals_exchange::Mode::Critical { .. }), Some(critical_qty)) => {
                annals_exchange::Mode::Critical { critical_qty }
            }
            (mode, _) => mode.unwrap_or(annals_exchange::Mode::Pipelined),
        }
    }

    pub fn symbols(&self) -> Vec<annals_exchange::SymbolSpec> {
        let spec = |s: &SymbolEntry| annals_exchange::SymbolSpec {
            tick: s.tick,
            lot: s.lot,
        };
        self.symbols.iter().map(spec).collect()
    }

    /// Checks the settings, and the mode against the store's durability.
    pub fn check(&self, durability: Durability) -> Result<(), String> {
        let mode = self.mode();
        // A critical quantity is the d2-critical mode's; another mode given by a later layer
        // (`--exchange d3`) leaves it aside.
        if let Some(i) = self.symbols.iter().position(|s| s.tick == 0 || s.lot == 0) {
            return Err(format!(
                "exchange symbol {i}: tick and lot must be positive"
            ));
        }
        if self.queue_depth == 0 {
            return Err("exchange.queue_depth must be at least 1".into());
        }
        match mode.store_durability() {
            None => Ok(()),
            Some(needed) if needed == durability => Ok(()),
            Some(needed) => Err(format!(
                "exchange mode {} needs the store in {} (--durability {}), not {}",
                mode,
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

/// Limits the server enforces on clients, and the store's own ([`ServerLimits::store`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    #[serde(rename = "header_timeout_ms", with = "millis")]
    pub header_timeout: Duration,
    /// Time a client has to send its whole request body.
    #[serde(rename = "body_timeout_ms", with = "millis")]
    pub body_timeout: Duration,
    /// Time in-flight requests get to finish on shutdown before connections are cut.
    #[serde(rename = "drain_timeout_ms", with = "millis")]
    pub drain_timeout: Duration,
    // The store's limits (`annals::Limits`, documented there), in the same table.
    pub event_bytes_max: usize,
    pub events_per_append_max: usize,
    pub append_bytes_max: usize,
    pub tags_per_event_max: usize,
    pub tag_bytes_max: usize,
    pub type_bytes_max: usize,
    pub query_items_max: usize,
    pub query_item_values_max: usize,
    pub queue_depth_max: usize,
    pub snapshot_bytes_max: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        let store = Limits::default();
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
            event_bytes_max: store.event_bytes_max,
            events_per_append_max: store.events_per_append_max,
            append_bytes_max: store.append_bytes_max,
            tags_per_event_max: store.tags_per_event_max,
            tag_bytes_max: store.tag_bytes_max,
            type_bytes_max: store.type_bytes_max,
            query_items_max: store.query_items_max,
            query_item_values_max: store.query_item_values_max,
            queue_depth_max: store.queue_depth_max,
            snapshot_bytes_max: store.snapshot_bytes_max,
        }
    }
}

impl ServerLimits {
    /// The store's limits: event size, events per append, tags, query size, queue depth.
    pub fn store(&self) -> Limits {
        Limits {
            event_bytes_max: self.event_bytes_max,
            events_per_append_max: self.events_per_append_max,
            append_bytes_max: self.append_bytes_max,
            tags_per_event_max: self.tags_per_event_max,
            tag_bytes_max: self.tag_bytes_max,
            type_bytes_max: self.type_bytes_max,
            query_items_max: self.query_items_max,
            query_item_values_max: self.query_item_values_max,
            queue_depth_max: self.queue_depth_max,
            snapshot_bytes_max: self.snapshot_bytes_max,
        }
    }
}

/// One layer of settings from one source (a file, the environment, the flags), each setting
/// at its dotted name; a figment provider.
#[derive(Debug)]
pub struct Layer {
    name: String,
    dict: Dict,
}

/// Variables beginning `ANNALS_` that are not settings of the server: the file's path, the
/// log's level, and the command line's client.
const OTHER_VARIABLES: &[&str] = &["CONFIG", "LOG", "URL", "API_KEY", "CA_CERT"];

impl Layer {
    pub fn new(name: impl Into<String>) -> Layer {
        Layer {
            name: name.into(),
            dict: Dict::new(),
        }
    }

    /// Sets the setting at `key` (dotted for a table's).
    pub fn set(&mut self, key: &str, value: impl Serialize) -> Result<(), String> {
        let value = Value::serialize(value).map_err(|e| format!("{key}: {e}"))?;
        let (tables, last) = match key.rsplit_once('.') {
            Some((tables, last)) => (tables.split('.').collect(), last),
            None => (Vec::new(), key),
        };
        let mut dict = &mut self.dict;
        for table in tables {
            let entry = dict
                .entry(table.to_string())
                .or_insert_with(|| Value::from(Dict::new()));
            if entry.as_dict().is_none() {
                *entry = Value::from(Dict::new());
            }
            dict = match entry {
                Value::Dict(_, d) => d,
                _ => unreachable!("made a table above"),
            };
        }
        dict.insert(last.to_string(), value);
        Ok(())
    }

    /// The TOML file at `path`.
    pub fn file(path: &Path) -> Result<Layer, String> {
        let name = format!("config file {}", path.display());
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| format!("{name}: {e}"))?;
        if let Some(dir) = table.remove("data_dir") {
            if table.contains_key("store") {
                return Err(format!(
                    "{name}: data_dir and store name one setting: give one"
                ));
            }
            table.insert("store".into(), dir);
        }
        let Value::Dict(_, dict) = Value::serialize(table).map_err(|e| format!("{name}: {e}"))?
        else {
            unreachable!("a TOML document is a table");
        };
        Ok(Layer { name, dict })
    }

    /// The `ANNALS_*` variables among `vars` (normally `std::env::vars()`) that name settings.
    /// A list's value that begins with `[` is read as a TOML list (of tables, say); any other
    /// value is a string, read as the setting needs it (a number, `on` or `off`); an empty one
    /// is as if unset. A variable that names no setting is returned, for the caller to warn of.
    pub fn env(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(Layer, Vec<String>), String> {
        let known = settings();
        let mut layer = Layer::new("the environment");
        let mut unknown = Vec::new();
        // ANNALS_STORE and its other name, ANNALS_DATA_DIR: one of them, or which wins would
        // depend on the environment's order.
        let mut store_named = None;
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix("ANNALS_") else {
                continue;
            };
            if matches!(rest, "STORE" | "DATA_DIR") && !value.is_empty() {
                if let Some(other) = store_named.replace(name.clone()) {
                    return Err(format!(
                        "{other} and {name} name one setting (where the log lives): give one"
                    ));
                }
            }
            if OTHER_VARIABLES.contains(&rest) {
                continue;
            }
            let Some(key) = setting_of_variable(rest, &known) else {
                unknown.push(name);
                continue;
            };
            // An empty variable is as if it were unset (`ANNALS_API_KEYS=${KEYS}` with KEYS
            // unset must not replace the file's keys with none).
            if value.is_empty() {
                continue;
            }
            // A list may be given as a TOML value; its error names no part of the value, which
            // may hold a key.
            if known.get(&key) == Some(&"list") && value.trim_start().starts_with('[') {
                let parsed: toml::Table = toml::from_str(&format!("v = {value}"))
                    .map_err(|e| format!("{name}: not a TOML list: {}", e.message()))?;
                layer.set(&key, &parsed["v"])?;
            } else {
                layer.set(&key, value)?;
            }
        }
        Ok((layer, unknown))
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name.clone())
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Ok(Map::from([(Profile::Default, self.dict.clone())]))
    }
}

/// The setting an `ANNALS_` variable names (without its prefix), if any: the setting whose
/// dotted name in capitals, dots as `_`, it is; `EXCHANGE` is `exchange.mode`, `DATA_DIR`
/// is `store`.
fn setting_of_variable(rest: &str, known: &BTreeMap<String, &'static str>) -> Option<String> {
    match rest {
        "EXCHANGE" => return Some("exchange.mode".into()),
        "DATA_DIR" => return Some("store".into()),
        _ => {}
    }
    known
        .keys()
        .find(|key| variable(key) == format!("ANNALS_{rest}"))
        .cloned()
}

/// The environment variable of a setting.
pub fn variable(key: &str) -> String {
    format!("ANNALS_{}", key.replace('.', "_").to_ascii_uppercase())
}

/// Every setting's dotted name, with the kind of value it takes: the keys of a configuration
/// with every optional setting given, down to tables (a list of tables is one setting).
pub fn settings() -> BTreeMap<String, &'static str> {
    let full = Config {
        mirror: Some(PathBuf::new()),
        disk_reserve_bytes: Some(0),
        backup: Some(String::new()),
        replica_of: Some(String::new()),
        master_key_file: Some(PathBuf::new()),
        api_keys_file: Some(PathBuf::new()),
        tls: Some(TlsFiles {
            cert: PathBuf::new(),
            key: PathBuf::new(),
        }),
        worker_threads: Some(1),
        exchange: Some(ExchangeConfig {
            critical_qty: Some(1),
            ..ExchangeConfig::default()
        }),
        telemetry: crate::telemetry::TelemetryConfig {
            endpoint: Some(String::new()),
            protocol: Some(String::new()),
            service_name: Some(String::new()),
            sample_ratio: Some(1.0),
            metrics: Some(true),
            metrics_interval_ms: Some(1),
            store_trace_context: Some(true),
        },
        ..Config::default()
    };
    let mut out = BTreeMap::new();
    fn walk(prefix: &str, dict: &Dict, out: &mut BTreeMap<String, &'static str>) {
        for (key, value) in dict {
            let name = match prefix {
                "" => key.clone(),
                _ => format!("{prefix}.{key}"),
            };
            let kind = match value {
                Value::Dict(_, inner) => {
                    walk(&name, inner, out);
                    continue;
                }
                Value::Array(..) => "list",
                Value::Bool(..) => "bool",
                Value::Num(..) => "number",
                _ => "string",
            };
            out.insert(name, kind);
        }
    }
    if let Ok(Value::Dict(_, dict)) = Value::serialize(&full) {
        walk("", &dict, &mut out);
    }
    out
}

impl Config {
    /// The configuration the layers give over the defaults, each replacing what the ones
    /// before set, checked.
    pub fn load(layers: impl IntoIterator<Item = Layer>) -> Result<Config, String> {
        let mut figment =
            Figment::from(figment::providers::Serialized::defaults(Config::default()));
        for layer in layers {
            figment = figment.merge(layer);
        }
        let mut config: Config = figment.extract_lossy().map_err(|e| {
            e.into_iter()
                .map(|e| {
                    let from = e
                        .metadata
                        .as_ref()
                        .map_or_else(String::new, |m| format!(" (from {})", m.name));
                    match e.path.is_empty() {
                        true => format!("{}{from}", e.kind),
                        false => format!("{}: {}{from}", e.path.join("."), e.kind),
                    }
                })
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        config.check()?;
        Ok(config)
    }

    /// Checks what one setting's type cannot say, and settles the exchange's `off`.
    fn check(&mut self) -> Result<(), String> {
        if self.backup_lease_seconds == 0 {
            return Err(
                "backup_lease_seconds: the backup's lease must hold for at least one \
                        second"
                    .into(),
            );
        }
        let pause = self.scrub_pause_seconds;
        if !(pause.is_finite() && pause > 0.0) {
            return Err(format!(
                "scrub_pause_seconds: the scrub's pause must be a positive number of seconds, \
                 not {pause}"
            ));
        }
        if self.worker_threads == Some(0) {
            return Err("worker_threads: at least one network thread is needed".into());
        }
        self.allowed_origins = std::mem::take(&mut self.allowed_origins)
            .iter()
            .map(|o| allowed_origin(o))
            .collect::<Result<_, _>>()?;
        let mut names = std::collections::HashSet::new();
        for spec in &self.read_models {
            spec.validate()?;
            if !names.insert(&spec.name) {
                return Err(format!("read model {:?} is declared twice", spec.name));
            }
        }
        if self.exchange.as_ref().is_some_and(|e| e.mode.is_none()) {
            self.exchange = None;
        }
        if let Some(exchange) = &self.exchange {
            exchange.check(self.durability)?;
        }
        self.telemetry.check()?;
        Ok(())
    }

    /// The runtime threads to start (see [`Config::worker_threads`]).
    pub fn runtime_threads(&self) -> usize {
        self.worker_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
        })
    }

    /// The PostgreSQL URL the log lives in, when `store` is one.
    pub fn postgres(&self) -> Option<&str> {
        is_postgres_url(&self.store).then_some(self.store.as_str())
    }

    /// The backup's lease.
    pub fn backup_lease(&self) -> Duration {
        Duration::from_secs(self.backup_lease_seconds)
    }

    /// The scrub's options; None when its rate is 0.
    pub fn scrub(&self) -> Option<annals::ScrubOptions> {
        (self.scrub_bytes_per_second > 0).then(|| annals::ScrubOptions {
            bytes_per_second: self.scrub_bytes_per_second,
            pause: Duration::from_secs_f64(self.scrub_pause_seconds),
        })
    }

    /// Where the log lives, for messages: the directory, or the database without its password.
    pub fn store_description(&self) -> String {
        match (&self.replica_of, self.postgres()) {
            (Some(url), _) => format!("a read replica of the backup at {url}"),
            (None, Some(url)) => format!("PostgreSQL {}", redact_password(url)),
            (None, None) => self.store.clone(),
        }
    }

    /// The API keys: those given inline and those in the keys file.
    pub fn keys(&self) -> Result<ApiKeys, String> {
        let mut keys = ApiKeys::default();
        for entry in &self.api_keys {
            let scopes = Scopes::parse_list(entry.scopes.iter().map(String::as_str))?;
            keys.insert_bound(entry.key.clone(), scopes, entry.accounts.clone())?;
        }
        if let Some(file) = &self.api_keys_file {
            keys.load_file(file)?;
        }
        Ok(keys)
    }

    /// The configuration as `annals config show` prints it: passwords in URLs and API keys
    /// replaced by `***`.
    pub fn redacted(&self) -> Config {
        let mut shown = self.clone();
        let url = |u: &mut Option<String>| {
            if let Some(u) = u {
                *u = redact_password(u);
            }
        };
        shown.store = redact_password(&shown.store);
        url(&mut shown.backup);
        url(&mut shown.replica_of);
        url(&mut shown.telemetry.endpoint);
        for entry in &mut shown.api_keys {
            entry.key = "***".into();
        }
        shown
    }

    /// The data subjects the store is opened with: the tag prefixes and the master key read
    /// from its file. Tags without a key file, or a key file without tags, are refused.
    pub fn subjects(&self) -> Result<Option<annals::SubjectOptions>, String> {
        subjects(&self.subject_tags, self.master_key_file.as_deref())
    }

    /// The reason to refuse this configuration at start, if any: a listener beyond loopback
    /// with no API keys, unless explicitly allowed.
    pub fn refusal(&self, keys: &ApiKeys) -> Option<String> {
        if self.replica_of.is_some() && (self.backup.is_some() || self.exchange.is_some()) {
            return Some(
                "a read replica serves reads only: it ships no backup of its own and hosts no \
                 exchange (drop --backup and --exchange)"
                    .into(),
            );
        }
        if self.exposed() && keys.is_empty() && !self.allow_unauthenticated_network {
            return Some(format!(
                "refusing to listen beyond loopback (http {}, grpc {}) without API keys: anyone \
                 who can connect could read and append. Configure keys (--api-keys-file FILE \
                 or ANNALS_API_KEYS_FILE=FILE, one `key scope,scope` per line; \
                 ANNALS_API_KEYS=key=read,append; or api_keys in the config file), or pass \
                 --allow-unauthenticated-network (ANNALS_ALLOW_UNAUTHENTICATED_NETWORK=1) to \
                 serve everyone on purpose",
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

/// The data subjects of a store: `tags` (prefixes) and the master key read from `key_file`.
/// Tags without a key file, or a key file without tags, are refused.
pub fn subjects(
    tags: &[String],
    key_file: Option<&Path>,
) -> Result<Option<annals::SubjectOptions>, String> {
    match (key_file, tags.is_empty()) {
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
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read the master key file {}: {e}", file.display()))?;
            let key = annals::MasterKey::from_hex(&text)
                .map_err(|e| format!("the master key file {}: {e}", file.display()))?;
            Ok(Some(annals::SubjectOptions::new(tags.to_vec(), key)))
        }
    }
}

/// A web origin allowed to call the API from a browser, checked: `scheme://host[:port]`.
fn allowed_origin(origin: &str) -> Result<String, String> {
    let origin = origin.trim().trim_end_matches('/');
    let valid = (origin.starts_with("http://") || origin.starts_with("https://"))
        && !origin["https://".len().min(origin.len())..].contains('/');
    if !valid {
        return Err(format!(
            "allowed origin {origin:?}: expected scheme://host[:port], as a browser sends it"
        ));
    }
    Ok(origin.to_ascii_lowercase())
}

/// A connection URL with its password, if any, replaced by `***`: in its user information
/// or as a `password` parameter of its query.
pub fn redact_password(url: &str) -> String {
    let url = &redact_password_parameter(url);
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

/// `url` with the value of a `password=` query parameter replaced by `***`.
fn redact_password_parameter(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let parameters: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
            _ => p.to_owned(),
        })
        .collect();
    format!("{base}?{}", parameters.join("&"))
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

/// A list of strings, or one comma-separated string.
fn list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    use serde::de::Error;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(text) => Ok(split_list(&text)),
        other => Vec::<String>::deserialize(other).map_err(|e| {
            D::Error::custom(format!(
                "{e}: expected a list of strings, or one comma-separated string"
            ))
        }),
    }
}

/// API keys: a list of tables, or one string `key=scope,scope;key2=scope`.
fn keys<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<KeyEntry>, D::Error> {
    use serde::de::Error;
    let text = match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(text) => text,
        // The tables' own errors (an unknown field, a scope that is not a string) come through.
        other => return Vec::<KeyEntry>::deserialize(other).map_err(D::Error::custom),
    };
    let mut entries = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, scopes) = part
            .split_once('=')
            .ok_or_else(|| D::Error::custom("API keys are written key=scope,scope;key2=scope"))?;
        entries.push(KeyEntry {
            key: key.trim().to_string(),
            scopes: split_list(scopes),
            accounts: None,
        });
    }
    Ok(entries)
}

/// A value written as text: parsed with `FromStr`, written with `Display`.
mod text {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|e| serde::de::Error::custom(format!("{text:?}: {e}")))
    }
}

/// A listen address.
mod listen {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }

    pub fn parse(text: &str) -> Result<SocketAddr, String> {
        text.parse().map_err(|_| {
            format!("invalid listen address {text:?}: expected host:port, like 127.0.0.1:7400")
        })
    }
}

/// A listen address, or `off`.
mod optional_listen {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(addr) => s.collect_str(addr),
            None => s.serialize_str("off"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        if text.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        super::listen::parse(&text)
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("{e}, or off")))
    }
}

/// The exchange's mode, or `off`.
mod exchange_mode {
    use annals_exchange::Mode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Mode>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(mode) => s.collect_str(mode),
            None => s.serialize_str("off"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Mode>, D::Error> {
        let text = String::deserialize(d)?;
        if text.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        text.parse().map(Some).map_err(serde::de::Error::custom)
    }
}

/// A duration in whole milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(value.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn env(pairs: &[(&str, &str)]) -> Layer {
        let (layer, unknown) = Layer::env(vars(pairs)).unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        layer
    }

    fn file(text: &str) -> (tempfile::TempDir, Layer) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("annals.toml");
        std::fs::write(&path, text).unwrap();
        let layer = Layer::file(&path).unwrap();
        (dir, layer)
    }

    /// Goal: the server's settings come from the defaults, then the configuration file, then the
    /// environment, then the flags, each replacing what the one before set, nested tables
    /// included, and unrelated variables are ignored.
    #[test]
    fn file_then_env_then_flags_override_defaults() {
        let (_dir, from_file) = file(
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
[exchange]
mode = "d2-critical"
critical_qty = 7
symbols = [{ tick = 1, lot = 1 }]
"#,
        );
        let config = Config::load([from_file]).unwrap();
        assert_eq!(config.store, "/srv/annals");
        assert_eq!(config.grpc_listen, None);
        assert_eq!(config.durability, Durability::SyncedLater);
        assert_eq!(config.mirror, Some(PathBuf::from("/srv/mirror")));
        assert_eq!(config.backup_lease(), Duration::from_secs(12));
        assert_eq!(config.limits.store().tags_per_event_max, 4);
        assert_eq!(config.limits.body_timeout, Duration::from_millis(500));
        assert_eq!(config.keys().unwrap().len(), 1);
        let exchange = config.exchange.as_ref().unwrap();
        assert_eq!(
            exchange.mode(),
            annals_exchange::Mode::Critical { critical_qty: 7 }
        );

        let (_dir, from_file) = file("durability = \"d2\"\n[limits]\ntags_per_event_max = 4\n");
        let mut flags = Layer::new("flags");
        flags.set("scrub_bytes_per_second", 0).unwrap();
        flags.set("tls.cert", "c.pem").unwrap();
        flags.set("tls.key", "k.pem").unwrap();
        let config = Config::load([
            from_file,
            env(&[
                ("ANNALS_DURABILITY", "d3"),
                ("ANNALS_HTTP_LISTEN", "0.0.0.0:9000"),
                ("ANNALS_STORE", "postgres://annals:secret@db/annals"),
                ("ANNALS_LIMITS_BODY_BYTES_MAX", "1000"),
                ("ANNALS_CONSOLE", "off"),
                ("ANNALS_SUBJECT_TAGS", "customer:, employee:"),
                (
                    "ANNALS_READ_MODELS",
                    r#"[{ name = "seats", types = ["Enrolled"] }]"#,
                ),
                ("ANNALS_LOG", "debug"),
                ("UNRELATED", "x"),
            ]),
            flags,
        ])
        .unwrap();
        assert_eq!(config.durability, Durability::Synced);
        assert!(config.exposed());
        assert_eq!(
            config.postgres(),
            Some("postgres://annals:secret@db/annals")
        );
        assert_eq!(config.limits.body_bytes_max, 1000);
        assert_eq!(config.limits.store().tags_per_event_max, 4);
        assert!(!config.console);
        assert_eq!(config.subject_tags, ["customer:", "employee:"]);
        assert_eq!(config.read_models[0].name, "seats");
        assert!(config.scrub().is_none());
        assert_eq!(config.tls.unwrap().key, PathBuf::from("k.pem"));
    }

    /// Goal: a mistyped setting, in the file or the environment, or a bad value is refused
    /// with a reason that names the setting and where it came from, rather than ignored.
    #[test]
    fn bad_files_and_values_are_refused_with_reasons() {
        let refused = |layers: Vec<Layer>| Config::load(layers).unwrap_err();
        let (_dir, typo) = file("data_dri = \"x\"\n");
        let err = refused(vec![typo]);
        assert!(
            err.contains("unknown field") && err.contains("config file"),
            "{err}"
        );
        let (_dir, typo) = file("[limits]\nbody_bytes = 1\n");
        assert!(refused(vec![typo]).contains("limits.body_bytes"));
        let dir = tempfile::tempdir().unwrap();
        let both = dir.path().join("both.toml");
        std::fs::write(&both, "data_dir = \"a\"\nstore = \"b\"\n").unwrap();
        assert!(Layer::file(&both).unwrap_err().contains("one setting"));

        let both = Layer::env(vars(&[("ANNALS_DATA_DIR", "/data"), ("ANNALS_STORE", "x")]));
        assert!(both.unwrap_err().contains("give one"));
        let (_, unknown) = Layer::env(vars(&[("ANNALS_DURABILTY", "d3")])).unwrap();
        assert_eq!(unknown, ["ANNALS_DURABILTY"]);
        for (name, value, says) in [
            ("ANNALS_DURABILITY", "d9", "unknown durability"),
            ("ANNALS_TLS_CERT", "c.pem", "missing field `key`"),
            (
                "ANNALS_ALLOW_UNAUTHENTICATED_NETWORK",
                "maybe",
                "expected a boolean",
            ),
            ("ANNALS_ALLOWED_ORIGINS", "evil.example", "scheme://host"),
            ("ANNALS_BACKUP_LEASE_SECONDS", "0", "second"),
            ("ANNALS_BACKUP_LEASE_SECONDS", "-1", "backup_lease_seconds"),
            (
                "ANNALS_BACKUP_LEASE_SECONDS",
                "soon",
                "backup_lease_seconds",
            ),
            ("ANNALS_SCRUB_PAUSE_SECONDS", "0", "positive"),
            ("ANNALS_HTTP_LISTEN", "nowhere", "host:port"),
            ("ANNALS_HTTP_LISTEN", "off", "host:port"),
            ("ANNALS_WORKER_THREADS", "0", "at least one"),
            ("ANNALS_EXCHANGE", "d2", "needs the store in d2"),
            ("ANNALS_API_KEYS", "no-equals-sign", "key=scope"),
            ("ANNALS_READ_MODELS", "[{ name = 5 }]", "read_models"),
        ] {
            let err = refused(vec![env(&[(name, value)])]);
            assert!(err.contains(says), "{name}={value}: {err}");
            assert!(
                err.contains("environment") || !err.contains("from"),
                "{err}"
            );
        }
        let err = Config::load([env(&[("ANNALS_API_KEYS", "short=read")])])
            .unwrap()
            .keys()
            .unwrap_err();
        assert!(err.contains("16 characters"), "{err}");
        let err = refused(vec![env(&[(
            "ANNALS_API_KEYS",
            r#"[{ key = "key-0123456789abcdef", scope = ["read"] }]"#,
        )])]);
        assert!(err.contains("unknown field `scope`"), "{err}");
        let malformed = r#"[{ key = "secret-key-0123456789""#;
        let err = Layer::env([("ANNALS_API_KEYS".to_string(), malformed.to_string())]).unwrap_err();
        assert!(
            !err.contains("secret-key"),
            "a malformed value is not echoed: {err}"
        );
        let off = Config::load([env(&[
            ("ANNALS_GRPC_LISTEN", "OFF"),
            ("ANNALS_EXCHANGE", "off"),
        ])])
        .unwrap();
        assert_eq!((off.grpc_listen, off.exchange.is_none()), (None, true));
    }

    /// Goal: an empty variable is as if unset (it does not replace the file's keys with none),
    /// an IPv6 address is an address and not a TOML list, and a file's critical quantity does
    /// not stop a later layer from choosing another exchange mode.
    #[test]
    fn empty_variables_ipv6_and_modes_are_read_as_meant() {
        let (_dir, from_file) = file(
            "api_keys = [{ key = \"file-key-0123456789\", scopes = [\"read\"] }]\n\
             [exchange]\nmode = \"d2-critical\"\ncritical_qty = 7\n",
        );
        let config = Config::load([
            from_file,
            env(&[
                ("ANNALS_API_KEYS", ""),
                ("ANNALS_HTTP_LISTEN", "[::1]:7400"),
                ("ANNALS_GRPC_LISTEN", "[::]:50051"),
                ("ANNALS_EXCHANGE", "d3"),
            ]),
        ])
        .unwrap();
        assert_eq!(config.keys().unwrap().len(), 1, "the file's key is kept");
        assert_eq!(config.http_listen, "[::1]:7400".parse().unwrap());
        assert!(config.exposed(), "[::] is beyond loopback");
        assert_eq!(
            config.exchange.unwrap().mode(),
            annals_exchange::Mode::Pipelined
        );
        assert!(!format!("{:?}", config.api_keys).contains("file-key"));
    }

    /// Goal: what `annals config show` prints hides passwords in URLs and API keys, and is a
    /// configuration file that loads back to the same settings.
    #[test]
    fn shown_configuration_is_redacted_and_loads_back() {
        let mut flags = Layer::new("flags");
        flags
            .set("store", "postgres://annals:secret@db/annals")
            .unwrap();
        flags.set("backup", "s3://key:secret2@host/bucket").unwrap();
        flags
            .set("replica_of", "s3://bucket/x?region=eu&password=secret3")
            .unwrap();
        flags.set("exchange.mode", "d3-per-order").unwrap();
        let config = Config::load([
            env(&[("ANNALS_API_KEYS", "key-0123456789abcdef=read,append")]),
            flags,
        ])
        .unwrap();
        let text = toml::to_string(&config.redacted()).unwrap();
        assert!(text.contains("region=eu&password=***"), "{text}");
        for secret in ["secret", "key-0123456789abcdef"] {
            assert!(!text.contains(secret), "{text}");
        }
        let (_dir, shown) = file(&text);
        let again = Config::load([shown]).unwrap();
        assert_eq!(
            toml::to_string(&again).unwrap(),
            text,
            "the shown configuration loads back as it is"
        );
    }

    /// Goal: docs/SERVER.md's table of settings names every setting, with its variable and
    /// default, and nothing that is not one; a new setting cannot go undocumented.
    #[test]
    fn the_settings_table_is_complete_and_true() {
        let doc = include_str!("../../../docs/SERVER.md");
        // An exchange's settings default to those of an `[exchange]` table given empty.
        let with_exchange = Config {
            exchange: Some(ExchangeConfig::default()),
            ..Config::default()
        };
        let defaults = match Value::serialize(with_exchange).unwrap() {
            Value::Dict(_, d) => d,
            _ => unreachable!(),
        };
        let default_of = |key: &str| -> String {
            let mut value = None;
            let mut dict = Some(&defaults);
            for part in key.split('.') {
                value = dict.and_then(|d| d.get(part));
                dict = value.and_then(Value::as_dict);
            }
            match value {
                None | Some(Value::Empty(..)) => "none".into(),
                Some(Value::Dict(..)) => "none".into(),
                Some(Value::Array(_, a)) if a.is_empty() => "none".into(),
                Some(Value::String(_, s)) => s.clone(),
                Some(Value::Num(_, n)) => match (n.to_u128_lossy(), n.to_f64()) {
                    (Some(whole), _) => whole.to_string(),
                    (None, Some(f)) => f.to_string(),
                    (None, None) => unreachable!("a number is whole or not"),
                },
                Some(Value::Bool(_, b)) => b.to_string(),
                Some(other) => format!("{other:?}"),
            }
        };
        let mut rows = BTreeMap::new();
        for line in doc.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells[1].trim_matches('`').to_string();
            rows.insert(
                name,
                (
                    cells[2].to_string(),
                    cells[3].to_string(),
                    cells[4].to_string(),
                ),
            );
        }
        let mut expected = Vec::new();
        for key in settings().keys() {
            let (variable, default) = (variable(key), default_of(key));
            let row = rows.get(key);
            let (_, env, def) = row.map_or(("", "", ""), |(f, e, d)| {
                (f.as_str(), e.as_str(), d.as_str())
            });
            // The first name in the variable's cell is the rule's; others may follow.
            let env = env
                .split(['`', ' ', ','])
                .find(|w| !w.is_empty())
                .unwrap_or("");
            if env != variable || def.trim_matches('`') != default {
                expected.push(format!("| `{key}` | ? | `{variable}` | `{default}` |"));
            }
        }
        let extra: Vec<_> = rows
            .keys()
            .filter(|k| !settings().contains_key(*k))
            .collect();
        assert!(
            expected.is_empty() && extra.is_empty(),
            "docs/SERVER.md's settings table is out of date; rows wanted:\n{}\nnot settings: \
             {extra:?}",
            expected.join("\n")
        );
    }
}
