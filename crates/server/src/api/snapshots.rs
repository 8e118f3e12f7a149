//! Fork and snapshots: `POST /sandboxes/{id}/fork`, `POST /sandboxes/{id}/snapshots`, `GET /snapshots`,
//! `DELETE /snapshots/{id}`. (The SDK's `delete_snapshot` calls `DELETE /templates/{id}`; the templates
//! router hands snapshot ids to [`delete_by_id`].)

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{TimeZone, Utc};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::{OptionalJson, QueryPairs};
use super::paging;
use super::sandboxes::created;
use super::AppState;
use crate::store::{SnapshotFilter, SnapshotRecord};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(fork))
        .routes(routes!(create))
        .routes(routes!(list))
        .routes(routes!(remove))
}

fn info(record: &SnapshotRecord) -> api::SnapshotInfo {
    let mut names = vec![record.id.clone()];
    if let Some(name) = &record.name {
        names.insert(0, name.clone());
    }
    api::SnapshotInfo {
        snapshot_id: record.id.clone(),
        names,
        sandbox_id: Some(record.sandbox_id.clone()),
        size_bytes: Some(record.size_bytes),
        created_at: Utc.timestamp_millis_opt(record.created_at).single(),
    }
}

#[utoipa::path(
    post,
    path = "/sandboxes/{sandboxID}/fork",
    operation_id = "forkSandbox",
    description = "Checkpoints the running sandbox once (it keeps running, with its ID and end time) and restores `count` new sandboxes from it. Each entry of the answer holds the new sandbox or the error of that fork (its own code, e.g. 429). 501 where the host cannot checkpoint.",
    params(
        ("sandboxID" = String, Path),
    ),
    request_body(content = Option<api::SandboxForkRequest>, content_type = "application/json"),
    responses(
        (status = 201, description = "One result per requested fork", body = [api::SandboxForkResult]),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
        (status = 501, description = "This host cannot take checkpoints"),
        (status = 503, response = super::error::ServiceUnavailable),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn fork(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<api::SandboxForkRequest>,
) -> Result<(StatusCode, Json<Vec<api::SandboxForkResult>>), ApiError> {
    key.sandbox(&state, &id).await?;
    let outcomes = state.lifecycle.fork(&id, body.count, body.timeout).await?;
    let results = outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Ok(record) => api::SandboxForkResult {
                sandbox: Some(created(&state, &record)),
                error: None,
            },
            Err(error) => {
                let error = ApiError::from(error);
                api::SandboxForkResult {
                    sandbox: None,
                    error: Some(api::Error {
                        code: error.status.as_u16(),
                        message: error.message,
                        error_code: error.error_code.map(str::to_string),
                    }),
                }
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(results)))
}

#[utoipa::path(
    post,
    path = "/sandboxes/{sandboxID}/snapshots",
    operation_id = "createSnapshot",
    description = "Checkpoints the running sandbox (it keeps running) into a stored snapshot; its snapshotID (or name) works as a templateID. With memory=false only the files are kept (no CRIU needed) and sandboxes created from it boot fresh over them.",
    params(
        ("sandboxID" = String, Path),
    ),
    request_body(content = Option<api::SandboxSnapshotRequest>, content_type = "application/json"),
    responses(
        (status = 201, description = "Snapshot taken", body = api::SnapshotInfo),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
        (status = 501, description = "This host cannot take checkpoints"),
        (status = 503, response = super::error::ServiceUnavailable),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn create(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<api::SandboxSnapshotRequest>,
) -> Result<(StatusCode, Json<api::SnapshotInfo>), ApiError> {
    key.sandbox(&state, &id).await?;
    let memory = body.memory != Some(false);
    let record = state
        .lifecycle
        .create_snapshot(&id, body.name, memory)
        .await?;
    Ok((StatusCode::CREATED, Json(info(&record))))
}

fn encode_token(record: &SnapshotRecord) -> String {
    paging::encode_token(record.created_at, &record.id)
}

#[utoipa::path(
    get,
    path = "/snapshots",
    operation_id = "listSnapshots",
    description = "Snapshots, newest first; the next page's token is in the x-next-token header.",
    params(
        ("sandboxID" = Option<String>, Query),
        ("name" = Option<String>, Query),
        ("limit" = Option<i64>, Query),
        ("nextToken" = Option<String>, Query),
    ),
    responses(
        (status = 200, description = "Snapshots", body = [api::SnapshotInfo]),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn list(
    State(state): State<AppState>,
    key: Authenticated,
    query: QueryPairs,
) -> Result<Response, ApiError> {
    let limit = paging::limit(&query)?;
    let filter = SnapshotFilter {
        team_id: Some(key.team().to_string()),
        sandbox_id: query.get("sandboxID").map(str::to_string),
        name: query.get("name").map(str::to_string),
        after: query
            .get("nextToken")
            .map(paging::decode_token)
            .transpose()?,
        limit: Some(limit + 1),
    };
    let mut records = state.lifecycle.list_snapshots(&filter).await?;
    let headers = paging::trim_page(&mut records, limit, encode_token);
    let body: Vec<api::SnapshotInfo> = records.iter().map(info).collect();
    Ok((headers, Json(body)).into_response())
}

/// Delete snapshot `id` (or name): 204, or 404 when there is none.
pub(super) async fn delete_by_id(
    state: &AppState,
    key: &Authenticated,
    id: &str,
) -> Result<StatusCode, ApiError> {
    let snapshot = key.snapshot(state, id).await?;
    if state.lifecycle.delete_snapshot(&snapshot.id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("snapshot '{id}' not found")))
    }
}

#[utoipa::path(
    delete,
    path = "/snapshots/{snapshotID}",
    operation_id = "deleteSnapshot",
    description = "Deletes the snapshot from the store and the disk (DELETE /templates/{id} does the same for a snapshot id, as the SDK calls it).",
    params(
        ("snapshotID" = String, Path),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn remove(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    delete_by_id(&state, &key, &id).await
}
