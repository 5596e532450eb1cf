//! Snapshots on files: one file of entries in `<data>/snapshots/`, appended to, and a map in
//! memory from each key to where its newest entry is.
//!
//! The file (`shelf-<generation, 16 hex digits>.log`) begins with a header (magic `ANNALSSH`,
//! format version u32, four bytes zero) followed by entries, each `kind u8, length u32,
//! body, CRC32C u32` (of kind, length and body; little-endian). A `put` entry's body is a
//! saved state's envelope; a `remove` entry's is the 16 bytes of a key. The last entry of a key
//! is its snapshot, and a `remove` leaves none.
//!
//! Puts are written and not synced: a snapshot is derived, and losing the newest costs a
//! longer read. At open the file is read through, and it ends at the first entry that is torn
//! or does not check (what follows is cut off): so a crash while saving leaves the previous
//! snapshot of a key or the new one, never a torn one. Removals are synced before they
//! answer, so a removed snapshot never comes back.
//!
//! A compaction writes the live entries into the next generation aside (`.tmp`), syncs it,
//! renames it into place, syncs the directory and removes the older file: when the file holds
//! more than twice what is live, and whenever a purge must forget snapshots that folded an
//! erased subject's events (which removes their bytes, in live and superseded entries alike).
//! At open the highest generation is the file; lower ones, and temporary files, are what a
//! crash left and are removed.
//!
//! The file is opened, and read through, at the first call that needs it: a store whose
//! decisions keep no snapshots never reads it.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::{saw_erased, Shelf, ShelfStats, Shelved, SnapshotFilter, SnapshotInfo};
use crate::io::{read_exact_at, Io, IoFile, OpenMode};
use crate::saved::{SavedState, StateKey};

/// The directory, within the data directory.
pub(crate) const DIR: &str = "snapshots";

const MAGIC: &[u8; 8] = b"ANNALSSH";
const FORMAT: u32 = 1;
const HEADER: u64 = 16;

const PUT: u8 = 1;
const REMOVE: u8 = 2;

/// An entry's bytes beside its body: kind, length, CRC.
const FRAME: u64 = 1 + 4 + 4;

/// A body longer than this is damage, not an allocation.
const BODY_MAX: u32 = 1 << 30;

/// Below this size the file is never compacted for its superseded entries.
const COMPACT_MIN: u64 = 8 << 20;

/// How much of the file one read takes while it is read through.
const CHUNK: usize = 1 << 20;

/// Snapshots in a directory (see the module documentation).
pub(crate) struct FileShelf {
    io: Arc<dyn Io>,
    dir: PathBuf,
    /// `None` until the first call that needs the file.
    open: Mutex<Option<ShelfFile>>,
}

/// The file and what it holds.
struct ShelfFile {
    file: Arc<dyn IoFile>,
    generation: u64,
    /// Where the next entry goes.
    end: u64,
    entries: HashMap<StateKey, Entry, foldhash::fast::RandomState>,
    models: Models,
    /// The bytes of the live entries, frames included.
    live: u64,
}

/// Where a key's newest entry is, and what a listing tells of it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Of the entry's body (the envelope).
    offset: u64,
    position: u64,
    saved_at_us: u64,
    len: u32,
    model: u32,
}

/// The (name, version) pairs seen, each once, by a small number.
#[derive(Default)]
struct Models {
    list: Vec<(String, u32)>,
    ids: HashMap<(String, u32), u32>,
}

impl Models {
    fn id(&mut self, name: &str, version: u32) -> u32 {
        if let Some(&id) = self.ids.get(&(name.to_owned(), version)) {
            return id;
        }
        let id = u32::try_from(self.list.len()).expect("fewer than 2^32 models");
        self.list.push((name.to_owned(), version));
        self.ids.insert((name.to_owned(), version), id);
        id
    }

    fn get(&self, id: u32) -> (&str, u32) {
        let (name, version) = &self.list[id as usize];
        (name, *version)
    }
}

impl FileShelf {
    /// The shelf in `data/snapshots`, opened when first used.
    pub(crate) fn new(io: Arc<dyn Io>, data: &Path) -> FileShelf {
        FileShelf {
            io,
            dir: data.join(DIR),
            open: Mutex::new(None),
        }
    }

