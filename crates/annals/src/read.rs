//! Streaming reads. A [`ReadIter`] takes the head when it starts and never returns an event past
//! it. A forward read of every event walks the segments record by record; any other read asks
//! the index for a chunk of positions at a time (holding its lock only for that) and fetches each
//! event from its segment. With mapped segments an event's bytes are shared, not copied.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{ReadError, StoreError};
use crate::event::Event;
use crate::index::{split_location, Resolved, Window};
use crate::keys::OpenMemo;
use crate::query::{Query, ReadOptions};
use crate::record::StoredAppend;
use crate::record::{crc_matches, decode_header, EntryLayout, Frame, RecordHeader, HEADER_BYTES};
use crate::segment::{Segment, SEGMENT_HEADER_BYTES};
use crate::shared::Shared;

const CHUNK: usize = 512;
/// How many events ahead an indexed read prefetches entries.
const PREFETCH_AHEAD: usize = 8;
/// How many cache lines of an entry a store with data subjects prefetches: a sealed event of a
/// few hundred bytes is read whole when it is opened, where a plain read touches its first.
const SEALED_PREFETCH_LINES: usize = 6;
const SCAN_WINDOW: usize = 4 << 20;

/// An iterator over the events a read matches, in read order.
pub struct ReadIter {
    shared: Arc<Shared>,
    head: u64,
    remaining: u64,
    mode: Mode,
    segment: Option<Arc<Segment>>,
    /// The cipher of the data subject's key this read opened last (sealed events only).
    memo: OpenMemo,
}

enum Mode {
    Done,
    Scan(Scan),
    Indexed {
        resolved: Resolved,
        window: Window,
        queue: VecDeque<(u64, u64)>,
        positions: Vec<u64>,
    },
}

/// A forward walk over records.
struct Scan {
    /// The next position to return.
    position: u64,
    /// Offset of the next record to load.
    offset: u64,
    segment: Option<Arc<Segment>>,
    view: Bytes,
    view_start: u64,
    record: Option<OpenRecord>,
}

struct OpenRecord {
    bytes: Bytes,
    header: RecordHeader,
    /// Offset of the next entry in `bytes`.
    at: usize,
    /// Position of that entry.
    position: u64,
}

fn corrupt(segment: &Segment, offset: u64, reason: &str) -> StoreError {
    StoreError::Corrupt {
        path: segment.path.clone(),
        offset,
        reason: reason.to_string(),
    }
}

impl ReadIter {
    pub(crate) fn new(
        shared: Arc<Shared>,
        query: &Query,
        options: ReadOptions,
        head: u64,
    ) -> Result<ReadIter, ReadError> {
        Self::with_afters(shared, query, &[], options, head)
    }

    /// [`ReadIter::new`], with item `i` of `query` matching only positions after `afters[i]`
    /// (see [`crate::index::Index::resolve_after`]).
    pub(crate) fn with_afters(
        shared: Arc<Shared>,
        query: &Query,
        afters: &[u64],
        options: ReadOptions,
        head: u64,
    ) -> Result<ReadIter, ReadError> {
        let bound = options.bound()?;
        let remaining = options.limit.unwrap_or(u64::MAX);
        let window = if options.backwards {
            Window {
                forward: false,
                start: bound.unwrap_or(head).min(head),
                end: 1,
            }
        } else {
            Window {
                forward: true,
                start: bound.unwrap_or(1).max(1),
                end: head,
            }
        };
        let empty = remaining == 0 || window.is_empty();
        let mut iter = ReadIter {
            shared,
            head,
            remaining,
            mode: Mode::Done,
            segment: None,
            memo: OpenMemo::default(),
        };
        if empty {
            return Ok(iter);
        }
        let resolved = iter.shared.index.read().resolve_after(query, afters);
        iter.mode = match resolved {
            Resolved::All if window.forward => Mode::Scan(Scan {
                position: window.start,
                offset: 0,
                segment: None,
                view: Bytes::new(),
                view_start: 0,
                record: None,
            }),
            resolved => Mode::Indexed {
                resolved,
                window,
                queue: VecDeque::new(),
                positions: Vec::new(),
            },
        };
        if let Mode::Scan(_) = iter.mode {
            iter.start_scan(window.start)?;
        }
        Ok(iter)
    }

    /// The head this read sees.
    pub fn head(&self) -> u64 {
        self.head
    }

    fn segment(&mut self, number: u32) -> Result<Arc<Segment>, StoreError> {
        if let Some(s) = &self.segment {
            if s.number == number {
                return Ok(s.clone());
            }
        }
        let segment = self
            .shared
            .segment(number)
            .ok_or_else(|| StoreError::Corrupt {
                path: self.shared.dir.join(crate::segment::file_name(number)),
                offset: 0,
                reason: "the index points into a segment that is not open".into(),
            })?;
        self.segment = Some(segment.clone());
        Ok(segment)
    }

