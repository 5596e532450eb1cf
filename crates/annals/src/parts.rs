//! What a backend's open hands the store: the log behind the seam as one object, the threads
//! and services it runs as one list stopped in order, where companions keep their files, the
//! copy of the log it keeps (a database's mirror, a replica's copy) and what the open found.
//! `Store` holds these parts and nothing backend-specific, so a further backend, or an engine
//! that opens many stores and shares their threads, is a new way of making parts.

use std::path::PathBuf;
use std::sync::Arc;

use crate::companions::Companions;
use crate::error::StoreError;
use crate::kept::{AppendStamp, Closed, KeptMirror};
use crate::log::Log;
use crate::request::Reply;
use crate::shared::Shared;
use crate::stats::{OpenReport, Stats};

/// A thread or set of threads a store runs beside its log: the file engine's writer, syncer
/// and notifier, the scrub, the continuous backup.
pub(crate) trait Service: Send + Sync {
    /// Stops it, once, after the log has stopped taking appends and every service before it
    /// in the store's list has stopped.
    fn stop(&mut self);

    /// Tells its part of the store's stats (`synced`: the log is durable through there).
    fn report(&self, _stats: &mut Stats, _synced: u64) {}

    /// What appends and erasures wait on to be shipped, when this is the backup.
    fn shipping(&self) -> Option<Arc<dyn Shipping>> {
        None
    }
}

/// A store's services, stopped in the order they were added.
#[derive(Default)]
pub(crate) struct Services(Vec<Box<dyn Service>>);

impl Services {
    pub(crate) fn push(&mut self, service: impl Service + 'static) {
        self.0.push(Box::new(service));
    }

    /// Stops every service, first added first; none is stopped twice.
    pub(crate) fn stop(&mut self) {
        for mut service in self.0.drain(..) {
            service.stop();
        }
    }

    pub(crate) fn report(&self, stats: &mut Stats, synced: u64) {
        for service in &self.0 {
            service.report(stats, synced);
        }
    }
}

/// The continuous backup as appends and erasures wait on it: a D4 append is answered once
/// its position is in object storage, an erasure once the backup's key file no longer holds
/// the key.
pub(crate) trait Shipping: Send + Sync {
    /// Answers `reply` with `position` once object storage holds it (or with why not);
    /// `trace`: the append's span, which the put that ships it links to.
    fn when_shipped(&self, position: u64, reply: Reply, trace: tracing::Span);

    /// Another server of the same database ships; this one stands by.
    fn standing_by(&self) -> bool;

    /// The newest key file shipped: its generation (a database's keys table, `table`) or
    /// its epoch (a key file beside segment files).
    fn keys_shipped(&self, table: bool) -> u64;

    /// Wakes the shipper to look for work now.
    fn nudge(&self);
}

/// Where a copy of the log lives, when the log lives elsewhere (a database, a backup).
// Only a build with a backend other than files makes a copy.
#[cfg_attr(
    not(any(feature = "postgres", feature = "object-store")),
    allow(dead_code)
)]
pub(crate) enum CopyDir {
    /// The log is the store's own: there is no copy.
    Own,
    /// A private temporary directory, removed at close (or when the open fails).
    Temporary(TemporaryDir),
    /// A directory kept across clean closes (a `Location`'s `mirror` or `copy`); `error`
    /// makes the error of the copy's source.
    Kept {
        kept: KeptMirror,
        error: fn(String) -> StoreError,
    },
}

impl CopyDir {
    /// Closes the copy, once the store has stopped (`stopped`: how): a temporary one is
    /// removed; a kept one, when the store stopped cleanly, is synced and recorded as closed
    /// with `last`, its last append as its source stored it.
    pub(crate) fn close(
        self,
        shared: &Shared,
        last: Option<AppendStamp>,
        stopped: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        match (self, last) {
            (CopyDir::Own, _) => stopped,
            (CopyDir::Temporary(dir), _) => {
                drop(dir);
                stopped
            }
            (CopyDir::Kept { kept, error }, Some(last)) if stopped.is_ok() => {
                close_kept(shared, &kept, last, error)
            }
            (CopyDir::Kept { .. }, _) => stopped,
        }
    }
}

/// A directory of this process's own, removed when dropped.
pub(crate) struct TemporaryDir(pub(crate) PathBuf);

impl Drop for TemporaryDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Syncs a kept copy, then records its clean close (see `crate::kept`); the index checkpoint
/// is written and synced already.
fn close_kept(
    shared: &Shared,
    kept: &KeptMirror,
    last: AppendStamp,
    error: fn(String) -> StoreError,
) -> Result<(), StoreError> {
    let head = shared.head();
    debug_assert_eq!(last.last, head, "a kept mirror ends with its last append");
    if last.last != head {
        // Not recorded as closed: the next open fills it again.
        return Err(error(format!(
            "the mirror ends at position {head}, its last append at {}",
            last.last
        )));
    }
    for segment in shared.segments.read().iter() {
        segment
            .file
            .sync_data()
            .map_err(|e| StoreError::io("sync mirror segment", &segment.path, 0, e))?;
    }
    kept.close(Closed { head, last })
}

/// An open store's parts, as its backend's open made them.
pub(crate) struct Parts {
    pub(crate) shared: Arc<Shared>,
    pub(crate) log: Box<dyn Log>,
    /// Stopped in order at close, after the log.
    pub(crate) services: Services,
    pub(crate) companions: Arc<dyn Companions>,
    /// Where decisions' snapshots are kept.
    pub(crate) shelf: Box<dyn crate::shelf::Shelf>,
    pub(crate) copy: CopyDir,
    pub(crate) report: OpenReport,
}
