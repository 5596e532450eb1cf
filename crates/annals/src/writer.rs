//! The one writer: group commit without a timer.
//!
//! Appends wait in a bounded queue. The writer takes the first, drains whatever else is already
//! waiting (up to `group_bytes_max`), and for each append in order: checks idempotency and its
//! condition against the index (which already holds the earlier appends of this group), stages
//! its record in one buffer and its events in the index. Then it writes the buffer, issues ONE
//! fdatasync (in D3), publishes the new head and acknowledges the whole group. The index lock is
//! taken per append, never across I/O. A failed write or sync poisons the store.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Receiver;
use parking_lot::{Condvar, Mutex};

use crate::checkpoint::Mark;
use crate::error::{AppendError, InputError, StoreError};
use crate::index::location;
use crate::options::Durability;
use crate::query::AppendCondition;
use crate::record::{aligned, EncodedAppend, Entries, RecordHeader, HEADER_BYTES};
use crate::recovery::Tail;
use crate::segment::{Segment, SEGMENT_HEADER_BYTES};
use crate::store::Shared;

/// Where a caller waits for its append's outcome.
pub(crate) struct Completion {
    slot: Mutex<Option<Result<u64, AppendError>>>,
    ready: Condvar,
}

thread_local! {
    /// A caller waits for one append at a time, so each thread reuses one completion.
    static COMPLETION: Arc<Completion> = Arc::new(Completion {
        slot: Mutex::new(None),
        ready: Condvar::new(),
    });
}

impl Completion {
    pub(crate) fn for_this_thread() -> Arc<Completion> {
        COMPLETION.with(Arc::clone)
    }

    fn set(&self, outcome: Result<u64, AppendError>) {
        *self.slot.lock() = Some(outcome);
        self.ready.notify_one();
    }

    pub(crate) fn wait(&self) -> Result<u64, AppendError> {
        let mut slot = self.slot.lock();
        loop {
            if let Some(outcome) = slot.take() {
                return outcome;
            }
            self.ready.wait(&mut slot);
        }
    }
}

pub(crate) enum Reply {
    Blocking(Arc<Completion>),
    Callback(Box<dyn FnOnce(Result<u64, AppendError>) + Send>),
}

impl Reply {
    fn send(self, outcome: Result<u64, AppendError>) {
        match self {
            Reply::Blocking(c) => c.set(outcome),
            Reply::Callback(f) => f(outcome),
        }
    }
}

pub(crate) struct Request {
    pub(crate) append: EncodedAppend,
    pub(crate) condition: Option<AppendCondition>,
    pub(crate) require_synced: bool,
    pub(crate) reply: Reply,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Background syncing for D1 and D2 stores: D2 syncs whenever something is unsynced; D1 only
/// when an append asked for D3. Appends that asked for D3 wait here for their sync.
pub(crate) struct Syncer {
    state: Mutex<SyncState>,
    wake: Condvar,
}

struct SyncState {
    written: u64,
    synced: u64,
    segment: Arc<Segment>,
    waiters: Vec<(u64, Reply)>,
    stop: bool,
}

impl Syncer {
    pub(crate) fn new(segment: Arc<Segment>, head: u64) -> Self {
        Syncer {
            state: Mutex::new(SyncState {
                written: head,
                synced: head,
                segment,
                waiters: Vec::new(),
                stop: false,
            }),
            wake: Condvar::new(),
        }
    }

    fn written(&self, position: u64, segment: &Arc<Segment>, waiters: Vec<(u64, Reply)>) {
        let mut state = self.state.lock();
        state.written = position;
        if !Arc::ptr_eq(&state.segment, segment) {
            state.segment = segment.clone();
        }
        state.waiters.extend(waiters);
        self.wake.notify_one();
    }

    pub(crate) fn stop(&self) {
        self.state.lock().stop = true;
        self.wake.notify_one();
    }

