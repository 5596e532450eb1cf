//! The store's handle, a thin facade: opening (recovery) and closing, appending (`submit.rs`),
//! reading and subscribing, stats. On PostgreSQL, opening and closing the backend and its
//! mirror is `store/postgres.rs`.

use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::TrySendError;
use parking_lot::{Mutex, RwLock};

use crate::append::{Append, AppendOptions, Submit};
use crate::batch::EventBatch;
use crate::checkpoint;
use crate::companions::{Companions, InDirectory};
use crate::error::{AppendError, InputError, ReadError, StoreError};
use crate::event::{Event, NewEvent};
use crate::health::Health;
use crate::index::{Index, IndexLock};
use crate::io::{Io, RealIo};
use crate::log::Log;
use crate::options::{Durability, Options};
use crate::published::Mark;
use crate::published::Published;
use crate::query::{AppendCondition, Query, ReadOptions};
use crate::read::ReadIter;
use crate::record::{encode_append_tracked, EncodedAppend};
use crate::recovery::{self, Tail};
use crate::route::{Backend, Policy};
use crate::segment::Segment;
use crate::shared::{store_error, CheckpointTrigger, Counters, Shared, SpareBodies};
use crate::sim::SimIo;
use crate::subscription::Subscription;
use crate::writer::{FileLog, Notifier, Reply, ReplyTo, Request, Syncer, Writer, WriterRole};

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(not(feature = "postgres"))]
mod without_postgres;
#[cfg(feature = "postgres")]
use crate::postgres::Remote;
#[cfg(not(feature = "postgres"))]
use without_postgres::Remote;
#[cfg(any(feature = "postgres", feature = "object-store"))]
mod kept;
#[cfg(feature = "object-store")]
mod replica;
pub(crate) mod subjects;
mod submit;

pub use crate::stats::{
    BackupStats, DatabaseStats, IndexSource, LiveCheck, MirrorKind, OpenReport, ReplicaStats,
    ScrubStats, Stats,
};

