//! Settling a commit whose session ended before its answer: make sure the old session is
//! gone, then read whether the group is in the log.

use super::*;

/// A database session as `pg_stat_activity` names it: its process id and when it started
/// (as text), which together name one session on one server.
#[derive(Clone, Debug)]
pub(super) struct Session {
    pub(super) pid: i32,
    pub(super) started: String,
}

/// What [`Committer::settle`] found of a group.
pub(super) enum Settled {
    /// In the log, each append with the positions where it was found.
    Committed(Vec<(Accepted, (u64, u64))>),
    /// Not in the log, and it cannot get there any more: the group's requests, to try again.
    Absent(Vec<Request>),
    /// Not known within [`SETTLE_MAX`].
    Unknown(Vec<Accepted>, StoreError),
}

/// A group whose commit is being settled, and what of it the log was found to hold.
pub(super) struct Awaited {
    pub(super) group: Vec<Accepted>,
    /// The group's append time (an append read from another log keeps its own).
    pub(super) time: u64,
    /// Where each of the group's first appends was found, in order.
    pub(super) found: Vec<(u64, u64)>,
    /// Why the log cannot hold what this server wrote (set when part of the group was found,
    /// then a row that is not the next of it).
    pub(super) broken: Option<String>,
}

impl Awaited {
    /// Takes a row the log holds after the mirror's head (first and last position, append
    /// time, body), in order.
    pub(super) fn see(&mut self, first: u64, last: u64, at: u64, body: &[u8]) {
        let Some(next) = self.group.get(self.found.len()) else {
            return;
        };
        let request = &next.request;
        let same = at == request.appended_at.unwrap_or(self.time)
            && last.checked_sub(first) == Some(next.last - next.first)
            && body == request.append.body.as_slice();
        if same {
            self.found.push((first, last));
        } else if !self.found.is_empty() && self.broken.is_none() {
            self.broken = Some(format!(
                "the append at positions {first}..={last} follows the first {} of the group",
                self.found.len()
            ));
        }
    }
}

