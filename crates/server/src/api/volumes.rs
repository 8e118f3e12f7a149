//! `/volumes` (the API key's team) and `/volumecontent/{id}/...` (the volume's bearer token): see
//! docs/volumes.md. Handlers validate and call [`crate::volumes`]; file access is confined there.

use std::path::PathBuf;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::ApiJson;
use super::AppState;
use crate::store::VolumeRecord;
use crate::volumes::content::{self, ContentError, Owner, VolumeFiles};
use crate::volumes::{self as volumes, VolumeError};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(info, remove))
        .routes(routes!(list_dir, make_dir))
        .routes(routes!(read_file, write_file))
        .routes(routes!(stat_path, update_path, remove_path))
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

#[utoipa::path(
    post,
    path = "/volumes",
    operation_id = "createVolume",
    description = "Makes a volume (an ext4 image of the server's volume size, --volume-size-mib).",
    request_body(content = api::NewVolume, content_type = "application/json"),
    responses(
        (status = 201, description = "Made", body = api::VolumeAndToken),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
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

#[utoipa::path(
    get,
    path = "/volumes",
    operation_id = "listVolumes",
    description = "The API key's team's volumes.",
    responses(
        (status = 200, description = "Volumes", body = [api::Volume]),
        (status = 401, response = super::error::Unauthorized),
        (status = 500, response = super::error::InternalError),
    ),
)]
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

#[utoipa::path(
    get,
    path = "/volumes/{volumeID}",
    operation_id = "getVolume",
    description = "The volume with its content token.",
    params(
        ("volumeID" = String, Path),
    ),
    responses(
        (status = 200, description = "The volume", body = api::VolumeAndToken),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn info(
    State(state): State<AppState>,
    key: Authenticated,
    Path(volume_id): Path<String>,
) -> Result<Json<api::VolumeAndToken>, ApiError> {
    let volume = volumes::get(state.lifecycle.store().as_ref(), key.team(), &volume_id).await?;
    Ok(Json(and_token(&state, volume)))
}

#[utoipa::path(
    delete,
    path = "/volumes/{volumeID}",
    operation_id = "deleteVolume",
    description = "Unmounts and removes the volume; 409 while a sandbox that is not killed or failed mounts it.",
    params(
        ("volumeID" = String, Path),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
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

#[utoipa::path(
    get,
    path = "/volumecontent/{volumeID}/dir",
    operation_id = "listVolumeDir",
    params(
        ("volumeID" = String, Path),
        ("path" = String, Query, description = "Relative to the volume's root; a leading / is the root; no `..`, no NUL, no symlinks on the way."),
        ("depth" = Option<i64>, Query, description = "Levels to list (default 1)."),
    ),
    responses(
        (status = 200, description = "Entries", body = [api::VolumeEntryStat]),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
    security(("VolumeToken" = [])),
)]
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

#[utoipa::path(
    post,
    path = "/volumecontent/{volumeID}/dir",
    operation_id = "makeVolumeDir",
    params(
        ("volumeID" = String, Path),
        ("path" = String, Query, description = "Relative to the volume's root; a leading / is the root; no `..`, no NUL, no symlinks on the way."),
        ("uid" = Option<i64>, Query),
        ("gid" = Option<i64>, Query),
        ("mode" = Option<i64>, Query),
        ("force" = Option<bool>, Query, description = "Make missing parent directories."),
    ),
    responses(
        (status = 201, description = "Made", body = api::VolumeEntryStat),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
    security(("VolumeToken" = [])),
)]
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

#[utoipa::path(
    get,
    path = "/volumecontent/{volumeID}/path",
    operation_id = "statVolumePath",
    params(
        ("volumeID" = String, Path),
        ("path" = String, Query, description = "Relative to the volume's root; a leading / is the root; no `..`, no NUL, no symlinks on the way."),
    ),
    responses(
        (status = 200, description = "The entry (a symlink is not followed)", body = api::VolumeEntryStat),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
    security(("VolumeToken" = [])),
)]
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

#[utoipa::path(
    patch,
    path = "/volumecontent/{volumeID}/path",
    operation_id = "updateVolumePath",
    params(
        ("volumeID" = String, Path),
        ("path" = String, Query, description = "Relative to the volume's root; a leading / is the root; no `..`, no NUL, no symlinks on the way."),
    ),
    request_body(content = api::VolumeMetadataUpdate, content_type = "application/json"),
    responses(
        (status = 200, description = "Updated", body = api::VolumeEntryStat),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
    security(("VolumeToken" = [])),
)]
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

#[utoipa::path(
    delete,
    path = "/volumecontent/{volumeID}/path",
    operation_id = "removeVolumePath",
    params(
        ("volumeID" = String, Path),
        ("path" = String, Query, description = "Relative to the volume's root; a leading / is the root; no `..`, no NUL, no symlinks on the way."),
    ),
    responses(
        (status = 204, description = "Removed (recursively; a symlink itself, never its target)"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
    security(("VolumeToken" = [])),
)]
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
#[utoipa::path(
    get,
    path = "/volumecontent/{volumeID}/file",
    operation_id = "readVolumeFile",
    params(
        ("volumeID" = String, Path),
        ("path" = String, Query, description = "Relative to the volume's root; a leading / is the root; no `..`, no NUL, no symlinks on the way."),
    ),
    responses(
        (status = 200, description = "The file, streamed", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
    security(("VolumeToken" = [])),
)]
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
#[utoipa::path(
    put,
    path = "/volumecontent/{volumeID}/file",
    operation_id = "writeVolumeFile",
    params(
        ("volumeID" = String, Path),
        ("path" = String, Query, description = "Relative to the volume's root; a leading / is the root; no `..`, no NUL, no symlinks on the way."),
        ("uid" = Option<i64>, Query),
        ("gid" = Option<i64>, Query),
        ("mode" = Option<i64>, Query),
        ("force" = Option<bool>, Query, description = "Make missing parent directories."),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 201, description = "Written (streamed into place)", body = api::VolumeEntryStat),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
        (status = 507, description = "The volume's quota is used up (the message names it)."),
    ),
    security(("VolumeToken" = [])),
)]
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
