//! A read replica: a store whose log is the backup another store writes into object storage
//! (`Store::open_replica`). It keeps a copy on files (the mirror, as on PostgreSQL), filled
//! from the backup at open and then followed as the backup grows: a thread asks for the
//! object that begins at the position after its head (the sealed segment's, else the
//! chunk), and hands its records to the copy's writer at their own positions. Reads,
//! subscriptions and read models see them as on any store; appends are refused, naming the
//! primary (the backup's lease holder).
//!
//! What it serves is in object storage, so at most as fresh as the primary's backup: the
//! backup's lag plus one poll. How far behind the backup the copy is, and whether the backup
//! can be read at all, is in [`ReplicaStats`]: a backup that fails, vanishes or is replaced
//! by another store's is a state the replica reports and polls again, never one it serves
//! through as if the backup had stopped growing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::TrySendError;
use parking_lot::{Condvar, Mutex};

use crate::archive::{
    decode_object, decode_object_header, parse_name, Decoded, Lease, Manifest, ObjectKind, LEASE,
    MANIFEST, OBJECT_HEADER_BYTES,
};
use crate::error::{InputError, StoreError};
use crate::kept::AppendStamp;
use crate::log::Log;
use crate::objects::Objects;
use crate::options::{BackupOptions, Durability};
use crate::record::{EncodedAppend, Entries, HEADER_BYTES};
use crate::request::{Reply, ReplyTo, Request};
use crate::route::Backend;
use crate::route::Route;
use crate::shared::Shared;
use crate::stats::{DatabaseStats, ReplicaStats};
use crate::writer::{FileLog, WriterRole};

/// How often a replica asks for new objects when it has caught up.
const POLL: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often, while it takes objects in, a replica lists the backup for its newest object:
/// the lag in positions, at the cost of a listing now and then rather than one per object.
const SURVEY: Duration = Duration::from_secs(10);

/// What the follower and the store share.
#[derive(Default)]
struct ReplicaState {
    url: String,
    /// Who appends to the primary, from the backup's lease.
    primary: Mutex<String>,
    objects_read: AtomicU64,
    failures: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// The last position the backup was seen to hold: the end of the newest object found
    /// (taken in, or listed by a survey), or the copy's head when a poll found nothing newer.
    backup_head: AtomicU64,
    /// The last poll failed (see `last_error`).
    failing: AtomicBool,
    /// When the last successful poll ended: its instant, and its time in microseconds since
    /// the Unix epoch.
    last_poll: Mutex<Option<(Instant, u64)>>,
    /// When a poll last found nothing newer than the copy: the copy then held everything the
    /// backup held.
    caught_up: Mutex<Option<Instant>>,
    /// The last append taken into the copy, as the backup holds it.
    last_append: Mutex<AppendStamp>,
    /// Polls finished (refresh waits for the next).
    polls: Mutex<u64>,
    polled: Condvar,
    stop: AtomicBool,
    kick: Condvar,
    kick_lock: Mutex<()>,
}

/// The replica's side of the seam: appends refused, the backup followed.
pub(crate) struct Replica {
    state: Arc<ReplicaState>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// The copy's log on files, whose writer takes what the follower reads; its queue closes
    /// when the replica stops.
    files: Option<FileLog>,
}

