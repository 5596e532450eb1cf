//! [`EventBatch`]: events encoded into their record body as they are added, for callers that
//! append at high rates and must not allocate per event (a journal, an importer).
//!
//! `Store::append` takes `&[NewEvent]`, whose type and tags are owned strings: convenient, but
//! three or four allocations per event. A batch writes each event's type, tags and data
//! straight into one growing buffer, in the record layout (see `record.rs`), checking each
//! against the store's limits as it goes; appending it moves that buffer to the writer.
//!
//! ```
//! use annals::{Options, Store};
//!
//! let store = Store::open_in_memory(Options::default()).unwrap();
//! let mut batch = store.batch();
//! for order in 1..=3u64 {
//!     let mut event = batch.event("OrderPlaced").unwrap();
//!     event.tag_fmt(format_args!("order:{order}")).unwrap();
//!     event.tag("symbol:ABC").unwrap();
//!     event.finish(&order.to_le_bytes()).unwrap();
//! }
//! assert_eq!(store.appending_batch(batch).wait().unwrap(), 3);
//! ```

use std::fmt::{self, Write as _};

use crate::error::InputError;
use crate::event::NewEvent;
use crate::limits::Limits;
use crate::record::{self, EncodedAppend, ENTRY_FIXED_BYTES, HEADER_BYTES};

/// Events encoded for one append (one record): see the module documentation.
#[derive(Debug, Clone)]
pub struct EventBatch {
    body: Vec<u8>,
    count: u32,
    /// Events pushed with an id.
    ids: u32,
    limits: Limits,
}

impl EventBatch {
    /// An empty batch checked against `limits` (those of the store it will be appended to;
    /// [`crate::Store::batch`] takes them from the store).
    pub fn new(limits: &Limits) -> EventBatch {
        EventBatch::with_capacity(limits, 0)
    }

    /// An empty batch with room for `bytes` of encoded events.
    pub fn with_capacity(limits: &Limits, bytes: usize) -> EventBatch {
        EventBatch::with_body(limits, Vec::new(), bytes)
    }

    /// An empty batch writing into `body` (a buffer kept for reuse: cleared here), with room
    /// for `bytes` of encoded events.
    pub(crate) fn with_body(limits: &Limits, mut body: Vec<u8>, bytes: usize) -> EventBatch {
        body.clear();
        body.reserve(bytes);
        EventBatch {
            body,
            count: 0,
            ids: 0,
            limits: limits.clone(),
        }
    }

    /// Events in the batch.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The bytes the batch will take in the log (its record header included).
    pub fn encoded_bytes(&self) -> usize {
        HEADER_BYTES + self.body.len()
    }

    /// Whether one more event of `bytes` encoded bytes fits in the append limits.
    pub fn has_room(&self, events: usize, bytes: usize) -> bool {
        self.len() + events <= self.limits.events_per_append_max
            && self.encoded_bytes() + bytes <= self.limits.append_bytes_max
    }

    /// Empties the batch, keeping its buffer.
    pub fn clear(&mut self) {
        self.body.clear();
        self.count = 0;
        self.ids = 0;
    }

    /// Adds a [`NewEvent`] (checked as [`crate::Store::append`] checks it).
    pub fn push(&mut self, event: &NewEvent) -> Result<(), InputError> {
        let index = self.len();
        let bytes = record::validate_event(index, event, &self.limits)?;
        self.check_room(bytes)?;
        if record::stored_id(event).is_some() {
            self.ids += 1;
        }
        record::encode_entry(&mut self.body, event);
        self.count += 1;
        Ok(())
    }

