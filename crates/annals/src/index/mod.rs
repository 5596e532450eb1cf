//! The in-memory indexes: by type, by tag, the ids of events by position, and each position's
//! place on disk.
//!
//! Derived from the log, never the source of truth: rebuilt by scanning segments, or loaded from
//! a checkpoint. The writer adds events as it stages them (before they are durable); readers
//! therefore clip every answer to the published head they took at their start.
//!
//! Posting lists are sorted vectors of positions, so a query item with tags walks its shortest
//! tag list and checks the others by a galloping search (`ids.rs`); an append condition asks for
//! the first match after a position, a galloping search from the tail and a short walk.

use std::collections::HashMap;

use foldhash::fast::RandomState;

use crate::query::{Query, QueryItem};
use crate::record::EntryLayout;

mod ids;
mod names;
mod resolve;
mod shard;
mod tag_cache;

pub(crate) use ids::*;
pub(crate) use names::*;
pub(crate) use resolve::*;
pub(crate) use shard::*;
pub(crate) use tag_cache::*;

/// A position's place on disk: the segment's number and the entry's offset in it.
pub(crate) fn location(segment: u32, offset: u32) -> u64 {
    (u64::from(segment) << 32) | u64::from(offset)
}

pub(crate) fn split_location(location: u64) -> (u32, u32) {
    ((location >> 32) as u32, location as u32)
}

#[derive(Default)]
pub(crate) struct Index {
    pub(crate) type_ids: NameMap,
    pub(crate) type_names: Vec<NameKey>,
    pub(crate) type_postings: Vec<Vec<u64>>,
    pub(crate) tag_ids: NameMap,
    pub(crate) tag_names: Vec<NameKey>,
    pub(crate) tag_postings: Vec<Vec<u64>>,
    /// The type of each event, by position - 1.
    pub(crate) event_types: Vec<u32>,
    /// Where each event's entry lies, by position - 1.
    pub(crate) locations: Vec<u64>,
    /// The ids of the events that carry one, by position (ascending), for recognising the retry
    /// of a conditional append. An id is not a key: several events may carry the same one.
    pub(crate) ids: IdColumn,
    /// Tracking positions by source, as `(last position of the record that set it, value)`,
    /// oldest first. The writer sets them before the record is acknowledged, so readers see
    /// the newest entry at or below the published head; older entries are pruned once a
    /// newer one is published.
    pub(crate) tracking: Map<Box<str>, Vec<(u64, u64)>>,
    /// A few recently seen types, and the last tag in each of the first tag slots: stores hold
    /// few types, and consecutive events (those of one append, above all) often repeat their
    /// tags; a byte comparison is cheaper than a hash lookup.
    recent_types: [Option<u32>; RECENT_TYPES],
    recent_tags: [CachedTag; RECENT_TAG_SLOTS],
    /// A direct-mapped cache of tag ids in front of `tag_ids`, indexed by the tag's hash: a
    /// store with a large tag table (one tag per order, per customer...) would otherwise pay a
    /// cache miss into that table for every tag of every event, even for the few thousand tags
    /// that recur (accounts, live orders). 64K slots, 2 MiB, allocated on first use, growing
    /// with the tag table to twice as many slots as tags, up to 512K slots (16 MiB): smaller
    /// caches missed often behind the exchange's accounts and live orders, and behind many
    /// tags drawn at random (docs/DECISIONS.md, R15).
    tag_cache: Vec<CachedTag>,
}

impl Index {
    pub(crate) fn len(&self) -> u64 {
        self.locations.len() as u64
    }

    /// Adds one event; positions must arrive in order.
    pub(crate) fn push(
        &mut self,
        position: u64,
        location: u64,
        entry: &[u8],
        layout: &EntryLayout,
    ) {
        self.push_ahead(position, location, entry, layout, &Ahead::NONE);
    }

