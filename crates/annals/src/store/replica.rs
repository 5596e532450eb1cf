//! Opening a read replica (`Store::open_replica`): its copy of the backup in a temporary
//! directory, or kept across clean closes in `Options::mirror`.

use super::*;

impl Store {
    /// Opens a read replica of the backup `backup` names (feature `object-store`): a copy of
    /// the log, filled from the backup before this returns and then following it as the
    /// primary ships more. Reads, subscriptions and read models work as on any store; appends
    /// are refused ([`InputError::ReadOnlyReplica`], naming the primary). `options` gives the
    /// limits; durability, backup and scrub are the replica's. With `options.mirror`, the
    /// copy is kept in that directory across clean closes, and the next open takes in only
    /// what the backup holds beyond it (when the backup still holds the copy's last append;
    /// otherwise the copy is filled again); without, it lives in a temporary directory and is
    /// filled from the backup at every open.
    pub fn open_replica(
        backup: &crate::options::BackupOptions,
        options: Options,
    ) -> Result<Store, StoreError> {
        // The copy is derived from object storage: written, never synced (D1), as a mirror.
        let kept_dir = options.mirror.clone();
        let copy = Options {
            durability: Durability::Written,
            backup: None,
            scrub: None,
            mirror: None,
            checkpoint_on_close: kept_dir.is_some(),
            checkpoint_interval_events: 0,
            preallocation: crate::Preallocation::Fallocate,
            unsynced_bytes_max: 1 << 40,
            ..options.clone()
        };
        let io: Arc<dyn Io> = Arc::new(RealIo);
        let Some(kept_dir) = kept_dir else {
            use std::sync::atomic::AtomicU64;
            static REPLICAS: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "annals-replica-{}-{}",
                std::process::id(),
                REPLICAS.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            let opened = subjects::replica_keys(backup, &options, &dir)
                .and_then(|()| Self::open_log(io, &dir, copy, Backend::Replica, None))
                .and_then(|store| store.follow_backup(backup, None, Some(dir.clone())))
                .map(|mut store| {
                    // A copy in a temporary directory is reported as a kept one is (the start
                    // line says where it lives, and that it was filled whole from the backup);
                    // what it took in is the objects read from the backup.
                    store.report.mirror = Some(MirrorKind {
                        kept: None,
                        resumed_at: None,
                        rebuilt: None,
                        followed: store.replica_stats().map_or(0, |r| r.objects_read),
                    });
                    store
                });
            if opened.is_err() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            return opened;
        };
        let (kept, closed) = crate::kept::KeptMirror::claim(io.clone(), &kept_dir)?;
        subjects::replica_keys(backup, &options, &kept.log_dir())?;
        let holds = |last| crate::replica::backup_holds(backup, last);
        let (mut store, found) =
            Self::open_kept_mirror(io, &kept, closed, copy, Backend::Replica, None, holds)?;
        if let Err(why) = &found {
            tracing::info!(
                dir = %kept_dir.display(),
                why = why.as_str(),
                "replica: the kept copy is filled from the backup"
            );
        }
        let resumed = found.as_ref().ok().map(|closed| closed.head);
        let last = found.as_ref().ok().map(|closed| closed.last);
        store.kept = Some(kept);
        let mut store = store.follow_backup(backup, last, None)?;
        store.report.mirror = Some(MirrorKind {
            kept: Some(kept_dir),
            resumed_at: resumed,
            rebuilt: found.err(),
            followed: store.replica_stats().map_or(0, |r| r.objects_read),
        });
        Ok(store)
    }

    /// Starts the replica's follower over this copy, which ends with `last` (None: empty, or
    /// a temporary copy); `temp`: the copy's temporary directory, removed at close.
    fn follow_backup(
        mut self,
        backup: &crate::options::BackupOptions,
        last: Option<crate::kept::AppendStamp>,
        temp: Option<std::path::PathBuf>,
    ) -> Result<Store, StoreError> {
        let role = match &self.files {
            Some(files) => files.role().clone(),
            None => return Err(StoreError::Closed),
        };
        let replica = crate::replica::Replica::start(
            backup,
            self.shared.clone(),
            role,
            last.unwrap_or_default(),
        )?;
        self.replica = Some((replica, temp));
        Ok(self)
    }
}
