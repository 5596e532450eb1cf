//! Errors, typed by what the caller can do about them.
//!
//! - [`AppendError::ConditionFailed`] is an expected outcome: re-read and decide again.
//! - [`InputError`] means the request itself is wrong: fix it; nothing was changed.
//! - [`StoreError`] is fatal for this handle: the store is poisoned, closed or damaged and must be
//!   reopened (or repaired) before it acknowledges anything again.

use std::io;
use std::path::PathBuf;

/// A fatal storage error. Messages name the file and offset and say what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{operation} failed on {path} at offset {offset}: {source}")]
    Io {
        operation: &'static str,
        path: PathBuf,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error(
        "damaged log: {path} at offset {offset}: {reason}; the damage lies before valid records, \
         so Annals refuses to open rather than drop acknowledged events (restore from a backup \
         or run `annals verify` to inspect)"
    )]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("the data directory {path} is in use by another process (its lock is held)")]
    Locked { path: PathBuf },
    #[error(
        "the store is poisoned after a failed write or fsync ({reason}); nothing more will be \
         acknowledged until it is reopened"
    )]
    Poisoned { reason: String },
    #[error("the store is closed")]
    Closed,
    #[error("invalid store option: {0}")]
    InvalidOption(String),
    /// The database behind the store refused or could not be reached; nothing was appended.
    /// The handle stays usable: it reconnects, and a later append may succeed.
    #[error("the database is unavailable ({reason}); nothing was appended, retry later")]
    Unavailable { reason: String },
    /// The database may or may not have committed the append (the connection was lost while
    /// the commit was in flight). Read to find out, or retry with event ids, which make the
    /// retry of a conditional append recognisable.
    #[error(
        "the outcome of the append is unknown ({reason}): it may or may not be stored; read \
         to find out, or retry it with the same event ids"
    )]
    OutcomeUnknown { reason: String },
    /// The file system holding the log (or the database) has no room for the append: nothing
    /// of it was written, and the store is not poisoned. It takes appends again once there is
    /// room, by itself.
    #[error("no room on the disk ({reason}); nothing was appended, retry once there is room")]
    DiskFull { reason: String },
    /// The database holds something this build cannot use (a newer schema, a damaged row).
    #[error("database: {0}")]
    Database(String),
    /// A copy between stores cannot go on: the target is not empty and not a prefix of the
    /// source, something else writes to it, or the two logs differ when compared.
    #[error("copy: {0}")]
    Copy(String),
    /// The backup in object storage cannot be used: a malformed URL, a bucket that does not
    /// exist, refused credentials, a prefix that holds another store or that another server
    /// ships into, a damaged object.
    #[error("backup: {0}")]
    Backup(String),
    /// The subjects' keys cannot be used: another master key than the store's, a damaged key
    /// file, a store with encrypted subjects opened without its master key.
    #[error("subjects: {0}")]
    Subjects(String),
}

impl StoreError {
    pub(crate) fn io(
        operation: &'static str,
        path: impl Into<PathBuf>,
        offset: u64,
        source: io::Error,
    ) -> Self {
        StoreError::Io {
            operation,
            path: path.into(),
            offset,
            source,
        }
    }
}

