//! The one writer: group commit without a timer.
//!
//! Appends wait in a bounded queue. The writer takes the first, drains whatever else is already
//! waiting (up to `group_bytes_max`), and for each append in order: checks its condition
//! against the index (which already holds the earlier appends of this group; a failed one may
//! be the retry of an append already stored, recognised by its ids), stages
//! its record in one buffer and its events in the index. Then it writes the buffer, issues ONE
//! fdatasync (in D3), publishes the new head and acknowledges the whole group. The index lock is
//! taken per append, never across I/O: shared for the checks (the writer is the index's only
//! mutator), exclusive only for adding the append's events. A failed write or sync poisons the
//! store.
//!
//! "The writer" is a role ([`WriterRole`]), not only a thread: the writer thread takes it for
//! each group, and a blocking caller alone on an idle store takes it to commit its own append
//! on its own thread (one append, one write, one fdatasync, no hand-over). Either way one
//! holder at a time stages and writes, in the order the role was taken; the syncer thread
//! syncs what was written, unless the holder syncs the group itself because there is nothing
//! to overlap that sync with (a lone append, or a group of small appends held for the sync
//! before; see `Writer::commit`). The writer thread runs such a sync with the role released,
//! and meanwhile callers stage their small appends into the next group themselves (see
//! [`WriterRole::stage_during_sync`]), which the writer thread writes and syncs when its sync
//! ends.

// Requests are handed back by value where they cannot be taken (queue full, role busy): boxing
// them to shrink the `Err` would cost an allocation per append.
#![allow(clippy::result_large_err)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Receiver;
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::checkpoint::Mark;
use crate::error::{AppendError, StoreError};
use crate::index::{location, Ahead, AheadStage};
use crate::options::Durability;
use crate::query::AppendCondition;
use crate::record::{aligned, EncodedAppend, Entries, EntryLayout, RecordHeader, HEADER_BYTES};
use crate::recovery::Tail;
use crate::segment::{Segment, SEGMENT_HEADER_BYTES};
use crate::store::Shared;

/// Where a caller waits for its append's outcome.
pub(crate) struct Completion {
    slot: Mutex<Option<Result<u64, AppendError>>>,
    /// Set with `slot`, for a caller polling without the lock.
    filled: AtomicBool,
    ready: Condvar,
}

thread_local! {
    /// A caller waits for one append at a time, so each thread reuses one completion.
    static COMPLETION: Arc<Completion> = Arc::new(Completion {
        slot: Mutex::new(None),
        filled: AtomicBool::new(false),
        ready: Condvar::new(),
    });
}

impl Completion {
    pub(crate) fn for_this_thread() -> Arc<Completion> {
        let completion = COMPLETION.with(Arc::clone);
        // Nothing can be pending here (one append at a time per thread); clear it regardless.
        *completion.slot.lock() = None;
        completion.filled.store(false, Ordering::Relaxed);
        completion
    }

    fn set(&self, outcome: Result<u64, AppendError>) {
        *self.slot.lock() = Some(outcome);
        self.filled.store(true, Ordering::Release);
        self.ready.notify_one();
    }

    /// Waits for the outcome; polls first while `waiting` says it is worth it.
    pub(crate) fn wait(&self, waiting: Waiting) -> Result<u64, AppendError> {
        while waiting.keep_polling() && !self.filled.load(Ordering::Acquire) {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        }
        let mut slot = self.slot.lock();
        loop {
            if let Some(outcome) = slot.take() {
                // Only now: a sleeping caller still counts as waiting.
                drop(waiting);
                return outcome;
            }
            self.ready.wait(&mut slot);
        }
    }
}

/// The longest a lone caller polls for its outcome (see [`Waiting`]).
const LONE_POLL_MAX: Duration = Duration::from_millis(2);

/// A caller waiting for its append's outcome, counted in `Shared::waiting` until it has it.
///
/// The right to move what readers see ([`crate::published::Published`]): its field is private
/// to this module, so only the writer's side (the role's holder, the syncer, the notifier)
/// can publish a head or a synced position.
pub(crate) struct PublishRight(());

/// The writer side's one right to publish.
const RIGHT: PublishRight = PublishRight(());

/// A caller that waits alone polls for its outcome, for about one and a half recent
/// fdatasyncs, before it sleeps. Nothing else then wants the CPU, and on a virtual machine
/// whose idle cores halt, waking a sleeping caller costs tens of microseconds, a good part
/// of a decision (docs/DECISIONS.md, R8). When other callers wait too, or the disk is slow enough
/// that the wake-up is noise, it sleeps at once: polling would take a core from the others.
pub(crate) struct Waiting<'a> {
    shared: &'a Shared,
    until: Option<Instant>,
    alone: bool,
}

impl<'a> Waiting<'a> {
    pub(crate) fn start(shared: &'a Shared) -> Self {
        let others = shared.waiting.fetch_add(1, Ordering::Relaxed);
        let alone = others == 0;
        let until = if alone {
            lone_poll_budget(shared).map(|budget| Instant::now() + budget)
        } else {
            None
        };
        Waiting {
            shared,
            until,
            alone,
        }
    }

    /// No other caller was waiting on the store when this one began.
    pub(crate) fn alone(&self) -> bool {
        self.alone
    }

