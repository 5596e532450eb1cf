//! `annals-bench image`: the container image (scripts/image), with podman: its size
//! uncompressed (as the engine stores it) and compressed (the image saved and gzipped, about
//! what a registry transfers), the time scripts/image takes on a built tree, and the time from
//! `podman run` to the first acknowledged append on a new volume.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench::median;

#[derive(clap::Args)]
pub struct ImageArgs {
    /// Runs of each timing (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Package this `annals` binary (as scripts/image --binary) instead of the one
    /// scripts/image builds (the `dist` profile).
    #[arg(long, value_name = "FILE")]
    binary: Option<PathBuf>,
    /// The image's name.
    #[arg(long, default_value = "localhost/annals-bench:latest")]
    tag: String,
}

/// The repository's root, where scripts/image is: the working directory's, else the one this
/// program was built in.
fn root() -> PathBuf {
    let root = if Path::new("scripts/image").exists() {
        PathBuf::from(".")
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    };
    // Absolute: the engine's helpers run in directories of their own.
    std::fs::canonicalize(&root).unwrap_or(root)
}

fn engine_conf() -> PathBuf {
    std::env::var_os("CONTAINERS_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("packaging/containers.conf"))
}

fn podman(args: &[&str]) -> Result<String, String> {
    let out = Command::new("podman")
        .args(args)
        .env("CONTAINERS_CONF", engine_conf())
        .output()
        .map_err(|e| format!("podman: {e} (scripts/setup container installs it)"))?;
    if !out.status.success() {
        return Err(format!(
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// scripts/image, timed.
fn build(args: &ImageArgs) -> Result<f64, String> {
    let mut command = Command::new(root().join("scripts/image"));
    command.args(["--tag", &args.tag]);
    if let Some(binary) = &args.binary {
        command.arg("--binary").arg(binary);
    }
    let started = Instant::now();
    let out = command
        .env("CONTAINERS_CONF", engine_conf())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("scripts/image: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/image: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The image saved as an archive and gzipped (level 6): its bytes.
fn compressed_bytes(tag: &str) -> Result<u64, String> {
    let mut save = Command::new("podman")
        .args(["save", "--format", "docker-archive", tag])
        .env("CONTAINERS_CONF", engine_conf())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("podman save: {e}"))?;
    let archive = save.stdout.take().ok_or("podman save: no output")?;
    let gzip = Command::new("gzip")
        .arg("-6")
        .stdin(archive)
        .stdout(Stdio::piped())
        .output()
        .map_err(|e| format!("gzip: {e}"))?;
    let saved = save.wait().map_err(|e| e.to_string())?;
    if !saved.success() || !gzip.status.success() {
        return Err("podman save | gzip failed".into());
    }
    Ok(gzip.stdout.len() as u64)
}

/// One POST /v1/append on a new connection: whether it was acknowledged (200).
fn appended(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let body = r#"{"events":[{"type":"Started","tags":["bench:image"],"data":"first"}]}"#;
    let request = format!(
        "POST /v1/append HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

/// `podman run` of the image on a new volume, then appends until one is acknowledged: the
/// seconds from the run's start to that acknowledgement.
fn first_append(tag: &str) -> Result<f64, String> {
    let port = annals_testkit::free_port();
    let name = format!("annals-bench-image-{}-{port}", std::process::id());
    let publish = format!("127.0.0.1:{port}:7400");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    let run = podman(&[
        "run",
        "-d",
        "--name",
        &name,
        "-p",
        &publish,
        "-e",
        "ANNALS_ALLOW_UNAUTHENTICATED_NETWORK=1",
        "-e",
        "ANNALS_GRPC_LISTEN=off",
        tag,
    ]);
    let outcome = run.and_then(|_| {
        while !appended(addr) {
            if started.elapsed() > Duration::from_secs(60) {
                return Err("no append was acknowledged within a minute".to_string());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(started.elapsed().as_secs_f64())
    });
    let _ = podman(&["rm", "-f", "-v", "-t", "10", &name]);
    outcome
}

pub fn run(args: ImageArgs) -> Result<Value, String> {
    let mut builds = Vec::new();
    for run in 0..args.runs.max(1) {
        let seconds = build(&args)?;
        eprintln!("scripts/image run {}: {seconds:.1} s", run + 1);
        builds.push(seconds);
    }
    let size: u64 = podman(&["image", "inspect", "--format", "{{.Size}}", &args.tag])?
        .parse()
        .map_err(|e| format!("the image's size: {e}"))?;
    let compressed = compressed_bytes(&args.tag)?;
    let mut starts = Vec::new();
    for run in 0..args.runs.max(1) {
        let seconds = first_append(&args.tag)?;
        eprintln!("run to first append {}: {:.0} ms", run + 1, seconds * 1e3);
        starts.push(seconds);
    }
    let binary = match &args.binary {
        Some(b) => b.display().to_string(),
        None => "scripts/image's own build (the dist profile, linked statically)".into(),
    };
    Ok(json!({
        "bench": "image",
        "binary": binary,
        "image_bytes": size,
        "image_gzip_bytes": compressed,
        "scripts_image_seconds": median(builds.clone()),
        "runs_scripts_image_seconds": builds,
        "run_to_first_append_seconds": median(starts.clone()),
        "runs_run_to_first_append_seconds": starts,
        "durability": "d3",
    }))
}
