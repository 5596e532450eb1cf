//! `annals-bench backup`: the backup to object storage, against a throwaway SeaweedFS on this
//! machine (scripts/setup installs it). In one run:
//! - the object store's own floor: sequential single puts of 4 KiB, per second and p50/p99;
//! - 64 writers, D3, without and with a backup, alternated, and the backup's lag during the
//!   runs with it (sampled every 10 ms) beside the fdatasync floor. The runs with a backup are
//!   made twice: with the object store's data on the disk of the store measured, and with it
//!   in memory (/dev/shm), as an object store on other machines keeps its writes off that
//!   disk; the object store's CPU stays on this machine's two cores either way;
//! - D4 over HTTP: 64 connections of conditional appends, and 1, beside the put floor;
//! - restoring a store of `--restore-events` events from the backup;
//! - a full scan on a read replica beside the same scan on the primary.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::backup::{restore, RestoreLimit};
use annals::objects::Objects;
use annals::{BackupOptions, Durability, Options, Store};
use annals_testkit::s3::S3Server;
use bytes::Bytes;
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::bench::{
    append_run, conditional_writers, fsync_floor, full_scans, latency_json, median, AppendArgs,
    Data,
};
use crate::bench_http::{run_against, start_server, Workload};

#[derive(clap::Args)]
pub struct BackupArgs {
    /// Directory for the stores (emptied first) and the fsync floor file.
    #[arg(long, default_value = "/tmp/annals-bench-backup")]
    dir: PathBuf,
    /// Alternated runs of 64 writers without and with a backup.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Events of each 64-writer run.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// Seconds of each HTTP run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Events of the store restored (appended 512 to an append by 64 writers, 64-byte data).
    #[arg(long, default_value_t = 10_000_000)]
    restore_events: u64,
}

fn writers_args(dir: &Path, events: u64, backup: Option<BackupOptions>) -> AppendArgs {
    AppendArgs {
        backup,
        data: Data::Json,
        ..conditional_writers(dir, 64, events)
    }
}

/// The backup options of `prefix` on the throwaway object store.
pub(crate) fn s3_backup(s3: &S3Server, prefix: &str) -> BackupOptions {
    let mut b = BackupOptions::new(s3.url(prefix));
    for (k, v) in s3.env() {
        b = b.setting(k, v);
    }
    b
}

/// Sequential single puts of 4 KiB for `seconds`: puts per second and their latency.
pub(crate) fn put_floor(
    options: &BackupOptions,
    seconds: f64,
) -> Result<(f64, Histogram<u64>), String> {
    let objects = Objects::open_with(&options.url, &options.settings)?;
    let mut latency = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let payload = Bytes::from(vec![7u8; 4096]);
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        let at = Instant::now();
        objects
            .put_new(&format!("{n:020}"), vec![payload.clone()])
            .map_err(|e| e.to_string())?;
        let _ = latency.record(at.elapsed().as_micros() as u64);
        n += 1;
    }
    Ok((n as f64 / started.elapsed().as_secs_f64(), latency))
}

fn http_summary(v: &Value) -> Value {
    let op = &v["operations"]["conditional_append"];
    json!({
        "appends_per_sec": v["requests_per_sec"],
        "runs": v["requests_per_sec_runs"],
        "errors": v["errors"],
        "latency_ms": op["latency_ms"],
    })
}

