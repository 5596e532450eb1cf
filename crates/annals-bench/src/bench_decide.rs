//! `annals-bench decide`: the course-subscription decision (read two projections in one read,
//! append one event under the condition that protects them) from N client threads, embedded,
//! in D3 unless told otherwise, optionally with the course states kept between decisions.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use annals::decide::{DecideError, Retry};
use annals::snapshot::SnapshotPolicy;
use annals::{Durability, Store};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::bench::Mode;

#[derive(clap::Args)]
pub struct DecideArgs {
    /// Where the store lives (emptied first).
    #[arg(long, default_value = "/tmp/annals-bench-decide")]
    dir: PathBuf,
    /// Concurrent clients, each deciding one command at a time.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Courses, each with room for --capacity students.
    #[arg(long, default_value_t = 1000)]
    courses: u32,
    #[arg(long, default_value_t = 1000)]
    capacity: u32,
    /// Students; each may join at most 3 courses. Enough that a run stays in a steady state:
    /// with too few, a fast run fills every student's courses, its last decisions are mostly
    /// refusals (which append nothing), and its rate depends on how fast it had been
    /// (docs/DECISIONS.md, R13). With a million, nearly every decision appends.
    #[arg(long, default_value_t = 1_000_000)]
    students: u32,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Runs; the figures are the median run's.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    #[arg(long, default_value = "d3")]
    durability: String,
    /// How clients run: `tasks` (async tasks awaiting `decide_and_append_async` on
    /// --runtime-threads threads, as in an async service) or `threads` (one OS thread each,
    /// blocking in `decide_and_append`).
    #[arg(long, value_enum, default_value = "tasks")]
    mode: Mode,
    /// Threads of the async runtime in `tasks` mode; default: one fewer than the cores (at
    /// least one), as the server (docs/DECISIONS.md, R1).
    #[arg(long)]
    runtime_threads: Option<usize>,
    /// Course states kept between decisions (`annals::decide::StateCache`), shared by all
    /// clients: a decision then reads only the course's events since the last decision on it.
    /// 0 keeps none: every decision reads the course's whole history.
    #[arg(long, default_value_t = 0)]
    state_cache: usize,
    /// Courses snapshotted by the store (`annals::snapshot`), saved after this many events
    /// folded since the last snapshot; 0: no snapshots (with --state-cache or without).
    #[arg(long, default_value_t = 0)]
    snapshot_every: u64,
}

impl DecideArgs {
    fn snapshots(&self) -> Option<SnapshotPolicy> {
        (self.snapshot_every > 0).then_some(SnapshotPolicy {
            every: self.snapshot_every,
            slower_than: None,
        })
    }
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
    /// Groups the writer committed (one write each) during the run.
    groups: u64,
    /// Appends their callers staged themselves while the writer thread synced.
    caller_stages: u64,
    /// Microseconds spent in fdatasync during the run.
    fsync_us: u64,
    /// CPU time of the whole process during the run, in microseconds.
    cpu_us: u64,
    seconds: f64,
    snapshots: annals::snapshot::SnapshotCounts,
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
    let before = store.stats();
    let tally = Arc::new(Tally::new()?);
    let cache = Arc::new(course_subscriptions::CourseCache::new(args.state_cache));
    let cpu_before = crate::bench::process_cpu_us();
    let threads_before = crate::bench::thread_times_if_asked();
    let seconds = match args.mode {
        Mode::Threads => run_threads(args, &store, &cache, &course_ids, &tally)?,
        Mode::Tasks => run_tasks(args, &store, &cache, &course_ids, &tally)?,
    };
    let cpu_us = crate::bench::process_cpu_us().saturating_sub(cpu_before);
    if let Some(before) = &threads_before {
        crate::bench::print_thread_times(before);
    }
    let after = store.stats();
    let fsyncs = after.fsyncs - before.fsyncs;
    let fsync_us = after.fsync_us.sum - before.fsync_us.sum;
    let (a, r) = (
        tally.accepted.load(Ordering::Relaxed),
        tally.rejected.load(Ordering::Relaxed),
    );
    let latency_us = std::mem::replace(
        &mut *tally.latency_us.lock().map_err(|e| e.to_string())?,
        Histogram::new(3).map_err(|e| e.to_string())?,
    );
    Ok(RunOutcome {
        decisions_per_sec: (a + r) as f64 / seconds,
        accepted: a,
        rejected: r,
        retries: tally.retries.load(Ordering::Relaxed),
        latency_us,
        fsyncs,
        groups: after.groups - before.groups,
        caller_stages: after.caller_stages - before.caller_stages,
        fsync_us,
        cpu_us,
        seconds,
        snapshots: store.snapshots().counts(),
    })
}

