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
mod check;
mod engine;
mod files;
mod notifier;
mod role;
mod syncer;

use crate::request::{Answers, Reply, ReplyTo, Request};
pub(crate) use check::{checked, count_settled};
pub(crate) use engine::{start, FileEngine};
pub(crate) use files::FileLog;
pub(crate) use notifier::Notifier;
pub(crate) use role::WriterRole;
pub(crate) use syncer::{Syncer, Waiter};

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Receiver;
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::error::{AppendError, StoreError};
use crate::index::{location, Ahead, AheadStage};
use crate::options::Durability;
use crate::published::{Mark, PublishRight};
use crate::record::{aligned, EncodedAppend, Entries, EntryLayout, RecordHeader, HEADER_BYTES};
use crate::recovery::Tail;
use crate::route::{Backend, Route};
use crate::segment::{Segment, SEGMENT_HEADER_BYTES};
use crate::shared::Shared;

/// The answer to an append whose record went to a segment by a write, or was to be made
/// durable by a sync, that failed: the record may be on disk or not (a later open finds out),
/// so neither success nor "nothing was appended" would be true.
pub(crate) fn write_failed(reason: &str) -> StoreError {
    StoreError::OutcomeUnknown {
        reason: format!("{reason}; the store is poisoned until it is reopened"),
    }
}

/// The answer to an append refused for lack of room.
fn disk_full(reason: &str) -> AppendError {
    StoreError::DiskFull {
        reason: reason.to_owned(),
    }
    .into()
}

/// Why segment `number` of `size` bytes cannot be made in `dir`, when the file system says it
/// has less room than that beside the `reserve` the store leaves alone.
fn no_room(
    io: &dyn crate::io::Io,
    dir: &std::path::Path,
    number: u32,
    size: u64,
    reserve: u64,
) -> Option<String> {
    match io.available_bytes(dir) {
        Ok(Some(available)) if available < size.saturating_add(reserve) => Some(format!(
            "segment {number} needs {size} bytes and {reserve} are kept in reserve; the file \
             system has {available} free"
        )),
        _ => None,
    }
}

/// Creates segment `number`, unless the file system has no room for it: then what was made of
/// it is removed, and the answer is [`StoreError::DiskFull`], which poisons nothing (the
/// segment held no record). Any other failure is the store's, as before.
fn make_segment(
    io: &dyn crate::io::Io,
    dir: &std::path::Path,
    number: u32,
    size: u64,
    reserve: u64,
    zero_fill: bool,
) -> Result<Segment, StoreError> {
    if let Some(reason) = no_room(io, dir, number, size, reserve) {
        return Err(StoreError::DiskFull { reason });
    }
    match Segment::create(io, dir, number, size, zero_fill) {
        Err(StoreError::Io {
            operation,
            path,
            offset,
            source,
        }) if crate::io::is_no_space(&source) => {
            // Not yet a segment of the log: no record was written to it.
            let _ = io.remove(&path);
            let _ = io.sync_dir(dir);
            Err(StoreError::DiskFull {
                reason: format!(
                    "{operation} failed on {} at offset {offset}: {source}",
                    path.display()
                ),
            })
        }
        other => other,
    }
}

pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
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
    /// The store's one right to publish (shared with the syncer and the notifier).
    right: PublishRight,
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
        right: PublishRight,
    ) -> Self {
        Writer {
            shared,
            right,
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

    /// Starts preparing the segment after the current one on a background thread, unless the
    /// file system is known to lack the room, or lacked it at the last roll (the roll into it
    /// tries again, on the writer's thread: no segment is begun and removed for every group
    /// on a file system that cannot tell its free space).
    fn prepare_next_segment(&mut self, zero_fill: bool) {
        if self.shared.health.disk_full().is_some() {
            return;
        }
        let io = self.shared.io.clone();
        let dir = self.shared.dir.clone();
        let number = self.segment.number + 1;
        let size = self.shared.options.segment_bytes;
        let reserve = self.shared.options.disk_reserve();
        if no_room(io.as_ref(), &dir, number, size, reserve).is_some() {
            return;
        }
        self.next_segment = std::thread::Builder::new()
            .name("annals-segment".into())
            .spawn(move || make_segment(io.as_ref(), &dir, number, size, reserve, zero_fill))
            .ok()
            .map(|handle| (handle, zero_fill));
    }

    /// Commits the group gathered in `self.group` (and what callers staged early) by `route`.
    /// Returns the group's sync when the committer is to run it on its own thread.
    fn commit_group(&mut self, route: Route) -> Option<InlineSync> {
        let mut group = std::mem::take(&mut self.group);
        let mut staged = std::mem::take(&mut self.staged);
        let inline = self.commit(&mut group, &mut staged, route);
        self.group = group;
        self.staged = staged;
        inline
    }

    /// One group's commit, in its four steps: stage (checks, records into the buffer, the
    /// index's additions), write, answer (publish and reply, or park the replies until the
    /// sync), sync (here, or handed to the syncer).
    fn commit(
        &mut self,
        group: &mut Vec<Request>,
        staged: &mut Vec<Staged>,
        route: Route,
    ) -> Option<InlineSync> {
        staged.clear();
        if let Some(error) = self.shared.poison_error() {
            for request in group.drain(..) {
                request.reply.send(Err(StoreError::Poisoned {
                    reason: error.to_string(),
                }
                .into()));
            }
            self.abandon_early(&error.to_string(), false);
            return None;
        }
        let staging = self.stage_group(group, staged);
        let written = staging.and_then(|()| self.write_group());
        if let Err(error) = written {
            self.fail(error, group, staged);
            return None;
        }
        let (mark, lone, mut waiters) = self.answer_group(group, staged, route);
        let inline = self.sync_group(mark, lone, route, &mut waiters);
        self.waiters = waiters;
        inline
    }

    /// Stages each request of the group, rolling to a new segment where the current one has
    /// no room. Requests after a failed roll are answered without being staged: refused for
    /// lack of room (the disk-full state), or, after any other failure, by that failure.
    fn stage_group(
        &mut self,
        group: &[Request],
        staged: &mut Vec<Staged>,
    ) -> Result<(), StoreError> {
        let appended_at = now_us();
        let mut failure: Option<StoreError> = None;
        // Why the appends from the first that needed a new segment on are refused: the file
        // system had no room for it. Nothing of them is written; what went before stays.
        let mut no_room: Option<String> = None;
        for request in group {
            if failure.is_some() {
                staged.push(Staged::Done(Err(StoreError::Closed.into())));
                continue;
            }
            if let Some(reason) = &no_room {
                self.shared
                    .counters
                    .disk_full_refusals
                    .fetch_add(1, Ordering::Relaxed);
                staged.push(Staged::Done(Err(disk_full(reason))));
                continue;
            }
            let stored = aligned(HEADER_BYTES + request.append.body.len()) as u64;
            if self.tail + self.buffer.len() as u64 + stored > self.segment.size {
                match self.roll() {
                    Ok(()) => {}
                    Err(StoreError::DiskFull { reason }) => {
                        self.shared.health.enter_disk_full(&reason);
                        self.shared
                            .counters
                            .disk_full_refusals
                            .fetch_add(1, Ordering::Relaxed);
                        staged.push(Staged::Done(Err(disk_full(&reason))));
                        no_room = Some(reason);
                        continue;
                    }
                    Err(e) => {
                        failure = Some(e);
                        staged.push(Staged::Done(Err(StoreError::Closed.into())));
                        continue;
                    }
                }
            }
            staged.push(self.stage(request, appended_at));
        }
        failure.map_or(Ok(()), Err)
    }

    /// Writes what the group staged (and what callers staged early) to the segment.
    fn write_group(&mut self) -> Result<(), StoreError> {
        let written = self.flush();
        // The segment the store opened with prepares its successor once half of it is used;
        // later ones do from the roll into them (see `roll`).
        if self.next_segment.is_none() && self.tail > self.segment.size / 2 {
            self.prepare_next_segment(self.next_zero_fill());
        }
        written
    }

    /// Counts the written group on its route, publishes it where the policy acknowledges
    /// appends once written, and answers each request or parks its reply until the sync that
    /// covers it. Returns where the log ends, whether the group is a lone small append, and
    /// the parked replies.
    fn answer_group(
        &mut self,
        group: &mut Vec<Request>,
        staged: &mut Vec<Staged>,
        route: Route,
    ) -> (Mark, bool, Vec<Waiter>) {
        let policy = self.shared.policy;
        let counters = &self.shared.counters;
        counters.groups.fetch_add(1, Ordering::Relaxed);
        if route == Route::Alone {
            counters.caller_commits.fetch_add(1, Ordering::Relaxed);
        }
        let early = std::mem::take(&mut self.early);
        counters.group_appends.record((group.len() + early) as u64);
        // A lone small append, queued with nothing behind it: nothing to overlap its sync with.
        let lone = group.len() == 1
            && early == 0
            && is_small(&group[0].append)
            && self.receiver.is_empty();
        // On a database the committer counts its appends; its mirror's writer does not again.
        // A replica's copy counts here what it takes in from its backup, as `replicated`.
        if policy.backend != Backend::Postgres {
            let appended = staged
                .iter()
                .filter(|s| matches!(s, Staged::Appended(_)))
                .count();
            counters.committed(route, appended);
        }
        let mark = Mark {
            head: self.next_position - 1,
            segment: self.segment.number,
            end_offset: self.tail,
            last_record_offset: self.last_record_offset,
        };
        if policy.acknowledge_when_written && mark.head > self.shared.head() {
            self.shared.published.publish(&self.right, mark);
            self.shared.maybe_checkpoint();
        }
        let durability = self.shared.options.durability;
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
                Durability::Synced | Durability::OffMachine => !policy.acknowledge_when_written,
                _ => request.require_synced && outcome.is_ok(),
            };
            if wait {
                waiters.push(Waiter {
                    needed,
                    reply: request.reply,
                    outcome,
                    trace: request.trace,
                });
            } else {
                answers.send(request.reply, outcome);
            }
        }
        answers.wake();
        (mark, lone, waiters)
    }

    /// Hands the written group to the sync: here, on the committer's thread (returned), or to
    /// the syncer thread; without a syncer (D0) the parked replies are answered now.
    fn sync_group(
        &mut self,
        mark: Mark,
        lone: bool,
        route: Route,
        waiters: &mut Vec<Waiter>,
    ) -> Option<InlineSync> {
        let Some(syncer) = &self.syncer else {
            for w in waiters.drain(..) {
                w.reply.send(w.outcome);
            }
            return None;
        };
        // Syncing here saves the hand-over to the syncer thread (a wake-up on each side, tens
        // of microseconds on a virtual machine whose idle cores halt); `Policy::sync_here`
        // says when there is nothing to overlap the sync with.
        let sync_here = self.shared.policy.sync_here(route, lone);
        let bytes = self.written_bytes;
        if sync_here && syncer.claim_inline(mark, bytes, &self.segment, waiters) {
            return Some(InlineSync {
                mark,
                bytes,
                segment: self.segment.clone(),
            });
        }
        syncer.written(&self.shared, mark, bytes, &self.segment, waiters);
        None
    }

    /// The store is poisoned: answers what callers staged early. Their records were in the
    /// buffer of a write that failed when `written` (they may be on disk or not), and will
    /// never be written otherwise.
    fn abandon_early(&mut self, reason: &str, written: bool) {
        self.early = 0;
        self.buffer.clear();
        for w in self.waiters.drain(..) {
            if written {
                w.fail(reason);
            } else {
                w.reply.send(Err(StoreError::Poisoned {
                    reason: reason.to_owned(),
                }
                .into()));
            }
        }
    }

    /// A write failed: poison the store and tell every append of the group. Those staged were
    /// in what was being written, or written before in this group: their outcome is unknown.
    /// Those not staged (their checks failed, or the group stopped before them) were not.
    fn fail(&mut self, error: StoreError, group: &mut Vec<Request>, staged: &mut Vec<Staged>) {
        let reason = error.to_string();
        self.shared.poison(reason.clone());
        // What callers staged early went before the group, into the same buffer.
        self.abandon_early(&reason, true);
        for (request, outcome) in group.drain(..).zip(staged.drain(..)) {
            let e = match outcome {
                Staged::Appended(_) => write_failed(&reason).into(),
                Staged::Done(Err(AppendError::Input(e))) => AppendError::Input(e),
                Staged::Done(_) => StoreError::Poisoned {
                    reason: reason.clone(),
                }
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
        if let Some(outcome) = checked(&index, request, |_, _| None, |_| None) {
            count_settled(counters, &outcome);
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
        debug_assert!(
            !crate::index::held_here(),
            "the index lock is held across a write"
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
        debug_assert!(
            !crate::index::held_here(),
            "the index lock is held across a sync"
        );
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
                let segment = make_segment(
                    self.shared.io.as_ref(),
                    &self.shared.dir,
                    self.segment.number + 1,
                    self.shared.options.segment_bytes,
                    self.shared.options.disk_reserve(),
                    zero_fill,
                );
                (segment, zero_fill)
            }
        };
        let (prepared, zero_filled) = match prepared {
            // Prepared ahead while there was no room: there may be now.
            Err(StoreError::DiskFull { .. }) => (
                make_segment(
                    self.shared.io.as_ref(),
                    &self.shared.dir,
                    self.segment.number + 1,
                    self.shared.options.segment_bytes,
                    self.shared.options.disk_reserve(),
                    zero_fill,
                ),
                zero_fill,
            ),
            other => (other, zero_filled),
        };
        let next = Arc::new(prepared?);
        self.shared.health.leave_disk_full();
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
