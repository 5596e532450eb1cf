//! Clients that keep every answer an append gets, by the append's own nonce, and the check
//! that each answer is true of the log read back afterwards: the database fault tests' load.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::append_body;

/// What the server answered one append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200: stored.
    Stored,
    /// 503 `database_unavailable`: nothing was appended.
    Unavailable,
    /// 503 `outcome_unknown`: stored or not.
    Unknown,
    /// Anything else (status and kind), which this load should never get.
    Other(u16, String),
}

/// Sends appends on keep-alive connections until `stop`, each a `Noted` event whose data is a
/// nonce of its own (`c{id}-n{n}`); every other append carries a condition that only the
/// append itself could fail (no event with its nonce's tag). Returns every answer by nonce.
/// A connection the server closes is opened again.
pub fn appender(addr: SocketAddr, id: usize, stop: Arc<AtomicBool>) -> Vec<(String, Answer)> {
    let mut answers = Vec::new();
    let mut n = 0u64;
    'connections: while !stop.load(Ordering::Relaxed) {
        let Ok(stream) = TcpStream::connect(addr) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        while !stop.load(Ordering::Relaxed) {
            let nonce = format!("c{id}-n{n}");
            n += 1;
            let tag = format!("nonce:{nonce}");
            let condition =
                format!(r#"{{"failIfEventsMatch":{{"items":[{{"tags":["{tag}"]}}]}}}}"#);
            let body = append_body(
                &[("Noted", &[&tag], &nonce)],
                n.is_multiple_of(2).then_some(condition.as_str()),
            );
            // One write: a second small one would wait for the first's delayed ACK.
            let request = format!(
                "POST /v1/append HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if writer.write_all(request.as_bytes()).is_err() {
                continue 'connections;
            }
            let response = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                super::read_response(&mut reader)
            }));
            let Ok(response) = response else {
                // No answer at all: the append's fate is not the server's word.
                answers.push((nonce, Answer::Unknown));
                continue 'connections;
            };
            let answer = match (response.status, response.kind().as_str()) {
                (200, _) => {
                    let json = response.json();
                    assert_eq!(
                        json["appendConditionFailed"], false,
                        "only the append itself could fail its condition: {json}"
                    );
                    Answer::Stored
                }
                (503, "database_unavailable") => Answer::Unavailable,
                (503, "outcome_unknown") => Answer::Unknown,
                (status, kind) => Answer::Other(status, kind.to_string()),
            };
            answers.push((nonce, answer));
        }
    }
    answers
}

/// How many answers of each kind.
#[derive(Debug, Default)]
pub struct Tally {
    pub stored: usize,
    pub unavailable: usize,
    pub unknown: usize,
    pub unknown_present: usize,
}

/// Checks every answer against a whole log read over HTTP: positions gapless from 1, no nonce
/// stored twice, every stored append present once, every `database_unavailable` append
/// absent, and only the nonces asked for. Panics naming the first answer that is not true.
pub fn check_answers(events: &[serde_json::Value], answers: &[(String, Answer)]) -> Tally {
    let mut in_log: HashMap<String, usize> = HashMap::new();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["position"], i as u64 + 1, "positions are gapless");
        let nonce = event["data"].as_str().unwrap().to_string();
        *in_log.entry(nonce).or_default() += 1;
    }
    let asked: HashMap<&str, &Answer> = answers.iter().map(|(n, a)| (n.as_str(), a)).collect();
    assert_eq!(asked.len(), answers.len(), "every nonce is asked once");
    for (nonce, count) in &in_log {
        assert_eq!(*count, 1, "{nonce} is stored {count} times");
        assert!(
            asked.contains_key(nonce.as_str()),
            "{nonce} is stored but was never asked for"
        );
    }
    let mut tally = Tally::default();
    for (nonce, answer) in answers {
        let present = in_log.contains_key(nonce);
        match answer {
            Answer::Stored => {
                assert!(present, "{nonce} was acknowledged but is not in the log");
                tally.stored += 1;
            }
            Answer::Unavailable => {
                assert!(
                    !present,
                    "{nonce} was answered database_unavailable (nothing was appended) but is \
                     in the log"
                );
                tally.unavailable += 1;
            }
            Answer::Unknown => {
                tally.unknown += 1;
                tally.unknown_present += usize::from(present);
            }
            Answer::Other(status, kind) => panic!("{nonce} was answered {status} {kind}"),
        }
    }
    tally
}
