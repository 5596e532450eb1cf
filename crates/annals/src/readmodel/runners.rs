//! The two runners: [`ReadModelRunner`] folds a model's state and checkpoints it;
//! [`ReactorRunner`] appends a reactor's effects with its tracking position.

use super::*;
use crate::state::{self, Damage, Loaded, SavedState, Unfit};

/// Runs a [`ReadModel`]; readers take its lock briefly through [`ReadModelRunner::read`].
pub struct ReadModelRunner<M: ReadModel> {
    pub(super) model: Arc<Mutex<M>>,
    pub(super) runner: Runner,
}

pub(super) struct StateDriver<M: ReadModel> {
    pub(super) model: Arc<Mutex<M>>,
    pub(super) checkpoints: Checkpoints,
    /// The model's name, version and query, and their key.
    pub(super) id: StateId,
    /// The data subjects whose events the state holds.
    pub(super) subjects: Subjects,
    pub(super) position: u64,
    pub(super) saved: u64,
    pub(super) folded_since_save: u64,
    pub(super) last_save: Instant,
    pub(super) options: RunnerOptions,
    pub(super) durable_checkpoints: bool,
    pub(super) checkpoints_written: u64,
    pub(super) scratch: Vec<u8>,
}

/// Why a checkpoint refused by [`crate::state`] does not fit, as a runner reports it.
fn unfit_reason(unfit: &Unfit) -> String {
    match unfit {
        Unfit::SubjectErased { subject, .. } => {
            format!("the data subject {subject}, whose events it folded, was erased")
        }
        other => format!("the checkpoint {other}"),
    }
}

impl<M: ReadModel> Driver for StateDriver<M> {
    fn start(&mut self, store: &Store, rebuild: bool) -> Result<Start, ReadModelError> {
        let mut model = self.model.lock();
        let mut after_erasure = false;
        let reason = if rebuild {
            "a rebuild was asked for".to_owned()
        } else {
            match self.checkpoints.load(store, &self.id)? {
                Loaded::Missing => "no checkpoint".to_owned(),
                Loaded::Older(_) => unfit_reason(&Unfit::Damaged(Damage::NotAState)),
                Loaded::Unfit(unfit) => {
                    after_erasure = matches!(unfit, Unfit::SubjectErased { .. });
                    unfit_reason(&unfit)
                }
                Loaded::Fit(saved) => match model.load(&saved.state) {
                    Ok(()) => {
                        self.subjects.clear();
                        self.subjects.extend(saved.subjects);
                        self.position = saved.position;
                        self.saved = saved.position;
                        self.folded_since_save = 0;
                        self.last_save = Instant::now();
                        return Ok(Start {
                            after: saved.position,
                            rebuilt_because: None,
                            after_erasure: false,
                        });
                    }
                    Err(e) => format!("the checkpoint's state does not load ({e})"),
                },
            }
        };
        model.reset();
        self.subjects.clear();
        self.checkpoints.remove(self.id.name())?;
        self.position = 0;
        self.saved = 0;
        self.folded_since_save = 0;
        self.last_save = Instant::now();
        Ok(Start {
            after: 0,
            rebuilt_because: Some(reason),
            after_erasure,
        })
    }

    fn apply(
        &mut self,
        _store: &Store,
        events: &[Event],
        position: u64,
    ) -> Result<(), ReadModelError> {
        let mut model = self.model.lock();
        for event in events {
            model.apply(event);
            self.subjects.see(event);
        }
        self.folded_since_save += events.len() as u64;
        self.position = position;
        Ok(())
    }

    fn checkpoint(&mut self, store: &Store, force: bool) -> Result<(), ReadModelError> {
        if self.position == self.saved {
            return Ok(());
        }
        let due = force
            || self.folded_since_save >= self.options.checkpoint_events
            || self.last_save.elapsed() >= self.options.checkpoint_interval;
        // A checkpoint must not hold an event the log could still lose: in D2 wait until the
        // background commit has synced it.
        if !due || (self.durable_checkpoints && store.synced() < self.position) {
            return Ok(());
        }
        let appended_at_us = state::appended_at(store, self.position)?.unwrap_or(0);
        self.scratch.clear();
        let position = {
            let model = self.model.lock();
            model.save(&mut self.scratch);
            self.position
        };
        let saved = SavedState {
            name: self.id.name().to_owned(),
            version: self.id.version(),
            key: self.id.key(),
            position,
            appended_at_us,
            saved_at_us: now_us(),
            subjects: self.subjects.to_vec(),
            state: std::mem::take(&mut self.scratch),
        };
        let written = self.checkpoints.save(&saved);
        self.scratch = saved.state;
        written?;
        self.saved = position;
        self.checkpoints_written += 1;
        self.folded_since_save = 0;
        self.last_save = Instant::now();
        Ok(())
    }

