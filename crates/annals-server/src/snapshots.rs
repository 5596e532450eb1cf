//! Decisions' snapshots over HTTP, for clients in any language (their folds run in the client,
//! so a snapshot's state is opaque here): `POST /v1/snapshots` saves one, `GET
//! /v1/snapshots/read` answers the snapshot of a model, version and query followed by the
//! events after it and the head, and `GET`/`DELETE /v1/admin/snapshots` list and remove them.
//!
//! A state is saved as JSON (`state`) or as bytes (`stateBase64`) and read back the same way:
//! the store keeps bytes after a zero byte, which no JSON text begins with.

use std::sync::Arc;

use annals::snapshot::{Lookup, Saved, SnapshotError, SnapshotFilter, SnapshotInfo};
use annals::state::StateId;
use annals::{Query, ReadOptions};
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::{delete, get, post};
use base64::Engine;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::answers;
use crate::auth::Scopes;
use crate::http::{
    accepts, answer_response, body_error, input_error, query_string, read_body, read_error,
    store_error, Guard, ReadEncoder, JSON, NDJSON,
};
use crate::metrics::Op;
use crate::wire::{self, ApiError};
use crate::AppState;

/// The byte that marks a state as bytes rather than JSON.
const BYTES: u8 = 0;

/// A model's name: at most this many bytes.
const NAME_MAX: usize = 256;

pub(crate) fn routes(
    state: &Arc<AppState>,
    router: axum::Router<Arc<AppState>>,
) -> axum::Router<Arc<AppState>> {
    let save_guard = Guard::new(state, Scopes::APPEND, Some(Op::Snapshot));
    let read_guard = Guard::new(state, Scopes::READ, Some(Op::Snapshot));
    let admin = Guard::new(state, Scopes::ADMIN, Some(Op::Snapshot));
    router
        .route("/v1/snapshots", save_guard.on(post(save)))
        .route("/v1/snapshots/read", read_guard.on(get(read)))
        .route(
            "/v1/admin/snapshots",
            admin.on(get(list)).merge(admin.on(delete(remove))),
        )
}

/// A save's body: a snapshot of the model's state, folded from the events of the query
/// through the position.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "SnapshotSave")]
#[schemars(extend("oneOf" = [{"required": ["state"]}, {"required": ["stateBase64"]}]))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SaveBody<'a> {
    /// The model's name (1 to 256 characters).
    #[schemars(length(min = 1, max = 256))]
    model: String,
    /// The model's version: raise it when its fold changes meaning.
    #[schemars(extend("maximum" = 4294967295u32))]
    #[serde(deserialize_with = "whole")]
    version: u32,
    query: Query,
    /// The last position the state folded (at most the head).
    #[serde(deserialize_with = "whole")]
    position: u64,
    /// The state as JSON, any value (or stateBase64).
    #[serde(borrow, default, deserialize_with = "present")]
    state: Option<&'a RawValue>,
    /// The state as bytes, in standard base64 with padding (or state).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    #[schemars(extend(
        "contentEncoding" = "base64",
        "pattern" = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
    ))]
    state_base64: Option<Option<String>>,
}

/// A whole number, written as JSON Schema's integers may be (`3` or `3.0`), in `T`'s range.
fn whole<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    use serde::de::Error;
    let number = serde_json::Number::deserialize(deserializer)?;
    let value = match (number.as_u64(), number.as_f64()) {
        (Some(n), _) => Some(n),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&f) => {
            Some(f as u64)
        }
        _ => None,
    };
    value
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| D::Error::custom(format!("{number} is not a whole number in range")))
}

/// A field that is there, whatever its value (`null` included).
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

fn model_name(name: &str, kind: &'static str) -> Result<(), ApiError> {
    let chars = name.chars().count();
    if chars == 0 || chars > NAME_MAX {
        return Err(ApiError::bad_request(
            kind,
            format!("a model's name has 1 to {NAME_MAX} characters"),
        ));
    }
    Ok(())
}

fn snapshot_error(e: &SnapshotError) -> ApiError {
    let message = e.to_string();
    match e {
        // The server's state, not the request, is what it conflicts with: another server of
        // the database may hold that position already.
        SnapshotError::BeyondHead { .. } => {
            ApiError::new(StatusCode::CONFLICT, "snapshot_beyond_head", message)
        }
        SnapshotError::TooLarge { .. } => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "snapshot_too_large", message)
        }
        SnapshotError::SubjectErased { .. } => {
            ApiError::new(StatusCode::CONFLICT, "subject_erased", message)
        }
        SnapshotError::Invalid(e) => input_error(e),
        SnapshotError::Read(e) => read_error(e),
        SnapshotError::Store(e) => store_error(e),
    }
}

fn failed_task(e: tokio::task::JoinError) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

