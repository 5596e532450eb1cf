//! The store's handle, a thin facade over the parts its backend's open made (`parts.rs`):
//! appending (`submit.rs`), reading and subscribing, stats, data subjects (`subjects.rs`),
//! closing. Opening, per backend, is the `open` module.

use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::TrySendError;

use crate::append::{Append, AppendOptions, Submit};
use crate::batch::EventBatch;
use crate::companions::Companions;
use crate::error::{AppendError, InputError, ReadError, StoreError};
use crate::event::{Event, NewEvent};
use crate::io::Io;
use crate::log::Log;
use crate::options::{Durability, Options};
use crate::parts::{CopyDir, Parts, Service, Services, Shipping};
use crate::query::{AppendCondition, Query, ReadOptions};
use crate::read::ReadIter;
use crate::record::{encode_append_tracked, EncodedAppend};
use crate::request::{Reply, ReplyTo, Request};
use crate::route::Backend;
use crate::shared::{store_error, Shared};
use crate::shelf::Keeper;
use crate::subscription::Subscription;

pub(crate) mod subjects;
mod submit;

pub use crate::stats::{
    BackupStats, DatabaseStats, IndexSource, LiveCheck, MirrorKind, OpenReport, ReplicaStats,
    ScrubStats, Stats,
};

/// A durable DCB event store. See the crate documentation for a tour.
pub struct Store {
    shared: Arc<Shared>,
    backend: Backend,
    /// Where appends are committed (the seam); taken at close.
    log: Option<Box<dyn Log>>,
    /// The threads beside the log (the file engine's, the scrub, the backup), stopped in
    /// order at close, after the log.
    services: Services,
    /// The continuous backup, as D4 appends and erasures wait on it.
    shipping: Option<Arc<dyn Shipping>>,
    /// Where read models' checkpoints and the exchange's snapshots are kept.
    companions: Arc<dyn Companions>,
    /// Where decisions' snapshots are kept, with what their loads and saves share.
    keeper: Arc<Keeper>,
    /// Where a copy of a log that lives elsewhere is kept; taken at close.
    copy: Option<CopyDir>,
    report: OpenReport,
    /// Every append is D4 (the store was opened with `Durability::OffMachine`).
    off_machine: bool,
}

impl Store {
    /// The store made of `parts`: the keys its log carries as grants are taken in first.
    pub(crate) fn from_parts(parts: Parts) -> Result<Store, StoreError> {
        let Parts {
            shared,
            log,
            services,
            companions,
            shelf,
            copy,
            report,
        } = parts;
        let backend = log.backend();
        assert_eq!(
            shared.policy.backend, backend,
            "the log's backend made the policy"
        );
        Ok(Store {
            shared,
            backend,
            log: Some(log),
            services,
            shipping: None,
            companions,
            keeper: Arc::new(Keeper::new(shelf)),
            copy: Some(copy),
            report,
            off_machine: false,
        })
    }

    /// Runs `service` beside the log until the store closes (after those already running);
    /// a backup's service is also what appends and erasures wait on to be shipped.
    pub(crate) fn run(&mut self, service: impl Service + 'static) {
        if let Some(shipping) = service.shipping() {
            self.shipping = Some(shipping);
        }
        self.services.push(service);
    }

    /// Makes every append D4: acknowledged once the backup has shipped it.
    pub(crate) fn set_off_machine(&mut self, off_machine: bool) {
        self.off_machine = off_machine;
    }

    /// Whether a lone async caller polls for its outcome before it sleeps: on files, where
    /// the wait is an fdatasync and the caller's core is otherwise idle; not on PostgreSQL,
    /// where the wait is the database's work on the same machine's cores (R30).
    pub(crate) fn lone_async_polls(&self) -> bool {
        self.shared.policy.lone_async_polls
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

    /// Which backend holds the log.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Where the log is committed; None once the store is closed.
    fn log(&self) -> Option<&dyn Log> {
        self.log.as_deref()
    }

    /// Why this store takes no append (a read replica), before any work is done for one.
    #[cfg(feature = "event-schemas")]
    pub(crate) fn appends_refusal(&self) -> Option<InputError> {
        self.log().and_then(|log| log.refusal())
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
        let replica = self.log().and_then(|log| log.replica_stats());
        let mut stats = Stats {
            head,
            backend: self.backend.name(),
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
            backup: None,
            scrub: None,
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
        };
        self.services.report(&mut stats, self.synced());
        stats
    }

    /// The backup's state, for appends and erasures that wait for it.
    pub(crate) fn shipping(&self) -> Option<&Arc<dyn Shipping>> {
        self.shipping.as_ref()
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

    /// Stops the log (the backend's threads first: what a database committed still goes to
    /// its mirror's writer), then the services in order (the file engine, the scrub, the
    /// backup, which ships what is durable now), writes the checkpoint and closes the copy
    /// of the log, if there is one.
    fn shutdown(&mut self) -> Result<(), StoreError> {
        let Some(log) = self.log.take() else {
            return Ok(());
        };
        let last = log.stop();
        self.services.stop();
        self.shared.checkpoints.join_background();
        self.shared.health.close();
        self.shared.published.wake_all();
        let stopped = match self.shared.poison_error() {
            Some(e) => Err(e),
            None if self.shared.options.checkpoint_on_close && self.head() > 0 => self.checkpoint(),
            None => Ok(()),
        };
        match self.copy.take() {
            Some(copy) => copy.close(&self.shared, last, stopped),
            None => stopped,
        }
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

    /// The snapshots' shelf and what their loads and saves share.
    pub(crate) fn keeper(&self) -> &Keeper {
        &self.keeper
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
