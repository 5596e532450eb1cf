//! Traces over OpenTelemetry: the server's spans (`tracing`'s, bridged by
//! `tracing-opentelemetry`) exported over OTLP (gRPC or HTTP with protobuf) by the
//! `opentelemetry` crates, off unless an endpoint is configured. Configured by the standard
//! `OTEL_*` variables (endpoint, protocol, headers, timeout, service name, resource attributes,
//! sampler and its argument, the batch queue's bounds), and by the configuration file's
//! `[telemetry]` table, which the variables override.
//!
//! The export never holds a request: ended spans go into a bounded queue that a thread of the
//! SDK's batch processor drains; a span that finds it full is dropped and counted
//! (`annals_trace_spans_dropped_total`), and a failing collector is reported in the log once
//! when it starts failing and once when it answers again.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, Span, SpanData, SpanExporter,
    SpanProcessor,
};
use opentelemetry_sdk::Resource;
use serde::{Deserialize, Serialize};

/// The `[telemetry]` table of the configuration file. Each value is a default the matching
/// `OTEL_*` variable overrides.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`): `http://host:4317` for
    /// gRPC, `http://host:4318` for HTTP. None: no export (unless the variable names one).
    pub endpoint: Option<String>,
    /// `grpc` (the default) or `http/protobuf` (`OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub protocol: Option<String>,
    /// The service name spans are reported under (`OTEL_SERVICE_NAME`). Default: `annals`.
    pub service_name: Option<String>,
    /// The share of new traces sampled, 0 to 1 (`OTEL_TRACES_SAMPLER=parentbased_traceidratio`
    /// with `OTEL_TRACES_SAMPLER_ARG`); a request that carries a sampled parent is always
    /// sampled. Default: 1.
    pub sample_ratio: Option<f64>,
    /// Whether the series of `/metrics` are pushed to the endpoint as well
    /// (`OTEL_METRICS_EXPORTER=otlp` or `none`). Default: true.
    pub metrics: Option<bool>,
    /// How often they are pushed, in milliseconds (`OTEL_METRIC_EXPORT_INTERVAL`). Default:
    /// 60000.
    pub metrics_interval_ms: Option<u64>,
    /// Whether an append's W3C trace context (the `traceparent` and `tracestate` its request
    /// carries) is stored in each of its events' metadata, so that a consumer continues the
    /// producer's trace. Default: false.
    pub store_trace_context: Option<bool>,
}

/// Which protocol the exporter speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// What the configuration and the environment ask for, resolved: None when nothing is
/// exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    pub endpoint: Option<String>,
    pub protocol: Protocol,
    /// None: `service.name` as `OTEL_RESOURCE_ATTRIBUTES` gives it.
    pub service_name: Option<String>,
    /// Which requests are traced.
    pub sampling: Sampling,
}

/// Which requests are traced: decided by the server when a request arrives, before any span is
/// made, so that a request not sampled costs nothing more than the decision. OpenTelemetry's
/// standard samplers, as `OTEL_TRACES_SAMPLER` names them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// A request whose `traceparent` says whether its caller sampled it is sampled likewise
    /// (the `parentbased_*` samplers).
    pub follow_parent: bool,
    /// The share of other requests sampled.
    pub ratio: f64,
}

impl Sampling {
    /// The sampler `name` with its argument `arg` (for the ratio samplers; default 1).
    fn named(name: &str, arg: Option<&str>) -> Result<Sampling, String> {
        let ratio = || -> Result<f64, String> {
            match arg {
                None => Ok(1.0),
                Some(a) => a
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        format!("OTEL_TRACES_SAMPLER_ARG={a:?}: expected a share from 0 to 1")
                    }),
            }
        };
        let (follow_parent, ratio) = match name.trim() {
            "always_on" => (false, 1.0),
            "always_off" => (false, 0.0),
            "traceidratio" => (false, ratio()?),
            "parentbased_always_on" => (true, 1.0),
            "parentbased_always_off" => (true, 0.0),
            "parentbased_traceidratio" => (true, ratio()?),
            other => {
                return Err(format!(
                    "OTEL_TRACES_SAMPLER={other:?}: expected always_on, always_off, \
                     traceidratio or their parentbased_ forms"
                ))
            }
        };
        Ok(Sampling {
            follow_parent,
            ratio,
        })
    }

    /// Whether a request is traced, given its caller's trace context (None: none): whether
    /// the caller sampled it, and its trace id. The ratio is decided as OpenTelemetry's
    /// `traceidratio` decides, from the trace id's low 8 bytes, so that every service of a
    /// trace decides alike; a new trace's id is random, and so is the draw.
    fn sampled(&self, parent: Option<(bool, u128)>) -> bool {
        match parent {
            Some((sampled, _)) if self.follow_parent => sampled,
            _ if self.ratio >= 1.0 => true,
            _ if self.ratio <= 0.0 => false,
            Some((_, trace_id)) => {
                let low = (trace_id as u64) >> 1;
                (low as f64) < self.ratio * (1u64 << 63) as f64
            }
            None => rand::random::<f64>() < self.ratio,
        }
    }
}

