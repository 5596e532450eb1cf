//! A state folded through a position, as it is saved: what it is a fold of ([`StateKey`],
//! [`StateId`]) and its envelope ([`SavedState`]), which decodes without trusting a length.
//! What checks a saved state against a log is `state.rs`, above the store; this is the format
//! alone, below it, so that the places that keep saved states (companions, the snapshot
//! shelves) can read their fields.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::query::Query;

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

    /// The key whose 16 bytes are `bytes`.
    pub fn from_bytes(bytes: [u8; 16]) -> StateKey {
        StateKey(bytes)
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

/// Now, in microseconds since the Unix epoch.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::QueryItem;

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
