//! The HTTP API's JSON: request bodies, parameters and the encoding of events and errors.
//!
//! Events are written straight into the response buffer (no intermediate value per event);
//! event data in an append body is borrowed from the request bytes when it has no escapes.

use std::borrow::Cow;

use annals::{AppendCondition, Event, NewEvent, Query};
use base64::Engine;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use uuid::Uuid;

/// `POST /v1/append` body.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "AppendRequest")]
#[schemars(extend(
    "if" = { "required": ["tracking"], "properties": { "tracking": { "type": "object" } } },
    "then" = { "properties": { "events": { "minItems": 1 } } }
))]
#[serde(deny_unknown_fields)]
pub struct AppendBody<'a> {
    /// No events (and no tracking): nothing is appended, and the answer is position 0.
    #[serde(borrow)]
    pub events: Vec<WireEvent<'a>>,
    /// Fail the append if an event matching the query was appended after `after`.
    #[serde(default)]
    pub condition: Option<AppendCondition>,
    /// A consumer position recorded atomically with the events (at least one); it must
    /// exceed the one recorded for the source. null: none.
    #[serde(default)]
    pub tracking: Option<WireTracking>,
    /// The least class this append needs: "d3" (synced before the answer) or "d4" (also in
    /// object storage; needs a server with a backup, else 409 off_machine_unavailable). A
    /// class weaker than the server's gets the server's. null: the server's class.
    #[serde(default)]
    #[schemars(regex(pattern = "^[dD][0-4]$"))]
    pub durability: Option<String>,
}

/// A tracking position: where a consumer of another source stands.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Tracking")]
#[serde(deny_unknown_fields)]
pub struct WireTracking {
    #[schemars(schema_with = "annals::schema::name")]
    pub source: String,
    #[serde(deserialize_with = "annals::numbers::u64")]
    #[schemars(schema_with = "annals::schema::unsigned")]
    pub position: u64,
}

/// One event in an append body.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "NewEvent")]
// With "dataEncoding": "base64", data is standard base64 with padding (what the server checks).
// With "metadataEncoding": "base64", metadata is such a string.
#[schemars(extend("allOf" = [
    {
        "if": { "required": ["dataEncoding"], "properties": { "dataEncoding": { "const": "base64" } } },
        "then": { "properties": { "data": {
            "contentEncoding": "base64",
            "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
        } } }
    },
    {
        "if": { "required": ["metadataEncoding"], "properties": { "metadataEncoding": { "const": "base64" } } },
        "then": { "properties": { "metadata": {
            "type": "string",
            "contentEncoding": "base64",
            "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
        } } }
    }
]))]
#[serde(deny_unknown_fields)]
pub struct WireEvent<'a> {
    #[serde(rename = "type", borrow)]
    #[schemars(schema_with = "annals::schema::name")]
    pub event_type: Cow<'a, str>,
    #[serde(default)]
    #[schemars(schema_with = "annals::schema::names")]
    pub tags: Vec<String>,
    /// Stored as its UTF-8 bytes, or as the bytes it decodes to when `dataEncoding` is
    /// "base64".
    #[serde(borrow)]
    pub data: Cow<'a, str>,
    /// How `data` stands for the bytes stored: "utf8" (the default) or "base64", as reads
    /// send data that is not UTF-8, so that what a client reads it can append again.
    #[serde(default, rename = "dataEncoding")]
    pub data_encoding: Option<DataEncoding>,
    /// How `metadata` stands for the bytes stored: as its JSON text (the default, "utf8"), or,
    /// with "base64", as the bytes its string decodes to (reads send metadata that is not
    /// JSON so).
    #[serde(default, rename = "metadataEncoding")]
    pub metadata_encoding: Option<DataEncoding>,
    /// Not a key: events with the same id may be stored. When a conditional append fails and
    /// the first events matching its condition after `after` carry exactly the append's ids in
    /// order, the append is a retry and answers their last position. The nil UUID means no id.
    #[serde(default)]
    pub id: Option<Uuid>,
    /// Any JSON value (nested at most 32 deep), stored as its text.
    #[serde(default, borrow)]
    #[schemars(with = "serde_json::Value")]
    pub metadata: Option<&'a RawValue>,
}

/// Standard base64 with padding, as reads write it; unused bits of the last symbol are
/// ignored rather than refused, as the document's pattern for the field allows them.
pub(crate) const BASE64_IN: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// How an event's `data` string stands for its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DataEncoding {
    /// The string's UTF-8 bytes.
    Utf8,
    /// The bytes the string decodes to as standard base64 (with padding).
    Base64,
}

