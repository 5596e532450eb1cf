//! Decision models: the application layer of DCB.
//!
//! A command is decided by reading the events that matter, folding them into state, and
//! appending with a condition that fails if anything read has changed. A [`Projection`] is a
//! query, an initial state and a fold; projections compose as tuples, and a decision builds the
//! states of all of them with ONE read over the union of their queries ([`Store::decide`]).
//! [`Store::decide_and_append`] runs the whole loop with bounded retries and backoff.
//!
//! ```
//! use annals::decide::{Projection, Retry};
//! use annals::{NewEvent, Options, Query, QueryItem, Store};
//!
//! let store = Store::open_in_memory(Options::default()).unwrap();
//! // "Is the username taken?" as a projection.
//! let taken = |name: &str| {
//!     Projection::new(
//!         Query::item(QueryItem::tags([format!("username:{name}")])),
//!         false,
//!         |taken: &mut bool, event| *taken = event.event_type() == "UsernameClaimed",
//!     )
//! };
//! let claim = |name: &str| {
//!     store.decide_and_append(&taken(name), Retry::default(), |taken| {
//!         if *taken {
//!             return Err("taken");
//!         }
//!         Ok(vec![NewEvent::new("UsernameClaimed", "").tag(format!("username:{name}"))])
//!     })
//! };
//! assert!(claim("ada").is_ok());
//! assert!(claim("ada").is_err());
//! ```

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{AppendError, ReadError};
use crate::event::{Event, NewEvent};
use crate::query::{AppendCondition, Query, QueryItem, ReadOptions};
use crate::state::{StateKey, Subjects};
use crate::store::Store;

/// Something that folds the events of a query into a state: one [`Projection`], or a tuple of
/// them (whose state is the tuple of their states).
pub trait Project {
    type State;
    /// The events this projection needs (for a tuple, the union of its members' queries).
    fn query(&self) -> Query;

    /// The query, lent, when the projection holds it (a [`Projection`] does): a decision then
    /// uses it without copying it. Either always `Some` (and equal to [`Project::query`]) or
    /// always `None`.
    fn query_ref(&self) -> Option<&Query> {
        None
    }
    fn initial(&self) -> Self::State;
    /// Folds one event in; for a tuple, only into the members whose query it matches.
    fn apply(&self, state: &mut Self::State, event: &Event);
    /// True when only the latest matching event matters (a sequence number, a current
    /// value): the decision then reads one event, backwards, instead of all of them.
    fn only_last(&self) -> bool {
        false
    }

    /// Where a decision on `store` starts: returns the state to fold into and pushes, for each
    /// part of the projection (itself, or each member of a tuple in order), its query and the
    /// position through which that state already holds the query's events. By default the
    /// initial state, holding nothing; a [`Cached`] projection starts from the state its cache
    /// kept, a [`Snapshotted`](crate::snapshot::Snapshotted) one from the store's snapshot. The
    /// query is lent when the projection lends it ([`Project::query_ref`]), else copied.
    fn start<'a>(&'a self, store: &Store, parts: &mut Vec<Part<'a>>) -> Self::State {
        let _ = store;
        let query = match self.query_ref() {
            Some(query) => Cow::Borrowed(query),
            None => Cow::Owned(self.query()),
        };
        parts.push(Part::new(query, 0));
        self.initial()
    }

    /// How many parts [`Project::start`] pushes.
    fn parts(&self) -> usize {
        1
    }

    /// Folds one event into the parts that match it and have not folded it yet; `parts` are
    /// this projection's entries of what [`Project::start`] pushed.
    fn apply_part(&self, state: &mut Self::State, event: &Event, parts: &[Part<'_>]) {
        if parts.first().is_none_or(|p| event.position() > p.folded) {
            self.apply(state, event);
        }
    }

    /// Told the state a decision built: every matching event through `built.head` folded in.
    fn built(&self, _state: &Self::State, _built: &Built<'_>) {}

    /// Whether [`Project::built`] needs the data subjects the state folded
    /// ([`Built::subjects`]); the decision then notes them as it reads.
    fn needs_subjects(&self) -> bool {
        false
    }
}

/// One part of a decision (see [`Project::start`]): a query, and the position through which the
/// state the decision starts from already holds its events (0: none of them).
#[derive(Debug, Clone)]
pub struct Part<'a> {
    pub query: Cow<'a, Query>,
    pub folded: u64,
    /// The data subjects whose events the state it starts from folded (a snapshot's).
    pub subjects: Vec<String>,
}

