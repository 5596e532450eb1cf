//! Errors per operation, typed by what the caller can do about them.
//!
//! - Opening answers [`OpenError`]; an append [`AppendError`]; a read or a subscription
//!   [`ReadError`]. Each names what that call can produce, and each value has a stable
//!   [`kind`](AppendError::kind), one of [`ERROR_KINDS`].
//! - An append's expected outcomes are values of [`AppendError`]: a failed condition (re-read
//!   and decide again), an outcome unknown (read to find out), no room on the disk, the
//!   database unavailable, the queue full, an erased subject. None of them poisons the store.
//! - [`InputError`] means the request itself is wrong: fix it; nothing was changed.
//! - [`StoreError`] inside an operation's error is fatal for this handle: the store is
//!   poisoned, closed or damaged and must be reopened (or repaired) before it acknowledges
//!   anything again. Calls with no error of their own (a copy, a backup, an erasure's upkeep,
//!   key rotation) answer [`StoreError`] whole, transient variants included.

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
    /// The handle stays usable: it reconnects, and a later append may succeed. Opening, an
    /// append and a read answer it as their own `Unavailable`.
    #[error("the database is unavailable ({reason}); nothing was appended, retry later")]
    Unavailable { reason: String },
    /// The database may or may not have committed the append (the connection was lost while
    /// the commit was in flight). Read to find out, or retry with event ids, which make the
    /// retry of a conditional append recognisable. An append answers it as
    /// [`AppendError::OutcomeUnknown`].
    #[error(
        "the outcome of the append is unknown ({reason}): it may or may not be stored; read \
         to find out, or retry it with the same event ids"
    )]
    OutcomeUnknown { reason: String },
    /// The file system holding the log (or the database) has no room for the append: nothing
    /// of it was written, and the store is not poisoned. It takes appends again once there is
    /// room, by itself. Opening and an append answer it as their own `DiskFull`.
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

impl StoreError {
    /// A stable word for what went wrong, which front ends answer as the error's kind (the
    /// server maps each to an HTTP status and a gRPC code in one table).
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Io { .. } => "io",
            StoreError::Corrupt { .. } => "corrupt",
            StoreError::Locked { .. } => "locked",
            StoreError::Poisoned { .. } => "store_poisoned",
            StoreError::Closed => "closed",
            StoreError::InvalidOption(_) => "invalid_option",
            StoreError::Unavailable { .. } => "database_unavailable",
            StoreError::OutcomeUnknown { .. } => "outcome_unknown",
            StoreError::DiskFull { .. } => "disk_full",
            StoreError::Database(_) => "database",
            StoreError::Copy(_) => "copy",
            StoreError::Backup(_) => "backup",
            StoreError::Subjects(_) => "subjects",
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
    /// An erasure of a tag that names no data subject (the store's subject tag prefixes).
    #[error("{tag:?} names no data subject (the store's subject tag prefixes are {prefixes})")]
    NotASubject { tag: String, prefixes: String },
    /// An erasure on a store without subjects.
    #[error("this store has no data subjects (configure subject tag prefixes and a master key)")]
    NoSubjects,
    /// An event of the type erasures use for their receipts, appended by a client (with data
    /// subjects or without: such an event would read as a receipt once subjects were on).
    #[error(
        "event {index}: the type {event_type} is the store's own (erasure receipts, the schema \
         registry)"
    )]
    ReservedType { index: usize, event_type: String },
    /// Refused by the store's admission check ([`crate::Options::admission`]).
    #[error("{0}")]
    NotAdmitted(crate::admission::Refusal),
}