    /// [`Index::push`] with what [`Index::look_ahead`] found out about the event's tags.
    pub(crate) fn push_ahead(
        &mut self,
        position: u64,
        location: u64,
        entry: &[u8],
        layout: &EntryLayout,
        ahead: &Ahead,
    ) {
        self.push_event(position, location, entry, layout);
        let mut tags = layout.tag_bytes(entry);
        for slot in 0..layout.tag_count as usize {
            let Some((tag, rest)) = crate::record::split_tag(tags) else {
                break;
            };
            tags = rest;
            if let Some(&id) = ahead.ids.get(slot).filter(|&&id| id != Ahead::UNKNOWN) {
                self.tag_postings[id as usize].push(position);
                continue;
            }
            let tag_id = match self.recent_tags.get(slot).and_then(|c| c.id_of(tag)) {
                Some(id) => id,
                None => {
                    let id = self.tag_id(tag);
                    if let Some(cached) = self.recent_tags.get_mut(slot) {
                        *cached = CachedTag::new(tag, id);
                    }
                    id
                }
            };
            self.tag_postings[tag_id as usize].push(position);
        }
    }

    /// Looks ahead at an event that [`Index::push_ahead`] will add a few events from now, so
    /// that the cache misses of its tags overlap the work on the events before it. The
    /// writer indexes whole appends of hundreds of events; each tag costs up to three misses
    /// in a large store (its slot in the tag-id cache, its posting list's header, the list's
    /// tail), one after the other. Each stage starts the loads the next needs:
    /// [`AheadStage::Slot`] fetches the cache slots, [`AheadStage::Header`] reads them for
    /// the tags' ids and fetches the posting-list headers, [`AheadStage::Tail`] reads the
    /// headers and fetches the tails.
    pub(crate) fn look_ahead(
        &self,
        entry: &[u8],
        layout: &EntryLayout,
        stage: AheadStage,
        ahead: &mut Ahead,
    ) {
        if self.tag_cache.is_empty() {
            return;
        }
        let mut tags = layout.tag_bytes(entry);
        for slot in 0..(layout.tag_count as usize).min(AHEAD_TAGS) {
            let Some((tag, rest)) = crate::record::split_tag(tags) else {
                break;
            };
            tags = rest;
            match stage {
                AheadStage::Slot => {
                    if tag.is_empty() || tag.len() > 27 {
                        continue;
                    }
                    let at = self.cache_slot(tag);
                    ahead.slots[slot] = at as u32;
                    prefetch(&self.tag_cache[at]);
                }
                AheadStage::Header => {
                    let at = ahead.slots[slot];
                    if at == Ahead::UNKNOWN {
                        continue;
                    }
                    if let Some(id) = self.tag_cache[at as usize].id_of(tag) {
                        // An interned tag keeps its id: what is found now holds at the push.
                        ahead.ids[slot] = id;
                        prefetch(&self.tag_postings[id as usize]);
                    }
                }
                AheadStage::Tail => {
                    let id = ahead.ids[slot];
                    if id != Ahead::UNKNOWN {
                        let list = &self.tag_postings[id as usize];
                        prefetch(list.as_ptr().wrapping_add(list.len()));
                    }
                }
            }
        }
    }

    fn cache_slot(&self, tag: &[u8]) -> usize {
        self.tag_ids.hash(tag) as usize & (self.tag_cache.len() - 1)
    }

    /// The id of `tag`, interned if new, through the direct-mapped cache.
    fn tag_id(&mut self, tag: &[u8]) -> u32 {
        if tag.is_empty() || tag.len() > 27 {
            return intern(
                &mut self.tag_ids,
                &mut self.tag_names,
                &mut self.tag_postings,
                tag,
            );
        }
        if self.tag_cache.is_empty() {
            self.resize_tag_cache();
        }
        let mut slot = self.cache_slot(tag);
        if let Some(id) = self.tag_cache[slot].id_of(tag) {
            return id;
        }
        let tags = self.tag_names.len();
        let id = intern(
            &mut self.tag_ids,
            &mut self.tag_names,
            &mut self.tag_postings,
            tag,
        );
        if self.tag_names.len() > tags && self.tag_names.len() * 2 > self.tag_cache.len() {
            // A new tag, and the table outgrows the cache: start a larger, empty one.
            self.resize_tag_cache();
            slot = self.cache_slot(tag);
        }
        self.tag_cache[slot] = CachedTag::new(tag, id);
        id
    }

