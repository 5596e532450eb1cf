//! Little-endian byte encoding shared by the journal's events and the engine's snapshots:
//! one-byte codes for the enums, and a reader that never panics and never trusts a length.

use crate::types::*;

pub(crate) fn side_code(side: Side) -> u8 {
    match side {
        Side::Buy => 0,
        Side::Sell => 1,
    }
}

pub(crate) fn side_from(code: u8) -> Option<Side> {
    match code {
        0 => Some(Side::Buy),
        1 => Some(Side::Sell),
        _ => None,
    }
}

pub(crate) fn kind_code(kind: Kind) -> u8 {
    match kind {
        Kind::Limit => 0,
        Kind::Market => 1,
        Kind::Ioc => 2,
        Kind::Fok => 3,
        Kind::PostOnly => 4,
    }
}

pub(crate) fn kind_from(code: u8) -> Option<Kind> {
    Some(match code {
        0 => Kind::Limit,
        1 => Kind::Market,
        2 => Kind::Ioc,
        3 => Kind::Fok,
        4 => Kind::PostOnly,
        _ => return None,
    })
}

pub(crate) fn stp_code(stp: Stp) -> u8 {
    match stp {
        Stp::Allow => 0,
        Stp::CancelNewest => 1,
        Stp::CancelOldest => 2,
        Stp::CancelBoth => 3,
        Stp::Decrement => 4,
    }
}

pub(crate) fn stp_from(code: u8) -> Option<Stp> {
    Some(match code {
        0 => Stp::Allow,
        1 => Stp::CancelNewest,
        2 => Stp::CancelOldest,
        3 => Stp::CancelBoth,
        4 => Stp::Decrement,
        _ => return None,
    })
}

pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Bytes of a journaled event or a snapshot that do not decode: what is wrong, for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// Reads fields in order; every read checks the remaining length.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        if self.bytes.len() < N {
            return Err(format!(
                "truncated: {N} bytes wanted, {} left",
                self.bytes.len()
            ));
        }
        let (head, rest) = self.bytes.split_at(N);
        self.bytes = rest;
        Ok(head.try_into().expect("split at N"))
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    /// A count of items that each take at least `min_bytes`: refused when the rest could not
    /// hold that many, so a damaged count never drives a huge allocation.
    pub(crate) fn count(&mut self, min_bytes: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_bytes.max(1)) > self.bytes.len() {
            return Err(format!("a count of {n} exceeds what the rest can hold"));
        }
        Ok(n)
    }

    pub(crate) fn side(&mut self) -> Result<Side, String> {
        let code = self.u8()?;
        side_from(code).ok_or_else(|| format!("unknown side code {code}"))
    }

    pub(crate) fn kind(&mut self) -> Result<Kind, String> {
        let code = self.u8()?;
        kind_from(code).ok_or_else(|| format!("unknown order kind code {code}"))
    }

    pub(crate) fn stp(&mut self) -> Result<Stp, String> {
        let code = self.u8()?;
        stp_from(code).ok_or_else(|| format!("unknown self-trade mode code {code}"))
    }

    pub(crate) fn finish(self) -> Result<(), String> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected bytes at the end", self.bytes.len()))
        }
    }
}
