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
//! answers as it is (the server's `"kind"`), its `index` the event it concerns, when one does,
//! and its `violations` what was wrong with each event, when a check judges them one by one.
//!
//! A check whose rules live in the log itself (event schemas, `crate::registry`) reads them
//! through [`Admitting::log`], and answers with the rules' position as a [`Fence`]: the writer
//! stores the append only if no event of the fence's types came after it, so that an append
//! judged by rules that changed before it was stored is answered
//! [`AppendError::AdmissionChanged`](crate::AppendError::AdmissionChanged) and stores nothing.

/// The types of the events that hold the event-schema registry (`crate::registry`): a version
/// of a type's schema, a type's enforcement, the store-wide policy. Only the registry appends
/// them (as events carried past admission); a client's append of one is refused as
/// [`InputError::ReservedType`](crate::InputError::ReservedType), with or without the registry.
pub const REGISTRY_TYPES: [&str; 3] = [
    "annals.SchemaVersion",
    "annals.SchemaEnforcement",
    "annals.SchemaPolicy",
];

/// Whether `event_type` is one of [`REGISTRY_TYPES`].
pub fn is_registry_type(event_type: &str) -> bool {
    event_type.starts_with("annals.Schema") && REGISTRY_TYPES.contains(&event_type)
}

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

/// An append as an admission check sees it: its events in order, the tracking position
/// recorded with them (its source and position), if any, and the log it goes to. Made only for
/// a store with a check.
pub struct Admitting<'a> {
    pub events: Vec<Candidate<'a>>,
    pub tracking: Option<(&'a str, u64)>,
    /// The store the append goes to, for a check whose rules are events in it.
    pub log: &'a dyn LogView,
}

impl std::fmt::Debug for Admitting<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitting")
            .field("events", &self.events)
            .field("tracking", &self.tracking)
            .finish_non_exhaustive()
    }
}

/// What an admission check may read of the log: its head, and the events of some types after
/// a position (the store's own records, which are few: never a client's whole history).
pub trait LogView {
    /// The last position readers see.
    fn head(&self) -> u64;
    /// The first position after `after` holding an event of `types`, from the index: cheap.
    fn first_of_types_after(&self, types: &[&str], after: u64) -> Option<u64>;
    /// The events of `types` after `after` up to the head, in order.
    fn events_of_types(&self, types: &[&str], after: u64) -> Result<Vec<Recorded>, String>;
    /// The type of the event at `position`; None when the log holds none there.
    fn type_at(&self, position: u64) -> Result<Option<String>, String>;
}

/// An event as [`LogView::events_of_types`] answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub position: u64,
    pub event_type: String,
    pub data: Vec<u8>,
}

/// What an admission check answers for an append it admits: the rules' fence, if its rules
/// live in the log (see the module's doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admitted {
    pub fence: Option<Fence>,
}

/// The append is stored only if no event matching one of `items` came after `after`: the
/// position of the rules that admitted it. Checked by the writer as a condition is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub items: Vec<FenceItem>,
    pub after: u64,
}

/// Events of one of `types` carrying every tag of `tags` (a query item).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceItem {
    pub types: Vec<String>,
    pub tags: Vec<String>,
}

impl Fence {
    /// One fence holding both: every item of either, after the earlier position.
    pub fn join(self, other: Fence) -> Fence {
        let mut items = self.items;
        for item in other.items {
            if !items.contains(&item) {
                items.push(item);
            }
        }
        Fence {
            items,
            after: self.after.min(other.after),
        }
    }
}

/// What was wrong with one event, as a check that judges each event against a JSON Schema
/// finds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Violation {
    /// The event's place in the append, from 0.
    pub index: usize,
    pub event_type: String,
    /// The schema version it was checked against.
    pub version: u32,
    /// Where in the event's data, as a JSON Pointer ("" for the whole).
    pub instance_path: String,
    /// Which keyword of the schema, as a JSON Pointer.
    pub schema_path: String,
    pub message: String,
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
    /// Each event's faults, when the check judges events one by one; may be empty.
    pub violations: Vec<Violation>,
}

impl Refusal {
    pub fn event(index: usize, kind: &'static str, reason: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            index: Some(index),
            reason: reason.into(),
            violations: Vec::new(),
        }
    }

    pub fn append(kind: &'static str, reason: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            index: None,
            reason: reason.into(),
            violations: Vec::new(),
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
    fn admit(&self, append: &Admitting<'_>) -> Result<Admitted, Refusal>;
}

/// Several checks, run in order; the first refusal stands, and the fences are joined.
impl Admission for Vec<std::sync::Arc<dyn Admission>> {
    fn admit(&self, append: &Admitting<'_>) -> Result<Admitted, Refusal> {
        let mut fence: Option<Fence> = None;
        for check in self {
            if let Some(f) = check.admit(append)?.fence {
                fence = Some(match fence {
                    Some(before) => before.join(f),
                    None => f,
                });
            }
        }
        Ok(Admitted { fence })
    }
}
