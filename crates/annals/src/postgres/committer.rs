//! The committer: checks a group of appends against the mirror, commits it with one
//! statement, and hands what the database committed to the mirror's writer.

use super::*;

/// One connection with its prepared statements.
pub(super) struct Connection {
    pub(super) client: Client,
    /// The database session serving it, to make sure, after the connection is lost with a
    /// statement in flight, that the session has ended and cannot commit it later.
    pub(super) session: Session,
    pub(super) commit_one: Statement,
    pub(super) commit_group: Statement,
    pub(super) commit_after: Statement,
    pub(super) head: Statement,
    pub(super) fetch: Statement,
}

/// Answers that the mirror log must give, counted down as its writer answers them.
#[derive(Default)]
pub(super) struct Applied {
    pub(super) state: Mutex<(usize, Option<String>)>,
    pub(super) done: Condvar,
}

impl Applied {
    pub(super) fn expect(&self, n: usize) {
        self.state.lock().0 += n;
    }

    pub(super) fn answer(&self, error: Option<String>) {
        let mut state = self.state.lock();
        state.0 -= 1;
        if state.1.is_none() {
            state.1 = error;
        }
        if state.0 == 0 {
            self.done.notify_all();
        }
    }

    /// Waits until every expected answer is in; the first error, if any.
    pub(super) fn wait(&self) -> Option<String> {
        let mut state = self.state.lock();
        while state.0 > 0 {
            self.done.wait(&mut state);
        }
        state.1.take()
    }
}

/// Why streaming the rows after the mirror's head stopped early.
pub(super) enum Stopped {
    /// The database or the connection failed.
    Read(postgres::Error),
    /// The mirror refused a row (not a continuation of the log, or malformed).
    Refused(StoreError),
}

/// Why a group's statement did not answer with its outcome.
pub(super) enum Failed {
    /// The statement may have committed or not: its session ended while it ran (a FATAL
    /// report or a lost connection), or the primary committed it without its synchronous
    /// standby's confirmation. `session` ran it; `time` is the group's append time.
    Unsettled {
        reason: String,
        session: Session,
        time: u64,
    },
    /// Nothing was committed (the database reported the statement's failure, or it was never
    /// sent), or this server can no longer tell (it is poisoned).
    Known(StoreError),
}

/// What a group's statement answered.
pub(super) enum Answered {
    /// [`COMMIT_ONE`] or [`COMMIT_GROUP`]: the rows inserted, none or the whole group.
    Plain(u64),
    /// [`COMMIT_AFTER`]'s rows.
    After(Vec<postgres::Row>),
}

/// An append of this server's group that passed its checks.
pub(super) struct Accepted {
    pub(super) request: Request,
    pub(super) first: u64,
    pub(super) last: u64,
}

/// The committer thread's state.
pub(super) struct Committer {
    pub(super) target: Target,
    pub(super) connection: Option<Connection>,
    /// The memory-only log that mirrors the database, and its writer's role, taken to hand
    /// committed appends over.
    pub(super) inner: Arc<Shared>,
    pub(super) role: Arc<WriterRole>,
    pub(super) counters: Arc<RemoteCounters>,
    /// Set by the connection's notice callback (see [`connect`]).
    pub(super) warned: Arc<AtomicBool>,
    /// After a lost connection: check on reconnecting that the database still holds the
    /// mirror's last append (a failover to a standby that lacks it would leave the mirror
    /// ahead of the log).
    pub(super) verify_on_connect: bool,
    /// The append time of the group last committed.
    pub(super) group_time: u64,
    /// The mirror's last append as the database stored it, to recognise it after a failover.
    pub(super) last_append: AppendStamp,
    /// Names this server's commits in their notifications (see [`COMMIT`]).
    pub(super) server_id: i64,
    /// The group whose commit is being settled (see [`Committer::settle`]).
    pub(super) awaited: Option<Awaited>,
}

impl Drop for Committer {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            connect::close(connection);
        }
    }
}

impl Committer {
    pub(super) fn adopt(&mut self, client: Client) -> Result<(), StoreError> {
        let mut client = client;
        let prepare = |client: &mut Client, sql: &str| {
            client
                .prepare(sql)
                .map_err(|e| unavailable("prepare a statement", &e))
        };
        let commit_one = prepare(&mut client, COMMIT_ONE)?;
        let commit_group = prepare(&mut client, COMMIT_GROUP)?;
        let commit_after = prepare(&mut client, COMMIT_AFTER)?;
        let head = prepare(&mut client, HEAD)?;
        let fetch = prepare(&mut client, FETCH)?;
        let session = client
            .query_one(SESSION, &[])
            .map_err(|e| unavailable("name the session", &e))?;
        let session = Session {
            pid: session.get(0),
            started: session.get(1),
        };
        self.connection = Some(Connection {
            client,
            session,
            commit_one,
            commit_group,
            commit_after,
            head,
            fetch,
        });
        Ok(())
    }

