//! The routes an append takes into the log, and the policy that decides among them, computed
//! once at open from the durability class and the backend. Every decision on the commit path
//! reads the policy; every append that is committed is counted on its route (`Stats::commits`,
//! `annals_commits_total{route}` in the server's metrics).
//!
//! The routes, when each is taken and who syncs and answers, are the table in
//! docs/ARCHITECTURE.md ("The commit path").

use crate::options::Durability;

/// Where the log is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Files,
    /// A PostgreSQL database, in front of a mirror on files.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
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
}

impl Route {
    pub(crate) const ALL: [Route; 6] = [
        Route::Queued,
        Route::Held,
        Route::Staged,
        Route::Alone,
        Route::Database,
        Route::DatabaseAlone,
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
        let synced = durability == Durability::Synced
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
