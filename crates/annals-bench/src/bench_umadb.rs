//! `annals-bench umadb`: the clients UmaDB's users have, against Annals and against UmaDB's own
//! server, in the same run. UmaDB's Rust client (`umadb-client`), as its users write it: one
//! client (one channel, one HTTP/2 connection) shared by N async tasks, each appending with a
//! condition on its own stream (checked, never failing). Runs alternate between the two
//! servers, each on a fresh store in the same directory, and the raw fdatasync rate of that
//! directory is measured before and after. Every figure is D3 (both servers sync before they
//! acknowledge). A third server, in this process, answers every append at once without a store
//! (tonic's own server): the round trip the client costs before any server works, and with
//! the fdatasync floor the fastest a single writer could go against any server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use umadb_client::AsyncUmaDbClient;
use umadb_dcb::{DcbAppendCondition, DcbEvent, DcbEventStoreAsync, DcbQuery, DcbQueryItem};

#[derive(clap::Args, Clone)]
pub struct UmadbArgs {
    /// Tasks appending at once, all through one client (one channel).
    #[arg(long, default_value_t = 64)]
    writers: usize,
    /// Events per append.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Measured seconds per run (after one second of warm-up).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 256)]
    event_bytes: usize,
    #[arg(long, default_value_t = 2)]
    tags: usize,
    /// Runs per server, alternated; figures are the median run's.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Directory for both servers' stores (emptied before each run) and the fsync floor.
    #[arg(long, default_value = "/tmp/annals-bench-umadb")]
    dir: PathBuf,
    /// UmaDB's server binary (scripts/setup builds it into its tools directory, ANNALS_UMADB_BIN); without
    /// it, only Annals is measured.
    #[arg(long, env = "ANNALS_UMADB_BIN")]
    umadb_bin: Option<PathBuf>,
    /// Threads of the client's async runtime; default: one fewer than the cores (at least
    /// one), as the server's.
    #[arg(long)]
    runtime_threads: Option<usize>,
    /// Drive an Annals server already running at this gRPC URL (to profile it) instead of
    /// starting one; UmaDB's server is then not measured.
    #[arg(long)]
    url: Option<String>,
    /// Serve Annals from PostgreSQL: a throwaway cluster with PostgreSQL's defaults (fsync
    /// on, synchronous_commit on), a fresh database per run, and the database's commit floor
    /// (one connection inserting one row per transaction) measured before and after. UmaDB's
    /// server keeps its files.
    #[arg(long)]
    postgres: bool,
    /// Serve Annals with every append D4: acknowledged once in a backup in object storage (a
    /// throwaway SeaweedFS on this machine, its sequential put floor measured before and
    /// after). UmaDB's server stays D3.
    #[arg(long)]
    off_machine: bool,
    /// The object store's URL prefix for --off-machine (set by the run).
    #[arg(skip)]
    backup_url: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum Peer {
    Annals,
    Umadb,
    /// A gRPC server that answers every append at once, without a store (tonic's own server,
    /// on a thread of this process): the round trip UmaDB's client costs before any server
    /// does any work. A single writer cannot go faster than this round trip plus an fdatasync.
    Null,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Annals => "annals",
            Peer::Umadb => "umadb",
            Peer::Null => "null_server",
        }
    }
}

/// UmaDB's server process; killed on drop.
struct UmadbProcess {
    child: Child,
    url: String,
}

impl Drop for UmadbProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server a run drives: one this benchmark started on a fresh store, or one running
/// already (`--url`).
enum Server {
    Annals(crate::bench_http::OwnServer),
    Umadb(UmadbProcess),
    Null(NullServer),
    Given(String),
}

impl Server {
    fn url(&self) -> String {
        match self {
            Server::Annals(s) => format!("http://{}", s.grpc),
            Server::Umadb(u) => u.url.clone(),
            Server::Null(n) => n.url.clone(),
            Server::Given(url) => url.clone(),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Server::Annals(s) => Some(s.child.id()),
            Server::Umadb(u) => Some(u.child.id()),
            Server::Null(_) | Server::Given(_) => None,
        }
    }

