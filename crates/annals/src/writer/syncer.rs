//! The syncer thread: one fdatasync for everything written, then the head published.

use super::*;

/// The syncer thread: the "one fdatasync per batch" half of group commit.
///
/// The writer hands over each written group; the syncer takes everything written so far, issues
/// one fdatasync, then (in D3) publishes the new head and acknowledges every append it covered.
/// While it syncs, the writer stages and writes the next groups, so the disk is never idle
/// waiting for the CPU nor the CPU for the disk. In D2 it syncs whatever is unsynced, in D1 only
/// when an append asked for D3; in both, only those appends wait for it.
pub(crate) struct Syncer {
    /// The store's one right to publish.
    right: PublishRight,
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
    pub(super) needed: u64,
    pub(super) reply: Reply,
    pub(super) outcome: Result<u64, AppendError>,
    /// The append's span, which the sync that covers it links to (see `sync_once`).
    pub(super) trace: tracing::Span,
}

impl Waiter {
    /// The sync it waited for failed, or will never come (the store is poisoned): an append
    /// staged is on disk or not, one refused by its checks was not appended.
    pub(super) fn fail(self, reason: &str) {
        let e = match self.outcome {
            Ok(_) => write_failed(reason).into(),
            // Wrong whatever the log holds.
            Err(AppendError::Input(e)) => AppendError::Input(e),
            // A failed condition may name an event that the failed sync leaves off the log.
            Err(_) => StoreError::Poisoned {
                reason: reason.to_owned(),
            }
            .into(),
        };
        self.reply.send(Err(e));
    }
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
    /// Where the log ends at `synced`: what a thread that releases a waiter on `synced`
    /// publishes first, when the sync's own thread has not yet (see [`Syncer::written`]).
    synced_mark: Mark,
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
    pub(super) fn busy(&self) -> bool {
        self.syncing || self.written > self.synced
    }
}

impl Syncer {
    pub(crate) fn new(
        segment: Arc<Segment>,
        mark: Mark,
        notifier: Arc<Notifier>,
        durability: Durability,
        right: PublishRight,
    ) -> Self {
        Syncer {
            right,
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
                synced_mark: mark,
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
    pub(super) fn written(
        &self,
        shared: &Shared,
        mark: Mark,
        bytes: u64,
        segment: &Arc<Segment>,
        waiters: &mut Vec<Waiter>,
    ) {
        let mut state = self.state.lock();
        state.written_bytes = state.written_bytes.max(bytes);
        if let Some(reason) = state.failed.clone() {
            drop(state);
            // Written, and never to be synced by this store: on disk or not.
            for w in waiters.drain(..) {
                w.fail(&reason);
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
        let (synced, synced_mark) = (state.synced, state.synced_mark);
        let (ready, pending): (Vec<Waiter>, Vec<Waiter>) =
            waiters.drain(..).partition(|w| w.needed <= synced);
        state.waiters.extend(pending);
        // In D1 a group nobody waits on asks for no sync: the syncer sleeps on (a wake-up per
        // group cost a PostgreSQL store's mirror a thread switch per commit).
        if self.eager || !state.waiters.is_empty() || state.room_wanted {
            self.wake.notify_one();
        }
        drop(state);
        // A waiter that an ended sync covers, whose thread has not published it yet (it does
        // right after letting the state go, or its notifier does): publish here first. A
        // caller answered must find what its answer names (its events, or in D3 the event a
        // failed condition names) in every read it starts after the answer.
        if ready.iter().any(|w| w.needed > shared.published.head()) {
            shared.published.publish(&self.right, synced_mark);
        }
        debug_assert!(ready.iter().all(|w| w.needed <= shared.published.head()));
        let mut answers = Answers::default();
        for w in ready {
            answers.send(w.reply, w.outcome);
        }
    }

    /// Waits while more than `max` bytes are written but not synced.
    pub(super) fn wait_for_room(&self, max: u64) {
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
    pub(super) fn wait_for_running_sync(&self) {
        let mut state = self.state.lock();
        let running = state.syncs_ended;
        while state.syncing && state.syncs_ended == running {
            self.room.wait(&mut state);
        }
    }

    /// A sync runs, or something written waits for one.
    pub(super) fn busy(&self) -> bool {
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
        debug_assert!(
            !crate::index::held_here(),
            "the index lock is held across a sync"
        );
        // The group commit as a span, when an append it makes durable is traced: the fsync,
        // linked both ways with the span of every such append. Whether one is is read only
        // when something records the store's spans.
        let traced = crate::spans::recorded()
            && self
                .state
                .lock()
                .waiters
                .iter()
                .any(|w| w.needed <= target && !w.trace.is_disabled());
        let span = match traced {
            false => tracing::Span::none(),
            true => crate::spans::commit(),
        };
        let started = Instant::now();
        let result = segment
            .file
            .sync_data()
            .map_err(|e| StoreError::io("fdatasync", &segment.path, mark.end_offset, e));
        let took = started.elapsed();
        shared.counters.record_fsync(took);
        if !span.is_disabled() {
            span.record("annals.head", mark.head as i64);
            span.record("annals.fsync_us", took.as_micros() as i64);
            if result.is_err() {
                span.record("otel.status_code", "ERROR");
            }
        }
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
                let bytes = target_bytes.saturating_sub(state.synced_bytes);
                state.synced = target;
                state.synced_mark = mark;
                state.synced_bytes = state.synced_bytes.max(target_bytes);
                self.room.notify_all();
                shared.published.set_synced(&self.right, target);
                let (done, waiting): (Vec<Waiter>, Vec<Waiter>) =
                    state.waiters.drain(..).partition(|w| w.needed <= target);
                state.waiters = waiting;
                let more = state.written > state.synced;
                if more {
                    self.wake.notify_one();
                }
                drop(state);
                if !span.is_disabled() {
                    span.record("annals.appends", done.len() as i64);
                    span.record("annals.bytes", bytes as i64);
                    crate::spans::link(&span, done.iter().map(|w| &w.trace));
                }
                let publish = shared.policy.publish_when_synced;
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
                        shared.published.publish(&self.right, mark);
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
                // Every waiter's record was written before the sync that failed.
                for w in waiters {
                    w.fail(&reason);
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
    pub(super) fn claim_inline(
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

/// For crash tests: records how far the current segment is synced (see
/// `Options::record_synced_length`).
fn record_synced_length(shared: &Shared, mark: Mark) -> Result<(), StoreError> {
    if !shared.options.record_synced_length {
        return Ok(());
    }
    let path = shared.dir.join(crate::segment::SYNCED_LENGTH);
    let record = format!("{} {}", mark.segment, mark.end_offset);
    let file = shared
        .io
        .open(&path, crate::io::OpenMode::Create)
        .map_err(|e| StoreError::io("record synced length", &path, 0, e))?;
    file.write_at(format!("{record:<64}").as_bytes(), 0)
        .map_err(|e| StoreError::io("record synced length", &path, 0, e))
}
