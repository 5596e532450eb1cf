//! Decision snapshots: a decision over a long history starts from the state a snapshot holds
//! and reads only the events after it.
//!
//! A snapshot is a saved state ([`SavedState`]): a model's state folded from the events of a
//! query through a position, under the key of the model's name, its version and the query's
//! canonical form ([`StateKey`]). The store computes the key, so a snapshot is never handed to
//! another query or another version of the model. It keeps one snapshot per key, beside the log
//! (in the data directory on files, in a table on PostgreSQL), written off the commit path.
//!
//! Loading ([`Snapshots::load`]) answers a [`Lookup`]: a hit, a miss, a miss because only other
//! versions of the model have one ([`Lookup::OtherVersion`]), or a snapshot refused because it
//! does not fit the log ([`Lookup::Unfit`]: the log holds another event at its position, or a
//! data subject whose events it folded was erased after it). A hit has been checked against
//! the log, in the library, before it is answered.
//!
//! Erasure: a snapshot notes the data subjects whose events it folded. It is never served after
//! one of them is erased (the check above), and its bytes are removed: by the erasure itself on
//! the store that erased (on PostgreSQL, for every server of the database: the rows are
//! deleted), and on any other copy of the log (a replica, a copy of a data
//! directory) by the first use of its snapshots after the copy takes in the erasure's receipt.
//! A snapshot is not saved once a subject it folded is erased: a save checks, under the
//! shelf's lock that a purge takes too (on PostgreSQL, holding the subjects' rows of the keys'
//! table), that no receipt after its position names one. A decision that started from a
//! snapshot checks again once its read has begun: a subject whose erasure's receipt is in the
//! log by then makes it read everything instead (the read would show that subject's events
//! erased); an erasure still under way (its key deleted, its receipt not yet appended) can
//! reach that decision's state, not a snapshot: its save is refused.
//!
//! A snapshot's state is kept in clear where the store keeps it (the subjects' events are
//! sealed; a fold of them is not). Removing it unlinks its bytes on files; on PostgreSQL the
//! row is deleted and the table vacuumed, but the database's write-ahead log and backups keep
//! the bytes until they are recycled.
//!
//! In a decision, [`Snapshotted`] wraps a projection: `decide` starts from the newest snapshot
//! that fits, reads the events after it (one read, under one head, as always), and saves a new
//! snapshot by a [`SnapshotPolicy`]. The condition is the one a full read gives, and so is the
//! state, provided it reads back as it was written (serde's JSON: a field skipped, or a float
//! that is not finite, does not).
//!
//! Backups do not carry snapshots: they are derived from the log, which a backup carries, and
//! a restored store saves them again as its decisions run.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::decide::{Built, Part, Project};
use crate::error::{ReadError, StoreError};
use crate::event::Event;
use crate::query::{Query, QueryItem, ReadOptions};
use crate::route::Backend;
use crate::shelf::Shelved;
use crate::state::{self, SavedState, StateId, StateKey, Subjects, Unfit};
use crate::store::Store;
use crate::subject::SUBJECT_ERASED_TYPE;

pub use crate::shelf::{ShelfStats as SnapshotStats, SnapshotCounts, SnapshotFilter, SnapshotInfo};

/// What [`Snapshots::load`] found for a model, version and query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A snapshot that fits the log.
    Hit(SavedState),
    /// None is kept.
    Miss,
    /// None of this version; the model's other `versions` have one for the query (stale: the
    /// model changed since they were saved).
    OtherVersion { versions: Vec<u32> },
    /// One is kept, but does not fit the log (why).
    Unfit(Unfit),
}

impl Lookup {
    /// `hit`, `miss`, `stale` (another version) or `unfit`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Lookup::Hit(_) => "hit",
            Lookup::Miss => "miss",
            Lookup::OtherVersion { .. } => "stale",
            Lookup::Unfit(_) => "unfit",
        }
    }
}

/// What became of a snapshot saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// It is its key's snapshot now.
    Saved,
    /// One further on is kept (at `kept`): this one was not.
    Behind { kept: u64 },
}

