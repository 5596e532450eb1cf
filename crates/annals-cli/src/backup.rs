//! `annals restore` and `annals backup verify`: reading back what `serve --backup` shipped
//! into object storage.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use annals::backup::{restore, verify_backup, RestoreLimit};
use annals::Options;

use crate::data::open_store;
use crate::failure::Failure;

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The backup: s3://bucket/prefix, gs://bucket/prefix, az://container/prefix or
    /// file:///directory (credentials from the provider's environment variables).
    #[arg(long, value_name = "URL")]
    from: String,
    /// Where to restore: a new or empty directory, or a PostgreSQL database without Annals
    /// tables.
    #[arg(long, value_name = "DIR|URL")]
    to: String,
    /// Restore up to this position (the appends that end at or before it).
    #[arg(long, value_name = "N", conflicts_with = "time")]
    position: Option<u64>,
    /// Restore the appends made at or before this time (RFC 3339, e.g.
    /// 2026-11-27T08:00:00Z).
    #[arg(long, value_name = "RFC3339")]
    time: Option<String>,
    #[command(flatten)]
    subjects: crate::subjects::SubjectArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
pub enum BackupCommand {
    /// Check every object of a backup (CRCs, records, positions without a gap, the manifest)
    /// without restoring it.
    ///
    /// Example: annals backup verify s3://bucket/annals
    Verify {
        /// The backup's URL.
        url: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn tty() -> bool {
    std::io::stderr().is_terminal()
}

/// The microseconds since the epoch an RFC 3339 time stands for.
fn parse_time(text: &str) -> Result<u64, String> {
    let t = chrono::DateTime::parse_from_rfc3339(text).map_err(|e| {
        format!("--time {text:?} is not an RFC 3339 time ({e}); e.g. 2026-11-27T08:00:00Z")
    })?;
    u64::try_from(t.timestamp_micros()).map_err(|_| format!("--time {text:?} is before 1970"))
}

/// Whether a directory exists and holds anything.
fn non_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some())
}

