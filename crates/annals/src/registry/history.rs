//! Registering a version: the schema compiled, then every stored event of its type checked
//! against it (or only those the previous version accepted), then its registration appended on
//! the condition that no event of the type, and no registry event, came after the last one
//! checked. A lost race checks what came since and tries again.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    compile, validate, HeldVersion, Registry, RegistryError, SchemaVersion, VersionRecord,
    VERSION_TYPE,
};
use crate::admission::{Violation, REGISTRY_TYPES};
use crate::{AppendCondition, AppendError, Query, QueryItem, ReadOptions, Store};

/// Which stored events a new version must accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryCheck {
    /// Every stored event of the type.
    #[default]
    Stored,
    /// Those the previous version accepts (events stored under `warn` or `off` that it did not
    /// accept are passed over); every stored event for a first version.
    PreviouslyAccepted,
}

/// A version to register.
#[derive(Debug, Clone)]
pub struct Registration {
    pub event_type: String,
    pub schema: Value,
    pub check: HistoryCheck,
    /// The version it must become: refused with [`RegistryError::VersionTaken`] when that is
    /// not the next. None: the next.
    pub version: Option<u32>,
    /// Check, and register nothing.
    pub dry_run: bool,
}

impl Registration {
    pub fn new(event_type: impl Into<String>, schema: Value) -> Registration {
        Registration {
            event_type: event_type.into(),
            schema,
            check: HistoryCheck::Stored,
            version: None,
            dry_run: false,
        }
    }
}

/// How far a history check is, as [`Registry::register`] reports it now and then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// Events of the type checked so far.
    pub checked: u64,
    /// Of those, how many fail.
    pub failed: u64,
    /// The position reached, and the log's head when the check began.
    pub position: u64,
    pub head: u64,
}

/// What a registration did.
#[derive(Debug, Clone, Serialize)]
pub struct Registered {
    pub event_type: String,
    pub version: u32,
    /// The registration's position; None for a dry run.
    pub position: Option<u64>,
    /// Events of the type checked, and events passed over (by `previously_accepted`).
    pub checked_events: u64,
    pub passed_over: u64,
    /// The schema is the newest version's already: nothing was registered.
    pub unchanged: bool,
    pub dry_run: bool,
}

/// Stored events that a new version refuses: the first of them with their faults.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryFailure {
    pub event_type: String,
    pub version: u32,
    pub checked: u64,
    pub failed: u64,
    /// At most [`FAILURES_SHOWN`] events, in order.
    pub events: Vec<FailedEvent>,
}

/// A stored event a new version refuses.
#[derive(Debug, Clone, Serialize)]
pub struct FailedEvent {
    pub position: u64,
    pub errors: Vec<Violation>,
}

/// Stored events named in a refusal at most.
pub const FAILURES_SHOWN: usize = 10;

impl std::fmt::Display for HistoryFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "version {} of {:?} refuses {} of the {} stored events checked",
            self.version, self.event_type, self.failed, self.checked
        )?;
        if let Some(first) = self.events.first() {
            if let Some(e) = first.errors.first() {
                write!(
                    f,
                    "; the first, at position {}, at {}: {}",
                    first.position,
                    compile::pointer(&e.instance_path),
                    e.message
                )?;
            }
        }
        Ok(())
    }
}

/// How often progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Registration attempts before giving up on a log that keeps taking events of the type.
const ATTEMPTS_MAX: u32 = 16;

