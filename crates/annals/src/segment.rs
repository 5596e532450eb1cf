//! Segment files: the log cut into preallocated files of a fixed size.
//!
//! A segment starts with a 64-byte header (magic, version, number, size, CRC32C) followed by
//! records aligned to 8 bytes. Segments are preallocated to their full size when created
//! (zeros written, or fallocate: `Options::preallocation`), so appends never change the
//! file size and the end of the written part is the first all-zero record header. Creation is
//! made durable (file sync, then directory sync) before any record is written into the new
//! segment.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::error::StoreError;
use crate::io::{read_exact_at, Io, IoFile, OpenMode};

pub(crate) const SEGMENT_HEADER_BYTES: u64 = 64;
const SEGMENT_MAGIC: &[u8; 8] = b"ANNALSEG";
/// Written after every sync when `Options::record_synced_length` is set: "segment offset".
pub const SYNCED_LENGTH: &str = "synced-length";

const SEGMENT_VERSION: u32 = 1;
const ZERO_CHUNK: usize = 1 << 20;

/// The file name of segment `number`.
pub(crate) fn file_name(number: u32) -> String {
    format!("{number:010}.seg")
}

/// The segment number a file name stands for, if it is a segment's name.
pub(crate) fn parse_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn encode_header(number: u32, size: u64) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&number.to_le_bytes());
    h[16..24].copy_from_slice(&size.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks a segment header; returns the segment's size, or why it is not valid.
fn decode_header(h: &[u8], number: u32) -> Result<u64, &'static str> {
    let h = h
        .get(..SEGMENT_HEADER_BYTES as usize)
        .ok_or("file shorter than its header")?;
    if &h[0..8] != SEGMENT_MAGIC {
        return Err("bad segment magic");
    }
    let crc = u32::from_le_bytes(h[60..64].try_into().map_err(|_| "short header")?);
    if crc32c::crc32c(&h[0..60]) != crc {
        return Err("segment header CRC mismatch");
    }
    let version = u32::from_le_bytes(h[8..12].try_into().map_err(|_| "short header")?);
    if version != SEGMENT_VERSION {
        return Err("unknown segment version");
    }
    let stored = u32::from_le_bytes(h[12..16].try_into().map_err(|_| "short header")?);
    if stored != number {
        return Err("segment number does not match the file name");
    }
    Ok(u64::from_le_bytes(
        h[16..24].try_into().map_err(|_| "short header")?,
    ))
}

/// One open segment file.
pub(crate) struct Segment {
    pub(crate) number: u32,
    pub(crate) path: PathBuf,
    pub(crate) file: Arc<dyn IoFile>,
    /// The size the segment was created with: records never go past it.
    pub(crate) size: u64,
    /// A read-only view of the whole file, when the I/O layer can map files.
    map: Option<Bytes>,
}

impl Segment {
    /// Creates, preallocates and syncs a new segment, then syncs the directory.
    pub(crate) fn create(
        io: &dyn Io,
        dir: &Path,
        number: u32,
        size: u64,
        zero_fill: bool,
    ) -> Result<Segment, StoreError> {
        let path = dir.join(file_name(number));
        let err = |op, offset, e| StoreError::io(op, &path, offset, e);
        let file = io
            .open(&path, OpenMode::Create)
            .map_err(|e| err("create segment", 0, e))?;
        file.set_len(0).map_err(|e| err("truncate segment", 0, e))?;
        file.write_at(&encode_header(number, size), 0)
            .map_err(|e| err("write segment header", 0, e))?;
        if zero_fill {
            let zeros = vec![0u8; ZERO_CHUNK];
            let mut at = SEGMENT_HEADER_BYTES;
            while at < size {
                let n = (size - at).min(ZERO_CHUNK as u64) as usize;
                file.write_at(&zeros[..n], at)
                    .map_err(|e| err("zero-fill segment", at, e))?;
                at += n as u64;
            }
        } else {
            file.allocate(size)
                .map_err(|e| err("preallocate segment", 0, e))?;
        }
        file.sync_data()
            .map_err(|e| err("sync new segment", 0, e))?;
        io.sync_dir(dir)
            .map_err(|e| StoreError::io("sync directory", dir, 0, e))?;
        Self::mapped(number, path, file, size)
    }

