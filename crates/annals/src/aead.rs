//! AES-256-GCM, the one cipher of data subjects' events and keys (`seal.rs`): aws-lc's with the
//! `aws-lc` feature (the server and the command line turn it on; they link aws-lc already), and
//! RustCrypto's otherwise, so that a library user on segment files builds no C. Both are the
//! standard algorithm (NIST SP 800-38D, 96-bit nonces, 128-bit tags): a store sealed by one
//! opens with the other, which the tests below check byte for byte. aws-lc opens a 256-byte
//! event in about a third of RustCrypto's time on the machines of docs/PERFORMANCE.md.

/// The nonce's length.
pub(crate) const NONCE_BYTES: usize = 12;
/// The tag's length.
pub(crate) const TAG_BYTES: usize = 16;

/// The implementation this build seals and opens with, as benchmarks report it.
pub const CIPHER: &str = if cfg!(feature = "aws-lc") {
    "AES-256-GCM (aws-lc)"
} else {
    "AES-256-GCM (RustCrypto)"
};

/// A 256-bit key with its cipher ready (round keys and GHASH's tables computed once), from the
/// implementation this build uses.
#[cfg(feature = "aws-lc")]
pub(crate) use aws_lc::AwsLcAes256 as Aes256;
#[cfg(not(feature = "aws-lc"))]
pub(crate) use rustcrypto::RustCryptoAes256 as Aes256;

/// The cipher of the key used last, kept by one sealing pass: consecutive events under one key
/// (an append of one subject's events) set its round keys up once rather than per event.
#[derive(Default)]
pub(crate) struct CipherMemo(Option<(zeroize::Zeroizing<[u8; 32]>, Aes256)>);

impl CipherMemo {
    pub(crate) fn cipher(&mut self, key: &[u8; 32]) -> &Aes256 {
        let same = matches!(&self.0, Some((held, _)) if **held == *key);
        if !same {
            self.0 = Some((zeroize::Zeroizing::new(*key), Aes256::new(key)));
        }
        &self.0.as_ref().expect("set just above").1
    }
}

/// Sealing or opening failed: the bytes do not authenticate (or, sealing, the library refused
/// the lengths).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CipherFailed;

#[cfg(feature = "aws-lc")]
mod aws_lc {
    use super::{CipherFailed, NONCE_BYTES, TAG_BYTES};
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

    pub(crate) struct AwsLcAes256(LessSafeKey);

    impl AwsLcAes256 {
        pub(crate) fn new(key: &[u8; 32]) -> AwsLcAes256 {
            let key = UnboundKey::new(&AES_256_GCM, key).expect("32 bytes is an AES-256 key");
            AwsLcAes256(LessSafeKey::new(key))
        }

        /// Encrypts `in_out` in place under `nonce`, authenticating `aad` too; answers the tag.
        pub(crate) fn seal(
            &self,
            nonce: &[u8; NONCE_BYTES],
            aad: &[u8],
            in_out: &mut [u8],
        ) -> Result<[u8; TAG_BYTES], CipherFailed> {
            let nonce = Nonce::assume_unique_for_key(*nonce);
            let tag = self
                .0
                .seal_in_place_separate_tag(nonce, Aad::from(aad), in_out)
                .map_err(|_| CipherFailed)?;
            tag.as_ref().try_into().map_err(|_| CipherFailed)
        }

        /// Decrypts `sealed` into `out` (of the same length) when it and `aad` authenticate
        /// under `nonce` and `tag`; `out` is left zeroed otherwise.
        pub(crate) fn open(
            &self,
            nonce: &[u8; NONCE_BYTES],
            aad: &[u8],
            sealed: &[u8],
            tag: &[u8; TAG_BYTES],
            out: &mut [u8],
        ) -> Result<(), CipherFailed> {
            if sealed.len() != out.len() {
                return Err(CipherFailed);
            }
            let nonce = Nonce::assume_unique_for_key(*nonce);
            self.0
                .open_separate_gather(nonce, Aad::from(aad), sealed, tag, out)
                .map_err(|_| {
                    zeroize::Zeroize::zeroize(out);
                    CipherFailed
                })
        }
    }
}

/// RustCrypto's, the library's own when the `aws-lc` feature is off; compiled in either way so
/// that the tests hold the two to the same bytes.
#[cfg_attr(feature = "aws-lc", allow(dead_code))]
mod rustcrypto {
    use super::{CipherFailed, NONCE_BYTES, TAG_BYTES};
    use aes_gcm::aead::inout::InOutBuf;
    use aes_gcm::aead::{AeadInOut, KeyInit};