    /// Sizes the tag-id cache to the tag table (see `tag_cache`); a cache that does not grow
    /// is kept as it is. Slots that [`Index::look_ahead`] noted for the old cache only miss
    /// in the new one: the cache never shrinks, so they stay in bounds.
    fn resize_tag_cache(&mut self) {
        let slots = (self.tag_names.len() * 2)
            .next_power_of_two()
            .clamp(TAG_CACHE_SLOTS_MIN, TAG_CACHE_SLOTS_MAX);
        if slots > self.tag_cache.len() {
            // Looked up at random for every tag of every event: on 4 KiB pages nearly every
            // lookup of a large cache would also miss the TLB.
            let mut cache = huge_vec(slots);
            cache.resize(slots, EMPTY_TAG);
            self.tag_cache = cache;
        }
    }

    /// Everything of `push` but the tags: type, location and id. The parallel rebuild indexes
    /// tags on other threads ([`TagShard`]) and adopts them at the end.
    pub(crate) fn push_event(
        &mut self,
        position: u64,
        location: u64,
        entry: &[u8],
        layout: &EntryLayout,
    ) {
        assert_eq!(
            position,
            self.len() + 1,
            "index positions must be gapless and in order"
        );
        let type_name = layout.type_bytes(entry);
        let cached = self
            .recent_types
            .iter()
            .flatten()
            .copied()
            .find(|&id| same_bytes(&self.type_names[id as usize], type_name));
        let type_id = match cached {
            Some(id) => id,
            None => {
                let id = intern(
                    &mut self.type_ids,
                    &mut self.type_names,
                    &mut self.type_postings,
                    type_name,
                );
                let slot = id as usize % RECENT_TYPES;
                self.recent_types[slot] = Some(id);
                id
            }
        };
        self.type_postings[type_id as usize].push(position);
        self.event_types.push(type_id);
        self.locations.push(location);
        if let Some(id) = layout.id(entry) {
            self.ids.push(position, id.as_u128());
        }
    }

    /// Takes over the tags indexed by shards (in shard order), when the index holds none yet.
    pub(crate) fn adopt_tags(&mut self, shards: Vec<TagShard>) {
        assert!(
            self.tag_names.is_empty(),
            "tags are adopted only into an index that has none"
        );
        self.tag_ids
            .reserve(shards.iter().map(|s| s.names.len()).sum::<usize>());
        for shard in shards {
            let base = self.tag_names.len() as u32;
            for (i, name) in shard.names.iter().enumerate() {
                self.tag_ids.insert(name.clone(), base + i as u32);
            }
            self.tag_names.extend(shard.names);
            self.tag_postings.extend(shard.postings);
        }
    }

    /// Starts loading the cache line of `position`'s location (see [`Segment::prefetch`]).
    ///
    /// [`Segment::prefetch`]: crate::segment::Segment::prefetch
    #[inline]
    pub(crate) fn prefetch_location(&self, position: u64) {
        if let Some(slot) = position
            .checked_sub(1)
            .and_then(|i| self.locations.get(i as usize))
        {
            crate::segment::prefetch(slot);
        }
    }

    pub(crate) fn location_of(&self, position: u64) -> Option<u64> {
        self.locations
            .get(usize::try_from(position.checked_sub(1)?).ok()?)
            .copied()
    }

    /// The id of the event at `position`, if it carries one.
    pub(crate) fn id_at(&self, position: u64) -> Option<u128> {
        self.ids.get(position)
    }

    /// The first `max` positions after `after` (staged events included) that match `query`,
    /// fewer when there are not so many.
    pub(crate) fn first_matches_after(&self, query: &Query, after: u64, max: usize) -> Vec<u64> {
        let resolved = self.resolve_after(query, &[]);
        let mut out = Vec::with_capacity(max.min(1024));
        let mut window = Window {
            forward: true,
            start: after.saturating_add(1),
            end: self.len(),
        };
        while out.len() < max && !window.is_empty() {
            match self
                .collect(&resolved, window, max - out.len(), &mut out)
                .resume
            {
                Some(next) => window.start = next,
                None => break,
            }
        }
        out
    }