impl<'a> Part<'a> {
    /// `query`, whose events the state holds through `folded`.
    pub fn new(query: Cow<'a, Query>, folded: u64) -> Part<'a> {
        Part {
            query,
            folded,
            subjects: Vec::new(),
        }
    }
}

/// What a decision's read built, told to [`Project::built`].
pub struct Built<'d> {
    /// The store decided on.
    pub store: &'d Store,
    /// The head the read saw: every matching event through it is folded in.
    pub head: u64,
    /// Events the read folded (for a part of a tuple, the whole decision's).
    pub events_read: u64,
    /// How long the read and the fold took, the start's loading included.
    pub elapsed: Duration,
    /// The data subjects whose events the state folded (the states it started from, and the
    /// events read), when the projection asked for them ([`Project::needs_subjects`]); for a
    /// part of a tuple, the whole decision's.
    pub subjects: &'d Subjects,
}

/// A query, an initial state and a fold.
pub struct Projection<S, F> {
    query: Query,
    initial: S,
    fold: F,
    only_last: bool,
}

impl<S: Clone, F: Fn(&mut S, &Event)> Projection<S, F> {
    pub fn new(query: Query, initial: S, fold: F) -> Self {
        Projection {
            query,
            initial,
            fold,
            only_last: false,
        }
    }

    /// A projection whose state depends only on the latest matching event (see
    /// [`Project::only_last`]). Alone it reads one event; inside a tuple it folds all of them
    /// (still correct, since the fold keeps the latest).
    pub fn last(query: Query, initial: S, fold: F) -> Self {
        Projection {
            only_last: true,
            ..Self::new(query, initial, fold)
        }
    }
}

impl<S: Clone, F: Fn(&mut S, &Event)> Project for Projection<S, F> {
    type State = S;

    fn query(&self) -> Query {
        self.query.clone()
    }

    fn query_ref(&self) -> Option<&Query> {
        Some(&self.query)
    }

    fn initial(&self) -> S {
        self.initial.clone()
    }

    fn apply(&self, state: &mut S, event: &Event) {
        if self.query.matches(event.event_type(), event.tags()) {
            (self.fold)(state, event);
        }
    }

    fn only_last(&self) -> bool {
        self.only_last
    }
}

/// States of one kind of projection kept between decisions, by query: a decision made through
/// [`StateCache::cached`] starts from the state the last decision on the same query built and
/// reads only the events appended after it, instead of the query's whole history. A course
/// with a thousand subscriptions is then decided on by reading the few that came since.
///
/// What it keeps is exact, not a guess: a state is the fold of every matching event through
/// the head its read saw, and the decision's condition is the same as without the cache. A
/// cache belongs to one store and one fold: the query is the key (its canonical key,
/// [`StateKey::of_query`], so that equal queries written in another order find the same
/// state), and two projections that fold the same query differently need two caches. At
/// `capacity` entries, adding one more drops another; a capacity of 0 keeps nothing.
pub struct StateCache<S> {
    entries: Mutex<CacheEntries<S>>,
    capacity: usize,
}

/// A cache's states by their query's canonical key, with the head each was built at.
type CacheEntries<S> = HashMap<StateKey, (u64, S), foldhash::fast::RandomState>;

impl<S: Clone> StateCache<S> {
    pub fn new(capacity: usize) -> Self {
        StateCache {
            entries: Mutex::new(HashMap::default()),
            capacity,
        }
    }

