//! `/templates`: list and get.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, TimeZone, Utc};
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::AppState;
use crate::store::{Millis, TemplateRecord};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/templates", get(list))
        .route("/templates/{id}", get(get_one))
}

fn time(millis: Millis) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(millis)
        .single()
        .unwrap_or_default()
}

fn status(record: &TemplateRecord) -> api::TemplateBuildStatus {
    match record.status.as_str() {
        "ready" => api::TemplateBuildStatus::Ready,
        "building" => api::TemplateBuildStatus::Building,
        "waiting" => api::TemplateBuildStatus::Waiting,
        _ => api::TemplateBuildStatus::Error,
    }
}

fn template(record: &TemplateRecord) -> api::Template {
    api::Template {
        template_id: record.id.clone(),
        build_id: record.build_id.clone(),
        cpu_count: record.vcpus.ceil().max(1.0) as u32,
        memory_mb: record.memory_mib,
        disk_size_mb: record.disk_mib,
        public: record.public,
        aliases: record.aliases.clone(),
        names: record.aliases.clone(),
        created_at: time(record.created_at),
        updated_at: time(record.updated_at),
        created_by: None,
        last_spawned_at: record.last_spawned_at.map(time),
        spawn_count: record.spawn_count,
        build_count: 1,
        envd_version: record.envd_version.clone(),
        build_status: status(record),
    }
}

async fn list(
    State(state): State<AppState>,
    _key: Authenticated,
) -> Result<Json<Vec<api::Template>>, ApiError> {
    let records = state.lifecycle.store().list_templates().await?;
    Ok(Json(records.iter().map(template).collect()))
}

async fn get_one(
    State(state): State<AppState>,
    _key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<api::TemplateWithBuilds>, ApiError> {
    let Some(record) = state.lifecycle.store().get_template(&id).await? else {
        return Err(ApiError::not_found(format!("template '{id}' not found")));
    };
    let build = api::TemplateBuild {
        build_id: record.build_id.clone(),
        status: status(&record),
        created_at: time(record.created_at),
        updated_at: time(record.updated_at),
        cpu_count: record.vcpus.ceil().max(1.0) as u32,
        memory_mb: record.memory_mib,
        finished_at: Some(time(record.updated_at)),
        disk_size_mb: Some(record.disk_mib),
        envd_version: Some(record.envd_version.clone()),
    };
    Ok(Json(api::TemplateWithBuilds {
        template: template(&record),
        builds: vec![build],
    }))
}
