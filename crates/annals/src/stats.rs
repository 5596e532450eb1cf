//! What a store tells about itself: what opening found ([`OpenReport`]), its counters
//! ([`Stats`], with [`DatabaseStats`] on PostgreSQL) and a live check ([`LiveCheck`]). Plain
//! data, below the store and its backends, which fill it in.

use std::path::PathBuf;

use crate::histogram::HistogramSnapshot;

/// How the index was obtained when the store was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexSource {
    /// Loaded from the checkpoint; `scanned_events` more were read from the log after it.
    Checkpoint { scanned_events: u64 },
    /// Rebuilt by scanning the whole log, because the checkpoint was missing, damaged or stale.
    Rebuilt { reason: String },
    /// A new store: the directory held no log, so there was no index to load.
    New,
}

/// What opening the store found.
#[derive(Debug, Clone)]
pub struct OpenReport {
    /// The index of the log on files, or of the mirror on PostgreSQL.
    pub index: IndexSource,
    /// A torn tail that was cut: the file, the offset, and why the bytes there were not a record.
    pub torn_tail: Option<(PathBuf, u64, String)>,
    /// The whole open, on PostgreSQL the reading of the database's log included.
    pub open_ms: f64,
    /// On PostgreSQL: where the mirror came from.
    pub mirror: Option<MirrorKind>,
}

/// Where a PostgreSQL store's mirror (its copy of the log), or a read replica's copy, came
/// from at open.
#[derive(Debug, Clone)]
pub struct MirrorKind {
    /// The directory it is kept in (a `Location`'s `mirror` or `copy`); None: a temporary one.
    pub kept: Option<PathBuf>,
    /// A kept mirror used as it was closed, up to this position.
    pub resumed_at: Option<u64>,
    /// Why a kept mirror was not used and was filled from the database (or the backup)
    /// instead.
    pub rebuilt: Option<String>,
    /// Appends read from the database (on a replica: objects read from the backup) at open.
    pub followed: u64,
}

/// A snapshot of the store's state and counters.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    pub head: u64,
    /// Which backend holds the log: "files" or "postgres".
    pub backend: &'static str,
    /// The database backend's counters (None on files).
    pub database: Option<DatabaseStats>,
    /// The class's label (d0 to d4), or "replica" on a read replica, which acknowledges no
    /// appends (see `durability_description`).
    pub durability: &'static str,
    pub durability_description: &'static str,
    pub segments: usize,
    pub segment_bytes: u64,
    pub types: usize,
    pub tags: usize,
    /// Bytes the in-memory index holds (its capacity).
    pub index_bytes: usize,
    /// Bytes per event of what the index holds, counted by length: the same figure for the
    /// same log however its index was built, and the one `annals verify` reports.
    pub index_bytes_per_event: f64,
    pub appends: u64,
    pub events_appended: u64,
    pub conditions_failed: u64,
    /// Conditional appends whose condition failed on exactly their own events (same ids):
    /// answered as retries of appends already stored.
    pub idempotent_retries: u64,
    /// Background index checkpoints that failed since open (a failure is not fatal: the log
    /// is the truth, and the next open scans further; repeated failures say the disk or the
    /// directory needs a look).
    pub checkpoints_failed: u64,
    pub groups: u64,
    /// Of `groups`, those a caller that found the store idle committed on its own thread.
    pub caller_commits: u64,
    /// Appends their callers staged into the next group themselves, on their own thread,
    /// while the writer thread synced the group before (checks, the record's copy and the
    /// index additions: no I/O and no waiting); the writer thread writes and syncs that group
    /// when its sync ends.
    pub caller_stages: u64,
    /// Appends committed since open, by the route they took into the log: `queued`, `held`,
    /// `staged` and `alone` on files, `database` and `database_alone` on PostgreSQL
    /// (docs/ARCHITECTURE.md, "The commit path").
    pub commits: std::collections::BTreeMap<String, u64>,
    pub fsyncs: u64,
    /// Bytes of records written to the log since open (headers, entries and padding).
    pub bytes_written: u64,
    /// Segments created since open, and the bytes of zeros written to preallocate those that
    /// were zero-filled (see [`crate::Preallocation`]): disk traffic beside `bytes_written`.
    pub segments_created: u64,
    pub zero_fill_bytes: u64,
    pub fsync_us_mean: f64,
    pub fsync_us_max: u64,
    /// fdatasync latency in microseconds.
    pub fsync_us: HistogramSnapshot,
    /// Appends committed per group (one write, and in D3 one fdatasync, per group).
    pub group_appends: HistogramSnapshot,
    pub queue_depth: usize,
    /// Callers blocked on or awaiting an append's outcome.
    pub waiting: usize,
    pub poisoned: Option<String>,
    /// Why this server of a database takes no appends: another seals for data subjects its
    /// own tag prefixes do not name (None otherwise). Reads go on.
    pub appends_refused: Option<String>,
    /// Why appends that need a new segment are refused, while the file system has no room
    /// for one (None otherwise). Reads go on; appends resume by themselves once there is room.
    pub disk_full: Option<String>,
    /// Appends refused for lack of room since open.
    pub disk_full_refusals: u64,
    /// Free bytes of the file system holding the log (None where not known, as on PostgreSQL
    /// or in memory).
    pub disk_free_bytes: Option<u64>,
    /// The continuous backup into object storage, when one runs.
    pub backup: Option<BackupStats>,
    /// The background scrub of sealed segments, when one runs.
    pub scrub: Option<ScrubStats>,
    /// A read replica's following of its backup.
    pub replica: Option<ReplicaStats>,
}