impl Committer {
    /// Finds out whether a group whose statement may or may not have committed (`reason`) is
    /// in the log. The statement ran in `session`, for appends checked at the mirror's `head`
    /// and stamped with `time`. Reconnects; makes sure that session has ended, so that nothing
    /// of it can commit later; then reads what the database holds after `head` into the mirror,
    /// as any follow does, looking for the group's rows: each append's length, time and bytes,
    /// in order (after a lost race they may have moved past other servers' appends). Found
    /// whole, the commit is confirmed as durable as an answered one ([`confirm_statement`]).
    /// Tries until [`SETTLE_MAX`] has passed; the group's outcome stays unknown only when the
    /// database cannot tell within that time.
    pub(super) fn settle(
        &mut self,
        head: u64,
        accepted: Vec<Accepted>,
        time: u64,
        session: &Session,
        reason: &str,
    ) -> Settled {
        debug_assert_eq!(
            self.inner.head(),
            head,
            "nothing moved the mirror meanwhile"
        );
        let deadline = Instant::now() + SETTLE_MAX;
        self.awaited = Some(Awaited {
            group: accepted,
            time,
            found: Vec::new(),
            broken: None,
        });
        let mut ended = false;
        let mut pause = Duration::from_millis(10);
        let outcome = loop {
            match self.settle_once(session, &mut ended, deadline) {
                Ok(()) => break Ok(()),
                Err(e) => {
                    let poisoned = self.inner.poison_error().is_some();
                    if poisoned || Instant::now() + pause >= deadline {
                        break Err(e);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        };
        let awaited = self.awaited.take().expect("set above");
        let unknown = |why: String| StoreError::OutcomeUnknown {
            reason: format!("{reason}; {why}"),
        };
        if let Some(broken) = awaited.broken {
            // The group commits whole or not at all: the log holds something this server
            // did not write.
            let why = format!("the log holds part of the group: {broken}");
            self.inner.poison(why.clone());
            return Settled::Unknown(awaited.group, unknown(why));
        }
        let found_whole = awaited.found.len() == awaited.group.len();
        match outcome {
            Ok(()) if found_whole => {
                self.counters
                    .settled
                    .fetch_add(awaited.group.len() as u64, Ordering::Relaxed);
                Settled::Committed(awaited.group.into_iter().zip(awaited.found).collect())
            }
            Ok(()) if awaited.found.is_empty() => {
                self.counters
                    .settled
                    .fetch_add(awaited.group.len() as u64, Ordering::Relaxed);
                Settled::Absent(awaited.group.into_iter().map(|a| a.request).collect())
            }
            Ok(()) => unreachable!("settle_once ends with the group found whole or not at all"),
            Err(e) => {
                let why = if found_whole {
                    format!(
                        "it is in the log, but its durability was not confirmed within {} s: {e}",
                        SETTLE_MAX.as_secs()
                    )
                } else {
                    format!(
                        "the database could not be asked within {} s: {e}",
                        SETTLE_MAX.as_secs()
                    )
                };
                Settled::Unknown(awaited.group, unknown(why))
            }
        }
    }

    /// One try of [`Committer::settle`]: Ok once the group is found whole (and confirmed) or
    /// known absent.
    pub(super) fn settle_once(
        &mut self,
        session: &Session,
        ended: &mut bool,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        self.connection()?;
        if !*ended {
            self.end_session(session, deadline)?;
            *ended = true;
        }
        self.follow()?;
        let awaited = self.awaited.as_ref().expect("settling");
        if let Some(broken) = &awaited.broken {
            return Err(StoreError::Database(broken.clone()));
        }
        if awaited.found.is_empty() {
            return Ok(());
        }
        if awaited.found.len() < awaited.group.len() {
            let why = format!(
                "{} of the group's {} appends are in the log, the others not after them",
                awaited.found.len(),
                awaited.group.len()
            );
            self.awaited.as_mut().expect("settling").broken = Some(why.clone());
            return Err(StoreError::Database(why));
        }
        self.confirm(deadline)
    }

    /// Ends `session` if it is still there, and waits until it has gone: a statement of a
    /// lost connection may still run in it. A session ended has committed or rolled back for
    /// good (its transaction is ended before it leaves `pg_stat_activity`). After a failover
    /// the session was on another server, and no session here has its name.
    pub(super) fn end_session(
        &mut self,
        session: &Session,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        loop {
            let connection = self.connection()?;
            let there = match connection
                .client
                .query(END_SESSION, &[&session.pid, &session.started])
            {
                Ok(rows) => !rows.is_empty(),
                Err(e) => {
                    let error = unavailable("end the session of a lost connection", &e);
                    self.lost(&e);
                    return Err(error);
                }
            };
            if !there {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Unavailable {
                    reason: format!(
                        "PostgreSQL session {} (started {}) that ran the commit did not end",
                        session.pid, session.started
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Makes sure that what the log holds is durable as configured: a commit that waits, as
    /// every commit does, for the WAL before it to be flushed and confirmed by a synchronous
    /// standby ([`CONFIRM`]). The wait is cancelled at `deadline`.
    pub(super) fn confirm(&mut self, deadline: Instant) -> Result<(), StoreError> {
        self.warned.store(false, Ordering::Release);
        let target = self.target.clone();
        let connection = self.connection()?;
        let token = connection.client.cancel_token();
        let (done, finished) = crossbeam_channel::bounded::<()>(0);
        let canceller = std::thread::spawn(move || {
            let left = deadline.saturating_duration_since(Instant::now());
            let late = matches!(
                finished.recv_timeout(left),
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            );
            if late {
                let _ = target.cancel(&token);
            }
            late
        });
        let confirmed = connection.client.batch_execute(CONFIRM);
        drop(done);
        let cancelled = canceller.join().unwrap_or(true);
        if cancelled {
            // A cancel that came late must not meet a later statement on this connection.
            self.connection = None;
            self.verify_on_connect = true;
        }
        if let Err(e) = confirmed {
            let error = unavailable("confirm a commit", &e);
            self.lost(&e);
            return Err(error);
        }
        if self.warned.load(Ordering::Acquire) {
            self.connection = None;
            self.verify_on_connect = true;
            return Err(StoreError::Unavailable {
                reason: "PostgreSQL committed locally but its synchronous standby did not \
                         confirm"
                    .into(),
            });
        }
        Ok(())
    }
}
