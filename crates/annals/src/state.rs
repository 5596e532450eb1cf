//! State at a position: a state folded from the events of a query through position P, saved
//! and loaded under a canonical key. Read models' checkpoints and the exchange's snapshots are
//! kept this way, and a decision cache keeps its states by the same key.
//!
//! A saved state ([`SavedState`]) says what it is a fold of (a model's name, its version, and
//! their [`StateKey`] with the query's), the position P it was folded through, the append time
//! of the event at P, and the data subjects whose events it folded. Loading it
//! ([`States::load`]) checks it against the log before anything of it is used, and refuses it
//! with a reason ([`Unfit`]) when:
//!
//! - it is of another model, version or query;
//! - P is past the head, or the event at P no longer has that append time: the log is another
//!   one (restored from an older copy, or it lost its tail and was refilled);
//! - an erasure's receipt after P names a subject it saw: it holds data the store forgot.
//!
//! The check is in the library, so that an embedded user gets it as the server does. A state
//! must not be saved past the receipt of an erasure of a subject it saw (fold it again first):
//! loading looks only at the receipts after its position.
//!
//! The bytes are one envelope ([`SavedState::encode`]) ending in a CRC, kept as a companion
//! file of the store ([`Companions`]): in the data directory on files, in the database on
//! PostgreSQL.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::companions::Companions;
use crate::error::{ReadError, StoreError};
use crate::event::Event;
use crate::query::{Query, QueryItem, ReadOptions};
use crate::store::Store;
use crate::subject::{names_subject, SUBJECT_ERASED_TYPE};

/// The envelope's first bytes.
const MAGIC: &[u8; 8] = b"ANNALSST";

/// The envelope's format version.
const VERSION: u32 = 1;

/// What a saved state is a fold of, as 128 bits: the first half of the SHA-256 of the model's
/// name, its version and its query's canonical bytes ([`Query::canonical_bytes`]). Equal
/// queries written in another order (items, types or tags reordered or repeated) have one
/// key; another name, version or query has another.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateKey([u8; 16]);

impl StateKey {
    /// The key of the fold named `name`, of `version`, over the events of `query`.
    pub fn new(name: &str, version: u32, query: &Query) -> StateKey {
        let mut hasher = Sha256::new();
        hasher.update(b"annals state key\0");
        hasher.update((name.len() as u32).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update(version.to_le_bytes());
        hasher.update(query.canonical_bytes());
        let digest = hasher.finalize();
        let mut key = [0; 16];
        key.copy_from_slice(&digest[..16]);
        StateKey(key)
    }

    /// The key of a fold that has no name of its own, by its query alone (a decision cache's:
    /// one cache holds one fold).
    pub fn of_query(query: &Query) -> StateKey {
        StateKey::new("", 0, query)
    }

    /// The key's 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The key as 32 lowercase hexadecimal characters.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for StateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for StateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateKey({})", self.to_hex())
    }
}

/// What a state is a fold of: a model's name, its version and its query, with their key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateId {
    name: String,
    version: u32,
    query: Query,
    key: StateKey,
}

impl StateId {
    /// The fold named `name`, of `version`, over the events of `query`.
    pub fn new(name: impl Into<String>, version: u32, query: Query) -> StateId {
        let name = name.into();
        let key = StateKey::new(&name, version, &query);
        StateId {
            name,
            version,
            query,
            key,
        }
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model's version: raised when its fold changes meaning.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The query whose events the state folds.
    pub fn query(&self) -> &Query {
        &self.query
    }

    /// The canonical key of the name, the version and the query.
    pub fn key(&self) -> StateKey {
        self.key
    }
}

/// A state folded through a position, as it is saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedState {
    /// The model's name.
    pub name: String,
    /// The model's version.
    pub version: u32,
    /// The key of the name, the version and the query ([`StateId::key`]).
    pub key: StateKey,
    /// The last position the state includes (0: none).
    pub position: u64,
    /// When the event at `position` was appended, in microseconds since the Unix epoch: a log
    /// that lost events and was refilled has another one there.
    pub appended_at_us: u64,
    /// When the state was saved, in microseconds since the Unix epoch.
    pub saved_at_us: u64,
    /// The data subjects (their tags) whose events the state folded, sorted, each once.
    pub subjects: Vec<String>,
    /// The state's own bytes.
    pub state: Vec<u8>,
}