/// Outcomes counted by every client.
struct Tally {
    accepted: AtomicU64,
    rejected: AtomicU64,
    retries: AtomicU64,
    latency_us: Mutex<Histogram<u64>>,
}

impl Tally {
    fn new() -> Result<Tally, String> {
        Ok(Tally {
            accepted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            latency_us: Mutex::new(Histogram::new(3).map_err(|e| e.to_string())?),
        })
    }

    fn count(&self, outcome: course_subscriptions::Outcome) {
        match outcome {
            Ok(d) => {
                self.accepted.fetch_add(1, Ordering::Relaxed);
                self.retries
                    .fetch_add(u64::from(d.attempts - 1), Ordering::Relaxed);
            }
            Err(DecideError::Rejected(_)) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => panic!("decision failed: {e}"),
        }
    }

    fn merge(&self, local: Histogram<u64>) {
        self.latency_us.lock().expect("histogram").add(local).ok();
    }
}

const RETRY: Retry = Retry {
    attempts: 100,
    backoff: Duration::from_micros(200),
    backoff_max: Duration::from_millis(50),
};

/// One OS thread per client, each blocking in `subscribe_with`. Returns the seconds measured.
fn run_threads(
    args: &DecideArgs,
    store: &Arc<Store>,
    cache: &Arc<course_subscriptions::CourseCache>,
    course_ids: &Arc<Vec<String>>,
    tally: &Arc<Tally>,
) -> Result<f64, String> {
    let barrier = Arc::new(std::sync::Barrier::new(args.clients + 1));
    let until = Arc::new(Mutex::new(None::<Instant>));
    let threads: Vec<_> = (0..args.clients)
        .map(|c| {
            let (store, cache, tally, barrier, until, course_ids) = (
                store.clone(),
                cache.clone(),
                tally.clone(),
                barrier.clone(),
                until.clone(),
                course_ids.clone(),
            );
            let students = args.students;
            let snapshots = args.snapshots();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(c as u64);
                let mut local = Histogram::<u64>::new(3).expect("histogram");
                barrier.wait();
                let until = until
                    .lock()
                    .expect("deadline")
                    .expect("set before the start");
                while Instant::now() < until {
                    let course = &course_ids[rng.gen_range(0..course_ids.len())];
                    let student = rng.gen_range(0..students).to_string();
                    let started = Instant::now();
                    let outcome = match snapshots {
                        Some(policy) => course_subscriptions::subscribe_snapshotted(
                            &store, course, &student, policy, RETRY,
                        ),
                        None => course_subscriptions::subscribe_cached(
                            &store, &cache, course, &student, RETRY,
                        ),
                    };
                    local
                        .record(started.elapsed().as_micros().max(1) as u64)
                        .ok();
                    tally.count(outcome);
                }
                tally.merge(local);
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
    Ok(started.elapsed().as_secs_f64())
}

fn runtime_threads(args: &DecideArgs) -> usize {
    crate::bench::runtime_threads(args.runtime_threads)
}

/// One async task per client on a runtime of `--runtime-threads` threads, each awaiting
/// `subscribe_async`: a waiting decision holds no thread. Returns the seconds measured.
fn run_tasks(
    args: &DecideArgs,
    store: &Arc<Store>,
    cache: &Arc<course_subscriptions::CourseCache>,
    course_ids: &Arc<Vec<String>>,
    tally: &Arc<Tally>,
) -> Result<f64, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(runtime_threads(args))
        .enable_time()
        .build()
        .map_err(|e| e.to_string())?;
    let until = Instant::now() + Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..args.clients)
            .map(|c| {
                let (store, cache, tally, course_ids) = (
                    store.clone(),
                    cache.clone(),
                    tally.clone(),
                    course_ids.clone(),
                );
                let students = args.students;
                let snapshots = args.snapshots();
                tokio::spawn(async move {
                    let mut rng = StdRng::seed_from_u64(c as u64);
                    let mut local = Histogram::<u64>::new(3).expect("histogram");
                    while Instant::now() < until {
                        let course = &course_ids[rng.gen_range(0..course_ids.len())];
                        let student = rng.gen_range(0..students).to_string();
                        let started = Instant::now();
                        let outcome = match snapshots {
                            Some(policy) => {
                                course_subscriptions::subscribe_snapshotted_async(
                                    &store,
                                    course,
                                    &student,
                                    policy,
                                    RETRY,
                                    tokio::time::sleep,
                                )
                                .await
                            }
                            None => {
                                course_subscriptions::subscribe_async(
                                    &store,
                                    &cache,
                                    course,
                                    &student,
                                    RETRY,
                                    tokio::time::sleep,
                                )
                                .await
                            }
                        };
                        local
                            .record(started.elapsed().as_micros().max(1) as u64)
                            .ok();
                        tally.count(outcome);
                    }
                    tally.merge(local);
                })
            })
            .collect();
        for task in tasks {
            task.await.map_err(|e| format!("a client failed: {e}"))?;
        }
        Ok::<(), String>(())
    })?;
    Ok(started.elapsed().as_secs_f64())
}