    /// Opens an existing segment and checks its header. A file shorter than its size (cut back
    /// by a crash test or a tool) is extended with zeros.
    pub(crate) fn open(io: &dyn Io, dir: &Path, number: u32) -> Result<Segment, SegmentOpenError> {
        let path = dir.join(file_name(number));
        let file = io
            .open(&path, OpenMode::Existing)
            .map_err(|e| SegmentOpenError::Io(StoreError::io("open segment", &path, 0, e)))?;
        let mut header = [0u8; SEGMENT_HEADER_BYTES as usize];
        let size = match read_exact_at(file.as_ref(), &mut header, 0) {
            Ok(()) => decode_header(&header, number),
            Err(_) => Err("file shorter than its header"),
        }
        .map_err(|reason| SegmentOpenError::BadHeader {
            path: path.clone(),
            reason,
        })?;
        let len = file
            .len()
            .map_err(|e| SegmentOpenError::Io(StoreError::io("stat segment", &path, 0, e)))?;
        if len < size {
            file.allocate(size).map_err(|e| {
                let no_room = crate::io::is_no_space(&e);
                let error = StoreError::io("extend segment", &path, len, e);
                if no_room {
                    SegmentOpenError::NoRoom(error)
                } else {
                    SegmentOpenError::Io(error)
                }
            })?;
            file.sync_data()
                .map_err(|e| SegmentOpenError::Io(StoreError::io("sync segment", &path, len, e)))?;
        }
        Self::mapped(number, path, file, size).map_err(SegmentOpenError::Io)
    }

    /// The segment, with its map when the I/O layer can map files.
    fn mapped(
        number: u32,
        path: PathBuf,
        file: Arc<dyn IoFile>,
        size: u64,
    ) -> Result<Segment, StoreError> {
        let map = file
            .map()
            .map_err(|e| StoreError::io("map segment", &path, 0, e))?;
        Ok(Segment {
            number,
            path,
            file,
            size,
            map,
        })
    }

    /// Opens a segment whose header does not check out, to look inside it.
    pub(crate) fn open_unchecked(io: &dyn Io, dir: &Path, number: u32) -> Option<Segment> {
        let path = dir.join(file_name(number));
        let file = io.open(&path, OpenMode::Existing).ok()?;
        let size = file.len().ok()?;
        Some(Segment {
            number,
            path,
            file,
            size,
            map: None,
        })
    }

    /// Asks the CPU to start loading `lines` cache lines from `offset` of the map (and the one
    /// before it, where a record's header usually sits): an indexed read issues this a few
    /// events ahead, so the cache misses of scattered events overlap instead of following each
    /// other.
    #[inline]
    pub(crate) fn prefetch(&self, offset: u64, lines: usize) {
        if let Some(map) = &self.map {
            let offset = offset as usize;
            if offset < map.len() {
                prefetch(map.as_ptr().wrapping_add(offset.saturating_sub(64)));
                for line in 0..lines {
                    let at = offset + line * 64;
                    if at >= map.len() {
                        break;
                    }
                    prefetch(map.as_ptr().wrapping_add(at));
                }
            }
        }
    }

    /// Hands `f` the `len` bytes at `offset` (fewer at the end of the segment), borrowed from
    /// the map when there is one: for small fixed fields, without the reference counting of
    /// [`Segment::bytes`].
    pub(crate) fn peek<T>(
        &self,
        offset: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, StoreError> {
        if let Some(map) = &self.map {
            let end = ((offset + len as u64).min(self.size) as usize).min(map.len());
            let start = (offset as usize).min(end);
            return Ok(f(&map[start..end]));
        }
        Ok(f(&self.bytes(offset, len)?))
    }

    /// `len` bytes at `offset` (fewer at the end of the segment): a slice of the map when there
    /// is one, otherwise a fresh read.
    pub(crate) fn bytes(&self, offset: u64, len: usize) -> Result<Bytes, StoreError> {
        let end = (offset + len as u64).min(self.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        if let Some(map) = &self.map {
            let end = (end as usize).min(map.len());
            let start = (offset as usize).min(end);
            return Ok(map.slice(start..end));
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        let mut filled = 0;
        while filled < buf.len() {
            let n = self
                .file
                .read_at(&mut buf[filled..], offset + filled as u64)
                .map_err(|e| StoreError::io("read segment", &self.path, offset, e))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        buf.truncate(filled);
        Ok(Bytes::from(buf))
    }
}

pub(crate) enum SegmentOpenError {
    Io(StoreError),
    /// The file is shorter than its header says, and the file system has no room to extend it.
    NoRoom(StoreError),
    BadHeader {
        path: PathBuf,
        reason: &'static str,
    },
}

/// A hint to load the cache line holding `address`; nothing on targets without one.
#[inline(always)]
pub(crate) fn prefetch<T>(address: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and never changes memory, whatever the
    // address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(address.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}