impl WireEvent<'_> {
    /// The event to append; `body` is the request body the strings were parsed from, so data
    /// without escapes is shared rather than copied. Data that does not decode under its
    /// `dataEncoding` is refused with a message for people.
    pub fn into_new_event(self, body: &Bytes) -> Result<NewEvent, String> {
        let data = match self.data_encoding {
            None | Some(DataEncoding::Utf8) => share_or_own(self.data, body),
            Some(DataEncoding::Base64) => Bytes::from(
                BASE64_IN
                    .decode(self.data.as_bytes())
                    .map_err(|e| format!("data is not base64, as its dataEncoding says: {e}"))?,
            ),
        };
        let metadata = match (self.metadata, self.metadata_encoding) {
            (None, _) => Bytes::new(),
            (Some(m), None | Some(DataEncoding::Utf8)) => body.slice_ref(m.get().as_bytes()),
            (Some(m), Some(DataEncoding::Base64)) => {
                let text: Cow<'_, str> = serde_json::from_str(m.get()).map_err(|_| {
                    "metadata with metadataEncoding base64 must be a string".to_string()
                })?;
                Bytes::from(BASE64_IN.decode(text.as_bytes()).map_err(|e| {
                    format!("metadata is not base64, as its metadataEncoding says: {e}")
                })?)
            }
        };
        Ok(NewEvent {
            event_type: self.event_type.into_owned(),
            tags: self.tags,
            data,
            metadata,
            id: self.id,
        })
    }
}

/// How deeply arrays and objects may nest in an event's metadata: it is served back inside
/// every read answer, where a deeper value would break clients' JSON parsers.
pub const METADATA_DEPTH_MAX: usize = 32;

/// The deepest nesting of arrays and objects in valid JSON text.
pub fn json_depth(text: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in text {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn share_or_own(text: Cow<'_, str>, body: &Bytes) -> Bytes {
    match text {
        Cow::Borrowed(s) => body.slice_ref(s.as_bytes()),
        Cow::Owned(s) => Bytes::from(s.into_bytes()),
    }
}

/// A client error: the HTTP status, a machine-readable kind and a message for people.
#[derive(Debug)]
pub struct ApiError {
    pub status: http::StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// Each event's faults against its schema, when those are why.
    pub violations: Vec<crate::answers::Violation>,
}

impl ApiError {
    pub fn new(status: http::StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            violations: Vec::new(),
        }
    }

    pub fn with_violations(mut self, violations: Vec<crate::answers::Violation>) -> Self {
        self.violations = violations;
        self
    }

    pub fn bad_request(kind: &'static str, message: impl Into<String>) -> Self {
        Self::new(http::StatusCode::BAD_REQUEST, kind, message)
    }

    pub fn body(&self) -> String {
        let answer = crate::answers::Error {
            error: self.message.clone(),
            kind: self.kind.to_string(),
            violations: self.violations.clone(),
        };
        serde_json::to_string(&answer).expect("an error serializes")
    }
}

/// Parses a JSON parameter (`query` or `options`) with a message that names it.
pub fn parse_param<'a, T: Deserialize<'a>>(name: &str, text: &'a str) -> Result<T, ApiError> {
    serde_json::from_str(text)
        .map_err(|e| ApiError::bad_request("invalid_parameter", format!("parameter `{name}`: {e}")))
}

pub fn parse_query(text: Option<&str>) -> Result<Query, ApiError> {
    match text {
        None => Ok(Query::all()),
        Some(t) if t.trim().is_empty() => Ok(Query::all()),
        Some(t) => parse_param("query", t),
    }
}

/// Appends one event as a JSON object: `{"type","tags","data","position"}`, then `id`,
/// `metadata` and `appendedAt` (microseconds since the epoch) when present. Data that is not
/// UTF-8 (possible through gRPC or the embedded API) is sent as base64 with
/// `"dataEncoding":"base64"`.
pub fn write_event(out: &mut Vec<u8>, event: &Event) {
    write_event_checked(out, event, None);
}

/// [`write_event`], with `"schema":{"version","enforcement"}` before `appendedAt` when the
/// event was checked against a version of its type's schema when it was appended.
pub fn write_event_checked(
    out: &mut Vec<u8>,
    event: &Event,
    schema: Option<annals::registry::CheckedAgainst>,
) {
    out.extend_from_slice(b"{\"type\":");
    write_str(out, event.event_type());
    out.extend_from_slice(b",\"tags\":[");
    for (i, tag) in event.tags().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, tag);
    }
    out.extend_from_slice(b"],\"data\":");
    let base64_data = !write_bytes_as_str(out, event.data());
    if base64_data {
        out.push(b'"');
        out.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(event.data())
                .as_bytes(),
        );
        out.push(b'"');
    }
    out.extend_from_slice(b",\"position\":");
    write_u64(out, event.position());
    if event.is_erased() {
        out.extend_from_slice(b",\"erased\":true");
    }
    if base64_data {
        out.extend_from_slice(b",\"dataEncoding\":\"base64\"");
    }
    if let Some(id) = event.id() {
        out.extend_from_slice(b",\"id\":\"");
        out.extend_from_slice(
            id.hyphenated()
                .encode_lower(&mut Uuid::encode_buffer())
                .as_bytes(),
        );
        out.push(b'"');
    }
    let metadata = event.metadata();
    if !metadata.is_empty() {
        out.extend_from_slice(b",\"metadata\":");
        write_metadata(out, metadata);
    }
    if let Some(schema) = schema {
        out.extend_from_slice(b",\"schema\":{\"version\":");
        write_u64(out, u64::from(schema.version));
        let enforcement: &[u8] = match schema.enforcement {
            annals::registry::Enforcement::Warn => b",\"enforcement\":\"warn\"}",
            _ => b",\"enforcement\":\"reject\"}",
        };
        out.extend_from_slice(enforcement);
    }
    out.extend_from_slice(b",\"appendedAt\":");
    write_u64(out, event.appended_at_us());
    out.push(b'}');
}