/// How far a read replica has followed its backup (see `Store::open_replica`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicaStats {
    pub url: String,
    /// The primary that writes the backup, from its lease.
    pub primary: String,
    /// "following" (the last poll of the backup succeeded) or "failing" (it failed: the
    /// backup is unreachable, gone, damaged or another store's; polled again with backoff,
    /// see `last_error`).
    pub state: &'static str,
    pub head: u64,
    /// The last position the backup was seen to hold.
    pub backup_head: u64,
    /// Positions the backup was seen to hold beyond the copy (`backup_head - head`). What
    /// the backup took in since it was last read is not known: while failing, watch
    /// `lag_seconds`.
    pub lag_positions: u64,
    /// How long since the copy last held everything the backup held: up to a poll's
    /// interval while the replica keeps up; it grows while it catches up and while it fails.
    pub lag_seconds: f64,
    /// When the last successful poll ended, in microseconds since the Unix epoch, and how
    /// long ago.
    pub last_poll_at_us: u64,
    pub last_poll_age_seconds: f64,
    pub objects_read: u64,
    pub failures: u64,
    pub last_error: Option<String>,
}

/// A read replica's class, as [`Stats::durability_description`] gives it.
pub(crate) const REPLICA_CLASS: &str = "read replica: acknowledges no appends (the primary \
    takes them); serves what the primary's backup holds, which is in object storage";

/// How long a replica may go without a successful poll of its backup before it counts as
/// not following it ([`Stats::unready_reasons`]): polls end every fraction of a second while
/// it follows, so a replica without one for this long is stuck (a request to object storage
/// that hangs is given up only after its timeout and the client's retries).
pub(crate) const REPLICA_POLL_AGE_MAX_SECONDS: f64 = 30.0;

