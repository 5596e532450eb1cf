//! `annals-bench postgres`: the PostgreSQL backend beside the database's own commit rate,
//! measured in the same run on the same cluster: the floor (one connection inserting one row
//! per transaction in a loop), the row floor (the same with the row and statement of a lone
//! append), one embedded client's conditional appends, 64 writers of
//! 512-event appends, 64 HTTP connections of conditional appends on one server and split over
//! two, the open of a store on the log all that left (filled from the database, and again
//! from a mirror kept across a clean close), and selective reads over HTTP on PostgreSQL
//! beside the same on files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::{AppendCondition, NewEvent, Options, Query, QueryItem, Store};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::bench_http::{run_against, start_server_on, Workload};

#[derive(clap::Args)]
pub struct PostgresArgs {
    /// The database to measure on (a postgres:// URL). Without it, a throwaway cluster is made
    /// with PostgreSQL's defaults (fsync on, synchronous_commit on) in a temporary directory.
    #[arg(long)]
    url: Option<String>,
    /// With the throwaway cluster: connect over its Unix socket, as servers on the database's
    /// machine would, instead of TCP on 127.0.0.1 (the default, what servers on other
    /// machines pay in kind).
    #[arg(long, conflicts_with = "url")]
    socket: bool,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Runs of each figure, alternated with the floor; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where the file backend's server keeps its data for the read comparison (emptied first).
    #[arg(long, default_value = "/tmp/annals-bench-pg-files")]
    dir: PathBuf,
    /// Measure only these figures (comma-separated: one, wide, http, two, separate, open), for
    /// profiling one of them; the floor is always measured. A partial run is not recorded.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The median of latencies in milliseconds, to the microsecond; null when none were measured.
fn figure_ms(values: &[f64]) -> Value {
    if values.is_empty() {
        return Value::Null;
    }
    ((median(values.to_vec()) * 1000.0).round() / 1000.0).into()
}

/// The median of run-by-run ratios of figures measured in alternation (`a[i]` beside
/// `b[i]`), which a machine that slows down during the benchmark leaves alone where a ratio
/// of medians would not. Null without pairs.
fn paired_ratio(a: &[f64], b: &[f64]) -> Value {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
    if ratios.is_empty() {
        Value::Null
    } else {
        round(median(ratios)).into()
    }
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Before a figure is measured: asks the database for a checkpoint, then writes out every
/// dirty page of the machine, so that no figure pays for another's. With its defaults
/// (max_wal_size 1 GB) PostgreSQL checkpoints every 20-30 s under these loads, writing its
/// dirty buffers and syncing its files; and a store's mirror (and the file store) write to
/// the page cache, which the kernel writes back some 30 s later (hundreds of MB after 64
/// writers of 512 events). Either, in the middle of a figure, competes with the fsyncs its
/// commits wait for. A database that refuses the checkpoint (a role without the right, with
/// --url) is measured as it is.
fn settle(url: &str) {
    if let Ok(mut client) = postgres::Client::connect(url, postgres::NoTls) {
        let _ = client.batch_execute("CHECKPOINT");
    }
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// What the load split over two servers made.
struct Split {
    /// Appends per second, both servers together.
    rate: f64,
    /// Appends refused.
    errors: f64,
    /// The latency of the server whose clients waited longer.
    p99_ms: f64,
    max_ms: f64,
}

/// 64 HTTP connections' conditional appends, 32 to each server at once.
fn split_load(url: &str, a: SocketAddr, b: SocketAddr, seconds: f64) -> Result<Split, String> {
    settle(url);
    let (ra, rb) = std::thread::scope(|scope| {
        let x = scope.spawn(move || run_against(a, Workload::Conditional, 32, seconds, 1, 0));
        let y = scope.spawn(move || run_against(b, Workload::Conditional, 32, seconds, 1, 0));
        (x.join().unwrap(), y.join().unwrap())
    });
    let rate = |v: &Result<Value, String>| -> Result<(f64, f64, f64, f64), String> {
        let v = v.as_ref()?;
        // The workload's conditions never fail: a conflict is keys shared by mistake, and
        // conflicts are answered without a commit, so they would inflate the figure.
        let conflicts = v["conflicts"].as_u64().unwrap_or(0);
        if conflicts > 0 {
            return Err(format!(
                "{conflicts} appends of the two-server load failed their conditions, which \
                 never fail: the loads shared keys"
            ));
        }
        let latency = &v["operations"]["conditional_append"]["latency_ms"];
        Ok((
            v["requests_per_sec"].as_f64().unwrap_or(0.0),
            v["errors"].as_f64().unwrap_or(0.0),
            latency["p99"].as_f64().unwrap_or(f64::NAN),
            latency["max"].as_f64().unwrap_or(f64::NAN),
        ))
    };
    let (a, b) = (rate(&ra)?, rate(&rb)?);
    Ok(Split {
        rate: a.0 + b.0,
        errors: a.1 + b.1,
        p99_ms: a.2.max(b.2),
        max_ms: a.3.max(b.3),
    })
}

/// What opening a store on the log took.
struct Opened {
    events: u64,
    appends: u64,
    /// Filled from the database (a mirror in a directory of its own, as `--mirror` keeps it).
    filled_ms: f64,
    /// The clean close that keeps it: checkpoint, sync, record.
    close_ms: f64,
    /// Again, from the mirror as it was closed.
    kept_ms: f64,
}

/// Opens a store on the database's log twice through a kept mirror: filled from the database,
/// then, after a clean close, from the mirror as it was left.
fn open_times(url: &str) -> Result<Opened, String> {
    let dir = std::env::temp_dir().join(format!("annals-bench-kept-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let location = annals::Location::Postgres {
        url: url.to_string(),
        mirror: Some(dir.clone()),
    };
    let ms = |since: Instant| (since.elapsed().as_secs_f64() * 1e4).round() / 10.0;
    let started = Instant::now();
    let store = Store::open_at(&location, Options::default()).map_err(|e| e.to_string())?;
    let filled_ms = ms(started);
    let events = store.head();
    let appends = store
        .open_report()
        .mirror
        .as_ref()
        .map_or(0, |m| m.followed);
    let started = Instant::now();
    store.close().map_err(|e| e.to_string())?;
    let close_ms = ms(started);
    let started = Instant::now();
    let store = Store::open_at(&location, Options::default()).map_err(|e| e.to_string())?;
    let kept_ms = ms(started);
    let resumed = store
        .open_report()
        .mirror
        .as_ref()
        .and_then(|m| m.resumed_at);
    if resumed != Some(events) || store.head() != events {
        return Err(format!(
            "the kept mirror was not used as closed at {events}: {:?}",
            store.open_report().mirror
        ));
    }
    store.close().map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(Opened {
        events,
        appends,
        filled_ms,
        close_ms,
        kept_ms,
    })
}

/// Single-row insert + commit in a loop from one connection: commits per second.
pub(crate) fn floor(url: &str, seconds: f64) -> Result<f64, String> {
    settle(url);
    let mut client = postgres::Client::connect(url, postgres::NoTls).map_err(|e| e.to_string())?;
    client
        .batch_execute(
            "DROP TABLE IF EXISTS annals_bench_floor; CREATE TABLE annals_bench_floor (n bigint)",
        )
        .map_err(|e| e.to_string())?;
    let insert = client
        .prepare("INSERT INTO annals_bench_floor VALUES ($1)")
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut n: i64 = 0;
    while Instant::now() < deadline {
        client.execute(&insert, &[&n]).map_err(|e| e.to_string())?;
        n += 1;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    // A database given with --url keeps nothing of it.
    client
        .batch_execute("DROP TABLE annals_bench_floor")
        .map_err(|e| e.to_string())?;
    Ok(rate)
}

/// The database's own work for a lone append, without the server: the statement a server
/// commits a lone append with (`annals::lone_commit_statement`), on a table made like the
/// store's and made anew, in a loop from one connection, with the row of an append the
/// one-client figure makes (its body and keys, read back from the store), at positions
/// counted up. Commits per second. Between the floor (a row of one number, no index) and the
/// one-client figure, it tells what the database costs per append row from what the server
/// adds.
pub(crate) fn row_floor(url: &str, seconds: f64, store: &Store) -> Result<f64, String> {
    let event = NewEvent::new("Bench", vec![b'x'; 256]).tag("k:f:0:123");
    store.append(&[event], None).map_err(|e| e.to_string())?;
    settle(url);
    let mut client = postgres::Client::connect(url, postgres::NoTls).map_err(|e| e.to_string())?;
    let row = client
        .query_one(
            "SELECT body, keys FROM annals_appends ORDER BY first_position DESC LIMIT 1",
            &[],
        )
        .map_err(|e| e.to_string())?;
    let (body, keys): (Vec<u8>, Option<Vec<i64>>) = (row.get(0), row.get(1));
    client
        .batch_execute(
            "DROP TABLE IF EXISTS annals_bench_rows;
             CREATE TABLE annals_bench_rows (LIKE annals_appends INCLUDING ALL)",
        )
        .map_err(|e| e.to_string())?;
    let insert = client
        .prepare(&annals::lone_commit_statement(
            "annals_bench_rows",
            "annals_bench_rows",
        ))
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let (mut n, server, time): (i64, i64, i64) = (0, 0, 0);
    while Instant::now() < deadline {
        n += 1;
        let inserted = client
            .execute(&insert, &[&n, &n, &time, &body, &server, &keys])
            .map_err(|e| e.to_string())?;
        if inserted != 1 {
            return Err(format!(
                "the row floor's insert at {n} inserted {inserted} rows"
            ));
        }
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    // A database given with --url keeps nothing of it.
    client
        .batch_execute("DROP TABLE annals_bench_rows")
        .map_err(|e| e.to_string())?;
    Ok(rate)
}

/// `writers` threads appending `batch` events at a time, each append conditional on a tag of
/// its own (checked, never failing), for `seconds`: appends per second and the latency.
fn appends(store: &Store, writers: usize, batch: usize, seconds: f64, run: usize) -> (f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let histograms: Vec<Histogram<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                let stop = stop.clone();
                let count = count.clone();
                scope.spawn(move || {
                    let mut h = Histogram::<u64>::new(3).unwrap();
                    let mut n = 0u64;
                    let data = vec![b'x'; 256];
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("k:{run}:{w}:{n}");
                        n += 1;
                        let events: Vec<NewEvent> = (0..batch)
                            .map(|_| NewEvent::new("Bench", data.clone()).tag(key.clone()))
                            .collect();
                        let condition =
                            AppendCondition::new(Query::item(QueryItem::tags([key])), None);
                        let t = Instant::now();
                        if store.append(&events, Some(&condition)).is_ok() {
                            let _ = h.record(t.elapsed().as_micros() as u64);
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    h
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut all = Histogram::<u64>::new(3).unwrap();
    for h in &histograms {
        all.add(h).unwrap();
    }
    (
        count.load(Ordering::Relaxed) as f64 / elapsed,
        all.value_at_quantile(0.99),
    )
}

pub fn run(args: PostgresArgs) -> Result<Value, String> {
    let mut cluster = None;
    // The reads compare stores holding the same events: a database of their own when the
    // benchmark makes the cluster, else the given one (which then holds the appends too).
    let (url, reads_url) = match &args.url {
        Some(url) => (url.clone(), url.clone()),
        None => {
            let made = annals_testkit::Cluster::start()
                .ok_or("PostgreSQL is not installed (run scripts/setup)")?;
            made.sql("CREATE DATABASE annals_reads");
            let urls = (
                made.db_url("postgres", args.socket)?,
                made.db_url("annals_reads", args.socket)?,
            );
            cluster = Some(made);
            urls
        }
    };
    let runs = args.runs.max(1);
    let seconds = args.seconds;
    let connection = match (&args.url, args.socket) {
        (Some(_), _) => "as the given URL says",
        (None, true) => "the cluster's Unix socket",
        (None, false) => "TCP on 127.0.0.1",
    };
    let wants = |figure: &str| args.only.is_empty() || args.only.iter().any(|f| f == figure);
    let store = Store::open_postgres(&url, Options::default()).map_err(|e| e.to_string())?;
    // One client, alternated with the floor.
    let (mut floors, mut one, mut one_p99) = (Vec::new(), Vec::new(), Vec::new());
    let mut row_floors = Vec::new();
    for run in 0..runs {
        floors.push(floor(&url, seconds)?);
        if wants("one") {
            row_floors.push(row_floor(&url, seconds, &store)?);
            settle(&url);
            let (rate, p99) = appends(&store, 1, 1, seconds, run);
            one.push(rate);
            one_p99.push(p99 as f64);
        }
    }
    let floor_rate = median(floors.clone());
    let (mut wide, mut wide_p99) = (Vec::new(), Vec::new());
    for run in 0..runs {
        if wants("wide") {
            settle(&url);
            let (rate, p99) = appends(&store, 64, 512, seconds, 100 + run);
            wide.push(rate * 512.0);
            wide_p99.push(p99 as f64);
        }
    }
    drop(store);
    // 64 HTTP connections on one server, then split over two servers on the same database,
    // alternated run by run; the second server runs only for its runs (an idle one follows the
    // first, which costs CPU).
    // The control, alternated with both when the benchmark made the cluster: the same two
    // servers' load with the second server on a database of its own (fresh each run), so
    // that neither follows the other nor races it. What the two servers on one database lose
    // beyond the control is the cost of sharing the log; the rest is two servers on two cores.
    let (mut one_rates, mut one_p99s, mut one_errors, mut split, mut separate) =
        (Vec::new(), Vec::new(), 0.0, Vec::new(), Vec::new());
    let (mut split_errors, mut separate_errors) = (0.0, 0.0);
    let (mut split_p99, mut split_max) = (Vec::new(), Vec::new());
    let control = cluster.is_some() && wants("separate");
    if wants("http") || wants("two") || control {
        let a = start_server_on(url.as_ref(), "d3", &[])?;
        for _ in 0..runs {
            if wants("http") {
                settle(&url);
                let one = run_against(a.http, Workload::Conditional, 64, seconds, 1, 0)?;
                one_rates.push(one["requests_per_sec"].as_f64().unwrap_or(0.0));
                let p99 = &one["operations"]["conditional_append"]["latency_ms"]["p99"];
                one_p99s.push(p99.as_f64().unwrap_or(f64::NAN));
                one_errors += one["errors"].as_f64().unwrap_or(0.0);
            }
            if wants("two") {
                let b = start_server_on(url.as_ref(), "d3", &[])?;
                let two = split_load(&url, a.http, b.http, seconds)?;
                split.push(two.rate);
                split_errors += two.errors;
                split_p99.push(two.p99_ms);
                split_max.push(two.max_ms);
            }
            if let Some(cluster) = cluster.as_ref().filter(|_| control) {
                cluster.sql("DROP DATABASE IF EXISTS annals_control WITH (FORCE)");
                cluster.sql("CREATE DATABASE annals_control");
                let own = cluster.db_url("annals_control", args.socket)?;
                let b = start_server_on(own.as_ref(), "d3", &[])?;
                let two = split_load(&url, a.http, b.http, seconds)?;
                separate.push(two.rate);
                separate_errors += two.errors;
            }
        }
    }
    let opened = if wants("open") {
        let o = open_times(&url)?;
        json!({
            "events": o.events,
            "appends": o.appends,
            "filled_ms": o.filled_ms,
            "close_kept_ms": o.close_ms,
            "kept_ms": o.kept_ms,
        })
    } else {
        Value::Null
    };
    let http_rate = if one_rates.is_empty() {
        0.0
    } else {
        median(one_rates.clone())
    };
    if !args.only.is_empty() {
        let figure = |v: &[f64]| {
            if v.is_empty() {
                Value::Null
            } else {
                median(v.to_vec()).round().into()
            }
        };
        return Ok(json!({
            "bench": "postgres-partial",
            "connection": connection,
            "commit_floor_per_sec": floor_rate.round(),
            "one_client_conditional_per_sec": figure(&one),
            "one_client_ratio_to_floor": if one.is_empty() { Value::Null } else { round(median(one.clone()) / floor_rate).into() },
            "row_floor_per_sec": figure(&row_floors),
            "row_floor_ratio_to_floor": if row_floors.is_empty() { Value::Null } else { round(median(row_floors.clone()) / floor_rate).into() },
            "one_client_ratio_to_row_floor": if one.is_empty() { Value::Null } else { round(median(one.clone()) / median(row_floors.clone())).into() },
            "one_client_p99_us": figure(&one_p99),
            "writers64_batch512_events_per_sec": figure(&wide),
            "writers64_batch512_p99_us": figure(&wide_p99),
            "http64_conditional_per_sec": figure(&one_rates),
            "two_servers_http64_per_sec": figure(&split),
            "two_servers_runs": split.iter().map(|r| r.round()).collect::<Vec<_>>(),
            "two_servers_errors": split_errors,
            "two_servers_p99_ms": figure_ms(&split_p99),
            "two_servers_max_ms": figure_ms(&split_max),
            "two_separate_errors": separate_errors,
            "two_servers_ratio_to_one": if split.is_empty() || one_rates.is_empty() { Value::Null } else { round(median(split.clone()) / http_rate).into() },
            "two_servers_ratio_to_one_paired": paired_ratio(&split, &one_rates),
            "two_separate_http64_per_sec": figure(&separate),
            "two_separate_runs": separate.iter().map(|r| r.round()).collect::<Vec<_>>(),
            "two_separate_ratio_to_one": if separate.is_empty() || one_rates.is_empty() { Value::Null } else { round(median(separate.clone()) / http_rate).into() },
            "two_servers_ratio_to_separate": if separate.is_empty() || split.is_empty() { Value::Null } else { round(median(split.clone()) / median(separate.clone())).into() },
            "open": opened,
        }));
    }
    // Selective reads over HTTP: PostgreSQL, then files, each preloaded alike.
    let reader = start_server_on(reads_url.as_ref(), "d3", &[])?;
    settle(&reads_url);
    let pg_reads = run_against(reader.http, Workload::Read, 64, seconds, runs, 100_000)?;
    drop(reader);
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir).map_err(|e| e.to_string())?;
    }
    let files = start_server_on(args.dir.as_os_str(), "d3", &[])?;
    settle(&reads_url);
    let file_reads = run_against(files.http, Workload::Read, 64, seconds, runs, 100_000)?;
    drop(files);
    let one_rate = median(one.clone());
    let row_floor_rate = median(row_floors.clone());
    let split_rate = median(split.clone());
    let separate_rate = if separate.is_empty() {
        f64::NAN
    } else {
        median(separate.clone())
    };
    let pg_read_rate = pg_reads["requests_per_sec"].as_f64().unwrap_or(0.0);
    let file_read_rate = file_reads["requests_per_sec"].as_f64().unwrap_or(0.0);
    Ok(json!({
        "bench": "postgres",
        "durability": "d3 (committed by PostgreSQL, synchronous_commit as configured)",
        "connection": connection,
        "seconds": seconds,
        "runs": runs,
        "commit_floor_per_sec": floor_rate.round(),
        "commit_floor_runs": floors.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "one_client_conditional_per_sec": one_rate.round(),
        "one_client_runs": one.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "one_client_p99_us": median(one_p99),
        "one_client_ratio_to_floor": round(one_rate / floor_rate),
        "row_floor_per_sec": row_floor_rate.round(),
        "row_floor_runs": row_floors.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "row_floor_ratio_to_floor": round(row_floor_rate / floor_rate),
        "one_client_ratio_to_row_floor": round(one_rate / row_floor_rate),
        "writers64_batch512_events_per_sec": median(wide.clone()).round(),
        "writers64_batch512_runs": wide.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "writers64_batch512_p99_us": median(wide_p99),
        "http64_conditional_per_sec": http_rate.round(),
        "http64_conditional_runs": one_rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "http64_conditional_p99_ms": median(one_p99s),
        "http64_conditional_errors": one_errors,
        "http64_ratio_to_floor": round(http_rate / floor_rate),
        "two_servers_http64_per_sec": split_rate.round(),
        "two_servers_runs": split.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "two_servers_errors": split_errors,
        "two_servers_p99_ms": figure_ms(&split_p99),
        "two_servers_max_ms": figure_ms(&split_max),
        "two_separate_errors": separate_errors,
        "two_servers_ratio_to_one": round(split_rate / http_rate),
        "two_servers_ratio_to_one_paired": paired_ratio(&split, &one_rates),
        "two_separate_ratio_to_one_paired": paired_ratio(&separate, &one_rates),
        "two_separate_http64_per_sec": separate_rate.round(),
        "two_separate_runs": separate.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "two_separate_ratio_to_one": round(separate_rate / http_rate),
        "two_servers_ratio_to_separate": round(split_rate / separate_rate),
        "http64_reads_per_sec": pg_read_rate,
        "http64_reads_files_per_sec": file_read_rate,
        "reads_ratio_to_files": round(pg_read_rate / file_read_rate),
        "open": opened,
    }))
}