    /// Whether to poll once more: while alone and within the budget.
    pub(crate) fn keep_polling(&self) -> bool {
        match self.until {
            Some(until) => {
                self.shared.waiting.load(Ordering::Relaxed) == 1 && Instant::now() < until
            }
            None => false,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a lone caller polls: one and a half recent fdatasyncs in D3, plus 100 us for the
/// writer's own work; none when that exceeds [`LONE_POLL_MAX`] (a disk that slow makes the
/// wake-up noise, and polling would hold a core for milliseconds per append).
fn lone_poll_budget(shared: &Shared) -> Option<Duration> {
    let expected_us = match shared.options.durability {
        Durability::Synced => shared.counters.fsync_recent_us.load(Ordering::Relaxed),
        _ => 0,
    };
    let budget = Duration::from_micros(expected_us * 3 / 2 + 100);
    (budget <= LONE_POLL_MAX).then_some(budget)
}

pub(crate) enum ReplyTo {
    Blocking(Arc<Completion>),
    Callback(Box<dyn FnOnce(Result<u64, AppendError>) + Send>),
    Async(Arc<AsyncSlot>),
}

/// Where an async caller ([`crate::Store::append_async`]) finds its outcome.
///
/// A synced group answers tens of async callers at once. Waking each task from the store's
/// thread costs a wake-up of a parked runtime thread per task when that thread, woken on the
/// same core, preempts the store's thread, runs its one task and parks again: a trace of 64
/// async writers on two cores showed acknowledgements 20-40 us apart. So a group's async
/// answers are filled in first and only one task is woken, holding the other tasks' wakers;
/// it wakes them from its runtime's own thread, where a wake-up is a push on a local queue
/// (see [`Answers`]).
#[derive(Default)]
pub(crate) struct AsyncSlot {
    state: Mutex<AsyncState>,
    /// Set with the outcome, for a lone caller polling without the lock.
    filled: AtomicBool,
}

#[derive(Default)]
struct AsyncState {
    outcome: Option<Result<u64, AppendError>>,
    /// The waiting task's waker, once it has been polled.
    waker: Option<Waker>,
    /// The wakers of other tasks answered with this one, for this task to wake.
    delegated: Vec<Waker>,
    /// The caller took its outcome or stopped waiting: it will never wake `delegated`.
    gone: bool,
}

impl AsyncSlot {
    pub(crate) fn filled(&self) -> bool {
        self.filled.load(Ordering::Acquire)
    }

    /// Stores the outcome; returns the waker to wake, if a task waits for it.
    fn fill(&self, outcome: Result<u64, AppendError>) -> Option<Waker> {
        let mut state = self.state.lock();
        state.outcome = Some(outcome);
        self.filled.store(true, Ordering::Release);
        if state.gone {
            None
        } else {
            state.waker.take()
        }
    }

    /// Waits for the outcome (and, when woken first of a group, wakes the others).
    pub(crate) fn wait(&self) -> AsyncWait<'_> {
        AsyncWait(self)
    }
}

/// The future of [`AsyncSlot::wait`].
pub(crate) struct AsyncWait<'a>(&'a AsyncSlot);

impl std::future::Future for AsyncWait<'_> {
    type Output = Result<u64, AppendError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.0.state.lock();
        match state.outcome.take() {
            Some(outcome) => {
                leave(state);
                Poll::Ready(outcome)
            }
            None => {
                match &mut state.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    slot => *slot = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for AsyncWait<'_> {
    /// A caller that stops waiting (its future dropped) still wakes what it was handed.
    fn drop(&mut self) {
        leave(self.0.state.lock());
    }
}

/// The caller stops waiting (its outcome taken, or its wait dropped): marks it gone and wakes,
/// outside the lock, the tasks whose wakers it was handed.
fn leave(mut state: MutexGuard<'_, AsyncState>) {
    state.gone = true;
    let delegated = std::mem::take(&mut state.delegated);
    drop(state);
    for waker in delegated {
        waker.wake();
    }
}

/// Answers a batch of replies: blocking callers and callbacks at once, async callers filled
/// in and woken through the first of them that still waits (see [`AsyncSlot`]).
#[derive(Default)]
pub(crate) struct Answers {
    woken: Vec<(Arc<AsyncSlot>, Waker)>,
}

impl Answers {
    fn send(&mut self, mut reply: Reply, outcome: Result<u64, AppendError>) {
        match reply.0.take() {
            Some(ReplyTo::Async(slot)) => {
                if let Some(waker) = slot.fill(outcome) {
                    self.woken.push((slot, waker));
                }
            }
            to => Reply(to).send(outcome),
        }
    }

    /// Wakes the async callers answered since the last call: the first still waiting holds
    /// the others' wakers.
    fn wake(&mut self) {
        let mut pending = self.woken.drain(..);
        while let Some((slot, waker)) = pending.next() {
            let mut state = slot.state.lock();
            if !state.gone {
                state.delegated.extend(pending.by_ref().map(|(_, w)| w));
            }
            drop(state);
            waker.wake();
        }
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.wake();
    }
}

/// Where an append's outcome goes. Every reply is answered exactly once: one dropped unanswered
/// (a panic unwinding through the writer) answers with an error, so no caller waits forever.
pub(crate) struct Reply(Option<ReplyTo>);

impl Reply {
    pub(crate) fn new(to: ReplyTo) -> Self {
        Reply(Some(to))
    }

    /// Drops the reply without answering: the request never reached the writer, and the
    /// caller learns why from the submitting call's own error.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }

    pub(crate) fn send(mut self, outcome: Result<u64, AppendError>) {
        match self.0.take() {
            Some(ReplyTo::Blocking(c)) => c.set(outcome),
            Some(ReplyTo::Callback(f)) => f(outcome),
            Some(ReplyTo::Async(slot)) => {
                if let Some(waker) = slot.fill(outcome) {
                    waker.wake();
                }
            }
            None => {}
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.0.is_some() {
            let reply = Reply(self.0.take());
            reply.send(Err(StoreError::Poisoned {
                reason: "the append was dropped unanswered (the writer stopped)".into(),
            }
            .into()));
        }
    }
}

pub(crate) struct Request {
    pub(crate) append: EncodedAppend,
    pub(crate) condition: Option<AppendCondition>,
    pub(crate) require_synced: bool,
    pub(crate) reply: Reply,
    /// The append time to record, when it was decided elsewhere (by the database backend,
    /// which committed the append before it reaches this writer); otherwise the group's.
    pub(crate) appended_at: Option<u64>,
}

pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The syncer thread: the "one fdatasync per batch" half of group commit.
///
/// The writer hands over each written group; the syncer takes everything written so far, issues
/// one fdatasync, then (in D3) publishes the new head and acknowledges every append it covered.
/// While it syncs, the writer stages and writes the next groups, so the disk is never idle
/// waiting for the CPU nor the CPU for the disk. In D2 it syncs whatever is unsynced, in D1 only
/// when an append asked for D3; in both, only those appends wait for it.
pub(crate) struct Syncer {
    /// D2 and D3 sync whatever is written; D1 only what an append or the writer asks for.
    eager: bool,
    state: Mutex<SyncState>,
    wake: Condvar,
    /// Signalled after each sync, for a writer waiting for the unsynced backlog to shrink or
    /// for the running sync to end.
    room: Condvar,
    notifier: Arc<Notifier>,
}

/// An append's outcome, released once the log is synced through `needed`.
pub(crate) struct Waiter {
    needed: u64,
    reply: Reply,
    outcome: Result<u64, AppendError>,
}

struct SyncState {
    written: u64,
    /// Bytes written to the log by this process so far, and how many of them are synced.
    written_bytes: u64,
    synced_bytes: u64,
    /// Where the log ends at `written`.
    mark: Mark,
    segment: Arc<Segment>,
    synced: u64,
    waiters: Vec<Waiter>,
    /// A sync is running (on the syncer thread or inline on the writer's).
    syncing: bool,
    /// Syncs finished (or failed) so far.
    syncs_ended: u64,
    stop: bool,
    /// Set when a sync failed: nothing will be synced again.
    failed: Option<String>,
    /// The writer waits for room (see [`Syncer::wait_for_room`]): sync, even when no append
    /// asked for it (D1).
    room_wanted: bool,
}

impl SyncState {
    /// A sync runs, or something written waits for one.
    fn busy(&self) -> bool {
        self.syncing || self.written > self.synced
    }
}

impl Syncer {
    pub(crate) fn new(
        segment: Arc<Segment>,
        mark: Mark,
        notifier: Arc<Notifier>,
        durability: Durability,
    ) -> Self {
        Syncer {
            eager: durability >= Durability::SyncedLater,
            notifier,
            room: Condvar::new(),
            state: Mutex::new(SyncState {
                written: mark.head,
                written_bytes: 0,
                synced_bytes: 0,
                mark,
                segment,
                synced: mark.head,
                waiters: Vec::new(),
                syncing: false,
                syncs_ended: 0,
                stop: false,
                failed: None,
                room_wanted: false,
            }),
            wake: Condvar::new(),
        }
    }

    /// The writer has written through `mark.head` into `segment`; `waiters` are released when
    /// that much is synced.
    fn written(&self, mark: Mark, bytes: u64, segment: &Arc<Segment>, waiters: &mut Vec<Waiter>) {
        let mut state = self.state.lock();
        state.written_bytes = state.written_bytes.max(bytes);
        if let Some(reason) = state.failed.clone() {
            drop(state);
            for w in waiters.drain(..) {
                w.reply.send(Err(StoreError::Poisoned {
                    reason: reason.clone(),
                }
                .into()));
            }
            return;
        }
        if mark.head > state.written {
            state.written = mark.head;
            state.mark = mark;
            if !Arc::ptr_eq(&state.segment, segment) {
                state.segment = segment.clone();
            }
        }
        let synced = state.synced;
        let (ready, pending): (Vec<Waiter>, Vec<Waiter>) =
            waiters.drain(..).partition(|w| w.needed <= synced);
        state.waiters.extend(pending);
        // In D1 a group nobody waits on asks for no sync: the syncer sleeps on (a wake-up per
        // group cost a PostgreSQL store's mirror a thread switch per commit).
        if self.eager || !state.waiters.is_empty() || state.room_wanted {
            self.wake.notify_one();
        }
        drop(state);
        let mut answers = Answers::default();
        for w in ready {
            answers.send(w.reply, w.outcome);
        }
    }

    /// Waits while more than `max` bytes are written but not synced.
    fn wait_for_room(&self, max: u64) {
        let mut state = self.state.lock();
        while state.failed.is_none() && state.written_bytes - state.synced_bytes > max {
            state.room_wanted = true;
            self.wake.notify_one();
            self.room.wait(&mut state);
        }
        state.room_wanted = false;
    }

    /// Waits for the sync now running, if any, to end. The writer calls it before staging a
    /// small group in D3: what it stages now could not be synced before that sync ends anyway,
    /// and what arrives meanwhile joins the group (see `Writer::run`).
    fn wait_for_running_sync(&self) {
        let mut state = self.state.lock();
        let running = state.syncs_ended;
        while state.syncing && state.syncs_ended == running {
            self.room.wait(&mut state);
        }
    }

    /// A sync runs, or something written waits for one.
    fn busy(&self) -> bool {
        self.state.lock().busy()
    }

    pub(crate) fn stop(&self) {
        self.state.lock().stop = true;
        self.wake.notify_one();
    }

    pub(crate) fn run(&self, shared: &Arc<Shared>) {
        let eager = self.eager;
        loop {
            let (target, target_bytes, mark, segment) = {
                let mut state = self.state.lock();
                loop {
                    // In D1 nothing asks for a sync but the writer waiting for room under the
                    // bound on unsynced bytes (a sync nobody would run otherwise).
                    let wanted =
                        eager || state.stop || !state.waiters.is_empty() || state.room_wanted;
                    if wanted && state.written > state.synced && !state.syncing {
                        break;
                    }
                    if state.stop {
                        return;
                    }
                    self.wake.wait(&mut state);
                }
                state.syncing = true;
                (
                    state.written,
                    state.written_bytes,
                    state.mark,
                    state.segment.clone(),
                )
            };
            if !self.sync_once(shared, (target, target_bytes), mark, &segment, false) {
                return;
            }
        }
    }

    /// Syncs through `target` (the caller has set `syncing`), then publishes (in D3) and releases
    /// the waiters it covers: itself when `direct` (unless that means waking several blocked
    /// threads one by one), else through the notifier thread. False when the sync failed and
    /// the store is poisoned.
    fn sync_once(
        &self,
        shared: &Arc<Shared>,
        (target, target_bytes): (u64, u64),
        mark: Mark,
        segment: &Segment,
        direct: bool,
    ) -> bool {
        let started = Instant::now();
        let result = segment
            .file
            .sync_data()
            .map_err(|e| StoreError::io("fdatasync", &segment.path, mark.end_offset, e));
        shared.counters.record_fsync(started.elapsed());
        let result = result.and_then(|()| record_synced_length(shared, mark));
        let mut state = self.state.lock();
        state.syncing = false;
        state.syncs_ended += 1;
        match result {
            Ok(()) => {
                // The synced position only moves forward, and never past what is written.
                assert!(
                    target >= state.synced && target <= state.written,
                    "synced through {target}: before {}, written {}",
                    state.synced,
                    state.written
                );
                state.synced = target;
                state.synced_bytes = state.synced_bytes.max(target_bytes);
                self.room.notify_all();
                shared.published.set_synced(&RIGHT, target);
                let (done, waiting): (Vec<Waiter>, Vec<Waiter>) =
                    state.waiters.drain(..).partition(|w| w.needed <= target);
                state.waiters = waiting;
                let more = state.written > state.synced;
                if more {
                    self.wake.notify_one();
                }
                drop(state);
                let publish = shared.options.durability == Durability::Synced
                    && !cfg!(feature = "canary-ack-before-fsync");
                // The writer's inline sync, or the syncer with nothing more to sync yet,
                // answers the group itself rather than hand it to the notifier (a wake-up on
                // each side), unless that means waking blocked threads one by one: callbacks
                // (an async caller's waker) are cheap, each blocked thread a futex wake.
                let few_blocked = done
                    .iter()
                    .filter(|w| matches!(w.reply.0, Some(ReplyTo::Blocking(_))))
                    .count()
                    <= 1;
                if few_blocked && (direct || !more) {
                    if publish {
                        shared.published.publish(&RIGHT, mark);
                    }
                    let mut answers = Answers::default();
                    for w in done {
                        answers.send(w.reply, w.outcome);
                    }
                    answers.wake();
                    // The writer checks after its inline sync.
                    if !direct {
                        shared.maybe_checkpoint();
                    }
                } else if publish || !done.is_empty() {
                    self.notifier.push(publish.then_some(mark), done);
                }
                true
            }
            Err(error) => {
                let reason = error.to_string();
                shared.poison(reason.clone());
                state.failed = Some(reason.clone());
                self.room.notify_all();
                let waiters = std::mem::take(&mut state.waiters);
                drop(state);
                let mut first = Some(error);
                for w in waiters {
                    let e = first.take().unwrap_or(StoreError::Poisoned {
                        reason: reason.clone(),
                    });
                    w.reply.send(Err(e.into()));
                }
                false
            }
        }
    }

    /// The writer's shortcut when there is nothing to overlap the sync with (see
    /// `Writer::commit`): claims the sync through `mark` for the committer, who runs it on its
    /// own thread ([`Syncer::run_inline`]), saving the hand-over to the syncer thread (a wake-up
    /// on each side). Only when no sync is running or pending; otherwise returns false and
    /// leaves `waiters` to [`Syncer::written`].
    fn claim_inline(
        &self,
        mark: Mark,
        bytes: u64,
        segment: &Arc<Segment>,
        waiters: &mut Vec<Waiter>,
    ) -> bool {
        let mut state = self.state.lock();
        if state.failed.is_some() || state.busy() || mark.head <= state.written {
            return false;
        }
        state.written = mark.head;
        state.written_bytes = state.written_bytes.max(bytes);
        state.mark = mark;
        if !Arc::ptr_eq(&state.segment, segment) {
            state.segment = segment.clone();
        }
        state.waiters.append(waiters);
        state.syncing = true;
        true
    }

    /// Runs a sync claimed by [`Syncer::claim_inline`] and answers what it covers.
    pub(crate) fn run_inline(&self, shared: &Arc<Shared>, sync: InlineSync) {
        let InlineSync {
            mark,
            bytes,
            segment,
        } = sync;
        self.sync_once(shared, (mark.head, bytes), mark, &segment, true);
        shared.maybe_checkpoint();
    }
}

/// Publishes synced groups and wakes their clients, so that the syncer can start the next
/// fdatasync at once instead of spending tens of microseconds per client on wake-ups.
pub(crate) struct Notifier {
    queue: Mutex<NotifierQueue>,
    wake: Condvar,
}

#[derive(Default)]
struct NotifierQueue {
    batches: Vec<(Option<Mark>, Vec<Waiter>)>,
    stop: bool,
}

impl Notifier {
    pub(crate) fn new() -> Self {
        Notifier {
            queue: Mutex::new(NotifierQueue::default()),
            wake: Condvar::new(),
        }
    }

    fn push(&self, mark: Option<Mark>, waiters: Vec<Waiter>) {
        let mut queue = self.queue.lock();
        queue.batches.push((mark, waiters));
        self.wake.notify_one();
    }

    pub(crate) fn stop(&self) {
        self.queue.lock().stop = true;
        self.wake.notify_one();
    }

    pub(crate) fn run(&self, shared: Arc<Shared>) {
        let mut batches = Vec::new();
        loop {
            {
                let mut queue = self.queue.lock();
                while queue.batches.is_empty() {
                    if queue.stop {
                        return;
                    }
                    self.wake.wait(&mut queue);
                }
                std::mem::swap(&mut batches, &mut queue.batches);
            }
            let mut answers = Answers::default();
            for (mark, waiters) in batches.drain(..) {
                if let Some(mark) = mark {
                    shared.published.publish(&RIGHT, mark);
                }
                for w in waiters {
                    answers.send(w.reply, w.outcome);
                }
            }
            answers.wake();
            shared.maybe_checkpoint();
        }
    }
}

/// For crash tests: records how far the current segment is synced (see
/// `Options::record_synced_length`).
fn record_synced_length(shared: &Shared, mark: Mark) -> Result<(), StoreError> {
    if !shared.options.record_synced_length {
        return Ok(());
    }
    let path = shared.dir.join(crate::files::SYNCED_LENGTH);
    let record = format!("{} {}", mark.segment, mark.end_offset);
    let file = shared
        .io
        .open(&path, crate::io::OpenMode::Create)
        .map_err(|e| StoreError::io("record synced length", &path, 0, e))?;
    file.write_at(format!("{record:<64}").as_bytes(), 0)
        .map_err(|e| StoreError::io("record synced length", &path, 0, e))
}

/// An append of fewer events than this and smaller than [`SMALL_BELOW_BYTES`] is small (see
/// [`is_small`]).
const SMALL_BELOW_EVENTS: u32 = 32;
const SMALL_BELOW_BYTES: usize = 16 << 10;

/// Whether staging `append` is too little work to overlap with a sync: it costs the writer
/// about half a microsecond per event, so a small append stages in a tenth of a fdatasync or
/// less. In D3 a small first append waits for the running sync (see `WriterRole::run`), and a
/// lone small append is synced by the writer itself (see `Writer::commit`).
fn is_small(append: &EncodedAppend) -> bool {
    append.event_count < SMALL_BELOW_EVENTS && append.body.len() < SMALL_BELOW_BYTES
}

pub(crate) struct Writer {
    shared: Arc<Shared>,
    receiver: Receiver<Request>,
    segment: Arc<Segment>,
    /// Offset in `segment` where `buffer` will be written.
    tail: u64,
    last_record_offset: u64,
    next_position: u64,
    buffer: Vec<u8>,
    syncer: Option<Arc<Syncer>>,
    /// Reused for each group's waiters.
    waiters: Vec<Waiter>,
    /// Bytes this writer has written to the log since open.
    written_bytes: u64,
    /// The entries of the append being staged, with what the index's look-ahead found.
    ahead: Vec<(usize, usize, EntryLayout, Ahead)>,
    /// The next segment, being created and preallocated in the background, and whether it is
    /// zero-filled.
    next_segment: Option<(std::thread::JoinHandle<Result<Segment, StoreError>>, bool)>,
    /// `written_bytes` and the store's fdatasync count when the current segment began (or the
    /// store opened): what `Preallocation::Adaptive` judges the next segment by.
    segment_began: (u64, u64),
    /// The group being committed and what happened to each of its appends (kept for reuse).
    group: Vec<Request>,
    staged: Vec<Staged>,
    /// Set while the writer thread syncs a group on its own thread with the role released:
    /// callers may then stage small appends into the next group themselves (see
    /// [`WriterRole::stage_during_sync`]); the writer thread commits them when its sync ends.
    open_for_staging: bool,
    /// Appends staged by their callers into the next group (their waiters are in `waiters`).
    early: usize,
}

/// A group's fdatasync that its committer runs on its own thread (see `Writer::commit`).
#[must_use]
pub(crate) struct InlineSync {
    mark: Mark,
    bytes: u64,
    segment: Arc<Segment>,
}

/// How a group came to be committed, which decides who syncs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The writer thread took it from the queue at once.
    Queued,
    /// The writer thread held it for the running sync (see `WriterRole::run`).
    Held,
    /// A lone blocking caller commits its own append (see [`WriterRole::commit_alone`]).
    Caller,
    /// The PostgreSQL committer hands over appends the database has committed (see
    /// [`WriterRole::commit_committed`]).
    Backend,
}

/// What happened to one request of a group.
enum Staged {
    /// Appended, pending the group's write; the last position.
    Appended(u64),
    Done(Result<u64, AppendError>),
}

impl Writer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        receiver: Receiver<Request>,
        segment: Arc<Segment>,
        tail: Tail,
        syncer: Option<Arc<Syncer>>,
    ) -> Self {
        Writer {
            shared,
            receiver,
            segment,
            tail: tail.offset,
            last_record_offset: tail.last_record_offset,
            next_position: tail.head + 1,
            buffer: Vec::with_capacity(1 << 20),
            syncer,
            waiters: Vec::new(),
            written_bytes: 0,
            ahead: Vec::new(),
            next_segment: None,
            segment_began: (0, 0),
            group: Vec::new(),
            staged: Vec::new(),
            open_for_staging: false,
            early: 0,
        }
    }