    /// The connection, made anew if the last one was lost.
    pub(super) fn connection(&mut self) -> Result<&mut Connection, StoreError> {
        if self.connection.is_none() {
            let client = self
                .target
                .connect(Some(self.warned.clone()))
                .map_err(|e| unavailable("connect", &e))?;
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            self.adopt(client)?;
            if self.verify_on_connect {
                // A connection whose database was not found to hold the mirror's last append
                // is not kept: the next use connects and checks again.
                if let Err(e) = self.verify_mirror() {
                    if let Some(unchecked) = self.connection.take() {
                        connect::close(unchecked);
                    }
                    return Err(e);
                }
                self.verify_on_connect = false;
            }
        }
        Ok(self.connection.as_mut().expect("connected above"))
    }

    /// Drops the connection after an error that may have left it unusable.
    pub(super) fn lost(&mut self, e: &postgres::Error) {
        if !statement_failed(e) || e.is_closed() {
            self.connection = None;
            self.verify_on_connect = true;
        }
    }

    /// Checks, commits and hands to the mirror one group of this server's appends; answers
    /// every request of the group. After a lost race the group takes in what was queued
    /// meanwhile (from `queue`), so that the next attempt commits it too. An append that
    /// another of the group settles (a condition failed on its events) is answered once that
    /// one is in the mirror, or checked again if it never is.
    pub(super) fn commit_group(
        &mut self,
        group: &mut Vec<Request>,
        queue: Option<&Receiver<Request>>,
    ) {
        // One bound on the tries for all rounds: an append held back waits no longer than
        // the group it waited on.
        let started = Instant::now();
        let mut deferred = Vec::new();
        self.commit_once(group, queue, started, &mut deferred);
        // A round's first check settles at least its first append (no append of its group is
        // before it), and after `RACING_MAX` every append is answered: the rounds end.
        while !deferred.is_empty() {
            let mut again = std::mem::take(&mut deferred);
            self.commit_once(&mut again, queue, started, &mut deferred);
        }
    }

