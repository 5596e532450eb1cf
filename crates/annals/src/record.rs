//! The on-disk framing of the log: records of events.
//!
//! One append is one record, so a multi-event append is atomic: a torn record fails its CRC and
//! disappears whole. Layout (all integers little-endian), records aligned to 8 bytes:
//!
//! ```text
//! record header (48 bytes)
//!   0  magic u32 = "ANRC"        4  version u8      5  kind u8      6  flags u16 (0)
//!   8  body_len u32              12 crc32c u32 over body ++ bytes [0..12) ++ [16..48)
//!   16 first_position u64        24 synced_through u64
//!   32 event_count u32           36 trailer_len u32
//!   40 appended_at_us u64
//! body: event_count entries, back to back, then trailer_len bytes of trailer
//! trailer (only when the append carries tracking): source_len u16, source, position u64
//! entry (24 fixed bytes, then the variable parts)
//!   0  entry_len u32             4  record_offset u32 (from the record's start to this entry)
//!   8  type_len u16              10 tag_count u16
//!   12 data_len u32              16 metadata_len u32
//!   20 flags u8 (bit 0: id present, bit 1: sealed)   21 reserved [u8; 3] (0)
//!   24 id [u8; 16] if present, type, tags (each u16 length + bytes), metadata, data
//! ```
//!
//! `synced_through` is a position the log was known to be durable through when the record was
//! written (a lower bound). Recovery uses it to tell a torn tail from damage: if a valid record
//! after a bad one says the bad one's position was already synced, the bad one is damage.
//! Decoders never panic and never trust a length.

use std::ops::Range;

use bytes::Bytes;
use uuid::Uuid;

use crate::error::InputError;
use crate::event::NewEvent;
use crate::limits::Limits;

pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"ANRC");
pub const RECORD_VERSION: u8 = 1;
pub const KIND_EVENTS: u8 = 1;
pub const HEADER_BYTES: usize = 48;
pub const ENTRY_FIXED_BYTES: usize = 24;
const FLAG_ID: u8 = 1;
/// The entry's metadata and data are a data subject's, sealed (`seal.rs`): the data field
/// holds the envelope, the metadata field is empty.
pub(crate) const FLAG_SEALED: u8 = 2;

/// Rounds a record length up to the 8-byte alignment of records in a segment.
pub fn aligned(len: usize) -> usize {
    (len + 7) & !7
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// One append's events, encoded and checked by the caller's thread before it is queued.
/// Position-independent: the writer only adds a header.
#[derive(Debug)]
pub struct EncodedAppend {
    pub body: Vec<u8>,
    pub body_crc: u32,
    pub event_count: u32,
    /// Every event carries an id, so that a failed condition may be recognised as the retry of
    /// an append already stored (see the writer's retry check).
    pub all_ids: bool,
    /// Bytes at the end of `body` that hold the tracking trailer (0 without tracking).
    pub trailer_len: u32,
}

impl EncodedAppend {
    /// The entries, without the trailer.
    pub fn entries(&self) -> &[u8] {
        &self.body[..self.body.len() - self.trailer_len as usize]
    }

    /// The tracking the append carries, if any.
    pub fn tracking(&self) -> Option<(&str, u64)> {
        decode_trailer(&self.body[self.body.len() - self.trailer_len as usize..])
    }
}

impl EncodedAppend {
    /// Rebuilds an append from a body stored elsewhere (a database row), checking that it
    /// holds `event_count` well-formed entries followed by an empty or valid tracking
    /// trailer.
    pub(crate) fn from_stored(body: Vec<u8>, event_count: u32) -> Result<EncodedAppend, String> {
        if event_count == 0 {
            return Err("an append without events".into());
        }
        let mut entries_len = 0;
        let mut all_ids = true;
        let mut seen = 0;
        for (offset, entry, layout) in Entries::new(&body, event_count).take(event_count as usize) {
            entries_len = offset + entry.len();
            all_ids &= layout.id(entry).is_some();
            seen += 1;
        }
        if seen != event_count {
            return Err(format!("{seen} well-formed entries of {event_count}"));
        }
        let trailer = &body[entries_len..];
        if !trailer.is_empty() && decode_trailer(trailer).is_none() {
            return Err("a malformed tracking trailer".into());
        }
        Ok(EncodedAppend {
            body_crc: crc32c::crc32c(&body),
            trailer_len: trailer.len() as u32,
            body,
            event_count,
            all_ids,
        })
    }
}

/// Decodes a tracking trailer: the source and its position. None when empty or malformed.
pub fn decode_trailer(trailer: &[u8]) -> Option<(&str, u64)> {
    let len = u16_at(trailer, 0)? as usize;
    let source = std::str::from_utf8(trailer.get(2..2 + len)?).ok()?;
    let position = u64_at(trailer, 2 + len)?;
    (trailer.len() == 2 + len + 8 && !source.is_empty()).then_some((source, position))
}

pub(crate) fn has_control(s: &str) -> bool {
    // One pass over the bytes settles the common case, printable ASCII; anything else (a
    // control byte, or a byte of a multi-byte character) is judged by characters.
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return false;
    }
    s.chars().any(char::is_control)
}