    /// Starts an event of `event_type`: add its tags, then [`EventWriter::finish`] it with its
    /// data. An event dropped before it is finished leaves the batch as it was.
    pub fn event(&mut self, event_type: &str) -> Result<EventWriter<'_>, InputError> {
        let index = self.len();
        record::validate_type(index, event_type, &self.limits)?;
        // A batch is always a client's: the store makes its erasure receipts otherwise.
        if event_type == crate::subject::SUBJECT_ERASED_TYPE
            || crate::admission::is_registry_type(event_type)
        {
            return Err(InputError::ReservedType {
                index,
                event_type: event_type.into(),
            });
        }
        self.check_room(ENTRY_FIXED_BYTES + event_type.len())?;
        let start = self.body.len();
        let record_offset = (HEADER_BYTES + start) as u32;
        // entry_len, tag_count and data_len are filled in when the event is finished;
        // metadata_len, flags and reserved stay 0.
        let mut fixed = [0u8; ENTRY_FIXED_BYTES];
        fixed[4..8].copy_from_slice(&record_offset.to_le_bytes());
        fixed[8..10].copy_from_slice(&(event_type.len() as u16).to_le_bytes());
        self.body.reserve(ENTRY_FIXED_BYTES + event_type.len());
        self.body.extend_from_slice(&fixed);
        self.body.extend_from_slice(event_type.as_bytes());
        Ok(EventWriter {
            batch: self,
            start,
            tags_start: start + ENTRY_FIXED_BYTES + event_type.len(),
            tag_count: 0,
            finished: false,
        })
    }

    fn check_room(&self, bytes: usize) -> Result<(), InputError> {
        if self.len() >= self.limits.events_per_append_max {
            return Err(InputError::TooManyEvents {
                count: self.len() + 1,
                max: self.limits.events_per_append_max,
            });
        }
        let total = self.encoded_bytes() + bytes;
        if total > self.limits.append_bytes_max {
            return Err(InputError::AppendTooLarge {
                bytes: total,
                max: self.limits.append_bytes_max,
            });
        }
        Ok(())
    }

    /// The encoded append, its CRC computed here (in the caller's thread).
    pub(crate) fn into_append(self) -> Result<EncodedAppend, InputError> {
        if self.count == 0 {
            return Err(InputError::NoEvents);
        }
        Ok(EncodedAppend {
            body_crc: crc32c::crc32c(&self.body),
            body: self.body,
            event_count: self.count,
            all_ids: self.ids == self.count,
            trailer_len: 0,
        })
    }
}

/// One event being written into an [`EventBatch`].
pub struct EventWriter<'a> {
    batch: &'a mut EventBatch,
    start: usize,
    tags_start: usize,
    tag_count: u16,
    finished: bool,
}

