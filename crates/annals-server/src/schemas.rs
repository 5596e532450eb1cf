//! Event schemas over HTTP (`annals::registry`): `GET /v1/schemas` lists the types with a
//! schema, `GET /v1/schemas/{type}` shows one (with `?position=P`, the version an event at P
//! was checked against), and the admin scope registers a version (`POST
//! /v1/admin/schemas/{type}`, a dry run with `dryRun`), sets a type's enforcement and the
//! store-wide policy. Schemas named in the configuration are registered at start ([`load`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use annals::registry::{
    Enforcement, HistoryCheck, Registration, Registry, RegistryError, TypeSchemas, UnknownTypes,
};
use annals::Store;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use axum::routing::{get, post, put};
use http::StatusCode;
use serde::Deserialize;

use crate::answers;
use crate::auth::Scopes;
use crate::http::{
    accepts, answer_response, append_error, body_error, query_string, read_body, Guard, NDJSON,
};
use crate::metrics::Op;
use crate::wire::ApiError;
use crate::AppState;

pub(crate) fn routes(
    state: &Arc<AppState>,
    router: axum::Router<Arc<AppState>>,
) -> axum::Router<Arc<AppState>> {
    let read = Guard::new(state, Scopes::READ, Some(Op::Schema));
    let admin = Guard::new(state, Scopes::ADMIN, Some(Op::Schema));
    router
        .route("/v1/schemas", read.on(get(list)))
        .route("/v1/schemas/{type}", read.on(get(show)))
        .route("/v1/admin/schemas/{type}", admin.on(post(register)))
        .route(
            "/v1/admin/schemas/{type}/enforcement",
            admin.on(put(enforcement)),
        )
        .route("/v1/admin/schema-policy", admin.on(put(policy)))
}

/// Registers the schemas the configuration names, and sets its policy for types without
/// one: at start, before the server listens. A replica takes its primary's.
pub(crate) fn load(
    config: &crate::Config,
    store: &Store,
    registry: &Registry,
) -> Result<(), String> {
    if config.replica_of.is_some() {
        if !config.schemas.is_empty() || config.schema_unknown_types.is_some() {
            tracing::warn!(
                "a replica takes its primary's schemas: the configured ones are not registered"
            );
        }
        return Ok(());
    }
    for crate::config::SchemaFile { event_type, file } in &config.schemas {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("the schema of {event_type:?} ({}): {e}", file.display()))?;
        let schema: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            format!(
                "the schema of {event_type:?} ({}) is not JSON: {e}",
                file.display()
            )
        })?;
        let mut log = progress_log(event_type);
        let done = registry
            .register(store, Registration::new(event_type, schema), &mut log)
            .map_err(|e| format!("the schema of {event_type:?} ({}): {e}", file.display()))?;
        if !done.unchanged {
            tracing::info!(
                event_type,
                version = done.version,
                checked = done.checked_events,
                "schema registered from the configuration"
            );
        }
    }
    if let Some(unknown) = config.schema_unknown_types {
        registry
            .set_unknown_types(store, unknown)
            .map_err(|e| format!("schema_unknown_types: {e}"))?;
    }
    Ok(())
}

/// Logs a history check's progress every few seconds.
fn progress_log(event_type: &str) -> impl FnMut(annals::registry::Progress) + '_ {
    let mut last = Instant::now();
    move |p| {
        if last.elapsed() >= Duration::from_secs(2) {
            last = Instant::now();
            tracing::info!(
                event_type,
                checked = p.checked,
                failed = p.failed,
                position = p.position,
                head = p.head,
                "checking the stored events against a new schema version"
            );
        }
    }
}

fn registry(state: &AppState) -> Result<Arc<Registry>, ApiError> {
    state.registry.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_schema_registry",
            "this server's store was opened without a schema registry",
        )
    })
}

/// What each event a read or a stream sends was checked against when it was appended, for
/// the event's `schema` member: looked up in the registry's rules, taken anew once an event
/// comes after the head they answer for.
pub(crate) struct SchemaNotes {
    registry: Option<Arc<Registry>>,
    checked: Option<annals::registry::Checked>,
}

impl SchemaNotes {
    pub(crate) fn new(state: &AppState) -> SchemaNotes {
        SchemaNotes {
            registry: state.registry.clone(),
            checked: None,
        }
    }

    /// None when the store has no registry, the event's type had no schema when it was
    /// appended, or its enforcement was off.
    pub(crate) fn of(
        &mut self,
        log: &dyn annals::admission::LogView,
        event: &annals::Event,
    ) -> Result<Option<annals::registry::CheckedAgainst>, RegistryError> {
        let Some(registry) = &self.registry else {
            return Ok(None);
        };
        if (self.checked.as_ref()).is_none_or(|c| c.through() < event.position()) {
            self.checked = Some(registry.checked(log)?);
        }
        let checked = self.checked.as_ref().expect("taken above");
        if checked.is_empty() || checked.through() < event.position() {
            // Rules taken after the event was read cover it, unless the log went back (a
            // truncation in repair): then say nothing rather than guess.
            return Ok(None);
        }
        Ok(checked.of(event.event_type(), event.position()))
    }
}

