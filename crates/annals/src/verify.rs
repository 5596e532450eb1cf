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
    /// As `Stats::index_bytes_per_event` counts it, so the two agree.
    pub index_bytes_per_event: f64,
    /// Events sealed for data subjects (`Options::subjects`).
    pub sealed_events: u64,
    /// A sealed event whose subject has neither a key nor an erasure, or an erasure without
    /// its receipt.
    pub subject_problem: Option<String>,
}

impl VerifyReport {
    /// True when the log is whole and the checkpoint (if any) agrees with it.
    pub fn is_clean(&self) -> bool {
        self.torn_tail.is_none()
            && (self.checkpoint == "matches" || self.checkpoint == "absent")
            && self.subject_problem.is_none()
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
    let (sealed_events, subject_problem) = check_subjects(io, dir, &segments, &index)?;
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
        index_bytes_per_event: index.bytes_per_event(),
        sealed_events,
        subject_problem,
    })
}

/// Every sealed event's subjects have a key or an erasure, and every erasure its receipt:
/// the sealed events counted, and the first problem found.
fn check_subjects(
    io: &dyn Io,
    dir: &Path,
    segments: &[std::sync::Arc<crate::segment::Segment>],
    index: &Index,
) -> Result<(u64, Option<String>), StoreError> {
    let path = dir.join(crate::keys::KEYS_FILE);
    let file = crate::io::read_file(io, &path).map_err(|e| StoreError::io("read", &path, 0, e))?;
    let (tags, wrap_id) = match &file {
        Some(bytes) => {
            let read = crate::keys::key_tags(bytes)
                .map_err(|e| StoreError::Subjects(format!("{}: {e}", path.display())))?;
            (read.tags, read.wrap_id)
        }
        None => Default::default(),
    };
    let mut sealed = 0;
    let mut carried = std::collections::HashSet::new();
    for position in 1..=index.len() {
        let Some(location) = index.location_of(position) else {
            continue;
        };
        let (number, offset) = crate::index::split_location(location);
        let Some(segment) = segments.iter().find(|s| s.number == number) else {
            continue;
        };
        let offset = u64::from(offset);
        let Some(len) = segment.peek(offset, 4, |b| {
            b.get(..4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
        })?
        else {
            continue;
        };
        let entry = segment.bytes(offset, len as usize)?;
        let Some(layout) = crate::record::EntryLayout::parse(&entry) else {
            continue;
        };
        if !layout.sealed {
            continue;
        }
        sealed += 1;
        let Some(subjects) = crate::seal::sealed_subjects(&entry, &layout) else {
            return Ok((
                sealed,
                Some(format!("the event at {position} has a malformed envelope")),
            ));
        };
        // A key the key file does not hold yet travels in the log, in the events sealed under
        // it from the first on (or, after an open took it in, from the first only).
        for grant in crate::seal::entry_grants(&entry, &layout).unwrap_or_default() {
            if Some(grant.wrap_id) == wrap_id {
                carried.insert(grant.tag.to_string());
            }
        }
        for tag in subjects {
            if !tags.contains_key(tag) && !carried.contains(tag) {
                let why = format!(
                    "the event at {position} is sealed for {tag}, which has neither a key nor \
                     an erasure{}",
                    if file.is_none() {
                        " (the store has no subjects.keys)"
                    } else {
                        ""
                    }
                );
                return Ok((sealed, Some(why)));
            }
        }
    }
    for (tag, erased) in &tags {
        let receipts = crate::query::Query::item(
            crate::query::QueryItem::types([crate::subject::SUBJECT_ERASED_TYPE])
                .and_tags([tag.as_str()]),
        );
        if *erased && index.first_query_match_after(&receipts, 0).is_none() {
            let why = format!(
                "{tag} was erased, and its receipt is not in the log yet (the next open appends it)"
            );
            return Ok((sealed, Some(why)));
        }
    }
    Ok((sealed, None))
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
