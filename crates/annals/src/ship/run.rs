//! Small chunks consolidated, a piece at a time.
//!
//! A store that ships often and little (a slow store, or D4 appends that each want their put)
//! leaves many small chunks of its active segment. Kept, they would make a restore read
//! thousands of objects. So the shipper keeps the run of small chunks it put one after
//! another in one segment; once the run carries `object_bytes_max` bytes, or its segment is
//! sealed, or a large chunk follows it, the run's records are put once more as one object of
//! the segment's kind (`segments/<first>`) and its chunks are deleted. No object is larger
//! than `object_bytes_max`, so no put holds a D4 append back for much longer than another;
//! and the shipper never makes two consolidating puts in a row while records wait to ship.
//!
//! A consolidated object begins where the run's first chunk begins and ends where its last
//! ends, so a reader that takes, at each position, the segment's object beginning there, else
//! the chunk, never needs a chunk that begins inside one. After a restart the run is found
//! again from the listing; chunks that a consolidated object covers (its chunks' delete was
//! cut short) are deleted then.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{decode_object_header, parse_name, Failure, ObjectKind, Shipper, OBJECT_HEADER_BYTES};
use crate::error::StoreError;
use crate::record::RecordHeader;

/// Chunks put one after another in one segment, each smaller than a run's `small` size.
#[derive(Debug)]
pub(super) struct Run {
    pub(super) segment: u32,
    /// The first position of each chunk, in order.
    firsts: Vec<u64>,
    /// The last position of the last chunk.
    last: u64,
    bytes: u64,
    /// A large chunk followed: the run grows no more.
    closed: bool,
}

impl Run {
    fn new(segment: u32) -> Run {
        Run {
            segment,
            firsts: Vec::new(),
            last: 0,
            bytes: 0,
            closed: false,
        }
    }

    fn push(&mut self, first: u64, last: u64, bytes: u64) {
        assert!(
            self.firsts.is_empty() || first == self.last + 1,
            "a run's chunks follow each other: {first} after {}",
            self.last
        );
        self.firsts.push(first);
        self.last = last;
        self.bytes += bytes;
    }
}

impl Shipper {
    /// Chunks smaller than this join the run; a larger one stands as it is.
    fn small_chunk(&self) -> u64 {
        (self.state.options.object_bytes_max as u64 / 8).max(1)
    }

    /// A chunk of `segment` holding `first..=last` in `bytes` record bytes was put.
    pub(super) fn chunk_put(&mut self, segment: u32, first: u64, last: u64, bytes: u64) {
        if let Some(run) = &self.run {
            assert!(
                run.segment == segment && !run.closed,
                "a due run is consolidated before the next chunk: {run:?}, chunk of {segment}"
            );
        }
        if bytes >= self.small_chunk() {
            if let Some(run) = &mut self.run {
                run.closed = true;
            }
            return;
        }
        self.run
            .get_or_insert_with(|| Run::new(segment))
            .push(first, last, bytes);
    }

    /// Whether the run is to be consolidated now: it is full, closed, or its segment sealed
    /// (the durable position is in a later one).
    pub(super) fn run_due(&self, durable_segment: u32) -> bool {
        self.run.as_ref().is_some_and(|run| {
            run.closed
                || run.bytes >= self.state.options.object_bytes_max as u64
                || run.segment < durable_segment
        })
    }

    /// Puts the run's records again as one object of the segment's kind and deletes its
    /// chunks. A run of one chunk is left as it is.
    pub(super) fn consolidate(&mut self) -> Result<(), Failure> {
        let Some(run) = self.run.as_ref() else {
            return Ok(());
        };
        if run.firsts.len() < 2 {
            self.run = None;
            return Ok(());
        }
        let (segment, first, last) = (run.segment, run.firsts[0], run.last);
        let frames = self.records(segment, first, last)?;
        let covered = self.put(ObjectKind::Segment, segment, first, last, frames)?;
        self.count_segment_object();
        let run = self.run.take().expect("the run is there");
        for &chunk in run.firsts.iter().filter(|&&f| f <= covered) {
            self.delete_covered(&ObjectKind::Chunk.name(chunk));
        }
        Ok(())
    }

