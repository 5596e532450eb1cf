//! Files the store's companions keep beside the log (read models' checkpoints, the exchange's
//! snapshots): in the data directory on files, in the database on PostgreSQL, so that they
//! last exactly as long as the log wherever it lives, and a server on another machine finds
//! them where the log is.
//!
//! A companion file is a name within a kind (`readmodels`, `exchange`), written whole and
//! durably (on files: aside, synced, renamed, the directory synced; on PostgreSQL: one row,
//! committed), read whole, listed and removed. Nothing here is the truth: what is kept is a
//! saved state (`state.rs`), checked against the log when it is loaded, and folded again from
//! the log when it does not fit.

use std::io;
use std::path::PathBuf;

use std::sync::Arc;

use crate::io::{read_file, remove_file_durably, write_file_durably, Io};

/// Where a store's companion files live (see the module documentation).
pub trait Companions: Send + Sync {
    /// Replaces `name` of `kind` with `bytes`; once this returns, a crash keeps them.
    fn write(&self, kind: &str, name: &str, bytes: &[u8]) -> io::Result<()>;
    /// The bytes of `name`, or `None` when there is none.
    fn read(&self, kind: &str, name: &str) -> io::Result<Option<Vec<u8>>>;
    /// Removes `name` (nothing when there is none).
    fn remove(&self, kind: &str, name: &str) -> io::Result<()>;
    /// The names of `kind`, sorted.
    fn list(&self, kind: &str) -> io::Result<Vec<String>>;
    /// Where `name` is kept, for messages.
    fn locate(&self, kind: &str, name: &str) -> PathBuf;
}

/// Companion files in `<data>/<kind>/<name>`, through the store's I/O layer (so that they too
/// live on the simulated disk in tests).
pub(crate) struct InDirectory {
    pub(crate) io: Arc<dyn Io>,
    pub(crate) dir: PathBuf,
}

impl Companions for InDirectory {
    fn write(&self, kind: &str, name: &str, bytes: &[u8]) -> io::Result<()> {
        write_file_durably(self.io.as_ref(), &self.dir.join(kind), name, bytes)
    }

    fn read(&self, kind: &str, name: &str) -> io::Result<Option<Vec<u8>>> {
        read_file(self.io.as_ref(), &self.locate(kind, name))
    }

    fn remove(&self, kind: &str, name: &str) -> io::Result<()> {
        remove_file_durably(self.io.as_ref(), &self.dir.join(kind), name)
    }

    fn list(&self, kind: &str) -> io::Result<Vec<String>> {
        match self.io.list(&self.dir.join(kind)) {
            Ok(mut names) => {
                // A write's temporary file is not a companion file.
                names.retain(|n| !n.ends_with(".tmp"));
                names.sort();
                Ok(names)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    fn locate(&self, kind: &str, name: &str) -> PathBuf {
        self.dir.join(kind).join(name)
    }
}
