//! Testing the testers: each deliberately broken store (compiled in by the test-only feature
//! `canaries`, selected at run time) must be caught by the harness meant to catch it. One test
//! runs them in turn, because the selection holds for the whole process.
mod common;

use annals::canary::{select, Canary};
use common::harness::*;

/// Goal: every test harness notices the breakage it is meant to catch, so that its passing on the
/// real store means something. Method: each deliberately broken store is selected in turn and its
/// harness must report it.
#[test]
fn every_harness_catches_its_canary() {
    for (canary, caught) in [
        (
            Canary::AckBeforeFsync,
            ack_before_fsync as fn() -> Option<String>,
        ),
        (Canary::SkipCrc, skipped_crc),
        (Canary::ConditionOutsideWriter, condition_outside_writer),
    ] {
        // The same harnesses pass on the unbroken store in crash.rs, robustness.rs and
        // concurrency.rs, so what they catch here is the breakage.
        select(Some(canary));
        let caught = caught();
        select(None);
        println!("{canary:?} caught: {caught:?}");
        assert!(caught.is_some(), "the harness did not notice {canary:?}");
    }
}

/// Acknowledging before fsync, for the crash harness.
fn ack_before_fsync() -> Option<String> {
    (0..40).find_map(|seed| crash_rounds(seed, 6, &small_options()).err())
}

/// Skipping the CRC check, for the damage harness.
fn skipped_crc() -> Option<String> {
    damage_rounds(7, 600).err()
}

/// Checking conditions outside the writer, for the race harness.
fn condition_outside_writer() -> Option<String> {
    (0..5).find_map(|_| {
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
    })
}
