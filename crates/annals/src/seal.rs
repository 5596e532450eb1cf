//! Sealing a data subject's events: the metadata and data of an entry that carries a subject's
//! tag are encrypted (AES-256-GCM: `aead.rs`) before the entry reaches any storage;
//! type, tags, id and position stay in the clear. The keys themselves are wrapped under the
//! master key the same way (the `keys` module keeps them).
//!
//! ```text
//! a sealed entry: flags bit 1 set, metadata_len 0, data = the envelope
//! envelope (version 1)
//!   0  version u8 (1)          1  subjects u8 (n >= 1)
//!   2  the subjects' tags, as indices into the entry's tags: u16 each, ascending
//!   2 + 2n  nonce [u8; 12]     then the ciphertext with its 16-byte tag, of
//!           metadata_len u32 ++ metadata ++ data
//! associated data: the entry's id, type and tags, then the envelope's first 2 + 2n bytes
//! key: the subject's key; for several subjects, HKDF-SHA256 over their keys in that order,
//!      so that erasing any one of them makes the event unreadable
//!
//! envelope version 2: an entry that carries the keys it is sealed under (grants)
//!   after the subjects' tags: grants u8 (g, 1 to n), then for each: the subject u8 (an
//!   index into the n above), the wrapping key's id u64, the subject's key wrapped under
//!   that wrapping key with the tag as associated data (60 bytes); then nonce and
//!   ciphertext as in version 1, the associated data running to the end of the grants
//! ```
//!
//! A grant is how a new key becomes durable with the first events sealed under it, in the
//! same fdatasync, rather than in a sync of the key file of its own ahead of them
//! (`keys/mod.rs`): every append sealed under a key the key file does not hold yet carries it.
//! The wrapping key is the key file's; an erasure replaces it, so the grants already in the
//! log (of every subject) can no longer be opened, and the key file holds every key but the
//! erased one.

use zeroize::Zeroize;

use crate::aead::{Aes256, CipherMemo, NONCE_BYTES, TAG_BYTES};

use crate::error::InputError;
use crate::record::{
    EncodedAppend, Entries, EntryLayout, ENTRY_FIXED_BYTES, FLAG_SEALED, HEADER_BYTES,
};
use crate::subject::{MasterKey, SubjectOptions, SUBJECT_ERASED_TYPE};

const ENVELOPE_VERSION: u8 = 1;
/// An envelope with grants.
const ENVELOPE_GRANTS: u8 = 2;
/// One grant: the subject's index, the wrapping key's id, the wrapped key.
const GRANT_BYTES: usize = 1 + 8 + WRAPPED_KEY_BYTES;
/// The most subjects one event may name.
pub(crate) const SUBJECTS_PER_EVENT_MAX: usize = 16;
/// A wrapped key: nonce, then the 32-byte key encrypted, then its tag.
pub(crate) const WRAPPED_KEY_BYTES: usize = NONCE_BYTES + 32 + TAG_BYTES;

/// One data subject's key: its 32 bytes alone, wiped from memory when dropped. The map of a
/// store's keys holds it inline, so that looking one up costs no pointer chase beyond the map's
/// own, and the map stays small with many subjects; its cipher is made where it is used
/// (`OpenMemo` for readers, [`CipherMemo`] for a sealing pass), once for a run of events
/// under one key.
#[derive(Clone)]
pub(crate) struct SubjectKey(zeroize::Zeroizing<[u8; 32]>);

impl SubjectKey {
    fn from_bytes(bytes: [u8; 32]) -> SubjectKey {
        SubjectKey(zeroize::Zeroizing::new(bytes))
    }

    pub(crate) fn generate() -> Result<SubjectKey, String> {
        let mut bytes = crate::subject::random_key()?;
        let key = SubjectKey::from_bytes(bytes);
        bytes.zeroize();
        Ok(key)
    }

    fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Its cipher, round keys set up.
    pub(crate) fn cipher(&self) -> Aes256 {
        Aes256::new(self.bytes())
    }

    #[cfg(test)]
    pub(crate) fn clone_bytes(&self) -> [u8; 32] {
        *self.0
    }
}

impl std::fmt::Debug for SubjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubjectKey(hidden)")
    }
}

/// The key that wraps new subjects' keys in the grants appends carry (see the module's
/// documentation): made at random with each key file epoch that begins one (an erasure), kept
/// in the key file under the master key. Wiped from memory when dropped.
pub(crate) struct WrapKey {
    /// The key file epoch it was made in.
    id: u64,
    bytes: [u8; 32],
    cipher: Aes256,
}

