//! `annals exchange`: the matching engine's benchmark.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use annals_exchange::scenario::{self, Scenario};
use annals_exchange::{Command, Engine, Report};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

#[derive(clap::Subcommand)]
pub enum ExchangeCommand {
    /// Runs a deterministic scenario through the matcher and prints, as its last line, one
    /// JSON object: throughput, trades, resting orders, the matcher's latency and the state hash.
    ///
    /// Example: annals exchange bench --scenario normal --messages 5000000 --durability d0
    Bench(BenchArgs),
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// seed50k or normal.
    #[arg(long, default_value = "normal")]
    scenario: String,
    /// Measured messages (after the scenario's warm-up).
    #[arg(long, default_value_t = 5_000_000)]
    messages: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// d0 (in memory, the matcher alone). The journaled modes (d3 per order, d2 with critical
    /// orders synced, d3 pipelined) come with the journal.
    #[arg(long, default_value = "d0")]
    durability: String,
    /// Where the fsync floor is measured.
    #[arg(long, default_value = "/tmp/annals-bench-exchange")]
    dir: PathBuf,
    /// Runs; throughput is the median run's.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

pub fn run(command: ExchangeCommand) -> Result<(), String> {
    match command {
        ExchangeCommand::Bench(args) => {
            let result = bench(&args)?;
            println!("{result}");
            Ok(())
        }
    }
}

/// What one pass over the messages found.
struct Pass {
    seconds: f64,
    trades: u64,
    trading_messages: u64,
    orders: u64,
    engine: Engine,
}

fn fresh(scenario: &Scenario) -> Engine {
    let mut engine = Engine::new(&scenario.symbols);
    // Room for the live orders a scenario holds; a table sized for every message would only
    // spread the live orders over more cache lines.
    engine.reserve(1 << 16);
    let mut out = Vec::new();
    for command in &scenario.warmup {
        engine.apply(0, command, &mut out);
        out.clear();
    }
    engine
}

/// Applies every message as fast as it can: throughput, without timing each message.
fn throughput(scenario: &Scenario) -> Pass {
    let mut engine = fresh(scenario);
    let mut out: Vec<Report> = Vec::with_capacity(1 << 16);
    let (mut trades, mut trading_messages, mut orders) = (0, 0, 0);
    let started = Instant::now();
    for (time, command) in scenario.messages.iter().enumerate() {
        engine.apply(time as u64, command, &mut out);
        let traded = out
            .iter()
            .filter(|r| matches!(r, Report::Trade { .. }))
            .count() as u64;
        trades += traded;
        trading_messages += u64::from(traded > 0);
        orders += u64::from(matches!(command, Command::Place(_)));
        out.clear();
    }
    Pass {
        seconds: started.elapsed().as_secs_f64(),
        trades,
        trading_messages,
        orders,
        engine,
    }
}

/// Times each message through the matcher (in nanoseconds, back to back).
fn latency(scenario: &Scenario) -> Result<Histogram<u64>, String> {
    let mut engine = fresh(scenario);
    let mut out: Vec<Report> = Vec::with_capacity(1 << 16);
    let mut histogram = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    for (time, command) in scenario.messages.iter().enumerate() {
        let started = Instant::now();
        engine.apply(time as u64, command, &mut out);
        let ns = started.elapsed().as_nanos() as u64;
        histogram.record(ns.max(1)).map_err(|e| e.to_string())?;
        out.clear();
    }
    Ok(histogram)
}

fn bench(args: &BenchArgs) -> Result<Value, String> {
    let durability = args.durability.to_ascii_lowercase();
    if durability != "d0" {
        return Err(format!(
            "--durability {durability}: only d0 (the matcher in memory) is measured so far; \
             the journaled modes come with the exchange's journal"
        ));
    }
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let floor = crate::bench::fsync_floor(&args.dir, true, Duration::from_secs(1))?;
    let scenario = scenario::generate(&args.scenario, args.messages, args.seed)?;
    let mut passes: Vec<Pass> = (0..args.runs.max(1))
        .map(|_| throughput(&scenario))
        .collect();
    let hashes: Vec<u64> = passes.iter().map(|p| p.engine.state_hash()).collect();
    if hashes.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!(
            "runs of one scenario ended in different states: {hashes:?}"
        ));
    }
    let rates: Vec<f64> = passes
        .iter()
        .map(|p| (scenario.messages.len() as f64 / p.seconds).round())
        .collect();
    passes.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let median = &passes[passes.len() / 2];
    let latency = latency(&scenario)?;
    let n = scenario.messages.len() as f64;
    Ok(json!({
        "bench": "exchange",
        "scenario": scenario.name,
        "messages": scenario.messages.len(),
        "warmup_messages": scenario.warmup.len(),
        "durability": "d0",
        "durability_class": "D0 in memory: the matcher alone, nothing journaled",
        "messages_per_sec": (n / median.seconds).round(),
        "messages_per_sec_runs": rates,
        "orders_per_sec": (median.orders as f64 / median.seconds).round(),
        "trades": median.trades,
        "trade_ratio": ((median.trading_messages as f64 / n) * 10_000.0).round() / 10_000.0,
        "resting_orders": median.engine.live_orders(),
        "latency_ns": {
            "p50": latency.value_at_quantile(0.5),
            "p90": latency.value_at_quantile(0.9),
            "p99": latency.value_at_quantile(0.99),
            "p999": latency.value_at_quantile(0.999),
            "max": latency.max(),
            "measured": "each message timed back to back (not at a fixed offered rate)",
        },
        "fsyncs": 0,
        "fsync_floor_per_sec": floor.round(),
        "state_hash": format!("{:016x}", median.engine.state_hash()),
    }))
}
