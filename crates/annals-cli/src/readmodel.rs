//! `annals readmodel`: status, lag, counts and rebuilds of read models, on a running server
//! (--url) or, for status and rebuild, on the checkpoint files of a data directory (--dir).

use std::path::PathBuf;

use crate::data::percent;
use crate::remote::{Remote, RemoteArgs};

#[derive(clap::Subcommand)]
pub enum ReadModelCommand {
    /// Each read model's position, checkpoint, head, lag and counters.
    ///
    /// With --dir (no server needed, safe while one runs): the checkpoint files and where
    /// they stand.
    ///
    /// Examples:
    ///   annals readmodel status --url http://127.0.0.1:7400
    ///   annals readmodel status --dir ./data
    #[command(verbatim_doc_comment)]
    Status(StatusArgs),
    /// One read model of a running server: its total and, with --key, one key's count.
    ///
    /// Example: annals readmodel get seats-by-course --key c1 --url http://127.0.0.1:7400
    Get(GetArgs),
    /// Fold a read model again from the first event.
    ///
    /// With --url the server rebuilds it in the background (admin scope); with --dir its
    /// checkpoint is removed, so the next start rebuilds it (stop the server first).
    ///
    /// Examples:
    ///   annals readmodel rebuild seats-by-course --url http://127.0.0.1:7400 --api-key $ADMIN_KEY
    ///   annals readmodel rebuild seats-by-course --store ./data
    #[command(verbatim_doc_comment)]
    Rebuild(RebuildArgs),
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// A data directory whose checkpoint files to list.
    #[arg(
        id = "store",
        long = "store",
        visible_alias = "dir",
        value_name = "DIR",
        required_unless_present = "url"
    )]
    dir: Option<PathBuf>,
    #[command(flatten)]
    server: RemoteArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct GetArgs {
    name: String,
    /// The key whose count to print.
    #[arg(long)]
    key: Option<String>,
    /// Wait until the model has folded this position (read your own writes).
    #[arg(long)]
    min_position: Option<u64>,
    /// How long to wait for --min-position, in milliseconds (at most 10000).
    #[arg(long, default_value_t = 5000)]
    wait_ms: u64,
    #[arg(
        id = "store",
        long = "store",
        alias = "dir",
        value_name = "DIR",
        hide = true
    )]
    dir: Option<PathBuf>,
    #[command(flatten)]
    server: RemoteArgs,
}

#[derive(clap::Args)]
pub struct RebuildArgs {
    name: String,
    /// A data directory: remove the model's checkpoint there.
    #[arg(
        id = "store",
        long = "store",
        visible_alias = "dir",
        value_name = "DIR",
        required_unless_present = "url"
    )]
    dir: Option<PathBuf>,
    #[command(flatten)]
    server: RemoteArgs,
}

pub fn run(command: ReadModelCommand) -> Result<(), String> {
    match command {
        ReadModelCommand::Status(args) => status(args),
        ReadModelCommand::Get(args) => get(args),
        ReadModelCommand::Rebuild(args) => rebuild(args),
    }
}

fn connect(server: &RemoteArgs) -> Result<Remote, String> {
    server.connect().ok_or("give --url")?
}

fn json(bytes: &[u8]) -> Result<serde_json::Value, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("the server's answer: {e}"))
}

fn status(args: StatusArgs) -> Result<(), String> {
    if let Some(dir) = &args.dir {
        let saved = annals::readmodel::list_checkpoints(dir).map_err(|e| e.to_string())?;
        if args.json {
            println!(
                "{}",
                serde_json::to_string(&saved).map_err(|e| e.to_string())?
            );
            return Ok(());
        }
        if saved.is_empty() {
            println!("no read-model checkpoints in {}", dir.display());
            return Ok(());
        }
        println!(
            "{:<32} {:>12} {:>8} {:>12}  saved",
            "name", "position", "version", "state bytes"
        );
        for s in saved {
            println!(
                "{:<32} {:>12} {:>8} {:>12}  {}",
                s.name,
                s.position,
                s.model_version,
                s.state_bytes,
                format_time(s.saved_at_us)
            );
        }
        return Ok(());
    }
    let mut remote = connect(&args.server)?;
    let answer = json(&remote.call("GET", "/v1/readmodels", Vec::new())?)?;
    if args.json {
        println!("{answer}");
        return Ok(());
    }
    let models = answer["readModels"].as_array().cloned().unwrap_or_default();
    if models.is_empty() {
        println!("the server keeps no read models (declare them under [[read_models]])");
        return Ok(());
    }
    println!(
        "{:<32} {:>12} {:>12} {:>10} {:>12}  state",
        "name", "position", "checkpoint", "lag", "events"
    );
    for m in models {
        let state = match (&m["error"], m["running"].as_bool()) {
            (serde_json::Value::String(e), _) => format!("failing: {e}"),
            (_, Some(false)) => "stopped".to_owned(),
            _ => "running".to_owned(),
        };
        println!(
            "{:<32} {:>12} {:>12} {:>10} {:>12}  {state}",
            m["name"].as_str().unwrap_or("?"),
            m["position"],
            m["checkpointPosition"],
            m["lag"],
            m["total"],
        );
    }
    Ok(())
}

fn get(args: GetArgs) -> Result<(), String> {
    if args.dir.is_some() {
        return Err("get reads a running server's model: give --url".into());
    }
    let mut remote = connect(&args.server)?;
    let mut query = Vec::new();
    if let Some(key) = &args.key {
        query.push(("key", key.clone()));
    }
    if let Some(p) = args.min_position {
        query.push(("minPosition", p.to_string()));
        query.push(("waitMs", args.wait_ms.to_string()));
    }
    let query = query
        .iter()
        .map(|(k, v)| format!("{k}={}", percent(v)))
        .collect::<Vec<_>>()
        .join("&");
    let path = format!(
        "/v1/readmodels/{}{}{query}",
        percent(&args.name),
        if query.is_empty() { "" } else { "?" }
    );
    let answer = json(&remote.call("GET", &path, Vec::new())?)?;
    println!("{answer}");
    Ok(())
}

fn rebuild(args: RebuildArgs) -> Result<(), String> {
    if let Some(dir) = &args.dir {
        let existed =
            annals::readmodel::remove_checkpoint(dir, &args.name).map_err(|e| e.to_string())?;
        if existed {
            println!(
                "removed the checkpoint of {}; it is rebuilt from the first event when next started",
                args.name
            );
        } else {
            println!(
                "{} has no checkpoint; it is rebuilt when next started",
                args.name
            );
        }
        return Ok(());
    }
    let mut remote = connect(&args.server)?;
    let path = format!("/v1/admin/readmodels/{}/rebuild", percent(&args.name));
    remote.call("POST", &path, Vec::new())?;
    println!(
        "{} is rebuilding; `annals readmodel status` shows its progress",
        args.name
    );
    Ok(())
}

fn format_time(us: u64) -> String {
    let secs = us / 1_000_000;
    let ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .saturating_sub(secs);
    format!("{ago} s ago")
}
