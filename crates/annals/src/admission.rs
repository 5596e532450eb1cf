//! The admission step: every check an append must pass before it is sealed and takes its
//! route, beyond the store's own limits, in one place. A check is given as
//! [`Options::admission`](crate::Options::admission) and runs on the caller's thread, after the
//! append is encoded (its limits checked) and before its data is sealed for a data subject, so
//! that it sees what the client sent. Appends carried from history (a copy, a restore, a
//! replica taking in its backup) and the store's own erasure receipts are not admitted again:
//! they were admitted when they were first made.
//!
//! A refusal is an [`InputError::NotAdmitted`](crate::InputError::NotAdmitted): the whole
//! append is refused and nothing of it is stored. Its `kind` is a stable word a front end
//! answers as it is (the server's `"kind"`), its `index` the event it concerns, when one does.

/// One event of an append as an admission check sees it: its type, tags, data and metadata as
/// the client gave them.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// Its place in the append, from 0.
    pub index: usize,
    pub event_type: &'a str,
    pub tags: Vec<&'a str>,
    pub data: &'a [u8],
    /// Empty when the event has none.
    pub metadata: &'a [u8],
}

/// An append as an admission check sees it: its events in order, and the tracking position
/// recorded with them (its source and position), if any. Made only for a store with a check.
#[derive(Debug, Clone)]
pub struct Admitting<'a> {
    pub events: Vec<Candidate<'a>>,
    pub tracking: Option<(&'a str, u64)>,
}

/// Why an admission check refused an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// A stable word for what was wrong (`reserved_type`, `metadata_too_deep`, ...), which
    /// front ends answer as the error's kind.
    pub kind: &'static str,
    /// The event concerned, when one is.
    pub index: Option<usize>,
    /// What was wrong, for people.
    pub reason: String,
}

impl Refusal {
    pub fn event(index: usize, kind: &'static str, reason: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            index: Some(index),
            reason: reason.into(),
        }
    }

    pub fn append(kind: &'static str, reason: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            index: None,
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.index {
            Some(index) => write!(f, "event {index}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

/// A check every append made through the store must pass (see the module's doc). Checks run
/// on callers' threads, several at once: they hold no lock a reader or the writer takes.
pub trait Admission: Send + Sync + std::fmt::Debug {
    fn admit(&self, append: &Admitting<'_>) -> Result<(), Refusal>;
}

/// Several checks, run in order; the first refusal stands.
impl Admission for Vec<std::sync::Arc<dyn Admission>> {
    fn admit(&self, append: &Admitting<'_>) -> Result<(), Refusal> {
        self.iter().try_for_each(|check| check.admit(append))
    }
}