    /// Annals' fsync count from its statistics (blocking HTTP/1.1 GET of
    /// `/v1/admin/stats`; None for the others).
    fn fsyncs(&self) -> Option<f64> {
        use std::io::{Read, Write};
        let Server::Annals(s) = self else {
            return None;
        };
        let mut stream = std::net::TcpStream::connect(s.http).ok()?;
        write!(
            stream,
            "GET /v1/admin/stats HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n",
            s.http
        )
        .ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).ok()?;
        let at = answer.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let stats: Value = serde_json::from_slice(&answer[at..]).ok()?;
        stats["fsyncs"].as_f64()
    }
}

/// Starts `peer` on a fresh store in `dir`.
fn start(
    peer: Peer,
    args: &UmadbArgs,
    dir: &Path,
    database: Option<&str>,
) -> Result<Server, String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    match peer {
        Peer::Annals => {
            let store = database.map_or(dir.as_os_str(), std::ffi::OsStr::new);
            let run = dir.file_name().and_then(|n| n.to_str()).unwrap_or("run");
            let (durability, extra) = match &args.backup_url {
                Some(url) => ("d4", vec!["--backup".to_string(), format!("{url}/{run}")]),
                None => ("d3", Vec::new()),
            };
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            Ok(Server::Annals(crate::bench_http::start_server_on(
                store, durability, &extra,
            )?))
        }
        Peer::Umadb => {
            let binary = args.umadb_bin.as_ref().ok_or("no UmaDB binary")?;
            let port = annals_testkit::free_port();
            let child = Command::new(binary)
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--db-path")
                .arg(dir.join("uma.db"))
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
            let process = UmadbProcess {
                child,
                url: format!("http://127.0.0.1:{port}"),
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if Instant::now() > deadline {
                    return Err("UmaDB's server did not listen".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(Server::Umadb(process))
        }
        Peer::Null => NullServer::start().map(Server::Null),
    }
}

/// The null server's thread; stopped on drop.
struct NullServer {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NullServer {
    fn start() -> Result<NullServer, String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("null-server".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the null server's runtime");
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("the null server's listener");
                    let incoming = tonic::transport::server::TcpIncoming::from(listener);
                    let service = umadb_proto::v1::dcb_server::DcbServer::new(NullDcb::default());
                    let _ = tonic::transport::Server::builder()
                        .add_service(service)
                        .serve_with_incoming_shutdown(incoming, async {
                            let _ = stopped.await;
                        })
                        .await;
                });
            })
            .map_err(|e| e.to_string())?;
        Ok(NullServer {
            url: format!("http://{address}"),
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for NullServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Answers each append with the next position; nothing else is offered.
#[derive(Default)]
struct NullDcb {
    head: AtomicU64,
}

type NoStream<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl umadb_proto::v1::dcb_server::Dcb for NullDcb {
    type ReadStream = NoStream<umadb_proto::v1::ReadResponse>;
    type SubscribeStream = NoStream<umadb_proto::v1::SubscribeResponse>;

    async fn read(
        &self,
        _: tonic::Request<umadb_proto::v1::ReadRequest>,
    ) -> Result<tonic::Response<Self::ReadStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("the null server only appends"))
    }

    async fn subscribe(
        &self,
        _: tonic::Request<umadb_proto::v1::SubscribeRequest>,
    ) -> Result<tonic::Response<Self::SubscribeStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("the null server only appends"))
    }

    async fn append(
        &self,
        request: tonic::Request<umadb_proto::v1::AppendRequest>,
    ) -> Result<tonic::Response<umadb_proto::v1::AppendResponse>, tonic::Status> {
        let events = request.into_inner().events.len() as u64;
        let position = self.head.fetch_add(events, Ordering::Relaxed) + events;
        Ok(tonic::Response::new(umadb_proto::v1::AppendResponse {
            position,
        }))
    }

    async fn head(
        &self,
        _: tonic::Request<umadb_proto::v1::HeadRequest>,
    ) -> Result<tonic::Response<umadb_proto::v1::HeadResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("the null server only appends"))
    }

    async fn get_tracking_info(
        &self,
        _: tonic::Request<umadb_proto::v1::TrackingRequest>,
    ) -> Result<tonic::Response<umadb_proto::v1::TrackingResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("the null server only appends"))
    }
}