/// Validates `events` against `limits` and encodes them as a record body, with the tracking
/// source and position, if any, in a trailer of the same record.
pub fn encode_append_tracked(
    events: &[NewEvent],
    tracking: Option<(&str, u64)>,
    limits: &Limits,
) -> Result<EncodedAppend, InputError> {
    if let Some((source, _)) = tracking {
        if source.is_empty() || source.len() > limits.tag_bytes_max || has_control(source) {
            return Err(InputError::InvalidTrackingSource {
                name: source.to_owned(),
                max: limits.tag_bytes_max,
            });
        }
    }
    if events.is_empty() {
        return Err(InputError::NoEvents);
    }
    if events.len() > limits.events_per_append_max {
        return Err(InputError::TooManyEvents {
            count: events.len(),
            max: limits.events_per_append_max,
        });
    }
    let mut total = HEADER_BYTES;
    for (index, event) in events.iter().enumerate() {
        total += validate_event(index, event, limits)?;
        if total > limits.append_bytes_max {
            return Err(InputError::AppendTooLarge {
                bytes: total,
                max: limits.append_bytes_max,
            });
        }
    }
    let all_ids = events.iter().all(|e| stored_id(e).is_some());
    let mut body = Vec::with_capacity(total - HEADER_BYTES);
    for event in events {
        encode_entry(&mut body, event);
    }
    let entries_len = body.len();
    if let Some((source, position)) = tracking {
        body.extend_from_slice(&(source.len() as u16).to_le_bytes());
        body.extend_from_slice(source.as_bytes());
        body.extend_from_slice(&position.to_le_bytes());
    }
    let body_crc = crc32c::crc32c(&body);
    Ok(EncodedAppend {
        trailer_len: (body.len() - entries_len) as u32,
        body,
        body_crc,
        event_count: events.len() as u32,
        all_ids,
    })
}

/// The id an event is stored with: the nil UUID, which clients send for an event without one,
/// means no id.
pub(crate) fn stored_id(event: &NewEvent) -> Option<Uuid> {
    event.id.filter(|id| !id.is_nil())
}

/// Checks one event and returns its encoded length.
pub(crate) fn validate_event(
    index: usize,
    event: &NewEvent,
    limits: &Limits,
) -> Result<usize, InputError> {
    validate_type(index, &event.event_type, limits)?;
    let type_len = event.event_type.len();
    if event.tags.len() > limits.tags_per_event_max {
        return Err(InputError::TooManyTags {
            index,
            count: event.tags.len(),
            max: limits.tags_per_event_max,
        });
    }
    let mut tags_len = 0;
    for (i, tag) in event.tags.iter().enumerate() {
        validate_tag(index, tag, limits)?;
        if event.tags[..i].contains(tag) {
            return Err(InputError::DuplicateTag {
                index,
                tag: tag.clone(),
            });
        }
        tags_len += 2 + tag.len();
    }
    let payload = event.data.len() + event.metadata.len();
    if payload > limits.event_bytes_max {
        return Err(InputError::EventTooLarge {
            index,
            bytes: payload,
            max: limits.event_bytes_max,
        });
    }
    let id_len = if stored_id(event).is_some() { 16 } else { 0 };
    Ok(ENTRY_FIXED_BYTES + id_len + type_len + tags_len + payload)
}