impl Drop for WrapKey {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

/// A new key as an append carries it: wrapped under the wrapping key `wrap_id`.
pub(crate) struct Grant {
    pub wrap_id: u64,
    pub wrapped: Box<[u8]>,
}

impl WrapKey {
    fn from_bytes(id: u64, bytes: [u8; 32]) -> WrapKey {
        let cipher = Aes256::new(&bytes);
        WrapKey { id, bytes, cipher }
    }

    pub(crate) fn generate(id: u64) -> Result<WrapKey, String> {
        let mut bytes = crate::subject::random_key()?;
        let key = WrapKey::from_bytes(id, bytes);
        bytes.zeroize();
        Ok(key)
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    fn aad(id: u64) -> [u8; 27] {
        let mut aad = [0u8; 27];
        aad[..19].copy_from_slice(b"annals wrapping key");
        aad[19..].copy_from_slice(&id.to_le_bytes());
        aad
    }

    /// This key wrapped under the master key, bound to its id.
    pub(crate) fn wrapped_under(&self, master: &MasterKey) -> Result<Vec<u8>, String> {
        wrap_bytes(&master_cipher(master), &Self::aad(self.id), &self.bytes)
    }

    /// The wrapping key `id` that `wrapped_under` wrapped, or None when `master` is not the
    /// key it was wrapped under (or the bytes are damaged).
    pub(crate) fn unwrap(master: &MasterKey, id: u64, wrapped: &[u8]) -> Option<WrapKey> {
        unwrap_bytes(&master_cipher(master), &Self::aad(id), wrapped)
            .map(|b| WrapKey::from_bytes(id, b))
    }

    /// `key`, the key of the subject `tag`, as a grant.
    pub(crate) fn grant(&self, tag: &str, key: &SubjectKey) -> Result<Grant, String> {
        Ok(Grant {
            wrap_id: self.id,
            wrapped: wrap_bytes(&self.cipher, tag.as_bytes(), key.bytes())?.into(),
        })
    }

    /// The key a grant of `tag` under this wrapping key carries; None when it does not
    /// authenticate.
    pub(crate) fn open_grant(&self, tag: &str, wrapped: &[u8]) -> Option<SubjectKey> {
        unwrap_bytes(&self.cipher, tag.as_bytes(), wrapped).map(SubjectKey::from_bytes)
    }
}

impl std::fmt::Debug for WrapKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WrapKey({}, hidden)", self.id)
    }
}

/// A 96-bit nonce, at random: per subject key the chance of a repeat stays negligible up to
/// billions of events (NIST SP 800-38D bounds random nonces at 2^32 messages per key).
fn nonce() -> Result<[u8; NONCE_BYTES], String> {
    let mut nonce = [0u8; NONCE_BYTES];
    getrandom::fill(&mut nonce)
        .map_err(|e| format!("the operating system's random generator failed: {e}"))?;
    Ok(nonce)
}

/// `plain` encrypted by `cipher` with `aad`: nonce ++ ciphertext ++ tag.
fn encrypt(cipher: &Aes256, aad: &[u8], plain: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let nonce = nonce()?;
    out.extend_from_slice(&nonce);
    let start = out.len();
    out.extend_from_slice(plain);
    let Ok(tag) = cipher.seal(&nonce, aad, &mut out[start..]) else {
        out[start..].zeroize();
        return Err("encryption failed".to_string());
    };
    out.extend_from_slice(&tag);
    Ok(())
}

/// The plaintext of `sealed` (nonce ++ ciphertext ++ tag), or None when it does not
/// authenticate under `cipher` and `aad`.
fn decrypt(cipher: &Aes256, aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    let body_len = sealed.len().checked_sub(NONCE_BYTES + TAG_BYTES)?;
    let (nonce, rest) = sealed.split_at(NONCE_BYTES);
    let (body, tag) = rest.split_at(body_len);
    let mut out = vec![0; body_len];
    cipher
        .open(
            nonce.try_into().ok()?,
            aad,
            body,
            tag.try_into().ok()?,
            &mut out,
        )
        .ok()?;
    Some(out)
}

fn master_cipher(master: &MasterKey) -> Aes256 {
    Aes256::new(master.bytes())
}

/// A subject's key wrapped under the master key, bound to its tag.
pub(crate) fn wrap_key(master: &MasterKey, tag: &str, key: &SubjectKey) -> Result<Vec<u8>, String> {
    wrap_bytes(&master_cipher(master), tag.as_bytes(), key.bytes())
}

/// The key `wrap_key` wrapped, or None when `master` is not the key it was wrapped under (or
/// the bytes are damaged).
pub(crate) fn unwrap_key(master: &MasterKey, tag: &str, wrapped: &[u8]) -> Option<SubjectKey> {
    unwrap_bytes(&master_cipher(master), tag.as_bytes(), wrapped).map(SubjectKey::from_bytes)
}

