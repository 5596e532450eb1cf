//! The exchange journal's decoder on arbitrary bytes: every event type the journal writes,
//! with any data, decodes to an entry or an error, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&choice, data)) = input.split_first() else {
        return;
    };
    let types = annals_exchange::codec::RESERVED_TYPES;
    let event_type = types.get(choice as usize % (types.len() + 1)).unwrap_or(&"Other");
    let _ = annals_exchange::codec::decode(event_type, data);
});
