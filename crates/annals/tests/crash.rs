//! Crash and fault tests on the simulated disk: every crash mode, injected EIO and ENOSPC.
mod common;

use annals::Durability;
use common::harness::*;

/// Goal: after any crash, acknowledged appends survive whole, once, gapless, and the indexes
/// agree with a full scan. Method: 40 seeds of 6 rounds of concurrent appends then a random crash.
#[test]
fn crashes_keep_every_acknowledged_append() {
    for seed in 0..40 {
        crash_rounds(seed, 6, &small_options()).unwrap();
    }
}

/// Goal: the same properties when the checkpoint is in play (written at close, then crashes).
#[test]
fn crashes_with_default_sized_groups() {
    let mut options = small_options();
    options.group_bytes_max = 64 << 10;
    options.segment_bytes = 256 << 10;
    for seed in 100..110 {
        crash_rounds(seed, 4, &options).unwrap();
    }
}

/// Goal: a failed write or fsync poisons the store and loses no acknowledged append.
/// Method: 60 seeds, a fault at a random operation, EIO or ENOSPC, once or persistent.
#[test]
fn faults_poison_and_lose_nothing() {
    for seed in 0..60 {
        fault_round(seed, &small_options()).unwrap();
    }
}

/// Goal: in D2 the acknowledged-but-unsynced window is the only loss; D3 requests still wait.
#[test]
fn synced_later_requires_sync_for_d3_appends() {
    let mut options = small_options();
    options.durability = Durability::SyncedLater;
    for seed in 200..210 {
        fault_round(seed, &options).unwrap();
    }
}
