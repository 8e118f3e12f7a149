//! `X-API-Key` authentication as an extractor: a handler that takes [`Authenticated`] only runs for a live
//! key.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use warren_proto::api::API_KEY_HEADER;

use super::error::ApiError;
use super::AppState;
use crate::keys;
use crate::lifecycle::LifecycleError;
use crate::store::{ApiKeyRecord, SandboxRecord, SnapshotRecord, TemplateRecord};

/// The key that authenticated this request.
pub struct Authenticated(pub ApiKeyRecord);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let from_header = parts
            .headers
            .get(API_KEY_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::trim);
        let from_bearer = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(secret) = from_header
            .or(from_bearer)
            .filter(|secret| !secret.is_empty())
        else {
            // The dashboard's browser code sends its session cookie instead (CSRF-checked there).
            if let Some(key) =
                crate::dashboard::authenticate_session(&parts.method, &parts.headers, state).await?
            {
                return Ok(Authenticated(key));
            }
            return Err(ApiError::unauthorized(format!(
                "missing {API_KEY_HEADER} header"
            )));
        };
        match keys::authenticate(state.lifecycle.store().as_ref(), secret).await? {
            Some(key) => Ok(Authenticated(key)),
            None => Err(ApiError::unauthorized("invalid API key")),
        }
    }
}

/// What a key may see: its own team's sandboxes, snapshots and templates, and public templates.
/// Another team's resource answers exactly as a missing one does (404), so keys cannot probe for IDs.
impl Authenticated {
    pub fn team(&self) -> &str {
        &self.0.team_id
    }

    /// 403 unless this is an admin key.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.0.admin {
            Ok(())
        } else {
            Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "this needs an admin API key",
            ))
        }
    }

    /// The sandbox `id` if it belongs to this key's team.
    pub async fn sandbox(&self, state: &AppState, id: &str) -> Result<SandboxRecord, ApiError> {
        let record = state.lifecycle.get(id).await?;
        if record.team_id == self.0.team_id {
            Ok(record)
        } else {
            Err(LifecycleError::NotFound(id.to_string()).into())
        }
    }

    /// A sandbox of this key's team that the store still has, ended ones included (their logs stay
    /// readable for the log retention).
    pub async fn any_sandbox(&self, state: &AppState, id: &str) -> Result<SandboxRecord, ApiError> {
        match state.lifecycle.store().get_sandbox(id).await? {
            Some(record) if record.team_id == self.0.team_id => Ok(record),
            _ => Err(LifecycleError::NotFound(id.to_string()).into()),
        }
    }

    /// The template `id_or_alias` if this key's team may use it (its own or a public one).
    pub async fn visible_template(
        &self,
        state: &AppState,
        id_or_alias: &str,
    ) -> Result<TemplateRecord, ApiError> {
        match state.lifecycle.store().get_template(id_or_alias).await? {
            Some(t) if t.public || t.team_id == self.0.team_id => Ok(t),
            _ => Err(ApiError::not_found(format!(
                "template '{id_or_alias}' not found"
            ))),
        }
    }

    /// The template `id_or_alias` if this key's team owns it (to build, upload to or delete).
    pub async fn owned_template(
        &self,
        state: &AppState,
        id_or_alias: &str,
    ) -> Result<TemplateRecord, ApiError> {
        let template = self.visible_template(state, id_or_alias).await?;
        if template.team_id == self.0.team_id {
            Ok(template)
        } else {
            Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                format!("template '{id_or_alias}' belongs to another team"),
            ))
        }
    }

    /// The snapshot `id_or_name` if it belongs to this key's team.
    pub async fn snapshot(
        &self,
        state: &AppState,
        id_or_name: &str,
    ) -> Result<SnapshotRecord, ApiError> {
        match state.lifecycle.store().get_snapshot(id_or_name).await? {
            Some(s) if s.team_id == self.0.team_id => Ok(s),
            _ => Err(ApiError::not_found(format!(
                "snapshot '{id_or_name}' not found"
            ))),
        }
    }
}
