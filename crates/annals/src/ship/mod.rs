//! The continuous backup: a thread that ships what the log made durable into object storage
//! (`archive.rs` lays out the objects), and answers the appends that wait for it (D4).
//!
//! The shipper reads records from the segments exactly as they lie there, from the position
//! after the last one shipped up to the durable position (on files the synced one: never a
//! record a power loss could take back; on PostgreSQL the mirror's head, which the database
//! committed). A sealed segment goes out once, as `segments/<first>` objects of at most
//! `object_bytes_max` record bytes each; records of the active segment go out as `log/<first>`
//! chunks of at most as many, at most one put in flight, at most one every `interval` unless
//! an append waits for it. Runs of small chunks are put again as one object of the segment's
//! kind and deleted (`run.rs`); larger chunks stay as its backup, so that a store under load
//! does not ship its bytes twice. A put that fails is retried with backoff, for as long as it
//! takes; the store keeps serving at the class it promises meanwhile, and D4 appends that
//! wait longer than their timeout are answered `OutcomeUnknown`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use crate::archive::{
    decode_object, decode_object_header, encode_object, parse_name, Lease, Manifest, ObjectKind,
    LEASE, MANIFEST, OBJECT_HEADER_BYTES,
};
use crate::error::StoreError;
use crate::index::split_location;
use crate::objects::{ObjectError, ObjectFault, Objects, Put};
use crate::options::BackupOptions;
use crate::query::{Query, ReadOptions};
use crate::read::ReadIter;
use crate::record::{decode_header, Frame, RecordHeader, HEADER_BYTES};
use crate::route::Backend;
use crate::segment::SEGMENT_HEADER_BYTES;
use crate::shared::Shared;

mod keys;
mod lease;
mod run;
mod standby;
mod state;
pub(crate) use state::now_us;
pub(crate) use state::BackupState;
use state::OffMachineWaiters;

/// How long the shipper sleeps when there is nothing to ship, at most.
const IDLE_POLL: Duration = Duration::from_millis(20);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long a store on PostgreSQL taking over a backup waits for its mirror to hold what
/// the backup does.
const MIRROR_CATCH_UP: Duration = Duration::from_secs(10);
/// How long a close waits for the backup to catch up before it gives up on it.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// The running backup of one store: its state and its thread.
pub(crate) struct Backup {
    pub(crate) state: Arc<BackupState>,
    thread: Option<JoinHandle<()>>,
}

impl Backup {
    /// Opens the prefix, takes its lease, checks that it backs up this store (or begins it),
    /// finds where shipping resumes, and starts the shipper. Fails with a clear error, having
    /// written nothing but the lease, when the prefix belongs to another store or server.
    pub(crate) fn start(shared: Arc<Shared>, options: BackupOptions) -> Result<Backup, StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("annals-backup".into())
            .spawn(move || {
                let shipper = match Shipper::open(shared, options) {
                    Ok(s) => {
                        let _ = tx.send(Ok(s.state.clone()));
                        s
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let state = shipper.state.clone();
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shipper.run()));
                if ran.is_err() {
                    // Never leave a D4 append waiting on a thread that is gone.
                    let reason = "the backup's thread panicked; shipping stopped";
                    tracing::error!(url = state.url.as_str(), "backup: {reason}");
                    *state.stopped.lock() = Some(reason.into());
                    state.fail_all(reason);
                }
            })
            .map_err(|e| StoreError::Backup(format!("start the backup thread: {e}")))?;
        match rx.recv() {
            Ok(Ok(state)) => Ok(Backup {
                state,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(StoreError::Backup(
                    "the backup thread ended at start".into(),
                ))
            }
        }
    }

