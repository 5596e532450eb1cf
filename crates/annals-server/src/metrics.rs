//! Request counters and latency histograms, counted on the hot path with atomics, and the
//! Prometheus exposition of them with the store's own statistics, read at scrape time by a
//! `prometheus-client` collector ([`Scrape`]), which writes the format and escapes labels.
//! The same series, written once, are also written as OTLP metrics for the push
//! (`otlp_metrics`).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use annals::snapshot::{SnapshotCounts, SnapshotStats};
use annals::{HistogramSnapshot, Log2Histogram, Stats};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
    NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::otlp_metrics::Number;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Http,
    Grpc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Append,
    Read,
    Head,
    Subscribe,
    Tracking,
    ReadModel,
    /// Exchange commands: place, cancel, amend, cancel-all, add a symbol.
    Order,
    /// Exchange queries and streams: an order, depth, trades, symbols, market data, reports.
    Market,
    /// Decisions' snapshots: saves, reads with a snapshot, listings and removals.
    Snapshot,
    /// Event schemas: listings, registrations and settings.
    Schema,
}

const APIS: [Api; 2] = [Api::Http, Api::Grpc];
const OPS: [Op; 10] = [
    Op::Append,
    Op::Read,
    Op::Head,
    Op::Subscribe,
    Op::Tracking,
    Op::ReadModel,
    Op::Order,
    Op::Market,
    Op::Snapshot,
    Op::Schema,
];

impl Api {
    fn name(self) -> &'static str {
        match self {
            Api::Http => "http",
            Api::Grpc => "grpc",
        }
    }
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Append => "append",
            Op::Read => "read",
            Op::Head => "head",
            Op::Subscribe => "subscribe",
            Op::Tracking => "tracking",
            Op::ReadModel => "readmodel",
            Op::Order => "exchange_order",
            Op::Market => "exchange_market",
            Op::Snapshot => "snapshot",
            Op::Schema => "schema",
        }
    }
}

#[derive(Default)]
struct OpMetrics {
    /// Requests by how they ended, in [`OUTCOMES`]' order.
    outcomes: [AtomicU64; OUTCOMES.len()],
    duration_us: Log2Histogram,
}

/// What the server counts; shared by the HTTP and gRPC front ends.
#[derive(Default)]
pub struct Metrics {
    ops: [[OpMetrics; OPS.len()]; APIS.len()],
    events_read: AtomicU64,
    subscribers: AtomicI64,
    connections: AtomicI64,
    auth_failures: AtomicU64,
    /// Appends' times by the class they were acknowledged in (d0 to d4).
    append_by_class: [Log2Histogram; 5],
    /// Each live subscription's position (how far it has read the log), while it lives.
    followers: std::sync::Mutex<Vec<std::sync::Weak<AtomicU64>>>,
}

/// How a request ended, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// An append whose condition failed: answered (200), with nothing appended.
    Conflict,
    ClientError,
    ServerError,
}

const OUTCOMES: [Outcome; 4] = [
    Outcome::Ok,
    Outcome::Conflict,
    Outcome::ClientError,
    Outcome::ServerError,
];

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Conflict => "condition_failed",
            Outcome::ClientError => "client_error",
            Outcome::ServerError => "server_error",
        }
    }
}

impl Metrics {
    fn op(&self, api: Api, op: Op) -> &OpMetrics {
        &self.ops[api as usize][op as usize]
    }

    pub fn record(&self, api: Api, op: Op, outcome: Outcome, took: Duration) {
        debug_assert!(
            outcome != Outcome::Conflict || op == Op::Append,
            "only appends have a condition to fail"
        );
        let m = self.op(api, op);
        m.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
        m.duration_us.record(took.as_micros() as u64);
    }

    /// Records an append's time, from its arrival to its answer, under the class it asked for
    /// (`AppendOptions::class`).
    pub fn record_append(&self, class: annals::Durability, took: Duration) {
        self.append_by_class[class as usize].record(took.as_micros() as u64);
    }

    /// A cell a live subscription keeps its position in, for the lag of the slowest; it counts
    /// while the subscription holds it.
    pub fn follower(&self, after: u64) -> std::sync::Arc<AtomicU64> {
        let cell = std::sync::Arc::new(AtomicU64::new(after));
        let mut followers = self.followers.lock().unwrap_or_else(|p| p.into_inner());
        followers.retain(|f| f.strong_count() > 0);
        followers.push(std::sync::Arc::downgrade(&cell));
        cell
    }

    pub fn events_read(&self, n: u64) {
        self.events_read.fetch_add(n, Ordering::Relaxed);
    }