    /// Positions the scan on the record holding `position`.
    fn start_scan(&mut self, position: u64) -> Result<(), StoreError> {
        let location = self.shared.index.read().location_of(position);
        let Some(location) = location else {
            self.mode = Mode::Done;
            return Ok(());
        };
        let (number, entry_offset) = split_location(location);
        let segment = self.segment(number)?;
        let fixed = segment.bytes(u64::from(entry_offset), 8)?;
        let record_offset = fixed
            .get(4..8)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| corrupt(&segment, u64::from(entry_offset), "short entry"))?;
        let offset = u64::from(entry_offset)
            .checked_sub(u64::from(record_offset))
            .ok_or_else(|| corrupt(&segment, u64::from(entry_offset), "bad record offset"))?;
        if let Mode::Scan(scan) = &mut self.mode {
            scan.offset = offset;
            scan.position = position;
            scan.segment = Some(segment);
        }
        Ok(())
    }

    fn next_scanned(&mut self) -> Result<Option<Event>, StoreError> {
        loop {
            let Mode::Scan(scan) = &mut self.mode else {
                return Ok(None);
            };
            if scan.position > self.head {
                return Ok(None);
            }
            if let Some(record) = &mut scan.record {
                if record.position <= record.header.last_position() {
                    let rest = record.bytes.get(record.at..).unwrap_or(&[]);
                    let layout = EntryLayout::parse(rest).ok_or_else(|| StoreError::Corrupt {
                        path: self.shared.dir.clone(),
                        offset: record.at as u64,
                        reason: "malformed entry".into(),
                    })?;
                    let len = layout.entry_len as usize;
                    let entry = record.bytes.slice(record.at..record.at + len);
                    record.at += len;
                    let position = record.position;
                    record.position += 1;
                    if position < scan.position {
                        continue;
                    }
                    scan.position = position + 1;
                    let at = record.header.appended_at_us;
                    return event_of(&self.shared, &mut self.memo, position, at, entry, layout)
                        .map(Some);
                }
                scan.record = None;
            }
            self.load_record()?;
        }
    }

    /// Loads the record at the scan's offset, moving to the next segment at a segment's end.
    fn load_record(&mut self) -> Result<(), StoreError> {
        let Mode::Scan(scan) = &mut self.mode else {
            return Ok(());
        };
        let mut segment = match &scan.segment {
            Some(s) => s.clone(),
            None => return Err(StoreError::Closed),
        };
        let mut header_bytes = scan.get(&segment, scan.offset, HEADER_BYTES)?;
        if !matches!(decode_header(&header_bytes), Frame::Record(_)) {
            // The previous record ended its segment: the log continues in the next one.
            let next = self
                .shared
                .segment(segment.number + 1)
                .ok_or_else(|| corrupt(&segment, scan.offset, "the log ends before the head"))?;
            segment = next;
            scan.segment = Some(segment.clone());
            scan.view = Bytes::new();
            scan.offset = SEGMENT_HEADER_BYTES;
            header_bytes = scan.get(&segment, scan.offset, HEADER_BYTES)?;
        }
        let header = match decode_header(&header_bytes) {
            Frame::Record(h) if h.first_position <= scan.position => h,
            _ => return Err(corrupt(&segment, scan.offset, "expected a record")),
        };
        let bytes = scan.get(&segment, scan.offset, header.stored_len())?;
        if !crc_matches(&bytes, &header) {
            return Err(corrupt(&segment, scan.offset, "CRC mismatch on read"));
        }
        scan.offset += header.stored_len() as u64;
        scan.record = Some(OpenRecord {
            bytes,
            header,
            at: HEADER_BYTES,
            position: header.first_position,
        });
        Ok(())
    }

    /// The next whole record of a forward scan of everything (see [`crate::Store::appends`]):
    /// the one holding the scan's position, then those after it, up to the head.
    pub(crate) fn next_record(&mut self) -> Result<Option<StoredAppend>, StoreError> {
        let Some((_, header, bytes)) = self.next_frame()? else {
            return Ok(None);
        };
        let body = bytes.slice(HEADER_BYTES..HEADER_BYTES + header.body_len as usize);
        Ok(Some(StoredAppend::new(
            header.first_position,
            header.event_count,
            header.appended_at_us,
            header.trailer_len,
            body,
        )))
    }

    /// [`ReadIter::next_record`] as the segment holds it: the segment's number, the record's
    /// header, and its bytes (header, body and padding; the CRC checked).
    pub(crate) fn next_frame(&mut self) -> Result<Option<(u32, RecordHeader, Bytes)>, StoreError> {
        let Mode::Scan(scan) = &mut self.mode else {
            return Ok(None);
        };
        if scan.position > self.head {
            self.mode = Mode::Done;
            return Ok(None);
        }
        scan.record = None;
        self.load_record()?;
        let Mode::Scan(scan) = &mut self.mode else {
            return Ok(None);
        };
        let record = scan.record.take().expect("loaded above");
        let header = record.header;
        debug_assert!(header.first_position <= scan.position);
        debug_assert!(
            header.last_position() <= self.head,
            "records end at the head"
        );
        scan.position = header.last_position() + 1;
        let segment = scan.segment.as_ref().map_or(0, |s| s.number);
        Ok(Some((segment, header, record.bytes)))
    }

    fn next_indexed(&mut self) -> Result<Option<Event>, StoreError> {
        loop {
            let Mode::Indexed {
                resolved,
                window,
                queue,
                positions,
            } = &mut self.mode
            else {
                return Ok(None);
            };
            if let Some((position, location)) = queue.pop_front() {
                if let Some(&(_, ahead)) = queue.get(PREFETCH_AHEAD - 1) {
                    self.prefetch_entry(ahead);
                }
                return self.fetch(position, location).map(Some);
            }
            if window.is_empty() {
                return Ok(None);
            }
            positions.clear();
            let want = (self.remaining.min(CHUNK as u64)) as usize;
            let index = self.shared.index.read();
            let chunk = index.collect(resolved, *window, want, positions);
            // The locations of scattered events miss the cache one by one: start all the loads
            // first, then read them.
            for &p in positions.iter() {
                index.prefetch_location(p);
            }
            for &p in positions.iter() {
                if let Some(location) = index.location_of(p) {
                    queue.push_back((p, location));
                }
            }
            drop(index);
            let mut ahead = [0u64; PREFETCH_AHEAD];
            let mut count = 0;
            for (slot, &(_, location)) in ahead.iter_mut().zip(queue.iter()) {
                *slot = location;
                count += 1;
            }
            match chunk.resume {
                Some(next) => window.start = next,
                None => window.start = 0,
            }
            if queue.is_empty() && window.start == 0 {
                return Ok(None);
            }
            for &location in &ahead[..count] {
                self.prefetch_entry(location);
            }
        }
    }

    /// Starts loading the entry at `location` into the cache (see [`Segment::prefetch`]).
    fn prefetch_entry(&mut self, location: u64) {
        let (number, offset) = split_location(location);
        // A sealed entry is read whole to be opened: its data's lines too.
        let lines = match self.shared.keys.is_some() {
            true => SEALED_PREFETCH_LINES,
            false => 1,
        };
        match &self.segment {
            Some(segment) if segment.number == number => segment.prefetch(u64::from(offset), lines),
            _ => {
                if let Ok(segment) = self.segment(number) {
                    segment.prefetch(u64::from(offset), lines);
                }
            }
        }
    }

    /// Reads the event at `location`.
    fn fetch(&mut self, position: u64, location: u64) -> Result<Event, StoreError> {
        let (number, offset) = split_location(location);
        let segment = self.segment(number)?;
        let offset = u64::from(offset);
        let len = segment
            .peek(offset, 4, |b| {
                b.get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_le_bytes)
            })?
            .ok_or_else(|| corrupt(&segment, offset, "short entry"))?;
        let entry = segment.bytes(offset, len as usize)?;
        // Entries reached through the index were checked when they were indexed (written by
        // this process from `&str`, or scanned at open), so the UTF-8 check is not repeated;
        // the accessors of `Event` stay safe on any bytes.
        let layout = EntryLayout::parse_checked(&entry, false)
            .ok_or_else(|| corrupt(&segment, offset, "malformed entry"))?;
        let record_start = offset
            .checked_sub(u64::from(layout.record_offset))
            .ok_or_else(|| corrupt(&segment, offset, "bad record offset"))?;
        let appended_at_us = segment
            .peek(record_start + 40, 8, |b| {
                b.get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
            })?
            .unwrap_or(0);
        event_of(
            &self.shared,
            &mut self.memo,
            position,
            appended_at_us,
            entry,
            layout,
        )
    }
}

