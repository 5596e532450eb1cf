//! Goal: every error a client can provoke is answered as `CONTRACT` says, over the HTTP API
//! (the status and the body's `kind`) and over gRPC (UmaDB's protocol: the status code), and no
//! refused request changes the log. `CONTRACT` is the server crate's table of kinds written out
//! as a client sees it; each row names the server it is provoked on (a file store with small
//! limits, one with data subjects, a memory-only one, a read replica). `request` builds each
//! kind's request once and both front ends send it; where UmaDB's protocol has no field for it
//! (a durability class, read options, an erasure) the row says HTTP only.
//!
//! Not covered here: the kinds only the store's own faults produce (io, corrupt,
//! outcome_unknown, store_poisoned, database_unavailable, disk_full, and the rest `NOT_LIVE`
//! names). The unit test of the server crate's table of kinds answers a value of every kind
//! through both front ends' functions, and server_disk.rs and server_postgres.rs provoke the
//! faults live. Refusals a front end makes before the store sees a request (malformed JSON,
//! a body too large, authentication) have words outside the table and are not walked here.

mod common;

use std::time::Duration;

use common::{encode, Response, ServerProcess, ANNALS};
use prost::Message;
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Code;
use umadb_proto::v1;
use umadb_proto::v1::dcb_client::DcbClient;

/// The server a row is provoked on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum On {
    /// A file store with `LIMITS`, holding one event appended with a tracking position.
    Plain,
    /// A file store with data subjects, one of them (`ERASED`) erased.
    Subjects,
    /// A memory-only store.
    Memory,
    /// A read replica following the backup a primary ships to a directory.
    Replica,
}

/// One row of the contract: a kind, the server it is provoked on, how HTTP answers it, and
/// the code gRPC answers it with (None: UmaDB's protocol cannot carry the request).
struct Row {
    kind: &'static str,
    on: On,
    http: u16,
    http_kind: &'static str,
    grpc: Option<Code>,
}

const fn row(
    kind: &'static str,
    on: On,
    http: u16,
    http_kind: &'static str,
    grpc: Option<Code>,
) -> Row {
    Row {
        kind,
        on,
        http,
        http_kind,
        grpc,
    }
}

/// The request was wrong; nothing changed.
const INVALID: Option<Code> = Some(Code::InvalidArgument);
/// An expected outcome of an append, UmaDB's integrity error.
const INTEGRITY: Option<Code> = Some(Code::FailedPrecondition);
/// UmaDB's protocol has no field or call for the request.
const HTTP_ONLY: Option<Code> = None;

/// What a client gets for each error it can provoke. A failed condition is no error over HTTP:
/// the append answers with its flag set (`appendConditionFailed`) and no `kind`.
#[rustfmt::skip]
const CONTRACT: &[Row] = &[
    //   kind                      server        HTTP  HTTP kind                 gRPC
    row("no_events",               On::Plain,    400, "no_events",               INVALID),
    row("too_many_events",         On::Plain,    400, "too_many_events",         INVALID),
    row("event_too_large",         On::Plain,    400, "event_too_large",         INVALID),
    row("append_too_large",        On::Plain,    400, "append_too_large",        INVALID),
    row("invalid_type",            On::Plain,    400, "invalid_type",            INVALID),
    row("too_many_tags",           On::Plain,    400, "too_many_tags",           INVALID),
    row("invalid_tag",             On::Plain,    400, "invalid_tag",             INVALID),
    row("query_too_large",         On::Plain,    400, "query_too_large",         INVALID),
    row("invalid_read_options",    On::Plain,    400, "invalid_read_options",    HTTP_ONLY),
    row("invalid_tracking",        On::Plain,    400, "invalid_tracking",        INVALID),
    row("tracking_not_increasing", On::Plain,    409, "tracking_not_increasing", INTEGRITY),
    row("condition_failed",        On::Plain,    200, "condition_failed",        INTEGRITY),
    row("off_machine_unavailable", On::Plain,    409, "off_machine_unavailable", HTTP_ONLY),
    row("no_subjects",             On::Plain,    409, "no_subjects",             HTTP_ONLY),
    row("reserved_type",           On::Plain,    400, "reserved_type",           INVALID),
    row("reserved_type",           On::Subjects, 400, "reserved_type",           INVALID),
    row("subject_erased",          On::Subjects, 409, "subject_erased",          INVALID),
    row("not_a_subject",           On::Subjects, 400, "not_a_subject",           HTTP_ONLY),
    row("sync_unavailable",        On::Memory,   400, "sync_unavailable",        HTTP_ONLY),
    row("read_only_replica",       On::Replica,  403, "read_only_replica",       INVALID),
];

