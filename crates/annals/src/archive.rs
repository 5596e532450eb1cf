//! The backup's objects: what a prefix of object storage holds for one store, and how each
//! object is laid out. Decoding never panics and never trusts a length.
//!
//! ```text
//! <prefix>/annals-backup.json      the manifest: format, and the store's first record
//! <prefix>/lease.json              who ships into the prefix, renewed while it does
//! <prefix>/segments/<first:020>    a sealed segment's records, whole, shipped once
//! <prefix>/log/<first:020>         records of a segment, shipped as they are synced
//! <prefix>/keys/<epoch:020>-<offset:020>  the data subjects' key file (`keys.rs`), its
//!                                  bytes from `offset` on, as synced in that epoch; an
//!                                  erasure begins an epoch, shipped whole from offset 0,
//!                                  and the older epochs' objects are then deleted
//! ```
//!
//! Each object holds whole records, exactly as the segment holds them (header, body, padding),
//! for positions `first..=last` without a gap; it never spans two segments. A sealed segment
//! shipped in small chunks is shipped again whole, and its chunks are deleted after the
//! segment's object is written; large chunks stay as the segment's copy;
//! readers prefer `segments/<n>` to `log/<n>` and never need both.
//!
//! ```text
//! object header (64 bytes, little-endian)
//!   0  magic "ANNALSBK"       8  version u32 (1)      12 kind u32 (1 log chunk, 2 segment)
//!   16 first u64              24 last u64              32 records u32    36 segment u32
//!   40 frames_len u64         48 frames_crc32c u32     52 reserved [u8; 8] (0)
//!   60 crc32c of bytes [0..60)
//! frames: the records, back to back, frames_len bytes
//! ```

use std::ops::Range;

use bytes::Bytes;

use crate::record::{crc_matches, decode_header, Frame, RecordHeader};

pub const MANIFEST: &str = "annals-backup.json";
pub const LEASE: &str = "lease.json";
pub const SEGMENTS_DIR: &str = "segments";
pub const LOG_DIR: &str = "log";
pub const KEYS_DIR: &str = "keys";

/// The name of the key file's bytes from `offset` on, in `epoch`.
pub fn keys_name(epoch: u64, offset: u64) -> String {
    format!("{KEYS_DIR}/{epoch:020}-{offset:020}")
}

/// The newest epoch of key objects in a backup, and the length of the key file they hold.
#[cfg(feature = "object-store")]
pub fn keys_extent(
    objects: &crate::objects::Objects,
) -> Result<Option<(u64, u64)>, crate::objects::ObjectError> {
    let mut newest: Option<(u64, u64)> = None;
    for l in objects.list(KEYS_DIR, None)? {
        if let Some((epoch, offset)) = parse_keys_name(&l.name) {
            let end = offset + l.size;
            newest = match newest {
                Some((e, len)) if e > epoch || (e == epoch && len >= end) => Some((e, len)),
                _ => Some((epoch, end)),
            };
        }
    }
    Ok(newest)
}

/// The key file a backup holds: the objects of its newest epoch, put back together (None
/// without key objects).
#[cfg(feature = "object-store")]
pub fn read_keys(objects: &crate::objects::Objects) -> Result<Option<Vec<u8>>, String> {
    let url = objects.url();
    let mut parts: Vec<(u64, u64, String)> = Vec::new();
    for l in objects
        .list(KEYS_DIR, None)
        .map_err(|e| format!("{url}: {e}"))?
    {
        if let Some((epoch, offset)) = parse_keys_name(&l.name) {
            parts.push((epoch, offset, l.name));
        }
    }
    let Some(newest) = parts.iter().map(|p| p.0).max() else {
        return Ok(None);
    };
    parts.retain(|p| p.0 == newest);
    parts.sort();
    let mut bytes = Vec::new();
    for (_, offset, name) in parts {
        if offset != bytes.len() as u64 {
            return Err(format!(
                "{url}: {name} does not follow the key file's {} bytes before it",
                bytes.len()
            ));
        }
        let (part, _) = objects
            .get(&name)
            .map_err(|e| format!("{url}: {e}"))?
            .ok_or_else(|| format!("{url}: {name} was listed and is gone"))?;
        bytes.extend_from_slice(&part);
    }
    Ok(Some(bytes))
}

