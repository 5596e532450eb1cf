//! Index checkpoints: the indexes written to one file so that opening a large store does not
//! rescan it. Never the source of truth: a checkpoint is used only when its CRC holds and the
//! record it names as the last one is in the log where it says, with the head it says;
//! otherwise the index is rebuilt from the log.
//!
//! Layout (little-endian): magic "ANNALCKP", version u32, reserved u32; head u64, segment u32,
//! reserved u32, end offset u64, last record offset u64; type count, tag count, id count (u64
//! each); type names and tag names (u32 length + bytes each); event types (u32 per event);
//! locations (u64 per event); each type's then each tag's postings (u64 count + u64s); ids
//! (16-byte id, u64 position each, positions ascending); tracking (u64 count, then per source u32
//! length + bytes and u64 position); then CRC32C of everything before it, and "ANNALEND".

use std::path::Path;

use crate::error::StoreError;
use crate::index::{Index, IndexLock};
use crate::io::{Io, IoFile, OpenMode};
use crate::published::{Mark, Published};

pub const FILE_NAME: &str = "index.checkpoint";
const TEMP_NAME: &str = "index.checkpoint.tmp";
const MAGIC: &[u8; 8] = b"ANNALCKP";
const END: &[u8; 8] = b"ANNALEND";
const VERSION: u32 = 3;

/// Streams bytes to a file in large writes, keeping a running CRC. `put` only buffers; the
/// caller flushes with `flush_full` where it holds no lock, so no index lock is ever held
/// across a write (a write into the page cache can stall for milliseconds when the kernel
/// throttles dirty pages, and the writer would wait that long for the index).
struct Sink<'a> {
    file: &'a dyn IoFile,
    buf: Vec<u8>,
    offset: u64,
    crc: u32,
}

/// Bytes the sink gathers before `flush_full` writes them.
const SINK_BYTES: usize = 8 << 20;

/// Elements copied per hold of the index lock: about half a millisecond of copying, so the
/// writer never waits on a checkpoint for long.
const STEP: usize = 1 << 16;