/// Why a snapshot was not saved.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Its position is beyond the log's head.
    #[error("the snapshot is at position {position}, beyond the head ({head})")]
    BeyondHead { position: u64, head: u64 },
    /// Its state is larger than the store keeps.
    #[error("the snapshot's state is {bytes} bytes; at most {max} are kept")]
    TooLarge { bytes: usize, max: usize },
    /// It folded the events of a data subject erased after its position.
    #[error(
        "the snapshot folded events of the data subject {subject}, erased since (its receipt is \
         at position {receipt}); fold again and save that"
    )]
    SubjectErased { subject: String, receipt: u64 },
    /// Its query is beyond the store's limits.
    #[error("the snapshot's query: {0}")]
    Invalid(crate::error::InputError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SnapshotError {
    /// A stable name for the error (`snapshot_beyond_head`, `snapshot_too_large`,
    /// `subject_erased`, or the query's, the read's or the store's kind).
    pub fn kind(&self) -> &'static str {
        match self {
            SnapshotError::BeyondHead { .. } => "snapshot_beyond_head",
            SnapshotError::TooLarge { .. } => "snapshot_too_large",
            SnapshotError::SubjectErased { .. } => "subject_erased",
            SnapshotError::Invalid(e) => e.kind(),
            SnapshotError::Read(e) => e.kind(),
            SnapshotError::Store(e) => e.kind(),
        }
    }
}

/// A store's snapshots ([`Store::snapshots`]).
#[derive(Clone, Copy)]
pub struct Snapshots<'s> {
    store: &'s Store,
}

impl Store {
    /// The snapshots this store keeps.
    pub fn snapshots(&self) -> Snapshots<'_> {
        Snapshots { store: self }
    }
}

impl<'s> Snapshots<'s> {
    fn shelf_error(&self, what: &'static str, e: io::Error) -> StoreError {
        StoreError::io(what, self.store.keeper().shelf.locate(), 0, e)
    }

    /// The snapshot of `id` (its name, version and query), checked against the log.
    pub fn load(&self, id: &StateId) -> Result<Lookup, ReadError> {
        let keeper = self.store.keeper();
        self.catch_up()?;
        let bytes = keeper
            .shelf
            .get(&id.key())
            .map_err(|e| self.shelf_error("read a snapshot", e))?;
        let lookup = match bytes {
            None => {
                let key_of = |version| StateKey::new(id.name(), version, id.query());
                let versions = keeper
                    .shelf
                    .other_versions(id.name(), id.version(), &key_of)
                    .map_err(|e| self.shelf_error("list snapshots", e))?;
                match versions.is_empty() {
                    true => Lookup::Miss,
                    false => Lookup::OtherVersion { versions },
                }
            }
            Some(bytes) => match SavedState::decode(&bytes) {
                Err(damage) => Lookup::Unfit(Unfit::Damaged(damage)),
                Ok(saved) => {
                    let mut unfit = state::check(self.store, id, &saved)?;
                    // Another server of the database saved it beyond what this one took in.
                    if matches!(unfit, Some(Unfit::BeyondHead { .. }))
                        && self.store.backend() == Backend::Postgres
                    {
                        self.store.refresh().map_err(ReadError::from)?;
                        unfit = state::check(self.store, id, &saved)?;
                    }
                    match unfit {
                        None => Lookup::Hit(saved),
                        Some(unfit) => {
                            self.drop_unfit(id, &saved, &unfit);
                            Lookup::Unfit(unfit)
                        }
                    }
                }
            },
        };
        keeper.counts.looked_up(lookup.outcome());
        Ok(lookup)
    }

    /// A snapshot that will never fit again is removed: one whose position holds another
    /// event (another log), one beyond the head of a log on files (which lost its tail and
    /// would otherwise hold every later save behind it), or one that folded a subject erased
    /// since (its bytes must go).
    fn drop_unfit(&self, id: &StateId, saved: &SavedState, unfit: &Unfit) {
        let shelf = &self.store.keeper().shelf;
        // A copy of a log rebuilt from elsewhere (a replica's) may be shorter than the one the
        // snapshot was folded on, as a log on files that lost its tail is.
        let own_log = matches!(self.store.backend(), Backend::Files | Backend::Replica);
        let done = match unfit {
            Unfit::Stale { .. } | Unfit::Damaged(_) => {
                shelf.remove(&SnapshotFilter::key(id.key())).map(drop)
            }
            Unfit::BeyondHead { .. } if own_log => {
                shelf.remove(&SnapshotFilter::key(id.key())).map(drop)
            }
            Unfit::SubjectErased { subject, receipt } => {
                let erased = HashMap::from([(subject.clone(), *receipt)]);
                shelf.purge(&erased).map(drop)
            }
            _ => Ok(()),
        };
        if let Err(e) = done {
            tracing::warn!(key = %saved.key, error = %e, "a snapshot that does not fit stays");
        }
    }

