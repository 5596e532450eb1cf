//! Testing the testers: each deliberately broken store (a test-only feature) must be caught by
//! the harness meant to catch it. Run with `--features canary-...`; see scripts/test.
#![allow(unused_imports)]
mod common;

use common::harness::*;

/// Goal: acknowledging before fsync is caught by the crash harness.
#[cfg(feature = "canary-ack-before-fsync")]
#[test]
fn crash_harness_catches_ack_before_fsync() {
    let caught = (0..40).find_map(|seed| crash_rounds(seed, 6, &small_options()).err());
    println!("caught: {caught:?}");
    assert!(
        caught.is_some(),
        "the crash harness did not notice acknowledgements before fsync"
    );
}

/// Goal: skipping the CRC check is caught by the damage harness.
#[cfg(feature = "canary-skip-crc")]
#[test]
fn damage_harness_catches_skipped_crc() {
    let caught = damage_rounds(7, 600).err();
    println!("caught: {caught:?}");
    assert!(
        caught.is_some(),
        "the damage harness did not notice that CRCs are not checked"
    );
}

/// Goal: checking conditions outside the writer is caught by the race harness.
#[cfg(feature = "canary-condition-outside-writer")]
#[test]
fn race_harness_catches_condition_outside_writer() {
    let caught = (0..5).find_map(|_| {
        let dir = tempfile::tempdir().unwrap();
        let options = annals::Options {
            segment_bytes: 1 << 20,
            limits: annals::Limits {
                append_bytes_max: 64 << 10,
                ..Default::default()
            },
            ..annals::Options::default()
        };
        let store = annals::Store::open(dir.path(), options).unwrap();
        claim_race(&store, 16, 60).err()
    });
    println!("caught: {caught:?}");
    assert!(
        caught.is_some(),
        "the race harness did not notice conditions checked outside the writer"
    );
}