    pub fn auth_failure(&self) {
        self.auth_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn subscribers(&self) -> i64 {
        self.subscribers.load(Ordering::Relaxed)
    }

    pub fn connections(&self) -> i64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Counts a subscriber for as long as the guard lives.
    pub fn subscriber(self: &std::sync::Arc<Self>) -> Gauge {
        Gauge::new(self.clone(), |m| &m.subscribers)
    }

    /// Counts a connection for as long as the guard lives.
    pub fn connection(self: &std::sync::Arc<Self>) -> Gauge {
        Gauge::new(self.clone(), |m| &m.connections)
    }

    /// What the server counted, read once for a scrape.
    pub fn counts(&self) -> ServerCounts {
        let mut ops = Vec::with_capacity(APIS.len() * OPS.len());
        for api in APIS {
            for op in OPS {
                let m = self.op(api, op);
                ops.push(OpCounts {
                    api: api.name(),
                    op: op.name(),
                    outcomes: m.outcomes.each_ref().map(|n| n.load(Ordering::Relaxed)),
                    duration_us: m.duration_us.snapshot(),
                });
            }
        }
        let slowest_subscription = self
            .followers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|f| f.upgrade())
            .map(|cell| cell.load(Ordering::Relaxed))
            .min();
        const CLASSES: [annals::Durability; 5] = [
            annals::Durability::Memory,
            annals::Durability::Written,
            annals::Durability::SyncedLater,
            annals::Durability::Synced,
            annals::Durability::OffMachine,
        ];
        ServerCounts {
            ops,
            append_by_class: CLASSES
                .map(|c| (c.label(), self.append_by_class[c as usize].snapshot()))
                .into(),
            slowest_subscription,
            events_read: self.events_read.load(Ordering::Relaxed),
            subscribers: self.subscribers.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
            auth_failures: self.auth_failures.load(Ordering::Relaxed),
        }
    }
}

/// One operation's counts, as read for a scrape.
#[derive(Debug)]
pub struct OpCounts {
    api: &'static str,
    op: &'static str,
    outcomes: [u64; OUTCOMES.len()],
    duration_us: HistogramSnapshot,
}

/// The server's own counts, as read for a scrape.
#[derive(Debug)]
pub struct ServerCounts {
    ops: Vec<OpCounts>,
    append_by_class: Vec<(&'static str, HistogramSnapshot)>,
    /// The position of the live subscription furthest behind, if any.
    slowest_subscription: Option<u64>,
    events_read: u64,
    subscribers: i64,
    connections: i64,
    auth_failures: u64,
}

/// A read model's counts, labelled by its name.
#[derive(Debug)]
pub struct ModelCounts {
    pub name: String,
    pub position: u64,
    pub checkpoint_position: u64,
    pub lag: u64,
    pub events_applied: u64,
    pub checkpoints: u64,
    pub rebuilds: u64,
    pub failures: u64,
    pub failing: bool,
}

/// The hosted exchange's counts.
#[derive(Debug)]
pub struct ExchangeCounts {
    pub commands: u64,
    pub trades: u64,
    pub queries: u64,
    pub flushes: u64,
    pub snapshots: u64,
    pub snapshot_position: u64,
    pub snapshot_failures: u64,
    pub snapshot_failing: bool,
    /// Trades and quantity traded, by symbol id.
    pub symbols: Vec<(u64, u64)>,
}

impl ExchangeCounts {
    pub fn of(s: &annals_exchange::ServiceStats) -> ExchangeCounts {
        ExchangeCounts {
            commands: s.commands.load(Ordering::Relaxed),
            trades: s.trades.load(Ordering::Relaxed),
            queries: s.queries.load(Ordering::Relaxed),
            flushes: s.flushes.load(Ordering::Relaxed),
            snapshots: s.snapshots.load(Ordering::Relaxed),
            snapshot_position: s.snapshot_position.load(Ordering::Relaxed),
            snapshot_failures: s.snapshot_failures.load(Ordering::Relaxed),
            snapshot_failing: s.snapshot_error.lock().is_some(),
            symbols: s
                .symbols
                .read()
                .iter()
                .map(|c| {
                    (
                        c.trades.load(Ordering::Relaxed),
                        c.volume.load(Ordering::Relaxed),
                    )
                })
                .collect(),
        }
    }
}

/// Everything one scrape exposes, read when the scrape came. Registered as the collector of a
/// registry made for the scrape, so that what is written is what was read at that moment.
#[derive(Debug)]
pub struct Scrape {
    pub server: ServerCounts,
    pub stats: Stats,
    /// The bytes of streamed answers held, and the budget for them.
    pub stream_bytes: (u64, u64),
    pub read_models: Vec<ModelCounts>,
    pub exchange: Option<ExchangeCounts>,
    /// The process's own series (None where `/proc` cannot be read).
    pub process: Option<crate::process::ProcessStats>,
    /// Decisions' snapshots: how many are kept (None when the shelf could not say) and what
    /// their loads and saves did.
    pub snapshots: (Option<SnapshotStats>, SnapshotCounts),
    /// The schema registry's counts, when the store has one.
    pub schemas: Option<annals::registry::RegistryStats>,
}

impl Scrape {
    /// The exposition in the Prometheus text format, version 0.0.4
    /// ([`prometheus_client::encoding::prometheus_text::CONTENT_TYPE`]).
    pub fn exposition(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::with_capacity(16384);
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
            .expect("the exposition is written to a String");
        out
    }
}

impl Scrape {
    /// The same series as OTLP metrics, each point's time `now` and its start `start` (both
    /// in nanoseconds since the Unix epoch): counters as monotonic cumulative sums (named
    /// without `_total`, which a Prometheus exporter adds again), gauges as gauges, an info
    /// series as a gauge of 1 named `..._info`, histograms with the same bounds.
    pub fn otlp(&self, start: u64, now: u64) -> Vec<crate::otlp_metrics::Metric> {
        let mut out = Out::Otlp(crate::otlp_metrics::Series::new(start, now));
        self.write(&mut out)
            .expect("series written to memory cannot fail");
        match out {
            Out::Otlp(series) => series.metrics,
            Out::Text(_) => unreachable!("the series were written as OTLP"),
        }
    }