/// The event of an entry read from the log: a data subject's opened with the store's keys.
fn event_of(
    shared: &Shared,
    memo: &mut OpenMemo,
    position: u64,
    appended_at_us: u64,
    entry: Bytes,
    layout: EntryLayout,
) -> Result<Event, StoreError> {
    if !layout.sealed {
        return Ok(Event::new(position, appended_at_us, entry, layout));
    }
    crate::keys::open_sealed(
        shared.keys.as_deref(),
        position,
        appended_at_us,
        entry,
        layout,
        memo,
    )
}

impl Scan {
    /// `len` bytes at `offset` of `segment`, from the current view when it covers them.
    fn get(&mut self, segment: &Segment, offset: u64, len: usize) -> Result<Bytes, StoreError> {
        let end = offset + len as u64;
        let view_end = self.view_start + self.view.len() as u64;
        if offset < self.view_start || end > view_end {
            self.view = segment.bytes(offset, len.max(SCAN_WINDOW))?;
            self.view_start = offset;
        }
        let start = (offset - self.view_start) as usize;
        let stop = (start + len).min(self.view.len());
        Ok(self.view.slice(start..stop))
    }
}

impl Iterator for ReadIter {
    type Item = Result<Event, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        let result = match self.mode {
            Mode::Done => return None,
            Mode::Scan(_) => self.next_scanned(),
            Mode::Indexed { .. } => self.next_indexed(),
        };
        match result {
            Ok(Some(event)) => {
                self.remaining -= 1;
                Some(Ok(event))
            }
            Ok(None) => {
                self.mode = Mode::Done;
                None
            }
            Err(e) => {
                self.mode = Mode::Done;
                Some(Err(e.into()))
            }
        }
    }
}