    /// Whether the segment after the current one is zero-filled: by the store's option, and
    /// for `Adaptive` by the bytes written per fdatasync since the current segment began.
    fn next_zero_fill(&self) -> bool {
        let (bytes_then, syncs_then) = self.segment_began;
        let bytes = self.written_bytes - bytes_then;
        let syncs = self.shared.counters.fsyncs.load(Ordering::Relaxed) - syncs_then;
        let history = (bytes > 0).then_some((bytes, syncs));
        self.shared.options.preallocation.zero_fill(history)
    }

    /// Starts preparing the segment after the current one on a background thread.
    fn prepare_next_segment(&mut self, zero_fill: bool) {
        let io = self.shared.io.clone();
        let dir = self.shared.dir.clone();
        let number = self.segment.number + 1;
        let size = self.shared.options.segment_bytes;
        self.next_segment = std::thread::Builder::new()
            .name("annals-segment".into())
            .spawn(move || Segment::create(io.as_ref(), &dir, number, size, zero_fill))
            .ok()
            .map(|handle| (handle, zero_fill));
    }

    /// Commits the group gathered in `self.group` (and what callers staged early). Returns the
    /// group's sync when the committer is to run it on its own thread.
    fn commit_group(&mut self, origin: Origin) -> Option<InlineSync> {
        let mut group = std::mem::take(&mut self.group);
        let mut staged = std::mem::take(&mut self.staged);
        let inline = self.commit(&mut group, &mut staged, origin);
        self.group = group;
        self.staged = staged;
        inline
    }