    /// `projection`, started from and remembered in this cache.
    pub fn cached<P: Project<State = S>>(&self, projection: P) -> Cached<'_, P> {
        // The query: the projection's own when it lends it.
        let query = match projection.query_ref() {
            Some(_) => None,
            None => Some(projection.query()),
        };
        let key = match &query {
            Some(query) => StateKey::of_query(query),
            None => StateKey::of_query(projection.query_ref().expect("it lends its query")),
        };
        Cached {
            query,
            key,
            inner: projection,
            cache: self,
        }
    }

    /// The state kept for `query` (or an equal query in another order) and the head it was
    /// built at.
    pub fn get(&self, query: &Query) -> Option<(u64, S)> {
        self.get_key(&StateKey::of_query(query))
    }

    fn get_key(&self, key: &StateKey) -> Option<(u64, S)> {
        self.lock().get(key).cloned()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Keeps `state`, built through `head`, unless a state built further on is kept already.
    fn put(&self, key: &StateKey, head: u64, state: &S) {
        if self.capacity == 0 {
            return;
        }
        let mut entries = self.lock();
        if let Some(kept) = entries.get_mut(key) {
            if kept.0 < head {
                *kept = (head, state.clone());
            }
            return;
        }
        if entries.len() >= self.capacity {
            // Any entry may go: dropping one only costs a longer read the next time.
            if let Some(victim) = entries.keys().next().cloned() {
                entries.remove(&victim);
            }
        }
        entries.insert(*key, (head, state.clone()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheEntries<S>> {
        // A panic while holding the lock leaves whole entries only: go on with them.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A projection whose states are kept in a [`StateCache`].
pub struct Cached<'c, P: Project> {
    inner: P,
    /// The query, when `inner` does not lend its own.
    query: Option<Query>,
    /// The query's canonical key in the cache.
    key: StateKey,
    cache: &'c StateCache<P::State>,
}

impl<P: Project> Cached<'_, P> {
    fn lent_query(&self) -> &Query {
        match &self.query {
            Some(query) => query,
            None => self
                .inner
                .query_ref()
                .expect("a projection lends its query"),
        }
    }
}

impl<P> Project for Cached<'_, P>
where
    P: Project,
    P::State: Clone,
{
    type State = P::State;

    fn query(&self) -> Query {
        self.lent_query().clone()
    }

    fn query_ref(&self) -> Option<&Query> {
        Some(self.lent_query())
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

    fn start<'a>(&'a self, _store: &Store, parts: &mut Vec<Part<'a>>) -> P::State {
        let (folded, state) = match self.cache.get_key(&self.key) {
            Some(kept) => kept,
            None => (0, self.inner.initial()),
        };
        parts.push(Part::new(Cow::Borrowed(self.lent_query()), folded));
        state
    }

    fn built(&self, state: &P::State, built: &Built<'_>) {
        self.cache.put(&self.key, built.head, state);
    }
}

/// The union of queries: an event matches if it matches any. A query that matches everything
/// makes the union match everything.
fn union(queries: &[Query]) -> Query {
    if queries.iter().any(Query::matches_all) {
        return Query::all();
    }
    let mut union = Union::default();
    for query in queries {
        for item in &query.items {
            union.add(Cow::Borrowed(item), 0);
        }
    }
    union.query
}

/// The union of the parts' queries, and for each of its items the position after which the
/// read must start for it: the lowest `folded` among the parts that hold the item. Owned
/// queries are moved into it, lent ones copied (a decision needs only the parts' `folded`
/// afterwards).
fn union_of_parts(parts: &mut [Part<'_>]) -> (Query, Vec<u64>) {
    if parts.iter().any(|p| p.query.matches_all()) {
        return (Query::all(), Vec::new());
    }
    let mut union = Union::default();
    for part in parts.iter_mut() {
        match &mut part.query {
            Cow::Owned(query) => {
                for item in std::mem::take(&mut query.items) {
                    union.add(Cow::Owned(item), part.folded);
                }
            }
            Cow::Borrowed(query) => {
                for item in &query.items {
                    union.add(Cow::Borrowed(item), part.folded);
                }
            }
        }
    }
    (union.query, union.afters)
}

/// Query items without repeats, each with the lowest position it is wanted after.
#[derive(Default)]
struct Union {
    query: Query,
    /// For each of `query`'s items.
    afters: Vec<u64>,
}

impl Union {
    fn add(&mut self, item: Cow<'_, QueryItem>, after: u64) {
        match self.query.items.iter().position(|i| *i == *item) {
            Some(at) => self.afters[at] = self.afters[at].min(after),
            None => {
                self.query.items.push(item.into_owned());
                self.afters.push(after);
            }
        }
    }
}

macro_rules! tuple_project {
    ($($name:ident $index:tt),+) => {
        impl<$($name: Project),+> Project for ($($name,)+) {
            type State = ($($name::State,)+);

            fn query(&self) -> Query {
                union(&[$(self.$index.query()),+])
            }

            fn initial(&self) -> Self::State {
                ($(self.$index.initial(),)+)
            }

            fn apply(&self, state: &mut Self::State, event: &Event) {
                $(self.$index.apply(&mut state.$index, event);)+
            }

            fn start<'a>(&'a self, store: &Store, parts: &mut Vec<Part<'a>>) -> Self::State {
                ($(self.$index.start(store, parts),)+)
            }

            fn parts(&self) -> usize {
                0 $(+ self.$index.parts())+
            }

            #[allow(unused_assignments)]
            fn apply_part(&self, state: &mut Self::State, event: &Event, parts: &[Part<'_>]) {
                let mut rest = parts;
                $(
                    let (mine, others) = rest.split_at(self.$index.parts().min(rest.len()));
                    self.$index.apply_part(&mut state.$index, event, mine);
                    rest = others;
                )+
            }

            fn built(&self, state: &Self::State, built: &Built<'_>) {
                $(self.$index.built(&state.$index, built);)+
            }

            fn needs_subjects(&self) -> bool {
                false $(|| self.$index.needs_subjects())+
            }
        }
    };
}

tuple_project!(A 0, B 1);
tuple_project!(A 0, B 1, C 2);
tuple_project!(A 0, B 1, C 2, D 3);
tuple_project!(A 0, B 1, C 2, D 3, E 4);

/// The states a decision is made on, and the condition that protects them: the union query,
/// after the head the read saw. An append with it fails if any event that would have changed
/// the states was appended since.
#[derive(Debug, Clone)]
pub struct Decision<S> {
    pub state: S,
    pub condition: AppendCondition,
    /// Events folded in.
    pub events_read: u64,
}

/// Bounded retries with exponential backoff and jitter, for decisions whose condition failed.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all (the first one included).
    pub attempts: u32,
    /// The wait after the first conflict; doubled after each one.
    pub backoff: Duration,
    pub backoff_max: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: 10,
            backoff: Duration::from_micros(200),
            backoff_max: Duration::from_millis(50),
        }
    }
}

/// A decided and appended command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    /// The position of the last appended event.
    pub position: u64,
    /// Attempts it took (1 when the first condition held).
    pub attempts: u32,
}

