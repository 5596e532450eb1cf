//! One way to append. An [`Append`] names what to append (events, or an [`EventBatch`]), its
//! condition and options, and is then sent the way its caller waits for the outcome:
//! [`Append::wait`] blocks the calling thread, [`Append::submit`] is a future for async
//! callers, [`Append::then`] calls back on one of the store's threads. [`Store::append`] and
//! [`Store::append_async`] are shorthands for the two commonest appends; every other append is
//! written with the builder, so that each option has one spelling.
//!
//! ```
//! # let dir = tempfile::tempdir().unwrap();
//! # let store = annals::Store::open(dir.path(), annals::Options::default()).unwrap();
//! use annals::{AppendCondition, NewEvent, Query, QueryItem};
//!
//! let claim = AppendCondition::new(Query::item(QueryItem::tags(["user:ada"])), None);
//! let event = NewEvent::new("UsernameClaimed", b"ada".to_vec()).tag("user:ada");
//! let position = store.appending(&[event.clone()]).condition(&claim).wait().unwrap();
//! assert_eq!(position, 1);
//! // The same claim again fails its condition.
//! assert!(store.appending(&[event]).condition(&claim).wait().is_err());
//! ```

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::EventBatch;
use crate::error::AppendError;
use crate::event::NewEvent;
use crate::query::AppendCondition;
use crate::request::{AsyncSlot, Completion, ReplyTo, Waiting};
use crate::store::Store;

/// How an append is handed to the writer.
#[derive(Clone)]
pub(crate) struct Submit {
    /// Wait while the queue is full; otherwise fail with [`AppendError::QueueFull`].
    pub(crate) wait_when_full: bool,
    /// A blocking caller that is the only one waiting on the store: it may commit its append
    /// on its own thread (see [`WriterRole::commit_alone`]).
    pub(crate) alone: bool,
    /// The append's span (see [`Append::span`]; none unless spans are recorded), which the
    /// commit that carries it links to.
    pub(crate) trace: tracing::Span,
}

/// Per-append options.
#[derive(Debug, Clone, Default)]
pub struct AppendOptions {
    /// Ask for D3 (fsynced before acknowledgement) even when the store runs in a weaker class.
    pub require_synced: bool,
    /// Ask for D4: acknowledged once the append is synced and in object storage too, in a
    /// store with a backup (`Options::backup`). Fails with
    /// [`crate::InputError::OffMachineUnavailable`] without one; answered
    /// [`crate::AppendError::OutcomeUnknown`] when object storage does not take it in time.
    pub off_machine: bool,
    /// Record a consumer's position in the same record as the events: the append fails with
    /// [`AppendError::TrackingNotIncreasing`] unless the position is above the one recorded
    /// for the source, so a process that appends the effects of what it consumed can neither
    /// lose nor repeat one across a crash.
    pub tracking: Option<Tracking>,
    /// The events are carried from another log's history (an import of an export), not made
    /// by a client: they are not admitted again, and the store's own erasure receipts among
    /// them are taken as they are. For tools that carry a log; a client's event of the
    /// receipts' type is refused (`InputError::ReservedType`).
    pub carried: bool,
}

impl AppendOptions {
    /// The class an append with these options is acknowledged in, on a store of class
    /// `store`: D4 when it asks for it, at least D3 when it asks to be synced, else the
    /// store's own.
    pub fn class(&self, store: crate::Durability) -> crate::Durability {
        if self.off_machine {
            crate::Durability::OffMachine
        } else if self.require_synced {
            crate::Durability::Synced.max(store)
        } else {
            store
        }
    }
}

/// A named consumer's position in some upstream sequence (see [`AppendOptions::tracking`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracking {
    pub source: String,
    pub position: u64,
}

impl Tracking {
    pub fn new(source: impl Into<String>, position: u64) -> Self {
        Tracking {
            source: source.into(),
            position,
        }
    }
}

/// An append being prepared; nothing happens until it is sent with [`Append::wait`],
/// [`Append::submit`] or [`Append::then`]. Made by [`Store::appending`] and
/// [`Store::appending_batch`].
#[must_use = "an append is sent by wait, submit or then"]
pub struct Append<'a> {
    store: &'a Store,
    body: Body<'a>,
    condition: Option<Cow<'a, AppendCondition>>,
    options: AppendOptions,
    wait_when_full: bool,
}

