//! Small chunks consolidated, on a thread of their own.
//!
//! A store that ships often and little (a slow store, or D4 appends that each want their put)
//! leaves many small chunks of its active segment. Kept, they would make a restore read
//! thousands of objects. So the shipper keeps the run of small chunks it put one after
//! another in one segment; once the run carries `object_bytes_max` bytes, or its segment is
//! sealed, or a large chunk follows it, the run goes to the consolidator, which puts its
//! records once more as one object of the segment's kind (`segments/<first>`) and deletes its
//! chunks. It does so beside the shipper, with a client of its own, so that no D4 append
//! waits behind a consolidating put: puts in line behind one another held D4 appends back
//! for 0.5-0.6 s at every consolidation (DECISIONS R38).
//!
//! A consolidated object begins where the run's first chunk begins and ends where its last
//! ends, so a reader that takes, at each position, the segment's object beginning there, else
//! the chunk, never needs a chunk that begins inside one; chunks are deleted only once the
//! object is in place. After a restart the last run is found again from the listing; chunks
//! that the newest object of a segment's kind covers (a delete cut short) are deleted then.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;

use super::{
    parse_name, write_object, BackupState, Failure, Found, ObjectKind, Shipper, BACKOFF_MAX,
    BACKOFF_MIN, OBJECT_HEADER_BYTES,
};
use crate::objects::Objects;
use crate::query::{Query, ReadOptions};
use crate::read::ReadIter;
use crate::record::RecordHeader;
use crate::shared::Shared;

/// Runs handed over and not yet taken up; beyond them a run's chunks stay as they are.
const RUNS_QUEUED_MAX: usize = 4;

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

    /// Hands the run to the consolidator (started at the first). A run of one chunk is
    /// left as it is.
    pub(super) fn consolidate(&mut self) {
        let Some(run) = self.run.take() else {
            return;
        };
        if run.firsts.len() < 2 {
            return;
        }
        if self.consolidator.is_none() {
            let started = Objects::open_with(&self.state.options.url, &self.state.options.settings)
                .and_then(|objects| {
                    Consolidator::start(self.shared.clone(), self.state.clone(), objects)
                });
            match started {
                Ok(consolidator) => self.consolidator = Some(consolidator),
                Err(e) => {
                    // Consolidating only spares a restore many small reads: the chunks stay.
                    tracing::warn!(
                        url = self.url(),
                        error = e.as_str(),
                        "backup: small chunks are not consolidated"
                    );
                    return;
                }
            }
        }
        let consolidator = self.consolidator.as_ref().expect("started");
        match consolidator.runs.try_send(run) {
            Ok(()) => {}
            // It is behind (object storage failing): the shipper does not wait for it, and
            // these chunks stay as they are.
            Err(crossbeam_channel::TrySendError::Full(_)) => {}
            // Its thread ended (it logged why): the chunks stay as they are.
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => self.consolidator = None,
        }
    }

    /// Lets the consolidator finish the runs handed to it (while object storage answers), and
    /// waits for it.
    pub(super) fn finish_consolidating(&mut self) {
        if let Some(Consolidator { runs, thread }) = self.consolidator.take() {
            drop(runs);
            let _ = thread.join();
        }
    }

    /// After a restart: the run of small chunks that ends at `shipped`, from what the start
    /// found, and chunks that the newest object of a segment's kind covers deleted.
    pub(super) fn find_run(&mut self, shipped: u64, found: &Found) {
        self.run = None;
        let Some(segment) = self.segment_of(shipped) else {
            return;
        };
        let mut covered_to = 0;
        if let Some((first, last)) = found.newest_piece {
            covered_to = last;
            for l in &found.chunks {
                if parse_name(ObjectKind::Chunk, &l.name).is_some_and(|c| c >= first && c <= last) {
                    delete_covered(&self.objects, &l.name);
                }
            }
        }
        let mut chunks: Vec<(u64, u64)> = found
            .chunks
            .iter()
            .filter_map(|l| parse_name(ObjectKind::Chunk, &l.name).map(|f| (f, l.size)))
            .filter(|&(f, _)| f > covered_to && f <= shipped && self.segment_of(f) == Some(segment))
            .collect();
        chunks.sort_unstable();
        // The run begins after the last large chunk.
        let small = self.small_chunk() + OBJECT_HEADER_BYTES as u64;
        if let Some(large) = chunks.iter().rposition(|&(_, size)| size >= small) {
            chunks.drain(..=large);
        }
        let mut run = Run::new(segment);
        for (i, &(first, size)) in chunks.iter().enumerate() {
            let last = chunks.get(i + 1).map_or(shipped, |&(next, _)| next - 1);
            run.push(first, last, size);
        }
        if !run.firsts.is_empty() {
            self.run = Some(run);
        }
    }
}

