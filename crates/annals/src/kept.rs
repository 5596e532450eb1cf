//! A copy of the log kept in a directory across restarts (a `mirror` or `copy` in
//! [`crate::Location`]): a PostgreSQL store's mirror, or a read replica's copy of its backup.
//!
//! A store on PostgreSQL, and a read replica, keep a copy of the log in a file store of their
//! own (the mirror, see `Store::open_postgres` and `Store::open_replica`). By default that
//! copy lives in a temporary directory and the whole log is read again from where it lives
//! (the database, the backup), and written again, at every open. A kept mirror survives a
//! clean close, so the next open reads only what was committed (or shipped) since.
//!
//! The directory holds `LOCK` (held while a store uses the mirror), `log/` (the file store) and,
//! only between a clean close and the next open, `closed`: the head the mirror held and its last
//! append as the database stored it. The marker is removed at open before anything is written to
//! the mirror, so a mirror whose server crashed, was killed or lost power is never trusted: its
//! writes were never synced (the database or the backup holds the truth), and it is rebuilt. A
//! mirror that was closed cleanly is used only if its source still holds that last append at the
//! same positions, with the same append time and size; otherwise (another database or backup, or
//! one restored or failed over to a copy that lacks it) it is rebuilt as well.

// A build with neither PostgreSQL nor object storage keeps no copy; the seam still speaks of
// a copy's last append (`Log::stop`).
#![cfg_attr(
    not(any(feature = "postgres", feature = "object-store")),
    allow(dead_code)
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::StoreError;
use crate::io::{DirLock, Io, OpenMode};

const LOCK: &str = "LOCK";
const LOG: &str = "log";
const CLOSED: &str = "closed";
const CLOSED_TEMP: &str = "closed.tmp";
/// The first word of the marker, and its version.
const MAGIC: &str = "annals-mirror 1";

/// What identifies an append where the log lives: positions, append time, body size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AppendStamp {
    pub(crate) first: u64,
    pub(crate) last: u64,
    pub(crate) at: u64,
    pub(crate) bytes: u64,
}

impl AppendStamp {
    #[cfg(feature = "postgres")]
    pub(crate) fn of(
        first: u64,
        last: u64,
        at: u64,
        append: &crate::record::EncodedAppend,
    ) -> AppendStamp {
        AppendStamp {
            first,
            last,
            at,
            bytes: append.body.len() as u64,
        }
    }
}

/// What a clean close left: the mirror's head and its last append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed {
    pub(crate) head: u64,
    pub(crate) last: AppendStamp,
}

impl Closed {
    fn render(&self) -> String {
        let l = &self.last;
        format!(
            "{MAGIC} head={} first={} last={} at={} bytes={}\n",
            self.head, l.first, l.last, l.at, l.bytes
        )
    }

    fn parse(text: &str) -> Option<Closed> {
        let rest = text.strip_prefix(MAGIC)?.strip_suffix('\n')?;
        let mut values = [0u64; 5];
        let mut words = rest.split(' ').skip(1);
        for (value, name) in values
            .iter_mut()
            .zip(["head", "first", "last", "at", "bytes"])
        {
            let (key, number) = words.next()?.split_once('=')?;
            if key != name {
                return None;
            }
            *value = number.parse().ok()?;
        }
        if words.next().is_some() {
            return None;
        }
        let [head, first, last, at, bytes] = values;
        let fits = if head == 0 {
            first == 0 && last == 0
        } else {
            first >= 1 && first <= last && last == head
        };
        fits.then_some(Closed {
            head,
            last: AppendStamp {
                first,
                last,
                at,
                bytes,
            },
        })
    }
}

/// A mirror directory this process holds.
pub(crate) struct KeptMirror {
    io: Arc<dyn Io>,
    dir: PathBuf,
    _lock: Box<dyn DirLock>,
}