    fn write(&self, out: &mut Out) -> std::fmt::Result {
        out.server(&self.server)?;
        out.gauge(
            "annals_subscription_lag_positions",
            "How far the live subscription furthest behind has yet to read: the head's position \
             less its own (0 with none).",
            self.server
                .slowest_subscription
                .map_or(0, |p| self.stats.head.saturating_sub(p)),
        )?;
        out.store(&self.stats)?;
        out.gauge(
            "annals_stream_buffered_bytes",
            "Bytes of streamed answers (long reads, subscriptions, market data) held until \
             written.",
            self.stream_bytes.0,
        )?;
        out.gauge(
            "annals_stream_buffered_bytes_max",
            "The server's budget for them (limits.stream_bytes_max).",
            self.stream_bytes.1,
        )?;
        out.read_models(&self.read_models)?;
        out.snapshots(&self.snapshots)?;
        out.spans()?;
        if let Some(schemas) = &self.schemas {
            out.schemas(schemas)?;
        }
        if let Some(exchange) = &self.exchange {
            out.exchange(exchange)?;
        }
        out.info(
            "annals_build",
            "The server's build (labels): its version.",
            [("version", env!("CARGO_PKG_VERSION"))],
        )?;
        if let Some(process) = &self.process {
            out.process(process)?;
        }
        Ok(())
    }
}

impl Collector for Scrape {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.write(&mut Out::Text(encoder))
    }
}

impl Out<'_> {
    /// The OTLP export's counts (all zero when nothing is exported; see `telemetry` and
    /// `otlp_metrics`).
    fn spans(&mut self) -> std::fmt::Result {
        use std::sync::atomic::Ordering::Relaxed;
        let spans = &crate::telemetry::SPANS;
        self.counter(
            "annals_trace_spans_exported",
            "Spans the OTLP collector took.",
            spans.exported.load(Relaxed),
        )?;
        self.counter(
            "annals_trace_spans_dropped",
            "Spans dropped because the export queue was full (a slow or absent collector); \
             requests never wait for the export.",
            spans.dropped.load(Relaxed),
        )?;
        self.counter(
            "annals_trace_spans_failed",
            "Spans lost in exports the collector did not take.",
            spans.failed.load(Relaxed),
        )?;
        let pushes = &crate::otlp_metrics::PUSHES;
        self.counter(
            "annals_metric_exports",
            "Pushes of these series over OTLP the collector took.",
            pushes.exported.load(Relaxed),
        )?;
        self.counter(
            "annals_metric_exports_failed",
            "Pushes of these series over OTLP that failed (each is retried at the next \
             interval with the series as they are then).",
            pushes.failed.load(Relaxed),
        )
    }
}

/// Writes series through the collector's encoder (`/metrics`), or as OTLP metrics (the
/// push to a collector). A counter's name is given without its `_total`, which the text
/// encoder adds.
enum Out<'a> {
    Text(DescriptorEncoder<'a>),
    Otlp(crate::otlp_metrics::Series),
}

/// A series' labels: written by the text encoder, and as OTLP attributes.
trait Labels: EncodeLabelSet {
    fn pairs(&self) -> Vec<(&str, &str)>;
}