fn delete_covered(objects: &Objects, name: &str) {
    if let Err(e) = objects.delete(name) {
        tracing::warn!(
            url = objects.url(),
            error = %e,
            "backup: a covered chunk was not deleted (reads skip it)"
        );
    }
}

/// The thread that puts runs of small chunks again as one object each, in the order given.
pub(super) struct Consolidator {
    runs: crossbeam_channel::Sender<Run>,
    thread: JoinHandle<()>,
}

impl Consolidator {
    fn start(
        shared: Arc<Shared>,
        state: Arc<BackupState>,
        objects: Objects,
    ) -> Result<Consolidator, String> {
        let (runs, taken) = crossbeam_channel::bounded::<Run>(RUNS_QUEUED_MAX);
        let thread = std::thread::Builder::new()
            .name("annals-consolidate".into())
            .spawn(move || {
                for run in taken {
                    if !consolidate_run(&shared, &state, &objects, &run) {
                        return;
                    }
                }
            })
            .map_err(|e| format!("start the consolidating thread: {e}"))?;
        Ok(Consolidator { runs, thread })
    }
}

/// Puts the run's records as one object and deletes its chunks, trying again with backoff
/// while object storage fails (until the store closes). False when consolidating cannot go
/// on: the run's chunks, and those of later runs, stay as they are (reads need nothing more).
fn consolidate_run(
    shared: &Arc<Shared>,
    state: &BackupState,
    objects: &Objects,
    run: &Run,
) -> bool {
    let (first, last) = (run.firsts[0], run.last);
    let mut backoff = BACKOFF_MIN;
    let written = loop {
        let written = records(shared, run.segment, first, last).and_then(|frames| {
            let durable = shared.published.head();
            write_object(
                objects,
                state,
                durable,
                ObjectKind::Segment,
                run.segment,
                (first, last),
                &frames,
            )
        });
        match written {
            Ok(covered) => break covered,
            Err(Failure::Retry(e)) if !state.stop.load(Ordering::Acquire) => {
                tracing::warn!(
                    url = objects.url(),
                    error = %e,
                    "backup: consolidating chunks failed; trying again"
                );
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            Err(Failure::Retry(e)) => {
                tracing::warn!(
                    url = objects.url(),
                    error = %e,
                    "backup: the store closed before chunks were consolidated; they stay"
                );
                return false;
            }
            Err(Failure::Fatal(reason)) => {
                tracing::error!(
                    url = objects.url(),
                    reason,
                    "backup: consolidating chunks stopped; they stay as they are"
                );
                return false;
            }
        }
    };
    for &chunk in run.firsts.iter().filter(|&&f| f <= written) {
        delete_covered(objects, &ObjectKind::Chunk.name(chunk));
    }
    true
}

/// The records `first..=last` of `segment`, read from the local log: they must begin and end
/// there.
fn records(
    shared: &Arc<Shared>,
    segment: u32,
    first: u64,
    last: u64,
) -> Result<Vec<(RecordHeader, Bytes)>, Failure> {
    let mut iter = ReadIter::new(
        shared.clone(),
        &Query::all(),
        ReadOptions::forwards().from(first),
        last,
    )
    .map_err(|e| Failure::fatal(crate::shared::store_error(e)))?;
    let mut frames = Vec::new();
    while let Some((number, header, bytes)) = iter.next_frame().map_err(Failure::fatal)? {
        if number != segment || header.first_position > last {
            break;
        }
        frames.push((header, bytes));
    }
    match (frames.first(), frames.last()) {
        (Some((f, _)), Some((l, _))) if f.first_position == first && l.last_position() == last => {
            Ok(frames)
        }
        _ => Err(Failure::Fatal(format!(
            "positions {first}..={last} are not whole records of segment {segment}"
        ))),
    }
}
