//! An event's data as the validator reads it: a JSON tree whose strings borrow the event's
//! bytes where they hold no escape, with each object's members sorted by name.
//!
//! Parsing into `serde_json::Value` copies every string and builds a map per object; for a
//! 1 KiB event of ten fields that was about six times the validation itself and most of what
//! a checked append cost (docs/DECISIONS.md, R43). The `jsonschema` crate validates any
//! representation that implements its `json` traits, and this one is read in place.
//!
//! The tree holds what `serde_json::Value` would: a repeated member name keeps its last value,
//! members are visited in name order, numbers are `serde_json::Number`s parsed the same way.

use std::borrow::Cow;
use std::fmt;

use jsonschema::json::{Array, Json, Node, NodeIdentity, Object};
use jsonschema::JsonType;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};

/// One JSON value of an event's data.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) enum Instance<'a> {
    #[default]
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Instance<'a>>),
    /// Sorted by name, one member per name.
    Object(Vec<(Cow<'a, str>, Instance<'a>)>),
}

impl<'a> Instance<'a> {
    /// Parses `data` as one JSON document (nothing but whitespace after it), borrowing its
    /// strings that need no unescaping. Nesting is bounded as `serde_json` bounds it.
    pub(crate) fn parse(data: &'a [u8]) -> Result<Instance<'a>, serde_json::Error> {
        // UTF-8 checked once for the whole document: parsing bytes checks each string on its
        // own, a sixth more instructions for a 1 KiB event of ten fields (docs/DECISIONS.md, R44).
        let text = std::str::from_utf8(data).map_err(|e| {
            de::Error::custom(format_args!("invalid UTF-8 after byte {}", e.valid_up_to()))
        })?;
        let mut parser = serde_json::Deserializer::from_str(text);
        let mut scratch = Scratch::default();
        let instance = parser.deserialize_any(InstanceVisitor(&mut scratch))?;
        parser.end()?;
        Ok(instance)
    }

    fn to_value(&self) -> Value {
        match self {
            Instance::Null => Value::Null,
            Instance::Bool(b) => Value::Bool(*b),
            Instance::Number(n) => Value::Number(n.clone()),
            Instance::String(s) => Value::String(s.to_string()),
            Instance::Array(items) => Value::Array(items.iter().map(Instance::to_value).collect()),
            Instance::Object(members) => Value::Object(
                members
                    .iter()
                    .map(|(name, value)| (name.to_string(), value.to_value()))
                    .collect(),
            ),
        }
    }
}

/// The members and items of the objects and arrays being read, one stack each: a value is
/// gathered here and moved into a vector of exactly its length once it ends. serde_json gives
/// no size hint; growing each object's vector by doubling took three allocations for ten
/// members, and reserving room per object let an event of many empty objects reserve far more
/// than its size. The stacks start with room for [`SCRATCH_ROOM`] once per parse.
#[derive(Default)]
struct Scratch<'a> {
    members: Vec<(Cow<'a, str>, Instance<'a>)>,
    items: Vec<Instance<'a>>,
}

/// Room the scratch stacks take on first use: a typical event's members in one allocation.
const SCRATCH_ROOM: usize = 32;

struct InstanceVisitor<'s, 'a>(&'s mut Scratch<'a>);

impl<'s, 'de> Visitor<'de> for InstanceVisitor<'s, 'de> {
    type Value = Instance<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Instance::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Instance::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Instance::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        // JSON has no NaN nor infinity; serde_json's `Value` turns one into null likewise.
        Ok(Number::from_f64(v).map_or(Instance::Null, Instance::Number))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Instance::String(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Instance::String(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Instance::String(Cow::Owned(v)))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Instance::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Instance::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let scratch = self.0;
        if scratch.items.capacity() == 0 {
            scratch.items.reserve(SCRATCH_ROOM);
        }
        let start = scratch.items.len();
        while let Some(item) = seq.next_element_seed(Seed(&mut *scratch))? {
            scratch.items.push(item);
        }
        // On an error the parse ends and the scratch with it: nothing is left to unwind.
        Ok(Instance::Array(scratch.items.drain(start..).collect()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let scratch = self.0;
        if scratch.members.capacity() == 0 {
            scratch.members.reserve(SCRATCH_ROOM);
        }
        let start = scratch.members.len();
        while let Some(name) = map.next_key_seed(NameSeed)? {
            let value = map.next_value_seed(Seed(&mut *scratch))?;
            scratch.members.push((name, value));
        }
        let gathered = &mut scratch.members[start..];
        // Sorted by name, stably, so that of a repeated name the last one given is kept: of
        // two neighbours with one name, `dedup_by` drops the later, holding the earlier's.
        gathered.sort_by(|a, b| a.0.cmp(&b.0));
        let mut members: Vec<_> = scratch.members.drain(start..).collect();
        members.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                std::mem::swap(later, earlier);
            }
            same
        });
        Ok(Instance::Object(members))
    }
}