    /// One group of [`Committer::commit_group`]: answers each of its requests or puts it in
    /// `deferred`.
    fn commit_once(
        &mut self,
        group: &mut Vec<Request>,
        queue: Option<&Receiver<Request>>,
        started: Instant,
        deferred: &mut Vec<Request>,
    ) {
        // A group from the queue, or a lone blocking caller's append on its own thread.
        let route = match queue {
            Some(_) => Route::Database,
            None => Route::DatabaseAlone,
        };
        let mut pending: Vec<Request> = std::mem::take(group);
        // The commit as a span, when an append of the group is traced: its tries, the time of
        // its statements, and once in, linked both ways with each traced append it carried.
        let span = match crate::spans::recorded() && pending.iter().any(|r| !r.trace.is_disabled())
        {
            true => crate::spans::commit(),
            false => tracing::Span::none(),
        };
        if !span.is_disabled() {
            span.record("db.system.name", "postgresql");
        }
        let mut committing = Duration::ZERO;
        let mut attempts = 0u32;
        while !pending.is_empty() {
            span.record("annals.tries", i64::from(attempts + 1));
            attempts += 1;
            if attempts > 1 && started.elapsed() > RACING_MAX {
                // Every try before ended with nothing committed: a race lost to another
                // server's commit, or a commit settled as not made.
                let e = StoreError::Unavailable {
                    reason: format!(
                        "PostgreSQL: the group was not committed in {} s ({} tries): other \
                         servers' commits took its position first, or the database ended its \
                         sessions",
                        RACING_MAX.as_secs(),
                        attempts - 1
                    ),
                };
                for request in pending.drain(..) {
                    request.reply.send(Err(clone_error(&e).into()));
                }
                return;
            }
            if let Some(e) = self.inner.poison_error() {
                for request in pending.drain(..) {
                    request.reply.send(Err(StoreError::Poisoned {
                        reason: e.to_string(),
                    }
                    .into()));
                }
                return;
            }
            // The mirror must hold what the database holds before a condition is checked: a
            // fresh connection or a lost race means another server may have committed.
            // After a plain statement lost, the retry passes over what the winner committed
            // in the database when it can (`COMMIT_AFTER`), which reads it for the mirror;
            // after that gave up, the committer reads and checks again itself.
            let after_lost_race = attempts > 1;
            if attempts > 2 || self.connection.is_none() {
                if let Err(e) = self.follow() {
                    for request in pending.drain(..) {
                        request.reply.send(Err(clone_error(&e).into()));
                    }
                    return;
                }
            }
            let head = self.inner.head();
            let mut accepted = check(&self.inner, head, &mut pending, deferred);
            if accepted.is_empty() {
                return;
            }
            let statement = Instant::now();
            let committed = self.commit(head, &accepted, after_lost_race);
            committing += statement.elapsed();
            span.record("annals.commit_us", committing.as_micros() as i64);
            match committed {
                Ok(Some(moved)) => {
                    for a in &mut accepted {
                        a.first += moved;
                        a.last += moved;
                    }
                    if !span.is_disabled() {
                        let last = accepted.iter().map(|a| a.last).max().unwrap_or(0);
                        span.record("annals.head", last as i64);
                        span.record("annals.appends", accepted.len() as i64);
                        crate::spans::link(&span, accepted.iter().map(|a| &a.request.trace));
                    }
                    self.counters.commits.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .committed_at_us
                        .store(now_us(), Ordering::Relaxed);
                    self.inner.counters.committed(route, accepted.len());
                    self.hand_over(accepted);
                    return;
                }
                Ok(None) => {
                    self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                    pending = accepted.into_iter().map(|a| a.request).collect();
                    if let Some(queue) = queue {
                        take_queued(&mut pending, queue, self.inner.options.group_bytes_max);
                    }
                }
                Err(Failed::Known(error)) => {
                    span.record("otel.status_code", "ERROR");
                    self.refuse(accepted, &error);
                    return;
                }
                Err(Failed::Unsettled {
                    reason,
                    session,
                    time,
                }) => match self.settle(head, accepted, time, &session, &reason) {
                    Settled::Committed(found) => {
                        if !span.is_disabled() {
                            let last = found.iter().map(|(_, (_, last))| *last).max();
                            span.record("annals.head", last.unwrap_or(0) as i64);
                            span.record("annals.appends", found.len() as i64);
                            crate::spans::link(&span, found.iter().map(|(a, _)| &a.request.trace));
                        }
                        self.counters.commits.fetch_add(1, Ordering::Relaxed);
                        self.inner.counters.committed(route, found.len());
                        self.counters
                            .committed_at_us
                            .store(now_us(), Ordering::Relaxed);
                        for (a, (_, last)) in found {
                            a.request.reply.send(Ok(last));
                        }
                        return;
                    }
                    // Nothing of it was committed and nothing can be: try again, as after a
                    // lost race.
                    Settled::Absent(requests) => pending = requests,
                    Settled::Unknown(accepted, error) => {
                        span.record("otel.status_code", "ERROR");
                        self.refuse(accepted, &error);
                        return;
                    }
                },
            }
        }
    }

    /// Answers every append of a group with `error`.
    pub(super) fn refuse(&self, accepted: Vec<Accepted>, error: &StoreError) {
        if matches!(error, StoreError::OutcomeUnknown { .. }) {
            self.counters
                .unknown
                .fetch_add(accepted.len() as u64, Ordering::Relaxed);
        }
        for a in accepted {
            a.request.reply.send(Err(clone_error(error).into()));
        }
    }

