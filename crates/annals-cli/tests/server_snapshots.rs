//! Goal: decisions' snapshots over HTTP through `annals serve`: a client reads with a snapshot
//! (a miss, then a hit followed by the events after it and the head), saves one, sees another
//! version as stale and another query as a miss; bad saves get clear errors and change
//! nothing; an erasure leaves no snapshot that folded the subject; the admin routes list and
//! remove them and /metrics counts them.

mod common;

use common::{append_body, encode, request, ServerProcess};
use serde_json::{json, Value};

fn query(course: &str) -> String {
    json!({"items": [{"types": ["Enrolled"], "tags": [format!("course:{course}")]}]}).to_string()
}

fn enrol(server: &ServerProcess, course: &str, student: &str) -> u64 {
    let tags = [format!("course:{course}"), format!("student:{student}")];
    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
    let body = append_body(&[("Enrolled", &tags, student)], None);
    server.append(&body)["position"].as_u64().unwrap()
}

fn read_with_snapshot(server: &ServerProcess, model: &str, version: u32, course: &str) -> Value {
    let r = server.get(&format!(
        "/v1/snapshots/read?model={model}&version={version}&query={}",
        encode(&query(course))
    ));
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(
        r.header("annals-snapshot"),
        answer["snapshot"]["outcome"].as_str()
    );
    assert_eq!(
        r.header("annals-head").map(|h| h.parse::<u64>().unwrap()),
        answer["head"].as_u64()
    );
    answer
}

fn save(server: &ServerProcess, body: Value) -> common::Response {
    server.post("/v1/snapshots", &body.to_string())
}

/// Goal: a client's decision loop over HTTP: a miss folds everything, a save keeps the state,
/// the next read starts from it with only the newer events; another version is stale (naming
/// the version that has one), another query a miss; a save behind the kept one is not kept;
/// NDJSON gives the snapshot and head first, then the events.
#[test]
fn a_client_decides_from_a_snapshot_and_the_events_after_it() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&data.path().join("store"), &[]);
    for i in 0..5 {
        enrol(&server, "c1", &format!("s{i}"));
        enrol(&server, "c2", &format!("s{i}"));
    }
    let first = read_with_snapshot(&server, "seats", 1, "c1");
    assert_eq!(first["snapshot"]["outcome"], "miss");
    assert_eq!(first["events"].as_array().unwrap().len(), 5);
    let head = first["head"].as_u64().unwrap();
    let saved = save(
        &server,
        json!({"model": "seats", "version": 1, "query": serde_json::from_str::<Value>(&query("c1")).unwrap(),
               "position": head, "state": {"taken": 5}}),
    );
    assert_eq!(saved.status, 200, "{}", saved.text());
    assert_eq!(saved.json()["saved"], true);
    let key = saved.json()["key"].as_str().unwrap().to_string();
    enrol(&server, "c1", "s9");
    let next = read_with_snapshot(&server, "seats", 1, "c1");
    assert_eq!(next["snapshot"]["outcome"], "hit");
    assert_eq!(next["snapshot"]["key"], key.as_str());
    assert_eq!(next["snapshot"]["position"], head);
    assert_eq!(next["snapshot"]["state"], json!({"taken": 5}));
    let events = next["events"].as_array().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["data"], "s9");

    let stale = read_with_snapshot(&server, "seats", 2, "c1");
    assert_eq!(stale["snapshot"]["outcome"], "stale");
    assert_eq!(stale["snapshot"]["versions"], json!([1]));
    assert_eq!(stale["events"].as_array().unwrap().len(), 6);
    let other = read_with_snapshot(&server, "seats", 1, "c2");
    assert_eq!(other["snapshot"]["outcome"], "miss");

    // Behind the one kept: not kept.
    let behind = save(
        &server,
        json!({"model": "seats", "version": 1, "query": serde_json::from_str::<Value>(&query("c1")).unwrap(),
               "position": 1, "stateBase64": "AAEC"}),
    );
    assert_eq!(behind.json()["saved"], false, "{}", behind.text());
    assert_eq!(behind.json()["keptPosition"], head);

    let ndjson = server.get_with(
        &format!(
            "/v1/snapshots/read?model=seats&version=1&query={}",
            encode(&query("c1"))
        ),
        &[("accept", "application/x-ndjson")],
    );
    let text = ndjson.text();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0]["snapshot"]["outcome"], "hit");
    assert_eq!(lines[1]["data"], "s9");

    // Bytes come back as bytes.
    let q2: Value = serde_json::from_str(&query("c2")).unwrap();
    let saved = save(
        &server,
        json!({"model": "bytes", "version": 1, "query": q2, "position": 3, "stateBase64": "AAEC/w=="}),
    );
    assert_eq!(saved.status, 200, "{}", saved.text());
    let hit = read_with_snapshot(&server, "bytes", 1, "c2");
    assert_eq!(hit["snapshot"]["stateBase64"], "AAEC/w==");
}