impl InputError {
    /// A stable word for what is wrong with the request (see [`StoreError::kind`]); an
    /// admission check's refusal has its own.
    pub fn kind(&self) -> &'static str {
        match self {
            InputError::NoEvents => "no_events",
            InputError::TooManyEvents { .. } => "too_many_events",
            InputError::EventTooLarge { .. } => "event_too_large",
            InputError::AppendTooLarge { .. } => "append_too_large",
            InputError::EmptyType { .. } | InputError::TypeTooLong { .. } => "invalid_type",
            InputError::TooManyTags { .. } => "too_many_tags",
            InputError::EmptyTag { .. }
            | InputError::InvalidQueryTag { .. }
            | InputError::TagTooLong { .. }
            | InputError::DuplicateTag { .. }
            | InputError::ControlCharacter { .. } => "invalid_tag",
            InputError::TooManyQueryItems { .. } | InputError::QueryItemTooLarge { .. } => {
                "query_too_large"
            }
            InputError::InvalidReadOptions(_) => "invalid_read_options",
            InputError::InvalidTrackingSource { .. } | InputError::TrackingInBatch => {
                "invalid_tracking"
            }
            InputError::SyncUnavailable => "sync_unavailable",
            InputError::ReadOnlyReplica { .. } => "read_only_replica",
            InputError::OffMachineUnavailable => "off_machine_unavailable",
            InputError::MalformedStoredAppend { .. } => "malformed_stored_append",
            InputError::NotASubject { .. } => "not_a_subject",
            InputError::NoSubjects => "no_subjects",
            InputError::ReservedType { .. } => "reserved_type",
            InputError::NotAdmitted(refusal) => refusal.kind,
        }
    }
}

/// Every kind [`StoreError::kind`], [`InputError::kind`] and [`AppendError::kind`] answer,
/// an admission check's own kinds aside: a front end's table of answers covers each.
pub const ERROR_KINDS: &[&str] = &[
    "io",
    "corrupt",
    "locked",
    "store_poisoned",
    "closed",
    "invalid_option",
    "database_unavailable",
    "outcome_unknown",
    "disk_full",
    "database",
    "copy",
    "backup",
    "subjects",
    "no_events",
    "too_many_events",
    "event_too_large",
    "append_too_large",
    "invalid_type",
    "too_many_tags",
    "invalid_tag",
    "query_too_large",
    "queue_full",
    "invalid_read_options",
    "invalid_tracking",
    "sync_unavailable",
    "read_only_replica",
    "off_machine_unavailable",
    "malformed_stored_append",
    "subject_erased",
    "not_a_subject",
    "no_subjects",
    "reserved_type",
    "condition_failed",
    "tracking_not_increasing",
    "admission_changed",
];

/// Why an append did not happen, or may not have.
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
    /// The append may or may not be stored: a write or sync whose result is unknown (the store
    /// is poisoned until reopened), a commit whose connection was lost, a D4 append the backup
    /// did not take in time. Read to find out, or retry it with the same event ids, which
    /// make the retry of a conditional append recognisable.
    #[error(
        "the outcome of the append is unknown ({reason}): it may or may not be stored; read \
         to find out, or retry it with the same event ids"
    )]
    OutcomeUnknown { reason: String },
    /// No room for the append on the file system (or in the database): nothing of it was
    /// written and the store is not poisoned; it takes appends again once there is room.
    #[error("no room on the disk ({reason}); nothing was appended, retry once there is room")]
    DiskFull { reason: String },
    /// The database refused or could not be reached, or this server stopped taking appends
    /// (another server seals for subjects it does not know): nothing was appended; retry.
    #[error("the database is unavailable ({reason}); nothing was appended, retry later")]
    Unavailable { reason: String },
    /// The append queue is full and the append asked not to wait: nothing was appended.
    #[error("the append queue is full ({depth} appends waiting); retry later")]
    QueueFull { depth: usize },
    /// An event names a data subject that was erased: its events can no longer be stored.
    /// Nothing was appended.
    #[error("the data subject {tag} was erased; events naming it are refused")]
    SubjectErased { tag: String },
    /// The rules that admitted the append (event schemas, kept in the log) changed at
    /// `position` before it was stored: nothing was appended. Send it again, to be judged by
    /// the rules in force now.
    #[error(
        "the rules that admitted this append changed at position {position} before it was \
         stored; nothing was appended, send it again"
    )]
    AdmissionChanged { position: u64 },
    /// The request is wrong: nothing was appended.
    #[error(transparent)]
    Input(#[from] InputError),
    /// Fatal for this handle (poisoned, closed, damaged): reopen the store. Never one of the
    /// outcomes above: [`From<StoreError>`](#impl-From<StoreError>-for-AppendError) sorts them.
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for AppendError {
    /// The one way a store error becomes an append's: the outcomes an append names are its
    /// own values, the rest are fatal.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::OutcomeUnknown { reason } => AppendError::OutcomeUnknown { reason },
            StoreError::DiskFull { reason } => AppendError::DiskFull { reason },
            StoreError::Unavailable { reason } => AppendError::Unavailable { reason },
            fatal => AppendError::Store(fatal),
        }
    }
}

