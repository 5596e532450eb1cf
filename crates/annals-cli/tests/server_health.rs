//! `annals serve`'s readiness and liveness where an operator looks (/ready, /health, /metrics,
//! `annals stats`): a read replica's lag and a backup it cannot read, and a D4 server whose
//! backup fails. (The HTTP API itself is server_http.rs.)

mod common;

use std::time::Duration;

use annals_testkit::eventually;
use common::{append_body, request, ServerProcess};
use serde_json::Value;

/// A sample of a server's /metrics, named with its labels as written (`name{label="v"}`).
fn sample(server: &ServerProcess, name: &str) -> Option<f64> {
    annals_testkit::server::sample(&server.get("/metrics").text(), name)
}

/// `annals health` with `args` and the variables `env`: whether it exited 0, and what it
/// printed (both streams).
fn annals_health_with(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
        .arg("health")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn annals_health(args: &[&str]) -> (bool, String) {
    annals_health_with(args, &[])
}

/// Goal: `annals health` exits 0 with /health's answer when the server answers, and not when
/// nothing listens: by default it asks the listener ANNALS_HTTP_LISTEN configures (a wildcard
/// host asked on loopback), as a container's health check does.
#[test]
fn annals_health_answers_only_for_a_server_that_serves() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let listen = format!("0.0.0.0:{}", server.http.port());
    let (live, out) = annals_health_with(&[], &[("ANNALS_HTTP_LISTEN", &listen)]);
    assert!(live, "{out}");
    let answer: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(answer["status"], "ok", "{answer}");
    let (ready, out) = annals_health(&["--url", &format!("http://{}", server.http), "--ready"]);
    assert!(ready, "{out}");
    let gone = format!("http://{}", server.http);
    drop(server);
    let (live, out) = annals_health(&["--url", &gone]);
    assert!(!live && out.contains("cannot connect"), "{out}");
}

/// How long a test waits for a replica or a server to get somewhere.
const WAIT: Duration = Duration::from_secs(30);

/// An append of one small event.
fn one_event(n: u64) -> String {
    append_body(&[("E", &["k:1"], &n.to_string())], None)
}