    fn commit(
        &mut self,
        group: &mut Vec<Request>,
        staged: &mut Vec<Staged>,
        origin: Origin,
    ) -> Option<InlineSync> {
        staged.clear();
        if let Some(error) = self.shared.poison_error() {
            for request in group.drain(..) {
                request.reply.send(Err(StoreError::Poisoned {
                    reason: error.to_string(),
                }
                .into()));
            }
            let _ = self.abandon_early(&error.to_string(), None);
            return None;
        }
        let appended_at = now_us();
        let mut failure: Option<StoreError> = None;
        for request in group.iter() {
            if failure.is_some() {
                staged.push(Staged::Done(Err(StoreError::Closed.into())));
                continue;
            }
            let stored = aligned(HEADER_BYTES + request.append.body.len()) as u64;
            if self.tail + self.buffer.len() as u64 + stored > self.segment.size {
                if let Err(e) = self.roll() {
                    failure = Some(e);
                    staged.push(Staged::Done(Err(StoreError::Closed.into())));
                    continue;
                }
            }
            staged.push(self.stage(request, appended_at));
        }
        if failure.is_none() {
            if let Err(e) = self.flush() {
                failure = Some(e);
            }
        }
        // The segment the store opened with prepares its successor once half of it is used;
        // later ones do from the roll into them (see `roll`).
        if self.next_segment.is_none() && self.tail > self.segment.size / 2 {
            self.prepare_next_segment(self.next_zero_fill());
        }
        if let Some(error) = failure {
            self.fail(error, group, staged);
            return None;
        }
        self.shared.counters.groups.fetch_add(1, Ordering::Relaxed);
        if origin == Origin::Caller {
            self.shared
                .counters
                .caller_commits
                .fetch_add(1, Ordering::Relaxed);
        }
        let early = std::mem::take(&mut self.early);
        self.shared
            .counters
            .group_appends
            .record((group.len() + early) as u64);
        let mark = Mark {
            head: self.next_position - 1,
            segment: self.segment.number,
            end_offset: self.tail,
            last_record_offset: self.last_record_offset,
        };
        let durability = self.shared.options.durability;
        let acknowledge_now =
            durability != Durability::Synced || cfg!(feature = "canary-ack-before-fsync");
        if acknowledge_now && mark.head > self.shared.head() {
            self.shared.published.publish(&RIGHT, mark);
            self.shared.maybe_checkpoint();
        }
        // A lone small append, queued with nothing behind it: nothing to overlap its sync with.
        let lone = group.len() == 1
            && early == 0
            && is_small(&group[0].append)
            && self.receiver.is_empty();
        let mut waiters = std::mem::take(&mut self.waiters);
        let mut answers = Answers::default();
        for (mut request, outcome) in group.drain(..).zip(staged.drain(..)) {
            self.shared
                .recycle_body(std::mem::take(&mut request.append.body));
            let (needed, outcome) = match outcome {
                Staged::Appended(last) => (last, Ok(last)),
                Staged::Done(outcome) => (mark.head, outcome),
            };
            // In D3 every outcome waits for the sync (a conflict may name an event that is
            // not durable yet); in weaker classes only appends that asked for D3 wait.
            let wait = match durability {
                Durability::Memory => false,
                Durability::Synced => !acknowledge_now,
                _ => request.require_synced && outcome.is_ok(),
            };
            if wait {
                waiters.push(Waiter {
                    needed,
                    reply: request.reply,
                    outcome,
                });
            } else {
                answers.send(request.reply, outcome);
            }
        }
        answers.wake();
        let mut inline = None;
        match &self.syncer {
            Some(syncer) => {
                // The writer syncs a group itself, saving the hand-over to the syncer thread
                // (a wake-up on each side, tens of microseconds on a virtual machine whose idle
                // cores halt), when there is nothing to overlap the sync with: a lone caller's
                // append, a lone small append, or a group held for the sync before (the small
                // appends arriving during this sync would be held for it anyway). Large
                // appends and groups behind them go to the syncer, so that the writer is free
                // to stage the next while the disk syncs (docs/DECISIONS.md, R9).
                let sync_here = durability == Durability::Synced
                    && !acknowledge_now
                    && (lone || origin != Origin::Queued);
                let bytes = self.written_bytes;
                if sync_here && syncer.claim_inline(mark, bytes, &self.segment, &mut waiters) {
                    inline = Some(InlineSync {
                        mark,
                        bytes,
                        segment: self.segment.clone(),
                    });
                } else {
                    syncer.written(mark, bytes, &self.segment, &mut waiters);
                }
            }
            None => {
                for w in waiters.drain(..) {
                    w.reply.send(w.outcome);
                }
            }
        }
        self.waiters = waiters;
        inline
    }

