//! The HTTP API's answers: every one that is not a stream is one of these types, serialized
//! by serde, and the OpenAPI document takes its response schemas from them (schemars), so
//! that a field cannot be answered and left out of the document, or the other way round.
//! Events are the exception: reads and streams write them with the encoder in `wire.rs`
//! (measured on the hot path), and [`SequencedEvent`] is their shape, which a test holds the
//! encoder to.

use schemars::JsonSchema;
use serde::Serialize;

/// A refusal: every answer that is not a success carries one.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Error {
    /// What is wrong, for people.
    pub error: String,
    /// A stable machine-readable kind, e.g. malformed_json, too_many_tags, body_too_large,
    /// unauthenticated, queue_full.
    pub kind: String,
    /// What was wrong with each event (kinds schema_violation and history_violation); absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<Violation>,
}

/// One fault of one event against its type's schema.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    /// The event's index in the append (schema_violation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// The stored event's position (history_violation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    #[serde(rename = "type")]
    pub event_type: String,
    /// The schema version it was checked against (0: its type has none, and the store refuses
    /// types without one).
    pub version: u32,
    /// Where in the event's data, as a JSON Pointer ("" for the whole).
    pub instance_path: String,
    /// Which keyword of the schema, as a JSON Pointer.
    pub schema_path: String,
    pub message: String,
}

impl Violation {
    pub fn of(v: &annals::admission::Violation, position: Option<u64>) -> Violation {
        Violation {
            index: position.is_none().then_some(v.index as u64),
            position,
            event_type: v.event_type.clone(),
            version: v.version,
            instance_path: v.instance_path.clone(),
            schema_path: v.schema_path.clone(),
            message: v.message.clone(),
        }
    }
}

/// The schema registry: the store-wide policy and every type with a schema.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaList {
    /// allow (the default) or refuse events of types without a schema.
    pub unknown_types: String,
    pub types: Vec<SchemaType>,
}

/// A type's schemas.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaType {
    #[serde(rename = "type")]
    pub event_type: String,
    /// reject, warn or off.
    pub enforcement: String,
    /// Oldest first.
    pub versions: Vec<SchemaVersionInfo>,
    /// With a position asked for: the version an event of the type at that position was
    /// checked against (null: none, or enforcement off then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked_against: Option<Option<CheckedAgainst>>,
}

/// One version of a type's schema.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaVersionInfo {
    pub version: u32,
    /// The position of its registration.
    pub position: u64,
    /// 2020-12 or draft-07.
    pub draft: String,
    /// How the stored events were checked before it was registered: stored (all of them)
    /// or previously_accepted; and how many.
    pub check: String,
    pub checked_events: u64,
    pub registered_at_us: u64,
    /// The schema (in a type's answer; not in the list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
}

/// The version an event was checked against.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckedAgainst {
    pub version: u32,
    /// reject (the event fits it) or warn (checked, stored either way).
    pub enforcement: String,
}

/// What a registration did.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaRegistered {
    #[serde(rename = "type")]
    pub event_type: String,
    pub version: u32,
    /// The registration's position (the existing version's when unchanged; null for a dry
    /// run).
    pub position: Option<u64>,
    /// Stored events of the type checked, and passed over (previously_accepted).
    pub checked_events: u64,
    pub passed_over: u64,
    /// The schema is the newest version's already: nothing was registered.
    pub unchanged: bool,
    pub dry_run: bool,
}

/// A change of the registry's settings, and its position (0: nothing changed).
#[derive(Debug, Serialize, JsonSchema)]
pub struct SchemaSettingChanged {
    pub position: u64,
}

