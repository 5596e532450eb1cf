//! `annals verify` and `annals stats`.

use std::io::IsTerminal;
use std::path::PathBuf;

use crate::failure::Failure;
use annals::{Durability, Options, Store};

/// The store a command opens: `--store` (alias `--dir`), or the same given on its own.
#[derive(clap::Args)]
pub struct StoreLocation {
    /// The store: a data directory (of a closed store) or a PostgreSQL URL
    /// (postgres://user:password@host/database); or give --url for a running server.
    #[arg(long, visible_alias = "dir", value_name = "DIR|URL")]
    store: Option<String>,
    /// The store, given without --store.
    #[arg(value_name = "DIR|URL", conflicts_with_all = ["store", "url"])]
    store_given: Option<String>,
}

impl StoreLocation {
    fn location(&self) -> Result<String, String> {
        self.store
            .clone()
            .or_else(|| self.store_given.clone())
            .ok_or_else(|| "say which store: --store DIR|postgres://... or --url URL".into())
    }
}

#[derive(clap::Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    at: StoreLocation,
    #[command(flatten)]
    server: crate::remote::RemoteArgs,
    // A data directory's records are checked without opening the store, so without the
    // subjects' keys; a database is opened, with them.
    #[command(flatten)]
    subjects: crate::subjects::SubjectArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct StatsArgs {
    #[command(flatten)]
    at: StoreLocation,
    #[command(flatten)]
    server: crate::remote::RemoteArgs,
    #[command(flatten)]
    subjects: crate::subjects::SubjectArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// `verify --url`: the server checks its live log (CRCs, sequence, index against the log) up
/// to its current head while it keeps serving (admin scope).
fn verify_server(mut remote: crate::remote::Remote, json: bool) -> Result<(), String> {
    let body = remote.call("GET", "/v1/admin/check", Vec::new())?;
    let report: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    if json {
        println!("{report}");
    } else {
        println!(
            "events:      {} (of head {})",
            report["events"], report["head"]
        );
        println!(
            "checked in:  {:.2} s",
            report["seconds"].as_f64().unwrap_or(0.0)
        );
        println!(
            "problem:     {}",
            report["problem"].as_str().unwrap_or("none")
        );
    }
    if report["ok"] == true {
        Ok(())
    } else {
        Err("the live log is not clean (see above)".into())
    }
}

pub fn verify(args: VerifyArgs) -> Result<(), Failure> {
    if let Some(remote) = args.server.connect() {
        return Ok(verify_server(remote?, args.json)?);
    }
    let store = args.at.location()?;
    if annals::is_database_url(&store) {
        let options = Options {
            subjects: args.subjects.options()?,
            ..Options::default()
        };
        return verify_database(&store, options, args.json);
    }
    let dir = PathBuf::from(store);
    let tty = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let report = annals::verify_with_progress(&dir, &mut |done, of| {
        if tty {
            eprint!(
                "\rverifying: {done} of {of} segments checked ({:.1} s)   ",
                started.elapsed().as_secs_f64()
            );
        }
    })
    .map_err(|e| e.to_string())?;
    if tty {
        eprintln!();
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
    } else {
        println!("segments:    {}", report.segments);
        println!("records:     {}", report.records);
        println!("events:      {}", report.events);
        println!("types/tags:  {} / {}", report.types, report.tags);
        println!("index bytes: {:.1} per event", report.index_bytes_per_event);
        println!(
            "torn tail:   {}",
            report.torn_tail.as_deref().unwrap_or("none")
        );
        println!("checkpoint:  {}", report.checkpoint);
        if report.sealed_events > 0 || report.subject_problem.is_some() {
            println!(
                "subjects:    {} sealed events; {}",
                report.sealed_events,
                report
                    .subject_problem
                    .as_deref()
                    .unwrap_or("each has a key or an erasure")
            );
        }
    }
    if report.is_clean() {
        Ok(())
    } else {
        Err("the store is not clean (see above)".into())
    }
}

/// `verify postgres://...`: opening loads every row of the log, each checked (well-formed,
/// gapless); then the live check reads every event back and compares the index with the log.
fn verify_database(url: &str, options: Options, json: bool) -> Result<(), Failure> {
    let tty = std::io::stderr().is_terminal();
    if tty {
        eprintln!(
            "loading the log from {} ...",
            annals_server::config::redact_password(url)
        );
    }
    let store = crate::data::open_store(url, options)?;
    let check = store
        .check(&mut |done, head| {
            if tty {
                eprint!("\rchecking: {done} of {head} events   ");
            }
        })
        .map_err(|e| e.to_string())?;
    if tty {
        eprintln!();
    }
    if json {
        println!(
            "{}",
            serde_json::to_string(&check).map_err(|e| e.to_string())?
        );
    } else {
        println!("events:      {} (of head {})", check.events, check.head);
        println!("checked in:  {:.2} s", check.seconds);
        println!(
            "problem:     {}",
            check.problem.as_deref().unwrap_or("none")
        );
    }
    store.close().map_err(|e| e.to_string())?;
    match check.problem {
        None => Ok(()),
        Some(_) => Err("the log is not clean (see above)".into()),
    }
}

/// Stats of a running server, from its Prometheus text.
/// `stats --url`: a running server's head, durability, counters and fsync latency, from
/// /metrics (admin scope).
/// A running server's statistics (`GET /v1/admin/stats`, admin scope), the shape `stats
/// --store --json` prints with the server's readiness, subscribers and connections.
fn server_stats(mut remote: crate::remote::Remote, url: &str, json: bool) -> Result<(), String> {
    let body = remote.call("GET", "/v1/admin/stats", Vec::new())?;
    let mut report: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| format!("{url} answered statistics that are not JSON: {e}"))?;
    report["url"] = url.into();
    if json {
        println!("{report}");
    } else {
        print_table(&report, 0);
    }
    Ok(())
}

