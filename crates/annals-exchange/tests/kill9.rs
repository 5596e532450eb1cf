//! The exchange killed (kill -9) in the middle of a D3 pipelined run, again and again.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use annals::{Options, Store};
use annals_exchange::{recover, scenario, Engine, Snapshots};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MESSAGES: usize = 400_000;

/// Goal: every command acknowledged before a kill -9 is in the journal after it, and the books
/// recovered (snapshot plus replay) equal a replay of exactly what the journal holds. Method: 6
/// rounds of a child running `normal` in the D3 pipelined mode, printing `ACK n` as batches
/// become durable, killed at a random moment; each restart must recover at least the highest
/// acknowledged count; a final run completes; the journal must then hold the whole scenario
/// and recover to the reference engine's state.
#[test]
fn acknowledged_commands_survive_kill9() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(0xe5c4);
    let mut acked = 0usize;
    let mut from_snapshot = 0;
    for round in 0..6 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_annals-exchange-child"))
            .arg(dir.path())
            .arg(MESSAGES.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        let recovered: usize = first
            .strip_prefix("RECOVERED commands=")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
        assert!(
            recovered >= acked,
            "round {round}: {acked} commands were acknowledged, {recovered} recovered"
        );
        if !first.ends_with("snapshot=0") {
            from_snapshot += 1;
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..400)));
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        for line in rx.try_iter() {
            if let Some(n) = line.strip_prefix("ACK ") {
                acked = acked.max(n.parse().unwrap());
            }
        }
    }
    assert!(acked > 0, "no round acknowledged anything before its kill");
    assert!(from_snapshot > 0, "no restart started from a snapshot");

    let output = Command::new(env!("CARGO_BIN_EXE_annals-exchange-child"))
        .arg(dir.path())
        .arg(MESSAGES.to_string())
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.lines().any(|l| l == "DONE"), "{text}");

    let scenario = scenario::generate("normal", MESSAGES, 7).unwrap();
    let mut engine = Engine::new(&scenario.symbols);
    let mut out = Vec::new();
    for (i, command) in scenario.warmup.iter().chain(&scenario.messages).enumerate() {
        engine.apply(i as u64, command, &mut out);
        out.clear();
    }
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let full = recover(&store, None).unwrap();
    assert_eq!(full.commands as usize, scenario.warmup.len() + MESSAGES);
    assert_eq!(full.engine.state_hash(), engine.state_hash());
    let snapshotted = recover(&store, Some(&Snapshots::for_store(&store))).unwrap();
    assert!(snapshotted.snapshot_position.is_some());
    assert_eq!(snapshotted.engine.state_hash(), engine.state_hash());
}