impl TelemetryConfig {
    /// Refuses what no exporter can take.
    pub fn check(&self) -> Result<(), String> {
        if let Some(ratio) = self.sample_ratio {
            if !(0.0..=1.0).contains(&ratio) {
                return Err(format!(
                    "telemetry.sample_ratio = {ratio}: expected a share from 0 to 1"
                ));
            }
        }
        if let Some(p) = &self.protocol {
            protocol(p).map_err(|e| format!("telemetry.protocol: {e}"))?;
        }
        if self.metrics_interval_ms == Some(0) {
            return Err("telemetry.metrics_interval_ms = 0: expected a positive interval".into());
        }
        Ok(())
    }

    /// The protocol of a signal (`TRACES`, `METRICS`): its own variable, else the shared one,
    /// else the table's, else gRPC.
    fn protocol_of(
        &self,
        signal: &str,
        set: &impl Fn(&str) -> Option<String>,
    ) -> Result<Protocol, String> {
        let own = format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL");
        let shared = "OTEL_EXPORTER_OTLP_PROTOCOL";
        for name in [own.as_str(), shared] {
            if let Some(p) = set(name) {
                return protocol(&p).map_err(|e| format!("{name}: {e}"));
            }
        }
        match &self.protocol {
            Some(p) => protocol(p),
            None => Ok(Protocol::Grpc),
        }
    }

    /// `OTEL_SERVICE_NAME`, else the table's, else None when `service.name` is among
    /// `OTEL_RESOURCE_ATTRIBUTES` (which the SDK reads), else `annals`.
    fn service_name(&self, set: &impl Fn(&str) -> Option<String>) -> Option<String> {
        let in_attributes = set("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|pair| pair.split('=').next().map(str::trim) == Some("service.name"))
        });
        set("OTEL_SERVICE_NAME")
            .or_else(|| self.service_name.clone())
            .or_else(|| (!in_attributes).then(|| "annals".into()))
    }

    /// The push of the metrics asked for by this table and the variables `env` reads, or
    /// None for none. Traces and metrics are asked for apart (`OTEL_TRACES_EXPORTER`,
    /// `OTEL_METRICS_EXPORTER`) and share the endpoint unless a variable names one for each.
    pub fn metrics(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<MetricsExport>, String> {
        self.check()?;
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match set("OTEL_METRICS_EXPORTER").as_deref().map(str::trim) {
            None if self.metrics == Some(false) => return Ok(None),
            None | Some("otlp") => {}
            // `/metrics` is always served: asking for Prometheus alone asks for no push.
            Some("none" | "prometheus") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "OTEL_METRICS_EXPORTER={other:?}: Annals pushes metrics over OTLP only \
                     (otlp, or none; /metrics is always served)"
                ))
            }
        }
        let protocol = self.protocol_of("METRICS", &set)?;
        // A signal's own endpoint is used as given; the shared one is a base, to which the
        // HTTP protocol adds the signal's path.
        let endpoint = match set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") {
            Some(endpoint) => endpoint.trim().to_owned(),
            None => match set("OTEL_EXPORTER_OTLP_ENDPOINT").or_else(|| self.endpoint.clone()) {
                None => return Ok(None),
                Some(base) => match protocol {
                    Protocol::Grpc => base.trim().to_owned(),
                    Protocol::HttpProtobuf => signal_path(&base, "metrics"),
                },
            },
        };
        let uri = endpoint.parse::<http::Uri>().ok();
        let valid = uri.as_ref().is_some_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https"))
                && u.host().is_some_and(|h| !h.is_empty())
        });
        if !valid {
            return Err(format!(
                "the OTLP metrics endpoint {:?}: expected an http:// or https:// URL with a host",
                redacted(&endpoint)
            ));
        }
        let millis = |name: &str, default: u64| -> Result<Duration, String> {
            match set(name) {
                None => Ok(Duration::from_millis(default)),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
                    _ => Err(format!(
                        "{name}={v:?}: expected a positive number of milliseconds"
                    )),
                },
            }
        };
        let timeout = match set("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT") {
            Some(_) => millis("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", 10_000)?,
            None => millis("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)?,
        };
        let interval = millis(
            "OTEL_METRIC_EXPORT_INTERVAL",
            self.metrics_interval_ms.unwrap_or(60_000),
        )?;
        match set("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE")
            .as_deref()
            .map(str::trim)
        {
            None => {}
            Some(t) if t.eq_ignore_ascii_case("cumulative") => {}
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={other:?}: Annals \
                     pushes cumulative series only"
                ))
            }
        }
        // The signal's own headers are added to the shared ones, replacing a key both give.
        let mut headers = Vec::new();
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        ] {
            if let Some(text) = set(name) {
                for (key, value) in parse_headers(&text).map_err(|e| format!("{name}: {e}"))? {
                    headers.retain(|(k, _): &(String, String)| *k != key);
                    headers.push((key, value));
                }
            }
        }
        Ok(Some(MetricsExport {
            endpoint,
            protocol,
            service_name: self.service_name(&set),
            headers,
            timeout,
            interval,
        }))
    }

    /// The export asked for by this table and the variables `env` reads, or None for none.
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Result<Option<Export>, String> {
        self.check()?;
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match set("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER={other:?}: Annals exports traces over OTLP only \
                     (otlp, or none)"
                ))
            }
        }
        let from_env = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
        if from_env.is_none() && self.endpoint.is_none() {
            return Ok(None);
        }
        let protocol = self.protocol_of("TRACES", &set)?;
        // The exporter reads the variable itself; the table's endpoint is given only when no
        // variable names one, so that the variable wins as it does for every other setting.
        let endpoint = match from_env {
            Some(_) => None,
            None => self.endpoint.clone(),
        };
        let service_name = self.service_name(&set);
        let sampling = match set("OTEL_TRACES_SAMPLER") {
            Some(name) => Sampling::named(&name, set("OTEL_TRACES_SAMPLER_ARG").as_deref())?,
            None => Sampling {
                follow_parent: true,
                ratio: self.sample_ratio.unwrap_or(1.0),
            },
        };
        Ok(Some(Export {
            endpoint,
            protocol,
            service_name,
            sampling,
        }))
    }
}

