//! `annals-bench exchange`: the matching engine's benchmark, in every durability mode.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::{Options, Preallocation, Store};
use annals_exchange::scenario::{self, Scenario};
use annals_exchange::{
    recover, Command, Engine, Mode, Released, Report, Sequencer, SequencerOptions,
};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::sync::Mutex;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// seed50k, normal, flash-crash or many-symbols (default: normal; seed50k with
    /// --compare-seed).
    #[arg(long)]
    scenario: Option<String>,
    /// Measured messages (after the scenario's warm-up). Default: 5,000,000, or 20,000 for
    /// d3-per-order (which runs at the disk's fsync rate), or 50,000 with --compare-seed.
    #[arg(long)]
    messages: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// d0 (in memory, nothing journaled), d3-per-order (one fsync per command), d2-critical
    /// (acknowledged once written; trading or large commands wait for the fsync) or
    /// d3-pipelined (every acknowledgement durable; the matcher runs ahead of the journal).
    #[arg(long, default_value = "d0")]
    durability: String,
    /// The quantity from which d2-critical treats an order as critical.
    #[arg(long, default_value_t = Mode::DEFAULT_CRITICAL_QTY)]
    critical_qty: u64,
    /// Where the journal's store lives (emptied before each run) and the fsync floor is
    /// measured.
    #[arg(long, default_value = "/tmp/annals-bench-exchange")]
    dir: PathBuf,
    /// Runs; throughput is the median run's.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Events per journal append when the input never runs dry.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Offer the messages at this fixed rate (messages per second) instead of as fast as
    /// possible; latency is then measured from each message's scheduled time.
    #[arg(long)]
    rate: Option<f64>,
    /// Runs the four modes on the same scenario (seed50k unless --scenario is given) and
    /// prints them beside the published figures of the seed engine, an earlier exchange engine
    /// whose modes answer ours one for one.
    #[arg(long)]
    compare_seed: bool,
    /// How the journal's segments are preallocated: `zeros`, `fallocate` or `adaptive` (the
    /// store's default, which picks per segment from the bytes per fdatasync). Default: zeros
    /// for d3-per-order, whose small fdatasyncs stay pure data flushes in zeroed space;
    /// fallocate for the batched modes, which write hundreds of MB/s and would write as many
    /// zeros again (docs/DECISIONS.md, R3).
    #[arg(long)]
    preallocate: Option<Preallocation>,
}

/// The preallocation a mode's store uses: `--preallocate`, else by the mode (see there).
fn preallocation_for(args: &BenchArgs, mode: Mode) -> Preallocation {
    args.preallocate.unwrap_or(match mode {
        Mode::PerOrder => Preallocation::Zeros,
        _ => Preallocation::Fallocate,
    })
}

pub fn run(args: BenchArgs) -> Result<Value, String> {
    if args.compare_seed {
        compare_seed(&args)
    } else {
        bench(&args)
    }
}

fn parse_mode(args: &BenchArgs, text: &str) -> Result<Mode, String> {
    Ok(match text.parse::<Mode>()? {
        Mode::Critical { .. } => Mode::Critical {
            critical_qty: args.critical_qty,
        },
        mode => mode,
    })
}

/// What one pass over the messages found.
struct Pass {
    seconds: f64,
    messages: usize,
    places: u64,
    trades: u64,
    trading_messages: u64,
    resting: usize,
    state_hash: u64,
    matcher_ns: Histogram<u64>,
    ack_ns: Option<Histogram<u64>>,
    fsyncs: u64,
    events_journaled: u64,
    /// Bytes of records the journal wrote during the pass.
    bytes_journaled: u64,
    replay: Option<Value>,
}

/// Nanoseconds since the clock started, cheap enough to read once per message: the CPU's
/// time-stamp counter where it is invariant (x86-64), scaled by a rate measured against the
/// monotonic clock over the first 20 ms; elsewhere the monotonic clock itself.
#[derive(Clone, Copy)]
struct Clock {
    epoch: Instant,
    #[cfg(target_arch = "x86_64")]
    tsc: Option<(u64, f64)>,
}