/// Metadata is stored as JSON text by the HTTP and gRPC APIs, and sent as it is; anything else
/// (possible through the embedded API) is sent as a base64 string followed by
/// `"metadataEncoding":"base64"`, so that an append of what was read stores the same bytes.
pub fn write_metadata(out: &mut Vec<u8>, metadata: &[u8]) {
    if serde_json::from_slice::<serde::de::IgnoredAny>(metadata).is_ok() {
        out.extend_from_slice(metadata);
    } else {
        out.push(b'"');
        out.extend_from_slice(BASE64_IN.encode(metadata).as_bytes());
        out.extend_from_slice(b"\",\"metadataEncoding\":\"base64\"");
    }
}

/// Metadata given as key/value pairs (gRPC) is stored as the text of a JSON object, in order.
pub fn metadata_from_entries<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.push(b'{');
    for (i, (key, value)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(&mut out, key);
        out.push(b':');
        write_str(&mut out, value);
    }
    out.push(b'}');
    Bytes::from(out)
}

/// Stored metadata as key/value pairs (gRPC): the members of a JSON object, string values as
/// they are and other values as JSON text; anything else as one `metadata` entry.
pub fn metadata_entries(metadata: &[u8]) -> Vec<(String, String)> {
    if metadata.is_empty() {
        return Vec::new();
    }
    // Parsed in document order; duplicate keys are kept.
    struct Pairs(Vec<(String, String)>);
    impl<'de> Deserialize<'de> for Pairs {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Pairs;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Pairs, A::Error> {
                    let mut pairs = Vec::new();
                    while let Some((key, value)) = map.next_entry::<String, serde_json::Value>()? {
                        let value = match value {
                            serde_json::Value::String(s) => s,
                            other => other.to_string(),
                        };
                        pairs.push((key, value));
                    }
                    Ok(Pairs(pairs))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    match serde_json::from_slice::<Pairs>(metadata) {
        Ok(Pairs(pairs)) => pairs,
        Err(_) => vec![(
            "metadata".to_string(),
            String::from_utf8_lossy(metadata).into_owned(),
        )],
    }
}

pub fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Writes `s` as a JSON string.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    let written = write_json_string(out, s.as_bytes(), false);
    debug_assert!(written, "a str is UTF-8");
}

/// Writes `bytes` as a JSON string if they are UTF-8 and returns true; otherwise leaves `out`
/// as it was and returns false. One pass both checks and escapes: two passes (`str::from_utf8`,
/// then the escaping scan) were a tenth of a server's CPU for selective reads
/// (docs/DECISIONS.md, R14).
pub fn write_bytes_as_str(out: &mut Vec<u8>, bytes: &[u8]) -> bool {
    write_json_string(out, bytes, true)
}

fn write_json_string(out: &mut Vec<u8>, bytes: &[u8], validate: bool) -> bool {
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let began = out.len();
    out.push(b'"');
    out.reserve(bytes.len() + 1);
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Event data and tags rarely need escaping: skip eight plain ASCII bytes at a time.
        if let Some(word) = bytes.get(i..i + 8) {
            let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
            if !needs_escape(word) && (!validate || word & HIGHS == 0) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => {
                out.extend_from_slice(&bytes[start..i]);
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[(b >> 4) as usize],
                    HEX[(b & 15) as usize],
                ]);
                i += 1;
                start = i;
                continue;
            }
            0x80.. if validate => {
                // A UTF-8 sequence holds no ASCII byte, so the text is UTF-8 exactly when
                // every run of non-ASCII bytes is.
                let run = bytes[i..].iter().take_while(|&&b| b >= 0x80).count();
                if std::str::from_utf8(&bytes[i..i + run]).is_err() {
                    out.truncate(began);
                    return false;
                }
                i += run;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escape);
        i += 1;
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
    true
}

