//! Events as they are appended ([`NewEvent`]) and as they are read back ([`Event`]).

use bytes::Bytes;
use uuid::Uuid;

use crate::record::EntryLayout;

/// An event to append: a type, a set of tags, opaque data, and optional id and metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub event_type: String,
    pub tags: Vec<String>,
    pub data: Bytes,
    pub metadata: Bytes,
    /// An optional id. It is not a key (several events may carry the same one): it lets a
    /// conditional append whose condition fails be recognised as the retry of one already
    /// stored, when the first events matching the condition after its `after` carry exactly
    /// the append's ids in order; it then answers their last position. The nil UUID means no
    /// id.
    pub id: Option<Uuid>,
}

impl NewEvent {
    pub fn new(event_type: impl Into<String>, data: impl Into<Bytes>) -> Self {
        NewEvent {
            event_type: event_type.into(),
            tags: Vec::new(),
            data: data.into(),
            metadata: Bytes::new(),
            id: None,
        }
    }

    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tags.push(tag.into());
        self
    }

    pub fn tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tags.extend(tags.into_iter().map(Into::into));
        self
    }

    pub fn id(mut self, id: Uuid) -> Self {
        self.id = Some(id);
        self
    }

    pub fn metadata(mut self, metadata: impl Into<Bytes>) -> Self {
        self.metadata = metadata.into();
        self
    }
}

/// A stored event. Cloning is cheap: the bytes are shared with the segment they were read from.
#[derive(Clone)]
pub struct Event {
    position: u64,
    appended_at_us: u64,
    entry: Bytes,
    layout: EntryLayout,
    /// A data subject's event whose subject was erased: no data, no metadata.
    erased: bool,
}

impl Event {
    pub(crate) fn new(
        position: u64,
        appended_at_us: u64,
        entry: Bytes,
        layout: EntryLayout,
    ) -> Self {
        Event {
            position,
            appended_at_us,
            entry,
            layout,
            erased: false,
        }
    }

    /// A data subject's event opened (`entry` in the clear), or erased (`entry` without data).
    pub(crate) fn opened(
        position: u64,
        appended_at_us: u64,
        entry: Bytes,
        layout: EntryLayout,
        erased: bool,
    ) -> Self {
        Event {
            erased,
            ..Event::new(position, appended_at_us, entry, layout)
        }
    }

    /// Whether the event's data subject was erased: its data and metadata are gone (empty
    /// here), its position, type, tags and id remain.
    pub fn is_erased(&self) -> bool {
        self.erased
    }

    /// The event's position in the log: 1 for the first event, gapless.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// When the writer appended the event, in microseconds since the Unix epoch.
    pub fn appended_at_us(&self) -> u64 {
        self.appended_at_us
    }

    pub fn event_type(&self) -> &str {
        self.layout.event_type(&self.entry)
    }

    pub fn tags(&self) -> Tags<'_> {
        Tags::of(&self.entry, &self.layout)
    }

    pub fn data(&self) -> &[u8] {
        &self.entry[self.layout.data_range()]
    }

    /// The bytes the event takes as stored: type, tags, id, metadata and data with their
    /// framing. What a batch of events holds in memory is about the sum of these.
    pub fn stored_bytes(&self) -> usize {
        self.entry.len()
    }

    /// The data as shared bytes, without copying.
    pub fn data_bytes(&self) -> Bytes {
        self.entry.slice(self.layout.data_range())
    }

    pub fn metadata(&self) -> &[u8] {
        &self.entry[self.layout.metadata_range()]
    }

    pub fn id(&self) -> Option<Uuid> {
        self.layout.id(&self.entry)
    }

    /// A [`NewEvent`] with the same content, as if it were to be appended again.
    pub fn to_new_event(&self) -> NewEvent {
        NewEvent {
            event_type: self.event_type().to_owned(),
            tags: self.tags().map(str::to_owned).collect(),
            data: self.data_bytes(),
            metadata: self.entry.slice(self.layout.metadata_range()),
            id: self.id(),
        }
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("position", &self.position)
            .field("type", &self.event_type())
            .field("tags", &self.tags().collect::<Vec<_>>())
            .field("data_len", &self.data().len())
            .finish()
    }
}

/// The tags of a stored event, in the order they were given.
#[derive(Clone)]
pub struct Tags<'a> {
    bytes: &'a [u8],
    remaining: u16,
}

impl<'a> Tags<'a> {
    /// The tags of an encoded entry.
    pub(crate) fn of(entry: &'a [u8], layout: &EntryLayout) -> Self {
        Tags {
            bytes: layout.tag_bytes(entry),
            remaining: layout.tag_count,
        }
    }
}

impl<'a> Iterator for Tags<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let (tag, rest) = crate::record::split_tag(self.bytes)?;
        self.bytes = rest;
        // Tags were validated as UTF-8 when the entry was decoded.
        std::str::from_utf8(tag).ok()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining as usize, Some(self.remaining as usize))
    }
}