/// An event as reads and subscriptions answer it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SequencedEvent {
    #[serde(rename = "type")]
    pub event_type: String,
    pub tags: Vec<String>,
    /// The stored bytes as a UTF-8 string (base64 when dataEncoding says so).
    pub data: String,
    /// Present only when the data is not UTF-8. An append takes the event's data and
    /// dataEncoding as they are read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_encoding: Option<Base64>,
    #[schemars(range(min = 1))]
    pub position: u64,
    /// Microseconds since the Unix epoch.
    pub appended_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<uuid::Uuid>,
    /// The metadata given at append, when any: its JSON, or, when it is not JSON, its bytes
    /// in base64 (metadataEncoding says so).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    /// Present only when the metadata is not JSON. An append takes the event's metadata and
    /// metadataEncoding as they are read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_encoding: Option<Base64>,
    /// Present (true) only when the event's data subject was erased: its data and metadata
    /// are gone (data is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub erased: Option<bool>,
    /// The version of its type's schema the event was checked against when it was appended;
    /// absent when its type had no schema then, or its enforcement was off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<CheckedAgainst>,
}

/// The one encoding named: base64.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Base64 {
    Base64,
}

/// What an append did.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "AppendResponse")]
#[serde(rename_all = "camelCase")]
pub struct Appended {
    pub duration_in_microseconds: u64,
    pub append_condition_failed: bool,
    /// The last appended event's position (absent when the condition failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// The first event that made the condition fail (only when it failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conflict_position: Option<u64>,
}

/// The position of the last acknowledged event, 0 when empty.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Head {
    pub head: u64,
}

/// The tracking position recorded for a source.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TrackingPosition {
    pub source: String,
    /// Null when none is recorded.
    pub position: Option<u64>,
}

/// A check of the live log; ok is false with the first problem found.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Check {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<u64>,
    pub problem: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

/// The store's statistics (`annals::Stats`) with how its opening had its index, as `annals
/// stats --store --json` prints them.
#[derive(Debug, Serialize, JsonSchema)]
pub struct StoreStats {
    #[serde(flatten)]
    pub stats: annals::Stats,
    pub open_ms: f64,
    pub index_source: String,
}

/// The store's statistics with the server's readiness, subscribers and connections.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ServerStats {
    #[serde(flatten)]
    pub store: StoreStats,
    pub ready: bool,
    pub unready_reasons: Vec<String>,
    pub subscribers: i64,
    pub connections: i64,
}

/// Every read model the server keeps.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadModels {
    pub read_models: Vec<crate::readmodels::ModelView>,
}

/// A rebuild under way.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Rebuilding {
    pub name: String,
    pub rebuilding: bool,
}

/// What an erasure did, as `POST /v1/admin/erase` and `annals erase --json` answer it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Erased {
    pub tag: String,
    /// Events carrying the tag, now unreadable.
    pub events: u64,
    /// The position of the erasure's receipt.
    pub receipt: u64,
    /// Erased before: nothing changed.
    pub already: bool,
    pub erased_at_us: u64,
    /// With a backup: whether its copy of the keys no longer holds the subject's key (false:
    /// object storage did not answer within 10 s; it is replaced once it does). Null: no
    /// backup.
    pub in_backup: Option<bool>,
    /// The hosted read models that had folded the subject's events: each is built again as
    /// it meets the receipt. Absent from `annals erase --json` on a closed store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_models_rebuilt: Option<Vec<String>>,
}

impl From<&annals::Erasure> for Erased {
    fn from(e: &annals::Erasure) -> Erased {
        Erased {
            tag: e.tag.clone(),
            events: e.events,
            receipt: e.receipt,
            already: e.already,
            erased_at_us: e.erased_at_us,
            in_backup: e.in_backup,
            read_models_rebuilt: None,
        }
    }
}

/// Liveness, with the store's, its backup's and its replication's states.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    pub status: HealthStatus,
    pub head: u64,
    pub durability: &'static str,
    /// Why the status is not ok.
    pub reason: Option<String>,
    pub disk_free_bytes: Option<u64>,
    pub backup: Option<HealthBackup>,
    /// A read replica's following of its backup.
    pub replica: Option<HealthReplica>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    Ok,
    /// A failed write or fsync: nothing is acknowledged until the store is reopened (503).
    Poisoned,
    /// Damage the scrub found and could not repair: reads that cross it fail.
    Damaged,
    /// Appends that need a new segment are refused; the rest serves.
    DiskFull,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthBackup {
    pub state: &'static str,
    pub lag_positions: u64,
    pub lag_seconds: f64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthReplica {
    pub state: &'static str,
    pub lag_positions: u64,
    pub lag_seconds: f64,
    pub last_poll_age_seconds: f64,
}

/// Readiness.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Ready {
    pub status: ReadyStatus,
    /// Why not ready, each beginning with its kind: poisoned, disk_full, backup_failing (the
    /// class is D4 and the backup fails), replica_failing, replica_stale (no successful poll
    /// of the backup for 30 s), shutting_down.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReadyStatus {
    Ok,
    Unavailable,
}

