//! The files tab: list a directory, download and upload a file, through the agent's envd
//! filesystem service and `/files` endpoint (the envd client the CLI uses).

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::{envd_error, envd_for};
use crate::api::auth::Authenticated;
use crate::api::error::ApiError;
use crate::api::AppState;

/// Largest upload through the dashboard.
const MAX_UPLOAD_BYTES: usize = 100 * 1024 * 1024;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/dashboard/api/sandboxes/{id}/files", get(list))
        .route(
            "/dashboard/api/sandboxes/{id}/files/content",
            get(download)
                .put(upload)
                .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES)),
        )
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    name: String,
    path: String,
    is_dir: bool,
    size: i64,
}

fn check_path(path: &str) -> Result<(), ApiError> {
    if path.starts_with('/') && !path.contains('\0') {
        Ok(())
    } else {
        Err(ApiError::bad_request("path must be absolute"))
    }
}

async fn list(
    auth: Authenticated,
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
) -> Result<Json<Vec<Entry>>, ApiError> {
    check_path(&query.path)?;
    let record = auth.sandbox(&state, &id).await?;
    let envd = envd_for(&state, &record).await?;
    let mut entries: Vec<Entry> = envd
        .list_dir(&query.path, 1)
        .await
        .map_err(|error| envd_error(&error))?
        .into_iter()
        .map(|entry| Entry {
            is_dir: entry.r#type == warren_proto::envd::filesystem::FileType::Directory as i32,
            name: entry.name,
            path: entry.path,
            size: entry.size,
        })
        .collect();
    entries.sort_by(|a, b| b.is_dir.cmp(&a.is_dir).then_with(|| a.name.cmp(&b.name)));
    Ok(Json(entries))
}

async fn download(
    auth: Authenticated,
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
) -> Result<Response, ApiError> {
    check_path(&query.path)?;
    let record = auth.sandbox(&state, &id).await?;
    let envd = envd_for(&state, &record).await?;
    let bytes = envd
        .read_file(&query.path)
        .await
        .map_err(|error| envd_error(&error))?;
    let name = query
        .path
        .rsplit('/')
        .next()
        .filter(|name| !name.is_empty())
        .unwrap_or("file")
        .replace(['"', '\\', '\r', '\n'], "_");
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        bytes,
    )
        .into_response())
}

async fn upload(
    auth: Authenticated,
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_path(&query.path)?;
    let record = auth.sandbox(&state, &id).await?;
    let envd = envd_for(&state, &record).await?;
    envd.write_file(&query.path, body.to_vec())
        .await
        .map_err(|error| envd_error(&error))?;
    Ok(axum::http::StatusCode::NO_CONTENT.into_response())
}