/// 32 bytes of a key wrapped under `cipher`, bound to `aad`: [`WRAPPED_KEY_BYTES`] of nonce,
/// ciphertext and tag.
fn wrap_bytes(cipher: &Aes256, aad: &[u8], bytes: &[u8; 32]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(WRAPPED_KEY_BYTES);
    encrypt(cipher, aad, bytes, &mut out)?;
    debug_assert_eq!(out.len(), WRAPPED_KEY_BYTES);
    Ok(out)
}

/// The 32 bytes `wrap_bytes` wrapped (the plaintext buffer wiped), or None when they do not
/// authenticate under `cipher` and `aad`.
fn unwrap_bytes(cipher: &Aes256, aad: &[u8], wrapped: &[u8]) -> Option<[u8; 32]> {
    let mut plain = decrypt(cipher, aad, wrapped)?;
    let bytes = <[u8; 32]>::try_from(plain.as_slice()).ok();
    plain.zeroize();
    bytes
}

/// What proves a master key is the store's: 16 zero bytes sealed under it.
pub(crate) fn master_check(master: &MasterKey) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    encrypt(
        &master_cipher(master),
        b"annals master key",
        &[0; 16],
        &mut out,
    )?;
    Ok(out)
}

pub(crate) fn master_matches(master: &MasterKey, check: &[u8]) -> bool {
    decrypt(&master_cipher(master), b"annals master key", check).is_some_and(|p| p == [0; 16])
}

/// The key of an event naming `keys` (in the order of its tags): the subject's own, or for
/// several, one derived from all of theirs.
fn event_key<'a>(keys: impl IntoIterator<Item = &'a SubjectKey>) -> SubjectKey {
    let mut keys = keys.into_iter();
    let first = keys
        .next()
        .expect("a sealed event names at least one subject");
    let Some(second) = keys.next() else {
        return first.clone();
    };
    let mut ikm = Vec::with_capacity(32 * SUBJECTS_PER_EVENT_MAX);
    for k in [first, second].into_iter().chain(keys) {
        ikm.extend_from_slice(k.bytes());
    }
    let mut okm = [0u8; 32];
    hkdf::Hkdf::<sha2::Sha256>::new(None, &ikm)
        .expand(b"annals subjects v1", &mut okm)
        .expect("32 bytes is a valid HKDF-SHA256 length");
    ikm.zeroize();
    let key = SubjectKey::from_bytes(okm);
    okm.zeroize();
    key
}

/// The indices of the entry's tags that name subjects.
fn subject_tags(entry: &[u8], layout: &EntryLayout, subjects: &SubjectOptions) -> Vec<u16> {
    crate::event::Tags::of(entry, layout)
        .enumerate()
        .filter(|(_, t)| subjects.is_subject(t))
        .map(|(i, _)| i as u16)
        .collect()
}

/// A key as a sealing pass gets it: the key, and its grant while the append must carry it.
pub(crate) type GivenKey = (SubjectKey, Option<std::sync::Arc<Grant>>);

/// The keys a sealing pass asks for: by tag, created when new (made durable before the
/// append goes on, or given with the grant the append carries); an erased subject's is
/// refused.
pub(crate) trait KeySource {
    fn keys_for(&self, tags: &[&str]) -> Result<Vec<GivenKey>, SealError>;
}

/// Why an append could not be sealed.
#[derive(Debug)]
pub(crate) enum SealError {
    Input(InputError),
    /// The key could not be made or stored: nothing was appended.
    Keys(String),
    /// The database that keeps the keys did not take a new one: nothing was appended.
    Unavailable(String),
    /// An event names this erased subject: nothing was appended.
    Erased(String),
}

impl From<InputError> for SealError {
    fn from(e: InputError) -> Self {
        SealError::Input(e)
    }
}

