//! `/workspaces/{user_id}/...`: each user of the key's team mapped to their own sandbox.

use axum::extract::{Path, State};
use axum::Json;
use chrono::{TimeZone, Utc};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::OptionalJson;
use super::sandboxes::created;
use super::AppState;
use crate::lifecycle::workspaces::WorkspaceRequest;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(sandbox))
        .routes(routes!(history))
}

#[utoipa::path(
    post,
    path = "/workspaces/{user_id}/sandbox",
    operation_id = "workspaceSandbox",
    description = "The user's own sandbox (Warren's, not E2B's): created from the workspace's template the first time, resumed when paused, replaced when killed, failed or lost. Concurrent calls for one user make one sandbox. See docs/operations.md.",
    params(
        ("user_id" = String, Path, description = "The user's ID in your application: 1 to 128 of A-Z a-z 0-9 . _ - @ :"),
    ),
    request_body(content = Option<api::WorkspaceSandboxRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "The user's sandbox and what was done to hand it over", body = api::WorkspaceSandbox),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 429, response = super::error::TooManyRequests),
        (status = 500, response = super::error::InternalError),
        (status = 503, response = super::error::ServiceUnavailable),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn sandbox(
    State(state): State<AppState>,
    key: Authenticated,
    Path(user_id): Path<String>,
    OptionalJson(body): OptionalJson<api::WorkspaceSandboxRequest>,
) -> Result<Json<api::WorkspaceSandbox>, ApiError> {
    let handed = state
        .lifecycle
        .workspace_sandbox(WorkspaceRequest {
            team_id: key.team().to_string(),
            user_id,
            template: body.template_id,
            timeout: body.timeout,
        })
        .await?;
    Ok(Json(api::WorkspaceSandbox {
        user_id: handed.workspace.user_id,
        template_id: handed.workspace.template,
        action: handed.action.as_str().to_string(),
        sandbox: created(&state, &handed.sandbox),
    }))
}

#[utoipa::path(
    get,
    path = "/workspaces/{user_id}/history",
    operation_id = "workspaceHistory",
    description = "Every sandbox the user was given, oldest first, with the reason.",
    params(
        ("user_id" = String, Path, description = "The user's ID in your application: 1 to 128 of A-Z a-z 0-9 . _ - @ :"),
    ),
    responses(
        (status = 200, description = "The workspace and its moves", body = api::WorkspaceHistory),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn history(
    State(state): State<AppState>,
    key: Authenticated,
    Path(user_id): Path<String>,
) -> Result<Json<api::WorkspaceHistory>, ApiError> {
    let (workspace, moves) = state
        .lifecycle
        .workspace_history(key.team(), &user_id)
        .await?;
    Ok(Json(api::WorkspaceHistory {
        user_id: workspace.user_id,
        template_id: workspace.template,
        sandbox_id: workspace.sandbox_id,
        history: moves
            .into_iter()
            .map(|entry| api::WorkspaceMove {
                sandbox_id: entry.sandbox_id,
                action: entry.action,
                reason: entry.reason,
                at: Utc
                    .timestamp_millis_opt(entry.at)
                    .single()
                    .unwrap_or_default(),
            })
            .collect(),
    }))
}