    pub(crate) fn run(&self, shared: &Shared) {
        let always = shared.options.durability == Durability::SyncedLater;
        loop {
            let (target, segment) = {
                let mut state = self.state.lock();
                loop {
                    let wanted = always || state.stop || !state.waiters.is_empty();
                    if wanted && state.written > state.synced {
                        break;
                    }
                    if state.stop {
                        return;
                    }
                    self.wake.wait(&mut state);
                }
                (state.written, state.segment.clone())
            };
            let started = Instant::now();
            let result = segment.file.sync_data();
            shared.counters.record_fsync(started.elapsed());
            let mut state = self.state.lock();
            match result {
                Ok(()) => {
                    state.synced = target;
                    let (done, waiting): (Vec<_>, Vec<_>) =
                        state.waiters.drain(..).partition(|(p, _)| *p <= target);
                    state.waiters = waiting;
                    drop(state);
                    for (position, reply) in done {
                        reply.send(Ok(position));
                    }
                }
                Err(e) => {
                    let error = StoreError::io("fdatasync", &segment.path, 0, e);
                    shared.poison(error.to_string());
                    let waiters = std::mem::take(&mut state.waiters);
                    state.stop = true;
                    drop(state);
                    for (_, reply) in waiters {
                        reply.send(Err(StoreError::Poisoned {
                            reason: error.to_string(),
                        }
                        .into()));
                    }
                    return;
                }
            }
        }
    }
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
        }
    }

    pub(crate) fn run(mut self) {
        let shared = self.shared.clone();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut group: Vec<Request> = Vec::new();
            let mut staged: Vec<Staged> = Vec::new();
            while let Ok(first) = self.receiver.recv() {
                let mut bytes = first.append.body.len();
                group.push(first);
                while bytes < self.shared.options.group_bytes_max {
                    match self.receiver.try_recv() {
                        Ok(request) => {
                            bytes += request.append.body.len();
                            group.push(request);
                        }
                        Err(_) => break,
                    }
                }
                self.commit(&mut group, &mut staged);
            }
        }));
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

    fn commit(&mut self, group: &mut Vec<Request>, staged: &mut Vec<Staged>) {
        staged.clear();
        if let Some(error) = self.shared.poison_error() {
            for request in group.drain(..) {
                request.reply.send(Err(StoreError::Poisoned {
                    reason: error.to_string(),
                }
                .into()));
            }
            return;
        }
        let durability = self.shared.options.durability;
        let appended_at = now_us();
        let mut group_first = self.next_position;
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
                group_first = self.next_position;
            }
            staged.push(self.stage(request, group_first, appended_at));
        }
        let last = self.next_position - 1;
        let wrote = !self.buffer.is_empty();
        if failure.is_none() && wrote {
            let synced_inline = durability == Durability::Synced;
            if cfg!(feature = "canary-ack-before-fsync") && synced_inline {
                // Deliberately wrong: acknowledge, then write and sync.
                self.publish(last);
                self.reply(group, staged, false);
                if let Err(e) = self.flush().and_then(|()| self.sync()) {
                    self.shared.poison(e.to_string());
                }
                return;
            }
            let result = self.flush().and_then(|()| {
                if synced_inline {
                    self.sync()
                } else {
                    Ok(())
                }
            });
            if let Err(e) = result {
                failure = Some(e);
            }
        }
        if let Some(error) = failure {
            let reason = error.to_string();
            self.shared.poison(reason.clone());
            let mut first = Some(error);
            for (request, outcome) in group.drain(..).zip(staged.drain(..)) {
                let e = match (outcome, first.take()) {
                    (Staged::Done(Err(AppendError::Input(e))), taken) => {
                        first = taken;
                        AppendError::Input(e)
                    }
                    (_, Some(e)) => e.into(),
                    (_, None) => StoreError::Poisoned {
                        reason: reason.clone(),
                    }
                    .into(),
                };
                request.reply.send(Err(e));
            }
            return;
        }
        if wrote {
            self.publish(last);
        }
        self.shared.counters.groups.fetch_add(1, Ordering::Relaxed);
        let defer = durability < Durability::Synced && durability != Durability::Memory;
        self.reply(group, staged, defer);
    }

    /// Sends each request its outcome; with `defer`, appends that asked for D3 go to the syncer.
    fn reply(&mut self, group: &mut Vec<Request>, staged: &mut Vec<Staged>, defer: bool) {
        let mut waiters = Vec::new();
        for (request, outcome) in group.drain(..).zip(staged.drain(..)) {
            match outcome {
                Staged::Appended(last) if defer && request.require_synced => {
                    waiters.push((last, request.reply));
                }
                Staged::Appended(last) => request.reply.send(Ok(last)),
                Staged::Done(result) => request.reply.send(result),
            }
        }
        if let Some(syncer) = &self.syncer {
            syncer.written(self.next_position - 1, &self.segment, waiters);
        }
    }

    fn publish(&self, head: u64) {
        self.shared.publish(Mark {
            head,
            segment: self.segment.number,
            end_offset: self.tail,
            last_record_offset: self.last_record_offset,
        });
    }

    /// Checks one request and, if it may go, adds its record to the buffer and its events to
    /// the index.
    fn stage(&mut self, request: &Request, group_first: u64, appended_at: u64) -> Staged {
        let counters = &self.shared.counters;
        let mut index = self.shared.index.write();
        let append = &request.append;
        if append.has_ids {
            if let Some(outcome) = idempotent_outcome(&index, append) {
                if outcome.is_ok() {
                    counters.idempotent_retries.fetch_add(1, Ordering::Relaxed);
                }
                return Staged::Done(outcome.map_err(AppendError::Input));
            }
        }
        if let Some(condition) = &request.condition {
            let resolved = index.resolve(&condition.fail_if_events_match);
            if let Some(position) =
                index.first_match_after(&resolved, condition.after.unwrap_or(0))
            {
                counters.conditions_failed.fetch_add(1, Ordering::Relaxed);
                return Staged::Done(Err(AppendError::ConditionFailed { position }));
            }
        }
        let first = self.next_position;
        let record_offset = self.tail + self.buffer.len() as u64;
        let mut header = [0u8; HEADER_BYTES];
        RecordHeader::encode(&mut header, append, first, group_first, appended_at);
        self.buffer.extend_from_slice(&header);
        self.buffer.extend_from_slice(&append.body);
        let padded = aligned(self.buffer.len());
        self.buffer.resize(padded, 0);
        let mut position = first;
        for (offset, entry, layout) in Entries::new(&append.body, append.event_count) {
            let at = record_offset + (HEADER_BYTES + offset) as u64;
            index.push(position, location(self.segment.number, at as u32), entry, &layout);
            position += 1;
        }
        assert_eq!(
            position,
            first + u64::from(append.event_count),
            "an encoded append must hold exactly its event count"
        );
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
        self.segment
            .file
            .write_at(&self.buffer, self.tail)
            .map_err(|e| StoreError::io("write", &self.segment.path, self.tail, e))?;
        self.tail += self.buffer.len() as u64;
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
        if self.shared.options.record_synced_length {
            let record = format!("{} {}\n", self.segment.number, self.tail);
            let path = self.shared.dir.join("synced-length");
            let file = self
                .shared
                .io
                .open(&path, crate::io::OpenMode::Create)
                .map_err(|e| StoreError::io("record synced length", &path, 0, e))?;
            file.write_at(format!("{record:<64}").as_bytes(), 0)
                .map_err(|e| StoreError::io("record synced length", &path, 0, e))?;
        }
        Ok(())
    }

    /// Ends the current segment: writes and syncs what is buffered for it (so a later segment
    /// never holds records while an earlier one is unsynced), then creates the next one.
    fn roll(&mut self) -> Result<(), StoreError> {
        self.flush()?;
        if self.shared.options.durability != Durability::Memory {
            self.sync()?;
        }
        let next = Arc::new(Segment::create(
            self.shared.io.as_ref(),
            &self.shared.dir,
            self.segment.number + 1,
            self.shared.options.segment_bytes,
        )?);
        self.shared.segments.write().push(next.clone());
        self.segment = next;
        self.tail = SEGMENT_HEADER_BYTES;
        self.last_record_offset = 0;
        Ok(())
    }
}