    /// Saves the state of `id` folded through `position`, having folded the events of the
    /// data subjects `subjects` (see [`Subjects`]): its key's snapshot from now on, unless one
    /// further on is kept. A subject erased at or before the position is left out: a read
    /// through the position showed none of its data.
    pub fn save_with_subjects(
        &self,
        id: &StateId,
        position: u64,
        subjects: Vec<String>,
        state: Vec<u8>,
    ) -> Result<Saved, SnapshotError> {
        self.admissible(id, position, &state)?;
        let subjects = self.not_erased_by(subjects, position)?;
        let appended_at_us = state::appended_at(self.store, position)?.unwrap_or(0);
        let saved = SavedState::new(id, position, appended_at_us, subjects, state);
        self.catch_up()?;
        // On a database, what other servers committed counts: an erasure's receipt among it.
        // Taken in before the shelf's transaction, which must not wait on the committer.
        if self.store.backend() == Backend::Postgres && !saved.subjects.is_empty() {
            self.store.refresh().map_err(ReadError::from)?;
        }
        let keeper = self.store.keeper();
        let refused = Mutex::new(None);
        let failed = Mutex::new(None);
        let admit = || match state::erased_since(self.store, &saved.subjects, position) {
            Ok(None) => Ok(true),
            Ok(Some(erased)) => {
                *refused.lock() = Some(erased);
                Ok(false)
            }
            Err(e) => {
                *failed.lock() = Some(e);
                Err(io::Error::other("the log could not be read"))
            }
        };
        let put = keeper.shelf.put(&saved, &admit);
        if let Some(e) = failed.into_inner() {
            return Err(SnapshotError::Read(e));
        }
        let put = put.map_err(|e| self.shelf_error("save a snapshot", e))?;
        keeper.counts.put(&put);
        match put {
            Shelved::Saved => Ok(Saved::Saved),
            Shelved::Behind { kept } => Ok(Saved::Behind { kept }),
            Shelved::Refused => {
                let (subject, receipt) = refused.into_inner().expect("the refusal's reason");
                Err(SnapshotError::SubjectErased { subject, receipt })
            }
            Shelved::Erased { subject } => {
                // Erased on another server since this one took the log in: its receipt is
                // in the database.
                self.store.refresh().map_err(ReadError::from)?;
                let receipt = state::erased_since(self.store, std::slice::from_ref(&subject), 0)?
                    .map_or(0, |(_, receipt)| receipt);
                Err(SnapshotError::SubjectErased { subject, receipt })
            }
        }
    }

    /// Refuses a save that can never be kept: a state over the limit, a query over the limits,
    /// a position beyond the head (on a database, beyond what the database holds).
    fn admissible(&self, id: &StateId, position: u64, state: &[u8]) -> Result<(), SnapshotError> {
        let limits = &self.store.options().limits;
        if state.len() > limits.snapshot_bytes_max {
            return Err(SnapshotError::TooLarge {
                bytes: state.len(),
                max: limits.snapshot_bytes_max,
            });
        }
        id.query()
            .validate(limits)
            .map_err(SnapshotError::Invalid)?;
        let mut head = self.store.head();
        if position > head && self.store.backend() == Backend::Postgres {
            head = self.store.refresh().map_err(ReadError::from)?;
        }
        if position > head {
            return Err(SnapshotError::BeyondHead { position, head });
        }
        Ok(())
    }

    /// Saves the state of `id` folded through `position` by a fold the store does not see (a
    /// client's, over HTTP): the data subjects it folded are found in the log, from the
    /// snapshot kept for the key when it fits, else by reading the query's events through
    /// `position` (on a store with data subjects only).
    pub fn save(
        &self,
        id: &StateId,
        position: u64,
        state: Vec<u8>,
    ) -> Result<Saved, SnapshotError> {
        self.admissible(id, position, &state)?;
        let mut subjects = Subjects::of(self.store);
        if subjects.keeps() {
            let mut after = 0;
            if let Lookup::Hit(kept) = self.load(id)? {
                if kept.position <= position {
                    after = kept.position;
                    subjects.extend(kept.subjects);
                }
            }
            subjects.read(self.store, id.query(), after, position)?;
        }
        self.save_with_subjects(id, position, subjects.to_vec(), state)
    }

    /// `subjects` but those erased at or before `position`: a subject's key is gone before its
    /// receipt is appended, so a read through the position showed none of its data, and a
    /// state folded there holds none of it.
    fn not_erased_by(
        &self,
        mut subjects: Vec<String>,
        position: u64,
    ) -> Result<Vec<String>, ReadError> {
        if subjects.is_empty() {
            return Ok(subjects);
        }
        let receipts = Query::item(QueryItem::types([SUBJECT_ERASED_TYPE]));
        let mut before = std::collections::HashSet::new();
        for receipt in self.store.read(&receipts, ReadOptions::forwards())? {
            let receipt = receipt?;
            if receipt.position() > position {
                break;
            }
            before.extend(receipt.tags().map(str::to_owned));
        }
        subjects.retain(|s| !before.contains(s));
        Ok(subjects)
    }

