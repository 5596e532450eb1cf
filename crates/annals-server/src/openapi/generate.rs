//! The OpenAPI document, generated: request and response schemas derived from the types the
//! handlers parse and answer (serde's attributes included, so they cannot drift), operations
//! written here. Built in tests only: a test holds the committed copy that the server serves
//! (`tests/snapshots/openapi.json`) to what this generates.

use serde_json::{json, Value};

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } }
    })
}

fn auth_errors() -> Value {
    json!({
        "401": error_response("No API key, or one that is not configured (only when keys are configured)."),
        "403": error_response("The API key lacks the scope this endpoint needs, or (exchange) is bound to other accounts (kind forbidden_account), or a browser page of another origin sent the request (kind origin_not_allowed).")
    })
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

/// The schemas of the request bodies and parameters, generated from the types the handlers
/// parse them into, and of the answers, from the types they serialize (`answers.rs`):
/// serde's own attributes included, so that they cannot drift.
fn schemas() -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .into_generator();
    for schema in [
        generator.subschema_for::<crate::wire::AppendBody>(),
        generator.subschema_for::<annals::Query>(),
        generator.subschema_for::<annals::ReadOptions>(),
        generator.subschema_for::<annals::AppendCondition>(),
        generator.subschema_for::<crate::snapshots::SaveBody>(),
        generator.subschema_for::<crate::schemas::RegisterBody>(),
        generator.subschema_for::<crate::schemas::EnforcementBody>(),
        generator.subschema_for::<crate::schemas::PolicyBody>(),
    ] {
        debug_assert!(schema.get("$ref").is_some(), "{schema:?} is a named schema");
    }
    crate::answers::register(&mut generator);
    annals_exchange::hosted::register_schemas(&mut generator);
    let mut schemas = Value::Object(generator.take_definitions(true));
    schemas["Name"] = annals::schema::name(&mut generator).to_value();
    schemas
}

