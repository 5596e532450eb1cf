//! `annals verify`: check every record of a closed store and compare the checkpoint with the
//! index rebuilt from the log. Changes nothing.

use std::path::Path;

use crate::checkpoint;
use crate::error::StoreError;
use crate::index::Index;
use crate::io::{Io, RealIo};
use crate::recovery::{self, Tail};

/// What `verify` found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyReport {
    pub segments: usize,
    pub records: u64,
    pub events: u64,
    pub types: usize,
    pub tags: usize,
    /// A torn tail that the next open would cut (file, offset, reason).
    pub torn_tail: Option<String>,
    /// "matches", "absent", or why it does not agree with the log.
    pub checkpoint: String,
    pub index_bytes_per_event: f64,
}

impl VerifyReport {
    /// True when the log is whole and the checkpoint (if any) agrees with it.
    pub fn is_clean(&self) -> bool {
        self.torn_tail.is_none() && (self.checkpoint == "matches" || self.checkpoint == "absent")
    }
}

/// Verifies the store in `dir` on the real file system.
pub fn verify(dir: &Path) -> Result<VerifyReport, StoreError> {
    verify_with_io(&RealIo, dir, &mut |_, _| {})
}

/// [`verify`], telling `progress` (segments done, segments) as each segment is checked.
pub fn verify_with_progress(
    dir: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<VerifyReport, StoreError> {
    verify_with_io(&RealIo, dir, progress)
}

/// Verifies through a given I/O layer; `progress` is told (segment, of segments) as it goes.
pub(crate) fn verify_with_io(
    io: &dyn Io,
    dir: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<VerifyReport, StoreError> {
    let _lock = io.lock(&dir.join("LOCK")).map_err(|_| StoreError::Locked {
        path: dir.to_path_buf(),
    })?;
    let segments = recovery::open_segments(io, dir, false)?;
    let mut index = Index::default();
    let mut tail = Tail::default();
    let mut torn = None;
    // The scan reports each segment it finishes.
    let count = segments.len();
    if count > 0 {
        progress(0, count);
        let result = recovery::scan(
            &segments,
            Tail::default(),
            &mut index,
            false,
            u64::MAX / 4,
            true,
            progress,
        )?;
        progress(count, count);
        tail = result.tail;
        torn = result
            .torn
            .map(|t| format!("{} at offset {}: {}", t.path.display(), t.offset, t.reason));
    }
    let checkpoint = match checkpoint::read(io, dir) {
        Err("missing") => "absent".to_string(),
        Err(reason) => format!("checkpoint {reason}"),
        Ok((saved, mark)) => compare(&saved, mark.head, &index),
    };
    Ok(VerifyReport {
        segments: count,
        records: tail.records,
        events: index.len(),
        types: index.type_count(),
        tags: index.tag_count(),
        torn_tail: torn,
        checkpoint,
        index_bytes_per_event: if index.len() == 0 {
            0.0
        } else {
            index.bytes_used() as f64 / index.len() as f64
        },
    })
}

/// Compares a checkpoint's index (covering positions up to `head`) with the rebuilt one.
fn compare(saved: &Index, head: u64, rebuilt: &Index) -> String {
    if head > rebuilt.len() {
        return format!(
            "stale: it covers {head} events, the log holds {}",
            rebuilt.len()
        );
    }
    let n = head as usize;
    if saved.locations[..] != rebuilt.locations[..n] {
        return "differs: event locations".into();
    }
    for (names, ids, postings, rebuilt_ids, rebuilt_postings) in [
        (
            &saved.type_names,
            &saved.type_ids,
            &saved.type_postings,
            &rebuilt.type_ids,
            &rebuilt.type_postings,
        ),
        (
            &saved.tag_names,
            &saved.tag_ids,
            &saved.tag_postings,
            &rebuilt.tag_ids,
            &rebuilt.tag_postings,
        ),
    ] {
        for name in names {
            let (Some(&a), Some(&b)) = (ids.get(name), rebuilt_ids.get(name)) else {
                return format!("differs: {:?} is missing", String::from_utf8_lossy(name));
            };
            let rebuilt_list = &rebuilt_postings[b as usize];
            let cut = rebuilt_list.partition_point(|&p| p <= head);
            if postings[a as usize][..] != rebuilt_list[..cut] {
                return format!("differs: postings of {:?}", String::from_utf8_lossy(name));
            }
        }
    }
    for (i, &t) in saved.event_types.iter().enumerate() {
        let name = &saved.type_names[t as usize];
        let other = &rebuilt.type_names[rebuilt.event_types[i] as usize];
        if name != other {
            return format!("differs: the type of position {}", i + 1);
        }
    }
    "matches".into()
}