/// The library's kinds no request of a client provokes, and why.
const NOT_LIVE: &[(&str, &str)] = &[
    ("io", "a fault of the store's own"),
    ("corrupt", "a fault of the store's own"),
    ("locked", "a fault of the store's own, at open"),
    ("invalid_option", "a fault of the configuration, at open"),
    ("store_poisoned", "a fault of the store's own"),
    ("closed", "a server shutting down, a race with its signal"),
    (
        "database_unavailable",
        "a database store's fault: server_postgres.rs",
    ),
    (
        "outcome_unknown",
        "a database store's fault: server_postgres.rs",
    ),
    ("disk_full", "a full file system: server_disk.rs"),
    ("database", "a database store's fault"),
    ("copy", "a copy between stores, not a request"),
    ("backup", "a fault of the backup's object storage"),
    ("subjects", "a fault of the subjects' keys"),
    ("queue_full", "a writer slower than its clients, a race"),
    (
        "admission_changed",
        "a schema registered while an append was judged, a race the server retries: the \
         library's tests/schemas.rs",
    ),
    (
        "malformed_stored_append",
        "an append copied from another log, not a request",
    ),
];

/// The plain server's limits: small enough that each limit is broken by a short request.
const LIMITS: &str = "[limits]
event_bytes_max = 100
events_per_append_max = 4
append_bytes_max = 256
tags_per_event_max = 2
query_items_max = 2
";
/// The tracking source of the seed event, and the position recorded with it.
const SOURCE: &str = "upstream";
const SEEN: u64 = 5;
/// The data subject erased on the subjects' server.
const ERASED: &str = "customer:7";

/// An event in terms both front ends carry.
struct Event {
    event_type: String,
    tags: Vec<String>,
    data: String,
}

fn event(event_type: &str, tags: &[&str], data: &str) -> Event {
    Event {
        event_type: event_type.into(),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        data: data.into(),
    }
}

