//! `annals-bench traces`: what exporting traces costs. 64 HTTP connections of conditional
//! appends (one 1 KiB event each) against a server exporting every request's spans over OTLP
//! to a local Jaeger (its all-in-one program, as the tests run it), alternated (ABBA) with the
//! same build exporting nothing; and a server sampling 1% of new traces, alternated likewise.
//! Each mode is a server of its own on a store of its own, started once; beside the fdatasync
//! floor before and after. The traced server's span counts (exported, dropped, failed) say
//! whether every span reached the collector.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::bench::{fsync_floor, median};

#[derive(clap::Args)]
pub struct TracesArgs {
    /// Directory for the stores (emptied first) and the fsync floor file.
    #[arg(long, default_value = "/tmp/annals-bench-traces")]
    dir: PathBuf,
    /// Alternated runs of each mode.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Measured seconds of each run.
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
}

fn ratio(a: f64, b: f64) -> f64 {
    (a / b * 1000.0).round() / 1000.0
}

/// The spans a server counted, from its /metrics.
fn span_counts(server: &crate::bench_http::OwnServer) -> Value {
    let text = annals_testkit::http::request(server.http, "GET", "/metrics", &[], b"").text();
    let count = |name: &str| annals_testkit::server::sample(&text, name);
    json!({
        "exported": count("annals_trace_spans_exported_total"),
        "dropped": count("annals_trace_spans_dropped_total"),
        "failed": count("annals_trace_spans_failed_total"),
    })
}

/// One mode's runs beside the runs with nothing exported: medians, their ratio, and the
/// traced server's span counts.
fn comparison(traced: Vec<f64>, off: Vec<f64>, server: &crate::bench_http::OwnServer) -> Value {
    json!({
        "runs_traced": traced, "runs_off": off,
        "traced_appends_per_sec": median(traced.clone()),
        "off_appends_per_sec": median(off.clone()),
        "ratio_traced_to_off": ratio(median(traced), median(off)),
        "spans": span_counts(server),
    })
}

pub fn run(args: TracesArgs) -> Result<Value, String> {
    let _ = std::fs::remove_dir_all(&args.dir);
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let jaeger = annals_testkit::jaeger::Jaeger::start()
        .ok_or("Jaeger is not installed: scripts/setup builds it")?;
    let floor = fsync_floor(&args.dir, true, Duration::from_secs(1))?;
    let endpoint = jaeger.otlp_grpc();
    let start = |name: &str, env: &[(&str, &str)]| {
        crate::bench_http::start_server_with(args.dir.join(name).as_os_str(), "d3", &[], env)
    };
    let off = start("off", &[])?;
    let all = start("all", &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)])?;
    let sampled = start(
        "sampled",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
        ],
    )?;
    let mut rates: [(&str, &crate::bench_http::OwnServer, Vec<f64>); 4] = [
        ("all", &all, Vec::new()),
        ("off, beside all", &off, Vec::new()),
        ("sampled", &sampled, Vec::new()),
        ("off, beside sampled", &off, Vec::new()),
    ];
    // The sampled comparison first: Jaeger takes every span of the traced runs for a while
    // after each, which would weigh on whatever ran next. ABBA within each comparison: each
    // mode goes first in every other pair.
    for pair in [[2, 3], [0, 1]] {
        for run in 0..args.runs {
            let order = match run % 2 {
                0 => pair,
                _ => [pair[1], pair[0]],
            };
            for i in order {
                let (name, server, runs) = &mut rates[i];
                let result = crate::bench_http::run_conditional_load(server.http, args.seconds)?;
                let rate = result["requests_per_sec"].as_f64().unwrap_or(0.0);
                eprintln!("run {}: {rate:.0} appends/s, tracing {name}", run + 1);
                runs.push(rate);
            }
        }
    }
    let [all_runs, off_all, sampled_runs, off_sampled] = rates.map(|(_, _, runs)| runs);
    let out = json!({
        "bench": "traces",
        "durability": "d3",
        "workload": "conditional_append over HTTP, 64 connections, 1 event of 1 KiB JSON, D3; OTLP/gRPC to a local Jaeger 1.76.0 (all-in-one, traces in memory)",
        "fsync_floor_per_sec": floor,
        "all": comparison(all_runs, off_all, &all),
        "sampled_1pct": comparison(sampled_runs, off_sampled, &sampled),
        "fsync_floor_after_per_sec": fsync_floor(&args.dir, true, Duration::from_secs(1))?,
    });
    drop((off, all, sampled, jaeger));
    Ok(out)
}
