//! `annals serve --store postgres://...`: several servers on one database, killed with -9 under
//! conditional load, followed by subscribers; and the database's primary killed with -9 while a
//! synchronous standby is promoted. Real PostgreSQL clusters (annals-testkit), never a mock.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use annals_testkit::Cluster;
use common::answers::{appender, check_answers, Answer, Tally};
use common::claims::{check_claims, client};
use common::{ServerProcess, Stream};

/// A primary with a synchronous standby, and a URL that names both and finds the primary;
/// None without PostgreSQL (the test command requires it).
fn primary_and_standby() -> Option<(Cluster, Cluster, String)> {
    let primary = Cluster::start()?;
    let standby = primary.synchronous_standby();
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    Some((primary, standby, url))
}

/// A postgres:// URL for the cluster's `postgres` database.
fn url(cluster: &Cluster) -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port())
}

/// Follows `/v1/subscribe` from the start until `stop`; returns the positions seen.
fn subscriber(addr: std::net::SocketAddr, stop: Arc<AtomicBool>) -> Vec<u64> {
    let mut stream = Stream::open(addr, "/v1/subscribe", &[]);
    assert_eq!(stream.status, 200);
    let mut seen = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Some(line) = stream.next_line() else {
            break;
        };
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if let Some(p) = value["position"].as_u64() {
            seen.push(p);
        }
    }
    seen
}

/// Goal: two servers on one database, 32 clients claiming keys through both (each key at most
/// once, by a condition), one server killed with -9 mid-load and restarted: no condition is
/// ever violated, positions are gapless, every acknowledged claim is stored exactly once, and
/// a subscriber on the other server sees every position once, in order, while both append.
/// The killed server keeps its copy of the log in a directory (`--mirror`): after each kill it
/// fills it from the database again (its writes there were never synced); after a clean stop
/// it uses it as it was left.
#[test]
fn two_servers_on_one_database_under_kill9() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = url(&cluster);
    let kept = tempfile::tempdir().unwrap();
    let mirror = kept.path().join("mirror");
    let mirror_flag = ["--mirror", mirror.to_str().unwrap()];
    let started_line = |server: &ServerProcess| -> String {
        server
            .startup
            .iter()
            .find(|l| l.contains("the log's copy"))
            .cloned()
            .unwrap_or_else(|| panic!("no line on the log's copy in {:?}", server.startup))
    };
    let mut acked: Vec<(u64, String)> = Vec::new();
    let mut a = ServerProcess::start_postgres(&url, &mirror_flag);
    assert!(
        started_line(&a).contains("none was kept here yet"),
        "{}",
        started_line(&a)
    );
    let b = ServerProcess::start_postgres(&url, &[]);
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop_watch.clone();
        let addr = b.http;
        std::thread::spawn(move || subscriber(addr, stop))
    };
    for round in 0..2 {
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..32)
            .map(|id| {
                let stop = stop.clone();
                let addr = if id % 2 == 0 { a.http } else { b.http };
                std::thread::spawn(move || client(addr, id, round, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        a.kill9();
        // B goes on alone for a while: its clients keep appending.
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            acked.extend(c.join().unwrap());
        }
        a = ServerProcess::start_postgres(&url, &mirror_flag);
        let line = started_line(&a);
        assert!(line.contains("it was not closed cleanly"), "{line}");
        let events = a.read("{}", "{}");
        check_claims(&events, &acked);
        assert_eq!(b.read("{}", "{}"), events, "both servers hold the same log");
    }
    // A clean stop: the next start uses the copy as it was left, reading only what b
    // committed meanwhile.
    let left_at = a.head();
    assert!(a.terminate().success());
    b.append(&common::append_body(&[("Meanwhile", &[], "x")], None));
    a = ServerProcess::start_postgres(&url, &mirror_flag);
    let line = started_line(&a);
    assert!(
        line.contains(&format!(
            "used as closed at position {left_at}; 1 appends read"
        )),
        "{line}"
    );
    assert_eq!(a.read("{}", "{}"), b.read("{}", "{}"));
    let head = b.head();
    // The subscriber has everything up to the head within moments.
    // (Waited for, not required: the watcher's count below is what is checked.)
    let _ = annals_testkit::poll(
        "the second server's head to reach the first's",
        Duration::from_secs(10),
        || b.get("/v1/stats").json()["head"].as_u64() == Some(head),
    );
    std::thread::sleep(Duration::from_millis(500));
    stop_watch.store(true, Ordering::Relaxed);
    // One more append wakes the stream so the watcher sees the stop.
    b.append(&common::append_body(&[("Wake", &[], "x")], None));
    let seen = watcher.join().unwrap();
    assert!(
        seen.len() as u64 >= head,
        "the subscriber saw {} of {head}",
        seen.len()
    );
    for (i, p) in seen.iter().enumerate() {
        assert_eq!(*p, i as u64 + 1, "the subscriber saw a gap or a duplicate");
    }
    eprintln!(
        "{} acknowledged claims over two servers and two kills",
        acked.len()
    );
    assert!(
        acked.len() > 50,
        "too few answers ({}) to mean much",
        acked.len()
    );
    // The database's own counters: b committed groups and followed a's appends.
    let metrics = String::from_utf8(b.get("/metrics").body).unwrap();
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from /metrics"))
    };
    assert!(value("annals_database_commits_total") > 0);
    assert!(value("annals_database_followed_total") > 0);
    assert_eq!(value("annals_database_unknown_outcomes_total"), 0);
    // Its appends went by the database's routes only (the server's appends are async: the
    // committer's queue); the mirror's writer counts none of them again.
    let route = |name: &str| value(&format!("annals_commits_total{{route=\"{name}\"}}"));
    assert!(route("database") > 0);
    for files in ["queued", "held", "staged", "alone"] {
        assert_eq!(route(files), 0, "{files}");
    }
}