    /// Runs the group's statement: [`COMMIT_ONE`] or [`COMMIT_GROUP`], or after a lost race
    /// ([`COMMIT_AFTER`]) one that may pass over other servers' appends. Answers how far the
    /// group's positions moved past other servers' appends (the mirror holds those when it
    /// returns), or None when another server committed first and the group must be checked
    /// again (nothing was inserted, or the database rolled the statement back as a
    /// serialization failure). An error whose outcome cannot be known is
    /// [`StoreError::OutcomeUnknown`]; one the database reported is [`StoreError::Unavailable`]
    /// (the statement, and so its transaction, failed: nothing was committed).
    pub(super) fn commit(
        &mut self,
        head: u64,
        accepted: &[Accepted],
        after_lost_race: bool,
    ) -> Result<Option<u64>, Failed> {
        let now = now_us();
        assert_eq!(
            accepted.first().expect("a group").first,
            head + 1,
            "a group starts right after the head"
        );
        // An append read from another log (a copy's) keeps its time.
        let time = |a: &Accepted| a.request.appended_at.unwrap_or(now) as i64;
        let firsts: Vec<i64> = accepted.iter().map(|a| a.first as i64).collect();
        let lasts: Vec<i64> = accepted.iter().map(|a| a.last as i64).collect();
        let times: Vec<i64> = accepted.iter().map(time).collect();
        let bodies: Vec<&[u8]> = accepted
            .iter()
            .map(|a| a.request.append.body.as_slice())
            .collect();
        // Each row's keys: keys[from..=to], counted from 1 as SQL does; none when NULL.
        let mut keys = Vec::new();
        let (mut key_from, mut key_to) = (Vec::new(), Vec::new());
        for a in accepted {
            let from = keys.len() as i32 + 1;
            let kept = append_keys(&a.request.append, &mut keys);
            key_from.push(kept.then_some(from));
            key_to.push(kept.then_some(keys.len() as i32));
        }
        self.warned.store(false, Ordering::Release);
        let server_id = self.server_id;
        let subjects = self.inner.keys.is_some();
        let connection = self.connection().map_err(Failed::Known)?;
        let session = connection.session.clone();
        let outcome = if after_lost_race {
            let probe = probe(head, accepted, subjects);
            connection
                .client
                .query(
                    &connection.commit_after,
                    &[
                        &(head as i64),
                        &probe,
                        &firsts,
                        &lasts,
                        &times,
                        &bodies,
                        &keys,
                        &key_from,
                        &key_to,
                        &server_id,
                    ],
                )
                .map(Answered::After)
        } else if accepted.len() == 1 {
            let lead_keys = key_from[0].map(|_| keys.as_slice());
            connection
                .client
                .execute(
                    &connection.commit_one,
                    &[
                        &firsts[0], &lasts[0], &times[0], &bodies[0], &server_id, &lead_keys,
                    ],
                )
                .map(Answered::Plain)
        } else {
            let lead_keys = key_to[0].map(|to| &keys[..to as usize]);
            // The other rows' key ranges, counted within the keys that follow the first's.
            let skip = key_to[0].unwrap_or(0);
            let rest_keys = &keys[skip as usize..];
            let rest_from: Vec<Option<i32>> =
                key_from[1..].iter().map(|f| f.map(|f| f - skip)).collect();
            let rest_to: Vec<Option<i32>> =
                key_to[1..].iter().map(|t| t.map(|t| t - skip)).collect();
            connection
                .client
                .query_one(
                    &connection.commit_group,
                    &[
                        &firsts[0],
                        &lasts[0],
                        &times[0],
                        &bodies[0],
                        &&firsts[1..],
                        &&lasts[1..],
                        &&times[1..],
                        &&bodies[1..],
                        &lasts[lasts.len() - 1],
                        &server_id,
                        &lead_keys,
                        &rest_keys,
                        &rest_from,
                        &rest_to,
                    ],
                )
                .map(|row| Answered::Plain(row.get::<_, i64>(0) as u64))
        };
        let answered = match outcome {
            Ok(answered) => answered,
            // The database rolled the statement back for a concurrent one (a distributed
            // database's optimistic transactions, or isolation set above read committed):
            // nothing was committed, as in a lost race.
            Err(e) if is_serialization_failure(&e) => return Ok(None),
            // The statement failed, and its transaction with it: nothing was committed.
            Err(e) if statement_failed(&e) => {
                let error = if e.code() == Some(&postgres::error::SqlState::DISK_FULL) {
                    StoreError::DiskFull {
                        reason: format!("PostgreSQL commit: {}", describe(&e)),
                    }
                } else {
                    unavailable("commit", &e)
                };
                self.lost(&e);
                return Err(Failed::Known(error));
            }
            Err(e) => {
                self.lost(&e);
                return Err(Failed::Unsettled {
                    reason: format!(
                        "the PostgreSQL session ended during the commit: {}",
                        describe(&e)
                    ),
                    session,
                    time: now,
                });
            }
        };
        if self.warned.load(Ordering::Acquire) {
            // Committed on the primary, not confirmed by its synchronous standby: a
            // failover may lose it. Neither success nor failure can be promised yet.
            self.connection = None;
            self.verify_on_connect = true;
            return Err(Failed::Unsettled {
                reason: "PostgreSQL committed locally but did not confirm replication".into(),
                session,
                time: now,
            });
        }
        let moved = match answered {
            Answered::Plain(inserted) => {
                let fits = inserted == 0 || inserted as usize == accepted.len();
                debug_assert!(fits, "a group's statement inserts none of it or all");
                if !fits {
                    let reason = format!(
                        "a group of {} appends after position {head} committed {inserted} rows",
                        accepted.len()
                    );
                    // Some of the group is in the log, where this server cannot tell.
                    self.inner.poison(reason.clone());
                    return Err(Failed::Known(StoreError::OutcomeUnknown { reason }));
                }
                (inserted > 0).then_some(0)
            }
            Answered::After(rows) => self
                .passed_over(head, accepted.len(), &rows)
                .map_err(Failed::Known)?,
        };
        // The appends' time, for the mirror: the one the database holds.
        self.group_time = now;
        Ok(moved)
    }