pub fn run(args: BackupArgs) -> Result<Value, String> {
    let s3 = S3Server::start().ok_or("SeaweedFS's weed is not installed: run scripts/setup")?;
    // The servers this benchmark starts read the endpoint and key from the environment, as
    // a user's would; this process is single-threaded here.
    for (k, v) in s3.env() {
        std::env::set_var(k, v);
    }
    let backup = |prefix: &str| s3_backup(&s3, prefix);
    let _ = std::fs::remove_dir_all(&args.dir);
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;

    let (puts_per_sec, put_latency) = put_floor(&backup("floor"), 2.0)?;
    eprintln!("object store: {puts_per_sec:.0} sequential puts/s");
    let floor = fsync_floor(&args.dir, true, Duration::from_secs(1))?;

    // 64 writers, alternated without a backup, with one to the object store on this disk, and
    // with one to an object store whose data is in memory.
    let in_memory = Path::new("/dev/shm");
    let s3_memory = match in_memory.is_dir() {
        true => S3Server::start_in(in_memory),
        false => None,
    };
    let store_dir = args.dir.join("writers");
    let mut without = Vec::new();
    let mut with = [Vec::new(), Vec::new()];
    let mut lag = [
        Histogram::<u64>::new(3).map_err(|e| e.to_string())?,
        Histogram::<u64>::new(3).map_err(|e| e.to_string())?,
    ];
    let mut drains = [Vec::new(), Vec::new()];
    for run in 0..args.runs {
        let plain = append_run(
            &writers_args(&args.dir, args.events, None),
            Durability::Synced,
            &store_dir,
        )?;
        without.push(plain.appends_per_sec);
        let mut line = format!(
            "run {}: {:.0} appends/s without a backup",
            run + 1,
            plain.appends_per_sec
        );
        for (i, server) in [Some(&s3), s3_memory.as_ref()].into_iter().enumerate() {
            let Some(server) = server else { continue };
            let shipped = append_run(
                &writers_args(
                    &args.dir,
                    args.events,
                    Some(s3_backup(server, &format!("writers-{run}"))),
                ),
                Durability::Synced,
                &store_dir,
            )?;
            with[i].push(shipped.appends_per_sec);
            if let Some(h) = &shipped.backup_lag_ms {
                lag[i].add(h).map_err(|e| e.to_string())?;
            }
            drains[i].extend(shipped.backup_drain_ms);
            let place = ["on this disk", "in memory"][i];
            line += &format!(
                ", {:.0} with its object store {place}",
                shipped.appends_per_sec
            );
        }
        eprintln!("{line}");
    }
    drop(s3_memory);
    let _ = std::fs::remove_dir_all(&store_dir);
    let floor_after = fsync_floor(&args.dir, true, Duration::from_secs(1))?;

    // D4 over HTTP, 64 connections and 1.
    let d4 = {
        let dir = args.dir.join("d4");
        let url = s3.url("http-d4");
        let server = start_server(&dir, "d4", &["--backup", &url])?;
        let many = run_against(server.http, Workload::Conditional, 64, args.seconds, 1, 0)?;
        let one = run_against(server.http, Workload::Conditional, 1, args.seconds, 1, 0)?;
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
        (many, one)
    };
    eprintln!(
        "D4 over HTTP: {} (64), {} (1)",
        d4.0["requests_per_sec"], d4.1["requests_per_sec"]
    );

    // A large store, shipped, restored; then read on a replica and on the primary.
    let big = args.dir.join("big");
    let big_backup = backup("big");
    let mut big_args = writers_args(&args.dir, args.restore_events, Some(big_backup.clone()));
    big_args.batch = 512;
    big_args.conditional = false;
    big_args.event_bytes = 64;
    let built = append_run(&big_args, Durability::Synced, &big)?;
    eprintln!(
        "built and shipped {} events at {:.0} events/s",
        args.restore_events, built.events_per_sec
    );
    // What the backup holds, against the records it holds (compressed objects).
    let stored_bytes: u64 = {
        let objects = Objects::open_with(&big_backup.url, &big_backup.settings)?;
        let mut total = 0;
        for dir in ["segments", "log"] {
            total += objects
                .list(dir, None)
                .map_err(|e| e.to_string())?
                .iter()
                .map(|l| l.size)
                .sum::<u64>();
        }
        total
    };
    let restored_dir = args.dir.join("restored");
    let target = Store::open(&restored_dir, Options::default()).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let report = restore(
        &big_backup,
        &target,
        RestoreLimit::default(),
        &mut |_, _| {},
    )
    .map_err(|e| e.to_string())?;
    target.close().map_err(|e| e.to_string())?;
    let restore_seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "restored {} events in {restore_seconds:.1} s",
        report.events
    );
    let _ = std::fs::remove_dir_all(&restored_dir);

    let scan = |store: &Store| full_scans(store, |_| {}).map(|(rate, _)| rate);
    let opened = Instant::now();
    let replica =
        Store::open_replica(&big_backup, Options::default()).map_err(|e| e.to_string())?;
    let replica_open_seconds = opened.elapsed().as_secs_f64();
    let replica_scan = scan(&replica)?;
    drop(replica);
    let primary = Arc::new(Store::open(&big, Options::default()).map_err(|e| e.to_string())?);
    let primary_scan = scan(&primary)?;
    drop(primary);
    let _ = std::fs::remove_dir_all(&big);

    let without_median = median(without.clone());
    let with_json = |i: usize| -> Value {
        if with[i].is_empty() {
            return Value::Null;
        }
        let with_median = median(with[i].clone());
        json!({
            "with_backup_appends_per_sec": with_median.round(),
            "runs_with": with[i].iter().map(|r| r.round()).collect::<Vec<_>>(),
            "ratio_with_to_without": ((with_median / without_median) * 100.0).round() / 100.0,
            "backup_lag_ms": latency_json(&lag[i]),
            "backup_catch_up_after_run_ms": drains[i],
        })
    };
    Ok(json!({
        "bench": "backup",
        "object_store": "SeaweedFS 4.48 (weed mini) on this machine",
        "object_store_puts_per_sec": puts_per_sec.round(),
        "object_store_put_latency_us": latency_json(&put_latency),
        "fsync_floor_per_sec": ((floor + floor_after) / 2.0).round(),
        "fsync_floor_before_after": [floor.round(), floor_after.round()],
        "writers_64_d3": {
            "workload": "conditional_append, 1 event of 256 bytes of JSON, 64 async writers, embedded",
            "events": args.events,
            "without_backup_appends_per_sec": without_median.round(),
            "runs_without": without.iter().map(|r| r.round()).collect::<Vec<_>>(),
            "object_store_data_on_the_store_disk": with_json(0),
            "object_store_data_in_memory": with_json(1),
        },
        "d4_http": {
            "workload": "conditional_append over HTTP/1.1, 1 event of 256 bytes, server --durability d4",
            "connections_64": http_summary(&d4.0),
            "connections_1": http_summary(&d4.1),
            "one_client_ratio_to_put_floor": d4.1["requests_per_sec"].as_f64().map(|r| ((r / puts_per_sec) * 100.0).round() / 100.0),
        },
        "restore": {
            "events": report.events,
            "appends": report.appends,
            "objects": report.objects,
            "bytes": report.bytes,
            "stored_bytes": stored_bytes,
            "records_to_stored_bytes": ((report.bytes as f64 / stored_bytes.max(1) as f64) * 100.0).round() / 100.0,
            "seconds": (restore_seconds * 100.0).round() / 100.0,
            "events_per_sec": (report.events as f64 / restore_seconds).round(),
            "built_events_per_sec_with_backup": built.events_per_sec.round(),
        },
        "replica": {
            "open_seconds": (replica_open_seconds * 100.0).round() / 100.0,
            "full_scan_events_per_sec": replica_scan.round(),
            "primary_full_scan_events_per_sec": primary_scan.round(),
            "ratio_to_primary": ((replica_scan / primary_scan) * 100.0).round() / 100.0,
        },
    }))
}
