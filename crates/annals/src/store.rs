//! The store: opening (recovery), the shared state readers and the writer see, and the public
//! embedded API.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use parking_lot::{Mutex, RwLock};

use crate::append::Append;
use crate::batch::EventBatch;
use crate::checkpoint::{self, Mark};
use crate::companions::{Companions, InDatabase, InDirectory};
use crate::error::{AppendError, InputError, ReadError, StoreError};
use crate::event::{Event, NewEvent};
use crate::health::Health;
use crate::histogram::{HistogramSnapshot, Log2Histogram};
use crate::index::{Index, IndexLock};
use crate::io::{DirLock, Io, RealIo};
use crate::options::{Durability, Options};
use crate::published::Published;
use crate::query::{AppendCondition, Query, ReadOptions};
use crate::read::ReadIter;
use crate::record::{encode_append_tracked, EncodedAppend};
use crate::recovery::{self, Tail};
use crate::segment::Segment;
use crate::sim::SimIo;
use crate::subscription::Subscription;
use crate::writer::{Notifier, Reply, ReplyTo, Request, Syncer, Writer, WriterRole};

/// How an append is handed to the writer.
#[derive(Clone, Copy)]
pub(crate) struct Submit {
    /// Wait while the queue is full; otherwise fail with [`InputError::QueueFull`].
    pub(crate) wait_when_full: bool,
    /// A blocking caller that is the only one waiting on the store: it may commit its append
    /// on its own thread (see [`WriterRole::commit_alone`]).
    pub(crate) alone: bool,
}

/// Counters kept by the writer, read by [`Store::stats`].
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) appends: AtomicU64,
    pub(crate) events: AtomicU64,
    pub(crate) conditions_failed: AtomicU64,
    pub(crate) idempotent_retries: AtomicU64,
    /// Background checkpoints that failed (the log stays the truth; the next open scans
    /// further).
    pub(crate) checkpoints_failed: AtomicU64,
    pub(crate) groups: AtomicU64,
    /// Groups committed by the appending caller on its own thread (see `WriterRole`).
    pub(crate) caller_commits: AtomicU64,
    /// Appends their callers staged while the writer thread synced (see `WriterRole`).
    pub(crate) caller_stages: AtomicU64,
    pub(crate) fsyncs: AtomicU64,
    /// Bytes of records written to segments (headers, entries and padding).
    pub(crate) bytes_written: AtomicU64,
    pub(crate) fsync_us_total: AtomicU64,
    pub(crate) fsync_us_max: AtomicU64,
    pub(crate) fsync_us: Log2Histogram,
    /// fdatasync latency in microseconds, averaged over about the last eight (0: none yet).
    pub(crate) fsync_recent_us: AtomicU64,
    pub(crate) group_appends: Log2Histogram,
    /// Segments created since open, and the bytes of zeros written to preallocate them.
    pub(crate) segments_created: AtomicU64,
    pub(crate) zero_fill_bytes: AtomicU64,
    /// Appends refused because the file system had no room for a new segment.
    pub(crate) disk_full_refusals: AtomicU64,
}

impl Counters {
    pub(crate) fn record_segment(&self, segment: &Segment, zero_filled: bool) {
        self.segments_created.fetch_add(1, Ordering::Relaxed);
        if zero_filled {
            let zeros = segment.size - crate::segment::SEGMENT_HEADER_BYTES;
            self.zero_fill_bytes.fetch_add(zeros, Ordering::Relaxed);
        }
    }

    pub(crate) fn record_fsync(&self, took: Duration) {
        let us = took.as_micros() as u64;
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync_us_total.fetch_add(us, Ordering::Relaxed);
        self.fsync_us_max.fetch_max(us, Ordering::Relaxed);
        self.fsync_us.record(us);
        // One sync runs at a time, so a load and a store suffice.
        let old = self.fsync_recent_us.load(Ordering::Relaxed);
        let recent = if old == 0 { us } else { old - old / 8 + us / 8 };
        self.fsync_recent_us.store(recent.max(1), Ordering::Relaxed);
    }
}

/// State shared by the store handle, the writer, readers and subscriptions.
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    pub(crate) io: Arc<dyn Io>,
    pub(crate) options: Options,
    pub(crate) index: IndexLock,
    pub(crate) segments: RwLock<Vec<Arc<Segment>>>,
    /// The published head and the synced position: read by all, moved only by the writer.
    pub(crate) published: Published,
    /// Poisoned or closed.
    pub(crate) health: Health,
    pub(crate) counters: Counters,
    /// Names of the read models and reactors running on this store: one runner per name.
    pub(crate) runners: Mutex<std::collections::HashSet<String>>,
    /// The index checkpoints' trigger: the last one's head, the one running.
    checkpoints: Checkpoints,
    /// Buffers of appended batches, handed back by the writer for [`Store::batch_with_capacity`]
    /// to reuse: a journal that appends a batch of tens of KiB after another then writes into
    /// memory that is already mapped, instead of faulting in and zeroing fresh pages.
    pub(crate) spare_bodies: Mutex<SpareBodies>,
    /// Callers waiting for an append's outcome (see [`crate::writer::Waiting`]).
    pub(crate) waiting: std::sync::atomic::AtomicUsize,
    _lock: Box<dyn DirLock>,
}

/// The capacities of batch buffers worth keeping for reuse, and the most memory all kept
/// buffers may hold: a store whose clients never call [`Store::batch_with_capacity`] keeps
/// at most this much idle.
const SPARE_BODY_BYTES: std::ops::RangeInclusive<usize> = (4 << 10)..=(1 << 20);
const SPARE_BYTES_MAX: usize = 4 << 20;

/// When the index is checkpointed: one checkpoint at a time, in the background once enough
/// events are published since the last.
struct Checkpoints {
    /// Held while a checkpoint is written.
    one_at_a_time: Mutex<()>,
    /// The head of the last checkpoint written.
    head: AtomicU64,
    /// A background checkpoint is running.
    running: AtomicBool,
    /// The last background checkpoint's thread, reaped by the next or at close.
    background: Mutex<Option<JoinHandle<()>>>,
}

/// Buffers of written batches kept for reuse, and their capacity in all.
#[derive(Default)]
pub(crate) struct SpareBodies {
    bodies: Vec<Vec<u8>>,
    bytes: usize,
}

impl SpareBodies {
    /// Keeps `body` if it is of a useful size and the kept buffers stay within
    /// [`SPARE_BYTES_MAX`].
    fn keep(&mut self, body: Vec<u8>) {
        let capacity = body.capacity();
        if SPARE_BODY_BYTES.contains(&capacity) && self.bytes + capacity <= SPARE_BYTES_MAX {
            self.bytes += capacity;
            self.bodies.push(body);
        }
    }

