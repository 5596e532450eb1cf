//! Traces exported over OTLP to a real Jaeger (its all-in-one program, which scripts/setup
//! builds), read back through Jaeger's own query API: a request's spans join the trace its
//! caller's `traceparent` names, over HTTP and gRPC; the append's span and the group commit
//! that carried it are linked both ways; a malformed `traceparent` begins a new trace; a
//! collector that is not there is reported once, never per request.

mod common;

use std::process::Stdio;
use std::time::Duration;

use annals_testkit::jaeger::Jaeger;
use common::{append_body, request, ServerProcess, ANNALS};
use serde_json::Value;

/// How long a test waits for Jaeger to hold what the server exported.
const WAIT: Duration = Duration::from_secs(30);

/// The variables pointing a server at `jaeger` over OTLP/gRPC, exporting within 100 ms.
fn exporting_to(jaeger: &Jaeger) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_grpc()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
    ]
}

fn start(dir: &std::path::Path, env: &[(&'static str, String)]) -> ServerProcess {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    ServerProcess::start_with_env(dir, &[], &env)
}

/// A fresh W3C trace id and span id, as a caller's tracer makes them.
fn ids() -> (String, String) {
    let trace = format!("{:032x}", rand::random::<u128>() | 1);
    let span = format!("{:016x}", rand::random::<u64>() | 1);
    (trace, span)
}

/// The spans of `trace` named `name`.
fn named<'a>(trace: &'a Value, name: &str) -> Vec<&'a Value> {
    trace["spans"]
        .as_array()
        .map(|spans| {
            spans
                .iter()
                .filter(|s| s["operationName"] == name)
                .collect()
        })
        .unwrap_or_default()
}

/// A span's attribute, as Jaeger holds it.
fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

