//! The `annals` binary end to end: verify and stats.

use std::process::Command;

use annals::{NewEvent, Options, Store};

fn annals() -> Command {
    Command::new(env!("CARGO_BIN_EXE_annals"))
}

/// Runs a command, requires success (showing its stderr otherwise), and returns its stdout.
fn stdout_of(command: &mut Command) -> Vec<u8> {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Runs `annals COMMAND DIR --json` and parses its output.
fn json_of(command: &str, dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&stdout_of(annals().arg(command).arg(dir).arg("--json"))).unwrap()
}

fn small_store(dir: &std::path::Path, events: u64) {
    let options = Options {
        segment_bytes: 1 << 20,
        limits: annals::Limits {
            append_bytes_max: 64 << 10,
            ..Default::default()
        },
        ..Options::default()
    };
    let store = Store::open(dir, options).unwrap();
    for i in 0..events {
        let event = NewEvent::new("Deposited", vec![b'x'; 200]).tag(format!("account:{}", i % 7));
        store.append(&[event], None).unwrap();
    }
    store.close().unwrap();
}

/// Goal: `verify` passes a whole store and its checkpoint, and fails (exit 1, naming the damage)
/// once a synced record in the middle of the log is damaged.
#[test]
fn verify_reports_clean_and_damaged_stores() {
    let dir = tempfile::tempdir().unwrap();
    small_store(dir.path(), 300);
    let report = json_of("verify", dir.path());
    assert_eq!(report["events"], 300);
    assert_eq!(report["checkpoint"], "matches");
    // Flip a byte inside the tenth record's data: every record after it proves it was synced.
    let segment = dir.path().join(annals::files::segment(1));
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = 64 + 10 * 320 + 100;
    bytes[at] ^= 0xFF;
    std::fs::write(&segment, &bytes).unwrap();
    let out = annals().arg("verify").arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("damaged log") && stderr.contains("0000000001.seg"),
        "{stderr}"
    );
}

/// Goal: `stats --json` reports the head, where the index came from in words, and index
/// bytes per event, and no durability class (a closed store has none; the command's own open
/// is no store's class).
#[test]
fn stats_json() {
    let dir = tempfile::tempdir().unwrap();
    small_store(dir.path(), 50);
    let stats = json_of("stats", dir.path());
    assert_eq!(stats["head"], 50);
    assert!(stats["index_bytes_per_event"].as_f64().unwrap() > 0.0);
    assert!(stats["index_source"]
        .as_str()
        .unwrap()
        .starts_with("index from its checkpoint"));
    // The class is a running server's setting; a closed store's stats do not invent one.
    assert!(stats.get("durability").is_none(), "{stats}");
    let missing = annals()
        .arg("stats")
        .arg(dir.path().join("nothing"))
        .output()
        .unwrap();
    assert!(!missing.status.success());
}

/// Goal: `verify` and `stats` report the same index bytes per event for the same log.
/// Regression: `stats` divided the bytes its index held (read from the checkpoint, its
/// vectors sized exactly) and `verify` those of the index it rebuilt (its vectors grown by
/// doubling), so the two disagreed on every store. Method: a store compared with its
/// checkpoint, then again with the checkpoint removed (stats then rebuilds its index too).
#[test]
fn verify_and_stats_agree_on_index_bytes_per_event() {
    let dir = tempfile::tempdir().unwrap();
    small_store(dir.path(), 300);
    for checkpoint in [true, false] {
        if !checkpoint {
            std::fs::remove_file(dir.path().join(annals::files::CHECKPOINT)).unwrap();
        }
        let verified = json_of("verify", dir.path())["index_bytes_per_event"]
            .as_f64()
            .unwrap();
        let stats = json_of("stats", dir.path());
        assert!(verified > 0.0);
        assert_eq!(
            stats["index_bytes_per_event"].as_f64().unwrap(),
            verified,
            "checkpoint {checkpoint}: {stats}"
        );
    }
}

/// Goal: `ANNALS_LOG` names the server log's level; a value it does not know is refused at start.
#[test]
fn the_log_level_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = annals()
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "off",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("ANNALS_LOG", "loud")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ANNALS_LOG=\"loud\""), "{stderr}");
}
