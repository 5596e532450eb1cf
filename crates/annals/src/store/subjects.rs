//! Data subjects on the store: opening their keys, erasing a subject (its key deleted, then a
//! receipt appended), and finishing an erasure that a crash cut between the two.

use super::*;
use crate::query::QueryItem;
use crate::subject::SUBJECT_ERASED_TYPE;

/// What [`Store::erase_subject`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Erasure {
    pub tag: String,
    /// The events carrying the subject's tag (its receipts aside), now unreadable.
    pub events: u64,
    /// The position of the erasure's receipt (`annals.SubjectErased`).
    pub receipt: u64,
    /// The subject was erased before: nothing changed.
    pub already: bool,
    /// When the key was deleted, in microseconds since the Unix epoch.
    pub erased_at_us: u64,
    /// With a backup: whether its copy of the keys no longer holds the subject's key (false:
    /// object storage did not take the new key file within 10 s; the backup replaces it
    /// once it answers). None: no backup.
    pub in_backup: Option<bool>,
}

/// Refuses an opening whose subject tag prefixes leave out subjects the store holds keys or
/// erasures for. The keys are the store's memory of the prefixes it sealed events under and
/// of the subjects it erased (they travel with the log into backups, replicas, copies and
/// every server of a database); an opening that left one out would store that subject's
/// later events in clear and take appends naming it after its erasure.
fn refuse_uncovered(keys: &crate::keys::KeyStore) -> Result<(), StoreError> {
    const NAMED: usize = 5;
    let (count, tags, shown) = keys.uncovered(NAMED);
    if count == 0 {
        return Ok(());
    }
    let given = &keys.options().tag_prefixes;
    let mut prefixes = given.clone();
    for prefix in shown {
        if !prefixes.contains(&prefix) {
            prefixes.push(prefix);
        }
    }
    let named: Vec<String> = tags
        .iter()
        .map(|(tag, erased)| match erased {
            true => format!("{tag} (erased)"),
            false => tag.clone(),
        })
        .collect();
    let more = match count - tags.len() {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Err(StoreError::Subjects(format!(
        "the subject tag prefixes given ({}) leave out data subjects this store holds keys \
         or erasures for: {}{more}. Opened so, it would store their events' data in clear \
         and accept appends naming erased subjects. Open it with every prefix it was used \
         with (such as --subject-tags {}, or Options::subjects); nothing was changed",
        given.join(","),
        named.join(", "),
        prefixes.join(","),
    )))
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Store {
    /// The subjects' keys of the store in `dir`, with the options' master key; refuses a
    /// store whose events are sealed when no master key is given.
    pub(crate) fn open_keys(
        io: &Arc<dyn Io>,
        dir: &Path,
        options: &Options,
        backend: Backend,
        table: Option<Arc<dyn crate::keys::KeyTable>>,
    ) -> Result<Option<Arc<crate::keys::KeyStore>>, StoreError> {
        let has_keys = io
            .list(dir)
            .map_err(|e| StoreError::io("list data directory", dir, 0, e))?
            .iter()
            .any(|n| n == crate::keys::KEYS_FILE);
        match (&options.subjects, backend) {
            (None, _) if has_keys => Err(StoreError::Subjects(format!(
                "{} holds data subjects' keys: open it with its master key (annals serve \
                 --master-key-file FILE, or Options::subjects)",
                dir.display()
            ))),
            (None, _) => Ok(None),
            // A replica's copy directory holds the primary's key file (`open_replica`).
            // The keys held so far are checked against the prefixes before anything is
            // written (those the log carries as grants, once they are taken in).
            (Some(subjects), Backend::Files | Backend::Replica) => {
                let keys = crate::keys::KeyStore::open(
                    io.clone(),
                    dir,
                    subjects.clone(),
                    backend == Backend::Replica,
                )?;
                refuse_uncovered(&keys)?;
                Ok(Some(Arc::new(keys)))
            }
            (Some(subjects), Backend::Postgres) => match table {
                Some(table) => {
                    let keys = crate::keys::KeyStore::open_table(
                        io.clone(),
                        dir,
                        subjects.clone(),
                        table,
                    )?;
                    refuse_uncovered(&keys)?;
                    Ok(Some(Arc::new(keys)))
                }
                None => Err(StoreError::InvalidOption(
                    "a store on PostgreSQL keeps its subjects' keys in its database".into(),
                )),
            },
        }
    }

    /// Whether this store keeps data subjects (`Options::subjects`).
    pub fn has_subjects(&self) -> bool {
        self.shared.keys.is_some()
    }

    /// The tag prefixes that name data subjects in this store (None without subjects).
    pub fn subject_prefixes(&self) -> Option<&[String]> {
        self.shared
            .keys
            .as_ref()
            .map(|k| k.options().tag_prefixes.as_slice())
    }

    /// How many data subjects have a key, and how many were erased (None without subjects).
    pub fn subject_counts(&self) -> Option<(u64, u64)> {
        self.shared.keys.as_ref().map(|k| k.counts())
    }

    /// Erases the data subject named by `tag`: its key is deleted from where the store keeps
    /// it (durably), so that every event carrying the tag reads back with no data or
    /// metadata ([`Event::is_erased`]) wherever a copy of the log lives; then a receipt
    /// (`annals.SubjectErased`, tagged with the subject, no personal data) is appended.
    /// Later appends naming the subject are refused ([`AppendError::SubjectErased`]).
    /// Idempotent: erasing again answers the first erasure's receipt.
    ///
    /// On PostgreSQL the receipt comes first: it is what tells the other servers, which drop
    /// the key as they take it in (and refuse appends naming the subject that would follow
    /// it); the key's row is erased next. An open finishes an erasure cut between the two
    /// either way.
    pub fn erase_subject(&self, tag: &str) -> Result<Erasure, AppendError> {
        let keys = self.shared.keys.as_ref().ok_or(InputError::NoSubjects)?;
        if let Some(refusal) = self.log().and_then(|log| log.refusal()) {
            return Err(refusal.into());
        }
        if !keys.options().is_subject(tag) {
            return Err(InputError::NotASubject {
                tag: tag.to_string(),
                prefixes: keys.options().tag_prefixes.join(", "),
            }
            .into());
        }
        crate::record::validate_tag(0, tag, &self.shared.options.limits)?;
        if keys.in_table() {
            // What other servers committed counts too, and may hold the receipt already.
            self.refresh()?;
            let at_us = now_us();
            keys.mark_erased(tag, at_us);
            let mut erasure = self.receipt(tag, at_us, false)?;
            let erased = keys.erase(tag, erasure.erased_at_us, self.head())?;
            erasure.already |= erased.already;
            erasure.erased_at_us = erased.at_us;
            erasure.in_backup = self.erasure_in_backup(keys.image_generation(), true);
            self.purge_snapshots(&erasure);
            return Ok(erasure);
        }
        let erased = keys.erase(tag, now_us(), self.head())?;
        let mut erasure = self.receipt(tag, erased.at_us, erased.already)?;
        erasure.in_backup = self.erasure_in_backup(keys.position().0, false);
        self.purge_snapshots(&erasure);
        Ok(erasure)
    }

    /// Removes the snapshots that folded the erased subject's events. A failure is logged,
    /// not answered (the erasure holds, and no such snapshot is served): the next use of the
    /// snapshots purges them from the receipt.
    fn purge_snapshots(&self, erasure: &Erasure) {
        let keeper = self.keeper();
        let erased = std::collections::HashMap::from([(erasure.tag.clone(), erasure.receipt)]);
        match keeper.shelf.purge(&erased) {
            Ok(purged) => keeper.counts.purged(purged),
            Err(e) => {
                tracing::warn!(error = %e, "the erased subject's snapshots are purged later");
                let mut through = keeper.purged_through.lock();
                *through = (*through).min(erasure.receipt.saturating_sub(1));
            }
        }
    }

    /// Wraps every subject's key under `new` in place of the master key it is under now: the
    /// key file only is written anew (the log is untouched, and the backup's keys are
    /// replaced with the next put). From then on the store opens with `new` only. Answers
    /// how many keys were wrapped again.
    pub fn rotate_master_key(&self, new: &crate::subject::MasterKey) -> Result<u64, StoreError> {
        let keys = self
            .shared
            .keys
            .as_ref()
            .ok_or_else(|| StoreError::Subjects("this store keeps no data subjects".into()))?;
        keys.rotate(new, self.head())
    }

    /// Puts the subjects' keys of `key_file` (a directory store's key file, or the one a
    /// backup holds: [`crate::backup::key_file`]) into this store's keys table, after a copy
    /// or a restore of that store's log into this one on a database: its keys, those the log
    /// carries as grants under its wrapping key, and its erasures. The key file must be
    /// under this store's master key. Answers how many keys it put.
    pub fn import_subject_keys(&self, key_file: &[u8]) -> Result<u64, StoreError> {
        let keys = self
            .shared
            .keys
            .as_ref()
            .ok_or_else(|| StoreError::Subjects("this store keeps no data subjects".into()))?;
        if !keys.in_table() {
            return Err(StoreError::InvalidOption(
                "a store on files takes a key file as it is (write it into its directory)".into(),
            ));
        }
        let image = crate::keys::KeyStore::from_key_file(keys.options().clone(), key_file)?;
        let head = self.refresh()?;
        grants_into(&self.shared, &image, head)?;
        keys.import(&image)
    }

    /// The subjects' keys of this store on a database as a key file (every key, still under
    /// the master key, and every erasure), for a copy of its log into a directory, which
    /// takes it as its own.
    pub fn subject_key_file(&self) -> Result<Vec<u8>, StoreError> {
        let keys = self
            .shared
            .keys
            .as_ref()
            .filter(|k| k.in_table())
            .ok_or_else(|| {
                StoreError::Subjects("this store keeps no data subjects in a database".into())
            })?;
        let head = self.refresh()?;
        Ok(keys.image_whole(0, head, false)?.1)
    }

    /// Waits (up to 10 s) for the backup to hold the key file of `epoch`, which replaced the
    /// older ones (`table`: the image of the table's keys of generation `epoch`); None
    /// without a backup. A server standing by does not wait: the server that ships replaces
    /// the backup's keys once it takes the receipt in.
    fn erasure_in_backup(&self, epoch: u64, table: bool) -> Option<bool> {
        let backup = self.shipping()?;
        if backup.standing_by() {
            return Some(false);
        }
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while backup.keys_shipped(table) < epoch {
            if Instant::now() > deadline {
                return Some(false);
            }
            backup.nudge();
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Some(true)
    }

    /// The receipt of `tag`'s erasure: the one in the log, or one appended now.
    fn receipt(&self, tag: &str, at_us: u64, already: bool) -> Result<Erasure, AppendError> {
        let receipts = Query::item(QueryItem::types([SUBJECT_ERASED_TYPE]).and_tags([tag]));
        let answer = |events, receipt| Erasure {
            tag: tag.to_string(),
            events,
            receipt,
            already,
            erased_at_us: at_us,
            in_backup: None,
        };
        loop {
            let head = self.head();
            let (events, found) = {
                let index = self.shared.index.read();
                let found = index
                    .first_query_match_after(&receipts, 0)
                    .filter(|&p| p <= head);
                (index.tag_events_through(tag, head), found)
            };
            if let Some(receipt) = found {
                // The receipt carries the tag too.
                return Ok(Erasure {
                    already: true,
                    ..answer(events - 1, receipt)
                });
            }
            let body = serde_json::json!({ "tag": tag, "events": events, "erasedAtUs": at_us });
            let event = NewEvent::new(SUBJECT_ERASED_TYPE, body.to_string()).tag(tag);
            let append = encode_append_tracked(&[event], None, &self.shared.options.limits)?;
            let (tx, rx) = crossbeam_channel::bounded(1);
            self.submit_encoded(
                append,
                Some(Cow::Owned(AppendCondition::new(
                    receipts.clone(),
                    Some(head),
                ))),
                AppendOptions {
                    require_synced: true,
                    ..AppendOptions::default()
                },
                ReplyTo::Callback(Box::new(move |r| {
                    let _ = tx.send(r);
                })),
                Submit {
                    wait_when_full: true,
                    alone: false,
                    trace: tracing::Span::none(),
                },
                None,
                true,
            )?;
            match rx.recv().map_err(|_| StoreError::Closed)? {
                Ok(receipt) => return Ok(answer(events, receipt)),
                // Another erasure of the same subject appended its receipt first.
                Err(AppendError::ConditionFailed { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Appends the receipt of every erasure a crash cut short (key deleted, no receipt yet):
    /// after an open, a subject's receipt is in the log exactly when its key is gone.
    pub(crate) fn settle_erasures(&self) -> Result<(), StoreError> {
        let Some(keys) = &self.shared.keys else {
            return Ok(());
        };
        if self.shared.options.durability == Durability::Memory {
            return Ok(());
        }
        for (tag, at_us) in keys.erased() {
            self.receipt(&tag, at_us, true)
                .map_err(|e| match e.into_store_error() {
                    Ok(e) => e,
                    Err(other) => StoreError::Subjects(format!(
                        "the receipt of {tag}'s erasure could not be appended: {other}"
                    )),
                })?;
        }
        // A receipt whose key is still there (on PostgreSQL the receipt goes first): the
        // erasure is finished by deleting the key.
        let receipts = Query::item(QueryItem::types([SUBJECT_ERASED_TYPE]));
        let read = self
            .read(&receipts, ReadOptions::forwards())
            .map_err(|e| StoreError::Subjects(e.to_string()))?;
        let mut erased_at = std::collections::HashMap::new();
        for receipt in read {
            let receipt = receipt.map_err(|e| StoreError::Subjects(e.to_string()))?;
            for tag in receipt.tags().filter(|t| keys.options().is_subject(t)) {
                erased_at.insert(tag.to_string(), receipt.appended_at_us());
            }
        }
        let tags: Vec<&str> = erased_at.keys().map(String::as_str).collect();
        for tag in keys.still_kept(&tags)? {
            keys.erase(&tag, erased_at[&tag], self.head())?;
        }
        Ok(())
    }
}

/// Takes in the keys that the log's appends after the key file's covered position carry (on
/// files: those that reached the log and not yet the key file), and writes a key file made
/// before grants anew with a wrapping key. Run at open, before the backend takes anything in.
pub(crate) fn take_in_grants(shared: &Arc<Shared>) -> Result<(), StoreError> {
    let Some(keys) = &shared.keys else {
        return Ok(());
    };
    if keys.in_table() {
        return Ok(());
    }
    let head = shared.head();
    let taken = grants_into(shared, keys, head)?;
    if taken > 0 {
        tracing::info!(keys = taken, "subjects: keys taken in from the log");
    }
    // The keys only the log carries (made within a second or so of a crash), checked
    // before the key file is written; the key file's own were checked before the log was
    // opened, so that such a refusal writes nothing (this one may have cut a torn tail).
    refuse_uncovered(keys)?;
    if shared.policy.backend == Backend::Files {
        keys.upgrade(head)?;
    }
    Ok(())
}

/// Takes into `keys` the keys the log of `shared` carries as grants after the position
/// through which `keys`' file holds them, up to `head`; answers how many were new.
fn grants_into(
    shared: &Arc<Shared>,
    keys: &crate::keys::KeyStore,
    head: u64,
) -> Result<usize, StoreError> {
    let Some(from) = keys.covered().filter(|&c| c < head) else {
        return Ok(0);
    };
    let mut taken = 0;
    let mut appends = ReadIter::new(
        shared.clone(),
        &Query::all(),
        ReadOptions::forwards().from(from + 1),
        head,
    )
    .map_err(store_error)?;
    while let Some(append) = appends.next_record()? {
        match keys.take_in(append.body(), append.event_count())? {
            crate::keys::TakenIn::Keys(n) => taken += n,
            crate::keys::TakenIn::NewerWrap(id) => {
                return Err(StoreError::Subjects(format!(
                    "the log at {} carries a key under wrapping key {id}, newer than the key \
                     file's: the key file is older than the log",
                    append.first_position()
                )))
            }
        }
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subject::{MasterKey, SubjectOptions};

    /// Goal: an erasure cut by a crash after the key was deleted and before its receipt was
    /// appended is finished at the next open: the receipt is there exactly when the key is
    /// gone.
    #[test]
    fn an_erasure_cut_before_its_receipt_is_finished_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let master = MasterKey::generate().unwrap();
        let options = Options {
            subjects: Some(SubjectOptions::new(["customer:"], master)),
            ..Options::default()
        };
        let store = Store::open(dir.path(), options.clone()).unwrap();
        let events = [NewEvent::new("Moved", "address").tag("customer:1")];
        store.append(&events, None).unwrap();
        store.append(&events, None).unwrap();
        // The first half of an erasure only: the key deleted, no receipt.
        let keys = store.shared.keys.clone().unwrap();
        keys.erase("customer:1", 42, store.head()).unwrap();
        let head = store.head();
        drop(store);
        let store = Store::open(dir.path(), options).unwrap();
        assert_eq!(store.head(), head + 1);
        let receipt = store
            .read(&Query::all(), ReadOptions::backwards())
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(receipt.event_type(), SUBJECT_ERASED_TYPE);
        let body: serde_json::Value = serde_json::from_slice(receipt.data()).unwrap();
        assert_eq!(body["events"], 2);
        assert_eq!(body["erasedAtUs"], 42);
        let first = store
            .read(&Query::all(), ReadOptions::forwards())
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert!(first.is_erased());
        let again = store.erase_subject("customer:1").unwrap();
        assert!(again.already);
        assert_eq!(again.receipt, head + 1);
        store.close().unwrap();
    }
}
