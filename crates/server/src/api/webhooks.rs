//! `/events/webhooks`: E2B's webhook registration. A team registers URLs that get the lifecycle events
//! of its sandboxes it subscribes to (`crate::webhooks` delivers them); the signature secret is kept
//! and never shown again.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{TimeZone, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Authenticated;
use super::error::ApiError;
use super::events::{known_type, EVENT_TYPES};
use super::extract::ApiJson;
use super::AppState;
use crate::lifecycle::now_millis;
use crate::store::WebhookRecord;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, register))
        .routes(routes!(get_one, update, delete))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NewWebhook {
    #[serde(default)]
    name: Option<String>,
    url: String,
    #[serde(default)]
    enabled: Option<bool>,
    events: Vec<String>,
    #[serde(default)]
    signature_secret: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WebhookUpdate {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    events: Option<Vec<String>>,
    #[serde(default)]
    signature_secret: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct Webhook {
    id: String,
    #[serde(rename = "teamID")]
    team_id: String,
    name: String,
    created_at: chrono::DateTime<Utc>,
    enabled: bool,
    events: Vec<String>,
    url: String,
}

fn shown(record: &WebhookRecord) -> Webhook {
    Webhook {
        id: record.id.clone(),
        team_id: record.team_id.clone(),
        name: record.name.clone(),
        created_at: Utc
            .timestamp_millis_opt(record.created_at)
            .single()
            .unwrap_or_default(),
        enabled: record.enabled,
        events: record.events.clone(),
        url: record.url.clone(),
    }
}

/// An http(s) URL that does not name a link-local, unspecified or multicast address (the server
/// would otherwise post on a team's behalf to, say, a cloud metadata service).
fn checked_url(url: &str) -> Result<String, ApiError> {
    let parsed = url::Url::parse(url)
        .map_err(|e| ApiError::bad_request(format!("url {url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ApiError::bad_request(format!(
            "url must be http or https, got {:?}",
            parsed.scheme()
        )));
    }
    let refused = match parsed.host() {
        None => return Err(ApiError::bad_request("url has no host")),
        Some(url::Host::Ipv4(ip)) => ip.is_link_local() || ip.is_unspecified() || ip.is_multicast(),
        Some(url::Host::Ipv6(ip)) => {
            ip.is_unspecified() || ip.is_multicast() || (ip.segments()[0] & 0xffc0) == 0xfe80
        }
        Some(url::Host::Domain(_)) => false,
    };
    if refused {
        return Err(ApiError::bad_request(format!(
            "url {url:?} names a link-local, unspecified or multicast address"
        )));
    }
    Ok(url.to_string())
}

fn checked_events(events: Vec<String>) -> Result<Vec<String>, ApiError> {
    if events.is_empty() {
        return Err(ApiError::bad_request(format!(
            "events must name at least one of {}",
            EVENT_TYPES.join(", ")
        )));
    }
    if let Some(unknown) = events.iter().find(|e| !known_type(e)) {
        return Err(ApiError::bad_request(format!(
            "unknown event type {unknown:?}: use {}",
            EVENT_TYPES.join(", ")
        )));
    }
    Ok(events)
}

async fn owned(state: &AppState, key: &Authenticated, id: &str) -> Result<WebhookRecord, ApiError> {
    state
        .lifecycle
        .store()
        .list_webhooks()
        .await?
        .into_iter()
        .find(|w| w.id == id && w.team_id == key.team())
        .ok_or_else(|| ApiError::not_found(format!("webhook {id} not found")))
}

/// `POST /events/webhooks`: it gets the events that happen from now on.
#[utoipa::path(
    post,
    path = "/events/webhooks",
    operation_id = "registerWebhook",
    summary = "Register a webhook for the lifecycle events of the team's sandboxes (from now on)",
    request_body(content = NewWebhook, content_type = "application/json", description = "name, url (http or https; not link-local, unspecified or multicast), enabled (true), events (sandbox.lifecycle.*), signatureSecret"),
    responses(
        (status = 201, description = "Registered", body = Webhook),
        (status = 400, description = "bad url, empty or unknown events, unknown fields"),
        (status = 401, response = super::error::Unauthorized),
    ),
)]
async fn register(
    State(state): State<AppState>,
    key: Authenticated,
    ApiJson(body): ApiJson<NewWebhook>,
) -> Result<(StatusCode, Json<Webhook>), ApiError> {
    let store = state.lifecycle.store();
    let record = WebhookRecord {
        id: uuid::Uuid::new_v4().to_string(),
        team_id: key.team().to_string(),
        name: body.name.unwrap_or_default(),
        url: checked_url(&body.url)?,
        enabled: body.enabled.unwrap_or(true),
        events: checked_events(body.events)?,
        secret: body.signature_secret.filter(|s| !s.is_empty()),
        delivered_seq: store.latest_event_seq().await?,
        created_at: now_millis(),
    };
    store.upsert_webhook(&record).await?;
    Ok((StatusCode::CREATED, Json(shown(&record))))
}

