//! The seam between the store and the place its log is committed: the one interface a backend
//! implements, and all the store's facade knows of it. Three implement it: segment files (the
//! writer, `writer/files.rs`), PostgreSQL (`postgres::Remote`, a committer in front of a
//! mirror on files) and a read replica (`replica::Replica`, a backup followed into a copy on
//! files, which refuses appends). Above the seam, conditions, the index, reads, subscriptions
//! and decisions are the same code whichever it is: every backend publishes what it commits
//! into the same shared state (`Shared`), where readers find it. A further place for the log plugs in here,
//! as another implementation, without touching the writer.

use crossbeam_channel::TrySendError;

use crate::error::{InputError, StoreError};
use crate::kept::AppendStamp;
use crate::options::Durability;
use crate::request::Request;
use crate::route::Backend;
use crate::stats::{DatabaseStats, ReplicaStats};

/// Where a store's log is committed.
// The refused request is handed back whole, by value, as the writer's routes do.
#[allow(clippy::result_large_err)]
pub(crate) trait Log: Send + Sync {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// The class every acknowledged append of this log has.
    fn durability(&self) -> Durability;

    /// Commits `request` on the calling thread, a blocking caller that is the only one
    /// waiting on the store, when the backend is idle; otherwise hands it back, to be
    /// submitted.
    fn commit_alone(&self, request: Request) -> Result<(), Request>;

    /// Hands `request` to the backend, to be committed with others; when the backend's queue
    /// is full, waits (`wait_when_full`) or hands it back.
    fn submit(&self, request: Request, wait_when_full: bool) -> Result<(), TrySendError<Request>>;

    /// Takes in what others committed to the log, and answers the head.
    fn refresh(&self) -> Result<u64, StoreError>;

    /// Appends waiting for the backend.
    fn queue_depth(&self) -> usize;

    /// The log is durable through this position (a lower bound).
    fn synced(&self) -> u64;

    /// Whether the log lives on this machine's file system (its free space is worth telling).
    fn on_local_disk(&self) -> bool;

    /// The database's own counters, for a log in a database.
    fn database_stats(&self) -> Option<DatabaseStats>;

    /// Why this store takes no append and no erasure (a read replica: its primary takes
    /// them); None when it does.
    fn refusal(&self) -> Option<InputError> {
        None
    }

    /// How a read replica follows its backup.
    fn replica_stats(&self) -> Option<ReplicaStats> {
        None
    }

    /// Stops taking appends: the backend's own threads finish what they hold and stop, and
    /// the queue of the file engine behind it closes (its threads are the store's services,
    /// stopped next). Answers the last append taken into a copy of the log (a database's
    /// mirror, a replica's copy), which a kept copy records at its close; None on files.
    fn stop(self: Box<Self>) -> Option<AppendStamp>;
}
