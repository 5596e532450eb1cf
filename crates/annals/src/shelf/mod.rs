//! Where a store keeps decisions' snapshots: saved states ([`SavedState`]) by their key, one per
//! key, beside the log (in the data directory on files, in a table on PostgreSQL). A shelf
//! holds what it is given; whether a snapshot fits the log is checked above the store, when it
//! is loaded (`snapshot.rs`), and nothing on a shelf is the truth: a snapshot lost costs a
//! longer read, never an answer.
//!
//! Two things a shelf must do beyond keeping bytes: never hand back a torn snapshot (a crash
//! while saving leaves the previous one or the new one), and forget, bytes and all, every
//! snapshot that folded the events of a data subject erased after it ([`Shelf::purge`]), so
//! that crypto-shredding holds for snapshots too.

pub(crate) mod files;

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::saved::{SavedState, StateKey};

/// What is known of one snapshot without reading its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its key (the model's name, version and query).
    pub key: StateKey,
    /// The model's name.
    pub name: String,
    /// The model's version.
    pub version: u32,
    /// The last position its state folded.
    pub position: u64,
    /// When it was saved, in microseconds since the Unix epoch.
    pub saved_at_us: u64,
    /// The size of its state, in bytes.
    pub bytes: u64,
}

/// Which snapshots a listing or a removal concerns: all of them, a model's, one version of a
/// model's, or one key's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotFilter {
    pub name: Option<String>,
    pub version: Option<u32>,
    pub key: Option<StateKey>,
}

impl SnapshotFilter {
    /// Every snapshot.
    pub fn all() -> SnapshotFilter {
        SnapshotFilter::default()
    }

    /// The snapshots of the model `name` (of every version).
    pub fn model(name: impl Into<String>) -> SnapshotFilter {
        SnapshotFilter {
            name: Some(name.into()),
            ..SnapshotFilter::default()
        }
    }

    /// Only those of `version`.
    pub fn version(mut self, version: u32) -> SnapshotFilter {
        self.version = Some(version);
        self
    }

    /// The snapshot of `key`.
    pub fn key(key: StateKey) -> SnapshotFilter {
        SnapshotFilter {
            key: Some(key),
            ..SnapshotFilter::default()
        }
    }

    /// Whether a snapshot of `name`, `version` and `key` is one of these.
    pub fn matches(&self, name: &str, version: u32, key: &StateKey) -> bool {
        self.name.as_deref().is_none_or(|n| n == name)
            && self.version.is_none_or(|v| v == version)
            && self.key.as_ref().is_none_or(|k| k == key)
    }
}

/// What became of a snapshot handed to [`Shelf::put`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shelved {
    /// It is the key's snapshot now.
    Saved,
    /// The shelf holds one of the key further on; it was not kept.
    Behind { kept: u64 },
    /// The check it was put under refused it (it folded a subject erased since).
    Refused,
    /// The keys' table says a subject it folded is erased (on a database: by another server,
    /// since this one took the log in).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Erased { subject: String },
}

/// A shelf's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShelfStats {
    /// Snapshots kept.
    pub count: u64,
    /// Their envelopes' bytes.
    pub bytes: u64,
    /// The bytes the shelf takes where it lives (on files: its file, with what a compaction
    /// has yet to drop).
    pub stored_bytes: u64,
}

