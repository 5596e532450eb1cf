//! A simulated, fault-injecting file system behind the [`Io`] trait.
//!
//! Each file keeps a live image (what reads see) and a durable image (what survives a crash),
//! plus the list of writes made since the last sync. Directory entries are durable only after
//! `sync_dir`. [`SimIo::crash`] turns the live state into what a power loss could leave behind,
//! in one of the [`CrashMode`]s; `fail_*` methods inject EIO or ENOSPC on writes and syncs.
//! Everything is deterministic given the seed.
//!
//! The same type, built with [`SimIo::memory`], is the backend of a D0 (memory only) store: it
//! then keeps no durable image and no history.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::io::{DirLock, Io, IoFile, OpenMode};

/// What a simulated crash leaves of the writes that were not yet synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unsynced write is lost.
    DropUnsynced,
    /// A random prefix of the unsynced writes survives, in order.
    KeepPrefix,
    /// A random subset of the unsynced writes survives.
    KeepSubset,
    /// A prefix survives, and the next write survives only in some of its 512-byte sectors.
    TearWrite,
    /// A prefix survives, and the next write's range holds random garbage.
    GarbageTail,
    /// Unsynced directory entries are lost (and a random subset of unsynced writes survives).
    LostDirEntry,
}

impl CrashMode {
    pub const ALL: [CrashMode; 6] = [
        CrashMode::DropUnsynced,
        CrashMode::KeepPrefix,
        CrashMode::KeepSubset,
        CrashMode::TearWrite,
        CrashMode::GarbageTail,
        CrashMode::LostDirEntry,
    ];
}

/// Which error an injected fault returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    Eio,
    NoSpace,
}

impl FaultKind {
    fn error(self) -> io::Error {
        match self {
            FaultKind::Eio => io::Error::from_raw_os_error(libc::EIO),
            FaultKind::NoSpace => io::Error::from_raw_os_error(libc::ENOSPC),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Fault {
    /// Fails the operation when the countdown reaches zero.
    countdown: u64,
    kind: FaultKind,
    persistent: bool,
    fired: bool,
}

impl Fault {
    fn check(slot: &mut Option<Fault>) -> io::Result<()> {
        if let Some(fault) = slot {
            if fault.fired {
                if fault.persistent {
                    return Err(fault.kind.error());
                }
                return Ok(());
            }
            if fault.countdown == 0 {
                fault.fired = true;
                return Err(fault.kind.error());
            }
            fault.countdown -= 1;
        }
        Ok(())
    }
}

enum Change {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Default)]
struct Image {
    live: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<Change>,
}

fn apply_write(target: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let offset = offset as usize;
    let end = offset + data.len();
    if target.len() < end {
        target.resize(end, 0);
    }
    target[offset..end].copy_from_slice(data);
}

fn apply(target: &mut Vec<u8>, change: &Change) {
    match change {
        Change::Write { offset, data } => apply_write(target, *offset, data),
        Change::SetLen(len) => target.resize(*len as usize, 0),
    }
}

type FileData = Arc<Mutex<Image>>;

struct DiskState {
    /// Bumped by every crash; handles from an earlier epoch fail with EIO.
    epoch: u64,
    live: HashMap<PathBuf, FileData>,
    durable: HashMap<PathBuf, FileData>,
    locks: HashSet<PathBuf>,
    write_fault: Option<Fault>,
    sync_fault: Option<Fault>,
    rng: u64,
    writes: u64,
    syncs: u64,
    /// Files preallocated through `IoFile::allocate` (as fallocate would).
    allocations: u64,
    /// Set by [`SimIo::hold_syncs`]: file syncs wait for a pass.
    syncs_held: bool,
    /// Syncs let through while held.
    sync_passes: u64,
    /// The threads of the syncs waiting for a pass.
    sync_threads: Vec<std::thread::ThreadId>,
    /// The bytes all live files may hold together (a small file system); None: unbounded.
    capacity: Option<u64>,
    /// Whether `available_bytes` tells the room left (else the store finds out by ENOSPC).
    tells_available: bool,
}

impl DiskState {
    fn next_random(&mut self) -> u64 {
        // xorshift64*: small, fast and deterministic for a given seed.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_random() % n
        }
    }
}

/// The simulated file system. Cloning shares the same files.
#[derive(Clone)]
pub struct SimIo {
    state: Arc<Mutex<DiskState>>,
    /// Wakes file syncs held by [`SimIo::hold_syncs`].
    sync_gate: Arc<Condvar>,
    epoch: u64,
    /// False for a memory-only store: no durable image and no history are kept.
    track: bool,
}

impl SimIo {
    /// A crash-capable simulated disk; `seed` drives every random choice.
    pub fn new(seed: u64) -> Self {
        Self::build(seed, true)
    }

