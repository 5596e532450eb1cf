//! The state the writer, the readers, subscriptions and the store's handle share: the index,
//! the segments, the published head, health, counters, and the trigger of background index
//! checkpoints. It sits below all of them: the writer publishes and starts checkpoints here
//! without reaching up into the store.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::checkpoint;
use crate::error::{ReadError, StoreError};
use crate::health::Health;
use crate::histogram::Log2Histogram;
use crate::index::IndexLock;
use crate::io::{DirLock, Io};
use crate::options::Options;
use crate::published::Published;
use crate::route::{Policy, Route};
use crate::segment::Segment;

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
    /// Appends committed, by the route they took (indexed as [`Route::ALL`]).
    pub(crate) routes: [AtomicU64; Route::ALL.len()],
}

impl Counters {
    /// Counts `appends` committed by `route`.
    pub(crate) fn committed(&self, route: Route, appends: usize) {
        let at = Route::ALL
            .iter()
            .position(|r| *r == route)
            .expect("every route is listed");
        self.routes[at].fetch_add(appends as u64, Ordering::Relaxed);
    }

    /// Appends committed by each route, by its name.
    pub(crate) fn routes(&self) -> std::collections::BTreeMap<String, u64> {
        Route::ALL
            .iter()
            .zip(&self.routes)
            .map(|(route, n)| (route.name().to_string(), n.load(Ordering::Relaxed)))
            .collect()
    }

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
    /// What the commit path may do, decided at open from the class and the backend.
    pub(crate) policy: Policy,
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
    pub(crate) checkpoints: CheckpointTrigger,
    /// Buffers of appended batches, handed back by the writer for [`Store::batch_with_capacity`]
    /// to reuse: a journal that appends a batch of tens of KiB after another then writes into
    /// memory that is already mapped, instead of faulting in and zeroing fresh pages.
    pub(crate) spare_bodies: Mutex<SpareBodies>,
    /// Callers waiting for an append's outcome (see [`crate::request::Waiting`]).
    pub(crate) waiting: std::sync::atomic::AtomicUsize,
    /// The data subjects' keys (`Options::subjects`); None without subjects.
    pub(crate) keys: Option<Arc<crate::keys::KeyStore>>,
    /// The data directory's lock, held as long as the store is open.
    pub(crate) _lock: Box<dyn DirLock>,
}

/// The capacities of batch buffers worth keeping for reuse, and the most memory all kept
/// buffers may hold: a store whose clients never call [`Store::batch_with_capacity`] keeps
/// at most this much idle.
const SPARE_BODY_BYTES: std::ops::RangeInclusive<usize> = (4 << 10)..=(1 << 20);

const SPARE_BYTES_MAX: usize = 4 << 20;

/// When the index is checkpointed: one checkpoint at a time, in the background once enough
/// events are published since the last.
pub(crate) struct CheckpointTrigger {
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

impl CheckpointTrigger {
    /// None running, the last at `head` (the log's head at open: what the open found is
    /// either in the checkpoint it loaded or scanned, and costs the next open no more).
    pub(crate) fn new(head: u64) -> Self {
        CheckpointTrigger {
            one_at_a_time: Mutex::new(()),
            head: AtomicU64::new(head),
            running: AtomicBool::new(false),
            background: Mutex::new(None),
        }
    }

    /// Waits for the background checkpoint, if one runs (at close).
    pub(crate) fn join_background(&self) {
        let background = self.background.lock().take();
        if let Some(handle) = background {
            let _ = handle.join();
        }
    }
}

impl SpareBodies {
    /// Keeps `body` if it is of a useful size and the kept buffers stay within
    /// [`SPARE_BYTES_MAX`].
    pub(crate) fn keep(&mut self, body: Vec<u8>) {
        let capacity = body.capacity();
        if SPARE_BODY_BYTES.contains(&capacity) && self.bytes + capacity <= SPARE_BYTES_MAX {
            self.bytes += capacity;
            self.bodies.push(body);
        }
    }

    /// A kept buffer, or an empty one.
    pub(crate) fn take(&mut self) -> Vec<u8> {
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
        // The subjects' new keys go to the key file first, so that the next open reads the
        // log's grants from no earlier than this head.
        if let Some(keys) = &self.keys {
            keys.persist(self.head())?;
        }
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
        let index_due = interval > 0 && self.head() >= last + interval.max(last / 2);
        // New subjects' keys go to the key file within about a second (or a batch), so that
        // appends carry them for no longer: without it they would travel until the next
        // checkpoint (see `keys/grants.rs`). No background work at all when the interval is 0.
        let keys_due = interval > 0
            && self.io.is_persistent()
            && self.keys.as_ref().is_some_and(|k| k.persist_due());
        if !index_due && !keys_due {
            return;
        }
        if self.checkpoints.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = self.clone();
        let spawned = std::thread::Builder::new()
            .name("annals-checkpoint".into())
            .spawn(move || {
                let done = match (index_due, &shared.keys) {
                    (true, _) => shared.checkpoint(),
                    (false, Some(keys)) => keys.persist(shared.head()),
                    (false, None) => Ok(()),
                };
                if let Err(e) = done {
                    tracing::warn!(
                        error = %e,
                        "a background checkpoint failed (the log stays the truth: the next \
                         open scans further, and new subjects' keys travel in the log meanwhile)"
                    );
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
        ReadError::Unavailable { reason } => StoreError::Unavailable { reason },
        ReadError::Input(e) => StoreError::InvalidOption(e.to_string()),
    }
}
