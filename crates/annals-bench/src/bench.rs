//! The store's benchmarks (append, read, recover, fsync) and what the other benchmarks share
//! (the fsync floor, CPU and thread times, the server binary they start). Each benchmark prints
//! one JSON object as its last line, with every figure labelled by its durability class and
//! measured beside the raw fdatasync rate of the same directory, in the same run. The command
//! list is the crate root's, so that every benchmark imports this module and this module imports
//! none of them.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use annals::{
    AppendCondition, Durability, Limits, NewEvent, Options, Preallocation, Query, QueryItem,
    ReadOptions, Store,
};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

#[derive(clap::Args, Clone)]
pub struct AppendArgs {
    /// Directory for the store (emptied first) and the fsync floor file.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub(crate) writers: usize,
    /// Events per append.
    #[arg(long, default_value_t = 1)]
    pub(crate) batch: usize,
    /// Total events to append.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) events: u64,
    /// Each append carries a condition on its writer's stream (checked, never failing).
    #[arg(long)]
    pub(crate) conditional: bool,
    #[arg(long, default_value_t = 256)]
    pub(crate) event_bytes: usize,
    /// What an event's data holds: `repeated` (one byte repeated, shared by every event) or
    /// `json` (a JSON object of random ids, amounts and words, its own per event, as real
    /// events are; it matters where bytes are compressed, as in a backup).
    #[arg(long, value_enum, default_value = "repeated")]
    pub(crate) data: Data,
    #[arg(long, default_value_t = 2)]
    pub(crate) tags: usize,
    #[arg(long, default_value = "d3")]
    pub(crate) durability: String,
    /// Repeat the run and report the median (each run on a fresh store).
    #[arg(long, default_value_t = 1)]
    pub(crate) runs: usize,
    /// How segments are preallocated: zeros, fallocate or adaptive (the store's default:
    /// zeros while fdatasyncs are small, fallocate once they cover 256 KiB or more each).
    #[arg(long, default_value = "adaptive")]
    pub(crate) preallocate: Preallocation,
    /// How writers run: `tasks` (async tasks awaiting `Store::append_async` on
    /// --runtime-threads threads, as in an async service) or `threads` (one OS thread each,
    /// blocking in `Store::append`).
    #[arg(long, value_enum, default_value = "tasks")]
    pub(crate) mode: Mode,
    /// Threads of the async runtime in `tasks` mode; default: one fewer than the cores (at
    /// least one), as the server.
    #[arg(long)]
    pub(crate) runtime_threads: Option<usize>,
    /// A backup the store ships to while it runs (the `backup` benchmark sets it).
    #[arg(skip)]
    pub(crate) backup: Option<annals::BackupOptions>,
    /// Data subjects the store seals (the `subjects` benchmark sets it).
    #[arg(skip)]
    pub(crate) subjects: Option<annals::SubjectOptions>,
    /// A schema of the events' type ("Deposited"), registered in the store's registry before
    /// the writers start (the `schema` benchmark sets it); None: the store has no registry.
    #[arg(skip)]
    pub(crate) schema: Option<Value>,
}

/// `writers` async writers of conditional appends of one 256-byte event with two tags, D3:
/// the load the backup and subjects benchmarks compare with and without their feature.
pub(crate) fn conditional_writers(dir: &Path, writers: usize, events: u64) -> AppendArgs {
    AppendArgs {
        dir: dir.to_path_buf(),
        writers,
        batch: 1,
        events,
        conditional: true,
        event_bytes: 256,
        data: Data::Repeated,
        tags: 2,
        durability: "d3".into(),
        runs: 1,
        preallocate: Preallocation::Adaptive,
        mode: Mode::Tasks,
        runtime_threads: None,
        backup: None,
        subjects: None,
        schema: None,
    }
}

/// What the events' data holds (`AppendArgs::data`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Data {
    Repeated,
    Json,
    /// A JSON object of ten fields that the `schema` benchmark's schema accepts.
    Record,
}