    /// Plain memory files for a D0 store; `crash` is not meaningful on it.
    pub fn memory() -> Self {
        Self::build(1, false)
    }

    fn build(seed: u64, track: bool) -> Self {
        SimIo {
            epoch: 0,
            sync_gate: Arc::new(Condvar::new()),
            state: Arc::new(Mutex::new(DiskState {
                epoch: 0,
                live: HashMap::new(),
                durable: HashMap::new(),
                locks: HashSet::new(),
                write_fault: None,
                sync_fault: None,
                rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                writes: 0,
                allocations: 0,
                syncs: 0,
                syncs_held: false,
                sync_passes: 0,
                sync_threads: Vec::new(),
                capacity: None,
                tells_available: true,
            })),
            track,
        }
    }

    /// The `n`-th write from now (0 = the next one) fails; if `persistent`, so does every later one.
    pub fn fail_write(&self, n: u64, kind: FaultKind, persistent: bool) {
        self.state.lock().write_fault = Some(Fault {
            countdown: n,
            kind,
            persistent,
            fired: false,
        });
    }

    /// The `n`-th file sync from now fails; if `persistent`, so does every later one.
    pub fn fail_sync(&self, n: u64, kind: FaultKind, persistent: bool) {
        self.state.lock().sync_fault = Some(Fault {
            countdown: n,
            kind,
            persistent,
            fired: false,
        });
    }

    /// Bounds the bytes all live files may hold together, as a small file system does: a write,
    /// `set_len` or `allocate` that would grow them beyond it fails with ENOSPC and changes
    /// nothing. None removes the bound (the file system grown).
    pub fn set_capacity(&self, capacity: Option<u64>) {
        self.state.lock().capacity = capacity;
    }

    /// Whether the file system tells how much room is left (`Io::available_bytes`); when it
    /// does not, the store finds out from ENOSPC.
    pub fn tell_available(&self, tells: bool) {
        self.state.lock().tells_available = tells;
    }

    /// Whether an injected fault has failed an operation yet.
    pub fn fault_fired(&self) -> bool {
        let state = self.state.lock();
        [state.write_fault, state.sync_fault]
            .iter()
            .any(|f| f.is_some_and(|f| f.fired))
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        let mut state = self.state.lock();
        state.write_fault = None;
        state.sync_fault = None;
    }

    /// From now on every file sync waits (as on a disk that has stalled) until
    /// [`SimIo::let_syncs_through`] or [`SimIo::release_syncs`] lets it go.
    pub fn hold_syncs(&self) {
        let mut state = self.state.lock();
        state.syncs_held = true;
        state.sync_passes = 0;
    }

    /// Lets `n` held file syncs (waiting now or to come) go.
    pub fn let_syncs_through(&self, n: u64) {
        self.state.lock().sync_passes += n;
        self.sync_gate.notify_all();
    }

    /// Ends [`SimIo::hold_syncs`]: every file sync goes.
    pub fn release_syncs(&self) {
        self.state.lock().syncs_held = false;
        self.sync_gate.notify_all();
    }

    /// How many file syncs are waiting for a pass.
    pub fn syncs_waiting(&self) -> u64 {
        self.state.lock().sync_threads.len() as u64
    }

    /// The threads whose file syncs wait for a pass.
    pub fn threads_in_sync(&self) -> Vec<std::thread::ThreadId> {
        self.state.lock().sync_threads.clone()
    }

    /// How many writes and file syncs have been made.
    pub fn counts(&self) -> (u64, u64) {
        let state = self.state.lock();
        (state.writes, state.syncs)
    }

    /// How many times a file was preallocated with `IoFile::allocate` (fallocate on a real
    /// disk) rather than written.
    pub fn allocations(&self) -> u64 {
        self.state.lock().allocations
    }