/// Goal: the loss of the database's primary loses no acknowledged append. Method: a primary
/// with a synchronous standby; a server given both hosts (target_session_attrs=read-write);
/// 16 clients claiming keys; the primary killed with -9 and the standby promoted. Appends
/// fail while no primary answers (never acknowledged), then succeed on the new primary; every
/// acknowledged claim is there exactly once.
#[test]
fn failover_to_a_synchronous_standby_loses_nothing() {
    let Some((primary, standby, url)) = primary_and_standby() else {
        return;
    };
    let server = ServerProcess::start_postgres(&url, &[]);
    let mut acked: Vec<(u64, String)> = Vec::new();
    for round in 0..2 {
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..16)
            .map(|id| {
                let stop = stop.clone();
                let addr = server.http;
                std::thread::spawn(move || client(addr, id, round, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(600));
        if round == 0 {
            primary.kill9();
            standby.promote();
        }
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            acked.extend(c.join().unwrap());
        }
    }
    let events = server.read("{}", "{}");
    check_claims(&events, &acked);
    let after: Vec<_> = acked.iter().filter(|(k, _)| *k >= 400).collect();
    assert!(
        !after.is_empty(),
        "appends succeed again on the promoted standby"
    );
    // A fresh server on the promoted standby holds the same log.
    let fresh = ServerProcess::start_postgres(
        &format!("postgres://postgres@127.0.0.1:{}/postgres", standby.port()),
        &[],
    );
    assert_eq!(fresh.read("{}", "{}"), events);
    eprintln!("{} acknowledged claims across a failover", acked.len());
}

/// Every client session of `cluster` terminated (as a database restart, a failover or a
/// connection pooler does), `times` times, `every` apart.
fn terminate_sessions(cluster: &Cluster, times: usize, every: Duration) {
    for _ in 0..times {
        std::thread::sleep(every);
        cluster.sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        );
    }
}