/// Whether any of the eight bytes in `word` is a control character, `"` or `\`.
fn needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte below 0x20 (or 0x80 and above, whose high bit `!word` clears again).
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    let zero_in = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    control | zero_in(word ^ (ONES * u64::from(b'"'))) | zero_in(word ^ (ONES * u64::from(b'\\')))
        != 0
}

#[cfg(test)]
mod depth_tests {
    use super::json_depth;

    /// Goal: nesting is counted through arrays and objects, and brackets inside strings
    /// (escaped quotes included) are not.
    #[test]
    fn nesting_is_counted_outside_strings() {
        assert_eq!(json_depth(b"1"), 0);
        assert_eq!(json_depth(br#"{"a":[1,{"b":2}]}"#), 3);
        assert_eq!(json_depth(br#"{"a":"[[[[\"{{"}"#), 1);
        assert_eq!(json_depth(&[b'['; 100_000]), 100_000);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: event data is written as a JSON string exactly when it is UTF-8, the string reading
    /// back to the same bytes, and otherwise nothing is written. Method: texts of every kind, and
    /// every byte value at every position of a word.
    #[test]
    fn bytes_are_written_as_a_string_exactly_when_they_are_utf8() {
        let texts: [&[u8]; 8] = [
            b"",
            b"plain ascii, longer than eight bytes",
            "ünï 🦀 and then some ascii \" \\ \n".as_bytes(),
            "🦀🦀🦀🦀🦀🦀".as_bytes(),
            b"\xff",
            b"eight ok\xc3",
            b"abcdefgh\xe2\x82abcdefgh",
            b"ascii \xed\xa0\x80 surrogate",
        ];
        for bytes in texts {
            let mut out = b"prefix".to_vec();
            let written = write_bytes_as_str(&mut out, bytes);
            assert_eq!(written, std::str::from_utf8(bytes).is_ok(), "{bytes:?}");
            if written {
                let back: String = serde_json::from_slice(&out[6..]).unwrap();
                assert_eq!(back.as_bytes(), bytes);
            } else {
                assert_eq!(out, b"prefix");
            }
        }
        // Every byte value at every position of an eight-byte word.
        for b in 0..=255u8 {
            for at in 0..9 {
                let mut bytes = b"abcdefghi".to_vec();
                bytes[at] = b;
                let mut out = Vec::new();
                let written = write_bytes_as_str(&mut out, &bytes);
                assert_eq!(written, std::str::from_utf8(&bytes).is_ok());
                if written {
                    let back: String = serde_json::from_slice(&out).unwrap();
                    assert_eq!(back.as_bytes(), &bytes[..]);
                }
            }
        }
    }

    /// Goal: the server's hand-written JSON strings and numbers read back as what was written,
    /// escapes included.
    #[test]
    fn strings_round_trip_through_json() {
        for s in [
            "",
            "plain",
            "quote\" back\\slash",
            "nl\n tab\t cr\r",
            "\u{1}\u{1f}",
            "ünï 🦀",
        ] {
            let mut out = Vec::new();
            write_str(&mut out, s);
            let back: String = serde_json::from_slice(&out).unwrap();
            assert_eq!(back, s);
        }
        for n in [0, 7, 10, 12345, u64::MAX] {
            let mut out = Vec::new();
            write_u64(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap(), n.to_string());
        }
    }

    /// Goal: the JSON string writer escapes what must be escaped, and nothing else, wherever it
    /// lies in a string. Method: every character that needs escaping, at every offset of a string
    /// long enough for the word-at-a-time skip, next to plain ASCII, characters beyond ASCII, the
    /// space and DEL.
    #[test]
    fn escapes_are_found_at_every_offset() {
        let specials = ['"', '\\', '\n', '\u{0}', '\u{1f}', '\u{7f}', ' ', 'é', '🦀'];
        for special in specials {
            for len in 0..40 {
                for at in 0..len {
                    let s: String = (0..len)
                        .map(|i| {
                            if i == at {
                                special
                            } else {
                                (b'a' + (i % 26) as u8) as char
                            }
                        })
                        .collect();
                    let mut out = Vec::new();
                    write_str(&mut out, &s);
                    let back: String = serde_json::from_slice(&out).unwrap();
                    assert_eq!(back, s);
                    let escaped = matches!(special, '"' | '\\' | '\n' | '\u{0}' | '\u{1f}');
                    assert_eq!(out.len() > s.len() + 2, escaped, "{s:?}");
                }
            }
        }
    }

    /// Goal: metadata given as key/value pairs over gRPC reads back as the same pairs in order,
    /// values that are not strings come back as JSON text, and metadata that is not an object comes
    /// back as one entry.
    #[test]
    fn metadata_pairs_round_trip() {
        let pairs = [("a", "1"), ("b", "x\"y"), ("a", "2")];
        let stored = metadata_from_entries(pairs.iter().copied());
        let back = metadata_entries(&stored);
        let expected: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(back, expected);
        assert_eq!(
            metadata_entries(br#"{"n":3,"o":{"p":true}}"#),
            vec![
                ("n".into(), "3".into()),
                ("o".into(), r#"{"p":true}"#.into())
            ]
        );
        assert_eq!(
            metadata_entries(b"[1]"),
            vec![("metadata".into(), "[1]".into())]
        );
        assert!(metadata_entries(b"").is_empty());
    }

    /// Goal: an append body's events carry their data and metadata as sent, escapes undone, and a
    /// body with an unknown field or data of the wrong type is refused with a reason.
    #[test]
    fn append_body_borrows_plain_data_and_rejects_unknown_fields() {
        let body = Bytes::from_static(
            br#"{"events":[{"type":"T","tags":["a:1"],"data":"hello","metadata":{"k":"v"}},{"type":"U","data":"esc\"aped"}]}"#,
        );
        let parsed: AppendBody = serde_json::from_slice(&body).unwrap();
        let mut events = parsed
            .events
            .into_iter()
            .map(|e| e.into_new_event(&body).unwrap());
        let first = events.next().unwrap();
        assert_eq!(&first.data[..], b"hello");
        assert_eq!(&first.metadata[..], br#"{"k":"v"}"#);
        let second = events.next().unwrap();
        assert_eq!(&second.data[..], b"esc\"aped");

        let err = serde_json::from_slice::<AppendBody>(br#"{"events":[],"extra":1}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("unknown field `extra`"), "{err}");
        let err = serde_json::from_slice::<AppendBody>(br#"{"events":[{"type":"T","data":{}}]}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("invalid type"), "{err}");
    }

    /// The shape `write_event` writes by hand, as a typed struct: the two must agree.
    #[derive(serde::Serialize)]
    struct TypedEvent<'a> {
        #[serde(rename = "type")]
        event_type: &'a str,
        tags: Vec<&'a str>,
        data: String,
        position: u64,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        erased: bool,
        #[serde(rename = "dataEncoding", skip_serializing_if = "Option::is_none")]
        data_encoding: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<serde_json::Value>,
        #[serde(rename = "metadataEncoding", skip_serializing_if = "Option::is_none")]
        metadata_encoding: Option<&'static str>,
        #[serde(rename = "appendedAt")]
        appended_at: u64,
    }

    fn typed(event: &Event) -> TypedEvent<'_> {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let (data, data_encoding) = match std::str::from_utf8(event.data()) {
            Ok(text) => (text.to_string(), None),
            Err(_) => (b64(event.data()), Some("base64")),
        };
        let (metadata, metadata_encoding) = match event.metadata() {
            [] => (None, None),
            bytes => match serde_json::from_slice::<serde_json::Value>(bytes) {
                Ok(value) => (Some(value), None),
                Err(_) => (Some(serde_json::Value::String(b64(bytes))), Some("base64")),
            },
        };
        TypedEvent {
            event_type: event.event_type(),
            tags: event.tags().collect(),
            data,
            position: event.position(),
            erased: event.is_erased(),
            data_encoding,
            id: event.id().map(|id| id.hyphenated().to_string()),
            metadata,
            metadata_encoding,
            appended_at: event.appended_at_us(),
        }
    }

    /// Goal: the hand-written event encoder (kept for speed on the read path) writes exactly
    /// the JSON a typed struct of the same shape serializes to, for every kind of event.
    /// Method: events with plain and escaped text, binary data, JSON and binary metadata, an
    /// id, and an erased subject's, read from a store, each written both ways and compared.
    #[test]
    fn the_event_encoder_writes_the_typed_shape() {
        let dir = tempfile::tempdir().unwrap();
        let options = annals::Options {
            subjects: Some(annals::SubjectOptions::new(
                ["customer:"],
                annals::MasterKey::generate().unwrap(),
            )),
            ..annals::Options::default()
        };
        let store = annals::Store::open(dir.path(), options).unwrap();
        let mut with_metadata = NewEvent::new("Noted", "quote \" and \\ and \u{1}");
        with_metadata.metadata = Bytes::from_static(br#"{"by":"web","n":[1,2]}"#);
        let mut binary = NewEvent::new("Blob", vec![0xffu8, 0, 1]).tag("k:1");
        binary.metadata = Bytes::from_static(b"\x00\x01\xff");
        let mut with_id = NewEvent::new("Named", "x").tag("a:1").tag("b:2");
        with_id.id = Some(Uuid::from_u128(0x6f1c2a1e_5d3b_4c4e_9a51_0c2d7f3b9e01));
        let events = [
            with_metadata,
            binary,
            with_id,
            NewEvent::new("Moved", "1 Main St").tag("customer:1"),
        ];
        store.append(&events, None).unwrap();
        store.erase_subject("customer:1").unwrap();
        let read: Vec<Event> = store
            .read(&Query::all(), annals::ReadOptions::forwards())
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(read.iter().any(Event::is_erased));
        for event in &read {
            let mut out = Vec::new();
            write_event(&mut out, event);
            let written: serde_json::Value = serde_json::from_slice(&out).unwrap();
            let expected = serde_json::to_value(typed(event)).unwrap();
            assert_eq!(written, expected, "event {}", event.position());
        }
        store.close().unwrap();
    }

    /// The events of an append body, each decoded or refused.
    fn decoded(body: &'static [u8]) -> Vec<Result<NewEvent, String>> {
        let body = Bytes::from_static(body);
        let parsed: AppendBody = serde_json::from_slice(&body).unwrap();
        parsed
            .events
            .into_iter()
            .map(|e| e.into_new_event(&body))
            .collect()
    }

    /// Goal: metadata that is not JSON is read as base64 with metadataEncoding, and appended
    /// back as the same bytes. Method: write such metadata, then parse an append of it.
    #[test]
    fn metadata_that_is_not_json_travels_as_base64() {
        let mut out = Vec::new();
        write_metadata(&mut out, b"\x00\x01\xff");
        assert_eq!(out, br#""AAH/","metadataEncoding":"base64""#);
        let events = decoded(
            br#"{"events":[{"type":"T","data":"","metadata":"AAH/","metadataEncoding":"base64"},{"type":"T","data":"","metadata":{"a":1},"metadataEncoding":"base64"}]}"#,
        );
        assert_eq!(&events[0].as_ref().unwrap().metadata[..], b"\x00\x01\xff");
        assert!(events[1].is_err());
    }

    /// Goal: an event's dataEncoding says how its data string stands for its bytes, as reads
    /// write it. Method: base64 data decodes to bytes that are not UTF-8, "utf8" and no
    /// encoding keep the string, bad base64 is refused, an unknown encoding does not parse.
    #[test]
    fn append_body_decodes_base64_data() {
        let events = decoded(
            br#"{"events":[{"type":"T","data":"/wAB","dataEncoding":"base64"},{"type":"T","data":"/wAB","dataEncoding":"utf8"},{"type":"T","data":"not base64!","dataEncoding":"base64"}]}"#,
        );
        assert_eq!(&events[0].as_ref().unwrap().data[..], b"\xff\x00\x01");
        assert_eq!(&events[1].as_ref().unwrap().data[..], b"/wAB");
        let refused = events[2].as_ref().err().unwrap();
        assert!(refused.contains("base64"), "{refused}");
        let err = serde_json::from_slice::<AppendBody>(
            br#"{"events":[{"type":"T","data":"","dataEncoding":"hex"}]}"#,
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("unknown variant"), "{err}");
    }
}