    fn position(&self) -> u64 {
        self.position
    }

    fn checkpoint_position(&self) -> u64 {
        self.saved
    }

    fn counters(&self) -> (u64, u64) {
        (self.checkpoints_written, 0)
    }

    fn forgets_erased(&self) -> bool {
        true
    }
}

impl<M: ReadModel> ReadModelRunner<M> {
    /// Loads the model's checkpoint (or rebuilds it from the first event when there is none or
    /// it does not fit) and follows the store on a thread of its own. Checkpoints live in the
    /// store's data directory, under [`CHECKPOINT_DIR`].
    pub fn start(
        store: &Arc<Store>,
        model: M,
        options: RunnerOptions,
    ) -> Result<Self, ReadModelError> {
        let name = model.name().to_owned();
        validate_name(&name)?;
        let query = model.query();
        let driver = StateDriver {
            id: StateId::new(name.clone(), model.version(), query.clone()),
            subjects: Subjects::of(store),
            model: Arc::new(Mutex::new(model)),
            checkpoints: Checkpoints::of_store(store),
            position: 0,
            saved: 0,
            folded_since_save: 0,
            last_save: Instant::now(),
            options: options.clone(),
            durable_checkpoints: matches!(
                store.durability(),
                Durability::OffMachine | Durability::Synced | Durability::SyncedLater
            ),
            checkpoints_written: 0,
            scratch: Vec::new(),
        };
        let model = driver.model.clone();
        let runner = Runner::start(store, &name, RunnerKind::State, query, driver, options)?;
        Ok(ReadModelRunner { model, runner })
    }

    /// Reads the model under its lock (held only for `f`; the runner waits meanwhile).
    pub fn read<T>(&self, f: impl FnOnce(&M) -> T) -> T {
        f(&self.model.lock())
    }

    pub fn status(&self) -> ReadModelStatus {
        self.runner.status()
    }

    /// Waits until the model reflects every matching event at or below `position` (for
    /// read-your-writes after an append). False when `timeout` passed first or the runner
    /// stopped.
    pub fn wait_for(&self, position: u64, timeout: Duration) -> bool {
        self.runner.wait_for(position, timeout)
    }

    /// Asks the runner to discard the checkpoint and the state and fold again from the first
    /// event; it happens on the runner's thread, between batches.
    pub fn rebuild(&self) {
        self.runner.shared.rebuild.store(true, Ordering::Release);
    }

    /// Writes a last checkpoint and stops the thread.
    pub fn stop(mut self) -> ReadModelStatus {
        self.runner.stop();
        self.runner.status()
    }
}

/// Runs a [`Reactor`]: appends its effects with the reactor's tracking position.
pub struct ReactorRunner {
    pub(super) runner: Runner,
}

pub(super) struct EffectDriver<R: Reactor> {
    pub(super) reactor: R,
    pub(super) name: String,
    pub(super) position: u64,
    pub(super) recorded: u64,
    pub(super) effects: Vec<NewEvent>,
    pub(super) effects_appended: u64,
    pub(super) appends: u64,
}

impl<R: Reactor> EffectDriver<R> {
    /// Appends `effects` with the tracking position `upto`, in D3 whatever the store's class
    /// (but a memory-only store).
    fn flush(&mut self, store: &Store, upto: u64) -> Result<(), ReadModelError> {
        if self.effects.is_empty() {
            return Ok(());
        }
        let options = AppendOptions {
            require_synced: store.durability() != Durability::Memory,
            tracking: Some(Tracking::new(self.name.clone(), upto)),
            ..AppendOptions::default()
        };
        // Effects judged by schemas that changed before they were stored are judged again.
        let mut outcome = store
            .appending(&self.effects)
            .options(options.clone())
            .wait();
        for _ in 0..3 {
            if !matches!(outcome, Err(AppendError::AdmissionChanged { .. })) {
                break;
            }
            outcome = store
                .appending(&self.effects)
                .options(options.clone())
                .wait();
        }
        match outcome {
            Ok(_) => {
                self.effects_appended += self.effects.len() as u64;
                self.appends += 1;
                self.recorded = upto;
                self.effects.clear();
                Ok(())
            }
            Err(AppendError::TrackingNotIncreasing { recorded, .. }) => {
                // Only one runner of a name runs on a store, but a client can append with
                // the same tracking source: what it recorded stands, these effects are
                // dropped, and the reactor continues after it.
                self.effects.clear();
                self.recorded = recorded;
                self.position = self.position.max(recorded);
                Ok(())
            }
            Err(e) => {
                self.effects.clear();
                Err(e.into())
            }
        }
    }
}

