//! Opening a log on segment files: the store's own, or the copy a database or a backup keeps.
//! Recovery finds what the directory holds (`recovery::recover`), the writer's engine starts
//! over it (`writer::start`).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::companions::{Companions, InDirectory};
use crate::error::StoreError;
use crate::io::Io;
use crate::log::Log;
use crate::options::Options;
use crate::parts::{CopyDir, Parts, Services};
use crate::published::{Mark, Published};
use crate::route::{Backend, Policy};
use crate::shared::{CheckpointTrigger, Shared, SpareBodies};
use crate::shelf::files::FileShelf;
use crate::stats::OpenReport;
use crate::store::Store;
use crate::writer::{FileEngine, FileLog};

const LOCK_FILE: &str = "LOCK";

/// A log on files, opened and its engine running: the store's own, or a copy that a
/// backend puts its own side of the seam in front of.
pub(super) struct OnFiles {
    pub(super) shared: Arc<Shared>,
    /// Declared before the engine: dropped first, it closes the queue the writer thread
    /// waits on, so that the engine's stop (at its drop) finds the writer ending.
    pub(super) files: FileLog,
    engine: FileEngine,
    pub(super) report: OpenReport,
    companions: Arc<dyn Companions>,
}

impl OnFiles {
    /// The parts of a store whose log is `log` (in front of these files, which it owns),
    /// its companions and its copy of the log where `companions` and `copy` say.
    pub(super) fn into_parts(
        self,
        log: impl FnOnce(FileLog) -> Result<Box<dyn Log>, StoreError>,
        companions: Option<Arc<dyn Companions>>,
        copy: CopyDir,
    ) -> Result<Parts, StoreError> {
        let OnFiles {
            shared,
            files,
            engine,
            report,
            companions: in_directory,
        } = self;
        let log = log(files)?;
        let mut services = Services::default();
        services.push(engine);
        let shelf = Box::new(FileShelf::new(shared.io.clone(), &shared.dir));
        Ok(Parts {
            shelf,
            shared,
            log,
            services,
            companions: companions.unwrap_or(in_directory),
            copy,
            report,
        })
    }

    /// The store whose own log this is.
    pub(super) fn into_store(self) -> Result<Store, StoreError> {
        debug_assert_eq!(self.shared.policy.backend, Backend::Files);
        let parts = self.into_parts(|files| Ok(Box::new(files)), None, CopyDir::Own)?;
        Store::from_parts(parts)
    }
}

/// Opens the log on files in `dir`: the store's own, or the copy a `backend` keeps of its log
/// (which decides with the class the commit path's policy). `table`: where a database keeps
/// the subjects' keys. The keys the log carries as grants are taken in before this answers.
pub(super) fn open(
    io: Arc<dyn Io>,
    dir: &Path,
    options: Options,
    backend: Backend,
    table: Option<Arc<dyn crate::keys::KeyTable>>,
) -> Result<OnFiles, StoreError> {
    let started = Instant::now();
    options.validate().map_err(StoreError::InvalidOption)?;
    io.create_dir_all(dir)
        .map_err(|e| StoreError::io("create data directory", dir, 0, e))?;
    let lock = io.lock(&dir.join(LOCK_FILE)).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            StoreError::Locked {
                path: dir.to_path_buf(),
            }
        } else {
            StoreError::io("lock data directory", dir.join(LOCK_FILE), 0, e)
        }
    })?;
    // The keys are checked against the prefixes before recovery writes anything.
    let keys = Store::open_keys(&io, dir, &options, backend, table)?;
    let found = crate::recovery::recover(io.as_ref(), dir, &options, backend == Backend::Files)?;
    let tail = found.tail;
    let segment = found.segments[tail.segment].clone();
    let mark = Mark {
        head: tail.head,
        segment: segment.number,
        end_offset: tail.offset,
        last_record_offset: tail.last_record_offset,
    };
    let policy = Policy::new(options.durability, backend);
    let (published, right) = Published::new(mark, policy.publish_when_synced);
    let shared = Arc::new(Shared {
        dir: dir.to_path_buf(),
        io: io.clone(),
        index: crate::index::IndexLock::new(found.index),
        segments: RwLock::new(found.segments),
        published,
        policy,
        health: Default::default(),
        counters: found.counters,
        waiting: Default::default(),
        runners: Mutex::new(Default::default()),
        checkpoints: CheckpointTrigger::new(tail.head),
        spare_bodies: Mutex::new(SpareBodies::default()),
        options,
        keys,
        _lock: lock,
    });
    let (files, engine) = crate::writer::start(shared.clone(), segment, mark, tail, right)?;
    let opened = OnFiles {
        report: OpenReport {
            index: found.index_source,
            torn_tail: found.torn_tail,
            open_ms: started.elapsed().as_secs_f64() * 1e3,
            mirror: None,
        },
        companions: Arc::new(InDirectory {
            io,
            dir: dir.to_path_buf(),
        }),
        shared,
        files,
        engine,
    };
    crate::store::subjects::take_in_grants(&opened.shared)?;
    Ok(opened)
}
