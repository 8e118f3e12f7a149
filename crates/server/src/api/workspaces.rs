//! `/workspaces/{user_id}/...`: each user of the key's team mapped to their own sandbox.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{TimeZone, Utc};
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::OptionalJson;
use super::sandboxes::created;
use super::AppState;
use crate::lifecycle::workspaces::WorkspaceRequest;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/workspaces/{user_id}/sandbox", post(sandbox))
        .route("/workspaces/{user_id}/history", get(history))
}

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