impl Replica {
    /// Fills the copy (written by `files`, over `shared`, which ends with `last`) from the
    /// backup, then follows it on a thread.
    pub(crate) fn start(
        backup: &BackupOptions,
        shared: Arc<Shared>,
        files: FileLog,
        last: AppendStamp,
    ) -> Result<Replica, StoreError> {
        let role = files.role().clone();
        debug_assert_eq!(
            last.last,
            shared.head(),
            "the copy ends with its last append"
        );
        let objects =
            Objects::open_existing(&backup.url, &backup.settings).map_err(StoreError::Backup)?;
        let url = objects.url().to_string();
        let manifest = objects
            .get(MANIFEST)
            .map_err(|e| StoreError::Backup(format!("{url}: {e}")))?
            .ok_or_else(|| {
                StoreError::Backup(format!(
                    "{url} holds no backup (no {MANIFEST}): a replica follows a backup that a \
                     primary (annals serve --backup) writes"
                ))
            })?;
        let manifest =
            Manifest::decode(&manifest.0).map_err(|e| StoreError::Backup(format!("{url}: {e}")))?;
        let state = Arc::new(ReplicaState {
            url,
            last_append: Mutex::new(last),
            ..ReplicaState::default()
        });
        let mut follower = Follower {
            objects,
            state: state.clone(),
            shared: shared.clone(),
            role,
            manifest,
            segment_after: None,
            primary_read: None,
            keys_seen: None,
            surveyed: None,
        };
        // Caught up before the store is handed out: a replica starts where its backup is.
        while follower.poll()? {}
        let thread = std::thread::Builder::new()
            .name("annals-replica".into())
            .spawn(move || follower.run())
            .map_err(|e| StoreError::io("spawn replica thread", "", 0, e))?;
        Ok(Replica {
            state,
            shared,
            thread: Some(thread),
            files: Some(files),
        })
    }

    pub(crate) fn stop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        {
            let _guard = self.state.kick_lock.lock();
            self.state.kick.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.files = None;
    }

    /// The last append taken into the copy (once stopped, the copy's last).
    pub(crate) fn last_append(&self) -> AppendStamp {
        *self.state.last_append.lock()
    }

    pub(crate) fn stats(&self) -> ReplicaStats {
        let head = self.shared.head();
        let backup_head = self.state.backup_head.load(Ordering::Relaxed);
        let last_poll = *self.state.last_poll.lock();
        // Both instants are set by the polls that fill the copy before the store opens.
        let seconds = |at: Option<Instant>| at.map_or(0.0, |at| at.elapsed().as_secs_f64());
        ReplicaStats {
            url: self.state.url.clone(),
            primary: self.state.primary.lock().clone(),
            state: match self.state.failing.load(Ordering::Relaxed) {
                true => "failing",
                false => "following",
            },
            head,
            backup_head,
            lag_positions: backup_head.saturating_sub(head),
            lag_seconds: seconds(*self.state.caught_up.lock()),
            last_poll_at_us: last_poll.map_or(0, |(_, us)| us),
            last_poll_age_seconds: seconds(last_poll.map(|(at, _)| at)),
            objects_read: self.state.objects_read.load(Ordering::Relaxed),
            failures: self.state.failures.load(Ordering::Relaxed),
            last_error: self.state.last_error.lock().clone(),
        }
    }

    /// Why a replica takes no append and no erasure: the primary takes them.
    pub(crate) fn refusal(&self) -> InputError {
        InputError::ReadOnlyReplica {
            backup: self.state.url.clone(),
            primary: self.state.primary.lock().clone(),
        }
    }

