//! Kill -9 of the server while 32 clients append with conditions: after a restart every
//! append that got a success answer is there exactly once, and the log violates no condition.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::claims::{check_claims, client};
use common::ServerProcess;
use rand::{Rng, SeedableRng};

const CLIENTS: usize = 32;

/// Goal: no acknowledged append is lost or doubled by a kill -9, and no condition is violated
/// across restarts. Method: three rounds of 32 clients claiming keys from a small key space
/// (so claims conflict), the server killed at a random moment each round; after each restart
/// every key is claimed at most once, and every acknowledged claim is stored exactly once.
#[test]
fn kill9_under_conditional_load_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut all_acked: Vec<(u64, String)> = Vec::new();
    for round in 0..3 {
        let mut server = ServerProcess::start(dir.path(), &[]);
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|id| {
                let stop = stop.clone();
                let addr = server.http;
                std::thread::spawn(move || client(addr, id, round, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.gen_range(150..600)));
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            all_acked.extend(c.join().unwrap());
        }
        // Restart and check.
        let server = ServerProcess::start(dir.path(), &[]);
        let events = server.read("{}", "{}");
        check_claims(&events, &all_acked);
        drop(server);
    }
    eprintln!(
        "{} acknowledged claims checked over 3 kills",
        all_acked.len()
    );
    assert!(
        all_acked.len() > 50,
        "the clients got too few answers ({}) for the test to mean much",
        all_acked.len()
    );
}

/// Goal: a kill -9 during snapshot saves under load leaves every snapshot served whole and
/// valid: after each restart, each model's read with a snapshot is a hit or a miss (never
/// unfit or damaged), and a hit's state is exactly the fold of its query's events through
/// its position. Method: eight clients, each appending to a counter of its own and saving a
/// snapshot of it (with a large state, so that writes are long) after every append; the
/// server killed at a random moment, four rounds.
#[test]
fn kill9_during_snapshot_saves_leaves_whole_snapshots() {
    use common::{encode, request};
    use serde_json::{json, Value};
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut hits = 0;
    let query =
        |c: usize| json!({"items": [{"types": ["Tick"], "tags": [format!("counter:{c}")]}]});
    for _round in 0..4 {
        let mut server = ServerProcess::start(dir.path(), &[]);
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..8)
            .map(|c| {
                let (stop, addr, query) = (stop.clone(), server.http, query(c));
                std::thread::spawn(move || {
                    // A request the kill cuts short ends the client (the kit's client panics).
                    let call = |method: &str, path: &str, body: Value| {
                        let body = match body {
                            Value::Null => String::new(),
                            body => body.to_string(),
                        };
                        let sent = std::panic::catch_unwind(|| {
                            request(addr, method, path, &[], body.as_bytes())
                        });
                        sent.ok().filter(|r| r.status == 200).map(|r| r.json())
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let append = json!({"events": [{"type": "Tick", "data": "",
                            "tags": [format!("counter:{c}")]}]});
                        let Some(appended) = call("POST", "/v1/append", append) else {
                            return;
                        };
                        let position = appended["position"].as_u64().unwrap();
                        // Only this client appends to its counter: the read's count is the
                        // count through the position. The padding makes a save long enough
                        // to be cut.
                        let path = format!("/v1/read?query={}", encode(&query.to_string()));
                        let Some(read) = call("GET", &path, Value::Null) else {
                            return;
                        };
                        let count = read.as_array().map_or(0, Vec::len);
                        let save = json!({"model": "ticks", "version": 1, "query": query,
                            "position": position,
                            "state": {"count": count, "padding": "x".repeat(200_000)}});
                        if call("POST", "/v1/snapshots", save).is_none() {
                            return;
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.gen_range(300..900)));
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().unwrap();
        }
        let server = ServerProcess::start(dir.path(), &[]);
        for c in 0..8 {
            let path = format!(
                "/v1/snapshots/read?model=ticks&version=1&query={}",
                encode(&query(c).to_string())
            );
            let answer: Value = server.get(&path).json();
            let snapshot = &answer["snapshot"];
            match snapshot["outcome"].as_str().unwrap() {
                "miss" => {}
                "hit" => {
                    hits += 1;
                    let position = snapshot["position"].as_u64().unwrap();
                    let events = server.read(&query(c).to_string(), "{}");
                    let through = events
                        .iter()
                        .filter(|e| e["position"].as_u64().unwrap() <= position)
                        .count() as u64;
                    assert_eq!(snapshot["state"]["count"], through, "counter {c}");
                    assert_eq!(
                        snapshot["state"]["padding"].as_str().unwrap().len(),
                        200_000
                    );
                }
                other => panic!("counter {c}: {other}: {answer}"),
            }
        }
        drop(server);
    }
    assert!(
        hits > 0,
        "no snapshot survived any kill: the saves were not exercised"
    );
}
