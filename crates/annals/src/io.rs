//! The one narrow door to the disk.
//!
//! Every byte Annals reads or writes goes through [`Io`] and [`IoFile`]. [`RealIo`] maps them to
//! the operating system; [`crate::sim::SimIo`] keeps files in memory, can crash in the ways a real
//! disk can, and injects errors, so that the recovery code is tested against the fault model
//! written down in docs/ARCHITECTURE.md.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// The file must exist.
    Existing,
    /// Create the file if it is missing.
    Create,
    /// Create the file; fail if it exists.
    CreateNew,
}

/// A held exclusive lock on a data directory; released on drop.
pub trait DirLock: Send + Sync {}

/// File-system operations, the only ones the storage layer uses.
pub trait Io: Send + Sync + 'static {
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>>;
    /// The names of the files directly in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes an exclusive lock, failing at once with `WouldBlock` when another holder has it.
    fn lock(&self, path: &Path) -> io::Result<Box<dyn DirLock>>;
    /// Whether this I/O layer keeps data across processes (false for an in-memory store).
    fn is_persistent(&self) -> bool {
        true
    }
    /// The bytes that files in `dir` may still grow by (the file system's space available to
    /// this process), or None where that is not known.
    fn available_bytes(&self, dir: &Path) -> io::Result<Option<u64>> {
        let _ = dir;
        Ok(None)
    }
}

/// Whether an I/O error means the file system has no room for what was asked (ENOSPC, or a
/// quota's EDQUOT).
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == io::ErrorKind::StorageFull
}

/// One open file.
pub trait IoFile: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync: the written data (and the metadata needed to read it) is durable on success.
    fn sync_data(&self) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves space so the file is at least `len` bytes long, reading as zeros beyond what was
    /// written, and later writes inside it change no file size (fallocate where supported).
    fn allocate(&self, len: u64) -> io::Result<()> {
        if self.len()? < len {
            self.set_len(len)?;
        }
        Ok(())
    }
    /// A read-only view of the whole file as it is now long, if this layer can map files.
    /// Writes through `write_at` become visible in the view (a shared page cache).
    fn map(&self) -> io::Result<Option<Bytes>> {
        Ok(None)
    }
}

/// Reads exactly `buf.len()` bytes or fails with `UnexpectedEof`.
pub fn read_exact_at(file: &dyn IoFile, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        let n = file.read_at(buf, offset)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the file",
            ));
        }
        buf = &mut buf[n..];
        offset += n as u64;
    }
    Ok(())
}

/// Replaces `dir/name` with `bytes` so that a crash leaves the old file or the new one whole,
/// never a mix: written aside (`name.tmp`), synced, renamed, then the directory synced.
/// Creates `dir` when missing. For files kept beside a log (checkpoints, snapshots).
pub fn write_file_durably(io: &dyn Io, dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    io.create_dir_all(dir)?;
    let temp = dir.join(format!("{name}.tmp"));
    let file = io.open(&temp, OpenMode::Create)?;
    file.set_len(0)?;
    file.write_at(bytes, 0)?;
    file.sync_data()?;
    drop(file);
    io.rename(&temp, &dir.join(name))?;
    io.sync_dir(dir)
}

/// The whole content of a file, or `None` when it does not exist.
pub fn read_file(io: &dyn Io, path: &Path) -> io::Result<Option<Vec<u8>>> {
    let file = match io.open(path, OpenMode::Existing) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = usize::try_from(file.len()?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file too large"))?;
    let mut bytes = vec![0; len];
    read_exact_at(file.as_ref(), &mut bytes, 0)?;
    Ok(Some(bytes))
}

/// Removes `dir/name` and syncs the directory; a missing file is not an error.
pub fn remove_file_durably(io: &dyn Io, dir: &Path, name: &str) -> io::Result<()> {
    match io.remove(&dir.join(name)) {
        Ok(()) => io.sync_dir(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealIo;

struct RealFile(File);

struct RealLock(#[allow(dead_code)] File);
impl DirLock for RealLock {}

impl Io for RealIo {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn IoFile>> {
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        match mode {
            OpenMode::Existing => {}
            OpenMode::Create => {
                options.create(true);
            }
            OpenMode::CreateNew => {
                options.create_new(true);
            }
        }
        Ok(Arc::new(RealFile(options.open(path)?)))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn available_bytes(&self, dir: &Path) -> io::Result<Option<u64>> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
        // SAFETY: statvfs reads the NUL-terminated path and fills the struct it is given.
        let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above; both pointers are valid for the call.
        if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(stats.f_bavail.saturating_mul(stats.f_frsize)))
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn DirLock>> {
        use std::os::fd::AsRawFd;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        // SAFETY: flock is called on a file descriptor this function owns for the call's length.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Box::new(RealLock(file)))
    }
}

impl IoFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let len_signed = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
        // SAFETY: fallocate on a file descriptor this handle owns; no memory is passed.
        let rc = unsafe { libc::fallocate(self.0.as_raw_fd(), 0, 0, len_signed) };
        if rc == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(error);
        }
        // No fallocate on this file system: write zeros so the space is really reserved.
        let zeros = vec![0u8; 1 << 20];
        let mut at = self.len()?;
        while at < len {
            let n = (len - at).min(zeros.len() as u64) as usize;
            self.0.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }

    fn map(&self) -> io::Result<Option<Bytes>> {
        if self.len()? == 0 {
            return Ok(None);
        }
        // SAFETY: Annals never shrinks a segment file while it is mapped: torn tails are
        // overwritten with zeros, not truncated, and only recovery (before any mapping exists)
        // changes a file's length. Another process that truncates the file breaks this contract;
        // the directory lock exists to keep other Annals processes out.
        let map = unsafe { memmap2::Mmap::map(&self.0)? };
        Ok(Some(Bytes::from_owner(map)))
    }
}