/// What a snapshot's save did.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSaved {
    /// False when a snapshot further on was kept instead (keptPosition).
    pub saved: bool,
    /// The snapshot's key: of the model's name, its version and the query's canonical form.
    pub key: String,
    pub position: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_position: Option<u64>,
}

/// Whether a read found a snapshot to start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotOutcome {
    /// A snapshot that fits the log: fold the events after it into its state.
    Hit,
    /// None: fold the events from the start.
    Miss,
    /// None of this version; other versions of the model have one (versions).
    Stale,
    /// One is kept but does not fit the log (reason): fold from the start.
    Unfit,
}

/// The snapshot a read with a snapshot starts with.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotFound {
    pub outcome: SnapshotOutcome,
    pub key: String,
    /// A hit's: the last position its state folded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// A hit's: when it was saved, in microseconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_at_us: Option<u64>,
    /// A hit's state, when it was saved as JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<serde_json::Value>,
    /// A hit's state, when it was saved as bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_base64: Option<String>,
    /// Stale: the model's versions that have a snapshot of the query.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versions: Option<Vec<u32>>,
    /// Unfit: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A read with a snapshot: the snapshot, the head, and the events of the query after the
/// snapshot through the head (as NDJSON: the first line without the events, then one event
/// per line).
#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotRead {
    pub snapshot: SnapshotFound,
    /// Append under the query after this head.
    pub head: u64,
    pub events: Vec<SequencedEvent>,
}

/// A snapshot kept.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotEntry {
    pub key: String,
    pub model: String,
    pub version: u32,
    pub position: u64,
    pub saved_at_us: u64,
    pub age_seconds: f64,
    /// Its size as kept (the state and its envelope).
    pub bytes: u64,
}

impl SnapshotEntry {
    pub fn new(info: annals::snapshot::SnapshotInfo, now_us: u64) -> SnapshotEntry {
        SnapshotEntry {
            key: info.key.to_hex(),
            age_seconds: now_us.saturating_sub(info.saved_at_us) as f64 / 1e6,
            model: info.name,
            version: info.version,
            position: info.position,
            saved_at_us: info.saved_at_us,
            bytes: info.bytes,
        }
    }
}

/// The snapshots of one version of a model.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotModel {
    pub model: String,
    pub version: u32,
    pub count: u64,
    pub bytes: u64,
    pub newest_position: u64,
    pub oldest_age_seconds: f64,
}

/// The snapshots kept: how many in all, those a listing matched (by model and version, each
/// at most once per key; `snapshots` holds the first ones up to the limit).
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotList {
    pub count: u64,
    pub bytes: u64,
    /// What the shelf takes where it lives (its file, or its table).
    pub stored_bytes: u64,
    pub matching: u64,
    pub models: Vec<SnapshotModel>,
    pub snapshots: Vec<SnapshotEntry>,
}

/// How many snapshots a removal removed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotsRemoved {
    pub removed: u64,
}

