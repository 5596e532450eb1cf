//! Test helper for the kill -9 loop (crates/annals/tests/kill9.rs): appends with conditions
//! from several threads and reports each append as pending ("P id count tags") before it is
//! submitted and as acknowledged ("A id position") after. The parent kills it at a random moment.
//!
//! Usage: annals-crash-child DIR THREADS

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use annals::{AppendCondition, Limits, NewEvent, Options, Query, QueryItem, ReadOptions, Store};

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: annals-crash-child DIR THREADS");
    let threads: u64 = args.next().and_then(|t| t.parse().ok()).unwrap_or(4);
    let options = Options {
        segment_bytes: 256 << 10,
        group_bytes_max: 64 << 10,
        limits: Limits {
            append_bytes_max: 32 << 10,
            ..Limits::default()
        },
        record_synced_length: true,
        ..Options::default()
    };
    let store = Arc::new(Store::open(&dir, options).expect("open"));
    let base = store.head() * 1000 + 1;
    {
        let store = store.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(40));
            let _ = store.checkpoint();
        });
    }
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let stream = format!("thread:{t}:{base}");
                let query = Query::item(QueryItem::tags([stream.clone()]));
                let mut last = store
                    .read(&query, ReadOptions::backwards().limit(1))
                    .expect("read")
                    .next()
                    .map_or(0, |e| e.expect("read").position());
                for k in 0u64.. {
                    let id = base + (t * 100_000_000) + k;
                    let count = 1 + (k % 3) as usize;
                    let tags = [stream.clone(), format!("k{}", id % 7)];
                    let events: Vec<NewEvent> = (0..count)
                        .map(|i| {
                            NewEvent::new(
                                if i % 2 == 0 { "Even" } else { "Odd" },
                                format!("{id}/{i}/{count}").into_bytes(),
                            )
                            .tags(tags.iter().cloned())
                        })
                        .collect();
                    println!("P {id} {count} {}", tags.join(","));
                    let condition = AppendCondition::new(query.clone(), Some(last));
                    match store.append(&events, Some(&condition)) {
                        Ok(position) => {
                            let mut out = std::io::stdout().lock();
                            let _ = writeln!(out, "A {id} {position}");
                            let _ = out.flush();
                            last = position;
                        }
                        Err(e) => panic!("append {id} failed: {e}"),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
}
