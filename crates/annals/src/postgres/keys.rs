//! The subjects' keys of a store on PostgreSQL: the [`KeyTable`] of `crate::keys`, as rows of
//! `annals_subject_keys` (tag, wrapped key or the time it was erased) beside the master key's
//! check in `annals_subject_master`, over a connection of their own. Created by the first
//! server that opens the database with data subjects; not part of the log's schema version.
//!
//! Every server holds the keys it has used in memory. A new key is inserted, committed,
//! before its event is committed; when another server inserted one for the subject first,
//! that one is taken. An erasure sets the row's key to NULL (and vacuums the table, so that
//! its old version leaves the table's pages once PostgreSQL reuses them); its receipt in the
//! log tells the other servers, which drop the key as they take the receipt in.

use crate::keys::{KeyTable, Rewrap, TableRow};

use super::connect::{SideConnection, Target};

const TABLES: &str = "CREATE TABLE IF NOT EXISTS annals_subject_master (
        id integer PRIMARY KEY CHECK (id = 1),
        master_check bytea NOT NULL);
    CREATE TABLE IF NOT EXISTS annals_subject_keys (
        tag text PRIMARY KEY,
        wrapped bytea,
        erased_at_us bigint,
        CHECK ((wrapped IS NULL) <> (erased_at_us IS NULL)))";

/// The keys' table over a connection of its own.
pub(crate) struct SubjectKeys {
    connection: SideConnection,
    /// The master key check this server holds (the table's when it opened, or the one it
    /// rotated to): new keys are inserted only while the table's is the same.
    check: parking_lot::Mutex<Vec<u8>>,
}

impl SubjectKeys {
    pub(crate) fn new(target: Target) -> SubjectKeys {
        SubjectKeys {
            connection: SideConnection::new(target, TABLES),
            check: parking_lot::Mutex::new(Vec::new()),
        }
    }
}

const ROTATED: &str = "the database's master key is not the one this server holds (another \
    server rotated it): start this server with the new master key file";

fn row(r: &postgres::Row) -> (String, TableRow) {
    let tag: String = r.get(0);
    match (r.get::<_, Option<Vec<u8>>>(1), r.get::<_, Option<i64>>(2)) {
        (Some(wrapped), _) => (tag, TableRow::Key(wrapped)),
        (None, at) => (tag, TableRow::Erased(at.unwrap_or(0) as u64)),
    }
}

const SELECT: &str = "SELECT tag, wrapped, erased_at_us FROM annals_subject_keys";

impl KeyTable for SubjectKeys {
    fn master_check(&self, check: &[u8]) -> Result<Vec<u8>, String> {
        self.connection
            .with(|c| {
                c.execute(
                    "INSERT INTO annals_subject_master (id, master_check) VALUES (1, $1)
                 ON CONFLICT (id) DO NOTHING",
                    &[&check],
                )?;
                c.query_one(
                    "SELECT master_check FROM annals_subject_master WHERE id = 1",
                    &[],
                )
                .map(|r| r.get::<_, Vec<u8>>(0))
            })
            .inspect(|stored| *self.check.lock() = stored.clone())
    }

    fn load(&self) -> Result<Vec<(String, TableRow)>, String> {
        self.connection.with(|c| {
            c.query(SELECT, &[])
                .map(|rows| rows.iter().map(row).collect())
        })
    }

    fn insert(&self, keys: &[(&str, &[u8])]) -> Result<Vec<(String, TableRow)>, String> {
        let tags: Vec<&str> = keys.iter().map(|(t, _)| *t).collect();
        let wrapped: Vec<&[u8]> = keys.iter().map(|(_, w)| *w).collect();
        let check = self.check.lock().clone();
        self.connection
            .with(|c| {
                // Committed (autocommit) before the rows are read back in a statement of its
                // own, whose snapshot also sees a row another server inserted meanwhile. The
                // master row is share-locked: a rotation (which locks it for update) waits
                // for this insert, or this insert for the rotation, and then inserts nothing.
                c.execute(
                    "INSERT INTO annals_subject_keys (tag, wrapped)
                     SELECT * FROM unnest($1::text[], $2::bytea[])
                     WHERE EXISTS (SELECT 1 FROM annals_subject_master
                                   WHERE id = 1 AND master_check = $3 FOR SHARE)
                     ON CONFLICT (tag) DO NOTHING",
                    &[&tags, &wrapped, &check],
                )?;
                let same: bool = c
                    .query_one(
                        "SELECT master_check = $1 FROM annals_subject_master WHERE id = 1",
                        &[&check],
                    )?
                    .get(0);
                if !same {
                    return Ok(Err(ROTATED.to_string()));
                }
                c.query(&format!("{SELECT} WHERE tag = ANY($1)"), &[&tags])
                    .map(|rows| Ok(rows.iter().map(row).collect()))
            })
            .and_then(|inserted| inserted)
    }