/// Goal: a position beyond the head, a state over the limit, a malformed body, a query over
/// the limits and a body with both or neither state get clear errors, and nothing is saved.
#[test]
fn bad_saves_get_clear_errors_and_change_nothing() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_env(
        &data.path().join("store"),
        &[],
        &[("ANNALS_LIMITS_SNAPSHOT_BYTES_MAX", "64")],
    );
    enrol(&server, "c1", "s1");
    let q: Value = serde_json::from_str(&query("c1")).unwrap();
    let cases = [
        (
            json!({"model": "m", "version": 1, "query": q, "position": 2, "state": 1}),
            409,
            "snapshot_beyond_head",
        ),
        (
            json!({"model": "m", "version": 1, "query": q, "position": 1, "state": "x".repeat(80)}),
            413,
            "snapshot_too_large",
        ),
        (
            json!({"model": "m", "version": 1, "query": q, "position": 1}),
            400,
            "invalid_body",
        ),
        (
            json!({"model": "m", "version": 1, "query": q, "position": 1, "state": 1, "stateBase64": "AA=="}),
            400,
            "invalid_body",
        ),
        (
            json!({"model": "", "version": 1, "query": q, "position": 1, "state": 1}),
            400,
            "invalid_body",
        ),
        (
            json!({"model": "m", "version": 1, "query": q, "position": 1, "state": 1, "extra": 1}),
            400,
            "invalid_body",
        ),
        (
            json!({"model": "m", "version": 1, "query": {"items": [{"types": vec!["x"; 100]}]}, "position": 1, "state": 1}),
            400,
            "query_too_large",
        ),
    ];
    for (body, status, kind) in cases {
        let r = save(&server, body.clone());
        assert_eq!(
            (r.status, r.kind()),
            (status, kind.to_string()),
            "{body}: {}",
            r.text()
        );
    }
    let r = request(server.http, "POST", "/v1/snapshots", &[], b"{\"model\":");
    assert_eq!((r.status, r.kind()), (400, "malformed_json".to_string()));
    let list = server.get("/v1/admin/snapshots").json();
    assert_eq!(list["count"], 0, "{list}");
}

