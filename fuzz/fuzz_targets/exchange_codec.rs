//! The exchange journal's decoder on arbitrary bytes: every event type the journal writes,
//! with any data, decodes to an entry or an error, never a panic.
//! The body is annals_fuzz_targets::exchange_codec, which the test command replays from this target's
//! corpus on the stable toolchain.

#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| annals_fuzz_targets::exchange_codec(input));