    pub(crate) struct RustCryptoAes256(aes_gcm::Aes256Gcm);

    impl RustCryptoAes256 {
        pub(crate) fn new(key: &[u8; 32]) -> RustCryptoAes256 {
            RustCryptoAes256(aes_gcm::Aes256Gcm::new(key.into()))
        }

        /// Encrypts `in_out` in place under `nonce`, authenticating `aad` too; answers the tag.
        pub(crate) fn seal(
            &self,
            nonce: &[u8; NONCE_BYTES],
            aad: &[u8],
            in_out: &mut [u8],
        ) -> Result<[u8; TAG_BYTES], CipherFailed> {
            let tag = self
                .0
                .encrypt_inout_detached(nonce.into(), aad, in_out.into())
                .map_err(|_| CipherFailed)?;
            Ok(tag.into())
        }

        /// Decrypts `sealed` into `out` (of the same length) when it and `aad` authenticate
        /// under `nonce` and `tag`; `out` is left zeroed otherwise.
        pub(crate) fn open(
            &self,
            nonce: &[u8; NONCE_BYTES],
            aad: &[u8],
            sealed: &[u8],
            tag: &[u8; TAG_BYTES],
            out: &mut [u8],
        ) -> Result<(), CipherFailed> {
            let buf = InOutBuf::new(sealed, out).map_err(|_| CipherFailed)?;
            self.0
                .decrypt_inout_detached(nonce.into(), aad, buf, tag.into())
                .map_err(|_| {
                    zeroize::Zeroize::zeroize(out);
                    CipherFailed
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: sealing and opening round-trip, and any change to the bytes, the associated data,
    /// the nonce or the tag is refused.
    #[test]
    fn sealed_bytes_open_and_any_change_is_refused() {
        let cipher = Aes256::new(&[7; 32]);
        let plain = b"a subject's address, 256 bytes or so".to_vec();
        let mut sealed = plain.clone();
        let tag = cipher.seal(&[3; 12], b"aad", &mut sealed).unwrap();
        assert_ne!(sealed, plain);
        let mut out = vec![0; sealed.len()];
        cipher
            .open(&[3; 12], b"aad", &sealed, &tag, &mut out)
            .unwrap();
        assert_eq!(out, plain);
        let mut flipped = sealed.clone();
        flipped[5] ^= 1;
        let mut bad_tag = tag;
        bad_tag[0] ^= 1;
        for (nonce, aad, bytes, tag) in [
            ([3; 12], &b"aad"[..], &flipped, tag),
            ([3; 12], &b"aaD"[..], &sealed, tag),
            ([4; 12], &b"aad"[..], &sealed, tag),
            ([3; 12], &b"aad"[..], &sealed, bad_tag),
        ] {
            let mut out = vec![1; sealed.len()];
            assert_eq!(
                cipher.open(&nonce, aad, bytes, &tag, &mut out),
                Err(CipherFailed)
            );
            assert!(
                out.iter().all(|&b| b == 0),
                "nothing of a refused opening is left"
            );
        }
        assert_eq!(
            Aes256::new(&[8; 32]).open(&[3; 12], b"aad", &sealed, &tag, &mut out),
            Err(CipherFailed)
        );
    }

    /// Goal: the two implementations are one algorithm: what aws-lc seals, RustCrypto opens,
    /// and the other way round, with the same ciphertext and tag (a store moves between builds
    /// with and without the feature).
    #[cfg(feature = "aws-lc")]
    #[test]
    fn aws_lc_and_rustcrypto_seal_the_same_bytes() {
        let key = [9u8; 32];
        let (ours, theirs) = (Aes256::new(&key), rustcrypto::RustCryptoAes256::new(&key));
        for len in [0usize, 1, 16, 255, 4096] {
            let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let (mut a, mut b) = (plain.clone(), plain.clone());
            let tag_a = ours.seal(&[5; 12], b"id type tags", &mut a).unwrap();
            let tag_b = theirs.seal(&[5; 12], b"id type tags", &mut b).unwrap();
            assert_eq!((&a, tag_a), (&b, tag_b));
            let (mut out_a, mut out_b) = (vec![0; len], vec![0; len]);
            ours.open(&[5; 12], b"id type tags", &b, &tag_b, &mut out_a)
                .unwrap();
            theirs
                .open(&[5; 12], b"id type tags", &a, &tag_a, &mut out_b)
                .unwrap();
            assert_eq!((out_a, out_b), (plain.clone(), plain));
        }
    }
}
