//! The key file's format: its header, its records, and reading it back.
//!
//! ```text
//! header: magic "ANNKEYS1", version u32 (2; 1 is read too), epoch u64 (rewrites so far:
//!         each erasure begins a new one), check_len u32, check (16 zero bytes sealed under
//!         the master key: proves a master key is the store's); from version 2: the wrapping
//!         key's id u64 and the wrapping key wrapped under the master key (60 bytes)
//! records, back to back: len u32 (of what follows the crc), crc32c u32, kind u8,
//!         tag_len u16, tag, then by kind:
//!         1 (a key): the key wrapped under the master key (60 bytes)
//!         2 (erased): the erasure's time u64 (microseconds since the epoch)
//!         3 (covered, empty tag): a position u64; every grant in the log through it under
//!           the wrapping key is in the file (the highest such record counts)
//! ```
//!
//! A version 1 file has no wrapping key: no grant was made under it, and the store writes
//! it anew as version 2 when it opens.

use std::collections::HashMap;
use std::path::Path;

use super::{subjects_error, KeyMap, Live, Slot};
use crate::error::StoreError;
use crate::seal::{master_check, master_matches, unwrap_key, WrapKey, WRAPPED_KEY_BYTES};
use crate::subject::MasterKey;

pub(crate) const KEYS_FILE: &str = "subjects.keys";
const MAGIC: &[u8; 8] = b"ANNKEYS1";
const VERSION: u32 = 2;
pub(super) const KIND_KEY: u8 = 1;
pub(super) const KIND_ERASED: u8 = 2;
pub(super) const KIND_COVERED: u8 = 3;

pub(super) fn encode_record(out: &mut Vec<u8>, kind: u8, tag: &str, payload: &[u8]) {
    let mut rest = Vec::with_capacity(3 + tag.len() + payload.len());
    rest.push(kind);
    rest.extend_from_slice(&(tag.len() as u16).to_le_bytes());
    rest.extend_from_slice(tag.as_bytes());
    rest.extend_from_slice(payload);
    out.extend_from_slice(&(rest.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&rest).to_le_bytes());
    out.extend_from_slice(&rest);
}

/// The header of a file in `epoch` with the wrapping key `wrap`, and a covered record for
/// `covered`.
pub(super) fn header(
    master: &MasterKey,
    epoch: u64,
    wrap: &WrapKey,
    covered: u64,
) -> Result<Vec<u8>, String> {
    let check = master_check(master)?;
    let wrapped = wrap.wrapped_under(master)?;
    let mut out = Vec::with_capacity(32 + check.len() + wrapped.len() + 24);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&(check.len() as u32).to_le_bytes());
    out.extend_from_slice(&check);
    out.extend_from_slice(&wrap.id().to_le_bytes());
    out.extend_from_slice(&wrapped);
    encode_record(&mut out, KIND_COVERED, "", &covered.to_le_bytes());
    Ok(out)
}

/// One decoded record: kind, tag, payload; None when short or failing its CRC.
fn decode_record(bytes: &[u8]) -> Option<(u8, &str, &[u8], usize)> {
    let len = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    let rest = bytes.get(8..8 + len)?;
    if crc32c::crc32c(rest) != crc || rest.len() < 3 {
        return None;
    }
    let tag_len = u16::from_le_bytes([rest[1], rest[2]]) as usize;
    let tag = std::str::from_utf8(rest.get(3..3 + tag_len)?).ok()?;
    Some((rest[0], tag, &rest[3 + tag_len..], 8 + len))
}

/// One record of a key file, at `at`, ending at `end`.
struct Record<'a> {
    at: usize,
    end: usize,
    kind: u8,
    tag: &'a str,
    payload: &'a [u8],
}

/// The records from `at` on, up to the first that is short or fails its CRC (a torn tail).
fn records(bytes: &[u8], mut at: usize) -> impl Iterator<Item = Record<'_>> {
    std::iter::from_fn(move || {
        let (kind, tag, payload, used) = decode_record(bytes.get(at..)?)?;
        let record = Record {
            at,
            end: at + used,
            kind,
            tag,
            payload,
        };
        at += used;
        Some(record)
    })
}

/// A key file's header read (without the master key).
struct Header<'a> {
    epoch: u64,
    check: &'a [u8],
    /// The wrapping key's id and its wrapped bytes (version 2).
    wrap: Option<(u64, &'a [u8])>,
    /// Where the records begin.
    len: usize,
}

