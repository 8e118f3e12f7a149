//! `/volumes` (the API key's team) and `/volumecontent/{id}/...` (the volume's bearer token): see
//! docs/volumes.md. Handlers validate and call [`crate::volumes`]; file access is confined there.

use std::path::PathBuf;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::ApiJson;
use super::AppState;
use crate::store::VolumeRecord;
use crate::volumes::content::{self, ContentError, Owner, VolumeFiles};
use crate::volumes::{self as volumes, VolumeError};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/volumes", get(list).post(create))
        .route("/volumes/{volume_id}", get(info).delete(remove))
        .route(
            "/volumecontent/{volume_id}/dir",
            get(list_dir).post(make_dir),
        )
        .route(
            "/volumecontent/{volume_id}/file",
            get(read_file).put(write_file),
        )
        .route(
            "/volumecontent/{volume_id}/path",
            get(stat_path).patch(update_path).delete(remove_path),
        )
}

impl From<VolumeError> for ApiError {
    fn from(error: VolumeError) -> Self {
        match &error {
            VolumeError::BadRequest(message) => ApiError::bad_request(message.clone()),
            VolumeError::NotFound(id) => ApiError::not_found(format!(
                "volume \"{id}\" doesn't exist or you don't have access to it"
            )),
            VolumeError::Conflict(message) => ApiError::new(StatusCode::CONFLICT, message.clone()),
            VolumeError::Disk(_) | VolumeError::Store(_) => ApiError::internal(&error),
        }
    }
}

impl From<ContentError> for ApiError {
    fn from(error: ContentError) -> Self {
        match &error {
            ContentError::BadPath(..) | ContentError::Refused { .. } => {
                ApiError::bad_request(error.to_string())
            }
            ContentError::NotFound(_) => ApiError::not_found(error.to_string()),
            ContentError::Exists(_) => ApiError::new(StatusCode::CONFLICT, error.to_string()),
            ContentError::NoSpace { .. } => ApiError {
                status: StatusCode::INSUFFICIENT_STORAGE,
                message: error.to_string(),
                error_code: Some("volume_quota_exceeded"),
            },
            ContentError::Io(_) => ApiError::internal(&error),
        }
    }
}

fn and_token(state: &AppState, volume: VolumeRecord) -> api::VolumeAndToken {
    let _ = state;
    api::VolumeAndToken {
        volume_id: volume.id,
        name: volume.name,
        token: volume.token,
        domain: None,
    }
}

async fn create(
    State(state): State<AppState>,
    key: Authenticated,
    ApiJson(body): ApiJson<api::NewVolume>,
) -> Result<(StatusCode, Json<api::VolumeAndToken>), ApiError> {
    let config = state.lifecycle.config();
    let volume = volumes::create(
        state.lifecycle.store().as_ref(),
        &config.state_dir,
        key.team(),
        &body.name,
        config.limits.volume_size_mib,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(and_token(&state, volume))))
}

async fn list(
    State(state): State<AppState>,
    key: Authenticated,
) -> Result<Json<Vec<api::Volume>>, ApiError> {
    let listed = state.lifecycle.store().list_volumes(key.team()).await?;
    Ok(Json(
        listed
            .into_iter()
            .map(|v| api::Volume {
                volume_id: v.id,
                name: v.name,
            })
            .collect(),
    ))
}

async fn info(
    State(state): State<AppState>,
    key: Authenticated,
    Path(volume_id): Path<String>,
) -> Result<Json<api::VolumeAndToken>, ApiError> {
    let volume = volumes::get(state.lifecycle.store().as_ref(), key.team(), &volume_id).await?;
    Ok(Json(and_token(&state, volume)))
}

async fn remove(
    State(state): State<AppState>,
    key: Authenticated,
    Path(volume_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    volumes::delete(
        state.lifecycle.store().as_ref(),
        &state.lifecycle.config().state_dir,
        key.team(),
        &volume_id,
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The query of the content routes; anything else is refused by name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContentQuery {
    path: String,
    #[serde(default)]
    depth: Option<u32>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    mode: Option<u32>,
    #[serde(default)]
    force: Option<bool>,
}

impl ContentQuery {
    fn owner(&self) -> Owner {
        Owner {
            uid: self.uid,
            gid: self.gid,
            mode: self.mode,
        }
    }

    fn rel(&self) -> Result<PathBuf, ApiError> {
        Ok(content::parse_path(&self.path)?)
    }
}

fn content_query(
    query: Result<Query<ContentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<ContentQuery, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|rejection| ApiError::bad_request(format!("bad query: {}", rejection.body_text())))
}

/// Checks the bearer token (missing: 401; wrong: 403), mounts the volume if needed and opens its
/// root, confined.
async fn open_volume(
    state: &AppState,
    volume_id: &str,
    headers: &HeaderMap,
) -> Result<std::sync::Arc<VolumeFiles>, ApiError> {
    let volume = state
        .lifecycle
        .store()
        .get_volume(volume_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("volume \"{volume_id}\" not found")))?;
    let Some(token) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
    else {
        return Err(ApiError::unauthorized(
            "the volume content API needs `Authorization: Bearer <volume token>`",
        ));
    };
    if !warren_proto::envd::signature::constant_time_eq(
        token.trim().as_bytes(),
        volume.token.as_bytes(),
    ) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("the token is not volume {volume_id}'s"),
        ));
    }
    let disk = volumes::disk(&state.lifecycle.config().state_dir, &volume.id)?;
    let quota = volume.size_mib;
    let files = tokio::task::spawn_blocking(move || -> Result<VolumeFiles, ApiError> {
        disk.ensure_mounted().map_err(|e| ApiError::internal(&e))?;
        Ok(VolumeFiles::open(&disk.mount_point, quota)?)
    })
    .await
    .map_err(|e| ApiError::internal(&e))??;
    Ok(std::sync::Arc::new(files))
}

