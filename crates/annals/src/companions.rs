//! Files the store's companions keep beside the log (read models' checkpoints, the exchange's
//! snapshots): in the data directory on files, in the database on PostgreSQL, so that they
//! last exactly as long as the log wherever it lives, and a server on another machine finds
//! them where the log is.
//!
//! A companion file is a name within a kind (`readmodels`, `exchange`), written whole and
//! durably (on files: aside, synced, renamed, the directory synced; on PostgreSQL: one row,
//! committed), read whole, listed and removed. Nothing here is the truth: each kind checks
//! what it reads against the log and rebuilds from the log when it does not fit.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

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

/// Companion files as rows of `annals_companions` (kind, name, bytes) in the store's database,
/// over a connection of their own, opened when first needed and again after a failure.
pub(crate) struct InDatabase {
    target: crate::pgconnect::Target,
    client: Mutex<Option<postgres::Client>>,
    /// Set when PostgreSQL says a commit is local only (its standby did not confirm it).
    warned: Arc<AtomicBool>,
}

const TABLE: &str = "CREATE TABLE IF NOT EXISTS annals_companions (
    kind text NOT NULL,
    name text NOT NULL,
    bytes bytea NOT NULL,
    PRIMARY KEY (kind, name))";

impl Drop for InDatabase {
    fn drop(&mut self) {
        if let Some(client) = self.client.get_mut().take() {
            crate::pgconnect::close(client);
        }
    }
}

impl InDatabase {
    pub(crate) fn new(target: crate::pgconnect::Target) -> Self {
        InDatabase {
            target,
            client: Mutex::new(None),
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Runs `f` on the connection, connecting (and creating the table) first when there is
    /// none; a failed call drops the connection, so the next one starts afresh.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error>,
    ) -> io::Result<T> {
        let mut slot = self.client.lock();
        if slot.is_none() {
            let mut client = self
                .target
                .connect(Some(self.warned.clone()))
                .map_err(database_error)?;
            client.batch_execute(TABLE).map_err(database_error)?;
            *slot = Some(client);
        }
        let client = slot.as_mut().expect("connected above");
        self.warned.store(false, Ordering::Release);
        match f(client) {
            Ok(value) if self.warned.load(Ordering::Acquire) => {
                drop(value);
                Err(io::Error::other(
                    "PostgreSQL committed the write locally but its synchronous standby did not \
                     confirm it",
                ))
            }
            Ok(value) => Ok(value),
            Err(e) => {
                *slot = None;
                Err(database_error(e))
            }
        }
    }
}

fn database_error(e: postgres::Error) -> io::Error {
    io::Error::other(format!("PostgreSQL: {e}"))
}

impl Companions for InDatabase {
    fn write(&self, kind: &str, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO annals_companions (kind, name, bytes) VALUES ($1, $2, $3)
                 ON CONFLICT (kind, name) DO UPDATE SET bytes = excluded.bytes",
                &[&kind, &name, &bytes],
            )
            .map(drop)
        })
    }

    fn read(&self, kind: &str, name: &str) -> io::Result<Option<Vec<u8>>> {
        self.with(|c| {
            c.query_opt(
                "SELECT bytes FROM annals_companions WHERE kind = $1 AND name = $2",
                &[&kind, &name],
            )
            .map(|row| row.map(|r| r.get::<_, Vec<u8>>(0)))
        })
    }

    fn remove(&self, kind: &str, name: &str) -> io::Result<()> {
        self.with(|c| {
            c.execute(
                "DELETE FROM annals_companions WHERE kind = $1 AND name = $2",
                &[&kind, &name],
            )
            .map(drop)
        })
    }

    fn list(&self, kind: &str) -> io::Result<Vec<String>> {
        self.with(|c| {
            c.query(
                "SELECT name FROM annals_companions WHERE kind = $1 ORDER BY name",
                &[&kind],
            )
            .map(|rows| rows.iter().map(|r| r.get::<_, String>(0)).collect())
        })
    }

    fn locate(&self, kind: &str, name: &str) -> PathBuf {
        PathBuf::from(format!("annals_companions[{kind}/{name}]"))
    }
}