/// Prints a JSON object as a table for people: one line per field, text without quotes,
/// `none` for null, and a nested object's fields indented under its name. Histograms (objects
/// holding `buckets`) are left to `--json`.
fn print_table(value: &serde_json::Value, indent: usize) {
    for (k, v) in value.as_object().into_iter().flatten() {
        let name = format!("{:indent$}{k}:", "");
        if v.get("buckets").is_some() {
            continue;
        }
        match v {
            serde_json::Value::Object(_) => {
                println!("{name}");
                print_table(v, indent + 2);
            }
            serde_json::Value::String(text) => println!("{name:<24} {text}"),
            serde_json::Value::Null => println!("{name:<24} none"),
            other => println!("{name:<24} {other}"),
        }
    }
}

pub fn stats(args: StatsArgs) -> Result<(), Failure> {
    if let Some(remote) = args.server.connect() {
        let url = args.server.url.clone().unwrap_or_default();
        return Ok(server_stats(remote?, &url, args.json)?);
    }
    let location = args.at.location()?;
    let subjects = args.subjects.options()?;
    if annals::is_database_url(&location) {
        let options = Options {
            subjects,
            ..Options::default()
        };
        let store = crate::data::open_store(&location, options)?;
        return Ok(print_stats(&store, args.json)?);
    }
    let dir = PathBuf::from(location);
    if !dir.join(annals::files::segment(1)).exists() {
        return Err(format!("{} holds no Annals store", dir.display()).into());
    }
    if std::io::stderr().is_terminal() {
        eprintln!(
            "opening {} (a store without a checkpoint is indexed first)...",
            dir.display()
        );
    }
    // Opening in D1 syncs nothing new; a closed store's stats do not depend on the class.
    let options = Options {
        durability: Durability::Written,
        checkpoint_on_close: false,
        subjects,
        ..Options::default()
    };
    let store = Store::open(&dir, options)
        .map_err(|e| Failure::of_kind(e.kind(), format!("cannot open {}: {e}", dir.display())))?;
    Ok(print_stats(&store, args.json)?)
}

fn print_stats(store: &Store, json: bool) -> Result<(), String> {
    let stats = store.stats();
    let report = store.open_report().clone();
    if json {
        let mut value = serde_json::to_value(annals_server::stats::store_stats(store))
            .map_err(|e| e.to_string())?;
        // The durability class is a running server's setting, not the store's: this command
        // opened the store in a class of its own choosing, which says nothing about it.
        if let Some(fields) = value.as_object_mut() {
            fields.remove("durability");
            fields.remove("durability_description");
        }
        println!("{value}");
    } else {
        println!("head:        {}", stats.head);
        println!("backend:     {}", stats.backend);
        if store.backend() == annals::Backend::Files {
            println!(
                "segments:    {} of {} bytes",
                stats.segments, stats.segment_bytes
            );
        }
        println!("types/tags:  {} / {}", stats.types, stats.tags);
        println!(
            "index:       {} bytes in memory; {:.1} bytes per event",
            stats.index_bytes, stats.index_bytes_per_event
        );
        println!(
            "opened in:   {:.1} ms ({})",
            report.open_ms,
            annals_server::stats::index_source(&report.index)
        );
        if let Some(free) = stats.disk_free_bytes {
            println!("disk free:   {free} bytes");
        }
        if let Some(reason) = &stats.disk_full {
            println!("disk full:   appends that need a new segment are refused: {reason}");
        }
    }
    Ok(())
}