    /// Simulates a power loss: every open handle and this `SimIo` are cut off (they fail with
    /// EIO from now on), locks are released, and each file keeps its durable image plus what
    /// `mode` lets survive of the unsynced writes. Returns the handle to the disk after the crash.
    pub fn crash(&self, mode: CrashMode) -> SimIo {
        assert!(self.track, "a memory-only SimIo cannot crash");
        let mut state = self.state.lock();
        state.epoch += 1;
        let live = std::mem::take(&mut state.live);
        let durable = std::mem::take(&mut state.durable);
        let mut survivors: HashMap<PathBuf, FileData> = HashMap::new();
        // Durable entries survive; unsynced entry changes survive by chance, never in
        // LostDirEntry mode.
        let mut paths: Vec<&PathBuf> = live.keys().chain(durable.keys()).collect();
        paths.sort();
        paths.dedup();
        for path in paths {
            let live_data = live.get(path);
            let durable_data = durable.get(path);
            let keep_unsynced_entry = mode != CrashMode::LostDirEntry && state.below(2) == 0;
            let chosen = match (live_data, durable_data) {
                (Some(l), Some(d)) if Arc::ptr_eq(l, d) => Some(l.clone()),
                (l, d) => {
                    if keep_unsynced_entry {
                        l.cloned()
                    } else {
                        d.cloned()
                    }
                }
            };
            if let Some(data) = chosen {
                let image = data.lock();
                let content = Self::after_crash(&mut state, &image, mode);
                survivors.insert(
                    path.clone(),
                    Arc::new(Mutex::new(Image {
                        live: content.clone(),
                        durable: content,
                        unsynced: Vec::new(),
                    })),
                );
            }
        }
        state.durable = survivors.clone();
        state.live = survivors;
        state.locks.clear();
        state.syncs_held = false;
        self.sync_gate.notify_all();
        SimIo {
            state: self.state.clone(),
            sync_gate: self.sync_gate.clone(),
            epoch: state.epoch,
            track: self.track,
        }
    }

    fn live_state(&self) -> io::Result<parking_lot::MutexGuard<'_, DiskState>> {
        let state = self.state.lock();
        if state.epoch != self.epoch {
            return Err(crashed());
        }
        Ok(state)
    }

    /// The live content of a file, for tests that damage files by hand.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.state.lock();
        let data = state.live.get(path)?.clone();
        let content = data.lock().live.clone();
        Some(content)
    }

    /// Replaces a file's content, durably (as if written and synced, directory entry included).
    pub fn write_file(&self, path: &Path, content: &[u8]) {
        let mut state = self.state.lock();
        let data: FileData = Arc::new(Mutex::new(Image {
            live: content.to_vec(),
            durable: content.to_vec(),
            unsynced: Vec::new(),
        }));
        state.live.insert(path.to_path_buf(), data.clone());
        state.durable.insert(path.to_path_buf(), data);
    }

    /// Removes a file durably.
    pub fn delete_file(&self, path: &Path) {
        let mut state = self.state.lock();
        state.live.remove(path);
        state.durable.remove(path);
    }

    /// The names of the files in `dir`.
    pub fn file_names(&self, dir: &Path) -> Vec<String> {
        let state = self.state.lock();
        let mut names: Vec<String> = state
            .live
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    fn after_crash(state: &mut DiskState, image: &Image, mode: CrashMode) -> Vec<u8> {
        let mut content = image.durable.clone();
        let n = image.unsynced.len() as u64;
        match mode {
            CrashMode::DropUnsynced => {}
            CrashMode::KeepPrefix => {
                let keep = state.below(n + 1) as usize;
                for change in &image.unsynced[..keep] {
                    apply(&mut content, change);
                }
            }
            CrashMode::KeepSubset | CrashMode::LostDirEntry => {
                for change in &image.unsynced {
                    if state.below(2) == 0 {
                        apply(&mut content, change);
                    }
                }
            }
            CrashMode::TearWrite | CrashMode::GarbageTail => {
                let keep = state.below(n + 1) as usize;
                for change in &image.unsynced[..keep] {
                    apply(&mut content, change);
                }
                if let Some(Change::Write { offset, data }) = image.unsynced.get(keep) {
                    if mode == CrashMode::TearWrite {
                        for (i, sector) in data.chunks(512).enumerate() {
                            if state.below(2) == 0 {
                                apply_write(&mut content, offset + (i * 512) as u64, sector);
                            }
                        }
                    } else {
                        let garbage: Vec<u8> =
                            (0..data.len()).map(|_| state.next_random() as u8).collect();
                        apply_write(&mut content, *offset, &garbage);
                    }
                }
            }
        }
        content
    }
}

struct SimLock {
    state: Arc<Mutex<DiskState>>,
    path: PathBuf,
}

impl DirLock for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.state.lock().locks.remove(&self.path);
    }
}

struct SimFile {
    data: FileData,
    state: Arc<Mutex<DiskState>>,
    sync_gate: Arc<Condvar>,
    epoch: u64,
    track: bool,
}

fn crashed() -> io::Error {
    io::Error::other("simulated crash: this handle is gone")
}

impl SimFile {
    /// Every file operation holds the state lock for its whole length, so a crash happens
    /// strictly before or after it.
    fn live_state(&self) -> io::Result<parking_lot::MutexGuard<'_, DiskState>> {
        let state = self.state.lock();
        if state.epoch != self.epoch {
            return Err(crashed());
        }
        Ok(state)
    }
}