/// `bytes` of JSON such as an application's event carries: an account, an amount, a currency,
/// a random reference and a note of words from a small vocabulary.
fn json_data(rng: &mut StdRng, bytes: usize) -> Bytes {
    const WORDS: [&str; 24] = [
        "order",
        "payment",
        "refund",
        "monthly",
        "invoice",
        "transfer",
        "card",
        "cash",
        "received",
        "pending",
        "settled",
        "for",
        "the",
        "from",
        "account",
        "customer",
        "service",
        "fee",
        "adjustment",
        "manual",
        "review",
        "batch",
        "salary",
        "rent",
    ];
    let reference: String = (0..16)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.gen_range(0..36)]))
        .collect();
    let mut s = format!(
        r#"{{"account":"acc-{:08x}","amount_cents":{},"currency":"{}","reference":"{reference}","channel":"{}","note":""#,
        rng.gen::<u32>(),
        rng.gen_range(1..10_000_000u32),
        ["EUR", "USD", "GBP", "CHF"][rng.gen_range(0..4)],
        ["web", "mobile", "branch", "api"][rng.gen_range(0..4)],
    );
    while s.len() + 2 < bytes {
        s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        s.push(' ');
    }
    s.truncate(bytes.saturating_sub(2));
    s.push_str("\"}");
    Bytes::from(s)
}

/// The ten-property schema the `schema` benchmark's events fit.
pub(crate) fn schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": false,
        "required": ["account", "amount_cents", "currency", "reference", "channel",
                     "sequence", "country", "priority", "flagged", "note"],
        "properties": {
            "account": {"type": "string", "pattern": "^acc-[0-9a-f]{8}$"},
            "amount_cents": {"type": "integer", "minimum": 1, "maximum": 1000000000},
            "currency": {"enum": ["EUR", "USD", "GBP", "CHF"]},
            "reference": {"type": "string", "minLength": 16, "maxLength": 16},
            "channel": {"enum": ["web", "mobile", "branch", "api"]},
            "sequence": {"type": "integer", "minimum": 0},
            "country": {"type": "string", "minLength": 2, "maxLength": 2},
            "priority": {"type": "integer", "minimum": 1, "maximum": 5},
            "flagged": {"type": "boolean"},
            "note": {"type": "string", "maxLength": 2048}
        }
    })
}

/// A JSON object of the ten fields, `bytes` long (the note fills it), its own per event.
pub(crate) fn record_data(rng: &mut StdRng, bytes: usize) -> Bytes {
    let reference: String = (0..16)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.gen_range(0..36)]))
        .collect();
    let mut s = format!(
        r#"{{"account":"acc-{:08x}","amount_cents":{},"currency":"{}","reference":"{reference}","channel":"{}","sequence":{},"country":"{}","priority":{},"flagged":{},"note":""#,
        rng.gen::<u32>(),
        rng.gen_range(1..10_000_000u32),
        ["EUR", "USD", "GBP", "CHF"][rng.gen_range(0..4)],
        ["web", "mobile", "branch", "api"][rng.gen_range(0..4)],
        rng.gen::<u32>(),
        ["DE", "FR", "NL", "CH"][rng.gen_range(0..4)],
        rng.gen_range(1..=5),
        rng.gen_bool(0.1),
    );
    while s.len() + 2 < bytes {
        s.push_str(["pay ", "rent ", "card ", "fee "][rng.gen_range(0..4)]);
    }
    s.truncate(bytes.saturating_sub(2));
    s.push_str("\"}");
    Bytes::from(s)
}

/// How a benchmark's clients run: as async tasks on a runtime of a few threads (as in an async
/// service) or as one OS thread each, blocking in the store's calls.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    Threads,
    Tasks,
}

impl Mode {
    /// The `mode` of a benchmark's JSON line; `who` names one client (`writer`, `client`).
    pub(crate) fn describe(self, who: &str, runtime_threads: usize) -> String {
        match self {
            Mode::Threads => format!("threads: one OS thread per {who}"),
            Mode::Tasks => format!("tasks: async {who}s on {runtime_threads} runtime thread(s)"),
        }
    }
}

/// CPU time the whole process has used so far (every thread, user and system), in
/// microseconds.
pub(crate) fn process_cpu_us() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill; the clock id is a constant.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) } == 0;
    if !ok {
        return 0;
    }
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
}

/// CPU time another process (every thread, user and system) has used so far, in
/// microseconds; `None` when its clock cannot be read (it has exited, or is not ours).
pub(crate) fn process_cpu_us_of(pid: u32) -> Option<u64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the call only writes the clock id it is given a place for.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } != 0 {
        return None;
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    let ok = unsafe { libc::clock_gettime(clock, &mut now) } == 0;
    ok.then(|| now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000)
}

/// The async runtime's threads: as asked, else as the server's default (one fewer than the
/// cores, at least one, leaving a core to the store's writer): a second thread fights the
/// writer and syncer for the CPU (docs/DECISIONS.md, R1).
pub(crate) fn runtime_threads(asked: Option<usize>) -> usize {
    asked
        .unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1))
        })
        .max(1)
}