struct Seed<'s, 'a>(&'s mut Scratch<'a>);

impl<'s, 'de> de::DeserializeSeed<'de> for Seed<'s, 'de> {
    type Value = Instance<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(InstanceVisitor(self.0))
    }
}

/// A member's name, borrowed where it has no escape.
struct NameSeed;

impl<'de> de::DeserializeSeed<'de> for NameSeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(NameVisitor)
    }
}

struct NameVisitor;

impl<'de> Visitor<'de> for NameVisitor {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member's name")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// The `jsonschema` crate's view of [`Instance`].
pub(crate) struct Borrowed;

impl Json for Borrowed {
    type Node<'a> = &'a Instance<'a>;
    type PreparedKey = String;
    type StringBuffer = Instance<'static>;
    /// A tree parsed from bytes holds no node twice.
    const ACYCLIC: bool = true;

    fn prepare_key(key: &str) -> String {
        key.to_owned()
    }

    fn with_string_node<T>(
        buffer: &mut Instance<'static>,
        string: &str,
        f: impl FnOnce(<Borrowed as Json>::Node<'_>) -> T,
    ) -> T {
        *buffer = Instance::String(Cow::Owned(string.to_owned()));
        f(buffer)
    }
}

impl<'a> Node<'a, Borrowed> for &'a Instance<'a> {
    type Object = &'a [(Cow<'a, str>, Instance<'a>)];
    type Array = &'a [Instance<'a>];
    type Number = &'a Number;

    fn as_object(&self) -> Option<Self::Object> {
        match self {
            Instance::Object(members) => Some(members),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<Self::Array> {
        match self {
            Instance::Array(items) => Some(items),
            _ => None,
        }
    }

    fn as_string(&self) -> Option<Cow<'a, str>> {
        match self {
            Instance::String(s) => Some(Cow::Borrowed(s.as_ref())),
            _ => None,
        }
    }

    fn as_number(&self) -> Option<&'a Number> {
        match self {
            Instance::Number(n) => Some(n),
            _ => None,
        }
    }

    fn as_boolean(&self) -> Option<bool> {
        match self {
            Instance::Bool(b) => Some(*b),
            _ => None,
        }
    }

    fn is_null(&self) -> bool {
        matches!(self, Instance::Null)
    }

    /// A string of `n` bytes holds between `n / 4` and `n` code points: most bounds (a note's
    /// `maxLength` far above its length) are decided without counting.
    fn string_length_within(&self, min: u64, max: u64) -> Option<bool> {
        let Instance::String(s) = self else {
            return None;
        };
        let bytes = s.len() as u64;
        if bytes <= max && bytes.div_ceil(4) >= min {
            return Some(true);
        }
        if bytes < min || bytes.div_ceil(4) > max {
            return Some(false);
        }
        let length = s.chars().count() as u64;
        Some((min..=max).contains(&length))
    }

    fn json_type(&self) -> JsonType {
        match self {
            Instance::Null => JsonType::Null,
            Instance::Bool(_) => JsonType::Boolean,
            Instance::Number(_) => JsonType::Number,
            Instance::String(_) => JsonType::String,
            Instance::Array(_) => JsonType::Array,
            Instance::Object(_) => JsonType::Object,
        }
    }

    fn to_value(&self) -> Cow<'a, Value> {
        Cow::Owned(Instance::to_value(self))
    }

    fn identity(&self) -> Option<NodeIdentity> {
        Some(NodeIdentity::new(
            std::ptr::from_ref::<Instance<'a>>(*self) as usize
        ))
    }
}

