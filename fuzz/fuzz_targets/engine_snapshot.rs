//! The matching engine's snapshot decoder on arbitrary bytes (a snapshot file's engine part,
//! behind its CRC): it answers an engine or an error, never a panic, and an engine it accepts
//! is consistent enough to be snapshotted again, restored again, and give the same bytes.

#![no_main]

use annals_exchange::Engine;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(engine) = Engine::from_snapshot(input) else {
        return;
    };
    let mut again = Vec::new();
    engine.snapshot(&mut again);
    let restored =
        Engine::from_snapshot(&again).expect("the snapshot of an accepted engine is accepted");
    let mut third = Vec::new();
    restored.snapshot(&mut third);
    assert_eq!(again, third, "one state, one snapshot");
});
