//! Companion files (read models' checkpoints, the exchange's snapshots) as rows of the store's
//! database: the PostgreSQL side of [`crate::companions`].

use std::io;
use std::path::PathBuf;

use crate::companions::Companions;

/// Companion files as rows of `annals_companions` (kind, name, bytes) in the store's database,
/// over a connection of their own, opened when first needed and again after a failure.
pub(crate) struct InDatabase {
    connection: super::connect::SideConnection,
}

const TABLE: &str = "CREATE TABLE IF NOT EXISTS annals_companions (
    kind text NOT NULL,
    name text NOT NULL,
    bytes bytea NOT NULL,
    PRIMARY KEY (kind, name))";

impl InDatabase {
    pub(crate) fn new(target: super::connect::Target) -> Self {
        InDatabase {
            connection: super::connect::SideConnection::new(target, TABLE),
        }
    }

    fn with<T: Send>(
        &self,
        f: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error> + Send,
    ) -> io::Result<T> {
        self.connection.with(f).map_err(io::Error::other)
    }
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