/// An append in terms both front ends carry, but for a durability class.
#[derive(Default)]
struct Append {
    events: Vec<Event>,
    /// Fail if an event carrying this tag exists.
    condition: Option<&'static str>,
    tracking: Option<(&'static str, u64)>,
    /// The least class asked for: UmaDB's append has no field for it.
    durability: Option<&'static str>,
}

/// One request of a client.
enum Request {
    Append(Append),
    /// A read: a query item per tag, and read options as JSON (UmaDB's read has none).
    Read {
        tags: Vec<&'static str>,
        options: Option<&'static str>,
    },
    /// An erasure of a data subject: there is no gRPC call for it.
    Erase(&'static str),
}

/// The request that provokes `kind` (on the server its row names).
fn request(kind: &str) -> Request {
    let append = |events: Vec<Event>| {
        Request::Append(Append {
            events,
            ..Append::default()
        })
    };
    let one = || vec![event("Noted", &["k:2"], "x")];
    let one_with = |more: Append| {
        Request::Append(Append {
            events: one(),
            ..more
        })
    };
    match kind {
        // No events, and a tracking position that needs one to travel with: no events and
        // no tracking is no error, but an empty append answered with position zero.
        "no_events" => Request::Append(Append {
            tracking: Some((SOURCE, SEEN + 1)),
            ..Append::default()
        }),
        "too_many_events" => append((0..5).map(|_| event("Noted", &[], "x")).collect()),
        "event_too_large" => append(vec![event("Noted", &[], &"x".repeat(101))]),
        // Each event within its limit, together beyond the append's.
        "append_too_large" => append(
            (0..3)
                .map(|_| event("Noted", &[], &"x".repeat(90)))
                .collect(),
        ),
        "invalid_type" => append(vec![event("", &[], "x")]),
        "too_many_tags" => append(vec![event("Noted", &["a:1", "a:2", "a:3"], "x")]),
        "invalid_tag" => append(vec![event("Noted", &[""], "x")]),
        "query_too_large" => Request::Read {
            tags: vec!["a:1", "a:2", "a:3"],
            options: None,
        },
        "invalid_read_options" => Request::Read {
            tags: vec![],
            options: Some(r#"{"from":1,"after":1}"#),
        },
        // A source the server passes on (it refuses only an empty one) and the store refuses.
        "invalid_tracking" => one_with(Append {
            tracking: Some(("up\u{1}stream", SEEN + 1)),
            ..Append::default()
        }),
        "tracking_not_increasing" => one_with(Append {
            tracking: Some((SOURCE, SEEN)),
            ..Append::default()
        }),
        "condition_failed" => one_with(Append {
            condition: Some("k:1"),
            ..Append::default()
        }),
        "off_machine_unavailable" => one_with(Append {
            durability: Some("d4"),
            ..Append::default()
        }),
        "sync_unavailable" => one_with(Append {
            durability: Some("d3"),
            ..Append::default()
        }),
        "reserved_type" => append(vec![event(annals::SUBJECT_ERASED_TYPE, &["note:1"], "{}")]),
        "subject_erased" => append(vec![event("Moved", &[ERASED], "x")]),
        "not_a_subject" => Request::Erase("order:1"),
        "no_subjects" => Request::Erase("customer:1"),
        "read_only_replica" => append(one()),
        other => panic!("no request provokes {other}"),
    }
}

/// The events every server holds before the refusals: one, with a tracking position.
fn seed() -> Append {
    Append {
        events: vec![event("Seeded", &["k:1"], "x")],
        tracking: Some((SOURCE, SEEN)),
        ..Append::default()
    }
}

impl Append {
    fn json(&self) -> String {
        let events: Vec<Value> = self
            .events
            .iter()
            .map(|e| json!({"type": e.event_type, "tags": e.tags, "data": e.data}))
            .collect();
        let mut body = json!({ "events": events });
        if let Some(tag) = self.condition {
            body["condition"] = json!({"failIfEventsMatch": query_json(&[tag])});
        }
        if let Some((source, position)) = self.tracking {
            body["tracking"] = json!({"source": source, "position": position});
        }
        if let Some(class) = self.durability {
            body["durability"] = json!(class);
        }
        body.to_string()
    }

    /// UmaDB's append request, or None when it cannot carry this one.
    fn grpc(&self) -> Option<v1::AppendRequest> {
        if self.durability.is_some() {
            return None;
        }
        let events = self
            .events
            .iter()
            .map(|e| v1::Event {
                event_type: e.event_type.clone(),
                tags: e.tags.clone(),
                data: e.data.clone().into_bytes(),
                uuid: String::new(),
                metadata: Vec::new(),
            })
            .collect();
        Some(v1::AppendRequest {
            events,
            condition: self.condition.map(|tag| v1::AppendCondition {
                fail_if_events_match: Some(query_proto(&[tag])),
                after: None,
            }),
            tracking_info: self.tracking.map(|(source, position)| v1::TrackingInfo {
                source: source.into(),
                position,
            }),
        })
    }
}

fn query_json(tags: &[&str]) -> Value {
    let items: Vec<Value> = tags.iter().map(|t| json!({"tags": [t]})).collect();
    json!({ "items": items })
}

fn query_proto(tags: &[&str]) -> v1::Query {
    v1::Query {
        items: tags
            .iter()
            .map(|t| v1::QueryItem {
                types: Vec::new(),
                tags: vec![t.to_string()],
            })
            .collect(),
    }
}

impl Request {
    fn http(&self, server: &ServerProcess) -> Response {
        match self {
            Request::Append(append) => server.post("/v1/append", &append.json()),
            Request::Read { tags, options } => server.get(&format!(
                "/v1/read?query={}&options={}",
                encode(&query_json(tags).to_string()),
                encode(options.unwrap_or("{}"))
            )),
            Request::Erase(tag) => {
                server.post("/v1/admin/erase", &json!({ "tag": tag }).to_string())
            }
        }
    }

    /// Sends the request over gRPC: the status it was refused with, or None when UmaDB's
    /// protocol cannot carry it.
    async fn grpc(&self, client: &mut DcbClient<Channel>) -> Option<tonic::Status> {
        let answer = match self {
            Request::Append(append) => client.append(append.grpc()?).await.map(drop),
            Request::Read {
                tags,
                options: None,
            } => {
                let read = v1::ReadRequest {
                    query: Some(query_proto(tags)),
                    ..v1::ReadRequest::default()
                };
                match client.read(read).await {
                    Ok(stream) => {
                        let mut stream = stream.into_inner();
                        loop {
                            match stream.message().await {
                                Ok(Some(_)) => continue,
                                Ok(None) => break Ok(()),
                                Err(status) => break Err(status),
                            }
                        }
                    }
                    Err(status) => Err(status),
                }
            }
            Request::Read { .. } | Request::Erase(_) => return None,
        };
        Some(answer.expect_err("the request was accepted"))
    }
}

/// Sends the request of every row provoked `on` this server over HTTP and gRPC, and compares
/// the answers with the row; then the server still serves, and its log holds the events
/// `acknowledged` names by type, nothing more: no refused request appended anything.
fn walk(server: &ServerProcess, on: On, acknowledged: &[&str]) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut client = runtime.block_on(async {
        let channel = Channel::from_shared(server.grpc_url())
            .unwrap()
            .connect()
            .await
            .unwrap();
        DcbClient::new(channel)
    });
    for row in CONTRACT.iter().filter(|row| row.on == on) {
        let kind = row.kind;
        let request = request(kind);
        let answer = request.http(server);
        assert_eq!(
            answer.status,
            row.http,
            "{kind} over HTTP: {}",
            answer.text()
        );
        let body = answer.json();
        if row.http == 200 {
            assert_eq!(body["appendConditionFailed"], true, "{kind}: {body}");
            assert!(body.get("kind").is_none(), "{kind}: {body}");
        } else {
            assert_eq!(body["kind"], row.http_kind, "{kind} over HTTP: {body}");
        }
        let refused = runtime.block_on(request.grpc(&mut client));
        match (refused, row.grpc) {
            (Some(status), Some(code)) => {
                assert_eq!(
                    status.code(),
                    code,
                    "{kind} over gRPC: {}",
                    status.message()
                );
                // UmaDB's clients read the error's type from the details.
                let details = v1::ErrorResponse::decode(status.details());
                assert!(
                    details.is_ok_and(|d| !d.message.is_empty()),
                    "{kind} over gRPC"
                );
            }
            (None, None) => {}
            (refused, code) => panic!("{kind}: the row says {code:?} over gRPC, sent: {refused:?}"),
        }
    }
    let health = server.get("/health");
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(health.json()["status"], "ok", "{}", health.text());
    let read: Vec<Value> = server.read("{}", "{}");
    let types: Vec<&str> = read.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, acknowledged);
    let head = acknowledged.len() as u64;
    assert_eq!(server.head(), head);
    let grpc_head = runtime
        .block_on(client.head(v1::HeadRequest {}))
        .unwrap()
        .into_inner()
        .position;
    assert_eq!(grpc_head, Some(head).filter(|&h| h > 0));
}

/// Goal: every refusal a client can provoke against a plain file store answers as the contract
/// says over both front ends, and none changes the log. Method: a server with small limits,
/// holding one event appended with a tracking position; each row's request sent over HTTP and,
/// where UmaDB's protocol carries it, over gRPC; the log read back holds the one event.
#[test]
fn a_file_store_refuses_by_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.toml");
    std::fs::write(&config, LIMITS).unwrap();
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    server.append(&seed().json());
    walk(&server, On::Plain, &["Seeded"]);
}

