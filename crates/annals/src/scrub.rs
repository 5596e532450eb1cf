//! The background scrub: a thread that re-reads every sealed segment at a bounded rate,
//! checking each record's CRC and position, so that a flipped bit is found before a read
//! breaks on it. Damage is reported (stats, hence `/health` and `/metrics`, and the log), never
//! hidden; with a backup, the damaged record is put back from the backup's copy of it (the
//! same bytes, checked by their CRC) and the segment checked again.
//!
//! Writing into a sealed segment is safe: the writer never touches one again, and readers see
//! either the damaged record (a CRC error, as before) or the repaired one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::StoreError;
use crate::options::{BackupOptions, ScrubOptions};
use crate::record::{crc_matches, decode_header, Frame, HEADER_BYTES};
use crate::segment::{Segment, SEGMENT_HEADER_BYTES};
use crate::shared::Shared;
use crate::stats::ScrubStats;

/// Bytes read at a time.
const WINDOW: usize = 1 << 20;

/// Damage found in a segment: where, and which position should be there.
#[derive(Debug, Clone)]
struct SegmentDamage {
    offset: u64,
    position: u64,
    reason: String,
}

#[derive(Default)]
pub(crate) struct ScrubState {
    passes: AtomicU64,
    segments_checked: AtomicU64,
    bytes_checked: AtomicU64,
    repaired: AtomicU64,
    /// Damage found and not repaired, by segment number: what it is.
    damaged: Mutex<BTreeMap<u32, String>>,
    last_repair: Mutex<Option<String>>,
    stop: AtomicBool,
    kick: Condvar,
    kick_lock: Mutex<()>,
}

impl ScrubState {
    pub(crate) fn stats(&self) -> ScrubStats {
        ScrubStats {
            passes: self.passes.load(Ordering::Relaxed),
            segments_checked: self.segments_checked.load(Ordering::Relaxed),
            bytes_checked: self.bytes_checked.load(Ordering::Relaxed),
            repaired: self.repaired.load(Ordering::Relaxed),
            damaged: self.damaged.lock().values().cloned().collect(),
            last_repair: self.last_repair.lock().clone(),
        }
    }

    /// Sleeps up to `d`; false when the scrub is to stop.
    fn sleep(&self, d: Duration) -> bool {
        let mut guard = self.kick_lock.lock();
        if self.stop.load(Ordering::Acquire) {
            return false;
        }
        self.kick.wait_for(&mut guard, d);
        !self.stop.load(Ordering::Acquire)
    }
}

/// The running scrub of one store.
pub(crate) struct Scrub {
    pub(crate) state: Arc<ScrubState>,
    thread: Option<JoinHandle<()>>,
}

impl Scrub {
    pub(crate) fn start(
        shared: Arc<Shared>,
        options: ScrubOptions,
        backup: Option<BackupOptions>,
    ) -> Result<Scrub, StoreError> {
        let state = Arc::new(ScrubState::default());
        let thread = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("annals-scrub".into())
                .spawn(move || {
                    Scrubber {
                        shared,
                        state,
                        options,
                        backup,
                        read_since: Instant::now(),
                        read_bytes: 0,
                    }
                    .run()
                })
                .map_err(|e| StoreError::io("spawn scrub thread", "", 0, e))?
        };
        Ok(Scrub {
            state,
            thread: Some(thread),
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
    }
}

impl Drop for Scrub {
    fn drop(&mut self) {
        self.stop();
    }
}

impl crate::parts::Service for Scrub {
    fn stop(&mut self) {
        Scrub::stop(self)
    }

