//! Unauthenticated endpoints about the server itself: health, the OpenAPI document, Prometheus metrics.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use super::error::ApiError;
use super::AppState;
use crate::store::SandboxFilter;

/// The OpenAPI 3 description of this API.
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
}

async fn health(State(state): State<AppState>) -> impl IntoResponse {
    let capabilities = state.lifecycle.capabilities();
    Json(serde_json::json!({
        "status": "ok",
        "checkpoint": capabilities.checkpoint,
        "pauseMode": if capabilities.checkpoint { "checkpoint" } else { "freeze" },
        "cgroupVersion": capabilities.cgroup_version,
    }))
}

async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}

async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let live = state.lifecycle.list(&SandboxFilter::default()).await?;
    state
        .metrics
        .set_sandbox_counts(live.iter().map(|record| record.state));
    Ok((
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    ))
}