    /// The store is poisoned: answers what callers staged early, which will never be written,
    /// the first with `first` if given, and returns `first` if there was none.
    fn abandon_early(&mut self, reason: &str, mut first: Option<StoreError>) -> Option<StoreError> {
        self.early = 0;
        self.buffer.clear();
        for w in self.waiters.drain(..) {
            let e = first.take().unwrap_or(StoreError::Poisoned {
                reason: reason.to_owned(),
            });
            w.reply.send(Err(e.into()));
        }
        first
    }

    /// A write failed: poison the store and tell every append of the group.
    fn fail(&mut self, error: StoreError, group: &mut Vec<Request>, staged: &mut Vec<Staged>) {
        let reason = error.to_string();
        self.shared.poison(reason.clone());
        let mut first = Some(error);
        // What callers staged early went before the group: the first of them names the error.
        first = self.abandon_early(&reason, first);
        for (request, outcome) in group.drain(..).zip(staged.drain(..)) {
            let e = match outcome {
                Staged::Done(Err(AppendError::Input(e))) => AppendError::Input(e),
                _ => first
                    .take()
                    .unwrap_or(StoreError::Poisoned {
                        reason: reason.clone(),
                    })
                    .into(),
            };
            request.reply.send(Err(e));
        }
    }

    /// Checks one request and, if it may go, adds its record to the buffer and its events to
    /// the index.
    fn stage(&mut self, request: &Request, appended_at: u64) -> Staged {
        let appended_at = request.appended_at.unwrap_or(appended_at);
        let counters = &self.shared.counters;
        let append = &request.append;
        // The checks only read the index, and the writer is its only mutator: under a shared
        // lock, readers go on meanwhile. The exclusive lock is held only for the pushes below.
        // (Held for the whole staging, it had 64 deciding clients spend a fifth of their
        // time spinning and parking on it.)
        let index = self.shared.index.read();
        if let Some(outcome) = checked(&index, counters, request, |_, _| None, |_| None) {
            return Staged::Done(outcome);
        }
        drop(index);
        let first = self.next_position;
        // Staging continues the log: past everything published, and where the index ends
        // (which `Index::push_event` asserts event by event).
        debug_assert!(
            first > self.shared.head(),
            "staging at {first}, published beyond it"
        );
        let record_offset = self.tail + self.buffer.len() as u64;
        let mut header = [0u8; HEADER_BYTES];
        let synced_through = self.shared.published.synced().min(first - 1);
        RecordHeader::encode(&mut header, append, first, synced_through, appended_at);
        self.buffer.extend_from_slice(&header);
        self.buffer.extend_from_slice(&append.body);
        let padded = aligned(self.buffer.len());
        self.buffer.resize(padded, 0);
        let mut position = first;
        let body = append.entries();
        let ahead = &mut self.ahead;
        ahead.clear();
        ahead.extend(
            Entries::new(body, append.event_count)
                .trusted()
                .map(|(offset, entry, layout)| (offset, entry.len(), layout, Ahead::NONE)),
        );
        let entry_at = |ahead: &[(usize, usize, EntryLayout, Ahead)], i: usize| {
            let (offset, len, layout, _) = ahead[i];
            (&body[offset..offset + len], layout)
        };
        // Each event goes through the look-ahead stages this many events before its push.
        const STAGES: [(AheadStage, usize); 3] = [
            (AheadStage::Slot, 6),
            (AheadStage::Header, 3),
            (AheadStage::Tail, 1),
        ];
        let n = ahead.len();
        let mut index = self.shared.index.write();
        for (stage, distance) in STAGES {
            for i in 0..distance.min(n) {
                let (entry, layout) = entry_at(ahead, i);
                index.look_ahead(entry, &layout, stage, &mut ahead[i].3);
            }
        }
        for i in 0..n {
            for (stage, distance) in STAGES {
                if let Some(j) = Some(i + distance).filter(|&j| j < n) {
                    let (entry, layout) = entry_at(ahead, j);
                    index.look_ahead(entry, &layout, stage, &mut ahead[j].3);
                }
            }
            let (offset, _, layout, prepared) = ahead[i];
            let (entry, _) = entry_at(ahead, i);
            let at = record_offset + (HEADER_BYTES + offset) as u64;
            index.push_ahead(
                position,
                location(self.segment.number, at as u32),
                entry,
                &layout,
                &prepared,
            );
            position += 1;
        }
        assert_eq!(
            position,
            first + u64::from(append.event_count),
            "an encoded append must hold exactly its event count"
        );
        if let Some((source, value)) = append.tracking() {
            index.set_tracking(source, position - 1, value, self.shared.head());
        }
        self.next_position = position;
        self.last_record_offset = record_offset;
        counters.appends.fetch_add(1, Ordering::Relaxed);
        counters
            .events
            .fetch_add(u64::from(append.event_count), Ordering::Relaxed);
        Staged::Appended(position - 1)
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        if let Some(syncer) = &self.syncer {
            let max = self.shared.options.unsynced_bytes_max as u64;
            syncer.wait_for_room(max.saturating_sub(self.buffer.len() as u64));
        }
        // A group never runs past its segment: staging rolls to the next one first.
        assert!(
            self.tail + self.buffer.len() as u64 <= self.segment.size,
            "a write of {} bytes at {} runs past segment {} ({} bytes)",
            self.buffer.len(),
            self.tail,
            self.segment.number,
            self.segment.size
        );
        self.segment
            .file
            .write_at(&self.buffer, self.tail)
            .map_err(|e| StoreError::io("write", &self.segment.path, self.tail, e))?;
        self.tail += self.buffer.len() as u64;
        self.written_bytes += self.buffer.len() as u64;
        self.shared
            .counters
            .bytes_written
            .fetch_add(self.buffer.len() as u64, Ordering::Relaxed);
        self.buffer.clear();
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        let started = Instant::now();
        self.segment
            .file
            .sync_data()
            .map_err(|e| StoreError::io("fdatasync", &self.segment.path, self.tail, e))?;
        self.shared.counters.record_fsync(started.elapsed());
        Ok(())
    }

