//! The writer's role: who stages and writes, the writer thread or a lone caller.

use super::*;

/// The writer's role: the writer's state, taken by the writer thread for each group it
/// commits, or by a caller that finds the store idle and commits its own append on its own
/// thread (see [`WriterRole::commit_alone`]). Readers never take it; appenders only try it.
pub(crate) struct WriterRole {
    writer: Mutex<Writer>,
    receiver: Receiver<Request>,
    syncer: Option<Arc<Syncer>>,
    shared: Arc<Shared>,
}

impl WriterRole {
    pub(crate) fn new(writer: Writer) -> Self {
        WriterRole {
            receiver: writer.receiver.clone(),
            syncer: writer.syncer.clone(),
            shared: writer.shared.clone(),
            writer: Mutex::new(writer),
        }
    }

    /// The writer thread: takes each append from the queue with whatever waits behind it, and
    /// commits them as one group. Returns when the queue is closed and empty.
    pub(crate) fn run(&self) {
        let shared = &self.shared;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Blocks for the next append rather than polling for it: on a machine with few
            // cores the client the writer has just woken often runs on the writer's core, and
            // a polling writer kept it waiting (docs/DECISIONS.md, R10).
            while let Ok(first) = self.receiver.recv() {
                let bytes = first.append.body.len();
                // Held for the running sync, or committed at once (`Policy::route_from_queue`).
                let route = shared.policy.route_from_queue(is_small(&first.append));
                if route == Route::Held {
                    if let Some(syncer) = &self.syncer {
                        syncer.wait_for_running_sync();
                    }
                }
                let mut writer = self.writer.lock();
                writer.group.push(first);
                self.gather(&mut writer, bytes);
                let mut inline = writer.commit_group(route);
                // The writer thread syncs the group on its own thread with the role released:
                // meanwhile callers stage small appends themselves (`stage_during_sync`), so
                // the staging of the next group overlaps this sync, and when it ends the next
                // group is written and synced at once. (Staged by the writer thread after the
                // sync, 64 deciding clients had the disk idle a third of the time.)
                while let (Some(sync), Some(syncer)) = (inline.take(), &self.syncer) {
                    writer.open_for_staging = true;
                    MutexGuard::unlocked(&mut writer, || syncer.run_inline(shared, sync));
                    writer.open_for_staging = false;
                    if writer.early > 0 || !writer.group.is_empty() {
                        let bytes = writer.buffer.len()
                            + writer
                                .group
                                .iter()
                                .map(|r| r.append.body.len())
                                .sum::<usize>();
                        self.gather(&mut writer, bytes);
                        inline = writer.commit_group(Route::Held);
                    }
                }
            }
        }));
        let mut writer = self.writer.lock();
        // A segment still being prepared must not outlive the store's hold on the directory.
        if let Some((handle, _)) = writer.next_segment.take() {
            let _ = handle.join();
        }
        drop(writer);
        if result.is_err() {
            shared.poison("the writer thread panicked".into());
            // Whoever still waits must not wait forever.
            while let Ok(request) = self.receiver.try_recv() {
                request.reply.send(Err(shared
                    .poison_error()
                    .unwrap_or(StoreError::Closed)
                    .into()));
            }
        }
    }

    /// Adds to the writer's group what waits in the queue, up to `group_bytes_max` in all.
    fn gather(&self, writer: &mut Writer, mut bytes: usize) {
        while bytes < self.shared.options.group_bytes_max {
            match self.receiver.try_recv() {
                Ok(request) => {
                    bytes += request.append.body.len();
                    writer.group.push(request);
                }
                Err(_) => break,
            }
        }
    }

    /// Stages a small append on the calling thread into the next group while the writer thread
    /// syncs the group before it with the role released (see `WriterRole::run`); the writer
    /// thread writes and syncs it with the next group when that sync ends. Staging is the
    /// checks, the record's copy into the writer's buffer and the index's additions: no I/O
    /// and no waiting, so any caller may do it, an async runtime's thread included. Appends
    /// queued before it are staged first (in the order they were queued), so that one caller's
    /// appends keep the order they were submitted in. Otherwise (the role is taken, no such
    /// sync runs, the append is large, or the next group has no room for it) hands the
    /// request back, to be queued.
    pub(crate) fn stage_during_sync(&self, request: Request) -> Result<(), Request> {
        if !is_small(&request.append) {
            return Err(request);
        }
        let Some(mut writer) = self.writer.try_lock() else {
            return Err(request);
        };
        // A request parked in the group is to be staged before anything queued after it.
        if !writer.open_for_staging || !writer.group.is_empty() {
            return Err(request);
        }
        while self.shared.poison_error().is_none() {
            let Ok(queued) = self.receiver.try_recv() else {
                return self.stage_early(&mut writer, request);
            };
            if let Err(queued) = self.stage_early(&mut writer, queued) {
                // No room: it goes first in the writer thread's next group, and what is still
                // queued (this request last) follows it there.
                writer.group.push(queued);
                break;
            }
        }
        Err(request)
    }

    /// Stages `request` into the next group for [`WriterRole::stage_during_sync`], or hands it
    /// back when the next group or the segment has no room for it.
    fn stage_early(&self, writer: &mut Writer, mut request: Request) -> Result<(), Request> {
        let stored = aligned(HEADER_BYTES + request.append.body.len());
        let buffered = writer.buffer.len() + stored;
        if buffered > self.shared.options.group_bytes_max
            || writer.tail + buffered as u64 > writer.segment.size
        {
            return Err(request);
        }
        let staged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            writer.stage(&request, now_us())
        }));
        let Ok(staged) = staged else {
            self.shared
                .poison("the writer panicked staging an append on its caller's thread".into());
            request.reply.send(Err(StoreError::Poisoned {
                reason: "the writer panicked staging this append".into(),
            }
            .into()));
            return Ok(());
        };
        let (needed, outcome) = match staged {
            Staged::Appended(last) => {
                self.shared.counters.committed(Route::Staged, 1);
                (last, Ok(last))
            }
            // In D3 every outcome waits for a sync: a conflict may name a staged event.
            Staged::Done(outcome) => (writer.next_position - 1, outcome),
        };
        self.shared
            .recycle_body(std::mem::take(&mut request.append.body));
        writer.early += 1;
        writer.waiters.push(Waiter {
            needed,
            reply: request.reply,
            outcome,
            trace: request.trace,
        });
        self.shared
            .counters
            .caller_stages
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Commits, on the calling thread, appends that the database behind a PostgreSQL store has
    /// committed (the committer's hand-over to the mirror log, see postgres/committer.rs),
    /// waiting for the role if another thread holds it. The mirror's appends all come this way, so its
    /// queue stays empty and its writer thread idle: the hand-over costs no wake-up. In the
    /// mirror's class (D1) every append is answered before this returns.
    /// A read replica hands over what its backup holds the same way (`Route::Replicated`).
    #[cfg_attr(
        not(any(feature = "postgres", feature = "object-store")),
        allow(dead_code)
    )]
    pub(crate) fn commit_committed(&self, requests: Vec<Request>, route: Route) {
        let mut writer = self.writer.lock();
        debug_assert!(writer.group.is_empty() && self.receiver.is_empty());
        writer.group.extend(requests);
        self.commit_here(
            &mut writer,
            route,
            "the writer panicked taking in committed appends",
        );
    }

    /// Commits `request` on the calling thread, a blocking caller that is the only one waiting
    /// on the store (see [`Waiting::alone`]), when the store is idle: nothing is queued, no
    /// sync runs or waits to run, and the role is free. The request then takes the writer
    /// thread's path (the lone group's inline sync included) without being handed to the
    /// writer and back: a wake-up of a sleeping thread,
    /// tens of microseconds on a virtual machine whose idle cores halt, against a 100 us
    /// fdatasync. Otherwise hands the request back, to be queued.
    ///
    /// Async callers never commit here. A server's appends come from request tasks that,
    /// between one append and the next, answer a client and read its next request: at a given
    /// moment none may be waiting on the store while tens of requests wait in the runtime,
    /// where the store cannot see them. Letting a lone async caller commit (and fdatasync) on
    /// its runtime's thread fed on itself: each such commit held a runtime thread for an
    /// fdatasync, so the next request reached the store alone too, and group commit collapsed
    /// to about one append per fdatasync (docs/DECISIONS.md, R12).
    pub(crate) fn commit_alone(&self, request: Request) -> Result<(), Request> {
        if !self.receiver.is_empty() || self.syncer.as_ref().is_some_and(|s| s.busy()) {
            return Err(request);
        }
        let Some(mut writer) = self.writer.try_lock() else {
            return Err(request);
        };
        // Queued meanwhile: the writer thread is waiting for the role and takes it in turn.
        if !self.receiver.is_empty() {
            return Err(request);
        }
        writer.group.push(request);
        // A panic drops the request's reply, which answers it with an error.
        self.commit_here(
            &mut writer,
            Route::Alone,
            "the writer panicked in a caller's commit",
        );
        Ok(())
    }

    /// Commits the held writer's group on the calling thread, its sync included when the
    /// writer leaves it inline; a panic poisons the store with `panicked`.
    fn commit_here(&self, writer: &mut Writer, route: Route, panicked: &str) {
        let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let inline = writer.commit_group(route);
            if let (Some(sync), Some(syncer)) = (inline, &self.syncer) {
                syncer.run_inline(&self.shared, sync);
            }
        }));
        if committed.is_err() {
            self.shared.poison(panicked.into());
        }
    }
}