struct Outcome {
    appends: u64,
    failed: u64,
    seconds: f64,
    latency_us: Histogram<u64>,
    server_cpu_us: Option<u64>,
    client_cpu_us: u64,
    fsyncs: Option<f64>,
    first_error: Option<String>,
}

fn one_run(
    peer: Peer,
    args: &UmadbArgs,
    run: usize,
    postgres: Option<&Postgres>,
) -> Result<Outcome, String> {
    let dir = args.dir.join(format!("{}-{run}", peer.name()));
    let database = match postgres {
        Some(pg) if peer == Peer::Annals => Some(pg.fresh_database(run)),
        _ => None,
    };
    let server = match &args.url {
        Some(url) => Server::Given(url.clone()),
        None => start(peer, args, &dir, database.as_deref())?,
    };
    let pid = server.pid();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(crate::bench::runtime_threads(args.runtime_threads))
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = runtime
        .block_on(AsyncUmaDbClient::connect(server.url(), None, None, None))
        .map_err(|e| format!("{}: connect: {e}", peer.name()))?;
    let client = Arc::new(client);
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let appends = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let histogram = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?,
    ));
    let data = vec![b'x'; args.event_bytes];
    let mut tasks = Vec::new();
    for writer in 0..args.writers {
        let client = client.clone();
        let (measuring, stop) = (measuring.clone(), stop.clone());
        let (appends, failed) = (appends.clone(), failed.clone());
        let (first_error, histogram) = (first_error.clone(), histogram.clone());
        let data = data.clone();
        let (batch, tag_count) = (args.batch, args.tags);
        tasks.push(runtime.spawn(async move {
            let stream = format!("stream:{run}:{writer}");
            let mut tags = vec![stream.clone()];
            tags.extend((1..tag_count).map(|t| format!("kind:{t}")));
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut last: Option<u64> = None;
            while !stop.load(Ordering::Relaxed) {
                let events: Vec<DcbEvent> = (0..batch)
                    .map(|_| DcbEvent {
                        event_type: "Appended".into(),
                        tags: tags.clone(),
                        data: data.clone(),
                        uuid: None,
                        metadata: Vec::new(),
                    })
                    .collect();
                let condition = DcbAppendCondition {
                    fail_if_events_match: DcbQuery {
                        items: vec![DcbQueryItem {
                            types: Vec::new(),
                            tags: vec![stream.clone()],
                        }],
                    },
                    after: last,
                };
                let started = Instant::now();
                let outcome = client.append(events, Some(condition), None).await;
                let measured = measuring.load(Ordering::Relaxed);
                match outcome {
                    Ok(position) => {
                        last = Some(position);
                        if measured {
                            appends.fetch_add(1, Ordering::Relaxed);
                            let _ = local.record(started.elapsed().as_micros().max(1) as u64);
                        }
                    }
                    Err(e) => {
                        if measured {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        first_error.lock().unwrap().get_or_insert(e.to_string());
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            histogram.lock().unwrap().add(&local).unwrap();
        }));
    }
    std::thread::sleep(Duration::from_secs(1));
    let fsyncs_before = server.fsyncs();
    let cpu_before = pid.and_then(crate::bench::process_cpu_us_of);
    let client_cpu_before = crate::bench::process_cpu_us();
    let started = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    measuring.store(false, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = pid.and_then(crate::bench::process_cpu_us_of);
    let client_cpu_us = crate::bench::process_cpu_us().saturating_sub(client_cpu_before);
    let fsyncs_after = server.fsyncs();
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(async {
        for task in tasks {
            let _ = task.await;
        }
    });
    drop(client);
    drop(runtime);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    let latency_us = histogram.lock().unwrap().clone();
    let first_error = first_error.lock().unwrap().clone();
    Ok(Outcome {
        appends: appends.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        seconds,
        latency_us,
        server_cpu_us: cpu_before.zip(cpu_after).map(|(a, b)| b.saturating_sub(a)),
        client_cpu_us,
        // On PostgreSQL the server does not fsync (the database commits): no such figure.
        fsyncs: fsyncs_before
            .zip(fsyncs_after)
            .map(|(a, b)| b - a)
            .filter(|_| database.is_none()),
        first_error,
    })
}

fn summary(args: &UmadbArgs, mut outcomes: Vec<Outcome>) -> Value {
    let rate = |o: &Outcome| o.appends as f64 / o.seconds;
    let runs: Vec<f64> = outcomes.iter().map(|o| rate(o).round()).collect();
    let failed: u64 = outcomes.iter().map(|o| o.failed).sum();
    let first_error = outcomes.iter().find_map(|o| o.first_error.clone());
    outcomes.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    let median = &outcomes[outcomes.len() / 2];
    let h = &median.latency_us;
    json!({
        "appends_per_sec": rate(median).round(),
        "events_per_sec": (rate(median) * args.batch as f64).round(),
        "runs_appends_per_sec": runs,
        "latency_us": {
            "p50": h.value_at_quantile(0.5), "p90": h.value_at_quantile(0.9),
            "p99": h.value_at_quantile(0.99), "p999": h.value_at_quantile(0.999),
            "max": h.max(),
        },
        "failed_calls": failed,
        "first_error": first_error,
        "server_cpu_us_per_append": median.server_cpu_us
            .map(|us| (us as f64 / median.appends.max(1) as f64 * 10.0).round() / 10.0),
        "client_cpu_us_per_append":
            (median.client_cpu_us as f64 / median.appends.max(1) as f64 * 10.0).round() / 10.0,
        "appends_per_fsync": median.fsyncs
            .map(|f| (median.appends as f64 / f.max(1.0) * 10.0).round() / 10.0),
    })
}

/// The throwaway cluster of `--postgres`.
struct Postgres {
    cluster: annals_testkit::Cluster,
}

impl Postgres {
    fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}",
            self.cluster.port()
        )
    }

    /// A new, empty database for run `run`; its URL.
    fn fresh_database(&self, run: usize) -> String {
        let name = format!("annals_umadb_{run}");
        self.cluster
            .sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        self.cluster.sql(&format!("CREATE DATABASE {name}"));
        self.url(&name)
    }

    fn commit_floor(&self) -> Result<f64, String> {
        crate::bench_postgres::floor(&self.url("postgres"), 2.0)
    }
}

pub fn run(mut args: UmadbArgs) -> Result<Value, String> {
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let s3 = match args.off_machine {
        true => {
            let s3 = annals_testkit::s3::S3Server::start()
                .ok_or("SeaweedFS's weed is not installed: run scripts/setup")?;
            // The servers this benchmark starts read the endpoint and key from the
            // environment, as a user's would; this process is single-threaded here.
            for (k, v) in s3.env() {
                std::env::set_var(k, v);
            }
            args.backup_url = Some(s3.url("umadb-d4"));
            Some(s3)
        }
        false => None,
    };
    let put_floor_before = s3
        .as_ref()
        .map(|s3| {
            crate::bench_backup::put_floor(&crate::bench_backup::s3_backup(s3, "floor-1"), 2.0)
        })
        .transpose()?;
    let postgres = if args.postgres {
        let cluster = annals_testkit::Cluster::start()
            .ok_or("PostgreSQL is not installed (run scripts/setup)")?;
        Some(Postgres { cluster })
    } else {
        None
    };
    let commit_floor_before = postgres.as_ref().map(Postgres::commit_floor).transpose()?;
    let floor_before = crate::bench::fsync_floor(&args.dir, true, Duration::from_secs(2))?;
    let mut peers = vec![Peer::Annals];
    if args.umadb_bin.is_some() && args.url.is_none() {
        peers.push(Peer::Umadb);
    }
    if args.url.is_none() {
        peers.push(Peer::Null);
    }
    let mut outcomes: Vec<Vec<Outcome>> = peers.iter().map(|_| Vec::new()).collect();
    for run in 0..args.runs.max(1) {
        // Alternate which server goes first, so that neither always meets a warmer disk.
        let mut order: Vec<usize> = (0..peers.len()).collect();
        if run % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let outcome = one_run(peers[i], &args, run, postgres.as_ref())?;
            eprintln!(
                "run {run} {}: {:.0} appends/s, {} failed",
                peers[i].name(),
                outcome.appends as f64 / outcome.seconds,
                outcome.failed
            );
            outcomes[i].push(outcome);
        }
    }
    let floor_after = crate::bench::fsync_floor(&args.dir, true, Duration::from_secs(2))?;
    let floor = (floor_before + floor_after) / 2.0;
    let commit_floor_after = postgres.as_ref().map(Postgres::commit_floor).transpose()?;
    let mut result = json!({
        "workload": "umadb_client_conditional_append",
        "client": "umadb-client 0.7.8 (Rust): one client, one channel, shared by all writers",
        "writers": args.writers,
        "batch": args.batch,
        "event_bytes": args.event_bytes,
        "tags": args.tags,
        "durability": if args.off_machine { "annals d4 (backup in SeaweedFS on this machine), umadb d3" } else { "d3" },
        "seconds": args.seconds,
        "runs": args.runs,
        "fsync_floor_per_sec": floor.round(),
        "fsync_floor_before_after_per_sec": [floor_before.round(), floor_after.round()],
    });
    let mut medians = Vec::new();
    for (peer, outcomes) in peers.iter().zip(outcomes) {
        let s = summary(&args, outcomes);
        medians.push(s["appends_per_sec"].as_f64().unwrap_or(0.0));
        result[peer.name()] = s;
    }
    let ratio = |x: f64, y: f64| (x / y.max(1.0) * 100.0).round() / 100.0;
    result["annals_to_fsync_floor"] = json!(ratio(medians[0], floor));
    let commit_floor = commit_floor_before
        .zip(commit_floor_after)
        .map(|(before, after)| (before + after) / 2.0);
    if let Some(((before, after), commit)) = commit_floor_before
        .zip(commit_floor_after)
        .zip(commit_floor)
    {
        result["annals_store"] = json!("postgresql (a throwaway cluster with its defaults)");
        result["commit_floor_per_sec"] = json!(commit.round());
        result["commit_floor_before_after_per_sec"] = json!([before.round(), after.round()]);
        result["annals_to_commit_floor"] = json!(ratio(medians[0], commit));
    }
    if let (Some(s3), Some((before, before_latency))) = (&s3, &put_floor_before) {
        let (after, _) =
            crate::bench_backup::put_floor(&crate::bench_backup::s3_backup(s3, "floor-2"), 2.0)?;
        let puts = (before + after) / 2.0;
        result["object_store"] = json!("SeaweedFS 4.48 (weed mini) on this machine");
        result["put_floor_per_sec"] = json!(puts.round());
        result["put_floor_before_after_per_sec"] = json!([before.round(), after.round()]);
        result["put_floor_p99_ms"] = json!(before_latency.value_at_quantile(0.99) as f64 / 1000.0);
        result["annals_to_put_floor"] = json!(ratio(medians[0], puts));
    }
    if let Some(i) = peers.iter().position(|&p| p == Peer::Umadb) {
        result["annals_to_umadb"] = json!(ratio(medians[0], medians[i]));
        result["umadb_to_fsync_floor"] = json!(ratio(medians[i], floor));
    }
    if let Some(i) = peers.iter().position(|&p| p == Peer::Null) {
        // One writer waits for a round trip and then an fdatasync per append: the fastest a
        // server could answer it is the null server's round trip plus the floor's fdatasync.
        let bound = 1.0 / (1.0 / medians[i].max(1.0) + 1.0 / floor.max(1.0));
        result["annals_to_null_server"] = json!(ratio(medians[0], medians[i]));
        if args.writers == 1 && args.batch == 1 {
            result["round_trip_and_fsync_bound_per_sec"] = json!(bound.round());
            result["round_trip_and_fsync_bound_to_fsync_floor"] = json!(ratio(bound, floor));
            result["annals_to_round_trip_and_fsync_bound"] = json!(ratio(medians[0], bound));
            if let Some(commit) = commit_floor {
                // On PostgreSQL the store's round trip is the client's plus a commit.
                let bound = 1.0 / (1.0 / medians[i].max(1.0) + 1.0 / commit.max(1.0));
                result["round_trip_and_commit_bound_per_sec"] = json!(bound.round());
                result["annals_to_round_trip_and_commit_bound"] = json!(ratio(medians[0], bound));
            }
        }
    }
    Ok(result)
}