/// Where a store keeps its snapshots (see the module documentation).
pub(crate) trait Shelf: Send + Sync {
    /// Keeps `saved` as its key's snapshot, unless one further on is kept, after `admit` (run
    /// while no purge can run) says it may be kept: `false` drops it, an error fails the put.
    /// Once this returns, a crash keeps it or the snapshot it replaced.
    fn put(
        &self,
        saved: &SavedState,
        admit: &(dyn Fn() -> io::Result<bool> + Sync),
    ) -> io::Result<Shelved>;
    /// The envelope of `key`'s snapshot, or `None`.
    fn get(&self, key: &StateKey) -> io::Result<Option<Vec<u8>>>;
    /// The snapshots `filter` names, by name, version and key.
    fn list(&self, filter: &SnapshotFilter) -> io::Result<Vec<SnapshotInfo>>;
    /// Removes the snapshots `filter` names, durably; answers how many.
    fn remove(&self, filter: &SnapshotFilter) -> io::Result<u64>;
    /// Forgets, durably and bytes and all, every snapshot that folded an event of a subject of
    /// `erased` through a position before the subject's erasure (its receipt's position);
    /// answers how many.
    fn purge(&self, erased: &HashMap<String, u64>) -> io::Result<u64>;
    /// How many snapshots, and their bytes.
    fn stats(&self) -> io::Result<ShelfStats>;
    /// The versions of the model `name`, other than `version`, that have a snapshot under
    /// the key `key_of` gives for them (the same query).
    fn other_versions(
        &self,
        name: &str,
        version: u32,
        key_of: &dyn Fn(u32) -> StateKey,
    ) -> io::Result<Vec<u32>>;
    /// Where the shelf lives, for messages.
    fn locate(&self) -> PathBuf;
}

/// Whether `saved` folded an event of a subject `erased` names, before its erasure.
pub(crate) fn saw_erased(saved: &SavedState, erased: &HashMap<String, u64>) -> bool {
    saved.subjects.iter().any(|s| {
        erased
            .get(s)
            .is_some_and(|&receipt| saved.position < receipt)
    })
}

/// A store's shelf, with what its snapshots' loads and saves share: how far erasures' receipts
/// were purged from it, and the counts.
pub(crate) struct Keeper {
    pub(crate) shelf: Box<dyn Shelf>,
    /// The head through which erasures' receipts were taken in (see `snapshot.rs`).
    pub(crate) purged_through: Mutex<u64>,
    pub(crate) counts: Counts,
}

impl Keeper {
    pub(crate) fn new(shelf: Box<dyn Shelf>) -> Keeper {
        Keeper {
            shelf,
            purged_through: Mutex::new(0),
            counts: Counts::default(),
        }
    }
}

/// Loads, saves and purges since the store opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Loads that found a snapshot that fits.
    pub hits: u64,
    /// Loads that found none.
    pub misses: u64,
    /// Loads that found only other versions' (stale).
    pub stale: u64,
    /// Loads that found one that does not fit the log.
    pub unfit: u64,
    /// Snapshots saved.
    pub saved: u64,
    /// Saves not kept: one further on was.
    pub behind: u64,
    /// Saves refused: they folded a subject erased since.
    pub refused: u64,
    /// Snapshots removed because they folded a subject erased since.
    pub purged: u64,
}

/// [`SnapshotCounts`] as they are counted.
#[derive(Default)]
pub(crate) struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
    stale: AtomicU64,
    unfit: AtomicU64,
    saved: AtomicU64,
    behind: AtomicU64,
    refused: AtomicU64,
    purged: AtomicU64,
}

impl Counts {
    /// Counts a load by its outcome (`hit`, `miss`, `stale`, `unfit`).
    pub(crate) fn looked_up(&self, outcome: &str) {
        let counter = match outcome {
            "hit" => &self.hits,
            "miss" => &self.misses,
            "stale" => &self.stale,
            _ => &self.unfit,
        };
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn put(&self, put: &Shelved) {
        let counter = match put {
            Shelved::Saved => &self.saved,
            Shelved::Behind { .. } => &self.behind,
            Shelved::Refused | Shelved::Erased { .. } => &self.refused,
        };
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn purged(&self, n: u64) {
        self.purged.fetch_add(n, Relaxed);
    }

    pub(crate) fn now(&self) -> SnapshotCounts {
        SnapshotCounts {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            stale: self.stale.load(Relaxed),
            unfit: self.unfit.load(Relaxed),
            saved: self.saved.load(Relaxed),
            behind: self.behind.load(Relaxed),
            refused: self.refused.load(Relaxed),
            purged: self.purged.load(Relaxed),
        }
    }
}