/// A request that breaks a limit or is malformed. Nothing was appended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    #[error("an append must carry at least one event")]
    NoEvents,
    #[error("too many events in one append: {count} (the limit is {max})")]
    TooManyEvents { count: usize, max: usize },
    #[error("event {index} is too large: {bytes} bytes of data and metadata (the limit is {max})")]
    EventTooLarge {
        index: usize,
        bytes: usize,
        max: usize,
    },
    #[error("the append is too large: {bytes} encoded bytes (the limit is {max})")]
    AppendTooLarge { bytes: usize, max: usize },
    #[error("event {index} has an empty type")]
    EmptyType { index: usize },
    #[error("event {index} has a type of {bytes} bytes (the limit is {max})")]
    TypeTooLong {
        index: usize,
        bytes: usize,
        max: usize,
    },
    #[error("event {index} has {count} tags (the limit is {max})")]
    TooManyTags {
        index: usize,
        count: usize,
        max: usize,
    },
    #[error("event {index} has an empty tag")]
    EmptyTag { index: usize },
    /// A tag of a query item is empty or too long (counted from 0).
    #[error("query item {item} has {problem}")]
    InvalidQueryTag { item: usize, problem: String },
    #[error("event {index} has a tag of {bytes} bytes (the limit is {max})")]
    TagTooLong {
        index: usize,
        bytes: usize,
        max: usize,
    },
    #[error("event {index} has the tag {tag:?} twice")]
    DuplicateTag { index: usize, tag: String },
    #[error("{what} {value:?} contains a control character")]
    ControlCharacter { what: &'static str, value: String },
    #[error("the query has {count} items (the limit is {max})")]
    TooManyQueryItems { count: usize, max: usize },
    #[error("a query item has {count} {what} (the limit is {max})")]
    QueryItemTooLarge {
        what: &'static str,
        count: usize,
        max: usize,
    },
    #[error("the append queue is full ({depth} appends waiting); retry later")]
    QueueFull { depth: usize },
    #[error("read options: {0}")]
    InvalidReadOptions(String),
    #[error(
        "invalid tracking source {name:?}: it must be 1 to {max} bytes without control characters"
    )]
    InvalidTrackingSource { name: String, max: usize },
    /// A tracking position given with an [`crate::EventBatch`], which has no room for one.
    #[error("an event batch carries no tracking position; append NewEvents for that")]
    TrackingInBatch,
    /// `require_synced` asked of a memory-only (D0) store, which has nothing to sync.
    #[error("a memory-only (D0) store cannot make an append durable")]
    SyncUnavailable,
    /// An append to a read replica, which serves reads only.
    #[error(
        "this store is a read replica of the backup at {backup}: it takes no appends; append \
         to the primary that writes the backup ({primary})"
    )]
    ReadOnlyReplica { backup: String, primary: String },
    /// The off-machine class (D4) asked of a store without a backup to ship to.
    #[error(
        "the off-machine class (d4) needs a backup in object storage; open the store with one \
         (annals serve --backup URL, or Options::backup)"
    )]
    OffMachineUnavailable,
    /// An append read from another log (a copy's) that does not decode.
    #[error("the append at position {position} is malformed: {why}")]
    MalformedStoredAppend { position: u64, why: String },
    /// An append naming a data subject that was erased: its events can no longer be stored.
    #[error("the data subject {tag} was erased; events naming it are refused")]
    SubjectErased { tag: String },
    /// An erasure of a tag that names no data subject (the store's subject tag prefixes).
    #[error("{tag:?} names no data subject (the store's subject tag prefixes are {prefixes})")]
    NotASubject { tag: String, prefixes: String },
    /// An erasure, or an event of the erasure receipt's type, on a store without subjects.
    #[error("this store has no data subjects (configure subject tag prefixes and a master key)")]
    NoSubjects,
    /// An event of the type erasures use for their receipts, appended by a client.
    #[error("event {index}: the type {event_type} is the store's own (erasure receipts)")]
    ReservedType { index: usize, event_type: String },
}

/// Why an append did not happen.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The append condition failed: an event matching `failIfEventsMatch` exists after `after`.
    /// `position` is the first such event. Nothing was appended.
    #[error("append condition failed: event at position {position} matches the condition")]
    ConditionFailed { position: u64 },
    /// The append carried a tracking position not above the one recorded for its source.
    /// Nothing was appended.
    #[error(
        "non-increasing tracking position for source {name:?}: {given} given, {recorded} \
         already recorded"
    )]
    TrackingNotIncreasing {
        name: String,
        recorded: u64,
        given: u64,
    },
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AppendError {
    /// The conflicting position, if this is a failed condition.
    pub fn conflict_position(&self) -> Option<u64> {
        match self {
            AppendError::ConditionFailed { position } => Some(*position),
            _ => None,
        }
    }
}

/// Errors from reads and subscriptions.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