impl SavedState {
    /// The state of `id` through `position` (whose event was appended at `appended_at_us`),
    /// having folded the events of `subjects`, saved now.
    pub fn new(
        id: &StateId,
        position: u64,
        appended_at_us: u64,
        mut subjects: Vec<String>,
        state: Vec<u8>,
    ) -> SavedState {
        subjects.sort_unstable();
        subjects.dedup();
        SavedState {
            name: id.name.clone(),
            version: id.version,
            key: id.key,
            position,
            appended_at_us,
            saved_at_us: now_us(),
            subjects,
            state,
        }
    }

    /// Whether `bytes` begin as an envelope does (else they are of another format).
    pub fn is_envelope(bytes: &[u8]) -> bool {
        bytes.starts_with(MAGIC)
    }

    /// The envelope. Layout (little-endian): magic "ANNALSST", format version u32, key 16
    /// bytes, name length u32, name, model version u32, position u64, appended-at of that
    /// position u64, saved-at u64, subject count u32, each subject (length u32, bytes), state
    /// length u64, state, CRC32C u32 of everything before it.
    pub fn encode(&self) -> Vec<u8> {
        let subjects: usize = self.subjects.iter().map(|s| 4 + s.len()).sum();
        let mut out = Vec::with_capacity(96 + self.name.len() + subjects + self.state.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.key.0);
        out.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.position.to_le_bytes());
        out.extend_from_slice(&self.appended_at_us.to_le_bytes());
        out.extend_from_slice(&self.saved_at_us.to_le_bytes());
        out.extend_from_slice(&(self.subjects.len() as u32).to_le_bytes());
        for subject in &self.subjects {
            out.extend_from_slice(&(subject.len() as u32).to_le_bytes());
            out.extend_from_slice(subject.as_bytes());
        }
        out.extend_from_slice(&(self.state.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.state);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// The saved state in an envelope; never panics, never trusts a length.
    pub fn decode(bytes: &[u8]) -> Result<SavedState, Damage> {
        if !Self::is_envelope(bytes) || bytes.len() < MAGIC.len() + 4 {
            return Err(Damage::NotAState);
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body).to_le_bytes() != crc {
            return Err(Damage::Crc);
        }
        let mut cursor = Cursor(&body[MAGIC.len()..]);
        let format = cursor.u32()?;
        if format != VERSION {
            return Err(Damage::UnknownVersion(format));
        }
        let key = StateKey(cursor.take(16)?.try_into().expect("16 bytes"));
        let name_len = cursor.u32()? as usize;
        let name = cursor.text(name_len)?;
        let version = cursor.u32()?;
        let position = cursor.u64()?;
        let appended_at_us = cursor.u64()?;
        let saved_at_us = cursor.u64()?;
        let count = cursor.u32()? as usize;
        // Each subject takes at least its length's 4 bytes: a count beyond that is damage,
        // not an allocation.
        if count > cursor.0.len() / 4 {
            return Err(Damage::Truncated);
        }
        let mut subjects = Vec::with_capacity(count);
        for _ in 0..count {
            let len = cursor.u32()? as usize;
            subjects.push(cursor.text(len)?);
        }
        subjects.sort_unstable();
        subjects.dedup();
        let state_len = usize::try_from(cursor.u64()?).map_err(|_| Damage::Truncated)?;
        let state = cursor.take(state_len)?.to_vec();
        if !cursor.0.is_empty() {
            return Err(Damage::TrailingBytes);
        }
        Ok(SavedState {
            name,
            version,
            key,
            position,
            appended_at_us,
            saved_at_us,
            subjects,
            state,
        })
    }
}

/// Reads an envelope's fields in order.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Damage> {
        if self.0.len() < n {
            return Err(Damage::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, Damage> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, Damage> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn text(&mut self, n: usize) -> Result<String, Damage> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| Damage::NotUtf8)
    }
}

/// What is wrong with bytes that do not decode as a saved state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    /// They do not begin as the format does, or are too short to.
    #[error("not a saved state (unknown magic, or too short)")]
    NotAState,
    /// The CRC at their end is not the CRC of what precedes it.
    #[error("CRC mismatch")]
    Crc,
    /// A format version this build does not know.
    #[error("unknown format version {0}")]
    UnknownVersion(u32),
    /// A field runs past the end.
    #[error("truncated")]
    Truncated,
    /// Bytes follow the last field.
    #[error("trailing bytes")]
    TrailingBytes,
    /// A name or a subject's tag is not UTF-8.
    #[error("a name or a subject is not UTF-8")]
    NotUtf8,
}

