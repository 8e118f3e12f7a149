//! What the fleet page shows beyond the REST API: how long the team's creates, resumes and pauses
//! took over time (each finishing event records its operation's duration), and the notes of the
//! fleet-hygiene checks (runaway processes, OOM kills, memory pressure, full disks, orphans reaped,
//! sandboxes the reconciler destroyed). Both are read from the store, scoped to the key's team.

use crate::api::time;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::api::auth::Authenticated;
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::lifecycle::now_millis;
use crate::store::Millis;

/// The latency chart's window when the page names none, and the longest it may name.
const DEFAULT_MINUTES: u32 = 60;
const MAX_MINUTES: u32 = 7 * 24 * 60;
/// At most this many operations in one answer (the newest).
const MAX_OPERATIONS: u32 = 5000;
/// Policy notes in one answer when the page names no limit, and the most it may ask for.
const DEFAULT_POLICY_EVENTS: u32 = 100;
const MAX_POLICY_EVENTS: u32 = 1000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/dashboard/api/fleet/latency", get(latency))
        .route("/dashboard/api/fleet/policy-events", get(policy_events))
}

#[derive(Deserialize)]
struct LatencyQuery {
    minutes: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Latency {
    /// The start of the window.
    since: DateTime<Utc>,
    /// Newest first.
    operations: Vec<TimedOperation>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TimedOperation {
    /// When it finished.
    at: DateTime<Utc>,
    /// `create`, `resume` or `pause`.
    operation: &'static str,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    /// How long it took, in milliseconds.
    ms: Millis,
}

/// `GET /dashboard/api/fleet/latency?minutes=`: the team's creates, resumes and pauses that
/// finished in the last `minutes` (60 unless named), with their durations.
async fn latency(
    auth: Authenticated,
    State(state): State<AppState>,
    Query(query): Query<LatencyQuery>,
) -> Result<Json<Latency>, ApiError> {
    let minutes = query.minutes.unwrap_or(DEFAULT_MINUTES);
    if !(1..=MAX_MINUTES).contains(&minutes) {
        return Err(ApiError::bad_request(format!(
            "minutes must be from 1 to {MAX_MINUTES}, got {minutes}"
        )));
    }
    let since = now_millis() - Millis::from(minutes) * 60_000;
    let timings = state
        .lifecycle
        .store()
        .operation_timings(auth.team(), since, MAX_OPERATIONS)
        .await?;
    Ok(Json(Latency {
        since: time(since),
        operations: timings
            .into_iter()
            .map(|timing| TimedOperation {
                at: time(timing.at),
                operation: timing.operation.as_str(),
                sandbox_id: timing.sandbox_id,
                ms: timing.took,
            })
            .collect(),
    }))
}

#[derive(Deserialize)]
struct PolicyQuery {
    limit: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PolicyNote {
    timestamp: DateTime<Utc>,
    /// `runaway_cpu`, `oom_kill`, `memory_pressure`, `disk_full`, `orphans` or `reconciler`.
    policy: &'static str,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "templateID", skip_serializing_if = "Option::is_none")]
    template_id: Option<String>,
    /// What the check found and did.
    message: String,
}

/// `GET /dashboard/api/fleet/policy-events?limit=`: the newest notes of the fleet-hygiene checks on
/// the team's sandboxes (100 unless named).
async fn policy_events(
    auth: Authenticated,
    State(state): State<AppState>,
    Query(query): Query<PolicyQuery>,
) -> Result<Json<Vec<PolicyNote>>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_POLICY_EVENTS);
    if !(1..=MAX_POLICY_EVENTS).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be from 1 to {MAX_POLICY_EVENTS}, got {limit}"
        )));
    }
    let events = state
        .lifecycle
        .store()
        .policy_events(auth.team(), limit)
        .await?;
    Ok(Json(
        events
            .into_iter()
            .map(|note| PolicyNote {
                timestamp: time(note.event.at),
                policy: note.policy.as_str(),
                sandbox_id: note.event.sandbox_id,
                template_id: note.template_id,
                message: note.event.reason.unwrap_or_default(),
            })
            .collect(),
    ))
}