    /// Ends the current segment: writes and syncs what is buffered for it (so a later segment
    /// never holds records while an earlier one is unsynced), then creates the next one.
    fn roll(&mut self) -> Result<(), StoreError> {
        self.flush()?;
        if self.shared.options.durability != Durability::Memory {
            self.sync()?;
        }
        // The segment now ending is what the segments after it are judged by.
        let zero_fill = self.next_zero_fill();
        let (prepared, zero_filled) = match self.next_segment.take() {
            Some((handle, prepared_zero_fill)) => (
                handle.join().unwrap_or_else(|_| {
                    Err(StoreError::Poisoned {
                        reason: "the segment preparation thread panicked".into(),
                    })
                }),
                prepared_zero_fill,
            ),
            None => {
                let segment = Segment::create(
                    self.shared.io.as_ref(),
                    &self.shared.dir,
                    self.segment.number + 1,
                    self.shared.options.segment_bytes,
                    zero_fill,
                );
                (segment, zero_fill)
            }
        };
        let next = Arc::new(prepared?);
        self.shared.counters.record_segment(&next, zero_filled);
        self.shared.segments.write().push(next.clone());
        self.segment = next;
        self.tail = SEGMENT_HEADER_BYTES;
        self.last_record_offset = 0;
        self.segment_began = (
            self.written_bytes,
            self.shared.counters.fsyncs.load(Ordering::Relaxed),
        );
        // A segment has filled since open, so appends may come as fast as the disk takes
        // them: writing the next segment's zeros then needs all the time this one lasts (begun
        // at half, at 200 MB/s of 512-event appends, it was late and the writer waited for it
        // up to a second; begun here, the rate rose 10%).
        self.prepare_next_segment(zero_fill);
        Ok(())
    }
}

/// The writer's role: the writer's state, taken by the writer thread for each group it
/// commits, or by a caller that finds the store idle and commits its own append on its own
/// thread (see [`WriterRole::commit_alone`]). Readers never take it; appenders only try it.
pub(crate) struct WriterRole {
    writer: Mutex<Writer>,
    receiver: Receiver<Request>,
    syncer: Option<Arc<Syncer>>,
    shared: Arc<Shared>,
}

impl WriterRole {
    pub(crate) fn new(writer: Writer) -> Self {
        WriterRole {
            receiver: writer.receiver.clone(),
            syncer: writer.syncer.clone(),
            shared: writer.shared.clone(),
            writer: Mutex::new(writer),
        }
    }