/// Goal: the refusals a store with data subjects adds (an erased subject, a tag naming no
/// subject, the type of its own erasure receipts) answer as the contract says. Method: a
/// server with subject tags and a master key; an event of a subject appended, the subject
/// erased over HTTP (which appends its receipt); each row's request sent; the log holds the
/// event and the receipt. Erasing has no gRPC call: `not_a_subject` is walked over HTTP only.
#[test]
fn a_store_with_data_subjects_refuses_by_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(ANNALS)
        .args(["master-key", "new"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let master = dir.path().join("master.key");
    std::fs::write(&master, out.stdout).unwrap();
    let flags = [
        "--subject-tags",
        "customer:",
        "--master-key-file",
        master.to_str().unwrap(),
    ];
    let server = ServerProcess::start(&dir.path().join("data"), &flags);
    let subject = Append {
        events: vec![event("Moved", &[ERASED], "x")],
        ..Append::default()
    };
    server.append(&subject.json());
    let erased = server.post("/v1/admin/erase", &json!({ "tag": ERASED }).to_string());
    assert_eq!(erased.status, 200, "{}", erased.text());
    walk(
        &server,
        On::Subjects,
        &["Moved", annals::SUBJECT_ERASED_TYPE],
    );
}

/// Goal: a memory-only store refuses an append that asks to be synced, as the contract says.
/// Method: a memory-only server; an append without a class taken, one asking for the synced
/// class refused; the log holds the first. UmaDB's append carries no class: HTTP only.
#[test]
fn a_memory_store_refuses_a_sync_by_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &["--durability", "d0"]);
    let plain = Append {
        events: vec![event("Seeded", &["k:1"], "x")],
        ..Append::default()
    };
    server.append(&plain.json());
    walk(&server, On::Memory, &["Seeded"]);
}