impl EventWriter<'_> {
    /// Adds a tag.
    pub fn tag(&mut self, tag: &str) -> Result<(), InputError> {
        self.tag_fmt(format_args!("{tag}"))
    }

    /// Refuses one more tag when the event holds as many as the limits allow.
    fn room_for_tag(&self) -> Result<(), InputError> {
        let max = self.batch.limits.tags_per_event_max;
        if usize::from(self.tag_count) >= max {
            return Err(InputError::TooManyTags {
                index: self.batch.len(),
                count: usize::from(self.tag_count) + 1,
                max,
            });
        }
        Ok(())
    }

    /// Adds the tag `prefix` followed by `number` in decimal (`order:42`), written without the
    /// formatting machinery: the fast path for the tags of high-rate journals.
    pub fn tag_number(&mut self, prefix: &str, number: u64) -> Result<(), InputError> {
        self.room_for_tag()?;
        let index = self.batch.len();
        let limits = &self.batch.limits;
        let mut digits = [0u8; 20];
        let digits = decimal(number, &mut digits);
        let len = prefix.len() + digits.len();
        if len > limits.tag_bytes_max {
            return Err(InputError::TagTooLong {
                index,
                bytes: len,
                max: limits.tag_bytes_max,
            });
        }
        // Digits are never control characters; the prefix is checked (once per distinct
        // prefix would do, but it is short).
        if record::has_control(prefix) {
            return Err(InputError::ControlCharacter {
                what: "tag",
                value: format!("{prefix}{number}"),
            });
        }
        let start = self.batch.body.len();
        let body = &mut self.batch.body;
        body.reserve(2 + len);
        body.extend_from_slice(&(len as u16).to_le_bytes());
        body.extend_from_slice(prefix.as_bytes());
        body.extend_from_slice(digits);
        if let Err(e) = self.check_unique(index, start + 2, start + 2 + len) {
            self.batch.body.truncate(start);
            return Err(e);
        }
        self.tag_count += 1;
        Ok(())
    }

    /// Adds a tag formatted in place, without an intermediate string:
    /// `event.tag_fmt(format_args!("order:{id}"))`.
    pub fn tag_fmt(&mut self, tag: fmt::Arguments<'_>) -> Result<(), InputError> {
        self.room_for_tag()?;
        let index = self.batch.len();
        let at = self.batch.body.len();
        self.batch.body.extend_from_slice(&0u16.to_le_bytes());
        let mut sink = BodyWriter(&mut self.batch.body);
        // Writing into a Vec cannot fail; a Display impl that fails leaves a short tag, which
        // the checks below still judge.
        let _ = sink.write_fmt(tag);
        let end = self.batch.body.len();
        let outcome = self.check_tag(index, at + 2, end);
        match outcome {
            Ok(()) => {
                let len = (end - at - 2) as u16;
                self.batch.body[at..at + 2].copy_from_slice(&len.to_le_bytes());
                self.tag_count += 1;
                Ok(())
            }
            Err(e) => {
                self.batch.body.truncate(at);
                Err(e)
            }
        }
    }

    fn check_tag(&self, index: usize, from: usize, to: usize) -> Result<(), InputError> {
        let body = &self.batch.body;
        let limits = &self.batch.limits;
        // The bytes came from a `fmt::Write` of `str`s, so they are UTF-8.
        let tag = std::str::from_utf8(&body[from..to]).unwrap_or_default();
        if to - from > limits.tag_bytes_max {
            return Err(InputError::TagTooLong {
                index,
                bytes: to - from,
                max: limits.tag_bytes_max,
            });
        }
        record::validate_tag(index, tag, limits)?;
        self.check_unique(index, from, to)
    }

    /// Refuses the tag at `from..to` when an earlier tag of this event has the same bytes.
    fn check_unique(&self, index: usize, from: usize, to: usize) -> Result<(), InputError> {
        let body = &self.batch.body;
        let tag = &body[from..to];
        let mut earlier = &body[self.tags_start..from - 2];
        while let Some((name, rest)) = record::split_tag(earlier) {
            if name == tag {
                return Err(InputError::DuplicateTag {
                    index,
                    tag: String::from_utf8_lossy(tag).into_owned(),
                });
            }
            earlier = rest;
        }
        Ok(())
    }

    /// Ends the event with `data` (and no metadata).
    pub fn finish(self, data: &[u8]) -> Result<(), InputError> {
        self.finish_with(|body| body.extend_from_slice(data))
    }

    /// Ends the event with data that `write` appends to the buffer it is given (encode straight
    /// into the record, without a copy).
    pub fn finish_with(mut self, write: impl FnOnce(&mut Vec<u8>)) -> Result<(), InputError> {
        let index = self.batch.len();
        let data_start = self.batch.body.len();
        write(&mut self.batch.body);
        let body = &mut self.batch.body;
        let data_len = body.len() - data_start;
        if data_len > self.batch.limits.event_bytes_max {
            return Err(InputError::EventTooLarge {
                index,
                bytes: data_len,
                max: self.batch.limits.event_bytes_max,
            });
        }
        let total = HEADER_BYTES + body.len();
        if total > self.batch.limits.append_bytes_max {
            return Err(InputError::AppendTooLarge {
                bytes: total,
                max: self.batch.limits.append_bytes_max,
            });
        }
        let start = self.start;
        let entry_len = (body.len() - start) as u32;
        body[start..start + 4].copy_from_slice(&entry_len.to_le_bytes());
        body[start + 10..start + 12].copy_from_slice(&self.tag_count.to_le_bytes());
        body[start + 12..start + 16].copy_from_slice(&(data_len as u32).to_le_bytes());
        self.batch.count += 1;
        self.finished = true;
        Ok(())
    }
}

/// `n` in decimal, written at the end of `out`: two digits per division.
fn decimal(mut n: u64, out: &mut [u8; 20]) -> &[u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut at = out.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        at -= 2;
        out[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        at -= 2;
        out[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        at -= 1;
        out[at] = b'0' + n as u8;
    }
    &out[at..]
}

impl Drop for EventWriter<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.batch.body.truncate(self.start);
        }
    }
}