    fn refuse(&self, request: Request) {
        request.reply.send(Err(self.refusal().into()));
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Log for Replica {
    fn backend(&self) -> Backend {
        Backend::Replica
    }

    /// Everything a replica holds is in object storage.
    fn durability(&self) -> Durability {
        Durability::OffMachine
    }

    fn commit_alone(&self, request: Request) -> Result<(), Request> {
        self.refuse(request);
        Ok(())
    }

    fn submit(&self, request: Request, _: bool) -> Result<(), TrySendError<Request>> {
        self.refuse(request);
        Ok(())
    }

    /// Waits for the next poll of the backup to finish, so that what was in object storage
    /// when this was called is taken in.
    fn refresh(&self) -> Result<u64, StoreError> {
        let mut polls = self.state.polls.lock();
        let target = *polls + 2;
        {
            let _guard = self.state.kick_lock.lock();
            self.state.kick.notify_all();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while *polls < target && !self.state.stop.load(Ordering::Acquire) {
            if self
                .state
                .polled
                .wait_until(&mut polls, deadline)
                .timed_out()
            {
                break;
            }
        }
        Ok(self.shared.head())
    }

    fn queue_depth(&self) -> usize {
        0
    }

    fn synced(&self) -> u64 {
        self.shared.head()
    }

    fn on_local_disk(&self) -> bool {
        false
    }

    fn database_stats(&self) -> Option<DatabaseStats> {
        None
    }

    fn refusal(&self) -> Option<InputError> {
        Some(Replica::refusal(self))
    }

    fn replica_stats(&self) -> Option<ReplicaStats> {
        Some(self.stats())
    }

    /// Stops the follower, then closes the copy writer's queue.
    fn stop(mut self: Box<Self>) -> Option<AppendStamp> {
        Replica::stop(&mut self);
        Some(self.last_append())
    }
}

/// Drops the key of every subject whose erasure's receipt `append` carries, as the copy takes
/// it in: the primary's new key file, which no longer holds the key, may reach the backup
/// after the receipt, and until it does the replica would still open the subject's events.
fn take_in_receipts(keys: &crate::keys::KeyStore, append: &EncodedAppend, at_us: u64) {
    for (_, entry, layout) in Entries::new(append.entries(), append.event_count).trusted() {
        if !layout.sealed && layout.event_type(entry) == crate::subject::SUBJECT_ERASED_TYPE {
            for tag in crate::event::Tags::of(entry, &layout) {
                keys.mark_erased(tag, at_us);
            }
        }
    }
}

/// Now, in microseconds since the Unix epoch (0 before it).
fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// What identifies a record of the backup, as a kept copy records its last.
fn stamp(header: &crate::record::RecordHeader) -> AppendStamp {
    AppendStamp {
        first: header.first_position,
        last: header.last_position(),
        at: header.appended_at_us,
        bytes: header.body_len as u64,
    }
}

/// Whether the backup `backup` names holds `last` (a kept copy's last append): None when it
/// does, else why not (another backup, or one that lost it).
pub(crate) fn backup_holds(
    backup: &BackupOptions,
    last: AppendStamp,
) -> Result<Option<String>, StoreError> {
    if last.last == 0 {
        return Ok(None);
    }
    let objects =
        Objects::open_existing(&backup.url, &backup.settings).map_err(StoreError::Backup)?;
    let url = objects.url().to_string();
    let err = |e: crate::objects::ObjectError| StoreError::Backup(format!("{url}: {e}"));
    // The object holding the append: the one that begins nearest before it.
    let mut nearest: Option<(u64, String)> = None;
    for kind in [ObjectKind::Segment, ObjectKind::Chunk] {
        for listed in objects.list(kind.dir(), None).map_err(err)? {
            let Some(first) = parse_name(kind, &listed.name) else {
                continue;
            };
            if first <= last.first && nearest.as_ref().is_none_or(|(f, _)| first > *f) {
                nearest = Some((first, listed.name));
            }
        }
    }
    let Some((first, name)) = nearest else {
        return Ok(Some(format!(
            "{url} holds no object up to position {}",
            last.first
        )));
    };
    let Some((bytes, _)) = objects.get(&name).map_err(err)? else {
        return Ok(Some(format!("{url}: object {name} is gone")));
    };
    let decoded = decode_object(bytes, Some(first))
        .map_err(|e| StoreError::Backup(format!("{url}: object {name} is damaged: {e}")))?;
    let found = decoded
        .records
        .iter()
        .find(|(header, _)| header.first_position == last.first)
        .map(|(header, _)| stamp(header));
    Ok(match found {
        Some(stamp) if stamp == last => None,
        Some(stamp) => Some(format!(
            "{url} holds {stamp:?} where the copy's last append is {last:?}"
        )),
        None => Some(format!(
            "{url} holds no append beginning at position {}",
            last.first
        )),
    })
}

struct Follower {
    objects: Objects,
    state: Arc<ReplicaState>,
    shared: Arc<Shared>,
    role: Arc<WriterRole>,
    manifest: Manifest,
    /// The first position of the newest segment object seen: where to list from when a
    /// chunk is gone (its segment's object now covers it).
    segment_after: Option<u64>,
    /// When the lease was last read for the primary's name.
    primary_read: Option<Instant>,
    /// The primary's key file as last taken in (epoch, length).
    keys_seen: Option<(u64, u64)>,
    /// When the backup was last listed for its newest object (see [`SURVEY`]).
    surveyed: Option<Instant>,
}

impl Follower {
    fn run(mut self) {
        let mut backoff = POLL;
        while !self.state.stop.load(Ordering::Acquire) {
            match self.poll() {
                Ok(true) => {
                    backoff = POLL;
                    continue;
                }
                Ok(false) => backoff = POLL,
                Err(_) => backoff = (backoff * 2).min(BACKOFF_MAX),
            }
            self.finish_poll();
            let mut guard = self.state.kick_lock.lock();
            if self.state.stop.load(Ordering::Acquire) {
                break;
            }
            self.state.kick.wait_for(&mut guard, backoff);
        }
        self.finish_poll();
    }

    fn finish_poll(&self) {
        *self.state.polls.lock() += 1;
        self.state.polled.notify_all();
    }

    /// Takes in the primary's key file when it changed: before the records sealed under its
    /// new keys, which the primary ships after it.
    fn follow_keys(&mut self) -> Result<(), StoreError> {
        let Some(keys) = self.shared.keys.clone() else {
            return Ok(());
        };
        let url = self.state.url.clone();
        let extent = crate::archive::keys_extent(&self.objects)
            .map_err(|e| StoreError::Backup(format!("{url}: {e}")))?;
        if extent.is_none() || extent == self.keys_seen {
            return Ok(());
        }
        if let Some(bytes) = crate::archive::read_keys(&self.objects).map_err(StoreError::Backup)? {
            keys.replace(&bytes)?;
        }
        self.keys_seen = extent;
        Ok(())
    }

    /// Polls the backup once (see [`Follower::take_next`]) and records what the poll found:
    /// the replica's state and lag in [`ReplicaStats`], a failure in the log once per error.
    fn poll(&mut self) -> Result<bool, StoreError> {
        let polled = self.take_next();
        let now = Instant::now();
        match &polled {
            Ok(taken) => {
                *self.state.last_poll.lock() = Some((now, unix_us()));
                if !taken {
                    *self.state.caught_up.lock() = Some(now);
                    self.state
                        .backup_head
                        .fetch_max(self.shared.head(), Ordering::Relaxed);
                }
                if self.state.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        url = self.state.url.as_str(),
                        "replica: the backup can be read again"
                    );
                }
                *self.state.last_error.lock() = None;
            }
            Err(e) => {
                self.state.failures.fetch_add(1, Ordering::Relaxed);
                self.state.failing.store(true, Ordering::Relaxed);
                let message = e.to_string();
                let mut last_error = self.state.last_error.lock();
                if last_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(
                        url = self.state.url.as_str(),
                        error = message.as_str(),
                        "replica: the backup cannot be read; retrying"
                    );
                }
                *last_error = Some(message);
            }
        }
        polled
    }

