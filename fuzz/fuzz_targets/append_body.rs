//! The HTTP API's request bodies and parameters on arbitrary bytes: an append body, a query
//! and a metadata value parse to a request or an error, never a panic, and what parses can be
//! turned into events.

#![no_main]

use annals_server::wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let body = bytes::Bytes::copy_from_slice(input);
    if let Ok(parsed) = serde_json::from_slice::<wire::AppendBody>(&body) {
        for event in parsed.events {
            if let Some(metadata) = event.metadata {
                let _ = wire::json_depth(metadata.get().as_bytes());
            }
            let _ = event.into_new_event(&body);
        }
    }
    if let Ok(text) = std::str::from_utf8(input) {
        let _ = wire::parse_query(Some(text));
    }
    let _ = wire::json_depth(input);
});
