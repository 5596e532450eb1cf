//! `annals-bench schema`: event schemas. In one run:
//! - appends: 64 HTTP connections of conditional appends of a 1 KiB event of ten fields whose
//!   type has a ten-property schema (or the one `--schema` gives), enforcement `reject` alternated with `off` (the same load
//!   with the schema not applied) on one server; and 64 writers through the library, a store
//!   with the registry and the schema alternated with one without a registry, beside the
//!   fdatasync floor;
//! - history: the check of a new version against a million stored events of its type (events
//!   validated per second), beside a full read of them parsing each event's data as JSON.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::registry::{Registration, Registry};
use annals::{Durability, NewEvent, Options, Query, QueryItem, ReadOptions, Store};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};

use crate::bench::{
    append_run, bench_options, conditional_writers, fsync_floor, median, record_data, schema, Data,
};

#[derive(clap::Args)]
pub struct SchemaArgs {
    /// Directory for the stores (emptied first) and the fsync floor file.
    #[arg(long, default_value = "/tmp/annals-bench-schema")]
    dir: PathBuf,
    /// Alternated runs of each mode.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Measured seconds of each HTTP run.
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    /// Events of each library run.
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// Stored events the history check reads.
    #[arg(long, default_value_t = 1_000_000)]
    history_events: u64,
    /// A JSON Schema file for the events' type instead of the ten-property one (the events
    /// are the same: ten fields, the note filling the kilobyte); what a schema costs is then
    /// measured for that schema.
    #[arg(long)]
    schema: Option<PathBuf>,
    /// The parts to run: http, library, history (comma-separated; all by default).
    #[arg(long, value_delimiter = ',', default_value = "http,library,history")]
    parts: Vec<String>,
}

/// The bytes of each event's data.
const EVENT_BYTES: usize = 1024;

/// The schema measured, as the results name it.
fn described(args: &SchemaArgs) -> &'static str {
    match args.schema {
        None => "a 10-property schema (draft 2020-12)",
        Some(_) => "the schema given (--schema)",
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    (a / b * 1000.0).round() / 1000.0
}

/// The HTTP part: one server, the schema registered, enforcement alternated.
fn http_part(args: &SchemaArgs, schema: &Value) -> Result<Value, String> {
    let server = crate::bench_http::start_server(&args.dir.join("http"), "d3", &[])?;
    let call = |method: &str, path: &str, body: Value| -> Result<String, String> {
        let headers = [("content-type", "application/json")];
        let body = body.to_string();
        let r = annals_testkit::http::request(server.http, method, path, &headers, body.as_bytes());
        match r.status {
            200..=299 => Ok(r.text()),
            status => Err(format!("{method} {path}: {status} {}", r.text())),
        }
    };
    let post = |path: &str, body: Value| call("POST", path, body).map(|_| ());
    let put = |path: &str, body: Value| call("PUT", path, body).map(|_| ());
    post("/v1/admin/schemas/BenchEvent", json!({ "schema": schema }))?;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    let mut results = Vec::new();
    for run in 0..args.runs {
        // ABBA: each mode goes first in every other pair, so that what a run leaves behind
        // (the previous store's writeback, its deletion) weighs on both alike.
        let mut pair = [("reject", &mut on), ("off", &mut off)];
        if run % 2 == 1 {
            pair.reverse();
        }
        for (enforcement, rates) in pair {
            put(
                "/v1/admin/schemas/BenchEvent/enforcement",
                json!({ "enforcement": enforcement }),
            )?;
            let result = crate::bench_http::run_conditional_load(server.http, args.seconds)?;
            let rate = result["requests_per_sec"].as_f64().unwrap_or(0.0);
            eprintln!(
                "HTTP run {}: {rate:.0} appends/s with enforcement {enforcement}",
                run + 1
            );
            rates.push(rate);
            results.push(json!({ "enforcement": enforcement, "result": result }));
        }
    }
    let metrics = annals_testkit::http::request(server.http, "GET", "/metrics", &[], b"").text();
    let refused = annals_testkit::server::sample(
        &metrics,
        r#"annals_schema_checks_total{outcome="refused"}"#,
    );
    if let Some(refused) = refused.filter(|n| *n > 0.0) {
        return Err(format!(
            "the schema refused {refused} of the benchmark's events: the figures would be \
             of refusals"
        ));
    }
    Ok(json!({
        "workload": format!("conditional_append over HTTP, 64 connections, 1 event of 1 KiB JSON (10 fields), its type with {}, D3", described(args)),
        "runs_reject": on, "runs_off": off,
        "reject_appends_per_sec": median(on.clone()),
        "off_appends_per_sec": median(off.clone()),
        "ratio_reject_to_off": ratio(median(on), median(off)),
        "events_refused": refused,
        "runs": results,
    }))
}

