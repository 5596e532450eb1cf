//! `annals bench decide`: the course-subscription decision (read two projections in one read,
//! append one event under the condition that protects them) from N client threads, embedded,
//! in D3 unless told otherwise.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use annals::decide::{DecideError, Retry};
use annals::{Durability, Store};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct DecideArgs {
    /// Where the store lives (emptied first).
    #[arg(long, default_value = "/tmp/annals-bench-decide")]
    dir: PathBuf,
    /// Concurrent clients (threads), each deciding one command at a time.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Courses, each with room for --capacity students.
    #[arg(long, default_value_t = 1000)]
    courses: u32,
    #[arg(long, default_value_t = 1000)]
    capacity: u32,
    /// Students; each may join at most 3 courses.
    #[arg(long, default_value_t = 100_000)]
    students: u32,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Runs; the figures are the median run's.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    #[arg(long, default_value = "d3")]
    durability: String,
}

/// The course-subscription decision, exactly as the example and its tests have it.
#[path = "../../annals/examples/course_subscriptions/main.rs"]
#[allow(dead_code)]
mod course_subscriptions;

struct RunOutcome {
    decisions_per_sec: f64,
    accepted: u64,
    rejected: u64,
    retries: u64,
    latency_us: Histogram<u64>,
    fsyncs: u64,
}

fn one_run(args: &DecideArgs, durability: Durability) -> Result<RunOutcome, String> {
    let dir = args.dir.join("store");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| e.to_string())?;
    }
    let options = annals::Options {
        durability,
        ..annals::Options::default()
    };
    let store = Arc::new(Store::open(&dir, options).map_err(|e| e.to_string())?);
    let course_ids: Arc<Vec<String>> = Arc::new((0..args.courses).map(|c| c.to_string()).collect());
    for id in course_ids.iter() {
        course_subscriptions::define_course(&store, id, args.capacity)
            .map_err(|e| e.to_string())?;
    }
    let fsyncs_before = store.stats().fsyncs;
    let accepted = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let histogram = Arc::new(Mutex::new(
        Histogram::<u64>::new(3).map_err(|e| e.to_string())?,
    ));
    let barrier = Arc::new(std::sync::Barrier::new(args.clients + 1));
    let until = Arc::new(Mutex::new(None::<Instant>));
    let threads: Vec<_> = (0..args.clients)
        .map(|c| {
            let (store, accepted, rejected, retries, histogram, barrier, until) = (
                store.clone(),
                accepted.clone(),
                rejected.clone(),
                retries.clone(),
                histogram.clone(),
                barrier.clone(),
                until.clone(),
            );
            let (courses, students) = (args.courses, args.students);
            let courses_ids = course_ids.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(c as u64);
                let mut local = Histogram::<u64>::new(3).expect("histogram");
                barrier.wait();
                let until = until
                    .lock()
                    .expect("deadline")
                    .expect("set before the start");
                while Instant::now() < until {
                    let (co, st) = (rng.gen_range(0..courses), rng.gen_range(0..students));
                    let started = Instant::now();
                    let retry = Retry {
                        attempts: 100,
                        ..Retry::default()
                    };
                    let result = course_subscriptions::subscribe_with(
                        &store,
                        &courses_ids[co as usize],
                        &st.to_string(),
                        retry,
                    );
                    local
                        .record(started.elapsed().as_micros().max(1) as u64)
                        .ok();
                    match result {
                        Ok(d) => {
                            accepted.fetch_add(1, Ordering::Relaxed);
                            retries.fetch_add(u64::from(d.attempts - 1), Ordering::Relaxed);
                        }
                        Err(DecideError::Rejected(_)) => {
                            rejected.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("decision failed: {e}"),
                    }
                }
                histogram.lock().expect("histogram").add(local).ok();
            })
        })
        .collect();
    *until.lock().map_err(|e| e.to_string())? =
        Some(Instant::now() + Duration::from_secs_f64(args.seconds));
    let started = Instant::now();
    barrier.wait();
    for t in threads {
        t.join().map_err(|_| "a client panicked")?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let fsyncs = store.stats().fsyncs - fsyncs_before;
    let (a, r) = (
        accepted.load(Ordering::Relaxed),
        rejected.load(Ordering::Relaxed),
    );
    let latency_us = std::mem::replace(
        &mut *histogram.lock().map_err(|e| e.to_string())?,
        Histogram::new(3).map_err(|e| e.to_string())?,
    );
    Ok(RunOutcome {
        decisions_per_sec: (a + r) as f64 / seconds,
        accepted: a,
        rejected: r,
        retries: retries.load(Ordering::Relaxed),
        latency_us,
        fsyncs,
    })
}

pub fn run(args: DecideArgs) -> Result<Value, String> {
    let durability: Durability = args.durability.parse()?;
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let floor = crate::bench::fsync_floor(&args.dir, true, Duration::from_secs(2))?;
    let mut outcomes = Vec::new();
    for _ in 0..args.runs.max(1) {
        outcomes.push(one_run(&args, durability)?);
    }
    let rates: Vec<f64> = outcomes
        .iter()
        .map(|o| o.decisions_per_sec.round())
        .collect();
    outcomes.sort_by(|a, b| a.decisions_per_sec.total_cmp(&b.decisions_per_sec));
    let m = &outcomes[outcomes.len() / 2];
    Ok(json!({
        "bench": "decide",
        "workload": "course subscription: two projections, one read, one conditional append",
        "clients": args.clients,
        "courses": args.courses,
        "students": args.students,
        "durability": durability.label(),
        "decisions_per_sec": m.decisions_per_sec.round(),
        "decisions_per_sec_runs": rates,
        "accepted": m.accepted,
        "rejected": m.rejected,
        "retries": m.retries,
        "latency_us": {
            "p50": m.latency_us.value_at_quantile(0.5),
            "p90": m.latency_us.value_at_quantile(0.9),
            "p99": m.latency_us.value_at_quantile(0.99),
            "max": m.latency_us.max(),
        },
        "fsyncs": m.fsyncs,
        "decisions_per_fsync": if m.fsyncs > 0 { ((m.accepted as f64 / m.fsyncs as f64) * 10.0).round() / 10.0 } else { 0.0 },
        "fsync_floor_per_sec": floor.round(),
        "ratio_to_fsync_floor": ((m.decisions_per_sec / floor) * 100.0).round() / 100.0,
    }))
}
