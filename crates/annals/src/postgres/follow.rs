//! Following: taking into the mirror what other servers committed, and checking that the
//! mirror and the database agree.

use super::*;

/// Takes in what another server's append tells about subjects before the mirror holds it:
/// the keys of its sealed events that this server does not hold (learned from the table),
/// and the erasures its receipts record (their keys dropped). Answers a subject that the
/// other server treats as one and this server's tag prefixes do not name, if any.
fn subjects_of(
    keys: &crate::keys::KeyStore,
    append: &EncodedAppend,
    at: u64,
) -> Result<Option<String>, StoreError> {
    let mut sealed = Vec::new();
    let mut unnamed = None;
    for (_, entry, layout) in Entries::new(append.entries(), append.event_count).trusted() {
        if layout.sealed {
            sealed.extend(crate::seal::sealed_subjects(entry, &layout).unwrap_or_default());
        } else if layout.event_type(entry) == crate::subject::SUBJECT_ERASED_TYPE {
            // A receipt carries its subject's tag alone; whatever this server's prefixes say,
            // the subject is erased for every server of the database.
            for tag in Tags::of(entry, &layout) {
                keys.mark_erased(tag, at);
                if !keys.options().is_subject(tag) {
                    unnamed.get_or_insert_with(|| tag.to_string());
                }
            }
        }
    }
    if let Some(tag) = sealed.iter().find(|t| !keys.options().is_subject(t)) {
        unnamed.get_or_insert_with(|| tag.to_string());
    }
    keys.learn(&sealed)?;
    Ok(unnamed)
}

/// A subject an append of another server names, for a server without data subjects: the
/// first tag of a sealed event, or of an erasure's receipt.
fn any_subject(append: &EncodedAppend) -> Option<String> {
    for (_, entry, layout) in Entries::new(append.entries(), append.event_count).trusted() {
        if layout.sealed {
            let tags = crate::seal::sealed_subjects(entry, &layout).unwrap_or_default();
            if let Some(tag) = tags.first() {
                return Some(tag.to_string());
            }
        } else if layout.event_type(entry) == crate::subject::SUBJECT_ERASED_TYPE {
            if let Some(tag) = Tags::of(entry, &layout).next() {
                return Some(tag.to_string());
            }
        }
    }
    None
}

impl Committer {
    /// Takes into the mirror what the database holds beyond it.
    pub(super) fn follow(&mut self) -> Result<(), StoreError> {
        // A poisoned mirror takes in nothing more (rows after a log it no longer shares with
        // the database would mix two logs) and answers no head as true.
        if let Some(e) = self.inner.poison_error() {
            return Err(e);
        }
        let result = self.follow_once();
        if let Err(StoreError::Database(reason)) = &result {
            // The mirror can no longer be trusted to hold what the database holds.
            self.inner.poison(reason.clone());
        }
        result
    }

    /// Reads the rows after the mirror's head until there are none: one round trip when
    /// another server committed a group (after a lost race, say). The rows are streamed: the
    /// database sends the next while the mirror takes in the last, a chunk at a time (at most
    /// [`TAKE_IN_ROWS`] rows, [`TAKE_IN_BYTES`] bytes). Finding none, it reads the head as
    /// well, to notice a database that lost what the mirror holds.
    pub(super) fn follow_once(&mut self) -> Result<(), StoreError> {
        loop {
            let local = self.inner.head();
            self.connection()?;
            let mut connection = self.connection.take().expect("connected above");
            let mut chunk = Vec::new();
            let mut chunk_bytes = 0;
            let mut read = 0i64;
            let streamed = match connection
                .client
                .query_raw(&connection.fetch, [&(local as i64), &FETCH_ROWS])
            {
                Err(e) => Err(Stopped::Read(e)),
                Ok(mut rows) => loop {
                    match rows.next() {
                        Err(e) => break Err(Stopped::Read(e)),
                        Ok(row) => {
                            let last_row = row.is_none();
                            if let Some(row) = row {
                                let body = row.get::<_, Vec<u8>>(3);
                                chunk_bytes += body.len();
                                chunk.push((row.get(0), row.get(1), row.get(2), body));
                                read += 1;
                            }
                            let full = chunk.len() >= TAKE_IN_ROWS || chunk_bytes >= TAKE_IN_BYTES;
                            if (full || last_row) && !chunk.is_empty() {
                                if let Err(e) = self.take_in(chunk.drain(..)) {
                                    break Err(Stopped::Refused(e));
                                }
                                chunk_bytes = 0;
                            }
                            if last_row {
                                break Ok(());
                            }
                        }
                    }
                },
            };
            match streamed {
                Ok(()) => self.connection = Some(connection),
                // The mirror refused a row: what came before it is in.
                Err(Stopped::Refused(e)) => return Err(e),
                Err(Stopped::Read(e)) => {
                    if statement_failed(&e) && !e.is_closed() {
                        self.connection = Some(connection);
                    } else {
                        self.verify_on_connect = true;
                    }
                    return Err(unavailable("read appends", &e));
                }
            }
            if read == 0 {
                return self.check_not_behind(local);
            }
            if read < FETCH_ROWS {
                return Ok(());
            }
        }
    }

