//! The HTTP API's request bodies and parameters on arbitrary bytes: an append body, a query
//! and a metadata value parse to a request or an error, never a panic, and what parses can be
//! turned into events.
//! The body is annals_fuzz_targets::append_body, which the test command replays from this target's
//! corpus on the stable toolchain.

#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| annals_fuzz_targets::append_body(input));
