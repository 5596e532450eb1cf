//! An append on its way to the log and the way back: the request a backend commits, and how
//! its caller waits for the outcome and is answered. Below both the seam (`log.rs`) and the
//! writer, which each take requests and answer them, so that neither imports the other.

// Requests are handed back by value where they cannot be taken (queue full, role busy): boxing
// them to shrink the `Err` would cost an allocation per append.
#![allow(clippy::result_large_err)]
mod reply;
mod waiting;

pub(crate) use reply::{Answers, AsyncSlot, Completion, Reply, ReplyTo};
pub(crate) use waiting::Waiting;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::error::{AppendError, StoreError};
use crate::options::Durability;
use crate::query::AppendCondition;
use crate::record::EncodedAppend;
use crate::shared::Shared;

/// One append handed to a backend: encoded and sealed, with its condition and its reply.
pub(crate) struct Request {
    pub(crate) append: EncodedAppend,
    pub(crate) condition: Option<AppendCondition>,
    /// The admission check's fence (see [`crate::admission::Fence`]): no event of its types
    /// may stand after its `after`, or the append is answered
    /// [`AppendError::AdmissionChanged`](crate::AppendError::AdmissionChanged).
    pub(crate) fence: Option<AppendCondition>,
    pub(crate) require_synced: bool,
    pub(crate) reply: Reply,
    /// The append time to record, when it was decided elsewhere (by the database backend,
    /// which committed the append before it reaches this writer); otherwise the group's.
    pub(crate) appended_at: Option<u64>,
    /// The append's span (none unless spans are recorded): the sync that makes it durable
    /// links to it, and it to the sync.
    pub(crate) trace: tracing::Span,
}
