//! `/teams` and `/api-keys`: tenancy, for admin keys only. Every other key sees and acts on its own
//! team's resources and gets 403 here. `/api-keys` follows E2B's shapes (list, create with the secret
//! shown once, delete by ID) with the team added; `/teams` is Warren's own.

use super::time;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::ApiJson;
use super::AppState;
use crate::keys::{self, KeyError, TeamQuotas};
use crate::store::{ApiKeyRecord, TeamRecord};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_teams, create_team))
        .routes(routes!(list_keys, create_key))
        .routes(routes!(revoke_key))
}

impl From<KeyError> for ApiError {
    fn from(error: KeyError) -> ApiError {
        match &error {
            KeyError::BadName(_) | KeyError::BadTeamName(_) => {
                ApiError::bad_request(error.to_string())
            }
            KeyError::TeamExists(_) => ApiError::new(StatusCode::CONFLICT, error.to_string()),
            KeyError::NotFound(_) | KeyError::NoTeam(_) => ApiError::not_found(error.to_string()),
            KeyError::Store(_) => ApiError::internal(&error),
        }
    }
}

#[derive(utoipa::ToSchema, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Team {
    #[serde(rename = "teamID")]
    team_id: String,
    name: String,
    max_sandboxes: Option<u32>,
    max_vcpus: Option<f64>,
    #[serde(rename = "maxMemoryMB")]
    max_memory_mb: Option<u64>,
    created_at: DateTime<Utc>,
}

impl From<&TeamRecord> for Team {
    fn from(team: &TeamRecord) -> Team {
        Team {
            team_id: team.id.clone(),
            name: team.name.clone(),
            max_sandboxes: team.max_sandboxes,
            max_vcpus: team.max_vcpus,
            max_memory_mb: team.max_memory_mib,
            created_at: time(team.created_at),
        }
    }
}

#[derive(utoipa::ToSchema, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NewTeam {
    name: String,
    #[serde(default)]
    max_sandboxes: Option<u32>,
    #[serde(default)]
    max_vcpus: Option<f64>,
    #[serde(default, rename = "maxMemoryMB")]
    max_memory_mb: Option<u64>,
}

#[utoipa::path(
    get,
    path = "/teams",
    operation_id = "listTeams",
    description = "Every team with its quotas (admin keys only).",
    responses(
        (status = 200, description = "The teams", body = [Team]),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn list_teams(
    State(state): State<AppState>,
    key: Authenticated,
) -> Result<Json<Vec<Team>>, ApiError> {
    key.require_admin()?;
    let teams = keys::list_teams(state.lifecycle.store().as_ref()).await?;
    Ok(Json(teams.iter().map(Team::from).collect()))
}

#[utoipa::path(
    post,
    path = "/teams",
    operation_id = "createTeam",
    description = "Creates a team with optional quotas (admin keys only).",
    request_body(content = NewTeam, content_type = "application/json"),
    responses(
        (status = 201, description = "The new team", body = Team),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 409, description = "A team of that name exists", body = warren_proto::api::Error),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn create_team(
    State(state): State<AppState>,
    key: Authenticated,
    ApiJson(body): ApiJson<NewTeam>,
) -> Result<(StatusCode, Json<Team>), ApiError> {
    key.require_admin()?;
    if body.max_vcpus.is_some_and(|v| !(v > 0.0 && v.is_finite())) {
        return Err(ApiError::bad_request("maxVcpus must be a positive number"));
    }
    let quotas = TeamQuotas {
        max_sandboxes: body.max_sandboxes,
        max_vcpus: body.max_vcpus,
        max_memory_mib: body.max_memory_mb,
    };
    let team = keys::create_team(state.lifecycle.store().as_ref(), &body.name, quotas).await?;
    Ok((StatusCode::CREATED, Json(Team::from(&team))))
}

/// E2B's `IdentifierMaskingDetails`: what of the secret may be shown.
#[derive(utoipa::ToSchema, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Mask {
    prefix: String,
    masked_value_prefix: String,
}

#[derive(utoipa::ToSchema, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiKey {
    id: String,
    name: String,
    #[serde(rename = "teamID")]
    team_id: String,
    admin: bool,
    mask: Mask,
    created_at: DateTime<Utc>,
    last_used: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

impl ApiKey {
    fn of(record: &ApiKeyRecord, secret: Option<String>) -> ApiKey {
        ApiKey {
            id: record.id.clone(),
            name: record.name.clone(),
            team_id: record.team_id.clone(),
            admin: record.admin,
            mask: Mask {
                prefix: keys::SECRET_PREFIX.to_string(),
                masked_value_prefix: record.prefix.clone(),
            },
            created_at: time(record.created_at),
            last_used: record.last_used_at.map(time),
            key: secret,
        }
    }
}

#[derive(utoipa::ToSchema, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NewApiKey {
    name: String,
    /// Team ID or name; the calling key's team when absent.
    #[serde(default, rename = "teamID")]
    team_id: Option<String>,
    #[serde(default)]
    admin: bool,
}

#[utoipa::path(
    get,
    path = "/api-keys",
    operation_id = "listApiKeys",
    description = "The live API keys of every team, masked (admin keys only).",
    responses(
        (status = 200, description = "The keys", body = [ApiKey]),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn list_keys(
    State(state): State<AppState>,
    key: Authenticated,
) -> Result<Json<Vec<ApiKey>>, ApiError> {
    key.require_admin()?;
    let keys = keys::list_keys(state.lifecycle.store().as_ref()).await?;
    let live = keys.iter().filter(|k| k.revoked_at.is_none());
    Ok(Json(live.map(|k| ApiKey::of(k, None)).collect()))
}

#[utoipa::path(
    post,
    path = "/api-keys",
    operation_id = "createApiKey",
    description = "Creates an API key for a team (the caller's when teamID is absent); the secret is in this answer only (admin keys only).",
    request_body(content = NewApiKey, content_type = "application/json"),
    responses(
        (status = 201, description = "The new key with its secret", body = ApiKey),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, description = "No such team", body = warren_proto::api::Error),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn create_key(
    State(state): State<AppState>,
    key: Authenticated,
    ApiJson(body): ApiJson<NewApiKey>,
) -> Result<(StatusCode, Json<ApiKey>), ApiError> {
    key.require_admin()?;
    let team = body.team_id.as_deref().unwrap_or(key.team());
    let created = keys::create_key(
        state.lifecycle.store().as_ref(),
        &body.name,
        team,
        body.admin,
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(ApiKey::of(&created.record, Some(created.secret))),
    ))
}

#[utoipa::path(
    delete,
    path = "/api-keys/{apiKeyID}",
    operation_id = "deleteApiKey",
    description = "Revokes an API key (admin keys only).",
    params(("apiKeyID" = String, Path)),
    responses(
        (status = 204, description = "Revoked"),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, description = "No such key", body = warren_proto::api::Error),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn revoke_key(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    key.require_admin()?;
    keys::revoke_key(state.lifecycle.store().as_ref(), &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
