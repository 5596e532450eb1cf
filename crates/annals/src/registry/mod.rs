//! Event schemas (feature `event-schemas`): per event type, a list of versions, each a JSON
//! Schema (2020-12 or draft 7), and an enforcement (`reject`, the default once a schema
//! exists; `warn`; `off`); store-wide, whether types without a schema are allowed (the
//! default) or refused.
//!
//! The registry lives in the log, as events of [`REGISTRY_TYPES`](crate::admission::REGISTRY_TYPES)
//! that only the registry appends: every server of a PostgreSQL store, a replica, a backup, a
//! restore and a copy carry it, and each version has a position. A [`Registry`] is the store's
//! admission check ([`crate::Options::admission`]): it catches up with those events when the
//! log moved, judges each event of an append against its type's newest version, and fences the
//! append at the registry's position, so that an append judged by a version that a newer one
//! replaced before it was stored stores nothing ([`crate::AppendError::AdmissionChanged`]).
//! Hence the version an event was checked against is the newest registered before its position
//! ([`Registry::checked_against`]).
//!
//! A new version is checked against the stored events of its type before it is registered
//! (`history.rs`): its registration is appended on the condition that no event of the type
//! (and no registry event) came after the last one checked.
//!
//! What is judged is an event's data, parsed as JSON; its metadata and tags are not. Appends
//! carried from history (a copy, a restore, a replica) are not judged again. Upcasting (reading
//! old shapes as new ones) is the clients' business.

mod compile;
mod history;
mod instance;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::admission::{
    Admission, Admitted, Admitting, Fence, FenceItem, LogView, Refusal, Violation, REGISTRY_TYPES,
};
use crate::error::AppendError;
use instance::{Borrowed, Instance};

pub use compile::SCHEMA_BYTES_MAX;
pub use history::{HistoryCheck, HistoryFailure, Progress, Registered, Registration};

const VERSION_TYPE: &str = REGISTRY_TYPES[0];
const ENFORCEMENT_TYPE: &str = REGISTRY_TYPES[1];
const POLICY_TYPE: &str = REGISTRY_TYPES[2];

/// Errors a single event's validation reports at most; an append's refusal holds at most
/// [`VIOLATIONS_MAX`].
const ERRORS_PER_EVENT_MAX: usize = 8;
const VIOLATIONS_MAX: usize = 64;
/// Faults written in a refusal's text at most, and the bytes of each message.
const FAULTS_IN_TEXT: usize = 16;
const MESSAGE_MAX: usize = 240;

/// How a type's schema is applied to appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// An append with an event that fails is refused whole.
    Reject,
    /// Stored, counted and logged.
    Warn,
    /// Not checked.
    Off,
}

/// Whether the store takes events of types that have no schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum UnknownTypes {
    #[default]
    Allow,
    Refuse,
}

/// One version of a type's schema.
#[derive(Debug, Clone, Serialize)]
pub struct SchemaVersion {
    pub version: u32,
    /// The position of its registration.
    pub position: u64,
    /// "2020-12" or "draft-07".
    pub draft: &'static str,
    pub schema: Value,
    /// How its stored events were checked before it was registered, and how many.
    pub check: HistoryCheck,
    pub checked_events: u64,
    /// When it was registered, in microseconds since the Unix epoch.
    pub registered_at_us: u64,
}

/// A type's schemas and enforcement.
#[derive(Debug, Clone, Serialize)]
pub struct TypeSchemas {
    pub event_type: String,
    pub enforcement: Enforcement,
    /// Oldest first.
    pub versions: Vec<SchemaVersion>,
}

/// What an event was checked against when it was appended (see [`Registry::checked_against`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CheckedAgainst {
    pub version: u32,
    /// `Reject`: the event fits that version. `Warn`: it was checked, and stored whether it
    /// fit or not.
    pub enforcement: Enforcement,
}

/// The registry's rules as the log held them through a head ([`Registry::checked`]): which
/// version each event up to that head was checked against.
#[derive(Debug, Clone)]
pub struct Checked {
    rules: Arc<Rules>,
    through: u64,
    /// Types never judged ([`Registry::exempting`]), whatever the rules hold for them.
    exempt: Arc<[String]>,
}