impl Stats {
    /// Why the store cannot now keep what it promises, one reason per line, each beginning
    /// with a stable kind (`poisoned:`, `subjects_differ:`, `disk_full:`, `backup_failing:`,
    /// `replica_failing:`, `replica_stale:`); empty when it can. A server is ready when this is empty
    /// (docs/SERVER.md, "Liveness and readiness").
    ///
    /// A backup that fails under a class below D4 is no reason: appends keep their class
    /// and the backup catches up when object storage returns; only appends that ask for D4
    /// on their own wait for it, and they are answered one by one. Damage the scrub could
    /// not repair is none either: reads that cross it fail, everything else is served.
    pub fn unready_reasons(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        if let Some(why) = &self.poisoned {
            reasons.push(format!(
                "poisoned: appends are refused until the store is reopened: {why}"
            ));
        }
        if let Some(why) = &self.appends_refused {
            reasons.push(format!("subjects_differ: appends are refused: {why}"));
        }
        if let Some(why) = &self.disk_full {
            reasons.push(format!(
                "disk_full: appends that need a new segment are refused: {why}"
            ));
        }
        if let Some(backup) = self.backup.as_ref().filter(|_| self.durability == "d4") {
            if backup.state == "failing" || backup.state == "stopped" {
                reasons.push(format!(
                    "backup_failing: every append is D4, and the backup at {} is {}: {}",
                    backup.url,
                    backup.state,
                    backup.last_error.as_deref().unwrap_or("no reason given")
                ));
            }
        }
        if let Some(replica) = &self.replica {
            if replica.state == "failing" {
                reasons.push(format!(
                    "replica_failing: the backup at {} cannot be followed: {}",
                    replica.url,
                    replica.last_error.as_deref().unwrap_or("no reason given")
                ));
            } else if replica.last_poll_age_seconds > REPLICA_POLL_AGE_MAX_SECONDS {
                reasons.push(format!(
                    "replica_stale: no poll of the backup at {} has succeeded for {:.0} s",
                    replica.url, replica.last_poll_age_seconds
                ));
            }
        }
        reasons
    }
}

/// What the background scrub found (see `Options::scrub`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ScrubStats {
    /// Passes over every sealed segment finished.
    pub passes: u64,
    pub segments_checked: u64,
    pub bytes_checked: u64,
    /// Damaged records put back from the backup.
    pub repaired: u64,
    /// Damage found and not repaired, one line per segment.
    pub damaged: Vec<String>,
    pub last_repair: Option<String>,
}

/// Where the continuous backup stands (see `Options::backup`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackupStats {
    pub url: String,
    /// "shipping", "failing" (object storage does not take puts; retried with backoff),
    /// "standby" (on PostgreSQL: another server of the database ships, see `holder`; this one
    /// takes over once that server's lease lapses) or "stopped" (the prefix holds another
    /// history or another server took it; see `last_error`).
    pub state: &'static str,
    /// Every position up to this one is in object storage.
    pub shipped_through: u64,
    /// Durable positions not yet shipped, and how long the oldest of them has waited.
    pub lag_positions: u64,
    pub lag_seconds: f64,
    pub bytes_shipped: u64,
    pub objects_shipped: u64,
    /// Of those, objects of a sealed segment's records (`segments/`): a sealed segment's
    /// pieces, and runs of small chunks put again as one.
    pub segments_shipped: u64,
    /// Puts that failed (each retried).
    pub failures: u64,
    pub last_error: Option<String>,
    /// On a standby, the server that holds the lease and ships.
    pub holder: Option<String>,
}

/// What [`Store::check`] found.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveCheck {
    /// The head the check ran up to.
    pub head: u64,
    /// Events whose records passed their CRC and sequence checks.
    pub events: u64,
    /// The first problem found, if any.
    pub problem: Option<String>,
    pub seconds: f64,
}

/// Counters of the PostgreSQL backend.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DatabaseStats {
    /// Group commits (one statement, one database commit each).
    pub commits: u64,
    /// Group commits that found another server had committed first, or that the database
    /// rolled back as a serialization failure (SQLSTATE 40001, 40P01), and were checked again.
    pub conflicts: u64,
    /// Retries of groups that went in right after another server's appends in one
    /// statement, none of those mattering to the group's conditions or tracking positions.
    pub passed: u64,
    /// Appends committed by other servers and taken into this one's log.
    pub followed: u64,
    /// Connections made again after one was lost.
    pub reconnects: u64,
    /// Appends answered with an unknown outcome: the session ended during the commit and the
    /// database could not tell, within the time a group waits for it, whether it committed.
    pub unknown_outcomes: u64,
    /// Appends whose commit's outcome was unknown when the session ended, then settled by
    /// reading the log: found committed and answered so, or found absent and tried again.
    pub settled_outcomes: u64,
}