/// `a / b` to a tenth (0 when `b` is 0).
fn tenths(a: u64, b: u64) -> f64 {
    if b == 0 {
        return 0.0;
    }
    (a as f64 / b as f64 * 10.0).round() / 10.0
}

pub fn run(args: DecideArgs) -> Result<Value, String> {
    let durability: Durability = args.durability.parse()?;
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    // The disk's own rate drifts while the runs go on: measured before and after, averaged
    // (as `bench append` does).
    let floor_before = crate::bench::fsync_floor(&args.dir, true, Duration::from_secs(1))?;
    let mut outcomes = Vec::new();
    for _ in 0..args.runs.max(1) {
        outcomes.push(one_run(&args, durability)?);
    }
    let floor_after = crate::bench::fsync_floor(&args.dir, true, Duration::from_secs(1))?;
    let floor = (floor_before + floor_after) / 2.0;
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
        "mode": args.mode.describe("client", runtime_threads(&args)),
        "courses": args.courses,
        "students": args.students,
        "state_cache": args.state_cache,
        "snapshot_every": args.snapshot_every,
        "snapshots_saved": m.snapshots.saved,
        "snapshot_hits": m.snapshots.hits,
        "durability": durability.label(),
        "decisions_per_sec": m.decisions_per_sec.round(),
        "decisions_per_sec_runs": rates,
        "accepted_per_sec": (m.accepted as f64 / m.seconds).round(),
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
        "appends_per_write": tenths(m.accepted, m.groups),
        "caller_stages": m.caller_stages,
        "fsync_us_mean": m.fsync_us.checked_div(m.fsyncs).unwrap_or(0),
        "disk_busy": ((m.fsync_us as f64 / 1e6 / m.seconds) * 100.0).round() / 100.0,
        // The whole process (clients, writer, runtime) per decision, attempts included: a
        // steadier figure than the rate on a shared machine, and what 64 clients are bound by.
        "cpu_us_per_decision": tenths(m.cpu_us, m.accepted + m.rejected),
        "cpu_cores_busy": ((m.cpu_us as f64 / 1e6 / m.seconds) * 100.0).round() / 100.0,
        "decisions_per_fsync": tenths(m.accepted, m.fsyncs),
        "fsync_floor_per_sec": floor.round(),
        "fsync_floor_before_after": [floor_before.round(), floor_after.round()],
        "ratio_to_fsync_floor": ((m.decisions_per_sec / floor) * 100.0).round() / 100.0,
    }))
}
