//! Explicit limits on everything a client controls. Each is enforced with a typed
//! [`crate::InputError`] and tested on both sides.

/// Limits on what one append, one event and one query may hold.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes of data plus metadata in one event.
    pub event_bytes_max: usize,
    /// Events in one append.
    pub events_per_append_max: usize,
    /// Encoded bytes of one append (one record on disk).
    pub append_bytes_max: usize,
    /// Tags on one event.
    pub tags_per_event_max: usize,
    /// Bytes in one tag.
    pub tag_bytes_max: usize,
    /// Bytes in one event type.
    pub type_bytes_max: usize,
    /// Items in one query. As many as events in one append by default: recorders that guard
    /// each event of an append with a query item of its own (the Python eventsourcing
    /// library's do) must fit.
    pub query_items_max: usize,
    /// Types, and separately tags, in one query item.
    pub query_item_values_max: usize,
    /// Appends waiting for the writer; a full queue applies backpressure.
    pub queue_depth_max: usize,
    /// Bytes of one snapshot's state ([`crate::snapshot`]).
    pub snapshot_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            event_bytes_max: 1 << 20,
            events_per_append_max: 10_000,
            append_bytes_max: 16 << 20,
            tags_per_event_max: 32,
            tag_bytes_max: 256,
            type_bytes_max: 256,
            query_items_max: 10_000,
            query_item_values_max: 64,
            queue_depth_max: 4096,
            snapshot_bytes_max: 16 << 20,
        }
    }
}