/// Registers every answer's schema with `generator`, under its type's name (the exchange's
/// are `annals_exchange::hosted`'s). For the OpenAPI document's generation, in tests.
#[cfg(test)]
pub(crate) fn register(generator: &mut schemars::SchemaGenerator) {
    for schema in [
        generator.subschema_for::<Error>(),
        generator.subschema_for::<SequencedEvent>(),
        generator.subschema_for::<Appended>(),
        generator.subschema_for::<Head>(),
        generator.subschema_for::<TrackingPosition>(),
        generator.subschema_for::<Check>(),
        generator.subschema_for::<ServerStats>(),
        generator.subschema_for::<ReadModels>(),
        generator.subschema_for::<crate::readmodels::ModelView>(),
        generator.subschema_for::<Rebuilding>(),
        generator.subschema_for::<Erased>(),
        generator.subschema_for::<Health>(),
        generator.subschema_for::<Ready>(),
        generator.subschema_for::<SnapshotSaved>(),
        generator.subschema_for::<SnapshotRead>(),
        generator.subschema_for::<SnapshotList>(),
        generator.subschema_for::<SnapshotsRemoved>(),
        generator.subschema_for::<SchemaList>(),
        generator.subschema_for::<SchemaType>(),
        generator.subschema_for::<SchemaRegistered>(),
        generator.subschema_for::<SchemaSettingChanged>(),
    ] {
        debug_assert!(schema.get("$ref").is_some(), "{schema:?} is a named schema");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use annals::{Event, NewEvent, Options, Store};
    use base64::Engine as _;

    /// The typed serialisation of an event: what `wire::write_event` must write.
    fn typed(event: &Event) -> SequencedEvent {
        let base64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let (data, data_encoding) = match std::str::from_utf8(event.data()) {
            Ok(text) => (text.to_string(), None),
            Err(_) => (base64(event.data()), Some(Base64::Base64)),
        };
        let metadata = event.metadata();
        let (metadata, metadata_encoding) = match serde_json::from_slice(metadata) {
            _ if metadata.is_empty() => (None, None),
            Ok(json) => (Some(json), None),
            Err(_) => (Some(base64(metadata).into()), Some(Base64::Base64)),
        };
        SequencedEvent {
            event_type: event.event_type().to_string(),
            tags: event.tags().map(str::to_string).collect(),
            data,
            data_encoding,
            position: event.position(),
            appended_at: event.appended_at_us(),
            id: event.id(),
            metadata,
            metadata_encoding,
            erased: event.is_erased().then_some(true),
            schema: None,
        }
    }

    /// Goal: the hand-written event encoder of reads and streams writes exactly the shape the
    /// typed answer (and so the OpenAPI document) gives: for data that is text or not,
    /// metadata that is JSON, not JSON or absent, with and without an id and tags, with and
    /// without the schema version it was checked against.
    #[test]
    fn the_event_encoder_writes_the_typed_shape() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Options::default()).unwrap();
        let id = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let events = [
            NewEvent::new("Plain", "text \" \\ \n ünï 🦀"),
            NewEvent::new("Binary", &b"\xff\x00 not utf-8"[..]).tag("a:1"),
            NewEvent::new("Json", "{}")
                .tags(["a:1", "b:two words"])
                .metadata(r#"{"correlation":"x","n":[1,2,{"deep":null}]}"#),
            NewEvent::new("Opaque", "")
                .id(id)
                .metadata(&b"\x01not json"[..]),
            NewEvent::new("Empty", ""),
        ];
        store.append(&events, None).unwrap();
        let read = store
            .read(&annals::Query::all(), annals::ReadOptions::default())
            .unwrap();
        let mut seen = 0;
        for event in read {
            let event = event.unwrap();
            let mut out = Vec::new();
            crate::wire::write_event(&mut out, &event);
            let written: serde_json::Value = serde_json::from_slice(&out).unwrap();
            let expected = serde_json::to_value(typed(&event)).unwrap();
            assert_eq!(written, expected, "{}", event.event_type());
            for (version, enforcement, word) in [
                (1, annals::registry::Enforcement::Reject, "reject"),
                (u32::MAX, annals::registry::Enforcement::Warn, "warn"),
            ] {
                let mut out = Vec::new();
                let schema = annals::registry::CheckedAgainst {
                    version,
                    enforcement,
                };
                crate::wire::write_event_checked(&mut out, &event, Some(schema));
                let written: serde_json::Value = serde_json::from_slice(&out).unwrap();
                let mut expected = typed(&event);
                expected.schema = Some(CheckedAgainst {
                    version,
                    enforcement: word.into(),
                });
                assert_eq!(written, serde_json::to_value(expected).unwrap());
            }
            seen += 1;
        }
        assert_eq!(seen, events.len());
    }
}