/// The references of `span` of kind `kind` (`CHILD_OF`, `FOLLOWS_FROM`: a link), as (trace,
/// span) ids.
fn references(span: &Value, kind: &str) -> Vec<(String, String)> {
    span["references"]
        .as_array()
        .map(|refs| {
            refs.iter()
                .filter(|r| r["refType"] == kind)
                .map(|r| {
                    (
                        r["traceID"].as_str().unwrap_or("").to_string(),
                        r["spanID"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Goal: an HTTP append carrying a `traceparent` is exported as the caller's child (`POST
/// /v1/append` with its route and status), with the store's `annals.append` under it holding
/// the event count, the condition, the durability class, the position and the outcome; the
/// fsync that made it durable (`annals.commit`, with its size and fsync time) links to it
/// and it to the commit; a read joins its caller's trace too; a caller's unsampled trace is
/// followed (nothing is exported for it).
#[test]
fn an_http_append_joins_its_callers_trace_and_links_its_commit() {
    let Some(jaeger) = Jaeger::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &exporting_to(&jaeger));
    let (trace, parent) = ids();
    let traceparent = format!("00-{trace}-{parent}-01");
    let body = append_body(
        &[("Opened", &["account:1"], "{}")],
        Some(r#"{"failIfEventsMatch":{"items":[{"tags":["account:1"]}]}}"#),
    );
    let r = request(
        server.http,
        "POST",
        "/v1/append",
        &[("traceparent", &traceparent)],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    let held = jaeger.trace(&trace, 2, WAIT);
    let http = named(&held, "POST /v1/append");
    assert_eq!(http.len(), 1, "{held:#}");
    let http = http[0];
    assert_eq!(references(http, "CHILD_OF"), [(trace.clone(), parent)]);
    assert_eq!(tag(http, "http.route"), Some(&Value::from("/v1/append")));
    assert_eq!(
        tag(http, "http.response.status_code"),
        Some(&Value::from(200))
    );
    assert_eq!(tag(http, "http.request.method"), Some(&Value::from("POST")));
    let service = &held["processes"][http["processID"].as_str().unwrap()]["serviceName"];
    assert_eq!(service, "annals");

    let append = named(&held, "annals.append");
    assert_eq!(append.len(), 1, "{held:#}");
    let append = append[0];
    let http_id = http["spanID"].as_str().unwrap().to_string();
    assert_eq!(references(append, "CHILD_OF"), [(trace.clone(), http_id)]);
    assert_eq!(tag(append, "annals.events"), Some(&Value::from(1)));
    assert_eq!(tag(append, "annals.condition"), Some(&Value::from(true)));
    assert_eq!(tag(append, "annals.durability"), Some(&Value::from("d3")));
    assert_eq!(tag(append, "annals.position"), Some(&Value::from(1)));
    assert_eq!(
        tag(append, "annals.outcome"),
        Some(&Value::from("appended"))
    );

    // The commit is a trace of its own (it carries appends of many traces), linked both ways.
    let links = references(append, "FOLLOWS_FROM");
    assert_eq!(links.len(), 1, "{append:#}");
    let (commit_trace, commit_id) = &links[0];
    let commits = jaeger.trace(commit_trace, 1, WAIT);
    let commit = named(&commits, "annals.commit");
    assert_eq!(commit.len(), 1, "{commits:#}");
    let commit = commit[0];
    assert_eq!(commit["spanID"], commit_id.as_str());
    let append_id = append["spanID"].as_str().unwrap().to_string();
    assert!(
        references(commit, "FOLLOWS_FROM").contains(&(trace.clone(), append_id)),
        "{commit:#}"
    );
    assert!(tag(commit, "annals.fsync_us").is_some(), "{commit:#}");
    assert!(tag(commit, "annals.appends").and_then(Value::as_u64) >= Some(1));
    assert!(tag(commit, "annals.bytes").and_then(Value::as_u64) > Some(0));

    // A read joins its caller's trace as well; a route no key guards is named by its route.
    for (path, name) in [("/v1/read", "GET /v1/read"), ("/ready", "GET /ready")] {
        let (trace, parent) = ids();
        let r = request(
            server.http,
            "GET",
            path,
            &[("traceparent", &format!("00-{trace}-{parent}-01"))],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let held = jaeger.trace(&trace, 1, WAIT);
        let span = named(&held, name);
        assert_eq!(span.len(), 1, "{held:#}");
        assert_eq!(references(span[0], "CHILD_OF"), [(trace, parent)]);
        assert_eq!(tag(span[0], "http.route"), Some(&Value::from(path)));
    }

    // A caller that did not sample its trace (flags 00) is followed: nothing is exported for
    // it, while a sampled request sent after it is.
    let (unsampled, parent) = ids();
    let r = request(
        server.http,
        "GET",
        "/v1/head",
        &[("traceparent", &format!("00-{unsampled}-{parent}-00"))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let (after, parent) = ids();
    let r = request(
        server.http,
        "GET",
        "/v1/head",
        &[("traceparent", &format!("00-{after}-{parent}-01"))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!named(&jaeger.trace(&after, 1, WAIT), "GET /v1/head").is_empty());
    assert_eq!(jaeger.get(&format!("/api/traces/{unsampled}")), None);
}

/// Goal: a gRPC append (UmaDB's protocol, a `traceparent` in its metadata) is exported as the
/// caller's child under the RPC conventions (`rpc.system`, `rpc.service`, `rpc.method`), with
/// the store's `annals.append` under it.
#[test]
fn a_grpc_append_joins_its_callers_trace() {
    let Some(jaeger) = Jaeger::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &exporting_to(&jaeger));
    let (trace, parent) = ids();
    let url = server.grpc_url();
    let traceparent = format!("00-{trace}-{parent}-01");
    grpc_append(
        &url,
        "Opened",
        "account:1",
        &[("traceparent", &traceparent)],
    );
    let held = jaeger.trace(&trace, 2, WAIT);
    let rpc: Vec<&Value> = held["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| tag(s, "rpc.system") == Some(&Value::from("grpc")))
        .collect();
    assert_eq!(rpc.len(), 1, "{held:#}");
    let rpc = rpc[0];
    assert_eq!(references(rpc, "CHILD_OF"), [(trace.clone(), parent)]);
    assert_eq!(tag(rpc, "rpc.method"), Some(&Value::from("Append")));
    let service = tag(rpc, "rpc.service").and_then(Value::as_str).unwrap();
    assert!(
        service.ends_with("DCB") || service.contains("umadb"),
        "{rpc:#}"
    );
    assert_eq!(
        rpc["operationName"].as_str(),
        Some(format!("{service}/Append").as_str())
    );
    let append = named(&held, "annals.append");
    assert_eq!(append.len(), 1, "{held:#}");
    let rpc_id = rpc["spanID"].as_str().unwrap().to_string();
    assert_eq!(references(append[0], "CHILD_OF"), [(trace, rpc_id)]);
}

/// Goal: a malformed `traceparent` is ignored: the request is answered as any other, and its
/// spans begin a trace of their own.
#[test]
fn a_malformed_traceparent_begins_a_new_trace() {
    let Some(jaeger) = Jaeger::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &exporting_to(&jaeger));
    for bad in [
        "00-zz-yy-01",
        "00-00000000000000000000000000000000-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "not a traceparent at all",
    ] {
        let body = append_body(&[("Noted", &[], "{}")], None);
        let r = request(
            server.http,
            "POST",
            "/v1/append",
            &[("traceparent", bad)],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{bad}: {}", r.text());
    }
    // Each began a trace of the service's own.
    let path = "/api/traces?service=annals&operation=POST%20%2Fv1%2Fappend&limit=20";
    let traces = annals_testkit::eventually("four traces of appends in Jaeger", WAIT, || {
        let found = jaeger.get(path)?;
        let traces = found["data"].as_array()?.clone();
        (traces.len() >= 4).then_some(traces)
    });
    // None of them took a header for its parent: each request's span is its trace's root.
    for trace in &traces {
        for span in named(trace, "POST /v1/append") {
            assert_eq!(references(span, "CHILD_OF"), [], "{span:#}");
            assert_ne!(
                span["traceID"], "4bf92f3577b34da6a3ce929d0e0e4736",
                "{span:#}"
            );
        }
    }
}

/// Goal: with no collector at the endpoint, appends are answered as ever, the spans lost are
/// counted in /metrics, and the log says so once, not once per request or per batch.
#[test]
fn a_collector_that_is_not_there_is_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let nowhere = format!("http://127.0.0.1:{}", annals_testkit::free_port());
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", nowhere.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
    ];
    let data = dir.path().join("data");
    let server = annals_testkit::server::ServerProcess::launch_logging(
        std::path::Path::new(ANNALS),
        Some(&data),
        &[],
        &env,
        Stdio::from(log),
    );
    for i in 0..200 {
        let tag = format!("n:{i}");
        let body = append_body(&[("Noted", &[tag.as_str()], "{}")], None);
        let r = request(server.http, "POST", "/v1/append", &[], body.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let lost = annals_testkit::eventually("the lost spans counted", WAIT, || {
        let text = request(server.http, "GET", "/metrics", &[], b"").text();
        let failed = annals_testkit::server::sample(&text, "annals_trace_spans_failed_total")?;
        (failed >= 200.0).then_some(failed)
    });
    assert!(lost >= 200.0);
    drop(server);
    let text = std::fs::read_to_string(&log_path).unwrap();
    let reports = text
        .lines()
        .filter(|l| l.contains("the trace collector did not take"))
        .count();
    assert_eq!(reports, 1, "{text}");
}

/// Goal: an export that cannot be made (a protocol no exporter here speaks) is refused at
/// start as a configuration error (exit 78), naming the variable, before anything listens.
#[test]
fn an_export_that_cannot_be_made_refuses_the_start() {
    let out = common::serve_refused(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
    ]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{text}");
    assert!(text.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{text}");
}

/// Appends from 8 threads for `seconds`, each request on a connection of its own: the appends
/// answered per second, and the time the slowest of them took.
fn load(server: &ServerProcess, seconds: f64) -> (f64, Duration) {
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(seconds);
    let http = server.http;
    let (answered, slowest) = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|t| {
                s.spawn(move || {
                    let (mut n, mut slowest) = (0, Duration::ZERO);
                    while std::time::Instant::now() < deadline {
                        let tag = format!("load:{t}");
                        let body = append_body(&[("Loaded", &[tag.as_str()], "{}")], None);
                        let sent = std::time::Instant::now();
                        let r = request(http, "POST", "/v1/append", &[], body.as_bytes());
                        slowest = slowest.max(sent.elapsed());
                        assert_eq!(r.status, 200, "{}", r.text());
                        n += 1;
                    }
                    (n, slowest)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .fold((0usize, Duration::ZERO), |(n, most), (m, slowest)| {
                (n + m, most.max(slowest))
            })
    });
    (answered as f64 / seconds, slowest)
}

/// How long the server's export of a batch waits for the collector in the test below: far
/// longer than any append takes, and shorter than the test client's own read timeout (30 s),
/// so an append that waited on an export would show as one.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(20);

/// Goal: with the collector gone under load (its port refuses), and then hung (its port takes
/// connections and answers nothing, so an export waits until the port is let go), appends are
/// answered as ever: none takes a third of the export's timeout, whatever the machine's load
/// does to their rate, and while the export hangs the spans that find its small queue full
/// are dropped rather than held. The exports that fail are counted, and once the collector is
/// back the export resumes: a new request's trace arrives.
#[test]
fn appends_go_on_while_the_collector_is_gone_and_export_resumes() {
    let Some(mut jaeger) = Jaeger::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut env = exporting_to(&jaeger);
    env.push((
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        EXPORT_TIMEOUT.as_millis().to_string(),
    ));
    env.push(("OTEL_BSP_MAX_QUEUE_SIZE", "64".into()));
    let server = start(dir.path(), &env);
    let count = |server: &ServerProcess, name| {
        let text = server.get("/metrics").text();
        annals_testkit::server::sample(&text, name).unwrap_or(0.0)
    };
    let (with, _) = load(&server, 1.0);
    assert!(with > 0.0);
    let failed_before = count(&server, "annals_trace_spans_failed_total");
    jaeger.stop();
    let (gone, slowest_gone) = load(&server, 1.5);
    let collector = jaeger.otlp_grpc();
    let address = collector.strip_prefix("http://").unwrap();
    let hung = std::net::TcpListener::bind(address).expect("the collector's port, to hold");
    let dropped_before = count(&server, "annals_trace_spans_dropped_total");
    let (held, slowest_held) = load(&server, 2.0);
    let dropped = count(&server, "annals_trace_spans_dropped_total") - dropped_before;
    drop(hung);
    let rates = format!("{with:.0}/s with the collector, {gone:.0}/s without, {held:.0}/s hung");
    for (slowest, what) in [(slowest_gone, "gone"), (slowest_held, "hung")] {
        assert!(
            slowest < EXPORT_TIMEOUT / 3,
            "an append took {slowest:?} with the collector {what} ({rates})"
        );
    }
    assert!(gone > 0.0 && held > 0.0, "{rates}");
    assert!(
        dropped > 0.0,
        "no span dropped while the export hung ({rates})"
    );
    annals_testkit::eventually("the failed exports counted", WAIT, || {
        count(&server, "annals_trace_spans_failed_total") > failed_before
    });
    jaeger.restart();
    let (trace, parent) = ids();
    annals_testkit::eventually(
        "a trace exported after the collector returned",
        WAIT,
        || {
            let body = append_body(&[("Noted", &[], "{}")], None);
            let r = request(
                server.http,
                "POST",
                "/v1/append",
                &[("traceparent", &format!("00-{trace}-{parent}-01"))],
                body.as_bytes(),
            );
            assert_eq!(r.status, 200, "{}", r.text());
            let held = jaeger.trace(&trace, 1, Duration::from_secs(2));
            !named(&held, "annals.append").is_empty()
        },
    );
}

/// Goal: with `telemetry.store_trace_context`, an append's trace context is stored in its
/// events' metadata and read back, over HTTP and gRPC, without a collector: added beside what
/// the caller's metadata holds, never over a `traceparent` of its own, nothing for metadata
/// that is not an object or for a request without a (valid) context. The same store started
/// again without the setting keeps what was stored and stamps nothing new.
#[test]
fn an_appends_trace_context_is_stored_with_its_events() {
    let dir = tempfile::tempdir().unwrap();
    let on = [("ANNALS_TELEMETRY_STORE_TRACE_CONTEXT", "true".to_string())];
    let server = start(dir.path(), &on);
    let (trace, parent) = ids();
    let traceparent = format!("00-{trace}-{parent}-01");
    let header = [("traceparent", traceparent.as_str())];
    let body = r#"{"events":[
        {"type":"Stamped","tags":["case:none"],"data":"{}"},
        {"type":"Stamped","tags":["case:object"],"data":"{}","metadata":{"by":"ada"}},
        {"type":"Stamped","tags":["case:own"],"data":"{}","metadata":{"traceparent":"mine"}},
        {"type":"Stamped","tags":["case:array"],"data":"{}","metadata":[1,2]}]}"#;
    let r = request(server.http, "POST", "/v1/append", &header, body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let untraced = r#"{"events":[{"type":"Stamped","tags":["case:untraced"],"data":"{}"}]}"#;
    let malformed = r#"{"events":[{"type":"Stamped","tags":["case:malformed"],"data":"{}"}]}"#;
    let bad = [("traceparent", "00-not-a-context-01")];
    for (headers, body) in [(&[][..], untraced), (&bad[..], malformed)] {
        let r = request(server.http, "POST", "/v1/append", headers, body.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let context = [
        ("traceparent", traceparent.as_str()),
        ("tracestate", "vendor=abc"),
    ];
    grpc_append(&server.grpc_url(), "Stamped", "case:grpc", &context);
    let read = request(server.http, "GET", "/v1/read", &[], b"").json();
    let metadata = |case: &str| {
        let events = read.as_array().unwrap();
        let event = events
            .iter()
            .find(|e| e["tags"][0] == format!("case:{case}"))
            .unwrap_or_else(|| panic!("no {case}: {read:#}"));
        event["metadata"].clone()
    };
    assert_eq!(
        metadata("none"),
        serde_json::json!({ "traceparent": traceparent })
    );
    assert_eq!(
        metadata("object"),
        serde_json::json!({ "traceparent": traceparent, "by": "ada" })
    );
    assert_eq!(
        metadata("own"),
        serde_json::json!({ "traceparent": "mine" })
    );
    assert_eq!(metadata("array"), serde_json::json!([1, 2]));
    assert_eq!(metadata("untraced"), Value::Null);
    assert_eq!(metadata("malformed"), Value::Null);
    assert_eq!(
        metadata("grpc"),
        serde_json::json!({ "traceparent": traceparent, "tracestate": "vendor=abc" })
    );
    // The same store started again without the setting: what was stored stays as it was,
    // and new appends are not stamped (off by default).
    drop(server);
    let again = start(dir.path(), &[]);
    let later = r#"{"events":[{"type":"Stamped","tags":["case:later"],"data":"{}"}]}"#;
    let r = request(again.http, "POST", "/v1/append", &header, later.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let read = request(again.http, "GET", "/v1/read", &[], b"").json();
    let events = read.as_array().unwrap();
    let last = events.last().unwrap();
    assert_eq!(last["tags"][0], "case:later");
    assert_eq!(last["metadata"], Value::Null, "{read:#}");
    assert_eq!(events[0]["metadata"]["traceparent"], traceparent.as_str());
}

/// Appends one event of `event_type` tagged `tag` over gRPC (UmaDB's protocol, through tonic),
/// with `metadata` in the call's metadata.
fn grpc_append(url: &str, event_type: &str, tag: &str, metadata: &[(&'static str, &str)]) {
    use umadb_proto::v1;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = tonic::transport::Channel::from_shared(url.to_string())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = v1::dcb_client::DcbClient::new(channel);
        let mut request = tonic::Request::new(v1::AppendRequest {
            events: vec![v1::Event {
                event_type: event_type.into(),
                tags: vec![tag.into()],
                data: b"{}".to_vec(),
                uuid: String::new(),
                metadata: Vec::new(),
            }],
            condition: None,
            tracking_info: None,
        });
        for (key, value) in metadata {
            request.metadata_mut().insert(*key, value.parse().unwrap());
        }
        client.append(request).await.unwrap();
    });
}