/// Saves a client's snapshot.
async fn save(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    if request.uri().query().is_some() {
        return Err(ApiError::bad_request(
            "invalid_parameter",
            "a save takes no query parameters; send the snapshot in the body",
        ));
    }
    let body = read_body(&state, request).await?;
    let parsed: SaveBody = serde_json::from_slice(&body).map_err(body_error("snapshot body"))?;
    model_name(&parsed.model, "invalid_body")?;
    parsed
        .query
        .validate(&state.config.limits.store())
        .map_err(|e| input_error(&e))?;
    let bytes = match (parsed.state, parsed.state_base64) {
        (Some(json), None) => json.get().as_bytes().to_vec(),
        (None, Some(None)) => {
            return Err(ApiError::bad_request(
                "invalid_body",
                "stateBase64 is a string of base64",
            ))
        }
        (None, Some(Some(text))) => {
            let mut bytes = vec![BYTES];
            wire::BASE64_IN
                .decode_vec(text.as_bytes(), &mut bytes)
                .map_err(|e| ApiError::bad_request("invalid_body", format!("stateBase64: {e}")))?;
            bytes
        }
        _ => {
            return Err(ApiError::bad_request(
                "invalid_body",
                "give the snapshot's state as `state` (JSON) or `stateBase64` (bytes), one of them",
            ))
        }
    };
    let id = StateId::new(parsed.model, parsed.version, parsed.query);
    let position = parsed.position;
    let store = state.store.clone();
    let key = id.key().to_hex();
    let saved = tokio::task::spawn_blocking(move || store.snapshots().save(&id, position, bytes))
        .await
        .map_err(failed_task)?
        .map_err(|e| snapshot_error(&e))?;
    let answer = match saved {
        Saved::Saved => answers::SnapshotSaved {
            saved: true,
            key,
            position,
            kept_position: None,
        },
        Saved::Behind { kept } => answers::SnapshotSaved {
            saved: false,
            key,
            position,
            kept_position: Some(kept),
        },
    };
    Ok(answer_response(StatusCode::OK, &answer))
}

/// The parameters of a read with a snapshot.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadParams {
    model: String,
    version: u32,
    query: Option<String>,
}

fn query_params<T: for<'de> Deserialize<'de>>(
    state: &AppState,
    request: &Request,
    what: &str,
) -> Result<T, ApiError> {
    serde_urlencoded::from_str(query_string(state, request)?)
        .map_err(|e| ApiError::bad_request("invalid_parameter", format!("{what}: {e}")))
}

/// The snapshot of a model, version and query (a hit, a miss, stale or unfit), then the
/// events of the query after it, then (in the header and the answer) the head: what a client
/// folds on to decide, and the condition it appends under is the query after that head.
async fn read(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let params: ReadParams = query_params(&state, &request, "snapshot read")?;
    model_name(&params.model, "invalid_parameter")?;
    let query = wire::parse_query(params.query.as_deref())?;
    query
        .validate(&state.config.limits.store())
        .map_err(|e| input_error(&e))?;
    let id = StateId::new(params.model, params.version, query);
    let store = state.store.clone();
    let (id, lookup) = tokio::task::spawn_blocking(move || {
        let lookup = store.snapshots().load(&id);
        (id, lookup)
    })
    .await
    .map_err(failed_task)?;
    // A snapshot that cannot be loaded costs a longer read, not an answer.
    let mut lookup = lookup.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "a snapshot could not be loaded: read from the start");
        Lookup::Miss
    });
    let after = match &lookup {
        Lookup::Hit(saved) => saved.position,
        _ => 0,
    };
    let mut iter = state
        .store
        .read(id.query(), ReadOptions::forwards().after(after))
        .map_err(|e| read_error(&e))?;
    // The snapshot was checked before this read began: a subject it folded may have been
    // erased since, and the events read show it erased. Then the client folds from the start.
    if let Lookup::Hit(saved) = &lookup {
        let erased = annals::state::erased_since(&state.store, &saved.subjects, saved.position)
            .map_err(|e| read_error(&e))?;
        if let Some((subject, receipt)) = erased {
            lookup = Lookup::Unfit(annals::state::Unfit::SubjectErased { subject, receipt });
            iter = state
                .store
                .read(id.query(), ReadOptions::forwards())
                .map_err(|e| read_error(&e))?;
        }
    }
    let head = iter.head();
    let ndjson = accepts(request.headers(), NDJSON);
    let mut prefix = b"{\"snapshot\":".to_vec();
    write_lookup(&mut prefix, &id, &lookup);
    prefix.extend_from_slice(b",\"head\":");
    wire::write_u64(&mut prefix, head);
    let (prefix, suffix): (Vec<u8>, &'static [u8]) = match ndjson {
        true => {
            prefix.extend_from_slice(b"}\n");
            (prefix, b"")
        }
        false => {
            prefix.extend_from_slice(b",\"events\":");
            (prefix, b"}")
        }
    };
    let encoder = ReadEncoder::new(&state, iter, ndjson).framed(prefix, suffix);
    let mut response = encoder
        .into_response(&state, &request)
        .map_err(|e| read_error(&e))?;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(if ndjson { NDJSON } else { JSON }),
    );
    headers.insert("annals-head", HeaderValue::from(head));
    headers.insert(
        "annals-snapshot",
        HeaderValue::from_static(lookup.outcome()),
    );
    Ok(response)
}