    /// A kept buffer, or an empty one.
    fn take(&mut self) -> Vec<u8> {
        let body = self.bodies.pop().unwrap_or_default();
        self.bytes -= body.capacity();
        body
    }
}

impl Shared {
    /// Keeps the buffer of an appended batch for [`Store::batch_with_capacity`].
    pub(crate) fn recycle_body(&self, body: Vec<u8>) {
        if SPARE_BODY_BYTES.contains(&body.capacity()) {
            self.spare_bodies.lock().keep(body);
        }
    }

    pub(crate) fn head(&self) -> u64 {
        self.published.head()
    }

    pub(crate) fn segment(&self, number: u32) -> Option<Arc<Segment>> {
        let segments = self.segments.read();
        let first = segments.first()?.number;
        segments.get(number.checked_sub(first)? as usize).cloned()
    }

    /// Poisons the store (see [`Health::poison`]) and wakes whoever waits on the head, to
    /// find out.
    pub(crate) fn poison(&self, reason: String) {
        self.health.poison(reason);
        self.published.wake_all();
    }

    pub(crate) fn poison_error(&self) -> Option<StoreError> {
        self.health.poison_error()
    }

    /// Writes the index checkpoint for the published head.
    pub(crate) fn checkpoint(&self) -> Result<(), StoreError> {
        if !self.io.is_persistent() {
            return Ok(());
        }
        let _one_at_a_time = self.checkpoints.one_at_a_time.lock();
        let mark = checkpoint::write(self.io.as_ref(), &self.dir, &self.index, &self.published)?;
        self.checkpoints
            .head
            .fetch_max(mark.head, Ordering::Relaxed);
        Ok(())
    }

    /// Starts a background checkpoint when `checkpoint_interval_events` new events are
    /// published since the last one and none is running. A failed checkpoint is not fatal: the
    /// log is the truth, and the next open scans further.
    pub(crate) fn maybe_checkpoint(self: &Arc<Self>) {
        let interval = self.options.checkpoint_interval_events;
        let last = self.checkpoints.head.load(Ordering::Relaxed);
        // A checkpoint costs time in proportion to the whole index, so the gap between them
        // grows with the store (by half of it at least): the total work stays linear.
        if interval == 0 || self.head() < last + interval.max(last / 2) {
            return;
        }
        if self.checkpoints.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = self.clone();
        let spawned = std::thread::Builder::new()
            .name("annals-checkpoint".into())
            .spawn(move || {
                if shared.checkpoint().is_err() {
                    shared
                        .counters
                        .checkpoints_failed
                        .fetch_add(1, Ordering::Relaxed);
                }
                shared.checkpoints.running.store(false, Ordering::Release);
            });
        match spawned {
            Ok(handle) => {
                let previous = self.checkpoints.background.lock().replace(handle);
                // The previous one has finished (`running` was false): reap it.
                if let Some(previous) = previous {
                    let _ = previous.join();
                }
            }
            Err(_) => self.checkpoints.running.store(false, Ordering::Release),
        }
    }
}

/// A read error where only store errors can occur (a read of everything has no input to
/// refuse).
pub(crate) fn store_error(e: ReadError) -> StoreError {
    match e {
        ReadError::Store(e) => e,
        ReadError::Input(e) => StoreError::InvalidOption(e.to_string()),
    }
}

/// How the index was obtained when the store was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexSource {
    /// Loaded from the checkpoint; `scanned_events` more were read from the log after it.
    Checkpoint { scanned_events: u64 },
    /// Rebuilt by scanning the whole log, because the checkpoint was missing, damaged or stale.
    Rebuilt { reason: String },
}

/// What opening the store found.
#[derive(Debug, Clone)]
pub struct OpenReport {
    /// The index of the log on files, or of the mirror on PostgreSQL.
    pub index: IndexSource,
    /// A torn tail that was cut: the file, the offset, and why the bytes there were not a record.
    pub torn_tail: Option<(PathBuf, u64, String)>,
    /// The whole open, on PostgreSQL the reading of the database's log included.
    pub open_ms: f64,
    /// On PostgreSQL: where the mirror came from.
    pub mirror: Option<MirrorKind>,
}

/// Where a PostgreSQL store's mirror (its copy of the log) came from at open.
#[derive(Debug, Clone)]
pub struct MirrorKind {
    /// The directory it is kept in (`Options::mirror`); None: a temporary one.
    pub kept: Option<PathBuf>,
    /// A kept mirror used as it was closed, up to this position.
    pub resumed_at: Option<u64>,
    /// Why a kept mirror was not used and was filled from the database instead.
    pub rebuilt: Option<String>,
    /// Appends read from the database at open.
    pub followed: u64,
}

/// A snapshot of the store's state and counters.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    pub head: u64,
    /// Which backend holds the log: "files" or "postgres".
    pub backend: &'static str,
    /// The database backend's counters (None on files).
    pub database: Option<DatabaseStats>,
    pub durability: &'static str,
    pub durability_description: &'static str,
    pub segments: usize,
    pub segment_bytes: u64,
    pub types: usize,
    pub tags: usize,
    pub index_bytes: usize,
    pub index_bytes_per_event: f64,
    pub appends: u64,
    pub events_appended: u64,
    pub conditions_failed: u64,
    /// Conditional appends whose condition failed on exactly their own events (same ids):
    /// answered as retries of appends already stored.
    pub idempotent_retries: u64,
    /// Background index checkpoints that failed since open (a failure is not fatal: the log
    /// is the truth, and the next open scans further; repeated failures say the disk or the
    /// directory needs a look).
    pub checkpoints_failed: u64,
    pub groups: u64,
    /// Of `groups`, those a caller that found the store idle committed on its own thread.
    pub caller_commits: u64,
    /// Appends their callers staged into the next group themselves, on their own thread,
    /// while the writer thread synced the group before (checks, the record's copy and the
    /// index additions: no I/O and no waiting); the writer thread writes and syncs that group
    /// when its sync ends.
    pub caller_stages: u64,
    pub fsyncs: u64,
    /// Bytes of records written to the log since open (headers, entries and padding).
    pub bytes_written: u64,
    /// Segments created since open, and the bytes of zeros written to preallocate those that
    /// were zero-filled (see [`crate::Preallocation`]): disk traffic beside `bytes_written`.
    pub segments_created: u64,
    pub zero_fill_bytes: u64,
    pub fsync_us_mean: f64,
    pub fsync_us_max: u64,
    /// fdatasync latency in microseconds.
    pub fsync_us: HistogramSnapshot,
    /// Appends committed per group (one write, and in D3 one fdatasync, per group).
    pub group_appends: HistogramSnapshot,
    pub queue_depth: usize,
    /// Callers blocked on or awaiting an append's outcome.
    pub waiting: usize,
    pub poisoned: Option<String>,
    /// Why appends that need a new segment are refused, while the file system has no room
    /// for one (None otherwise). Reads go on; appends resume by themselves once there is room.
    pub disk_full: Option<String>,
    /// Appends refused for lack of room since open.
    pub disk_full_refusals: u64,
    /// Free bytes of the file system holding the log (None where not known, as on PostgreSQL
    /// or in memory).
    pub disk_free_bytes: Option<u64>,
}