/// Appends through UmaDB's Rust client (gRPC) until `stop`, each a `Noted` event whose data is
/// a nonce of its own (`g{id}-n{n}`), counting those stored in `stored`; returns every answer
/// by nonce, read from the error the client gives (its message is the server's).
fn grpc_appender(
    url: String,
    id: usize,
    stop: Arc<AtomicBool>,
    stored: Arc<AtomicUsize>,
) -> Vec<(String, Answer)> {
    use umadb_dcb::{DcbEvent, DcbEventStoreSync};
    let client = umadb_client::UmaDbClient::new(url).connect().unwrap();
    let mut answers = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let nonce = format!("g{id}-n{n}");
        n += 1;
        let event = DcbEvent {
            event_type: "Noted".into(),
            tags: vec![format!("nonce:{nonce}")],
            data: nonce.clone().into_bytes(),
            uuid: None,
            metadata: Vec::new(),
        };
        let answer = match client.append(vec![event], None, None) {
            Ok(_) => {
                stored.fetch_add(1, Ordering::Relaxed);
                Answer::Stored
            }
            Err(e) => {
                let message = e.to_string();
                if message.contains("nothing was appended") {
                    Answer::Unavailable
                } else {
                    // The outcome is unknown, or no answer came at all.
                    Answer::Unknown
                }
            }
        };
        answers.push((nonce, answer));
    }
    answers
}

/// Runs 8 HTTP clients and 2 gRPC clients (UmaDB's Rust client) appending to `server` while
/// `faults` runs, then checks every answer against the log the server reads back.
fn answers_under(server: &ServerProcess, faults: impl FnOnce()) -> (Tally, Vec<(String, Answer)>) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients: Vec<_> = (0..8)
        .map(|id| {
            let stop = stop.clone();
            let addr = server.http;
            std::thread::spawn(move || appender(addr, id, stop))
        })
        .collect();
    let stored: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::default()).collect();
    clients.extend(stored.iter().enumerate().map(|(id, stored)| {
        let (stop, stored) = (stop.clone(), stored.clone());
        let url = server.grpc_url();
        std::thread::spawn(move || grpc_appender(url, id, stop, stored))
    }));
    faults();
    // Appends go on a moment after the last fault, and until each gRPC client (which may
    // wait to connect again) has had one stored since, so that the server is seen to recover.
    let after: Vec<usize> = stored.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    std::thread::sleep(Duration::from_millis(700));
    annals_testkit::eventually(
        "each gRPC client's appends stored again after the faults",
        Duration::from_secs(30),
        || (stored.iter().zip(&after)).all(|(n, &before)| n.load(Ordering::Relaxed) > before),
    );
    stop.store(true, Ordering::Relaxed);
    let answers: Vec<(String, Answer)> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let events = server.read("{}", "{}");
    let tally = check_answers(&events, &answers);
    eprintln!("{tally:?}");
    assert!(
        tally.stored > 100,
        "too few appends stored to mean much: {tally:?}"
    );
    assert!(
        answers
            .iter()
            .any(|(n, a)| n.starts_with('g') && *a == Answer::Stored),
        "the gRPC clients appended too"
    );
    let last: Vec<_> = answers.iter().rev().take(8).collect();
    assert!(
        last.iter().any(|(_, a)| *a == Answer::Stored),
        "appends are taken again after the faults: {last:?}"
    );
    (tally, answers)
}

/// Goal: every answer an append gets while the database ends the server's sessions is true,
/// over HTTP and over gRPC.
/// Story: with 8 clients appending while every client session was terminated 12 times, a few
/// appends answered `database_unavailable` ("nothing was appended") were in the log: the
/// session's end came as a FATAL error after the commit, which the server took for the
/// statement's own failure, so a client that retried stored the event twice. Method: the same
/// load against a real cluster; every answer kept by the append's nonce and checked against
/// the log read back: every acknowledged append there once, every `database_unavailable` one
/// absent, `outcome_unknown` ones there at most once (and rare: the server resolves what it
/// can by reading the log after reconnecting).
#[test]
fn every_answer_holds_while_the_database_ends_sessions() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let server = ServerProcess::start_postgres(&url(&cluster), &[]);
    let (tally, _) = answers_under(&server, || {
        terminate_sessions(&cluster, 12, Duration::from_millis(400))
    });
    // The database answered throughout: every outcome is settled, none left unknown.
    assert_eq!(tally.unknown, 0, "{tally:?}");
    assert!(
        metric(&server, "annals_database_settled_outcomes_total") > 0,
        "sessions ended during commits, and their outcomes were settled"
    );
    assert_eq!(metric(&server, "annals_database_unknown_outcomes_total"), 0);
}

