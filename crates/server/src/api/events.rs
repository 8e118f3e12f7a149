//! `GET /events/sandboxes` and `GET /events/sandboxes/{id}`: E2B's lifecycle events API. A team sees
//! the events of its own sandboxes, killed ones included; the steps in between (`creating`,
//! `pausing`, …) are not events here, only what E2B reports: created, paused, resumed, updated (an
//! event without a state change, such as a policy's report) and killed (failures too, with the reason).

use axum::extract::{Path, State};
use axum::Json;
use chrono::{TimeZone, Utc};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::QueryPairs;
use super::AppState;
use crate::store::{EventQuery, LifecycleEvent};

/// The types E2B's API names; `types` must be among them.
pub const EVENT_TYPES: [&str; 5] = [
    "sandbox.lifecycle.created",
    "sandbox.lifecycle.paused",
    "sandbox.lifecycle.resumed",
    "sandbox.lifecycle.updated",
    "sandbox.lifecycle.killed",
];

/// Whether `kind` is one of [`EVENT_TYPES`].
pub(crate) fn known_type(kind: &str) -> bool {
    EVENT_TYPES.contains(&kind)
}

/// Most events one request returns.
const MOST: u64 = 100;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(team_events))
        .routes(routes!(sandbox_events))
}

fn number(
    query: &QueryPairs,
    name: &str,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, ApiError> {
    match query.get(name) {
        None => Ok(default),
        Some(text) => match text.parse::<u64>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(ApiError::bad_request(format!(
                "{name} must be a whole number from {} to {}, got {text:?}",
                range.start(),
                range.end()
            ))),
        },
    }
}

/// The query of a request: `offset`, `limit` (1..=100, 10), `orderAsc`, `types` (repeated or
/// comma-separated) and Warren's own `after` (only events with a greater `id`, for following).
fn event_query(
    key: &Authenticated,
    sandbox_id: Option<String>,
    query: &QueryPairs,
) -> Result<EventQuery, ApiError> {
    let ascending = match query.get("orderAsc") {
        None => false,
        Some("true") => true,
        Some("false") => false,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "orderAsc must be true or false, got {other:?}"
            )))
        }
    };
    let mut types = Vec::new();
    for kind in query.all("types").flat_map(|v| v.split(',')).map(str::trim) {
        if kind.is_empty() {
            continue;
        }
        if !EVENT_TYPES.contains(&kind) {
            return Err(ApiError::bad_request(format!(
                "unknown event type {kind:?}: use {}",
                EVENT_TYPES.join(", ")
            )));
        }
        types.push(kind.to_string());
    }
    let after_seq = match query.get("after") {
        None => None,
        Some(text) => Some(text.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!("after must be an event id, got {text:?}"))
        })?),
    };
    Ok(EventQuery {
        team_id: key.team().to_string(),
        sandbox_id,
        types,
        after_seq,
        offset: number(query, "offset", 0, 0..=u64::from(u32::MAX))?,
        limit: number(query, "limit", 10, 1..=MOST)?,
        ascending,
    })
}

pub(crate) fn to_api(event: LifecycleEvent) -> api::SandboxLifecycleEvent {
    let mut data = serde_json::Map::new();
    if let Some(from) = event.event.from_state {
        data.insert("from".into(), from.as_str().into());
    }
    data.insert("to".into(), event.event.to_state.as_str().into());
    if let Some(reason) = &event.event.reason {
        data.insert("reason".into(), reason.clone().into());
    }
    api::SandboxLifecycleEvent {
        version: "v1".into(),
        id: event.event.seq.to_string(),
        kind: event.kind,
        event_data: Some(serde_json::Value::Object(data)),
        sandbox_build_id: event.build_id,
        sandbox_execution_id: None,
        sandbox_id: event.event.sandbox_id,
        sandbox_team_id: event.team_id,
        sandbox_template_id: event.template_id,
        timestamp: Utc
            .timestamp_millis_opt(event.event.at)
            .single()
            .unwrap_or_default(),
    }
}

async fn read(
    state: &AppState,
    query: EventQuery,
) -> Result<Json<Vec<api::SandboxLifecycleEvent>>, ApiError> {
    let events = state.lifecycle.store().lifecycle_events(&query).await?;
    Ok(Json(events.into_iter().map(to_api).collect()))
}

/// `GET /events/sandboxes`: the team's latest events.
#[utoipa::path(
    get,
    path = "/events/sandboxes",
    operation_id = "listTeamSandboxEvents",
    summary = "Lifecycle events of the team's sandboxes (killed ones included)",
    params(
        ("offset" = Option<i64>, Query),
        ("limit" = Option<i64>, Query, description = "10 by default"),
        ("orderAsc" = Option<bool>, Query, description = "Oldest first; newest first by default"),
        ("types" = Option<Vec<String>>, Query),
        ("after" = Option<i64>, Query, description = "Warren's own: only events whose id is greater"),
    ),
    responses(
        (status = 200, description = "SandboxLifecycleEvent list: version, id, type, eventData {from, to, reason}, sandboxBuildId, sandboxExecutionId (null), sandboxId, sandboxTeamId, sandboxTemplateId, timestamp", body = [api::SandboxLifecycleEvent]),
        (status = 400, description = "a query value out of range or an unknown type"),
        (status = 401, response = super::error::Unauthorized),
    ),
)]
async fn team_events(
    State(state): State<AppState>,
    key: Authenticated,
    query: QueryPairs,
) -> Result<Json<Vec<api::SandboxLifecycleEvent>>, ApiError> {
    let query = event_query(&key, None, &query)?;
    read(&state, query).await
}

/// `GET /events/sandboxes/{id}`: one sandbox's events, also once it is killed. Another team's or an
/// unknown sandbox is 404. A template build's sandbox has no record; its events (which name their
/// team) are all there is of it.
#[utoipa::path(
    get,
    path = "/events/sandboxes/{sandboxID}",
    operation_id = "listSandboxEvents",
    summary = "Lifecycle events of one sandbox of the team, also once killed",
    params(
        ("sandboxID" = String, Path),
        ("offset" = Option<i64>, Query),
        ("limit" = Option<i64>, Query, description = "10 by default"),
        ("orderAsc" = Option<bool>, Query, description = "Oldest first; newest first by default"),
        ("types" = Option<Vec<String>>, Query),
        ("after" = Option<i64>, Query, description = "Warren's own: only events whose id is greater"),
    ),
    responses(
        (status = 200, description = "SandboxLifecycleEvent list: version, id, type, eventData {from, to, reason}, sandboxBuildId, sandboxExecutionId (null), sandboxId, sandboxTeamId, sandboxTemplateId, timestamp", body = [api::SandboxLifecycleEvent]),
        (status = 400, description = "a query value out of range or an unknown type"),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
    ),
)]
async fn sandbox_events(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    query: QueryPairs,
) -> Result<Json<Vec<api::SandboxLifecycleEvent>>, ApiError> {
    let record = state.lifecycle.store().get_sandbox(&id).await?;
    let missing = || ApiError::not_found(format!("sandbox {id} not found"));
    if record.as_ref().is_some_and(|r| r.team_id != key.team()) {
        return Err(missing());
    }
    let query = event_query(&key, Some(id.clone()), &query)?;
    let events = read(&state, query).await?;
    if record.is_none() && events.0.is_empty() {
        return Err(missing());
    }
    Ok(events)
}