enum Body<'a> {
    Events(&'a [NewEvent]),
    Batch(EventBatch),
}

impl<'a> Append<'a> {
    pub(crate) fn of_events(store: &'a Store, events: &'a [NewEvent]) -> Self {
        Self::new(store, Body::Events(events))
    }

    pub(crate) fn of_batch(store: &'a Store, batch: EventBatch) -> Self {
        Self::new(store, Body::Batch(batch))
    }

    fn new(store: &'a Store, body: Body<'a>) -> Self {
        Append {
            store,
            body,
            condition: None,
            options: AppendOptions::default(),
            wait_when_full: true,
        }
    }

    /// Appends only if `condition` holds: no event matching its query after its `after`.
    pub fn condition(mut self, condition: &'a AppendCondition) -> Self {
        self.condition = Some(Cow::Borrowed(condition));
        self
    }

    /// The condition given, lent or none (the two shorthands' and a decision's, which hands
    /// over its own and saves a copy of its query).
    pub(crate) fn condition_given(mut self, condition: Option<Cow<'a, AppendCondition>>) -> Self {
        self.condition = condition;
        self
    }

    /// All per-append options at once (see [`AppendOptions`]).
    pub fn options(mut self, options: AppendOptions) -> Self {
        self.options = options;
        self
    }

    /// Records a consumer's position with the events (see [`AppendOptions::tracking`]).
    pub fn tracking(mut self, tracking: Tracking) -> Self {
        self.options.tracking = Some(tracking);
        self
    }

    /// Acknowledged only once synced, whatever the store's durability class (see
    /// [`AppendOptions::require_synced`]).
    pub fn require_synced(mut self) -> Self {
        self.options.require_synced = true;
        self
    }

    /// Ask for D4: acknowledged once in object storage too (see
    /// [`AppendOptions::off_machine`]).
    pub fn require_off_machine(mut self) -> Self {
        self.options.off_machine = true;
        self
    }

    /// Fails with [`crate::AppendError::QueueFull`] instead of waiting when the append queue is
    /// full. [`Append::submit`] always does.
    pub fn fail_when_full(mut self) -> Self {
        self.wait_when_full = false;
        self
    }

    /// Sends the append and blocks until its outcome: the position of its last event.
    pub fn wait(self) -> Result<u64, AppendError> {
        let completion = Completion::for_this_thread();
        let store = self.store;
        let waiting = Waiting::start(store.shared_arc());
        let span = self.span();
        let how = Submit {
            wait_when_full: self.wait_when_full,
            alone: waiting.alone(),
            trace: span.clone(),
        };
        let sent = self.send(ReplyTo::Blocking(completion.clone()), how);
        let outcome = sent.and_then(|()| completion.wait(waiting));
        finish(&span, &outcome);
        outcome
    }

    /// Sends the append without blocking the calling thread: the future resolves when the
    /// append is acknowledged (in D3, durable). Works on any async runtime. It fails with
    /// [`crate::AppendError::QueueFull`] rather than wait when the append queue is full; back
    /// off and try again. The append is always committed by the writer thread, never on the
    /// caller's.
    ///
    /// Await the future to its end or drop it. The appends acknowledged by one fdatasync are
    /// woken through one of their tasks (see `AsyncSlot` in request/reply.rs), so a future that
    /// was polled, then kept without being polled again and without being dropped (as a
    /// future handed back unfinished by a `select` can be), delays the other tasks of its
    /// group until it is polled or dropped. `select!`, timeouts and cancellation drop it,
    /// which is fine.
    pub async fn submit(self) -> Result<u64, AppendError> {
        let slot = Arc::new(AsyncSlot::default());
        let store = self.store;
        let waiting = Waiting::start(store.shared_arc());
        let span = self.span();
        let how = Submit {
            wait_when_full: false,
            // Never on a runtime's thread: see `WriterRole::commit_alone`.
            alone: false,
            trace: span.clone(),
        };
        if let Err(e) = self.send(ReplyTo::Async(slot.clone()), how) {
            let outcome = Err(e);
            finish(&span, &outcome);
            return outcome;
        }
        // A lone caller on files polls (see `Waiting`), yielding to the runtime between polls
        // so that the thread stays free for any other task.
        let polls = store.lone_async_polls();
        while polls && waiting.keep_polling() && !slot.filled() {
            let spin_until = Instant::now() + LONE_SPIN;
            while !slot.filled() && Instant::now() < spin_until {
                std::hint::spin_loop();
            }
            if slot.filled() {
                break;
            }
            YieldOnce(false).await;
        }
        // `waiting` stays alive until the outcome is in: a sleeping caller still counts.
        let outcome = slot.wait().await;
        drop(waiting);
        finish(&span, &outcome);
        outcome
    }