    /// Hands rows of other servers' appends (first and last position, append time, body)
    /// that follow the mirror's head to the mirror's writer, and waits until it holds them.
    /// Fails on a row that does not continue the log or that is malformed; what came before
    /// it is committed and sound, and the mirror takes it.
    pub(super) fn take_in(
        &mut self,
        rows: impl Iterator<Item = (i64, i64, i64, Vec<u8>)>,
    ) -> Result<(), StoreError> {
        let mut local = self.inner.head();
        let applied = Arc::new(Applied::default());
        let mut handed = Vec::new();
        let mut bad = None;
        let mut keys_failed = None;
        for (first, last, at, body) in rows {
            let (first, last, at) = (first as u64, last as u64, at as u64);
            if let Some(awaited) = &mut self.awaited {
                awaited.see(first, last, at, &body);
            }
            if first != local + 1 || last < first || last - first >= u64::from(u32::MAX) {
                bad = Some(format!(
                    "an append at positions {first}..={last} follows position {local}: the \
                     table annals_appends is not a gapless log"
                ));
                break;
            }
            let append = match EncodedAppend::from_stored(body, (last - first + 1) as u32) {
                Ok(append) => append,
                Err(why) => {
                    bad = Some(format!(
                        "the append at position {first} is malformed: {why}"
                    ));
                    break;
                }
            };
            let unnamed = match &self.inner.keys {
                Some(keys) => match subjects_of(keys, &append, at) {
                    Ok(unnamed) => unnamed,
                    Err(e) => {
                        keys_failed = Some(e);
                        break;
                    }
                },
                None => any_subject(&append),
            };
            // Another server seals for subjects this one does not treat as such: this one
            // would store their data in clear. It takes the append in (it can read what it
            // holds the keys for) and takes no more appends until it is started again with
            // the database's prefixes.
            if let Some(tag) = unnamed {
                let given = match &self.inner.keys {
                    Some(keys) => format!(
                        "this server's subject tag prefixes ({}) do not name",
                        keys.options().tag_prefixes.join(",")
                    ),
                    None => "this server was started without data subjects for".into(),
                };
                self.inner.health.refuse_appends(format!(
                    "another server of this database treats {tag} as a data subject, which \
                     {given}: it would store such subjects' data in clear; start it again \
                     with the same --subject-tags and --master-key-file as the others"
                ));
            }
            self.last_append = AppendStamp::of(first, last, at, &append);
            applied.expect(1);
            let done = applied.clone();
            let reply = ReplyTo::Callback(Box::new(move |outcome| {
                done.answer(match outcome {
                    Ok(p) if p == last => None,
                    other => Some(format!(
                        "the mirror took the append at {first}..={last} as {other:?}"
                    )),
                })
            }));
            handed.push(committed(append, at, reply));
            local = last;
            self.counters.followed.fetch_add(1, Ordering::Relaxed);
        }
        if !handed.is_empty() {
            self.role.commit_committed(handed, Route::Database);
        }
        match applied.wait().or(bad) {
            Some(error) => Err(StoreError::Database(error)),
            // What came before the append whose keys could not be learned is in.
            None => keys_failed.map_or(Ok(()), Err),
        }
    }

    /// Fails when the database's log ends before the mirror's.
    pub(super) fn check_not_behind(&mut self, local: u64) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let target = match connection.client.query_opt(&connection.head, &[]) {
            Ok(row) => row.map_or(0, |r| r.get::<_, i64>(0) as u64),
            Err(e) => {
                let error = unavailable("read the head", &e);
                self.lost(&e);
                return Err(error);
            }
        };
        if target < local {
            return Err(StoreError::Database(format!(
                "the database's log ends at position {target}, before this server's at {local}: \
                 it lost committed appends (a failover to a standby that did not have them?); \
                 restart this server to follow the database as it is"
            )));
        }
        Ok(())
    }

    /// Checks that the database holds the mirror's last append: the same positions, append
    /// time and size. After a failover to a standby that lacked it, another server may have
    /// committed a different append at the same positions since; its time tells them apart
    /// (two servers committing the same positions in the same microsecond with bodies of one
    /// size is what this cannot tell).
    pub(super) fn verify_mirror(&mut self) -> Result<(), StoreError> {
        let head = self.inner.head();
        if head == 0 {
            return Ok(());
        }
        let mine = self.last_append;
        debug_assert_eq!(mine.last, head, "the mirror's last append ends at its head");
        let connection = self.connection.as_mut().expect("connected");
        let row = connection
            .client
            .query_opt(VERIFY, &[&(head as i64)])
            .map_err(|e| unavailable("verify the log", &e))?;
        let found = row.map(|r| stored(&r));
        if found == Some(mine) && mine.last == head {
            return Ok(());
        }
        let reason = format!(
            "after reconnecting, the database does not hold the append this server holds last \
             ({mine:?}; found {found:?}): it lost committed appends, and another server may \
             have written others in their place; restart this server to follow the database \
             as it is"
        );
        self.inner.poison(reason.clone());
        Err(StoreError::Database(reason))
    }
}