struct BodyWriter<'a>(&'a mut Vec<u8>);

impl fmt::Write for BodyWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the fast decimal writer writes every number as the standard formatting does, at every
    /// length and at the edges of the range.
    #[test]
    fn decimal_agrees_with_formatting() {
        let mut out = [0u8; 20];
        let edges = [
            0,
            9,
            10,
            99,
            100,
            101,
            999,
            1000,
            65_535,
            u64::from(u32::MAX),
            u64::MAX,
        ];
        let powers = (0..20).flat_map(|k| {
            let p = 10u64.pow(k);
            [p - 1, p, p + 1]
        });
        for n in (0..20_000).chain(edges).chain(powers) {
            assert_eq!(decimal(n, &mut out), n.to_string().as_bytes(), "{n}");
        }
    }

    /// Goal: an event batch, whether built field by field or from whole events, encodes to the same
    /// bytes and checksum as an append of the same events.
    #[test]
    fn encodes_as_append_does() {
        let limits = Limits::default();
        let events = vec![
            NewEvent::new("A", &b"one"[..]).tags(["x:1", "y"]),
            NewEvent::new("B", &b""[..]),
        ];
        let expected = record::encode_append_tracked(&events, None, &limits).unwrap();
        let mut batch = EventBatch::new(&limits);
        let mut a = batch.event("A").unwrap();
        a.tag_number("x:", 1).unwrap();
        a.tag("y").unwrap();
        a.finish(b"one").unwrap();
        batch.event("B").unwrap().finish(b"").unwrap();
        let mut pushed = EventBatch::new(&limits);
        for event in &events {
            pushed.push(event).unwrap();
        }
        for batch in [batch, pushed] {
            let got = batch.into_append().unwrap();
            assert_eq!(got.body, expected.body);
            assert_eq!(got.body_crc, expected.body_crc);
            assert_eq!(got.event_count, 2);
        }
    }

    /// Goal: every input a batch refuses (an empty type, a bad tag, too many tags or events, an
    /// event too large, no events) is refused with its reason and leaves nothing of the refused
    /// event in the batch.
    #[test]
    fn refusals_leave_the_batch_as_it_was() {
        let limits = Limits {
            tags_per_event_max: 2,
            tag_bytes_max: 8,
            event_bytes_max: 4,
            events_per_append_max: 2,
            ..Limits::default()
        };
        let mut batch = EventBatch::new(&limits);
        batch.event("A").unwrap().finish(b"ok").unwrap();
        let before = batch.clone().into_append().unwrap().body;
        assert!(matches!(batch.event(""), Err(InputError::EmptyType { .. })));
        {
            let mut e = batch.event("B").unwrap();
            assert!(matches!(e.tag(""), Err(InputError::EmptyTag { .. })));
            assert!(matches!(
                e.tag("far-too-long"),
                Err(InputError::TagTooLong { .. })
            ));
            assert!(matches!(
                e.tag("a\u{7}"),
                Err(InputError::ControlCharacter { .. })
            ));
            e.tag("t").unwrap();
            assert!(matches!(e.tag("t"), Err(InputError::DuplicateTag { .. })));
            assert!(matches!(
                e.tag_number("far-too-", 1234),
                Err(InputError::TagTooLong { .. })
            ));
            assert!(matches!(
                e.tag_number("\u{1}", 1),
                Err(InputError::ControlCharacter { .. })
            ));
            e.tag("u").unwrap();
            assert!(matches!(e.tag("v"), Err(InputError::TooManyTags { .. })));
            assert!(matches!(
                e.finish(b"12345"),
                Err(InputError::EventTooLarge { .. })
            ));
        }
        // Nothing of the refused event remains.
        assert_eq!(batch.len(), 1);
        assert_eq!(batch.clone().into_append().unwrap().body, before);
        batch.event("C").unwrap().finish(b"").unwrap();
        assert!(matches!(
            batch.event("D"),
            Err(InputError::TooManyEvents { .. })
        ));
        assert!(matches!(
            EventBatch::new(&limits).into_append(),
            Err(InputError::NoEvents)
        ));
    }
}
