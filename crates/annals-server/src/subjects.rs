//! Data subjects over HTTP: `POST /v1/admin/erase` erases one (admin scope).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use serde::Deserialize;

use crate::auth::Scopes;
use crate::http::{answer_response, append_error, read_body, Guard};
use crate::metrics::Op;
use crate::wire::ApiError;
use crate::AppState;

pub(crate) fn routes(
    state: &Arc<AppState>,
    router: axum::Router<Arc<AppState>>,
) -> axum::Router<Arc<AppState>> {
    // Counted with the appends: an erasure appends its receipt.
    let admin = Guard::new(state, Scopes::ADMIN, Some(Op::Append));
    router.route("/v1/admin/erase", admin.on(axum::routing::post(erase)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EraseBody {
    tag: String,
}

/// Erases the data subject `tag` names: its key deleted, a receipt appended; answers how
/// many events it made unreadable. Idempotent.
async fn erase(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    erase_inner(&state, request).await
}

async fn erase_inner(state: &Arc<AppState>, request: Request) -> Result<Response, ApiError> {
    let body = read_body(state, request).await?;
    let parsed: EraseBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_body",
            format!("expected {{\"tag\": \"customer:42\"}}: {e}"),
        )
    })?;
    let store = state.store.clone();
    let models = state.read_models.clone();
    let tag = parsed.tag;
    let erased = tokio::task::spawn_blocking(move || {
        let erasure = store.erase_subject(&tag)?;
        let rebuilt = models.seeing(&store, &tag);
        Ok::<_, annals::AppendError>((erasure, rebuilt))
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "erase_failed",
            e.to_string(),
        )
    })?;
    match erased {
        Ok((e, rebuilt)) => {
            let answer = crate::answers::Erased {
                read_models_rebuilt: Some(rebuilt),
                ..crate::answers::Erased::from(&e)
            };
            Ok(answer_response(StatusCode::OK, &answer))
        }
        Err(e) => Err(append_error(&e)),
    }
}