pub(super) fn document() -> String {
    let query_param = json!({
        "name": "query", "in": "query", "required": false,
        "description": "URL-encoded JSON Query. Absent, empty or {\"items\":[]} matches every event.",
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Query" } } }
    });
    let doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Annals",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A durable DCB event store. Positions start at 1 and are gapless; 0 means before everything. In the default durability class (D3) an append is answered only after the fdatasync that covers it."
        },
        "components": {
            "securitySchemes": {
                "apiKey": { "type": "http", "scheme": "bearer", "description": "An API key with the scopes read, append or admin (admin implies both others). Required only when keys are configured." }
            },
            "schemas": {}
        },
        "security": [ {}, { "apiKey": [] } ],
        "paths": {
            "/v1/read": { "get": {
                "summary": "Read the events matching a query (scope read).",
                "description": "Answers a JSON array, or NDJSON (one event per line) when Accept includes application/x-ndjson. Large answers are streamed. The header annals-head gives the head the read saw.",
                "parameters": [
                    query_param,
                    { "name": "options", "in": "query", "required": false,
                      "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ReadOptions" } } } }
                ],
                "responses": merge(json!({
                    "200": { "description": "The matching events in position order (descending when backwards).",
                             "headers": { "annals-head": { "schema": { "type": "integer" } } },
                             "content": {
                                 "application/json": { "schema": { "type": "array", "items": { "$ref": "#/components/schemas/SequencedEvent" } } },
                                 "application/x-ndjson": { "schema": { "$ref": "#/components/schemas/SequencedEvent" } } } },
                    "400": error_response("Malformed or oversize query or options."),
                    "414": error_response("The query string exceeds the configured limit.")
                }), auth_errors())
            } },
            "/v1/append": { "post": {
                "summary": "Append events atomically, optionally under a condition (scope append).",
                "description": "A failed condition is 200 with appendConditionFailed true and the first conflicting position. Nothing is half-appended. A read replica answers 403 read_only_replica, naming the primary.",
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/AppendRequest" } } } },
                "responses": merge(json!({
                    "200": { "description": "Appended (durable in D3), or the condition failed.",
                             "content": { "application/json": { "schema": { "$ref": "#/components/schemas/AppendResponse" } } } },
                    "400": error_response("Malformed JSON, unknown fields, wrong types, data that is not base64 although its dataEncoding says so (the message names the event's index), or a limit broken (events, tags, sizes)."),
                    "408": error_response("The body did not arrive within the body timeout."),
                    "409": error_response("A tracking position not above the one recorded for its source, or d4 asked of a server without a backup (off_machine_unavailable), or an event naming an erased data subject (subject_erased), or the event schemas changed while the append was judged, again and again (admission_changed: nothing was appended; send it again)."),
                    "413": error_response("The body exceeds the configured limit."),
                    "422": error_response("An event does not fit its type's newest schema, or (when the store refuses them) its type has none (schema_violation): nothing was appended; violations names each fault with the event's index, type, schema version, and paths in the event and the schema."),
                    "415": error_response("The body was not sent as application/json."),
                    "503": error_response("The append queue stayed full, the store is poisoned by a failed write or fsync (store_poisoned: the append was not written), the outcome is unknown (outcome_unknown: the append's write or fsync failed, its database commit could not be confirmed or denied, or a d4 append did not reach object storage in time), the database is unavailable (database_unavailable: nothing was appended), or the server is shutting down."),
                    "507": error_response("No room on the disk for the segment the append needs (disk_full): nothing was appended and nothing is poisoned; appends are taken again once there is room.")
                }), auth_errors())
            } },
            "/v1/head": { "get": {
                "summary": "The position of the last acknowledged event, 0 when empty (scope read).",
                "responses": merge(json!({
                    "200": { "description": "The head.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Head" } } } }
                }), auth_errors())
            } },
            "/v1/subscribe": { "get": {
                "summary": "Follow the events matching a query: first those already stored after `after`, then new ones as they are acknowledged, without gap or duplicate (scope read).",
                "description": "NDJSON by default; Server-Sent Events (id = position, event = event) when Accept includes text/event-stream, with Last-Event-ID honoured on reconnect and a comment every 15 s while idle. The stream ends when the server shuts down.",
                "parameters": [
                    query_param,
                    { "name": "after", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0, "default": 0 } }
                ],
                "responses": merge(json!({
                    "200": { "description": "A live stream of events.", "content": {
                        "application/x-ndjson": { "schema": { "$ref": "#/components/schemas/SequencedEvent" } },
                        "text/event-stream": { "schema": { "type": "string" } } } },
                    "400": error_response("Malformed query or after."),
                    "503": error_response("Too many subscriptions.")
                }), auth_errors())
            } },
            "/v1/tracking": { "get": {
                "summary": "The tracking position recorded for a source (scope read).",
                "parameters": [ { "name": "source", "in": "query", "required": true, "schema": { "type": "string" } } ],
                "responses": merge(json!({
                    "200": { "description": "The position, null when none is recorded.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/TrackingPosition" } } } },
                    "400": error_response("Missing or unknown parameters.")
                }), auth_errors())
            } },
            "/v1/admin/check": { "get": {
                "summary": "Check the live log up to the current head without stopping the server: every record's CRC and sequence, and the index against the log (scope admin).",
                "responses": merge(json!({
                    "200": { "description": "The result; ok is false with the first problem found.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Check" } } } }
                }), auth_errors())
            } },
            "/v1/admin/stats": { "get": {
                "summary": "The store's statistics (scope metrics; admin implies it): head, class, counters, fsync latency, index, disk, backup, replica and database state, in the shape annals stats --store prints, with the server's readiness, subscribers and connections. annals stats --url prints it.",
                "responses": merge(json!({
                    "200": { "description": "The statistics; fields a backend does not have are null.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ServerStats" } } } }
                }), auth_errors())
            } },
            "/v1/admin/erase": { "post": {
                "summary": "Erase a data subject (scope admin): its key is deleted, so that every event carrying its tag reads back without data (erased: true) wherever the store keeps it; a receipt event (annals.SubjectErased) is appended; later appends naming it are refused (409 subject_erased). Idempotent.",
                "requestBody": { "required": true, "content": { "application/json": { "schema": {
                    "type": "object", "required": ["tag"], "additionalProperties": false,
                    "properties": { "tag": { "type": "string", "description": "The subject's tag, beginning with one of the server's subject tag prefixes (--subject-tags)." } } } } } },
                "responses": merge(json!({
                    "200": { "description": "Erased (or erased before: already is true).", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Erased" } } } },
                    "400": error_response("A malformed body, or a tag that names no data subject (not_a_subject)."),
                    "409": error_response("The server keeps no data subjects (no_subjects).")
                }), auth_errors())
            } },
            "/v1/snapshots": { "post": {
                "summary": "Save a decision's snapshot (scope append): a model's state folded from the events of a query through a position, kept under the key of the model's name, version and the query's canonical form, one per key; a save behind the one kept is not kept (saved false).",
                "description": "The state is opaque to the server: JSON (state) or bytes (stateBase64), at most limits.snapshot_bytes_max bytes. The server notes the data subjects whose events the query holds through the position, and forgets the snapshot when one of them is erased.",
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/SnapshotSave" } } } },
                "responses": merge(json!({
                    "200": { "description": "Saved, or a snapshot further on was kept.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/SnapshotSaved" } } } },
                    "400": error_response("Malformed JSON, unknown fields, neither or both of state and stateBase64, an empty model name, or a query beyond the limits."),
                    "409": error_response("The position is beyond the head (snapshot_beyond_head), or the state folded events of a data subject erased since its position (subject_erased): fold again and save that."),
                    "413": error_response("The body or the state exceeds the configured limit (snapshot_too_large).")
                }), auth_errors())
            } },
            "/v1/snapshots/read": { "get": {
                "summary": "Read with a snapshot (scope read): the snapshot of a model, version and query when one fits the log, then the events of the query after it, then the head. Fold the events into the snapshot's state (or the initial state on a miss) and append under the query after the head.",
                "description": "outcome says whether the snapshot was a hit, a miss, stale (only other versions of the model have one: versions) or unfit (one is kept that does not fit the log: reason); the header annals-snapshot says the same. NDJSON when Accept includes application/x-ndjson: the first line is the snapshot and the head, then one event per line.",
                "parameters": [
                    { "name": "model", "in": "query", "required": true, "schema": { "type": "string", "minLength": 1, "maxLength": 256 } },
                    { "name": "version", "in": "query", "required": true, "schema": { "type": "integer", "minimum": 0, "maximum": 4294967295u32 } },
                    query_param
                ],
                "responses": merge(json!({
                    "200": { "description": "The snapshot, the head and the events after the snapshot.",
                             "headers": { "annals-head": { "schema": { "type": "integer" } },
                                          "annals-snapshot": { "schema": { "type": "string", "enum": ["hit", "miss", "stale", "unfit"] } } },
                             "content": {
                                 "application/json": { "schema": { "$ref": "#/components/schemas/SnapshotRead" } },
                                 "application/x-ndjson": { "schema": { "type": "object" } } } },
                    "400": error_response("A missing model or version, or a malformed or oversize query."),
                    "414": error_response("The query string exceeds the configured limit.")
                }), auth_errors())
            } },
            "/v1/admin/snapshots": {
                "get": {
                    "summary": "The snapshots kept (scope admin): how many and their bytes, per model and version, and the first of them (limit, 1000 by default), optionally of one model and version.",
                    "parameters": [
                        { "name": "model", "in": "query", "required": false, "schema": { "type": "string" } },
                        { "name": "version", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0, "maximum": 4294967295u32 } },
                        { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0, "maximum": 4294967295u32 } }
                    ],
                    "responses": merge(json!({
                        "200": { "description": "The snapshots.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/SnapshotList" } } } }
                    }), auth_errors())
                },
                "delete": {
                    "summary": "Remove the snapshots of a model, or of one version of it (scope admin).",
                    "parameters": [
                        { "name": "model", "in": "query", "required": true, "schema": { "type": "string" } },
                        { "name": "version", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0, "maximum": 4294967295u32 } }
                    ],
                    "responses": merge(json!({
                        "200": { "description": "How many were removed.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/SnapshotsRemoved" } } } }
                    }), auth_errors())
                }
            },
            "/v1/readmodels": { "get": {
                "summary": "Every read model the server keeps (declared under [[read_models]] in the configuration file) with its position, checkpoint, lag and counters (scope read).",
                "responses": merge(json!({
                    "200": { "description": "The read models.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ReadModels" } } } }
                }), auth_errors())
            } },
            "/v1/readmodels/{name}": { "get": {
                "summary": "One read model: status, total and number of keys; with key, that key's count; with minPosition, waits up to waitMs (at most 10 s) until the model has folded that position, to read one's own writes (scope read).",
                "parameters": [
                    { "name": "name", "in": "path", "required": true, "schema": { "type": "string" } },
                    { "name": "key", "in": "query", "required": false, "schema": { "type": "string" } },
                    { "name": "minPosition", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0 } },
                    { "name": "waitMs", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0 } }
                ],
                "responses": merge(json!({
                    "200": { "description": "The read model.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ReadModel" } } } },
                    "400": error_response("Unknown or invalid parameters."),
                    "404": error_response("No read model of that name."),
                    "504": { "description": "minPosition was not reached within waitMs; the body is the model as it stands.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ReadModel" } } } }
                }), auth_errors())
            } },
            "/v1/admin/readmodels/{name}/rebuild": { "post": {
                "summary": "Discard a read model's checkpoint and state and fold again from the first event, in the background (scope admin).",
                "parameters": [ { "name": "name", "in": "path", "required": true, "schema": { "type": "string" } } ],
                "responses": merge(json!({
                    "202": { "description": "The rebuild is under way; GET /v1/readmodels/{name} shows its progress.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Rebuilding" } } } },
                    "404": error_response("No read model of that name.")
                }), auth_errors())
            } },
            "/v1/openapi.json": { "get": {
                "summary": "This document (scope read).",
                "responses": merge(json!({ "200": { "description": "OpenAPI 3.1.", "content": { "application/json": {} } } }), auth_errors())
            } },
            "/health": { "get": {
                "summary": "Liveness: the process serves (readiness is /ready); open without a key.",
                "security": [],
                "responses": {
                    "200": { "description": "Serving; the body tells the store's, its backup's and its replication's states.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Health" } } } },
                    "503": { "description": "The store is poisoned by a failed write or fsync; it acknowledges nothing until reopened (restarted): status poisoned.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Health" } } } }
                }
            } },
            "/ready": { "get": {
                "summary": "Readiness: whether the server can now keep what it promises; open without a key.",
                "security": [],
                "responses": {
                    "200": { "description": "Ready: {\"status\":\"ok\"}.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Ready" } } } },
                    "503": { "description": "Not ready: {\"status\":\"unavailable\",\"reasons\":[...]}.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Ready" } } } }
                }
            } },
            "/metrics": { "get": {
                "summary": "Prometheus text exposition: request counts and latencies, append and read counters, group sizes, fsync latency, queue depth, head, subscribers (scope metrics; admin implies it).",
                "responses": merge(json!({ "200": { "description": "Metrics.", "content": { "text/plain": {} } } }), auth_errors())
            } }
        }
    });
    let mut doc = doc;
    doc["components"]["schemas"] = merge(doc["components"]["schemas"].take(), schemas());
    let (paths, schemas) = exchange();
    doc["paths"] = merge(doc["paths"].take(), paths);
    doc["paths"] = merge(doc["paths"].take(), schema_paths());
    doc["components"]["schemas"] = merge(doc["components"]["schemas"].take(), schemas);
    bound_positions(&mut doc);
    common_refusals(&mut doc);
    doc.to_string()
}

