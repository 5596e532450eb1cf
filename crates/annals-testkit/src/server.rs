//! A running `annals serve` child process on ephemeral loopback ports, for the end-to-end
//! tests: started from the binary the test names (a test of the command-line crate passes
//! `env!("CARGO_BIN_EXE_annals")`), ready once it printed its listening line, killed when
//! dropped; with shorthands for the HTTP API over [`crate::http`].

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http::{encode, request, Response};

/// How long a server may take to print its listening line (a replica or a database store
/// reads its log first).
const STARTUP: Duration = Duration::from_secs(60);

pub struct ServerProcess {
    pub child: Child,
    pub http: SocketAddr,
    pub grpc: Option<SocketAddr>,
    /// The data directory it was started on (empty for a database store or a replica).
    pub dir: PathBuf,
    /// Lines the server printed before its listening line.
    pub startup: Vec<String>,
    /// Lines the server printed after its listening line.
    pub output: std::sync::mpsc::Receiver<String>,
}

impl ServerProcess {
    /// Starts `bin serve` (on the data directory `dir`, when given) with ephemeral HTTP and
    /// gRPC ports, `args` and the environment `env`; waits for its listening line.
    pub fn launch(
        bin: &Path,
        dir: Option<&Path>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ServerProcess {
        Self::launch_logging(bin, dir, args, env, Stdio::inherit())
    }

    /// [`ServerProcess::launch`], its log (stderr) going to `log` (a file a test reads).
    pub fn launch_logging(
        bin: &Path,
        dir: Option<&Path>,
        args: &[&str],
        env: &[(&str, &str)],
        log: Stdio,
    ) -> ServerProcess {
        let mut command = Command::new(bin);
        command.arg("serve");
        if let Some(dir) = dir {
            command.arg("--data-dir").arg(dir);
        }
        command
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(log);
        for (k, _) in std::env::vars_os() {
            if k.to_str().is_some_and(harness_variable) {
                command.env_remove(k);
            }
        }
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn annals serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + STARTUP;
        let mut startup = Vec::new();
        loop {
            let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server did not print its listening line");
            };
            if let Some(rest) = line.strip_prefix("annals: listening ") {
                let mut http = None;
                let mut grpc = None;
                for part in rest.split_whitespace() {
                    if let Some(a) = part.strip_prefix("http=") {
                        http = Some(a.parse().unwrap());
                    }
                    if let Some(a) = part.strip_prefix("grpc=") {
                        grpc = a.parse().ok();
                    }
                }
                return ServerProcess {
                    child,
                    http: http.unwrap(),
                    grpc,
                    dir: dir.map(Path::to_path_buf).unwrap_or_default(),
                    startup,
                    output: rx,
                };
            }
            startup.push(line);
        }
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc.expect("gRPC is on"))
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill takes plain integers; the child is ours and not yet reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait().unwrap()
    }

    pub fn get(&self, path: &str) -> Response {
        request(self.http, "GET", path, &[], b"")
    }

    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        request(self.http, "GET", path, headers, b"")
    }

    pub fn post(&self, path: &str, body: &str) -> Response {
        request(
            self.http,
            "POST",
            path,
            &[("content-type", "application/json")],
            body.as_bytes(),
        )
    }

    pub fn head(&self) -> u64 {
        let r = self.get("/v1/head");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["head"].as_u64().unwrap()
    }

    /// Appends and returns the parsed answer (status 200 required).
    pub fn append(&self, body: &str) -> serde_json::Value {
        let r = self.post("/v1/append", body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    /// Waits up to `within` until the server's backup holds every append it made durable
    /// (`annals_backup_lag_positions` 0): before a replica starts from it, or a test looks
    /// into it.
    pub fn await_backup_shipped(&self, within: Duration) {
        crate::eventually("the backup to hold every append", within, || {
            sample(&self.get("/metrics").text(), "annals_backup_lag_positions") == Some(0.0)
        });
    }

    /// Reads with a query and options given as JSON text.
    pub fn read(&self, query: &str, options: &str) -> Vec<serde_json::Value> {
        let r = self.get(&format!(
            "/v1/read?query={}&options={}",
            encode(query),
            encode(options)
        ));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json().as_array().unwrap().clone()
    }
}

/// Whether `name` is one of the tests' own variables (which tools the test command requires
/// and where they are, a seed, a request to rewrite fixtures or keep screenshots), not a
/// setting of `annals serve`: a server started here does not inherit them, or it would warn
/// of each as a misspelt setting at every start.
fn harness_variable(name: &str) -> bool {
    name.strip_prefix("ANNALS_").is_some_and(|rest| {
        rest.starts_with("REQUIRE_")
            || rest.starts_with("UPDATE_")
            || rest.ends_with("_BIN")
            || matches!(
                rest,
                "PYTHON" | "JAVA_HOME" | "TOOLS" | "NO_TOOLS" | "SEED" | "CONSOLE_SCREENSHOTS"
            )
    })
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the sample `name` (with its labels as written: `name{label="v"}`) in the
/// Prometheus text a server's `/metrics` answers; None when it has none. For tests of the
/// exposition: tools read the statistics as JSON (`GET /v1/admin/stats`).
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