impl<S: AsRef<str>, const N: usize> Labels for [(&'static str, S); N]
where
    [(&'static str, S); N]: EncodeLabelSet,
{
    fn pairs(&self) -> Vec<(&str, &str)> {
        self.iter().map(|(k, v)| (*k, v.as_ref())).collect()
    }
}

impl Out<'_> {
    fn counter<V: EncodeCounterValue + Number + std::fmt::Debug>(
        &mut self,
        name: &str,
        help: &str,
        value: V,
    ) -> std::fmt::Result {
        match self {
            Out::Text(encoder) => {
                let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                ConstCounter::new(value).encode(metric)
            }
            Out::Otlp(series) => {
                let point = series.point(&[], value.number());
                series.sum(name, help, vec![point]);
                Ok(())
            }
        }
    }

    fn gauge<V: EncodeGaugeValue + Number + std::fmt::Debug>(
        &mut self,
        name: &str,
        help: &str,
        value: V,
    ) -> std::fmt::Result {
        match self {
            Out::Text(encoder) => {
                let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                ConstGauge::new(value).encode(metric)
            }
            Out::Otlp(series) => {
                let point = series.point(&[], value.number());
                series.gauge(name, help, vec![point]);
                Ok(())
            }
        }
    }

    /// A gauge whose value is 1 and whose labels say what holds (`name_info`).
    fn info(&mut self, name: &str, help: &str, labels: impl Labels) -> std::fmt::Result {
        match self {
            Out::Text(encoder) => {
                let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Info)?;
                metric.encode_info(&labels)
            }
            Out::Otlp(series) => {
                let point = series.point(&labels.pairs(), 1u64.number());
                series.gauge(&format!("{name}_info"), help, vec![point]);
                Ok(())
            }
        }
    }

    fn counters<L: Labels>(
        &mut self,
        name: &str,
        help: &str,
        rows: impl IntoIterator<Item = (L, u64)>,
    ) -> std::fmt::Result {
        match self {
            Out::Text(encoder) => {
                let mut metric =
                    encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                for (labels, value) in rows {
                    metric
                        .encode_family(&labels)?
                        .encode_counter::<NoLabelSet, _, u64>(&value, None)?;
                }
                Ok(())
            }
            Out::Otlp(series) => {
                let points = rows
                    .into_iter()
                    .map(|(labels, value)| series.point(&labels.pairs(), value.number()))
                    .collect();
                series.sum(name, help, points);
                Ok(())
            }
        }
    }

    fn gauges<L: Labels, V: EncodeGaugeValue + Number>(
        &mut self,
        name: &str,
        help: &str,
        rows: impl IntoIterator<Item = (L, V)>,
    ) -> std::fmt::Result {
        match self {
            Out::Text(encoder) => {
                let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                for (labels, value) in rows {
                    metric.encode_family(&labels)?.encode_gauge(&value)?;
                }
                Ok(())
            }
            Out::Otlp(series) => {
                let points = rows
                    .into_iter()
                    .map(|(labels, value)| series.point(&labels.pairs(), value.number()))
                    .collect();
                series.gauge(name, help, points);
                Ok(())
            }
        }
    }

    /// One unlabelled histogram over fixed `bounds` (see `histograms`).
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        h: &HistogramSnapshot,
        bounds: &[u64],
        scale: f64,
    ) -> std::fmt::Result {
        self.histograms(name, help, [([] as [(&str, &str); 0], h)], bounds, scale)
    }

    /// Histograms over fixed `bounds` (in the snapshot's unit); bounds and sums are scaled by
    /// `scale` (microseconds to seconds).
    fn histograms<'h, L: Labels>(
        &mut self,
        name: &str,
        help: &str,
        rows: impl IntoIterator<Item = (L, &'h HistogramSnapshot)>,
        bounds: &[u64],
        scale: f64,
    ) -> std::fmt::Result {
        match self {
            Out::Text(encoder) => {
                let mut metric =
                    encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
                for (labels, h) in rows {
                    let buckets = fixed_buckets(h, bounds, scale);
                    let sum = h.sum as f64 * scale;
                    metric
                        .encode_family(&labels)?
                        .encode_histogram::<NoLabelSet>(sum, h.count, &buckets, None)?;
                }
                Ok(())
            }
            Out::Otlp(series) => {
                let points = rows
                    .into_iter()
                    .map(|(labels, h)| {
                        let buckets = fixed_buckets(h, bounds, scale);
                        let sum = h.sum as f64 * scale;
                        series.histogram_point(&labels.pairs(), sum, h.count, &buckets)
                    })
                    .collect();
                series.histogram(name, help, points);
                Ok(())
            }
        }
    }

    fn server(&mut self, s: &ServerCounts) -> std::fmt::Result {
        // Every outcome of every operation, from the start, so that a rate over a series that
        // first moves late counts from 0; only appends have a condition to fail.
        let by_outcome = s.ops.iter().flat_map(|o| {
            OUTCOMES
                .iter()
                .filter(move |&&outcome| outcome != Outcome::Conflict || o.op == "append")
                .map(move |&outcome| {
                    let labels = [("api", o.api), ("op", o.op), ("outcome", outcome.name())];
                    (labels, o.outcomes[outcome as usize])
                })
        });
        self.counters(
            "annals_requests",
            "Requests by API, operation and outcome: ok, condition_failed (an append answered \
             with its condition failed), client_error (bad input or authorization: 4xx, gRPC \
             client codes), server_error (the server or the store failed: 5xx, gRPC server \
             codes).",
            by_outcome,
        )?;
        self.histograms(
            "annals_request_duration_seconds",
            "Time from a request's arrival to its answer (for streams: to the first response).",
            s.ops
                .iter()
                .map(|o| ([("api", o.api), ("op", o.op)], &o.duration_us)),
            &DURATION_BOUNDS_US,
            1e-6,
        )?;
        self.histograms(
            "annals_append_duration_seconds",
            "Time an append took from its admission to its outcome, by the durability class it \
             was acknowledged in (its request's, or the server's).",
            s.append_by_class
                .iter()
                .map(|(class, h)| ([("class", *class)], h)),
            &DURATION_BOUNDS_US,
            1e-6,
        )?;
        self.counter(
            "annals_events_read",
            "Events sent to readers and subscribers.",
            s.events_read,
        )?;
        self.gauge(
            "annals_subscribers",
            "Live subscriptions (HTTP and gRPC).",
            s.subscribers,
        )?;
        self.gauge(
            "annals_connections",
            "Open client connections.",
            s.connections,
        )?;
        self.counter(
            "annals_auth_failures",
            "Requests refused for a missing, invalid or insufficient API key.",
            s.auth_failures,
        )
    }

    fn store(&mut self, stats: &Stats) -> std::fmt::Result {
        self.gauge(
            "annals_head_position",
            "Position of the last acknowledged event.",
            stats.head,
        )?;
        for (name, help, value) in [
            (
                "annals_appends",
                "Appends committed by the writer.",
                stats.appends,
            ),
            (
                "annals_events_appended",
                "Events appended.",
                stats.events_appended,
            ),
            (
                "annals_append_conditions_failed",
                "Appends refused by their condition.",
                stats.conditions_failed,
            ),
            (
                "annals_idempotent_retries",
                "Conditional appends recognised by their ids as retries of appends already \
                 stored.",
                stats.idempotent_retries,
            ),
            (
                "annals_checkpoints_failed",
                "Background index checkpoints that failed (the log stays the truth).",
                stats.checkpoints_failed,
            ),
            (
                "annals_groups",
                "Groups committed (one write, and in D3 one fdatasync, each).",
                stats.groups,
            ),
            (
                "annals_caller_commits",
                "Of the groups, those a lone blocking caller committed on its own thread.",
                stats.caller_commits,
            ),
        ] {
            self.counter(name, help, value)?;
        }
        if let Some(db) = &stats.database {
            for (name, help, value) in [
                (
                    "annals_database_commits",
                    "PostgreSQL: group commits that went in.",
                    db.commits,
                ),
                (
                    "annals_database_conflicts",
                    "PostgreSQL: group commits that found another server had committed first, \
                     or rolled back as a serialization failure (checked again and retried).",
                    db.conflicts,
                ),
                (
                    "annals_database_passed",
                    "PostgreSQL: retries of groups that went in right after another server's \
                     appends, which did not matter to their conditions.",
                    db.passed,
                ),
                (
                    "annals_database_followed",
                    "PostgreSQL: appends of other servers taken into this server's log.",
                    db.followed,
                ),
                (
                    "annals_database_reconnects",
                    "PostgreSQL: connections made again after one was lost.",
                    db.reconnects,
                ),
                (
                    "annals_database_unknown_outcomes",
                    "PostgreSQL: appends answered outcome_unknown (the commit's fate not known).",
                    db.unknown_outcomes,
                ),
                (
                    "annals_database_settled_outcomes",
                    "PostgreSQL: appends whose commit's fate was unknown when the session \
                     ended, then settled by reading the log.",
                    db.settled_outcomes,
                ),
            ] {
                self.counter(name, help, value)?;
            }
        }
        self.counters(
            "annals_commits",
            "Appends committed, by the route they took into the log.",
            stats
                .commits
                .iter()
                .map(|(route, n)| ([("route", route.as_str())], *n)),
        )?;
        self.counter(
            "annals_caller_stages",
            "Appends their callers staged into the next group while the writer thread synced.",
            stats.caller_stages,
        )?;
        self.histogram(
            "annals_group_appends",
            "Appends per committed group (batch size).",
            &stats.group_appends,
            &GROUP_BOUNDS,
            1.0,
        )?;
        self.counter("annals_fsyncs", "fdatasync calls on the log.", stats.fsyncs)?;
        self.histogram(
            "annals_fsync_seconds",
            "fdatasync latency.",
            &stats.fsync_us,
            &FSYNC_BOUNDS_US,
            1e-6,
        )?;
        self.gauge(
            "annals_queue_depth",
            "Appends waiting for the writer.",
            stats.queue_depth,
        )?;
        self.gauge(
            "annals_waiting_callers",
            "Callers blocked on or awaiting an append's outcome.",
            stats.waiting,
        )?;
        self.gauge(
            "annals_index_bytes",
            "Bytes used by the in-memory indexes.",
            stats.index_bytes,
        )?;
        self.gauge(
            "annals_segments",
            "Segment files in the log.",
            stats.segments,
        )?;
        self.gauge(
            "annals_segment_bytes",
            "Bytes of the log's segment files.",
            stats.segment_bytes,
        )?;
        self.gauge(
            "annals_disk_full",
            "1 while appends that need a new segment are refused for lack of room.",
            u64::from(stats.disk_full.is_some()),
        )?;
        if let Some(free) = stats.disk_free_bytes {
            self.gauge(
                "annals_disk_free_bytes",
                "Free bytes of the file system holding the log.",
                free,
            )?;
        }
        self.counter(
            "annals_disk_full_refusals",
            "Appends refused because the file system had no room for a new segment.",
            stats.disk_full_refusals,
        )?;
        self.gauge(
            "annals_poisoned",
            "1 when a failed write or fsync stopped acknowledgements until reopen.",
            u64::from(stats.poisoned.is_some()),
        )?;
        self.info(
            "annals_durability",
            "The store's durability class (label).",
            [("class", stats.durability)],
        )?;
        self.gauge(
            "annals_ready",
            "1 while the store can keep what it promises (GET /ready's reasons list what not).",
            u64::from(stats.unready_reasons().is_empty()),
        )?;
        if let Some(backup) = &stats.backup {
            self.backup(backup)?;
        }
        if let Some(scrub) = &stats.scrub {
            self.scrub(scrub)?;
        }
        if let Some(replica) = &stats.replica {
            self.replica(replica)?;
        }
        Ok(())
    }

    /// The background scrub's series: what it read, what it found and repaired.
    fn scrub(&mut self, s: &annals::ScrubStats) -> std::fmt::Result {
        self.counter(
            "annals_scrub_passes",
            "Passes of the scrub over every sealed segment.",
            s.passes,
        )?;
        self.counter(
            "annals_scrub_bytes_checked",
            "Bytes of sealed segments the scrub read and checked.",
            s.bytes_checked,
        )?;
        self.gauge(
            "annals_scrub_damaged_segments",
            "Sealed segments holding damage the scrub found and could not repair.",
            s.damaged.len(),
        )?;
        self.counter(
            "annals_scrub_repaired",
            "Damaged records the scrub put back from the backup.",
            s.repaired,
        )
    }

    /// The continuous backup's series: how far it trails the log, what it shipped, failures.
    fn backup(&mut self, b: &annals::BackupStats) -> std::fmt::Result {
        self.gauge(
            "annals_backup_shipped_position",
            "Every position up to this one is in object storage.",
            b.shipped_through,
        )?;
        self.gauge(
            "annals_backup_lag_positions",
            "Durable positions not yet in object storage.",
            b.lag_positions,
        )?;
        self.gauge(
            "annals_backup_lag_seconds",
            "How long the oldest durable append not yet in object storage has waited.",
            b.lag_seconds,
        )?;
        self.counter(
            "annals_backup_bytes_shipped",
            "Bytes written to object storage by the backup.",
            b.bytes_shipped,
        )?;
        self.counter(
            "annals_backup_objects_shipped",
            "Objects written to object storage by the backup.",
            b.objects_shipped,
        )?;
        self.counter(
            "annals_backup_failures",
            "Requests to object storage that failed (each retried with backoff).",
            b.failures,
        )?;
        self.gauges(
            "annals_backup_state",
            "The backup's state (label): shipping, failing (retrying), standby (another server \
             of the database ships) or stopped.",
            ["shipping", "failing", "standby", "stopped"]
                .map(|state| ([("state", state)], u64::from(b.state == state))),
        )
    }

    /// A read replica's series: how far behind its backup it is, and whether it can read it.
    fn replica(&mut self, r: &annals::ReplicaStats) -> std::fmt::Result {
        self.gauge(
            "annals_replica_backup_position",
            "The last position the replica saw its backup hold.",
            r.backup_head,
        )?;
        self.gauge(
            "annals_replica_lag_positions",
            "Positions the backup was seen to hold beyond the replica's copy.",
            r.lag_positions,
        )?;
        self.gauge(
            "annals_replica_lag_seconds",
            "How long since the replica's copy last held everything its backup held.",
            r.lag_seconds,
        )?;
        self.gauge(
            "annals_replica_last_poll_timestamp_seconds",
            "When the last successful poll of the backup ended (Unix time).",
            r.last_poll_at_us as f64 / 1e6,
        )?;
        self.gauge(
            "annals_replica_last_poll_age_seconds",
            "How long ago the last successful poll of the backup ended.",
            r.last_poll_age_seconds,
        )?;
        self.counter(
            "annals_replica_objects_read",
            "Objects of the backup taken into the replica's copy.",
            r.objects_read,
        )?;
        self.counter(
            "annals_replica_failures",
            "Polls of the backup that failed (each retried with backoff).",
            r.failures,
        )?;
        self.gauges(
            "annals_replica_state",
            "The replica's state (label): following (its last poll of the backup succeeded) or \
             failing (the backup cannot be read; retrying).",
            ["following", "failing"].map(|state| ([("state", state)], u64::from(r.state == state))),
        )
    }

    /// The schema registry's checks on append.
    fn schemas(&mut self, s: &annals::registry::RegistryStats) -> std::fmt::Result {
        self.counters(
            "annals_schema_checks",
            "Events checked against their type's schema on append, by outcome: fit, refused \
             (enforcement reject: the append was refused) or warned (enforcement warn: stored).",
            [
                ("fit", s.checked.saturating_sub(s.refused + s.warned)),
                ("refused", s.refused),
                ("warned", s.warned),
            ]
            .map(|(outcome, n)| ([("outcome", outcome)], n)),
        )?;
        self.counter(
            "annals_schema_unknown_type_refusals",
            "Appends refused because an event's type has no schema and the store refuses those.",
            s.unknown_refused,
        )
    }

    /// Decisions' snapshots' series.
    fn snapshots(
        &mut self,
        (stats, counts): &(Option<SnapshotStats>, SnapshotCounts),
    ) -> std::fmt::Result {
        if let Some(stats) = stats {
            self.gauge(
                "annals_snapshots",
                "Decisions' snapshots kept (one per model, version and query).",
                stats.count,
            )?;
            self.gauge(
                "annals_snapshot_bytes",
                "Their bytes (states and envelopes).",
                stats.bytes,
            )?;
        }
        self.counters(
            "annals_snapshot_loads",
            "Loads of a snapshot by what they found: hit, miss, stale (only other versions \
             of the model) or unfit (does not fit the log).",
            [
                ("hit", counts.hits),
                ("miss", counts.misses),
                ("stale", counts.stale),
                ("unfit", counts.unfit),
            ]
            .map(|(outcome, n)| ([("outcome", outcome)], n)),
        )?;
        self.counters(
            "annals_snapshot_saves",
            "Saves of a snapshot by outcome: saved, behind (one further on was kept) or \
             refused (it folded a data subject erased since).",
            [
                ("saved", counts.saved),
                ("behind", counts.behind),
                ("refused", counts.refused),
            ]
            .map(|(outcome, n)| ([("outcome", outcome)], n)),
        )?;
        self.counter(
            "annals_snapshots_purged",
            "Snapshots removed because they folded a data subject erased since.",
            counts.purged,
        )
    }

    fn read_models(&mut self, models: &[ModelCounts]) -> std::fmt::Result {
        type Field = fn(&ModelCounts) -> u64;
        let gauges: [(&str, &str, Field); 4] = [
            (
                "annals_readmodel_position",
                "Every matching event at or below this position is folded.",
                |m| m.position,
            ),
            (
                "annals_readmodel_checkpoint_position",
                "The position of the read model's durable checkpoint.",
                |m| m.checkpoint_position,
            ),
            (
                "annals_readmodel_lag",
                "Store positions the read model has still to scan (head - position).",
                |m| m.lag,
            ),
            (
                "annals_readmodel_failing",
                "1 while the read model's last step failed (see its status for the error).",
                |m| u64::from(m.failing),
            ),
        ];
        let counters: [(&str, &str, Field); 4] = [
            (
                "annals_readmodel_events_applied",
                "Events folded since the server started.",
                |m| m.events_applied,
            ),
            (
                "annals_readmodel_checkpoints",
                "Checkpoints written since the server started.",
                |m| m.checkpoints,
            ),
            (
                "annals_readmodel_rebuilds",
                "Rebuilds asked for since the server started.",
                |m| m.rebuilds,
            ),
            (
                "annals_readmodel_failures",
                "Steps that failed and were retried: checkpoints not written (a full disk, \
                 say), effects not appended.",
                |m| m.failures,
            ),
        ];
        for (name, help, field) in gauges {
            let rows = models
                .iter()
                .map(|m| ([("name", m.name.as_str())], field(m)));
            self.gauges(name, help, rows)?;
        }
        for (name, help, field) in counters {
            let rows = models
                .iter()
                .map(|m| ([("name", m.name.as_str())], field(m)));
            self.counters(name, help, rows)?;
        }
        Ok(())
    }

    /// The hosted exchange's series.
    fn exchange(&mut self, x: &ExchangeCounts) -> std::fmt::Result {
        for (name, help, value) in [
            (
                "annals_exchange_commands",
                "Commands the matcher executed since the server started.",
                x.commands,
            ),
            (
                "annals_exchange_trades",
                "Trades printed since the server started.",
                x.trades,
            ),
            (
                "annals_exchange_queries",
                "Queries the matcher answered since the server started.",
                x.queries,
            ),
            (
                "annals_exchange_flushes",
                "Batches the matcher handed to the journal.",
                x.flushes,
            ),
            (
                "annals_exchange_snapshots",
                "Snapshots saved since the server started.",
                x.snapshots,
            ),
            (
                "annals_exchange_snapshot_failures",
                "Snapshots that could not be saved (the next one due tries again).",
                x.snapshot_failures,
            ),
        ] {
            self.counter(name, help, value)?;
        }
        self.gauge(
            "annals_exchange_snapshot_position",
            "The journal position of the newest snapshot saved since the server started.",
            x.snapshot_position,
        )?;
        self.gauge(
            "annals_exchange_snapshot_failing",
            "1 while the last snapshot could not be saved.",
            u64::from(x.snapshot_failing),
        )?;
        let symbol = |i: usize| [("symbol", i.to_string())];
        self.counters(
            "annals_exchange_symbol_trades",
            "Trades printed since the server started, by symbol.",
            x.symbols.iter().enumerate().map(|(i, c)| (symbol(i), c.0)),
        )?;
        self.counters(
            "annals_exchange_symbol_volume",
            "Quantity traded since the server started, by symbol.",
            x.symbols.iter().enumerate().map(|(i, c)| (symbol(i), c.1)),
        )
    }

    /// The process's series, named as Prometheus' client libraries name them.
    fn process(&mut self, p: &crate::process::ProcessStats) -> std::fmt::Result {
        self.counter(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds.",
            p.cpu_seconds,
        )?;
        self.gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            p.resident_memory_bytes,
        )?;
        self.gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            p.virtual_memory_bytes,
        )?;
        self.gauge(
            "process_open_fds",
            "Number of open file descriptors.",
            p.open_fds,
        )?;
        if let Some(max) = p.max_fds {
            self.gauge(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max,
            )?;
        }
        self.gauge(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds.",
            p.start_time_seconds,
        )
    }
}