/// The event schemas' operations (`schemas.rs`).
fn schema_paths() -> Value {
    let type_param = json!({
        "name": "type", "in": "path", "required": true,
        "schema": { "$ref": "#/components/schemas/Name" }
    });
    let body = |name: &str| json!({ "required": true, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{name}") } } } });
    let answer = |description: &str, name: &str| json!({ "description": description, "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{name}") } } } });
    json!({
        "/v1/schemas": { "get": {
            "summary": "The event schema registry (scope read): whether types without a schema are taken, and every type with a schema: its enforcement and versions (without their schemas).",
            "responses": merge(json!({ "200": answer("The registry.", "SchemaList") }), auth_errors())
        } },
        "/v1/schemas/{type}": { "get": {
            "summary": "One type's schemas, every version with its schema (scope read). With position, also the version an event of the type at that position was checked against.",
            "parameters": [
                type_param,
                { "name": "position", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0, "maximum": u64::MAX } }
            ],
            "responses": merge(json!({
                "200": answer("The type's schemas.", "SchemaType"),
                "404": error_response("The type has no schema (schema_not_found), or, with position, no event is stored there (no_event) or the event there is of another type (other_type).")
            }), auth_errors())
        } },
        "/v1/admin/schemas/{type}": { "post": {
            "summary": "Register a new version of a type's schema (scope admin), after checking it against every stored event of the type (or, with check previously_accepted, those the previous version accepts). With dryRun, check and register nothing. A schema equal to the newest version's registers nothing (unchanged).",
            "description": "The registration is an event in the log: every server of the store, its replicas, backups and copies carry it. From its position on, appends of the type are judged against it (enforcement reject by default).",
            "parameters": [type_param],
            "requestBody": body("SchemaRegistration"),
            "responses": merge(json!({
                "200": { "description": "A dry run passed, or the schema is the newest version's already. With Accept: application/x-ndjson, every registration answers 200 with lines: {\"progress\":{checked, failed, position, head}} now and then while the stored events are checked, then {\"registered\":{...}} or {\"error\":{status, kind, error, violations}}.",
                         "content": {
                             "application/json": { "schema": { "$ref": "#/components/schemas/SchemaRegistered" } },
                             "application/x-ndjson": { "schema": { "type": "object" } } } },
                "201": answer("Registered.", "SchemaRegistered"),
                "400": error_response("Malformed JSON or unknown fields; a type that is the store's own or breaks the limits (invalid_type); a schema that is not a JSON Schema, breaks its draft's meta-schema or refers to a document outside itself (invalid_schema), or names a draft other than 2020-12 and draft 7 (unknown_draft)."),
                "403": error_response("The key lacks the admin scope, or the server is a read replica (read_only_replica)."),
                "409": error_response("Stored events of the type do not fit it (history_violation: violations names the first of them, by position), or the version asked for is not the next (version_taken)."),
                "413": error_response("The body, or the schema (64 KiB of JSON), is too large.")
            }), auth_errors())
        } },
        "/v1/admin/schemas/{type}/enforcement": { "put": {
            "summary": "Set how a type's schema is applied to appends (scope admin): reject, warn (stored, counted and logged) or off.",
            "parameters": [type_param],
            "requestBody": body("SchemaEnforcement"),
            "responses": merge(json!({
                "200": answer("The position of the change (or of the setting in force, when the same).", "SchemaSettingChanged"),
                "403": error_response("The key lacks the admin scope, or the server is a read replica (read_only_replica)."),
                "404": error_response("The type has no schema (schema_not_found).")
            }), auth_errors())
        } },
        "/v1/admin/schema-policy": { "put": {
            "summary": "Set whether events of types without a schema are taken (allow) or refused (refuse) (scope admin).",
            "requestBody": body("SchemaPolicy"),
            "responses": merge(json!({
                "200": answer("The position of the change (0: nothing changed).", "SchemaSettingChanged"),
                "403": error_response("The key lacks the admin scope, or the server is a read replica (read_only_replica).")
            }), auth_errors())
        } }
    })
}