/// Checks an event type against the limits.
pub(crate) fn validate_type(
    index: usize,
    event_type: &str,
    limits: &Limits,
) -> Result<(), InputError> {
    let type_len = event_type.len();
    if type_len == 0 {
        return Err(InputError::EmptyType { index });
    }
    if type_len > limits.type_bytes_max {
        return Err(InputError::TypeTooLong {
            index,
            bytes: type_len,
            max: limits.type_bytes_max,
        });
    }
    if has_control(event_type) {
        return Err(InputError::ControlCharacter {
            what: "event type",
            value: event_type.to_owned(),
        });
    }
    Ok(())
}

/// Checks one tag against the limits (shared by appends and queries).
pub fn validate_tag(index: usize, tag: &str, limits: &Limits) -> Result<(), InputError> {
    if tag.is_empty() {
        return Err(InputError::EmptyTag { index });
    }
    if tag.len() > limits.tag_bytes_max {
        return Err(InputError::TagTooLong {
            index,
            bytes: tag.len(),
            max: limits.tag_bytes_max,
        });
    }
    if has_control(tag) {
        return Err(InputError::ControlCharacter {
            what: "tag",
            value: tag.to_owned(),
        });
    }
    Ok(())
}

pub(crate) fn encode_entry(body: &mut Vec<u8>, event: &NewEvent) {
    let start = body.len();
    let record_offset = (HEADER_BYTES + start) as u32;
    body.extend_from_slice(&0u32.to_le_bytes()); // entry_len, patched below
    body.extend_from_slice(&record_offset.to_le_bytes());
    body.extend_from_slice(&(event.event_type.len() as u16).to_le_bytes());
    body.extend_from_slice(&(event.tags.len() as u16).to_le_bytes());
    body.extend_from_slice(&(event.data.len() as u32).to_le_bytes());
    body.extend_from_slice(&(event.metadata.len() as u32).to_le_bytes());
    let id = stored_id(event);
    let flags = if id.is_some() { FLAG_ID } else { 0 };
    body.extend_from_slice(&[flags, 0, 0, 0]);
    if let Some(id) = id {
        body.extend_from_slice(id.as_bytes());
    }
    body.extend_from_slice(event.event_type.as_bytes());
    for tag in &event.tags {
        body.extend_from_slice(&(tag.len() as u16).to_le_bytes());
        body.extend_from_slice(tag.as_bytes());
    }
    body.extend_from_slice(&event.metadata);
    body.extend_from_slice(&event.data);
    let entry_len = (body.len() - start) as u32;
    body[start..start + 4].copy_from_slice(&entry_len.to_le_bytes());
}

/// The fields of a record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub body_len: u32,
    pub crc: u32,
    pub first_position: u64,
    pub synced_through: u64,
    pub event_count: u32,
    pub trailer_len: u32,
    pub appended_at_us: u64,
}