/// Seals the entries of `append` that name a subject; unchanged (not copied) when none does.
/// Entries already sealed (a copy's) stay as they are. `receipts`: the store's own erasure
/// receipts, left in the clear; a client's event of that type is refused.
pub(crate) fn seal_append(
    append: EncodedAppend,
    subjects: &SubjectOptions,
    keys: &dyn KeySource,
    receipts: bool,
) -> Result<EncodedAppend, SealError> {
    let mut plan: Vec<Vec<u16>> = Vec::new();
    let mut any = false;
    let mut tags: Vec<&str> = Vec::new();
    let mut index_of: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (index, (_, entry, layout)) in Entries::new(append.entries(), append.event_count)
        .trusted()
        .enumerate()
    {
        if layout.event_type(entry) == SUBJECT_ERASED_TYPE && !receipts && !layout.sealed {
            return Err(InputError::ReservedType {
                index,
                event_type: SUBJECT_ERASED_TYPE.into(),
            }
            .into());
        }
        let found = if layout.sealed || layout.event_type(entry) == SUBJECT_ERASED_TYPE {
            Vec::new()
        } else {
            subject_tags(entry, &layout, subjects)
        };
        if found.len() > SUBJECTS_PER_EVENT_MAX {
            return Err(InputError::TooManyTags {
                index,
                count: found.len(),
                max: SUBJECTS_PER_EVENT_MAX,
            }
            .into());
        }
        for &i in &found {
            let tag = crate::event::Tags::of(entry, &layout)
                .nth(i as usize)
                .unwrap_or_default();
            index_of.entry(tag).or_insert_with(|| {
                tags.push(tag);
                tags.len() - 1
            });
        }
        any |= !found.is_empty();
        plan.push(found);
    }
    if !any {
        return Ok(append);
    }
    let found_keys = keys.keys_for(&tags)?;
    debug_assert_eq!(found_keys.len(), tags.len());
    let key_of = |tag: &str| -> &GivenKey { &found_keys[index_of[tag]] };
    // One call to the operating system's generator for all the nonces of the append.
    let sealed_count = plan.iter().filter(|found| !found.is_empty()).count();
    let mut nonces = vec![0u8; sealed_count * NONCE_BYTES];
    getrandom::fill(&mut nonces).map_err(|e| {
        SealError::Keys(format!(
            "the operating system's random generator failed: {e}"
        ))
    })?;
    let mut nonces = nonces.chunks_exact(NONCE_BYTES);
    let mut body = Vec::with_capacity(append.body.len() + plan.len() * 64);
    let mut all_ids = true;
    let mut memo = CipherMemo::default();
    for ((_, entry, layout), found) in Entries::new(append.entries(), append.event_count)
        .trusted()
        .zip(&plan)
    {
        all_ids &= layout.id(entry).is_some();
        if found.is_empty() {
            let start = body.len();
            body.extend_from_slice(entry);
            set_record_offset(&mut body, start);
            continue;
        }
        let event_tags: Vec<&str> = crate::event::Tags::of(entry, &layout).collect();
        let given: Vec<&GivenKey> = found
            .iter()
            .map(|&i| key_of(event_tags[i as usize]))
            .collect();
        let subject_keys = given.iter().map(|(k, _)| k);
        let grants: Vec<(u8, &Grant)> = given
            .iter()
            .enumerate()
            .filter_map(|(i, (_, g))| g.as_deref().map(|g| (i as u8, g)))
            .collect();
        let nonce = nonces.next().expect("a nonce for each sealed entry");
        let cipher = memo.cipher(event_key(subject_keys).bytes());
        seal_entry(&mut body, entry, &layout, found, cipher, &grants, nonce)
            .map_err(SealError::Keys)?;
    }
    let entries_len = body.len();
    body.extend_from_slice(&append.body[append.entries().len()..]);
    let body_crc = crc32c::crc32c(&body);
    Ok(EncodedAppend {
        trailer_len: (body.len() - entries_len) as u32,
        body,
        body_crc,
        event_count: append.event_count,
        all_ids,
    })
}

/// Points the entry copied at `start` of `body` to its new place in the record.
fn set_record_offset(body: &mut [u8], start: usize) {
    let offset = (HEADER_BYTES + start) as u32;
    body[start + 4..start + 8].copy_from_slice(&offset.to_le_bytes());
}