/// The refusals every operation of a kind can meet, whatever it does: a body that is not
/// `application/json` (415) where there is one, and a malformed parameter (400) where there
/// are parameters.
fn common_refusals(doc: &mut Value) {
    let paths = doc["paths"].as_object_mut().expect("paths");
    for operation in paths
        .values_mut()
        .flat_map(|methods| methods.as_object_mut().expect("methods").values_mut())
    {
        let has_body = operation.get("requestBody").is_some();
        let has_parameters = operation.get("parameters").is_some();
        let responses = operation["responses"].as_object_mut().expect("responses");
        if has_body {
            responses
                .entry("415")
                .or_insert_with(|| error_response("The body was not sent as application/json."));
        }
        if has_body || has_parameters {
            responses
                .entry("400")
                .or_insert_with(|| error_response("A malformed parameter or body."));
        }
        if has_parameters {
            responses.entry("414").or_insert_with(|| {
                error_response("The request's URI is longer than the server accepts.")
            });
            responses.entry("431").or_insert_with(|| {
                error_response(
                    "The request's headers (URI included) are larger than the server accepts.",
                )
            });
        }
    }
}

/// Every integer that cannot be negative is at most `u64::MAX`, as the server parses it.
fn bound_positions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let unsigned = map.get("type") == Some(&json!("integer"))
                && map.get("minimum").is_some_and(|m| m.as_u64().is_some());
            if unsigned && !map.contains_key("maximum") {
                map.insert("maximum".into(), json!(u64::MAX));
            }
            map.values_mut().for_each(bound_positions);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_positions),
        _ => {}
    }
}

