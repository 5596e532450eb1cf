//! A throwaway Jaeger for tests, started the way an operator runs one: its all-in-one program
//! (v1.76.0, built by scripts/setup from the Go module proxy) on free loopback ports, with an
//! OTLP receiver (gRPC and HTTP), traces kept in memory, and its query API, which the tests
//! read traces from as Jaeger's own UI does. The metrics it receives go to its Prometheus
//! exporter (a component of the OpenTelemetry Collector that Jaeger is built on), which the
//! tests scrape. It can be stopped and started again on the same
//! ports, as a collector that goes away for a while.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, tool};

/// Jaeger's program (`ANNALS_JAEGER_BIN`).
pub fn jaeger_bin() -> Option<PathBuf> {
    tool("ANNALS_JAEGER_BIN", "jaeger-1.76.0/jaeger")
}

/// Whether the tests must find Jaeger (the test command says so); otherwise a test without
/// it skips, saying why.
pub fn jaeger_required() -> bool {
    std::env::var_os("ANNALS_REQUIRE_JAEGER").is_some_and(|v| v == "1")
}

/// A running (or stopped) Jaeger.
pub struct Jaeger {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// OTLP over gRPC, OTLP over HTTP, the query API over HTTP, and over gRPC, and the
    /// Prometheus exporter of the metrics received.
    ports: [u16; 5],
    child: Option<Child>,
}

impl Jaeger {
    /// Starts Jaeger; None (saying why) when it is not installed and the tests do not require
    /// it.
    pub fn start() -> Option<Jaeger> {
        let Some(bin) = jaeger_bin() else {
            if jaeger_required() {
                panic!("Jaeger is required (ANNALS_REQUIRE_JAEGER=1): run scripts/setup");
            }
            eprintln!("skipped: Jaeger is not installed (scripts/setup installs it)");
            return None;
        };
        let mut jaeger = Jaeger {
            dir: tempfile::tempdir().expect("a temporary directory"),
            bin,
            ports: [
                free_port(),
                free_port(),
                free_port(),
                free_port(),
                free_port(),
            ],
            child: None,
        };
        jaeger.run();
        Some(jaeger)
    }

    /// The OTLP endpoint over gRPC, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it.
    pub fn otlp_grpc(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[0])
    }

    /// The OTLP endpoint over HTTP (its base; the exporter adds `/v1/traces`).
    pub fn otlp_http(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[1])
    }

    /// The query API's address (and the UI's).
    pub fn query(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.ports[2]).into()
    }

    /// The metrics received, as its Prometheus exporter serves them (text format).
    pub fn metrics(&self) -> Option<String> {
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], self.ports[4]).into();
        let response =
            std::panic::catch_unwind(|| crate::http::request(addr, "GET", "/metrics", &[], b""))
                .ok()?;
        (response.status == 200).then(|| response.text())
    }

    fn config(&self) -> String {
        let [grpc, http, query, query_grpc, prometheus] = self.ports;
        format!(
            "service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: []
      exporters: [jaeger_storage_exporter]
    metrics:
      receivers: [otlp]
      processors: []
      exporters: [prometheus]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memory
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memory:
        memory:
          max_traces: 200000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc}
      http:
        endpoint: 127.0.0.1:{http}
exporters:
  jaeger_storage_exporter:
    trace_storage: memory
  prometheus:
    endpoint: 127.0.0.1:{prometheus}
"
        )
    }

    fn run(&mut self) {
        let config = self.dir.path().join("jaeger.yaml");
        std::fs::write(&config, self.config()).expect("write Jaeger's configuration");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("jaeger.log"))
            .expect("Jaeger's log");
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(format!("file:{}", config.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log again"))
            .stderr(log)
            .spawn()
            .expect("start Jaeger");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("Jaeger exited at start ({status}):\n{}", self.log());
            }
            let answered = std::net::TcpStream::connect(("127.0.0.1", self.ports[0])).is_ok()
                && self.get("/api/services").is_some();
            if answered {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Jaeger did not start:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Jaeger's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("jaeger.log")).unwrap_or_default()
    }

    /// Stops it (SIGKILL): the collector is gone, with what it held.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports.
    pub fn restart(&mut self) {
        self.stop();
        self.run();
    }

    /// A GET of the query API, parsed; None when it does not answer 200.
    pub fn get(&self, path: &str) -> Option<serde_json::Value> {
        let response =
            std::panic::catch_unwind(|| crate::http::request(self.query(), "GET", path, &[], b""))
                .ok()?;
        (response.status == 200).then(|| response.json())
    }

    /// The spans of trace `id` (32 hexadecimal digits) Jaeger holds, as its API gives them
    /// (`data[0].spans`, with `data[0].processes`), waiting up to `within` for at least
    /// `spans` of them.
    pub fn trace(&self, id: &str, spans: usize, within: Duration) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            if let Some(answer) = self.get(&format!("/api/traces/{id}")) {
                let held = answer["data"][0]["spans"].as_array().map_or(0, Vec::len);
                if held >= spans || Instant::now() >= deadline {
                    return answer["data"][0].clone();
                }
            } else if Instant::now() >= deadline {
                return serde_json::Value::Null;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        self.stop();
    }
}