/// Goal: a read replica refuses appends as the contract says, over both front ends, and
/// neither it nor its primary takes them. Method: a primary ships its backup to a directory;
/// once the backup holds the seed event, a replica follows it; appends sent to the replica
/// are refused; both logs hold the seed event only.
#[test]
fn a_read_replica_refuses_appends_by_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("backup").display());
    let primary = ServerProcess::start(&dir.path().join("primary"), &["--backup", &url]);
    primary.append(&seed().json());
    let wait = Duration::from_secs(60);
    primary.await_backup_shipped(wait);
    let mut replica = ServerProcess::launch_with(&["--replica-of", &url], &[]);
    annals_testkit::eventually("the replica to hold the seed event", wait, || {
        replica.head() == 1
    });
    walk(&replica, On::Replica, &["Seeded"]);
    assert_eq!(primary.head(), 1);
    // Stopped cleanly, so that its copy of the log in a temporary directory goes too.
    assert!(replica.terminate().success());
}

/// Goal: the contract leaves no kind out. Method: every kind the library gives an error is
/// either walked (on one server or several) or named with the reason no client provokes it,
/// never both; and each of those is a kind of the library's.
#[test]
fn every_kind_is_walked_live_or_said_why_not() {
    for kind in annals::ERROR_KINDS {
        let live = CONTRACT.iter().any(|row| row.kind == *kind);
        let not_live = NOT_LIVE.iter().filter(|(k, _)| k == kind).count();
        assert_eq!(
            usize::from(live) + not_live,
            1,
            "{kind}: rows, or a reason why not"
        );
    }
    let named = CONTRACT
        .iter()
        .map(|row| row.kind)
        .chain(NOT_LIVE.iter().map(|(k, _)| *k));
    for kind in named {
        assert!(
            annals::ERROR_KINDS.contains(&kind),
            "{kind} is no kind of the library's"
        );
    }
}
