//! One stats shape: the store's statistics as JSON, as `GET /v1/admin/stats` answers them for
//! a running server and `annals stats --store` prints them for a closed store. `annals stats
//! --url` prints the server's answer; nothing reads them back out of the Prometheus text.

use annals::{IndexSource, Store};
use serde_json::Value;

/// The store's statistics (`annals::Stats`, serialized) with how its opening had its index.
pub fn store_json(store: &Store) -> Value {
    let report = store.open_report();
    // Stats holds numbers, text and maps keyed by text: it always serializes.
    let mut value = serde_json::to_value(store.stats()).expect("stats serialize to JSON");
    value["open_ms"] = report.open_ms.into();
    value["index_source"] = index_source(&report.index).into();
    value
}

/// How the opened store's index was had, in words.
pub fn index_source(index: &IndexSource) -> String {
    match index {
        IndexSource::Checkpoint { scanned_events } => {
            format!("index from its checkpoint, {scanned_events} events scanned after it")
        }
        IndexSource::Rebuilt { reason } => format!("index rebuilt from the log: {reason}"),
        IndexSource::New => "a new store: no log yet".to_string(),
    }
}