/// The `annals` binary that benchmarks start as their server: `ANNALS_BIN`, else the one beside
/// this program (both are built into the same target directory).
pub(crate) fn server_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("ANNALS_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let sibling = exe.with_file_name("annals");
    if sibling.exists() {
        Ok(sibling)
    } else {
        Err(format!(
            "no annals binary beside {} (build it with cargo build -p annals-cli, or set ANNALS_BIN)",
            exe.display()
        ))
    }
}

/// What one writer appends, prepared before the measurement: a few batches, cycled (tag
/// formatting stays out of the measurement), and the query of its own stream.
struct Writer {
    batches: Vec<Vec<NewEvent>>,
    stream: Query,
    conditional: bool,
    last: u64,
    latency: Histogram<u64>,
    /// Where the run's latencies and failures are gathered.
    histogram: Arc<Mutex<Histogram<u64>>>,
    failures: Arc<std::sync::atomic::AtomicU64>,
}

impl Writer {
    fn new(
        w: usize,
        args: &AppendArgs,
        payload: &Bytes,
        histogram: &Arc<Mutex<Histogram<u64>>>,
        failures: &Arc<std::sync::atomic::AtomicU64>,
    ) -> Writer {
        let mut rng = StdRng::seed_from_u64(w as u64);
        Writer {
            batches: (0..8)
                .map(|s| make_batch(w, s, args, payload, &mut rng))
                .collect(),
            stream: Query::item(QueryItem::tags([format!("stream:{w}")])),
            conditional: args.conditional,
            last: 0,
            latency: Histogram::<u64>::new(3).expect("histogram"),
            histogram: histogram.clone(),
            failures: failures.clone(),
        }
    }

    /// The k-th append's events and condition (on the writer's stream, after what it last
    /// appended: checked, never failing).
    fn next(&self, k: u64) -> (&[NewEvent], Option<AppendCondition>) {
        let condition = self
            .conditional
            .then(|| AppendCondition::new(self.stream.clone(), Some(self.last)));
        (&self.batches[(k % 8) as usize], condition)
    }

