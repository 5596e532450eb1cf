//! The routes an append takes into the log, and the policy that decides among them, computed
//! once at open from the durability class and the backend. Every decision on the commit path
//! reads the policy; every append that is committed is counted on its route (`Stats::commits`,
//! `annals_commits_total{route}` in the server's metrics).
//!
//! The routes, when each is taken and who syncs and answers, are the table in
//! docs/ARCHITECTURE.md ("The commit path").

use crate::options::Durability;

/// Where a store's log lives ([`crate::Store::backend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// Segment files in the store's data directory.
    Files,
    /// A PostgreSQL database, in front of a mirror on files.
    Postgres,
    /// A backup in object storage that another store writes: a read replica's copy on files.
    Replica,
}

impl Backend {
    /// Its name in stats, metrics and the command line: "files", "postgres" or "replica".
    pub fn name(self) -> &'static str {
        match self {
            Backend::Files => "files",
            Backend::Postgres => "postgres",
            Backend::Replica => "replica",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The route an append took into the log (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Queued,
    Held,
    Staged,
    Alone,
    Database,
    DatabaseAlone,
    /// A read replica taking in what its backup holds.
    Replicated,
}

impl Route {
    pub(crate) const ALL: [Route; 7] = [
        Route::Queued,
        Route::Held,
        Route::Staged,
        Route::Alone,
        Route::Database,
        Route::DatabaseAlone,
        Route::Replicated,
    ];

    /// The route's name in stats and metrics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Route::Queued => "queued",
            Route::Held => "held",
            Route::Staged => "staged",
            Route::Alone => "alone",
            Route::Database => "database",
            Route::DatabaseAlone => "database_alone",
            Route::Replicated => "replicated",
        }
    }
}

/// What the commit path may do in a store, decided once at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub(crate) backend: Backend,
    /// Appends are acknowledged, and the head published, once written and before their
    /// fdatasync: every class below D3.
    pub(crate) acknowledge_when_written: bool,
    /// Every acknowledgement waits for the sync that covers the append (D3): the head is
    /// published only once synced (`Published` asserts it).
    pub(crate) publish_when_synced: bool,
    /// A small append the writer thread takes from the queue is held for the running sync,
    /// and the writer thread syncs held groups itself (R9, R11, R27): D3 on files.
    pub(crate) hold_small: bool,
    /// A lone async caller polls briefly before it sleeps: on files, where the wait is an
    /// fdatasync and its core is otherwise idle; not on a database, whose commit needs the
    /// machine's cores (R7, R30).
    pub(crate) lone_async_polls: bool,
}

impl Policy {
    pub(crate) fn new(durability: Durability, backend: Backend) -> Policy {
        let synced = durability >= Durability::Synced
            && !crate::canary::on(crate::canary::Canary::AckBeforeFsync);
        Policy {
            backend,
            acknowledge_when_written: !synced,
            publish_when_synced: synced,
            hold_small: synced && backend == Backend::Files,
            lone_async_polls: backend == Backend::Files,
        }
    }
}

impl Policy {
    /// The route of an append the writer thread takes from the queue: held for the running
    /// sync (then synced by the writer thread itself) when small in D3 on files, since staging
    /// it before that sync ends gains nothing and held appends make groups several times
    /// larger; otherwise queued, its staging overlapped with the running sync (R11).
    pub(crate) fn route_from_queue(&self, small: bool) -> Route {
        if self.hold_small && small {
            Route::Held
        } else {
            Route::Queued
        }
    }

    /// Whether the committer of a written group runs its fdatasync on its own thread: when
    /// there is nothing to overlap the sync with (a lone small append, a caller alone, a held
    /// group, whose small followers would be held for the sync anyway); large appends and
    /// groups behind them go to the syncer thread, so that the writer is free to stage the
    /// next while the disk syncs (R9, R27).
    pub(crate) fn sync_here(&self, route: Route, lone_small: bool) -> bool {
        self.hold_small && (lone_small || route != Route::Queued)
    }
}
