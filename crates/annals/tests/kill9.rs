//! A real-process kill -9 loop with emulated power loss.
mod common;

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use annals::{Options, Store};
use common::{check_recovered, tracked_events, Ledger, ModelEvent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Cuts every segment back to what the child last synced, as a power loss would, sometimes
/// leaving garbage after it.
fn power_loss(dir: &Path, rng: &mut StdRng) {
    let Ok(record) = std::fs::read_to_string(dir.join(annals::files::SYNCED_LENGTH)) else {
        return;
    };
    let mut parts = record.split_whitespace();
    let segment: u32 = parts.next().and_then(|s| s.parse().ok()).expect("segment");
    let offset: u64 = parts.next().and_then(|s| s.parse().ok()).expect("offset");
    for number in segment.. {
        let path = dir.join(annals::files::segment(number));
        let Ok(file) = OpenOptions::new().write(true).open(&path) else {
            break;
        };
        let keep = if number == segment { offset } else { 64 };
        file.set_len(keep).unwrap();
        if rng.gen_bool(0.3) {
            let garbage: Vec<u8> = (0..rng.gen_range(1..3000)).map(|_| rng.gen()).collect();
            file.write_all_at(&garbage, keep).unwrap();
        }
    }
}

/// Goal: after kill -9 at random moments (and emulated power loss, and a deleted or damaged
/// checkpoint), every acknowledged append is present once and whole, positions are gapless,
/// no condition is violated, and the indexes agree with a full scan. Method: 10 rounds on one
/// directory, the ledger built from the child's reports.
#[test]
fn kill9_loop() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(0x9);
    let mut ledger = Ledger::default();
    for round in 0..10 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_annals-crash-child"))
            .arg(dir.path())
            .arg("6")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        std::thread::sleep(Duration::from_millis(rng.gen_range(30..300)));
        child.kill().unwrap();
        child.wait().unwrap();
        let mut pending: HashMap<u64, ()> = HashMap::new();
        let mut acked = 0;
        for line in reader.join().unwrap() {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["P", id, count, tags] => {
                    let id: u64 = id.parse().unwrap();
                    let tags: Vec<String> = tags.split(',').map(str::to_owned).collect();
                    let events = tracked_events(id, count.parse().unwrap(), &tags);
                    ledger.appends.insert(
                        id,
                        (events.iter().map(ModelEvent::from_new).collect(), None),
                    );
                    pending.insert(id, ());
                }
                ["A", id, position] => {
                    let id: u64 = id.parse().unwrap();
                    ledger
                        .appends
                        .get_mut(&id)
                        .expect("ack of an unknown append")
                        .1 = Some(position.parse().unwrap());
                    acked += 1;
                }
                _ => {} // a line cut by the kill
            }
        }
        power_loss(dir.path(), &mut rng);
        let checkpoint = dir.path().join(annals::files::CHECKPOINT);
        match round % 3 {
            1 => {
                let _ = std::fs::remove_file(&checkpoint);
            }
            2 => {
                if let Ok(file) = OpenOptions::new().write(true).open(&checkpoint) {
                    let len = file.metadata().unwrap().len();
                    if len > 0 {
                        file.write_all_at(&[0xA5], rng.gen_range(0..len)).unwrap();
                        file.sync_all().unwrap();
                    }
                }
            }
            _ => {}
        }
        let options = Options {
            segment_bytes: 256 << 10,
            group_bytes_max: 64 << 10,
            limits: annals::Limits {
                append_bytes_max: 32 << 10,
                ..Default::default()
            },
            ..Options::default()
        };
        let store = Store::open(dir.path(), options)
            .unwrap_or_else(|e| panic!("round {round}: reopen failed: {e}"));
        check_recovered(&store, &ledger)
            .unwrap_or_else(|e| panic!("round {round} ({acked} acks): {e}"));
        store.close().unwrap();
        std::io::stdout().flush().unwrap();
    }
    assert!(
        ledger.appends.values().filter(|(_, a)| a.is_some()).count() > 100,
        "the loop acknowledged too little to mean anything"
    );
}