impl Checked {
    /// The head these rules answer for. An event after it may have been judged by a version
    /// registered after it: take a new [`Checked`] for it.
    pub fn through(&self) -> u64 {
        self.through
    }

    /// Whether no type has a schema or an enforcement (then no event was checked).
    pub fn is_empty(&self) -> bool {
        self.rules.types.is_empty()
    }

    /// What an event of `event_type` at `position` (at most [`Checked::through`]) was checked
    /// against when it was appended: the newest version registered before it, under the
    /// enforcement in force then. None when its type had no schema then, or its enforcement
    /// was `off`.
    pub fn of(&self, event_type: &str, position: u64) -> Option<CheckedAgainst> {
        assert!(
            position <= self.through,
            "asked about position {position} of rules through {}",
            self.through
        );
        let t = self.rules.types.get(event_type)?;
        if self.exempt.iter().any(|e| e == event_type) {
            return None;
        }
        let version = t
            .versions
            .iter()
            .rev()
            .find(|v| v.listed.position < position)?;
        match t.enforcement_at(position) {
            Enforcement::Off => None,
            enforcement => Some(CheckedAgainst {
                version: version.listed.version,
                enforcement,
            }),
        }
    }
}

/// Counts since the registry was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RegistryStats {
    /// Events checked on append.
    pub checked: u64,
    /// Events that failed under `reject` (their appends refused).
    pub refused: u64,
    /// Events that failed under `warn` (stored).
    pub warned: u64,
    /// Appends refused because a type had no schema and the store refuses those.
    pub unknown_refused: u64,
}

/// Why the registry refused a request. Nothing was registered.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// An event type that is empty, too long, has control characters, or is the store's own.
    #[error("invalid event type: {0}")]
    InvalidType(String),
    #[error("invalid JSON Schema: {0}")]
    InvalidSchema(String),
    #[error(
        "unknown JSON Schema draft {0:?}: the registry takes 2020-12 \
         (https://json-schema.org/draft/2020-12/schema, the default) and draft 7 \
         (http://json-schema.org/draft-07/schema)"
    )]
    UnknownDraft(String),
    #[error("the schema is {bytes} bytes of JSON; the limit is {max}")]
    SchemaTooLarge { bytes: usize, max: usize },
    /// The version asked for is not the next: another registration took it.
    #[error(
        "version {asked} of {event_type:?} cannot be registered: the newest is {newest} (another \
         registration came first?); ask for version {}", newest + 1
    )]
    VersionTaken {
        event_type: String,
        asked: u32,
        newest: u32,
    },
    /// Stored events of the type do not fit the new version.
    #[error("{0}")]
    History(Box<HistoryFailure>),
    /// The type has no schema (an enforcement set on it, a version shown).
    #[error("the event type {0:?} has no schema")]
    NotFound(String),
    /// The registry's event could not be appended.
    #[error("the registration was not appended: {0}")]
    Append(#[from] AppendError),
    /// The log could not be read.
    #[error("the registry could not read the log: {0}")]
    Read(String),
    /// The log kept moving under a registration: nothing was registered; try again.
    #[error("{0}")]
    Busy(String),
    /// No event is stored at the position asked about.
    #[error("no event is stored at position {0}")]
    NoEvent(u64),
    /// The event at the position asked about is of another type.
    #[error("the event at position {position} is of type {found:?}, not {asked:?}")]
    OtherType {
        position: u64,
        asked: String,
        found: String,
    },
}

impl RegistryError {
    /// A stable word for what went wrong, as the server's error kinds.
    pub fn kind(&self) -> &'static str {
        match self {
            RegistryError::InvalidType(_) => "invalid_type",
            RegistryError::InvalidSchema(_) => "invalid_schema",
            RegistryError::UnknownDraft(_) => "unknown_draft",
            RegistryError::SchemaTooLarge { .. } => "schema_too_large",
            RegistryError::VersionTaken { .. } => "version_taken",
            RegistryError::History(_) => "history_violation",
            RegistryError::NotFound(_) => "schema_not_found",
            RegistryError::Append(e) => e.kind(),
            RegistryError::Read(_) => "read",
            RegistryError::Busy(_) => "registry_busy",
            RegistryError::NoEvent(_) => "no_event",
            RegistryError::OtherType { .. } => "other_type",
        }
    }
}