impl Io for SimIo {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        // Directories are implied by the paths of their files; only the epoch is checked.
        let _ = path;
        drop(self.live_state()?);
        Ok(())
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>> {
        let mut state = self.live_state()?;
        let existing = state.live.get(path).cloned();
        let data = match (existing, mode) {
            (Some(_), OpenMode::CreateNew) => {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "file exists"))
            }
            (Some(data), _) => data,
            (None, OpenMode::Existing) => {
                return Err(io::Error::new(io::ErrorKind::NotFound, "file not found"))
            }
            (None, _) => {
                let data: FileData = Arc::new(Mutex::new(Image::default()));
                state.live.insert(path.to_path_buf(), data.clone());
                data
            }
        };
        Ok(Arc::new(SimFile {
            data,
            state: self.state.clone(),
            sync_gate: self.sync_gate.clone(),
            epoch: self.epoch,
            track: self.track,
        }))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        drop(self.live_state()?);
        Ok(self.file_names(dir))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.live_state()?
            .live
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "file not found"))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.live_state()?;
        let data = state
            .live
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "file not found"))?;
        state.live.insert(to.to_path_buf(), data);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.live_state()?;
        Fault::check(&mut state.sync_fault)?;
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        state.durable.retain(|p, _| !in_dir(p));
        let entries: Vec<(PathBuf, FileData)> = state
            .live
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, d)| (p.clone(), d.clone()))
            .collect();
        state.durable.extend(entries);
        Ok(())
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn DirLock>> {
        let mut state = self.live_state()?;
        if !state.locks.insert(path.to_path_buf()) {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        Ok(Box::new(SimLock {
            state: self.state.clone(),
            path: path.to_path_buf(),
        }))
    }

    fn is_persistent(&self) -> bool {
        self.track
    }

    fn available_bytes(&self, dir: &Path) -> io::Result<Option<u64>> {
        let _ = dir;
        let state = self.live_state()?;
        if !state.tells_available {
            return Ok(None);
        }
        Ok(state
            .capacity
            .map(|capacity| capacity.saturating_sub(state.used_bytes())))
    }
}

impl DiskState {
    /// Fails with ENOSPC when `file`, `len` bytes long now, may not grow to `to`.
    fn room_for(&self, file: &FileData, len: u64, to: u64) -> io::Result<()> {
        let Some(capacity) = self.capacity else {
            return Ok(());
        };
        if to <= len {
            return Ok(());
        }
        let others: u64 = self
            .live
            .values()
            .filter(|f| !Arc::ptr_eq(f, file))
            .map(|f| f.lock().live.len() as u64)
            .sum();
        if others + to > capacity {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }

    fn used_bytes(&self) -> u64 {
        self.live.values().map(|f| f.lock().live.len() as u64).sum()
    }
}

impl IoFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let _state = self.live_state()?;
        let image = self.data.lock();
        let start = (offset as usize).min(image.live.len());
        let end = (start + buf.len()).min(image.live.len());
        buf[..end - start].copy_from_slice(&image.live[start..end]);
        Ok(end - start)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.live_state()?;
        state.writes += 1;
        Fault::check(&mut state.write_fault)?;
        let len = self.data.lock().live.len() as u64;
        state.room_for(&self.data, len, offset + buf.len() as u64)?;
        let mut image = self.data.lock();
        apply_write(&mut image.live, offset, buf);
        if self.track {
            image.unsynced.push(Change::Write {
                offset,
                data: buf.to_vec(),
            });
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.live_state()?;
        while state.syncs_held && state.sync_passes == 0 {
            let thread = std::thread::current().id();
            state.sync_threads.push(thread);
            self.sync_gate.wait(&mut state);
            if let Some(i) = state.sync_threads.iter().position(|&t| t == thread) {
                state.sync_threads.swap_remove(i);
            }
            if state.epoch != self.epoch {
                return Err(crashed());
            }
        }
        if state.syncs_held {
            state.sync_passes -= 1;
        }
        state.syncs += 1;
        Fault::check(&mut state.sync_fault)?;
        if self.track {
            let mut image = self.data.lock();
            let changes = std::mem::take(&mut image.unsynced);
            for change in &changes {
                apply(&mut image.durable, change);
            }
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let _state = self.live_state()?;
        Ok(self.data.lock().live.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let state = self.live_state()?;
        let now = self.data.lock().live.len() as u64;
        state.room_for(&self.data, now, len)?;
        let mut image = self.data.lock();
        image.live.resize(len as usize, 0);
        if self.track {
            image.unsynced.push(Change::SetLen(len));
        }
        Ok(())
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.live_state()?.allocations += 1;
        if self.len()? < len {
            self.set_len(len)?;
        }
        Ok(())
    }
}