    /// Records an append's outcome.
    fn done(&mut self, started: Instant, outcome: Result<u64, annals::AppendError>) {
        self.latency
            .record(started.elapsed().as_micros() as u64)
            .ok();
        match outcome {
            Ok(p) => self.last = p,
            Err(_) => {
                self.failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Adds this writer's latencies to the run's.
    fn finish(self) {
        self.histogram
            .lock()
            .expect("histogram")
            .add(self.latency)
            .ok();
    }
}

#[derive(clap::Args)]
pub struct ReadArgs {
    #[arg(long)]
    dir: PathBuf,
    /// Events in the store (built if the directory holds fewer).
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Distinct selective tags; each gets events / tags events.
    #[arg(long, default_value_t = 100_000)]
    selective_tags: u64,
    #[arg(long, default_value_t = 200_000)]
    reads: u64,
}

#[derive(clap::Args)]
pub struct RecoverArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Opens of each kind (with the checkpoint, rebuilding); the medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

#[derive(clap::Args)]
pub struct FsyncArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
}

/// The raw fdatasync rate of a directory: on a preallocated and on a growing file, and per CPU.
pub(crate) fn fsync(args: FsyncArgs) -> Result<Value, String> {
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let seconds = Duration::from_secs_f64(args.seconds);
    let per_cpu = fsync_floor_per_cpu(&args.dir, seconds / 2)?;
    Ok(json!({
        "workload": "fsync_floor",
        "fsync_floor_per_sec": fsync_floor(&args.dir, true, seconds)?,
        "fsync_floor_growing_per_sec": fsync_floor(&args.dir, false, seconds)?,
        "fsync_floor_per_cpu": per_cpu,
    }))
}

/// A new empty file `name` in `dir`, fallocated to `allocate` bytes (and synced) if given.
fn scratch_file(
    dir: &Path,
    name: &str,
    allocate: Option<u64>,
) -> Result<(PathBuf, std::fs::File), String> {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(size) = allocate {
        use std::os::fd::AsRawFd;
        // SAFETY: fallocate on a descriptor owned by `file`; no memory is passed.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
        if rc != 0 {
            return Err(format!("fallocate: {}", std::io::Error::last_os_error()));
        }
        file.sync_all().map_err(|e| e.to_string())?;
    }
    Ok((path, file))
}

/// The raw rate of "write 256 bytes, fdatasync" on a file in `dir`: preallocated with
/// fallocate (as Annals segments are) or growing at each write.
pub fn fsync_floor(dir: &Path, preallocated: bool, duration: Duration) -> Result<f64, String> {
    let size: u64 = 64 << 20;
    let (path, file) = scratch_file(dir, "fsync-floor.tmp", preallocated.then_some(size))?;
    let record = [0x5Au8; 256];
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < duration {
        let at = (n * 256) % (size - 256);
        file.write_all_at(&record, at).map_err(|e| e.to_string())?;
        file.sync_data().map_err(|e| e.to_string())?;
        n += 1;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    Ok(rate)
}

/// The raw fdatasync rate ([`fsync_floor`], preallocated) of a thread held on each CPU this
/// process may run on in turn, keyed by CPU number. On a virtual machine whose disk
/// interrupts all arrive at one CPU, a thread elsewhere waits for an inter-processor wake-up
/// after each fdatasync, so any figure of a synced path depends on where its thread ran
/// (docs/DECISIONS.md, R2).
fn fsync_floor_per_cpu(
    dir: &Path,
    each: Duration,
) -> Result<serde_json::Map<String, Value>, String> {
    // SAFETY: sched_getaffinity fills the set it is given; the set is plain data.
    let allowed = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(format!(
                "sched_getaffinity: {}",
                std::io::Error::last_os_error()
            ));
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect::<Vec<_>>()
    };
    let mut rates = serde_json::Map::new();
    for cpu in allowed {
        let dir = dir.to_path_buf();
        let rate = std::thread::spawn(move || {
            // SAFETY: as above; this thread only restricts itself.
            let pinned = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0
            };
            if !pinned {
                return Err(format!(
                    "sched_setaffinity: {}",
                    std::io::Error::last_os_error()
                ));
            }
            fsync_floor(&dir, true, each)
        })
        .join()
        .map_err(|_| "the fsync floor thread panicked".to_string())??;
        rates.insert(cpu.to_string(), json!(rate.round()));
    }
    Ok(rates)
}

/// The raw rate, in bytes per second, of "write 4 MiB, fdatasync" in a loop through a
/// fallocated file in `dir`, each write to space not written before (as a log's are): what a
/// log of large synced appends could write there at most.
pub fn write_bandwidth(dir: &Path, duration: Duration) -> Result<f64, String> {
    const CHUNK: usize = 4 << 20;
    const SIZE: u64 = 1 << 30;
    let (path, file) = scratch_file(dir, "bandwidth-floor.tmp", Some(SIZE))?;
    let chunk = vec![0xA5u8; CHUNK];
    let started = Instant::now();
    let mut written = 0u64;
    while started.elapsed() < duration && written < SIZE {
        file.write_all_at(&chunk, written)
            .map_err(|e| e.to_string())?;
        file.sync_data().map_err(|e| e.to_string())?;
        written += CHUNK as u64;
    }
    let rate = written as f64 / started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    Ok(rate)
}

pub(crate) fn latency_json(h: &Histogram<u64>) -> Value {
    json!({
        "p50": h.value_at_quantile(0.50),
        "p90": h.value_at_quantile(0.90),
        "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999),
        "max": h.max(),
    })
}

/// Full scans of `store` from the start, `each` called on every event: the median of three,
/// events/s, and the events the last scan read.
pub(crate) fn full_scans(
    store: &Store,
    mut each: impl FnMut(&annals::Event),
) -> Result<(f64, u64), String> {
    let (mut rates, mut events) = (Vec::new(), 0);
    for _ in 0..3 {
        let started = Instant::now();
        events = 0u64;
        for event in store
            .read(&Query::all(), ReadOptions::forwards())
            .map_err(|e| e.to_string())?
        {
            each(&event.map_err(|e| e.to_string())?);
            events += 1;
        }
        rates.push(events as f64 / started.elapsed().as_secs_f64());
    }
    Ok((median(rates), events))
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        0.0
    } else {
        values[values.len() / 2]
    }
}

fn fresh_dir(dir: &Path) -> Result<(), String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

pub(crate) fn bench_options(durability: Durability) -> Options {
    Options {
        durability,
        segment_bytes: 256 << 20,
        limits: Limits {
            append_bytes_max: 16 << 20,
            events_per_append_max: 100_000,
            queue_depth_max: 16_384,
            ..Limits::default()
        },
        group_bytes_max: 64 << 20,
        ..Options::default()
    }
}

