//! The file engine's start and stop: the writer thread (holding the role between groups), the
//! syncer and the notifier, over a log that recovery has found and published.

use std::thread::JoinHandle;

use super::*;
use crate::parts::Service;

/// The threads of a log on segment files: stopped after the log's queue has closed.
pub(crate) struct FileEngine {
    writer: Option<JoinHandle<()>>,
    syncer: Option<(Arc<Syncer>, JoinHandle<()>)>,
    notifier: Option<(Arc<Notifier>, JoinHandle<()>)>,
}

/// Starts the engine of the log `shared` holds, which ends at `mark` (`tail`) in `segment`:
/// its notifier and syncer (none in D0, where nothing is synced or waits) and its writer
/// thread. Answers the files' side of the seam, whose queue the writer thread takes appends
/// from until it closes, and the engine's threads.
pub(crate) fn start(
    shared: Arc<Shared>,
    segment: Arc<Segment>,
    mark: Mark,
    tail: Tail,
    right: PublishRight,
) -> Result<(FileLog, FileEngine), StoreError> {
    let dir = shared.dir.clone();
    let spawn_failed = |what: &'static str, e| StoreError::io(what, &dir, 0, e);
    let notifier = match shared.options.durability {
        Durability::Memory => None,
        _ => {
            let notifier = Arc::new(Notifier::new(right));
            let handle = {
                let notifier = notifier.clone();
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name("annals-notifier".into())
                    .spawn(move || notifier.run(shared))
                    .map_err(|e| spawn_failed("spawn notifier thread", e))?
            };
            Some((notifier, handle))
        }
    };
    let syncer = match &notifier {
        Some((notifier, _)) => {
            let syncer = Arc::new(Syncer::new(
                segment.clone(),
                mark,
                notifier.clone(),
                shared.options.durability,
                right,
            ));
            let handle = {
                let syncer = syncer.clone();
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name("annals-syncer".into())
                    .spawn(move || syncer.run(&shared))
                    .map_err(|e| spawn_failed("spawn syncer thread", e))?
            };
            Some((syncer, handle))
        }
        None => None,
    };
    let (sender, receiver) = crossbeam_channel::bounded(shared.options.limits.queue_depth_max);
    let writer = Writer::new(
        shared.clone(),
        receiver,
        segment,
        tail,
        syncer.as_ref().map(|(s, _)| s.clone()),
        right,
    );
    let role = Arc::new(WriterRole::new(writer));
    let mut engine = FileEngine {
        writer: None,
        syncer,
        notifier,
    };
    let handle = {
        let role = role.clone();
        std::thread::Builder::new()
            .name("annals-writer".into())
            .spawn(move || role.run())
            .map_err(|e| spawn_failed("spawn writer thread", e))?
    };
    engine.writer = Some(handle);
    Ok((FileLog::new(sender, role, shared), engine))
}

impl Service for FileEngine {
    /// Waits for the writer thread, which ends once its queue is closed and empty, then
    /// stops the syncer and the notifier.
    fn stop(&mut self) {
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        if let Some((syncer, handle)) = self.syncer.take() {
            syncer.stop();
            let _ = handle.join();
        }
        if let Some((notifier, handle)) = self.notifier.take() {
            notifier.stop();
            let _ = handle.join();
        }
    }
}

impl Drop for FileEngine {
    fn drop(&mut self) {
        self.stop();
    }
}
