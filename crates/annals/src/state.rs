//! State at a position: a state folded from the events of a query through position P, saved
//! and loaded under a canonical key. Read models' checkpoints and the exchange's snapshots are
//! kept this way, and a decision cache keeps its states by the same key.
//!
//! A saved state ([`SavedState`]) says what it is a fold of (a model's name, its version, and
//! their [`StateKey`] with the query's), the position P it was folded through, the append time
//! of the event at P, and the data subjects whose events it folded. Loading it
//! ([`States::load`]) checks it against the log before anything of it is used, and refuses it
//! with a reason ([`Unfit`]) when:
//!
//! - it is of another model, version or query;
//! - P is past the head, or the event at P no longer has that append time: the log is another
//!   one (restored from an older copy, or it lost its tail and was refilled);
//! - an erasure's receipt after P names a subject it saw: it holds data the store forgot.
//!
//! The check is in the library, so that an embedded user gets it as the server does. A state
//! must not be saved past the receipt of an erasure of a subject it saw (fold it again first):
//! loading looks only at the receipts after its position.
//!
//! The bytes are one envelope ([`SavedState::encode`]) ending in a CRC, kept as a companion
//! file of the store ([`Companions`]): in the data directory on files, in the database on
//! PostgreSQL.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use crate::companions::Companions;
use crate::error::{ReadError, StoreError};
use crate::event::Event;
use crate::query::{Query, QueryItem, ReadOptions};
use crate::store::Store;
use crate::subject::{names_subject, SUBJECT_ERASED_TYPE};

pub(crate) use crate::saved::now_us;
pub use crate::saved::{Damage, SavedState, StateId, StateKey};

/// Why a saved state was refused. Its text completes a sentence whose subject is the state
/// ("the checkpoint {unfit}").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    /// Its bytes do not decode.
    #[error("is damaged ({0})")]
    Damaged(Damage),
    /// It is another model's.
    #[error("is of the model {saved:?}, not {wanted:?}")]
    OtherName { saved: String, wanted: String },
    /// It is of another version of the model.
    #[error("is of model version {saved}, this is {wanted}")]
    OtherVersion { saved: u32, wanted: u32 },
    /// It is of another query (the same name and version, another key).
    #[error("is of another query")]
    OtherQuery,
    /// It was folded through a position the log does not reach.
    #[error("is at position {position}, but the log ends before it (head {head})")]
    BeyondHead { position: u64, head: u64 },
    /// The event at its position has another append time: another log.
    #[error(
        "was folded through an event the log no longer holds: another event is at position \
         {position}"
    )]
    Stale {
        position: u64,
        /// The append time it saved.
        saved_us: u64,
        /// The append time of the event the log holds there.
        found_us: Option<u64>,
    },
    /// A data subject whose events it folded was erased after its position.
    #[error("saw the data subject {subject}, erased since (its receipt is at position {receipt})")]
    SubjectErased { subject: String, receipt: u64 },
}

/// What [`States::load`] found under a name.
#[derive(Debug)]
pub enum Loaded {
    /// Nothing is saved under it.
    Missing,
    /// A state that fits the log.
    Fit(SavedState),
    /// A state refused, and why (it is left where it is).
    Unfit(Unfit),
    /// Bytes not in the envelope: an older format that its owner may read and hand to
    /// [`States::adopt`]; otherwise damaged ([`Damage::NotAState`]).
    Older(Vec<u8>),
}

/// The saved states of one kind (`readmodels`, `exchange`) in a store's companions.
#[derive(Clone)]
pub struct States {
    companions: Arc<dyn Companions>,
    kind: String,
}

impl States {
    /// The states of `kind` kept in `companions`.
    pub fn new(companions: Arc<dyn Companions>, kind: impl Into<String>) -> States {
        States {
            companions,
            kind: kind.into(),
        }
    }

    /// The states of `kind` kept where `store` keeps its companions.
    pub fn of_store(store: &Store, kind: impl Into<String>) -> States {
        States::new(store.companions(), kind)
    }

    /// Where `file` is kept, for messages.
    pub fn locate(&self, file: &str) -> PathBuf {
        self.companions.locate(&self.kind, file)
    }

