//! Data subjects: the tag prefixes that name a person whose data can be erased, and the master
//! key that encrypts their keys. The events that carry a subject's tag are stored encrypted
//! (`seal.rs`), under keys kept beside the log (`keys.rs`); erasing a subject deletes its key.

use std::fmt;

use zeroize::Zeroize;

/// The type of the receipt an erasure appends: tagged with the subject, it carries no
/// personal data, only how many events the erasure made unreadable.
pub const SUBJECT_ERASED_TYPE: &str = "annals.SubjectErased";

/// 32 random bytes from the operating system's generator, for a key.
pub(crate) fn random_key() -> Result<[u8; 32], String> {
    use aes_gcm::aead::{Generate, Key};
    let key = Key::<aes_gcm::Aes256Gcm>::try_generate()
        .map_err(|e| format!("the operating system's random generator failed: {e}"))?;
    Ok(key.into())
}

/// 256 bits that encrypt the subjects' keys where they are stored: without it, a copy of the
/// data directory (or of the database) shows no personal data. Never printed: its `Debug`
/// hides it, and it is wiped from memory when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct MasterKey([u8; 32]);

impl MasterKey {
    /// A master key from 64 hexadecimal characters (surrounding whitespace ignored), as
    /// `annals master-key new` prints one and a master key file holds it.
    pub fn from_hex(text: &str) -> Result<MasterKey, String> {
        let text = text.trim();
        if text.len() != 64 {
            return Err(format!(
                "a master key is 64 hexadecimal characters (256 bits); this one has {}",
                text.chars().count()
            ));
        }
        let mut key = [0u8; 32];
        for (i, pair) in text.as_bytes().chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair).ok();
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) => key[i] = b,
                None => {
                    key.zeroize();
                    return Err("a master key holds only hexadecimal characters (0-9, a-f)".into());
                }
            }
        }
        Ok(MasterKey(key))
    }

    /// A fresh random master key, from the operating system's generator.
    pub fn generate() -> Result<MasterKey, String> {
        Ok(MasterKey(random_key()?))
    }

    /// The key as 64 lowercase hexadecimal characters (for `annals master-key new` only).
    pub fn to_hex(&self) -> String {
        let mut out = String::with_capacity(64);
        for b in &self.0 {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(hidden)")
    }
}

impl Drop for MasterKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// Whether `tag` begins with one of `prefixes` and has more after it (see
/// [`SubjectOptions::is_subject`]).
pub(crate) fn names_subject(prefixes: &[String], tag: &str) -> bool {
    prefixes
        .iter()
        .any(|p| tag.len() > p.len() && tag.starts_with(p.as_str()))
}

/// Which tags name data subjects, and the master key (see `Options::subjects`).
#[derive(Debug, Clone)]
pub struct SubjectOptions {
    /// Tag prefixes such as `customer:`: an event carrying a tag that begins with one of them
    /// has its data and metadata encrypted under that subject's key. Tags themselves stay in
    /// the clear (indexes and conditions need them): make subject tags opaque ids.
    pub tag_prefixes: Vec<String>,
    pub master_key: MasterKey,
}

impl SubjectOptions {
    pub fn new<I, S>(tag_prefixes: I, master_key: MasterKey) -> SubjectOptions
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SubjectOptions {
            tag_prefixes: tag_prefixes.into_iter().map(Into::into).collect(),
            master_key,
        }
    }

    /// Whether `tag` names a data subject: it begins with a configured prefix and has more
    /// after it.
    pub fn is_subject(&self, tag: &str) -> bool {
        names_subject(&self.tag_prefixes, tag)
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.tag_prefixes.is_empty() {
            return Err("subjects: name at least one tag prefix (such as customer:)".into());
        }
        for p in &self.tag_prefixes {
            if p.is_empty() || p.chars().any(char::is_control) {
                return Err(format!(
                    "subjects: the tag prefix {p:?} is empty or holds a control character"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a master key reads back from its hexadecimal form, surrounding space allowed, never
    /// shows in debug output, and a key of the wrong length or with other characters is refused
    /// with the reason.
    #[test]
    fn a_master_key_reads_back_from_its_hex_and_hides_itself() {
        let key = MasterKey::generate().unwrap();
        let hex = key.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(MasterKey::from_hex(&format!(" {hex}\n")).unwrap(), key);
        assert!(!format!("{key:?}").contains(&hex[..8]));
        assert!(MasterKey::from_hex("abc").unwrap_err().contains("64"));
        let bad = "g".repeat(64);
        assert!(MasterKey::from_hex(&bad)
            .unwrap_err()
            .contains("hexadecimal"));
    }

    /// Goal: a tag names a subject when it begins with one of the subject prefixes and has more
    /// after it, and subject options without a prefix are refused.
    #[test]
    fn a_subject_tag_begins_with_a_prefix_and_has_more() {
        let s = SubjectOptions::new(["customer:", "employee:"], MasterKey([7; 32]));
        assert!(s.is_subject("customer:42"));
        assert!(s.is_subject("employee:x"));
        assert!(!s.is_subject("customer:"));
        assert!(!s.is_subject("order:1"));
        assert!(
            SubjectOptions::new(Vec::<String>::new(), MasterKey([7; 32]))
                .validate()
                .is_err()
        );
    }
}