impl Clock {
    fn start() -> Clock {
        let epoch = Instant::now();
        #[cfg(target_arch = "x86_64")]
        {
            let invariant = std::fs::read_to_string("/proc/cpuinfo")
                .map(|c| c.contains(" constant_tsc") && c.contains(" nonstop_tsc"))
                .unwrap_or(false);
            let tsc = invariant.then(|| {
                // SAFETY: rdtsc has no preconditions on x86-64.
                let t0 = unsafe { std::arch::x86_64::_rdtsc() };
                std::thread::sleep(Duration::from_millis(20));
                // SAFETY: as above.
                let t1 = unsafe { std::arch::x86_64::_rdtsc() };
                let ns = epoch.elapsed().as_nanos() as f64;
                (t0, ns / (t1 - t0).max(1) as f64)
            });
            Clock { epoch, tsc }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Clock { epoch }
    }

    #[inline]
    fn now_ns(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if let Some((t0, ns_per_tick)) = self.tsc {
            // SAFETY: rdtsc has no preconditions on x86-64.
            let t = unsafe { std::arch::x86_64::_rdtsc() };
            return (t.saturating_sub(t0) as f64 * ns_per_tick) as u64;
        }
        self.epoch.elapsed().as_nanos() as u64
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

/// Opens a fresh store for `mode` in `dir` (emptied first).
fn fresh_store(
    dir: &Path,
    mode: Mode,
    preallocation: Preallocation,
) -> Result<Option<Arc<Store>>, String> {
    let Some(durability) = mode.store_durability() else {
        return Ok(None);
    };
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("emptying {}: {e}", dir.display()))?;
    }
    let options = Options {
        durability,
        // Recovery is measured on its own below; index checkpoints during the run would only
        // compete with the matcher for the two cores.
        checkpoint_interval_events: 0,
        checkpoint_on_close: false,
        preallocation,
        ..Options::default()
    };
    let store = Store::open(dir, options).map_err(|e| e.to_string())?;
    Ok(Some(Arc::new(store)))
}

/// Runs `scenario` once through a sequencer in `mode`.
fn pass(
    scenario: &Scenario,
    mode: Mode,
    args: &BenchArgs,
    rate: Option<f64>,
    check_replay: bool,
    timed: bool,
) -> Result<Pass, String> {
    let store_dir = args.dir.join("store");
    let store = fresh_store(&store_dir, mode, preallocation_for(args, mode))?;
    let mut engine = Engine::new(&[]);
    // Room for the most orders the scenario holds at once, no more: a table sized for every
    // message would only spread the live orders over more cache lines (docs/DECISIONS.md,
    // R4).
    engine.reserve(scenario.peak_live_orders);
    let options = SequencerOptions {
        batch_events: args.batch.max(1),
        ..SequencerOptions::default()
    };
    let mut sequencer =
        Sequencer::new(engine, store.clone(), mode, options).map_err(|e| e.to_string())?;
    for &spec in &scenario.symbols {
        sequencer.add_symbol(spec).map_err(|e| e.to_string())?;
    }
    let mut out: Vec<Report> = Vec::with_capacity(1 << 16);
    for command in &scenario.warmup {
        sequencer
            .execute(0, command, &mut out)
            .map_err(|e| e.to_string())?;
        out.clear();
        if sequencer.batch_full() {
            sequencer.flush(|_| {});
        }
    }
    sequencer.sync().map_err(|e| e.to_string())?;
    let before = store.as_ref().map(|s| s.stats());

    let clock = Clock::start();
    let acks = Arc::new(Mutex::new(histogram()));
    let failures = Arc::new(AtomicU64::new(0));
    let release = |tickets: Vec<u64>| {
        let acks = acks.clone();
        let failures = failures.clone();
        move |outcome: Released| match outcome {
            Ok(_) => {
                let now = clock.now_ns();
                let mut acks = acks.lock().unwrap_or_else(|e| e.into_inner());
                for t in tickets {
                    let _ = acks.record(now.saturating_sub(t).max(1));
                }
            }
            Err(_) => {
                failures.fetch_add(tickets.len() as u64, Ordering::Relaxed);
            }
        }
    };
    let journaled = store.is_some();
    let mut tickets: Vec<u64> = Vec::with_capacity(args.batch);
    let mut matcher_ns = histogram();
    let (mut places, mut trades, mut trading_messages) = (0, 0, 0);
    let interval_ns = rate.map(|r| 1e9 / r);
    let cpu_before = crate::bench::thread_times_if_asked();
    let started = Instant::now();
    let base_ns = clock.now_ns();
    // As fast as possible, one clock read per message: a message's latency is the time from
    // its start to the next one's (its matching, journaling and any hand-over to the store).
    let mut previous: Option<u64> = None;
    for (i, command) in scenario.messages.iter().enumerate() {
        let begin = match interval_ns {
            Some(interval) => {
                let scheduled = base_ns + (i as f64 * interval) as u64;
                loop {
                    let now = clock.now_ns();
                    if now >= scheduled {
                        break;
                    }
                    if journaled && sequencer.idle_flush_due() {
                        let batch = std::mem::take(&mut tickets);
                        sequencer.flush(release(batch));
                    }
                    std::hint::spin_loop();
                }
                scheduled
            }
            None if journaled || timed => {
                let now = clock.now_ns();
                if let Some(previous) = previous.replace(now) {
                    let _ = matcher_ns.record(now.saturating_sub(previous).max(1));
                }
                now
            }
            None => 0,
        };
        sequencer
            .execute(i as u64, command, &mut out)
            .map_err(|e| e.to_string())?;
        if interval_ns.is_some() {
            let end = clock.now_ns();
            let _ = matcher_ns.record(end.saturating_sub(begin).max(1));
        }
        let traded = out
            .iter()
            .filter(|r| matches!(r, Report::Trade { .. }))
            .count() as u64;
        trades += traded;
        trading_messages += u64::from(traded > 0);
        places += u64::from(matches!(command, Command::Place(_)));
        out.clear();
        if journaled {
            tickets.push(begin);
            if sequencer.batch_full() {
                let batch = std::mem::replace(&mut tickets, Vec::with_capacity(args.batch));
                sequencer.flush(release(batch));
            }
        }
    }
    if let Some(previous) = previous {
        let now = clock.now_ns();
        let _ = matcher_ns.record(now.saturating_sub(previous).max(1));
    }
    if journaled {
        sequencer.flush(release(tickets));
    }
    sequencer.sync().map_err(|e| e.to_string())?;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(before) = &cpu_before {
        crate::bench::print_thread_times(before);
    }
    if failures.load(Ordering::Relaxed) > 0 {
        return Err("the journal failed during the run".into());
    }
    let engine_hash = sequencer.engine().state_hash();
    let resting = sequencer.engine().live_orders();
    let (fsyncs, events_journaled, bytes_journaled) = match (&store, &before) {
        (Some(store), Some(before)) => {
            let after = store.stats();
            (
                after.fsyncs - before.fsyncs,
                after.events_appended - before.events_appended,
                after.bytes_written - before.bytes_written,
            )
        }
        _ => (0, 0, 0),
    };
    drop(sequencer);
    let replay = match store {
        Some(store) if check_replay => Some(replay(store, &store_dir, engine_hash)?),
        _ => None,
    };
    let ack_ns = journaled.then(|| acks.lock().unwrap_or_else(|e| e.into_inner()).clone());
    Ok(Pass {
        seconds,
        messages: scenario.messages.len(),
        places,
        trades,
        trading_messages,
        resting,
        state_hash: engine_hash,
        matcher_ns,
        ack_ns,
        fsyncs,
        events_journaled,
        bytes_journaled,
        replay,
    })
}

/// Closes the journal, reopens it and rebuilds the books from it: the hash must be the live
/// engine's.
fn replay(store: Arc<Store>, dir: &Path, live_hash: u64) -> Result<Value, String> {
    let store = Arc::try_unwrap(store).map_err(|_| "the store is still shared".to_string())?;
    store.close().map_err(|e| e.to_string())?;
    let opened = Instant::now();
    let store = Store::open(dir, Options::default()).map_err(|e| e.to_string())?;
    let open_seconds = opened.elapsed().as_secs_f64();
    let started = Instant::now();
    let recovered = recover(&store, None).map_err(|e| e.to_string())?;
    let seconds = started.elapsed().as_secs_f64();
    let hash = recovered.engine.state_hash();
    if hash != live_hash {
        return Err(format!(
            "replaying the journal gave state hash {hash:016x}, the live engine {live_hash:016x}"
        ));
    }
    Ok(json!({
        "commands": recovered.replayed,
        "open_seconds": round3(open_seconds),
        "replay_seconds": round3(seconds),
        "commands_per_sec": (recovered.replayed as f64 / seconds).round(),
        "state_hash_matches": true,
    }))
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn percentiles_ns(h: &Histogram<u64>) -> Value {
    json!({
        "p50": h.value_at_quantile(0.5),
        "p90": h.value_at_quantile(0.9),
        "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999),
        "max": h.max(),
    })
}

fn percentiles_us(h: &Histogram<u64>) -> Value {
    let us = |ns: u64| (ns as f64 / 100.0).round() / 10.0;
    json!({
        "p50": us(h.value_at_quantile(0.5)),
        "p90": us(h.value_at_quantile(0.9)),
        "p99": us(h.value_at_quantile(0.99)),
        "p999": us(h.value_at_quantile(0.999)),
        "max": us(h.max()),
    })
}

fn default_messages(args: &BenchArgs, mode: Mode) -> usize {
    args.messages.unwrap_or(match mode {
        Mode::PerOrder => 20_000,
        _ => 5_000_000,
    })
}

/// Runs `mode` `runs` times; returns the median run (by throughput) and every run's rate.
fn measure(
    scenario: &Scenario,
    mode: Mode,
    args: &BenchArgs,
    runs: usize,
) -> Result<(Pass, Vec<f64>), String> {
    let mut passes = Vec::new();
    // In memory there are no acknowledgements to time: the throughput runs read no clock, and
    // one more run times each message for the latency.
    let untimed = mode == Mode::Memory && args.rate.is_none();
    for run in 0..runs.max(1) {
        // The journal is replayed (and checked against the live books) after the last run.
        let last = run + 1 == runs.max(1);
        passes.push(pass(scenario, mode, args, args.rate, last, !untimed)?);
    }
    let timing = if untimed {
        Some(pass(scenario, mode, args, None, false, true)?.matcher_ns)
    } else {
        None
    };
    let hashes: Vec<u64> = passes.iter().map(|p| p.state_hash).collect();
    if hashes.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!(
            "runs of one scenario ended in different states: {hashes:?}"
        ));
    }
    let replay = passes.iter_mut().find_map(|p| p.replay.take());
    let rates: Vec<f64> = passes
        .iter()
        .map(|p| (p.messages as f64 / p.seconds).round())
        .collect();
    passes.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let mut median = passes.swap_remove(passes.len() / 2);
    median.replay = replay;
    if let Some(timing) = timing {
        median.matcher_ns = timing;
    }
    Ok((median, rates))
}

