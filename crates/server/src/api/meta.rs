//! Unauthenticated endpoints about the server itself: health, the OpenAPI document, Prometheus metrics.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::Json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::AppState;
use crate::store::SandboxFilter;

/// The OpenAPI document, rendered once.
static OPENAPI_JSON: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    super::openapi_document()
        .to_pretty_json()
        .expect("the OpenAPI document serialises")
});

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(openapi))
        .routes(routes!(metrics))
}

/// `GET /health`: the server answers, and how it pauses.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct Health {
    /// Always `ok`.
    status: &'static str,
    /// Whether this host checkpoints with CRIU (pause keeps processes across restarts).
    checkpoint: bool,
    /// `checkpoint` or `freeze` (the cgroup freezer, in memory only).
    pause_mode: &'static str,
    /// 1 or 2.
    cgroup_version: u8,
}

#[utoipa::path(
    get,
    path = "/health",
    operation_id = "health",
    responses(
        (status = 200, description = "Server health and pause capability", body = Health),
    ),
    security(),
)]
async fn health(State(state): State<AppState>) -> Json<Health> {
    let capabilities = state.lifecycle.capabilities();
    Json(Health {
        status: "ok",
        checkpoint: capabilities.checkpoint,
        pause_mode: if capabilities.checkpoint {
            "checkpoint"
        } else {
            "freeze"
        },
        cgroup_version: capabilities.cgroup_version,
    })
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    responses(
        (status = 200, description = "This document", body = serde_json::Value),
    ),
    security(),
)]
async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], OPENAPI_JSON.as_str())
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "prometheusMetrics",
    responses(
        (status = 200, description = "Prometheus text format", body = String, content_type = "application/openmetrics-text"),
    ),
    security(),
)]
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