    /// Checks that the index holds the event at `position` as the log does: its type, and the
    /// position in the postings of each of its tags. Why not, when it does not.
    pub(crate) fn check_event<'a>(
        &self,
        position: u64,
        event_type: &str,
        tags: impl Iterator<Item = &'a str>,
    ) -> Result<(), String> {
        let at = usize::try_from(position - 1).map_err(|e| e.to_string())?;
        let type_id = self
            .event_types
            .get(at)
            .ok_or_else(|| format!("the index has no event at position {position}"))?;
        let indexed = self
            .type_names
            .get(*type_id as usize)
            .map(|n| n.as_bytes())
            .unwrap_or(&[]);
        if indexed != event_type.as_bytes() {
            return Err(format!(
                "position {position}: the log says type {event_type:?}, the index {:?}",
                String::from_utf8_lossy(indexed)
            ));
        }
        if self.type_postings[*type_id as usize]
            .binary_search(&position)
            .is_err()
        {
            return Err(format!(
                "position {position} is missing from its type's postings"
            ));
        }
        for tag in tags {
            let found = self.tag_ids.get(tag.as_bytes()).is_some_and(|&id| {
                self.tag_postings[id as usize]
                    .binary_search(&position)
                    .is_ok()
            });
            if !found {
                return Err(format!("position {position}: tag {tag:?} is not indexed"));
            }
        }
        Ok(())
    }

    /// Records that the append ending at `at` set `source` to `value`. `published` is the
    /// published head: entries hidden behind a newer published one are dropped.
    pub(crate) fn set_tracking(&mut self, source: &str, at: u64, value: u64, published: u64) {
        let history = match self.tracking.get_mut(source) {
            Some(h) => h,
            None => self.tracking.entry(source.into()).or_default(),
        };
        history.push((at, value));
        if let Some(visible) = history.iter().rposition(|&(a, _)| a <= published) {
            history.drain(..visible);
        }
    }

    /// The tracking position of `source` as of the published head `head`.
    pub(crate) fn tracking(&self, source: &str, head: u64) -> Option<u64> {
        let history = self.tracking.get(source)?;
        history
            .iter()
            .rev()
            .find(|&&(at, _)| at <= head)
            .map(|&(_, value)| value)
    }

    /// The newest tracking position of `source`, acknowledged or not: what the writer checks a
    /// new one against.
    pub(crate) fn tracking_staged(&self, source: &str) -> Option<u64> {
        self.tracking.get(source)?.last().map(|&(_, value)| value)
    }

    /// Bytes held by the index structures (capacity, not just length).
    pub(crate) fn bytes_used(&self) -> usize {
        self.bytes(true)
    }

    /// Bytes per event of what the index holds, counted by length rather than capacity: the
    /// same log gives the same figure whether its index was read from a checkpoint or rebuilt
    /// from the log, whose vectors grow differently. `Stats` and `annals verify` both report
    /// this one.
    pub(crate) fn bytes_per_event(&self) -> f64 {
        match self.len() {
            0 => 0.0,
            events => self.bytes(false) as f64 / events as f64,
        }
    }

    /// The index structures' bytes: their capacity when `held`, their length otherwise.
    fn bytes(&self, held: bool) -> usize {
        let size = |len: usize, capacity: usize| if held { capacity } else { len };
        let names = |names: &Vec<NameKey>| -> usize {
            let heap = |n: &NameKey| match n {
                NameKey::Heap(b) => b.len(),
                NameKey::Inline { .. } => 0,
            };
            // Each name is in the vector and in the map (key, id and a control byte).
            names.iter().map(|n| 2 * heap(n)).sum::<usize>()
                + size(names.len(), names.capacity()) * size_of::<NameKey>()
                + names.len() * (size_of::<NameKey>() + 4 + 1) * 8 / 7
        };
        let postings = |lists: &Vec<Vec<u64>>| -> usize {
            lists
                .iter()
                .map(|l| size(l.len(), l.capacity()) * 8 + 24)
                .sum::<usize>()
        };
        names(&self.type_names)
            + names(&self.tag_names)
            + postings(&self.type_postings)
            + postings(&self.tag_postings)
            + size(self.event_types.len(), self.event_types.capacity()) * 4
            + size(self.locations.len(), self.locations.capacity()) * 8
            + self.ids.bytes(held)
    }

    /// How many events through `head` carry `tag` (a binary search in its postings).
    pub(crate) fn tag_events_through(&self, tag: &str, head: u64) -> u64 {
        self.tag_ids.get(tag.as_bytes()).map_or(0, |&id| {
            self.tag_postings[id as usize].partition_point(|&p| p <= head) as u64
        })
    }

    pub(crate) fn tag_count(&self) -> usize {
        self.tag_names.len()
    }

    pub(crate) fn type_count(&self) -> usize {
        self.type_names.len()
    }

    /// The query with its names turned into ids, item `i` matching only positions after
    /// `afters[i]` (0, or no entry: all of them). A decision that already holds some of its
    /// projections' states up to a position reads only what came after it for those.
    pub(crate) fn resolve_after(&self, query: &Query, afters: &[u64]) -> Resolved {
        if query.matches_all() {
            return Resolved::All;
        }
        let mut items = Vec::with_capacity(query.items.len());
        for (i, item) in query.items.iter().enumerate() {
            let after = afters.get(i).copied().unwrap_or(0);
            if let Some(resolved) = self.resolve_item(item, after) {
                items.push(resolved);
            }
        }
        Resolved::Items(items)
    }

    /// One query item with its names turned into ids; None when it cannot match (a tag, or
    /// every type, unknown).
    fn resolve_item(&self, item: &QueryItem, after: u64) -> Option<ResolvedItem> {
        let types = if item.types.is_empty() {
            None
        } else {
            let mut ids = Ids::EMPTY;
            for t in &item.types {
                if let Some(&id) = self.type_ids.get(t.as_bytes()) {
                    ids.push(id);
                }
            }
            // Only unknown types: nothing can match.
            ids.as_slice().first()?;
            ids.sort_dedup_by_key(|id| (0, id));
            Some(ids)
        };
        let mut tags = Ids::EMPTY;
        for tag in &item.tags {
            tags.push(*self.tag_ids.get(tag.as_bytes())?);
        }
        // Shortest list first: it drives the walk.
        tags.sort_dedup_by_key(|t| (self.tag_postings[t as usize].len(), t));
        Some(ResolvedItem { types, tags, after })
    }

    /// Appends to `out` up to `max` positions matching `resolved` in `window`, in window order.
    pub(crate) fn collect(
        &self,
        resolved: &Resolved,
        window: Window,
        max: usize,
        out: &mut Vec<u64>,
    ) -> Chunk {
        let end = self.len();
        let window = Window {
            end: if window.forward {
                window.end.min(end)
            } else {
                window.end.max(1)
            },
            start: if window.forward {
                window.start.max(1)
            } else {
                window.start.min(end)
            },
            ..window
        };
        if window.is_empty() || max == 0 {
            return Chunk { resume: None };
        }
        let items = match resolved {
            Resolved::All => {
                let mut p = window.start;
                while out.len() < max && window.contains(p) {
                    out.push(p);
                    if p == window.end {
                        return Chunk { resume: None };
                    }
                    p = window.next_after(p);
                }
                return Chunk { resume: Some(p) };
            }
            Resolved::Items(items) => items,
        };
        let base = out.len();
        // The frontier is the last position up to which every item's answer is complete.
        let mut frontier: Option<u64> = None;
        for item in items {
            let item_frontier = self.collect_item(item, window, max, out);
            if let Some(f) = item_frontier {
                frontier = Some(match frontier {
                    Some(g) if window.before(g, f) => g,
                    _ => f,
                });
            }
        }
        let found = &mut out[base..];
        if window.forward {
            found.sort_unstable();
        } else {
            found.sort_unstable_by(|a, b| b.cmp(a));
        }
        let mut kept = base;
        for i in base..out.len() {
            let p = out[i];
            if kept > base && out[kept - 1] == p {
                continue;
            }
            if let Some(f) = frontier {
                if window.before(f, p) {
                    break;
                }
            }
            out[kept] = p;
            kept += 1;
            if kept - base == max {
                break;
            }
        }
        out.truncate(kept);
        if kept - base == max {
            let last = out[kept - 1];
            let more = last != window.end;
            return Chunk {
                resume: more.then(|| window.next_after(last)),
            };
        }
        match frontier {
            Some(f) if f != window.end => Chunk {
                resume: Some(window.next_after(f)),
            },
            _ => Chunk { resume: None },
        }
    }

    /// One item's matches; returns the frontier if it stopped before the window's end.
    fn collect_item(
        &self,
        item: &ResolvedItem,
        window: Window,
        max: usize,
        out: &mut Vec<u64>,
    ) -> Option<u64> {
        let mut window = window;
        if item.after > 0 {
            // The item's own lower bound narrows the window; past it, the item has nothing to
            // add and does not hold the others back.
            if window.forward {
                window.start = window.start.max(item.after + 1);
            } else {
                window.end = window.end.max(item.after + 1);
            }
            if window.is_empty() {
                return None;
            }
        }
        if let Some((&driver, rest)) = item.tags.as_slice().split_first() {
            let list = &self.tag_postings[driver as usize];
            return self.walk(list, window, max, out, |p| self.holds(item, rest, p));
        }
        match &item.types {
            Some(types) => {
                let mut frontier: Option<u64> = None;
                for &t in types.as_slice() {
                    let list = &self.type_postings[t as usize];
                    if let Some(f) = self.walk(list, window, max, out, |_| true) {
                        frontier = Some(match frontier {
                            Some(g) if window.before(g, f) => g,
                            _ => f,
                        });
                    }
                }
                frontier
            }
            // An item with no types and no tags is resolved as `All` before we get here.
            None => None,
        }
    }

    /// Whether the event at `position`, found in the item's driving tag list, matches the
    /// item: one of its types, and the `rest` of its tags.
    fn holds(&self, item: &ResolvedItem, rest: &[u32], position: u64) -> bool {
        self.type_matches(item, position)
            && rest.iter().all(|&t| {
                self.tag_postings[t as usize]
                    .binary_search(&position)
                    .is_ok()
            })
    }

    fn type_matches(&self, item: &ResolvedItem, position: u64) -> bool {
        match &item.types {
            None => true,
            Some(types) => self
                .event_types
                .get((position - 1) as usize)
                .is_some_and(|t| types.as_slice().binary_search(t).is_ok()),
        }
    }

    /// Walks a sorted posting list through the window; returns the frontier when it stopped
    /// early (full, or the scan cap reached).
    fn walk(
        &self,
        list: &[u64],
        window: Window,
        max: usize,
        out: &mut Vec<u64>,
        accept: impl Fn(u64) -> bool,
    ) -> Option<u64> {
        if window.forward {
            let from = first_at_least(list, window.start);
            Self::walk_in(list[from..].iter().copied(), window, max, out, accept)
        } else {
            let to = first_at_least(list, window.start.saturating_add(1));
            Self::walk_in(list[..to].iter().rev().copied(), window, max, out, accept)
        }
    }

    /// The walk itself, over candidates already in window order.
    fn walk_in(
        candidates: impl Iterator<Item = u64>,
        window: Window,
        max: usize,
        out: &mut Vec<u64>,
        accept: impl Fn(u64) -> bool,
    ) -> Option<u64> {
        let mut found = 0;
        for (scanned, p) in candidates.enumerate() {
            if window.before(window.end, p) {
                return None;
            }
            if accept(p) {
                out.push(p);
                found += 1;
                if found == max {
                    return Some(p);
                }
            }
            if scanned + 1 >= SCAN_CAP {
                return Some(p);
            }
        }
        None
    }

    /// The check of an append condition: the first position after `after` (staged events
    /// included) that matches `query`. Resolves and walks one item at a time, allocating
    /// nothing: the writer runs it for every conditional append, between one fdatasync and the
    /// next.
    pub(crate) fn first_query_match_after(&self, query: &Query, after: u64) -> Option<u64> {
        if query.matches_all() {
            return (after < self.len()).then(|| after + 1);
        }
        query
            .items
            .iter()
            .filter_map(|item| self.first_item_match_after(&self.resolve_item(item, 0)?, after))
            .min()
    }

    /// The first position after `after` (and after the item's own bound) matching `item`:
    /// its driving list walked from there on, or each of its types' lists looked up.
    fn first_item_match_after(&self, item: &ResolvedItem, after: u64) -> Option<u64> {
        let from = after.max(item.after).checked_add(1)?;
        let end = self.len();
        let tags = item.tags.as_slice();
        if let Some((&driver, rest)) = tags.split_first() {
            let list = &self.tag_postings[driver as usize];
            return list[first_at_least(list, from)..]
                .iter()
                .copied()
                .take_while(|&p| p <= end)
                .find(|&p| self.holds(item, rest, p));
        }
        item.types
            .as_ref()?
            .as_slice()
            .iter()
            .filter_map(|&t| {
                let list = &self.type_postings[t as usize];
                list.get(first_at_least(list, from))
                    .copied()
                    .filter(|&p| p <= end)
            })
            .min()
    }
}

