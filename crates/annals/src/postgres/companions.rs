//! Companion files (read models' checkpoints, the exchange's snapshots) as rows of the store's
//! database: the PostgreSQL side of [`crate::companions`].

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::companions::Companions;

/// Companion files as rows of `annals_companions` (kind, name, bytes) in the store's database,
/// over a connection of their own, opened when first needed and again after a failure.
pub(crate) struct InDatabase {
    target: super::connect::Target,
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
            crate::postgres::connect::close(client);
        }
    }
}

impl InDatabase {
    pub(crate) fn new(target: super::connect::Target) -> Self {
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
