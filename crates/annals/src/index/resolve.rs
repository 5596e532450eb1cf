//! Query items with their names resolved to ids, and the windows a read scans in chunks.

pub(super) const RECENT_TYPES: usize = 8;
pub(super) const RECENT_TAG_SLOTS: usize = 4;

/// A query item with names turned into ids.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedItem {
    /// None: any type.
    pub(super) types: Option<Ids>,
    pub(super) tags: Ids,
    /// Only positions after this one (0: all); see [`Index::resolve_after`].
    pub(super) after: u64,
}

/// Ids held inline by [`Ids`] before it moves to the heap.
pub(super) const INLINE_IDS: usize = 4;

/// The ids of one query item's types or tags, sorted and without repeats: a few inline (a
/// decision's items name one or two of each), more on the heap. Every read and every append
/// condition resolves its query, and two allocations per item were a tenth of the writer's
/// work on a deciding client's append.
#[derive(Debug, Clone)]
pub(super) enum Ids {
    Inline(u8, [u32; INLINE_IDS]),
    Heap(Vec<u32>),
}

impl Ids {
    pub(super) const EMPTY: Ids = Ids::Inline(0, [0; INLINE_IDS]);

    pub(super) fn push(&mut self, id: u32) {
        match self {
            Ids::Inline(len, ids) if usize::from(*len) < INLINE_IDS => {
                ids[usize::from(*len)] = id;
                *len += 1;
            }
            Ids::Inline(len, ids) => {
                let mut heap = ids[..usize::from(*len)].to_vec();
                heap.push(id);
                *self = Ids::Heap(heap);
            }
            Ids::Heap(heap) => heap.push(id),
        }
    }

    pub(super) fn as_slice(&self) -> &[u32] {
        match self {
            Ids::Inline(len, ids) => &ids[..usize::from(*len)],
            Ids::Heap(heap) => heap,
        }
    }

    /// Sorts by `key` and drops repeated ids (equal ids have equal keys, so they end up side
    /// by side).
    pub(super) fn sort_dedup_by_key(&mut self, key: impl Fn(u32) -> (usize, u32)) {
        let slice = match self {
            Ids::Inline(len, ids) => &mut ids[..usize::from(*len)],
            Ids::Heap(heap) => heap.as_mut_slice(),
        };
        slice.sort_unstable_by_key(|&id| key(id));
        let mut kept = 0;
        for i in 0..slice.len() {
            if kept == 0 || slice[kept - 1] != slice[i] {
                slice[kept] = slice[i];
                kept += 1;
            }
        }
        match self {
            Ids::Inline(len, _) => *len = kept as u8,
            Ids::Heap(heap) => heap.truncate(kept),
        }
    }
}

/// A query with names turned into ids. Items that cannot match (an unknown tag, only unknown
/// types) are dropped.
#[derive(Debug, Clone)]
pub(crate) enum Resolved {
    All,
    Items(Vec<ResolvedItem>),
}

/// Where a chunked search goes on: the next start, when more matches may lie beyond what it
/// returned.
pub(crate) struct Chunk {
    pub(crate) resume: Option<u64>,
}

/// A stretch of positions to search, both ends inclusive, walked upwards or downwards.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) forward: bool,
    /// The first position to look at (the lowest when forward, the highest when backward).
    pub(crate) start: u64,
    /// The last position to look at.
    pub(crate) end: u64,
}

impl Window {
    /// No position lies in it (a start of 0 also marks a finished walk).
    pub(crate) fn is_empty(&self) -> bool {
        if self.forward {
            self.start > self.end || self.start == 0
        } else {
            self.start < self.end || self.start == 0
        }
    }

    pub(super) fn contains(&self, p: u64) -> bool {
        if self.forward {
            p >= self.start && p <= self.end
        } else {
            p <= self.start && p >= self.end
        }
    }

    /// True when `a` comes before `b` in this window's order.
    pub(super) fn before(&self, a: u64, b: u64) -> bool {
        if self.forward {
            a < b
        } else {
            a > b
        }
    }

    pub(super) fn next_after(&self, p: u64) -> u64 {
        if self.forward {
            p + 1
        } else {
            p - 1
        }
    }
}

/// Candidates one item may examine in one chunk before it yields, so that a read holds the index
/// lock only briefly.
pub(super) const SCAN_CAP: usize = 4096;