/// The hosted exchange's endpoints and schemas (answered 404 no_exchange when the server
/// hosts none).
fn exchange() -> (Value, Value) {
    let (mut paths, schemas) = exchange_operations();
    for operation in paths
        .as_object_mut()
        .expect("paths")
        .values_mut()
        .flat_map(|methods| methods.as_object_mut().expect("methods").values_mut())
    {
        let responses = operation["responses"].as_object_mut().expect("responses");
        responses.entry("404").or_insert_with(|| {
            error_response("The server hosts no exchange (start it with --exchange MODE).")
        });
    }
    (paths, schemas)
}

fn exchange_operations() -> (Value, Value) {
    let schemas = json!({});
    let paths = json!({
            "/v1/exchange": { "get": {
                "summary": "The hosted exchange: its mode and durability class, what starting it found (snapshot, commands replayed), and its counters (scope read).",
                "responses": merge(json!({
                    "200": { "description": "The exchange's status.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ExchangeStatus" } } } },
                    "404": error_response("The server hosts no exchange (start it with --exchange MODE).")
                }), auth_errors())
            } },
            "/v1/exchange/orders": { "post": {
                "summary": "Place an order (scope append). Answered once durable, with every report it produced.",
                "description": "Prices and quantities are integers, multiples of the symbol's tick and lot. kind: limit (default, good till cancelled), market (no price), ioc, fok, post_only. selfTrade (the taker's rule): cancel_newest (default), cancel_oldest, cancel_both, decrement, allow. Orders the engine refuses (bad tick, unknown symbol, a post-only that would take...) are journaled and answered 200 with status rejected and a reason.",
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/PlaceOrder" } } } },
                "responses": merge(json!({
                    "200": { "description": "Executed and durable.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CommandResult" } } } },
                    "400": error_response("Malformed JSON, unknown fields, a missing price (or a price on a market order)."),
                    "404": error_response("The server hosts no exchange."),
                    "503": error_response("The exchange's queue is full, its journal failed (it answers nothing more until restarted), or it is shutting down.")
                }), auth_errors())
            } },
            "/v1/exchange/orders/{id}": { "get": {
                "summary": "Where an order stands: live (account, symbol, side, price, leaves), filled or cancelled (scope read).",
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "integer", "minimum": 0 } } ],
                "responses": merge(json!({
                    "200": { "description": "The order's state.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/OrderState" } } } },
                    "404": error_response("No order with this id was ever accepted, or no exchange.")
                }), auth_errors())
            } },
            "/v1/exchange/orders/{id}/cancel": { "post": {
                "summary": "Cancel an order of the account (scope append). A filled, cancelled, unknown or foreign order is answered 200 with status rejected and a reason.",
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "integer", "minimum": 0 } } ],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CancelOrder" } } } },
                "responses": merge(json!({
                    "200": { "description": "Executed and durable.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CommandResult" } } } },
                    "400": error_response("Malformed body or id."),
                    "503": error_response("Queue full, journal failed, or shutting down.")
                }), auth_errors())
            } },
            "/v1/exchange/orders/{id}/amend": { "post": {
                "summary": "Amend an order's price and open quantity (scope append): a decrease at the same price keeps its place; a price change or an increase goes to the back and may trade.",
                "parameters": [ { "name": "id", "in": "path", "required": true, "schema": { "type": "integer", "minimum": 0 } } ],
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/AmendOrder" } } } },
                "responses": merge(json!({
                    "200": { "description": "Executed and durable.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CommandResult" } } } },
                    "400": error_response("Malformed body or id."),
                    "503": error_response("Queue full, journal failed, or shutting down.")
                }), auth_errors())
            } },
            "/v1/exchange/accounts/{account}/cancel-all": { "post": {
                "summary": "Cancel every live order of an account, in one symbol or all (scope append).",
                "parameters": [ { "name": "account", "in": "path", "required": true, "schema": { "type": "integer", "minimum": 0 } } ],
                "requestBody": { "required": true, "description": "{} cancels in every symbol.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CancelAll" } } } },
                "responses": merge(json!({
                    "200": { "description": "Executed and durable.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/CommandResult" } } } },
                    "400": error_response("Malformed body or account."),
                    "503": error_response("Queue full, journal failed, or shutting down.")
                }), auth_errors())
            } },
            "/v1/exchange/accounts/{account}/reports": { "get": {
                "summary": "A live stream of the account's execution reports as they become durable (scope read).",
                "description": "NDJSON (each line has event report and seq), or Server-Sent Events (event report, id = seq) when Accept includes text/event-stream. A stream that falls too far behind gets one lagged event and ends. The stream ends when the server shuts down.",
                "parameters": [ { "name": "account", "in": "path", "required": true, "schema": { "type": "integer", "minimum": 0 } } ],
                "responses": merge(json!({
                    "200": { "description": "The live stream.", "content": {
                        "application/x-ndjson": { "schema": { "$ref": "#/components/schemas/ExecutionReport" } },
                        "text/event-stream": { "schema": { "type": "string" } } } },
                    "503": error_response("Too many streams.")
                }), auth_errors())
            } },
            "/v1/exchange/symbols": { "get": {
                "summary": "Every symbol: its id, tick, lot and best bid and offer (scope read).",
                "responses": merge(json!({
                    "200": { "description": "The symbols.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Symbols" } } } }
                }), auth_errors())
            } },
            "/v1/admin/exchange/symbols": { "post": {
                "summary": "Add a symbol with its tick and lot sizes (scope admin); journaled, answered with its id once durable.",
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/AddSymbol" } } } },
                "responses": merge(json!({
                    "201": { "description": "Added.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/SymbolAdded" } } } },
                    "400": error_response("Malformed body, or a zero tick or lot.")
                }), auth_errors())
            } },
            "/v1/exchange/symbols/{symbol}/depth": { "get": {
                "summary": "A book's depth by price level, best first (scope read).",
                "parameters": [
                    { "name": "symbol", "in": "path", "required": true, "schema": { "type": "integer", "minimum": 0, "maximum": 4294967295u64 } },
                    { "name": "levels", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 1000, "default": 10 } }
                ],
                "responses": merge(json!({
                    "200": { "description": "The book.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Book" } } } },
                    "400": error_response("Bad levels or symbol."),
                    "404": error_response("No such symbol.")
                }), auth_errors())
            } },
            "/v1/exchange/symbols/{symbol}/trades": { "get": {
                "summary": "The symbol's latest trades, newest first, read from the journal (scope read).",
                "parameters": [
                    { "name": "symbol", "in": "path", "required": true, "schema": { "type": "integer", "minimum": 0, "maximum": 4294967295u64 } },
                    { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 1000, "default": 50 } }
                ],
                "responses": merge(json!({
                    "200": { "description": "The trades, each with its journal position.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Trades" } } } },
                    "400": error_response("Bad limit or symbol."),
                    "409": error_response("The exchange runs in d0 and journals no trades.")
                }), auth_errors())
            } },
            "/v1/exchange/symbols/{symbol}/stream": { "get": {
                "summary": "A symbol's live market data: the book first (event book), then every trade (event trade) and best bid and offer change (event bbo) after it, with no gap or repeat (scope read).",
                "description": "NDJSON (each line has event and seq) or Server-Sent Events (id = seq) when Accept includes text/event-stream. Everything sent is durable. A stream that falls too far behind gets one lagged event and ends; reconnect for a fresh book.",
                "parameters": [
                    { "name": "symbol", "in": "path", "required": true, "schema": { "type": "integer", "minimum": 0, "maximum": 4294967295u64 } },
                    { "name": "levels", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 1000, "default": 10 } }
                ],
                "responses": merge(json!({
                    "200": { "description": "The live stream.", "content": {
                        "application/x-ndjson": { "schema": { "type": "object" } },
                        "text/event-stream": { "schema": { "type": "string" } } } },
                    "404": error_response("No such symbol."),
                    "503": error_response("Too many streams.")
                }), auth_errors())
            } }
    });
    (paths, schemas)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    out.push(r);
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    /// Goal: a change to the OpenAPI document is a visible decision: the document is compared
    /// with the copy committed beside the tests, which `ANNALS_UPDATE_SNAPSHOTS=1` writes
    /// anew. Method: the document, pretty-printed, against the file, line by line.
    #[test]
    fn the_document_is_the_committed_snapshot() {
        let doc: Value = serde_json::from_str(&super::document()).unwrap();
        let text = serde_json::to_string_pretty(&doc).unwrap() + "\n";
        crate::snapshot::assert_snapshot("openapi.json", &text);
    }

    /// Goal: the server serves exactly the generated document: the committed copy it
    /// includes parses to the same JSON. Method: both parsed and compared (skipped while
    /// `ANNALS_UPDATE_SNAPSHOTS=1` writes the copy, which the next build includes).
    #[test]
    fn the_served_document_is_the_generated_one() {
        if std::env::var_os("ANNALS_UPDATE_SNAPSHOTS").is_some() {
            return;
        }
        let generated: Value = serde_json::from_str(&super::document()).unwrap();
        let served: Value = serde_json::from_str(super::super::DOCUMENT).unwrap();
        assert!(
            generated == served,
            "the served document is not the generated one"
        );
    }

    /// Goal: every reference in the document names a schema it holds, and the request schemas
    /// are the generated ones (serde's renames and refusals of unknown fields included).
    #[test]
    fn references_resolve_and_request_schemas_come_from_the_types() {
        let doc: Value = serde_json::from_str(&super::document()).unwrap();
        let mut found = Vec::new();
        refs(&doc, &mut found);
        assert!(found.len() > 20);
        for r in found {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{r} is not a component"));
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "{r} is not in the document"
            );
        }
        let schemas = &doc["components"]["schemas"];
        let new_event = &schemas["NewEvent"];
        assert_eq!(new_event["additionalProperties"], false);
        assert!(new_event["properties"].get("type").is_some());
        assert!(new_event["properties"].get("event_type").is_none());
        assert!(new_event["properties"].get("dataEncoding").is_some());
        assert_eq!(
            schemas["AppendCondition"]["required"][0],
            "failIfEventsMatch"
        );
        assert_eq!(
            schemas["ReadOptions"]["not"]["required"],
            serde_json::json!(["from", "after"])
        );
    }
}
