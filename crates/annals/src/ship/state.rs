//! What the shipper and the store share: how far the backup is, its counters, and the D4
//! appends waiting for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};

use crate::error::{AppendError, StoreError};
use crate::options::BackupOptions;
use crate::request::Reply;
use crate::stats::BackupStats;

/// A D4 append waiting for its position to be shipped.
struct OffMachineWaiter {
    position: u64,
    deadline: Instant,
    reply: Reply,
    /// The append's span, linked with the put that ships it.
    trace: tracing::Span,
}

/// The D4 appends waiting, and why no more may wait once shipping ended.
#[derive(Default)]
pub(super) struct OffMachineWaiters {
    list: Vec<OffMachineWaiter>,
    closed: Option<String>,
}

/// What the shipper and the store share.
pub(crate) struct BackupState {
    pub(super) url: String,
    pub(super) shipped: AtomicU64,
    /// The append time of the first record not yet shipped, once the shipper has read it.
    pub(super) oldest_unshipped_us: AtomicU64,
    pub(super) bytes_shipped: AtomicU64,
    pub(super) objects_shipped: AtomicU64,
    pub(super) segments_shipped: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) last_error: Mutex<Option<String>>,
    /// Set when shipping stopped for good (the prefix holds another history, the lease was
    /// taken): D4 appends fail at once.
    pub(super) stopped: Mutex<Option<String>>,
    pub(super) failing: AtomicBool,
    pub(super) waiters: Mutex<OffMachineWaiters>,
    pub(super) kick: Condvar,
    pub(super) kick_lock: Mutex<()>,
    pub(super) stop: AtomicBool,
    pub(super) options: BackupOptions,
    /// The newest epoch of the subjects' key file the backup holds whole (`ship/keys.rs`).
    pub(super) keys_epoch: AtomicU64,
    /// The generation of a table's keys whose image the backup holds (`keys/image.rs`).
    pub(super) keys_generation: AtomicU64,
    /// While another server of the database holds the prefix's lease and ships: which one
    /// (`ship/standby.rs`). `shipped` is then what this server saw that server ship.
    pub(super) standby: Mutex<Option<String>>,
}

impl BackupState {
    pub(crate) fn shipped(&self) -> u64 {
        self.shipped.load(Ordering::Acquire)
    }

    /// The newest epoch of the key file in the backup.
    pub(crate) fn keys_epoch(&self) -> u64 {
        self.keys_epoch.load(Ordering::Acquire)
    }

    /// The generation of a table's keys the backup holds an image of.
    pub(crate) fn keys_generation(&self) -> u64 {
        self.keys_generation.load(Ordering::Acquire)
    }

    /// Whether another server ships (this one stands by).
    pub(crate) fn standing_by(&self) -> bool {
        self.standby.lock().is_some()
    }

    /// Wakes the shipper (an erasure waits for the key file to be shipped).
    pub(crate) fn nudge(&self) {
        self.wake();
    }

    /// Answers `reply` once `position` is in object storage (or `OutcomeUnknown` after the
    /// timeout, or at once when shipping stopped for good).
    pub(crate) fn when_shipped(&self, position: u64, reply: Reply, trace: tracing::Span) {
        {
            let mut waiters = self.waiters.lock();
            if let Some(reason) = waiters.closed.clone() {
                drop(waiters);
                reply.send(Err(off_machine_unknown(&self.url, &reason)));
                return;
            }
            if self.shipped() >= position {
                drop(waiters);
                reply.send(Ok(position));
                return;
            }
            waiters.list.push(OffMachineWaiter {
                position,
                deadline: Instant::now() + self.options.off_machine_timeout,
                reply,
                trace,
            });
        }
        self.wake();
    }

    pub(super) fn wake(&self) {
        let _guard = self.kick_lock.lock();
        self.kick.notify_one();
    }

    /// Sleeps up to `d`, or until kicked.
    pub(super) fn sleep(&self, d: Duration) {
        let mut guard = self.kick_lock.lock();
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        self.kick.wait_for(&mut guard, d);
    }

    /// Answers the waiters through `shipped`, and those past their deadline.
    pub(super) fn answer(&self) {
        self.answer_carried(&tracing::Span::none());
    }

    /// As `answer`, after the put whose span is `put`: linked with each traced append it
    /// answers.
    pub(super) fn answer_carried(&self, put: &tracing::Span) {
        let shipped = self.shipped();
        let now = Instant::now();
        let mut done = Vec::new();
        {
            let waiters = &mut self.waiters.lock().list;
            let mut i = 0;
            while i < waiters.len() {
                if waiters[i].position <= shipped || waiters[i].deadline <= now {
                    done.push(waiters.swap_remove(i));
                } else {
                    i += 1;
                }
            }
        }
        if !put.is_disabled() {
            let carried = done.iter().filter(|w| w.position <= shipped);
            put.record("annals.appends", carried.clone().count() as i64);
            crate::spans::link(put, carried.map(|w| &w.trace));
        }
        for w in done {
            if w.position <= shipped {
                w.reply.send(Ok(w.position));
            } else {
                let why = self
                    .last_error
                    .lock()
                    .clone()
                    .unwrap_or_else(|| "no answer yet".into());
                let reason = format!(
                    "not in object storage within {:?} ({why})",
                    self.options.off_machine_timeout
                );
                w.reply.send(Err(off_machine_unknown(&self.url, &reason)));
            }
        }
    }

    pub(super) fn has_waiters(&self) -> bool {
        !self.waiters.lock().list.is_empty()
    }

    /// Fails every waiter, and every later one: shipping ended.
    pub(super) fn fail_all(&self, reason: &str) {
        let waiters = {
            let mut waiters = self.waiters.lock();
            waiters.closed = Some(reason.to_string());
            std::mem::take(&mut waiters.list)
        };
        for w in waiters {
            w.reply.send(Err(off_machine_unknown(&self.url, reason)));
        }
    }

    pub(crate) fn stats(&self, durable: u64) -> BackupStats {
        let shipped = self.shipped();
        let lag_positions = durable.saturating_sub(shipped);
        let oldest = self.oldest_unshipped_us.load(Ordering::Relaxed);
        let lag_seconds = if lag_positions == 0 || oldest == 0 {
            0.0
        } else {
            now_us().saturating_sub(oldest) as f64 / 1e6
        };
        let stopped = self.stopped.lock().clone();
        BackupStats {
            url: self.url.clone(),
            state: match (&stopped, self.failing.load(Ordering::Relaxed)) {
                (Some(_), _) => "stopped",
                (None, true) => "failing",
                (None, false) if self.standby.lock().is_some() => "standby",
                (None, false) => "shipping",
            },
            shipped_through: shipped,
            lag_positions,
            lag_seconds,
            bytes_shipped: self.bytes_shipped.load(Ordering::Relaxed),
            objects_shipped: self.objects_shipped.load(Ordering::Relaxed),
            segments_shipped: self.segments_shipped.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            last_error: stopped.or_else(|| self.last_error.lock().clone()),
            holder: self.standby.lock().clone(),
        }
    }
}

pub(super) fn off_machine_unknown(url: &str, reason: &str) -> AppendError {
    StoreError::OutcomeUnknown {
        reason: format!(
            "the append is durable on this machine but not known to be in the backup at {url}: \
             {reason}"
        ),
    }
    .into()
}

pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
