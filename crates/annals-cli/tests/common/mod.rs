//! A running `annals serve` child process and a small blocking HTTP/1.1 client that can also
//! misbehave on purpose (partial requests, stalls), for the end-to-end tests.
#![allow(dead_code)]

pub mod answers;
pub mod claims;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct ServerProcess {
    pub child: Child,
    pub http: SocketAddr,
    pub grpc: Option<SocketAddr>,
    pub dir: PathBuf,
    /// Lines the server printed before its listening line.
    pub startup: Vec<String>,
    /// Lines the server printed after its listening line.
    pub output: std::sync::mpsc::Receiver<String>,
}

impl ServerProcess {
    /// Starts `annals serve` on `dir` with ephemeral ports and `extra` flags; waits for its
    /// listening line.
    pub fn start(dir: &Path, extra: &[&str]) -> ServerProcess {
        Self::start_with_env(dir, extra, &[])
    }

    pub fn start_with_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        Self::launch(Some(dir), extra, env)
    }

    /// Starts `annals serve` with `args` instead of a data directory (a replica, say).
    pub fn launch_with(args: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        Self::launch(None, args, env)
    }

    /// Starts `annals serve --store <url>` on a PostgreSQL database.
    pub fn start_postgres(url: &str, extra: &[&str]) -> ServerProcess {
        let mut args = vec!["--store", url];
        args.extend_from_slice(extra);
        Self::launch(None, &args, &[])
    }

    fn launch(dir: Option<&Path>, extra: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_annals"));
        command.arg("serve");
        if let Some(dir) = dir {
            command.arg("--data-dir").arg(dir);
        }
        command
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
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
        let deadline = Instant::now() + Duration::from_secs(60);
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

/// Runs tests/python (UmaDB's Python client, and the eventsourcing library's recorders,
/// applications and projections on its UmaDB persistence module) with
/// pytest and `env`; fails with pytest's output. Skipped, saying why, when the Python packages
/// are missing, unless the test command requires them (ANNALS_REQUIRE_PYTHON).
pub fn python_suite(env: &[(&str, String)]) {
    let python = annals_testkit::python().unwrap_or_else(|| "python3".into());
    let has_packages = annals_testkit::tools_allowed()
        && Command::new(&python)
            .args([
                "-c",
                "import umadb, pytest, eventsourcing, eventsourcing_umadb",
            ])
            .status()
            .is_ok_and(|s| s.success());
    if !has_packages {
        assert!(
            std::env::var_os("ANNALS_REQUIRE_PYTHON").is_none(),
            "{} lacks the umadb, eventsourcing and pytest packages: run scripts/setup",
            python.display()
        );
        eprintln!("skipped: no Python with umadb/pytest (scripts/test installs them)");
        return;
    }
    let tests = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python");
    let out = Command::new(&python)
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider", tests])
        .env("ANNALS_BIN", env!("CARGO_BIN_EXE_annals"))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "pytest failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The error kind of a JSON error answer.
    pub fn kind(&self) -> String {
        self.json()["kind"].as_str().unwrap_or_default().to_string()
    }
}

/// One request on a fresh connection (`Connection: close`); a body without a Content-Type
/// goes as `application/json`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut headers = headers.to_vec();
    if !body.is_empty()
        && !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        headers.push(("content-type", "application/json"));
    }
    request_exactly(addr, method, path, &headers, body)
}

/// One request on a fresh connection (`Connection: close`), with only the headers given.
pub fn request_exactly(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    read_response(&mut BufReader::new(stream))
}

/// Reads one response (content-length, chunked, or until close).
pub fn read_response(reader: &mut impl BufRead) -> Response {
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').unwrap();
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(len) = find("content-length") {
        body.resize(len.parse().unwrap(), 0);
        reader.read_exact(&mut body).unwrap();
    } else if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        let _ = reader.read_to_end(&mut body);
    }
    Response {
        status,
        headers,
        body,
    }
}

/// A streaming GET whose chunked body is read line by line (NDJSON or SSE).
pub struct Stream {
    reader: BufReader<TcpStream>,
    pending: Vec<u8>,
    pub status: u16,
}

impl Stream {
    pub fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Stream {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut head = format!("GET {path} HTTP/1.1\r\nhost: test\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        (&stream).write_all(head.as_bytes()).unwrap();
        let mut reader = BufReader::new(stream);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).unwrap();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.trim_end().is_empty() {
                break;
            }
        }
        Stream {
            reader,
            pending: Vec::new(),
            status,
        }
    }

    /// The next line of the (chunked) body, without its newline; None when the body ends.
    pub fn next_line(&mut self) -> Option<String> {
        loop {
            if let Some(at) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                return Some(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
            }
            let mut size = String::new();
            if self.reader.read_line(&mut size).ok()? == 0 {
                return None;
            }
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; n + 2];
            self.reader.read_exact(&mut chunk).ok()?;
            if n == 0 {
                return None;
            }
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A JSON append body of events `(type, tags, data)` with an optional condition (JSON text).
pub fn append_body(events: &[(&str, &[&str], &str)], condition: Option<&str>) -> String {
    let events: Vec<serde_json::Value> = events
        .iter()
        .map(|(t, tags, data)| serde_json::json!({"type": t, "tags": tags, "data": data}))
        .collect();
    let mut body = serde_json::json!({ "events": events });
    if let Some(c) = condition {
        body["condition"] = serde_json::from_str(c).unwrap();
    }
    body.to_string()
}