impl KeptMirror {
    /// Takes the directory (made if missing) and reads what its last clean close left, or why
    /// there is none; the caller then rebuilds the mirror ([`KeptMirror::wipe`]). The record
    /// stays until [`KeptMirror::consume`], so that an open that fails before it (the database
    /// unreachable, say) leaves the mirror as trusted as it found it.
    pub(crate) fn claim(
        io: Arc<dyn Io>,
        dir: &Path,
    ) -> Result<(KeptMirror, Result<Closed, String>), StoreError> {
        let fail =
            |op: &'static str, path: &Path, e: std::io::Error| StoreError::io(op, path, 0, e);
        io.create_dir_all(dir)
            .map_err(|e| fail("create mirror directory", dir, e))?;
        let lock = io.lock(&dir.join(LOCK)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                StoreError::Locked {
                    path: dir.to_path_buf(),
                }
            } else {
                fail("lock mirror directory", &dir.join(LOCK), e)
            }
        })?;
        let kept = KeptMirror {
            io: io.clone(),
            dir: dir.to_path_buf(),
            _lock: lock,
        };
        let names = io
            .list(dir)
            .map_err(|e| fail("list mirror directory", dir, e))?;
        let marker = dir.join(CLOSED);
        let closed = if names.iter().any(|n| n == CLOSED) {
            let text = read_small(io.as_ref(), &marker)
                .map_err(|e| fail("read mirror marker", &marker, e))?;
            Closed::parse(&text).ok_or_else(|| format!("its marker is malformed ({text:?})"))
        } else if kept.holds_a_log()? {
            Err("it was not closed cleanly (its server crashed or was killed)".to_string())
        } else {
            Err("none was kept here yet".to_string())
        };
        Ok((kept, closed))
    }

    /// Whether the file store's directory holds any file.
    fn holds_a_log(&self) -> Result<bool, StoreError> {
        let log = self.log_dir();
        match self.io.list(&log) {
            Ok(names) => Ok(!names.is_empty()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StoreError::io("list mirror log", &log, 0, e)),
        }
    }

    /// The file store's directory.
    /// The directory itself (its `log/` is the copy of the log, wiped when it is rebuilt).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn log_dir(&self) -> PathBuf {
        self.dir.join(LOG)
    }

    /// Removes the record of a clean close, before anything is written to the mirror: from
    /// here on it is not closed, until [`KeptMirror::close`].
    pub(crate) fn consume(&self) -> Result<(), StoreError> {
        let marker = self.dir.join(CLOSED);
        match self.io.remove(&marker) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(StoreError::io("remove mirror marker", &marker, 0, e)),
        }
        self.io
            .sync_dir(&self.dir)
            .map_err(|e| StoreError::io("sync mirror directory", &self.dir, 0, e))
    }

    /// Removes the file store (and any record of a clean close), so that it is made anew and
    /// filled from the database.
    pub(crate) fn wipe(&self) -> Result<(), StoreError> {
        self.consume()?;
        let log = self.log_dir();
        let names = match self.io.list(&log) {
            Ok(names) => names,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(StoreError::io("list mirror log", &log, 0, e)),
        };
        for name in names {
            let path = log.join(name);
            self.io
                .remove(&path)
                .map_err(|e| StoreError::io("remove mirror file", &path, 0, e))?;
        }
        self.io
            .sync_dir(&log)
            .map_err(|e| StoreError::io("sync mirror log", &log, 0, e))
    }

    /// Records a clean close, once the file store is synced and checkpointed: written to a
    /// temporary file, synced, renamed into place, the directory synced.
    pub(crate) fn close(&self, closed: Closed) -> Result<(), StoreError> {
        debug_assert_eq!(
            Closed::parse(&closed.render()),
            Some(closed),
            "a marker reads back as written"
        );
        let temp = self.dir.join(CLOSED_TEMP);
        let err = |op, e| StoreError::io(op, &temp, 0, e);
        let file = self
            .io
            .open(&temp, OpenMode::Create)
            .map_err(|e| err("create mirror marker", e))?;
        file.set_len(0)
            .map_err(|e| err("truncate mirror marker", e))?;
        file.write_at(closed.render().as_bytes(), 0)
            .map_err(|e| err("write mirror marker", e))?;
        file.sync_data().map_err(|e| err("sync mirror marker", e))?;
        self.io
            .rename(&temp, &self.dir.join(CLOSED))
            .map_err(|e| err("rename mirror marker", e))?;
        self.io
            .sync_dir(&self.dir)
            .map_err(|e| StoreError::io("sync mirror directory", &self.dir, 0, e))
    }
}