/// Runs `work` on the volume's files off the async threads.
async fn blocking<T: Send + 'static>(
    files: std::sync::Arc<VolumeFiles>,
    work: impl FnOnce(&VolumeFiles) -> Result<T, ContentError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || work(&files))
        .await
        .map_err(|e| ApiError::internal(&e))?
        .map_err(ApiError::from)
}

async fn list_dir(
    State(state): State<AppState>,
    Path(volume_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ContentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<api::VolumeEntryStat>>, ApiError> {
    let files = open_volume(&state, &volume_id, &headers).await?;
    let query = content_query(query)?;
    let rel = query.rel()?;
    let depth = query.depth.unwrap_or(1).max(1);
    Ok(Json(blocking(files, move |f| f.list(&rel, depth)).await?))
}

async fn make_dir(
    State(state): State<AppState>,
    Path(volume_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ContentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(StatusCode, Json<api::VolumeEntryStat>), ApiError> {
    let files = open_volume(&state, &volume_id, &headers).await?;
    let query = content_query(query)?;
    let rel = query.rel()?;
    let (force, owner) = (query.force.unwrap_or(false), query.owner());
    let made = blocking(files, move |f| f.make_dir(&rel, force, owner)).await?;
    Ok((StatusCode::CREATED, Json(made)))
}

async fn stat_path(
    State(state): State<AppState>,
    Path(volume_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ContentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<api::VolumeEntryStat>, ApiError> {
    let files = open_volume(&state, &volume_id, &headers).await?;
    let rel = content_query(query)?.rel()?;
    Ok(Json(blocking(files, move |f| f.stat(&rel)).await?))
}

async fn update_path(
    State(state): State<AppState>,
    Path(volume_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ContentQuery>, axum::extract::rejection::QueryRejection>,
    ApiJson(body): ApiJson<api::VolumeMetadataUpdate>,
) -> Result<Json<api::VolumeEntryStat>, ApiError> {
    let files = open_volume(&state, &volume_id, &headers).await?;
    let rel = content_query(query)?.rel()?;
    let owner = Owner {
        uid: body.uid,
        gid: body.gid,
        mode: body.mode,
    };
    Ok(Json(blocking(files, move |f| f.update(&rel, owner)).await?))
}

async fn remove_path(
    State(state): State<AppState>,
    Path(volume_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ContentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let files = open_volume(&state, &volume_id, &headers).await?;
    let rel = content_query(query)?.rel()?;
    blocking(files, move |f| f.remove(&rel)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Streams the file out in chunks as it is read.
async fn read_file(
    State(state): State<AppState>,
    Path(volume_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ContentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let files = open_volume(&state, &volume_id, &headers).await?;
    let rel = content_query(query)?.rel()?;
    let file = blocking(files, move |f| f.open_file(&rel)).await?;
    let file = tokio::fs::File::from_std(file);
    let stream = futures_util::stream::unfold(Some(file), |state| async move {
        let mut file = state?;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Streams the body into a new file beside the target and renames it into place at the end: a
/// failed upload leaves the old file as it was.
async fn write_file(
    State(state): State<AppState>,
    Path(volume_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ContentQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<(StatusCode, Json<api::VolumeEntryStat>), ApiError> {
    let files = open_volume(&state, &volume_id, &headers).await?;
    let query = content_query(query)?;
    let rel = query.rel()?;
    let (force, owner) = (query.force.unwrap_or(false), query.owner());
    let begin_rel = rel.clone();
    let mut pending = blocking(files.clone(), move |f| f.begin_write(&begin_rel, force)).await?;
    let Some(file) = pending.take_file() else {
        return Err(ApiError::internal(&std::io::Error::other(
            "upload file missing",
        )));
    };
    let mut file = tokio::fs::File::from_std(file);
    let quota_mib = files.quota_mib();
    let no_space =
        |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT));
    let write_error = |e: std::io::Error| -> ApiError {
        if no_space(&e) {
            ContentError::NoSpace { quota_mib }.into()
        } else {
            ApiError::internal(&e)
        }
    };
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::bad_request(format!("reading the request body failed: {e}")))?;
        file.write_all(&chunk).await.map_err(write_error)?;
    }
    file.flush().await.map_err(write_error)?;
    let file = file.into_std().await;
    file.sync_data().map_err(write_error)?;
    pending.put_back(file);
    let written = blocking(files, move |f| f.finish_write(&rel, pending, owner)).await?;
    Ok((StatusCode::CREATED, Json(written)))
}