    /// Ships what is durable now (waiting up to 10 s for object storage), releases the lease
    /// and stops. D4 appends still waiting are answered `OutcomeUnknown`.
    pub(crate) fn finish(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        self.state.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Backup {
    fn drop(&mut self) {
        self.finish();
    }
}

impl crate::parts::Service for Backup {
    fn stop(&mut self) {
        self.finish();
    }

    fn report(&self, stats: &mut crate::stats::Stats, synced: u64) {
        stats.backup = Some(self.state.stats(synced));
    }

    fn shipping(&self) -> Option<Arc<dyn crate::parts::Shipping>> {
        Some(self.state.clone())
    }
}

impl crate::parts::Shipping for BackupState {
    fn when_shipped(&self, position: u64, reply: crate::request::Reply, trace: tracing::Span) {
        BackupState::when_shipped(self, position, reply, trace)
    }

    fn standing_by(&self) -> bool {
        BackupState::standing_by(self)
    }

    fn keys_shipped(&self, table: bool) -> u64 {
        match table {
            true => self.keys_generation(),
            false => self.keys_epoch(),
        }
    }

    fn nudge(&self) {
        BackupState::nudge(self)
    }
}

/// What a start finds in the prefix.
#[derive(Default)]
struct Found {
    /// The chunks, as listed.
    chunks: Vec<crate::objects::Listed>,
    /// The first and last positions of the newest object of the segments' kind.
    newest_piece: Option<(u64, u64)>,
    /// The object holding the backup's last position, and that position.
    newest: Option<(String, u64)>,
}

struct Shipper {
    shared: Arc<Shared>,
    objects: Objects,
    state: Arc<BackupState>,
    lease: Lease,
    lease_version: Option<String>,
    lease_renewed: Instant,
    /// Whether the manifest is written (a backup of an empty store writes it with the first
    /// record).
    manifest_written: bool,
    /// Small chunks not yet consolidated (`run.rs`).
    run: Option<run::Run>,
    /// The thread that puts runs of small chunks again as one object (`run.rs`).
    consolidator: Option<run::Consolidator>,
    /// The key file's epoch and length the backup holds (`keys.rs`).
    keys_shipped: Option<(u64, u64)>,
    /// Keys in a database's table: the image the backup holds, and one made and not yet put.
    table_keys: Option<keys::TableKeys>,
    table_image: Option<keys::TableImage>,
    last_put: Instant,
}

fn backup_error(url: &str, e: &ObjectError) -> StoreError {
    let hint = match e.fault {
        ObjectFault::NotFound => " (does the bucket exist?)",
        ObjectFault::Refused => {
            " (check the credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for S3)"
        }
        _ => "",
    };
    StoreError::Backup(format!("{url}: {e}{hint}"))
}

impl Shipper {
    fn open(shared: Arc<Shared>, options: BackupOptions) -> Result<Shipper, StoreError> {
        if shared.options.durability == crate::Durability::Memory {
            return Err(StoreError::InvalidOption(
                "a memory-only (D0) store has nothing durable to back up".into(),
            ));
        }
        if options.object_bytes_max == 0 {
            return Err(StoreError::InvalidOption(
                "a backup's object_bytes_max must be at least 1".into(),
            ));
        }
        let objects =
            Objects::open_with(&options.url, &options.settings).map_err(StoreError::Backup)?;
        let url = objects.url().to_string();
        let state = Arc::new(BackupState {
            url: url.clone(),
            shipped: AtomicU64::new(0),
            oldest_unshipped_us: AtomicU64::new(0),
            bytes_shipped: AtomicU64::new(0),
            objects_shipped: AtomicU64::new(0),
            segments_shipped: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            last_error: Mutex::new(None),
            stopped: Mutex::new(None),
            failing: AtomicBool::new(false),
            waiters: Mutex::new(OffMachineWaiters::default()),
            kick: Condvar::new(),
            kick_lock: Mutex::new(()),
            stop: AtomicBool::new(false),
            options,
            keys_epoch: AtomicU64::new(0),
            keys_generation: AtomicU64::new(0),
            standby: Mutex::new(None),
        });
        let lease = Lease {
            host: lease::host_name(),
            dir: shared.dir.display().to_string(),
            pid: std::process::id(),
            holder: format!("{}-{}", std::process::id(), now_us()),
            renewed_at_us: now_us(),
            ttl_s: state.options.lease.as_secs().max(1),
        };
        let mut shipper = Shipper {
            shared,
            objects,
            state,
            lease,
            lease_version: None,
            lease_renewed: Instant::now(),
            manifest_written: false,
            run: None,
            consolidator: None,
            keys_shipped: None,
            table_keys: None,
            table_image: None,
            last_put: Instant::now() - Duration::from_secs(3600),
        };
        match shipper.take_lease()? {
            None => {}
            // Several servers of one database, each started with the same backup: one ships,
            // the others stand by (`standby.rs`).
            Some(holder) if shipper.shared.policy.backend == Backend::Postgres => {
                shipper.check_manifest()?;
                tracing::info!(
                    url = shipper.url(),
                    holder = holder.as_str(),
                    "backup: another server of the database ships into this prefix; this one \
                     stands by and takes over once that server's lease lapses"
                );
                *shipper.state.standby.lock() = Some(holder);
                return Ok(shipper);
            }
            Some(holder) => {
                return Err(StoreError::Backup(format!(
                    "{holder}; give each store its own prefix"
                )))
            }
        }
        match shipper.begin() {
            Ok(()) => Ok(shipper),
            Err(e) => {
                shipper.release_lease();
                Err(e)
            }
        }
    }

    /// With the lease held: checks that the prefix backs up this store and finds where
    /// shipping resumes.
    fn begin(&mut self) -> Result<(), StoreError> {
        self.check_manifest()?;
        let found = self.find_objects()?;
        let shipped = self.resume_point(&found)?;
        let keys_shipped =
            keys::shipped_keys(&self.objects).map_err(|e| backup_error(self.url(), &e))?;
        self.state.shipped.store(shipped, Ordering::Release);
        self.find_run(shipped, &found);
        self.keys_shipped = keys_shipped;
        // A table's keys go out as a whole image first (another server may have shipped
        // since this one last did).
        self.table_keys = None;
        self.table_image = None;
        if let Some((epoch, _)) = keys_shipped {
            self.state.keys_epoch.store(epoch, Ordering::Release);
        }
        Ok(())
    }

    fn url(&self) -> &str {
        &self.state.url
    }

    /// The record holding position 1, from the local log.
    fn first_record(&self) -> Result<Option<RecordHeader>, StoreError> {
        if self.durable() == 0 {
            return Ok(None);
        }
        let Some(segment) = self.shared.segment(self.first_segment()) else {
            return Ok(None);
        };
        let bytes = segment.bytes(SEGMENT_HEADER_BYTES, HEADER_BYTES)?;
        match decode_header(&bytes) {
            Frame::Record(h) if h.first_position == 1 => Ok(Some(h)),
            _ => Err(StoreError::Backup(
                "the log's first segment does not begin with position 1".into(),
            )),
        }
    }

    fn first_segment(&self) -> u32 {
        self.shared.segments.read().first().map_or(0, |s| s.number)
    }

    fn check_manifest(&mut self) -> Result<(), StoreError> {
        let found = self
            .objects
            .get(MANIFEST)
            .map_err(|e| backup_error(self.url(), &e))?;
        let first = self.first_record()?;
        match (found, first) {
            (Some((bytes, _)), first) => {
                let manifest = Manifest::decode(&bytes)
                    .map_err(|e| StoreError::Backup(format!("{}: {e}", self.url())))?;
                if let Some(first) = first {
                    if !manifest.names(&first) {
                        return Err(StoreError::Backup(format!(
                            "{} backs up another store (its first record differs from this \
                             store's); give this store its own prefix",
                            self.url()
                        )));
                    }
                }
                self.manifest_written = true;
            }
            (None, Some(first)) => self.write_manifest(&first)?,
            (None, None) => {}
        }
        Ok(())
    }

    fn write_manifest(&mut self, first: &RecordHeader) -> Result<(), StoreError> {
        let manifest = Manifest::for_first_record(first);
        let bytes = Bytes::from(serde_json::to_vec_pretty(&manifest).expect("serializes"));
        match self.objects.put_new(MANIFEST, vec![bytes]) {
            Ok(Put::Created) => {}
            Ok(Put::Existed) => return self.check_manifest(),
            Err(e) => return Err(backup_error(self.url(), &e)),
        }
        self.manifest_written = true;
        Ok(())
    }

    /// What the prefix holds of the log, listed once at a start.
    fn find_objects(&self) -> Result<Found, StoreError> {
        let err = |e: ObjectError| backup_error(self.url(), &e);
        let mut found = Found::default();
        for kind in [ObjectKind::Segment, ObjectKind::Chunk] {
            let listed = self.objects.list(kind.dir(), None).map_err(err)?;
            if let Some(newest) = listed
                .iter()
                .rev()
                .find(|l| parse_name(kind, &l.name).is_some())
            {
                let head = self
                    .objects
                    .get_range(&newest.name, 0..OBJECT_HEADER_BYTES as u64)
                    .map_err(err)?;
                let header = decode_object_header(&head).map_err(|e| {
                    StoreError::Backup(format!("{}: {}: {e}", self.url(), newest.name))
                })?;
                if kind == ObjectKind::Segment {
                    found.newest_piece = Some((header.first, header.last));
                }
                if found.newest.as_ref().is_none_or(|(_, l)| header.last > *l) {
                    found.newest = Some((newest.name.clone(), header.last));
                }
            }
            if kind == ObjectKind::Chunk {
                found.chunks = listed;
            }
        }
        Ok(found)
    }

    /// The last position the prefix holds, checked against this store's log.
    fn resume_point(&self, found: &Found) -> Result<u64, StoreError> {
        let err = |e: ObjectError| backup_error(self.url(), &e);
        let Some((name, shipped)) = found.newest.clone() else {
            return Ok(0);
        };
        let mut durable = self.durable();
        // On PostgreSQL another server may have shipped what this one's mirror has not taken
        // in yet (it follows the database within moments).
        let caught_up = Instant::now() + MIRROR_CATCH_UP;
        while durable < shipped
            && self.shared.policy.backend == Backend::Postgres
            && Instant::now() < caught_up
        {
            std::thread::sleep(Duration::from_millis(20));
            durable = self.durable();
        }
        if durable < shipped {
            return Err(StoreError::Backup(format!(
                "{} holds positions through {shipped}, this store only through {durable}: the \
                 store is behind its backup (restored from an older copy, or a new store?); \
                 restore it from the backup (annals restore) or give it another prefix",
                self.url()
            )));
        }
        // The backup's newest record must be this store's record at that position.
        let object = self.objects.get(&name).map_err(err)?.ok_or_else(|| {
            StoreError::Backup(format!("{}: {name} vanished while read", self.url()))
        })?;
        let decoded = decode_object(
            object.0,
            parse_name(ObjectKind::Segment, &name).or_else(|| parse_name(ObjectKind::Chunk, &name)),
        )
        .map_err(|e| StoreError::Backup(format!("{}: {name}: {e}", self.url())))?;
        let i = decoded.records.len() - 1;
        let theirs = decoded.frame(i);
        let position = decoded.records[i].0.first_position;
        let mut iter = self.reader(position, durable)?;
        let ours = iter.next_frame()?.map(|(_, _, b)| b);
        if ours.as_deref() != Some(&theirs[..]) {
            return Err(StoreError::Backup(format!(
                "{} holds another history than this store at position {position}; give this \
                 store its own prefix",
                self.url()
            )));
        }
        Ok(shipped)
    }

    /// The position through which the log is durable: on files the synced one, on
    /// PostgreSQL everything the mirror holds (the database committed it first).
    fn durable(&self) -> u64 {
        let published = &self.shared.published;
        match self.shared.policy.backend {
            Backend::Files => published.synced().min(published.head()),
            Backend::Postgres | Backend::Replica => published.head(),
        }
    }

    fn reader(&self, from: u64, head: u64) -> Result<ReadIter, StoreError> {
        ReadIter::new(
            self.shared.clone(),
            &Query::all(),
            ReadOptions::forwards().from(from),
            head,
        )
        .map_err(crate::shared::store_error)
    }

    fn run(mut self) {
        // Standing by (on PostgreSQL) until the lease is this server's; shipping until the
        // store closes, shipping stops for good, or another server takes the lease over
        // (then standing by again).
        while !self.state.standing_by() || self.stand_by() {
            if !self.ship_while_leased() {
                self.finish_consolidating();
                self.state.answer();
                let reason = match self.state.stopped.lock().clone() {
                    Some(r) => r,
                    None => "the store closed before the append reached object storage".into(),
                };
                self.state.fail_all(&reason);
                if self.state.stopped.lock().is_none() {
                    self.release_lease();
                }
                return;
            }
        }
        self.finish_consolidating();
        self.state.answer();
        let reason =
            self.state.stopped.lock().clone().unwrap_or_else(|| {
                "the store closed before the append reached object storage".into()
            });
        self.state.fail_all(&reason);
    }

    /// Ships while this server holds the lease: false once the store closes or shipping
    /// stopped for good; true when another server of the database took the lease over (this
    /// one stands by again).
    fn ship_while_leased(&mut self) -> bool {
        let mut backoff = BACKOFF_MIN;
        let mut stop_deadline: Option<Instant> = None;
        loop {
            self.state.answer();
            let stopping = self.state.stop.load(Ordering::Acquire);
            if stopping && stop_deadline.is_none() {
                stop_deadline = Some(Instant::now() + CLOSE_WAIT);
            }
            if self.state.stopped.lock().is_some() {
                break;
            }
            let durable = self.durable();
            let shipped = self.state.shipped();
            let consolidating = self.segment_of(durable).is_some_and(|s| self.run_due(s));
            if durable <= shipped && !consolidating {
                self.state.oldest_unshipped_us.store(0, Ordering::Relaxed);
                if stopping {
                    break;
                }
                if self.renew_lease().is_err() {
                    return self.lease_lost();
                }
                self.state.sleep(IDLE_POLL);
                continue;
            }
            if stop_deadline.is_some_and(|d| Instant::now() > d) {
                break;
            }
            let since = self.last_put.elapsed();
            if !stopping && !self.state.has_waiters() && since < self.state.options.interval {
                self.state.sleep(self.state.options.interval - since);
                continue;
            }
            match self.ship_next(durable) {
                Ok(()) => {
                    self.note_answered();
                    backoff = BACKOFF_MIN;
                }
                Err(Failure::Fatal(reason)) => {
                    self.stop_for_good(&reason);
                    break;
                }
                Err(Failure::Retry(e)) => {
                    self.note_failure(&e.to_string());
                    self.state.answer();
                    self.state.sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
            if self.renew_lease().is_err() {
                return self.lease_lost();
            }
        }
        false
    }

    /// Object storage failed a request: counted, kept as the last error, and logged the
    /// first time and every twentieth; the caller tries again later.
    fn note_failure(&self, message: &str) {
        let failures = self.state.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.state.failing.swap(true, Ordering::Relaxed) || failures.is_multiple_of(20) {
            tracing::warn!(
                url = self.url(),
                failures,
                error = message,
                "backup: object storage failed; trying again with backoff while the store \
                 keeps serving"
            );
        }
        *self.state.last_error.lock() = Some(message.to_string());
    }

    /// Object storage answered: logged once after failures.
    fn note_answered(&self) {
        if self.state.failing.swap(false, Ordering::Relaxed) {
            tracing::info!(
                url = self.url(),
                shipped = self.state.shipped(),
                "backup: object storage answers again"
            );
        }
    }

    fn stop_for_good(&self, reason: &str) {
        tracing::error!(
            url = self.url(),
            reason,
            "backup: shipping stopped; the store keeps serving, D4 appends fail"
        );
        *self.state.stopped.lock() = Some(reason.to_string());
        self.state.fail_all(reason);
        self.stop_noting_keys();
    }

    /// No image of a table's keys follows while this server does not ship: the keys it
    /// takes in meanwhile are not kept aside for one (the next image is whole).
    fn stop_noting_keys(&self) {
        if let Some(keys) = &self.shared.keys {
            keys.stop_noting();
        }
    }

    /// Hands a run of small chunks that is due to the consolidator, and ships the records
    /// after the last shipped one: an object of a sealed segment, or a chunk of the active one.
    fn ship_next(&mut self, durable: u64) -> Result<(), Failure> {
        let next = self.state.shipped() + 1;
        if !self.manifest_written {
            let first = self.first_record().map_err(Failure::fatal)?;
            if let Some(first) = first {
                self.write_manifest(&first).map_err(Failure::fatal)?;
            }
        }
        let Some(last_segment) = self.segment_of(durable) else {
            return Err(Failure::Fatal(format!(
                "position {durable} is not in the index"
            )));
        };
        if self.run_due(last_segment) {
            self.consolidate();
        }
        if next > durable {
            return Ok(());
        }
        let Some(segment) = self.segment_of(next) else {
            return Err(Failure::Fatal(format!(
                "position {next} is not in the index"
            )));
        };
        let kind = match segment < last_segment {
            true => ObjectKind::Segment,
            false => ObjectKind::Chunk,
        };
        self.ship_records(kind, segment, next, durable)
    }

    /// The segment holding `position`, from the index.
    fn segment_of(&self, position: u64) -> Option<u32> {
        if position == 0 {
            return None;
        }
        self.shared
            .index
            .read()
            .location_of(position)
            .map(|l| split_location(l).0)
    }

    /// Puts the records of `segment` from `next` on, up to `durable` and at most
    /// `object_bytes_max` of them, as one object of `kind`.
    fn ship_records(
        &mut self,
        kind: ObjectKind,
        segment: u32,
        next: u64,
        durable: u64,
    ) -> Result<(), Failure> {
        let mut iter = self.reader(next, durable).map_err(Failure::fatal)?;
        let mut frames = Vec::new();
        let mut bytes_total = 0;
        let mut last = next;
        while bytes_total < self.state.options.object_bytes_max {
            let Some((number, header, bytes)) = iter.next_frame().map_err(Failure::fatal)? else {
                break;
            };
            if number != segment {
                break;
            }
            if frames.is_empty() && header.first_position != next {
                return Err(Failure::Fatal(format!(
                    "position {next} does not begin a record (the record there begins at {})",
                    header.first_position
                )));
            }
            last = header.last_position();
            bytes_total += bytes.len();
            frames.push((header, bytes));
        }
        if frames.is_empty() {
            return Ok(());
        }
        self.put(kind, segment, next, last, frames)?;
        if kind == ObjectKind::Chunk {
            self.chunk_put(segment, next, last, bytes_total as u64);
        }
        Ok(())
    }

    /// Writes one object of `frames` (positions `first..=last`) and moves the shipped
    /// position; a name already taken must hold the same records. Answers the last position
    /// the object holds.
    fn put(
        &mut self,
        kind: ObjectKind,
        segment: u32,
        first: u64,
        last: u64,
        frames: Vec<(RecordHeader, Bytes)>,
    ) -> Result<u64, Failure> {
        // The keys the records may be sealed under go first.
        self.ship_keys()?;
        // The lag is the age of what this put ships first; a run of chunks put again as one
        // object (they shipped it already) leaves it as it was.
        if first > self.state.shipped() {
            self.state
                .oldest_unshipped_us
                .store(frames[0].0.appended_at_us, Ordering::Relaxed);
        }
        self.last_put = Instant::now();
        let durable = self.durable();
        // The put as a span, whenever the store's spans are recorded: a trace of its own,
        // linked with each traced D4 append it ships.
        let span = match crate::spans::recorded() {
            true => crate::spans::put(kind.label(), first, last),
            false => tracing::Span::none(),
        };
        let shipped_to = write_object(
            &self.objects,
            &self.state,
            durable,
            kind,
            segment,
            (first, last),
            &frames,
        );
        if !span.is_disabled() {
            let bytes: usize = frames.iter().map(|(_, b)| b.len()).sum();
            span.record("annals.bytes", bytes as i64);
            span.record("annals.put_us", self.last_put.elapsed().as_micros() as i64);
            if shipped_to.is_err() {
                span.record("otel.status_code", "ERROR");
            }
        }
        let shipped_to = shipped_to?;
        // A run of chunks put again as one object moves nothing.
        self.state.shipped.fetch_max(shipped_to, Ordering::AcqRel);
        self.state.answer_carried(&span);
        Ok(shipped_to)
    }
}

/// Writes one object of `frames` (positions `first..=last`), counted in the backup's
/// figures. A name already taken (by an earlier put of this store whose answer was lost)
/// must hold this store's records, through no further than `durable`. Answers the last
/// position the object holds.
fn write_object(
    objects: &Objects,
    state: &BackupState,
    durable: u64,
    kind: ObjectKind,
    segment: u32,
    (first, last): (u64, u64),
    frames: &[(RecordHeader, Bytes)],
) -> Result<u64, Failure> {
    let bytes: Vec<Bytes> = frames.iter().map(|(_, b)| b.clone()).collect();
    let payload = encode_object(kind, segment, first, last, &bytes);
    let size: usize = payload.iter().map(|b| b.len()).sum();
    let name = kind.name(first);
    match objects.put_new(&name, payload).map_err(Failure::Retry)? {
        Put::Created => {
            state
                .bytes_shipped
                .fetch_add(size as u64, Ordering::Relaxed);
            state.objects_shipped.fetch_add(1, Ordering::Relaxed);
            if kind == ObjectKind::Segment {
                state.segments_shipped.fetch_add(1, Ordering::Relaxed);
            }
            Ok(last)
        }
        Put::Existed => {
            let (bytes, _) = objects
                .get(&name)
                .map_err(Failure::Retry)?
                .ok_or_else(|| Failure::Fatal(format!("{name} exists and vanished")))?;
            let theirs = decode_object(bytes, Some(first))
                .map_err(|e| Failure::Fatal(format!("{name}: {e}")))?;
            for (i, (_, frame)) in frames.iter().enumerate().take(theirs.records.len()) {
                if theirs.frame(i) != *frame {
                    return Err(Failure::Fatal(format!(
                        "{name} holds another history than this store at position {}",
                        theirs.records[i].0.first_position
                    )));
                }
            }
            if theirs.header.last > durable {
                return Err(Failure::Fatal(format!(
                    "{name} holds positions through {}, beyond this store's log",
                    theirs.header.last
                )));
            }
            Ok(theirs.header.last)
        }
    }
}

enum Failure {
    /// Object storage did not take it: try again later.
    Retry(ObjectError),
    /// Shipping cannot go on.
    Fatal(String),
}

impl Failure {
    fn fatal(e: StoreError) -> Failure {
        Failure::Fatal(e.to_string())
    }
}
