//! `annals-bench snapshot`: decisions' snapshots.
//!
//! - `--workload decide`: a decision over a query matching `--events` events (a million by
//!   default), with a snapshot at most `--every` events old, in the library (`Snapshotted`) and
//!   over HTTP (a read with a snapshot, the fold in the client, a save every `--every` events),
//!   beside the same decision without a snapshot (a full read), in one run. Between two
//!   decisions one event is appended (not timed), so each decision folds the events since the
//!   snapshot and the snapshot is saved again as the policy says.
//! - `--workload keys`: `--keys` snapshots under as many keys: the time to save them, the bytes
//!   they take on disk and in memory, and the time to load one (the first load after an open
//!   reads the shelf through; then single loads).
//!
//! The rate of 64 deciding clients saving snapshots is `annals-bench decide --snapshot-every`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use annals::decide::{Project, Projection};
use annals::snapshot::{Lookup, SnapshotPolicy, Snapshotted};
use annals::state::StateId;
use annals::{NewEvent, Options, Query, QueryItem, Store};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::http1::Http1;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    Decide,
    Keys,
}

#[derive(clap::Args)]
pub struct SnapshotArgs {
    /// Where the store lives (emptied first).
    #[arg(long, default_value = "/tmp/annals-bench-snapshot")]
    dir: PathBuf,
    #[arg(long, value_enum, default_value = "decide")]
    workload: Workload,
    /// Events the decision's query matches (decide).
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// A snapshot is saved after this many events folded since the last (decide).
    #[arg(long, default_value_t = 1_000)]
    every: u64,
    /// Timed decisions with a snapshot, in the library and over HTTP each (decide).
    #[arg(long, default_value_t = 3_000)]
    decisions: u64,
    /// Timed decisions without a snapshot (each reads every event), in each place (decide).
    #[arg(long, default_value_t = 5)]
    full_decisions: u64,
    /// Snapshot keys (keys).
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
}

pub fn run(args: SnapshotArgs) -> Result<Value, String> {
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir).map_err(|e| e.to_string())?;
    }
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    match args.workload {
        Workload::Decide => decide(&args),
        Workload::Keys => keys(&args),
    }
}

fn query() -> Query {
    Query::item(QueryItem::types(["Enrolled"]).and_tags(["course:big"]))
}

fn enrolled(i: u64) -> NewEvent {
    NewEvent::new("Enrolled", "")
        .tag("course:big")
        .tag(format!("student:{i}"))
}

/// The decision's state: how many are enrolled.
fn seats() -> impl Project<State = u64> {
    Projection::new(query(), 0u64, |n: &mut u64, _event| *n += 1)
}

fn percentiles(h: &Histogram<u64>) -> Value {
    json!({
        "count": h.len(),
        "p50": h.value_at_quantile(0.5),
        "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999),
        "max": h.max(),
    })
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("a histogram")
}

fn elapsed_us(started: Instant) -> u64 {
    started.elapsed().as_micros().max(1) as u64
}

