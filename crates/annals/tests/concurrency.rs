//! Concurrency: racing conditional appends.
mod common;

use annals::{Options, Store};

/// Goal: at most one thread wins each username and no optimistic append is accepted on a stale
/// read. Method: 16 threads, 60 attempts each, over 24 names and one counter, on a real disk.
#[test]
fn racing_claims_and_counter() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        Options {
            segment_bytes: 1 << 20,
            limits: annals::Limits {
                append_bytes_max: 64 << 10,
                ..Default::default()
            },
            ..Options::default()
        },
    )
    .unwrap();
    common::harness::claim_race(&store, 16, 60).unwrap();
}