/// The bucket bounds, in microseconds, of every duration histogram: powers of four from 1 us
/// to about 17 s. Fixed, so that every series has the same `le` values from its first scrape
/// on (a bucket that appeared only once filled would be undercounted by `rate()`).
const DURATION_BOUNDS_US: [u64; 13] = [
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
];

/// The bucket bounds, in microseconds, of the fsync latency: powers of two from 1 us to about
/// 17 s, finer than a request's (the console's fsync percentiles are read from them).
const FSYNC_BOUNDS_US: [u64; 25] = {
    let mut bounds = [0; 25];
    let mut i = 0;
    while i < bounds.len() {
        bounds[i] = 1 << i;
        i += 1;
    }
    bounds
};

/// The bucket bounds of the appends-per-group histogram: powers of four up to 4096.
const GROUP_BOUNDS: [u64; 7] = [1, 4, 16, 64, 256, 1024, 4096];

/// How many recorded values are at most `bound` (a power of two, as the snapshot's bounds).
fn cumulative_at(h: &HistogramSnapshot, bound: u64) -> u64 {
    debug_assert!(bound.is_power_of_two());
    h.buckets
        .iter()
        .take_while(|(upper, _)| *upper <= bound)
        .last()
        .map_or(0, |(_, count)| *count)
}