impl Sink<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn put_u32s(&mut self, values: &[u32]) {
        self.buf.reserve(values.len() * 4);
        for v in values {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn put_u64s(&mut self, values: &[u64]) {
        self.buf.reserve(values.len() * 8);
        for v in values {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Writes what is buffered once there is enough of it to make a large write.
    fn flush_full(&mut self) -> std::io::Result<()> {
        if self.buf.len() >= SINK_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, &self.buf);
        self.file.write_at(&self.buf, self.offset)?;
        self.offset += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

/// Writes a checkpoint of everything in `index` up to the published mark, which is read under
/// the index lock together with the tracking positions (the writer prunes their history under
/// that lock). The index lock is taken for a bounded stretch of copying at a time, never
/// across I/O, so the writer keeps running.
/// Returns the mark written.
pub(crate) fn write(
    io: &dyn Io,
    dir: &Path,
    index: &IndexLock,
    published: &Published,
) -> Result<Mark, StoreError> {
    write_in_steps(io, dir, index, published, STEP)
}

/// [`write`], copying about `step` elements per hold of the index lock.
fn write_in_steps(
    io: &dyn Io,
    dir: &Path,
    index: &IndexLock,
    published: &Published,
    step: usize,
) -> Result<Mark, StoreError> {
    let temp = dir.join(TEMP_NAME);
    let err = |op, e| StoreError::io(op, dir.join(TEMP_NAME), 0, e);
    let file = io
        .open(&temp, OpenMode::Create)
        .map_err(|e| err("create checkpoint", e))?;
    file.set_len(0).map_err(|e| err("truncate checkpoint", e))?;
    let mut sink = Sink {
        file: file.as_ref(),
        buf: Vec::new(),
        offset: 0,
        crc: 0,
    };
    // Touched once here, so that copying under the index lock never faults a page in nor
    // grows the buffer: one hold adds at most `step` lists' counts and positions (16 bytes
    // for a list of one) to less than SINK_BYTES.
    sink.buf.resize(SINK_BYTES + step * 16 + 4096, 0);
    sink.buf.clear();
    let (mark, type_names, tag_names, ids, tracking) = {
        let index = index.read();
        let mark = published.mark();
        let head = mark.head;
        let ids: Vec<(u64, u128)> = index.ids.up_to(head).collect();
        let tracking: Vec<(Box<str>, u64)> = index
            .tracking
            .keys()
            .filter_map(|source| Some((source.clone(), index.tracking(source, head)?)))
            .collect();
        (
            mark,
            index.type_names.clone(),
            index.tag_names.clone(),
            ids,
            tracking,
        )
    };
    let head = mark.head;
    let n = head as usize;
    (|| -> std::io::Result<()> {
        sink.put(MAGIC);
        sink.put(&VERSION.to_le_bytes());
        sink.put(&0u32.to_le_bytes());
        sink.put(&head.to_le_bytes());
        sink.put(&mark.segment.to_le_bytes());
        sink.put(&0u32.to_le_bytes());
        sink.put(&mark.end_offset.to_le_bytes());
        sink.put(&mark.last_record_offset.to_le_bytes());
        sink.put(&(type_names.len() as u64).to_le_bytes());
        sink.put(&(tag_names.len() as u64).to_le_bytes());
        sink.put(&(ids.len() as u64).to_le_bytes());
        for name in type_names.iter().chain(tag_names.iter()) {
            sink.put(&(name.len() as u32).to_le_bytes());
            sink.put(name);
            sink.flush_full()?;
        }
        let mut at = 0;
        while at < n {
            let to = (at + step).min(n);
            sink.put_u32s(&index.read().event_types[at..to]);
            sink.flush_full()?;
            at = to;
        }
        at = 0;
        while at < n {
            let to = (at + step).min(n);
            sink.put_u64s(&index.read().locations[at..to]);
            sink.flush_full()?;
            at = to;
        }
        // Each type's and each tag's positions up to the head, a stretch of about `step`
        // positions per hold of the lock: many short lists at a time (a store may hold
        // millions of tags), or part of a long one (a list may be as long as the log).
        let lists = type_names.len() + tag_names.len();
        let mut list = 0;
        let mut at = 0;
        // The current list's length up to the head, once its count is written.
        let mut current: Option<usize> = None;
        while list < lists {
            {
                let index = index.read();
                let mut budget = step;
                while list < lists && budget > 0 {
                    let positions = match list.checked_sub(type_names.len()) {
                        None => &index.type_postings[list],
                        Some(tag) => &index.tag_postings[tag],
                    };
                    let len = *current.get_or_insert_with(|| {
                        let len = positions.partition_point(|&p| p <= head);
                        sink.put(&(len as u64).to_le_bytes());
                        len
                    });
                    let to = (at + budget).min(len);
                    sink.put_u64s(&positions[at..to]);
                    // Each list costs at least one unit, so that empty ones end the hold too.
                    budget = budget.saturating_sub((to - at).max(1));
                    at = to;
                    if at == len {
                        list += 1;
                        at = 0;
                        current = None;
                    }
                }
            }
            sink.flush_full()?;
        }
        for (p, id) in &ids {
            sink.put(&id.to_le_bytes());
            sink.put(&p.to_le_bytes());
            sink.flush_full()?;
        }
        sink.put(&(tracking.len() as u64).to_le_bytes());
        for (source, value) in &tracking {
            sink.put(&(source.len() as u32).to_le_bytes());
            sink.put(source.as_bytes());
            sink.put(&value.to_le_bytes());
        }
        sink.flush()?;
        let crc = sink.crc;
        sink.put(&crc.to_le_bytes());
        sink.put(END);
        sink.flush()?;
        file.sync_data()
    })()
    .map_err(|e| err("write checkpoint", e))?;
    io.rename(&temp, &dir.join(FILE_NAME))
        .map_err(|e| err("rename checkpoint", e))?;
    io.sync_dir(dir)
        .map_err(|e| StoreError::io("sync directory", dir, 0, e))?;
    Ok(mark)
}

/// Reads little-endian values from a byte slice without trusting any length.
struct CheckpointReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> CheckpointReader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn count(&mut self, element_bytes: usize) -> Option<usize> {
        let n = usize::try_from(self.u64()?).ok()?;
        // Refuse counts that could not fit in what is left: never allocate on a bad length.
        (n.checked_mul(element_bytes)? <= self.bytes.len() - self.at).then_some(n)
    }

    fn u64s(&mut self, n: usize) -> Option<Vec<u64>> {
        let bytes = self.take(n.checked_mul(8)?)?;
        let mut out = if n >= 1 << 18 {
            crate::index::huge_vec(n)
        } else {
            Vec::with_capacity(n)
        };
        out.extend(
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))),
        );
        Some(out)
    }
}

/// Why a checkpoint was not used.
pub(crate) type Rejected = &'static str;

/// Reads the checkpoint, if there is one and it is whole. The caller still checks that the
/// log agrees with its mark.
pub(crate) fn read(io: &dyn Io, dir: &Path) -> Result<(Index, Mark), Rejected> {
    let path = dir.join(FILE_NAME);
    let file = io.open(&path, OpenMode::Existing).map_err(|_| "missing")?;
    // Mapped where the I/O layer can: the file is parsed once, never copied whole.
    if let Ok(Some(map)) = file.map() {
        return parse(&map).ok_or("damaged");
    }
    let len = file.len().map_err(|_| "unreadable")? as usize;
    let mut bytes = vec![0u8; len];
    crate::io::read_exact_at(file.as_ref(), &mut bytes, 0).map_err(|_| "unreadable")?;
    parse(&bytes).ok_or("damaged")
}

