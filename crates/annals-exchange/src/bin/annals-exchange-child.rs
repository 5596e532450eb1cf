//! Helper for the exchange's kill -9 test: `annals-exchange-child <dir> <messages>`.
//!
//! Recovers the exchange from the journal in `<dir>` (newest fit snapshot, then replay), prints
//! `RECOVERED commands=<n> snapshot=<position or 0>`, then goes on through the deterministic
//! `normal` scenario (its symbols, warm-up and messages, seed 7) from command `n`, journaled in
//! the D3 pipelined mode. Each time a batch is acknowledged (durable) it prints
//! `ACK <commands durable>`; it snapshots every 20,000 commands; at the end it prints `DONE`.
//! The test kills it at random moments: every command acknowledged must survive.

use std::io::Write;
use std::sync::Arc;

use annals::{Options, Store};
use annals_exchange::{recover, scenario, Mode, Sequencer, SequencerOptions, Snapshots};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(&args[1]);
    let messages: usize = args[2].parse().expect("a message count");
    let scenario = scenario::generate("normal", messages, 7).expect("scenario");
    let commands: Vec<_> = scenario
        .warmup
        .iter()
        .chain(&scenario.messages)
        .copied()
        .collect();

    let store = Arc::new(Store::open(&dir, Options::default()).expect("open the store"));
    let snapshots = Snapshots::for_store(&store);
    let recovered = recover(&store, Some(&snapshots)).expect("recover");
    let done = recovered.commands as usize;
    println!(
        "RECOVERED commands={done} snapshot={}",
        recovered.snapshot_position.unwrap_or(0)
    );
    let fresh = recovered.engine.symbols() == 0;
    let options = SequencerOptions {
        batch_events: 256,
        ..SequencerOptions::default()
    };
    let mut sequencer =
        Sequencer::resume(recovered, store, Mode::Pipelined, options).expect("sequencer");
    if fresh {
        for &spec in &scenario.symbols {
            sequencer.add_symbol(spec).expect("add a symbol");
        }
    }
    let mut out = Vec::new();
    for (i, command) in commands.iter().enumerate().skip(done) {
        sequencer
            .execute(i as u64, command, &mut out)
            .expect("execute");
        out.clear();
        if sequencer.batch_full() || i + 1 == commands.len() {
            let durable = i + 1;
            sequencer.flush(move |outcome| {
                if outcome.is_ok() {
                    let mut stdout = std::io::stdout().lock();
                    let _ = writeln!(stdout, "ACK {durable}");
                    let _ = stdout.flush();
                }
            });
        }
        if (i + 1) % 20_000 == 0 {
            let snapshot = sequencer.snapshot().expect("snapshot");
            snapshots.save(&snapshot).expect("save the snapshot");
        }
    }
    sequencer.sync().expect("sync");
    println!("DONE");
}