/// What [`Store::check`] found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveCheck {
    /// The head the check ran up to.
    pub head: u64,
    /// Events whose records passed their CRC and sequence checks.
    pub events: u64,
    /// The first problem found, if any.
    pub problem: Option<String>,
    pub seconds: f64,
}

/// Removes the mirrors (see [`Store::open_postgres`]) that processes killed before closing
/// their stores left in the temporary directory: those whose lock no process holds.
fn remove_stale_mirrors() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let named = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("annals-mirror-"));
        let lock = entry.path().join(LOCK_FILE);
        if !named || !lock.exists() {
            continue;
        }
        if let Ok(held) = RealIo.lock(&lock) {
            let _ = std::fs::remove_dir_all(entry.path());
            drop(held);
        }
    }
}

/// Whether a store location names a PostgreSQL database rather than a directory.
pub fn is_database_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// Whether `location` reads as libpq's other form of connection string, `key=value` pairs
/// (`host=db1 dbname=annals`): every word a pair whose key is one of libpq's. Such a string
/// given where a store is expected is refused as a directory, rather than made into one.
fn is_key_value_connection_string(location: &str) -> bool {
    const KEYS: &[&str] = &[
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "sslmode",
        "sslrootcert",
        "application_name",
        "connect_timeout",
        "options",
        "target_session_attrs",
        "keepalives",
        "channel_binding",
    ];
    let mut words = location.split_whitespace().peekable();
    words.peek().is_some()
        && words.all(|w| {
            w.split_once('=')
                .is_some_and(|(key, _)| KEYS.contains(&key))
        })
}

/// Per-append options.
#[derive(Debug, Clone, Default)]
pub struct AppendOptions {
    /// Ask for D3 (fsynced before acknowledgement) even when the store runs in a weaker class.
    pub require_synced: bool,
    /// Record a consumer's position in the same record as the events: the append fails with
    /// [`AppendError::TrackingNotIncreasing`] unless the position is above the one recorded
    /// for the source, so a process that appends the effects of what it consumed can neither
    /// lose nor repeat one across a crash.
    pub tracking: Option<Tracking>,
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

/// Counters of the PostgreSQL backend.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DatabaseStats {
    /// Group commits (one statement, one database commit each).
    pub commits: u64,
    /// Group commits that found another server had committed first, or that the database
    /// rolled back as a serialization failure (SQLSTATE 40001, 40P01), and were checked again.
    pub conflicts: u64,
    /// Retries of groups that went in right after another server's appends in one
    /// statement, none of those mattering to the group's conditions or tracking positions.
    pub passed: u64,
    /// Appends committed by other servers and taken into this one's log.
    pub followed: u64,
    /// Connections made again after one was lost.
    pub reconnects: u64,
    /// Appends answered with an unknown outcome: the session ended during the commit and the
    /// database could not tell, within the time a group waits for it, whether it committed.
    pub unknown_outcomes: u64,
    /// Appends whose commit's outcome was unknown when the session ended, then settled by
    /// reading the log: found committed and answered so, or found absent and tried again.
    pub settled_outcomes: u64,
}

/// A durable DCB event store. See the crate documentation for a tour.
pub struct Store {
    shared: Arc<Shared>,
    sender: Option<Sender<Request>>,
    writer: Option<JoinHandle<()>>,
    /// The writer's role, which an idle store lets a blocking caller take.
    role: Arc<WriterRole>,
    syncer: Option<(Arc<Syncer>, JoinHandle<()>)>,
    notifier: Option<(Arc<Notifier>, JoinHandle<()>)>,
    report: OpenReport,
    /// The database backend, when the log lives in PostgreSQL: appends go through it, and the
    /// rest of the store is the memory-only mirror it keeps (see postgres.rs).
    remote: Option<crate::postgres::Remote>,
    /// The mirror's temporary directory, removed at close.
    mirror_dir: Option<PathBuf>,
    /// The mirror's directory when it is kept across closes (`Options::mirror`).
    kept: Option<crate::mirror::KeptMirror>,
    /// Where read models' checkpoints and the exchange's snapshots are kept.
    companions: Arc<dyn Companions>,
}

const LOCK_FILE: &str = "LOCK";

impl Store {
    /// Whether a lone async caller polls for its outcome before it sleeps: on files, where
    /// the wait is an fdatasync and the caller's core is otherwise idle; not on PostgreSQL,
    /// where the wait is the database's work on the same machine's cores (R30).
    pub(crate) fn lone_async_polls(&self) -> bool {
        self.remote.is_none()
    }

    /// Opens (creating if needed) the store in `dir`. A D0 store lives in memory only and
    /// ignores `dir`.
    /// A directory whose name reads as a libpq `key=value` connection string is refused: a
    /// database is given as a URL (see [`Store::open_location`]).
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store, StoreError> {
        if let Some(name) = dir
            .as_ref()
            .to_str()
            .filter(|d| is_key_value_connection_string(d))
        {
            return Err(StoreError::InvalidOption(format!(
                "{name:?} reads as a PostgreSQL connection string of key=value pairs, not a \
                 directory; give the database as a URL, postgres://user@host:port/dbname (a Unix \
                 socket's directory percent-encoded as the host, as in \
                 postgres://user@%2Fvar%2Frun%2Fpostgresql/dbname)"
            )));
        }
        if options.durability == Durability::Memory {
            return Self::open_with_io(Arc::new(SimIo::memory()), dir.as_ref(), options);
        }
        Self::open_with_io(Arc::new(RealIo), dir.as_ref(), options)
    }

