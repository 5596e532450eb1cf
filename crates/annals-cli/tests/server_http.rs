//! `annals serve` end to end over HTTP on loopback: the DCB semantics of docs/GUIDE.md,
//! subscriptions that start while appends run, every kind of bad input, auth, the OpenAPI
//! document, metrics, a clean SIGTERM and the start lines. (Readiness and health are
//! server_health.rs.)

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{append_body, encode, request, ServerProcess, Stream};
use serde_json::Value;

fn positions(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["position"].as_u64().unwrap())
        .collect()
}

/// Goal: read, append, conditions, head and idempotency behave exactly as decided, edge cases
/// included (empty store, `after` beyond head, match-all, backwards with `from`, limit).
#[test]
fn dcb_semantics_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    // Empty store.
    assert_eq!(server.head(), 0);
    assert!(server.read(r#"{"items":[]}"#, "{}").is_empty());
    assert!(server.get("/v1/read").json().as_array().unwrap().is_empty());
    // A condition on an empty store holds; `after` beyond the head is accepted.
    let r = server.append(&append_body(
        &[("CourseDefined", &["course:c1"], r#"{"capacity":2}"#)],
        Some(r#"{"failIfEventsMatch":{"items":[{"tags":["course:c1"]}]},"after":99}"#),
    ));
    assert_eq!(r["appendConditionFailed"], false);
    assert_eq!(r["position"], 1);
    assert!(r["durationInMicroseconds"].as_u64().is_some());
    // A multi-event append is one atomic step; positions are gapless.
    let r = server.append(&append_body(
        &[
            ("StudentSubscribed", &["course:c1", "student:s1"], "{}"),
            ("StudentSubscribed", &["course:c1", "student:s2"], "{}"),
            ("CourseDefined", &["course:c2"], r#"{"capacity":5}"#),
        ],
        None,
    ));
    assert_eq!(r["position"], 4);
    assert_eq!(server.head(), 4);
    // Match-all, types, tags (all tags of an item), OR of items.
    assert_eq!(
        positions(&server.read(r#"{"items":[]}"#, "{}")),
        [1, 2, 3, 4]
    );
    assert_eq!(
        positions(&server.read(r#"{"items":[{"types":["CourseDefined"]}]}"#, "{}")),
        [1, 4]
    );
    assert_eq!(
        positions(&server.read(r#"{"items":[{"tags":["course:c1","student:s2"]}]}"#, "{}")),
        [3]
    );
    assert_eq!(
        positions(&server.read(
            r#"{"items":[{"types":["StudentSubscribed"],"tags":["student:s1"]},{"tags":["course:c2"]}]}"#,
            "{}"
        )),
        [2, 4]
    );
    assert!(server
        .read(r#"{"items":[{"tags":["nobody"]}]}"#, "{}")
        .is_empty());
    // from (inclusive), limit, backwards with from as the maximum, after beyond head.
    assert_eq!(positions(&server.read("{}", r#"{"from":2}"#)), [2, 3, 4]);
    assert_eq!(
        positions(&server.read("{}", r#"{"from":2,"limit":2}"#)),
        [2, 3]
    );
    assert_eq!(
        positions(&server.read("{}", r#"{"backwards":true}"#)),
        [4, 3, 2, 1]
    );
    assert_eq!(
        positions(&server.read("{}", r#"{"backwards":true,"from":3,"limit":2}"#)),
        [3, 2]
    );
    assert!(server.read("{}", r#"{"after":10}"#).is_empty());
    assert!(server.read("{}", r#"{"from":10}"#).is_empty());
    // The event shape: type, tags, data as a string, position.
    let first = &server.read("{}", r#"{"limit":1}"#)[0];
    assert_eq!(first["type"], "CourseDefined");
    assert_eq!(first["tags"], serde_json::json!(["course:c1"]));
    assert_eq!(first["data"], r#"{"capacity":2}"#);
    assert_eq!(first["position"], 1);
    // A failed condition is 200 with true and the first conflicting position; nothing is added.
    let r = server.append(&append_body(
        &[("StudentSubscribed", &["course:c1", "student:s3"], "{}")],
        Some(r#"{"failIfEventsMatch":{"items":[{"tags":["course:c1"]}]},"after":1}"#),
    ));
    assert_eq!(r["appendConditionFailed"], true);
    assert_eq!(r["conflictPosition"], 2);
    assert!(r.get("position").is_none());
    assert_eq!(server.head(), 4);
    // After the last relevant event, the same condition holds.
    let r = server.append(&append_body(
        &[("StudentSubscribed", &["course:c1", "student:s3"], "{}")],
        Some(r#"{"failIfEventsMatch":{"items":[{"tags":["course:c1"]}]},"after":3}"#),
    ));
    assert_eq!(r["position"], 5);
    // An absent `after` means 0: any match fails.
    let r = server.append(&append_body(
        &[("X", &[], "")],
        Some(r#"{"failIfEventsMatch":{"items":[{"types":["CourseDefined"]}]}}"#),
    ));
    assert_eq!(r["conflictPosition"], 1);
    // A conditional append retried with the same ids returns the original position.
    let body = r#"{"events":[{"type":"Paid","tags":["invoice:7"],"data":"100","id":"8c0b6a3e-4d44-4b4a-9f0e-1c2d3e4f5a6b"}],
        "condition":{"failIfEventsMatch":{"items":[{"tags":["invoice:7"]}]}}}"#;
    let first = server.append(body)["position"].as_u64().unwrap();
    let again = server.append(body)["position"].as_u64().unwrap();
    assert_eq!(first, again);
    assert_eq!(server.head(), first);
    // NDJSON on request, with the head the read saw.
    let r = server.get_with("/v1/read", &[("accept", "application/x-ndjson")]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(r.header("annals-head"), Some(first.to_string().as_str()));
    let lines: Vec<Value> = r
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(positions(&lines), (1..=first).collect::<Vec<_>>());
    // Non-UTF-8 data cannot come over HTTP, but the tracking endpoint and head answer.
    let r = server.get("/v1/tracking?source=nobody");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["position"], Value::Null);
}

/// Goal: a read far larger than one buffer streams (chunked) and arrives whole, as JSON and
/// as NDJSON.
#[test]
fn large_reads_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let data = "x".repeat(900);
    let events: Vec<(&str, &[&str], &str)> =
        (0..500).map(|_| ("Big", &[][..], data.as_str())).collect();
    for _ in 0..4 {
        server.append(&append_body(&events, None));
    }
    let r = server.get("/v1/read");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(
        positions(r.json().as_array().unwrap()),
        (1..=2000).collect::<Vec<_>>()
    );
    let r = server.get_with("/v1/read", &[("accept", "application/x-ndjson")]);
    assert_eq!(r.text().lines().count(), 2000);
}

/// Goal: subscriptions that start while appends are running see every matching event exactly
/// once, in order, across the switch from catching up to following; several at once; SSE
/// resumes from Last-Event-ID.
#[test]
fn subscriptions_while_appending() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    const TOTAL: u64 = 400;
    let addr = server.http;
    let appender = std::thread::spawn(move || {
        for i in 0..TOTAL {
            let tag = if i % 2 == 0 {
                "parity:even"
            } else {
                "parity:odd"
            };
            let r = request(
                addr,
                "POST",
                "/v1/append",
                &[],
                append_body(&[("Tick", &[tag], &i.to_string())], None).as_bytes(),
            );
            assert_eq!(r.status, 200);
        }
    });
    // Start subscribers while the appends run.
    while server.head() < 50 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut all = Stream::open(addr, "/v1/subscribe", &[]);
    assert_eq!(all.status, 200);
    let even_query = encode(r#"{"items":[{"tags":["parity:even"]}]}"#);
    let mut even = Stream::open(
        addr,
        &format!("/v1/subscribe?query={even_query}&after=10"),
        &[],
    );
    let mut seen = Vec::new();
    while seen.len() < TOTAL as usize {
        let line = all.next_line().expect("the stream stays open");
        let event: Value = serde_json::from_str(&line).unwrap();
        seen.push(event["position"].as_u64().unwrap());
    }
    assert_eq!(seen, (1..=TOTAL).collect::<Vec<_>>());
    let mut seen_even = Vec::new();
    while seen_even.len() < (TOTAL as usize - 10) / 2 {
        let event: Value = serde_json::from_str(&even.next_line().unwrap()).unwrap();
        assert_eq!(event["tags"][0], "parity:even");
        seen_even.push(event["position"].as_u64().unwrap());
    }
    assert_eq!(seen_even, (11..=TOTAL).step_by(2).collect::<Vec<_>>());
    appender.join().unwrap();
    // SSE: id is the position; Last-Event-ID resumes after it.
    let mut sse = Stream::open(
        addr,
        "/v1/subscribe",
        &[("accept", "text/event-stream"), ("last-event-id", "397")],
    );
    let mut ids = Vec::new();
    while ids.len() < 3 {
        let line = sse.next_line().unwrap();
        if let Some(id) = line.strip_prefix("id: ") {
            ids.push(id.parse::<u64>().unwrap());
        }
    }
    assert_eq!(ids, [398, 399, 400]);
    let metrics = server.get("/metrics").text();
    let subscribers = metrics
        .lines()
        .find(|l| l.starts_with("annals_subscribers "))
        .unwrap();
    assert_eq!(subscribers, "annals_subscribers 3");
}

/// A server with small limits, so that each can be broken cheaply.
fn limited_server(dir: &std::path::Path) -> ServerProcess {
    let config = dir.join("annals.toml");
    std::fs::write(
        &config,
        r#"
[limits]
body_bytes_max = 65536
query_param_bytes_max = 4096
event_bytes_max = 1024
events_per_append_max = 10
tags_per_event_max = 4
tag_bytes_max = 32
type_bytes_max = 32
query_items_max = 8
query_item_values_max = 8
body_timeout_ms = 500
header_timeout_ms = 500
"#,
    )
    .unwrap();
    ServerProcess::start(&dir.join("data"), &["--config", config.to_str().unwrap()])
}

/// Goal: every kind of bad input gets a 4xx with a JSON message that says what is wrong,
/// changes nothing, and the server keeps serving.
#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = limited_server(dir.path());
    server.append(&append_body(&[("Seed", &["k:1"], "ok")], None));
    let before = server.get("/v1/read").text();
    let nested = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let huge_query = format!(r#"{{"items":[{}]}}"#, [r#"{"tags":["a"]}"#; 9].join(","));
    let long_query_string = format!("/v1/read?query={}", "%20".repeat(3000));
    let many_events: Vec<(&str, &[&str], &str)> = (0..11).map(|_| ("E", &[][..], "")).collect();
    let big_data = "x".repeat(2000);
    let body_over_limit = append_body(&[("E", &[], &"y".repeat(70_000))], None);
    // (what, method, path, body, status, kind, words the message must contain)
    let cases: Vec<(&str, &str, String, String, u16, &str, &str)> = vec![
        ("malformed JSON", "POST", "/v1/append".into(), r#"{"events":[{"type":"#.into(), 400, "malformed_json", "EOF"),
        ("not JSON at all", "POST", "/v1/append".into(), "events=1".into(), 400, "malformed_json", "expected"),
        ("unknown field", "POST", "/v1/append".into(), r#"{"events":[{"type":"E","data":"","color":"red"}]}"#.into(), 400, "invalid_body", "unknown field `color`"),
        ("unknown top-level field", "POST", "/v1/append".into(), r#"{"events":[],"extra":true}"#.into(), 400, "invalid_body", "unknown field `extra`"),
        ("wrong type for data", "POST", "/v1/append".into(), r#"{"events":[{"type":"E","data":5}]}"#.into(), 400, "invalid_body", "invalid type"),
        ("wrong type for tags", "POST", "/v1/append".into(), r#"{"events":[{"type":"E","data":"","tags":"a"}]}"#.into(), 400, "invalid_body", "invalid type"),
        ("missing data", "POST", "/v1/append".into(), r#"{"events":[{"type":"E"}]}"#.into(), 400, "invalid_body", "missing field `data`"),
        ("empty type", "POST", "/v1/append".into(), append_body(&[("", &[], "")], None), 400, "invalid_type", "empty type"),
        ("type too long", "POST", "/v1/append".into(), append_body(&[(&"T".repeat(33), &[], "")], None), 400, "invalid_type", "limit is 32"),
        ("too many events", "POST", "/v1/append".into(), append_body(&many_events, None), 400, "too_many_events", "limit is 10"),
        ("too many tags", "POST", "/v1/append".into(), append_body(&[("E", &["a", "b", "c", "d", "e"], "")], None), 400, "too_many_tags", "limit is 4"),
        ("duplicate tag", "POST", "/v1/append".into(), append_body(&[("E", &["a", "a"], "")], None), 400, "invalid_tag", "twice"),
        ("empty tag", "POST", "/v1/append".into(), append_body(&[("E", &[""], "")], None), 400, "invalid_tag", "empty tag"),
        ("tag too long", "POST", "/v1/append".into(), append_body(&[("E", &[&"t".repeat(33)], "")], None), 400, "invalid_tag", "limit is 32"),
        ("control character in tag", "POST", "/v1/append".into(), append_body(&[("E", &["a\u{7}b"], "")], None), 400, "invalid_tag", "control character"),
        ("event too large", "POST", "/v1/append".into(), append_body(&[("E", &[], &big_data)], None), 400, "event_too_large", "limit is 1024"),
        ("body over the limit", "POST", "/v1/append".into(), body_over_limit, 413, "body_too_large", "limit is 65536"),
        ("deeply nested condition", "POST", "/v1/append".into(), format!(r#"{{"events":[{{"type":"E","data":""}}],"condition":{{"failIfEventsMatch":{nested}}}}}"#), 400, "invalid_body", "invalid type"),
        ("deeply nested events", "POST", "/v1/append".into(), format!(r#"{{"events":{nested}}}"#), 400, "invalid_body", "invalid type"),
        ("deeply nested query", "GET", format!("/v1/read?query={}", encode(&format!(r#"{{"items":{}}}"#, "[".repeat(1000)))), String::new(), 400, "invalid_parameter", "parameter `query`"),
        ("condition with a bad query", "POST", "/v1/append".into(), r#"{"events":[{"type":"E","data":""}],"condition":{"failIfEventsMatch":{"items":[{"tagz":["a"]}]}}}"#.into(), 400, "invalid_body", "unknown field `tagz`"),
        ("condition with too many items", "POST", "/v1/append".into(), format!(r#"{{"events":[{{"type":"E","data":""}}],"condition":{{"failIfEventsMatch":{huge_query}}}}}"#), 400, "query_too_large", "limit is 8"),
        ("bad id", "POST", "/v1/append".into(), r#"{"events":[{"type":"E","data":"","id":"not-a-uuid"}]}"#.into(), 400, "invalid_body", "UUID"),
        ("query not JSON", "GET", "/v1/read?query=%7Bitems".into(), String::new(), 400, "invalid_parameter", "parameter `query`"),
        ("query of the wrong shape", "GET", format!("/v1/read?query={}", encode(r#"{"items":{"tags":[]}}"#)), String::new(), 400, "invalid_parameter", "invalid type"),
        ("query with too many items", "GET", format!("/v1/read?query={}", encode(&huge_query)), String::new(), 400, "query_too_large", "limit is 8"),
        ("query with an invalid tag", "GET", format!("/v1/read?query={}", encode(r#"{"items":[{"tags":["a"]},{"tags":[""]}]}"#)), String::new(), 400, "invalid_tag", "query item 1 has an empty tag"),
        ("query string over the limit", "GET", long_query_string, String::new(), 414, "query_too_large", "limit is 4096"),
        ("options with unknown field", "GET", format!("/v1/read?options={}", encode(r#"{"reverse":true}"#)), String::new(), 400, "invalid_parameter", "unknown field `reverse`"),
        ("options with from and after", "GET", format!("/v1/read?options={}", encode(r#"{"from":1,"after":1}"#)), String::new(), 400, "invalid_read_options", "not both"),
        ("negative limit", "GET", format!("/v1/read?options={}", encode(r#"{"limit":-1}"#)), String::new(), 400, "invalid_parameter", "invalid value"),
        ("unknown read parameter", "GET", "/v1/read?colour=1".into(), String::new(), 400, "invalid_parameter", "unknown field `colour`"),
        ("subscribe with a bad after", "GET", "/v1/subscribe?after=soon".into(), String::new(), 400, "invalid_parameter", "parameter `after`"),
        ("append with query parameters", "POST", "/v1/append?x=1".into(), append_body(&[("E", &[], "")], None), 400, "invalid_parameter", "no query parameters"),
        ("unknown endpoint", "GET", "/v1/nothing".into(), String::new(), 404, "not_found", "/v1/nothing"),
        ("wrong method", "DELETE", "/v1/append".into(), String::new(), 405, "method_not_allowed", "DELETE"),
    ];
    for (what, method, path, body, status, kind, words) in &cases {
        let r = request(server.http, method, path, &[], body.as_bytes());
        assert_eq!(r.status, *status, "{what}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
        assert_eq!(r.kind(), *kind, "{what}: {}", r.text());
        let message = r.json()["error"].as_str().unwrap().to_string();
        assert!(
            message.contains(words),
            "{what}: {message:?} lacks {words:?}"
        );
        assert_eq!(
            server.get("/v1/read").text(),
            before,
            "{what} changed the store"
        );
    }
    // A body that never finishes arrives too slowly: 408, nothing appended.
    let mut slow = TcpStream::connect(server.http).unwrap();
    slow.write_all(
        b"POST /v1/append HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"events\":[",
    )
    .unwrap();
    let started = Instant::now();
    let r = common::read_response(&mut std::io::BufReader::new(slow));
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(r.kind(), "body_timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Headers that never finish: the connection is closed.
    let mut stall = TcpStream::connect(server.http).unwrap();
    stall
        .write_all(b"GET /v1/head HTTP/1.1\r\nhost: t\r\n")
        .unwrap();
    stall
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 256];
    let n = std::io::Read::read(&mut stall, &mut buf).unwrap_or(0);
    assert!(
        n == 0 || String::from_utf8_lossy(&buf[..n]).contains("408"),
        "a stalled request is cut off"
    );
    // Abandoned connections mid-request and mid-stream.
    for _ in 0..20 {
        let mut gone = TcpStream::connect(server.http).unwrap();
        let _ = gone.write_all(b"POST /v1/append HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n{\"ev");
        drop(gone);
        let sub = Stream::open(server.http, "/v1/subscribe", &[]);
        drop(sub);
    }
    assert_eq!(server.get("/v1/read").text(), before);
    assert_eq!(server.get("/health").json()["status"], "ok");
    server.append(&append_body(&[("After", &[], "still serving")], None));
    assert_eq!(server.head(), 2);
}

/// Goal: what a client reads it can append again, binary data included. Regression: reads
/// answered data that is not UTF-8 as base64 with `"dataEncoding":"base64"`, but appends
/// refused `dataEncoding` as an unknown field, so such an event could be read over HTTP and
/// never written back. Method: append bytes that are not UTF-8 as base64; read them back
/// (base64 with dataEncoding); append the event as read (position and time dropped); both
/// read back byte-identical. Bad base64 is a 400 naming the event's index and changes
/// nothing; "utf8" stores the string as it is.
#[test]
fn binary_data_read_over_http_appends_again() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    // 0xff 0x00 0x01 0xfe: not UTF-8.
    let binary = "/wAB/g==";
    server.append(&format!(
        r#"{{"events":[{{"type":"Blob","tags":["blob:1"],"data":"{binary}","dataEncoding":"base64","metadata":{{"k":"v"}}}}]}}"#
    ));
    let first = server.read("{}", "{}");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0]["data"], binary);
    assert_eq!(first[0]["dataEncoding"], "base64");
    assert_eq!(first[0]["metadata"], serde_json::json!({ "k": "v" }));

    // The event as read, appended again.
    let mut event = first[0].clone();
    let object = event.as_object_mut().unwrap();
    object.remove("position");
    object.remove("appendedAt");
    server.append(&serde_json::json!({ "events": [event] }).to_string());
    let both = server.read("{}", "{}");
    assert_eq!(positions(&both), vec![1, 2]);
    for field in ["type", "tags", "data", "dataEncoding", "metadata"] {
        assert_eq!(both[1][field], both[0][field], "{field}");
    }

    // Bad base64 in the second event: refused, naming it; the first is not appended either.
    let before = server.get("/v1/read").text();
    let r = server.post(
        "/v1/append",
        r#"{"events":[{"type":"Ok","data":"aGk=","dataEncoding":"base64"},{"type":"Bad","data":"not base64!","dataEncoding":"base64"}]}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.kind(), "invalid_body");
    let message = r.json()["error"].as_str().unwrap().to_string();
    assert!(message.contains("event 1"), "{message}");
    assert!(message.contains("base64"), "{message}");
    let r = server.post(
        "/v1/append",
        r#"{"events":[{"type":"Bad","data":"","dataEncoding":"hex"}]}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(server.get("/v1/read").text(), before);

    // "utf8" is the default said out loud: the string itself is stored.
    server.append(r#"{"events":[{"type":"Text","data":"aGk=","dataEncoding":"utf8"}]}"#);
    let text = server.read("{}", "{}");
    assert_eq!(text[2]["data"], "aGk=");
    assert!(text[2].get("dataEncoding").is_none());
}

/// Goal: with keys configured, every endpoint refuses a missing or wrong key (401) and a key
/// without its scope (403), and serves the right one; /health stays open.
#[test]
fn api_keys_and_scopes_on_every_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(
        &keys,
        "reader-key-0000000001 read\nwriter-key-0000000002 append\nadmin-key-00000000003 admin\n",
    )
    .unwrap();
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &["--api-keys-file", keys.to_str().unwrap()],
    );
    let body = append_body(&[("E", &["k:1"], "x")], None);
    // (method, path, body, the key with just the right scope, a key without it)
    let endpoints: Vec<(&str, &str, &str, &str, &str)> = vec![
        (
            "GET",
            "/v1/read",
            "",
            "reader-key-0000000001",
            "writer-key-0000000002",
        ),
        (
            "POST",
            "/v1/append",
            &body,
            "writer-key-0000000002",
            "reader-key-0000000001",
        ),
        (
            "GET",
            "/v1/head",
            "",
            "reader-key-0000000001",
            "writer-key-0000000002",
        ),
        (
            "GET",
            "/v1/tracking?source=s",
            "",
            "reader-key-0000000001",
            "writer-key-0000000002",
        ),
        (
            "GET",
            "/v1/openapi.json",
            "",
            "reader-key-0000000001",
            "writer-key-0000000002",
        ),
        (
            "GET",
            "/metrics",
            "",
            "admin-key-00000000003",
            "reader-key-0000000001",
        ),
    ];
    for (method, path, body, good, lacking) in &endpoints {
        let call = |key: Option<&str>| {
            let auth = key.map(|k| format!("Bearer {k}"));
            let headers: Vec<(&str, &str)> =
                auth.iter().map(|a| ("authorization", a.as_str())).collect();
            request(server.http, method, path, &headers, body.as_bytes())
        };
        let r = call(None);
        assert_eq!(r.status, 401, "{path} without a key");
        assert_eq!(r.kind(), "unauthenticated");
        let r = call(Some("wrong-key-00000000000"));
        assert_eq!(r.status, 401, "{path} with a wrong key");
        let r = call(Some(lacking));
        assert_eq!(r.status, 403, "{path} without the scope");
        assert_eq!(r.kind(), "forbidden");
        assert!(r.json()["error"].as_str().unwrap().contains("scope"));
        let r = call(Some(good));
        assert_eq!(r.status, 200, "{path} with the right key: {}", r.text());
        let r = call(Some("admin-key-00000000003"));
        assert_eq!(r.status, 200, "{path} with the admin key");
    }
    // Subscribe is a stream: check its status only.
    let no_key = Stream::open(server.http, "/v1/subscribe", &[]);
    assert_eq!(no_key.status, 401);
    let ok = Stream::open(
        server.http,
        "/v1/subscribe",
        &[("authorization", "Bearer reader-key-0000000001")],
    );
    assert_eq!(ok.status, 200);
    assert_eq!(server.get("/health").status, 200, "health is open");
    assert_eq!(server.get("/ready").status, 200, "readiness is open");
    // Two appends went through (the writer's and the admin's).
    let r = server.get_with(
        "/v1/head",
        &[("authorization", "Bearer admin-key-00000000003")],
    );
    assert_eq!(r.json()["head"], 2);
}

/// Goal: the OpenAPI document is valid JSON that lists every endpoint the server has, and each
/// listed operation exists (no 404 or 405).
#[test]
fn openapi_describes_every_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("annals.toml");
    let master = dir.path().join("master.key");
    std::fs::write(&master, "ab".repeat(32)).unwrap();
    std::fs::write(
        &config,
        format!(
            "subject_tags = [\"customer:\"]\nmaster_key_file = {:?}\n[[read_models]]\nname = \
             \"m\"\n[exchange]\nsymbols = [{{ tick = 1, lot = 1 }}]\n",
            master.display().to_string()
        ),
    )
    .unwrap();
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let doc = server.get("/v1/openapi.json").json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let mut listed: Vec<&str> = paths.keys().map(String::as_str).collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            "/health",
            "/metrics",
            "/ready",
            "/v1/admin/check",
            "/v1/admin/erase",
            "/v1/admin/exchange/symbols",
            "/v1/admin/readmodels/{name}/rebuild",
            "/v1/admin/schema-policy",
            "/v1/admin/schemas/{type}",
            "/v1/admin/schemas/{type}/enforcement",
            "/v1/admin/snapshots",
            "/v1/admin/stats",
            "/v1/append",
            "/v1/exchange",
            "/v1/exchange/accounts/{account}/cancel-all",
            "/v1/exchange/accounts/{account}/reports",
            "/v1/exchange/orders",
            "/v1/exchange/orders/{id}",
            "/v1/exchange/orders/{id}/amend",
            "/v1/exchange/orders/{id}/cancel",
            "/v1/exchange/symbols",
            "/v1/exchange/symbols/{symbol}/depth",
            "/v1/exchange/symbols/{symbol}/stream",
            "/v1/exchange/symbols/{symbol}/trades",
            "/v1/head",
            "/v1/openapi.json",
            "/v1/read",
            "/v1/readmodels",
            "/v1/readmodels/{name}",
            "/v1/schemas",
            "/v1/schemas/{type}",
            "/v1/snapshots",
            "/v1/snapshots/read",
            "/v1/subscribe",
            "/v1/tracking"
        ]
    );
    for (path, ops) in paths {
        for (method, op) in ops.as_object().unwrap() {
            // A rebuild is accepted (202) and runs in the background; a symbol is created.
            let ok = if path.ends_with("/rebuild") {
                202
            } else if path == "/v1/admin/exchange/symbols" || path == "/v1/admin/schemas/{type}" {
                201
            } else {
                200
            };
            assert!(
                op["responses"]
                    .as_object()
                    .unwrap()
                    .contains_key(&ok.to_string()),
                "{path}"
            );
            // Paths sort so that the order placed here is order 1 by the time it is named.
            let path = path
                .replace("{name}", "m")
                .replace("{account}", "1")
                .replace("{id}", "1")
                .replace("{symbol}", "0")
                .replace("{type}", "T");
            if path == "/v1/subscribe" || path.ends_with("/stream") || path.ends_with("/reports") {
                assert_eq!(Stream::open(server.http, &path, &[]).status, 200, "{path}");
                continue;
            }
            let path = match path.as_str() {
                "/v1/tracking" => "/v1/tracking?source=s".to_owned(),
                "/v1/snapshots/read" => "/v1/snapshots/read?model=m&version=1".to_owned(),
                "/v1/admin/snapshots" => "/v1/admin/snapshots?model=m".to_owned(),
                _ => path,
            };
            let body = match path.as_str() {
                "/v1/exchange/orders" => {
                    r#"{"account":1,"symbol":0,"side":"sell","price":100,"qty":5}"#.to_string()
                }
                "/v1/exchange/orders/1/amend" => r#"{"account":1,"price":101,"qty":4}"#.into(),
                "/v1/exchange/orders/1/cancel" => r#"{"account":1}"#.into(),
                "/v1/exchange/accounts/1/cancel-all" => "{}".into(),
                "/v1/admin/exchange/symbols" => r#"{"tick":1,"lot":1}"#.into(),
                "/v1/admin/erase" => r#"{"tag":"customer:1"}"#.into(),
                // Registered first (paths sort), then its enforcement set and it shown.
                "/v1/admin/schemas/T" => r#"{"schema":{}}"#.into(),
                "/v1/admin/schemas/T/enforcement" => r#"{"enforcement":"warn"}"#.into(),
                "/v1/admin/schema-policy" => r#"{"unknownTypes":"allow"}"#.into(),
                "/v1/snapshots" => {
                    r#"{"model":"m","version":1,"query":{},"position":0,"state":{}}"#.into()
                }
                _ => append_body(&[("E", &[], "")], None),
            };
            let r = request(
                server.http,
                &method.to_uppercase(),
                &path,
                &[],
                body.as_bytes(),
            );
            assert_eq!(r.status, ok, "{method} {path}: {}", r.text());
        }
    }
    // Every schema reference resolves.
    let text = doc.to_string();
    for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = reference.split('"').next().unwrap();
        assert!(doc["components"]["schemas"].get(name).is_some(), "{name}");
    }
}

/// Goal: /metrics carries what an operator needs, in Prometheus text format, with values that
/// move with the traffic.
#[test]
fn metrics_in_prometheus_format() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    for i in 0..5 {
        server.append(&append_body(&[("E", &["m:1"], &i.to_string())], None));
    }
    server.read("{}", "{}");
    let r = server.get("/metrics");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let text = r.text();
    for needed in [
        "annals_requests_total{api=\"http\",op=\"append\",outcome=\"ok\"} 5",
        "annals_requests_total{api=\"http\",op=\"append\",outcome=\"condition_failed\"} 0",
        "annals_requests_total{api=\"http\",op=\"read\",outcome=\"ok\"} 1",
        "annals_events_appended_total 5",
        "annals_events_read_total 5",
        "annals_head_position 5",
        "annals_group_appends_bucket{le=\"+Inf\"}",
        "annals_fsync_seconds_bucket{le=\"+Inf\"}",
        "annals_fsync_seconds_count",
        "annals_queue_depth 0",
        "annals_waiting_callers 0",
        "annals_subscribers 0",
        "annals_request_duration_seconds_bucket{api=\"http\",op=\"append\",le=\"+Inf\"} 5",
        "annals_durability_info{class=\"d3\"} 1",
    ] {
        assert!(text.contains(needed), "missing {needed:?} in\n{text}");
    }
    // Every sample line is `name{labels} value` with a numeric value.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
    // Each append counted on the route it took into the log, every route listed: one after
    // another over HTTP, each is taken from the queue and synced by the writer thread, or
    // staged by its request's task while the writer thread still runs the sync before.
    let routes: Vec<(&str, f64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("annals_commits_total{route=\""))
        .map(|l| {
            let (route, rest) = l.split_once('"').unwrap();
            (route, rest.rsplit(' ').next().unwrap().parse().unwrap())
        })
        .collect();
    assert_eq!(routes.len(), 7, "{routes:?}");
    assert_eq!(
        routes.iter().map(|(_, n)| n).sum::<f64>(),
        5.0,
        "{routes:?}"
    );
    assert!(
        routes
            .iter()
            .all(|(route, n)| *n == 0.0 || ["held", "staged"].contains(route)),
        "{routes:?}"
    );
}

/// Goal: appends arriving over many connections at once share fdatasyncs (group commit through
/// the server), and each is acknowledged. A server's append tasks must never commit on a
/// runtime thread: when they did, each held a runtime thread for its fdatasync, so the next
/// request reached the store alone as well, and 64 connections made 1.1 appends per fdatasync.
#[test]
fn concurrent_appends_share_fdatasyncs() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let addr = server.http;
    const CLIENTS: usize = 32;
    const APPENDS: usize = 40;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                // One keep-alive connection per client, one append in flight on each.
                let stream = TcpStream::connect(addr).unwrap();
                stream.set_nodelay(true).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                let mut writer = stream.try_clone().unwrap();
                let mut reader = std::io::BufReader::new(stream);
                barrier.wait();
                let mut positions = Vec::new();
                for i in 0..APPENDS {
                    let key = format!("key:{c}-{i}");
                    let condition =
                        format!(r#"{{"failIfEventsMatch":{{"items":[{{"tags":["{key}"]}}]}}}}"#);
                    let body = append_body(&[("E", &[&key], "x")], Some(&condition));
                    let head = format!(
                        "POST /v1/append HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    writer.write_all(head.as_bytes()).unwrap();
                    writer.write_all(body.as_bytes()).unwrap();
                    let r = common::read_response(&mut reader);
                    assert_eq!(r.status, 200, "{}", r.text());
                    positions.push(r.json()["position"].as_u64().unwrap());
                }
                positions
            })
        })
        .collect();
    let mut positions: Vec<u64> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    positions.sort_unstable();
    let total = (CLIENTS * APPENDS) as u64;
    assert_eq!(
        positions,
        (1..=total).collect::<Vec<_>>(),
        "each acknowledged once"
    );
    let metrics = server.get("/metrics").text();
    let sample = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    let (appends, fsyncs) = (
        sample("annals_appends_total"),
        sample("annals_fsyncs_total"),
    );
    assert_eq!(appends, total as f64);
    // 32 connections with one append in flight each, committed one by one, made 1.1 appends
    // per fdatasync. Grouped, they share them, by how many arrive during one: on a disk whose
    // fdatasync takes 50 us, two or three per fdatasync in a debug build, by the tens on a
    // slower one; and the appends that arrive together (32 at the start) go in together.
    assert!(
        appends / fsyncs >= 1.6,
        "{appends} appends in {fsyncs} fdatasyncs"
    );
    let (groups, small) = (
        sample("annals_group_appends_count"),
        sample("annals_group_appends_bucket{le=\"4\"}"),
    );
    assert!(
        groups - small >= 1.0,
        "no group of more than 4 appends among {groups}:\n{metrics}"
    );
}

/// Goal: SIGTERM lets in-flight appends finish and be answered, syncs, and exits 0; every
/// answered append is there after a restart, which finds a checkpoint.
#[test]
fn sigterm_drains_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(dir.path(), &[]);
    let addr = server.http;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = append_body(&[("E", &[&format!("client:{c}")], &format!("{c}-{i}"))], None);
                    let Ok(mut stream) = TcpStream::connect(addr) else { break };
                    let head = format!(
                        "POST /v1/append HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    if stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body.as_bytes())).is_err() {
                        break;
                    }
                    let mut text = String::new();
                    let _ = std::io::Read::read_to_string(&mut stream, &mut text);
                    if text.starts_with("HTTP/1.1 200") {
                        acked.push(format!("{c}-{i}"));
                    }
                    i += 1;
                }
                acked
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let status = server.terminate();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(status.success(), "exit status {status:?}");
    let acked: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(!acked.is_empty());
    let server = ServerProcess::start(dir.path(), &[]);
    let stored: std::collections::HashSet<String> = server
        .read("{}", "{}")
        .iter()
        .map(|e| e["data"].as_str().unwrap().to_string())
        .collect();
    for a in &acked {
        assert!(stored.contains(a), "acknowledged append {a} lost");
    }
}

/// Goal: the start lines speak plainly. Regression: a new, empty store's start said "index
/// rebuilt: checkpoint missing", which reads like damage, and the console's address was
/// never printed. Method: a start on a new directory must say "new store" and print the
/// console's URL; after one append and a clean stop, a start with `--no-console` reads its
/// index from the checkpoint and prints no console line.
#[test]
fn the_start_lines_name_a_new_store_and_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = ServerProcess::start(&data, &[]);
    let lines = server.startup.join("\n");
    assert!(lines.contains("(new store)"), "{lines}");
    assert!(lines.contains("annals: data subjects off"), "{lines}");
    assert!(!lines.contains("rebuilt"), "{lines}");
    let console = format!("annals: console http://{}/", server.http);
    assert!(server.startup.contains(&console), "{lines}");
    server.append(&append_body(&[("Opened", &["k:1"], "{}")], None));
    assert!(server.terminate().success());
    let mut again = ServerProcess::start(&data, &["--no-console"]);
    let lines = again.startup.join("\n");
    assert!(lines.contains("index from checkpoint"), "{lines}");
    assert!(!lines.contains("annals: console"), "{lines}");
    assert!(again.terminate().success());
}
