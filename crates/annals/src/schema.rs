//! JSON Schemas of what the store's serde types accept, for API documents (feature `schema`).
//! The types derive theirs; the pieces here are what a derive cannot say.

use schemars::{json_schema, Schema, SchemaGenerator};

/// An event type, a tag or a tracking source: not empty, no control characters, at most the
/// store's `tag_bytes_max`/`type_bytes_max` bytes of UTF-8 (256 by default). JSON Schema counts
/// characters, not bytes: `maxLength` is the byte limit, which a string of more characters
/// always breaks, and the description says the rest.
pub fn name(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string", "minLength": 1, "maxLength": 256,
        "pattern": "^[^\\u0000-\\u001F\\u007F-\\u009F]+$",
        "description": "Not empty, no control characters, at most 256 bytes of UTF-8 by default (the server's limits say): 64 characters of any kind always fit, 256 ASCII characters too."
    })
}

/// A query item's tags: at most 64 (the default `query_item_values_max`), each a name.
pub fn query_tags(generator: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "maxItems": 64, "items": name(generator) })
}

/// A query item's types: at most 64 strings (a type no event has matches nothing).
pub fn query_types(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "maxItems": 64, "items": { "type": "string" } })
}

/// An event's tags: at most 32 distinct names (the default `tags_per_event_max`).
pub fn names(generator: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array", "maxItems": 32, "uniqueItems": true,
        "items": name(generator)
    })
}

/// An unsigned integer as JSON writes it (see [`crate::numbers`]).
pub fn unsigned(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "integer", "minimum": 0, "maximum": u64::MAX })
}

/// An optional unsigned integer.
pub fn opt_unsigned(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": ["integer", "null"], "minimum": 0, "maximum": u64::MAX })
}
