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