/// Goal: a read replica's freshness and failures show where an operator looks. Story: with
/// its backup unreadable, a replica's /health said ok, /metrics had no replica series and
/// counted nothing on the `replicated` route, `annals stats` and the console showed nothing,
/// and its start said neither where its copy lives nor that it acknowledges no appends.
/// Method: a primary server ships to a local directory and a replica server follows it; its
/// start names its copy's directory and its class; /ready is ok and /metrics says following,
/// with no lag, and counts what it took in as replicated; the backup's directory swapped for
/// a plain file while the primary appends: /ready answers 503 naming `replica_failing`,
/// /metrics and `annals stats --url` say failing with a lag in seconds that grows, /health
/// still answers 200 (the process serves, from its copy) with the replica's state; swapped
/// back: the replica takes in what the primary appended meanwhile and is ready again.
#[test]
fn a_replica_reports_its_lag_and_readiness() {
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("backup");
    let url = format!("file://{}", location.display());
    let mut primary = ServerProcess::start(&dir.path().join("primary"), &["--backup", &url]);
    for n in 0..10 {
        primary.append(&one_event(n));
    }
    primary.await_backup_shipped(WAIT);
    let mut replica = ServerProcess::launch_with(&["--replica-of", &url], &[]);
    let started = replica.startup.join("\n");
    assert!(
        started.contains("acknowledges no appends")
            && started.contains("temporary directory")
            && started.contains(&std::env::temp_dir().display().to_string()),
        "{started}"
    );
    assert_eq!(replica.head(), 10);
    let ready = replica.get("/ready");
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(ready.json(), serde_json::json!({ "status": "ok" }));
    assert_eq!(
        sample(&replica, "annals_replica_state{state=\"following\"}"),
        Some(1.0)
    );
    assert_eq!(sample(&replica, "annals_replica_lag_positions"), Some(0.0));
    assert_eq!(sample(&replica, "annals_ready"), Some(1.0));
    assert_eq!(
        sample(&replica, "annals_commits_total{route=\"replicated\"}"),
        Some(10.0)
    );

    // The backup becomes unreadable; the primary goes on appending.
    let blocked = dir.path().join("blocked");
    std::fs::write(&blocked, "not a backup").unwrap();
    annals_testkit::exchange(&location, &blocked);
    for n in 10..15 {
        primary.append(&one_event(n));
    }
    eventually("the replica is not ready", WAIT, || {
        replica.get("/ready").status == 503
    });
    let ready = replica.get("/ready").json();
    let reasons = ready["reasons"].as_array().unwrap();
    assert!(
        ready["status"] == "unavailable"
            && reasons.len() == 1
            && reasons[0].as_str().unwrap().starts_with("replica_failing:"),
        "{ready}"
    );
    assert_eq!(
        sample(&replica, "annals_replica_state{state=\"failing\"}"),
        Some(1.0)
    );
    assert_eq!(sample(&replica, "annals_ready"), Some(0.0));
    assert!(sample(&replica, "annals_replica_failures_total").unwrap() >= 1.0);
    let lag = sample(&replica, "annals_replica_lag_seconds").unwrap();
    eventually("the lag in seconds grows", WAIT, || {
        sample(&replica, "annals_replica_lag_seconds").unwrap() > lag + 0.5
    });
    let health = replica.get("/health");
    assert_eq!(health.status, 200, "the process serves: {}", health.text());
    assert!(
        health.json()["replica"]["state"] == "failing" && health.json()["durability"] == "replica",
        "{}",
        health.text()
    );
    assert_eq!(replica.head(), 10, "reads go on from the copy");
    // `annals health` (a container's health check) says the same: it serves, not ready.
    let replica_url = format!("http://{}", replica.http);
    let (live, out) = annals_health(&["--url", &replica_url]);
    assert!(live && out.contains("\"failing\""), "{out}");
    let (ready, out) = annals_health(&["--url", &replica_url, "--ready"]);
    assert!(!ready && out.contains("replica_failing"), "{out}");
    let stats = std::process::Command::new(env!("CARGO_BIN_EXE_annals"))
        .args([
            "stats",
            "--json",
            "--url",
            &format!("http://{}", replica.http),
        ])
        .output()
        .unwrap();
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert!(
        stats["replica"]["state"] == "failing"
            && stats["replica"]["lag_seconds"].as_f64().unwrap() > 0.5
            && stats["ready"] == false,
        "{stats}"
    );

    // The backup is back: the replica takes in what the primary appended meanwhile.
    annals_testkit::exchange(&location, &blocked);
    eventually("the replica catches up", WAIT, || replica.head() == 15);
    eventually("the replica is ready again", WAIT, || {
        replica.get("/ready").status == 200
    });
    eventually("no lag", WAIT, || {
        sample(&replica, "annals_replica_lag_positions") == Some(0.0)
    });
    assert_eq!(
        sample(&replica, "annals_replica_state{state=\"following\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&replica, "annals_commits_total{route=\"replicated\"}"),
        Some(15.0)
    );
    assert!(replica.terminate().success());
    assert!(primary.terminate().success());
}

/// Goal: readiness says when a promised class cannot be kept, while liveness stays up. Story:
/// /health said ok while the backup of a D4 server failed, so nothing told a load balancer
/// that no append could be acknowledged. Method: a server in D4 shipping to a local directory
/// is ready; the directory swapped for a plain file and an append sent (it waits for object
/// storage): /ready answers 503 naming `backup_failing`, /health still answers 200 with the
/// backup failing; swapped back: the waiting append is answered (acknowledged, or
/// outcome_unknown if it waited past its time), /ready is ok again, and a new append is
/// acknowledged.
#[test]
fn ready_is_unavailable_while_a_d4_backup_fails() {
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("backup");
    let url = format!("file://{}", location.display());
    let mut server = ServerProcess::start(
        &dir.path().join("data"),
        &["--backup", &url, "--durability", "d4"],
    );
    server.append(&one_event(0));
    let ready = server.get("/ready");
    assert_eq!(ready.status, 200, "{}", ready.text());

    let blocked = dir.path().join("blocked");
    std::fs::write(&blocked, "not a backup").unwrap();
    annals_testkit::exchange(&location, &blocked);
    let addr = server.http;
    let waiting = std::thread::spawn(move || {
        request(addr, "POST", "/v1/append", &[], one_event(1).as_bytes())
    });
    eventually("the server is not ready", WAIT, || {
        server.get("/ready").status == 503
    });
    let ready = server.get("/ready").json();
    let reasons = ready["reasons"].as_array().unwrap();
    assert!(
        ready["status"] == "unavailable"
            && reasons.len() == 1
            && reasons[0].as_str().unwrap().starts_with("backup_failing:"),
        "{ready}"
    );
    let health = server.get("/health");
    assert_eq!(health.status, 200, "the process serves: {}", health.text());
    assert_eq!(
        health.json()["backup"]["state"],
        "failing",
        "{}",
        health.text()
    );
    assert_eq!(sample(&server, "annals_ready"), Some(0.0));

    annals_testkit::exchange(&location, &blocked);
    let answered = waiting.join().unwrap();
    assert!(
        answered.status == 200 || answered.kind() == "outcome_unknown",
        "{} {}",
        answered.status,
        answered.text()
    );
    eventually("the server is ready again", WAIT, || {
        server.get("/ready").status == 200
    });
    server.append(&one_event(2));
    assert!(server.terminate().success());
}