impl<'a> Object<'a, Borrowed> for &'a [(Cow<'a, str>, Instance<'a>)] {
    type Node = &'a Instance<'a>;
    type MemberName = &'a str;
    type MembersIter = Members<'a>;

    fn len(&self) -> usize {
        <[_]>::len(self)
    }

    fn get(&self, key: &String) -> Option<&'a Instance<'a>> {
        self.binary_search_by(|(name, _)| name.as_ref().cmp(key.as_str()))
            .ok()
            .map(|at| &self[at].1)
    }

    fn members(&self) -> Members<'a> {
        Members(self.iter())
    }
}

/// An object's members in name order.
pub(crate) struct Members<'a>(std::slice::Iter<'a, (Cow<'a, str>, Instance<'a>)>);

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, &'a Instance<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(name, value)| (name.as_ref(), value))
    }
}

impl<'a> Array<'a, Borrowed> for &'a [Instance<'a>] {
    type Node = &'a Instance<'a>;
    type ElementsIter = std::slice::Iter<'a, Instance<'a>>;

    fn len(&self) -> usize {
        <[_]>::len(self)
    }

    fn elements(&self) -> Self::ElementsIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the tree reads any document as `serde_json::Value` does: the same values, a
    /// repeated name's last value, escapes undone, numbers alike, trailing text refused.
    #[test]
    fn reads_as_serde_json_reads() {
        let documents: [&[u8]; 9] = [
            br#"{"a":{"x":1,"y":[1,{"q":2,"p":[]},3]},"b":[{"c":1},{"e":3,"d":2}],"a2":[]}"#,
            br#"{"b":1,"a":[true,null,"x\ny"],"c":{"z":-2,"y":1.5e3}}"#,
            br#"{"k":1,"k":2,"j":"\u00e9t\u00e9"}"#,
            br#"  [1, 18446744073709551615, -9223372036854775808, 0.1, 1e308]  "#,
            br#""just a string""#,
            b"null",
            br#"{"":{"":[]}}"#,
            br#"{"nested":[[[[{"deep":"\"quoted\""}]]]]}"#,
            br#"{"emoji":"\ud83d\ude00","plain":"caf\u00e9"}"#,
        ];
        for document in documents {
            let expected: Value = serde_json::from_slice(document).expect("valid JSON");
            let instance = Instance::parse(document).expect("parses");
            assert_eq!(
                instance.to_value(),
                expected,
                "{}",
                String::from_utf8_lossy(document)
            );
        }
        for bad in [&b"{\"a\":1} x"[..], b"{\"a\":}", b"[1,2", b"", b"\"\xff\""] {
            assert!(
                Instance::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(
            Instance::parse(deep.as_bytes()).is_err(),
            "nesting is bounded"
        );
    }

    /// Goal: the tree keeps the contract the `jsonschema` crate states for a representation
    /// (code-point lengths, numbers equal by value, stable identities), by its own check.
    #[test]
    fn keeps_the_validators_contract() {
        let document =
            serde_json::to_vec(&jsonschema::json::conformance::document()).expect("serialises");
        let root = Instance::parse(&document).expect("parses");
        jsonschema::json::conformance::assert_conformance::<Borrowed>(&&root);
    }

    /// Goal: each object and array holds exactly its length, however many there are, so
    /// that a small event of many empty objects cannot reserve much more than its size.
    #[test]
    fn takes_exactly_the_room_it_holds() {
        fn exact(instance: &Instance<'_>) {
            match instance {
                Instance::Array(items) => {
                    assert_eq!(items.capacity(), items.len());
                    items.iter().for_each(exact);
                }
                Instance::Object(members) => {
                    // A repeated name's dropped member leaves its slot: at most that many.
                    assert!(members.capacity() <= members.len() + 1, "{members:?}");
                    members.iter().for_each(|(_, value)| exact(value));
                }
                _ => {}
            }
        }
        let empties = format!("[{}{{}}]", "{},".repeat(100_000));
        let Instance::Array(items) = Instance::parse(empties.as_bytes()).expect("parses") else {
            panic!("an array");
        };
        assert_eq!(items.len(), 100_001);
        exact(&Instance::Array(items));
        let nested = br#"{"z":[[{"b":1,"a":{"k":[1,2,3]}}],{}],"y":{"x":{"w":[{"v":[]}]}},"y":0}"#;
        exact(&Instance::parse(nested).expect("parses"));
    }

    /// Goal: strings without escapes are read in place; one with an escape is unescaped.
    #[test]
    fn plain_strings_borrow_the_event() {
        let data = br#"{"plain":"abc","escaped":"a\tb"}"#;
        let Instance::Object(members) = Instance::parse(data).expect("parses") else {
            panic!("an object");
        };
        let by_name = |n: &str| members.iter().find(|(name, _)| name == n).map(|m| &m.1);
        assert!(matches!(
            by_name("plain"),
            Some(Instance::String(Cow::Borrowed("abc")))
        ));
        assert!(matches!(
            by_name("escaped"),
            Some(Instance::String(Cow::Owned(s))) if s == "a\tb"
        ));
        assert!(members
            .iter()
            .all(|(name, _)| matches!(name, Cow::Borrowed(_))));
    }

    /// Goal: a validator over the tree answers as one over `serde_json::Value`, valid or not,
    /// with the same paths and messages, for the keywords events' schemas use.
    #[test]
    fn validates_as_over_serde_json() {
        let schema = serde_json::json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["id", "amount"],
            "properties": {
                "id": {"type": "string", "pattern": "^[a-z]+-[0-9]+$", "maxLength": 12},
                "amount": {"type": "integer", "minimum": 1, "multipleOf": 5},
                "rate": {"type": "number", "exclusiveMaximum": 1},
                "kind": {"enum": ["a", "b", {"c": [1, 2]}]},
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true,
                         "maxItems": 3},
                "meta": {"type": "object", "propertyNames": {"maxLength": 3},
                         "additionalProperties": {"type": ["string", "null"]}},
                "only": {"const": 10},
                "label": {"type": "string", "minLength": 2, "maxLength": 4},
                "either": {"oneOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]}
            }
        });
        let over_value = jsonschema::validator_for(&schema).expect("compiles");
        let over_tree = jsonschema::options_for::<Borrowed>()
            .build(&schema)
            .expect("compiles");
        let documents = [
            r#"{"id":"abc-12","amount":10}"#,
            r#"{"id":"abc-12","amount":10,"rate":0.5,"kind":{"c":[1,2]},"tags":["x","y"]}"#,
            r#"{"id":"abc-12","amount":10,"meta":{"ab":"x","abc":null},"only":10.0}"#,
            r#"{"id":"ABC","amount":7}"#,
            r#"{"id":"abc-12345678901","amount":0.5,"rate":1,"kind":"d"}"#,
            r#"{"amount":10,"extra":true,"tags":["x","x","y","z"]}"#,
            r#"{"id":"a-1","amount":10,"meta":{"long":"x","ok":1},"only":11,"either":-1}"#,
            r#"{"id":"a-1","amount":10,"either":"s","tags":[1]}"#,
            r#"{"id":"a-1","amount":5,"label":"éé","meta":{"ééé":"x"}}"#,
            r#"{"id":"a-1","amount":5,"label":"ééééé","meta":{"éééé":"x"}}"#,
            r#"{"id":"a-1","amount":5,"label":"😀"}"#,
            r#"{"id":"a-1","amount":5,"label":"a😀😀😀"}"#,
            r#"{"id":"a-1","amount":5,"label":"a😀😀😀😀"}"#,
            r#"{"id":"a-1","amount":5,"id":"b-2","id":"ccc"}"#,
            r#"[1,2]"#,
            r#""text""#,
        ];
        for document in documents {
            let value: Value = serde_json::from_str(document).expect("valid JSON");
            let tree = Instance::parse(document.as_bytes()).expect("parses");
            assert_eq!(
                over_tree.is_valid(&tree),
                over_value.is_valid(&value),
                "{document}"
            );
            let faults = |errors: jsonschema::ErrorIterator<'_>| -> Vec<String> {
                let mut found: Vec<String> = errors
                    .map(|e| format!("{} {} {}", e.instance_path(), e.schema_path(), e))
                    .collect();
                found.sort();
                found
            };
            assert_eq!(
                faults(over_tree.iter_errors(&tree)),
                faults(over_value.iter_errors(&value)),
                "{document}"
            );
        }
    }
}
