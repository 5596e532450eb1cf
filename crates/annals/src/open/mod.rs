//! Opening a store: each backend's open makes the store's parts (`crate::parts`), and a store is
//! made of them. Segment files (`files.rs`) are every backend's base: PostgreSQL
//! (`postgres.rs`) and a read replica (`replica.rs`) keep a copy of their log in a file store,
//! temporary or kept across clean closes (`kept.rs`), and put their own side of the seam in
//! front of its writer. Which backends a build has is decided here, by its features, and
//! nowhere in the store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{OpenError, StoreError};
use crate::io::{Io, RealIo};
use crate::options::{BackupOptions, Durability, Options};
use crate::route::Backend;
use crate::sim::SimIo;
use crate::store::Store;

mod files;
#[cfg(any(feature = "postgres", feature = "object-store"))]
mod kept;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "object-store")]
mod replica;

/// Where a store's log lives, with what only that backend takes ([`Store::open_at`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Location {
    /// Segment files in a data directory.
    Directory(PathBuf),
    /// A PostgreSQL database (see `Store::open_postgres`), and the directory where the store
    /// keeps its mirror across clean closes, so that the next open reads only what the
    /// database committed since (None: a temporary directory, filled at every open).
    Postgres {
        url: String,
        mirror: Option<PathBuf>,
    },
    /// A read replica of a backup (see `Store::open_replica`), and the directory where it
    /// keeps its copy across clean closes, so that the next open takes in only what the
    /// backup holds beyond it (None: a temporary directory, filled at every open).
    Replica {
        backup: BackupOptions,
        copy: Option<PathBuf>,
    },
}

impl Location {
    /// A PostgreSQL URL (`postgres://` or `postgresql://`) or else a data directory.
    pub fn parse(location: &str) -> Location {
        match is_database_url(location) {
            true => Location::Postgres {
                url: location.to_string(),
                mirror: None,
            },
            false => Location::Directory(PathBuf::from(location)),
        }
    }

    /// The backend a store at this location runs on.
    pub fn backend(&self) -> Backend {
        match self {
            Location::Directory(_) => Backend::Files,
            Location::Postgres { .. } => Backend::Postgres,
            Location::Replica { .. } => Backend::Replica,
        }
    }
}

/// What opening a location answers when this build leaves its backend out.
#[cfg_attr(all(feature = "postgres", feature = "object-store"), allow(dead_code))]
fn left_out(location: &Location, feature: &str) -> StoreError {
    let name = location.backend();
    StoreError::InvalidOption(format!(
        "a store on {name} needs the annals crate's `{feature}` feature, which this build \
         leaves out (the server and the command line have it)"
    ))
}

/// The local class of a store opened in `options.durability`, and whether its appends are
/// D4 besides (D4 is D3 on the log, and a backup's put before acknowledgement).
pub(crate) fn off_machine_class(mut options: Options) -> Result<(Options, bool), StoreError> {
    if options.durability != Durability::OffMachine {
        return Ok((options, false));
    }
    if options.backup.is_none() {
        return Err(StoreError::InvalidOption(
            "the off-machine class (d4) needs a backup in object storage (Options::backup, \
             annals serve --backup URL)"
                .into(),
        ));
    }
    options.durability = Durability::Synced;
    Ok((options, true))
}

/// Whether a store location names a PostgreSQL database rather than a directory.
pub fn is_database_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// Whether `location` reads as libpq's other form of connection string, `key=value` pairs
/// (`host=db1 dbname=annals`): every word a pair whose key is one of libpq's. Such a string
/// given where a store is expected is refused as a directory, rather than made into one.
fn is_key_value_connection_string(location: &str) -> bool {
    const KEYS: &[&str] = &[
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "sslmode",
        "sslrootcert",
        "application_name",
        "connect_timeout",
        "options",
        "target_session_attrs",
        "keepalives",
        "channel_binding",
    ];
    let mut words = location.split_whitespace().peekable();
    words.peek().is_some()
        && words.all(|w| {
            w.split_once('=')
                .is_some_and(|(key, _)| KEYS.contains(&key))
        })
}