/// Why a saved state was refused. Its text completes a sentence whose subject is the state
/// ("the checkpoint {unfit}").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    /// Its bytes do not decode.
    #[error("is damaged ({0})")]
    Damaged(Damage),
    /// It is another model's.
    #[error("is of the model {saved:?}, not {wanted:?}")]
    OtherName { saved: String, wanted: String },
    /// It is of another version of the model.
    #[error("is of model version {saved}, this is {wanted}")]
    OtherVersion { saved: u32, wanted: u32 },
    /// It is of another query (the same name and version, another key).
    #[error("is of another query")]
    OtherQuery,
    /// It was folded through a position the log does not reach.
    #[error("is at position {position}, but the log ends before it (head {head})")]
    BeyondHead { position: u64, head: u64 },
    /// The event at its position has another append time: another log.
    #[error(
        "was folded through an event the log no longer holds: another event is at position \
         {position}"
    )]
    Stale {
        position: u64,
        /// The append time it saved.
        saved_us: u64,
        /// The append time of the event the log holds there.
        found_us: Option<u64>,
    },
    /// A data subject whose events it folded was erased after its position.
    #[error("saw the data subject {subject}, erased since (its receipt is at position {receipt})")]
    SubjectErased { subject: String, receipt: u64 },
}

/// What [`States::load`] found under a name.
#[derive(Debug)]
pub enum Loaded {
    /// Nothing is saved under it.
    Missing,
    /// A state that fits the log.
    Fit(SavedState),
    /// A state refused, and why (it is left where it is).
    Unfit(Unfit),
    /// Bytes not in the envelope: an older format that its owner may read and hand to
    /// [`States::adopt`]; otherwise damaged ([`Damage::NotAState`]).
    Older(Vec<u8>),
}

/// The saved states of one kind (`readmodels`, `exchange`) in a store's companions.
#[derive(Clone)]
pub struct States {
    companions: Arc<dyn Companions>,
    kind: String,
}

impl States {
    /// The states of `kind` kept in `companions`.
    pub fn new(companions: Arc<dyn Companions>, kind: impl Into<String>) -> States {
        States {
            companions,
            kind: kind.into(),
        }
    }

    /// The states of `kind` kept where `store` keeps its companions.
    pub fn of_store(store: &Store, kind: impl Into<String>) -> States {
        States::new(store.companions(), kind)
    }

    /// Where `file` is kept, for messages.
    pub fn locate(&self, file: &str) -> PathBuf {
        self.companions.locate(&self.kind, file)
    }

    /// Saves `saved` as `file`, replacing what was there; once this returns, a crash keeps it.
    pub fn save(&self, file: &str, saved: &SavedState) -> Result<(), StoreError> {
        self.companions
            .write(&self.kind, file, &saved.encode())
            .map_err(|e| StoreError::io("save a state", self.locate(file), 0, e))
    }

    /// The bytes of `file` as they are, or `None` when there is none.
    pub fn read(&self, file: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.companions
            .read(&self.kind, file)
            .map_err(|e| StoreError::io("read a saved state", self.locate(file), 0, e))
    }

    /// Removes `file` (nothing when there is none).
    pub fn remove(&self, file: &str) -> Result<(), StoreError> {
        self.companions
            .remove(&self.kind, file)
            .map_err(|e| StoreError::io("remove a saved state", self.locate(file), 0, e))
    }

    /// The files of this kind, sorted.
    pub fn list(&self) -> Result<Vec<String>, StoreError> {
        self.companions
            .list(&self.kind)
            .map_err(|e| StoreError::io("list saved states", self.locate(""), 0, e))
    }

    /// The state saved as `file`, checked against `store`'s log as the fold `id` ([`check`]).
    pub fn load(&self, store: &Store, file: &str, id: &StateId) -> Result<Loaded, ReadError> {
        let Some(bytes) = self.read(file)? else {
            return Ok(Loaded::Missing);
        };
        if !SavedState::is_envelope(&bytes) {
            return Ok(Loaded::Older(bytes));
        }
        let saved = match SavedState::decode(&bytes) {
            Ok(saved) => saved,
            Err(damage) => return Ok(Loaded::Unfit(Unfit::Damaged(damage))),
        };
        Ok(match check(store, id, &saved)? {
            Some(unfit) => Loaded::Unfit(unfit),
            None => Loaded::Fit(saved),
        })
    }

