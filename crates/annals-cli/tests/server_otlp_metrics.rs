//! Metrics pushed over OTLP to a real collector (Jaeger's all-in-one program, which scripts/setup
//! builds, its metrics pipeline ending in the OpenTelemetry Collector's Prometheus exporter),
//! read back from that exporter and compared with the server's own `/metrics`: the same
//! series, labels and values, over gRPC and over HTTP; a collector that goes away is counted
//! and reported once, and the push resumes when it returns.

mod common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use annals_testkit::jaeger::Jaeger;
use common::{append_body, request, ServerProcess, ANNALS};

const WAIT: Duration = Duration::from_secs(30);

/// One sample of a text exposition: its name, labels and value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The samples of a Prometheus text exposition (labels parsed; `le` kept as written).
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let mut map = BTreeMap::new();
        let mut rest = labels;
        while let Some((key, after)) = rest.split_once("=\"") {
            let end = after.find('"').expect("a label's value ends");
            map.insert(
                key.trim_start_matches(',').to_string(),
                after[..end].to_string(),
            );
            rest = &after[end + 1..];
        }
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().expect("a sample's value"),
        };
        out.push(Sample {
            name: name.to_string(),
            labels: map,
            value,
        });
    }
    out
}

/// Whether a pushed sample (with the collector's own labels, `job` among them) is the
/// scraped one: the same name, the scrape's labels (a bucket's bound compared as a number).
fn same_series(pushed: &Sample, scraped: &Sample) -> bool {
    pushed.name == scraped.name
        && scraped.labels.iter().all(|(k, v)| match k.as_str() {
            "le" => {
                let bound = |s: &str| s.parse::<f64>().ok();
                pushed.labels.get("le").and_then(|p| bound(p)) == bound(v)
            }
            _ => pushed.labels.get(k) == Some(v),
        })
}

/// The series compared: they do not move while the test reads them (the process's own do).
fn compared(name: &str) -> bool {
    [
        "annals_appends_total",
        "annals_events_appended_total",
        "annals_head_position",
        "annals_requests_total",
        "annals_request_duration_seconds",
        "annals_group_appends",
        "annals_fsync_seconds",
        "annals_build_info",
        "annals_durability_info",
    ]
    .iter()
    .any(|series| name.starts_with(series))
}

fn start(dir: &std::path::Path, env: &[(&str, &str)]) -> ServerProcess {
    ServerProcess::start_with_env(dir, &[], env)
}