    /// Takes in the answer of [`COMMIT_AFTER`] for a group of `appends` checked at `head`:
    /// the other servers' appends it passed over go to the mirror (they are committed,
    /// whatever became of the group), and how far the group moved, None when it gave up.
    pub(super) fn passed_over(
        &mut self,
        head: u64,
        appends: usize,
        rows: &[postgres::Row],
    ) -> Result<Option<u64>, StoreError> {
        let Some((status, passed)) = rows.split_last() else {
            return Err(StoreError::Database(
                "annals_commit_after answered no rows".into(),
            ));
        };
        let (moved, inserted) = (status.get::<_, i64>(0), status.get::<_, i64>(1));
        let stray = status.get::<_, Option<Vec<u8>>>(3).is_some()
            || passed
                .iter()
                .any(|r| r.get::<_, Option<Vec<u8>>>(3).is_none());
        let taken = if stray {
            Ok(())
        } else {
            self.take_in(passed.iter().map(|row| {
                (
                    row.get::<_, i64>(0),
                    row.get::<_, i64>(1),
                    row.get::<_, i64>(2),
                    row.get::<_, Option<Vec<u8>>>(3).unwrap_or_default(),
                )
            }))
        };
        let fits = !stray
            && moved >= 0
            && taken.is_ok()
            && self.inner.head() == head + moved as u64
            && (inserted == 0 || inserted as usize == appends);
        debug_assert!(fits, "annals_commit_after's answer fits the group");
        if !fits {
            let reason = format!(
                "a group of {appends} appends after position {head}, retried after a lost race, \
                 was answered with {} rows passed over, a move of {moved} and {inserted} rows \
                 inserted, which the mirror took as {taken:?}, at its head {}",
                passed.len(),
                self.inner.head()
            );
            // The database holds the log as it is; this server no longer knows it.
            self.inner.poison(reason.clone());
            if inserted > 0 {
                // The group may well be committed, but not where this server can tell.
                return Err(StoreError::OutcomeUnknown { reason });
            }
            return Err(StoreError::Database(reason));
        }
        if moved > 0 && inserted > 0 {
            self.counters.passed.fetch_add(1, Ordering::Relaxed);
        }
        Ok((inserted > 0).then_some(moved as u64))
    }

    /// Hands a committed group to the mirror, each append answered from there; waits until
    /// the mirror holds it, so that the next group is checked against it.
    pub(super) fn hand_over(&mut self, accepted: Vec<Accepted>) {
        let applied = Arc::new(Applied::default());
        applied.expect(accepted.len());
        let at = self.group_time;
        let mut handed = Vec::with_capacity(accepted.len());
        for a in accepted {
            let Accepted {
                request,
                first,
                last,
            } = a;
            let Request {
                append,
                reply,
                appended_at,
                ..
            } = request;
            let at = appended_at.unwrap_or(at);
            self.last_append = AppendStamp::of(first, last, at, &append);
            let done = applied.clone();
            let inner = self.inner.clone();
            let answer = ReplyTo::Callback(Box::new(move |outcome| {
                let fits = matches!(outcome, Ok(p) if p == last);
                if !fits {
                    // Committed in the database, but the mirror disagrees: this server can no
                    // longer answer for the log until it is restarted.
                    inner.poison(format!(
                        "the mirror took the committed append at {first}..={last} as {outcome:?}"
                    ));
                }
                done.answer(None);
                // The database committed it: that is the append's outcome.
                reply.send(Ok(last));
            }));
            handed.push(committed(append, at, answer));
        }
        self.role.commit_committed(handed, Route::Database);
        // The mirror answers in its writer's call (D1): nothing is left to wait for, but the
        // next group must be checked against this one.
        applied.wait();
    }
}

