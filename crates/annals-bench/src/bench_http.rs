//! `annals-bench http`: a load generator against a running server, over HTTP or gRPC.
//!
//! Each connection sends one request at a time and waits for its answer (like a k6 virtual
//! user); latencies go into per-operation HDR histograms. Without `--url` the benchmark starts
//! `annals serve` itself on `--dir` (a separate process on the same machine), measures the raw
//! fdatasync rate of that directory in the same run, and reads the server's own counters
//! (fsyncs, groups) from /metrics before and after.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::grpc_client::GrpcClient;
use crate::http1::Http1;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Debug)]
pub enum Workload {
    /// Appends of one event, no condition.
    Append,
    /// Appends of one event with a condition on a tag of its own (checked, never failing).
    Conditional,
    /// Selective reads: the events of one tag among 10,000 (about ten each).
    Read,
    /// Half reads, a quarter appends, a quarter conditional appends (the mix of the k6 load
    /// an earlier event store on PostgreSQL was measured with, so the two compare).
    Mixed,
    /// Limit orders placed on the hosted exchange (HTTP only; the benchmark's own server runs
    /// `--exchange d3-pipelined` with one symbol): 2,000 accounts, prices within ten ticks of
    /// one another, so that about a fifth of the orders trade and the book stays shallow.
    Orders,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Debug)]
pub enum Protocol {
    Http,
    Grpc,
}

#[derive(clap::Args)]
pub struct HttpArgs {
    /// A running server's HTTP address (http://host:port). Without it, a server is started on
    /// --dir for the run.
    #[arg(long)]
    url: Option<String>,
    /// A running server's gRPC address, for --protocol grpc with --url.
    #[arg(long)]
    grpc_url: Option<String>,
    /// Where the benchmark's own server keeps its data (emptied first).
    #[arg(long, default_value = "/tmp/annals-bench-http")]
    dir: PathBuf,
    /// Durability class of the benchmark's own server.
    #[arg(long, default_value = "d3")]
    durability: String,
    #[arg(long, value_enum, default_value = "conditional")]
    workload: Workload,
    #[arg(long, value_enum, default_value = "http")]
    protocol: Protocol,
    /// Concurrent connections, each with one request in flight.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// gRPC only: concurrent streams per HTTP/2 connection (HTTP/1.1 cannot multiplex); the
    /// concurrency is connections x streams.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Measured seconds per run (after one second of warm-up).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Runs; the figures are the median run's (by requests per second).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Bytes of data per appended event.
    #[arg(long, default_value_t = 256)]
    event_bytes: usize,
    /// Events loaded before a read or mixed workload (tags account:0..10000).
    #[arg(long, default_value_t = 100_000)]
    preload: u64,
    /// API key to send (Authorization: Bearer).
    #[arg(long)]
    api_key: Option<String>,
    /// Events hold a JSON object of ten fields (the `schema` benchmark's) instead of one byte
    /// repeated.
    #[arg(skip)]
    record: bool,
}

const READ_TAGS: u64 = 10_000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Append,
    Conditional,
    Read,
    Order,
}

const OPS: [Op; 4] = [Op::Append, Op::Conditional, Op::Read, Op::Order];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Append => "append",
            Op::Conditional => "conditional_append",
            Op::Read => "read",
            Op::Order => "place_order",
        }
    }
}

/// How a request was answered.
#[derive(PartialEq, Eq)]
enum Answer {
    Ok,
    /// The append's condition failed: a correct answer, counted apart.
    Conflict,
    Failed(String),
}

/// One connection's tallies.
struct Tally {
    latency_us: [Histogram<u64>; OPS.len()],
    errors: [u64; OPS.len()],
    conflicts: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Self {
        let h = || Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
        Tally {
            latency_us: [h(), h(), h(), h()],
            errors: [0; OPS.len()],
            conflicts: 0,
            first_error: None,
        }
    }

    fn merge(&mut self, other: &Tally) {
        for i in 0..OPS.len() {
            let _ = self.latency_us[i].add(&other.latency_us[i]);
            self.errors[i] += other.errors[i];
        }
        self.conflicts += other.conflicts;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }

    /// Counts one answer (after the warm-up): its latency, or its error. `Err` means the
    /// connection broke; returns false then, so the connection stops.
    fn settle(
        &mut self,
        op: Op,
        started: Instant,
        warmup_until: Instant,
        answer: Result<Answer, String>,
    ) -> bool {
        let took = started.elapsed();
        let counted = started >= warmup_until;
        match answer {
            Ok(Answer::Failed(message)) if counted => self.error(op, message),
            Ok(Answer::Failed(_)) => {}
            Ok(ok) => {
                if counted {
                    if ok == Answer::Conflict {
                        self.conflicts += 1;
                    }
                    let _ = self.latency_us[op as usize].record(took.as_micros().max(1) as u64);
                }
            }
            Err(e) => {
                if counted {
                    self.error(op, e);
                }
                return false;
            }
        }
        true
    }

    fn error(&mut self, op: Op, message: String) {
        self.errors[op as usize] += 1;
        if self.first_error.is_none() {
            self.first_error = Some(message);
        }
    }
}

/// A caller's random seed: distinct per caller, never zero.
fn seed_of(caller: usize) -> u64 {
    (caller as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// A cheap per-connection random number (xorshift64).
fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// The operation a connection does next.
fn pick(workload: Workload, n: u64) -> Op {
    match workload {
        Workload::Append => Op::Append,
        Workload::Conditional => Op::Conditional,
        Workload::Read => Op::Read,
        Workload::Orders => Op::Order,
        Workload::Mixed => match n % 4 {
            0 | 2 => Op::Read,
            1 => Op::Append,
            _ => Op::Conditional,
        },
    }
}

/// A server started for the benchmark: stopped on drop.
pub(crate) struct OwnServer {
    pub(crate) child: Child,
    pub(crate) http: SocketAddr,
    pub(crate) grpc: SocketAddr,
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        // SAFETY: signals our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

pub(crate) fn start_server(
    dir: &std::path::Path,
    durability: &str,
    extra: &[&str],
) -> Result<OwnServer, String> {
    start_server_on(dir.as_os_str(), durability, extra)
}

/// [`start_server`] on a store location: a directory or a PostgreSQL URL.
pub(crate) fn start_server_on(
    store: &std::ffi::OsStr,
    durability: &str,
    extra: &[&str],
) -> Result<OwnServer, String> {
    start_server_with(store, durability, extra, &[])
}

/// [`start_server_on`] with the variables `env` set for the server.
pub(crate) fn start_server_with(
    store: &std::ffi::OsStr,
    durability: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<OwnServer, String> {
    use std::io::BufRead;
    let exe = crate::bench::server_binary()?;
    let mut child = Command::new(exe)
        .arg("serve")
        .arg("--store")
        .arg(store)
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(["--durability", durability])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = std::io::BufReader::new(stdout).lines();
    let mut http = None;
    let mut grpc = None;
    for line in lines.by_ref() {
        let line = line.map_err(|e| e.to_string())?;
        if let Some(rest) = line.strip_prefix("annals: listening ") {
            for part in rest.split_whitespace() {
                if let Some(a) = part.strip_prefix("http=") {
                    http = a.parse().ok();
                }
                if let Some(a) = part.strip_prefix("grpc=") {
                    grpc = a.parse().ok();
                }
            }
            break;
        }
    }
    // Keep draining the server's output so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    match (http, grpc) {
        (Some(http), Some(grpc)) => Ok(OwnServer { child, http, grpc }),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            Err("the server did not report its addresses".into())
        }
    }
}

fn host_port(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or("only http:// URLs are supported by the load generator")?;
    let host = rest.split('/').next().unwrap_or(rest);
    use std::net::ToSocketAddrs;
    host.to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url}: no address"))
}

struct Target {
    /// Makes this run's condition keys differ from any earlier run's on the same server.
    run_id: u64,
    http: SocketAddr,
    grpc: Option<SocketAddr>,
    api_key: Option<String>,
    /// The benchmark's own server process, whose CPU it reads.
    server_pid: Option<u32>,
}

fn event_json(tags: &[String], data: &str) -> String {
    let tags: Vec<String> = tags.iter().map(|t| format!("\"{t}\"")).collect();
    format!(
        r#"{{"type":"BenchEvent","tags":[{}],"data":"{data}"}}"#,
        tags.join(",")
    )
}

fn body_for(op: Op, run_id: u64, conn: usize, n: u64, data: &str, rnd: u64) -> (String, String) {
    let rng_tag = rnd % READ_TAGS;
    match op {
        Op::Append => (
            "/v1/append".into(),
            format!(
                r#"{{"events":[{}]}}"#,
                event_json(&[format!("account:{rng_tag}")], data)
            ),
        ),
        Op::Conditional => {
            let key = format!("key:{run_id}-{conn}-{n}");
            (
                "/v1/append".into(),
                format!(
                    r#"{{"events":[{}],"condition":{{"failIfEventsMatch":{{"items":[{{"tags":["{key}"]}}]}}}}}}"#,
                    event_json(&[key.clone(), format!("account:{rng_tag}")], data)
                ),
            )
        }
        Op::Order => {
            // Buyers bid a little above sellers' offers about a fifth of the time.
            let buy = rnd.is_multiple_of(2);
            let offset = (rnd / 2) % 10;
            let price = if buy { 996 + offset } else { 1_004 - offset };
            (
                "/v1/exchange/orders".into(),
                format!(
                    r#"{{"account":{},"symbol":0,"side":"{}","price":{price},"qty":{}}}"#,
                    (rnd / 20) % 2_000,
                    if buy { "buy" } else { "sell" },
                    1 + (rnd / 40_000) % 5,
                ),
            )
        }
        Op::Read => {
            let query = format!(
                "%7B%22items%22%3A%5B%7B%22tags%22%3A%5B%22account%3A{rng_tag}%22%5D%7D%5D%7D"
            );
            (format!("/v1/read?query={query}"), String::new())
        }
    }
}

async fn http_connection(
    target: Arc<Target>,
    workload: Workload,
    conn: usize,
    data: Arc<String>,
    warmup_until: Instant,
    until: Instant,
) -> Tally {
    let mut tally = Tally::new();
    let mut client = match Http1::connect(target.http).await {
        Ok(client) => client,
        Err(e) => {
            tally.error(Op::Append, e);
            return tally;
        }
    };
    let authorization = target.api_key.as_ref().map(|k| format!("Bearer {k}"));
    let mut n = 0u64;
    let mut seed = seed_of(conn);
    loop {
        let now = Instant::now();
        if now >= until {
            break;
        }
        let rnd = xorshift(&mut seed);
        let op = pick(workload, n + conn as u64);
        let (path, body) = body_for(op, target.run_id, conn, n, &data, rnd);
        n += 1;
        let method = if op == Op::Read { "GET" } else { "POST" };
        let started = Instant::now();
        let outcome = client
            .round_trip(method, &path, authorization.as_deref(), body.as_bytes())
            .await;
        let answer = outcome.map(|(status, body)| {
            if !(200..300).contains(&status) {
                Answer::Failed(format!("{status}: {}", String::from_utf8_lossy(body)))
            } else if op != Op::Read && contains(body, b"\"appendConditionFailed\":true") {
                Answer::Conflict
            } else {
                Answer::Ok
            }
        });
        if !tally.settle(op, started, warmup_until, answer) {
            break;
        }
    }
    tally
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// gRPC over one HTTP/2 connection (`grpc_client.rs`): `streams` callers share it, each with
/// one call in flight, like one HTTP connection each, all driven by this one task.
#[allow(clippy::too_many_arguments)]
async fn grpc_connection(
    target: Arc<Target>,
    workload: Workload,
    conn: usize,
    streams: usize,
    data: Arc<String>,
    warmup_until: Instant,
    until: Instant,
) -> Tally {
    let mut tally = Tally::new();
    let Some(addr) = target.grpc else {
        tally.error(Op::Append, "no gRPC address".into());
        return tally;
    };
    let authorization = target.authorization();
    let paths = ["/umadb.v1.DCB/Append", "/umadb.v1.DCB/Read"];
    let mut client = match GrpcClient::connect(addr, authorization.as_deref(), &paths).await {
        Ok(client) => client,
        Err(e) => {
            tally.error(Op::Append, e);
            return tally;
        }
    };
    let streams = streams.max(1);
    let mut callers: Vec<GrpcCaller> = (0..streams)
        .map(|s| GrpcCaller::new(conn * streams + s))
        .collect();
    for (tag, caller) in callers.iter_mut().enumerate() {
        if let Err(e) = caller.call(&mut client, &target, workload, &data, tag) {
            tally.error(caller.op, e);
            return tally;
        }
    }
    let mut done = Vec::new();
    while client.pending() > 0 {
        let round = match client.flush().await {
            Ok(()) => client.answers(&mut done).await,
            Err(e) => Err(e),
        };
        if let Err(e) = round {
            if Instant::now() >= warmup_until {
                tally.error(Op::Append, e);
            }
            break;
        }
        for (tag, (code, message)) in done.drain(..) {
            let caller = &mut callers[tag];
            let answer = match code {
                0 => Answer::Ok,
                // FAILED_PRECONDITION: a failed condition, a correct answer.
                9 => Answer::Conflict,
                _ => Answer::Failed(format!("grpc status {code}: {message}")),
            };
            tally.settle(caller.op, caller.started, warmup_until, Ok(answer));
            if Instant::now() >= until {
                continue;
            }
            if let Err(e) = caller.call(&mut client, &target, workload, &data, tag) {
                tally.error(caller.op, e);
                return tally;
            }
        }
    }
    tally
}

/// One of a gRPC connection's callers: one call at a time, each the next of its workload.
struct GrpcCaller {
    id: usize,
    n: u64,
    seed: u64,
    /// The call in flight: what it is and when it started.
    op: Op,
    started: Instant,
}

impl GrpcCaller {
    fn new(id: usize) -> Self {
        GrpcCaller {
            id,
            n: 0,
            seed: seed_of(id),
            op: Op::Append,
            started: Instant::now(),
        }
    }

    /// Starts this caller's next call on `client`, answered with `tag`.
    fn call(
        &mut self,
        client: &mut GrpcClient,
        target: &Target,
        workload: Workload,
        data: &str,
        tag: usize,
    ) -> Result<(), String> {
        use umadb_proto::v1;
        let op = pick(workload, self.n + self.id as u64);
        let tag_text = format!("account:{}", xorshift(&mut self.seed) % READ_TAGS);
        self.op = op;
        self.started = Instant::now();
        let result = match op {
            Op::Append | Op::Conditional => {
                let mut tags = vec![tag_text];
                let mut condition = None;
                if op == Op::Conditional {
                    let key = format!("key:{}-{}-{}", target.run_id, self.id, self.n);
                    tags.insert(0, key.clone());
                    condition = Some(v1::AppendCondition {
                        fail_if_events_match: Some(v1::Query {
                            items: vec![v1::QueryItem {
                                types: Vec::new(),
                                tags: vec![key],
                            }],
                        }),
                        after: None,
                    });
                }
                let request = v1::AppendRequest {
                    events: vec![v1::Event {
                        event_type: "BenchEvent".into(),
                        tags,
                        data: data.as_bytes().to_vec(),
                        uuid: String::new(),
                        metadata: Vec::new(),
                    }],
                    condition,
                    tracking_info: None,
                };
                client.start(0, &request, tag)
            }
            Op::Order => Err("the orders workload is HTTP only".into()),
            Op::Read => {
                let request = v1::ReadRequest {
                    query: Some(v1::Query {
                        items: vec![v1::QueryItem {
                            types: Vec::new(),
                            tags: vec![tag_text],
                        }],
                    }),
                    ..Default::default()
                };
                client.start(1, &request, tag)
            }
        };
        self.n += 1;
        result
    }
}

impl Target {
    /// The Authorization header's value for the benchmark's own requests, if a key is given.
    fn authorization(&self) -> Option<String> {
        self.api_key.as_ref().map(|k| format!("Bearer {k}"))
    }
}

/// Loads `events` events over HTTP in appends of 1,000, tags account:0..10000.
async fn preload(target: &Target, events: u64, data: &str) -> Result<(), String> {
    let mut client = Http1::connect(target.http).await?;
    let authorization = target.authorization();
    let mut i = 0;
    while i < events {
        let batch: Vec<String> = (i..(i + 1000).min(events))
            .map(|j| event_json(&[format!("account:{}", j % READ_TAGS)], data))
            .collect();
        i += batch.len() as u64;
        let body = format!(r#"{{"events":[{}]}}"#, batch.join(","));
        let (status, _) = client
            .round_trip(
                "POST",
                "/v1/append",
                authorization.as_deref(),
                body.as_bytes(),
            )
            .await?;
        if !(200..300).contains(&status) {
            return Err(format!("preload failed: {status}"));
        }
    }
    Ok(())
}

/// Adds symbol 0 (tick 1, lot 1) to the benchmark's own exchange.
async fn add_symbol(target: &Target) -> Result<(), String> {
    let mut client = Http1::connect(target.http).await?;
    let body = br#"{"tick":1,"lot":1}"#;
    let path = "/v1/admin/exchange/symbols";
    let authorization = target.authorization();
    let (status, _) = client
        .round_trip("POST", path, authorization.as_deref(), body)
        .await?;
    if !(200..300).contains(&status) {
        return Err(format!("adding a symbol failed: {status}"));
    }
    Ok(())
}

/// The server's (fsyncs, appends) from its statistics (`/v1/admin/stats`; None when they
/// cannot be read, e.g. without the admin scope).
async fn server_counters(target: &Target) -> Option<(f64, f64)> {
    let mut client = Http1::connect(target.http).await.ok()?;
    let authorization = target.authorization();
    let (status, body) = client
        .round_trip("GET", "/v1/admin/stats", authorization.as_deref(), b"")
        .await
        .ok()?;
    if !(200..300).contains(&status) {
        return None;
    }
    let stats: Value = serde_json::from_slice(body).ok()?;
    Some((stats["fsyncs"].as_f64()?, stats["appends"].as_f64()?))
}

struct RunOutcome {
    tally: Tally,
    seconds: f64,
    fsyncs: Option<f64>,
    appends: Option<f64>,
    /// CPU microseconds the client and the server used during the measured seconds.
    client_cpu_us: u64,
    server_cpu_us: Option<u64>,
}

async fn one_run(args: &HttpArgs, target: Arc<Target>, data: Arc<String>) -> RunOutcome {
    let before = server_counters(&target).await;
    let start = Instant::now();
    let warmup_until = start + Duration::from_secs(1);
    let until = warmup_until + Duration::from_secs_f64(args.seconds);
    // The CPU both sides use during the measured seconds (the server's only if it is ours).
    let server_pid = target.server_pid;
    let cpu = tokio::spawn(async move {
        let read = || {
            (
                crate::bench::process_cpu_us(),
                server_pid.and_then(crate::bench::process_cpu_us_of),
            )
        };
        tokio::time::sleep_until(warmup_until.into()).await;
        let (client, server) = read();
        tokio::time::sleep_until(until.into()).await;
        let (client_after, server_after) = read();
        (
            client_after.saturating_sub(client),
            server.zip(server_after).map(|(b, a)| a.saturating_sub(b)),
        )
    });
    let mut tasks = Vec::new();
    for conn in 0..args.connections {
        let target = target.clone();
        let data = data.clone();
        let workload = args.workload;
        tasks.push(match args.protocol {
            Protocol::Http => tokio::spawn(http_connection(
                target,
                workload,
                conn,
                data,
                warmup_until,
                until,
            )),
            Protocol::Grpc => tokio::spawn(grpc_connection(
                target,
                workload,
                conn,
                args.streams,
                data,
                warmup_until,
                until,
            )),
        });
    }
    let mut tally = Tally::new();
    for task in tasks {
        match task.await {
            Ok(t) => tally.merge(&t),
            // A connection's task that panicked is an error of the benchmark, not silence.
            Err(e) => tally.error(Op::Append, format!("a connection's task failed: {e}")),
        }
    }
    let seconds = args.seconds;
    let (client_cpu_us, server_cpu_us) = cpu.await.unwrap_or((0, None));
    let after = server_counters(&target).await;
    let (fsyncs, appends) = match (before, after) {
        (Some(b), Some(a)) => (Some(a.0 - b.0), Some(a.1 - b.1)),
        _ => (None, None),
    };
    RunOutcome {
        tally,
        seconds,
        fsyncs,
        appends,
        client_cpu_us,
        server_cpu_us,
    }
}

fn ms(us: u64) -> f64 {
    (us as f64 / 1000.0 * 1000.0).round() / 1000.0
}

pub fn run(args: HttpArgs) -> Result<Value, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut own = None;
    let mut fsync_floor = None;
    // Distinct for two loads started in the same microsecond by one process (the two-server
    // figure starts two at once): shared keys would make half their appends fail their
    // conditions, answered without a commit, and counted.
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let started = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 64;
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
        .wrapping_mul(64)
        .wrapping_add(started);
    let target = match &args.url {
        Some(url) => Target {
            run_id,
            http: host_port(url)?,
            grpc: args.grpc_url.as_deref().map(host_port).transpose()?,
            api_key: args.api_key.clone(),
            server_pid: None,
        },
        None => {
            if args.dir.exists() {
                std::fs::remove_dir_all(&args.dir)
                    .map_err(|e| format!("{}: {e}", args.dir.display()))?;
            }
            std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
            fsync_floor = Some(crate::bench::fsync_floor(
                &args.dir,
                true,
                Duration::from_secs(2),
            )?);
            let exchange: &[&str] = if args.workload == Workload::Orders {
                &["--exchange", "d3-pipelined"]
            } else {
                &[]
            };
            let server = start_server(&args.dir.join("data"), &args.durability, exchange)?;
            let target = Target {
                run_id,
                http: server.http,
                grpc: Some(server.grpc),
                api_key: args.api_key.clone(),
                server_pid: Some(server.child.id()),
            };
            own = Some(server);
            target
        }
    };
    let target = Arc::new(target);
    let data = Arc::new(match args.record {
        // Written inside a JSON string: its quotes escaped.
        true => {
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
            let record = crate::bench::record_data(&mut rng, args.event_bytes);
            String::from_utf8_lossy(&record).replace('"', "\\\"")
        }
        false => "x".repeat(args.event_bytes),
    });
    if matches!(args.workload, Workload::Read | Workload::Mixed) && args.preload > 0 {
        runtime.block_on(preload(&target, args.preload, &data))?;
    }
    if args.workload == Workload::Orders {
        if args.protocol == Protocol::Grpc {
            return Err("the orders workload is HTTP only".into());
        }
        if own.is_some() {
            runtime.block_on(add_symbol(&target))?;
        }
    }
    let mut outcomes = Vec::new();
    for run in 0..args.runs.max(1) {
        // Each run claims condition keys of its own, so no run meets another's events.
        let target = Arc::new(Target {
            run_id: target.run_id.wrapping_mul(100).wrapping_add(run as u64),
            http: target.http,
            grpc: target.grpc,
            api_key: target.api_key.clone(),
            server_pid: target.server_pid,
        });
        outcomes.push(runtime.block_on(one_run(&args, target, data.clone())));
    }
    let rate = |o: &RunOutcome| -> f64 {
        OPS.iter()
            .map(|&op| o.tally.latency_us[op as usize].len() as f64)
            .sum::<f64>()
            / o.seconds
    };
    let rates: Vec<f64> = outcomes.iter().map(rate).collect();
    outcomes.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    let median = &outcomes[outcomes.len() / 2];
    let mut operations = serde_json::Map::new();
    let mut errors = 0;
    for op in OPS {
        let h = &median.tally.latency_us[op as usize];
        let e = median.tally.errors[op as usize];
        errors += e;
        if h.is_empty() && e == 0 {
            continue;
        }
        operations.insert(
            op.name().into(),
            json!({
                "requests": h.len(),
                "requests_per_sec": (h.len() as f64 / median.seconds).round(),
                "errors": e,
                "latency_ms": {
                    "p50": ms(h.value_at_quantile(0.50)),
                    "p90": ms(h.value_at_quantile(0.90)),
                    "p99": ms(h.value_at_quantile(0.99)),
                    "p999": ms(h.value_at_quantile(0.999)),
                    "max": ms(h.max()),
                },
            }),
        );
    }
    let total = rate(median);
    let requests = total * median.seconds;
    let per_request = |us: u64| ((us as f64 / requests.max(1.0)) * 10.0).round() / 10.0;
    let result = json!({
        "bench": "http",
        "protocol": match args.protocol { Protocol::Http => "http", Protocol::Grpc => "grpc" },
        "workload": format!("{:?}", args.workload).to_lowercase(),
        "durability": if args.url.is_some() { "as configured on the server".to_string() } else { args.durability.to_lowercase() },
        "connections": args.connections,
        "streams_per_connection": if args.protocol == Protocol::Grpc { args.streams.max(1) } else { 1 },
        "concurrency": args.connections * if args.protocol == Protocol::Grpc { args.streams.max(1) } else { 1 },
        "event_bytes": args.event_bytes,
        "seconds": median.seconds,
        "runs": args.runs.max(1),
        "requests_per_sec": total.round(),
        "requests_per_sec_runs": rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "errors": errors,
        "first_error": median.tally.first_error,
        "conflicts": median.tally.conflicts,
        "operations": operations,
        "server_fsyncs": median.fsyncs,
        "appends_per_fsync": match (median.appends, median.fsyncs) {
            (Some(a), Some(f)) if f > 0.0 => Some(((a / f) * 10.0).round() / 10.0),
            _ => None,
        },
        "client_cpu_us_per_request": per_request(median.client_cpu_us),
        "server_cpu_us_per_request": median.server_cpu_us.map(per_request),
        "cpu_cores_busy": ((median.client_cpu_us + median.server_cpu_us.unwrap_or(0)) as f64
            / 1e6 / median.seconds * 100.0).round() / 100.0,
        "fsync_floor_per_sec": fsync_floor.map(|f| f.round()),
        "ratio_to_fsync_floor": fsync_floor.map(|f| ((total / f) * 100.0).round() / 100.0),
    });
    drop(own);
    Ok(result)
}

/// One HTTP load run against a running server (for benchmarks that start their own servers):
/// `workload` over `connections` keep-alive connections, `runs` runs of `seconds`, with
/// `preload` events loaded first for reads.
pub(crate) fn run_against(
    http: SocketAddr,
    workload: Workload,
    connections: usize,
    seconds: f64,
    runs: usize,
    preload: u64,
) -> Result<Value, String> {
    run(HttpArgs {
        url: Some(format!("http://{http}")),
        grpc_url: None,
        dir: PathBuf::new(),
        durability: "as configured on the server".into(),
        workload,
        protocol: Protocol::Http,
        connections,
        streams: 1,
        seconds,
        runs,
        event_bytes: 256,
        preload,
        api_key: None,
        record: false,
    })
}

/// The `schema` and `traces` benchmarks' HTTP load: 64 connections of conditional appends of
/// one event of 1 KiB of JSON (ten fields), one run of `seconds`, against a running server.
pub(crate) fn run_conditional_load(http: SocketAddr, seconds: f64) -> Result<Value, String> {
    run(HttpArgs {
        url: Some(format!("http://{http}")),
        grpc_url: None,
        dir: PathBuf::new(),
        durability: "as configured on the server".into(),
        workload: Workload::Conditional,
        protocol: Protocol::Http,
        connections: 64,
        streams: 1,
        seconds,
        runs: 1,
        event_bytes: 1024,
        preload: 0,
        api_key: None,
        record: true,
    })
}