impl RecordHeader {
    /// The part of a record body that holds entries.
    pub fn entries<'a>(&self, body: &'a [u8]) -> &'a [u8] {
        body.get(..body.len().saturating_sub(self.trailer_len as usize))
            .unwrap_or(&[])
    }

    /// The tracking trailer of a record body (empty when there is none).
    pub fn trailer<'a>(&self, body: &'a [u8]) -> &'a [u8] {
        body.get(body.len().saturating_sub(self.trailer_len as usize)..)
            .unwrap_or(&[])
    }

    /// Bytes the record takes in a segment, padding included.
    pub fn stored_len(&self) -> usize {
        aligned(HEADER_BYTES + self.body_len as usize)
    }

    pub fn last_position(&self) -> u64 {
        self.first_position + u64::from(self.event_count) - 1
    }

    /// Writes the header for `append`, computing the record CRC from the body's.
    pub fn encode(
        out: &mut [u8; HEADER_BYTES],
        append: &EncodedAppend,
        first_position: u64,
        synced_through: u64,
        appended_at_us: u64,
    ) {
        out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        out[4] = RECORD_VERSION;
        out[5] = KIND_EVENTS;
        out[6..8].copy_from_slice(&0u16.to_le_bytes());
        out[8..12].copy_from_slice(&(append.body.len() as u32).to_le_bytes());
        out[16..24].copy_from_slice(&first_position.to_le_bytes());
        out[24..32].copy_from_slice(&synced_through.to_le_bytes());
        out[32..36].copy_from_slice(&append.event_count.to_le_bytes());
        out[36..40].copy_from_slice(&append.trailer_len.to_le_bytes());
        out[40..48].copy_from_slice(&appended_at_us.to_le_bytes());
        let crc = header_crc(out, append.body_crc);
        out[12..16].copy_from_slice(&crc.to_le_bytes());
    }
}

/// The record CRC runs over the body first, then the header without its CRC field: the
/// caller's thread computes the body's CRC, and the writer only extends it over 44 bytes.
fn header_crc(header: &[u8], body_crc: u32) -> u32 {
    let crc = crc32c::crc32c_append(body_crc, &header[0..12]);
    crc32c::crc32c_append(crc, &header[16..HEADER_BYTES])
}

/// What lies at an offset of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A record whose header is well formed (the CRC is checked separately).
    Record(RecordHeader),
    /// Zeros: the end of the written part of the segment.
    End,
    /// Not a record: garbage or a torn write.
    Invalid(&'static str),
}

/// Reads the header at the start of `bytes` (which may be shorter than a header at the end of
/// a file).
pub fn decode_header(bytes: &[u8]) -> Frame {
    let Some(head) = bytes.get(..HEADER_BYTES) else {
        return if bytes.iter().all(|&b| b == 0) {
            Frame::End
        } else {
            Frame::Invalid("truncated header")
        };
    };
    let magic = u32_at(head, 0).unwrap_or(0);
    if magic != RECORD_MAGIC {
        return if head.iter().all(|&b| b == 0) {
            Frame::End
        } else {
            Frame::Invalid("bad magic")
        };
    }
    if head[4] != RECORD_VERSION {
        return Frame::Invalid("unknown record version");
    }
    if head[5] != KIND_EVENTS || head[6] != 0 || head[7] != 0 {
        return Frame::Invalid("unknown record kind or flags");
    }
    let (
        Some(body_len),
        Some(crc),
        Some(first),
        Some(synced),
        Some(count),
        Some(trailer_len),
        Some(at),
    ) = (
        u32_at(head, 8),
        u32_at(head, 12),
        u64_at(head, 16),
        u64_at(head, 24),
        u32_at(head, 32),
        u32_at(head, 36),
        u64_at(head, 40),
    )
    else {
        return Frame::Invalid("truncated header");
    };
    if count == 0 || first == 0 || synced >= first {
        return Frame::Invalid("impossible positions in header");
    }
    if (body_len as usize) < count as usize * ENTRY_FIXED_BYTES + trailer_len as usize {
        return Frame::Invalid("body too short for its event count");
    }
    Frame::Record(RecordHeader {
        body_len,
        crc,
        first_position: first,
        synced_through: synced,
        event_count: count,
        trailer_len,
        appended_at_us: at,
    })
}

/// Checks a whole record (header and body, without padding) against its CRC.
pub fn crc_matches(record: &[u8], header: &RecordHeader) -> bool {
    if crate::canary::on(crate::canary::Canary::SkipCrc) {
        return true;
    }
    let Some(body) = record.get(HEADER_BYTES..HEADER_BYTES + header.body_len as usize) else {
        return false;
    };
    header_crc(record, crc32c::crc32c(body)) == header.crc
}