/// The epoch and offset a key object's name stands for.
pub fn parse_keys_name(name: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix(KEYS_DIR)?.strip_prefix('/')?;
    let (epoch, offset) = rest.split_once('-')?;
    let digits = |d: &str| d.len() == 20 && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(epoch) || !digits(offset) {
        return None;
    }
    Some((epoch.parse().ok()?, offset.parse().ok()?))
}
/// The version of the objects' layout (the header's `version`, and the manifest's `format`).
pub const ARCHIVE_VERSION: u32 = 1;
/// The header's `version` of an object whose records are compressed (LZ4's block format);
/// its header is laid out as version 1's, `frames_len` and `frames_crc` those of the records
/// uncompressed.
pub const ARCHIVE_VERSION_LZ4: u32 = 2;
/// The most record bytes an object may say it holds: a damaged or hostile header does not
/// make a reader allocate more.
const FRAMES_LEN_MAX: u64 = 1 << 31;
pub const OBJECT_HEADER_BYTES: usize = 64;
const OBJECT_MAGIC: &[u8; 8] = b"ANNALSBK";

/// Which of the two kinds an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// Records of the active segment, shipped as they were synced.
    Chunk,
    /// A sealed segment's records, whole.
    Segment,
}

impl ObjectKind {
    /// Its name in spans and logs.
    #[cfg(feature = "object-store")]
    pub(crate) fn label(self) -> &'static str {
        match self {
            ObjectKind::Chunk => "chunk",
            ObjectKind::Segment => "segment",
        }
    }

    fn code(self) -> u32 {
        match self {
            ObjectKind::Chunk => 1,
            ObjectKind::Segment => 2,
        }
    }

    pub fn dir(self) -> &'static str {
        match self {
            ObjectKind::Chunk => LOG_DIR,
            ObjectKind::Segment => SEGMENTS_DIR,
        }
    }

    /// The object's name below the prefix.
    pub fn name(self, first: u64) -> String {
        format!("{}/{first:020}", self.dir())
    }
}

/// The first position an object's name stands for, if it is one of `kind`'s names.
pub fn parse_name(kind: ObjectKind, name: &str) -> Option<u64> {
    let digits = name.strip_prefix(kind.dir())?.strip_prefix('/')?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&p| p > 0)
}

/// What an object's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectHeader {
    pub kind: ObjectKind,
    pub first: u64,
    pub last: u64,
    pub records: u32,
    /// The segment of the shipping store the records came from (for messages only).
    pub segment: u32,
    pub frames_len: u64,
    pub frames_crc: u32,
    /// Whether the records are stored compressed (version 2).
    pub compressed: bool,
}

/// An object holding `frames` (whole records, in order, for positions `first..=last`), as
/// the pieces of its bytes: the header, then the records, compressed when that saves an
/// eighth of them or more (records sealed for data subjects do not compress, and go as
/// they are).
pub fn encode_object(
    kind: ObjectKind,
    segment: u32,
    first: u64,
    last: u64,
    frames: &[Bytes],
) -> Vec<Bytes> {
    let len: usize = frames.iter().map(|f| f.len()).sum();
    let mut whole = Vec::with_capacity(len);
    for f in frames {
        whole.extend_from_slice(f);
    }
    let packed = lz4_flex::block::compress(&whole);
    let compressed = packed.len() < len - len / 8;
    let header = encode_header(kind, segment, first, last, frames, compressed);
    let mut object = Vec::with_capacity(frames.len() + 1);
    object.push(Bytes::copy_from_slice(&header));
    match compressed {
        true => object.push(Bytes::from(packed)),
        false => object.extend(frames.iter().cloned()),
    }
    object
}