/// Why [`Store::decide_and_append`] did not append.
#[derive(Debug, thiserror::Error)]
pub enum DecideError<E> {
    /// The command refused, given the state (a business rule).
    #[error("rejected: {0}")]
    Rejected(E),
    /// Every attempt met a concurrent change.
    #[error("the decision's events kept changing: {attempts} attempts, each conflicting")]
    TooManyConflicts { attempts: u32 },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Append(AppendError),
}

impl Store {
    /// Builds the state of `projection` (one read over its query) and the condition that
    /// protects it.
    pub fn decide<P: Project>(&self, projection: &P) -> Result<Decision<P::State>, ReadError> {
        let span = crate::spans::decide();
        let _entered = span.enter();
        let started = Instant::now();
        let mut parts = Vec::with_capacity(projection.parts());
        let mut state = projection.start(self, &mut parts);
        let mut subjects = Subjects::default();
        // The states started from that folded data subjects' events: where each began, and
        // whose events it holds.
        let mut started_from = Vec::new();
        if projection.needs_subjects() {
            subjects = Subjects::of(self);
            for part in &mut parts {
                if !part.subjects.is_empty() {
                    started_from.push((part.folded, std::mem::take(&mut part.subjects)));
                }
            }
        }
        let (query, afters) = union_of_parts(&mut parts);
        let options = if projection.only_last() {
            ReadOptions::backwards().limit(1)
        } else {
            ReadOptions::forwards()
        };
        let mut iter = self.read_after(&query, &afters, options)?;
        // A state started from (a snapshot, checked when it was loaded) may hold the data of
        // a subject erased since: the read below would show that subject's events erased, so
        // the decision starts again from the initial state and reads everything.
        let mut whole = false;
        for (folded, names) in &started_from {
            if crate::state::erased_since(self, names, *folded)?.is_some() {
                whole = true;
            }
        }
        if whole {
            state = projection.initial();
            iter = self.read(&query, options)?;
        } else {
            for (_, names) in started_from {
                subjects.extend(names);
            }
        }
        let head = iter.head();
        let mut events_read = 0;
        for event in iter.by_ref() {
            let event = event?;
            subjects.see(&event);
            match whole {
                true => projection.apply(&mut state, &event),
                false => projection.apply_part(&mut state, &event, &parts),
            }
            events_read += 1;
        }
        let built = Built {
            store: self,
            head,
            events_read,
            elapsed: started.elapsed(),
            subjects: &subjects,
        };
        projection.built(&state, &built);
        if !span.is_disabled() {
            span.record("annals.events_read", events_read as i64);
            span.record("annals.head", head as i64);
            span.record("annals.rebuilt", whole);
        }
        Ok(Decision {
            state,
            condition: AppendCondition::new(query, Some(head)),
            events_read,
        })
    }