/// The registry's events, as stored (JSON).
#[derive(Debug, Serialize, Deserialize)]
struct VersionRecord {
    event_type: String,
    version: u32,
    schema: Value,
    check: HistoryCheck,
    checked_events: u64,
    registered_at_us: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct EnforcementRecord {
    event_type: String,
    enforcement: Enforcement,
}

#[derive(Debug, Serialize, Deserialize)]
struct PolicyRecord {
    unknown_types: UnknownTypes,
}

/// A version held in memory: what is listed, and its validator, or why it has none (a schema
/// carried from a log whose registry compiled what this build cannot).
#[derive(Debug, Clone)]
struct HeldVersion {
    listed: SchemaVersion,
    validator: Result<Arc<jsonschema::Validator<Borrowed>>, String>,
}

#[derive(Debug, Default, Clone)]
struct TypeState {
    versions: Vec<HeldVersion>,
    /// Each change of enforcement, by position; `Reject` before the first.
    enforcement: Vec<(u64, Enforcement)>,
}

impl TypeState {
    fn enforcement_at(&self, position: u64) -> Enforcement {
        self.enforcement
            .iter()
            .rev()
            .find(|(p, _)| *p < position)
            .map_or(Enforcement::Reject, |(_, e)| *e)
    }

    fn enforcement(&self) -> Enforcement {
        self.enforcement_at(u64::MAX)
    }

    fn newest(&self) -> Option<&HeldVersion> {
        self.versions.last()
    }
}

/// The registry's rules as of `applied_through`, the position of the last registry event
/// applied: a new value is made when one comes (rarely), and appends are judged by the value
/// they took, holding no lock.
#[derive(Debug, Default, Clone)]
struct Rules {
    applied_through: u64,
    types: HashMap<String, TypeState>,
    unknown_types: UnknownTypes,
}

/// The event-schema registry of one store (see the module's doc). Give it to the store as its
/// admission check, then pass that store to its methods:
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// let registry = Arc::new(annals::registry::Registry::new());
/// let mut options = annals::Options::default();
/// options.admission = Some(registry.clone());
/// let store = annals::Store::open("data", options)?;
/// let schema = serde_json::json!({"type": "object", "required": ["id"]});
/// registry.register(&store, annals::registry::Registration::new("Opened", schema), &mut |_| {})?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct Registry {
    rules: RwLock<Arc<Rules>>,
    /// The head through which the log was looked at for registry events: none after the rules'
    /// `applied_through` up to it.
    seen: AtomicU64,
    /// Types never judged nor fenced: those of the store's own journals (an exchange's).
    exempt: Arc<[String]>,
    /// One registration at a time in this process; the log's condition orders them across
    /// processes.
    registering: Mutex<()>,
    checked: AtomicU64,
    refused: AtomicU64,
    warned: AtomicU64,
    unknown_refused: AtomicU64,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// A registry that never judges events of `types` nor takes a schema for them: the types
    /// of a journal the store's own code writes (the hosted exchange's), whose appends must
    /// not fail on a schema an operator registers.
    pub fn exempting<S: Into<String>>(types: impl IntoIterator<Item = S>) -> Registry {
        Registry {
            exempt: types.into_iter().map(Into::into).collect(),
            ..Registry::default()
        }
    }

    pub(crate) fn is_exempt(&self, event_type: &str) -> bool {
        self.exempt.iter().any(|t| t == event_type)
    }

    /// Every type with a schema (or an enforcement), sorted by name, as the log holds them now.
    pub fn types(&self, log: &dyn LogView) -> Result<Vec<TypeSchemas>, RegistryError> {
        let state = self.catch_up(log)?;
        let sorted: BTreeMap<&String, &TypeState> = state.types.iter().collect();
        Ok(sorted
            .into_iter()
            .map(|(name, t)| listed(name, t))
            .collect())
    }

    /// One type's schemas; None when it has none.
    pub fn schemas_of(
        &self,
        log: &dyn LogView,
        event_type: &str,
    ) -> Result<Option<TypeSchemas>, RegistryError> {
        let state = self.catch_up(log)?;
        Ok(state.types.get(event_type).map(|t| listed(event_type, t)))
    }

    /// Whether types without a schema are taken.
    pub fn unknown_types(&self, log: &dyn LogView) -> Result<UnknownTypes, RegistryError> {
        Ok(self.catch_up(log)?.unknown_types)
    }