fn decide(args: &SnapshotArgs) -> Result<Value, String> {
    let dir = args.dir.join("store");
    let store = Store::open(&dir, Options::default()).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut next = 0;
    while next < args.events {
        let n = 1000.min(args.events - next);
        let batch: Vec<NewEvent> = (next..next + n).map(enrolled).collect();
        store.append(&batch, None).map_err(|e| e.to_string())?;
        next += n;
    }
    let filled_s = started.elapsed().as_secs_f64();
    let policy = SnapshotPolicy {
        every: args.every,
        slower_than: None,
    };
    let model = Snapshotted::new("seats", 1, seats()).policy(policy);
    // The first decision reads everything and saves the first snapshot.
    store.decide(&model).map_err(|e| e.to_string())?;
    let mut with = histogram();
    for _ in 0..args.decisions {
        store
            .append(&[enrolled(next)], None)
            .map_err(|e| e.to_string())?;
        next += 1;
        let started = Instant::now();
        let decision = store.decide(&model).map_err(|e| e.to_string())?;
        with.record(elapsed_us(started)).ok();
        debug_assert_eq!(decision.state, next);
    }
    let mut without = histogram();
    let plain = seats();
    for _ in 0..args.full_decisions {
        let started = Instant::now();
        let decision = store.decide(&plain).map_err(|e| e.to_string())?;
        without.record(elapsed_us(started)).ok();
        if decision.state != next {
            return Err(format!("a full read folded {} of {next}", decision.state));
        }
    }
    let counts = store.snapshots().counts();
    store.close().map_err(|e| e.to_string())?;

    let server = crate::bench_http::start_server(&dir, "d3", &[])?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let http = runtime.block_on(over_http(server.http, args, next))?;
    drop(server);
    Ok(json!({
        "bench": "snapshot",
        "workload": "decide",
        "durability": "d3",
        "events": args.events,
        "every": args.every,
        "fill_seconds": (filled_s * 10.0).round() / 10.0,
        "library_us": {
            "with_snapshot": percentiles(&with),
            "without_snapshot": percentiles(&without),
            "p99_ratio": ratio(without.value_at_quantile(0.99), with.value_at_quantile(0.99)),
            "snapshots_saved": counts.saved,
            "snapshot_hits": counts.hits,
        },
        "http_us": http,
    }))
}

fn ratio(a: u64, b: u64) -> f64 {
    ((a as f64 / b.max(1) as f64) * 10.0).round() / 10.0
}

/// The same decisions as a client in another language makes them: a read with a snapshot,
/// the events folded in the client, a save every `--every` events (timed with the decision
/// that makes it); the appends between them are not timed.
async fn over_http(
    addr: SocketAddr,
    args: &SnapshotArgs,
    mut expected: u64,
) -> Result<Value, String> {
    let mut client = Http1::connect(addr).await?;
    let query_text = serde_json::to_string(&query()).map_err(|e| e.to_string())?;
    let encoded = encode(&query_text);
    let read_path = format!("/v1/snapshots/read?model=seats-http&version=1&query={encoded}");
    let mut with = histogram();
    let mut saves = 0;
    let mut hits = 0;
    for i in 0..=args.decisions {
        if i > 0 {
            let body = json!({"events": [{"type": "Enrolled", "data": "",
                "tags": ["course:big", format!("student:{expected}")]}]});
            let (status, _) = client
                .round_trip("POST", "/v1/append", None, body.to_string().as_bytes())
                .await?;
            if status != 200 {
                return Err(format!("append answered {status}"));
            }
            expected += 1;
        }
        let started = Instant::now();
        let (status, answer) = client.round_trip("GET", &read_path, None, b"").await?;
        if status != 200 {
            return Err(format!("a read with a snapshot answered {status}"));
        }
        let answer: Value = serde_json::from_slice(answer).map_err(|e| e.to_string())?;
        let snapshot = &answer["snapshot"];
        let mut state = match snapshot["outcome"].as_str() {
            Some("hit") => {
                hits += 1;
                snapshot["state"]["taken"].as_u64().unwrap_or(0)
            }
            _ => 0,
        };
        let events = answer["events"].as_array().map_or(0, Vec::len) as u64;
        state += events;
        let head = answer["head"].as_u64().unwrap_or(0);
        if events >= args.every {
            let body = json!({"model": "seats-http", "version": 1, "query": query(),
                "position": head, "state": {"taken": state}});
            let (status, _) = client
                .round_trip("POST", "/v1/snapshots", None, body.to_string().as_bytes())
                .await?;
            if status != 200 {
                return Err(format!("a save answered {status}"));
            }
            saves += 1;
        }
        if i > 0 {
            with.record(elapsed_us(started)).ok();
        }
        if state != expected {
            return Err(format!("the client folded {state} of {expected}"));
        }
    }
    let mut without = histogram();
    let full_path = format!("/v1/read?query={encoded}");
    for _ in 0..args.full_decisions {
        let started = Instant::now();
        let (status, answer) = client.round_trip("GET", &full_path, None, b"").await?;
        if status != 200 {
            return Err(format!("a read answered {status}"));
        }
        let events: Vec<&serde_json::value::RawValue> =
            serde_json::from_slice(answer).map_err(|e| e.to_string())?;
        without.record(elapsed_us(started)).ok();
        if events.len() as u64 != expected {
            return Err(format!("a full read gave {} of {expected}", events.len()));
        }
    }
    Ok(json!({
        "with_snapshot": percentiles(&with),
        "without_snapshot": percentiles(&without),
        "p99_ratio": ratio(without.value_at_quantile(0.99), with.value_at_quantile(0.99)),
        "snapshots_saved": saves,
        "snapshot_hits": hits,
    }))
}

fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The process's resident memory, in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .map(|e| e.metadata().map_or(0, |m| m.len()))
            .sum()
    })
}

fn key_id(i: u64) -> StateId {
    StateId::new(
        "account",
        1,
        Query::item(QueryItem::tags([format!("account:{i}")])),
    )
}

fn keys(args: &SnapshotArgs) -> Result<Value, String> {
    let dir = args.dir.join("store");
    let store = Store::open(&dir, Options::default()).map_err(|e| e.to_string())?;
    store
        .append(&[NewEvent::new("Opened", "").tag("account:0")], None)
        .map_err(|e| e.to_string())?;
    // The shelf is opened by its first use, before the memory is measured.
    store.snapshots().stats().map_err(|e| e.to_string())?;
    let rss_before = rss_bytes();
    let started = Instant::now();
    for i in 0..args.keys {
        let state = format!("{{\"balance\":{i},\"opened\":true}}").into_bytes();
        store
            .snapshots()
            .save_with_subjects(&key_id(i), 1, Vec::new(), state)
            .map_err(|e| e.to_string())?;
    }
    let save_s = started.elapsed().as_secs_f64();
    let rss_after = rss_bytes();
    let stats = store.snapshots().stats().map_err(|e| e.to_string())?;
    store.close().map_err(|e| e.to_string())?;
    let disk = dir_bytes(&dir.join("snapshots"));

    let store = Store::open(&dir, Options::default()).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let first = store
        .snapshots()
        .load(&key_id(args.keys / 2))
        .map_err(|e| e.to_string())?;
    let first_us = elapsed_us(started);
    if !matches!(first, Lookup::Hit(_)) {
        return Err(format!("the first load found {}", first.outcome()));
    }
    let mut loads = histogram();
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    for _ in 0..10_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let started = Instant::now();
        let found = store
            .snapshots()
            .load(&key_id(x % args.keys))
            .map_err(|e| e.to_string())?;
        loads.record(elapsed_us(started)).ok();
        if !matches!(found, Lookup::Hit(_)) {
            return Err(format!("a load found {}", found.outcome()));
        }
    }
    store.close().map_err(|e| e.to_string())?;
    Ok(json!({
        "bench": "snapshot",
        "workload": "keys",
        "keys": args.keys,
        "saves_per_sec": (args.keys as f64 / save_s).round(),
        "state_bytes_each": format!("{{\"balance\":{},\"opened\":true}}", args.keys / 2).len(),
        "kept_bytes": stats.bytes,
        "disk_bytes": disk,
        "disk_bytes_per_key": (disk as f64 / args.keys as f64).round(),
        "memory_bytes": rss_after.saturating_sub(rss_before),
        "memory_bytes_per_key": (rss_after.saturating_sub(rss_before) as f64 / args.keys as f64).round(),
        "first_load_after_open_us": first_us,
        "load_us": percentiles(&loads),
    }))
}
