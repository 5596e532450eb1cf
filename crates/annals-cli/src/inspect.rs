//! `annals verify` and `annals stats`.

use std::path::PathBuf;

use annals::{Durability, Options, Store};

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// The data directory.
    dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct StatsArgs {
    /// The data directory.
    dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn verify(args: VerifyArgs) -> Result<(), String> {
    let report = annals::verify(&args.dir).map_err(|e| e.to_string())?;
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
    }
    if report.is_clean() {
        Ok(())
    } else {
        Err("the store is not clean (see above)".into())
    }
}

pub fn stats(args: StatsArgs) -> Result<(), String> {
    if !args.dir.join(annals::files::segment(1)).exists() {
        return Err(format!("{} holds no Annals store", args.dir.display()));
    }
    // Opening in D1 syncs nothing new; a closed store's stats do not depend on the class.
    let options = Options {
        durability: Durability::Written,
        checkpoint_on_close: false,
        ..Options::default()
    };
    let store = Store::open(&args.dir, options).map_err(|e| e.to_string())?;
    let stats = store.stats();
    let report = store.open_report().clone();
    if args.json {
        let mut value = serde_json::to_value(&stats).map_err(|e| e.to_string())?;
        value["open_ms"] = report.open_ms.into();
        value["index_source"] = format!("{:?}", report.index).into();
        println!("{value}");
    } else {
        println!("head:        {}", stats.head);
        println!(
            "segments:    {} of {} bytes",
            stats.segments, stats.segment_bytes
        );
        println!("types/tags:  {} / {}", stats.types, stats.tags);
        println!(
            "index:       {} bytes ({:.1} per event)",
            stats.index_bytes, stats.index_bytes_per_event
        );
        println!("opened in:   {:.1} ms ({:?})", report.open_ms, report.index);
    }
    Ok(())
}