/// The snapshot part of a read's answer (its shape is `answers::SnapshotFound`).
fn write_lookup(out: &mut Vec<u8>, id: &StateId, lookup: &Lookup) {
    out.extend_from_slice(b"{\"outcome\":\"");
    out.extend_from_slice(lookup.outcome().as_bytes());
    out.extend_from_slice(b"\",\"key\":\"");
    out.extend_from_slice(id.key().to_hex().as_bytes());
    out.push(b'"');
    match lookup {
        Lookup::Hit(saved) => {
            out.extend_from_slice(b",\"position\":");
            wire::write_u64(out, saved.position);
            out.extend_from_slice(b",\"savedAtUs\":");
            wire::write_u64(out, saved.saved_at_us);
            let json = saved.state.first() != Some(&BYTES)
                && serde_json::from_slice::<&RawValue>(&saved.state).is_ok();
            if json {
                out.extend_from_slice(b",\"state\":");
                out.extend_from_slice(&saved.state);
            } else {
                // Bytes saved as bytes lose their mark; any other state that is not JSON
                // (an embedded fold's own encoding) is answered whole.
                let bytes = match saved.state.split_first() {
                    Some((&BYTES, bytes)) => bytes,
                    _ => &saved.state[..],
                };
                out.extend_from_slice(b",\"stateBase64\":\"");
                let text = base64::engine::general_purpose::STANDARD.encode(bytes);
                out.extend_from_slice(text.as_bytes());
                out.push(b'"');
            }
        }
        Lookup::Miss => {}
        Lookup::OtherVersion { versions } => {
            out.extend_from_slice(b",\"versions\":");
            out.extend_from_slice(&serde_json::to_vec(versions).expect("numbers"));
        }
        Lookup::Unfit(unfit) => {
            out.extend_from_slice(b",\"reason\":");
            wire::write_str(out, &format!("the snapshot {unfit}"));
        }
    }
    out.push(b'}');
}

/// The parameters of a listing or a removal.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminParams {
    model: Option<String>,
    version: Option<u32>,
    limit: Option<u32>,
}

impl AdminParams {
    fn filter(&self) -> SnapshotFilter {
        SnapshotFilter {
            name: self.model.clone(),
            version: self.version,
            key: None,
        }
    }
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// How many snapshots a listing names by default.
const LIST_LIMIT: usize = 1000;

/// The snapshots kept (of a model, of a version), with a summary per model and version.
async fn list(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let params: AdminParams = query_params(&state, &request, "snapshot listing")?;
    let filter = params.filter();
    let store = state.store.clone();
    let (listed, stats) = tokio::task::spawn_blocking(move || {
        let snapshots = store.snapshots();
        Ok::<_, annals::StoreError>((snapshots.list(&filter)?, snapshots.stats()?))
    })
    .await
    .map_err(failed_task)?
    .map_err(|e| store_error(&e))?;
    let now_us = now_us();
    let models = summarise(&listed, now_us);
    let total = listed.len() as u64;
    let limit = params.limit.map_or(LIST_LIMIT, |n| n as usize);
    let snapshots = listed
        .into_iter()
        .take(limit)
        .map(|s| answers::SnapshotEntry::new(s, now_us))
        .collect();
    let answer = answers::SnapshotList {
        count: stats.count,
        bytes: stats.bytes,
        stored_bytes: stats.stored_bytes,
        matching: total,
        models,
        snapshots,
    };
    Ok(answer_response(StatusCode::OK, &answer))
}

/// Per model and version: how many, their bytes, the newest position and the oldest save.
fn summarise(listed: &[SnapshotInfo], now_us: u64) -> Vec<answers::SnapshotModel> {
    let mut models: Vec<answers::SnapshotModel> = Vec::new();
    for s in listed {
        let age = now_us.saturating_sub(s.saved_at_us) as f64 / 1e6;
        match models
            .last_mut()
            .filter(|m| m.model == s.name && m.version == s.version)
        {
            Some(m) => {
                m.count += 1;
                m.bytes += s.bytes;
                m.newest_position = m.newest_position.max(s.position);
                m.oldest_age_seconds = m.oldest_age_seconds.max(age);
            }
            None => models.push(answers::SnapshotModel {
                model: s.name.clone(),
                version: s.version,
                count: 1,
                bytes: s.bytes,
                newest_position: s.position,
                oldest_age_seconds: age,
            }),
        }
    }
    models
}

/// Removes the snapshots of a model (of one version of it).
async fn remove(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    let params: AdminParams = query_params(&state, &request, "snapshot removal")?;
    if params.model.is_none() || params.limit.is_some() {
        return Err(ApiError::bad_request(
            "invalid_parameter",
            "a removal names a model (`model`, and optionally `version`)",
        ));
    }
    let filter = params.filter();
    let store = state.store.clone();
    let removed = tokio::task::spawn_blocking(move || store.snapshots().remove(&filter))
        .await
        .map_err(failed_task)?
        .map_err(|e| store_error(&e))?;
    Ok(answer_response(
        StatusCode::OK,
        &answers::SnapshotsRemoved { removed },
    ))
}