fn parse_header(bytes: &[u8]) -> Result<Header<'_>, String> {
    if bytes.get(..8) != Some(MAGIC.as_slice()) {
        return Err("not a key file (its magic is wrong)".into());
    }
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let u64_at = |at: usize| {
        bytes
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let short = || "a key file cut short in its header".to_string();
    let version = u32_at(8).ok_or_else(short)?;
    if version != 1 && version != VERSION {
        return Err(format!(
            "key file version {version}; this build reads 1 and {VERSION}"
        ));
    }
    let epoch = u64_at(12).ok_or_else(short)?;
    let check_len = u32_at(20).ok_or_else(short)? as usize;
    let check = bytes.get(24..24 + check_len).ok_or_else(short)?;
    let mut len = 24 + check_len;
    let wrap = match version {
        1 => None,
        _ => {
            let id = u64_at(len).ok_or_else(short)?;
            let wrapped = bytes
                .get(len + 8..len + 8 + WRAPPED_KEY_BYTES)
                .ok_or_else(short)?;
            len += 8 + WRAPPED_KEY_BYTES;
            Some((id, wrapped))
        }
    };
    Ok(Header {
        epoch,
        check,
        wrap,
        len,
    })
}

/// What a key file names, read without the master key (tags are in the clear), for `annals
/// verify`: each subject with whether it was erased, and the wrapping key's id.
pub(crate) struct KeyTags {
    pub tags: HashMap<String, bool>,
    pub wrap_id: Option<u64>,
}

pub(crate) fn key_tags(bytes: &[u8]) -> Result<KeyTags, String> {
    let header = parse_header(bytes)?;
    let tags = records(bytes, header.len)
        .filter(|r| r.kind != KIND_COVERED)
        .map(|r| (r.tag.to_string(), r.kind == KIND_ERASED))
        .collect();
    Ok(KeyTags {
        tags,
        wrap_id: header.wrap.map(|(id, _)| id),
    })
}

/// A key file read back.
pub(super) struct KeyFile {
    /// How many of its bytes are valid (a torn record at the end is not).
    pub valid: usize,
    pub epoch: u64,
    /// None for a version 1 file.
    pub wrap: Option<WrapKey>,
    /// Through which position the log's grants are in the file (None: version 1, which has
    /// no grants).
    pub covered: Option<u64>,
}

/// Reads the file's keys into `keys` with the master key.
pub(super) fn load(
    path: &Path,
    bytes: &[u8],
    master: &MasterKey,
    keys: &mut KeyMap,
) -> Result<KeyFile, StoreError> {
    let header = parse_header(bytes).map_err(|e| subjects_error(path, e))?;
    if !master_matches(master, header.check) {
        return Err(subjects_error(
            path,
            "the master key given is not this store's (the store's keys were made under \
             another); start with the store's master key file",
        ));
    }
    let wrap = match header.wrap {
        None => None,
        Some((id, wrapped)) => Some(WrapKey::unwrap(master, id, wrapped).ok_or_else(|| {
            subjects_error(
                path,
                "the wrapping key does not unwrap under the master key",
            )
        })?),
    };
    let mut covered = wrap.as_ref().map(|_| 0);
    let mut valid = header.len;
    for record in records(bytes, header.len) {
        let (tag, payload) = (record.tag, record.payload);
        match record.kind {
            KIND_KEY if payload.len() == WRAPPED_KEY_BYTES => {
                let key = unwrap_key(master, tag, payload).ok_or_else(|| {
                    subjects_error(path, format!("the key of {tag} does not unwrap"))
                })?;
                keys.insert(tag.into(), Slot::Live(Live::kept(key, payload.into())));
            }
            KIND_ERASED if payload.len() == 8 => {
                let at_us = u64::from_le_bytes(payload.try_into().expect("8 bytes"));
                keys.insert(tag.into(), Slot::Erased(at_us));
            }
            KIND_COVERED if payload.len() == 8 && wrap.is_some() => {
                let through = u64::from_le_bytes(payload.try_into().expect("8 bytes"));
                covered = covered.max(Some(through));
            }
            kind => {
                return Err(subjects_error(
                    path,
                    format!(
                        "a record of kind {kind} for {tag:?} at offset {}",
                        record.at
                    ),
                ))
            }
        }
        valid = record.end;
    }
    Ok(KeyFile {
        valid,
        epoch: header.epoch,
        wrap,
        covered,
    })
}