    /// The version the event at `position`, which must be of `event_type`, was checked
    /// against when it was appended: the newest registered before it, under the enforcement
    /// then in force. None when the type had no schema then, or its enforcement was `off`.
    /// (An event carried from another log was checked there, against the same registry.)
    pub fn checked_against(
        &self,
        log: &dyn LogView,
        event_type: &str,
        position: u64,
    ) -> Result<Option<CheckedAgainst>, RegistryError> {
        match log.type_at(position).map_err(RegistryError::Read)? {
            None => Err(RegistryError::NoEvent(position)),
            Some(found) if found != event_type => Err(RegistryError::OtherType {
                position,
                asked: event_type.into(),
                found,
            }),
            Some(_) => Ok(self.checked(log)?.of(event_type, position)),
        }
    }

    /// The registry as the log holds it now: what each stored event was checked against,
    /// for a reader to tell with each event it reads.
    pub fn checked(&self, log: &dyn LogView) -> Result<Checked, RegistryError> {
        // Read first: the rules caught up after it cover every registry event up to it.
        let through = log.head();
        let rules = self.catch_up(log)?;
        Ok(Checked {
            rules,
            through,
            exempt: self.exempt.clone(),
        })
    }

    /// Counts since the registry was made.
    pub fn stats(&self) -> RegistryStats {
        RegistryStats {
            checked: self.checked.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            warned: self.warned.load(Ordering::Relaxed),
            unknown_refused: self.unknown_refused.load(Ordering::Relaxed),
        }
    }

    /// Sets how `event_type`'s schema is applied; it must have one. Answers the position of
    /// the change (or of the one in force, when it is the same).
    pub fn set_enforcement(
        &self,
        store: &crate::Store,
        event_type: &str,
        enforcement: Enforcement,
    ) -> Result<u64, RegistryError> {
        let _one = self.registering.lock();
        {
            let state = self.catch_up(store)?;
            let Some(t) = state
                .types
                .get(event_type)
                .filter(|t| !t.versions.is_empty())
            else {
                return Err(RegistryError::NotFound(event_type.into()));
            };
            if t.enforcement() == enforcement {
                return Ok(t
                    .enforcement
                    .last()
                    .map_or(t.versions[0].listed.position, |e| e.0));
            }
        }
        let record = EnforcementRecord {
            event_type: event_type.into(),
            enforcement,
        };
        self.append_record(store, ENFORCEMENT_TYPE, &record)
    }

    /// Sets whether types without a schema are taken. Answers the position of the change
    /// (0 when nothing changed).
    pub fn set_unknown_types(
        &self,
        store: &crate::Store,
        unknown_types: UnknownTypes,
    ) -> Result<u64, RegistryError> {
        let _one = self.registering.lock();
        if self.unknown_types(store)? == unknown_types {
            return Ok(0);
        }
        self.append_record(store, POLICY_TYPE, &PolicyRecord { unknown_types })
    }

    /// Appends one of the registry's events (carried past admission, which refuses them from
    /// clients) and takes it in.
    fn append_record(
        &self,
        store: &crate::Store,
        event_type: &str,
        record: &impl Serialize,
    ) -> Result<u64, RegistryError> {
        let data = serde_json::to_vec(record).expect("a registry record serialises");
        let event = crate::NewEvent::new(event_type, data);
        let options = crate::AppendOptions {
            carried: true,
            ..crate::AppendOptions::default()
        };
        let position = store
            .appending(std::slice::from_ref(&event))
            .options(options)
            .wait()?;
        self.catch_up(store)?;
        Ok(position)
    }