/// Goal: the admin routes list snapshots per model and version (with their position and
/// age) and remove a model's or one version's; /metrics counts loads by outcome and saves.
#[test]
fn snapshots_are_listed_removed_and_counted() {
    let data = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&data.path().join("store"), &[]);
    enrol(&server, "c1", "s1");
    enrol(&server, "c2", "s1");
    for (model, version, course) in [
        ("seats", 1, "c1"),
        ("seats", 1, "c2"),
        ("seats", 2, "c1"),
        ("other", 1, "c1"),
    ] {
        let q: Value = serde_json::from_str(&query(course)).unwrap();
        let r = save(
            &server,
            json!({"model": model, "version": version, "query": q, "position": 2, "state": {}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    read_with_snapshot(&server, "seats", 1, "c1");
    read_with_snapshot(&server, "none", 1, "c1");
    let list = server.get("/v1/admin/snapshots").json();
    assert_eq!(list["count"], 4, "{list}");
    let models: Vec<(String, u64, u64)> = list["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["model"].as_str().unwrap().to_string(),
                m["version"].as_u64().unwrap(),
                m["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        models,
        [
            ("other".into(), 1, 1),
            ("seats".into(), 1, 2),
            ("seats".into(), 2, 1)
        ]
    );
    assert!(list["snapshots"][0]["ageSeconds"].as_f64().unwrap() >= 0.0);
    let one = server
        .get("/v1/admin/snapshots?model=seats&version=1")
        .json();
    assert_eq!(one["matching"], 2);
    let refused = request(server.http, "DELETE", "/v1/admin/snapshots", &[], b"");
    assert_eq!(refused.status, 400, "{}", refused.text());
    let removed = request(
        server.http,
        "DELETE",
        "/v1/admin/snapshots?model=seats&version=1",
        &[],
        b"",
    );
    assert_eq!(removed.json()["removed"], 2, "{}", removed.text());
    assert_eq!(server.get("/v1/admin/snapshots").json()["count"], 2);
    let metrics = server.get("/metrics").text();
    let sample = |name: &str| annals_testkit::server::sample(&metrics, name);
    assert_eq!(sample("annals_snapshots"), Some(2.0));
    assert_eq!(
        sample("annals_snapshot_loads_total{outcome=\"hit\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample("annals_snapshot_loads_total{outcome=\"miss\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample("annals_snapshot_saves_total{outcome=\"saved\"}"),
        Some(4.0)
    );
}

/// Goal: with data subjects, a snapshot saved over HTTP notes the subjects the query's events
/// hold; erasing one removes the snapshot (a miss after it, its state gone from the data
/// directory), and a save of a state folded before the erasure is refused (409).
#[test]
fn an_erasure_removes_the_snapshots_that_folded_the_subject() {
    let keys = tempfile::tempdir().unwrap();
    let master = keys.path().join("master.key");
    let out = std::process::Command::new(common::ANNALS)
        .args(["master-key", "new"])
        .output()
        .unwrap();
    std::fs::write(&master, out.stdout).unwrap();
    let master = master.display().to_string();
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("store");
    let server = ServerProcess::start(
        &dir,
        &["--subject-tags", "student:", "--master-key-file", &master],
    );
    enrol(&server, "c1", "ann");
    let position = enrol(&server, "c1", "ben");
    let q: Value = serde_json::from_str(&query("c1")).unwrap();
    let secret = "SNAPSHOT-SECRET-of-ann-7f3a";
    let r = save(
        &server,
        json!({"model": "seats", "version": 1, "query": q, "position": position, "state": {"names": [secret]}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(contains(&dir, secret.as_bytes()));
    let erased = server.post("/v1/admin/erase", r#"{"tag":"student:ann"}"#);
    assert_eq!(erased.status, 200, "{}", erased.text());
    assert_eq!(
        read_with_snapshot(&server, "seats", 1, "c1")["snapshot"]["outcome"],
        "miss"
    );
    assert!(!contains(&dir, secret.as_bytes()));
    let refused = save(
        &server,
        json!({"model": "seats", "version": 1, "query": q, "position": position, "state": {}}),
    );
    assert_eq!(
        (refused.status, refused.kind()),
        (409, "subject_erased".to_string()),
        "{}",
        refused.text()
    );
}

/// Whether a file under `dir` holds `needle`.
fn contains(dir: &std::path::Path, needle: &[u8]) -> bool {
    std::fs::read_dir(dir).unwrap().any(|entry| {
        let path = entry.unwrap().path();
        match path.is_dir() {
            true => contains(&path, needle),
            false => std::fs::read(&path)
                .unwrap_or_default()
                .windows(needle.len())
                .any(|w| w == needle),
        }
    })
}
