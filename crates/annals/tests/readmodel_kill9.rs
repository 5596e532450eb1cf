//! A read model and a reactor killed mid-run (kill -9) and restarted.
mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use annals::{Options, Query, QueryItem, ReadOptions, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn child(dir: &std::path::Path, mode: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_annals-readmodel-child"))
        .arg(dir)
        .arg(mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Goal: a read model killed at random moments and restarted reaches the same state as a fold
/// that never stopped, and the reactor wrote each effect exactly once. Method: 8 rounds of
/// kill -9 while two threads append; each restart resumes from the checkpoint (most rounds
/// must, or the test proves nothing); then a settling run, compared with a fold from scratch
/// over the store and with a count of receipts per enrolment.
#[test]
fn read_model_survives_kill9() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(0x4ead);
    let mut resumed = 0;
    for _ in 0..8 {
        let mut run = child(dir.path(), "run");
        let stdout = run.stdout.take().unwrap();
        let first = std::thread::spawn(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).unwrap();
            line
        });
        std::thread::sleep(Duration::from_millis(rng.gen_range(150..400)));
        run.kill().unwrap();
        run.wait().unwrap();
        let line = first.join().unwrap();
        if !line.contains("resumed_from=0 ") {
            resumed += 1;
        }
    }
    assert!(
        resumed >= 5,
        "only {resumed} of 8 restarts resumed from a checkpoint"
    );

    let settle = child(dir.path(), "settle");
    let output = settle.wait_with_output().unwrap();
    assert!(output.status.success());
    let lines = String::from_utf8(output.stdout).unwrap();
    let field = |prefix: &str| {
        lines
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {lines}"))
            .to_owned()
    };
    let state: BTreeMap<String, u64> = serde_json::from_str(&field("STATE ")).unwrap();
    let status: serde_json::Value = serde_json::from_str(&field("STATUS ")).unwrap();
    let reactor: serde_json::Value = serde_json::from_str(&field("REACTOR ")).unwrap();
    assert_eq!(status["error"], serde_json::Value::Null, "{status}");
    assert_eq!(reactor["error"], serde_json::Value::Null, "{reactor}");

    let store = Store::open(dir.path(), Options::default()).unwrap();
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    let mut enrolments = Vec::new();
    for event in store
        .read(
            &Query::item(QueryItem::types(["StudentEnrolled"])),
            ReadOptions::forwards(),
        )
        .unwrap()
    {
        let event = event.unwrap();
        enrolments.push(event.position());
        for tag in event.tags() {
            if let Some(course) = tag.strip_prefix("course:") {
                *expected.entry(course.to_owned()).or_default() += 1;
            }
        }
    }
    assert!(
        enrolments.len() > 500,
        "too few enrolments ({}) to mean anything",
        enrolments.len()
    );
    assert_eq!(
        state, expected,
        "the restarted model differs from a fold from scratch"
    );

    let receipts = common::receipts_per_enrolment(&store);
    let missing: Vec<_> = enrolments
        .iter()
        .filter(|p| !receipts.contains_key(p))
        .collect();
    let repeated: Vec<_> = receipts.iter().filter(|(_, &n)| n != 1).collect();
    assert!(
        missing.is_empty(),
        "enrolments without a receipt: {missing:?}"
    );
    assert!(
        repeated.is_empty(),
        "receipts written more than once: {repeated:?}"
    );
    assert_eq!(receipts.len(), enrolments.len());
    assert_eq!(
        store.tracking("receipts"),
        Some(reactor["checkpointPosition"].as_u64().unwrap())
    );
}