/// A request handing an append the database committed to the mirror's writer.
pub(super) fn committed(append: EncodedAppend, appended_at: u64, reply: ReplyTo) -> Request {
    Request {
        append,
        condition: None,
        fence: None,
        require_synced: false,
        reply: Reply::new(reply),
        appended_at: Some(appended_at),
        trace: tracing::Span::none(),
    }
}

/// Checks each pending append against the mirror at `head` and against the appends of the
/// group accepted before it; answers those whose outcome the mirror settles (a failed
/// condition, a retry recognised, a tracking position not above the recorded one) and
/// returns the others with their positions. One that an append of the group settles is put in
/// `deferred`, to be checked again once the group is in the mirror (or is not, when its
/// commit fails): an answer must not name an event that no read shows yet, and may never.
pub(super) fn check(
    inner: &Shared,
    head: u64,
    pending: &mut Vec<Request>,
    deferred: &mut Vec<Request>,
) -> Vec<Accepted> {
    let index = inner.index.read();
    debug_assert_eq!(index.len(), head, "the mirror's index is at its head");
    let mut accepted: Vec<Accepted> = Vec::with_capacity(pending.len());
    let mut next = head + 1;
    for request in pending.drain(..) {
        let by_group = std::cell::Cell::new(false);
        let outcome = checked(
            &index,
            &request,
            |query, after| {
                let found = first_match_in_group(&accepted, query, after);
                by_group.set(by_group.get() || found.is_some());
                found
            },
            |source| {
                let found = accepted
                    .iter()
                    .filter_map(|a| a.request.append.tracking())
                    .filter(|(s, _)| *s == source)
                    .map(|(_, p)| p)
                    .max();
                by_group.set(by_group.get() || found.is_some());
                found
            },
        );
        if let Some(outcome) = outcome {
            if by_group.get() {
                deferred.push(request);
            } else {
                use crate::error::AppendError::{AdmissionChanged, ConditionFailed};
                debug_assert!(
                    match &outcome {
                        Err(ConditionFailed { position } | AdmissionChanged { position }) => {
                            *position <= head
                        }
                        _ => true,
                    },
                    "an answer names a position the mirror does not hold: {outcome:?}"
                );
                count_settled(&inner.counters, &outcome);
                request.reply.send(outcome);
            }
            continue;
        }
        // This server learned, while following, that it would store subjects' data in clear.
        if let Some(reason) = inner.health.appends_refused() {
            request.reply.send(Err(StoreError::Unavailable {
                reason: reason.to_string(),
            }
            .into()));
            continue;
        }
        // Sealed for a subject that another server erased since (its receipt is in now).
        if let Some(tag) = inner
            .keys
            .as_ref()
            .and_then(|keys| erased_subject(keys, &request.append))
        {
            request
                .reply
                .send(Err(crate::error::AppendError::SubjectErased { tag }));
            continue;
        }
        let first = next;
        let last = first + u64::from(request.append.event_count) - 1;
        next = last + 1;
        accepted.push(Accepted {
            request,
            first,
            last,
        });
    }
    accepted
}

/// A subject that one of the append's sealed events names and that is erased.
fn erased_subject(keys: &crate::keys::KeyStore, append: &EncodedAppend) -> Option<String> {
    sealed_tags(append)
        .into_iter()
        .find(|tag| keys.is_erased(tag))
}

/// The subjects' tags of an append's sealed events.
pub(super) fn sealed_tags(append: &EncodedAppend) -> Vec<String> {
    let mut tags = Vec::new();
    for (_, entry, layout) in Entries::new(append.entries(), append.event_count).trusted() {
        if layout.sealed {
            let subjects = crate::seal::sealed_subjects(entry, &layout).unwrap_or_default();
            tags.extend(subjects.into_iter().map(str::to_string));
        }
    }
    tags
}

/// The first event of the group's accepted appends after `after` that `query` matches.
pub(super) fn first_match_in_group(
    accepted: &[Accepted],
    query: &Query,
    after: u64,
) -> Option<u64> {
    accepted.iter().find_map(|a| {
        let append = &a.request.append;
        Entries::new(append.entries(), append.event_count)
            .trusted()
            .zip(a.first..)
            .find(|((_, entry, layout), position)| {
                *position > after
                    && query.matches(layout.event_type(entry), Tags::of(entry, layout))
            })
            .map(|(_, position)| position)
    })
}