/// A vector with room for `capacity` elements whose memory the kernel is asked to back with
/// huge pages: the big per-event arrays of the index are filled at open, and faulting them in
/// 4 KiB at a time (each page zeroed) costs more than reading them.
pub(crate) fn huge_vec<T>(capacity: usize) -> Vec<T> {
    const HUGE: usize = 2 << 20;
    let mut v = Vec::with_capacity(capacity);
    let start = v.as_mut_ptr() as usize;
    let end = start + capacity * size_of::<T>();
    let aligned_start = start.next_multiple_of(HUGE);
    let aligned_end = end - end % HUGE;
    if aligned_end > aligned_start {
        // SAFETY: the range lies inside the vector's own allocation, and MADV_HUGEPAGE only
        // advises the kernel how to back it; it changes no contents and no permissions.
        unsafe {
            libc::madvise(
                aligned_start as *mut libc::c_void,
                aligned_end - aligned_start,
                libc::MADV_HUGEPAGE,
            );
        }
    }
    v
}

/// The lock around the index: many readers, one writer (the writer thread, for a few
/// microseconds per append). A futex lock that spins briefly and then sleeps: parking_lot's
/// `RwLock` calls `sched_yield` up to seven times before it parks, a visible share of the CPU
/// with many deciding clients on two cores (docs/DECISIONS.md, R16).
#[derive(Default)]
pub(crate) struct IndexLock(std::sync::RwLock<Index>);