impl Store {
    /// Opens (creating if needed) the store in `dir`. A D0 store lives in memory only and
    /// ignores `dir`.
    /// A directory whose name reads as a libpq `key=value` connection string is refused: a
    /// database is given as a URL (see [`Store::open_location`]).
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store, OpenError> {
        if let Some(name) = dir
            .as_ref()
            .to_str()
            .filter(|d| is_key_value_connection_string(d))
        {
            return Err(OpenError::InvalidOption(format!(
                "{name:?} reads as a PostgreSQL connection string of key=value pairs, not a \
                 directory; give the database as a URL, postgres://user@host:port/dbname (a Unix \
                 socket's directory percent-encoded as the host, as in \
                 postgres://user@%2Fvar%2Frun%2Fpostgresql/dbname)"
            )));
        }
        if options.durability == Durability::Memory {
            return Self::open_with_io(Arc::new(SimIo::memory()), dir.as_ref(), options);
        }
        Self::open_with_io(Arc::new(RealIo), dir.as_ref(), options)
    }

    /// Opens a memory-only (D0) store.
    pub fn open_in_memory(mut options: Options) -> Result<Store, OpenError> {
        options.durability = Durability::Memory;
        Self::open_with_io(Arc::new(SimIo::memory()), Path::new("/memory"), options)
    }

    /// Opens the store through a given I/O layer (the simulated one, in tests).
    pub fn open_with_io(io: Arc<dyn Io>, dir: &Path, options: Options) -> Result<Store, OpenError> {
        let (local, off_machine) = off_machine_class(options)?;
        let opened = files::open(io, dir, local.clone(), Backend::Files, None)?;
        let store = opened.into_store()?;
        store.settle_erasures()?;
        Ok(begin_services(store, &local, off_machine)?)
    }

    /// Opens the store at `location`: a PostgreSQL URL (`postgres://` or `postgresql://`, see
    /// `Store::open_postgres`) or else a data directory (see [`Store::open`]).
    pub fn open_location(location: &str, options: Options) -> Result<Store, OpenError> {
        Self::open_at(&Location::parse(location), options)
    }

    /// Opens the store at `location`, on its backend.
    pub fn open_at(location: &Location, options: Options) -> Result<Store, OpenError> {
        let opened = match location {
            Location::Directory(dir) => return Self::open(dir, options),
            #[cfg(feature = "postgres")]
            Location::Postgres { url, mirror } => postgres::open(url, mirror.as_deref(), options),
            #[cfg(feature = "object-store")]
            Location::Replica { backup, copy } => replica::open(backup, copy.as_deref(), options),
            #[cfg(not(feature = "postgres"))]
            Location::Postgres { .. } => Err(left_out(location, "postgres")),
            #[cfg(not(feature = "object-store"))]
            Location::Replica { .. } => Err(left_out(location, "object-store")),
        };
        Ok(opened?)
    }
}

/// Starts the services `options` asks for beside an opened store: the scrub (on files) and
/// the continuous backup (every append D4 when `off_machine`).
fn begin_services(
    mut store: Store,
    options: &Options,
    off_machine: bool,
) -> Result<Store, StoreError> {
    store.set_off_machine(off_machine);
    let shared = store.shared_arc().clone();
    let on_files =
        shared.policy.backend == Backend::Files && options.durability != Durability::Memory;
    if let (Some(scrub), true) = (&options.scrub, on_files) {
        store.run(crate::scrub::Scrub::start(
            shared.clone(),
            scrub.clone(),
            options.backup.clone(),
        )?);
    }
    let Some(backup) = &options.backup else {
        return Ok(store);
    };
    #[cfg(feature = "object-store")]
    {
        store.run(crate::ship::Backup::start(shared, backup.clone())?);
        Ok(store)
    }
    #[cfg(not(feature = "object-store"))]
    {
        drop(shared);
        Err(StoreError::InvalidOption(format!(
            "a backup to {} needs object storage, which this build leaves out (the annals \
             crate's feature `object-store`)",
            backup.url
        )))
    }
}