/// The local class of a store opened in `options.durability`, and whether its appends are
/// D4 besides (D4 is D3 on the log, and a backup's put before acknowledgement).
pub(crate) fn off_machine_class(mut options: Options) -> Result<(Options, bool), StoreError> {
    if options.durability != Durability::OffMachine {
        return Ok((options, false));
    }
    if options.backup.is_none() {
        return Err(StoreError::InvalidOption(
            "the off-machine class (d4) needs a backup in object storage (Options::backup, \
             annals serve --backup URL)"
                .into(),
        ));
    }
    options.durability = Durability::Synced;
    Ok((options, true))
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

/// A durable DCB event store. See the crate documentation for a tour.
pub struct Store {
    shared: Arc<Shared>,
    /// The log on segment files (on PostgreSQL, the mirror's): its writer's queue and role.
    /// Taken at close.
    files: Option<FileLog>,
    writer: Option<JoinHandle<()>>,
    syncer: Option<(Arc<Syncer>, JoinHandle<()>)>,
    notifier: Option<(Arc<Notifier>, JoinHandle<()>)>,
    report: OpenReport,
    /// The database backend, when the log lives in PostgreSQL: appends go through it, and the
    /// rest of the store is the memory-only mirror it keeps (see the `postgres` module).
    remote: Option<Remote>,
    /// The mirror's temporary directory, removed at close.
    #[cfg(feature = "postgres")]
    mirror_dir: Option<std::path::PathBuf>,
    /// The mirror's (or a replica's copy's) directory when it is kept across closes
    /// (`Options::mirror`).
    #[cfg(any(feature = "postgres", feature = "object-store"))]
    kept: Option<crate::kept::KeptMirror>,
    /// Where read models' checkpoints and the exchange's snapshots are kept.
    companions: Arc<dyn Companions>,
    /// The continuous backup into object storage (`Options::backup`), once started.
    #[cfg(feature = "object-store")]
    backup: Option<crate::ship::Backup>,
    /// Every append is D4 (the store was opened with `Durability::OffMachine`).
    off_machine: bool,
    /// The background scrub of sealed segments (`Options::scrub`), on files.
    scrub: Option<crate::scrub::Scrub>,
    /// A read replica's follower of its backup, and its copy's temporary directory (None:
    /// the copy is kept, in `kept`).
    #[cfg(feature = "object-store")]
    replica: Option<(crate::replica::Replica, Option<std::path::PathBuf>)>,
}

const LOCK_FILE: &str = "LOCK";

impl Store {
    /// Whether a lone async caller polls for its outcome before it sleeps: on files, where
    /// the wait is an fdatasync and the caller's core is otherwise idle; not on PostgreSQL,
    /// where the wait is the database's work on the same machine's cores (R30).
    pub(crate) fn lone_async_polls(&self) -> bool {
        self.shared.policy.lone_async_polls
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
        let (local, off_machine) = off_machine_class(options)?;
        let store = Self::open_log(io, dir, local.clone(), Backend::Files, None)?;
        store.settle_erasures()?;
        store.begin_backup(&local, off_machine)
    }

    /// Starts the background work `options` asks for: the scrub (on files) and the
    /// continuous backup.
    fn begin_backup(mut self, options: &Options, off_machine: bool) -> Result<Store, StoreError> {
        self.off_machine = off_machine;
        let on_files = self.shared.policy.backend == Backend::Files
            && options.durability != Durability::Memory;
        if let (Some(scrub), true) = (&options.scrub, on_files) {
            self.scrub = Some(crate::scrub::Scrub::start(
                self.shared.clone(),
                scrub.clone(),
                options.backup.clone(),
            )?);
        }
        let Some(backup) = &options.backup else {
            return Ok(self);
        };
        #[cfg(feature = "object-store")]
        {
            self.backup = Some(crate::ship::Backup::start(
                self.shared.clone(),
                backup.clone(),
            )?);
            Ok(self)
        }
        #[cfg(not(feature = "object-store"))]
        Err(StoreError::InvalidOption(format!(
            "a backup to {} needs object storage, which this build leaves out (the annals \
             crate's feature `object-store`)",
            backup.url
        )))
    }

    /// Opens the log on files in `dir`: the store's own, or the mirror of a database
    /// (`backend`), which decides with the class the commit path's policy.
    fn open_log(
        io: Arc<dyn Io>,
        dir: &Path,
        options: Options,
        backend: Backend,
        table: Option<Arc<dyn crate::keys::KeyTable>>,
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
        let keys = Self::open_keys(&io, dir, &options, backend, table)?;
        let mut segments = recovery::open_segments(io.as_ref(), dir, true)?;
        let counters = Counters::default();
        // No log and no checkpoint: a new store (a checkpoint without segments is a lost log).
        let new = backend == Backend::Files
            && segments.is_empty()
            && !io
                .list(dir)
                .map_err(|e| StoreError::io("list data directory", dir, 0, e))?
                .iter()
                .any(|n| n == checkpoint::FILE_NAME);
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
        let policy = Policy::new(options.durability, backend);
        let (published, right) = Published::new(mark, policy.publish_when_synced);
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            io: io.clone(),
            index: IndexLock::new(index),
            segments: RwLock::new(segments),
            published,
            policy,
            health: Health::default(),
            counters,
            waiting: Default::default(),
            runners: Mutex::new(Default::default()),
            checkpoints: CheckpointTrigger::new(tail.head),
            spare_bodies: Mutex::new(SpareBodies::default()),
            options,
            keys,
            _lock: lock,
        });
        let notifier = match shared.options.durability {
            Durability::Memory => None,
            _ => {
                let notifier = Arc::new(Notifier::new(right));
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
                    right,
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
            right,
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
                Some(_) if new => IndexSource::New,
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
        let files = FileLog::new(sender, role, shared.clone());
        let store = Store {
            shared,
            files: Some(files),
            writer: Some(handle),
            syncer,
            notifier,
            report,
            remote: None,
            #[cfg(feature = "postgres")]
            mirror_dir: None,
            #[cfg(any(feature = "postgres", feature = "object-store"))]
            kept: None,
            companions: Arc::new(InDirectory {
                io: io.clone(),
                dir: dir.to_path_buf(),
            }),
            #[cfg(feature = "object-store")]
            backup: None,
            off_machine: false,
            scrub: None,
            #[cfg(feature = "object-store")]
            replica: None,
        };
        store.take_in_grants()?;
        Ok(store)
    }

    /// Opens the store at `location`: a PostgreSQL URL (`postgres://` or `postgresql://`, see
    /// [`Store::open_postgres`]) or else a data directory (see [`Store::open`]).
    pub fn open_location(location: &str, options: Options) -> Result<Store, StoreError> {
        if is_database_url(location) {
            #[cfg(feature = "postgres")]
            return Self::open_postgres(location, options);
            #[cfg(not(feature = "postgres"))]
            return Err(without_postgres::unavailable(location));
        } else {
            Self::open(location, options)
        }
    }

    /// Takes in what the log's backend holds now, and answers the head. On PostgreSQL, a store
    /// follows what other servers commit within moments (woken by the database, or polling);
    /// this waits for it, for a caller that needs to read what was appended elsewhere. On
    /// files, this store is the only writer: the head as it is.
    pub fn refresh(&self) -> Result<u64, StoreError> {
        match self.log() {
            Some(log) => log.refresh(),
            None => Ok(self.head()),
        }
    }

    /// Which backend holds the log: "files" or "postgres".
    pub fn backend(&self) -> &'static str {
        self.log().map_or("files", |log| log.name())
    }

    /// Where the log is committed: the database when there is one, else segment files; None
    /// once the store is closed.
    fn log(&self) -> Option<&dyn Log> {
        #[cfg(feature = "object-store")]
        if let (Some((replica, _)), Some(_)) = (&self.replica, &self.files) {
            return Some(replica);
        }
        match (&self.remote, &self.files) {
            (Some(remote), _) => Some(remote),
            (None, Some(files)) => Some(files),
            (None, None) => None,
        }
    }

    /// What opening found: where the index came from, whether a torn tail was cut.
    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    pub fn durability(&self) -> Durability {
        let local = self
            .log()
            .map_or(self.shared.options.durability, |log| log.durability());
        if self.off_machine {
            Durability::OffMachine
        } else {
            local
        }
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
        let (index_bytes, index_bytes_per_event, types, tags) = {
            let index = self.shared.index.read();
            (
                index.bytes_used(),
                index.bytes_per_event(),
                index.type_count(),
                index.tag_count(),
            )
        };
        let head = self.head();
        let fsyncs = c.fsyncs.load(Ordering::Relaxed);
        let replica = self.replica_stats();
        Stats {
            head,
            backend: self.backend(),
            database: self.log().and_then(|log| log.database_stats()),
            // A replica acknowledges no appends, so it has no append class of its own.
            durability: match replica {
                Some(_) => "replica",
                None => self.durability().label(),
            },
            durability_description: match replica {
                Some(_) => crate::stats::REPLICA_CLASS,
                None => self.durability().description(),
            },
            segments: self.shared.segments.read().len(),
            segment_bytes: self.shared.options.segment_bytes,
            types,
            tags,
            index_bytes,
            index_bytes_per_event,
            appends: c.appends.load(Ordering::Relaxed),
            events_appended: c.events.load(Ordering::Relaxed),
            conditions_failed: c.conditions_failed.load(Ordering::Relaxed),
            idempotent_retries: c.idempotent_retries.load(Ordering::Relaxed),
            checkpoints_failed: c.checkpoints_failed.load(Ordering::Relaxed),
            groups: c.groups.load(Ordering::Relaxed),
            caller_commits: c.caller_commits.load(Ordering::Relaxed),
            caller_stages: c.caller_stages.load(Ordering::Relaxed),
            commits: c.routes(),
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
            queue_depth: self.log().map_or(0, |log| log.queue_depth()),
            waiting: self.shared.waiting.load(Ordering::Relaxed),
            poisoned: self.shared.poison_error().map(|e| e.to_string()),
            appends_refused: self.shared.health.appends_refused().map(str::to_string),
            disk_full: self.disk_full(),
            disk_full_refusals: c.disk_full_refusals.load(Ordering::Relaxed),
            backup: self.backup_stats(),
            scrub: self.scrub.as_ref().map(|s| s.state.stats()),
            replica,
            disk_free_bytes: match self.log().is_none_or(|log| log.on_local_disk()) {
                false => None,
                true => self
                    .shared
                    .io
                    .available_bytes(&self.shared.dir)
                    .ok()
                    .flatten(),
            },
        }
    }

    fn backup_stats(&self) -> Option<BackupStats> {
        #[cfg(feature = "object-store")]
        return self.backup.as_ref().map(|b| b.state.stats(self.synced()));
        #[cfg(not(feature = "object-store"))]
        None
    }

    fn replica_stats(&self) -> Option<ReplicaStats> {
        #[cfg(feature = "object-store")]
        return self.replica.as_ref().map(|(r, _)| r.stats());
        #[cfg(not(feature = "object-store"))]
        None
    }

    /// The backup's state, for appends that wait for it (D4).
    #[cfg(feature = "object-store")]
    pub(crate) fn backup_state(&self) -> Option<&Arc<crate::ship::BackupState>> {
        self.backup.as_ref().map(|b| &b.state)
    }

    /// Every append of this store is D4.
    pub(crate) fn all_off_machine(&self) -> bool {
        self.off_machine
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
        #[cfg(feature = "postgres")]
        return self.shutdown_with_database();
        #[cfg(not(feature = "postgres"))]
        self.stop_threads()
    }

    /// Stops the writer's threads (the backend's are stopped first) and writes the checkpoint.
    fn stop_threads(&mut self) -> Result<(), StoreError> {
        // A replica's follower hands records to the writer: it stops first; its copy goes.
        #[cfg(feature = "object-store")]
        if let Some((mut replica, dir)) = self.replica.take() {
            replica.stop();
            let stopped = self.stop_threads();
            match (dir, self.kept.take()) {
                (Some(dir), _) => {
                    let _ = std::fs::remove_dir_all(dir);
                }
                (None, Some(kept)) if stopped.is_ok() => {
                    return self.close_kept_mirror(&kept, replica.last_append(), StoreError::Backup)
                }
                _ => {}
            }
            return stopped;
        }
        let Some(files) = self.files.take() else {
            return Ok(());
        };
        // The writer thread ends once its queue is closed and empty.
        drop(files);
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
        if let Some(mut scrub) = self.scrub.take() {
            scrub.stop();
        }

        // Everything is durable now: the backup ships it before it stops.
        #[cfg(feature = "object-store")]
        if let Some(mut backup) = self.backup.take() {
            backup.finish();
        }
        self.shared.checkpoints.join_background();
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
        self.log()
            .map_or_else(|| self.shared.published.synced(), |log| log.synced())
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