/// The events of one writer's append: 2+ tags (the writer's stream, and an entity among
/// 100,000, then extra tags), `event_bytes` of data: shared between events (not copied), or
/// JSON of its own.
fn make_batch(
    writer: usize,
    serial: u64,
    args: &AppendArgs,
    payload: &Bytes,
    rng: &mut StdRng,
) -> Vec<NewEvent> {
    (0..args.batch)
        .map(|_| {
            let mut tags = Vec::with_capacity(args.tags);
            if args.tags > 0 {
                tags.push(format!("stream:{writer}"));
            }
            if args.tags > 1 {
                tags.push(format!("entity:{}", rng.gen_range(0..100_000)));
            }
            for t in 2..args.tags {
                tags.push(format!("extra{t}:{}", serial % 1000));
            }
            let data = match args.data {
                Data::Repeated => payload.clone(),
                Data::Json => json_data(rng, args.event_bytes),
                Data::Record => record_data(rng, args.event_bytes),
            };
            NewEvent {
                event_type: "Deposited".to_owned(),
                tags,
                data,
                metadata: Bytes::new(),
                id: None,
            }
        })
        .collect()
}

pub(crate) struct RunResult {
    pub(crate) events_per_sec: f64,
    pub(crate) appends_per_sec: f64,
    pub(crate) latency: Histogram<u64>,
    fsyncs: u64,
    /// Groups committed, and of them those a lone caller committed on its own thread.
    groups: u64,
    caller_commits: u64,
    /// Appends their callers staged into the next group while the writer thread synced.
    caller_stages: u64,
    events: u64,
    seconds: f64,
    bytes_written: u64,
    /// Zeros written to preallocate the segments begun during the run.
    zero_bytes: u64,
    fsync_us_mean: f64,
    /// With a backup: its lag in milliseconds, sampled every 10 ms during the run, and the
    /// time it took to catch up after it.
    pub(crate) backup_lag_ms: Option<Histogram<u64>>,
    pub(crate) backup_drain_ms: Option<f64>,
}