pub fn run_restore(args: RestoreArgs) -> Result<(), Failure> {
    let limit = RestoreLimit {
        position: args.position,
        time_us: args.time.as_deref().map(parse_time).transpose()?,
    };
    // A location that holds no backup is refused before anything is made on either side.
    annals::backup::require_backup(&annals::BackupOptions::new(&args.from))
        .map_err(|e| e.to_string())?;
    let database = annals::is_database_url(&args.to);
    if !database && non_empty(Path::new(&args.to)) {
        return Err(format!(
            "{} is not empty: restore into a new or empty directory",
            args.to
        )
        .into());
    }
    let subjects = args.subjects.options()?;
    let backup = annals::BackupOptions::new(&args.from);
    if subjects.is_none() && annals::backup::holds_keys(&backup).map_err(|e| e.to_string())? {
        return Err(format!(
            "{} holds data subjects' keys: give the store's subject tags and master key \
             (--subject-tags, --master-key-file)",
            args.from
        )
        .into());
    }
    let options = Options {
        subjects: subjects.clone(),
        ..Options::default()
    };
    let store = open_store(&args.to, options.clone())?;
    if store.head() != 0 {
        return Err(format!(
            "{} holds {} events: restore into an empty store",
            annals_server::config::redact_password(&args.to),
            store.head()
        )
        .into());
    }
    let tty = tty();
    let started = Instant::now();
    let mut shown = Instant::now() - Duration::from_secs(1);
    let report = restore(
        &annals::BackupOptions::new(&args.from),
        &store,
        limit,
        &mut |reached, last| {
            if tty && shown.elapsed() >= Duration::from_millis(250) {
                shown = Instant::now();
                eprint!(
                    "\rrestoring: position {reached} of {last} ({:.1} s)   ",
                    started.elapsed().as_secs_f64()
                );
            }
        },
    )
    .map_err(|e| e.to_string())?;
    if tty {
        eprintln!();
    }
    // The subjects' keys, as the backup holds them: into a database's keys table (with those
    // the log carries), or on files written beside the log with the store closed. Either way
    // the store is opened again, and that open appends the receipt of each erasure the
    // restored log ends before (a restore to a position or a time before it): erasures
    // survive a restore, as events after the positions restored, which stay the backup's.
    let store = if subjects.is_none() {
        store
    } else if database {
        match annals::backup::key_file(&backup).map_err(|e| e.to_string())? {
            Some(key_file) => {
                let keys = store
                    .import_subject_keys(&key_file)
                    .map_err(|e| e.to_string())?;
                eprintln!("restored the keys of {keys} data subjects into the database");
                store.close().map_err(|e| e.to_string())?;
                open_store(&args.to, options)?
            }
            None => store,
        }
    } else if annals::backup::holds_keys(&backup).map_err(|e| e.to_string())? {
        store.close().map_err(|e| e.to_string())?;
        annals::backup::restore_keys(&backup, Path::new(&args.to)).map_err(|e| e.to_string())?;
        open_store(&args.to, options)?
    } else {
        store
    };
    let receipts = store.head().saturating_sub(report.head);
    // The same check as `annals verify`: every record, and the index against the log.
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
    store.close().map_err(|e| e.to_string())?;
    if let Some(problem) = &check.problem {
        return Err(format!("the restored store is not clean: {problem}").into());
    }
    let verified = if database {
        None
    } else {
        let verify = annals::verify(Path::new(&args.to)).map_err(|e| e.to_string())?;
        if !verify.is_clean() {
            return Err(format!(
                "the restored directory is not clean: {}",
                serde_json::to_string(&verify).unwrap_or_default()
            )
            .into());
        }
        Some(verify)
    };
    let secs = started.elapsed().as_secs_f64();
    if args.json {
        let mut value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
        value["seconds"] = secs.into();
        value["verified_events"] = check.events.into();
        value["erasures_carried_over"] = receipts.into();
        value["head_with_receipts"] = (report.head + receipts).into();
        if let Some(v) = &verified {
            value["verified_segments"] = v.segments.into();
        }
        println!("{value}");
    } else {
        println!(
            "restored {} appends ({} events, {}) from {} objects ({} bytes) in {secs:.2} s; \
             the backup holds positions through {}",
            report.appends,
            report.events,
            match report.head {
                0 => "no positions".to_string(),
                head => format!("positions 1..={head}"),
            },
            report.objects,
            report.bytes,
            report.backup_head
        );
        if receipts > 0 {
            println!(
                "{receipts} erasures made after position {} carried over: their receipts \
                 (annals.SubjectErased) appended at positions {}..={} with this restore's \
                 time; positions 1..={} are the backup's, unchanged",
                report.head,
                report.head + 1,
                report.head + receipts,
                report.head
            );
        }
        println!(
            "checked {} events: every record and the index agree",
            check.events
        );
    }
    Ok(())
}

pub fn run(command: BackupCommand) -> Result<(), String> {
    match command {
        BackupCommand::Verify { url, json } => {
            let tty = tty();
            let started = Instant::now();
            let report = verify_backup(&annals::BackupOptions::new(&url), &mut |reached, last| {
                if tty {
                    eprint!("\rchecking: position {reached} of {last}   ");
                }
            })
            .map_err(|e| e.to_string())?;
            if tty {
                eprintln!();
            }
            if json {
                let mut value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
                value["seconds"] = started.elapsed().as_secs_f64().into();
                println!("{value}");
            } else if report.objects == 0 {
                println!(
                    "{url}: a backup that holds no events yet (a store began shipping into it)"
                );
            } else {
                println!(
                    "{url}: positions 1..={} in {} objects ({} sealed segments, {} chunks), \
                     {} records, {} bytes: every object checked",
                    report.head,
                    report.objects,
                    report.segments,
                    report.chunks,
                    report.records,
                    report.bytes
                );
                if report.covered_chunks > 0 {
                    println!(
                        "{} chunks are covered by a segment's object (left by a delete that \
                         failed; reads skip them)",
                        report.covered_chunks
                    );
                }
            }
            Ok(())
        }
    }
}