impl AppendError {
    /// A stable word for the outcome (see [`StoreError::kind`]).
    pub fn kind(&self) -> &'static str {
        match self {
            AppendError::ConditionFailed { .. } => "condition_failed",
            AppendError::TrackingNotIncreasing { .. } => "tracking_not_increasing",
            AppendError::OutcomeUnknown { .. } => "outcome_unknown",
            AppendError::DiskFull { .. } => "disk_full",
            AppendError::Unavailable { .. } => "database_unavailable",
            AppendError::QueueFull { .. } => "queue_full",
            AppendError::SubjectErased { .. } => "subject_erased",
            AppendError::AdmissionChanged { .. } => "admission_changed",
            AppendError::Input(e) => e.kind(),
            AppendError::Store(e) => e.kind(),
        }
    }

    /// The conflicting position, if this is a failed condition.
    pub fn conflict_position(&self) -> Option<u64> {
        match self {
            AppendError::ConditionFailed { position } => Some(*position),
            _ => None,
        }
    }

    /// The error as the store error of a call that has no error of its own (an erasure's
    /// upkeep, a copy): the append's outcomes go back to their [`StoreError`] variants.
    pub(crate) fn into_store_error(self) -> Result<StoreError, AppendError> {
        match self {
            AppendError::Store(e) => Ok(e),
            AppendError::OutcomeUnknown { reason } => Ok(StoreError::OutcomeUnknown { reason }),
            AppendError::DiskFull { reason } => Ok(StoreError::DiskFull { reason }),
            AppendError::Unavailable { reason } => Ok(StoreError::Unavailable { reason }),
            other => Err(other),
        }
    }
}

/// Why a read or a subscription failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The query or the read options are wrong.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The database behind the store could not be reached: retry.
    #[error("the database is unavailable ({reason}); retry later")]
    Unavailable { reason: String },
    /// Fatal for this handle (closed, damaged, an I/O error): reopen the store.
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for ReadError {
    /// The one way a store error becomes a read's.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable { reason } => ReadError::Unavailable { reason },
            fatal => ReadError::Store(fatal),
        }
    }
}

impl ReadError {
    /// A stable word for what went wrong (see [`StoreError::kind`]).
    pub fn kind(&self) -> &'static str {
        match self {
            ReadError::Input(e) => e.kind(),
            ReadError::Unavailable { .. } => "database_unavailable",
            ReadError::Store(e) => e.kind(),
        }
    }
}