/// Appends `entry` to `body` sealed by `cipher` (its subjects' key) with `nonce`: the clear
/// part, the envelope's header (with `grants`, the keys the entry carries, by their index into
/// `subjects`), the nonce, then the metadata and data encrypted in place with their tag.
fn seal_entry(
    body: &mut Vec<u8>,
    entry: &[u8],
    layout: &EntryLayout,
    subjects: &[u16],
    cipher: &Aes256,
    grants: &[(u8, &Grant)],
    nonce: &[u8],
) -> Result<(), String> {
    let start = body.len();
    let clear_end = layout.metadata_start as usize;
    body.extend_from_slice(&entry[..clear_end]);
    body.push(match grants.is_empty() {
        true => ENVELOPE_VERSION,
        false => ENVELOPE_GRANTS,
    });
    body.push(subjects.len() as u8);
    for &i in subjects {
        body.extend_from_slice(&i.to_le_bytes());
    }
    if !grants.is_empty() {
        body.push(grants.len() as u8);
        for (i, grant) in grants {
            debug_assert!((*i as usize) < subjects.len());
            debug_assert_eq!(grant.wrapped.len(), WRAPPED_KEY_BYTES);
            body.push(*i);
            body.extend_from_slice(&grant.wrap_id.to_le_bytes());
            body.extend_from_slice(&grant.wrapped);
        }
    }
    // The associated data is contiguous in the sealed entry: id, type, tags, envelope header.
    let aad_end = body.len();
    body.extend_from_slice(nonce);
    let plain_start = body.len();
    let metadata = &entry[layout.metadata_range()];
    body.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
    body.extend_from_slice(metadata);
    body.extend_from_slice(&entry[layout.data_range()]);
    let (head, plain) = body.split_at_mut(plain_start);
    let nonce: &[u8; NONCE_BYTES] = nonce.try_into().expect("a 12-byte nonce");
    let sealed = cipher.seal(nonce, &head[start + ENTRY_FIXED_BYTES..aad_end], plain);
    let Ok(tag) = sealed else {
        body[plain_start..].zeroize();
        body.truncate(start);
        return Err("encryption failed".into());
    };
    body.extend_from_slice(&tag);
    // The fixed part: lengths and flags change; the id, type and tags are as they were.
    let entry_len = (body.len() - start) as u32;
    let envelope_len = (body.len() - clear_end - start) as u32;
    body[start..start + 4].copy_from_slice(&entry_len.to_le_bytes());
    set_record_offset(body, start);
    body[start + 12..start + 16].copy_from_slice(&envelope_len.to_le_bytes());
    body[start + 16..start + 20].copy_from_slice(&0u32.to_le_bytes());
    body[start + 20] |= FLAG_SEALED;
    Ok(())
}

/// An envelope's header read: how many subjects, where its grants are, and its length
/// (where the nonce begins).
struct EnvelopeHeader {
    subjects: usize,
    grants: std::ops::Range<usize>,
    len: usize,
}

impl EnvelopeHeader {
    /// The header of `envelope`, checked to leave room for a nonce, a length and a tag.
    fn parse(envelope: &[u8]) -> Result<EnvelopeHeader, String> {
        let (Some(&version), Some(&n)) = (envelope.first(), envelope.get(1)) else {
            return Err("an empty envelope".into());
        };
        let n = n as usize;
        let bad = || format!("an envelope of version {version} with {n} subjects");
        if n == 0 || n > SUBJECTS_PER_EVENT_MAX {
            return Err(bad());
        }
        let (grants, len) = match version {
            ENVELOPE_VERSION => (2 + 2 * n..2 + 2 * n, 2 + 2 * n),
            ENVELOPE_GRANTS => {
                let g = *envelope.get(2 + 2 * n).ok_or_else(bad)? as usize;
                if g == 0 || g > n {
                    return Err(bad());
                }
                let start = 3 + 2 * n;
                (start..start + g * GRANT_BYTES, start + g * GRANT_BYTES)
            }
            _ => return Err(bad()),
        };
        if envelope.len() < len + NONCE_BYTES + 4 + TAG_BYTES {
            return Err(bad());
        }
        Ok(EnvelopeHeader {
            subjects: n,
            grants,
            len,
        })
    }

    /// The index among the entry's tags of subject `i`.
    fn tag_index(envelope: &[u8], i: usize) -> usize {
        u16::from_le_bytes([envelope[2 + 2 * i], envelope[3 + 2 * i]]) as usize
    }
}

/// The tags of the subjects a sealed entry is sealed for; None when its envelope is malformed.
pub(crate) fn sealed_subjects<'a>(entry: &'a [u8], layout: &EntryLayout) -> Option<Vec<&'a str>> {
    let envelope = &entry[layout.data_range()];
    let header = EnvelopeHeader::parse(envelope).ok()?;
    let tags: Vec<&str> = crate::event::Tags::of(entry, layout).collect();
    (0..header.subjects)
        .map(|i| tags.get(EnvelopeHeader::tag_index(envelope, i)).copied())
        .collect()
}

/// One key a sealed entry carries: the subject's tag, the wrapping key's id, the wrapped key.
pub(crate) struct CarriedGrant<'a> {
    pub tag: &'a str,
    pub wrap_id: u64,
    pub wrapped: &'a [u8],
}