#[utoipa::path(
    get,
    path = "/events/webhooks",
    operation_id = "listWebhooks",
    summary = "The team's webhooks",
    responses(
        (status = 200, description = "Webhook list", body = [Webhook]),
        (status = 401, response = super::error::Unauthorized),
    ),
)]
async fn list(
    State(state): State<AppState>,
    key: Authenticated,
) -> Result<Json<Vec<Webhook>>, ApiError> {
    let all = state.lifecycle.store().list_webhooks().await?;
    Ok(Json(
        all.iter()
            .filter(|w| w.team_id == key.team())
            .map(shown)
            .collect(),
    ))
}

#[utoipa::path(
    get,
    path = "/events/webhooks/{webhookID}",
    operation_id = "getWebhook",
    params(
        ("webhookID" = String, Path),
    ),
    responses(
        (status = 200, description = "The webhook", body = Webhook),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
    ),
)]
async fn get_one(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<Webhook>, ApiError> {
    Ok(Json(shown(&owned(&state, &key, &id).await?)))
}

/// `PATCH /events/webhooks/{id}`: the fields given replace the old ones.
#[utoipa::path(
    patch,
    path = "/events/webhooks/{webhookID}",
    operation_id = "updateWebhook",
    summary = "The fields given replace the old ones",
    params(
        ("webhookID" = String, Path),
    ),
    request_body(content = WebhookUpdate, content_type = "application/json", description = "name, url (http or https; not link-local, unspecified or multicast), enabled (true), events (sandbox.lifecycle.*), signatureSecret"),
    responses(
        (status = 200, description = "Updated", body = Webhook),
        (status = 400, description = "bad field"),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
    ),
)]
async fn update(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<WebhookUpdate>,
) -> Result<Json<Webhook>, ApiError> {
    let mut record = owned(&state, &key, &id).await?;
    if let Some(name) = body.name {
        record.name = name;
    }
    if let Some(url) = body.url {
        record.url = checked_url(&url)?;
    }
    if let Some(enabled) = body.enabled {
        record.enabled = enabled;
    }
    if let Some(events) = body.events {
        record.events = checked_events(events)?;
    }
    if let Some(secret) = body.signature_secret {
        record.secret = Some(secret).filter(|s| !s.is_empty());
    }
    state.lifecycle.store().upsert_webhook(&record).await?;
    Ok(Json(shown(&record)))
}

#[utoipa::path(
    delete,
    path = "/events/webhooks/{webhookID}",
    operation_id = "deleteWebhook",
    params(
        ("webhookID" = String, Path),
    ),
    responses(
        (status = 200, description = "Deleted"),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
    ),
)]
async fn delete(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    owned(&state, &key, &id).await?;
    state.lifecycle.store().delete_webhook(&id).await?;
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_http_and_never_link_local_unspecified_or_multicast() {
        for refused in [
            "http://169.254.169.254/latest",
            "http://0.0.0.0/x",
            "http://224.0.0.1/x",
            "http://[fe80::1]/x",
            "http://[::]/x",
            "ftp://127.0.0.1/x",
            "not a url",
        ] {
            assert!(checked_url(refused).is_err(), "{refused} was accepted");
        }
        for accepted in ["http://127.0.0.1:9/hook", "https://hooks.example.com/e2b"] {
            assert_eq!(checked_url(accepted).ok().as_deref(), Some(accepted));
        }
    }
}