    /// The writer thread: takes each append from the queue with whatever waits behind it, and
    /// commits them as one group. Returns when the queue is closed and empty.
    pub(crate) fn run(&self) {
        let shared = &self.shared;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Blocks for the next append rather than polling for it: on a machine with few
            // cores the client the writer has just woken often runs on the writer's core, and
            // a polling writer kept it waiting (docs/DECISIONS.md, R10).
            let hold = shared.options.durability == Durability::Synced;
            while let Ok(first) = self.receiver.recv() {
                let bytes = first.append.body.len();
                // In D3 an append staged while a sync runs waits for that sync and the next:
                // staging it at once gains nothing over staging it when the running sync ends,
                // with whatever has queued behind it by then, and held appends make groups
                // several times larger. Large appends go at once: their staging is worth
                // overlapping with the sync, or writer and disk sit idle in turn
                // (docs/DECISIONS.md, R11).
                let origin = if hold && is_small(&first.append) {
                    if let Some(syncer) = &self.syncer {
                        syncer.wait_for_running_sync();
                    }
                    Origin::Held
                } else {
                    Origin::Queued
                };
                let mut writer = self.writer.lock();
                writer.group.push(first);
                self.gather(&mut writer, bytes);
                let mut inline = writer.commit_group(origin);
                // The writer thread syncs the group on its own thread with the role released:
                // meanwhile callers stage small appends themselves (`stage_during_sync`), so
                // the staging of the next group overlaps this sync, and when it ends the next
                // group is written and synced at once. (Staged by the writer thread after the
                // sync, 64 deciding clients had the disk idle a third of the time.)
                while let (Some(sync), Some(syncer)) = (inline.take(), &self.syncer) {
                    writer.open_for_staging = true;
                    MutexGuard::unlocked(&mut writer, || syncer.run_inline(shared, sync));
                    writer.open_for_staging = false;
                    if writer.early > 0 || !writer.group.is_empty() {
                        let bytes = writer.buffer.len()
                            + writer
                                .group
                                .iter()
                                .map(|r| r.append.body.len())
                                .sum::<usize>();
                        self.gather(&mut writer, bytes);
                        inline = writer.commit_group(Origin::Held);
                    }
                }
            }
        }));
        let mut writer = self.writer.lock();
        // A segment still being prepared must not outlive the store's hold on the directory.
        if let Some((handle, _)) = writer.next_segment.take() {
            let _ = handle.join();
        }
        drop(writer);
        if result.is_err() {
            shared.poison("the writer thread panicked".into());
            // Whoever still waits must not wait forever.
            while let Ok(request) = self.receiver.try_recv() {
                request.reply.send(Err(shared
                    .poison_error()
                    .unwrap_or(StoreError::Closed)
                    .into()));
            }
        }
    }

    /// Adds to the writer's group what waits in the queue, up to `group_bytes_max` in all.
    fn gather(&self, writer: &mut Writer, mut bytes: usize) {
        while bytes < self.shared.options.group_bytes_max {
            match self.receiver.try_recv() {
                Ok(request) => {
                    bytes += request.append.body.len();
                    writer.group.push(request);
                }
                Err(_) => break,
            }
        }
    }

    /// Stages a small append on the calling thread into the next group while the writer thread
    /// syncs the group before it with the role released (see `WriterRole::run`); the writer
    /// thread writes and syncs it with the next group when that sync ends. Staging is the
    /// checks, the record's copy into the writer's buffer and the index's additions: no I/O
    /// and no waiting, so any caller may do it, an async runtime's thread included. Appends
    /// queued before it are staged first (in the order they were queued), so that one caller's
    /// appends keep the order they were submitted in. Otherwise (the role is taken, no such
    /// sync runs, the append is large, or the next group has no room for it) hands the
    /// request back, to be queued.
    pub(crate) fn stage_during_sync(&self, request: Request) -> Result<(), Request> {
        if !is_small(&request.append) {
            return Err(request);
        }
        let Some(mut writer) = self.writer.try_lock() else {
            return Err(request);
        };
        // A request parked in the group is to be staged before anything queued after it.
        if !writer.open_for_staging || !writer.group.is_empty() {
            return Err(request);
        }
        while self.shared.poison_error().is_none() {
            let Ok(queued) = self.receiver.try_recv() else {
                return self.stage_early(&mut writer, request);
            };
            if let Err(queued) = self.stage_early(&mut writer, queued) {
                // No room: it goes first in the writer thread's next group, and what is still
                // queued (this request last) follows it there.
                writer.group.push(queued);
                break;
            }
        }
        Err(request)
    }

    /// Stages `request` into the next group for [`WriterRole::stage_during_sync`], or hands it
    /// back when the next group or the segment has no room for it.
    fn stage_early(&self, writer: &mut Writer, mut request: Request) -> Result<(), Request> {
        let stored = aligned(HEADER_BYTES + request.append.body.len());
        let buffered = writer.buffer.len() + stored;
        if buffered > self.shared.options.group_bytes_max
            || writer.tail + buffered as u64 > writer.segment.size
        {
            return Err(request);
        }
        let staged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            writer.stage(&request, now_us())
        }));
        let Ok(staged) = staged else {
            self.shared
                .poison("the writer panicked staging an append on its caller's thread".into());
            request.reply.send(Err(StoreError::Poisoned {
                reason: "the writer panicked staging this append".into(),
            }
            .into()));
            return Ok(());
        };
        let (needed, outcome) = match staged {
            Staged::Appended(last) => (last, Ok(last)),
            // In D3 every outcome waits for a sync: a conflict may name a staged event.
            Staged::Done(outcome) => (writer.next_position - 1, outcome),
        };
        self.shared
            .recycle_body(std::mem::take(&mut request.append.body));
        writer.early += 1;
        writer.waiters.push(Waiter {
            needed,
            reply: request.reply,
            outcome,
        });
        self.shared
            .counters
            .caller_stages
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Commits, on the calling thread, appends that the database behind a PostgreSQL store has
    /// committed (the committer's hand-over to the mirror log, see postgres.rs), waiting for
    /// the role if another thread holds it. The mirror's appends all come this way, so its
    /// queue stays empty and its writer thread idle: the hand-over costs no wake-up. In the
    /// mirror's class (D1) every append is answered before this returns.
    pub(crate) fn commit_committed(&self, requests: Vec<Request>) {
        let mut writer = self.writer.lock();
        debug_assert!(writer.group.is_empty() && self.receiver.is_empty());
        writer.group.extend(requests);
        let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let inline = writer.commit_group(Origin::Backend);
            if let (Some(sync), Some(syncer)) = (inline, &self.syncer) {
                syncer.run_inline(&self.shared, sync);
            }
        }));
        if committed.is_err() {
            self.shared
                .poison("the writer panicked taking in committed appends".into());
        }
    }

    /// Commits `request` on the calling thread, a blocking caller that is the only one waiting
    /// on the store (see [`Waiting::alone`]), when the store is idle: nothing is queued, no
    /// sync runs or waits to run, and the role is free. The request then takes the writer thread's path (the lone group's inline sync
    /// included) without being handed to the writer and back: a wake-up of a sleeping thread,
    /// tens of microseconds on a virtual machine whose idle cores halt, against a 100 us
    /// fdatasync. Otherwise hands the request back, to be queued.
    ///
    /// Async callers never commit here. A server's appends come from request tasks that,
    /// between one append and the next, answer a client and read its next request: at a given
    /// moment none may be waiting on the store while tens of requests wait in the runtime,
    /// where the store cannot see them. Letting a lone async caller commit (and fdatasync) on
    /// its runtime's thread fed on itself: each such commit held a runtime thread for an
    /// fdatasync, so the next request reached the store alone too, and group commit collapsed
    /// to about one append per fdatasync (docs/DECISIONS.md, R12).
    pub(crate) fn commit_alone(&self, request: Request) -> Result<(), Request> {
        if !self.receiver.is_empty() || self.syncer.as_ref().is_some_and(|s| s.busy()) {
            return Err(request);
        }
        let Some(mut writer) = self.writer.try_lock() else {
            return Err(request);
        };
        // Queued meanwhile: the writer thread is waiting for the role and takes it in turn.
        if !self.receiver.is_empty() {
            return Err(request);
        }
        writer.group.push(request);
        let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let inline = writer.commit_group(Origin::Caller);
            if let (Some(sync), Some(syncer)) = (inline, &self.syncer) {
                syncer.run_inline(&self.shared, sync);
            }
        }));
        if committed.is_err() {
            // The unwinding dropped the request's reply, which answered it with an error.
            self.shared
                .poison("the writer panicked in a caller's commit".into());
        }
        Ok(())
    }
}