/// A counter of the server's /metrics.
fn metric(server: &ServerProcess, name: &str) -> u64 {
    let metrics = String::from_utf8(server.get("/metrics").body).unwrap();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

/// Goal: the same during a failover to a synchronous standby. Method: a primary with a
/// synchronous standby and a server given both hosts; 8 clients appending while sessions are
/// terminated on the primary, the primary killed with -9, the standby promoted, and sessions
/// terminated on it; every answer checked against the log by nonce.
#[test]
fn every_answer_holds_across_a_failover() {
    let Some((primary, standby, url)) = primary_and_standby() else {
        return;
    };
    let server = ServerProcess::start_postgres(&url, &[]);
    answers_under(&server, || {
        terminate_sessions(&primary, 3, Duration::from_millis(400));
        std::thread::sleep(Duration::from_millis(300));
        primary.kill9();
        standby.promote();
        terminate_sessions(&standby, 3, Duration::from_millis(400));
    });
    let unknown = metric(&server, "annals_database_unknown_outcomes_total");
    assert_eq!(
        unknown, 0,
        "the standby was promoted at once: every outcome is settled"
    );
}

/// Goal: on PostgreSQL, a server restarted after SIGTERM resumes its read models from their
/// checkpoints and the hosted exchange from its snapshot (both kept in the database, not in
/// the server's temporary mirror), rather than replaying the whole log.
#[test]
fn read_models_and_the_exchange_resume_from_the_database() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = url(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("annals.toml");
    std::fs::write(
        &config,
        "[[read_models]]\nname = \"counts\"\ntypes = [\"Counted\"]\ngroup_by = \"k:\"\n\
         [exchange]\nmode = \"d3-pipelined\"\nsymbols = [{ tick = 1, lot = 1 }]\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let mut server = ServerProcess::start_postgres(&url, &args);
    for i in 0..30 {
        server.append(&format!(
            r#"{{"events":[{{"type":"Counted","tags":["k:{}"],"data":"{i}"}}]}}"#,
            i % 3
        ));
    }
    for i in 0..10u64 {
        let side = if i % 2 == 0 { "buy" } else { "sell" };
        let body = format!(
            r#"{{"account":{},"symbol":0,"side":"{side}","price":{},"qty":1}}"#,
            i % 4,
            100 + i % 3
        );
        assert_eq!(server.post("/v1/exchange/orders", &body).status, 200);
    }
    let head = server.head();
    let wait = format!("/v1/readmodels/counts?minPosition={head}&waitMs=10000");
    assert_eq!(server.get(&wait).json()["total"], 30);
    assert!(server.terminate().success());

    let server = ServerProcess::start_postgres(&url, &args);
    let model = server.get(&wait).json();
    assert_eq!(model["rebuiltBecause"], serde_json::Value::Null, "{model}");
    assert!(model["resumedFrom"].as_u64().unwrap() > 0, "{model}");
    assert_eq!(model["total"], 30, "{model}");
    let exchange = server.get("/v1/exchange").json();
    assert!(
        exchange["started"]["snapshotPosition"].as_u64().is_some(),
        "{exchange}"
    );
    assert_eq!(exchange["started"]["replayed"], 0, "{exchange}");
    assert_eq!(exchange["started"]["commands"], 10, "{exchange}");
}

/// Goal: a server on PostgreSQL that turns idle after committing listens again: another server's
/// single appends reach it by notification, well before its poll would take them in.
#[test]
fn an_idle_server_is_woken_by_another_servers_commits() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = url(&cluster);
    let a = ServerProcess::start_postgres(&url, &[]);
    let b = ServerProcess::start_postgres(&url, &[]);
    let event = r#"{"events":[{"type":"T","tags":["k:1"],"data":"x"}]}"#;
    // B is busy for a while (it does not listen then), then idle.
    for _ in 0..200 {
        b.append(event);
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut lags = Vec::new();
    for _ in 0..15 {
        let position = a.append(event)["position"].as_u64().unwrap();
        let sent = Instant::now();
        while b.head() < position {
            assert!(
                sent.elapsed() < Duration::from_secs(10),
                "B never saw {position}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        lags.push(sent.elapsed());
        // Off the poll's rhythm, so that a poll alone would answer after 250 ms on average.
        std::thread::sleep(Duration::from_millis(37));
    }
    lags.sort();
    let median = lags[lags.len() / 2];
    assert!(
        median < Duration::from_millis(150),
        "median lag {median:?}: {lags:?}"
    );
}

/// Goal: a server on PostgreSQL that cannot take its port says so and exits. Regression: it used to
/// panic while closing its database connections on the async runtime.
#[test]
fn a_server_that_cannot_listen_says_so() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = url(&cluster);
    let a = ServerProcess::start_postgres(&url, &[]);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
        .args(["serve", "--store", &url, "--grpc", "off", "--http"])
        .arg(a.http.to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("cannot listen"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Goal: UmaDB's Python client, and the Python eventsourcing library's UmaDB persistence
/// module (recorders, applications, projections), work unchanged against a server whose store
/// is in PostgreSQL, as they do against one on files (server_grpc.rs runs the same suite
/// there). The library's tests each get a fresh database of the cluster.
#[test]
fn umadb_python_client_on_postgres() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let server = ServerProcess::start_postgres(&url(&cluster), &[]);
    let bin = annals_testkit::bin_dir().expect("PostgreSQL's programs");
    common::python_suite(&[
        ("ANNALS_GRPC_URL", server.grpc_url()),
        ("ANNALS_PG_PORT", cluster.port().to_string()),
        ("ANNALS_PG_BIN", bin.display().to_string()),
    ]);
}

/// Goal: two servers on one PostgreSQL database enforce the same event schemas: a version
/// registered through one judges the other's appends at once (B admits under the registry it
/// has seen; its commit, fenced there, finds A's version and is judged again), the history
/// check reads what the other stored, and a restart keeps the registry. Method: an event
/// appended on B, a version it breaks refused on A; another type registered on A, then
/// appended to on B straight away, valid and invalid; B restarted.
#[test]
fn two_servers_enforce_the_same_schemas() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let a = ServerProcess::start_postgres(&url(&cluster), &[]);
    let mut b = ServerProcess::start_postgres(&url(&cluster), &[]);
    let event = |data: &str| common::append_body(&[("Opened", &["account:1"], data)], None);
    let before = b.append(&event(r#"{"id":"before"}"#))["position"].as_u64();
    let schema = serde_json::json!({"schema": {
        "type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}
    }, "check": "previously_accepted"});
    // Stored events break it: refused on A, naming the one on B.
    let refused = a.post("/v1/admin/schemas/Opened", &schema.to_string());
    assert_eq!(refused.status, 409, "{}", refused.text());
    assert_eq!(refused.json()["violations"][0]["position"].as_u64(), before);
    let other = a.post("/v1/admin/schemas/Opened2", &schema.to_string());
    assert_eq!(other.status, 201, "{}", other.text());
    let event2 = |data: &str| common::append_body(&[("Opened2", &[], data)], None);
    let refused = b.post("/v1/append", &event2(r#"{"id":"x"}"#));
    assert_eq!(
        refused.status,
        422,
        "B judges by A's version at once: {}",
        refused.text()
    );
    b.append(&event2(r#"{"id":1}"#));
    assert_eq!(b.get("/v1/schemas").json(), a.get("/v1/schemas").json());
    // Registrations of the same version on both servers at once: exactly one wins each time,
    // whichever server it came through.
    for round in 0..5 {
        let path = format!("/v1/admin/schemas/Raced{round}");
        let statuses: Vec<u16> = [a.http, b.http]
            .map(|addr| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let body = format!(r#"{{"schema":{{"title":"{addr}"}},"version":1}}"#);
                    let headers = [("content-type", "application/json")];
                    common::request(addr, "POST", &path, &headers, body.as_bytes()).status
                })
            })
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let mut sorted = statuses.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [201, 409], "round {round}: {statuses:?}");
    }
    let listed = a.get("/v1/schemas").json();
    b.terminate();
    let b = ServerProcess::start_postgres(&url(&cluster), &[]);
    assert_eq!(b.get("/v1/schemas").json(), listed);
    assert_eq!(b.post("/v1/append", &event2("{}")).status, 422);
}