    /// The rules as the log holds them now: the registry's events beyond those applied are
    /// applied first, if the index shows any.
    fn catch_up(&self, log: &dyn LogView) -> Result<Arc<Rules>, RegistryError> {
        let head = log.head();
        // `seen` before the rules: the rules are replaced before `seen` is raised, so rules
        // read after a `seen` at or past the head hold every registry event up to it.
        let seen = self.seen.load(Ordering::Acquire);
        let rules = self.rules.read().clone();
        if head < rules.applied_through {
            // A log behind the rules is not the one they came from (a registry given to
            // another store): start over.
            *self.rules.write() = Arc::new(Rules::default());
            self.seen.store(0, Ordering::Release);
            return self.catch_up(log);
        }
        if head <= seen {
            return Ok(rules);
        }
        if log
            .first_of_types_after(&REGISTRY_TYPES, rules.applied_through)
            .is_none()
        {
            self.seen.fetch_max(head, Ordering::AcqRel);
            return Ok(rules);
        }
        let mut slot = self.rules.write();
        let mut next = (**slot).clone();
        for recorded in log
            .events_of_types(&REGISTRY_TYPES, next.applied_through)
            .map_err(RegistryError::Read)?
        {
            if recorded.position > next.applied_through {
                apply(&mut next, &recorded);
                next.applied_through = recorded.position;
            }
        }
        let next = Arc::new(next);
        *slot = next.clone();
        drop(slot);
        self.seen.fetch_max(head, Ordering::AcqRel);
        Ok(next)
    }

    /// Judges one append's events (see [`Admission::admit`]).
    fn judge(&self, state: &Rules, append: &Admitting<'_>) -> Result<(), Refusal> {
        let mut violations: Vec<Violation> = Vec::new();
        let mut unknown = None;
        let mut failing = std::collections::BTreeSet::new();
        for event in append
            .events
            .iter()
            .filter(|e| !self.is_exempt(e.event_type))
        {
            let Some(t) = state.types.get(event.event_type) else {
                if state.unknown_types == UnknownTypes::Refuse {
                    unknown.get_or_insert(event.index);
                    failing.insert(event.index);
                    push(
                        &mut violations,
                        Violation {
                            index: event.index,
                            event_type: event.event_type.into(),
                            version: 0,
                            instance_path: String::new(),
                            schema_path: String::new(),
                            message: "the type has no schema, and this store refuses types \
                                      without one"
                                .into(),
                        },
                    );
                }
                continue;
            };
            let Some(newest) = t.newest() else { continue };
            let enforcement = t.enforcement();
            if enforcement == Enforcement::Off {
                continue;
            }
            self.checked.fetch_add(1, Ordering::Relaxed);
            let found = validate(newest, event.index, event.event_type, event.data);
            if found.is_empty() {
                continue;
            }
            match enforcement {
                Enforcement::Warn => {
                    self.warned.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        event_type = event.event_type,
                        version = newest.listed.version,
                        index = event.index,
                        error = %found[0].message,
                        "an event does not fit its schema; stored (enforcement: warn)"
                    );
                }
                _ => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    failing.insert(event.index);
                    for v in found {
                        push(&mut violations, v);
                    }
                }
            }
        }
        if violations.is_empty() {
            return Ok(());
        }
        if unknown.is_some() {
            self.unknown_refused.fetch_add(1, Ordering::Relaxed);
        }
        // The faults in the text too, as UmaDB's clients show only an error's message; within
        // what a gRPC status carries in its headers.
        let mut faults: Vec<String> = violations
            .iter()
            .take(FAULTS_IN_TEXT)
            .map(|v| {
                let schema = match v.schema_path.is_empty() {
                    true => String::new(),
                    false => format!(" (schema {})", v.schema_path),
                };
                format!(
                    "event {} ({} v{}) at {}{schema}: {}",
                    v.index,
                    v.event_type,
                    v.version,
                    compile::pointer(&v.instance_path),
                    v.message
                )
            })
            .collect();
        if violations.len() > FAULTS_IN_TEXT {
            faults.push(format!("and {} more", violations.len() - FAULTS_IN_TEXT));
        }
        let reason = format!(
            "{} of the append's events do not fit their schemas; nothing was appended: {}",
            failing.len(),
            faults.join("; ")
        );
        Err(Refusal {
            kind: "schema_violation",
            index: None,
            reason,
            violations,
        })
    }
}