    /// Decides and appends: builds the state, asks `command` for the events to append (or a
    /// refusal), appends them under the decision's condition, and when the condition fails
    /// (someone changed what was read) decides again, up to `retry.attempts` times.
    pub fn decide_and_append<P, E>(
        &self,
        projection: &P,
        retry: Retry,
        command: impl FnMut(&P::State) -> Result<Vec<NewEvent>, E>,
    ) -> Result<Decided, DecideError<E>>
    where
        P: Project,
    {
        let span = crate::spans::decision();
        let _entered = span.enter();
        let decided = self.decide_and_append_untraced(projection, retry, command);
        finish(&span, &decided);
        decided
    }

    fn decide_and_append_untraced<P, E>(
        &self,
        projection: &P,
        retry: Retry,
        mut command: impl FnMut(&P::State) -> Result<Vec<NewEvent>, E>,
    ) -> Result<Decided, DecideError<E>>
    where
        P: Project,
    {
        let mut backoff = Backoff::new(retry);
        for attempt in 1..=backoff.attempts {
            let decision = self.decide(projection)?;
            let events = command(&decision.state).map_err(DecideError::Rejected)?;
            let condition = Some(Cow::Owned(decision.condition));
            match self.appending(&events).condition_given(condition).wait() {
                Ok(position) => {
                    return Ok(Decided {
                        position,
                        attempts: attempt,
                    })
                }
                Err(e) => match backoff.after_failure(e, attempt)? {
                    Some(wait) => std::thread::sleep(wait),
                    None => break,
                },
            }
        }
        Err(DecideError::TooManyConflicts {
            attempts: backoff.attempts,
        })
    }

    /// [`Store::decide_and_append`] for async code: the append is awaited instead of blocking
    /// the thread, so many decisions can be in flight on a few threads (the read and the fold
    /// run on the calling task: they do no I/O). Runtime-agnostic: `sleep` is the runtime's
    /// timer, used for the backoff, e.g. `tokio::time::sleep`. A full append queue is backed
    /// off from like a conflict.
    pub async fn decide_and_append_async<P, E, S, F>(
        &self,
        projection: &P,
        retry: Retry,
        command: impl FnMut(&P::State) -> Result<Vec<NewEvent>, E>,
        sleep: S,
    ) -> Result<Decided, DecideError<E>>
    where
        P: Project,
        S: FnMut(Duration) -> F,
        F: std::future::Future<Output = ()>,
    {
        use tracing::Instrument as _;
        let span = crate::spans::decision();
        let decided = self
            .decide_and_append_async_untraced(projection, retry, command, sleep)
            .instrument(span.clone())
            .await;
        finish(&span, &decided);
        decided
    }

