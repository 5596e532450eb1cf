//! One stats shape: the store's statistics as JSON, as `GET /v1/admin/stats` answers them for
//! a running server and `annals stats --store` prints them for a closed store. `annals stats
//! --url` prints the server's answer; nothing reads them back out of the Prometheus text.

use crate::answers::StoreStats;
use annals::{IndexSource, Store};

/// The store's statistics with how its opening had its index.
pub fn store_stats(store: &Store) -> StoreStats {
    let report = store.open_report();
    StoreStats {
        stats: store.stats(),
        open_ms: report.open_ms,
        index_source: index_source(&report.index),
    }
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
