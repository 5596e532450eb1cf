//! Clients that claim keys with conditional appends over HTTP, and the check that the log
//! holds every acknowledged claim exactly once and no key twice: the kill -9 tests' load.

use std::collections::{HashMap, HashSet};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};

use super::append_body;

const KEYS: u64 = 400;

/// Sends appends on one keep-alive connection until the server goes away. Each append claims a
/// random key: a `Claimed` event tagged `key:K`, under the condition that no event with that tag
/// exists. Only answers with status 200 and `appendConditionFailed: false` count as acked;
/// returns those claims: (key, nonce).
pub fn client(
    addr: SocketAddr,
    id: usize,
    round: usize,
    stop: Arc<AtomicBool>,
) -> Vec<(u64, String)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64((round * 1000 + id) as u64);
    let mut claims: Vec<(u64, String)> = Vec::new();
    let Ok(stream) = TcpStream::connect(addr) else {
        return claims;
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
            super::read_response(&mut reader)
        }));
        let Ok(response) = response else { break };
        if response.status != 200 {
            continue;
        }
        let answer: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        if answer["appendConditionFailed"] == false {
            claims.push((key, nonce));
        }
    }
    claims
}

/// Checks a whole log read over HTTP: positions gapless from 1, every key claimed at most once
/// (no condition violated), every acknowledged claim stored exactly once.
pub fn check_claims(events: &[serde_json::Value], acked: &[(u64, String)]) {
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
    for (key, nonce) in acked {
        assert_eq!(
            nonces.get(nonce).copied().unwrap_or(0),
            1,
            "acknowledged claim {nonce} of key:{key} is not stored exactly once"
        );
    }
    let keys: HashSet<u64> = acked.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys.len(), acked.len(), "two acks for one key");
}
