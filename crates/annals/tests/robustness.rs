//! Decoder robustness: damaged segments never panic and never yield an event that was not
//! written.
mod common;

/// Goal: every truncation and many single-bit flips of a valid segment are handled safely.
#[test]
fn truncations_and_bit_flips() {
    common::harness::damage_rounds(7, 600).unwrap();
}
