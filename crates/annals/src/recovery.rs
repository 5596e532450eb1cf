//! Opening a log: scan segments, rebuild or extend the index, and cut a torn tail.
//!
//! The rule that separates a torn tail from damage: every record says through which position
//! the log was already synced when it was written (`synced_through`, a lower bound). After the
//! first bad record at offset X, where position P was expected, a valid record that says P was
//! already synced proves the bad record had been durable: that is damage, and opening stops with
//! an error naming the file and offset. A segment is synced before the next one receives
//! records, so when the next segment holds records the current one is whole: a valid first
//! record there must continue the positions, and if the first is missing, later records there
//! are an unsynced remainder unless one says the missing position was synced (damage again).
//! Anything else after X is an unsynced tail: it was never acknowledged in D3, and it is
//! overwritten with zeros (a remainder in later segments goes with those segments).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::checkpoint;
use crate::error::StoreError;
use crate::index::{location, Index, ShardTag, TagHasher, TagShard};
use crate::io::Io;
use crate::options::{Durability, Options};
use crate::record::{self, crc_matches, decode_header, Entries, EntryLayout, Frame, HEADER_BYTES};
use crate::segment::{Segment, SEGMENT_HEADER_BYTES};
use crate::shared::Counters;
use crate::stats::IndexSource;

/// Tag indexing on helper threads, for a full rebuild: the scanning thread checks records and
/// indexes types and locations; every shard thread walks the same events and indexes the tags
/// that hash to it. Tag lookups among many distinct tags are memory-latency bound, so sharing
/// them out uses both cores. (Dealing the tags out from the scanning thread instead was slower:
/// the hand-over costs more memory traffic than walking the events twice.)
struct ShardPool {
    senders: Vec<crossbeam_channel::Sender<Arc<Work>>>,
    handles: Vec<std::thread::JoinHandle<TagShard>>,
    pending: Work,
}

/// A batch of records for the shards: the records' bytes (shared, not copied) and each event's
/// position, record and layout.
#[derive(Default)]
struct Work {
    records: Vec<bytes::Bytes>,
    entries: Vec<(u64, u32, u32, EntryLayout)>,
}

const WORK_EVENTS: usize = 8192;
/// How many entries ahead a shard thread starts loading the entry it will read.
const ENTRY_AHEAD: usize = 16;

impl ShardPool {
    fn start(count: usize) -> Option<ShardPool> {
        let mut senders = Vec::with_capacity(count);
        let mut handles = Vec::with_capacity(count);
        let hasher = TagHasher::new();
        for k in 0..count {
            let hasher = hasher.clone();
            let (sender, receiver) = crossbeam_channel::bounded::<Arc<Work>>(8);
            let handle = std::thread::Builder::new()
                .name("annals-rebuild".into())
                .spawn(move || {
                    let mut shard = TagShard::default();
                    let mut capacity = 0;
                    for work in receiver {
                        let mut mine: Vec<ShardTag<'_>> = Vec::with_capacity(capacity);
                        for (i, &(position, record, offset, layout)) in
                            work.entries.iter().enumerate()
                        {
                            // The entries were read by the scanning thread a while ago and
                            // are out of the cache: start loading the one some way ahead.
                            if let Some(&(_, r, o, _)) = work.entries.get(i + ENTRY_AHEAD) {
                                if let Some(ahead) = work.records[r as usize].get(o as usize..) {
                                    // The tags start some 40 bytes in: the first two lines.
                                    crate::segment::prefetch(ahead.as_ptr());
                                    crate::segment::prefetch(ahead.as_ptr().wrapping_add(64));
                                }
                            }
                            let bytes = &work.records[record as usize];
                            let start = offset as usize;
                            let Some(entry) = bytes.get(start..start + layout.entry_len as usize)
                            else {
                                continue;
                            };
                            let mut tags = layout.tag_bytes(entry);
                            for _ in 0..layout.tag_count {
                                let Some((tag, rest)) = record::split_tag(tags) else {
                                    break;
                                };
                                tags = rest;
                                let hash = hasher.hash(tag);
                                if TagHasher::shard(hash, count) == k {
                                    mine.push((hash, tag, position));
                                }
                            }
                        }
                        shard.add_batch(&mine);
                        capacity = mine.len();
                    }
                    shard
                })
                .ok()?;
            senders.push(sender);
            handles.push(handle);
        }
        Some(ShardPool {
            senders,
            handles,
            pending: Work::default(),
        })
    }