fn protocol(name: &str) -> Result<Protocol, String> {
    match name.trim() {
        "grpc" => Ok(Protocol::Grpc),
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        other => Err(format!(
            "{other:?}: expected grpc or http/protobuf (http/json is not supported)"
        )),
    }
}

/// Where and how often the series are pushed, resolved from the configuration and the
/// `OTEL_*` variables (`TelemetryConfig::metrics`).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsExport {
    /// The whole URL: for gRPC the collector's address, for HTTP the `/v1/metrics` path.
    pub endpoint: String,
    pub protocol: Protocol,
    /// None: `service.name` as `OTEL_RESOURCE_ATTRIBUTES` gives it.
    pub service_name: Option<String>,
    /// Sent with every push (`OTEL_EXPORTER_OTLP_HEADERS`, `..._METRICS_HEADERS`).
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub interval: Duration,
}

/// A URL as it may be logged: without the user and password it may carry.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme && !url[scheme + 3..at].contains('/') => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// Parses `key=value,key=value` as the OTLP variables give headers (values percent-encoded).
/// An error names the entry by its place and key, never its value (a header may hold a key).
pub fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::new();
    for (place, pair) in text.split(',').filter(|p| !p.trim().is_empty()).enumerate() {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!("entry {}: expected key=value", place + 1));
        };
        let key = key.trim();
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("the value of {key:?} is not UTF-8 once decoded"))?;
        let valid = http::HeaderName::from_bytes(key.as_bytes()).is_ok()
            && http::HeaderValue::from_str(&value).is_ok();
        if !valid {
            return Err(format!("{key:?}: not a valid header"));
        }
        headers.push((key.to_ascii_lowercase(), value.into_owned()));
    }
    Ok(headers)
}

/// Whether spans are exported: the request spans and the trace context they read are made
/// only then, so that a server that exports nothing pays one load per request.
static ACTIVE: AtomicBool = AtomicBool::new(false);

pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// How requests are sampled while spans are exported.
static SAMPLING: parking_lot::RwLock<Sampling> = parking_lot::RwLock::new(Sampling {
    follow_parent: true,
    ratio: 1.0,
});

/// The spans the server exported, dropped because the queue was full, and lost in exports
/// that failed.
#[derive(Debug, Default)]
pub struct SpanCounts {
    pub exported: AtomicU64,
    pub dropped: AtomicU64,
    pub failed: AtomicU64,
}

pub static SPANS: SpanCounts = SpanCounts {
    exported: AtomicU64::new(0),
    dropped: AtomicU64::new(0),
    failed: AtomicU64::new(0),
};