fn parse(bytes: &[u8]) -> Option<(Index, Mark)> {
    let body_len = bytes.len().checked_sub(12)?;
    if &bytes[body_len + 4..] != END {
        return None;
    }
    let crc = u32::from_le_bytes(bytes[body_len..body_len + 4].try_into().ok()?);
    if crc32c::crc32c(&bytes[..body_len]) != crc {
        return None;
    }
    let mut c = CheckpointReader {
        bytes: &bytes[..body_len],
        at: 0,
    };
    if c.take(8)? != MAGIC || c.u32()? != VERSION {
        return None;
    }
    c.u32()?;
    let head = c.u64()?;
    let segment = c.u32()?;
    c.u32()?;
    let end_offset = c.u64()?;
    let last_record_offset = c.u64()?;
    let type_count = c.count(4)?;
    let tag_count = c.count(4)?;
    let id_count = c.count(24)?;
    let n = usize::try_from(head).ok()?;
    let mut index = Index::default();
    for (names, ids, postings, count) in [
        (
            &mut index.type_names,
            &mut index.type_ids,
            &mut index.type_postings,
            type_count,
        ),
        (
            &mut index.tag_names,
            &mut index.tag_ids,
            &mut index.tag_postings,
            tag_count,
        ),
    ] {
        names.reserve(count);
        ids.reserve(count);
        for i in 0..count {
            let len = c.u32()? as usize;
            let name = crate::index::NameKey::new(c.take(len)?);
            ids.insert(name.clone(), i as u32);
            names.push(name);
        }
        postings.reserve(count);
    }
    if index.type_ids.len() != type_count || index.tag_ids.len() != tag_count {
        return None;
    }
    let types = c.take(n.checked_mul(4)?)?;
    index.event_types = crate::index::huge_vec(n);
    index.event_types.extend(
        types
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4]))),
    );
    if index.event_types.iter().any(|&t| t as usize >= type_count) {
        return None;
    }
    index.locations = c.u64s(n)?;
    for (postings, count) in [
        (&mut index.type_postings, type_count),
        (&mut index.tag_postings, tag_count),
    ] {
        for _ in 0..count {
            let len = c.count(8)?;
            let list = c.u64s(len)?;
            if list.windows(2).any(|w| w[0] >= w[1])
                || list.last().is_some_and(|&p| p > head)
                || list.first() == Some(&0)
            {
                return None;
            }
            postings.push(list);
        }
    }
    index.ids.reserve(id_count);
    let mut previous = 0;
    for _ in 0..id_count {
        let id = u128::from_le_bytes(c.take(16)?.try_into().ok()?);
        let position = c.u64()?;
        if position <= previous || position > head {
            return None;
        }
        previous = position;
        index.ids.push(position, id);
    }
    let sources = c.count(12)?;
    for _ in 0..sources {
        let len = c.u32()? as usize;
        let source = std::str::from_utf8(c.take(len)?).ok()?;
        let value = c.u64()?;
        if source.is_empty() {
            return None;
        }
        index.set_tracking(source, head, value, head);
    }
    if c.at != body_len {
        return None;
    }
    Some((
        index,
        Mark {
            head,
            segment,
            end_offset,
            last_record_offset,
        },
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{NewEvent, Options, Store};

    /// Goal: a checkpoint copied in stretches (many short lists per hold of the lock, a long
    /// list over several holds) reads back as exactly the index it was taken of. Method: 600
    /// events over 3 types, a tag shared by all, one per ten events and one per event; write
    /// with stretches of 1, 7 and 1,000 elements; compare every part of the index read back.
    #[test]
    fn a_checkpoint_written_in_stretches_reads_back_whole() {
        let io = crate::sim::SimIo::new(5);
        let dir = Path::new("/ckp");
        let options = Options {
            checkpoint_on_close: false,
            checkpoint_interval_events: 0,
            ..Options::default()
        };
        let store = Store::open_with_io(Arc::new(io.clone()), dir, options).unwrap();
        for chunk in 0..20u64 {
            let events: Vec<NewEvent> = (0..30u64)
                .map(|i| {
                    let n = chunk * 30 + i;
                    NewEvent::new(format!("type{}", n % 3), vec![n as u8; 5])
                        .tag("all")
                        .tag(format!("tenth:{}", n / 10))
                        .tag(format!("each:{n}"))
                })
                .collect();
            store.append(&events, None).unwrap();
        }
        let shared = store.shared();
        for step in [1, 7, 1000] {
            let mark = write_in_steps(&io, dir, &shared.index, &shared.published, step).unwrap();
            assert_eq!(mark.head, 600);
            let (read, read_mark) = read(&io, dir).unwrap();
            assert_eq!(read_mark, mark);
            let index = shared.index.read();
            let names = |n: &[crate::index::NameKey]| -> Vec<Vec<u8>> {
                n.iter().map(|k| k.as_bytes().to_vec()).collect()
            };
            assert_eq!(names(&read.type_names), names(&index.type_names));
            assert_eq!(names(&read.tag_names), names(&index.tag_names));
            assert_eq!(read.type_postings, index.type_postings, "step {step}");
            assert_eq!(read.tag_postings, index.tag_postings, "step {step}");
            assert_eq!(read.event_types, index.event_types);
            assert_eq!(read.locations, index.locations);
            assert_eq!(read.tag_names.len(), 1 + 60 + 600);
        }
    }
}