    /// Takes in the object after the head, if there is one; true when it did.
    fn take_next(&mut self) -> Result<bool, StoreError> {
        let url = self.state.url.clone();
        let err = |e: crate::objects::ObjectError| StoreError::Backup(format!("{url}: {e}"));
        self.read_primary();
        self.follow_keys()?;
        let next = self.shared.head() + 1;
        let mut object = None;
        for kind in [ObjectKind::Segment, ObjectKind::Chunk] {
            if let Some((bytes, _)) = self.objects.get(&kind.name(next)).map_err(err)? {
                object = Some((kind.name(next), bytes));
                break;
            }
        }
        if object.is_none() {
            // The chunk that began at `next` may be gone, its segment's object covering it.
            object = self.covering(next)?;
        }
        let Some((name, bytes)) = object else {
            self.check_manifest()?;
            return Ok(false);
        };
        let first =
            parse_name(ObjectKind::Segment, &name).or_else(|| parse_name(ObjectKind::Chunk, &name));
        let decoded = decode_object(bytes, first)
            .map_err(|e| StoreError::Backup(format!("{url}: object {name} is damaged: {e}")))?;
        if decoded.header.kind == ObjectKind::Segment {
            self.segment_after = Some(decoded.header.first);
        }
        self.state
            .backup_head
            .fetch_max(decoded.header.last, Ordering::Relaxed);
        self.apply(&name, &decoded, next)?;
        self.state.objects_read.fetch_add(1, Ordering::Relaxed);
        // The object is in: a survey that fails leaves the lag in positions as it was, and
        // the next poll tries again; it never fails the poll that took the object in.
        if let Err(e) = self.survey() {
            tracing::debug!(error = %e, "replica: the backup's extent was not learned");
        }
        Ok(true)
    }