/// The keys a sealed entry carries (none for an envelope of version 1); None when its
/// envelope is malformed.
pub(crate) fn entry_grants<'a>(
    entry: &'a [u8],
    layout: &EntryLayout,
) -> Option<Vec<CarriedGrant<'a>>> {
    let envelope = &entry[layout.data_range()];
    let header = EnvelopeHeader::parse(envelope).ok()?;
    let tags: Vec<&str> = crate::event::Tags::of(entry, layout).collect();
    envelope[header.grants]
        .chunks_exact(GRANT_BYTES)
        .map(|g| {
            let subject = g[0] as usize;
            if subject >= header.subjects {
                return None;
            }
            Some(CarriedGrant {
                tag: tags
                    .get(EnvelopeHeader::tag_index(envelope, subject))
                    .copied()?,
                wrap_id: u64::from_le_bytes(g[1..9].try_into().expect("8 bytes")),
                wrapped: &g[9..],
            })
        })
        .collect()
}

/// What a sealed entry's keys are, as far as the store knows.
pub(crate) enum KeyState {
    Live(SubjectKey),
    Erased,
    /// No key and no erasure: a key file lost or damaged.
    Missing,
}

/// Why an event's subjects give no cipher.
pub(crate) enum Unopenable {
    /// One of them was erased.
    Erased,
    /// This one has neither a key nor an erasure.
    Missing(String),
}

/// Where an opening pass gets the cipher of an event's subjects.
pub(crate) trait Ciphers {
    /// The cipher of the subjects `tags` (in the envelope's order): see [`cipher_key`].
    fn cipher(&mut self, tags: &[&str]) -> Result<&Aes256, Unopenable>;
}

/// The key an event of the subjects `tags` is sealed under, from their states in that order:
/// the subject's own, or for several, one derived from all of theirs. A subject without key
/// or erasure makes the event damaged, whatever the others; an erased one makes it erased.
pub(crate) fn cipher_key<'t>(
    states: impl IntoIterator<Item = (&'t str, KeyState)>,
) -> Result<SubjectKey, Unopenable> {
    let mut keys: Vec<SubjectKey> = Vec::new();
    let mut erased = false;
    for (tag, state) in states {
        match state {
            KeyState::Live(k) => keys.push(k),
            KeyState::Erased => erased = true,
            KeyState::Missing => return Err(Unopenable::Missing(tag.to_string())),
        }
    }
    match erased {
        true => Err(Unopenable::Erased),
        false => Ok(event_key(&keys)),
    }
}

/// A sealed entry opened.
pub(crate) enum Opened {
    /// The entry with its metadata and data back in the clear (not sealed).
    Clear(Vec<u8>),
    /// A subject was erased: the entry with empty metadata and data.
    Erased(Vec<u8>),
    /// The envelope is malformed, a key is missing, or it does not authenticate.
    Damaged(String),
}

/// Opens a sealed entry with the cipher `ciphers` gives for its subjects' tags. The opened
/// entry is built in one buffer, decrypted straight into it.
pub(crate) fn open_entry(entry: &[u8], layout: &EntryLayout, ciphers: &mut dyn Ciphers) -> Opened {
    let envelope = &entry[layout.data_range()];
    let (n, header) = match EnvelopeHeader::parse(envelope) {
        Ok(h) => (h.subjects, h.len),
        Err(why) => return Opened::Damaged(why),
    };
    let mut tags = [""; SUBJECTS_PER_EVENT_MAX];
    for (i, slot) in tags.iter_mut().enumerate().take(n) {
        let index = EnvelopeHeader::tag_index(envelope, i);
        let Some(tag) = crate::event::Tags::of(entry, layout).nth(index) else {
            return Opened::Damaged(format!("a subject tag index {index} beyond the tags"));
        };
        *slot = tag;
    }
    let clear_end = layout.metadata_start as usize;
    let cipher = match ciphers.cipher(&tags[..n]) {
        Ok(cipher) => cipher,
        Err(Unopenable::Erased) => {
            return Opened::Erased(rebuild_lengths(entry[..clear_end].to_vec(), 0, 0))
        }
        Err(Unopenable::Missing(tag)) => {
            return Opened::Damaged(format!("no key for the subject {tag}, and no erasure"))
        }
    };
    let nonce = &envelope[header..header + NONCE_BYTES];
    let (sealed, tag) = envelope[header + NONCE_BYTES..]
        .split_at(envelope.len() - header - NONCE_BYTES - TAG_BYTES);
    // The plaintext begins with the metadata's 4-byte length, which the opened entry does
    // not keep: it is decrypted over the clear part's last 4 bytes, which are put back, so
    // that the buffer is allocated once at its final size (and becomes the event's bytes
    // without another allocation).
    debug_assert!(clear_end >= ENTRY_FIXED_BYTES && sealed.len() >= 4);
    let len = clear_end + sealed.len() - 4;
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&entry[..clear_end]);
    out.resize(len, 0);
    let kept: [u8; 4] = entry[clear_end - 4..clear_end].try_into().expect("4 bytes");
    let aad = &entry[ENTRY_FIXED_BYTES..clear_end + header];
    let nonce: &[u8; NONCE_BYTES] = nonce.try_into().expect("12 bytes");
    let tag: &[u8; TAG_BYTES] = tag.try_into().expect("16 bytes");
    let opened = cipher.open(nonce, aad, sealed, tag, &mut out[clear_end - 4..]);
    if opened.is_err() {
        return Opened::Damaged("the envelope does not authenticate under its keys".into());
    }
    let metadata_len =
        u32::from_le_bytes(out[clear_end - 4..clear_end].try_into().expect("4 bytes")) as usize;
    out[clear_end - 4..clear_end].copy_from_slice(&kept);
    if metadata_len > sealed.len() - 4 {
        out.zeroize();
        return Opened::Damaged("a metadata length beyond the envelope".into());
    }
    debug_assert_eq!(out.len(), out.capacity());
    let data_len = out.len() - clear_end - metadata_len;
    Opened::Clear(rebuild_lengths(out, metadata_len, data_len))
}

