//! The prefix's lease: which server ships into it. Taken at start (or over, once the
//! holder's lapses), renewed every third of its time to live, released at a clean close; a
//! server of a PostgreSQL store that finds it taken stands by (`standby.rs`).

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{backup_error, now_us, Shipper, BACKOFF_MAX, LEASE};

/// The lease was not written: another server wrote it since it was read, or object storage
/// failed.
pub(super) enum NotWritten {
    Taken,
    Failed(StoreError),
}
use crate::archive::Lease;
use crate::error::StoreError;
use crate::objects::ObjectFault;
use crate::route::Backend;

pub(super) fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that and a
    // terminating zero when it fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl Shipper {
    /// Takes the prefix's lease: None once taken, or why not when another server holds it
    /// and renewed it within its time to live.
    pub(super) fn take_lease(&mut self) -> Result<Option<String>, StoreError> {
        // A listing fails on a bucket that does not exist (a get answers "no such object",
        // and some servers make a bucket on the first put).
        self.objects
            .list(LEASE, None)
            .map_err(|e| backup_error(self.url(), &e))?;
        let current = self
            .objects
            .get(LEASE)
            .map_err(|e| backup_error(self.url(), &e))?;
        let version = match current {
            None => None,
            Some((bytes, version)) => {
                let held: Option<Lease> = serde_json::from_slice(&bytes).ok();
                if let Some(held) = held {
                    let same_dir = held.host == self.lease.host && held.dir == self.lease.dir;
                    let age_s = now_us().saturating_sub(held.renewed_at_us) / 1_000_000;
                    if !same_dir && held.renewed_at_us != 0 && age_s < held.ttl_s {
                        return Ok(Some(format!(
                            "{}: another server ships into this prefix (host {}, directory {}, \
                             pid {}; its lease was renewed {age_s} s ago and holds for {} s)",
                            self.url(),
                            held.host,
                            held.dir,
                            held.pid,
                            held.ttl_s
                        )));
                    }
                }
                version
            }
        };
        match self.write_lease(version) {
            Ok(()) => Ok(None),
            Err(NotWritten::Taken) => Ok(Some(self.taken())),
            Err(NotWritten::Failed(e)) => Err(e),
        }
    }

    fn taken(&self) -> String {
        format!(
            "{}: another server took the lease of this prefix meanwhile",
            self.url()
        )
    }

    fn write_lease(&mut self, over: Option<String>) -> Result<(), NotWritten> {
        self.lease.renewed_at_us = now_us();
        let bytes = Bytes::from(serde_json::to_vec(&self.lease).expect("a lease serializes"));
        match self.objects.put_over(LEASE, bytes, over) {
            Ok(version) => {
                self.lease_version = version;
                self.lease_renewed = Instant::now();
                Ok(())
            }
            Err(e) if e.fault == ObjectFault::Conflict => Err(NotWritten::Taken),
            Err(e) => Err(NotWritten::Failed(backup_error(self.url(), &e))),
        }
    }

    /// Another server took the lease over (this one paused past it, say): on PostgreSQL this
    /// one stands by again (true); otherwise shipping stops for good (false).
    pub(super) fn lease_lost(&mut self) -> bool {
        let message = self.taken();
        if self.shared.policy.backend == Backend::Postgres {
            tracing::warn!(
                url = self.url(),
                "backup: another server of the database took the lease over; this one stands \
                 by again"
            );
            *self.state.standby.lock() = Some(message);
            self.stop_noting_keys();
            return true;
        }
        self.stop_for_good(&message);
        false
    }

    /// Lets the next holder (this directory reopened, or another server) take the lease at
    /// once.
    pub(super) fn release_lease(&mut self) {
        self.lease.renewed_at_us = 0;
        let bytes = Bytes::from(serde_json::to_vec(&self.lease).expect("serializes"));
        if let Ok(version) = self
            .objects
            .put_over(LEASE, bytes, self.lease_version.clone())
        {
            self.lease_version = version;
        }
    }

    /// Renews the lease every third of the time it holds; Err once another server took it.
    pub(super) fn renew_lease(&mut self) -> Result<(), NotWritten> {
        let renew = Duration::from_secs(self.lease.ttl_s) / 3;
        if self.lease_renewed.elapsed() < renew {
            return Ok(());
        }
        match self.write_lease(self.lease_version.clone()) {
            // Object storage unreachable: keep the lease we have, try again later.
            Err(NotWritten::Failed(_)) => {
                self.lease_renewed = Instant::now() - renew + BACKOFF_MAX.min(renew);
                Ok(())
            }
            outcome => outcome,
        }
    }
}