pub(crate) fn append_run(
    args: &AppendArgs,
    durability: Durability,
    store_dir: &Path,
) -> Result<RunResult, String> {
    fresh_dir(store_dir)?;
    let registry = args
        .schema
        .as_ref()
        .map(|_| Arc::new(annals::registry::Registry::new()));
    let options = Options {
        preallocation: args.preallocate,
        backup: args.backup.clone(),
        subjects: args.subjects.clone(),
        admission: registry
            .clone()
            .map(|r| r as Arc<dyn annals::admission::Admission>),
        ..bench_options(durability)
    };
    let store = Arc::new(Store::open(store_dir, options).map_err(|e| e.to_string())?);
    if let (Some(registry), Some(schema)) = (&registry, &args.schema) {
        let registration = annals::registry::Registration::new("Deposited", schema.clone());
        registry
            .register(&store, registration, &mut |_| {})
            .map_err(|e| e.to_string())?;
    }
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = args.backup.as_ref().map(|_| {
        let (store, sampling) = (store.clone(), sampling.clone());
        std::thread::spawn(move || {
            let mut lag = Histogram::<u64>::new(3).expect("a histogram");
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(b) = store.stats().backup {
                    let _ = lag.record((b.lag_seconds * 1e3) as u64);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            lag
        })
    });
    // The first segment's zeros were written at open, before the run.
    let zeros_at_open = store.stats().zero_fill_bytes;
    let appends_per_writer = (args.events / (args.writers as u64 * args.batch as u64)).max(1);
    let payload = Bytes::from(vec![b'x'; args.event_bytes]);
    let histogram = Arc::new(Mutex::new(
        Histogram::<u64>::new(3).map_err(|e| e.to_string())?,
    ));
    let failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = match args.mode {
        Mode::Threads => {
            let barrier = Arc::new(std::sync::Barrier::new(args.writers + 1));
            let handles: Vec<_> = (0..args.writers)
                .map(|w| {
                    let mut writer = Writer::new(w, args, &payload, &histogram, &failures);
                    let (store, barrier) = (store.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        for k in 0..appends_per_writer {
                            let (events, condition) = writer.next(k);
                            let started = Instant::now();
                            let outcome = store.append(events, condition.as_ref());
                            writer.done(started, outcome);
                        }
                        writer.finish();
                    })
                })
                .collect();
            barrier.wait();
            let started = Instant::now();
            for h in handles {
                h.join().map_err(|_| "a writer panicked")?;
            }
            started
        }
        Mode::Tasks => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(runtime_threads(args.runtime_threads))
                .build()
                .map_err(|e| e.to_string())?;
            let mut writers: Vec<_> = (0..args.writers)
                .map(|w| Writer::new(w, args, &payload, &histogram, &failures))
                .collect();
            let started = Instant::now();
            runtime.block_on(async {
                let tasks: Vec<_> = writers
                    .drain(..)
                    .map(|mut writer| {
                        let store = store.clone();
                        tokio::spawn(async move {
                            for k in 0..appends_per_writer {
                                let started = Instant::now();
                                let outcome = loop {
                                    let (events, condition) = writer.next(k);
                                    match store
                                        .append_async(
                                            events,
                                            condition.as_ref(),
                                            Default::default(),
                                        )
                                        .await
                                    {
                                        Err(annals::AppendError::QueueFull { .. }) => {
                                            tokio::task::yield_now().await
                                        }
                                        outcome => break outcome,
                                    }
                                };
                                writer.done(started, outcome);
                            }
                            writer.finish();
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.map_err(|e| format!("a writer failed: {e}"))?;
                }
                Ok::<(), String>(())
            })?;
            started
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let stats = store.stats();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let backup_lag_ms = match sampler {
        Some(s) => Some(s.join().map_err(|_| "the lag sampler panicked")?),
        None => None,
    };
    let backup_drain_ms = match &args.backup {
        None => None,
        Some(_) => {
            let drain = Instant::now();
            while store.stats().backup.is_some_and(|b| b.lag_positions > 0) {
                if drain.elapsed() > Duration::from_secs(120) {
                    return Err("the backup did not catch up within 2 minutes".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Some(drain.elapsed().as_secs_f64() * 1e3)
        }
    };
    if failures.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        return Err(format!(
            "{} appends failed",
            failures.load(std::sync::atomic::Ordering::Relaxed)
        ));
    }
    let events = appends_per_writer * args.writers as u64 * args.batch as u64;
    drop(store);
    let latency = Arc::try_unwrap(histogram)
        .map_err(|_| "histogram still shared")?
        .into_inner()
        .map_err(|e| e.to_string())?;
    Ok(RunResult {
        events_per_sec: events as f64 / seconds,
        appends_per_sec: (events / args.batch as u64) as f64 / seconds,
        latency,
        fsyncs: stats.fsyncs,
        groups: stats.groups,
        caller_commits: stats.caller_commits,
        caller_stages: stats.caller_stages,
        events,
        seconds,
        bytes_written: stats.bytes_written,
        // Segments rolled into during the run (the one being prepared when it ended is left
        // out).
        zero_bytes: stats.zero_fill_bytes - zeros_at_open,
        fsync_us_mean: stats.fsync_us_mean,
        backup_lag_ms,
        backup_drain_ms,
    })
}

pub(crate) fn append(args: AppendArgs) -> Result<Value, String> {
    let durability: Durability = args.durability.parse()?;
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let floor = fsync_floor(&args.dir, true, Duration::from_secs(1))?;
    let bandwidth = write_bandwidth(&args.dir, Duration::from_secs(1))?;
    let store_dir = args.dir.join("store");
    let mut runs = Vec::new();
    for run in 0..args.runs {
        let result = append_run(&args, durability, &store_dir)?;
        eprintln!(
            "run {}: {:.0} events/s, {:.0} appends/s, p99 {} us, {} fsyncs in {:.2} s",
            run + 1,
            result.events_per_sec,
            result.appends_per_sec,
            result.latency.value_at_quantile(0.99),
            result.fsyncs,
            result.seconds
        );
        runs.push(result);
    }
    let _ = std::fs::remove_dir_all(&store_dir);
    let floor_after = fsync_floor(&args.dir, true, Duration::from_secs(1))?;
    let bandwidth_after = write_bandwidth(&args.dir, Duration::from_secs(1))?;
    let bandwidth_before_after = [bandwidth / 1e6, bandwidth_after / 1e6];
    let bandwidth = (bandwidth + bandwidth_after) / 2.0;
    runs.sort_by(|a, b| a.events_per_sec.total_cmp(&b.events_per_sec));
    let mid = &runs[runs.len() / 2];
    let floor_before_after = [floor, floor_after];
    let floor = (floor + floor_after) / 2.0;
    Ok(json!({
        "workload": if args.conditional { "conditional_append" } else { "append" },
        "writers": args.writers,
        "mode": args.mode.describe("writer", runtime_threads(args.runtime_threads)),
        "batch": args.batch,
        "events": mid.events,
        "event_bytes": args.event_bytes,
        "tags": args.tags,
        "durability": durability.label(),
        "preallocation": args.preallocate.label(),
        "runs": runs.len(),
        "events_per_sec": mid.events_per_sec,
        "events_per_sec_runs": runs.iter().map(|r| r.events_per_sec).collect::<Vec<_>>(),
        "appends_per_sec": mid.appends_per_sec,
        "latency_us": latency_json(&mid.latency),
        "fsyncs": mid.fsyncs,
        "events_per_fsync": if mid.fsyncs == 0 { 0.0 } else { mid.events as f64 / mid.fsyncs as f64 },
        "groups": mid.groups,
        "caller_commits": mid.caller_commits,
        "caller_stages": mid.caller_stages,
        "fsync_floor_per_sec": floor,
        "fsync_floor_before_after": floor_before_after,
        "ratio_to_fsync_floor": mid.events_per_sec / floor,
        "log_mb_per_sec": mid.bytes_written as f64 / mid.seconds / 1e6,
        "fsync_us_mean": mid.fsync_us_mean,
        "fsync_busy": mid.fsync_us_mean * mid.fsyncs as f64 / 1e6 / mid.seconds,
        "disk_write_mb_per_sec": bandwidth / 1e6,
        "disk_write_mb_per_sec_before_after": bandwidth_before_after,
        "zero_fill_mb_per_sec": mid.zero_bytes as f64 / mid.seconds / 1e6,
        "share_of_disk_bandwidth": (mid.bytes_written + mid.zero_bytes) as f64 / mid.seconds / bandwidth,
    }))
}

/// Fills `dir` with `events` events: each carries one selective tag among `selective_tags`
/// and a type among four; 256-byte data.
fn build_store(dir: &Path, events: u64, selective_tags: u64) -> Result<(), String> {
    let store = Store::open(dir, bench_options(Durability::Synced)).map_err(|e| e.to_string())?;
    let have = store.head();
    if have >= events {
        return Ok(());
    }
    let payload = Bytes::from(vec![b'y'; 256]);
    let batch = 4096u64;
    let types = ["Opened", "Deposited", "Withdrawn", "Closed"];
    let mut position = have;
    let started = Instant::now();
    while position < events {
        let n = batch.min(events - position);
        let batch: Vec<NewEvent> = (0..n)
            .map(|i| {
                let p = position + i;
                NewEvent {
                    event_type: types[(p % 4) as usize].to_owned(),
                    tags: vec![
                        format!("entity:{}", p % selective_tags),
                        format!("region:{}", p % 16),
                    ],
                    data: payload.clone(),
                    metadata: Bytes::new(),
                    id: None,
                }
            })
            .collect();
        position = store.append(&batch, None).map_err(|e| e.to_string())?;
    }
    eprintln!(
        "built {} events in {:.1} s",
        events - have,
        started.elapsed().as_secs_f64()
    );
    store.close().map_err(|e| e.to_string())
}

pub(crate) fn read(args: ReadArgs) -> Result<Value, String> {
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let store_dir = args.dir.join("read-store");
    build_store(&store_dir, args.events, args.selective_tags)?;
    let store =
        Store::open(&store_dir, bench_options(Durability::Synced)).map_err(|e| e.to_string())?;
    let head = store.head();
    let mut scans = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let mut count = 0u64;
        let mut bytes = 0usize;
        for event in store
            .read(&Query::all(), ReadOptions::forwards())
            .map_err(|e| e.to_string())?
        {
            let event = event.map_err(|e| e.to_string())?;
            bytes += event.data().len();
            count += 1;
        }
        let seconds = started.elapsed().as_secs_f64();
        if count != head || bytes == 0 {
            return Err(format!("full scan found {count} events, head is {head}"));
        }
        scans.push(count as f64 / seconds);
    }
    let mut rng = StdRng::seed_from_u64(1);
    let mut latency = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let per_tag = head / args.selective_tags;
    let queries: Vec<Query> = (0..1024)
        .map(|_| {
            Query::item(QueryItem::tags([format!(
                "entity:{}",
                rng.gen_range(0..args.selective_tags)
            )]))
        })
        .collect();
    let started = Instant::now();
    let mut events_read = 0u64;
    for i in 0..args.reads {
        let query = &queries[(i % 1024) as usize];
        let t = Instant::now();
        let mut n = 0u64;
        for event in store
            .read(query, ReadOptions::forwards())
            .map_err(|e| e.to_string())?
        {
            let event = event.map_err(|e| e.to_string())?;
            n += event.data().len().min(1) as u64;
        }
        latency.record(t.elapsed().as_nanos() as u64).ok();
        if n != per_tag {
            return Err(format!(
                "a selective read returned {n} events, expected {per_tag}"
            ));
        }
        events_read += n;
    }
    let seconds = started.elapsed().as_secs_f64();
    let us = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    Ok(json!({
        "workload": "read",
        "events": head,
        "event_bytes": 256,
        "durability": "d3",
        "full_scan_events_per_sec": median(scans.clone()),
        "full_scan_runs": scans,
        "selective_tags": args.selective_tags,
        "events_per_selective_read": per_tag,
        "reads_per_sec": args.reads as f64 / seconds,
        "selective_events_per_sec": events_read as f64 / seconds,
        "latency_us": {
            "p50": us(0.5), "p90": us(0.9), "p99": us(0.99), "p999": us(0.999),
            "max": latency.max() as f64 / 1000.0,
        },
    }))
}

pub(crate) fn recover(args: RecoverArgs) -> Result<Value, String> {
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let store_dir = args.dir.join("recover-store");
    build_store(&store_dir, args.events, 100_000)?;
    let options = bench_options(Durability::Synced);
    let timed_open =
        |options: &Options| -> Result<(f64, annals::Stats, annals::OpenReport), String> {
            let started = Instant::now();
            let store = Store::open(&store_dir, options.clone()).map_err(|e| e.to_string())?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            let stats = store.stats();
            let report = store.open_report().clone();
            store.close().map_err(|e| e.to_string())?;
            Ok((ms, stats, report))
        };
    let runs = args.runs.max(1);
    let mut checkpoint_runs = Vec::new();
    let mut stats = None;
    for _ in 0..runs {
        let (ms, opened, report) = timed_open(&options)?;
        if !matches!(report.index, annals::IndexSource::Checkpoint { .. }) {
            return Err(format!(
                "expected to open from the checkpoint: {:?}",
                report.index
            ));
        }
        checkpoint_runs.push(ms);
        stats = Some(opened);
    }
    let stats = stats.ok_or("no run")?;
    std::fs::remove_file(store_dir.join(annals::files::CHECKPOINT)).map_err(|e| e.to_string())?;
    let no_checkpoint = Options {
        checkpoint_on_close: false,
        ..options.clone()
    };
    let mut rebuild_runs = Vec::new();
    for _ in 0..runs {
        let (ms, _, report) = timed_open(&no_checkpoint)?;
        if !matches!(report.index, annals::IndexSource::Rebuilt { .. }) {
            return Err(format!("expected a rebuild: {:?}", report.index));
        }
        rebuild_runs.push(ms);
    }
    // Leave the store with a checkpoint for the next run.
    timed_open(&options)?;
    let checkpoint_ms = median(checkpoint_runs.clone());
    let rebuild_ms = median(rebuild_runs.clone());
    Ok(json!({
        "workload": "recover",
        "events": stats.head,
        "durability": "d3",
        "open_ms": checkpoint_ms,
        "open_ms_runs": checkpoint_runs,
        "open_ms_rebuild": rebuild_ms,
        "open_ms_rebuild_runs": rebuild_runs,
        "rebuild_events_per_sec": stats.head as f64 / (rebuild_ms / 1e3),
        "index_bytes_per_event": stats.index_bytes_per_event,
        "segments": stats.segments,
    }))
}

/// One thread's CPU time so far, in clock ticks: (thread id, name, user, system).
type ThreadTime = (String, String, u64, u64);

/// Each thread's CPU time so far, when ANNALS_BENCH_THREADS asks a benchmark to print it
/// for its timed run (see [`print_thread_times`]).
pub(crate) fn thread_times_if_asked() -> Option<Vec<ThreadTime>> {
    std::env::var_os("ANNALS_BENCH_THREADS").map(|_| thread_times())
}

fn thread_times() -> Vec<ThreadTime> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut times = Vec::new();
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat.split_whitespace().collect();
        if fields.len() > 14 {
            times.push((
                task.file_name().to_string_lossy().into_owned(),
                fields[1].to_string(),
                fields[13].parse().unwrap_or(0),
                fields[14].parse().unwrap_or(0),
            ));
        }
    }
    times
}

/// Prints the CPU each thread spent since `before` (ANNALS_BENCH_THREADS set).
pub(crate) fn print_thread_times(before: &[ThreadTime]) {
    for (id, name, user, system) in thread_times() {
        let (u0, s0) = before
            .iter()
            .find(|(i, ..)| *i == id)
            .map_or((0, 0), |&(_, _, u, s)| (u, s));
        eprintln!(
            "thread {name} user {} system {} (clock ticks during the timed run)",
            user - u0,
            system - s0
        );
    }
}