impl Registry {
    /// Registers a new version of a type's schema, checked first against the type's stored
    /// events (see the module's doc); `progress` hears how far the check is now and then. A
    /// schema equal to the newest version's registers nothing (`unchanged`), so that schemas
    /// loaded at every start are registered once.
    pub fn register(
        &self,
        store: &Store,
        registration: Registration,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Registered, RegistryError> {
        check_type(store, &registration.event_type)?;
        let compiled = compile::compile(registration.schema)?;
        if self.is_exempt(&registration.event_type) {
            return Err(RegistryError::InvalidType(format!(
                "{:?} is written by the store's own journal (the hosted exchange's) and takes no \
                 schema",
                registration.event_type
            )));
        }
        // A replica takes no registration: refused before the history is read (a dry run is
        // a read, and a replica answers it).
        if let Some(refusal) = store.appends_refusal().filter(|_| !registration.dry_run) {
            return Err(RegistryError::Append(refusal.into()));
        }
        let _one = self.registering.lock();
        let event_type = registration.event_type;
        let mut checked = 0u64;
        let mut passed_over = 0u64;
        let mut through = 0u64;
        let mut failure = HistoryFailure {
            event_type: event_type.clone(),
            version: 0,
            checked: 0,
            failed: 0,
            events: Vec::new(),
        };
        for _ in 0..ATTEMPTS_MAX {
            // The head first, then the rules: every registry event through the head is in
            // them, and the condition below covers what comes after.
            let head = store.head();
            let (previous, version) = {
                let state = self.catch_up(store)?;
                let previous = state
                    .types
                    .get(&event_type)
                    .and_then(|t| t.newest().cloned());
                let newest = previous.as_ref().map_or(0, |v| v.listed.version);
                let same = previous.as_ref().filter(|p| {
                    p.listed.schema == *compiled.schema
                        && registration.version.is_none_or(|v| v == p.listed.version)
                });
                if let Some(p) = same {
                    return Ok(Registered {
                        event_type,
                        version: p.listed.version,
                        position: Some(p.listed.position),
                        checked_events: 0,
                        passed_over: 0,
                        unchanged: true,
                        dry_run: registration.dry_run,
                    });
                }
                match registration.version {
                    Some(asked) if asked != newest + 1 => {
                        return Err(RegistryError::VersionTaken {
                            event_type,
                            asked,
                            newest,
                        })
                    }
                    _ => (previous, newest + 1),
                }
            };
            failure.version = version;
            let held = HeldVersion {
                listed: SchemaVersion {
                    version,
                    position: 0,
                    draft: compiled.draft,
                    schema: (*compiled.schema).clone(),
                    check: registration.check,
                    checked_events: 0,
                    registered_at_us: 0,
                },
                validator: Ok(compiled.validator.clone()),
            };
            let previous = match registration.check {
                HistoryCheck::Stored => None,
                HistoryCheck::PreviouslyAccepted => previous,
            };
            let query = Query::item(QueryItem::types([event_type.as_str()]));
            let options = ReadOptions {
                after: Some(through),
                ..ReadOptions::forwards()
            };
            let mut reported = Instant::now();
            for event in store
                .read(&query, options)
                .map_err(|e| RegistryError::Read(e.to_string()))?
            {
                let event = event.map_err(|e| RegistryError::Read(e.to_string()))?;
                if event.position() > head {
                    break;
                }
                through = event.position();
                let data = event.data();
                if let Some(previous) = &previous {
                    if !validate(previous, 0, &event_type, data).is_empty() {
                        passed_over += 1;
                        continue;
                    }
                }
                checked += 1;
                let errors = validate(&held, 0, &event_type, data);
                if !errors.is_empty() {
                    failure.failed += 1;
                    if failure.events.len() < FAILURES_SHOWN {
                        failure.events.push(FailedEvent {
                            position: event.position(),
                            errors,
                        });
                    }
                }
                if reported.elapsed() >= PROGRESS_EVERY {
                    reported = Instant::now();
                    progress(Progress {
                        checked,
                        failed: failure.failed,
                        position: through,
                        head,
                    });
                }
            }
            through = through.max(head);
            progress(Progress {
                checked,
                failed: failure.failed,
                position: through,
                head,
            });
            if failure.failed > 0 {
                failure.checked = checked;
                return Err(RegistryError::History(Box::new(failure)));
            }
            if registration.dry_run {
                return Ok(Registered {
                    event_type,
                    version,
                    position: None,
                    checked_events: checked,
                    passed_over,
                    unchanged: false,
                    dry_run: true,
                });
            }
            let record = VersionRecord {
                event_type: event_type.clone(),
                version,
                schema: (*compiled.schema).clone(),
                check: registration.check,
                checked_events: checked,
                registered_at_us: now_us(),
            };
            let event = crate::NewEvent::new(
                VERSION_TYPE,
                serde_json::to_vec(&record).expect("a registry record serialises"),
            );
            // Nothing of the type and nothing of the registry after the last event checked.
            let condition = AppendCondition::new(
                Query::item(QueryItem::types([event_type.as_str()]))
                    .or(QueryItem::types(REGISTRY_TYPES)),
                Some(through),
            );
            let options = crate::AppendOptions {
                carried: true,
                ..crate::AppendOptions::default()
            };
            match store
                .appending(std::slice::from_ref(&event))
                .condition(&condition)
                .options(options)
                .wait()
            {
                Ok(position) => {
                    self.catch_up(store)?;
                    return Ok(Registered {
                        event_type,
                        version,
                        position: Some(position),
                        checked_events: checked,
                        passed_over,
                        unchanged: false,
                        dry_run: false,
                    });
                }
                // Events came since: check them (and a registry that moved) and try again.
                Err(AppendError::ConditionFailed { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RegistryError::Busy(format!(
            "events of {event_type:?} (or other registrations) kept arriving during \
             {ATTEMPTS_MAX} checks; try again"
        )))
    }
}

/// A type a schema can be registered for: one the store takes, and not the store's own.
fn check_type(store: &Store, event_type: &str) -> Result<(), RegistryError> {
    if event_type.is_empty() {
        return Err(RegistryError::InvalidType("it is empty".into()));
    }
    if crate::admission::is_registry_type(event_type)
        || event_type == crate::subject::SUBJECT_ERASED_TYPE
    {
        return Err(RegistryError::InvalidType(format!(
            "{event_type:?} is the store's own"
        )));
    }
    crate::record::validate_type(0, event_type, &store.options().limits)
        .map_err(|e| RegistryError::InvalidType(e.to_string()))
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