/// If the append's events carry ids already stored: the original last position when this is a
/// faithful retry, an error when it is not. None when none of the ids is stored.
fn idempotent_outcome(
    index: &crate::index::Index,
    append: &EncodedAppend,
) -> Option<Result<u64, InputError>> {
    let mut found = 0u32;
    let mut first_position = 0u64;
    let mut conflict = None;
    for (i, (_, entry, layout)) in Entries::new(&append.body, append.event_count).enumerate() {
        let Some(id) = layout.id(entry) else {
            continue;
        };
        match index.id_entry(id.as_u128()) {
            Some((position, crc)) => {
                if found == 0 {
                    first_position = position.saturating_sub(i as u64);
                }
                found += 1;
                let same = position == first_position + i as u64
                    && crc == crc32c::crc32c(layout.content(entry));
                if !same && conflict.is_none() {
                    conflict = Some(id);
                }
            }
            None => {
                if conflict.is_none() {
                    conflict = Some(id);
                }
            }
        }
    }
    if found == 0 {
        return None;
    }
    match conflict {
        Some(id) => Some(Err(InputError::IdConflict { id })),
        None if found == append.event_count => {
            Some(Ok(first_position + u64::from(append.event_count) - 1))
        }
        None => {
            // Some events had no id while others matched: not a faithful retry.
            let id = Entries::new(&append.body, append.event_count)
                .find_map(|(_, e, l)| l.id(e))
                .unwrap_or_default();
            Some(Err(InputError::IdConflict { id }))
        }
    }
}