    async fn decide_and_append_async_untraced<P, E, S, F>(
        &self,
        projection: &P,
        retry: Retry,
        mut command: impl FnMut(&P::State) -> Result<Vec<NewEvent>, E>,
        mut sleep: S,
    ) -> Result<Decided, DecideError<E>>
    where
        P: Project,
        S: FnMut(Duration) -> F,
        F: std::future::Future<Output = ()>,
    {
        let mut backoff = Backoff::new(retry);
        let mut attempt = 0;
        while attempt < backoff.attempts {
            attempt += 1;
            let Decision {
                state, condition, ..
            } = self.decide(projection)?;
            let events = command(&state).map_err(DecideError::Rejected)?;
            // Only the condition is held across the await, so the future is Send whenever
            // the projection is Sync.
            drop(state);
            let appended = self
                .appending(&events)
                .condition_given(Some(Cow::Owned(condition)))
                .submit()
                .await;
            match appended {
                Ok(position) => {
                    return Ok(Decided {
                        position,
                        attempts: attempt,
                    })
                }
                Err(AppendError::QueueFull { .. }) => {
                    // Not an attempt: nothing was decided against a changed state.
                    attempt -= 1;
                    sleep(retry.backoff).await;
                }
                Err(e) => match backoff.after_failure(e, attempt)? {
                    Some(wait) => sleep(wait).await,
                    None => break,
                },
            }
        }
        Err(DecideError::TooManyConflicts {
            attempts: backoff.attempts,
        })
    }
}

/// Records a decision's outcome on its span: the attempts it took, and the position its
/// append was given or why it ended without one.
fn finish<E>(span: &tracing::Span, decided: &Result<Decided, DecideError<E>>) {
    if span.is_disabled() {
        return;
    }
    let (attempts, outcome) = match decided {
        Ok(d) => {
            span.record("annals.position", d.position as i64);
            (Some(d.attempts), "appended")
        }
        Err(DecideError::Rejected(_)) => (None, "rejected"),
        Err(DecideError::TooManyConflicts { attempts }) => (Some(*attempts), "too_many_conflicts"),
        Err(DecideError::Read(e)) => (None, e.kind()),
        Err(DecideError::Append(e)) => (None, e.kind()),
    };
    if let Some(attempts) = attempts {
        span.record("annals.attempts", i64::from(attempts));
    }
    span.record("annals.outcome", outcome);
    // A command that refuses is an answer, as a failed condition is; the rest are faults.
    if !matches!(decided, Ok(_) | Err(DecideError::Rejected(_))) {
        span.record("otel.status_code", "ERROR");
    }
}

/// The retry policy's state: how many attempts, and the next wait.
struct Backoff {
    attempts: u32,
    next: Duration,
    max: Duration,
}

impl Backoff {
    fn new(retry: Retry) -> Self {
        Backoff {
            attempts: retry.attempts.max(1),
            next: retry.backoff,
            max: retry.backoff_max,
        }
    }

    /// After a failed append: the wait before the next attempt (a failed condition with
    /// attempts left), `None` when the attempts are used up, or the error to give up with.
    fn after_failure<E>(
        &mut self,
        error: AppendError,
        attempt: u32,
    ) -> Result<Option<Duration>, DecideError<E>> {
        match error {
            AppendError::ConditionFailed { .. } if attempt < self.attempts => {
                // Jitter keeps retrying deciders from colliding again in step.
                let wait = self.next.mul_f64(0.5 + pseudo_random(attempt) * 0.5);
                self.next = (self.next * 2).min(self.max);
                Ok(Some(wait))
            }
            AppendError::ConditionFailed { .. } => Ok(None),
            e => Err(DecideError::Append(e)),
        }
    }
}

/// A number in [0, 1) that differs between threads and attempts, without a random generator.
fn pseudo_random(attempt: u32) -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(attempt);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}
