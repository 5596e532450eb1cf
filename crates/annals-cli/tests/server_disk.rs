//! `annals serve` on a real file system that fills up: a small tmpfs the test mounts (it must
//! run as root, as CI does; elsewhere it says so and stops, and the simulated disk's full-disk
//! tests in crates/annals cover the store).
//! Also the disk going bad under a running server: a byte flipped in a sealed segment, which
//! the scrub must report in `/health` and `/metrics`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use annals_testkit::{eventually, Tmpfs};
use common::{append_body, ServerProcess, Stream};

/// An append of one event of about 200 KiB whose data starts with `nonce`.
fn big_append(nonce: &str) -> String {
    let data = format!("{nonce}:{}", "x".repeat(200 << 10));
    append_body(&[("Filled", &["fill"], &data)], None)
}

/// Appends until the server refuses; returns the nonces acknowledged and the refusal.
fn fill(server: &ServerProcess, from: usize) -> (Vec<String>, common::Response) {
    let mut acknowledged = Vec::new();
    for n in from.. {
        let nonce = format!("n{n}");
        let response = server.post("/v1/append", &big_append(&nonce));
        if response.status != 200 {
            return (acknowledged, response);
        }
        acknowledged.push(nonce);
        assert!(acknowledged.len() < 5000, "the file system never filled");
    }
    unreachable!()
}

/// The nonces of every event the server holds, in order.
fn stored(server: &ServerProcess) -> Vec<String> {
    server
        .read("{}", "{}")
        .iter()
        .map(|e| {
            let data = e["data"].as_str().unwrap();
            data.split(':').next().unwrap().to_string()
        })
        .collect()
}

/// Waits up to 5 s for a line of the server's log containing `text`.
fn logged(server: &ServerProcess, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match server.output.recv_timeout(left) {
            Ok(line) if line.contains(text) => return line,
            Ok(_) => {}
            Err(_) => panic!("the server never logged {text:?}"),
        }
    }
}

fn metric(server: &ServerProcess, name: &str) -> Option<f64> {
    let text = String::from_utf8(server.get("/metrics").body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Goal: a full disk is a state the server lives through. Story: on a 150 MiB file system,
/// the append that needed a third segment answered 500 and poisoned the store, every later
/// append answered 503, and a restart on the full disk failed, so not even reads were served.
/// Method: a 160 MiB tmpfs and a 16 MiB reserve; 200 KiB appends over HTTP until refused: the
/// refusal is 507 `disk_full`, nothing is poisoned, /health and /metrics say so, reads and a
/// subscription go on, and the log says so; the file system grown by a remount: the log says
/// so within a second, and appends resume without a restart;
/// filled again and the server killed with -9 while full: it starts on the full disk, serves
/// every acknowledged append, refuses appends with 507 once its segment is full, and takes
/// them again when the file system grows.
#[test]
fn a_full_disk_refuses_appends_and_resumes() {
    let Some(mount) = Tmpfs::mount(160) else {
        return;
    };
    let dir = mount.path().join("data");
    let start = |dir: &Path| ServerProcess::start(dir, &["--disk-reserve", "16777216"]);
    let mut server = start(&dir);
    let (mut acknowledged, refusal) = fill(&server, 0);
    assert_eq!(refusal.status, 507, "{}", refusal.text());
    assert_eq!(refusal.kind(), "disk_full");
    assert!(
        acknowledged.len() > 300,
        "{} appends fit",
        acknowledged.len()
    );
    // Refused again, and nothing is poisoned.
    let again = server.post("/v1/append", &big_append("refused"));
    assert_eq!(again.status, 507);
    let health = server.get("/health");
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "disk_full", "{}", health.text());
    assert_eq!(metric(&server, "annals_disk_full"), Some(1.0));
    assert_eq!(metric(&server, "annals_poisoned"), Some(0.0));
    assert!(metric(&server, "annals_disk_free_bytes").unwrap() < (80 << 20) as f64);
    assert!(metric(&server, "annals_disk_full_refusals_total").unwrap() >= 2.0);
    logged(&server, "annals: disk full");
    // Reads and a subscription go on.
    assert_eq!(stored(&server), acknowledged);
    let mut stream = Stream::open(server.http, "/v1/subscribe?after=0", &[]);
    assert_eq!(stream.status, 200);
    let first: serde_json::Value = serde_json::from_str(&stream.next_line().unwrap()).unwrap();
    assert_eq!(first["position"], 1);

    // Room again: appends resume, with no restart.
    mount.resize(320);
    logged(&server, "room on the disk again");
    let resumed = server.post("/v1/append", &big_append("resumed"));
    assert_eq!(resumed.status, 200, "{}", resumed.text());
    acknowledged.push("resumed".into());
    assert_eq!(server.get("/health").json()["status"], "ok");
    assert_eq!(metric(&server, "annals_disk_full"), Some(0.0));

    // Full again, then killed: the restart on the full disk serves everything acknowledged.
    let (more, refusal) = fill(&server, acknowledged.len());
    assert_eq!(refusal.status, 507, "{}", refusal.text());
    acknowledged.extend(more);
    server.kill9();
    server = start(&dir);
    assert_eq!(stored(&server), acknowledged);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (more, refusal) = fill(&server, acknowledged.len() + 1_000_000);
    assert_eq!(refusal.status, 507, "{}", refusal.text());
    acknowledged.extend(more);
    mount.resize(480);
    let resumed = server.post("/v1/append", &big_append("after-restart"));
    assert_eq!(resumed.status, 200, "{}", resumed.text());
    acknowledged.push("after-restart".into());
    assert_eq!(stored(&server), acknowledged);
    assert!(Instant::now() < deadline);
}

/// Goal: a byte flipped in a sealed segment of a running server (no backup to repair it from)
/// is found by the scrub and reported where an operator looks: `/health` says "damaged" and
/// names the segment, `/metrics` counts it; the server keeps serving the rest.
#[test]
fn the_scrub_reports_a_flipped_byte_in_health_and_metrics() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ServerProcess::start_with_env(
        &data,
        &[],
        &[
            ("ANNALS_SCRUB_BYTES_PER_SECOND", "1073741824"),
            ("ANNALS_SCRUB_PAUSE_SECONDS", "0.2"),
        ],
    );
    // About 72 MiB: the first segment (64 MiB) is sealed.
    let chunk = "d".repeat(900 << 10);
    for i in 0..80 {
        let body = append_body(&[("Filled", &["fill"], &format!("{i}:{chunk}"))], None);
        assert_eq!(server.post("/v1/append", &body).status, 200);
    }
    assert!(
        data.join(annals::files::segment(2)).exists(),
        "the first segment is sealed"
    );
    assert_eq!(server.get("/health").json()["status"], "ok");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(data.join(annals::files::segment(1)))
        .unwrap();
    let at = 32 << 20;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    assert_eq!(byte[0], b'd', "the byte is inside an event's data");
    file.write_all_at(b"e", at).unwrap();
    let health = eventually(
        "the scrub to report the damage",
        Duration::from_secs(30),
        || {
            let health = server.get("/health").json();
            if health["status"] == "damaged" {
                Ok(health)
            } else {
                Err(health)
            }
        },
    );
    let reason = health["reason"].as_str().unwrap();
    assert!(reason.contains(&annals::files::segment(1)), "{reason}");
    assert!(metric(&server, "annals_scrub_damaged_segments").unwrap_or(0.0) >= 1.0);
    // The rest still serves: the head, and appends.
    let body = append_body(&[("After", &["after"], "x")], None);
    assert_eq!(server.post("/v1/append", &body).status, 200);
}
