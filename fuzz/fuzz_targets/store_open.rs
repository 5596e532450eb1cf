//! Opening a store whose files hold arbitrary bytes: the record and segment-header decoders,
//! recovery and the index checkpoint's decoder must answer with the store or an error, never
//! panic, and a store that opens must read back whole. Method: a valid store of a few events in
//! the simulated disk, then the input written over its segment or its checkpoint (where the
//! first bytes of the input say), then open, read everything, verify.

#![no_main]

use std::path::Path;
use std::sync::Arc;

use annals::sim::SimIo;
use annals::{NewEvent, Options, Query, ReadOptions, Store};
use libfuzzer_sys::fuzz_target;

const DIR: &str = "/fuzz";

fuzz_target!(|input: &[u8]| {
    let Some((&choice, rest)) = input.split_first() else {
        return;
    };
    let Some((offset_bytes, data)) = rest.split_at_checked(2) else {
        return;
    };
    let offset = u16::from_le_bytes([offset_bytes[0], offset_bytes[1]]) as usize;
    let io = SimIo::new(1);
    let dir = Path::new(DIR);
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
            let event = NewEvent::new("E", vec![i; 40]).tag("t:1").metadata("{\"k\":1}");
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
});
