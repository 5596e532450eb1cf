//! A schema as given, checked and compiled: its draft (2020-12 or draft 7, no other), its
//! validity against its draft's meta-schema, and a validator built by the `jsonschema` crate
//! with no retrieval of remote documents.

use std::sync::Arc;

use jsonschema::Draft;
use serde_json::Value;

use super::instance::Borrowed;
use super::RegistryError;

/// The largest schema the registry takes, as JSON bytes: a schema is held in memory by every
/// server and stored in one event.
pub const SCHEMA_BYTES_MAX: usize = 64 * 1024;

/// The drafts a schema may name in `$schema`; none names 2020-12.
const DRAFT_2020_12: [&str; 2] = [
    "https://json-schema.org/draft/2020-12/schema",
    "http://json-schema.org/draft/2020-12/schema",
];
const DRAFT_7: [&str; 2] = [
    "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft-07/schema",
];

/// A compiled schema: what it was compiled from, its draft's name and the validator.
pub(super) struct Compiled {
    pub schema: Arc<Value>,
    pub draft: &'static str,
    pub validator: Arc<jsonschema::Validator<Borrowed>>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("draft", &self.draft)
            .finish_non_exhaustive()
    }
}

/// Checks `schema` and compiles it: a clear error for a schema that is not an object or a
/// boolean, names an unknown draft, breaks its draft's meta-schema, is too large, or refers
/// to a document outside itself.
pub(super) fn compile(schema: Value) -> Result<Compiled, RegistryError> {
    let bytes = serde_json::to_vec(&schema)
        .map(|b| b.len())
        .unwrap_or(usize::MAX);
    if bytes > SCHEMA_BYTES_MAX {
        return Err(RegistryError::SchemaTooLarge {
            bytes,
            max: SCHEMA_BYTES_MAX,
        });
    }
    let (draft, name) = match &schema {
        Value::Bool(_) => (Draft::Draft202012, "2020-12"),
        Value::Object(fields) => match fields.get("$schema") {
            None => (Draft::Draft202012, "2020-12"),
            Some(Value::String(uri)) => {
                let uri = uri.trim_end_matches('#');
                if DRAFT_2020_12.contains(&uri) {
                    (Draft::Draft202012, "2020-12")
                } else if DRAFT_7.contains(&uri) {
                    (Draft::Draft7, "draft-07")
                } else {
                    return Err(RegistryError::UnknownDraft(uri.to_owned()));
                }
            }
            Some(_) => {
                return Err(RegistryError::InvalidSchema(
                    "\"$schema\" must be a string naming the draft".into(),
                ))
            }
        },
        _ => {
            return Err(RegistryError::InvalidSchema(
                "a schema is a JSON object (or true or false)".into(),
            ))
        }
    };
    if let Err(e) = jsonschema::meta::validate(&schema) {
        return Err(RegistryError::InvalidSchema(format!(
            "it breaks the {name} meta-schema at {}: {e}",
            pointer(&e.instance_path().to_string())
        )));
    }
    let validator = jsonschema::options_for::<Borrowed>()
        .with_draft(draft)
        .build(&schema)
        .map_err(|e| RegistryError::InvalidSchema(e.to_string()))?;
    Ok(Compiled {
        schema: Arc::new(schema),
        draft: name,
        validator: Arc::new(validator),
    })
}

/// A JSON Pointer as people read it: the whole document is "/".
pub(super) fn pointer(path: &str) -> &str {
    if path.is_empty() {
        "/"
    } else {
        path
    }
}