impl Admission for Registry {
    fn admit(&self, append: &Admitting<'_>) -> Result<Admitted, Refusal> {
        if let Some(index) = append
            .events
            .iter()
            .position(|e| crate::admission::is_registry_type(e.event_type))
        {
            return Err(Refusal::event(
                index,
                "reserved_type",
                "the schema registry's event types are the store's own",
            ));
        }
        if append.events.iter().all(|e| self.is_exempt(e.event_type)) {
            return Ok(Admitted::default());
        }
        let rules = self.catch_up(append.log).map_err(|e| {
            Refusal::append(
                "schema_unavailable",
                format!("the schemas could not be read, so nothing was appended: {e}"),
            )
        })?;
        self.judge(&rules, append)?;
        // Stored only if no registry event came after the rules it was judged by. One fence
        // for every type: a registration is rare, and an append it overtakes is judged again;
        // a fence per type (a tag on the registry's events) cost the writer a sixth of its
        // rate (docs/DECISIONS.md, R43).
        Ok(Admitted {
            fence: Some(Fence {
                items: vec![FenceItem {
                    types: REGISTRY_TYPES.iter().map(|t| t.to_string()).collect(),
                    tags: Vec::new(),
                }],
                after: rules.applied_through,
            }),
        })
    }
}

/// A fault's message, cut: a validator's message may quote the whole event.
fn cut(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    message
}

fn push(violations: &mut Vec<Violation>, violation: Violation) {
    if violations.len() < VIOLATIONS_MAX {
        violations.push(violation);
    }
}

/// What is wrong with `data` under `held`; empty when it fits.
fn validate(held: &HeldVersion, index: usize, event_type: &str, data: &[u8]) -> Vec<Violation> {
    let version = held.listed.version;
    let violation = |instance_path: String, schema_path: String, message: String| Violation {
        index,
        event_type: event_type.into(),
        version,
        instance_path,
        schema_path,
        message,
    };
    let validator = match &held.validator {
        Ok(v) => v,
        Err(reason) => {
            return vec![violation(
                String::new(),
                String::new(),
                format!("its schema cannot be applied by this server: {reason}"),
            )]
        }
    };
    let instance = match Instance::parse(data) {
        Ok(v) => v,
        Err(e) => {
            return vec![violation(
                String::new(),
                String::new(),
                format!("the data is not JSON ({e})"),
            )]
        }
    };
    if validator.is_valid(&instance) {
        return Vec::new();
    }
    validator
        .iter_errors(&instance)
        .take(ERRORS_PER_EVENT_MAX)
        .map(|e| {
            violation(
                e.instance_path().to_string(),
                e.schema_path().to_string(),
                cut(e.to_string()),
            )
        })
        .collect()
}

fn listed(name: &str, t: &TypeState) -> TypeSchemas {
    TypeSchemas {
        event_type: name.into(),
        enforcement: t.enforcement(),
        versions: t.versions.iter().map(|v| v.listed.clone()).collect(),
    }
}

/// Applies one of the registry's events. One that does not parse (it cannot come from this
/// registry) is logged and passed over.
fn apply(state: &mut Rules, recorded: &crate::admission::Recorded) {
    let position = recorded.position;
    let parsed = match recorded.event_type.as_str() {
        VERSION_TYPE => serde_json::from_slice::<VersionRecord>(&recorded.data).map(|r| {
            let (draft, validator) = match compile::compile(r.schema.clone()) {
                Ok(c) => (c.draft, Ok(c.validator)),
                Err(e) => ("unknown", Err(e.to_string())),
            };
            let t = state.types.entry(r.event_type).or_default();
            let next = t.versions.last().map_or(1, |v| v.listed.version + 1);
            if r.version != next {
                // Only an import of another log's registry into this one could put it here.
                tracing::error!(
                    position,
                    version = r.version,
                    expected = next,
                    "a schema version out of sequence; passed over"
                );
                return;
            }
            t.versions.push(HeldVersion {
                listed: SchemaVersion {
                    version: r.version,
                    position,
                    draft,
                    schema: r.schema,
                    check: r.check,
                    checked_events: r.checked_events,
                    registered_at_us: r.registered_at_us,
                },
                validator,
            });
        }),
        ENFORCEMENT_TYPE => serde_json::from_slice::<EnforcementRecord>(&recorded.data).map(|r| {
            let t = state.types.entry(r.event_type).or_default();
            t.enforcement.push((position, r.enforcement));
        }),
        POLICY_TYPE => serde_json::from_slice::<PolicyRecord>(&recorded.data)
            .map(|r| state.unknown_types = r.unknown_types),
        _ => Ok(()),
    };
    if let Err(e) = parsed {
        tracing::error!(position, error = %e, "a schema registry event does not parse; passed over");
    }
}
