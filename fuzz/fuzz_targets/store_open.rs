//! Opening a store whose files hold arbitrary bytes: the record and segment-header decoders,
//! recovery and the index checkpoint's decoder must answer with the store or an error, never
//! panic, and a store that opens must read back whole. Method: a valid store of a few events in
//! the simulated disk, then the input written over its segment or its checkpoint (where the
//! first bytes of the input say), then open, read everything, verify.
//! The body is annals_fuzz_targets::store_open, which the test command replays from this target's
//! corpus on the stable toolchain.

#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| annals_fuzz_targets::store_open(input));
