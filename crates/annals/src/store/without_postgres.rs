//! A build without the `postgres` feature: no store has a database backend, so its handle is
//! a type with no values, and every branch that would use one is statically dead.

use crossbeam_channel::TrySendError;

use crate::error::StoreError;
use crate::log::Log;
use crate::options::Durability;
use crate::stats::DatabaseStats;
use crate::writer::Request;

/// The PostgreSQL backend's handle, which this build cannot make.
pub(crate) enum Remote {}

impl Log for Remote {
    fn name(&self) -> &'static str {
        match *self {}
    }

    fn durability(&self) -> Durability {
        match *self {}
    }

    fn commit_alone(&self, _: Request) -> Result<(), Request> {
        match *self {}
    }

    fn submit(&self, _: Request, _: bool) -> Result<(), TrySendError<Request>> {
        match *self {}
    }

    fn refresh(&self) -> Result<u64, StoreError> {
        match *self {}
    }

    fn queue_depth(&self) -> usize {
        match *self {}
    }

    fn synced(&self) -> u64 {
        match *self {}
    }

    fn on_local_disk(&self) -> bool {
        match *self {}
    }

    fn database_stats(&self) -> Option<DatabaseStats> {
        match *self {}
    }
}

/// What opening a database URL answers in this build.
pub(crate) fn unavailable(location: &str) -> StoreError {
    StoreError::InvalidOption(format!(
        "{location} is a PostgreSQL URL, and this build of Annals has no PostgreSQL backend \
         (build the annals crate with its `postgres` feature; the server and the command line \
         have it)"
    ))
}