    /// The records `first..=last` of `segment`, read from the local log: they must begin
    /// and end there.
    pub(super) fn records(
        &self,
        segment: u32,
        first: u64,
        last: u64,
    ) -> Result<Vec<(RecordHeader, Bytes)>, Failure> {
        let mut iter = self.reader(first, last).map_err(Failure::fatal)?;
        let mut frames = Vec::new();
        while let Some((number, header, bytes)) = iter.next_frame().map_err(Failure::fatal)? {
            if number != segment || header.first_position > last {
                break;
            }
            frames.push((header, bytes));
        }
        match (frames.first(), frames.last()) {
            (Some((f, _)), Some((l, _)))
                if f.first_position == first && l.last_position() == last =>
            {
                Ok(frames)
            }
            _ => Err(Failure::Fatal(format!(
                "positions {first}..={last} are not whole records of segment {segment}"
            ))),
        }
    }

    pub(super) fn delete_covered(&self, name: &str) {
        if let Err(e) = self.objects.delete(name) {
            tracing::warn!(
                url = self.url(),
                error = %e,
                "backup: a covered chunk was not deleted (reads skip it)"
            );
        }
    }

    /// After a restart: the run of small chunks that ends at `shipped`, found from the
    /// listing, and chunks that the newest object of a segment's kind covers deleted.
    pub(super) fn find_run(&mut self, shipped: u64) -> Result<(), StoreError> {
        self.run = None;
        let Some(segment) = self.segment_of(shipped) else {
            return Ok(());
        };
        let err = |e| super::backup_error(&self.state.url, &e);
        let mut covered_to = 0;
        let pieces = self
            .objects
            .list(ObjectKind::Segment.dir(), None)
            .map_err(err)?;
        let newest = pieces
            .iter()
            .rev()
            .find_map(|l| parse_name(ObjectKind::Segment, &l.name).map(|f| (f, &l.name)));
        if let Some((first, name)) = newest {
            let head = self
                .objects
                .get_range(name, 0..OBJECT_HEADER_BYTES as u64)
                .map_err(err)?;
            let header = decode_object_header(&head)
                .map_err(|e| StoreError::Backup(format!("{}: {name}: {e}", self.url())))?;
            covered_to = header.last;
            let chunks = self
                .objects
                .list(ObjectKind::Chunk.dir(), None)
                .map_err(err)?;
            for l in &chunks {
                if parse_name(ObjectKind::Chunk, &l.name)
                    .is_some_and(|c| c >= first && c <= covered_to)
                {
                    self.delete_covered(&l.name);
                }
            }
        }
        let segment_first = self.first_of(segment).map_err(|e| match e {
            Failure::Fatal(m) => StoreError::Backup(m),
            Failure::Retry(e) => err(e),
        })?;
        let chunks = self
            .objects
            .list(ObjectKind::Chunk.dir(), None)
            .map_err(err)?;
        let mut found: Vec<(u64, u64)> = chunks
            .iter()
            .filter_map(|l| parse_name(ObjectKind::Chunk, &l.name).map(|f| (f, l.size)))
            .filter(|&(f, _)| f > covered_to && f >= segment_first && f <= shipped)
            .collect();
        found.sort_unstable();
        // The run begins after the last large chunk.
        let small = self.small_chunk() + OBJECT_HEADER_BYTES as u64;
        if let Some(large) = found.iter().rposition(|&(_, size)| size >= small) {
            found.drain(..=large);
        }
        let mut run = Run::new(segment);
        for (i, &(first, size)) in found.iter().enumerate() {
            let last = found.get(i + 1).map_or(shipped, |&(next, _)| next - 1);
            run.push(first, last, size);
        }
        if !run.firsts.is_empty() {
            self.run = Some(run);
        }
        Ok(())
    }

    /// The first position of `segment`, from its first record.
    pub(super) fn first_of(&self, segment: u32) -> Result<u64, Failure> {
        let file = self
            .shared
            .segment(segment)
            .ok_or_else(|| Failure::Fatal(format!("segment {segment} is not open")))?;
        let bytes = file
            .bytes(
                crate::segment::SEGMENT_HEADER_BYTES,
                crate::record::HEADER_BYTES,
            )
            .map_err(Failure::fatal)?;
        match crate::record::decode_header(&bytes) {
            crate::record::Frame::Record(h) => Ok(h.first_position),
            _ => Err(Failure::Fatal(format!(
                "segment {segment} does not begin with a record"
            ))),
        }
    }

    /// Counts an object of a sealed segment's records put.
    pub(super) fn count_segment_object(&self) {
        self.state.segments_shipped.fetch_add(1, Ordering::Relaxed);
    }
}
