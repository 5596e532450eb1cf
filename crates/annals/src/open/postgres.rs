//! Opening a store whose log lives in PostgreSQL: the backend's connection and committer
//! ([`crate::postgres::Remote`]) in front of the mirror it keeps, temporary or kept.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::{begin_services, files, kept, off_machine_class};
use crate::companions::Companions;
use crate::error::StoreError;
use crate::io::{Io, RealIo};
use crate::options::{Durability, Options};
use crate::parts::{CopyDir, TemporaryDir};
use crate::postgres::companions::InDatabase;
use crate::postgres::Remote;
use crate::route::Backend;
use crate::stats::MirrorKind;
use crate::store::Store;

const LOCK_FILE: &str = "LOCK";

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
    /// into a temporary directory, removed at close; [`crate::Location::Postgres`] keeps it in a
    /// directory across clean closes instead (what the open found is in
    /// [`Store::open_report`]).
    pub fn open_postgres(url: &str, options: Options) -> Result<Store, crate::OpenError> {
        Ok(open(url, None, options)?)
    }
}

/// Opens the store on the database at `url`, its mirror kept in `kept_mirror` across clean
/// closes (None: a temporary directory).
pub(super) fn open(
    url: &str,
    kept_mirror: Option<&Path>,
    options: Options,
) -> Result<Store, StoreError> {
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
    // open; or in the directory `kept_mirror` names, kept across clean closes.
    let mut mirror = options.clone();
    mirror.backup = None;
    mirror.durability = Durability::Written;
    mirror.checkpoint_on_close = kept_mirror.is_some();
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
    let (opened, copy, found) = match kept_mirror {
        None => {
            static MIRRORS: AtomicU64 = AtomicU64::new(0);
            remove_stale_mirrors();
            let dir = TemporaryDir(std::env::temp_dir().join(format!(
                "annals-mirror-{}-{}",
                std::process::id(),
                MIRRORS.fetch_add(1, Ordering::Relaxed)
            )));
            let _ = std::fs::remove_dir_all(&dir.0);
            let opened = files::open(io, &dir.0, mirror, Backend::Postgres, table)?;
            (opened, CopyDir::Temporary(dir), None)
        }
        Some(dir) => {
            let (kept, closed) = crate::kept::KeptMirror::claim(io.clone(), dir)?;
            let holds = |last| match last {
                crate::kept::AppendStamp { last: 0, .. } => Ok(None),
                last => crate::postgres::holds(url, last),
            };
            let (opened, found) =
                kept::open(io, &kept, closed, mirror, Backend::Postgres, table, holds)?;
            let copy = CopyDir::Kept {
                kept,
                error: StoreError::Database,
            };
            (opened, copy, Some(found))
        }
    };
    let resumed = found.as_ref().and_then(|f| f.as_ref().ok());
    let last_append = resumed.map_or_else(Default::default, |closed| closed.last);
    let resumed_at = resumed.map(|closed| closed.head);
    // Companion files live in the database with the log, not in the mirror's directory.
    let companions: Arc<dyn Companions> = Arc::new(InDatabase::new(
        crate::postgres::connect::Target::parse(url)?,
    ));
    let shared = opened.shared.clone();
    let mut followed = 0;
    let mut parts = opened.into_parts(
        |files| {
            let remote = Remote::start(url, shared, files, last_append)?;
            followed = remote.counters.followed.load(Ordering::Relaxed);
            Ok(Box::new(remote))
        },
        Some(companions),
        copy,
    )?;
    parts.shelf = Box::new(crate::postgres::snapshots::SnapshotTable::new(
        crate::postgres::connect::Target::parse(url)?,
    ));
    parts.report.mirror = Some(MirrorKind {
        kept: kept_mirror.map(Path::to_path_buf),
        resumed_at,
        rebuilt: found.and_then(Result::err),
        followed,
    });
    parts.report.open_ms = started.elapsed().as_secs_f64() * 1e3;
    let store = Store::from_parts(parts)?;
    // An erasure whose server stopped before its receipt: any server finishes it.
    store.settle_erasures()?;
    begin_services(store, &options, off_machine)
}