/// The header of an object holding `frames` (whole records, in order).
pub fn encode_header(
    kind: ObjectKind,
    segment: u32,
    first: u64,
    last: u64,
    frames: &[Bytes],
    compressed: bool,
) -> [u8; OBJECT_HEADER_BYTES] {
    assert!(first >= 1 && last >= first, "an object holds positions");
    let mut crc = 0;
    let mut len = 0u64;
    for f in frames {
        crc = crc32c::crc32c_append(crc, f);
        len += f.len() as u64;
    }
    let version = match compressed {
        true => ARCHIVE_VERSION_LZ4,
        false => ARCHIVE_VERSION,
    };
    let records = frames.len() as u32;
    let mut h = [0u8; OBJECT_HEADER_BYTES];
    h[0..8].copy_from_slice(OBJECT_MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12..16].copy_from_slice(&kind.code().to_le_bytes());
    h[16..24].copy_from_slice(&first.to_le_bytes());
    h[24..32].copy_from_slice(&last.to_le_bytes());
    h[32..36].copy_from_slice(&records.to_le_bytes());
    h[36..40].copy_from_slice(&segment.to_le_bytes());
    h[40..48].copy_from_slice(&len.to_le_bytes());
    h[48..52].copy_from_slice(&crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&h[0..60]);
    h[60..64].copy_from_slice(&header_crc.to_le_bytes());
    h
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads an object's header (the first 64 bytes or more of it).
pub fn decode_object_header(bytes: &[u8]) -> Result<ObjectHeader, String> {
    let h = bytes
        .get(..OBJECT_HEADER_BYTES)
        .ok_or("shorter than an object header")?;
    if &h[0..8] != OBJECT_MAGIC {
        return Err("not a backup object (bad magic)".into());
    }
    if crc32c::crc32c(&h[0..60]) != u32_at(h, 60) {
        return Err("object header CRC mismatch".into());
    }
    let version = u32_at(h, 8);
    if version != ARCHIVE_VERSION && version != ARCHIVE_VERSION_LZ4 {
        return Err(format!(
            "object version {version}; this build reads versions {ARCHIVE_VERSION} and \
             {ARCHIVE_VERSION_LZ4}"
        ));
    }
    let kind = match u32_at(h, 12) {
        1 => ObjectKind::Chunk,
        2 => ObjectKind::Segment,
        other => return Err(format!("unknown object kind {other}")),
    };
    let (first, last, records) = (u64_at(h, 16), u64_at(h, 24), u32_at(h, 32));
    if first == 0 || last < first || records == 0 || u64::from(records) > last - first + 1 {
        return Err(format!(
            "impossible positions {first}..={last} in {records} records"
        ));
    }
    Ok(ObjectHeader {
        kind,
        first,
        last,
        records,
        segment: u32_at(h, 36),
        frames_len: u64_at(h, 40),
        frames_crc: u32_at(h, 48),
        compressed: version == ARCHIVE_VERSION_LZ4,
    })
}

/// A whole object, checked: every record's CRC, positions `first..=last` without a gap.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub header: ObjectHeader,
    /// Each record's header and where its bytes lie in the object (padding included).
    pub records: Vec<(RecordHeader, Range<usize>)>,
    pub bytes: Bytes,
}

impl Decoded {
    /// A record's bytes as the segment held them.
    pub fn frame(&self, i: usize) -> Bytes {
        self.bytes.slice(self.records[i].1.clone())
    }
}

/// Checks and splits a whole object. `expected_first`: the position its name stands for.
pub fn decode_object(bytes: Bytes, expected_first: Option<u64>) -> Result<Decoded, String> {
    let header = decode_object_header(&bytes)?;
    if let Some(first) = expected_first.filter(|&f| f != header.first) {
        return Err(format!(
            "named for position {first} but holds {}..={}",
            header.first, header.last
        ));
    }
    if header.frames_len > FRAMES_LEN_MAX {
        return Err(format!(
            "the header says {} bytes of records, more than an object holds",
            header.frames_len
        ));
    }
    let bytes = match header.compressed {
        true => {
            let mut whole = vec![0u8; OBJECT_HEADER_BYTES + header.frames_len as usize];
            whole[..OBJECT_HEADER_BYTES].copy_from_slice(&bytes[..OBJECT_HEADER_BYTES]);
            let out = lz4_flex::block::decompress_into(
                &bytes[OBJECT_HEADER_BYTES..],
                &mut whole[OBJECT_HEADER_BYTES..],
            )
            .map_err(|e| format!("the compressed records do not decompress: {e}"))?;
            if out as u64 != header.frames_len {
                return Err(format!(
                    "{out} bytes of records decompressed where the header says {}",
                    header.frames_len
                ));
            }
            Bytes::from(whole)
        }
        false => bytes,
    };
    let frames = &bytes[OBJECT_HEADER_BYTES..];
    if frames.len() as u64 != header.frames_len {
        return Err(format!(
            "{} bytes of records where the header says {} (cut short or extended)",
            frames.len(),
            header.frames_len
        ));
    }
    if crc32c::crc32c(frames) != header.frames_crc {
        return Err("CRC mismatch over the records".into());
    }
    let mut records = Vec::with_capacity(header.records as usize);
    let mut at = OBJECT_HEADER_BYTES;
    let mut next = header.first;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let record = match decode_header(rest) {
            Frame::Record(r) => r,
            Frame::End => return Err(format!("zeros where record {} should be", next)),
            Frame::Invalid(why) => {
                return Err(format!("record at byte {at} (position {next}): {why}"))
            }
        };
        if record.first_position != next {
            return Err(format!(
                "record at byte {at} starts at position {}, expected {next}",
                record.first_position
            ));
        }
        let len = record.stored_len();
        if rest.len() < len || !crc_matches(&rest[..len], &record) {
            return Err(format!(
                "record at byte {at} (position {next}): CRC mismatch or cut short"
            ));
        }
        records.push((record, at..at + len));
        next = record.last_position() + 1;
        at += len;
    }
    if next != header.last + 1 || records.len() != header.records as usize {
        return Err(format!(
            "records end at position {} in {} records; the header says {}..={} in {}",
            next - 1,
            records.len(),
            header.first,
            header.last,
            header.records
        ));
    }
    Ok(Decoded {
        header,
        records,
        bytes,
    })
}