fn report(
    scenario: &Scenario,
    mode: Mode,
    args: &BenchArgs,
    median: &Pass,
    rates: &[f64],
    floor: f64,
) -> Value {
    let n = median.messages as f64;
    let rate = n / median.seconds;
    let measured = match args.rate {
        Some(r) => {
            format!("from each message's scheduled time at a fixed offered rate of {r} messages/s")
        }
        None => "each message timed back to back (not at a fixed offered rate)".into(),
    };
    let mut value = json!({
        "bench": "exchange",
        "scenario": scenario.name,
        "messages": median.messages,
        "warmup_messages": scenario.warmup.len(),
        "durability": mode.label(),
        "durability_class": mode.class(),
        "messages_per_sec": rate.round(),
        "messages_per_sec_runs": rates,
        // Every message is an order command (place, cancel, amend, cancel-all).
        "orders_per_sec": rate.round(),
        "places_per_sec": (median.places as f64 / median.seconds).round(),
        "trades": median.trades,
        "trade_ratio": ((median.trading_messages as f64 / n) * 10_000.0).round() / 10_000.0,
        "resting_orders": median.resting,
        "latency_ns": percentiles_ns(&median.matcher_ns),
        "latency_measured": measured,
        "ack_latency_us": median.ack_ns.as_ref().map(percentiles_us),
        "fsyncs": median.fsyncs,
        "events_journaled": median.events_journaled,
        // How hard the journal pressed on the disk: bytes per event and MB/s of records.
        "journal_bytes_per_event": if median.events_journaled > 0 {
            ((median.bytes_journaled as f64 / median.events_journaled as f64) * 10.0).round() / 10.0
        } else {
            0.0
        },
        "journal_mb_per_sec": ((median.bytes_journaled as f64 / 1e6 / median.seconds) * 10.0)
            .round()
            / 10.0,
        "commands_per_fsync": if median.fsyncs > 0 {
            ((n / median.fsyncs as f64) * 10.0).round() / 10.0
        } else {
            0.0
        },
        "fsync_floor_per_sec": floor.round(),
        "ratio_to_fsync_floor": ((rate / floor) * 100.0).round() / 100.0,
        "state_hash": format!("{:016x}", median.state_hash),
        "replay": median.replay,
        "batch_events": args.batch,
        "preallocate": preallocation_for(args, mode).label(),
        "runs": rates.len(),
    });
    if let Some(r) = args.rate {
        value["offered_rate"] = json!(r);
    }
    value
}