    /// A state its owner read from an older format (whose checks of name, version and query
    /// it made): the data subjects whose events `id`'s query holds through its position are
    /// added to it (the older formats kept none), it is checked as [`States::load`] checks,
    /// and when it fits it is saved anew as `file` in the envelope. Finding the subjects reads
    /// the query's events through the position once, on a store with data subjects only. A
    /// failed save is logged, not answered: the older file stays, and loads again.
    pub fn adopt(
        &self,
        store: &Store,
        file: &str,
        id: &StateId,
        mut saved: SavedState,
    ) -> Result<Loaded, ReadError> {
        let mut subjects = Subjects::of(store);
        subjects.read(store, id.query(), 0, saved.position)?;
        subjects.extend(std::mem::take(&mut saved.subjects));
        saved.subjects = subjects.to_vec();
        if let Some(unfit) = check(store, id, &saved)? {
            return Ok(Loaded::Unfit(unfit));
        }
        if let Err(e) = self.save(file, &saved) {
            tracing::warn!(error = %e, "a state of an older format was not saved anew");
        }
        Ok(Loaded::Fit(saved))
    }
}

/// Checks `saved` against `store`'s log as the fold `id`: `None` when it fits, else why not
/// (see the module documentation).
pub fn check(store: &Store, id: &StateId, saved: &SavedState) -> Result<Option<Unfit>, ReadError> {
    if saved.name != id.name {
        return Ok(Some(Unfit::OtherName {
            saved: saved.name.clone(),
            wanted: id.name.clone(),
        }));
    }
    if saved.version != id.version {
        return Ok(Some(Unfit::OtherVersion {
            saved: saved.version,
            wanted: id.version,
        }));
    }
    if saved.key != id.key {
        return Ok(Some(Unfit::OtherQuery));
    }
    let head = store.head();
    if saved.position > head {
        return Ok(Some(Unfit::BeyondHead {
            position: saved.position,
            head,
        }));
    }
    // A state through position 0 holds no event: it fits any log.
    if saved.position > 0 {
        let found = appended_at(store, saved.position)?;
        if found != Some(saved.appended_at_us) {
            return Ok(Some(Unfit::Stale {
                position: saved.position,
                saved_us: saved.appended_at_us,
                found_us: found,
            }));
        }
    }
    if let Some((subject, receipt)) = erased_since(store, &saved.subjects, saved.position)? {
        return Ok(Some(Unfit::SubjectErased { subject, receipt }));
    }
    Ok(None)
}

/// When the event at `position` was appended, or `None` for position 0 and beyond the head.
pub fn appended_at(store: &Store, position: u64) -> Result<Option<u64>, ReadError> {
    if position == 0 || position > store.head() {
        return Ok(None);
    }
    let mut events = store.read(
        &Query::all(),
        ReadOptions::forwards().from(position).limit(1),
    )?;
    match events.next().transpose()? {
        Some(event) if event.position() == position => Ok(Some(event.appended_at_us())),
        _ => Ok(None),
    }
}

/// The first of `subjects` that an erasure's receipt after `after` names, with the receipt's
/// position; `None` when none was erased since.
pub fn erased_since(
    store: &Store,
    subjects: &[String],
    after: u64,
) -> Result<Option<(String, u64)>, ReadError> {
    if subjects.is_empty() {
        return Ok(None);
    }
    let sorted = subjects.is_sorted();
    let receipts = Query::item(QueryItem::types([SUBJECT_ERASED_TYPE]));
    for receipt in store.read(&receipts, ReadOptions::forwards().after(after))? {
        let receipt = receipt?;
        let named = receipt.tags().find(|&tag| match sorted {
            true => subjects.binary_search_by(|s| s.as_str().cmp(tag)).is_ok(),
            false => subjects.iter().any(|s| s == tag),
        });
        if let Some(tag) = named {
            return Ok(Some((tag.to_owned(), receipt.position())));
        }
    }
    Ok(None)
}

/// The data subjects a fold saw: the tags naming a data subject (by the store's prefixes,
/// `Options::subjects`) of the events it folded. Empty on a store without data subjects.
#[derive(Debug, Clone, Default)]
pub struct Subjects {
    prefixes: Vec<String>,
    seen: BTreeSet<String>,
}

