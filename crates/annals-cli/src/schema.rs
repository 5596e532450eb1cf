//! `annals schema`: event schemas on a running server (--url) or a closed store (--store):
//! register a version (`put`, checked against the stored events first), check one without
//! registering it (`check`), list and show them, set a type's enforcement and the store-wide
//! policy for types without a schema.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::registry::{Enforcement, HistoryCheck, Registration, Registry, UnknownTypes};
use annals::Options;
use serde_json::{json, Value};

use crate::data::percent;
use crate::failure::Failure;
use crate::remote::RemoteArgs;

#[derive(clap::Subcommand)]
pub enum SchemaCommand {
    /// Register a new version of a type's schema (a JSON Schema file, 2020-12 or draft 7),
    /// after checking every stored event of the type against it; refused, naming the first
    /// events that break it, when any does. The same file again registers nothing.
    ///
    /// Examples:
    ///   annals schema put Opened opened.json --url http://127.0.0.1:7400 --api-key $ADMIN_KEY
    ///   annals schema put Opened opened.json --store ./data --check previously-accepted
    #[command(verbatim_doc_comment)]
    Put(PutArgs),
    /// Check a schema file against the stored events of a type, registering nothing.
    ///
    /// Example: annals schema check Opened opened-v2.json --url http://127.0.0.1:7400
    Check(PutArgs),
    /// Every type with a schema: its enforcement and versions.
    ///
    /// Example: annals schema list --url http://127.0.0.1:7400
    List(Target),
    /// One type's versions with their schemas; with --position, the version an event at that
    /// position was checked against.
    ///
    /// Example: annals schema show Opened --url http://127.0.0.1:7400
    Show(ShowArgs),
    /// Set how a type's schema is applied to appends: reject (refuse an append with an event
    /// that breaks it), warn (store it, count and log it) or off.
    ///
    /// Example: annals schema enforce Opened warn --url http://127.0.0.1:7400 --api-key $ADMIN_KEY
    Enforce(EnforceArgs),
    /// Take (allow, the default) or refuse events of types that have no schema.
    ///
    /// Example: annals schema unknown-types refuse --url http://127.0.0.1:7400 --api-key $ADMIN_KEY
    UnknownTypes(UnknownArgs),
}