fn bench(args: &BenchArgs) -> Result<Value, String> {
    let mode = parse_mode(args, &args.durability)?;
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let floor = crate::bench::fsync_floor(&args.dir, true, Duration::from_secs(1))?;
    let name = args.scenario.as_deref().unwrap_or("normal");
    let scenario = scenario::generate(name, default_messages(args, mode), args.seed)
        .map_err(|e| e.to_string())?;
    let (median, rates) = measure(&scenario, mode, args, args.runs)?;
    Ok(report(&scenario, mode, args, &median, &rates, floor))
}

/// The seed engine's published figures for the mode each of ours answers, with what each was
/// measured on.
fn seed_figure(mode: Mode) -> Value {
    match mode {
        Mode::Memory => json!({
            "seed_mode": "event_sourcing", "orders_per_sec": 418_800, "p99_us": 3.08,
            "source": "50,000 orders, in-memory event log",
        }),
        Mode::PerOrder => json!({
            "seed_mode": "production_safe", "orders_per_sec": 9_780, "p99_us": 397.0,
            "source": "50,000 orders, WAL fsync on the order path",
        }),
        Mode::Critical { .. } => json!({
            "seed_mode": "production_safe_optimized", "orders_per_sec": 1_113_640, "p99_us": 3.04,
            "source": "macOS, async WAL (10 ms / 1,000-entry groups), acknowledged before durable",
        }),
        Mode::Pipelined => json!({
            "seed_mode": "zero-loss mode (no figure published)", "orders_per_sec": null,
            "p99_us": null, "source": "described without a measurement",
        }),
    }
}