impl IndexLock {
    pub(crate) fn new(index: Index) -> Self {
        IndexLock(std::sync::RwLock::new(index))
    }

    pub(crate) fn read(&self) -> IndexRead<'_> {
        // A panic while the writer held the lock poisons the store; the index itself is only
        // ever read after that, so the lock's own poison flag adds nothing.
        let guard = self.0.read().unwrap_or_else(|e| e.into_inner());
        held::enter();
        IndexRead(guard)
    }

    pub(crate) fn write(&self) -> IndexWrite<'_> {
        let guard = self.0.write().unwrap_or_else(|e| e.into_inner());
        held::enter();
        IndexWrite(guard)
    }
}

/// The index, read; counts as held on this thread until dropped (see [`held_here`]).
pub(crate) struct IndexRead<'a>(std::sync::RwLockReadGuard<'a, Index>);

/// The index, written; counts as held on this thread until dropped (see [`held_here`]).
pub(crate) struct IndexWrite<'a>(std::sync::RwLockWriteGuard<'a, Index>);

impl std::ops::Deref for IndexRead<'_> {
    type Target = Index;
    fn deref(&self) -> &Index {
        &self.0
    }
}

impl std::ops::Deref for IndexWrite<'_> {
    type Target = Index;
    fn deref(&self) -> &Index {
        &self.0
    }
}