/// Why a store could not be opened. An opening that fails leaves the data directory (or the
/// database) as it found it, or as far as recovery had mended it.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process holds the data directory (or this directory's copy of a database).
    #[error("the data directory {path} is in use by another process (its lock is held)")]
    Locked { path: PathBuf },
    /// An option, or the location, is wrong: fix it.
    #[error("invalid store option: {0}")]
    InvalidOption(String),
    /// The database could not be reached: retry.
    #[error("the database is unavailable ({reason}); retry later")]
    Unavailable { reason: String },
    /// No room to make the store's files.
    #[error("no room on the disk ({reason}); make room and open again")]
    DiskFull { reason: String },
    /// The subjects' keys cannot be used: another master key, subject tag prefixes that leave
    /// out a subject the store sealed for, a damaged key file, a missing master key.
    #[error("subjects: {0}")]
    Subjects(String),
    /// The backup the store follows or ships to cannot be used.
    #[error("backup: {0}")]
    Backup(String),
    /// The store's own: a damaged log, an I/O error, a database or a kept copy this build
    /// cannot use.
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for OpenError {
    /// The one way a store error becomes an opening's.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Locked { path } => OpenError::Locked { path },
            StoreError::InvalidOption(reason) => OpenError::InvalidOption(reason),
            StoreError::Unavailable { reason } => OpenError::Unavailable { reason },
            StoreError::DiskFull { reason } => OpenError::DiskFull { reason },
            StoreError::Subjects(reason) => OpenError::Subjects(reason),
            StoreError::Backup(reason) => OpenError::Backup(reason),
            other => OpenError::Store(other),
        }
    }
}

impl From<OpenError> for StoreError {
    /// For calls that open a store as one of their steps (a restore, a copy's target) and
    /// answer [`StoreError`]: each value goes back to its variant.
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Locked { path } => StoreError::Locked { path },
            OpenError::InvalidOption(reason) => StoreError::InvalidOption(reason),
            OpenError::Unavailable { reason } => StoreError::Unavailable { reason },
            OpenError::DiskFull { reason } => StoreError::DiskFull { reason },
            OpenError::Subjects(reason) => StoreError::Subjects(reason),
            OpenError::Backup(reason) => StoreError::Backup(reason),
            OpenError::Store(e) => e,
        }
    }
}

impl OpenError {
    /// A stable word for what went wrong (see [`StoreError::kind`]).
    pub fn kind(&self) -> &'static str {
        match self {
            OpenError::Locked { .. } => "locked",
            OpenError::InvalidOption(_) => "invalid_option",
            OpenError::Unavailable { .. } => "database_unavailable",
            OpenError::DiskFull { .. } => "disk_full",
            OpenError::Subjects(_) => "subjects",
            OpenError::Backup(_) => "backup",
            OpenError::Store(e) => e.kind(),
        }
    }
}

/// One value of every kind an append can answer, each as an append answers it: for front
/// ends' tests that walk every kind through their answers. An admission check's refusal is
/// not among them (its kind is the check's own).
#[doc(hidden)]
pub fn append_error_examples() -> Vec<AppendError> {
    let (store, input) = examples();
    let mut all: Vec<AppendError> = store.into_iter().map(AppendError::from).collect();
    all.extend(
        input
            .into_iter()
            .filter(|e| !matches!(e, InputError::NotAdmitted(_)))
            .map(AppendError::Input),
    );
    all.extend([
        AppendError::ConditionFailed { position: 1 },
        AppendError::TrackingNotIncreasing {
            name: "s".into(),
            recorded: 2,
            given: 1,
        },
        AppendError::QueueFull { depth: 1 },
        AppendError::SubjectErased { tag: "t".into() },
        AppendError::AdmissionChanged { position: 1 },
    ]);
    all
}