    /// Saves `saved` as `file`, replacing what was there; once this returns, a crash keeps it.
    pub fn save(&self, file: &str, saved: &SavedState) -> Result<(), StoreError> {
        self.companions
            .write(&self.kind, file, &saved.encode())
            .map_err(|e| StoreError::io("save a state", self.locate(file), 0, e))
    }

    /// The bytes of `file` as they are, or `None` when there is none.
    pub fn read(&self, file: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.companions
            .read(&self.kind, file)
            .map_err(|e| StoreError::io("read a saved state", self.locate(file), 0, e))
    }

    /// Removes `file` (nothing when there is none).
    pub fn remove(&self, file: &str) -> Result<(), StoreError> {
        self.companions
            .remove(&self.kind, file)
            .map_err(|e| StoreError::io("remove a saved state", self.locate(file), 0, e))
    }

    /// The files of this kind, sorted.
    pub fn list(&self) -> Result<Vec<String>, StoreError> {
        self.companions
            .list(&self.kind)
            .map_err(|e| StoreError::io("list saved states", self.locate(""), 0, e))
    }

    /// The state saved as `file`, checked against `store`'s log as the fold `id` ([`check`]).
    pub fn load(&self, store: &Store, file: &str, id: &StateId) -> Result<Loaded, ReadError> {
        let Some(bytes) = self.read(file)? else {
            return Ok(Loaded::Missing);
        };
        if !SavedState::is_envelope(&bytes) {
            return Ok(Loaded::Older(bytes));
        }
        let saved = match SavedState::decode(&bytes) {
            Ok(saved) => saved,
            Err(damage) => return Ok(Loaded::Unfit(Unfit::Damaged(damage))),
        };
        Ok(match check(store, id, &saved)? {
            Some(unfit) => Loaded::Unfit(unfit),
            None => Loaded::Fit(saved),
        })
    }

    /// A state its owner read from an older format (whose checks of name, version and query
    /// it made): the data subjects whose events `id`'s query holds through its position are
    /// added to it (the older formats kept none), it is checked as [`States::load`] checks,
    /// and when it fits it is saved anew as `file` in the envelope. Finding the subjects reads
    /// the query's events through the position once, on a store with data subjects only. A
    /// failed save is logged, not answered: the older file stays, and loads again.
    pub fn adopt(
        &self,
        store: &Store,
        file: &str,
        id: &StateId,
        mut saved: SavedState,
    ) -> Result<Loaded, ReadError> {
        let mut subjects = Subjects::of(store);
        subjects.read(store, id.query(), 0, saved.position)?;
        subjects.extend(std::mem::take(&mut saved.subjects));
        saved.subjects = subjects.to_vec();
        if let Some(unfit) = check(store, id, &saved)? {
            return Ok(Loaded::Unfit(unfit));
        }
        if let Err(e) = self.save(file, &saved) {
            tracing::warn!(error = %e, "a state of an older format was not saved anew");
        }
        Ok(Loaded::Fit(saved))
    }
}

/// Checks `saved` against `store`'s log as the fold `id`: `None` when it fits, else why not
/// (see the module documentation).
pub fn check(store: &Store, id: &StateId, saved: &SavedState) -> Result<Option<Unfit>, ReadError> {
    if saved.name != id.name() {
        return Ok(Some(Unfit::OtherName {
            saved: saved.name.clone(),
            wanted: id.name().to_owned(),
        }));
    }
    if saved.version != id.version() {
        return Ok(Some(Unfit::OtherVersion {
            saved: saved.version,
            wanted: id.version(),
        }));
    }
    if saved.key != id.key() {
        return Ok(Some(Unfit::OtherQuery));
    }
    let head = store.head();
    if saved.position > head {
        return Ok(Some(Unfit::BeyondHead {
            position: saved.position,
            head,
        }));
    }
    // A state through position 0 holds no event: it fits any log.
    if saved.position > 0 {
        let found = appended_at(store, saved.position)?;
        if found != Some(saved.appended_at_us) {
            return Ok(Some(Unfit::Stale {
                position: saved.position,
                saved_us: saved.appended_at_us,
                found_us: found,
            }));
        }
    }
    if let Some((subject, receipt)) = erased_since(store, &saved.subjects, saved.position)? {
        return Ok(Some(Unfit::SubjectErased { subject, receipt }));
    }
    Ok(None)
}

