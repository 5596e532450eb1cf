//! The store's append API: every way to send an append ends in `submit_encoded`, which hands
//! it to the log's backend.

use super::*;

impl Store {
    /// An append of `events`, to give a condition and options and then send: the one way to
    /// append, whether the caller blocks, awaits or takes a callback (see [`Append`]).
    pub fn appending<'a>(&'a self, events: &'a [NewEvent]) -> Append<'a> {
        Append::of_events(self, events)
    }

    /// An append of the events of `batch` (see [`Store::appending`]). A batch carries no
    /// tracking position: append `NewEvent`s for that.
    pub fn appending_batch(&self, batch: EventBatch) -> Append<'_> {
        Append::of_batch(self, batch)
    }

    /// Appends `events` atomically if `condition` holds; returns the last event's position.
    /// Waits while the append queue is full (backpressure). Shorthand for
    /// [`Store::appending`] with [`Append::wait`], kept because it is the commonest append.
    pub fn append(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
    ) -> Result<u64, AppendError> {
        self.appending(events)
            .condition_given(condition.map(Cow::Borrowed))
            .wait()
    }

    /// Appends without blocking the calling thread. Shorthand for [`Store::appending`] with
    /// [`Append::submit`], which says how to await it.
    pub async fn append_async(
        &self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
        options: AppendOptions,
    ) -> Result<u64, AppendError> {
        self.appending(events)
            .condition_given(condition.map(Cow::Borrowed))
            .options(options)
            .submit()
            .await
    }

    pub(crate) fn submit(
        &self,
        events: &[NewEvent],
        condition: Option<Cow<'_, AppendCondition>>,
        options: AppendOptions,
        reply: ReplyTo,
        how: Submit,
    ) -> Result<(), AppendError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e.into());
        }
        // With data subjects the sealing refuses it; without, it would read as an erasure's
        // receipt once subjects were configured (or to a server with subjects on the same
        // database, which would drop the subject's key as it took the receipt in).
        // The registry's events likewise: only the registry appends them, carried.
        if !options.carried {
            let receipts = self.shared.keys.is_none();
            if let Some((index, e)) = events.iter().enumerate().find(|(_, e)| {
                (receipts && e.event_type == crate::subject::SUBJECT_ERASED_TYPE)
                    || crate::admission::is_registry_type(&e.event_type)
            }) {
                return Err(InputError::ReservedType {
                    index,
                    event_type: e.event_type.clone(),
                }
                .into());
            }
        }
        let limits = &self.shared.options.limits;
        let tracking = options
            .tracking
            .as_ref()
            .map(|t| (t.source.as_str(), t.position));
        let append = encode_append_tracked(events, tracking, limits)?;
        let carried = options.carried;
        self.submit_encoded(append, condition, options, reply, how, None, carried)
    }

    /// Queues an append read from a log (a copy's), with its own append time; see
    /// [`Store::append_stored_then`].
    pub(crate) fn submit_stored(
        &self,
        append: EncodedAppend,
        condition: AppendCondition,
        appended_at_us: u64,
        done: Box<dyn FnOnce(Result<u64, AppendError>) + Send>,
    ) -> Result<(), AppendError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e.into());
        }
        let limits = &self.shared.options.limits;
        if append.body.len() > limits.append_bytes_max {
            return Err(InputError::AppendTooLarge {
                bytes: append.body.len(),
                max: limits.append_bytes_max,
            }
            .into());
        }
        self.submit_encoded(
            append,
            Some(Cow::Owned(condition)),
            AppendOptions::default(),
            ReplyTo::Callback(done),
            Submit {
                wait_when_full: true,
                alone: false,
                trace: tracing::Span::none(),
            },
            Some(appended_at_us),
            // A copy's or a backup's log holds the receipts of its erasures.
            true,
        )
    }

    /// An empty [`EventBatch`] checked against this store's limits.
    pub fn batch(&self) -> EventBatch {
        EventBatch::new(&self.shared.options.limits)
    }

    /// [`Store::batch`] with room for `bytes` of encoded events.
    pub fn batch_with_capacity(&self, bytes: usize) -> EventBatch {
        let body = self.shared.spare_bodies.lock().take();
        EventBatch::with_body(&self.shared.options.limits, body, bytes)
    }

    pub(crate) fn submit_batch(
        &self,
        batch: EventBatch,
        condition: Option<Cow<'_, AppendCondition>>,
        options: AppendOptions,
        reply: ReplyTo,
        how: Submit,
    ) -> Result<(), AppendError> {
        if let Some(e) = self.shared.poison_error() {
            return Err(e.into());
        }
        if options.tracking.is_some() {
            return Err(InputError::TrackingInBatch.into());
        }
        let append = batch.into_append()?;
        self.submit_encoded(append, condition, options, reply, how, None, false)
    }

    /// Hands an encoded append to the log. `receipt`: the store's own erasure receipt, or
    /// events carried from another log's history: not admitted again, receipts among them
    /// left in the clear.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn submit_encoded(
        &self,
        append: EncodedAppend,
        condition: Option<Cow<'_, AppendCondition>>,
        options: AppendOptions,
        reply: ReplyTo,
        how: Submit,
        appended_at: Option<u64>,
        receipt: bool,
    ) -> Result<(), AppendError> {
        let log = self.log().ok_or(StoreError::Closed)?;
        // A replica refuses before sealing: it makes no keys.
        if let Some(refusal) = log.refusal() {
            return Err(refusal.into());
        }
        if let Some(reason) = self.shared.health.appends_refused() {
            return Err(StoreError::Unavailable {
                reason: reason.to_string(),
            }
            .into());
        }
        // The admission check sees the append as the client gave it, before it is sealed;
        // the store's own receipts (and appends carried from another log) were admitted when
        // they were first made.
        let fence = match (&self.shared.options.admission, receipt) {
            (Some(check), false) => check
                .admit(&admitting(&append, self))
                .map_err(InputError::NotAdmitted)?
                .fence
                .map(|f| {
                    let items = f.items.into_iter().map(|i| crate::QueryItem {
                        types: i.types,
                        tags: i.tags,
                    });
                    AppendCondition::new(
                        Query {
                            items: items.collect(),
                        },
                        Some(f.after),
                    )
                }),
            _ => None,
        };
        let append = match &self.shared.keys {
            None => append,
            Some(keys) => crate::seal::seal_append(append, keys.options(), keys.as_ref(), receipt)
                .map_err(|e| match e {
                    crate::seal::SealError::Input(e) => AppendError::Input(e),
                    crate::seal::SealError::Keys(reason) => StoreError::Subjects(reason).into(),
                    crate::seal::SealError::Unavailable(reason) => {
                        AppendError::Unavailable { reason }
                    }
                    crate::seal::SealError::Erased(tag) => AppendError::SubjectErased { tag },
                })?,
        };
        let limits = &self.shared.options.limits;
        let condition = match condition {
            Some(c) => {
                c.fail_if_events_match.validate(limits)?;
                Some(c.into_owned())
            }
            None => None,
        };
        let off_machine = options.off_machine || self.all_off_machine();
        if (options.require_synced || off_machine) && self.durability() == Durability::Memory {
            return Err(InputError::SyncUnavailable.into());
        }
        let reply = match off_machine {
            false => reply,
            true => self.off_machine_reply(reply, how.trace.clone())?,
        };
        let condition = match condition {
            // Deliberately wrong: checks the condition against the published head, outside the
            // writer, so two racing appends can both pass.
            Some(c) if crate::canary::on(crate::canary::Canary::ConditionOutsideWriter) => {
                let index = self.shared.index.read();
                let head = self.shared.head();
                let query = &c.fail_if_events_match;
                if let Some(p) = index.first_query_match_after(query, c.after.unwrap_or(0)) {
                    if p <= head {
                        return Err(AppendError::ConditionFailed { position: p });
                    }
                }
                None
            }
            other => other,
        };
        // From here on the reply must be answered exactly once: by the writer, or disarmed
        // below when the request never reaches it.
        let request = Request {
            append,
            condition,
            fence,
            require_synced: options.require_synced || off_machine,
            reply: Reply::new(reply),
            appended_at,
            trace: how.trace,
        };
        let request = if how.alone {
            match log.commit_alone(request) {
                Ok(()) => return Ok(()),
                Err(request) => request,
            }
        } else {
            request
        };
        log.submit(request, how.wait_when_full)
            .map_err(|e| match e {
                TrySendError::Full(r) => {
                    r.reply.disarm();
                    AppendError::QueueFull {
                        depth: log.queue_depth(),
                    }
                }
                TrySendError::Disconnected(r) => {
                    r.reply.disarm();
                    StoreError::Closed.into()
                }
            })
    }

    /// The reply of a D4 append: once the log has it (synced), it waits for the backup.
    fn off_machine_reply(
        &self,
        reply: ReplyTo,
        trace: tracing::Span,
    ) -> Result<ReplyTo, AppendError> {
        if let Some(backup) = self.shipping() {
            let backup = backup.clone();
            return Ok(ReplyTo::Callback(Box::new(move |outcome| {
                let reply = Reply::new(reply);
                match outcome {
                    Ok(position) => backup.when_shipped(position, reply, trace),
                    Err(e) => reply.send(Err(e)),
                }
            })));
        }
        drop(reply);
        Err(InputError::OffMachineUnavailable.into())
    }
}

