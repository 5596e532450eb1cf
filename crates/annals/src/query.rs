//! DCB queries, append conditions and read options (docs/GUIDE.md).

use serde::{Deserialize, Serialize};

use crate::error::InputError;
use crate::limits::Limits;
use crate::record::validate_tag;

/// A list of items, OR-ed. No items matches every event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Query {
    #[serde(default)]
    pub items: Vec<QueryItem>,
}

/// Matches an event whose type is one of `types` (any type when empty) and that carries every
/// tag in `tags`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct QueryItem {
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::query_types")
    )]
    pub types: Vec<String>,
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::query_tags")
    )]
    pub tags: Vec<String>,
}

impl Query {
    /// Matches every event.
    pub fn all() -> Self {
        Query { items: Vec::new() }
    }

    pub fn item(item: QueryItem) -> Self {
        Query { items: vec![item] }
    }

    pub fn or(mut self, item: QueryItem) -> Self {
        self.items.push(item);
        self
    }

    /// True when the query matches every event: no items, or an item with no types and no tags.
    pub fn matches_all(&self) -> bool {
        self.items.is_empty()
            || self
                .items
                .iter()
                .any(|i| i.types.is_empty() && i.tags.is_empty())
    }

    /// Checks the query against the limits.
    pub fn validate(&self, limits: &Limits) -> Result<(), InputError> {
        if self.items.len() > limits.query_items_max {
            return Err(InputError::TooManyQueryItems {
                count: self.items.len(),
                max: limits.query_items_max,
            });
        }
        for (i, item) in self.items.iter().enumerate() {
            for (what, values) in [("types", &item.types), ("tags", &item.tags)] {
                if values.len() > limits.query_item_values_max {
                    return Err(InputError::QueryItemTooLarge {
                        what,
                        count: values.len(),
                        max: limits.query_item_values_max,
                    });
                }
            }
            for tag in &item.tags {
                validate_tag(0, tag, limits).map_err(|e| match e {
                    InputError::EmptyTag { .. } => InputError::InvalidQueryTag {
                        item: i,
                        problem: "an empty tag".into(),
                    },
                    InputError::TagTooLong { bytes, max, .. } => InputError::InvalidQueryTag {
                        item: i,
                        problem: format!("a tag of {bytes} bytes (the limit is {max})"),
                    },
                    other => other,
                })?;
            }
        }
        Ok(())
    }

    /// The query in one canonical form, as bytes: two queries that match the same events by
    /// their form alone (items, and each item's types and tags, in any order and repeated)
    /// have the same bytes, and two that differ in a type, a tag or an item do not. Each
    /// item's types and tags are sorted and deduplicated, then the items themselves; a query
    /// that matches every event ([`Query::matches_all`]) is written as one with no items.
    ///
    /// Layout (little-endian): item count u32; per item, type count u32 then each type
    /// (length u32, bytes), tag count u32 then each tag (length u32, bytes).
    pub fn canonical_bytes(&self) -> Vec<u8> {
        fn put(out: &mut Vec<u8>, values: &[String]) {
            let mut sorted: Vec<&str> = values.iter().map(String::as_str).collect();
            sorted.sort_unstable();
            sorted.dedup();
            out.extend_from_slice(&(sorted.len() as u32).to_le_bytes());
            for value in sorted {
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value.as_bytes());
            }
        }
        let mut items: Vec<Vec<u8>> = match self.matches_all() {
            true => Vec::new(),
            false => self
                .items
                .iter()
                .map(|item| {
                    let mut out = Vec::new();
                    put(&mut out, &item.types);
                    put(&mut out, &item.tags);
                    out
                })
                .collect(),
        };
        items.sort_unstable();
        items.dedup();
        let mut out = Vec::with_capacity(4 + items.iter().map(Vec::len).sum::<usize>());
        out.extend_from_slice(&(items.len() as u32).to_le_bytes());
        for item in items {
            out.extend_from_slice(&item);
        }
        out
    }

    /// Whether an event with this type and these tags matches (the brute-force definition).
    pub fn matches<'a>(
        &self,
        event_type: &str,
        tags: impl Iterator<Item = &'a str> + Clone,
    ) -> bool {
        if self.items.is_empty() {
            return true;
        }
        self.items.iter().any(|item| {
            (item.types.is_empty() || item.types.iter().any(|t| t == event_type))
                && item
                    .tags
                    .iter()
                    .all(|wanted| tags.clone().any(|t| t == wanted))
        })
    }
}

impl QueryItem {
    pub fn types<I, S>(types: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        QueryItem {
            types: types.into_iter().map(Into::into).collect(),
            tags: Vec::new(),
        }
    }

    pub fn tags<I, S>(tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        QueryItem {
            types: Vec::new(),
            tags: tags.into_iter().map(Into::into).collect(),
        }
    }

    pub fn and_tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tags.extend(tags.into_iter().map(Into::into));
        self
    }
}

/// Fail the append if any event matching `fail_if_events_match` has a position greater than
/// `after` (0 when absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AppendCondition {
    pub fail_if_events_match: Query,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::numbers::opt_u64"
    )]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::opt_unsigned")
    )]
    pub after: Option<u64>,
}

impl AppendCondition {
    pub fn new(fail_if_events_match: Query, after: Option<u64>) -> Self {
        AppendCondition {
            fail_if_events_match,
            after,
        }
    }
}

/// Where a read starts and how far it goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(extend("not" = { "required": ["from", "after"] }))
)]
#[serde(deny_unknown_fields)]
pub struct ReadOptions {
    /// Inclusive start (forwards) or inclusive maximum (backwards).
    #[serde(default, deserialize_with = "crate::numbers::opt_u64")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::opt_unsigned")
    )]
    pub from: Option<u64>,
    /// Exclusive start (forwards) or exclusive maximum (backwards); not with `from`. Used by
    /// subscriptions.
    #[serde(default, deserialize_with = "crate::numbers::opt_u64")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::opt_unsigned")
    )]
    pub after: Option<u64>,
    /// At most this many events.
    #[serde(default, deserialize_with = "crate::numbers::opt_u64")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::opt_unsigned")
    )]
    pub limit: Option<u64>,
    #[serde(default)]
    pub backwards: bool,
}

impl ReadOptions {
    pub fn forwards() -> Self {
        Self::default()
    }

    pub fn backwards() -> Self {
        ReadOptions {
            backwards: true,
            ..Self::default()
        }
    }

    pub fn from(mut self, position: u64) -> Self {
        self.from = Some(position);
        self
    }

    pub fn after(mut self, position: u64) -> Self {
        self.after = Some(position);
        self
    }

    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The first position a forward read may return, or the last a backward read may return
    /// (`None` for a backward read with no bound: start at the head).
    pub(crate) fn bound(&self) -> Result<Option<u64>, InputError> {
        match (self.from, self.after, self.backwards) {
            (Some(_), Some(_), _) => Err(InputError::InvalidReadOptions(
                "give either `from` or `after`, not both".into(),
            )),
            (Some(from), None, false) => Ok(Some(from.max(1))),
            (None, Some(after), false) => Ok(Some(after.saturating_add(1))),
            (None, None, false) => Ok(Some(1)),
            (Some(from), None, true) => Ok(Some(from)),
            (None, Some(after), true) => Ok(Some(after.saturating_sub(1))),
            (None, None, true) => Ok(None),
        }
    }
}