/// A running export: shut down (its queue flushed, within a bound) when the server stops.
pub struct Telemetry {
    provider: SdkTracerProvider,
    /// The gRPC exporter's connection runs on a runtime of its own (one thread), so that the
    /// export never takes a thread of the runtime serving requests.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Telemetry {
    /// Starts exporting as `export` says.
    pub fn start(export: &Export) -> Result<Telemetry, String> {
        let runtime = match export.protocol {
            Protocol::Grpc => Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("annals-otlp")
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the trace export's runtime: {e}"))?,
            ),
            Protocol::HttpProtobuf => None,
        };
        let exporter = {
            use opentelemetry_otlp::WithExportConfig;
            let _entered = runtime.as_ref().map(|r| r.enter());
            let built = match export.protocol {
                Protocol::Grpc => {
                    let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                    if let Some(endpoint) = &export.endpoint {
                        builder = builder.with_endpoint(endpoint.clone());
                    }
                    builder.build()
                }
                Protocol::HttpProtobuf => {
                    let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http();
                    if let Some(endpoint) = &export.endpoint {
                        builder = builder.with_endpoint(traces_path(endpoint));
                    }
                    builder.build()
                }
            };
            built.map_err(|e| format!("cannot make the OTLP trace exporter: {e}"))?
        };
        // The bounds read once and given to the processor, so that the count below and the
        // processor's queue agree.
        let (queue, batch) = queue_bounds();
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(queue)
            .with_max_export_batch_size(batch)
            .build();
        let bound = queue;
        let in_flight = Arc::new(AtomicUsize::new(0));
        let processor = Counted {
            inner: BatchSpanProcessor::builder(Reported {
                inner: exporter,
                in_flight: in_flight.clone(),
                failing: AtomicBool::new(false),
            })
            .with_batch_config(config)
            .build(),
            in_flight,
            bound,
        };
        let resource = resource(export.service_name.as_deref());
        let mut builder = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource);
        // Requests are sampled when they arrive (`request_span`): a span made is one to keep.
        builder = builder.with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn);
        let provider = builder.build();
        *SAMPLING.write() = export.sampling;
        ACTIVE.store(true, Ordering::Relaxed);
        Ok(Telemetry { provider, runtime })
    }

    /// The layer that hands `tracing`'s spans of Annals' crates to the export.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::filter::{LevelFilter, Targets};
        use tracing_subscriber::Layer as _;
        let tracer = self.provider.tracer("annals");
        let targets = Targets::new()
            .with_target("annals", LevelFilter::INFO)
            .with_target("annals_server", LevelFilter::INFO);
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_threads(false)
            .with_location(false)
            .with_tracked_inactivity(false)
            .with_filter(targets)
    }

    /// Stops exporting: what is queued is sent, within a few seconds.
    pub fn shutdown(self) {
        ACTIVE.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!("the trace export did not shut down cleanly: {e}");
        }
        if let Some(runtime) = self.runtime {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// The service's resource, as traces and metrics are reported under: `service_name` when given
/// (else `service.name` among `OTEL_RESOURCE_ATTRIBUTES`, which the SDK reads), its version.
pub fn resource(service_name: Option<&str>) -> Resource {
    let mut resource = Resource::builder();
    if let Some(name) = service_name {
        resource = resource.with_service_name(name.to_owned());
    }
    resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build()
}

/// The collector's HTTP endpoint for traces, from its base (as `OTEL_EXPORTER_OTLP_ENDPOINT`
/// is read): the exporter takes a configured endpoint as it is.
fn traces_path(endpoint: &str) -> String {
    signal_path(endpoint, "traces")
}

/// A signal's path (`/v1/traces`, `/v1/metrics`) under a collector's base URL.
fn signal_path(endpoint: &str, signal: &str) -> String {
    let base = endpoint.trim().trim_end_matches('/');
    let path = format!("/v1/{signal}");
    if base.ends_with(&path) {
        base.to_owned()
    } else {
        format!("{base}{path}")
    }
}

/// The batch processor's queue and batch sizes, from the variables it reads (a size that is
/// not a positive number is its default, where the processor would take 0 as given).
fn queue_bounds() -> (usize, usize) {
    let read = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or(default)
    };
    let queue = read("OTEL_BSP_MAX_QUEUE_SIZE", 2048);
    let batch = read("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512).min(queue);
    (queue, batch)
}

/// The batch processor, with a count of the spans it holds (in its queue, or taken from it
/// and not yet exported): a span that finds the count at the queue's size is dropped here and
/// counted, since the processor's own count of drops is not readable. Every span in the
/// queue is counted until its export returns, so the queue is never full when a span is
/// handed to it, and the processor drops none itself.
#[derive(Debug)]
struct Counted {
    inner: BatchSpanProcessor,
    in_flight: Arc<AtomicUsize>,
    bound: usize,
}

impl SpanProcessor for Counted {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.bound).then_some(n + 1)
            });
        if taken.is_err() {
            SPANS.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting what it sent and lost, and telling the log when the collector
/// starts failing and when it answers again (never once per batch).
#[derive(Debug)]
struct Reported<E> {
    inner: E,
    in_flight: Arc<AtomicUsize>,
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Reported<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        self.in_flight.fetch_sub(n, Ordering::AcqRel);
        match &result {
            Ok(()) => {
                SPANS.exported.fetch_add(n as u64, Ordering::Relaxed);
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("the trace collector takes spans again");
                }
            }
            Err(e) => {
                SPANS.failed.fetch_add(n as u64, Ordering::Relaxed);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the trace collector did not take {n} spans ({e}); spans are dropped \
                         until it does (annals_trace_spans_failed_total)"
                    );
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The span of one request on either listener, following OpenTelemetry's conventions for
/// HTTP servers (`http.request.method`, `url.path`, `http.route`,
/// `http.response.status_code`) and for gRPC (`rpc.system`, `rpc.service`, `rpc.method`,
/// `rpc.grpc.status_code`), a child of the trace a W3C `traceparent` header (or gRPC metadata
/// entry, which is one) names; a malformed one is ignored and a new trace begins. None when
/// nothing is exported.
pub(crate) fn request_span<B>(request: &http::Request<B>, grpc: bool) -> tracing::Span {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use tracing::field::Empty;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if !active() {
        return tracing::Span::none();
    }
    let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .extract(&opentelemetry_http::HeaderExtractor(request.headers()));
    let remote = parent.span().span_context().clone();
    let given = remote.is_valid().then(|| {
        let id = u128::from_be_bytes(remote.trace_id().to_bytes());
        (remote.is_sampled(), id)
    });
    if !SAMPLING.read().sampled(given) {
        return tracing::Span::none();
    }
    let path = request.uri().path();
    let span = if grpc {
        let full = path.trim_start_matches('/');
        let (service, method) = full.split_once('/').unwrap_or((full, ""));
        tracing::info_span!(
            target: "annals_server",
            "grpc",
            otel.name = full,
            otel.kind = "server",
            otel.status_code = Empty,
            rpc.system = "grpc",
            rpc.service = service,
            rpc.method = method,
            rpc.grpc.status_code = Empty,
        )
    } else {
        let method = request.method().as_str();
        tracing::info_span!(
            target: "annals_server",
            "http",
            otel.name = method,
            otel.kind = "server",
            otel.status_code = Empty,
            http.request.method = method,
            url.path = path,
            http.route = Empty,
            http.response.status_code = Empty,
        )
    };
    if given.is_some() {
        let _ = span.set_parent(parent);
    }
    span
}

/// A request's W3C trace context, as OpenTelemetry's propagator reads it (a malformed one is
/// none), written back in its canonical form; stored in an append's events when
/// `telemetry.store_trace_context` says so.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// The trace context `headers` carry (`traceparent`, `tracestate`), if a valid one.
    pub(crate) fn of(headers: &http::HeaderMap) -> Option<TraceContext> {
        use opentelemetry::propagation::TextMapPropagator;
        use opentelemetry::trace::TraceContextExt;
        headers.get("traceparent")?;
        let context = opentelemetry_sdk::propagation::TraceContextPropagator::new()
            .extract(&opentelemetry_http::HeaderExtractor(headers));
        let remote = context.span().span_context().clone();
        if !remote.is_valid() {
            return None;
        }
        let tracestate = remote.trace_state().header();
        Some(TraceContext {
            traceparent: format!(
                "00-{}-{}-{:02x}",
                remote.trace_id(),
                remote.span_id(),
                remote.trace_flags().to_u8()
            ),
            tracestate: (!tracestate.is_empty()).then_some(tracestate),
        })
    }

    /// An event's metadata with this context in it: as the whole metadata when it has none,
    /// added to a JSON object that has no `traceparent` of its own (the rest of its text as it
    /// was), and None (left as it is) for metadata of another shape or one that has one.
    pub(crate) fn stamped(&self, metadata: &[u8]) -> Option<bytes::Bytes> {
        let mut members = format!("\"traceparent\":\"{}\"", self.traceparent);
        if let Some(state) = &self.tracestate {
            members.push_str(",\"tracestate\":");
            members.push_str(&serde_json::to_string(state).expect("a string serializes"));
        }
        if metadata.is_empty() {
            return Some(format!("{{{members}}}").into());
        }
        let object: std::collections::HashMap<String, serde::de::IgnoredAny> =
            serde_json::from_slice(metadata).ok()?;
        if object.contains_key("traceparent") || object.contains_key("tracestate") {
            return None;
        }
        // The object's text: whitespace, its opening brace, then its members.
        let open = metadata.iter().position(|&b| b == b'{')?;
        let mut out = Vec::with_capacity(metadata.len() + members.len() + 1);
        out.extend_from_slice(&metadata[..=open]);
        out.extend_from_slice(members.as_bytes());
        if !object.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(&metadata[open + 1..]);
        Some(out.into())
    }

    /// Stamps each of `events` (see `stamped`).
    pub(crate) fn stamp(&self, events: &mut [annals::NewEvent]) {
        for event in events {
            if let Some(metadata) = self.stamped(&event.metadata) {
                event.metadata = metadata;
            }
        }
    }
}

/// Records on the current request's span the route that matched (`http.route`, and the span's
/// name as the conventions give it: the method and the route).
pub(crate) fn record_route(method: &http::Method, route: &str) {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if !active() {
        return;
    }
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("http.route", route);
    // The span has started (it is entered): its name is changed on the span itself, which
    // the bridge's `otel.name` field does only before the start.
    span.context()
        .span()
        .update_name(format!("{method} {route}"));
}

/// Records a request's answer on its span: the status, and for gRPC the status code when it
/// is in the headers (an answer of trailers only; a streamed answer's comes at its end).
pub(crate) fn record_response(
    span: &tracing::Span,
    response: &http::Response<axum::body::Body>,
    grpc: bool,
) {
    if span.is_disabled() {
        return;
    }
    let status = response.status();
    if grpc {
        let code = response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok());
        if let Some(code) = code {
            span.record("rpc.grpc.status_code", code);
            // The server errors among gRPC's codes: unknown, deadline exceeded,
            // unimplemented, internal, unavailable, data loss.
            if matches!(code, 2 | 4 | 12 | 13 | 14 | 15) {
                span.record("otel.status_code", "ERROR");
            }
        }
    } else {
        span.record("http.response.status_code", i64::from(status.as_u16()));
        if status.is_server_error() {
            span.record("otel.status_code", "ERROR");
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's future, run inside its span, whose answer the span records.
    pub(crate) struct Traced<F> {
        #[pin]
        inner: F,
        span: tracing::Span,
        grpc: bool,
    }
}

impl<F> Traced<F> {
    pub(crate) fn new(inner: F, span: tracing::Span, grpc: bool) -> Self {
        Traced { inner, span, grpc }
    }
}

impl<F, E> std::future::Future for Traced<F>
where
    F: std::future::Future<Output = Result<http::Response<axum::body::Body>, E>>,
{
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let polled = this.inner.poll(cx);
        if let std::task::Poll::Ready(Ok(response)) = &polled {
            record_response(this.span, response, *this.grpc);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(table: &TelemetryConfig, vars: &[(&str, &str)]) -> Result<Option<Export>, String> {
        table.resolve(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    fn metrics(
        table: &TelemetryConfig,
        vars: &[(&str, &str)],
    ) -> Result<Option<MetricsExport>, String> {
        table.metrics(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    /// Goal: metrics are pushed where traces go unless asked otherwise: each signal's own
    /// variables win over the shared ones, HTTP adds the signal's path to a base, the
    /// interval and headers are read, each signal is turned off apart, and what cannot be
    /// pushed is refused naming its variable.
    #[test]
    fn metrics_are_pushed_where_the_variables_say() {
        let none = TelemetryConfig::default();
        assert_eq!(metrics(&none, &[]), Ok(None));
        let table = TelemetryConfig {
            endpoint: Some("http://table:4318/".into()),
            protocol: Some("http/protobuf".into()),
            metrics_interval_ms: Some(5000),
            ..TelemetryConfig::default()
        };
        let export = metrics(&table, &[]).unwrap().unwrap();
        assert_eq!(export.endpoint, "http://table:4318/v1/metrics");
        assert_eq!(export.protocol, Protocol::HttpProtobuf);
        assert_eq!(export.interval, Duration::from_secs(5));
        assert_eq!(export.timeout, Duration::from_secs(10));
        assert_eq!(export.service_name.as_deref(), Some("annals"));
        let export = metrics(
            &table,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "250"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "a=1,b=2"),
                ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "b=3"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(export.endpoint, "http://env:4317");
        assert_eq!(export.protocol, Protocol::Grpc);
        assert_eq!(export.interval, Duration::from_millis(250));
        assert_eq!(export.timeout, Duration::from_secs(2));
        assert_eq!(
            export.headers,
            vec![("a".into(), "1".into()), ("b".into(), "3".into())]
        );
        let own = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:9/push"),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
        ];
        let export = metrics(&none, &own).unwrap().unwrap();
        assert_eq!(export.endpoint, "http://m:9/push");
        assert_eq!(export.protocol, Protocol::HttpProtobuf);
        // Traces off leaves metrics on, and the other way round.
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://e:4317");
        let traces_off = [endpoint, ("OTEL_TRACES_EXPORTER", "none")];
        assert!(metrics(&none, &traces_off).unwrap().is_some());
        assert_eq!(resolve(&none, &traces_off), Ok(None));
        for off in ["none", "prometheus"] {
            let vars = [endpoint, ("OTEL_METRICS_EXPORTER", off)];
            assert_eq!(metrics(&none, &vars), Ok(None));
            assert!(resolve(&none, &vars).unwrap().is_some());
        }
        let table_off = TelemetryConfig {
            endpoint: Some("http://e:4317".into()),
            metrics: Some(false),
            ..TelemetryConfig::default()
        };
        assert_eq!(metrics(&table_off, &[]), Ok(None));
        assert_eq!(
            metrics(&none, &[endpoint, ("OTEL_SDK_DISABLED", "true")]),
            Ok(None)
        );
        for (name, value) in [
            ("OTEL_METRICS_EXPORTER", "statsd"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "0"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "soon"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "no-value"),
            ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
        ] {
            let e = metrics(&none, &[endpoint, (name, value)]).unwrap_err();
            assert!(e.contains(name), "{name}={value}: {e}");
        }
        for bad in [
            "collector:4317",
            "http://bad host:4317",
            "http://[::1",
            "http://",
        ] {
            let e = metrics(&none, &[("OTEL_EXPORTER_OTLP_ENDPOINT", bad)]);
            assert!(e.unwrap_err().contains("http://"), "{bad}");
        }
    }

    /// Goal: nothing is exported without an endpoint; the variables override the table, as
    /// the server's other settings do, and the SDK's own switches turn the export off.
    #[test]
    fn the_variables_override_the_table_and_nothing_is_exported_unasked() {
        let none = TelemetryConfig::default();
        assert_eq!(resolve(&none, &[]), Ok(None));
        let table = TelemetryConfig {
            endpoint: Some("http://table:4317".into()),
            protocol: Some("http/protobuf".into()),
            service_name: Some("ledger".into()),
            sample_ratio: Some(0.5),
            ..TelemetryConfig::default()
        };
        let export = resolve(&table, &[]).unwrap().unwrap();
        assert_eq!(export.endpoint.as_deref(), Some("http://table:4317"));
        assert_eq!(export.protocol, Protocol::HttpProtobuf);
        assert_eq!(export.service_name.as_deref(), Some("ledger"));
        assert_eq!(
            export.sampling,
            Sampling {
                follow_parent: true,
                ratio: 0.5
            }
        );
        // The variables win; the exporter reads the endpoint variable itself.
        let export = resolve(
            &table,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_SERVICE_NAME", "payments"),
                ("OTEL_TRACES_SAMPLER", "always_on"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(export.endpoint, None);
        assert_eq!(export.protocol, Protocol::Grpc);
        assert_eq!(export.service_name.as_deref(), Some("payments"));
        assert_eq!(
            export.sampling,
            Sampling {
                follow_parent: false,
                ratio: 1.0
            }
        );
        let defaults = resolve(&none, &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://e")]);
        let defaults = defaults.unwrap().unwrap();
        assert_eq!(
            (defaults.protocol, defaults.service_name.as_deref()),
            (Protocol::Grpc, Some("annals"))
        );
        // A service name among the resource's attributes is left to the SDK, which reads it.
        let attributes = (
            "OTEL_RESOURCE_ATTRIBUTES",
            "team=ledger, service.name=books",
        );
        let named = resolve(
            &none,
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://e"), attributes],
        );
        assert_eq!(named.unwrap().unwrap().service_name, None);
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            assert_eq!(resolve(&table, &[off]), Ok(None), "{off:?}");
        }
        // An empty variable is as if unset.
        assert_eq!(
            resolve(&none, &[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]),
            Ok(None)
        );
    }

    /// Goal: the standard samplers are read as the SDK reads them, and decide as they do: a
    /// parent-based one follows the caller's choice, the ratio is a share of the others.
    #[test]
    fn requests_are_sampled_as_the_standard_samplers_say() {
        let named = |name, arg| Sampling::named(name, arg).unwrap();
        assert_eq!(named("parentbased_traceidratio", Some("0.25")).ratio, 0.25);
        assert!(named("parentbased_always_off", None).follow_parent);
        assert!(!named("traceidratio", Some("0.5")).follow_parent);
        assert!(Sampling::named("traceidratio", Some("2")).is_err());
        assert!(Sampling::named("jaeger_remote", None).is_err());
        let on = named("always_on", None);
        let off = named("parentbased_always_off", None);
        let caller = |sampled| Some((sampled, 7u128 << 70));
        assert!(on.sampled(None) && on.sampled(caller(false)));
        assert!(!off.sampled(None) && off.sampled(caller(true)) && !off.sampled(caller(false)));
        let tenth = named("parentbased_traceidratio", Some("0.1"));
        let kept = (0..20_000).filter(|_| tenth.sampled(None)).count();
        assert!((1_500..2_500).contains(&kept), "{kept} of 20000 at 0.1");
        assert!(!tenth.sampled(caller(false)) && tenth.sampled(caller(true)));
        // Without following the caller, the ratio is read from the trace id: the same id
        // always gets the same answer, and a tenth of ids are kept.
        let ratio = named("traceidratio", Some("0.1"));
        let ids =
            (0..20_000u128).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835));
        let kept: Vec<u128> = ids.filter(|id| ratio.sampled(Some((false, *id)))).collect();
        assert!(
            (1_500..2_500).contains(&kept.len()),
            "{} of 20000 at 0.1",
            kept.len()
        );
        assert!(kept.iter().all(|id| ratio.sampled(Some((true, *id)))));
    }

    /// Goal: what no exporter here can take is refused with its name, before anything starts.
    #[test]
    fn what_cannot_be_exported_is_refused() {
        let none = TelemetryConfig::default();
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://e:4317");
        let e = resolve(
            &none,
            &[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
        );
        assert!(e.unwrap_err().contains("http/json is not supported"));
        let e = resolve(&none, &[("OTEL_TRACES_EXPORTER", "zipkin")]).unwrap_err();
        assert!(
            e.contains("OTEL_TRACES_EXPORTER") && e.contains("zipkin"),
            "{e}"
        );
        let ratio = TelemetryConfig {
            sample_ratio: Some(1.5),
            ..TelemetryConfig::default()
        };
        assert!(ratio.check().unwrap_err().contains("sample_ratio"));
        let protocol = TelemetryConfig {
            protocol: Some("udp".into()),
            ..TelemetryConfig::default()
        };
        assert!(protocol.check().unwrap_err().contains("telemetry.protocol"));
    }

    /// Goal: the HTTP exporter is given the traces path under the collector's base, as the
    /// endpoint variable is read, and a full traces URL as it is.
    #[test]
    fn the_http_endpoint_names_the_traces_path() {
        assert_eq!(traces_path("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_path("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_path("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }

    /// Goal: headers given as the OTLP variables write them (values percent-encoded) are
    /// read, and what is not a header is refused, naming it.
    #[test]
    fn headers_are_read_as_the_variables_give_them() {
        let headers = parse_headers("api-key=a%20b , X-Tenant=t1,").unwrap();
        assert_eq!(
            headers,
            vec![
                ("api-key".to_owned(), "a b".to_owned()),
                ("x-tenant".to_owned(), "t1".to_owned())
            ]
        );
        let e = parse_headers("a=1,authorization Bearer secret").unwrap_err();
        assert!(e.contains("entry 2") && !e.contains("secret"), "{e}");
        assert!(parse_headers("bad key=1").unwrap_err().contains("bad key"));
        assert!(parse_headers("").unwrap().is_empty());
    }

    /// Goal: a stored trace context is the caller's, in its canonical form, added to the
    /// event's metadata without changing what the caller wrote; metadata that is not an
    /// object, or names its own traceparent, is left as it is; a malformed header is none.
    #[test]
    fn the_trace_context_is_stamped_into_metadata() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", parent.parse().unwrap());
        let context = TraceContext::of(&headers).unwrap();
        let stamped = |m: &str| {
            context
                .stamped(m.as_bytes())
                .map(|b| String::from_utf8(b.to_vec()).unwrap())
        };
        let alone = format!("{{\"traceparent\":\"{parent}\"}}");
        assert_eq!(stamped("").as_deref(), Some(alone.as_str()));
        assert_eq!(
            stamped(" {} ").as_deref(),
            Some(format!(" {alone} ").as_str())
        );
        let added = stamped("{\"b\": 2, \"a\": [1]}").unwrap();
        assert_eq!(
            added,
            format!("{{\"traceparent\":\"{parent}\",\"b\": 2, \"a\": [1]}}")
        );
        serde_json::from_str::<serde_json::Value>(&added).unwrap();
        assert_eq!(stamped("[1, 2]"), None);
        assert_eq!(stamped("\"text\""), None);
        assert_eq!(stamped("{\"traceparent\": \"mine\"}"), None);
        assert_eq!(stamped("{\"tracestate\": \"mine\"}"), None);
        assert_eq!(
            redacted("https://u:p@collector:4318/x"),
            "https://collector:4318/x"
        );
        assert_eq!(redacted("http://collector:4317"), "http://collector:4317");
        headers.insert("tracestate", "vendor=abc,other=x".parse().unwrap());
        let with_state = TraceContext::of(&headers).unwrap();
        let text = String::from_utf8(with_state.stamped(b"").unwrap().to_vec()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["traceparent"], parent);
        assert_eq!(value["tracestate"], "vendor=abc,other=x");
        for bad in [
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "junk",
            "01-x",
        ] {
            headers.insert("traceparent", bad.parse().unwrap());
            assert_eq!(TraceContext::of(&headers), None, "{bad}");
        }
    }
}