/// An encoded append as an admission check sees it.
fn admitting<'a>(append: &'a EncodedAppend, store: &'a Store) -> crate::admission::Admitting<'a> {
    let events = crate::record::Entries::new(append.entries(), append.event_count)
        .trusted()
        .enumerate()
        .map(|(index, (_, entry, layout))| crate::admission::Candidate {
            index,
            event_type: layout.event_type(entry),
            tags: crate::event::Tags::of(entry, &layout).collect(),
            data: &entry[layout.data_range()],
            metadata: &entry[layout.metadata_range()],
        })
        .collect();
    crate::admission::Admitting {
        events,
        tracking: append.tracking(),
        log: store,
    }
}

impl crate::admission::LogView for Store {
    fn head(&self) -> u64 {
        Store::head(self)
    }

    fn first_of_types_after(&self, types: &[&str], after: u64) -> Option<u64> {
        let query = Query::item(crate::QueryItem::types(types.iter().copied()));
        self.shared
            .index
            .read()
            .first_query_match_after(&query, after)
    }

    fn events_of_types(
        &self,
        types: &[&str],
        after: u64,
    ) -> Result<Vec<crate::admission::Recorded>, String> {
        let query = Query::item(crate::QueryItem::types(types.iter().copied()));
        let options = ReadOptions {
            after: Some(after),
            ..ReadOptions::forwards()
        };
        let events = self.read(&query, options).map_err(|e| e.to_string())?;
        events
            .map(|event| {
                let event = event.map_err(|e| e.to_string())?;
                Ok(crate::admission::Recorded {
                    position: event.position(),
                    event_type: event.event_type().to_owned(),
                    data: event.data().to_vec(),
                })
            })
            .collect()
    }

    fn type_at(&self, position: u64) -> Result<Option<String>, String> {
        if position == 0 {
            return Ok(None);
        }
        let options = ReadOptions {
            from: Some(position),
            limit: Some(1),
            ..ReadOptions::forwards()
        };
        let mut events = self
            .read(&Query::all(), options)
            .map_err(|e| e.to_string())?;
        match events.next() {
            Some(Ok(event)) if event.position() == position => {
                Ok(Some(event.event_type().to_owned()))
            }
            Some(Ok(_)) | None => Ok(None),
            Some(Err(e)) => Err(e.to_string()),
        }
    }
}