    /// Opens a memory-only (D0) store.
    pub fn open_in_memory(mut options: Options) -> Result<Store, StoreError> {
        options.durability = Durability::Memory;
        Self::open_with_io(Arc::new(SimIo::memory()), Path::new("/memory"), options)
    }

    /// Opens the store through a given I/O layer (the simulated one, in tests).
    pub fn open_with_io(
        io: Arc<dyn Io>,
        dir: &Path,
        options: Options,
    ) -> Result<Store, StoreError> {
        let started = Instant::now();
        options.validate().map_err(StoreError::InvalidOption)?;
        if let Some(mirror) = &options.mirror {
            return Err(StoreError::InvalidOption(format!(
                "a mirror directory ({}) is for a store on PostgreSQL; a store on files is its \
                 own directory",
                mirror.display()
            )));
        }
        io.create_dir_all(dir)
            .map_err(|e| StoreError::io("create data directory", dir, 0, e))?;
        let lock = io.lock(&dir.join(LOCK_FILE)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                StoreError::Locked {
                    path: dir.to_path_buf(),
                }
            } else {
                StoreError::io("lock data directory", dir.join(LOCK_FILE), 0, e)
            }
        })?;
        let mut segments = recovery::open_segments(io.as_ref(), dir, true)?;
        let counters = Counters::default();
        if segments.is_empty() {
            let zero_fill = options.preallocation.zero_fill(None);
            let segment = Segment::create(io.as_ref(), dir, 1, options.segment_bytes, zero_fill)?;
            counters.record_segment(&segment, zero_fill);
            segments.push(Arc::new(segment));
        }
        let (mut index, start_tail, rebuild_reason) =
            match load_checkpoint(io.as_ref(), dir, &segments) {
                Ok((index, tail)) => (index, tail, None),
                Err(reason) => (Index::default(), Tail::default(), Some(reason)),
            };
        // The most a crash can leave unsynced: the backlog, plus one group written at its edge.
        let tail_window = (options.unsynced_bytes_max
            + options.group_bytes_max
            + options.limits.append_bytes_max) as u64
            + 4096;
        let scanned = recovery::scan(
            &segments,
            start_tail,
            &mut index,
            true,
            tail_window,
            true,
            &mut |_, _| {},
        )?;
        let tail = scanned.tail;
        // Segments past the tail hold nothing: remove them so the writer creates them afresh.
        if scanned.empty_after_tail > 0 {
            for segment in segments.drain(tail.segment + 1..) {
                io.remove(&segment.path)
                    .map_err(|e| StoreError::io("remove empty segment", &segment.path, 0, e))?;
            }
            io.sync_dir(dir)
                .map_err(|e| StoreError::io("sync directory", dir, 0, e))?;
        }
        // What we found may sit only in the page cache (a killed process): make it durable
        // before we present it as acknowledged.
        if options.durability != Durability::Memory {
            for segment in &segments[start_tail.segment.min(tail.segment)..=tail.segment] {
                segment
                    .file
                    .sync_data()
                    .map_err(|e| StoreError::io("sync segment at open", &segment.path, 0, e))?;
            }
        }
        let segment = segments[tail.segment].clone();
        let mark = Mark {
            head: tail.head,
            segment: segment.number,
            end_offset: tail.offset,
            last_record_offset: tail.last_record_offset,
        };
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            io: io.clone(),
            index: IndexLock::new(index),
            segments: RwLock::new(segments),
            published: Published::new(
                mark,
                options.durability == Durability::Synced
                    && !crate::canary::on(crate::canary::Canary::AckBeforeFsync),
            ),
            health: Health::default(),
            counters,
            waiting: Default::default(),
            runners: Mutex::new(Default::default()),
            checkpoints: Checkpoints {
                one_at_a_time: Mutex::new(()),
                head: AtomicU64::new(tail.head),
                running: AtomicBool::new(false),
                background: Mutex::new(None),
            },
            spare_bodies: Mutex::new(SpareBodies::default()),
            options,
            _lock: lock,
        });
        let notifier = match shared.options.durability {
            Durability::Memory => None,
            _ => {
                let notifier = Arc::new(Notifier::new());
                let handle = {
                    let notifier = notifier.clone();
                    let shared = shared.clone();
                    std::thread::Builder::new()
                        .name("annals-notifier".into())
                        .spawn(move || notifier.run(shared))
                        .map_err(|e| StoreError::io("spawn notifier thread", dir, 0, e))?
                };
                Some((notifier, handle))
            }
        };
        let syncer = match &notifier {
            Some((notifier, _)) => {
                let syncer = Arc::new(Syncer::new(
                    segment.clone(),
                    mark,
                    notifier.clone(),
                    shared.options.durability,
                ));
                let handle = {
                    let syncer = syncer.clone();
                    let shared = shared.clone();
                    std::thread::Builder::new()
                        .name("annals-syncer".into())
                        .spawn(move || syncer.run(&shared))
                        .map_err(|e| StoreError::io("spawn syncer thread", dir, 0, e))?
                };
                Some((syncer, handle))
            }
            None => None,
        };
        let (sender, receiver) = crossbeam_channel::bounded(shared.options.limits.queue_depth_max);
        let writer = Writer::new(
            shared.clone(),
            receiver,
            segment,
            tail,
            syncer.as_ref().map(|(s, _)| s.clone()),
        );
        let role = Arc::new(WriterRole::new(writer));
        let handle = {
            let role = role.clone();
            std::thread::Builder::new()
                .name("annals-writer".into())
                .spawn(move || role.run())
        }
        .map_err(|e| StoreError::io("spawn writer thread", dir, 0, e))?;
        let report = OpenReport {
            index: match rebuild_reason {
                None => IndexSource::Checkpoint {
                    scanned_events: tail.head - start_tail.head,
                },
                Some(reason) => IndexSource::Rebuilt { reason },
            },
            torn_tail: scanned
                .torn
                .map(|t| (t.path, t.offset, t.reason.to_string())),
            open_ms: started.elapsed().as_secs_f64() * 1e3,
            mirror: None,
        };
        Ok(Store {
            shared,
            sender: Some(sender),
            writer: Some(handle),
            role,
            syncer,
            notifier,
            report,
            remote: None,
            mirror_dir: None,
            kept: None,
            companions: Arc::new(InDirectory {
                io: io.clone(),
                dir: dir.to_path_buf(),
            }),
        })
    }

    /// Opens the store whose log lives in the PostgreSQL database at `url` (a libpq-style
    /// connection string or URL; several hosts may be given, with
    /// `target_session_attrs=read-write` to find the primary). Creates the schema on first use
    /// and loads the log into memory. Several stores, in this process or others, may open the
    /// same database: each takes in what the others commit. The durability is D3: an append
    /// is acknowledged once the database has committed it (with its `synchronous_commit`
    /// setting in force). The store's copy of the log (its mirror) is filled from the database
    /// into a temporary directory, or kept across clean closes in `options.mirror` (see
    /// [`Options::mirror`]; what the open found is in [`Store::open_report`]).
    pub fn open_postgres(url: &str, options: Options) -> Result<Store, StoreError> {
        if options.durability != Durability::Synced {
            return Err(StoreError::InvalidOption(format!(
                "a PostgreSQL store acknowledges an append once the database has committed it \
                 (D3); {} is not available there",
                options.durability.label()
            )));
        }
        let started = Instant::now();
        // The mirror is a file store, written to the page cache and never synced (D1): the
        // database holds the truth, and reads map the mirror's segments as they do on files.
        // In a private temporary directory, removed at close and filled from the database at
        // open; or in the directory `options.mirror` names, kept across clean closes.
        let mut mirror = options.clone();
        mirror.mirror = None;
        mirror.durability = Durability::Written;
        mirror.checkpoint_on_close = options.mirror.is_some();
        mirror.checkpoint_interval_events = 0;
        // Nothing written to the mirror is synced while it runs, nor its segments filled with
        // zeros: either would put the mirror's disk traffic beside the database's own commits.
        mirror.preallocation = crate::Preallocation::Fallocate;
        mirror.unsynced_bytes_max = 1 << 40;
        let io: Arc<dyn Io> = Arc::new(RealIo);
        // A kept mirror: used as closed, or why it was filled again.
        let (mut store, kept, found) = match &options.mirror {
            None => {
                static MIRRORS: AtomicU64 = AtomicU64::new(0);
                remove_stale_mirrors();
                let dir = std::env::temp_dir().join(format!(
                    "annals-mirror-{}-{}",
                    std::process::id(),
                    MIRRORS.fetch_add(1, Ordering::Relaxed)
                ));
                let _ = std::fs::remove_dir_all(&dir);
                let mut store = Self::open_with_io(io, &dir, mirror)?;
                store.mirror_dir = Some(dir);
                (store, None, None)
            }
            Some(dir) => {
                let (kept, closed) = crate::mirror::KeptMirror::claim(io.clone(), dir)?;
                let (store, found) = Self::open_kept_mirror(url, io, &kept, closed, mirror)?;
                (store, Some(kept), Some(found))
            }
        };
        let resumed = found.as_ref().and_then(|f| f.as_ref().ok());
        let last_append = resumed.map_or_else(Default::default, |closed| closed.last);
        // Companion files live in the database with the log, not in the mirror's directory.
        store.companions = Arc::new(InDatabase::new(crate::pgconnect::Target::parse(url)?));
        store.kept = kept;
        let remote = crate::postgres::Remote::start(
            url,
            store.shared.clone(),
            store.role.clone(),
            last_append,
        )?;
        store.report.mirror = Some(MirrorKind {
            kept: options.mirror.clone(),
            resumed_at: resumed.map(|closed| closed.head),
            rebuilt: found.and_then(Result::err),
            followed: remote.counters.followed.load(Ordering::Relaxed),
        });
        store.report.open_ms = started.elapsed().as_secs_f64() * 1e3;
        store.remote = Some(remote);
        Ok(store)
    }

    /// Opens the file store of a kept mirror: as it was closed, when the database holds its
    /// last append (`closed`, what its clean close recorded), answered with that record; else
    /// emptied, to be filled from the database, answered with why.
    fn open_kept_mirror(
        url: &str,
        io: Arc<dyn Io>,
        kept: &crate::mirror::KeptMirror,
        closed: Result<crate::mirror::Closed, String>,
        options: Options,
    ) -> Result<(Store, Result<crate::mirror::Closed, String>), StoreError> {
        let dir = kept.log_dir();
        let why_not = match closed {
            Err(why) => why,
            Ok(closed) => {
                let store = Self::open_with_io(io.clone(), &dir, options.clone())?;
                let why_not = if store.head() != closed.head {
                    format!(
                        "it ends at position {}, where its close recorded {}",
                        store.head(),
                        closed.head
                    )
                } else {
                    let holds = match closed.head {
                        0 => None,
                        _ => crate::postgres::holds(url, closed.last)?,
                    };
                    match holds {
                        None => {
                            kept.consume()?;
                            return Ok((store, Ok(closed)));
                        }
                        Some(why_not) => why_not,
                    }
                };
                drop(store);
                why_not
            }
        };
        kept.wipe()?;
        let store = Self::open_with_io(io, &dir, options)?;
        debug_assert_eq!(store.head(), 0, "a wiped mirror is empty");
        Ok((store, Err(why_not)))
    }

    /// Opens the store at `location`: a PostgreSQL URL (`postgres://` or `postgresql://`, see
    /// [`Store::open_postgres`]) or else a data directory (see [`Store::open`]).
    pub fn open_location(location: &str, options: Options) -> Result<Store, StoreError> {
        if is_database_url(location) {
            Self::open_postgres(location, options)
        } else {
            Self::open(location, options)
        }
    }

    /// Takes in what the log's backend holds now, and answers the head. On PostgreSQL, a store
    /// follows what other servers commit within moments (woken by the database, or polling);
    /// this waits for it, for a caller that needs to read what was appended elsewhere. On
    /// files, this store is the only writer: the head as it is.
    pub fn refresh(&self) -> Result<u64, StoreError> {
        match &self.remote {
            Some(remote) => remote.refresh(),
            None => Ok(self.head()),
        }
    }

    /// Which backend holds the log: "files" or "postgres".
    pub fn backend(&self) -> &'static str {
        if self.remote.is_some() {
            "postgres"
        } else {
            "files"
        }
    }

    /// What opening found: where the index came from, whether a torn tail was cut.
    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    pub fn durability(&self) -> Durability {
        if self.remote.is_some() {
            return Durability::Synced;
        }
        self.shared.options.durability
    }

    pub fn options(&self) -> &Options {
        &self.shared.options
    }

    pub(crate) fn shared_arc(&self) -> &Arc<Shared> {
        &self.shared
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The position of the last acknowledged event (0 when the store is empty).
    pub fn head(&self) -> u64 {
        self.shared.head()
    }

    /// An append of `events`, to give a condition and options and then send: the one way to
    /// append, whether the caller blocks, awaits or takes a callback (see [`Append`]).
    pub fn appending<'a>(&'a self, events: &'a [NewEvent]) -> Append<'a> {
        Append::of_events(self, events)
    }

    /// An append of the events of `batch` (see [`Store::appending`]). A batch carries no
    /// tracking position: append `NewEvent`s for that.
    pub fn appending_batch(&self, batch: EventBatch) -> Append<'_> {
        Append::of_batch(self, batch)
    }

    /// Appends `events` atomically if `condition` holds; returns the last event's position.
    /// Waits while the append queue is full (backpressure). Shorthand for
    /// [`Store::appending`] with [`Append::wait`].
    pub fn append(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
    ) -> Result<u64, AppendError> {
        self.append_with(events, condition, AppendOptions::default())
    }

    /// [`Store::append`] with per-append options.
    pub fn append_with(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
        options: AppendOptions,
    ) -> Result<u64, AppendError> {
        self.appending(events)
            .condition_given(condition.map(Cow::Borrowed))
            .options(options)
            .wait()
    }

    /// Like [`Store::append`], but fails with [`InputError::QueueFull`] instead of waiting when
    /// the append queue is full ([`Append::fail_when_full`]).
    pub fn try_append(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
    ) -> Result<u64, AppendError> {
        self.appending(events)
            .condition_given(condition.map(Cow::Borrowed))
            .fail_when_full()
            .wait()
    }

    /// Queues an append and returns at once; `done` is called with the outcome on one of the
    /// store's threads. Shorthand for [`Store::appending`] with [`Append::then`].
    pub fn append_then(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
        options: AppendOptions,
        done: impl FnOnce(Result<u64, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        self.appending(events)
            .condition_given(condition.map(Cow::Borrowed))
            .options(options)
            .then(done)
    }

    /// Like [`Store::append_then`], but fails with [`InputError::QueueFull`] instead of waiting
    /// when the append queue is full: for callers that must never block, such as async tasks.
    pub fn try_append_then(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
        options: AppendOptions,
        done: impl FnOnce(Result<u64, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        self.appending(events)
            .condition_given(condition.map(Cow::Borrowed))
            .options(options)
            .fail_when_full()
            .then(done)
    }

    /// Appends without blocking the calling thread. Shorthand for [`Store::appending`] with
    /// [`Append::submit`], which says how to await it.
    pub async fn append_async(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
        options: AppendOptions,
    ) -> Result<u64, AppendError> {
        self.appending(events)
            .condition_given(condition.map(Cow::Borrowed))
            .options(options)
            .submit()
            .await
    }

    pub(crate) fn submit(
        &self,
        events: &[NewEvent],
        condition: Option<Cow<'_, AppendCondition>>,
        options: AppendOptions,
        reply: ReplyTo,
        how: Submit,
    ) -> Result<(), AppendError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e.into());
        }
        let limits = &self.shared.options.limits;
        let tracking = options
            .tracking
            .as_ref()
            .map(|t| (t.source.as_str(), t.position));
        let append = encode_append_tracked(events, tracking, limits)?;
        self.submit_encoded(append, condition, options, reply, how, None)
    }

    /// Queues an append read from a log (a copy's), with its own append time; see
    /// [`Store::append_stored_then`].
    pub(crate) fn submit_stored(
        &self,
        append: EncodedAppend,
        condition: AppendCondition,
        appended_at_us: u64,
        done: Box<dyn FnOnce(Result<u64, AppendError>) + Send>,
    ) -> Result<(), AppendError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e.into());
        }
        let limits = &self.shared.options.limits;
        if append.body.len() > limits.append_bytes_max {
            return Err(InputError::AppendTooLarge {
                bytes: append.body.len(),
                max: limits.append_bytes_max,
            }
            .into());
        }
        self.submit_encoded(
            append,
            Some(Cow::Owned(condition)),
            AppendOptions::default(),
            ReplyTo::Callback(done),
            Submit {
                wait_when_full: true,
                alone: false,
            },
            Some(appended_at_us),
        )
    }

    /// An empty [`EventBatch`] checked against this store's limits.
    pub fn batch(&self) -> EventBatch {
        EventBatch::new(&self.shared.options.limits)
    }

    /// [`Store::batch`] with room for `bytes` of encoded events.
    pub fn batch_with_capacity(&self, bytes: usize) -> EventBatch {
        let body = self.shared.spare_bodies.lock().take();
        EventBatch::with_body(&self.shared.options.limits, body, bytes)
    }

    /// Appends the events of `batch` atomically if `condition` holds, as [`Store::append`].
    pub fn append_batch(
        &self,
        batch: EventBatch,
        condition: Option<&AppendCondition>,
    ) -> Result<u64, AppendError> {
        self.appending_batch(batch)
            .condition_given(condition.map(Cow::Borrowed))
            .wait()
    }

    /// Queues the events of `batch` and returns at once, as [`Store::append_then`]: `done` is
    /// called with the outcome on one of the store's threads. Waits while the queue is full.
    pub fn append_batch_then(
        &self,
        batch: EventBatch,
        condition: Option<&AppendCondition>,
        options: AppendOptions,
        done: impl FnOnce(Result<u64, AppendError>) + Send + 'static,
    ) -> Result<(), AppendError> {
        self.appending_batch(batch)
            .condition_given(condition.map(Cow::Borrowed))
            .options(options)
            .then(done)
    }

    pub(crate) fn submit_batch(
        &self,
        batch: EventBatch,
        condition: Option<Cow<'_, AppendCondition>>,
        options: AppendOptions,
        reply: ReplyTo,
        how: Submit,
    ) -> Result<(), AppendError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e.into());
        }
        if options.tracking.is_some() {
            return Err(InputError::TrackingInBatch.into());
        }
        let append = batch.into_append()?;
        self.submit_encoded(append, condition, options, reply, how, None)
    }

    fn submit_encoded(
        &self,
        append: EncodedAppend,
        condition: Option<Cow<'_, AppendCondition>>,
        options: AppendOptions,
        reply: ReplyTo,
        how: Submit,
        appended_at: Option<u64>,
    ) -> Result<(), AppendError> {
        let sender = self.sender.as_ref().ok_or(StoreError::Closed)?;
        let limits = &self.shared.options.limits;
        let condition = match condition {
            Some(c) => {
                c.fail_if_events_match.validate(limits)?;
                Some(c.into_owned())
            }
            None => None,
        };
        if options.require_synced && self.durability() == Durability::Memory {
            return Err(InputError::SyncUnavailable.into());
        }
        let condition = match condition {
            // Deliberately wrong: checks the condition against the published head, outside the
            // writer, so two racing appends can both pass.
            Some(c) if crate::canary::on(crate::canary::Canary::ConditionOutsideWriter) => {
                let index = self.shared.index.read();
                let head = self.shared.head();
                let query = &c.fail_if_events_match;
                if let Some(p) = index.first_query_match_after(query, c.after.unwrap_or(0)) {
                    if p <= head {
                        return Err(AppendError::ConditionFailed { position: p });
                    }
                }
                None
            }
            other => other,
        };
        // From here on the reply must be answered exactly once: by the writer, or disarmed
        // below when the request never reaches it.
        let request = Request {
            append,
            condition,
            require_synced: options.require_synced,
            reply: Reply::new(reply),
            appended_at,
        };
        if let Some(remote) = &self.remote {
            let request = if how.alone {
                match remote.commit_alone(request) {
                    Ok(()) => return Ok(()),
                    Err(request) => request,
                }
            } else {
                request
            };
            return remote
                .submit(request, how.wait_when_full)
                .map_err(|e| match e {
                    TrySendError::Full(r) => {
                        r.reply.disarm();
                        AppendError::Input(InputError::QueueFull {
                            depth: remote.queue_depth(),
                        })
                    }
                    TrySendError::Disconnected(r) => {
                        r.reply.disarm();
                        AppendError::Store(StoreError::Closed)
                    }
                });
        }
        let request = if how.alone {
            match self.role.commit_alone(request) {
                Ok(()) => return Ok(()),
                Err(request) => request,
            }
        } else {
            request
        };
        let request = match self.role.stage_during_sync(request) {
            Ok(()) => return Ok(()),
            Err(request) => request,
        };
        if how.wait_when_full {
            sender.send(request).map_err(|e| {
                e.into_inner().reply.disarm();
                StoreError::Closed
            })?;
        } else {
            sender.try_send(request).map_err(|e| match e {
                TrySendError::Full(r) => {
                    r.reply.disarm();
                    AppendError::Input(InputError::QueueFull {
                        depth: sender.len(),
                    })
                }
                TrySendError::Disconnected(r) => {
                    r.reply.disarm();
                    AppendError::Store(StoreError::Closed)
                }
            })?;
        }
        Ok(())
    }

    /// Reads the events matching `query`, streaming: the iterator holds no lock and reads
    /// events as it goes. It sees the log as it was when `read` was called.
    pub fn read(&self, query: &Query, options: ReadOptions) -> Result<ReadIter, ReadError> {
        self.read_after(query, &[], options)
    }

    /// [`Store::read`], with item `i` of `query` matching only events after position
    /// `afters[i]`: one read (one head) for a decision that already holds some of its states.
    pub(crate) fn read_after(
        &self,
        query: &Query,
        afters: &[u64],
        options: ReadOptions,
    ) -> Result<ReadIter, ReadError> {
        query.validate(&self.shared.options.limits)?;
        ReadIter::with_afters(
            self.shared.clone(),
            query,
            afters,
            options,
            self.shared.head(),
        )
    }

    /// Follows the events matching `query` after position `after`: first those already in the
    /// log, then new ones as they are acknowledged, through one code path.
    pub fn subscribe(&self, query: &Query, after: u64) -> Result<Subscription, ReadError> {
        query.validate(&self.shared.options.limits)?;
        Ok(Subscription::new(self.shared.clone(), query.clone(), after))
    }

    /// Checks the log of a running store up to the current head without stopping it: every
    /// record's CRC and sequence (a full forward scan, as reads do), and that the index holds
    /// every event as the log does (type and tag postings). `progress` is told (events checked,
    /// head) every 64Ki events. Nothing is changed; appends go on meanwhile.
    pub fn check(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<LiveCheck, StoreError> {
        let started = Instant::now();
        let iter = ReadIter::new(
            self.shared.clone(),
            &Query::all(),
            ReadOptions::forwards(),
            self.head(),
        )
        .map_err(store_error)?;
        let head = iter.head();
        let mut checked = 0u64;
        let mut pending: Vec<Event> = Vec::with_capacity(4096);
        let mut problem = None;
        let check_pending = |pending: &mut Vec<Event>| {
            let index = self.shared.index.read();
            for event in pending.drain(..) {
                index.check_event(event.position(), event.event_type(), event.tags())?;
            }
            Ok(())
        };
        for event in iter {
            let event = event.map_err(store_error)?;
            checked += 1;
            if event.position() != checked {
                problem = Some(format!(
                    "the log skips from position {} to {}",
                    checked - 1,
                    event.position()
                ));
                break;
            }
            pending.push(event);
            if pending.len() == pending.capacity() {
                if let Err(why) = check_pending(&mut pending) {
                    problem = Some(why);
                    break;
                }
            }
            if checked & 0xFFFF == 0 {
                progress(checked, head);
            }
        }
        if problem.is_none() {
            problem = check_pending(&mut pending).err();
        }
        if problem.is_none() && checked != head {
            problem = Some(format!(
                "the log holds {checked} events, the head is {head}"
            ));
        }
        progress(checked, head);
        Ok(LiveCheck {
            head,
            events: checked,
            problem,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// The tracking position last recorded for `source` by an acknowledged append.
    pub fn tracking(&self, source: &str) -> Option<u64> {
        let index = self.shared.index.read();
        // Read the head under the lock: the writer prunes history against the head it saw
        // under the write lock, and a head read before the lock could be older than that.
        index.tracking(source, self.head())
    }

    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let (index_bytes, types, tags) = {
            let index = self.shared.index.read();
            (index.bytes_used(), index.type_count(), index.tag_count())
        };
        let head = self.head();
        let fsyncs = c.fsyncs.load(Ordering::Relaxed);
        Stats {
            head,
            backend: self.backend(),
            database: self.remote.as_ref().map(|r| r.stats()),
            durability: self.durability().label(),
            durability_description: self.durability().description(),
            segments: self.shared.segments.read().len(),
            segment_bytes: self.shared.options.segment_bytes,
            types,
            tags,
            index_bytes,
            index_bytes_per_event: if head == 0 {
                0.0
            } else {
                index_bytes as f64 / head as f64
            },
            appends: c.appends.load(Ordering::Relaxed),
            events_appended: c.events.load(Ordering::Relaxed),
            conditions_failed: c.conditions_failed.load(Ordering::Relaxed),
            idempotent_retries: c.idempotent_retries.load(Ordering::Relaxed),
            checkpoints_failed: c.checkpoints_failed.load(Ordering::Relaxed),
            groups: c.groups.load(Ordering::Relaxed),
            caller_commits: c.caller_commits.load(Ordering::Relaxed),
            caller_stages: c.caller_stages.load(Ordering::Relaxed),
            fsyncs,
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            segments_created: c.segments_created.load(Ordering::Relaxed),
            zero_fill_bytes: c.zero_fill_bytes.load(Ordering::Relaxed),
            fsync_us_mean: if fsyncs == 0 {
                0.0
            } else {
                c.fsync_us_total.load(Ordering::Relaxed) as f64 / fsyncs as f64
            },
            fsync_us_max: c.fsync_us_max.load(Ordering::Relaxed),
            fsync_us: c.fsync_us.snapshot(),
            group_appends: c.group_appends.snapshot(),
            queue_depth: match &self.remote {
                Some(remote) => remote.queue_depth(),
                None => self.sender.as_ref().map_or(0, |s| s.len()),
            },
            waiting: self.shared.waiting.load(Ordering::Relaxed),
            poisoned: self.shared.poison_error().map(|e| e.to_string()),
            disk_full: self.disk_full(),
            disk_full_refusals: c.disk_full_refusals.load(Ordering::Relaxed),
            disk_free_bytes: match &self.remote {
                Some(_) => None,
                None => self
                    .shared
                    .io
                    .available_bytes(&self.shared.dir)
                    .ok()
                    .flatten(),
            },
        }
    }

    /// Why appends that need a new segment are refused now: the last roll found no room, and
    /// the file system still lacks it (when it tells; the next roll finds out otherwise).
    fn disk_full(&self) -> Option<String> {
        let reason = self.shared.health.disk_full()?;
        let options = &self.shared.options;
        let needed = options.segment_bytes.saturating_add(options.disk_reserve());
        match self.shared.io.available_bytes(&self.shared.dir) {
            Ok(Some(available)) if available >= needed => None,
            _ => Some(reason),
        }
    }

    /// Writes the index checkpoint for the current head, so the next open need not rescan.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.shared.checkpoint()
    }

    /// Drains the queue, syncs, writes the checkpoint (unless disabled) and releases the
    /// directory.
    pub fn close(mut self) -> Result<(), StoreError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), StoreError> {
        // The backend first: what it has committed still goes to the mirror's writer.
        let last_append = self.remote.take().map(|mut remote| {
            remote.stop();
            remote.last_append()
        });
        let result = self.stop_threads();
        if let Some(dir) = self.mirror_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        match (self.kept.take(), last_append) {
            (Some(kept), Some(last)) if result.is_ok() => self.close_kept_mirror(&kept, last),
            _ => result,
        }
    }

    /// Syncs a kept mirror, then records its clean close (see mirror.rs); the index
    /// checkpoint is written and synced already.
    fn close_kept_mirror(
        &self,
        kept: &crate::mirror::KeptMirror,
        last: crate::postgres::StoredAppend,
    ) -> Result<(), StoreError> {
        let head = self.head();
        debug_assert_eq!(last.last, head, "a kept mirror ends with its last append");
        if last.last != head {
            // Not recorded as closed: the next open fills it from the database.
            return Err(StoreError::Database(format!(
                "the mirror ends at position {head}, its last append at {}",
                last.last
            )));
        }
        for segment in self.shared.segments.read().iter() {
            segment
                .file
                .sync_data()
                .map_err(|e| StoreError::io("sync mirror segment", &segment.path, 0, e))?;
        }
        kept.close(crate::mirror::Closed { head, last })
    }

    /// Stops the writer's threads (the backend's are stopped first) and writes the checkpoint.
    fn stop_threads(&mut self) -> Result<(), StoreError> {
        let Some(sender) = self.sender.take() else {
            return Ok(());
        };
        drop(sender);
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        if let Some((syncer, handle)) = self.syncer.take() {
            syncer.stop();
            let _ = handle.join();
        }
        if let Some((notifier, handle)) = self.notifier.take() {
            notifier.stop();
            let _ = handle.join();
        }
        let background = self.shared.checkpoints.background.lock().take();
        if let Some(handle) = background {
            let _ = handle.join();
        }
        self.shared.health.close();
        self.shared.published.wake_all();
        if let Some(e) = self.shared.poison_error() {
            return Err(e);
        }
        if self.shared.options.checkpoint_on_close && self.head() > 0 {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// The store's I/O layer (the simulated disk in tests).
    pub fn io(&self) -> Arc<dyn Io> {
        self.shared.io.clone()
    }

    /// Where companions keep their files beside the log (read models' checkpoints, the
    /// exchange's snapshots): the data directory on files, the database on PostgreSQL.
    pub fn companions(&self) -> Arc<dyn Companions> {
        self.companions.clone()
    }

    /// The log is durable through this position (a lower bound).
    pub fn synced(&self) -> u64 {
        if self.remote.is_some() {
            // Everything the mirror holds was committed by the database first.
            return self.head();
        }
        self.shared.published.synced()
    }

    /// Claims `name` for a read-model runner; false when one of that name is running.
    pub(crate) fn claim_runner(&self, name: &str) -> bool {
        self.shared.runners.lock().insert(name.to_owned())
    }

    pub(crate) fn release_runner(&self, name: &str) {
        self.shared.runners.lock().remove(name);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.shared.health.is_closed()
    }

    /// Why the store is poisoned, if it is.
    pub(crate) fn poison_reason(&self) -> Option<StoreError> {
        self.shared.poison_error()
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Loads the checkpoint if it agrees with the log: the index and the end of the log it covers
/// (where scanning resumes); or why it cannot be used.
fn load_checkpoint(
    io: &dyn Io,
    dir: &Path,
    segments: &[Arc<Segment>],
) -> Result<(Index, Tail), String> {
    let (index, mark) = checkpoint::read(io, dir).map_err(|r| format!("checkpoint {r}"))?;
    let first = segments.first().map_or(0, |s| s.number);
    let position = mark
        .segment
        .checked_sub(first)
        .map(|p| p as usize)
        .filter(|&p| p < segments.len())
        .ok_or("checkpoint stale: its segment is gone")?;
    if mark.head == 0 || index.len() != mark.head {
        return Err("checkpoint stale: empty or inconsistent".into());
    }
    if !recovery::record_ends_at(
        &segments[position],
        mark.last_record_offset,
        mark.end_offset,
        mark.head,
    ) {
        return Err("checkpoint stale: the log does not hold its last record".into());
    }
    Ok((
        index,
        Tail {
            head: mark.head,
            segment: position,
            offset: mark.end_offset,
            last_record_offset: mark.last_record_offset,
            records: 0,
        },
    ))
}