    /// The open file, opened and read through now if it is not yet.
    fn open(&self) -> io::Result<MutexGuard<'_, Option<ShelfFile>>> {
        let mut guard = self.open.lock();
        if guard.is_none() {
            *guard = Some(ShelfFile::read(self.io.as_ref(), &self.dir)?);
        }
        Ok(guard)
    }

    fn path(&self, generation: u64) -> PathBuf {
        self.dir.join(file_name(generation))
    }
}

fn file_name(generation: u64) -> String {
    format!("shelf-{generation:016x}.log")
}

fn generation_of(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("shelf-")?.strip_suffix(".log")?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

fn header() -> [u8; HEADER as usize] {
    let mut header = [0; HEADER as usize];
    header[..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    header
}

/// One entry's bytes.
fn entry(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + FRAME as usize);
    out.push(kind);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

impl ShelfFile {
    /// Opens the directory's file (a new one when there is none) and reads it through.
    fn read(io: &dyn Io, dir: &Path) -> io::Result<ShelfFile> {
        io.create_dir_all(dir)?;
        let mut generations = Vec::new();
        for name in io.list(dir)? {
            match generation_of(&name) {
                Some(generation) => generations.push(generation),
                // What a compaction cut short left aside.
                None if name.ends_with(".tmp") => io.remove(&dir.join(&name))?,
                None => {}
            }
        }
        generations.sort_unstable();
        let Some(&generation) = generations.last() else {
            return ShelfFile::create(io, dir, 1);
        };
        // A lower generation is one a compaction replaced before a crash let it remove it.
        for &older in &generations[..generations.len() - 1] {
            io.remove(&dir.join(file_name(older)))?;
        }
        if generations.len() > 1 {
            io.sync_dir(dir)?;
        }
        let path = dir.join(file_name(generation));
        let file = io.open(&path, OpenMode::Existing)?;
        let len = file.len()?;
        let mut head = [0; HEADER as usize];
        if len < HEADER {
            // Its creation did not finish: nothing was kept in it.
            drop(file);
            io.remove(&path)?;
            return ShelfFile::create(io, dir, generation + 1);
        }
        read_exact_at(file.as_ref(), &mut head, 0)?;
        if &head[..8] != MAGIC {
            return Err(invalid(format!(
                "{} is not a snapshot shelf (unknown magic)",
                path.display()
            )));
        }
        let format = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if format != FORMAT {
            return Err(invalid(format!(
                "{} has format version {format}; this build reads {FORMAT}",
                path.display()
            )));
        }
        let mut open = ShelfFile {
            file,
            generation,
            end: HEADER,
            entries: HashMap::default(),
            models: Models::default(),
            live: 0,
        };
        let end = open.read_entries(len)?;
        if end < len {
            tracing::warn!(
                file = %path.display(),
                offset = end,
                cut = len - end,
                "the snapshot shelf ends in an entry a crash tore: it is cut off there"
            );
            open.file.set_len(end)?;
        }
        open.end = end;
        Ok(open)
    }

    fn create(io: &dyn Io, dir: &Path, generation: u64) -> io::Result<ShelfFile> {
        let path = dir.join(file_name(generation));
        let file = io.open(&path, OpenMode::CreateNew)?;
        file.write_at(&header(), 0)?;
        file.sync_data()?;
        io.sync_dir(dir)?;
        Ok(ShelfFile {
            file,
            generation,
            end: HEADER,
            entries: HashMap::default(),
            models: Models::default(),
            live: 0,
        })
    }

    /// Reads the entries of the file's first `len` bytes into the map; answers where the
    /// last whole entry ends.
    fn read_entries(&mut self, len: u64) -> io::Result<u64> {
        let file = self.file.clone();
        let mut offset = HEADER;
        let mut reader = Chunks::new(file.as_ref(), len);
        loop {
            let Some(frame) = reader.at(offset, 5)? else {
                return Ok(offset);
            };
            let kind = frame[0];
            let body_len = u32::from_le_bytes(frame[1..5].try_into().expect("4 bytes"));
            if !matches!(kind, PUT | REMOVE) || body_len > BODY_MAX {
                return Ok(offset);
            }
            let whole = FRAME + u64::from(body_len);
            let Some(bytes) = reader.at(offset, whole)? else {
                return Ok(offset);
            };
            let (checked, crc) = bytes.split_at(bytes.len() - 4);
            if crc32c::crc32c(checked).to_le_bytes() != crc {
                return Ok(offset);
            }
            let body = &checked[5..];
            match kind {
                PUT => match SavedState::decode(body) {
                    Ok(saved) => self.note(&saved, offset + 5, body_len),
                    Err(damage) => {
                        // Its CRC holds, so it is whole: of a format this build does not read.
                        tracing::warn!(offset, %damage, "a snapshot the shelf cannot read");
                    }
                },
                _ => match <[u8; 16]>::try_from(body) {
                    Ok(key) => self.forget(&StateKey::from_bytes(key)),
                    Err(_) => return Ok(offset),
                },
            }
            offset += whole;
        }
    }

    /// `saved`, whose envelope is at `offset`, is its key's snapshot now.
    fn note(&mut self, saved: &SavedState, offset: u64, len: u32) {
        let model = self.models.id(&saved.name, saved.version);
        let entry = Entry {
            offset,
            position: saved.position,
            saved_at_us: saved.saved_at_us,
            len,
            model,
        };
        self.live += u64::from(len) + FRAME;
        if let Some(old) = self.entries.insert(saved.key, entry) {
            self.live -= u64::from(old.len) + FRAME;
        }
    }

    fn forget(&mut self, key: &StateKey) {
        if let Some(old) = self.entries.remove(key) {
            self.live -= u64::from(old.len) + FRAME;
        }
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<u64> {
        let at = self.end;
        if let Err(e) = self.file.write_at(bytes, at) {
            // Some of it may be in the file: cut it off, so that neither a purge's scan (which
            // stops at the end) nor the next open finds what the caller was told failed.
            self.file.set_len(at)?;
            return Err(e);
        }
        self.end += bytes.len() as u64;
        Ok(at)
    }

    fn envelope(&self, entry: &Entry) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0; entry.len as usize];
        read_exact_at(self.file.as_ref(), &mut bytes, entry.offset)?;
        Ok(bytes)
    }

    fn info(&self, key: &StateKey, entry: &Entry) -> SnapshotInfo {
        let (name, version) = self.models.get(entry.model);
        SnapshotInfo {
            key: *key,
            name: name.to_owned(),
            version,
            position: entry.position,
            saved_at_us: entry.saved_at_us,
            bytes: u64::from(entry.len),
        }
    }

    /// Whether any entry of the file, live or superseded, folded a subject of `erased`
    /// before its erasure.
    fn holds_erased(&self, erased: &HashMap<String, u64>) -> io::Result<bool> {
        let mut reader = Chunks::new(self.file.as_ref(), self.end);
        let mut offset = HEADER;
        while offset < self.end {
            let frame = reader
                .at(offset, 5)?
                .ok_or_else(|| invalid("short".into()))?;
            let kind = frame[0];
            let len = u32::from_le_bytes(frame[1..5].try_into().expect("4 bytes"));
            if kind == PUT {
                let body = reader
                    .at(offset + 5, u64::from(len))?
                    .ok_or_else(|| invalid("short".into()))?;
                if SavedState::decode(body).is_ok_and(|saved| saw_erased(&saved, erased)) {
                    return Ok(true);
                }
            }
            offset += FRAME + u64::from(len);
        }
        Ok(false)
    }

    /// Writes the live entries (but those that folded a subject of `erased` before its
    /// erasure) into the next generation and makes it the file; answers how many it left out.
    fn compact(
        &mut self,
        io: &dyn Io,
        dir: &Path,
        erased: &HashMap<String, u64>,
    ) -> io::Result<u64> {
        let generation = self.generation + 1;
        let temp = dir.join(format!("{}.tmp", file_name(generation)));
        let file = io.open(&temp, OpenMode::Create)?;
        file.set_len(0)?;
        file.write_at(&header(), 0)?;
        let mut live: Vec<(StateKey, Entry)> = self.entries.iter().map(|(k, e)| (*k, *e)).collect();
        live.sort_unstable_by_key(|(_, e)| e.offset);
        let mut kept = Vec::with_capacity(live.len());
        let mut left_out = 0;
        let mut end = HEADER;
        let mut batch = Vec::with_capacity(CHUNK);
        for (key, mut e) in live {
            let envelope = self.envelope(&e)?;
            if !erased.is_empty()
                && SavedState::decode(&envelope).is_ok_and(|saved| saw_erased(&saved, erased))
            {
                left_out += 1;
                continue;
            }
            let bytes = entry(PUT, &envelope);
            e.offset = end + batch.len() as u64 + 5;
            batch.extend_from_slice(&bytes);
            if batch.len() >= CHUNK {
                file.write_at(&batch, end)?;
                end += batch.len() as u64;
                batch.clear();
            }
            kept.push((key, e));
        }
        file.write_at(&batch, end)?;
        end += batch.len() as u64;
        file.sync_data()?;
        drop(file);
        let path = dir.join(file_name(generation));
        io.rename(&temp, &path)?;
        io.sync_dir(dir)?;
        io.remove(&dir.join(file_name(self.generation)))?;
        io.sync_dir(dir)?;
        self.file = io.open(&path, OpenMode::Existing)?;
        self.generation = generation;
        self.end = end;
        self.entries.clear();
        self.live = 0;
        for (key, e) in kept {
            self.live += u64::from(e.len) + FRAME;
            self.entries.insert(key, e);
        }
        Ok(left_out)
    }

    fn wants_compaction(&self) -> bool {
        self.end > COMPACT_MIN && self.end - HEADER > 2 * self.live
    }
}

/// After a failed write or compaction the file may not be what the map says: the map is
/// dropped, and the next call reads the file through again.
fn forget_state(guard: &mut MutexGuard<'_, Option<ShelfFile>>, e: io::Error) -> io::Error {
    **guard = None;
    e
}

impl FileShelf {
    /// Compacts the file when it holds more than twice what is live. A failure is logged, not
    /// answered: what the caller asked for is done; the file is read through again next time.
    fn compact_if_due(&self, guard: &mut MutexGuard<'_, Option<ShelfFile>>) {
        let Some(open) = guard.as_mut() else { return };
        if !open.wants_compaction() {
            return;
        }
        if let Err(e) = open.compact(self.io.as_ref(), &self.dir, &HashMap::new()) {
            tracing::warn!(error = %e, dir = %self.dir.display(), "a snapshot shelf's compaction failed");
            **guard = None;
        }
    }
}

impl Shelf for FileShelf {
    fn put(
        &self,
        saved: &SavedState,
        admit: &(dyn Fn() -> io::Result<bool> + Sync),
    ) -> io::Result<Shelved> {
        let mut guard = self.open()?;
        let open = guard.as_mut().expect("opened");
        if let Some(kept) = open.entries.get(&saved.key) {
            if kept.position > saved.position {
                return Ok(Shelved::Behind {
                    kept: kept.position,
                });
            }
        }
        if !admit()? {
            return Ok(Shelved::Refused);
        }
        let envelope = saved.encode();
        let len = u32::try_from(envelope.len())
            .ok()
            .filter(|&len| len <= BODY_MAX)
            .ok_or_else(|| invalid(format!("a snapshot of {} bytes", envelope.len())))?;
        let at = match open.append(&entry(PUT, &envelope)) {
            Ok(at) => at,
            Err(e) => return Err(forget_state(&mut guard, e)),
        };
        open.note(saved, at + 5, len);
        self.compact_if_due(&mut guard);
        Ok(Shelved::Saved)
    }

    fn get(&self, key: &StateKey) -> io::Result<Option<Vec<u8>>> {
        let guard = self.open()?;
        let open = guard.as_ref().expect("opened");
        match open.entries.get(key) {
            Some(entry) => open.envelope(entry).map(Some),
            None => Ok(None),
        }
    }

    fn list(&self, filter: &SnapshotFilter) -> io::Result<Vec<SnapshotInfo>> {
        let guard = self.open()?;
        let open = guard.as_ref().expect("opened");
        let mut list: Vec<SnapshotInfo> = open
            .entries
            .iter()
            .filter(|(key, e)| {
                let (name, version) = open.models.get(e.model);
                filter.matches(name, version, key)
            })
            .map(|(key, e)| open.info(key, e))
            .collect();
        list.sort_by(|a, b| (&a.name, a.version, a.key).cmp(&(&b.name, b.version, b.key)));
        Ok(list)
    }

    fn remove(&self, filter: &SnapshotFilter) -> io::Result<u64> {
        let mut guard = self.open()?;
        let open = guard.as_mut().expect("opened");
        let keys: Vec<StateKey> = open
            .entries
            .iter()
            .filter(|(key, e)| {
                let (name, version) = open.models.get(e.model);
                filter.matches(name, version, key)
            })
            .map(|(key, _)| *key)
            .collect();
        if keys.is_empty() {
            return Ok(0);
        }
        let mut bytes = Vec::with_capacity(keys.len() * (16 + FRAME as usize));
        for key in &keys {
            bytes.extend_from_slice(&entry(REMOVE, key.as_bytes()));
        }
        if let Err(e) = open.append(&bytes).and_then(|_| open.file.sync_data()) {
            return Err(forget_state(&mut guard, e));
        }
        for key in &keys {
            open.forget(key);
        }
        self.compact_if_due(&mut guard);
        Ok(keys.len() as u64)
    }

    fn purge(&self, erased: &HashMap<String, u64>) -> io::Result<u64> {
        if erased.is_empty() {
            return Ok(0);
        }
        let mut guard = self.open()?;
        let open = guard.as_mut().expect("opened");
        if !open.holds_erased(erased)? {
            return Ok(0);
        }
        let compacted = open.compact(self.io.as_ref(), &self.dir, erased);
        compacted.map_err(|e| forget_state(&mut guard, e))
    }

    fn stats(&self) -> io::Result<ShelfStats> {
        let guard = self.open()?;
        let open = guard.as_ref().expect("opened");
        Ok(ShelfStats {
            count: open.entries.len() as u64,
            bytes: open.entries.values().map(|e| u64::from(e.len)).sum(),
            stored_bytes: open.end,
        })
    }

    fn other_versions(
        &self,
        name: &str,
        version: u32,
        key_of: &dyn Fn(u32) -> StateKey,
    ) -> io::Result<Vec<u32>> {
        let guard = self.open()?;
        let open = guard.as_ref().expect("opened");
        let mut versions: Vec<u32> = open
            .models
            .list
            .iter()
            .filter(|(n, v)| n == name && *v != version)
            .map(|(_, v)| *v)
            .filter(|&v| open.entries.contains_key(&key_of(v)))
            .collect();
        versions.sort_unstable();
        Ok(versions)
    }

    fn locate(&self) -> PathBuf {
        match self.open.lock().as_ref() {
            Some(open) => self.path(open.generation),
            None => self.dir.clone(),
        }
    }
}

/// A file read through in chunks: what [`Chunks::at`] answers stays valid until the next call.
struct Chunks<'f> {
    file: &'f dyn IoFile,
    len: u64,
    buf: Vec<u8>,
    /// The file offset of `buf[0]`.
    start: u64,
}

impl<'f> Chunks<'f> {
    fn new(file: &'f dyn IoFile, len: u64) -> Chunks<'f> {
        Chunks {
            file,
            len,
            buf: Vec::new(),
            start: 0,
        }
    }

    /// The `n` bytes at `offset`, or `None` when the file ends before them.
    fn at(&mut self, offset: u64, n: u64) -> io::Result<Option<&[u8]>> {
        if offset + n > self.len {
            return Ok(None);
        }
        let within = offset >= self.start && offset + n <= self.start + self.buf.len() as u64;
        if !within {
            let want = (n as usize).max(CHUNK).min((self.len - offset) as usize);
            self.buf.resize(want, 0);
            read_exact_at(self.file, &mut self.buf, offset)?;
            self.start = offset;
        }
        let from = (offset - self.start) as usize;
        Ok(Some(&self.buf[from..from + n as usize]))
    }
}