/// When a conditional append fails: the position of the last event of the append it retries,
/// if it is one. It is when every event carries an id and the first events matching the
/// condition's query after its `after` are as many as the append's and carry the same ids in
/// the same order (UmaDB's rule; an id is not a key, and content is not compared).
/// An append's outcome when its checks settle it before it is staged: its condition fails (or
/// it is recognised as the retry of an append already stored), or its tracking position is not
/// above the one recorded; None when it is to be stored. `pending_match` and
/// `pending_tracking` look among appends accepted but not yet in the index (the PostgreSQL
/// committer's group; the writer stages each append before checking the next, so has none).
pub(crate) fn checked(
    index: &crate::index::Index,
    counters: &crate::store::Counters,
    request: &Request,
    pending_match: impl Fn(&crate::Query, u64) -> Option<u64>,
    pending_tracking: impl Fn(&str) -> Option<u64>,
) -> Option<Result<u64, AppendError>> {
    let append = &request.append;
    if let Some(condition) = &request.condition {
        let (query, after) = (
            &condition.fail_if_events_match,
            condition.after.unwrap_or(0),
        );
        let found = index
            .first_query_match_after(query, after)
            .or_else(|| pending_match(query, after));
        if let Some(position) = found {
            if let Some(last) = retried_append(index, append, query, after) {
                counters.idempotent_retries.fetch_add(1, Ordering::Relaxed);
                return Some(Ok(last));
            }
            counters.conditions_failed.fetch_add(1, Ordering::Relaxed);
            return Some(Err(AppendError::ConditionFailed { position }));
        }
    }
    let (source, given) = append.tracking()?;
    let recorded = pending_tracking(source).or_else(|| index.tracking_staged(source))?;
    (given <= recorded).then(|| {
        Err(AppendError::TrackingNotIncreasing {
            name: source.to_owned(),
            recorded,
            given,
        })
    })
}

fn retried_append(
    index: &crate::index::Index,
    append: &EncodedAppend,
    query: &crate::Query,
    after: u64,
) -> Option<u64> {
    if !append.all_ids {
        return None;
    }
    let count = append.event_count as usize;
    let matches = index.first_matches_after(query, after, count);
    if matches.len() != count {
        return None;
    }
    let same = Entries::new(append.entries(), append.event_count)
        .zip(&matches)
        .all(|((_, entry, layout), &p)| layout.id(entry).map(|id| id.as_u128()) == index.id_at(p));
    same.then(|| matches[count - 1])
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::sim::SimIo;
    use crate::{Options, Store};

    /// A waker that counts its wake-ups.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Async callers, each with its slot, its pinned wait and its counting waker.
    struct Callers {
        slots: Vec<Arc<AsyncSlot>>,
        wakes: Vec<Arc<Counting>>,
    }

    impl Callers {
        fn new(n: usize) -> Self {
            Callers {
                slots: (0..n).map(|_| Arc::new(AsyncSlot::default())).collect(),
                wakes: (0..n)
                    .map(|_| Arc::new(Counting(std::sync::atomic::AtomicUsize::new(0))))
                    .collect(),
            }
        }

        fn poll(&self, i: usize, wait: &mut AsyncWait<'_>) -> Poll<Result<u64, AppendError>> {
            let waker = Waker::from(self.wakes[i].clone());
            std::future::Future::poll(std::pin::Pin::new(wait), &mut Context::from_waker(&waker))
        }

        fn woken(&self) -> Vec<usize> {
            self.wakes
                .iter()
                .map(|w| w.0.load(Ordering::SeqCst))
                .collect()
        }

        /// Answers caller i with position i + 1, all in one batch.
        fn answer(&self) {
            let mut answers = Answers::default();
            for (i, slot) in self.slots.iter().enumerate() {
                answers.send(Reply::new(ReplyTo::Async(slot.clone())), Ok(i as u64 + 1));
            }
            answers.wake();
        }
    }

    #[test]
    fn a_batch_of_async_answers_wakes_one_caller_which_wakes_the_others() {
        let callers = Callers::new(5);
        let mut waits: Vec<_> = callers.slots.iter().map(|s| s.wait()).collect();
        for (i, wait) in waits.iter_mut().enumerate() {
            assert!(callers.poll(i, wait).is_pending());
        }
        callers.answer();
        assert_eq!(callers.woken(), [1, 0, 0, 0, 0], "only the first is woken");
        assert!(callers.slots.iter().all(|s| s.filled()));
        assert!(matches!(callers.poll(0, &mut waits[0]), Poll::Ready(Ok(1))));
        assert_eq!(
            callers.woken(),
            [1, 1, 1, 1, 1],
            "the first woke the others"
        );
        for (i, wait) in waits.iter_mut().enumerate().skip(1) {
            match callers.poll(i, wait) {
                Poll::Ready(Ok(p)) => assert_eq!(p, i as u64 + 1),
                _ => panic!("caller {i} has no answer"),
            }
        }
        drop(waits);
        assert_eq!(callers.woken(), [1, 1, 1, 1, 1], "nobody is woken twice");
    }

    #[test]
    fn callers_that_stopped_waiting_or_never_slept_pass_the_wake_ups_on() {
        // Caller 0 polls without sleeping (never registered a waker), caller 1 stops waiting
        // before the answers, caller 2 is woken first and then drops its wait unpolled.
        let callers = Callers::new(5);
        let mut waits: Vec<_> = callers.slots.iter().map(|s| s.wait()).collect();
        for (i, wait) in waits.iter_mut().enumerate().skip(1) {
            assert!(callers.poll(i, wait).is_pending());
        }
        let mut waits = waits.into_iter();
        let first = waits.next().unwrap();
        drop(waits.next());
        let third = waits.next().unwrap();
        let mut rest: Vec<_> = waits.collect();
        callers.answer();
        assert_eq!(
            callers.woken(),
            [0, 0, 1, 0, 0],
            "the first still asleep leads"
        );
        drop(third);
        assert_eq!(
            callers.woken(),
            [0, 0, 1, 1, 1],
            "dropped, it still woke the others"
        );
        for (i, wait) in rest.iter_mut().enumerate() {
            assert!(callers.poll(i + 3, wait).is_ready());
        }
        assert!(callers.slots[0].filled(), "the poller finds its answer");
        drop(first);

        // A lone answer wakes its caller directly.
        let callers = Callers::new(1);
        let mut wait = callers.slots[0].wait();
        assert!(callers.poll(0, &mut wait).is_pending());
        Reply::new(ReplyTo::Async(callers.slots[0].clone())).send(Ok(9));
        assert_eq!(callers.woken(), [1]);
        assert!(matches!(callers.poll(0, &mut wait), Poll::Ready(Ok(9))));
    }

    #[test]
    fn only_a_lone_caller_polls_and_only_on_a_fast_disk() {
        let store =
            Store::open_with_io(Arc::new(SimIo::new(7)), Path::new("/s"), Options::default())
                .unwrap();
        let shared = store.shared();
        shared
            .counters
            .fsync_recent_us
            .store(200, Ordering::Relaxed);
        let first = Waiting::start(shared);
        assert!(first.keep_polling(), "alone on a fast disk");
        let second = Waiting::start(shared);
        assert!(
            !second.keep_polling(),
            "a caller arriving second sleeps at once"
        );
        assert!(!first.keep_polling(), "the first stops once another waits");
        drop(second);
        assert!(first.keep_polling(), "alone again, within its budget");
        drop(first);
        assert_eq!(shared.waiting.load(Ordering::Relaxed), 0);
        shared
            .counters
            .fsync_recent_us
            .store(5_000, Ordering::Relaxed);
        assert!(
            !Waiting::start(shared).keep_polling(),
            "a slow disk: sleep at once"
        );
        // The budget runs out.
        shared.counters.fsync_recent_us.store(1, Ordering::Relaxed);
        let lone = Waiting::start(shared);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!lone.keep_polling(), "past its budget");
    }
}
