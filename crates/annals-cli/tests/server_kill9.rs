//! Kill -9 of the server while 32 clients append with conditions: after a restart every
//! append that got a success answer is there exactly once, and the log violates no condition.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{append_body, ServerProcess};
use rand::{Rng, SeedableRng};

const CLIENTS: usize = 32;
const KEYS: u64 = 400;

/// What a client saw answered with success.
struct Acked {
    /// Claims: (key, nonce) acknowledged.
    claims: Vec<(u64, String)>,
}

/// Sends appends on one keep-alive connection until the server goes away. Each append claims a
/// random key: a `Claimed` event tagged `key:K`, under the condition that no event with that tag
/// exists. Only answers with status 200 and `appendConditionFailed: false` count as acked.
fn client(addr: SocketAddr, id: usize, round: usize, stop: Arc<AtomicBool>) -> Acked {
    let mut rng = rand::rngs::StdRng::seed_from_u64((round * 1000 + id) as u64);
    let mut acked = Acked { claims: Vec::new() };
    let Ok(stream) = TcpStream::connect(addr) else {
        return acked;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        // Each round claims from a fresh key space, so every round has claims that succeed.
        let key = round as u64 * KEYS + rng.gen_range(0..KEYS);
        let nonce = format!("r{round}-c{id}-n{n}");
        n += 1;
        let condition =
            format!(r#"{{"failIfEventsMatch":{{"items":[{{"tags":["key:{key}"]}}]}}}}"#);
        let body = append_body(
            &[(
                "Claimed",
                &[&format!("key:{key}"), &format!("client:{id}")],
                &nonce,
            )],
            Some(&condition),
        );
        let head = format!(
            "POST /v1/append HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if writer
            .write_all(head.as_bytes())
            .and_then(|_| writer.write_all(body.as_bytes()))
            .is_err()
        {
            break;
        }
        let response = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            common::read_response(&mut reader)
        }));
        let Ok(response) = response else { break };
        if response.status != 200 {
            continue;
        }
        let answer: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        if answer["appendConditionFailed"] == false {
            acked.claims.push((key, nonce));
        }
    }
    acked
}

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
            all_acked.extend(c.join().unwrap().claims);
        }
        // Restart and check.
        let server = ServerProcess::start(dir.path(), &[]);
        let events = server.read("{}", "{}");
        let mut by_key: HashMap<String, usize> = HashMap::new();
        let mut nonces: HashMap<String, usize> = HashMap::new();
        for (i, event) in events.iter().enumerate() {
            assert_eq!(event["position"], i as u64 + 1, "positions are gapless");
            let key = event["tags"][0].as_str().unwrap().to_string();
            *by_key.entry(key).or_default() += 1;
            *nonces
                .entry(event["data"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        for (key, count) in &by_key {
            assert_eq!(
                *count, 1,
                "{key} claimed {count} times: a condition was violated"
            );
        }
        for (key, nonce) in &all_acked {
            assert_eq!(
                nonces.get(nonce).copied().unwrap_or(0),
                1,
                "acknowledged claim {nonce} of key:{key} is not stored exactly once"
            );
        }
        let keys: HashSet<u64> = all_acked.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys.len(), all_acked.len(), "two acks for one key");
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
