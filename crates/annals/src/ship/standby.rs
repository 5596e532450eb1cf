//! A standby: a server of a PostgreSQL store started with the backup that another server of
//! the same database already ships (each server of a database may be started alike).
//!
//! It ships nothing. It follows what the holder of the lease ships, by listing the prefix
//! (every 20 ms while a D4 append on this server waits for it, every second otherwise), so
//! that its D4 appends are answered once the holder has put them and its lag is that of the
//! backup. It tries the lease every second; once the holder's lapses (30 s without renewal,
//! or at once after a clean stop), it takes it, resumes where the backup ends and ships.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::decode_object_header;
use super::{parse_name, ObjectKind, Shipper, OBJECT_HEADER_BYTES};

/// How often a standby tries the lease.
const LEASE_POLL: Duration = Duration::from_secs(1);
/// How often a standby lists the backup while a D4 append waits, and otherwise.
const FOLLOW_WAITING: Duration = Duration::from_millis(20);
const FOLLOW_IDLE: Duration = Duration::from_secs(1);

impl Shipper {
    /// Stands by until this server holds the lease (true: ship from here on) or the store
    /// closes (false).
    pub(super) fn stand_by(&mut self) -> bool {
        let mut lease_tried = Instant::now();
        let mut followed: Option<Instant> = None;
        let mut after: [Option<String>; 2] = [None, None];
        loop {
            self.state.answer();
            if self.state.stop.load(Ordering::Acquire) || self.state.stopped.lock().is_some() {
                return false;
            }
            if lease_tried.elapsed() >= LEASE_POLL {
                lease_tried = Instant::now();
                match self.take_lease() {
                    Ok(None) => return self.take_over(),
                    Ok(Some(holder)) => *self.state.standby.lock() = Some(holder),
                    Err(e) => self.note_failure(&e.to_string()),
                }
            }
            let every = match self.state.has_waiters() {
                true => FOLLOW_WAITING,
                false => FOLLOW_IDLE,
            };
            if followed.is_none_or(|f| f.elapsed() >= every) {
                followed = Some(Instant::now());
                if let Err(e) = self.follow_holder(&mut after) {
                    self.note_failure(&e);
                }
            }
            self.state.sleep(every.min(LEASE_POLL));
        }
    }

    /// The lease is this server's: ship from where the backup ends.
    fn take_over(&mut self) -> bool {
        let was = self.state.standby.lock().take();
        match self.begin() {
            Ok(()) => {
                tracing::warn!(
                    url = self.url(),
                    shipped = self.state.shipped(),
                    previous = was.as_deref().unwrap_or(""),
                    "backup: the lease of the server that shipped lapsed; this server ships now"
                );
                true
            }
            Err(e) => {
                self.stop_for_good(&e.to_string());
                false
            }
        }
    }

    /// Moves `shipped` to the last position of the newest object the holder put, listing
    /// only the objects after those seen before (`after`, per kind).
    fn follow_holder(&mut self, after: &mut [Option<String>; 2]) -> Result<(), String> {
        let durable = self.durable();
        for (i, kind) in [ObjectKind::Segment, ObjectKind::Chunk]
            .into_iter()
            .enumerate()
        {
            let listed = self
                .objects
                .list(kind.dir(), after[i].as_deref())
                .map_err(|e| e.to_string())?;
            let Some(newest) = listed
                .iter()
                .rev()
                .find(|l| parse_name(kind, &l.name).is_some())
            else {
                continue;
            };
            let head = self
                .objects
                .get_range(&newest.name, 0..OBJECT_HEADER_BYTES as u64)
                .map_err(|e| e.to_string())?;
            let header =
                decode_object_header(&head).map_err(|e| format!("{}: {e}", newest.name))?;
            after[i] = Some(newest.name.clone());
            self.state.shipped.fetch_max(header.last, Ordering::AcqRel);
        }
        let shipped = self.state.shipped();
        // The lag's age: the append time of the first record this server holds beyond it.
        let oldest = match shipped < durable {
            true => self
                .reader(shipped + 1, durable)
                .ok()
                .and_then(|mut r| r.next_frame().ok().flatten())
                .map_or(0, |(_, header, _)| header.appended_at_us),
            false => 0,
        };
        self.state
            .oldest_unshipped_us
            .store(oldest, Ordering::Relaxed);
        self.note_answered();
        Ok(())
    }
}
