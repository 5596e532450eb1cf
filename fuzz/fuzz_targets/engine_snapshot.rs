//! The matching engine's snapshot decoder on arbitrary bytes (a snapshot file's engine part,
//! behind its CRC): it answers an engine or an error, never a panic, and an engine it accepts
//! is consistent enough to be snapshotted again, restored again, and give the same bytes.
//! The body is annals_fuzz_targets::engine_snapshot, which the test command replays from this target's
//! corpus on the stable toolchain.

#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| annals_fuzz_targets::engine_snapshot(input));
