//! Request counters and latency histograms, and the Prometheus text rendering of them together
//! with the store's own counters (appends, groups, fsync latency, queue depth, head).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use annals::{HistogramSnapshot, Log2Histogram, Stats};

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
}

const APIS: [Api; 2] = [Api::Http, Api::Grpc];
const OPS: [Op; 8] = [
    Op::Append,
    Op::Read,
    Op::Head,
    Op::Subscribe,
    Op::Tracking,
    Op::ReadModel,
    Op::Order,
    Op::Market,
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
        }
    }
}

#[derive(Default)]
struct OpMetrics {
    requests: AtomicU64,
    client_errors: AtomicU64,
    server_errors: AtomicU64,
    conflicts: AtomicU64,
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
}

/// How a request ended, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Conflict,
    ClientError,
    ServerError,
}

impl Metrics {
    fn op(&self, api: Api, op: Op) -> &OpMetrics {
        &self.ops[api as usize][op as usize]
    }

    pub fn record(&self, api: Api, op: Op, outcome: Outcome, took: Duration) {
        let m = self.op(api, op);
        m.requests.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Ok => {}
            Outcome::Conflict => {
                m.conflicts.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::ClientError => {
                m.client_errors.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::ServerError => {
                m.server_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        m.duration_us.record(took.as_micros() as u64);
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

    /// The Prometheus text exposition of the server's and the store's counters.
    pub fn render(&self, stats: &Stats) -> String {
        let mut out = String::with_capacity(8192);
        header(
            &mut out,
            "annals_requests_total",
            "counter",
            "Requests by API and operation.",
        );
        self.each(&mut out, "annals_requests_total", |m| &m.requests);
        header(
            &mut out,
            "annals_request_client_errors_total",
            "counter",
            "Requests refused for bad input or missing authorization (4xx, gRPC client codes).",
        );
        self.each(&mut out, "annals_request_client_errors_total", |m| {
            &m.client_errors
        });
        header(
            &mut out,
            "annals_request_server_errors_total",
            "counter",
            "Requests that failed in the server or the store (5xx, gRPC server codes).",
        );
        self.each(&mut out, "annals_request_server_errors_total", |m| {
            &m.server_errors
        });
        header(
            &mut out,
            "annals_append_conditions_failed_requests_total",
            "counter",
            "Append requests whose condition failed.",
        );
        self.each(
            &mut out,
            "annals_append_conditions_failed_requests_total",
            |m| &m.conflicts,
        );
        header(
            &mut out,
            "annals_request_duration_seconds",
            "histogram",
            "Time from a request's arrival to its answer (for streams: to the first response).",
        );
        for api in APIS {
            for op in OPS {
                let labels = format!("api=\"{}\",op=\"{}\"", api.name(), op.name());
                histogram(
                    &mut out,
                    "annals_request_duration_seconds",
                    &labels,
                    &self.op(api, op).duration_us.snapshot(),
                    &DURATION_BOUNDS_US,
                    1e-6,
                );
            }
        }
        counter(
            &mut out,
            "annals_events_read_total",
            "Events sent to readers and subscribers.",
            self.events_read.load(Ordering::Relaxed) as f64,
        );
        gauge(
            &mut out,
            "annals_subscribers",
            "Live subscriptions (HTTP and gRPC).",
            self.subscribers.load(Ordering::Relaxed) as f64,
        );
        gauge(
            &mut out,
            "annals_connections",
            "Open client connections.",
            self.connections.load(Ordering::Relaxed) as f64,
        );
        counter(
            &mut out,
            "annals_auth_failures_total",
            "Requests refused for a missing, invalid or insufficient API key.",
            self.auth_failures.load(Ordering::Relaxed) as f64,
        );

        // The store.
        gauge(
            &mut out,
            "annals_head_position",
            "Position of the last acknowledged event.",
            stats.head as f64,
        );
        counter(
            &mut out,
            "annals_appends_total",
            "Appends committed by the writer.",
            stats.appends as f64,
        );
        counter(
            &mut out,
            "annals_events_appended_total",
            "Events appended.",
            stats.events_appended as f64,
        );
        counter(
            &mut out,
            "annals_append_conditions_failed_total",
            "Appends refused by their condition.",
            stats.conditions_failed as f64,
        );
        counter(
            &mut out,
            "annals_idempotent_retries_total",
            "Conditional appends recognised by their ids as retries of appends already stored.",
            stats.idempotent_retries as f64,
        );
        counter(
            &mut out,
            "annals_checkpoints_failed_total",
            "Background index checkpoints that failed (the log stays the truth).",
            stats.checkpoints_failed as f64,
        );
        counter(
            &mut out,
            "annals_groups_total",
            "Groups committed (one write, and in D3 one fdatasync, each).",
            stats.groups as f64,
        );
        counter(
            &mut out,
            "annals_caller_commits_total",
            "Of the groups, those a lone blocking caller committed on its own thread.",
            stats.caller_commits as f64,
        );
        if let Some(db) = &stats.database {
            for (name, help, value) in [
                (
                    "annals_database_commits_total",
                    "PostgreSQL: group commits that went in.",
                    db.commits,
                ),
                (
                    "annals_database_conflicts_total",
                    "PostgreSQL: group commits that found another server had committed first, \
                     or rolled back as a serialization failure (checked again and retried).",
                    db.conflicts,
                ),
                (
                    "annals_database_passed_total",
                    "PostgreSQL: retries of groups that went in right after another server's \
                     appends, which did not matter to their conditions.",
                    db.passed,
                ),
                (
                    "annals_database_followed_total",
                    "PostgreSQL: appends of other servers taken into this server's log.",
                    db.followed,
                ),
                (
                    "annals_database_reconnects_total",
                    "PostgreSQL: connections made again after one was lost.",
                    db.reconnects,
                ),
                (
                    "annals_database_unknown_outcomes_total",
                    "PostgreSQL: appends answered outcome_unknown (the commit's fate not known).",
                    db.unknown_outcomes,
                ),
                (
                    "annals_database_settled_outcomes_total",
                    "PostgreSQL: appends whose commit's fate was unknown when the session ended, \
                     then settled by reading the log.",
                    db.settled_outcomes,
                ),
            ] {
                counter(&mut out, name, help, value as f64);
            }
        }
        header(
            &mut out,
            "annals_commits_total",
            "counter",
            "Appends committed, by the route they took into the log.",
        );
        for (route, n) in &stats.commits {
            let _ = writeln!(out, "annals_commits_total{{route=\"{route}\"}} {n}");
        }
        counter(
            &mut out,
            "annals_caller_stages_total",
            "Appends their callers staged into the next group while the writer thread synced.",
            stats.caller_stages as f64,
        );
        header(
            &mut out,
            "annals_group_appends",
            "histogram",
            "Appends per committed group (batch size).",
        );
        histogram(
            &mut out,
            "annals_group_appends",
            "",
            &stats.group_appends,
            &GROUP_BOUNDS,
            1.0,
        );
        counter(
            &mut out,
            "annals_fsyncs_total",
            "fdatasync calls on the log.",
            stats.fsyncs as f64,
        );
        header(
            &mut out,
            "annals_fsync_seconds",
            "histogram",
            "fdatasync latency.",
        );
        histogram(
            &mut out,
            "annals_fsync_seconds",
            "",
            &stats.fsync_us,
            &FSYNC_BOUNDS_US,
            1e-6,
        );
        gauge(
            &mut out,
            "annals_queue_depth",
            "Appends waiting for the writer.",
            stats.queue_depth as f64,
        );
        gauge(
            &mut out,
            "annals_waiting_callers",
            "Callers blocked on or awaiting an append's outcome.",
            stats.waiting as f64,
        );
        gauge(
            &mut out,
            "annals_index_bytes",
            "Bytes used by the in-memory indexes.",
            stats.index_bytes as f64,
        );
        gauge(
            &mut out,
            "annals_segments",
            "Segment files in the log.",
            stats.segments as f64,
        );
        gauge(
            &mut out,
            "annals_segment_bytes",
            "Bytes of the log's segment files.",
            stats.segment_bytes as f64,
        );
        gauge(
            &mut out,
            "annals_disk_full",
            "1 while appends that need a new segment are refused for lack of room.",
            if stats.disk_full.is_some() { 1.0 } else { 0.0 },
        );
        if let Some(free) = stats.disk_free_bytes {
            gauge(
                &mut out,
                "annals_disk_free_bytes",
                "Free bytes of the file system holding the log.",
                free as f64,
            );
        }
        counter(
            &mut out,
            "annals_disk_full_refusals_total",
            "Appends refused because the file system had no room for a new segment.",
            stats.disk_full_refusals as f64,
        );
        gauge(
            &mut out,
            "annals_poisoned",
            "1 when a failed write or fsync stopped acknowledgements until reopen.",
            if stats.poisoned.is_some() { 1.0 } else { 0.0 },
        );
        header(
            &mut out,
            "annals_durability_info",
            "gauge",
            "The store's durability class (label).",
        );
        let _ = writeln!(
            out,
            "annals_durability_info{{class=\"{}\"}} 1",
            stats.durability
        );
        gauge(
            &mut out,
            "annals_ready",
            "1 while the store can keep what it promises (GET /ready's reasons list what not).",
            if stats.unready_reasons().is_empty() {
                1.0
            } else {
                0.0
            },
        );
        if let Some(backup) = &stats.backup {
            render_backup(&mut out, backup);
        }
        if let Some(scrub) = &stats.scrub {
            render_scrub(&mut out, scrub);
        }
        if let Some(replica) = &stats.replica {
            render_replica(&mut out, replica);
        }
        out
    }

    fn each(&self, out: &mut String, name: &str, field: impl Fn(&OpMetrics) -> &AtomicU64) {
        for api in APIS {
            for op in OPS {
                let value = field(self.op(api, op)).load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "{name}{{api=\"{}\",op=\"{}\"}} {value}",
                    api.name(),
                    op.name()
                );
            }
        }
    }
}

/// The background scrub's lines: what it read, what it found and repaired.
fn render_scrub(out: &mut String, s: &annals::ScrubStats) {
    counter(
        out,
        "annals_scrub_passes_total",
        "Passes of the scrub over every sealed segment.",
        s.passes as f64,
    );
    counter(
        out,
        "annals_scrub_bytes_checked_total",
        "Bytes of sealed segments the scrub read and checked.",
        s.bytes_checked as f64,
    );
    gauge(
        out,
        "annals_scrub_damaged_segments",
        "Sealed segments holding damage the scrub found and could not repair.",
        s.damaged.len() as f64,
    );
    counter(
        out,
        "annals_scrub_repaired_total",
        "Damaged records the scrub put back from the backup.",
        s.repaired as f64,
    );
}

/// The continuous backup's lines: how far it trails the log, what it shipped, its failures.
fn render_backup(out: &mut String, b: &annals::BackupStats) {
    gauge(
        out,
        "annals_backup_shipped_position",
        "Every position up to this one is in object storage.",
        b.shipped_through as f64,
    );
    gauge(
        out,
        "annals_backup_lag_positions",
        "Durable positions not yet in object storage.",
        b.lag_positions as f64,
    );
    gauge(
        out,
        "annals_backup_lag_seconds",
        "How long the oldest durable append not yet in object storage has waited.",
        b.lag_seconds,
    );
    counter(
        out,
        "annals_backup_bytes_shipped_total",
        "Bytes written to object storage by the backup.",
        b.bytes_shipped as f64,
    );
    counter(
        out,
        "annals_backup_objects_shipped_total",
        "Objects written to object storage by the backup.",
        b.objects_shipped as f64,
    );
    counter(
        out,
        "annals_backup_failures_total",
        "Requests to object storage that failed (each retried with backoff).",
        b.failures as f64,
    );
    header(
        out,
        "annals_backup_state",
        "gauge",
        "The backup's state (label): shipping, failing (retrying), standby (another server \
         of the database ships) or stopped.",
    );
    for state in ["shipping", "failing", "standby", "stopped"] {
        let on = u8::from(b.state == state);
        let _ = writeln!(out, "annals_backup_state{{state=\"{state}\"}} {on}");
    }
}

/// A read replica's lines: how far behind its backup it is, and whether it can read it.
fn render_replica(out: &mut String, r: &annals::ReplicaStats) {
    gauge(
        out,
        "annals_replica_backup_position",
        "The last position the replica saw its backup hold.",
        r.backup_head as f64,
    );
    gauge(
        out,
        "annals_replica_lag_positions",
        "Positions the backup was seen to hold beyond the replica's copy.",
        r.lag_positions as f64,
    );
    gauge(
        out,
        "annals_replica_lag_seconds",
        "How long since the replica's copy last held everything its backup held.",
        r.lag_seconds,
    );
    gauge(
        out,
        "annals_replica_last_poll_timestamp_seconds",
        "When the last successful poll of the backup ended (Unix time).",
        r.last_poll_at_us as f64 / 1e6,
    );
    gauge(
        out,
        "annals_replica_last_poll_age_seconds",
        "How long ago the last successful poll of the backup ended.",
        r.last_poll_age_seconds,
    );
    counter(
        out,
        "annals_replica_objects_read_total",
        "Objects of the backup taken into the replica's copy.",
        r.objects_read as f64,
    );
    counter(
        out,
        "annals_replica_failures_total",
        "Polls of the backup that failed (each retried with backoff).",
        r.failures as f64,
    );
    header(
        out,
        "annals_replica_state",
        "gauge",
        "The replica's state (label): following (its last poll of the backup succeeded) or \
         failing (the backup cannot be read; retrying).",
    );
    for state in ["following", "failing"] {
        let on = u8::from(r.state == state);
        let _ = writeln!(out, "annals_replica_state{{state=\"{state}\"}} {on}");
    }
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

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn counter(out: &mut String, name: &str, help: &str, value: f64) {
    header(out, name, "counter", help);
    let _ = writeln!(out, "{name} {value}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    header(out, name, "gauge", help);
    let _ = writeln!(out, "{name} {value}");
}

/// Writes a histogram's buckets, `+Inf`, `_sum` and `_count`; bounds and the sum are scaled
/// by `scale` (microseconds to seconds).
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

fn histogram(
    out: &mut String,
    name: &str,
    labels: &str,
    h: &HistogramSnapshot,
    bounds: &[u64],
    scale: f64,
) {
    let sep = if labels.is_empty() { "" } else { "," };
    for &bound in bounds {
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"{}\"}} {}",
            bound as f64 * scale,
            cumulative_at(h, bound)
        );
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let braces = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(out, "{name}_sum{braces} {}", h.sum as f64 * scale);
    let _ = writeln!(out, "{name}_count{braces} {}", h.count);
}

/// The bytes of streamed answers the server holds, and its budget for them.
pub(crate) fn render_stream_bytes(out: &mut String, held: usize, max: usize) {
    gauge(
        out,
        "annals_stream_buffered_bytes",
        "Bytes of streamed answers (long reads, subscriptions, market data) held until written.",
        held as f64,
    );
    gauge(
        out,
        "annals_stream_buffered_bytes_max",
        "The server's budget for them (limits.stream_bytes_max).",
        max as f64,
    );
}

/// The read models' gauges and counters, labelled by name.
pub fn render_read_models(out: &mut String, models: &[crate::readmodels::ModelView]) {
    type Field = fn(&crate::readmodels::ModelView) -> u64;
    let series: [(&str, &str, &str, Field); 8] = [
        (
            "annals_readmodel_position",
            "gauge",
            "Every matching event at or below this position is folded.",
            |m| m.status.position,
        ),
        (
            "annals_readmodel_checkpoint_position",
            "gauge",
            "The position of the read model's durable checkpoint.",
            |m| m.status.checkpoint_position,
        ),
        (
            "annals_readmodel_lag",
            "gauge",
            "Store positions the read model has still to scan (head - position).",
            |m| m.status.lag,
        ),
        (
            "annals_readmodel_events_applied_total",
            "counter",
            "Events folded since the server started.",
            |m| m.status.events_applied,
        ),
        (
            "annals_readmodel_checkpoints_total",
            "counter",
            "Checkpoints written since the server started.",
            |m| m.status.checkpoints,
        ),
        (
            "annals_readmodel_rebuilds_total",
            "counter",
            "Rebuilds asked for since the server started.",
            |m| m.status.rebuilds,
        ),
        (
            "annals_readmodel_failures_total",
            "counter",
            "Steps that failed and were retried: checkpoints not written (a full disk, say), \
             effects not appended.",
            |m| m.status.failures,
        ),
        (
            "annals_readmodel_failing",
            "gauge",
            "1 while the read model's last step failed (see its status for the error).",
            |m| u64::from(m.status.error.is_some()),
        ),
    ];
    for (name, kind, help, field) in series {
        header(out, name, kind, help);
        for model in models {
            let _ = writeln!(
                out,
                "{name}{{name=\"{}\"}} {}",
                model.status.name,
                field(model)
            );
        }
    }
}

/// The hosted exchange's counters.
pub fn render_exchange(out: &mut String, stats: &annals_exchange::ServiceStats) {
    use annals_exchange::ServiceStats;
    type Field = fn(&ServiceStats) -> u64;
    let series: [(&str, &str, &str, Field); 8] = [
        (
            "annals_exchange_commands_total",
            "counter",
            "Commands the matcher executed since the server started.",
            |s| s.commands.load(Ordering::Relaxed),
        ),
        (
            "annals_exchange_trades_total",
            "counter",
            "Trades printed since the server started.",
            |s| s.trades.load(Ordering::Relaxed),
        ),
        (
            "annals_exchange_queries_total",
            "counter",
            "Queries the matcher answered since the server started.",
            |s| s.queries.load(Ordering::Relaxed),
        ),
        (
            "annals_exchange_flushes_total",
            "counter",
            "Batches the matcher handed to the journal.",
            |s| s.flushes.load(Ordering::Relaxed),
        ),
        (
            "annals_exchange_snapshots_total",
            "counter",
            "Snapshots saved since the server started.",
            |s| s.snapshots.load(Ordering::Relaxed),
        ),
        (
            "annals_exchange_snapshot_position",
            "gauge",
            "The journal position of the newest snapshot saved since the server started.",
            |s| s.snapshot_position.load(Ordering::Relaxed),
        ),
        (
            "annals_exchange_snapshot_failures_total",
            "counter",
            "Snapshots that could not be saved (the next one due tries again).",
            |s| s.snapshot_failures.load(Ordering::Relaxed),
        ),
        (
            "annals_exchange_snapshot_failing",
            "gauge",
            "1 while the last snapshot could not be saved.",
            |s| u64::from(s.snapshot_error.lock().is_some()),
        ),
    ];
    for (name, kind, help, field) in series {
        header(out, name, kind, help);
        let _ = writeln!(out, "{name} {}", field(stats));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a change to the series `/metrics` exposes (a name, its help, its type, its
    /// labels) is a visible decision: the exposition of a fresh store is compared with the
    /// copy committed beside the tests (`ANNALS_UPDATE_SNAPSHOTS=1` writes it anew). Method:
    /// a memory-only store with one append, its exposition with the server's own series, every
    /// sample's value cut off (what is counted varies; what is exposed may not).
    #[test]
    fn the_exposition_is_the_committed_snapshot() {
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
        let mut text = metrics.render(&store.stats());
        render_stream_bytes(&mut text, 0, 1 << 20);
        render_read_models(&mut text, &[]);
        let shape: String = text
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
        store.close().unwrap();
    }

    /// Goal: every histogram series exposes the same buckets whatever it counted, with
    /// cumulative counts. Regression: empty buckets were left out, so each series had its own
    /// growing set of `le` values. Method: one histogram with values and one without, their
    /// bucket lines compared.
    #[test]
    fn histograms_expose_fixed_buckets() {
        let filled = annals::Log2Histogram::default();
        for value in [3, 100, 5000] {
            filled.record(value);
        }
        let lines = |h: &annals::Log2Histogram| {
            let mut out = String::new();
            histogram(&mut out, "h", "", &h.snapshot(), &DURATION_BOUNDS_US, 1.0);
            out.lines()
                .filter(|l| l.starts_with("h_bucket"))
                .map(|l| l.rsplit_once(' ').unwrap())
                .map(|(series, count)| (series.to_string(), count.parse::<u64>().unwrap()))
                .collect::<Vec<_>>()
        };
        let (filled, empty) = (lines(&filled), lines(&annals::Log2Histogram::default()));
        let series = |v: &[(String, u64)]| v.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>();
        assert_eq!(series(&filled), series(&empty));
        assert_eq!(filled.len(), DURATION_BOUNDS_US.len() + 1);
        let counts: Vec<u64> = filled.iter().map(|(_, c)| *c).collect();
        assert_eq!(counts, [0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3]);
        assert!(empty.iter().all(|(_, c)| *c == 0));
    }
}
