//! The store's spans beyond an append's own (`annals.append`, in append.rs): the commit that
//! makes appends durable (a group's fdatasync, or a PostgreSQL commit), the backup's puts to
//! object storage, and decisions. They are `tracing` spans, recorded by whoever subscribes
//! (the server exports them over OTLP); a commit or a put is a trace of its own, since it
//! carries the appends of many, and is linked both ways with each traced append it carried.
//! Their numbers are signed: the bridge to OpenTelemetry writes a `u64` as text.

use tracing::field::Empty;
use tracing::Span;

/// Whether anything records the store's spans (read before looking for traced appends).
pub(crate) fn recorded() -> bool {
    tracing::enabled!(target: "annals", tracing::Level::INFO)
}

/// The span of a commit that makes appends durable: `annals.head` (the position it makes
/// durable), `annals.appends` (how many it acknowledges), and as the backend has them `annals.bytes` and `annals.fsync_us`
/// (a segment's sync) or `db.system.name`, `annals.commit_us` and `annals.tries` (a
/// database's commit, tried again after a race lost to another server).
pub(crate) fn commit() -> Span {
    tracing::info_span!(
        target: "annals",
        parent: None,
        "annals.commit",
        annals.appends = Empty,
        annals.bytes = Empty,
        annals.fsync_us = Empty,
        annals.head = Empty,
        annals.commit_us = Empty,
        annals.tries = Empty,
        db.system.name = Empty,
        otel.status_code = Empty,
    )
}

#[cfg(feature = "object-store")]
/// The span of one object put into the backup: its kind (`chunk`, `segment`), the positions
/// it holds, its bytes and how long the put took.
pub(crate) fn put(kind: &'static str, first: u64, last: u64) -> Span {
    tracing::info_span!(
        target: "annals",
        parent: None,
        "annals.backup.put",
        annals.object = kind,
        annals.first = first as i64,
        annals.last = last as i64,
        annals.bytes = Empty,
        annals.put_us = Empty,
        annals.appends = Empty,
        otel.status_code = Empty,
    )
}

/// Links `span` and each traced append's span, both ways: from an append's trace an operator
/// reaches what carried it, and from that every append.
pub(crate) fn link<'a>(span: &Span, appends: impl IntoIterator<Item = &'a Span>) {
    for append in appends.into_iter().filter(|s| !s.is_disabled()) {
        span.follows_from(append);
        append.follows_from(span);
    }
}

/// The span `make` makes under the caller's, or none when the caller has no span.
fn under_caller(make: impl FnOnce(&Span) -> Span) -> Span {
    let caller = Span::current();
    match caller.is_none() {
        true => caller,
        false => make(&caller),
    }
}

/// A decision's span (`annals.decide`: one read of the state it decides on) under the
/// caller's, none without one: the events read, the head it read to, whether the state was
/// built from nothing again (a subject erased since a part was kept).
pub(crate) fn decide() -> Span {
    under_caller(|caller| {
        tracing::info_span!(
            target: "annals",
            parent: caller,
            "annals.decide",
            annals.events_read = Empty,
            annals.head = Empty,
            annals.rebuilt = Empty,
        )
    })
}

/// A decision with its append, retried on conflict (`annals.decision`), under the caller's
/// span: the attempts made, and the outcome with the last event's position.
pub(crate) fn decision() -> Span {
    under_caller(|caller| {
        tracing::info_span!(
            target: "annals",
            parent: caller,
            "annals.decision",
            annals.attempts = Empty,
            annals.position = Empty,
            annals.outcome = Empty,
            otel.status_code = Empty,
        )
    })
}
