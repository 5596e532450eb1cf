//! A direct-mapped cache of tag ids, and the prefetching look-ahead the writer uses to stage
//! an event's tags without waiting on one cache miss after another.

pub(super) const TAG_CACHE_SLOTS_MIN: usize = 1 << 16;
pub(super) const TAG_CACHE_SLOTS_MAX: usize = 1 << 19;

/// One slot of `Index::tag_cache`: a tag of up to 27 bytes and its id.
#[derive(Clone, Copy)]
pub(super) struct CachedTag {
    pub(super) len: u8,
    pub(super) bytes: [u8; 27],
    pub(super) id: u32,
}

pub(super) const EMPTY_TAG: CachedTag = CachedTag {
    len: 0,
    bytes: [0; 27],
    id: 0,
};

impl Default for CachedTag {
    fn default() -> Self {
        EMPTY_TAG
    }
}

impl CachedTag {
    /// `tag` and its id; a tag too long to keep never matches.
    pub(super) fn new(tag: &[u8], id: u32) -> CachedTag {
        if tag.is_empty() || tag.len() > 27 {
            return EMPTY_TAG;
        }
        let mut bytes = [0; 27];
        bytes[..tag.len()].copy_from_slice(tag);
        CachedTag {
            len: tag.len() as u8,
            bytes,
            id,
        }
    }

    /// The id, when this slot holds `tag` (compared in place: no trip to the tag table).
    pub(super) fn id_of(&self, tag: &[u8]) -> Option<u32> {
        (self.len != 0 && usize::from(self.len) == tag.len() && self.bytes[..tag.len()] == *tag)
            .then_some(self.id)
    }
}

/// Tags per event that [`Index::look_ahead`] prepares.
pub(super) const AHEAD_TAGS: usize = 4;

/// What [`Index::look_ahead`] learnt about an event's first tags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ahead {
    pub(super) slots: [u32; AHEAD_TAGS],
    pub(super) ids: [u32; AHEAD_TAGS],
}

impl Ahead {
    pub(super) const UNKNOWN: u32 = u32::MAX;
    pub(crate) const NONE: Ahead = Ahead {
        slots: [Self::UNKNOWN; AHEAD_TAGS],
        ids: [Self::UNKNOWN; AHEAD_TAGS],
    };
}

/// The stages of [`Index::look_ahead`], in the order an event goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AheadStage {
    Slot,
    Header,
    Tail,
}

/// Asks the CPU to start loading the cache line holding `p`: a hint that never faults.
#[inline(always)]
pub(super) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and cannot fault, whatever the
    // address; SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