pub(crate) fn registry_error(e: &RegistryError) -> ApiError {
    let message = e.to_string();
    let kind = e.kind();
    match e {
        RegistryError::InvalidType(_)
        | RegistryError::InvalidSchema(_)
        | RegistryError::UnknownDraft(_) => ApiError::bad_request(kind, message),
        RegistryError::SchemaTooLarge { .. } => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, kind, message)
        }
        RegistryError::VersionTaken { .. } => ApiError::new(StatusCode::CONFLICT, kind, message),
        // The request is well formed; the store's history is what it conflicts with.
        RegistryError::History(failure) => ApiError::new(StatusCode::CONFLICT, kind, message)
            .with_violations(
                failure
                    .events
                    .iter()
                    .flat_map(|f| {
                        f.errors
                            .iter()
                            .map(|v| answers::Violation::of(v, Some(f.position)))
                    })
                    .collect(),
            ),
        // No event of the type at the position asked about: what was asked for is not there.
        RegistryError::NotFound(_)
        | RegistryError::NoEvent(_)
        | RegistryError::OtherType { .. } => ApiError::new(StatusCode::NOT_FOUND, kind, message),
        RegistryError::Append(e) => append_error(e),
        RegistryError::Read(_) | RegistryError::Busy(_) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, kind, message)
        }
    }
}

fn word<T: serde::Serialize>(value: T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn type_answer(t: TypeSchemas, with_schemas: bool) -> answers::SchemaType {
    answers::SchemaType {
        event_type: t.event_type,
        enforcement: word(t.enforcement),
        versions: t
            .versions
            .into_iter()
            .map(|v| answers::SchemaVersionInfo {
                version: v.version,
                position: v.position,
                draft: v.draft.into(),
                check: word(v.check),
                checked_events: v.checked_events,
                registered_at_us: v.registered_at_us,
                schema: with_schemas.then_some(v.schema),
            })
            .collect(),
        checked_against: None,
    }
}

/// Runs a registry call off the runtime's threads: it may read the log.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RegistryError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(|e| registry_error(&e))
}

fn no_parameters(request: &Request, what: &str) -> Result<(), ApiError> {
    match request.uri().query() {
        Some(_) => Err(ApiError::bad_request(
            "invalid_parameter",
            format!("{what} takes no query parameters"),
        )),
        None => Ok(()),
    }
}

async fn list(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    no_parameters(&request, "the list of schemas")?;
    let (registry, store) = (registry(&state)?, state.store.clone());
    let (types, unknown) = blocking(move || {
        Ok((
            registry.types(store.as_ref())?,
            registry.unknown_types(store.as_ref())?,
        ))
    })
    .await?;
    let answer = answers::SchemaList {
        unknown_types: word(unknown),
        types: types.into_iter().map(|t| type_answer(t, false)).collect(),
    };
    Ok(answer_response(StatusCode::OK, &answer))
}

async fn show(
    State(state): State<Arc<AppState>>,
    Path(event_type): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Params {
        position: Option<u64>,
    }
    let params: Params = serde_urlencoded::from_str(query_string(&state, &request)?)
        .map_err(|e| ApiError::bad_request("invalid_parameter", e.to_string()))?;
    let (registry, store) = (registry(&state)?, state.store.clone());
    let name = event_type.clone();
    let (found, against) = blocking(move || {
        let found = registry.schemas_of(store.as_ref(), &name)?;
        let against = match (&found, params.position) {
            (Some(_), Some(p)) => Some(registry.checked_against(store.as_ref(), &name, p)?),
            _ => None,
        };
        Ok((found, against))
    })
    .await?;
    let Some(found) = found else {
        return Err(registry_error(&RegistryError::NotFound(event_type)));
    };
    let mut answer = type_answer(found, true);
    answer.checked_against = against.map(|a| {
        a.map(|a| answers::CheckedAgainst {
            version: a.version,
            enforcement: word(a.enforcement),
        })
    });
    Ok(answer_response(StatusCode::OK, &answer))
}

/// Which stored events a new version must accept.
#[derive(Deserialize, schemars::JsonSchema, Clone, Copy, Default)]
#[schemars(rename = "SchemaHistoryCheck")]
#[serde(rename_all = "snake_case")]
pub(crate) enum Check {
    /// Every stored event of the type.
    #[default]
    Stored,
    /// Those the previous version accepts.
    PreviouslyAccepted,
}

/// A registration's body.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "SchemaRegistration")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RegisterBody {
    /// The JSON Schema: 2020-12 unless its $schema names draft 7; no references outside it;
    /// at most 64 KiB of JSON.
    #[schemars(extend("type" = ["object", "boolean"]))]
    schema: serde_json::Value,
    #[serde(default)]
    check: Check,
    /// The version it must become (refused 409 version_taken when that is not the next).
    #[schemars(range(min = 1, max = 4294967295u32))]
    version: Option<u32>,
    /// Check the stored events, register nothing.
    #[serde(default)]
    dry_run: bool,
}

