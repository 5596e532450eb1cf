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

/// Goal: with data subjects, the same, and every acknowledged event reads back whole: a new
/// key is durable with the first append sealed under it (it travels in the log until the key
/// file holds it). Every append names a new subject (`id-N`) besides one of six (`stream-N`).
#[test]
fn crashes_keep_every_acknowledged_append_of_data_subjects() {
    let mut options = small_options();
    options.subjects = Some(annals::SubjectOptions::new(
        ["stream-", "id-"],
        annals::MasterKey::generate().unwrap(),
    ));
    options.checkpoint_interval_events = 24;
    for seed in 200..230 {
        crash_rounds(seed, 6, &options).unwrap();
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

/// Goal: every answer an append gets around a failed write or fsync is true of what the store
/// holds once reopened: a position means there, `Poisoned` or a failed condition means not
/// there, `OutcomeUnknown` either. Story: appends whose records were in a failed write or sync
/// were answered `Poisoned` ("nothing more will be acknowledged"), and a reopen without a crash
/// found some of them stored. Method: 40 seeds, a fault at a random operation (EIO or ENOSPC,
/// once or persistent), every answer kept by id; half the seeds reopen as the process left the
/// disk, the others after a random crash.
#[test]
fn every_answer_is_true_after_a_fault() {
    use annals::sim::CrashMode;
    let mut unknown = 0;
    for seed in 0..40 {
        let crash =
            (seed % 2 == 1).then(|| CrashMode::ALL[(seed as usize / 2) % CrashMode::ALL.len()]);
        unknown += answers_round(seed, &small_options(), crash).unwrap();
    }
    assert!(unknown > 0, "the faults left appends of unknown outcome");
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

/// Offsets of the records in a segment file (their magic, at 8-byte alignment).
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    (0..bytes.len().saturating_sub(4))
        .step_by(8)
        .filter(|&i| &bytes[i..i + 4] == b"ANRC")
        .collect()
}

/// Goal: a crash that keeps a later write into a freshly rolled segment but loses its first
/// leaves an unsynced remainder, not damage: the store opens at the end of the segment before,
/// whole, and appends on. When a record there says the lost one had been synced, the lost one
/// was durable and opening refuses. Method: append until the third segment holds two records,
/// erase its first, reopen; in D1 nothing was synced when they were written, in D3 everything.
#[test]
fn a_lost_first_record_in_a_new_segment() {
    use annals::{NewEvent, Options, Store, StoreError};
    use std::path::Path;
    use std::sync::Arc;

    for (durability, damage) in [(Durability::Written, false), (Durability::Synced, true)] {
        let io = annals::sim::SimIo::new(5);
        let options = Options {
            durability,
            checkpoint_on_close: false,
            ..small_options()
        };
        let third = Path::new(DIR).join("0000000003.seg");
        let store =
            Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options.clone()).unwrap();
        let mut appended = 0u64;
        while io
            .read_file(&third)
            .is_none_or(|bytes| record_offsets(&bytes).len() < 2)
        {
            let event = NewEvent::new("E", vec![7u8; 200]).tag("t");
            appended = store.append(&[event], None).unwrap();
            assert!(appended < 1_000, "never reached the third segment");
        }
        drop(store);
        let mut bytes = io.read_file(&third).unwrap();
        let records = record_offsets(&bytes);
        bytes[records[0]..records[1]].fill(0);
        io.write_file(&third, &bytes);
        let reopened = Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), options.clone());
        if damage {
            match reopened {
                Err(annals::OpenError::Store(StoreError::Corrupt { reason, .. })) => {
                    assert!(reason.contains("was synced"), "{reason}")
                }
                Ok(_) => panic!("a durable record was lost, yet the store opened"),
                Err(e) => panic!("expected damage, got {e}"),
            }
            continue;
        }
        let store = reopened.unwrap();
        // The two records of the third segment are gone, nothing before them.
        assert_eq!(store.head(), appended - 2);
        assert!(store.open_report().torn_tail.is_some());
        let event = NewEvent::new("E", vec![7u8; 200]).tag("t");
        assert_eq!(store.append(&[event], None).unwrap(), appended - 1);
        drop(store);
        let store = Store::open_with_io(Arc::new(io), Path::new(DIR), options).unwrap();
        assert_eq!(store.head(), appended - 1);
    }
}
