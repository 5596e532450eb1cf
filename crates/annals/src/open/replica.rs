//! Opening a read replica (`Store::open_replica`): its copy of the backup in a temporary
//! directory, or kept across clean closes in `Location::Replica`'s `copy`.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{files, kept};
use crate::error::StoreError;
use crate::io::{Io, RealIo};
use crate::options::{BackupOptions, Durability, Options};
use crate::parts::{CopyDir, TemporaryDir};
use crate::replica::Replica;
use crate::route::Backend;
use crate::stats::MirrorKind;
use crate::store::Store;

/// A replica of a primary with data subjects starts from the primary's key file in its copy
/// directory (under the same master key; `replica.rs` follows it as it changes).
fn replica_keys(backup: &BackupOptions, options: &Options, dir: &Path) -> Result<(), StoreError> {
    let objects = crate::objects::Objects::open_existing(&backup.url, &backup.settings)
        .map_err(StoreError::Backup)?;
    let keys = crate::archive::read_keys(&objects).map_err(StoreError::Backup)?;
    match (&options.subjects, keys) {
        (None, Some(_)) => Err(StoreError::Subjects(format!(
            "{} holds data subjects' keys: give the replica the primary's subject tags and \
             master key",
            backup.url
        ))),
        (Some(_), Some(bytes)) => {
            crate::io::write_file_durably(&RealIo, dir, crate::keys::KEYS_FILE, &bytes)
                .map_err(|e| StoreError::io("write the key file", dir, 0, e))
        }
        _ => Ok(()),
    }
}

impl Store {
    /// Opens a read replica of the backup `backup` names (feature `object-store`): a copy of
    /// the log, filled from the backup before this returns and then following it as the
    /// primary ships more. Reads, subscriptions and read models work as on any store; appends
    /// are refused ([`crate::InputError::ReadOnlyReplica`], naming the primary). `options`
    /// gives the limits; durability, backup and scrub are the replica's. Its copy lives in a
    /// temporary directory and is filled from the backup at every open;
    /// [`crate::Location::Replica`] keeps it in a directory across clean closes instead, and the next open takes in only what the
    /// backup holds beyond it (when the backup still holds the copy's last append; otherwise
    /// the copy is filled again).
    pub fn open_replica(
        backup: &BackupOptions,
        options: Options,
    ) -> Result<Store, crate::OpenError> {
        Ok(open(backup, None, options)?)
    }
}

/// Opens the replica of `backup`, its copy kept in `kept_copy` across clean closes (None: a
/// temporary directory).
pub(super) fn open(
    backup: &BackupOptions,
    kept_copy: Option<&Path>,
    options: Options,
) -> Result<Store, StoreError> {
    // The copy is derived from object storage: written, never synced (D1), as a mirror.
    let kept_dir = kept_copy.map(Path::to_path_buf);
    let copy = Options {
        durability: Durability::Written,
        backup: None,
        scrub: None,
        checkpoint_on_close: kept_dir.is_some(),
        checkpoint_interval_events: 0,
        preallocation: crate::Preallocation::Fallocate,
        unsynced_bytes_max: 1 << 40,
        ..options.clone()
    };
    let io: Arc<dyn Io> = Arc::new(RealIo);
    let Some(kept_dir) = kept_dir else {
        static REPLICAS: AtomicU64 = AtomicU64::new(0);
        let dir = TemporaryDir(std::env::temp_dir().join(format!(
            "annals-replica-{}-{}",
            std::process::id(),
            REPLICAS.fetch_add(1, Ordering::Relaxed)
        )));
        let _ = std::fs::remove_dir_all(&dir.0);
        replica_keys(backup, &options, &dir.0)?;
        let opened = files::open(io, &dir.0, copy, Backend::Replica, None)?;
        // A copy in a temporary directory is reported as a kept one is (the start line
        // says where it lives, and that it was filled whole from the backup); what it
        // took in is the objects read from the backup.
        let mirror = |replica: &Replica| MirrorKind {
            kept: None,
            resumed_at: None,
            rebuilt: None,
            followed: replica.stats().objects_read,
        };
        return follow(opened, backup, None, CopyDir::Temporary(dir), mirror);
    };
    let (kept, closed) = crate::kept::KeptMirror::claim(io.clone(), &kept_dir)?;
    replica_keys(backup, &options, &kept.log_dir())?;
    let holds = |last| crate::replica::backup_holds(backup, last);
    let (opened, found) = kept::open(io, &kept, closed, copy, Backend::Replica, None, holds)?;
    if let Err(why) = &found {
        tracing::info!(
            dir = %kept_dir.display(),
            why = why.as_str(),
            "replica: the kept copy is filled from the backup"
        );
    }
    let resumed = found.as_ref().ok().map(|closed| closed.head);
    let last = found.as_ref().ok().map(|closed| closed.last);
    let copy = CopyDir::Kept {
        kept,
        error: StoreError::Backup,
    };
    let mirror = |replica: &Replica| MirrorKind {
        kept: Some(kept_dir),
        resumed_at: resumed,
        rebuilt: found.err(),
        followed: replica.stats().objects_read,
    };
    follow(opened, backup, last, copy, mirror)
}

/// The replica made of its copy (`opened`, which ends with `last`; None: empty, or a
/// temporary copy, kept in `copy`), filled from the backup and followed; `mirror` tells
/// what the open found of the copy, once filled.
fn follow(
    opened: files::OnFiles,
    backup: &BackupOptions,
    last: Option<crate::kept::AppendStamp>,
    copy: CopyDir,
    mirror: impl FnOnce(&Replica) -> MirrorKind,
) -> Result<Store, StoreError> {
    let shared = opened.shared.clone();
    // A kept copy's snapshots live beside its log, which is wiped when it is rebuilt.
    let shelf_dir = match &copy {
        CopyDir::Kept { kept, .. } => Some(kept.dir().to_path_buf()),
        _ => None,
    };
    let io = shared.io.clone();
    let mut kind = None;
    let mut parts = opened.into_parts(
        |files| {
            let replica = Replica::start(backup, shared, files, last.unwrap_or_default())?;
            kind = Some(mirror(&replica));
            Ok(Box::new(replica))
        },
        None,
        copy,
    )?;
    parts.report.mirror = kind;
    if let Some(dir) = shelf_dir {
        parts.shelf = Box::new(crate::shelf::files::FileShelf::new(io, &dir));
    }
    Store::from_parts(parts)
}