/// When the event at `position` was appended, or `None` for position 0 and beyond the head.
pub fn appended_at(store: &Store, position: u64) -> Result<Option<u64>, ReadError> {
    if position == 0 || position > store.head() {
        return Ok(None);
    }
    let mut events = store.read(
        &Query::all(),
        ReadOptions::forwards().from(position).limit(1),
    )?;
    match events.next().transpose()? {
        Some(event) if event.position() == position => Ok(Some(event.appended_at_us())),
        _ => Ok(None),
    }
}

/// The first of `subjects` that an erasure's receipt after `after` names, with the receipt's
/// position; `None` when none was erased since.
pub fn erased_since(
    store: &Store,
    subjects: &[String],
    after: u64,
) -> Result<Option<(String, u64)>, ReadError> {
    if subjects.is_empty() {
        return Ok(None);
    }
    let sorted = subjects.is_sorted();
    let receipts = Query::item(QueryItem::types([SUBJECT_ERASED_TYPE]));
    for receipt in store.read(&receipts, ReadOptions::forwards().after(after))? {
        let receipt = receipt?;
        let named = receipt.tags().find(|&tag| match sorted {
            true => subjects.binary_search_by(|s| s.as_str().cmp(tag)).is_ok(),
            false => subjects.iter().any(|s| s == tag),
        });
        if let Some(tag) = named {
            return Ok(Some((tag.to_owned(), receipt.position())));
        }
    }
    Ok(None)
}

/// The data subjects a fold saw: the tags naming a data subject (by the store's prefixes,
/// `Options::subjects`) of the events it folded. Empty on a store without data subjects.
#[derive(Debug, Clone, Default)]
pub struct Subjects {
    prefixes: Vec<String>,
    seen: BTreeSet<String>,
}

impl Subjects {
    /// None seen yet, by `store`'s subject prefixes.
    pub fn of(store: &Store) -> Subjects {
        Subjects {
            prefixes: store
                .subject_prefixes()
                .map(<[String]>::to_vec)
                .unwrap_or_default(),
            seen: BTreeSet::new(),
        }
    }

    /// Whether the store has data subjects to note.
    pub fn keeps(&self) -> bool {
        !self.prefixes.is_empty()
    }

    /// Notes the subjects of `event`, folded now. An erased event is not noted: its data is
    /// gone, the fold saw none of it.
    pub fn see(&mut self, event: &Event) {
        if self.keeps() && !event.is_erased() {
            self.note(event);
        }
    }

    fn note(&mut self, event: &Event) {
        for tag in event.tags() {
            if names_subject(&self.prefixes, tag) && !self.seen.contains(tag) {
                self.seen.insert(tag.to_owned());
            }
        }
    }

    /// Notes the subjects of the events of `query` after `after` through `through`, as read
    /// now: for a fold made earlier, erased events included (it may have seen their data
    /// before the erasure). Reads nothing on a store without data subjects.
    pub fn read(
        &mut self,
        store: &Store,
        query: &Query,
        after: u64,
        through: u64,
    ) -> Result<(), ReadError> {
        if !self.keeps() || through <= after {
            return Ok(());
        }
        for event in store.read(query, ReadOptions::forwards().after(after))? {
            let event = event?;
            if event.position() > through {
                break;
            }
            self.note(&event);
        }
        Ok(())
    }

    /// Notes `subjects` (a saved state's, when a fold resumes from it).
    pub fn extend(&mut self, subjects: impl IntoIterator<Item = String>) {
        self.seen.extend(subjects);
    }

    /// Forgets every subject noted (a fold started again).
    pub fn clear(&mut self) {
        self.seen.clear();
    }

    /// How many subjects were noted.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// The subjects noted, sorted.
    pub fn to_vec(&self) -> Vec<String> {
        self.seen.iter().cloned().collect()
    }
}