    fn report(&self, stats: &mut crate::stats::Stats, _synced: u64) {
        stats.scrub = Some(self.state.stats());
    }
}

struct Scrubber {
    shared: Arc<Shared>,
    state: Arc<ScrubState>,
    options: ScrubOptions,
    backup: Option<BackupOptions>,
    read_since: Instant,
    read_bytes: u64,
}

impl Scrubber {
    fn run(mut self) {
        while self.state.sleep(self.options.pause) {
            if !self.pass() {
                return;
            }
            self.state.passes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One pass over the sealed segments; false when told to stop.
    fn pass(&mut self) -> bool {
        let segments: Vec<Arc<Segment>> = self.shared.segments.read().clone();
        let mut expected = 1;
        for pair in segments.windows(2) {
            if self.state.stop.load(Ordering::Acquire) {
                return false;
            }
            let (segment, next) = (&pair[0], &pair[1]);
            // Where the next segment begins tells where this one ends.
            let Some(next_first) = first_position(next) else {
                // The next one's first record is unreadable: its own check reports it.
                expected = 0;
                continue;
            };
            if expected == 0 {
                expected = first_position(segment).unwrap_or(0);
            }
            let found = self.check(segment, expected, next_first);
            match found {
                Ok(()) => {
                    self.state.damaged.lock().remove(&segment.number);
                }
                Err(damage) => self.found(segment, expected, next_first, damage),
            }
            self.state.segments_checked.fetch_add(1, Ordering::Relaxed);
            expected = next_first;
        }
        true
    }

    /// Reports damage, and repairs it from the backup when there is one.
    fn found(&mut self, segment: &Segment, expected: u64, next_first: u64, damage: SegmentDamage) {
        let what = format!(
            "segment {} at offset {} (position {}): {}",
            segment.path.display(),
            damage.offset,
            damage.position,
            damage.reason
        );
        tracing_error(&what);
        self.state
            .damaged
            .lock()
            .insert(segment.number, what.clone());
        let Some(backup) = self.backup.clone() else {
            return;
        };
        let mut damage = damage;
        // Each repaired record lets the check go on to the next damage, if any.
        for _ in 0..1024 {
            match repair(&backup, segment, &damage) {
                Ok(object) => {
                    let done = format!(
                        "repaired segment {} at offset {} (position {}) from the backup's {object}",
                        segment.path.display(),
                        damage.offset,
                        damage.position
                    );
                    tracing_info(&done);
                    self.state.repaired.fetch_add(1, Ordering::Relaxed);
                    *self.state.last_repair.lock() = Some(done);
                }
                Err(why) => {
                    let what = format!("{what}; not repaired: {why}");
                    tracing_error(&what);
                    self.state.damaged.lock().insert(segment.number, what);
                    return;
                }
            }
            match self.check(segment, expected, next_first) {
                Ok(()) => {
                    self.state.damaged.lock().remove(&segment.number);
                    return;
                }
                Err(next) => damage = next,
            }
        }
    }

    /// Checks every record of a sealed segment: positions `first..next_first` without a gap,
    /// each CRC, zeros after the last.
    fn check(
        &mut self,
        segment: &Segment,
        first: u64,
        next_first: u64,
    ) -> Result<(), SegmentDamage> {
        let mut offset = SEGMENT_HEADER_BYTES;
        let mut position = first;
        let damage = |offset, position, reason: &str| SegmentDamage {
            offset,
            position,
            reason: reason.to_string(),
        };
        let mut window = bytes::Bytes::new();
        let mut window_start = 0u64;
        while position < next_first {
            let need = |len: usize, window: &bytes::Bytes, start: u64| {
                offset >= start && offset + len as u64 <= start + window.len() as u64
            };
            if !need(HEADER_BYTES, &window, window_start) {
                window = self
                    .read(segment, offset, WINDOW)
                    .map_err(|e| damage(offset, position, &format!("unreadable: {e}")))?;
                window_start = offset;
            }
            let at = (offset - window_start) as usize;
            let header = match decode_header(&window[at..]) {
                Frame::Record(h) => h,
                Frame::End => {
                    return Err(damage(offset, position, "the segment ends early (zeros)"))
                }
                Frame::Invalid(why) => return Err(damage(offset, position, why)),
            };
            if header.first_position != position {
                return Err(damage(
                    offset,
                    position,
                    &format!("a record of position {}", header.first_position),
                ));
            }
            let len = header.stored_len();
            if offset + len as u64 > segment.size {
                return Err(damage(offset, position, "a record past the segment's end"));
            }
            if !need(len, &window, window_start) {
                window = self
                    .read(segment, offset, len.max(WINDOW))
                    .map_err(|e| damage(offset, position, &format!("unreadable: {e}")))?;
                window_start = offset;
            }
            let at = (offset - window_start) as usize;
            if !crc_matches(&window[at..at + len], &header) {
                return Err(damage(offset, position, "CRC mismatch"));
            }
            position = header.last_position() + 1;
            offset += len as u64;
        }
        if position != next_first {
            return Err(damage(
                offset,
                position,
                &format!("records run past position {}", next_first - 1),
            ));
        }
        Ok(())
    }

    /// Reads through the segment's map (or file), at most `bytes_per_second`.
    fn read(
        &mut self,
        segment: &Segment,
        offset: u64,
        len: usize,
    ) -> Result<bytes::Bytes, StoreError> {
        let bytes = segment.bytes(offset, len)?;
        self.read_bytes += bytes.len() as u64;
        self.state
            .bytes_checked
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let rate = self.options.bytes_per_second.max(1);
        let due = Duration::from_secs_f64(self.read_bytes as f64 / rate as f64);
        let elapsed = self.read_since.elapsed();
        if due > elapsed {
            self.state.sleep(due - elapsed);
        }
        if elapsed > Duration::from_secs(10) {
            self.read_since = Instant::now();
            self.read_bytes = 0;
        }
        Ok(bytes)
    }
}

/// The first position a segment holds, from its first record's header.
fn first_position(segment: &Segment) -> Option<u64> {
    let bytes = segment.bytes(SEGMENT_HEADER_BYTES, HEADER_BYTES).ok()?;
    match decode_header(&bytes) {
        Frame::Record(h) => Some(h.first_position),
        _ => None,
    }
}

/// Puts the record of `damage.position` back at `damage.offset` from the backup; answers
/// the object it came from.
#[cfg(feature = "object-store")]
fn repair(
    backup: &BackupOptions,
    segment: &Segment,
    damage: &SegmentDamage,
) -> Result<String, String> {
    use crate::archive::{decode_object, decode_object_header, parse_name, ObjectKind};
    let objects = crate::objects::Objects::open_existing(&backup.url, &backup.settings)?;
    let mut found = None;
    for kind in [ObjectKind::Segment, ObjectKind::Chunk] {
        let listed = objects.list(kind.dir(), None).map_err(|e| e.to_string())?;
        let holder = listed
            .iter()
            .filter_map(|l| parse_name(kind, &l.name).map(|first| (first, &l.name)))
            .filter(|(first, _)| *first <= damage.position)
            .max_by_key(|(first, _)| *first);
        if let Some((_, name)) = holder {
            let head = objects
                .get_range(name, 0..crate::archive::OBJECT_HEADER_BYTES as u64)
                .map_err(|e| e.to_string())?;
            let header = decode_object_header(&head).map_err(|e| format!("{name}: {e}"))?;
            if header.last >= damage.position {
                found = Some(name.clone());
                break;
            }
        }
    }
    let name = found.ok_or_else(|| {
        format!(
            "the backup holds no object with position {} (not shipped yet?)",
            damage.position
        )
    })?;
    let (bytes, _) = objects
        .get(&name)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{name} is gone"))?;
    let first =
        parse_name(ObjectKind::Segment, &name).or_else(|| parse_name(ObjectKind::Chunk, &name));
    let object = decode_object(bytes, first).map_err(|e| format!("{name}: {e}"))?;
    let i = object
        .records
        .iter()
        .position(|(h, _)| h.first_position == damage.position)
        .ok_or_else(|| format!("{name} has no record beginning at {}", damage.position))?;
    let frame = object.frame(i);
    if damage.offset + frame.len() as u64 > segment.size {
        return Err(format!("{name}'s record does not fit where the damage is"));
    }
    segment
        .file
        .write_at(&frame, damage.offset)
        .map_err(|e| format!("write the record back: {e}"))?;
    segment
        .file
        .sync_data()
        .map_err(|e| format!("sync the repaired segment: {e}"))?;
    Ok(name)
}

#[cfg(not(feature = "object-store"))]
fn repair(_: &BackupOptions, _: &Segment, _: &SegmentDamage) -> Result<String, String> {
    Err("this build has no object storage".into())
}

fn tracing_error(what: &str) {
    tracing::error!(damage = what, "scrub: damage in a sealed segment");
}

fn tracing_info(what: &str) {
    tracing::info!(repair = what, "scrub: repaired from the backup");
}