/// The snapshot's counts in each of `bounds` (not cumulative: the encoder sums them), scaled.
fn fixed_buckets(h: &HistogramSnapshot, bounds: &[u64], scale: f64) -> Vec<(f64, u64)> {
    let mut below = 0;
    bounds
        .iter()
        .map(|&bound| {
            let cumulative = cumulative_at(h, bound);
            let in_bucket = cumulative - below;
            below = cumulative;
            (bound as f64 * scale, in_bucket)
        })
        .collect()
}

/// Decrements its gauge when dropped.
pub struct Gauge {
    metrics: std::sync::Arc<Metrics>,
    field: fn(&Metrics) -> &AtomicI64,
}

impl Gauge {
    fn new(metrics: std::sync::Arc<Metrics>, field: fn(&Metrics) -> &AtomicI64) -> Self {
        field(&metrics).fetch_add(1, Ordering::Relaxed);
        Gauge { metrics, field }
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        (self.field)(&self.metrics).fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exposition of a memory-only store with one append, with one model's series and the
    /// exchange's, and the server's.
    fn exposition() -> String {
        let store = annals::Store::open_in_memory(annals::Options::default()).unwrap();
        store
            .append(&[annals::NewEvent::new("Opened", "{}").tag("k:1")], None)
            .unwrap();
        let metrics = Metrics::default();
        metrics.record(
            Api::Http,
            Op::Append,
            Outcome::Ok,
            Duration::from_micros(100),
        );
        let model = ModelCounts {
            name: "orders \"open\"\n".into(),
            position: 1,
            checkpoint_position: 0,
            lag: 0,
            events_applied: 1,
            checkpoints: 0,
            rebuilds: 0,
            failures: 0,
            failing: false,
        };
        let text = Scrape {
            server: metrics.counts(),
            stats: store.stats(),
            stream_bytes: (0, 1 << 20),
            read_models: vec![model],
            exchange: Some(ExchangeCounts::of(&annals_exchange::ServiceStats::default())),
            process: None,
            snapshots: (
                Some(store.snapshots().stats().unwrap()),
                store.snapshots().counts(),
            ),
            schemas: Some(annals::registry::RegistryStats::default()),
        }
        .exposition();
        store.close().unwrap();
        text
    }

    /// Goal: a change to the series `/metrics` exposes (a name, its help, its type, its
    /// labels) is a visible decision: the exposition is compared with the copy committed
    /// beside the tests (`ANNALS_UPDATE_SNAPSHOTS=1` writes it anew). Method: a memory-only
    /// store with one append, a read model and the exchange, every sample's value cut off
    /// (what is counted varies; what is exposed may not).
    #[test]
    fn the_exposition_is_the_committed_snapshot() {
        let shape: String = exposition()
            .lines()
            .map(|line| match line.starts_with('#') {
                true => format!("{line}\n"),
                false => format!(
                    "{}\n",
                    line.rsplit_once(' ').map_or(line, |(series, _)| series)
                ),
            })
            .collect();
        crate::snapshot::assert_snapshot("metrics.txt", &shape);
    }

    /// Goal: label values are escaped by the library: a read model's name with a quote and a
    /// newline cannot break the exposition. Method: the exposition's line for that model.
    #[test]
    fn labels_are_escaped() {
        let text = exposition();
        assert!(
            text.contains("annals_readmodel_position{name=\"orders \\\"open\\\"\\n\"} 1"),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(
                line.rsplit_once(' ').unwrap().1.parse::<f64>().is_ok(),
                "{line}"
            );
        }
    }

    /// Goal: every histogram series exposes the same buckets whatever it counted, with
    /// cumulative counts, and a failed condition is counted for appends only. Regression:
    /// empty buckets were left out, so each series had its own growing set of `le` values;
    /// a failed-condition counter was exported for reads and heads, always 0. Method: one
    /// histogram with values and one without, their bucket lines compared; the exposition's
    /// failed-condition series.
    #[test]
    fn histograms_expose_fixed_buckets() {
        let filled = Log2Histogram::default();
        for value in [3, 100, 5000] {
            filled.record(value);
        }
        let cumulative = |h: &Log2Histogram| {
            let mut sum = 0;
            fixed_buckets(&h.snapshot(), &DURATION_BOUNDS_US, 1.0)
                .into_iter()
                .map(|(bound, n)| {
                    sum += n;
                    (bound, sum)
                })
                .collect::<Vec<_>>()
        };
        let (filled, empty) = (cumulative(&filled), cumulative(&Log2Histogram::default()));
        let bounds = |v: &[(f64, u64)]| v.iter().map(|(b, _)| *b).collect::<Vec<_>>();
        assert_eq!(bounds(&filled), bounds(&empty));
        assert_eq!(filled.len(), DURATION_BOUNDS_US.len());
        let counts: Vec<u64> = filled.iter().map(|(_, c)| *c).collect();
        assert_eq!(counts, [0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3]);
        assert!(empty.iter().all(|(_, c)| *c == 0));
        let text = exposition();
        let failed: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("annals_requests_total{"))
            .filter(|l| l.contains("outcome=\"condition_failed\""))
            .collect();
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert!(
            failed.iter().all(|l| l.contains("op=\"append\"")),
            "{failed:?}"
        );
        let buckets = |series: &str| text.lines().filter(|l| l.starts_with(series)).count();
        assert_eq!(
            buckets("annals_request_duration_seconds_bucket{api=\"http\",op=\"append\""),
            DURATION_BOUNDS_US.len() + 1
        );
        assert_eq!(
            buckets("annals_request_duration_seconds_bucket{api=\"grpc\",op=\"exchange_market\""),
            DURATION_BOUNDS_US.len() + 1,
            "an operation never asked for has every bucket too"
        );
    }
}
