//! An append's checks before it is staged: its admission's fence, its condition (or a retry
//! recognised by ids) and its tracking position.

use super::*;

/// An append's outcome when its checks settle it before it is staged: its condition fails (or
/// it is recognised as the retry of an append already stored), or its tracking position is not
/// above the one recorded; None when it is to be stored. The caller counts the outcome
/// ([`count_settled`]) once it takes it as the append's (the writer when it stages; the
/// PostgreSQL committer when it answers, not when it holds an append back). `pending_match` and
/// `pending_tracking` look among appends accepted but not yet in the index (the PostgreSQL
/// committer's group; the writer stages each append before checking the next, so has none).
pub(crate) fn checked(
    index: &crate::index::Index,
    request: &Request,
    pending_match: impl Fn(&crate::Query, u64) -> Option<u64>,
    pending_tracking: impl Fn(&str) -> Option<u64>,
) -> Option<Result<u64, AppendError>> {
    let append = &request.append;
    // The rules that admitted the append must still be the newest: otherwise it was judged by
    // rules that no longer hold, and the caller sends it again to be judged by the new ones.
    if let Some(fence) = &request.fence {
        let (query, after) = (&fence.fail_if_events_match, fence.after.unwrap_or(0));
        let found = index
            .first_query_match_after(query, after)
            .or_else(|| pending_match(query, after));
        if let Some(position) = found {
            return Some(Err(AppendError::AdmissionChanged { position }));
        }
    }
    if let Some(condition) = &request.condition {
        let (query, after) = (
            &condition.fail_if_events_match,
            condition.after.unwrap_or(0),
        );
        let found = index
            .first_query_match_after(query, after)
            .or_else(|| pending_match(query, after));
        if let Some(position) = found {
            if let Some(last) = retried_append(index, append, query, after) {
                return Some(Ok(last));
            }
            return Some(Err(AppendError::ConditionFailed { position }));
        }
    }
    let (source, given) = append.tracking()?;
    let recorded = pending_tracking(source).or_else(|| index.tracking_staged(source))?;
    (given <= recorded).then(|| {
        Err(AppendError::TrackingNotIncreasing {
            name: source.to_owned(),
            recorded,
            given,
        })
    })
}

/// Counts an outcome of [`checked`] that its caller answers with: a retry recognised, or a
/// failed condition.
pub(crate) fn count_settled(
    counters: &crate::shared::Counters,
    outcome: &Result<u64, AppendError>,
) {
    let counter = match outcome {
        Ok(_) => &counters.idempotent_retries,
        Err(AppendError::ConditionFailed { .. }) => &counters.conditions_failed,
        Err(_) => return,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// When a conditional append fails: the position of the last event of the append it retries,
/// if it is one. It is when every event carries an id and the first events matching the
/// condition's query after its `after` are as many as the append's and carry the same ids in
/// the same order (UmaDB's rule; an id is not a key, and content is not compared).
fn retried_append(
    index: &crate::index::Index,
    append: &EncodedAppend,
    query: &crate::Query,
    after: u64,
) -> Option<u64> {
    if !append.all_ids {
        return None;
    }
    let count = append.event_count as usize;
    let matches = index.first_matches_after(query, after, count);
    if matches.len() != count {
        return None;
    }
    let same = Entries::new(append.entries(), append.event_count)
        .zip(&matches)
        .all(|((_, entry, layout), &p)| layout.id(entry).map(|id| id.as_u128()) == index.id_at(p));
    same.then(|| matches[count - 1])
}
