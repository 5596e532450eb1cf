//! Opening and closing a store whose log lives in PostgreSQL: the backend's connection and
//! committer ([`crate::postgres::Remote`]) and the mirror it keeps, temporary or kept.

use super::*;
use crate::postgres::companions::InDatabase;
use std::sync::atomic::AtomicU64;

/// Removes the mirrors (see [`Store::open_postgres`]) that processes killed before closing
/// their stores left in the temporary directory: those whose lock no process holds, of a
/// process that is gone. A mirror being opened has its lock file a moment before its lock,
/// so the lock alone would let a store opening beside another remove the other's mirror.
fn remove_stale_mirrors() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("annals-mirror-")) else {
            continue;
        };
        let owner = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
        if owner.is_some_and(process_lives) {
            continue;
        }
        let lock = entry.path().join(LOCK_FILE);
        if !lock.exists() {
            continue;
        }
        if let Ok(held) = RealIo.lock(&lock) {
            let _ = std::fs::remove_dir_all(entry.path());
            drop(held);
        }
    }
}

/// Whether a process of that id runs (one of another user's counts: it may not be signalled).
fn process_lives(pid: i32) -> bool {
    // SAFETY: signal 0 sends nothing; kill only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl Store {
    /// Opens the store whose log lives in the PostgreSQL database at `url` (a libpq-style
    /// connection string or URL; several hosts may be given, with
    /// `target_session_attrs=read-write` to find the primary). Creates the schema on first use
    /// and loads the log into memory. Several stores, in this process or others, may open the
    /// same database: each takes in what the others commit. The durability is D3: an append
    /// is acknowledged once the database has committed it (with its `synchronous_commit`
    /// setting in force). The store's copy of the log (its mirror) is filled from the database
    /// into a temporary directory, or kept across clean closes in `options.mirror` (see
    /// [`Options::mirror`]; what the open found is in [`Store::open_report`]).
    pub fn open_postgres(url: &str, options: Options) -> Result<Store, StoreError> {
        let (options, off_machine) = off_machine_class(options)?;
        if options.durability != Durability::Synced {
            return Err(StoreError::InvalidOption(format!(
                "a PostgreSQL store acknowledges an append once the database has committed it \
                 (D3); {} is not available there",
                options.durability.label()
            )));
        }
        let started = Instant::now();
        // The mirror is a file store, written to the page cache and never synced (D1): the
        // database holds the truth, and reads map the mirror's segments as they do on files.
        // In a private temporary directory, removed at close and filled from the database at
        // open; or in the directory `options.mirror` names, kept across clean closes.
        let mut mirror = options.clone();
        mirror.mirror = None;
        mirror.backup = None;
        mirror.durability = Durability::Written;
        mirror.checkpoint_on_close = options.mirror.is_some();
        mirror.checkpoint_interval_events = 0;
        // Nothing written to the mirror is synced while it runs, nor its segments filled with
        // zeros: either would put the mirror's disk traffic beside the database's own commits.
        mirror.preallocation = crate::Preallocation::Fallocate;
        mirror.unsynced_bytes_max = 1 << 40;
        let io: Arc<dyn Io> = Arc::new(RealIo);
        // The subjects' keys live in the database, beside the log.
        let table = match &options.subjects {
            Some(_) => Some(Arc::new(crate::postgres::keys::SubjectKeys::new(
                crate::postgres::connect::Target::parse(url)?,
            )) as Arc<dyn crate::keys::KeyTable>),
            None => {
                let target = crate::postgres::connect::Target::parse(url)?;
                if crate::postgres::keys::database_has_keys(&target)? {
                    return Err(StoreError::Subjects(
                        "the database holds data subjects' keys: open it with its master key \
                         (annals serve --master-key-file FILE, or Options::subjects)"
                            .into(),
                    ));
                }
                None
            }
        };
        // A kept mirror: used as closed, or why it was filled again.
        let (mut store, kept, found) = match &options.mirror {
            None => {
                static MIRRORS: AtomicU64 = AtomicU64::new(0);
                remove_stale_mirrors();
                let dir = std::env::temp_dir().join(format!(
                    "annals-mirror-{}-{}",
                    std::process::id(),
                    MIRRORS.fetch_add(1, Ordering::Relaxed)
                ));
                let _ = std::fs::remove_dir_all(&dir);
                let mut store = Self::open_log(io, &dir, mirror, Backend::Postgres, table)?;
                store.mirror_dir = Some(dir);
                (store, None, None)
            }
            Some(dir) => {
                let (kept, closed) = crate::kept::KeptMirror::claim(io.clone(), dir)?;
                let holds = |last| match last {
                    crate::kept::AppendStamp { last: 0, .. } => Ok(None),
                    last => crate::postgres::holds(url, last),
                };
                let (store, found) = Self::open_kept_mirror(
                    io,
                    &kept,
                    closed,
                    mirror,
                    Backend::Postgres,
                    table,
                    holds,
                )?;
                (store, Some(kept), Some(found))
            }
        };
        let resumed = found.as_ref().and_then(|f| f.as_ref().ok());
        let last_append = resumed.map_or_else(Default::default, |closed| closed.last);
        // Companion files live in the database with the log, not in the mirror's directory.
        store.companions = Arc::new(InDatabase::new(crate::postgres::connect::Target::parse(
            url,
        )?));
        store.kept = kept;
        let role = match &store.files {
            Some(files) => files.role().clone(),
            None => return Err(StoreError::Closed),
        };
        let remote = Remote::start(url, store.shared.clone(), role, last_append)?;
        store.report.mirror = Some(MirrorKind {
            kept: options.mirror.clone(),
            resumed_at: resumed.map(|closed| closed.head),
            rebuilt: found.and_then(Result::err),
            followed: remote.counters.followed.load(Ordering::Relaxed),
        });
        store.report.open_ms = started.elapsed().as_secs_f64() * 1e3;
        store.remote = Some(remote);
        // An erasure whose server stopped before its receipt: any server finishes it.
        store.settle_erasures()?;
        store.begin_backup(&options, off_machine)
    }

    /// Closes a store that may have a database backend: the backend first (what it has
    /// committed still goes to the mirror's writer), then the threads, then the mirror.
    pub(super) fn shutdown_with_database(&mut self) -> Result<(), StoreError> {
        let last_append = self.remote.take().map(|mut remote| {
            remote.stop();
            remote.last_append()
        });
        let result = self.stop_threads();
        if let Some(dir) = self.mirror_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        match (self.kept.take(), last_append) {
            (Some(kept), Some(last)) if result.is_ok() => {
                self.close_kept_mirror(&kept, last, StoreError::Database)
            }
            _ => result,
        }
    }
}