fn append(http: std::net::SocketAddr, n: usize) {
    for i in 0..n {
        let tag = format!("n:{i}");
        let body = append_body(&[("Noted", &[tag.as_str()], "{}")], None);
        let r = request(http, "POST", "/v1/append", &[], body.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// Goal: the series pushed over OTLP are those `/metrics` serves, with the same names,
/// labels and values: counters (with `_total` as a Prometheus exporter writes them), gauges,
/// info series and histograms bucket by bucket; over gRPC and over HTTP with protobuf.
/// Method: 25 appends to a server pushing every 200 ms under a service name of its own, then
/// every compared series of its scrape found among those Jaeger's Prometheus exporter serves
/// under that service's `job`.
#[test]
fn the_pushed_series_are_the_scraped_ones() {
    let Some(jaeger) = Jaeger::start() else {
        return;
    };
    for (protocol, endpoint, service) in [
        ("grpc", jaeger.otlp_grpc(), "annals-grpc"),
        ("http/protobuf", jaeger.otlp_http(), "annals-http"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
            ("OTEL_SERVICE_NAME", service),
            ("OTEL_TRACES_EXPORTER", "none"),
        ];
        let server = start(dir.path(), &env);
        append(server.http, 25);
        let scraped: Vec<Sample> =
            samples(&request(server.http, "GET", "/metrics", &[], b"").text())
                .into_iter()
                .filter(|s| compared(&s.name))
                .collect();
        assert!(scraped.len() > 40, "{scraped:?}");
        let appends = scraped
            .iter()
            .find(|s| s.name == "annals_appends_total")
            .expect("the appends' counter");
        assert_eq!(appends.value, 25.0);
        // Pushes go on every 200 ms: wait for one that holds the 25 appends, then compare.
        let pushed = annals_testkit::eventually("the appends pushed", WAIT, || {
            let pushed: Vec<Sample> = samples(&jaeger.metrics()?)
                .into_iter()
                .filter(|s| s.labels.get("job").map(String::as_str) == Some(service))
                .collect();
            pushed
                .iter()
                .any(|p| same_series(p, appends) && p.value == 25.0)
                .then_some(pushed)
        });
        for s in &scraped {
            let found = pushed.iter().find(|p| same_series(p, s));
            let found = found.unwrap_or_else(|| panic!("{protocol}: {s:?} was not pushed"));
            let close = (found.value - s.value).abs() <= 1e-9 * s.value.abs().max(1.0);
            assert!(close, "{protocol}: pushed {found:?}, scraped {s:?}");
        }
        let exports = request(server.http, "GET", "/metrics", &[], b"").text();
        let taken = annals_testkit::server::sample(&exports, "annals_metric_exports_total");
        assert!(taken.is_some_and(|n| n >= 1.0), "{exports}");
    }
}

/// Goal: a collector that goes away costs no request: the pushes that fail are counted, the
/// log says so once, and once it is back the push resumes and the log says that once.
/// Method: Jaeger stopped while the server pushes every 100 ms and takes appends, then
/// started again on the same ports; the series it then serves hold the appends made while it
/// was gone.
#[test]
fn a_collector_that_goes_away_is_counted_and_the_push_resumes() {
    let Some(mut jaeger) = Jaeger::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let endpoint = jaeger.otlp_grpc();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "100"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
        ("OTEL_SERVICE_NAME", "annals-away"),
        ("OTEL_TRACES_EXPORTER", "none"),
    ];
    let server = annals_testkit::server::ServerProcess::launch_logging(
        std::path::Path::new(ANNALS),
        Some(&dir.path().join("data")),
        &[],
        &env,
        Stdio::from(log),
    );
    let metric = |name: &str| {
        let text = request(server.http, "GET", "/metrics", &[], b"").text();
        annals_testkit::server::sample(&text, name).unwrap_or(0.0)
    };
    annals_testkit::eventually("a push taken", WAIT, || {
        (metric("annals_metric_exports_total") >= 1.0).then_some(())
    });
    jaeger.stop();
    append(server.http, 30);
    annals_testkit::eventually("failed pushes counted", WAIT, || {
        (metric("annals_metric_exports_failed_total") >= 3.0).then_some(())
    });
    jaeger.restart();
    let pushed_appends = |text: &str| {
        samples(text).into_iter().find(|s| {
            s.name == "annals_appends_total"
                && s.labels.get("job").map(String::as_str) == Some("annals-away")
        })
    };
    annals_testkit::eventually("the appends made while it was gone", WAIT, || {
        let sample = pushed_appends(&jaeger.metrics()?)?;
        (sample.value == 30.0).then_some(())
    });
    drop(server);
    let text = std::fs::read_to_string(&log_path).unwrap();
    let count = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("does not take metrics"), 1, "{text}");
    assert_eq!(count("takes metrics again"), 1, "{text}");
}

/// Goal: a push that cannot be made as asked (an exporter no one here has, an interval that
/// is not one, a temporality not pushed) is refused at start as a configuration error
/// (exit 78), naming the variable, before anything listens.
#[test]
fn a_push_that_cannot_be_made_refuses_the_start() {
    for (name, value) in [
        ("OTEL_METRICS_EXPORTER", "statsd"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "often"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
    ] {
        let out = common::serve_refused(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            (name, value),
        ]);
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{name}={value}: {text}");
        assert!(text.contains(name), "{text}");
    }
}

/// Goal: the series the operators of an OTLP backend ask for are among those scraped and
/// pushed: appends' times by the durability class they were acknowledged in, and how far the
/// slowest live subscription is behind. Method: a D2 server takes appends at its class and
/// one that asks for D3; a subscriber that does not read falls behind appends of 24 MB (the
/// server stops reading for it once its stream's budget and the socket are full), then
/// reads everything and is caught up.
#[test]
fn appends_by_class_and_the_slowest_subscription_are_measured() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_env(dir.path(), &["--durability", "d2"], &[]);
    let metric = |name: &str| {
        let text = request(server.http, "GET", "/metrics", &[], b"").text();
        annals_testkit::server::sample(&text, name).unwrap_or(-1.0)
    };
    append(server.http, 2);
    let synced = r#"{"events":[{"type":"Noted","tags":["n:s"],"data":"{}"}],"durability":"d3"}"#;
    let r = request(server.http, "POST", "/v1/append", &[], synced.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let count = |class: &str| {
        metric(&format!(
            "annals_append_duration_seconds_count{{class=\"{class}\"}}"
        ))
    };
    assert_eq!((count("d2"), count("d3"), count("d4")), (2.0, 1.0, 0.0));
    assert_eq!(metric("annals_subscription_lag_positions"), 0.0);
    let mut stream = annals_testkit::http::Stream::open(server.http, "/v1/subscribe?after=0", &[]);
    assert_eq!(stream.status, 200);
    let data = "x".repeat(2000);
    let mut head = 0;
    for _ in 0..24 {
        let events: Vec<(&str, &[&str], &str)> = vec![("Big", &["big:1"][..], data.as_str()); 500];
        let body = append_body(&events, None);
        let r = request(server.http, "POST", "/v1/append", &[], body.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        head = r.json()["position"].as_u64().unwrap();
    }
    let behind = annals_testkit::eventually("the subscriber behind", WAIT, || {
        let lag = metric("annals_subscription_lag_positions");
        (lag > 0.0).then_some(lag)
    });
    assert!(behind <= head as f64, "{behind} behind a head of {head}");
    let mut seen = 0;
    while seen < head {
        let line = stream.next_line().expect("the stream goes on");
        if line.trim().is_empty() {
            continue;
        }
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        seen = event["position"].as_u64().unwrap();
    }
    annals_testkit::eventually("the subscriber caught up", WAIT, || {
        (metric("annals_subscription_lag_positions") == 0.0).then_some(())
    });
}