impl Subjects {
    /// None seen yet, by `store`'s subject prefixes.
    pub fn of(store: &Store) -> Subjects {
        Subjects {
            prefixes: store
                .subject_prefixes()
                .map(<[String]>::to_vec)
                .unwrap_or_default(),
            seen: BTreeSet::new(),
        }
    }

    /// Whether the store has data subjects to note.
    pub fn keeps(&self) -> bool {
        !self.prefixes.is_empty()
    }

    /// Notes the subjects of `event`, folded now. An erased event is not noted: its data is
    /// gone, the fold saw none of it.
    pub fn see(&mut self, event: &Event) {
        if self.keeps() && !event.is_erased() {
            self.note(event);
        }
    }

    fn note(&mut self, event: &Event) {
        for tag in event.tags() {
            if names_subject(&self.prefixes, tag) && !self.seen.contains(tag) {
                self.seen.insert(tag.to_owned());
            }
        }
    }

    /// Notes the subjects of the events of `query` after `after` through `through`, as read
    /// now: for a fold made earlier, erased events included (it may have seen their data
    /// before the erasure). Reads nothing on a store without data subjects.
    pub fn read(
        &mut self,
        store: &Store,
        query: &Query,
        after: u64,
        through: u64,
    ) -> Result<(), ReadError> {
        if !self.keeps() || through <= after {
            return Ok(());
        }
        for event in store.read(query, ReadOptions::forwards().after(after))? {
            let event = event?;
            if event.position() > through {
                break;
            }
            self.note(&event);
        }
        Ok(())
    }

    /// Notes `subjects` (a saved state's, when a fold resumes from it).
    pub fn extend(&mut self, subjects: impl IntoIterator<Item = String>) {
        self.seen.extend(subjects);
    }

    /// Forgets every subject noted (a fold started again).
    pub fn clear(&mut self) {
        self.seen.clear();
    }

    /// How many subjects were noted.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// The subjects noted, sorted.
    pub fn to_vec(&self) -> Vec<String> {
        self.seen.iter().cloned().collect()
    }
}

/// Now, in microseconds since the Unix epoch.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved() -> SavedState {
        let id = StateId::new("seats", 3, Query::item(QueryItem::types(["Enrolled"])));
        SavedState::new(
            &id,
            42,
            1_700_000_000_000_000,
            vec![
                "customer:2".into(),
                "customer:1".into(),
                "customer:2".into(),
            ],
            b"{\"c1\":2}".to_vec(),
        )
    }

    /// Goal: an envelope decodes back to what was encoded, its subjects sorted and once each.
    #[test]
    fn an_envelope_round_trips() {
        let saved = saved();
        assert_eq!(saved.subjects, ["customer:1", "customer:2"]);
        let bytes = saved.encode();
        assert!(SavedState::is_envelope(&bytes));
        assert_eq!(SavedState::decode(&bytes).unwrap(), saved);
    }

    /// Goal: damaged envelopes are refused with their reason, never a panic: a flipped bit
    /// (the CRC), another magic, an unknown version, and cuts at every length.
    #[test]
    fn damaged_envelopes_are_refused_with_their_reason() {
        let bytes = saved().encode();
        let mut flipped = bytes.clone();
        flipped[bytes.len() / 2] ^= 0x40;
        assert_eq!(SavedState::decode(&flipped), Err(Damage::Crc));
        assert_eq!(SavedState::decode(b"ANNALSRM...."), Err(Damage::NotAState));
        let mut later = bytes[..bytes.len() - 4].to_vec();
        later[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&later);
        later.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(SavedState::decode(&later), Err(Damage::UnknownVersion(2)));
        for cut in 0..bytes.len() {
            let mut short = bytes[..cut].to_vec();
            if cut >= 12 {
                // With a CRC of its own, so that the fields behind it are reached.
                let crc = crc32c::crc32c(&short[..cut - 4]);
                short.truncate(cut - 4);
                short.extend_from_slice(&crc.to_le_bytes());
            }
            assert!(SavedState::decode(&short).is_err(), "cut at {cut}");
        }
    }

    /// Goal: the key's text is its 16 bytes in hexadecimal.
    #[test]
    fn a_key_prints_as_hex() {
        let key = StateKey::of_query(&Query::all());
        assert_eq!(key.to_hex().len(), 32);
        assert_eq!(key.to_string(), key.to_hex());
        assert_eq!(
            key.to_hex(),
            key.as_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
    }
}