    fn fetch(&self, tags: &[&str]) -> Result<Vec<(String, TableRow)>, String> {
        self.connection.with(|c| {
            c.query(&format!("{SELECT} WHERE tag = ANY($1)"), &[&tags])
                .map(|rows| rows.iter().map(row).collect())
        })
    }

    fn erase(&self, tag: &str, at_us: u64) -> Result<u64, String> {
        let at = self.connection.with(|c| {
            c.execute(
                "INSERT INTO annals_subject_keys (tag, wrapped, erased_at_us) VALUES ($1, NULL, $2)
                 ON CONFLICT (tag) DO UPDATE SET wrapped = NULL, erased_at_us = $2
                 WHERE annals_subject_keys.erased_at_us IS NULL",
                &[&tag, &(at_us as i64)],
            )?;
            c.query_one(
                "SELECT erased_at_us FROM annals_subject_keys WHERE tag = $1",
                &[&tag],
            )
            .map(|r| r.get::<_, i64>(0) as u64)
        })?;
        // The row's old version, with the wrapped key, is dead now; vacuum frees its space
        // for reuse (autovacuum would, later).
        if at == at_us {
            self.connection
                .with(|c| c.batch_execute("VACUUM annals_subject_keys"))?;
        }
        Ok(at)
    }

    fn rotate(
        &self,
        is_ours: &(dyn Fn(&[u8]) -> bool + Sync),
        check: &[u8],
        rewrap: Rewrap<'_>,
    ) -> Result<u64, String> {
        let count = self
            .connection
            .with(|c| {
                let mut tx = c.transaction()?;
                let stored: Vec<u8> = tx
                    .query_one(
                        "SELECT master_check FROM annals_subject_master WHERE id = 1 FOR UPDATE",
                        &[],
                    )?
                    .get(0);
                if !is_ours(&stored) {
                    return Ok(Err(ROTATED.to_string()));
                }
                let rows = tx.query(
                    "SELECT tag, wrapped FROM annals_subject_keys WHERE wrapped IS NOT NULL
                     FOR UPDATE",
                    &[],
                )?;
                let (mut tags, mut again) = (Vec::new(), Vec::new());
                for r in &rows {
                    let tag: String = r.get(0);
                    match rewrap(&tag, r.get::<_, &[u8]>(1)) {
                        Ok(w) => again.push(w),
                        Err(e) => return Ok(Err(e)),
                    }
                    tags.push(tag);
                }
                tx.execute(
                    "UPDATE annals_subject_keys k SET wrapped = n.wrapped
                     FROM unnest($1::text[], $2::bytea[]) AS n(tag, wrapped)
                     WHERE k.tag = n.tag AND k.wrapped IS NOT NULL",
                    &[&tags, &again],
                )?;
                tx.execute(
                    "UPDATE annals_subject_master SET master_check = $1 WHERE id = 1",
                    &[&check],
                )?;
                tx.commit()?;
                Ok(Ok(tags.len() as u64))
            })
            .and_then(|rotated| rotated)?;
        *self.check.lock() = check.to_vec();
        // The rows' old versions, wrapped under the old master key, are dead now.
        self.connection
            .with(|c| c.batch_execute("VACUUM annals_subject_keys"))?;
        Ok(count)
    }
}

/// Whether the database at `target` keeps data subjects' keys (a store opened without a
/// master key must not append to it in the clear, nor read its sealed events as damaged).
pub(crate) fn database_has_keys(target: &Target) -> Result<bool, crate::error::StoreError> {
    let mut client = target
        .connect(None)
        .map_err(|e| super::unavailable("connect", &e))?;
    let found = client
        .query_one(
            "SELECT to_regclass('annals_subject_master') IS NOT NULL",
            &[],
        )
        .map_err(|e| super::unavailable("look for the subjects' keys", &e))?
        .get::<_, bool>(0);
    super::connect::close(client);
    Ok(found)
}