/// Where the parts of one entry lie, relative to the entry's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryLayout {
    pub entry_len: u32,
    pub record_offset: u32,
    pub has_id: bool,
    /// A data subject's event: the data is its sealed envelope (`seal.rs`).
    pub sealed: bool,
    pub type_start: u32,
    pub type_len: u16,
    pub tag_count: u16,
    pub tags_start: u32,
    pub metadata_start: u32,
    pub data_start: u32,
}

impl EntryLayout {
    /// Decodes and checks the entry at the start of `bytes`: every length is inside the entry,
    /// the type and tags are UTF-8. Never panics.
    pub fn parse(bytes: &[u8]) -> Option<EntryLayout> {
        Self::parse_checked(bytes, true)
    }

    /// `parse`, optionally without the UTF-8 check: only for bodies this process encoded from
    /// `&str` (the writer's staging), never for bytes read from disk.
    pub fn parse_checked(bytes: &[u8], check_utf8: bool) -> Option<EntryLayout> {
        let entry_len = u32_at(bytes, 0)?;
        let entry = bytes.get(..entry_len as usize)?;
        let record_offset = u32_at(entry, 4)?;
        let type_len = u16_at(entry, 8)?;
        let tag_count = u16_at(entry, 10)?;
        let data_len = u32_at(entry, 12)? as usize;
        let metadata_len = u32_at(entry, 16)? as usize;
        let flags = *entry.get(20)?;
        if flags & !(FLAG_ID | FLAG_SEALED) != 0 || entry.get(21..24)? != [0, 0, 0] {
            return None;
        }
        let has_id = flags & FLAG_ID != 0;
        let sealed = flags & FLAG_SEALED != 0;
        if sealed && metadata_len != 0 {
            return None;
        }
        let type_start = ENTRY_FIXED_BYTES + if has_id { 16 } else { 0 };
        let tags_start = type_start.checked_add(type_len as usize)?;
        if type_len == 0 {
            return None;
        }
        let type_bytes = entry.get(type_start..tags_start)?;
        if check_utf8 && !is_utf8(type_bytes) {
            return None;
        }
        let mut at = tags_start;
        for _ in 0..tag_count {
            let len = u16_at(entry, at)? as usize;
            let tag = entry.get(at + 2..at + 2 + len)?;
            if check_utf8 && !is_utf8(tag) {
                return None;
            }
            at += 2 + len;
        }
        let metadata_start = at;
        let data_start = metadata_start.checked_add(metadata_len)?;
        if data_start.checked_add(data_len)? != entry.len() {
            return None;
        }
        Some(EntryLayout {
            entry_len,
            record_offset,
            has_id,
            sealed,
            type_start: type_start as u32,
            type_len,
            tag_count,
            tags_start: tags_start as u32,
            metadata_start: metadata_start as u32,
            data_start: data_start as u32,
        })
    }

    /// The layout of `opened`, this sealed entry as `seal::open_entry` rebuilt it: the same
    /// clear part (id, type, tags), then the metadata and data whose lengths it set, no
    /// longer sealed. Saves parsing the opened entry's tags again for every sealed event read.
    pub(crate) fn opened(&self, opened: &[u8]) -> EntryLayout {
        let len_at = |at: usize| u32_at(opened, at).expect("an opened entry's fixed part");
        let metadata_len = len_at(16);
        debug_assert_eq!(len_at(0) as usize, opened.len());
        EntryLayout {
            entry_len: opened.len() as u32,
            sealed: false,
            data_start: self.metadata_start + metadata_len,
            ..*self
        }
    }

    pub fn event_type<'a>(&self, entry: &'a [u8]) -> &'a str {
        let start = self.type_start as usize;
        entry
            .get(start..start + self.type_len as usize)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }

    pub fn type_bytes<'a>(&self, entry: &'a [u8]) -> &'a [u8] {
        let start = self.type_start as usize;
        entry
            .get(start..start + self.type_len as usize)
            .unwrap_or(&[])
    }

    pub fn tag_bytes<'a>(&self, entry: &'a [u8]) -> &'a [u8] {
        entry
            .get(self.tags_start as usize..self.metadata_start as usize)
            .unwrap_or(&[])
    }

    pub fn metadata_range(&self) -> Range<usize> {
        self.metadata_start as usize..self.data_start as usize
    }

    pub fn data_range(&self) -> Range<usize> {
        self.data_start as usize..self.entry_len as usize
    }

    pub fn id(&self, entry: &[u8]) -> Option<Uuid> {
        if !self.has_id {
            return None;
        }
        let bytes: [u8; 16] = entry
            .get(ENTRY_FIXED_BYTES..ENTRY_FIXED_BYTES + 16)?
            .try_into()
            .ok()?;
        // Records written before the nil UUID meant "no id" may hold it.
        Some(Uuid::from_bytes(bytes)).filter(|id| !id.is_nil())
    }
}

