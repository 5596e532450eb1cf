//! Decisions' snapshots as rows of the store's database, shared by every server of it: the
//! PostgreSQL side of [`crate::shelf`].
//!
//! One row per key, in `annals_snapshots`, with the data subjects the snapshot folded in an
//! array (indexed, so that an erasure finds them). A save that names subjects holds their rows
//! of `annals_subject_keys` (`FOR SHARE`) while it checks and inserts: an erasure, which
//! updates its subject's row after its receipt is committed and then deletes the snapshots
//! that folded the subject, either waits for the save and deletes what it inserted, or went
//! first, and the save's check (after taking in what other servers committed) finds the
//! receipt.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;

use postgres::types::ToSql;

use crate::saved::{SavedState, StateKey};
use crate::shelf::{Shelf, ShelfStats, Shelved, SnapshotFilter, SnapshotInfo};

const TABLE: &str = "CREATE TABLE IF NOT EXISTS annals_snapshots (
        key bytea PRIMARY KEY,
        name text NOT NULL,
        version bigint NOT NULL,
        position bigint NOT NULL,
        saved_at_us bigint NOT NULL,
        subjects text[] NOT NULL,
        envelope bytea NOT NULL);
    CREATE INDEX IF NOT EXISTS annals_snapshots_model ON annals_snapshots (name, version);
    CREATE INDEX IF NOT EXISTS annals_snapshots_subjects ON annals_snapshots USING gin (subjects)";

/// Snapshots as rows of `annals_snapshots`, over a connection of their own.
pub(crate) struct SnapshotTable {
    connection: super::connect::SideConnection,
}

