//! `annals copy`: moves a store between a directory and PostgreSQL (either way, or between two
//! of either), append by append with positions, append times and tracking kept, then compares
//! both logs.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use annals::{CopyPhase, Options};

use crate::data::open_store;
use crate::failure::Failure;

/// The data subjects' key file of a store on files.
const KEYS: &str = "subjects.keys";

/// A copy into a directory of a store with data subjects gets its keys (still under the
/// master key) once both are closed: the source directory's key file, or `exported` from a
/// source database's keys table. Opening it again appends the receipt of any erasure its log
/// lacks.
fn copy_keys(
    from: &str,
    to: &str,
    exported: Option<Vec<u8>>,
    options: Options,
) -> Result<(), Failure> {
    if annals::is_database_url(to) {
        return Ok(());
    }
    let source = std::path::Path::new(from).join(KEYS);
    let bytes = match exported {
        Some(bytes) => bytes,
        None if annals::is_database_url(from) || !source.exists() => return Ok(()),
        None => std::fs::read(&source).map_err(|e| format!("{}: {e}", source.display()))?,
    };
    annals::io::write_file_durably(&annals::io::RealIo, std::path::Path::new(to), KEYS, &bytes)
        .map_err(|e| format!("{to}: writing its key file: {e}"))?;
    open_store(to, options)?
        .close()
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[derive(clap::Args)]
pub struct CopyArgs {
    /// The store to copy: a data directory (not while a server holds it) or a PostgreSQL URL.
    #[arg(long, value_name = "DIR|URL")]
    from: String,
    /// Where to copy it: an empty store (a new directory, or a database without Annals
    /// tables), or one a copy from the same source stopped in, which the copy resumes.
    #[arg(long, value_name = "DIR|URL")]
    to: String,
    // The data subjects of both stores.
    #[command(flatten)]
    subjects: crate::subjects::SubjectArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: CopyArgs) -> Result<(), Failure> {
    if args.from == args.to {
        return Err("--from and --to name the same store".into());
    }
    let keys = std::path::Path::new(&args.from).join(KEYS);
    let from_database = annals::is_database_url(&args.from);
    let options = Options {
        subjects: args.subjects.options()?,
        ..Options::default()
    };
    let from = open_store(&args.from, options.clone())?;
    let to = open_store(&args.to, options.clone())?;
    // Into a database, a source's data subjects' keys go into its keys table.
    let keys_into_table = annals::is_database_url(&args.to)
        && (from.has_subjects() || (!from_database && keys.exists()));
    if keys_into_table && !to.has_subjects() {
        return Err(format!(
            "{} keeps data subjects: give their tag prefixes and master key \
             (--subject-tags, --master-key-file) to copy their keys into the database",
            args.from
        )
        .into());
    }
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut shown = Instant::now() - Duration::from_secs(1);
    let report = annals::copy(&from, &to, &mut |phase, reached, head| {
        if tty && shown.elapsed() >= Duration::from_millis(250) {
            shown = Instant::now();
            let verb = match phase {
                CopyPhase::Copying => "copying",
                CopyPhase::Verifying => "verifying",
            };
            eprint!(
                "\r{verb}: position {reached} of {head} ({:.1} s)   ",
                started.elapsed().as_secs_f64()
            );
        }
    })
    .map_err(|e| e.to_string())?;
    if tty {
        eprint!("\r");
    }
    // A source database's keys table as a key file (a directory's is read once it is closed).
    let exported = if from_database && from.has_subjects() {
        Some(from.subject_key_file().map_err(|e| e.to_string())?)
    } else {
        None
    };
    from.close().map_err(|e| e.to_string())?;
    if keys_into_table {
        let bytes = match &exported {
            Some(bytes) => bytes.clone(),
            None => std::fs::read(&keys).map_err(|e| format!("{}: {e}", keys.display()))?,
        };
        to.import_subject_keys(&bytes).map_err(|e| e.to_string())?;
    }
    to.close().map_err(|e| e.to_string())?;
    copy_keys(&args.from, &args.to, exported, options)?;
    let secs = started.elapsed().as_secs_f64();
    if args.json {
        let mut value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
        value["seconds"] = secs.into();
        println!("{value}");
    } else {
        let resumed = match report.resumed_after {
            0 => String::new(),
            p => format!(" after position {p}, which the target held"),
        };
        println!(
            "copied {} appends ({} events){resumed} in {secs:.2} s",
            report.copied_appends, report.copied_events
        );
        println!(
            "verified {} appends, positions 1..={}: the target's log is the source's",
            report.verified_appends, report.head
        );
    }
    Ok(())
}