    /// Fails unless the backup still holds the manifest it held at open. Asked when a poll
    /// finds nothing newer: a prefix moved away, emptied or unreadable answers no object
    /// rather than an error, and would otherwise pass for a backup that stopped growing; one
    /// that now holds another store's backup would be followed into another history.
    fn check_manifest(&self) -> Result<(), StoreError> {
        let url = &self.state.url;
        let found = self
            .objects
            .get(MANIFEST)
            .map_err(|e| StoreError::Backup(format!("{url}: {e}")))?;
        let Some((bytes, _)) = found else {
            return Err(StoreError::Backup(format!(
                "{url} holds no backup any more (no {MANIFEST}): moved, deleted or unreadable"
            )));
        };
        match Manifest::decode(&bytes) {
            Ok(manifest) if manifest == self.manifest => Ok(()),
            Ok(_) => Err(StoreError::Backup(format!(
                "{url} now holds another store's backup (its {MANIFEST} names another first \
                 record): the replica follows the one it opened"
            ))),
            Err(e) => Err(StoreError::Backup(format!("{url}: {e}"))),
        }
    }

    /// Learns how far the backup reaches beyond the copy while objects are being taken in:
    /// the end of the newest object listed after the head, read from its header. At most
    /// every [`SURVEY`]; a caught-up poll tells the rest (the backup then ends at the head).
    fn survey(&mut self) -> Result<(), StoreError> {
        if self.surveyed.is_some_and(|at| at.elapsed() < SURVEY) {
            return Ok(());
        }
        self.surveyed = Some(Instant::now());
        let url = self.state.url.clone();
        let err = |e: crate::objects::ObjectError| StoreError::Backup(format!("{url}: {e}"));
        let next = self.shared.head() + 1;
        let mut newest: Option<(u64, String)> = None;
        for kind in [ObjectKind::Segment, ObjectKind::Chunk] {
            let listed = self
                .objects
                .list(kind.dir(), Some(&kind.name(next)))
                .map_err(err)?;
            // Listed in name order, and names order by first position.
            let last = listed
                .into_iter()
                .rev()
                .find_map(|l| parse_name(kind, &l.name).map(|first| (first, l.name)));
            if let Some((first, name)) = last {
                if newest.as_ref().is_none_or(|(f, _)| first > *f) {
                    newest = Some((first, name));
                }
            }
        }
        let Some((_, name)) = newest else {
            return Ok(());
        };
        let head = match self.objects.get_range(&name, 0..OBJECT_HEADER_BYTES as u64) {
            Ok(head) => head,
            // A chunk removed since the listing, its segment's object now covering it: the
            // next survey finds that one.
            Err(e) if e.fault == crate::objects::ObjectFault::NotFound => return Ok(()),
            Err(e) => return Err(err(e)),
        };
        let header = decode_object_header(&head)
            .map_err(|e| StoreError::Backup(format!("{url}: {name}: {e}")))?;
        self.state
            .backup_head
            .fetch_max(header.last, Ordering::Relaxed);
        Ok(())
    }