fn compare_seed(args: &BenchArgs) -> Result<Value, String> {
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let floor = crate::bench::fsync_floor(&args.dir, true, Duration::from_secs(1))?;
    let name = args.scenario.as_deref().unwrap_or("seed50k");
    let scenario = scenario::generate(name, args.messages.unwrap_or(50_000), args.seed)
        .map_err(|e| e.to_string())?;
    let modes = [
        Mode::Memory,
        Mode::PerOrder,
        Mode::Critical {
            critical_qty: args.critical_qty,
        },
        Mode::Pipelined,
    ];
    let mut rows = Vec::new();
    let mut hash = None;
    println!(
        "{:<14} {:>14} {:>12} {:>12}   {:<26} {:>14} {:>10}   class",
        "mode", "orders/s", "p99 us", "ack p99 us", "seed mode", "seed orders/s", "seed p99"
    );
    for mode in modes {
        let (median, rates) = measure(&scenario, mode, args, args.runs)?;
        if *hash.get_or_insert(median.state_hash) != median.state_hash {
            return Err(format!("mode {mode} ended in another state than d0"));
        }
        let row = report(&scenario, mode, args, &median, &rates, floor);
        let seed = seed_figure(mode);
        let ack_p99 = row["ack_latency_us"]["p99"].as_f64();
        println!(
            "{:<14} {:>14} {:>12.2} {:>12}   {:<26} {:>14} {:>10}   {}",
            mode.label(),
            row["orders_per_sec"],
            row["latency_ns"]["p99"].as_f64().unwrap_or(0.0) / 1000.0,
            ack_p99.map_or("-".into(), |v| format!("{v:.1}")),
            seed["seed_mode"].as_str().unwrap_or(""),
            seed["orders_per_sec"],
            seed["p99_us"],
            mode.class(),
        );
        rows.push(json!({ "ours": row, "seed": seed }));
    }
    Ok(json!({
        "bench": "exchange-compare-seed",
        "scenario": scenario.name,
        "messages": scenario.messages.len(),
        "fsync_floor_per_sec": floor.round(),
        "note": "p99 us is the matcher's (journal encoding included); ack p99 is from a \
                 command's start to its release (durable in D3); the seed engine's p99 is its \
                 per-order latency",
        "rows": rows,
    }))
}
