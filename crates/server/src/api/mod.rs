//! The E2B-compatible REST API: a router per resource, auth and validation as extractors, handlers that
//! only call the lifecycle and the store.

pub mod auth;
pub mod error;
pub(crate) mod events;
pub mod extract;
mod meta;
mod paging;
mod sandboxes;
mod secrets;
mod snapshots;
mod teams;
mod templates;
mod volumes;
mod webhooks;
mod workspaces;

use std::sync::Arc;

use axum::Router;

pub use meta::OPENAPI_JSON;

use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::templates::builds::TemplateBuilds;

#[derive(Clone)]
pub struct AppState {
    pub lifecycle: Arc<Lifecycle>,
    pub metrics: Arc<Metrics>,
    pub builds: Arc<TemplateBuilds>,
    pub dashboard: Arc<crate::dashboard::Sessions>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(sandboxes::router())
        .merge(secrets::router())
        .merge(events::router())
        .merge(webhooks::router())
        .merge(snapshots::router())
        .merge(templates::router())
        .merge(teams::router())
        .merge(workspaces::router())
        .merge(volumes::router())
        .merge(meta::router())
        .merge(crate::dashboard::router())
        .fallback(|| async { error::ApiError::not_found("no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_errors,
        ))
        .layer(axum::middleware::from_fn(drain_after_error))
        .with_state(state)
}

/// A request refused before its body was read (a bad API key, a missing header) keeps its
/// connection: the rest of the body is read before the answer goes out, so a client still
/// writing it reads the error instead of "broken pipe" (see `warren_proto::body_drain`).
async fn drain_after_error(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    warren_proto::body_drain::drain_after_error(request, |r| next.run(r.map(axum::body::Body::new)))
        .await
}

/// Counts every 4xx and 5xx answer by method and declared route (`warren_api_errors_total`).
async fn count_errors(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let method = request.method().clone();
    let response = next.run(request).await;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        state
            .metrics
            .api_error(method.as_str(), &route, status.as_u16());
    }
    response
}