/// One value of every variant. The matches below name every variant with no wildcard, so
/// that a new variant does not compile until it is named here: add its example beside it
/// (its kind's match in `kind()` is as exhaustive).
fn examples() -> (Vec<StoreError>, Vec<InputError>) {
    let store = vec![
        StoreError::io("write", "f", 0, io::Error::other("x")),
        StoreError::Corrupt {
            path: "f".into(),
            offset: 0,
            reason: "x".into(),
        },
        StoreError::Locked { path: "d".into() },
        StoreError::Poisoned { reason: "x".into() },
        StoreError::Closed,
        StoreError::InvalidOption("x".into()),
        StoreError::Unavailable { reason: "x".into() },
        StoreError::OutcomeUnknown { reason: "x".into() },
        StoreError::DiskFull { reason: "x".into() },
        StoreError::Database("x".into()),
        StoreError::Copy("x".into()),
        StoreError::Backup("x".into()),
        StoreError::Subjects("x".into()),
    ];
    let input = vec![
        InputError::NoEvents,
        InputError::TooManyEvents { count: 2, max: 1 },
        InputError::EventTooLarge {
            index: 0,
            bytes: 2,
            max: 1,
        },
        InputError::AppendTooLarge { bytes: 2, max: 1 },
        InputError::EmptyType { index: 0 },
        InputError::TypeTooLong {
            index: 0,
            bytes: 2,
            max: 1,
        },
        InputError::TooManyTags {
            index: 0,
            count: 2,
            max: 1,
        },
        InputError::EmptyTag { index: 0 },
        InputError::InvalidQueryTag {
            item: 0,
            problem: "x".into(),
        },
        InputError::TagTooLong {
            index: 0,
            bytes: 2,
            max: 1,
        },
        InputError::DuplicateTag {
            index: 0,
            tag: "t".into(),
        },
        InputError::ControlCharacter {
            what: "tag",
            value: "x".into(),
        },
        InputError::TooManyQueryItems { count: 2, max: 1 },
        InputError::QueryItemTooLarge {
            what: "tags",
            count: 2,
            max: 1,
        },
        InputError::InvalidReadOptions("x".into()),
        InputError::InvalidTrackingSource {
            name: String::new(),
            max: 1,
        },
        InputError::TrackingInBatch,
        InputError::SyncUnavailable,
        InputError::ReadOnlyReplica {
            backup: "b".into(),
            primary: "p".into(),
        },
        InputError::OffMachineUnavailable,
        InputError::MalformedStoredAppend {
            position: 1,
            why: "x".into(),
        },
        InputError::NotASubject {
            tag: "t".into(),
            prefixes: "p".into(),
        },
        InputError::NoSubjects,
        InputError::ReservedType {
            index: 0,
            event_type: "t".into(),
        },
        InputError::NotAdmitted(crate::admission::Refusal::append("checked", "x")),
    ];
    for e in &store {
        match e {
            StoreError::Io { .. }
            | StoreError::Corrupt { .. }
            | StoreError::Locked { .. }
            | StoreError::Poisoned { .. }
            | StoreError::Closed
            | StoreError::InvalidOption(_)
            | StoreError::Unavailable { .. }
            | StoreError::OutcomeUnknown { .. }
            | StoreError::DiskFull { .. }
            | StoreError::Database(_)
            | StoreError::Copy(_)
            | StoreError::Backup(_)
            | StoreError::Subjects(_) => {}
        }
    }
    for e in &input {
        match e {
            InputError::NoEvents
            | InputError::TooManyEvents { .. }
            | InputError::EventTooLarge { .. }
            | InputError::AppendTooLarge { .. }
            | InputError::EmptyType { .. }
            | InputError::TypeTooLong { .. }
            | InputError::TooManyTags { .. }
            | InputError::EmptyTag { .. }
            | InputError::InvalidQueryTag { .. }
            | InputError::TagTooLong { .. }
            | InputError::DuplicateTag { .. }
            | InputError::ControlCharacter { .. }
            | InputError::TooManyQueryItems { .. }
            | InputError::QueryItemTooLarge { .. }
            | InputError::InvalidReadOptions(_)
            | InputError::InvalidTrackingSource { .. }
            | InputError::TrackingInBatch
            | InputError::SyncUnavailable
            | InputError::ReadOnlyReplica { .. }
            | InputError::OffMachineUnavailable
            | InputError::MalformedStoredAppend { .. }
            | InputError::NotASubject { .. }
            | InputError::NoSubjects
            | InputError::ReservedType { .. }
            | InputError::NotAdmitted(_) => {}
        }
    }
    (store, input)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every error value has a stable kind, and `ERROR_KINDS` lists each kind exactly
    /// once, so that a front end's table built from it answers every error. Method: one value
    /// of every variant (the compiler keeps the list whole), its kind looked up.
    #[test]
    fn every_error_has_a_listed_kind() {
        let appends = append_error_examples();
        for e in &appends {
            match e {
                AppendError::ConditionFailed { .. }
                | AppendError::TrackingNotIncreasing { .. }
                | AppendError::OutcomeUnknown { .. }
                | AppendError::DiskFull { .. }
                | AppendError::Unavailable { .. }
                | AppendError::QueueFull { .. }
                | AppendError::SubjectErased { .. }
                | AppendError::AdmissionChanged { .. }
                | AppendError::Input(_)
                | AppendError::Store(_) => {}
            }
        }
        let kinds: Vec<&str> = appends.iter().map(AppendError::kind).collect();
        for kind in &kinds {
            assert!(ERROR_KINDS.contains(kind), "{kind} is not in ERROR_KINDS");
        }
        for kind in ERROR_KINDS {
            assert!(kinds.contains(kind), "no error has the kind {kind}");
            assert_eq!(
                ERROR_KINDS.iter().filter(|k| *k == kind).count(),
                1,
                "{kind}"
            );
        }
        assert_eq!(
            InputError::NotAdmitted(crate::admission::Refusal::append("checked", "x")).kind(),
            "checked"
        );
    }

    /// Goal: an append, a read and an opening never answer one of their own outcomes as a
    /// fatal store error, and an opening's error goes back to the store error it came from.
    /// Method: every store error sorted by each conversion.
    #[test]
    fn each_operation_sorts_store_errors_into_its_own() {
        let (store, _) = examples();
        for e in store {
            let kind = e.kind();
            let transient = matches!(
                e,
                StoreError::OutcomeUnknown { .. }
                    | StoreError::DiskFull { .. }
                    | StoreError::Unavailable { .. }
            );
            let append = AppendError::from(clone_of(&e));
            assert_eq!(append.kind(), kind);
            assert_eq!(
                matches!(append, AppendError::Store(_)),
                !transient,
                "{kind}"
            );
            let read = ReadError::from(clone_of(&e));
            assert_eq!(read.kind(), kind);
            assert_eq!(
                matches!(read, ReadError::Unavailable { .. }),
                kind == "database_unavailable"
            );
            let opened = OpenError::from(clone_of(&e));
            assert_eq!(opened.kind(), kind);
            assert_eq!(StoreError::from(opened).kind(), kind);
            assert_eq!(
                append.into_store_error().map(|e| e.kind()).ok(),
                Some(kind),
                "an erasure's upkeep keeps the kind"
            );
        }
    }

    /// A copy of a store error for the test above (an I/O error's source is not `Clone`).
    fn clone_of(e: &StoreError) -> StoreError {
        match e {
            StoreError::Io {
                operation,
                path,
                offset,
                source,
            } => StoreError::io(
                operation,
                path.clone(),
                *offset,
                io::Error::new(source.kind(), "x"),
            ),
            StoreError::Corrupt {
                path,
                offset,
                reason,
            } => StoreError::Corrupt {
                path: path.clone(),
                offset: *offset,
                reason: reason.clone(),
            },
            StoreError::Locked { path } => StoreError::Locked { path: path.clone() },
            StoreError::Poisoned { reason } => StoreError::Poisoned {
                reason: reason.clone(),
            },
            StoreError::Closed => StoreError::Closed,
            StoreError::InvalidOption(r) => StoreError::InvalidOption(r.clone()),
            StoreError::Unavailable { reason } => StoreError::Unavailable {
                reason: reason.clone(),
            },
            StoreError::OutcomeUnknown { reason } => StoreError::OutcomeUnknown {
                reason: reason.clone(),
            },
            StoreError::DiskFull { reason } => StoreError::DiskFull {
                reason: reason.clone(),
            },
            StoreError::Database(r) => StoreError::Database(r.clone()),
            StoreError::Copy(r) => StoreError::Copy(r.clone()),
            StoreError::Backup(r) => StoreError::Backup(r.clone()),
            StoreError::Subjects(r) => StoreError::Subjects(r.clone()),
        }
    }
}