impl std::ops::DerefMut for IndexWrite<'_> {
    fn deref_mut(&mut self) -> &mut Index {
        &mut self.0
    }
}

impl Drop for IndexRead<'_> {
    fn drop(&mut self) {
        held::leave();
    }
}

impl Drop for IndexWrite<'_> {
    fn drop(&mut self) {
        held::leave();
    }
}

/// Whether this thread holds the index lock: the writer's I/O asserts it does not (no lock
/// across I/O: readers would wait for a disk). Counted in debug builds only; always false in
/// release.
pub(crate) fn held_here() -> bool {
    held::count() > 0
}

#[cfg(debug_assertions)]
mod held {
    use std::cell::Cell;

    thread_local! {
        static HELD: Cell<u32> = const { Cell::new(0) };
    }

    pub(super) fn enter() {
        HELD.with(|h| h.set(h.get() + 1));
    }

    pub(super) fn leave() {
        HELD.with(|h| h.set(h.get() - 1));
    }

    pub(super) fn count() -> u32 {
        HELD.with(Cell::get)
    }
}

#[cfg(not(debug_assertions))]
mod held {
    pub(super) fn enter() {}
    pub(super) fn leave() {}
    pub(super) fn count() -> u32 {
        0
    }
}

#[cfg(test)]
mod tests;
