//! The bodies of the fuzz targets, one function per target, each taking the fuzzer's bytes:
//! every decoder of bytes from disk or network answers a value or an error, never a panic.
//!
//! Two callers: fuzz/ (cargo-fuzz, nightly, sanitizers; `scripts/fuzz`, on demand) explores new
//! inputs, and this crate's tests replay every input kept in fuzz/corpus/ on the stable
//! toolchain, in the test command, so that an input that once found a bug stays a test.

use std::path::Path;
use std::sync::Arc;

use annals::sim::SimIo;
use annals::{NewEvent, Options, Query, ReadOptions, Store};
use annals_exchange::Engine;
use annals_server::wire;

/// A target's body: the fuzzer's bytes in, a panic if a decoder misbehaves.
pub type Target = fn(&[u8]);

/// The targets by the names of their corpus directories.
pub const TARGETS: [(&str, Target); 5] = [
    ("store_open", store_open),
    ("exchange_codec", exchange_codec),
    ("append_body", append_body),
    ("engine_snapshot", engine_snapshot),
    ("readmodel_checkpoint", readmodel_checkpoint),
];

/// Opening a store whose files hold arbitrary bytes: the record and segment-header decoders,
/// recovery and the index checkpoint's decoder must answer with the store or an error, never
/// panic, and a store that opens must read back whole. Method: a valid store of a few events in
/// the simulated disk, then the input written over its segment or its checkpoint (where the
/// first bytes of the input say), then open, read everything, verify.
pub fn store_open(input: &[u8]) {
    let Some((&choice, rest)) = input.split_first() else {
        return;
    };
    let Some((offset_bytes, data)) = rest.split_at_checked(2) else {
        return;
    };
    let offset = u16::from_le_bytes([offset_bytes[0], offset_bytes[1]]) as usize;
    let io = SimIo::new(1);
    let dir = Path::new("/fuzz");
    let options = || {
        let mut options = Options {
            segment_bytes: 64 << 10,
            ..Options::default()
        };
        options.limits.append_bytes_max = 16 << 10;
        options.limits.event_bytes_max = 8 << 10;
        options
    };
    {
        let store = Store::open_with_io(Arc::new(io.clone()), dir, options()).unwrap();
        for i in 0..4u8 {
            let event = NewEvent::new("E", vec![i; 40])
                .tag("t:1")
                .metadata("{\"k\":1}");
            store.append(&[event], None).unwrap();
        }
        store.close().unwrap();
    }
    let file = if choice % 2 == 0 {
        dir.join(annals::files::segment(1))
    } else {
        dir.join(annals::files::CHECKPOINT)
    };
    let mut bytes = io.read_file(&file).unwrap_or_default();
    let end = offset.saturating_add(data.len());
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[offset..end].copy_from_slice(data);
    io.write_file(&file, &bytes);
    if let Ok(store) = Store::open_with_io(Arc::new(io.clone()), dir, options()) {
        let head = store.head();
        let read = store.read(&Query::all(), ReadOptions::forwards());
        if let Ok(events) = read {
            let mut n = 0;
            for event in events {
                match event {
                    Ok(e) => {
                        n += 1;
                        assert_eq!(e.position(), n, "positions gapless after recovery");
                    }
                    Err(_) => break,
                }
            }
            assert!(n <= head);
        }
        let _ = store.check(&mut |_, _| {});
    }
}

/// The exchange journal's decoder: every event type the journal writes, with any data,
/// decodes to an entry or an error. The first byte chooses the type.
pub fn exchange_codec(input: &[u8]) {
    let Some((&choice, data)) = input.split_first() else {
        return;
    };
    let types = annals_exchange::codec::RESERVED_TYPES;
    let event_type = types
        .get(choice as usize % (types.len() + 1))
        .unwrap_or(&"Other");
    let _ = annals_exchange::codec::decode(event_type, data);
}

/// The HTTP API's request bodies and parameters: an append body, a query and a metadata value
/// parse to a request or an error, and what parses can be turned into events.
pub fn append_body(input: &[u8]) {
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
}

/// The matching engine's snapshot decoder (a snapshot file's engine part, behind its CRC): an
/// engine it accepts is consistent enough to be snapshotted again, restored again, and give
/// the same bytes.
pub fn engine_snapshot(input: &[u8]) {
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
}

/// A read model's checkpoint file holding arbitrary bytes, read as a tool reads it
/// (`annals::readmodel::list_checkpoints`). The first byte chooses whether the rest is written
/// as it is (the CRC then almost always fails) or followed by its own CRC32C, so that the
/// decoder behind the CRC check is reached.
pub fn readmodel_checkpoint(input: &[u8]) {
    let Some((&choice, body)) = input.split_first() else {
        return;
    };
    let mut file = body.to_vec();
    if choice % 2 == 0 {
        file.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let models = dir.path().join(annals::readmodel::CHECKPOINT_DIR);
    std::fs::create_dir_all(&models).expect("the checkpoint directory");
    std::fs::write(models.join("fuzzed.model"), &file).expect("the checkpoint file");
    let _ = annals::readmodel::list_checkpoints(dir.path());
}

#[cfg(test)]
mod tests {
    use super::TARGETS;
    use std::path::PathBuf;

    fn corpus(target: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/corpus")
            .join(target)
    }

    /// Goal: every input kept in the corpora, replayed, runs without a panic. A target whose corpus
    /// is missing or empty fails, so that the replay cannot pass by reading nothing.
    #[test]
    fn every_corpus_input_replays_without_a_panic() {
        for (target, run) in TARGETS {
            let mut inputs: Vec<PathBuf> = std::fs::read_dir(corpus(target))
                .unwrap_or_else(|e| panic!("the corpus of {target}: {e}"))
                .map(|entry| entry.unwrap().path())
                .collect();
            inputs.sort();
            assert!(!inputs.is_empty(), "the corpus of {target} is empty");
            for input in &inputs {
                let bytes = std::fs::read(input).unwrap();
                let outcome = std::panic::catch_unwind(|| run(&bytes));
                assert!(outcome.is_ok(), "{target} panicked on {}", input.display());
            }
            println!("{target}: {} inputs", inputs.len());
        }
    }
}