/// Where the schemas are: a running server or a closed store.
#[derive(clap::Args)]
pub struct Target {
    /// A closed store's data directory or PostgreSQL URL (or give --url for a running server).
    #[arg(
        long,
        visible_alias = "dir",
        value_name = "DIR|URL",
        conflicts_with = "url"
    )]
    store: Option<String>,
    #[command(flatten)]
    server: RemoteArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct PutArgs {
    /// The event type.
    event_type: String,
    /// The JSON Schema file.
    file: PathBuf,
    /// Which stored events the version must accept: every one (stored), or those the previous
    /// version accepts (previously-accepted).
    #[arg(long, value_enum, default_value = "stored")]
    check: Check,
    /// The version it must become (refused when that is not the next).
    #[arg(long)]
    version: Option<u32>,
    #[command(flatten)]
    target: Target,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Check {
    Stored,
    PreviouslyAccepted,
}

#[derive(clap::Args)]
pub struct ShowArgs {
    event_type: String,
    /// Also say which version an event of the type at this position was checked against.
    #[arg(long)]
    position: Option<u64>,
    #[command(flatten)]
    target: Target,
}

#[derive(clap::Args)]
pub struct EnforceArgs {
    event_type: String,
    #[arg(value_enum)]
    enforcement: Level,
    #[command(flatten)]
    target: Target,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Level {
    Reject,
    Warn,
    Off,
}

#[derive(clap::Args)]
pub struct UnknownArgs {
    #[arg(value_enum)]
    policy: Policy,
    #[command(flatten)]
    target: Target,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Policy {
    Allow,
    Refuse,
}

pub fn run(command: SchemaCommand) -> Result<(), Failure> {
    match command {
        SchemaCommand::Put(args) => put(args, false),
        SchemaCommand::Check(args) => put(args, true),
        SchemaCommand::List(target) => {
            let answer = on(
                &target,
                |remote| remote_json(remote, "GET", "/v1/schemas", None),
                |store, registry| {
                    let types = registry.types(store).map_err(|e| e.to_string())?;
                    let unknown = registry.unknown_types(store).map_err(|e| e.to_string())?;
                    Ok(json!({ "unknownTypes": unknown, "types": types }))
                },
            )?;
            print_list(&answer, target.json);
            Ok(())
        }
        SchemaCommand::Show(args) => {
            let name = args.event_type.clone();
            let mut path = format!("/v1/schemas/{}", percent(&name));
            if let Some(p) = args.position {
                path.push_str(&format!("?position={p}"));
            }
            let answer = on(
                &args.target,
                |remote| remote_json(remote, "GET", &path, None),
                |store, registry| {
                    let found = registry
                        .schemas_of(store, &name)
                        .map_err(|e| e.to_string())?
                        .ok_or_else(|| format!("the event type {name:?} has no schema"))?;
                    let mut answer = serde_json::to_value(found).map_err(|e| e.to_string())?;
                    if let Some(p) = args.position {
                        let against = registry
                            .checked_against(store, &name, p)
                            .map_err(|e| e.to_string())?;
                        answer["checkedAgainst"] =
                            serde_json::to_value(against).unwrap_or_default();
                    }
                    Ok(answer)
                },
            )?;
            println!(
                "{}",
                serde_json::to_string_pretty(&answer).unwrap_or_default()
            );
            Ok(())
        }
        SchemaCommand::Enforce(args) => {
            let enforcement = match args.enforcement {
                Level::Reject => Enforcement::Reject,
                Level::Warn => Enforcement::Warn,
                Level::Off => Enforcement::Off,
            };
            let path = format!(
                "/v1/admin/schemas/{}/enforcement",
                percent(&args.event_type)
            );
            let body = json!({ "enforcement": enforcement });
            let answer = on(
                &args.target,
                |remote| remote_json(remote, "PUT", &path, Some(&body)),
                |store, registry| {
                    let position = registry
                        .set_enforcement(store, &args.event_type, enforcement)
                        .map_err(|e| e.to_string())?;
                    Ok(json!({ "position": position }))
                },
            )?;
            println!(
                "{}: enforcement {} (position {})",
                args.event_type, body["enforcement"], answer["position"]
            );
            Ok(())
        }
        SchemaCommand::UnknownTypes(args) => {
            let policy = match args.policy {
                Policy::Allow => UnknownTypes::Allow,
                Policy::Refuse => UnknownTypes::Refuse,
            };
            let body = json!({ "unknownTypes": policy });
            let answer = on(
                &args.target,
                |remote| remote_json(remote, "PUT", "/v1/admin/schema-policy", Some(&body)),
                |store, registry| {
                    let position = registry
                        .set_unknown_types(store, policy)
                        .map_err(|e| e.to_string())?;
                    Ok(json!({ "position": position }))
                },
            )?;
            println!(
                "types without a schema: {} (position {})",
                body["unknownTypes"], answer["position"]
            );
            Ok(())
        }
    }
}

fn put(args: PutArgs, dry_run: bool) -> Result<(), Failure> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let schema: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", args.file.display()))?;
    let check = match args.check {
        Check::Stored => HistoryCheck::Stored,
        Check::PreviouslyAccepted => HistoryCheck::PreviouslyAccepted,
    };
    let path = format!("/v1/admin/schemas/{}", percent(&args.event_type));
    let mut body = json!({ "schema": schema, "check": check, "dryRun": dry_run });
    if let Some(v) = args.version {
        body["version"] = v.into();
    }
    let answer = on(
        &args.target,
        |remote| streamed_registration(remote, &path, &body, &args.event_type),
        |store, registry| {
            let registration = Registration {
                event_type: args.event_type.clone(),
                schema: schema.clone(),
                check,
                version: args.version,
                dry_run,
            };
            let mut last = Instant::now();
            let mut progress = |p: annals::registry::Progress| {
                if last.elapsed() >= Duration::from_millis(500) {
                    last = Instant::now();
                    eprintln!(
                        "checked {} events of {} ({} fail), at position {} of {}",
                        p.checked, args.event_type, p.failed, p.position, p.head
                    );
                }
            };
            let done = registry
                .register(store, registration, &mut progress)
                .map_err(|e| match e {
                    annals::registry::RegistryError::History(failure) => history_message(&failure),
                    e => e.to_string(),
                })?;
            Ok(json!({
                "type": done.event_type, "version": done.version, "position": done.position,
                "checkedEvents": done.checked_events, "passedOver": done.passed_over,
                "unchanged": done.unchanged, "dryRun": done.dry_run,
            }))
        },
    )?;
    if args.target.json {
        println!("{answer}");
    } else if answer["dryRun"] == true {
        println!(
            "{} fits every one of the {} stored events of {} checked; nothing was registered (check)",
            args.file.display(),
            answer["checkedEvents"],
            args.event_type
        );
    } else if answer["unchanged"] == true {
        println!(
            "{} is version {} of {} already; nothing was registered",
            args.file.display(),
            answer["version"],
            args.event_type
        );
    } else {
        println!(
            "registered version {} of {} at position {} ({} stored events checked)",
            answer["version"], args.event_type, answer["position"], answer["checkedEvents"]
        );
    }
    Ok(())
}

/// A registration on a server, its progress printed as the server reports it.
fn streamed_registration(
    remote: &mut crate::remote::Remote,
    path: &str,
    body: &Value,
    event_type: &str,
) -> Result<Value, String> {
    let mut last: Option<Value> = None;
    let mut printed: Option<Instant> = None;
    remote.stream_lines_of("POST", path, body.to_string().into_bytes(), |line| {
        let value: Value =
            serde_json::from_slice(line).map_err(|e| format!("the server's answer: {e}"))?;
        if let Some(p) = value.get("progress") {
            if printed.is_none_or(|t| t.elapsed() >= Duration::from_millis(500)) {
                printed = Some(Instant::now());
                eprintln!(
                    "checked {} events of {event_type} ({} fail), at position {} of {}",
                    p["checked"], p["failed"], p["position"], p["head"]
                );
            }
        } else {
            last = Some(value);
        }
        Ok(true)
    })?;
    match last {
        Some(mut v) if v.get("registered").is_some() => Ok(v["registered"].take()),
        Some(v) if v.get("error").is_some() => Err(crate::remote::refusal_text(
            format!("{}", v["error"]["status"]),
            Some(&v["error"]),
            b"",
        )),
        _ => Err("the server's answer ended before the registration's outcome".into()),
    }
}

/// A history check's refusal with every failing event it names.
fn history_message(failure: &annals::registry::HistoryFailure) -> String {
    let mut message = failure.to_string();
    for event in &failure.events {
        for e in &event.errors {
            let at = if e.instance_path.is_empty() {
                "/"
            } else {
                &e.instance_path
            };
            message.push_str(&format!(
                "\n  position {} at {at}: {}",
                event.position, e.message
            ));
        }
    }
    message
}

/// Runs `remote` against the server the target names, or `local` on its closed store opened
/// with its registry (and closed after).
fn on(
    target: &Target,
    remote: impl FnOnce(&mut crate::remote::Remote) -> Result<Value, String>,
    local: impl FnOnce(&annals::Store, &Registry) -> Result<Value, String>,
) -> Result<Value, Failure> {
    if let Some(connected) = target.server.connect() {
        return Ok(remote(&mut connected?)?);
    }
    let location = target
        .store
        .as_deref()
        .ok_or("say which store: --store DIR (closed) or --url URL (running)")?;
    let registry = Arc::new(Registry::new());
    let options = Options {
        admission: Some(registry.clone()),
        ..Options::default()
    };
    let store = crate::data::open_store(location, options)?;
    let answer = local(&store, &registry);
    store.close().map_err(|e| e.to_string())?;
    Ok(answer?)
}

fn remote_json(
    remote: &mut crate::remote::Remote,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, String> {
    let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let bytes = remote.call(method, path, body)?;
    serde_json::from_slice(&bytes).map_err(|e| format!("the server's answer: {e}"))
}

fn print_list(answer: &Value, json: bool) {
    if json {
        println!("{answer}");
        return;
    }
    println!(
        "types without a schema: {}",
        answer["unknownTypes"].as_str().unwrap_or("?")
    );
    let empty = Vec::new();
    let types = answer["types"].as_array().unwrap_or(&empty);
    if types.is_empty() {
        println!("no type has a schema");
    }
    for t in types {
        let versions = t["versions"].as_array().unwrap_or(&empty);
        let newest = versions.last();
        println!(
            "{}  {} versions, newest {} (position {}), enforcement {}",
            t["event_type"]
                .as_str()
                .or(t["type"].as_str())
                .unwrap_or("?"),
            versions.len(),
            newest.map_or(Value::Null, |v| v["version"].clone()),
            newest.map_or(Value::Null, |v| v["position"].clone()),
            t["enforcement"].as_str().unwrap_or("?")
        );
    }
}