    /// The snapshots `filter` names.
    pub fn list(&self, filter: &SnapshotFilter) -> Result<Vec<SnapshotInfo>, StoreError> {
        if let Err(e) = self.catch_up() {
            tracing::warn!(error = %e, "snapshots of erased subjects are purged later");
        }
        let shelf = &self.store.keeper().shelf;
        shelf
            .list(filter)
            .map_err(|e| self.shelf_error("list snapshots", e))
    }

    /// Removes the snapshots `filter` names; answers how many.
    pub fn remove(&self, filter: &SnapshotFilter) -> Result<u64, StoreError> {
        let shelf = &self.store.keeper().shelf;
        shelf
            .remove(filter)
            .map_err(|e| self.shelf_error("remove snapshots", e))
    }

    /// How many snapshots are kept, and their bytes.
    pub fn stats(&self) -> Result<SnapshotStats, StoreError> {
        let shelf = &self.store.keeper().shelf;
        shelf
            .stats()
            .map_err(|e| self.shelf_error("count snapshots", e))
    }

    /// Loads, saves and purges counted since the store opened.
    pub fn counts(&self) -> SnapshotCounts {
        self.store.keeper().counts.now()
    }

    /// Removes the snapshots that folded the events of subjects erased since the last time
    /// this ran (by the erasures' receipts in the log). Another caller already at it is
    /// left to it: what is served is checked anyway ([`Snapshots::load`]).
    pub(crate) fn catch_up(&self) -> Result<(), ReadError> {
        if self.store.subject_prefixes().is_none() {
            return Ok(());
        }
        let keeper = self.store.keeper();
        let Some(mut through) = keeper.purged_through.try_lock() else {
            return Ok(());
        };
        let head = self.store.head();
        if *through >= head {
            return Ok(());
        }
        let receipts = Query::item(QueryItem::types([SUBJECT_ERASED_TYPE]));
        let mut erased: HashMap<String, u64> = HashMap::new();
        for receipt in self
            .store
            .read(&receipts, ReadOptions::forwards().after(*through))?
        {
            let receipt = receipt?;
            if receipt.position() > head {
                break;
            }
            for tag in receipt.tags() {
                let at = erased.entry(tag.to_owned()).or_default();
                *at = (*at).max(receipt.position());
            }
        }
        if !erased.is_empty() {
            let purged = keeper
                .shelf
                .purge(&erased)
                .map_err(|e| self.shelf_error("purge snapshots", e))?;
            keeper.counts.purged(purged);
        }
        *through = head;
        Ok(())
    }
}

/// When a [`Snapshotted`] decision saves a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// After this many events folded since the snapshot it started from (0: never by count).
    pub every: u64,
    /// When a decision's read took at least this long (None: never by time).
    pub slower_than: Option<Duration>,
}

impl Default for SnapshotPolicy {
    /// Every 1,000 events.
    fn default() -> Self {
        SnapshotPolicy {
            every: 1_000,
            slower_than: None,
        }
    }
}

impl SnapshotPolicy {
    fn wants(&self, events_read: u64, elapsed: Duration) -> bool {
        (self.every > 0 && events_read >= self.every)
            || self.slower_than.is_some_and(|slow| elapsed >= slow)
    }
}

/// A projection whose decisions start from the store's snapshot of it and save new ones (see
/// the module documentation). Its state is saved as JSON (serde). Wrap the projection whose
/// history is long: the whole projection of a decision, or one part of a tuple (its snapshot
/// is then of that part alone, and the policy counts the events the whole decision read).
/// Wrapping a [`Cached`](crate::decide::Cached) projection gains nothing: without a snapshot
/// the cache's state is not started from.
///
/// ```
/// use annals::decide::{Projection, Retry};
/// use annals::snapshot::{SnapshotPolicy, Snapshotted};
/// use annals::{NewEvent, Options, Query, QueryItem, Store};
///
/// let store = Store::open_in_memory(Options::default()).unwrap();
/// let seats = Projection::new(
///     Query::item(QueryItem::types(["Enrolled"]).and_tags(["course:c1"])),
///     0u64,
///     |taken: &mut u64, _event| *taken += 1,
/// );
/// let policy = SnapshotPolicy { every: 2, ..SnapshotPolicy::default() };
/// let seats = Snapshotted::new("course-seats", 1, seats).policy(policy);
/// for _ in 0..5 {
///     store
///         .decide_and_append(&seats, Retry::default(), |taken| match *taken < 10 {
///             true => Ok(vec![NewEvent::new("Enrolled", "").tag("course:c1")]),
///             false => Err("full"),
///         })
///         .unwrap();
/// }
/// assert_eq!(store.decide(&seats).unwrap().state, 5);
/// assert!(store.snapshots().stats().unwrap().count == 1);
/// ```
pub struct Snapshotted<P> {
    inner: P,
    id: StateId,
    policy: SnapshotPolicy,
}

