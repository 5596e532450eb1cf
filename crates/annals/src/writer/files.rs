//! The log on segment files behind the seam ([`crate::log::Log`]): appends go to the writer's
//! role, on the caller's thread when the store is idle or a sync runs, else through the
//! writer thread's bounded queue.

use crossbeam_channel::{Sender, TrySendError};

use super::*;
use crate::log::Log;
use crate::stats::DatabaseStats;

/// The segment-file log: the writer's queue and its role.
pub(crate) struct FileLog {
    sender: Sender<Request>,
    role: Arc<WriterRole>,
    shared: Arc<Shared>,
}

impl FileLog {
    pub(crate) fn new(sender: Sender<Request>, role: Arc<WriterRole>, shared: Arc<Shared>) -> Self {
        FileLog {
            sender,
            role,
            shared,
        }
    }

    /// The writer's role, for a backend that commits in front of it (the database's mirror,
    /// a replica's copy).
    #[cfg_attr(
        not(any(feature = "postgres", feature = "object-store")),
        allow(dead_code)
    )]
    pub(crate) fn role(&self) -> &Arc<WriterRole> {
        &self.role
    }
}

impl Log for FileLog {
    fn backend(&self) -> Backend {
        Backend::Files
    }

    fn durability(&self) -> Durability {
        self.shared.options.durability
    }

    fn commit_alone(&self, request: Request) -> Result<(), Request> {
        self.role.commit_alone(request)
    }

    fn submit(&self, request: Request, wait_when_full: bool) -> Result<(), TrySendError<Request>> {
        let request = match self.role.stage_during_sync(request) {
            Ok(()) => return Ok(()),
            Err(request) => request,
        };
        if wait_when_full {
            self.sender
                .send(request)
                .map_err(|e| TrySendError::Disconnected(e.into_inner()))
        } else {
            self.sender.try_send(request)
        }
    }

    fn refresh(&self) -> Result<u64, StoreError> {
        // This store is the log's only writer: the head as it is.
        Ok(self.shared.head())
    }

    fn queue_depth(&self) -> usize {
        self.sender.len()
    }

    fn synced(&self) -> u64 {
        self.shared.published.synced()
    }

    fn on_local_disk(&self) -> bool {
        true
    }

    fn database_stats(&self) -> Option<DatabaseStats> {
        None
    }

    /// Closes the writer's queue (by dropping it): the writer thread ends once it has
    /// committed what the queue holds.
    fn stop(self: Box<Self>) -> Option<crate::kept::AppendStamp> {
        None
    }
}