    fn add(
        &mut self,
        record: &bytes::Bytes,
        first_position: u64,
        layouts: &[(usize, EntryLayout)],
    ) {
        let index = self.pending.records.len() as u32;
        self.pending.records.push(record.clone());
        for (position, &(offset, layout)) in (first_position..).zip(layouts) {
            let offset = (HEADER_BYTES + offset) as u32;
            self.pending.entries.push((position, index, offset, layout));
        }
        if self.pending.entries.len() >= WORK_EVENTS {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.pending.entries.is_empty() {
            return;
        }
        let work = Arc::new(std::mem::take(&mut self.pending));
        for sender in &self.senders {
            // A shard that died (it cannot, short of a panic) shows up when it is joined.
            let _ = sender.send(work.clone());
        }
    }

    /// Hands over the last batch and collects the shards, in shard order.
    fn finish(mut self) -> Result<Vec<TagShard>, StoreError> {
        self.flush();
        self.senders.clear();
        let mut shards = Vec::with_capacity(self.handles.len());
        for handle in self.handles.drain(..) {
            shards.push(handle.join().map_err(|_| StoreError::Poisoned {
                reason: "a rebuild thread panicked".into(),
            })?);
        }
        Ok(shards)
    }
}

impl Drop for ShardPool {
    fn drop(&mut self) {
        self.senders.clear();
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

/// Where a scan ended.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tail {
    /// The last position found.
    pub(crate) head: u64,
    /// Index (in the segment list) of the segment that holds the end of the log.
    pub(crate) segment: usize,
    /// Offset just past the last record.
    pub(crate) offset: u64,
    /// Offset of the last record (0 when the segment holds none).
    pub(crate) last_record_offset: u64,
    pub(crate) records: u64,
}

/// A torn tail found (and, when repairing, zeroed) by a scan.
#[derive(Debug, Clone)]
pub(crate) struct Torn {
    pub(crate) path: PathBuf,
    pub(crate) offset: u64,
    pub(crate) reason: &'static str,
}

pub(crate) struct ScanResult {
    pub(crate) tail: Tail,
    pub(crate) torn: Option<Torn>,
    /// Segments past the tail that held no valid record (spares or torn creations).
    pub(crate) empty_after_tail: usize,
}

/// A record read and checked at `offset`, or why not.
enum Read {
    Record {
        header: record::RecordHeader,
        bytes: bytes::Bytes,
    },
    End,
    Invalid(&'static str),
}

fn read_record(segment: &Segment, offset: u64) -> Result<Read, StoreError> {
    if offset + HEADER_BYTES as u64 > segment.size {
        return Ok(Read::End);
    }
    let head = segment.bytes(offset, HEADER_BYTES)?;
    let header = match decode_header(&head) {
        Frame::Record(h) => h,
        Frame::End => return Ok(Read::End),
        Frame::Invalid(why) => return Ok(Read::Invalid(why)),
    };
    let len = header.stored_len();
    if offset + len as u64 > segment.size {
        return Ok(Read::Invalid("record runs past the end of the segment"));
    }
    let bytes = segment.bytes(offset, len)?;
    if bytes.len() < len {
        return Ok(Read::Invalid("record runs past the end of the file"));
    }
    if !crc_matches(&bytes, &header) {
        return Ok(Read::Invalid("CRC mismatch"));
    }
    Ok(Read::Record { header, bytes })
}

/// Scans `segments` from the end of the log as `from` describes it (`Tail::default()` for the
/// beginning), adding every record to `index`. `segments` must be contiguous by number. With
/// `repair`, a torn tail is zeroed and synced.
pub(crate) fn scan(
    segments: &[Arc<Segment>],
    from: Tail,
    index: &mut Index,
    repair: bool,
    tail_window: u64,
    parallel: bool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ScanResult, StoreError> {
    // Shard tags out only for a rebuild from nothing, where there is much to do.
    let mut pool = if parallel && index.len() == 0 && index.tag_count() == 0 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores > 1 {
            ShardPool::start(2)
        } else {
            None
        }
    } else {
        None
    };
    let result = scan_records(
        segments,
        from,
        index,
        repair,
        tail_window,
        &mut pool,
        progress,
    );
    if let (Ok(_), Some(pool)) = (&result, pool) {
        index.adopt_tags(pool.finish()?);
    }
    result
}

fn scan_records(
    segments: &[Arc<Segment>],
    from: Tail,
    index: &mut Index,
    repair: bool,
    tail_window: u64,
    pool: &mut Option<ShardPool>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ScanResult, StoreError> {
    let mut tail = from;
    let mut next_position = tail.head + 1;
    let (mut seg_index, mut offset) = (tail.segment, tail.offset.max(SEGMENT_HEADER_BYTES));
    let mut layouts = Vec::new();
    while seg_index < segments.len() {
        let segment = &segments[seg_index];
        let mut stop: Option<&'static str> = None;
        loop {
            match read_record(segment, offset)? {
                Read::Record { header, bytes } => {
                    if header.first_position != next_position {
                        stop = Some("record out of sequence");
                        break;
                    }
                    let body = &bytes[HEADER_BYTES..HEADER_BYTES + header.body_len as usize];
                    // Check the whole body before indexing any of it; the layouts found by
                    // the check are kept so the body is parsed once.
                    layouts.clear();
                    let mut entries = Entries::new(header.entries(body), header.event_count);
                    layouts.extend(entries.by_ref().map(|(at, _, layout)| (at, layout)));
                    if entries.malformed || layouts.len() != header.event_count as usize {
                        stop = Some("malformed record body");
                        break;
                    }
                    let tracking = if header.trailer_len > 0 {
                        match record::decode_trailer(header.trailer(body)) {
                            Some(t) => Some(t),
                            None => {
                                stop = Some("malformed tracking trailer");
                                break;
                            }
                        }
                    } else {
                        None
                    };
                    for (position, &(entry_offset, layout)) in
                        (header.first_position..).zip(layouts.iter())
                    {
                        let entry = &body[entry_offset..entry_offset + layout.entry_len as usize];
                        let at = offset + (HEADER_BYTES + entry_offset) as u64;
                        let at = location(segment.number, at as u32);
                        match pool {
                            Some(_) => index.push_event(position, at, entry, &layout),
                            None => index.push(position, at, entry, &layout),
                        }
                    }
                    if let Some(pool) = pool.as_mut() {
                        pool.add(&bytes, header.first_position, &layouts);
                    }
                    if let Some((source, value)) = tracking {
                        let last = header.last_position();
                        index.set_tracking(source, last, value, last);
                    }
                    tail = Tail {
                        head: header.last_position(),
                        segment: seg_index,
                        offset: offset + header.stored_len() as u64,
                        last_record_offset: offset,
                        records: tail.records + 1,
                    };
                    next_position = tail.head + 1;
                    offset = tail.offset;
                }
                Read::End => break,
                Read::Invalid(why) => {
                    stop = Some(why);
                    break;
                }
            }
        }
        // `offset` is where this segment's records end. Is what lies after it a torn tail, the
        // normal remainder of a full segment, or damage?
        if let Some(path_offset) = evidence_of_later_group(segment, offset + 8, next_position)? {
            return Err(StoreError::Corrupt {
                path: segment.path.clone(),
                offset,
                reason: format!(
                    "{} at offset {offset}, yet a record of a later group lies at offset \
                     {path_offset}",
                    stop.unwrap_or("zeros where records should be"),
                ),
            });
        }
        let next_starts_here = match segments.get(seg_index + 1) {
            Some(next) => match read_record(next, SEGMENT_HEADER_BYTES)? {
                Read::Record { header, .. } => {
                    if stop.is_none() && header.first_position == next_position {
                        true
                    } else {
                        return Err(StoreError::Corrupt {
                            path: segment.path.clone(),
                            offset,
                            reason: format!(
                                "{} at offset {offset}, yet the next segment {} holds records \
                                 from position {}",
                                stop.unwrap_or("the records end"),
                                next.path.display(),
                                header.first_position
                            ),
                        });
                    }
                }
                _ => false,
            },
            None => false,
        };
        if next_starts_here {
            seg_index += 1;
            progress(seg_index, segments.len());
            offset = SEGMENT_HEADER_BYTES;
            continue;
        }
        // The log ends in this segment. A later segment receives records only once this one is
        // synced, so this one is whole: if it ends cleanly, records in a later segment whose
        // first record is missing are an unsynced remainder (a crash kept some of its writes
        // and lost the first), unless one of them says position `next_position` was already
        // synced: then a durable record was lost, which is damage. The remainder is never
        // acknowledged in D3; the open removes the later segments with it.
        let mut remainder = None;
        for later in &segments[seg_index + 1..] {
            // One pass: note any record, stop at one that proves damage.
            let mut any = false;
            let damage = first_record_where(later, SEGMENT_HEADER_BYTES, |header| {
                any = true;
                header.synced_through >= next_position
            })?;
            if let Some(at) = damage {
                return Err(StoreError::Corrupt {
                    path: segment.path.clone(),
                    offset,
                    reason: format!(
                        "the log ends at offset {offset} but {} holds a record at offset {at} \
                         written after position {next_position} was synced",
                        later.path.display()
                    ),
                });
            }
            if any {
                // A bad record here, not a clean end, with records after the roll: this
                // segment was synced whole before them, so the bad record is damage.
                if let Some(why) = stop {
                    return Err(StoreError::Corrupt {
                        path: segment.path.clone(),
                        offset,
                        reason: format!(
                            "{why} at offset {offset}, yet the later segment {} holds records",
                            later.path.display()
                        ),
                    });
                }
                remainder.get_or_insert_with(|| later.path.clone());
            }
        }
        if tail.segment != seg_index {
            tail.last_record_offset = 0;
        }
        tail.segment = seg_index;
        tail.offset = offset;
        let torn = stop
            .map(|reason| Torn {
                path: segment.path.clone(),
                offset,
                reason,
            })
            .or_else(|| {
                remainder.map(|path| Torn {
                    path,
                    offset: SEGMENT_HEADER_BYTES,
                    reason: "unsynced records in a later segment whose first record was lost",
                })
            });
        let dirty = zero_tail(segment, offset, tail_window, repair)?;
        let torn = torn.or_else(|| {
            dirty.then(|| Torn {
                path: segment.path.clone(),
                offset,
                reason: "garbage after the last record",
            })
        });
        return Ok(ScanResult {
            tail,
            torn,
            empty_after_tail: segments.len() - seg_index - 1,
        });
    }
    // No segments at all past the start.
    Ok(ScanResult {
        tail,
        torn: None,
        empty_after_tail: 0,
    })
}

/// Looks for a valid record at any 8-byte aligned offset from `from` that was written when
/// `next_position` was already synced: proof that the data before it had been durable.
fn evidence_of_later_group(
    segment: &Segment,
    from: u64,
    next_position: u64,
) -> Result<Option<u64>, StoreError> {
    first_record_where(segment, from, |header| {
        header.synced_through >= next_position
    })
}

/// The offset of the first valid record at an 8-byte aligned offset from `from` for which
/// `wanted` holds (every valid record met is shown to it, in order).
fn first_record_where(
    segment: &Segment,
    from: u64,
    mut wanted: impl FnMut(&record::RecordHeader) -> bool,
) -> Result<Option<u64>, StoreError> {
    let magic = record::RECORD_MAGIC.to_le_bytes();
    let window = 4 << 20;
    let mut at = from.next_multiple_of(8);
    while at + HEADER_BYTES as u64 <= segment.size {
        let chunk = segment.bytes(at, window)?;
        if chunk.is_empty() {
            break;
        }
        // Most of what follows the end of a log is zeros: skip all-zero blocks at memory speed
        // and look for the magic only in the others.
        const BLOCK: usize = 4096;
        for (b, block) in chunk.chunks(BLOCK).enumerate() {
            if is_zero(block) {
                continue;
            }
            let base = b * BLOCK;
            let mut i = 0;
            while i + 4 <= block.len() {
                if block[i..i + 4] == magic {
                    let offset = at + (base + i) as u64;
                    if let Read::Record { header, .. } = read_record(segment, offset)? {
                        if wanted(&header) {
                            return Ok(Some(offset));
                        }
                    }
                }
                i += 8;
            }
        }
        at += chunk.len() as u64;
    }
    Ok(None)
}

/// True when every byte is zero; written to vectorise (no early exit inside a block).
fn is_zero(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    let folded = words.by_ref().fold(0u64, |acc, w| {
        acc | u64::from_le_bytes(w.try_into().unwrap_or([1; 8]))
    });
    folded == 0 && words.remainder().iter().all(|&b| b == 0)
}

fn has_any_record(segment: &Segment) -> Result<bool, StoreError> {
    Ok(matches!(
        read_record(segment, SEGMENT_HEADER_BYTES)?,
        Read::Record { .. }
    ) || evidence_of_later_group(segment, SEGMENT_HEADER_BYTES, 0)?.is_some())
}

/// Finds (and with `repair`, zeroes and syncs) non-zero bytes in `[from, from + window)`.
/// Returns whether any were found.
fn zero_tail(segment: &Segment, from: u64, window: u64, repair: bool) -> Result<bool, StoreError> {
    const BLOCK: usize = 64 << 10;
    let end = (from + window).min(segment.size);
    let mut at = from;
    let mut found = false;
    let zeros = vec![0u8; BLOCK];
    while at < end {
        let n = ((end - at) as usize).min(BLOCK);
        let chunk = segment.bytes(at, n)?;
        if !is_zero(&chunk) {
            found = true;
            if repair {
                segment
                    .file
                    .write_at(&zeros[..chunk.len()], at)
                    .map_err(|e| StoreError::io("zero torn tail", &segment.path, at, e))?;
            }
        }
        if chunk.len() < n {
            break;
        }
        at += n as u64;
    }
    if found && repair {
        segment
            .file
            .sync_data()
            .map_err(|e| StoreError::io("sync after zeroing torn tail", &segment.path, from, e))?;
    }
    Ok(found)
}

/// Opens every segment file in `dir`, in order. A last segment whose header is unreadable (a
/// creation cut short by a crash; no record was ever written into it) is removed when
/// `repair` is set.
pub(crate) fn open_segments(
    io: &dyn Io,
    dir: &Path,
    repair: bool,
) -> Result<Vec<Arc<Segment>>, StoreError> {
    let mut numbers: Vec<u32> = io
        .list(dir)
        .map_err(|e| StoreError::io("list directory", dir, 0, e))?
        .iter()
        .filter_map(|name| crate::segment::parse_file_name(name))
        .collect();
    numbers.sort_unstable();
    let mut segments = Vec::with_capacity(numbers.len());
    for (i, &number) in numbers.iter().enumerate() {
        if i > 0 && number != numbers[i - 1] + 1 {
            return Err(StoreError::Corrupt {
                path: dir.join(crate::segment::file_name(numbers[i - 1] + 1)),
                offset: 0,
                reason: "a segment file is missing from the sequence".into(),
            });
        }
        match Segment::open(io, dir, number) {
            Ok(segment) => segments.push(Arc::new(segment)),
            Err(crate::segment::SegmentOpenError::Io(e)) => return Err(e),
            Err(crate::segment::SegmentOpenError::NoRoom(e)) => {
                // A segment's creation cut short (by a crash, or by the disk filling before an
                // older build removed it) leaves a short last segment with no record in it:
                // nothing of the log, so it goes, and the open needs no room. One that holds
                // records cannot be extended now: say so.
                let last = i + 1 == numbers.len();
                let empty = Segment::open_unchecked(io, dir, number)
                    .map_or(Ok(false), |s| has_any_record(&s).map(|any| !any))?;
                if last && empty {
                    let path = dir.join(crate::segment::file_name(number));
                    if repair {
                        io.remove(&path).map_err(|e| {
                            StoreError::io("remove unfinished segment", &path, 0, e)
                        })?;
                        io.sync_dir(dir)
                            .map_err(|e| StoreError::io("sync directory", dir, 0, e))?;
                    }
                    break;
                }
                return Err(e);
            }
            Err(crate::segment::SegmentOpenError::BadHeader { path, reason }) => {
                let last = i + 1 == numbers.len();
                // A creation cut short by a crash leaves a last segment with a bad header and no
                // record in it; anything else is damage.
                let empty = Segment::open_unchecked(io, dir, number)
                    .map_or(Ok(false), |s| has_any_record(&s).map(|any| !any))?;
                if last && empty {
                    if repair {
                        io.remove(&path)
                            .map_err(|e| StoreError::io("remove torn segment", &path, 0, e))?;
                        io.sync_dir(dir)
                            .map_err(|e| StoreError::io("sync directory", dir, 0, e))?;
                    }
                    break;
                }
                return Err(StoreError::Corrupt {
                    path,
                    offset: 0,
                    reason: reason.into(),
                });
            }
        }
    }
    Ok(segments)
}

/// Whether a valid record at `offset` ends at `end` and holds position `head` last: the check
/// that a checkpoint's mark agrees with the log.
pub(crate) fn record_ends_at(segment: &Segment, offset: u64, end: u64, head: u64) -> bool {
    match read_record(segment, offset) {
        Ok(Read::Record { header, .. }) => {
            header.last_position() == head && offset + header.stored_len() as u64 == end
        }
        _ => false,
    }
}

/// What opening found in a data directory: the log's segments (at least one), the index (from
/// its checkpoint and a scan of what follows it, or rebuilt by a scan of everything), where the
/// log ends, and what the open report tells of it.
pub(crate) struct Recovered {
    pub(crate) segments: Vec<Arc<Segment>>,
    pub(crate) index: Index,
    pub(crate) tail: Tail,
    pub(crate) counters: Counters,
    pub(crate) index_source: IndexSource,
    /// A torn tail cut: its file, its offset and why.
    pub(crate) torn_tail: Option<(PathBuf, u64, String)>,
}

/// Recovers the log in `dir`, whose lock the caller holds: lists its segments (creating the
/// first of a new log), loads the index checkpoint when the log holds the record it names,
/// scans the rest, cuts a torn tail, removes the empty segments past it and syncs what it
/// found (unless in memory), so that nothing presented as acknowledged sits only in the page
/// cache. `own_log`: the directory holds the store's own log (not a copy of one that lives
/// elsewhere), so an empty one without a checkpoint is a new store.
pub(crate) fn recover(
    io: &dyn Io,
    dir: &Path,
    options: &Options,
    own_log: bool,
) -> Result<Recovered, StoreError> {
    let mut segments = open_segments(io, dir, true)?;
    let counters = Counters::default();
    // No log and no checkpoint: a new store (a checkpoint without segments is a lost log).
    let new = own_log
        && segments.is_empty()
        && !io
            .list(dir)
            .map_err(|e| StoreError::io("list data directory", dir, 0, e))?
            .iter()
            .any(|n| n == checkpoint::FILE_NAME);
    if segments.is_empty() {
        let zero_fill = options.preallocation.zero_fill(None);
        let segment = Segment::create(io, dir, 1, options.segment_bytes, zero_fill)?;
        counters.record_segment(&segment, zero_fill);
        segments.push(Arc::new(segment));
    }
    let (mut index, start_tail, rebuild_reason) = match load_checkpoint(io, dir, &segments) {
        Ok((index, tail)) => (index, tail, None),
        Err(reason) => (Index::default(), Tail::default(), Some(reason)),
    };
    // The most a crash can leave unsynced: the backlog, plus one group written at its edge.
    let tail_window = (options.unsynced_bytes_max
        + options.group_bytes_max
        + options.limits.append_bytes_max) as u64
        + 4096;
    let scanned = scan(
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
    let index_source = match rebuild_reason {
        Some(_) if new => IndexSource::New,
        None => IndexSource::Checkpoint {
            scanned_events: tail.head - start_tail.head,
        },
        Some(reason) => IndexSource::Rebuilt { reason },
    };
    Ok(Recovered {
        segments,
        index,
        tail,
        counters,
        index_source,
        torn_tail: scanned
            .torn
            .map(|t| (t.path, t.offset, t.reason.to_string())),
    })
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
    if !record_ends_at(
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