    /// The segment object holding `next`, found by listing after the last one seen.
    fn covering(&mut self, next: u64) -> Result<Option<(String, bytes::Bytes)>, StoreError> {
        let url = self.state.url.clone();
        let err = |e: crate::objects::ObjectError| StoreError::Backup(format!("{url}: {e}"));
        let after = self.segment_after.map(|p| ObjectKind::Segment.name(p));
        let listed = self
            .objects
            .list(ObjectKind::Segment.dir(), after.as_deref())
            .map_err(err)?;
        for l in listed {
            let Some(first) = parse_name(ObjectKind::Segment, &l.name) else {
                continue;
            };
            if first > next {
                break;
            }
            let head = self
                .objects
                .get_range(&l.name, 0..OBJECT_HEADER_BYTES as u64)
                .map_err(err)?;
            let header = decode_object_header(&head)
                .map_err(|e| StoreError::Backup(format!("{url}: {}: {e}", l.name)))?;
            if header.last >= next {
                return Ok(self
                    .objects
                    .get(&l.name)
                    .map_err(err)?
                    .map(|(bytes, _)| (l.name, bytes)));
            }
            self.segment_after = Some(first);
        }
        Ok(None)
    }

    /// Hands the object's records from `next` on to the copy's writer, at their positions.
    fn apply(&self, name: &str, object: &Decoded, next: u64) -> Result<(), StoreError> {
        let url = &self.state.url;
        let mut requests = Vec::new();
        let mut expected = next;
        let mut last = None;
        for (i, (header, _)) in object.records.iter().enumerate() {
            if header.last_position() < next {
                continue;
            }
            if header.first_position != expected {
                return Err(StoreError::Backup(format!(
                    "{url}: object {name} has a record at {} where the replica expects {expected}",
                    header.first_position
                )));
            }
            if header.first_position == 1 && !self.manifest.names(header) {
                return Err(StoreError::Backup(format!(
                    "{url}: the first record is not the one its manifest names"
                )));
            }
            let frame = object.frame(i);
            let body = frame[HEADER_BYTES..HEADER_BYTES + header.body_len as usize].to_vec();
            let append = EncodedAppend::from_stored(body, header.event_count).map_err(|why| {
                StoreError::Backup(format!(
                    "{url}: object {name}, position {}: {why}",
                    header.first_position
                ))
            })?;
            if let Some(keys) = &self.shared.keys {
                let taken = keys.take_in(append.entries(), append.event_count)?;
                if let crate::keys::TakenIn::NewerWrap(id) = taken {
                    return Err(StoreError::Backup(format!(
                        "{url}: object {name}, position {}: a key under wrapping key {id}, \
                         newer than the replica's key file (read again at the next poll)",
                        header.first_position
                    )));
                }
                take_in_receipts(keys, &append, header.appended_at_us);
            }
            expected = header.last_position() + 1;
            last = Some(stamp(header));
            let position = header.first_position;
            requests.push(Request {
                append,
                condition: None,
                fence: None,
                require_synced: false,
                reply: Reply::new(ReplyTo::Callback(Box::new(move |outcome| {
                    if let Err(e) = outcome {
                        tracing::error!(position, error = %e, "replica: a record was not taken in");
                    }
                }))),
                appended_at: Some(header.appended_at_us),
                trace: tracing::Span::none(),
            });
        }
        if !requests.is_empty() {
            self.role.commit_committed(requests, Route::Replicated);
        }
        let head = self.shared.head();
        if head + 1 != expected {
            return Err(StoreError::Backup(format!(
                "{url}: the replica's copy ends at {head} after object {name}, not at {}",
                expected - 1
            )));
        }
        if let Some(last) = last {
            *self.state.last_append.lock() = last;
        }
        Ok(())
    }

    /// Who the primary is, from the backup's lease (read every 10 s).
    fn read_primary(&mut self) {
        if self
            .primary_read
            .is_some_and(|at| at.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        self.primary_read = Some(Instant::now());
        if let Ok(Some((bytes, _))) = self.objects.get(LEASE) {
            if let Ok(lease) = serde_json::from_slice::<Lease>(&bytes) {
                let shipping = if lease.renewed_at_us == 0 {
                    " (stopped)"
                } else {
                    ""
                };
                *self.state.primary.lock() =
                    format!("host {}, directory {}{shipping}", lease.host, lease.dir);
            }
        }
    }
}