impl<R: Reactor> Driver for EffectDriver<R> {
    fn start(&mut self, store: &Store, rebuild: bool) -> Result<Start, ReadModelError> {
        if rebuild {
            return Err(ReadModelError::CannotRebuild(self.name.clone()));
        }
        self.recorded = store.tracking(&self.name).unwrap_or(0);
        self.position = self.recorded;
        Ok(Start {
            after: self.recorded,
            rebuilt_because: (self.recorded == 0).then(|| "no tracking position yet".into()),
            after_erasure: false,
        })
    }

    fn apply(
        &mut self,
        store: &Store,
        events: &[Event],
        position: u64,
    ) -> Result<(), ReadModelError> {
        let limits = &store.options().limits;
        let events_max = limits.events_per_append_max.max(1);
        let bytes_max = limits.append_bytes_max / 2;
        let mut bytes = 0usize;
        for event in events {
            if event.position() <= self.recorded {
                continue;
            }
            let before = self.effects.len();
            self.reactor.react(event, &mut self.effects);
            let added: usize = self.effects[before..].iter().map(approximate_size).sum();
            // Keep each append within the store's limits: flush what earlier events produced
            // (tracked at the event before this one) and carry this event's effects on.
            if before > 0 && (self.effects.len() > events_max || bytes + added > bytes_max) {
                let carried = self.effects.split_off(before);
                self.flush(store, event.position() - 1)?;
                if event.position() <= self.recorded {
                    // Another runner of this name has reacted to it already.
                    continue;
                }
                self.effects = carried;
                bytes = 0;
            }
            bytes += added;
        }
        if let Some(last) = events.last() {
            self.flush(store, last.position().max(self.recorded))?;
        }
        self.position = self.position.max(position);
        Ok(())
    }

    fn checkpoint(&mut self, _store: &Store, _force: bool) -> Result<(), ReadModelError> {
        // The tracking position is written with each append of effects.
        Ok(())
    }

    fn position(&self) -> u64 {
        self.position
    }

    fn checkpoint_position(&self) -> u64 {
        self.recorded
    }

    fn counters(&self) -> (u64, u64) {
        (self.appends, self.effects_appended)
    }
}

pub(super) fn approximate_size(event: &NewEvent) -> usize {
    64 + event.event_type.len()
        + event.data.len()
        + event.metadata.len()
        + event.tags.iter().map(|t| t.len() + 4).sum::<usize>()
}

impl ReactorRunner {
    /// Resumes after the reactor's tracking position in the store and follows the store on a
    /// thread of its own.
    pub fn start<R: Reactor>(
        store: &Arc<Store>,
        reactor: R,
        options: RunnerOptions,
    ) -> Result<Self, ReadModelError> {
        let name = reactor.name().to_owned();
        validate_name(&name)?;
        let query = reactor.query();
        let driver = EffectDriver {
            reactor,
            name: name.clone(),
            position: 0,
            recorded: 0,
            effects: Vec::new(),
            effects_appended: 0,
            appends: 0,
        };
        let runner = Runner::start(store, &name, RunnerKind::Effects, query, driver, options)?;
        Ok(ReactorRunner { runner })
    }

    pub fn status(&self) -> ReadModelStatus {
        self.runner.status()
    }

    /// See [`ReadModelRunner::wait_for`].
    pub fn wait_for(&self, position: u64, timeout: Duration) -> bool {
        self.runner.wait_for(position, timeout)
    }

    pub fn stop(mut self) -> ReadModelStatus {
        self.runner.stop();
        self.runner.status()
    }
}
