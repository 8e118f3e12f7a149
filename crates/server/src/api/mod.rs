//! The E2B-compatible REST API: a router per resource, auth and validation as extractors, handlers that
//! only call the lifecycle and the store.

pub mod auth;
pub mod error;
pub(crate) mod events;
pub mod extract;
mod meta;
mod paging;
mod sandboxes;
mod snapshots;
mod teams;
mod templates;
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
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(sandboxes::router())
        .merge(events::router())
        .merge(webhooks::router())
        .merge(snapshots::router())
        .merge(templates::router())
        .merge(teams::router())
        .merge(workspaces::router())
        .merge(meta::router())
        .fallback(|| async { error::ApiError::not_found("no such endpoint") })
        .with_state(state)
}
