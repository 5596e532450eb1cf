//! Unsigned integers in JSON, as JSON means them: `190` and `190.0` are the same number (JSON
//! Schema's `integer` includes both), so a field typed as an integer takes either. A fraction,
//! a negative number or one out of range is refused with serde's own message.

use serde::de::{Deserializer, Error, Visitor};

struct Unsigned(u64);

impl<'de> Visitor<'de> for Unsigned {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "an unsigned integer of at most {}", self.0)
    }

    fn visit_u64<E: Error>(self, v: u64) -> Result<u64, E> {
        if v > self.0 {
            return Err(E::invalid_value(serde::de::Unexpected::Unsigned(v), &self));
        }
        Ok(v)
    }

    fn visit_i64<E: Error>(self, v: i64) -> Result<u64, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(v), &self)),
        }
    }

    fn visit_f64<E: Error>(self, v: f64) -> Result<u64, E> {
        // 2^64 is the first float beyond u64; every integral float below it is exact.
        if v.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&v) {
            self.visit_u64(v as u64)
        } else {
            Err(E::invalid_value(serde::de::Unexpected::Float(v), &self))
        }
    }
}

/// A `u64` field written as an integer or an integral float.
pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(Unsigned(u64::MAX))
}

/// A `u32` field written as an integer or an integral float.
pub fn u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    d.deserialize_any(Unsigned(u32::MAX as u64))
        .map(|v| v as u32)
}

/// An optional `u64` field (absent or null is `None`).
pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Maybe;
    impl<'de> Visitor<'de> for Maybe {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an unsigned integer or null")
        }
        fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            u64(d).map(Some)
        }
    }
    d.deserialize_option(Maybe)
}

/// An optional `u32` field (absent or null is `None`).
pub fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    opt_u64(d)?
        .map(|v| {
            u32::try_from(v).map_err(|_| D::Error::custom(format!("{v} is over {}", u32::MAX)))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize, Debug)]
    struct T {
        #[serde(deserialize_with = "super::u64")]
        n: u64,
        #[serde(default, deserialize_with = "super::opt_u64")]
        m: Option<u64>,
    }

    /// Goal: integral floats are the integers they equal; fractions, negatives and numbers out
    /// of range are refused; an optional field may be absent or null.
    #[test]
    fn integral_floats_are_integers() {
        let t: T = serde_json::from_str(r#"{"n":190.0,"m":7}"#).unwrap();
        assert_eq!((t.n, t.m), (190, Some(7)));
        let t: T = serde_json::from_str(r#"{"n":18446744073709551615,"m":null}"#).unwrap();
        assert_eq!((t.n, t.m), (u64::MAX, None));
        let t: T = serde_json::from_str(r#"{"n":1e3}"#).unwrap();
        assert_eq!((t.n, t.m), (1000, None));
        for bad in [
            r#"{"n":1.5}"#,
            r#"{"n":-1}"#,
            r#"{"n":-0.5}"#,
            r#"{"n":1e20}"#,
            r#"{"n":"1"}"#,
        ] {
            assert!(serde_json::from_str::<T>(bad).is_err(), "{bad}");
        }
    }
}