    /// Sends the append and returns at once; `done` is called with the outcome on one of the
    /// store's threads (the writer's, or the notifier's once the append is synced), so keep
    /// it short and never block in it. Errors found before the append is queued are returned
    /// here, and `done` is then not called.
    pub fn then(
        self,
        done: impl FnOnce(Result<u64, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        let span = self.span();
        let how = Submit {
            wait_when_full: self.wait_when_full,
            alone: false,
            trace: span.clone(),
        };
        let answered = span.clone();
        let done = move |outcome: Result<u64, AppendError>| {
            finish(&answered, &outcome);
            done(outcome)
        };
        let sent = self.send(ReplyTo::Callback(Box::new(done)), how);
        if let Err(e) = &sent {
            span.record("annals.outcome", e.kind());
        }
        sent
    }

    fn send(self, reply: ReplyTo, how: Submit) -> Result<(), AppendError> {
        match self.body {
            Body::Events(events) => {
                self.store
                    .submit(events, self.condition, self.options, reply, how)
            }
            Body::Batch(batch) => {
                self.store
                    .submit_batch(batch, self.condition, self.options, reply, how)
            }
        }
    }

    /// The append's span, `annals.append`, made only under the caller's span (a server's
    /// request, sampled; an append nobody traces costs the lookup alone): its event count,
    /// whether it has a condition and the position the condition reads after, its durability
    /// class, and once answered its last event's position and outcome. Its numbers are
    /// signed (OpenTelemetry's attributes have no unsigned ones: `tracing`'s bridge writes a
    /// `u64` as text). The commit that carried it (a group's fsync) is linked to it both ways
    /// (see `writer/syncer.rs`).
    fn span(&self) -> tracing::Span {
        use tracing::field::Empty;
        let caller = tracing::Span::current();
        if caller.is_none() {
            return caller;
        }
        let span = tracing::info_span!(
            target: "annals",
            parent: &caller,
            "annals.append",
            annals.events = Empty,
            annals.condition = self.condition.is_some(),
            annals.after = Empty,
            annals.durability = Empty,
            annals.position = Empty,
            annals.outcome = Empty,
            otel.status_code = Empty,
        );
        if span.is_disabled() {
            return span;
        }
        let events = match &self.body {
            Body::Events(events) => events.len(),
            Body::Batch(batch) => batch.len(),
        };
        span.record("annals.events", events as i64);
        if let Some(after) = self.condition.as_ref().and_then(|c| c.after) {
            span.record("annals.after", after as i64);
        }
        let class = self.options.class(self.store.durability());
        span.record("annals.durability", class.label());
        span
    }
}

/// Records an append's answer on its span.
fn finish(span: &tracing::Span, outcome: &Result<u64, AppendError>) {
    if span.is_disabled() {
        return;
    }
    match outcome {
        Ok(position) => {
            span.record("annals.position", *position as i64);
            span.record("annals.outcome", "appended");
        }
        Err(e) => {
            span.record("annals.outcome", e.kind());
            // A failed condition is an answer, not a fault.
            if !matches!(e, AppendError::ConditionFailed { .. }) {
                span.record("otel.status_code", "ERROR");
            }
        }
    }
}

/// How long a lone async caller spins on its outcome between yields to the runtime. Each yield
/// schedules the task anew, and a runtime with an idle worker wakes that worker to steal it:
/// yielding after every check kept both cores busy and the writer thread waiting for one
/// (docs/DECISIONS.md, R7). The runtime's thread is held at most this long.
const LONE_SPIN: Duration = Duration::from_micros(10);

/// A future that is pending once (waking itself at once) and then ready: lets an async caller
/// poll without holding its runtime's thread, on any runtime.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}