/// The library part: 64 async writers; a store with the registry and the schema against one
/// without a registry.
fn library_part(args: &SchemaArgs, schema: &Value) -> Result<Value, String> {
    let store_dir = args.dir.join("library");
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        // ABBA, as in the HTTP part.
        let pair = if run % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for checked in pair {
            let mut load = conditional_writers(&args.dir, 64, args.events);
            load.event_bytes = EVENT_BYTES;
            load.data = Data::Record;
            load.schema = checked.then(|| schema.clone());
            let r = append_run(&load, Durability::Synced, &store_dir)?;
            eprintln!(
                "library run {}: {:.0} appends/s {}",
                run + 1,
                r.appends_per_sec,
                if checked {
                    "with the schema"
                } else {
                    "without a registry"
                }
            );
            match checked {
                true => with.push(r.appends_per_sec),
                false => without.push(r.appends_per_sec),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&store_dir);
    Ok(json!({
        "workload": format!("conditional_append, 1 event of 1 KiB JSON (10 fields), tags stream:<writer> and entity:<one of 100,000>, its type with {}, 64 async writers, embedded, D3", described(args)),
        "runs_schema": with, "runs_no_registry": without,
        "schema_appends_per_sec": median(with.clone()),
        "no_registry_appends_per_sec": median(without.clone()),
        "ratio_schema_to_no_registry": ratio(median(with), median(without)),
    }))
}

/// The history part: a million stored events of one type, then a version checked against
/// them (median of three), beside a read of them that parses each event's data.
fn history_part(args: &SchemaArgs, schema: &Value) -> Result<Value, String> {
    let dir = args.dir.join("history");
    let _ = std::fs::remove_dir_all(&dir);
    let registry = Arc::new(Registry::new());
    let options = Options {
        admission: Some(registry.clone()),
        ..bench_options(Durability::Synced)
    };
    let store = Store::open(&dir, options).map_err(|e| e.to_string())?;
    let mut rng = StdRng::seed_from_u64(7);
    let mut written = 0;
    while written < args.history_events {
        let n = (args.history_events - written).min(2048);
        let batch: Vec<NewEvent> = (0..n)
            .map(|_| NewEvent::new("Deposited", record_data(&mut rng, EVENT_BYTES)))
            .collect();
        store.append(&batch, None).map_err(|e| e.to_string())?;
        written += n;
    }
    let query = Query::item(QueryItem::types(["Deposited"]));
    let (mut checks, mut scans) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let started = Instant::now();
        let mut parsed = 0u64;
        for event in store
            .read(&query, ReadOptions::forwards())
            .map_err(|e| e.to_string())?
        {
            let event = event.map_err(|e| e.to_string())?;
            let value: Value = serde_json::from_slice(event.data()).map_err(|e| e.to_string())?;
            parsed += u64::from(value.is_object());
        }
        scans.push(parsed as f64 / started.elapsed().as_secs_f64());
        let mut dry = Registration::new("Deposited", schema.clone());
        dry.dry_run = true;
        let started = Instant::now();
        let done = registry
            .register(&store, dry, &mut |_| {})
            .map_err(|e| e.to_string())?;
        let seconds = started.elapsed().as_secs_f64();
        checks.push(done.checked_events as f64 / seconds);
        eprintln!(
            "history: {} events checked in {seconds:.2} s; read and parsed at {:.0}/s",
            done.checked_events,
            scans.last().unwrap_or(&0.0)
        );
    }
    store.close().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({
        "events": args.history_events,
        "event_bytes": EVENT_BYTES,
        "check_events_per_sec": median(checks.clone()),
        "read_and_parse_events_per_sec": median(scans.clone()),
        "ratio_check_to_read_and_parse": ratio(median(checks.clone()), median(scans.clone())),
        "runs_check": checks, "runs_read_and_parse": scans,
        "threads": 1,
    }))
}

pub fn run(args: SchemaArgs) -> Result<Value, String> {
    let part = |name: &str| args.parts.iter().any(|p| p == name);
    let _ = std::fs::remove_dir_all(&args.dir);
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let schema = match &args.schema {
        None => schema(),
        Some(file) => std::fs::read(file)
            .map_err(|e| format!("{}: {e}", file.display()))
            .and_then(|bytes| {
                serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", file.display()))
            })?,
    };
    let mut out = json!({"bench": "schema", "parts": args.parts, "durability": "d3"});
    if let Some(file) = &args.schema {
        out["schema"] = json!({ "file": file, "schema": schema });
    }
    let floor = fsync_floor(&args.dir, true, Duration::from_secs(1))?;
    out["fsync_floor_per_sec"] = json!(floor);
    if part("http") {
        out["http_64"] = http_part(&args, &schema)?;
    }
    if part("library") {
        out["library_64"] = library_part(&args, &schema)?;
    }
    if part("history") {
        out["history"] = history_part(&args, &schema)?;
    }
    out["fsync_floor_after_per_sec"] = json!(fsync_floor(&args.dir, true, Duration::from_secs(1))?);
    Ok(out)
}