/// `out` (an entry's clear part followed by its metadata and data) with its lengths set and
/// its sealed flag cleared.
fn rebuild_lengths(mut out: Vec<u8>, metadata_len: usize, data_len: usize) -> Vec<u8> {
    let len = out.len() as u32;
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[12..16].copy_from_slice(&(data_len as u32).to_le_bytes());
    out[16..20].copy_from_slice(&(metadata_len as u32).to_le_bytes());
    out[20] &= !FLAG_SEALED;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NewEvent;
    use crate::limits::Limits;
    use crate::record::encode_append_tracked;
    use std::collections::HashMap;
    use std::sync::Mutex;

    struct Keys(Mutex<HashMap<String, Option<SubjectKey>>>);

    impl KeySource for Keys {
        fn keys_for(&self, tags: &[&str]) -> Result<Vec<GivenKey>, SealError> {
            let mut map = self.0.lock().unwrap();
            tags.iter()
                .map(|t| {
                    match map
                        .entry(t.to_string())
                        .or_insert_with(|| Some(SubjectKey::generate().unwrap()))
                    {
                        Some(k) => Ok((k.clone(), None)),
                        None => Err(SealError::Erased(t.to_string())),
                    }
                })
                .collect()
        }
    }

    impl Keys {
        fn state(&self, tag: &str) -> KeyState {
            match self.0.lock().unwrap().get(tag) {
                Some(Some(k)) => KeyState::Live(k.clone()),
                Some(None) => KeyState::Erased,
                None => KeyState::Missing,
            }
        }
    }

    /// The ciphers of a test's keys (or of none), made for each event.
    struct Open<'a>(Option<&'a Keys>, Option<Aes256>);

    impl Ciphers for Open<'_> {
        fn cipher(&mut self, tags: &[&str]) -> Result<&Aes256, Unopenable> {
            let keys = self.0;
            let key = cipher_key(
                tags.iter()
                    .map(|&t| (t, keys.map_or(KeyState::Missing, |k| k.state(t)))),
            )?;
            Ok(self.1.insert(key.cipher()))
        }
    }

    fn subjects() -> SubjectOptions {
        SubjectOptions::new(["customer:"], MasterKey::generate().unwrap())
    }

    fn opened(body: &[u8], count: u32, keys: &Keys) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
        Entries::new(body, count)
            .map(|(_, entry, layout)| {
                if !layout.sealed {
                    return (
                        entry[layout.metadata_range()].to_vec(),
                        entry[layout.data_range()].to_vec(),
                        false,
                    );
                }
                match open_entry(entry, &layout, &mut Open(Some(keys), None)) {
                    Opened::Clear(e) => {
                        let l = EntryLayout::parse(&e).unwrap();
                        assert!(!l.sealed);
                        (
                            e[l.metadata_range()].to_vec(),
                            e[l.data_range()].to_vec(),
                            false,
                        )
                    }
                    Opened::Erased(e) => {
                        let l = EntryLayout::parse(&e).unwrap();
                        assert_eq!(l.data_range().len() + l.metadata_range().len(), 0);
                        (vec![], vec![], true)
                    }
                    Opened::Damaged(why) => panic!("{why}"),
                }
            })
            .collect()
    }

    /// Goal: sealing an append hides the subjects' data in its bytes and keeps its tracking; its
    /// entries open back to their data and metadata; erasing either subject of an event hides it
    /// while other events stay readable; and an append naming an erased subject is refused.
    #[test]
    fn sealed_entries_open_to_their_data_and_erasure_of_either_subject_hides_it() {
        let s = subjects();
        let keys = Keys(Mutex::new(HashMap::new()));
        let events = vec![
            NewEvent::new("Plain", "order data").tag("order:1"),
            NewEvent::new("Moved", "secret address")
                .tag("order:1")
                .tag("customer:7")
                .metadata("meta"),
            NewEvent::new("Married", "two people").tags(["customer:7", "customer:8"]),
        ];
        let append = encode_append_tracked(&events, Some(("src", 3)), &Limits::default()).unwrap();
        let sealed = seal_append(append, &s, &keys, false).unwrap();
        assert_eq!(sealed.tracking(), Some(("src", 3)));
        assert!(!sealed.body.windows(6).any(|w| w == b"secret"));
        assert!(!sealed.body.windows(3).any(|w| w == b"two"));
        assert_eq!(sealed.body_crc, crc32c::crc32c(&sealed.body));
        let entries = sealed.entries().to_vec();
        let out = opened(&entries, 3, &keys);
        assert_eq!(out[0], (vec![], b"order data".to_vec(), false));
        assert_eq!(
            out[1],
            (b"meta".to_vec(), b"secret address".to_vec(), false)
        );
        assert_eq!(out[2], (vec![], b"two people".to_vec(), false));
        // Erase customer:8: the event of both is unreadable, the other stays readable.
        keys.0.lock().unwrap().insert("customer:8".into(), None);
        let out = opened(&entries, 3, &keys);
        assert!(!out[1].2);
        assert!(out[2].2);
        // An append naming it is refused.
        let again = encode_append_tracked(&events[2..], None, &Limits::default()).unwrap();
        assert!(matches!(
            seal_append(again, &s, &keys, false),
            Err(SealError::Erased(_))
        ));
    }

    /// Goal: a sealed entry whose bytes were changed, or opened without its key, is reported as
    /// damage and never returned as data.
    #[test]
    fn a_tampered_envelope_or_a_wrong_key_is_damage_not_data() {
        let s = subjects();
        let keys = Keys(Mutex::new(HashMap::new()));
        let events = vec![NewEvent::new("Moved", "secret").tag("customer:7")];
        let append = encode_append_tracked(&events, None, &Limits::default()).unwrap();
        let mut body = seal_append(append, &s, &keys, false).unwrap().body;
        let last = body.len() - 1;
        body[last] ^= 1;
        let (_, entry, layout) = Entries::new(&body, 1).next().unwrap();
        assert!(matches!(
            open_entry(entry, &layout, &mut Open(Some(&keys), None)),
            Opened::Damaged(_)
        ));
        assert!(matches!(
            open_entry(entry, &layout, &mut Open(None, None)),
            Opened::Damaged(_)
        ));
    }

    /// Goal: a subject's key wrapped under the master key unwraps only with that master key and for
    /// that subject, and the master key's check tells the right key from another.
    #[test]
    fn keys_wrap_under_the_master_key_only() {
        let master = MasterKey::generate().unwrap();
        let other = MasterKey::generate().unwrap();
        let key = SubjectKey::generate().unwrap();
        let wrapped = wrap_key(&master, "customer:1", &key).unwrap();
        assert_eq!(wrapped.len(), WRAPPED_KEY_BYTES);
        assert_eq!(
            unwrap_key(&master, "customer:1", &wrapped)
                .unwrap()
                .clone_bytes(),
            key.clone_bytes()
        );
        assert!(unwrap_key(&other, "customer:1", &wrapped).is_none());
        assert!(unwrap_key(&master, "customer:2", &wrapped).is_none());
        let check = master_check(&master).unwrap();
        assert!(master_matches(&master, &check));
        assert!(!master_matches(&other, &check));
    }

    /// Goal: a client cannot append an erasure receipt, while the store's own receipt is appended
    /// unsealed, in the clear.
    #[test]
    fn a_clients_receipt_is_refused_and_the_stores_own_stays_clear() {
        let s = subjects();
        let keys = Keys(Mutex::new(HashMap::new()));
        let events = vec![NewEvent::new(SUBJECT_ERASED_TYPE, "{}").tag("customer:7")];
        let append = encode_append_tracked(&events, None, &Limits::default()).unwrap();
        assert!(matches!(
            seal_append(append, &s, &keys, false),
            Err(SealError::Input(InputError::ReservedType { .. }))
        ));
        let append = encode_append_tracked(&events, None, &Limits::default()).unwrap();
        let body = seal_append(append, &s, &keys, true).unwrap().body;
        assert!(body.windows(2).any(|w| w == b"{}"));
    }
}