impl<P: Project> Snapshotted<P>
where
    P::State: Serialize + DeserializeOwned,
{
    /// `inner`, snapshotted as the model `name` of `version`: raise the version when the fold
    /// changes meaning, and the snapshots of the earlier one are no longer used.
    pub fn new(name: impl Into<String>, version: u32, inner: P) -> Snapshotted<P> {
        let id = StateId::new(name, version, inner.query());
        Snapshotted {
            inner,
            id,
            policy: SnapshotPolicy::default(),
        }
    }

    /// Saves by `policy`.
    pub fn policy(mut self, policy: SnapshotPolicy) -> Snapshotted<P> {
        self.policy = policy;
        self
    }

    /// What its snapshots are of.
    pub fn id(&self) -> &StateId {
        &self.id
    }

    /// The snapshot to start from: a hit whose state deserialises.
    fn snapshot(&self, store: &Store) -> Option<(SavedState, P::State)> {
        match store.snapshots().load(&self.id) {
            Ok(Lookup::Hit(saved)) => match serde_json::from_slice(&saved.state) {
                Ok(state) => Some((saved, state)),
                Err(e) => {
                    tracing::warn!(model = self.id.name(), error = %e,
                        "a snapshot's state does not deserialise: read from the start");
                    None
                }
            },
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(model = self.id.name(), error = %e,
                    "a snapshot could not be loaded: read from the start");
                None
            }
        }
    }
}

impl<P> Project for Snapshotted<P>
where
    P: Project,
    P::State: Serialize + DeserializeOwned,
{
    type State = P::State;

    fn query(&self) -> Query {
        self.id.query().clone()
    }

    fn query_ref(&self) -> Option<&Query> {
        Some(self.id.query())
    }

    fn initial(&self) -> P::State {
        self.inner.initial()
    }

    fn apply(&self, state: &mut P::State, event: &Event) {
        self.inner.apply(state, event);
    }

    fn only_last(&self) -> bool {
        self.inner.only_last()
    }

    fn start<'a>(&'a self, store: &Store, parts: &mut Vec<Part<'a>>) -> P::State {
        let first = parts.len();
        let initial = self.inner.start(store, parts);
        if self.inner.only_last() {
            return initial;
        }
        let Some((saved, state)) = self.snapshot(store) else {
            // An inner state that holds events already (a cache's) noted no subjects: it is
            // not started from, so that what is saved names every subject it folded.
            if parts[first..].iter().any(|part| part.folded > 0) {
                for part in &mut parts[first..] {
                    part.folded = 0;
                    part.subjects.clear();
                }
                return self.inner.initial();
            }
            return initial;
        };
        // The snapshot holds every part's events through its position, and nothing of what
        // the parts' own starts held beyond it.
        for part in &mut parts[first..] {
            part.folded = saved.position;
            part.subjects.clear();
        }
        if let Some(part) = parts.get_mut(first) {
            part.subjects = saved.subjects;
        }
        state
    }

    fn parts(&self) -> usize {
        self.inner.parts()
    }

    fn apply_part(&self, state: &mut P::State, event: &Event, parts: &[Part<'_>]) {
        self.inner.apply_part(state, event, parts);
    }

    fn built(&self, state: &P::State, built: &Built<'_>) {
        self.inner.built(state, built);
        // A projection that reads only the last event is never started from a snapshot.
        if self.inner.only_last()
            || built.head == 0
            || !self.policy.wants(built.events_read, built.elapsed)
        {
            return;
        }
        let bytes = match serde_json::to_vec(state) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(model = self.id.name(), error = %e,
                    "a state does not serialise: no snapshot saved");
                return;
            }
        };
        let saved = built.store.snapshots().save_with_subjects(
            &self.id,
            built.head,
            built.subjects.to_vec(),
            bytes,
        );
        if let Err(e) = saved {
            tracing::warn!(model = self.id.name(), error = %e, "a snapshot was not saved");
        }
    }

    fn needs_subjects(&self) -> bool {
        true
    }
}