async fn register(
    State(state): State<Arc<AppState>>,
    Path(event_type): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    no_parameters(&request, "a registration")?;
    let streamed = accepts(request.headers(), NDJSON);
    let body = read_body(&state, request).await?;
    let parsed: RegisterBody =
        serde_json::from_slice(&body).map_err(body_error("registration body"))?;
    if parsed.version == Some(0) {
        return Err(ApiError::bad_request(
            "invalid_body",
            "registration body: versions count from 1",
        ));
    }
    let registration = Registration {
        event_type,
        schema: parsed.schema,
        check: match parsed.check {
            Check::Stored => HistoryCheck::Stored,
            Check::PreviouslyAccepted => HistoryCheck::PreviouslyAccepted,
        },
        version: parsed.version,
        dry_run: parsed.dry_run,
    };
    let (registry, store) = (registry(&state)?, state.store.clone());
    if streamed {
        return Ok(stream_registration(registry, store, registration));
    }
    let done = blocking(move || {
        let event_type = registration.event_type.clone();
        let mut log = progress_log(&event_type);
        registry.register(store.as_ref(), registration, &mut log)
    })
    .await?;
    let status = match done.unchanged || done.dry_run {
        true => StatusCode::OK,
        false => StatusCode::CREATED,
    };
    Ok(answer_response(status, &registered(done)))
}

fn registered(done: annals::registry::Registered) -> answers::SchemaRegistered {
    answers::SchemaRegistered {
        event_type: done.event_type,
        version: done.version,
        position: done.position,
        checked_events: done.checked_events,
        passed_over: done.passed_over,
        unchanged: done.unchanged,
        dry_run: done.dry_run,
    }
}

/// A registration answered as NDJSON: a line `{"progress":{...}}` now and then while the
/// stored events are checked, then `{"registered":{...}}` or `{"error":{...}}` (the refusal
/// the plain answer would have been, with its status). The status line is 200 either way:
/// it is sent before the outcome is known.
fn stream_registration(
    registry: Arc<Registry>,
    store: Arc<Store>,
    registration: Registration,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(16);
    tokio::task::spawn_blocking(move || {
        let line = |value: serde_json::Value| Ok(bytes::Bytes::from(format!("{value}\n")));
        let event_type = registration.event_type.clone();
        let mut log = progress_log(&event_type);
        let progress_tx = tx.clone();
        let mut progress = |p: annals::registry::Progress| {
            log(p);
            // Progress only: a line the client is too slow for is left out.
            let _ = progress_tx.try_send(line(serde_json::json!({ "progress": p })));
        };
        let last = match registry.register(store.as_ref(), registration, &mut progress) {
            Ok(done) => serde_json::json!({ "registered": registered(done) }),
            Err(e) => {
                let e = registry_error(&e);
                serde_json::json!({ "error": {
                    "status": e.status.as_u16(), "kind": e.kind, "error": e.message,
                    "violations": e.violations,
                } })
            }
        };
        let _ = tx.blocking_send(line(last));
    });
    let mut response = Response::new(axum::body::Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(NDJSON),
    );
    response
}

/// A type's enforcement.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "SchemaEnforcement")]
#[serde(deny_unknown_fields)]
pub(crate) struct EnforcementBody {
    /// reject: appends with an event that fails are refused; warn: stored, counted and
    /// logged; off: not checked.
    enforcement: Enforcement,
}

async fn enforcement(
    State(state): State<Arc<AppState>>,
    Path(event_type): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    no_parameters(&request, "an enforcement")?;
    let body = read_body(&state, request).await?;
    let parsed: EnforcementBody =
        serde_json::from_slice(&body).map_err(body_error("enforcement body"))?;
    let (registry, store) = (registry(&state)?, state.store.clone());
    let position =
        blocking(move || registry.set_enforcement(store.as_ref(), &event_type, parsed.enforcement))
            .await?;
    Ok(answer_response(
        StatusCode::OK,
        &answers::SchemaSettingChanged { position },
    ))
}

/// The store-wide policy.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "SchemaPolicy")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct PolicyBody {
    /// allow (the default) or refuse events of types without a schema.
    unknown_types: UnknownTypes,
}

async fn policy(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    no_parameters(&request, "the schema policy")?;
    let body = read_body(&state, request).await?;
    let parsed: PolicyBody = serde_json::from_slice(&body).map_err(body_error("policy body"))?;
    let (registry, store) = (registry(&state)?, state.store.clone());
    let position =
        blocking(move || registry.set_unknown_types(store.as_ref(), parsed.unknown_types)).await?;
    Ok(answer_response(
        StatusCode::OK,
        &answers::SchemaSettingChanged { position },
    ))
}