/// The manifest: which store a prefix backs up, named by its first record (a store's history
/// is told from another's by where it began).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The CRC of the record holding position 1, and when it was appended.
    pub first_record_crc: u32,
    pub first_appended_at_us: u64,
    /// The Annals version that began the backup.
    pub created_by: String,
}

impl Manifest {
    pub fn for_first_record(record: &RecordHeader) -> Manifest {
        Manifest {
            format: ARCHIVE_VERSION,
            first_record_crc: record.crc,
            first_appended_at_us: record.appended_at_us,
            created_by: format!("annals {}", env!("CARGO_PKG_VERSION")),
        }
    }

    /// Whether the record holding position 1 is the one this manifest names.
    pub fn names(&self, record: &RecordHeader) -> bool {
        self.first_record_crc == record.crc && self.first_appended_at_us == record.appended_at_us
    }

    pub fn decode(bytes: &[u8]) -> Result<Manifest, String> {
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| format!("{MANIFEST} is not a backup manifest: {e}"))?;
        if manifest.format != ARCHIVE_VERSION {
            return Err(format!(
                "{MANIFEST} has format {}; this build reads format {ARCHIVE_VERSION}",
                manifest.format
            ));
        }
        Ok(manifest)
    }
}

/// Who ships into a prefix: renewed while it ships; another may take it over once it has
/// not been renewed for `ttl_s`, or at once when it names the same data directory on the
/// same host (whose lock the taker holds, so its holder is gone).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    pub host: String,
    pub dir: String,
    pub pid: u32,
    /// A random id for this holding, told apart from a restarted process's.
    pub holder: String,
    pub renewed_at_us: u64,
    pub ttl_s: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::HEADER_BYTES;

    fn record(first: u64, count: u32) -> Bytes {
        let events: Vec<_> = (0..count)
            .map(|i| crate::NewEvent::new("T", format!("data {first} {i}")))
            .collect();
        record_of(first, &events)
    }

    fn record_with(first: u64, data: &[u8]) -> Bytes {
        record_of(first, &[crate::NewEvent::new("T", data.to_vec())])
    }

    fn record_of(first: u64, events: &[crate::NewEvent]) -> Bytes {
        let append =
            crate::record::encode_append_tracked(events, None, &crate::Limits::default()).unwrap();
        let mut header = [0u8; HEADER_BYTES];
        RecordHeader::encode(&mut header, &append, first, first - 1, 7);
        let mut out = header.to_vec();
        out.extend_from_slice(&append.body);
        out.resize(crate::record::aligned(out.len()), 0);
        Bytes::from(out)
    }

    fn object_as(frames: &[Bytes], first: u64, last: u64, compressed: bool) -> Bytes {
        let header = encode_header(ObjectKind::Chunk, 3, first, last, frames, compressed);
        let mut records = Vec::new();
        for f in frames {
            records.extend_from_slice(f);
        }
        let mut out = header.to_vec();
        match compressed {
            true => out.extend(lz4_flex::block::compress(&records)),
            false => out.extend(records),
        }
        Bytes::from(out)
    }

    fn object(frames: &[Bytes], first: u64, last: u64) -> Bytes {
        object_as(frames, first, last, false)
    }

    /// Goal: records that compress go compressed, others as they are, and either way the
    /// object decodes to the same records; damage to a compressed object is found too.
    #[test]
    fn compressed_objects_decode_to_the_same_records() {
        let frames = [record(5, 2), record(7, 1), record(8, 3)];
        let pieces = encode_object(ObjectKind::Chunk, 3, 5, 10, &frames);
        assert_eq!(pieces.len(), 2, "the records compress");
        let packed = Bytes::from(pieces.concat());
        let decoded = decode_object(packed.clone(), Some(5)).unwrap();
        assert!(decoded.header.compressed);
        let raw = decode_object(object(&frames, 5, 10), Some(5)).unwrap();
        assert!(!raw.header.compressed);
        for (i, frame) in frames.iter().enumerate() {
            assert_eq!(decoded.frame(i), *frame);
            assert_eq!(raw.frame(i), *frame);
        }
        for at in [8, 40, 48, 64, 70, packed.len() - 1] {
            let mut damaged = packed.to_vec();
            damaged[at] ^= 0x10;
            assert!(
                decode_object(Bytes::from(damaged), Some(5)).is_err(),
                "a flip at {at} is found"
            );
        }
        let cut = packed.slice(..packed.len() - 4);
        assert!(decode_object(cut, Some(5)).is_err());
        // Bytes that do not compress (sealed data looks like noise) go as they are.
        let mut noise = vec![0u8; 4096];
        getrandom::fill(&mut noise).unwrap();
        let one = record_with(9, &noise);
        let pieces = encode_object(ObjectKind::Segment, 3, 9, 9, std::slice::from_ref(&one));
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[1], one, "stored as it is");
        let decoded = decode_object(Bytes::from(pieces.concat()), Some(9)).unwrap();
        assert!(!decoded.header.compressed);
        assert_eq!(decoded.frame(0), one);
    }

    /// Goal: an object of records decodes to them (positions, bytes), names round-trip, and
    /// every damage is refused with a reason: a flipped bit anywhere, a cut, a wrong name, a
    /// gap between records, a header whose count or positions lie.
    #[test]
    fn objects_round_trip_and_damage_is_named() {
        let frames = [record(5, 2), record(7, 1), record(8, 3)];
        let bytes = object(&frames, 5, 10);
        let decoded = decode_object(bytes.clone(), Some(5)).unwrap();
        assert_eq!(decoded.header.first, 5);
        assert_eq!(decoded.header.last, 10);
        assert_eq!(decoded.records.len(), 3);
        assert_eq!(decoded.frame(1), frames[1]);
        assert_eq!(ObjectKind::Chunk.name(5), "log/00000000000000000005");
        assert_eq!(
            parse_name(ObjectKind::Chunk, &ObjectKind::Chunk.name(5)),
            Some(5)
        );
        assert_eq!(
            parse_name(ObjectKind::Segment, "log/00000000000000000005"),
            None
        );
        assert_eq!(parse_name(ObjectKind::Chunk, "log/5"), None);
        for at in [3, 20, 61, 64, 70, 64 + 60, bytes.len() - 1] {
            let mut damaged = bytes.to_vec();
            damaged[at] ^= 0x10;
            assert!(
                decode_object(Bytes::from(damaged), Some(5)).is_err(),
                "a flip at {at} is found"
            );
        }
        let cut = bytes.slice(..bytes.len() - 8);
        assert!(decode_object(cut, Some(5))
            .unwrap_err()
            .contains("cut short"));
        assert!(decode_object(bytes.clone(), Some(6))
            .unwrap_err()
            .contains("named for position 6"));
        let gap = object(&[record(5, 2), record(8, 3)], 5, 10);
        assert!(decode_object(gap, None).unwrap_err().contains("expected 7"));
        let lying = object(&frames, 5, 11);
        assert!(decode_object(lying, None)
            .unwrap_err()
            .contains("the header says"));
        let lying = object_as(&frames, 5, 11, true);
        assert!(decode_object(lying, None)
            .unwrap_err()
            .contains("the header says"));
        assert!(decode_object_header(b"short").is_err());
    }

    /// Goal: the manifest names the first record by CRC and time, refuses another format.
    #[test]
    fn the_manifest_names_a_store_by_its_first_record() {
        let first = match decode_header(&record(1, 1)) {
            Frame::Record(r) => r,
            other => panic!("{other:?}"),
        };
        let manifest = Manifest::for_first_record(&first);
        let text = serde_json::to_vec(&manifest).unwrap();
        assert_eq!(Manifest::decode(&text).unwrap(), manifest);
        assert!(manifest.names(&first));
        let other = match decode_header(&record(1, 2)) {
            Frame::Record(r) => r,
            other => panic!("{other:?}"),
        };
        assert!(!manifest.names(&other));
        let newer = String::from_utf8(text)
            .unwrap()
            .replace("\"format\":1", "\"format\":9");
        assert!(Manifest::decode(newer.as_bytes())
            .unwrap_err()
            .contains("format 9"));
    }
}