impl SnapshotTable {
    pub(crate) fn new(target: super::connect::Target) -> Self {
        SnapshotTable {
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

/// A filter's conditions, for a statement whose parameters `$1` (name), `$2` (version) and
/// `$3` (key) may each be null.
const FILTER: &str = "($1::text IS NULL OR name = $1)
    AND ($2::bigint IS NULL OR version = $2)
    AND ($3::bytea IS NULL OR key = $3)";

fn filter_params(filter: &SnapshotFilter) -> (Option<String>, Option<i64>, Option<Vec<u8>>) {
    (
        filter.name.clone(),
        filter.version.map(i64::from),
        filter.key.map(|k| k.as_bytes().to_vec()),
    )
}

fn key_of(bytes: &[u8]) -> StateKey {
    let mut key = [0; 16];
    let n = bytes.len().min(16);
    key[..n].copy_from_slice(&bytes[..n]);
    StateKey::from_bytes(key)
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Shelf for SnapshotTable {
    fn put(
        &self,
        saved: &SavedState,
        admit: &(dyn Fn() -> io::Result<bool> + Sync),
    ) -> io::Result<Shelved> {
        let envelope = saved.encode();
        let key = saved.key.as_bytes().to_vec();
        let admitted = self.with(|c| {
            let mut tx = c.transaction()?;
            if !saved.subjects.is_empty() {
                // Held until the commit: an erasure of one of them waits for this save, and
                // then deletes what it inserted.
                let rows = tx.query(
                    "SELECT tag, erased_at_us IS NOT NULL FROM annals_subject_keys
                     WHERE tag = ANY($1) FOR SHARE",
                    &[&saved.subjects],
                )?;
                if let Some(row) = rows.iter().find(|row| row.get::<_, bool>(1)) {
                    return Ok(Err(row.get::<_, String>(0)));
                }
            }
            let Ok(true) = admit() else {
                return Ok(Ok(None));
            };
            let params: [&(dyn ToSql + Sync); 7] = [
                &key,
                &saved.name,
                &i64::from(saved.version),
                &int(saved.position),
                &int(saved.saved_at_us),
                &saved.subjects,
                &envelope,
            ];
            let stored = tx.execute(
                "INSERT INTO annals_snapshots
                     (key, name, version, position, saved_at_us, subjects, envelope)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (key) DO UPDATE SET
                     position = excluded.position, saved_at_us = excluded.saved_at_us,
                     subjects = excluded.subjects, envelope = excluded.envelope
                 WHERE annals_snapshots.position <= excluded.position",
                &params,
            )?;
            let kept = match stored {
                1 => None,
                _ => tx
                    .query_opt(
                        "SELECT position FROM annals_snapshots WHERE key = $1",
                        &[&key],
                    )?
                    .map(|row| row.get::<_, i64>(0) as u64),
            };
            tx.commit()?;
            Ok(Ok(Some(kept)))
        })?;
        Ok(match admitted {
            Err(subject) => Shelved::Erased { subject },
            // A refusal or a failed check: which one, the caller's check knows.
            Ok(None) => Shelved::Refused,
            Ok(Some(None)) => Shelved::Saved,
            Ok(Some(Some(kept))) => Shelved::Behind { kept },
        })
    }

    fn get(&self, key: &StateKey) -> io::Result<Option<Vec<u8>>> {
        let key = key.as_bytes().to_vec();
        self.with(|c| {
            c.query_opt(
                "SELECT envelope FROM annals_snapshots WHERE key = $1",
                &[&key],
            )
            .map(|row| row.map(|r| r.get::<_, Vec<u8>>(0)))
        })
    }

    fn list(&self, filter: &SnapshotFilter) -> io::Result<Vec<SnapshotInfo>> {
        let (name, version, key) = filter_params(filter);
        self.with(|c| {
            let rows = c.query(
                &format!(
                    "SELECT key, name, version, position, saved_at_us, octet_length(envelope)
                     FROM annals_snapshots WHERE {FILTER} ORDER BY name, version, key"
                ),
                &[&name, &version, &key],
            )?;
            Ok(rows
                .iter()
                .map(|r| SnapshotInfo {
                    key: key_of(&r.get::<_, Vec<u8>>(0)),
                    name: r.get(1),
                    version: r.get::<_, i64>(2) as u32,
                    position: r.get::<_, i64>(3) as u64,
                    saved_at_us: r.get::<_, i64>(4) as u64,
                    bytes: r.get::<_, i32>(5) as u64,
                })
                .collect())
        })
    }

    fn remove(&self, filter: &SnapshotFilter) -> io::Result<u64> {
        let (name, version, key) = filter_params(filter);
        self.with(|c| {
            c.execute(
                &format!("DELETE FROM annals_snapshots WHERE {FILTER}"),
                &[&name, &version, &key],
            )
        })
    }

    fn purge(&self, erased: &HashMap<String, u64>) -> io::Result<u64> {
        if erased.is_empty() {
            return Ok(0);
        }
        let (subjects, receipts): (Vec<String>, Vec<i64>) =
            erased.iter().map(|(s, r)| (s.clone(), int(*r))).unzip();
        self.with(|c| {
            let purged = c.execute(
                "DELETE FROM annals_snapshots s
                 USING unnest($1::text[], $2::bigint[]) AS e(subject, receipt)
                 WHERE s.subjects @> ARRAY[e.subject] AND s.position < e.receipt",
                &[&subjects, &receipts],
            )?;
            // A deleted row's bytes stay in the table's pages until a vacuum frees them for
            // reuse: the server that deleted them vacuums now (the others delete nothing). A
            // failed vacuum is logged: the rows are gone, and autovacuum comes.
            if purged > 0 {
                if let Err(e) = c.batch_execute("VACUUM annals_snapshots") {
                    tracing::warn!(error = %e, "annals_snapshots was not vacuumed after a purge");
                }
            }
            Ok(purged)
        })
    }

    fn stats(&self) -> io::Result<ShelfStats> {
        self.with(|c| {
            let row = c.query_one(
                "SELECT count(*), coalesce(sum(octet_length(envelope)), 0)::bigint,
                        pg_total_relation_size('annals_snapshots')
                 FROM annals_snapshots",
                &[],
            )?;
            Ok(ShelfStats {
                count: row.get::<_, i64>(0) as u64,
                bytes: row.get::<_, i64>(1) as u64,
                stored_bytes: row.get::<_, i64>(2) as u64,
            })
        })
    }

    fn other_versions(
        &self,
        name: &str,
        version: u32,
        key_of: &dyn Fn(u32) -> StateKey,
    ) -> io::Result<Vec<u32>> {
        let name = name.to_owned();
        let versions: Vec<i64> = self.with(|c| {
            c.query(
                "SELECT DISTINCT version FROM annals_snapshots WHERE name = $1 AND version <> $2",
                &[&name, &i64::from(version)],
            )
            .map(|rows| rows.iter().map(|r| r.get::<_, i64>(0)).collect())
        })?;
        if versions.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<Vec<u8>> = versions
            .iter()
            .map(|&v| key_of(v as u32).as_bytes().to_vec())
            .collect();
        let mut found: Vec<u32> = self.with(|c| {
            c.query(
                "SELECT version FROM annals_snapshots WHERE key = ANY($1)",
                &[&keys],
            )
            .map(|rows| rows.iter().map(|r| r.get::<_, i64>(0) as u32).collect())
        })?;
        found.sort_unstable();
        Ok(found)
    }

    fn locate(&self) -> PathBuf {
        PathBuf::from("annals_snapshots")
    }
}