/// UTF-8 validity, with a fast path for ASCII (most types and tags).
fn is_utf8(bytes: &[u8]) -> bool {
    bytes.is_ascii() || std::str::from_utf8(bytes).is_ok()
}

/// Splits the first tag (u16 length + bytes) off `bytes`.
pub fn split_tag(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u16_at(bytes, 0)? as usize;
    let tag = bytes.get(2..2 + len)?;
    Some((tag, &bytes[2 + len..]))
}

/// Iterates over the entries of a record body, checking each and that they fill it exactly.
pub struct Entries<'a> {
    body: &'a [u8],
    /// False only for bodies encoded by this process (see `EntryLayout::parse_checked`).
    check_utf8: bool,
    at: usize,
    remaining: u32,
    /// Set when the body turned out malformed.
    pub malformed: bool,
}

impl<'a> Entries<'a> {
    pub fn new(body: &'a [u8], event_count: u32) -> Self {
        Entries {
            body,
            check_utf8: true,
            at: 0,
            remaining: event_count,
            malformed: false,
        }
    }
}

impl Entries<'_> {
    /// Skips the UTF-8 check: the body was encoded here from `&str`.
    pub fn trusted(mut self) -> Self {
        self.check_utf8 = false;
        self
    }
}

impl<'a> Iterator for Entries<'a> {
    /// The entry's offset in the body, its bytes and its layout.
    type Item = (usize, &'a [u8], EntryLayout);

    fn next(&mut self) -> Option<Self::Item> {
        if self.malformed {
            return None;
        }
        if self.remaining == 0 {
            if self.at != self.body.len() {
                self.malformed = true;
            }
            return None;
        }
        let rest = self.body.get(self.at..)?;
        let Some(layout) = EntryLayout::parse_checked(rest, self.check_utf8) else {
            self.malformed = true;
            return None;
        };
        if layout.record_offset as usize != HEADER_BYTES + self.at {
            self.malformed = true;
            return None;
        }
        let offset = self.at;
        let entry = &rest[..layout.entry_len as usize];
        self.at += layout.entry_len as usize;
        self.remaining -= 1;
        Some((offset, entry, layout))
    }
}

/// One append as the log holds it: its events, encoded as in a segment's record body (the
/// tracking trailer included), where they start and when they were appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAppend {
    first_position: u64,
    event_count: u32,
    appended_at_us: u64,
    trailer_len: u32,
    body: Bytes,
}

impl StoredAppend {
    pub(crate) fn new(
        first_position: u64,
        event_count: u32,
        appended_at_us: u64,
        trailer_len: u32,
        body: Bytes,
    ) -> Self {
        debug_assert!(event_count > 0 && first_position > 0);
        debug_assert!(trailer_len as usize <= body.len());
        StoredAppend {
            first_position,
            event_count,
            appended_at_us,
            trailer_len,
            body,
        }
    }

    pub fn first_position(&self) -> u64 {
        self.first_position
    }

    pub fn last_position(&self) -> u64 {
        self.first_position + u64::from(self.event_count) - 1
    }

    pub fn event_count(&self) -> u32 {
        self.event_count
    }

    pub fn appended_at_us(&self) -> u64 {
        self.appended_at_us
    }

    /// The encoded events and trailer, as stored.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The tracking position the append records, if any.
    pub fn tracking(&self) -> Option<(&str, u64)> {
        decode_trailer(&self.body[self.body.len() - self.trailer_len as usize..])
    }
}