/// A small file's text.
fn read_small(io: &dyn Io, path: &Path) -> std::io::Result<String> {
    let file = io.open(path, OpenMode::Existing)?;
    let len = file.len()?;
    if len > 4096 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "larger than a marker",
        ));
    }
    let mut bytes = vec![0; len as usize];
    crate::io::read_exact_at(file.as_ref(), &mut bytes, 0)?;
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimIo;

    fn closed(head: u64) -> Closed {
        Closed {
            head,
            last: AppendStamp {
                first: head.saturating_sub(2).max(1),
                last: head,
                at: 1_700_000_000_000_000,
                bytes: 321,
            },
        }
    }

    /// Goal: a kept mirror's clean-close marker reads back as written, and a marker that is cut, of
    /// another version, inconsistent, out of order, with extra fields or not a number is not
    /// trusted.
    #[test]
    fn a_marker_reads_back_and_a_bad_one_does_not() {
        let c = closed(10);
        assert_eq!(Closed::parse(&c.render()), Some(c));
        let empty = Closed {
            head: 0,
            last: AppendStamp::default(),
        };
        assert_eq!(Closed::parse(&empty.render()), Some(empty));
        for bad in [
            "",
            "annals-mirror 1 head=10 first=8 last=10 at=1 bytes=2",
            "annals-mirror 2 head=10 first=8 last=10 at=1 bytes=2\n",
            "annals-mirror 1 head=10 first=8 last=9 at=1 bytes=2\n",
            "annals-mirror 1 head=10 first=11 last=10 at=1 bytes=2\n",
            "annals-mirror 1 head=10 last=10 first=8 at=1 bytes=2\n",
            "annals-mirror 1 head=10 first=8 last=10 at=1 bytes=2 more=1\n",
            "annals-mirror 1 head=x first=8 last=10 at=1 bytes=2\n",
        ] {
            assert_eq!(Closed::parse(bad), None, "{bad:?}");
        }
    }

    /// Goal: a kept mirror is claimed by one holder at a time and trusted only after a clean close,
    /// until an open consumes it; an open that failed before writing leaves it trusted, and a wiped
    /// mirror is empty.
    #[test]
    fn a_mirror_is_trusted_once_after_a_clean_close() {
        let io: Arc<dyn Io> = Arc::new(SimIo::new(1));
        let dir = Path::new("/kept");
        let (kept, closed_before) = KeptMirror::claim(io.clone(), dir).unwrap();
        assert!(closed_before.unwrap_err().contains("none was kept"));
        io.create_dir_all(&kept.log_dir()).unwrap();
        let segment = kept.log_dir().join("segment");
        io.open(&segment, OpenMode::Create).unwrap();
        // A second holder is refused while the first holds it.
        assert!(matches!(
            KeptMirror::claim(io.clone(), dir),
            Err(StoreError::Locked { .. })
        ));
        kept.close(closed(7)).unwrap();
        drop(kept);
        let (kept, found) = KeptMirror::claim(io.clone(), dir).unwrap();
        assert_eq!(found, Ok(closed(7)));
        drop(kept);
        // Not consumed (an open that failed before writing): still trusted.
        let (kept, found) = KeptMirror::claim(io.clone(), dir).unwrap();
        assert_eq!(found, Ok(closed(7)));
        kept.consume().unwrap();
        drop(kept);
        // Consumed: the next open without a close does not trust the mirror.
        let (kept, found) = KeptMirror::claim(io.clone(), dir).unwrap();
        assert!(found.unwrap_err().contains("not closed cleanly"));
        kept.wipe().unwrap();
        assert!(io.list(&kept.log_dir()).unwrap().is_empty());
    }
}
