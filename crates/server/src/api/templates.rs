//! `/templates`: list, get, delete, and builds (request, upload context files, start, status).

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, TimeZone, Utc};
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::{ApiJson, OptionalJson, QueryPairs};
use super::AppState;
use crate::store::{Millis, TemplateRecord};
use crate::templates::builder::job::{LogLevel, TemplateBuildInfo};
use crate::templates::builder::sdk_template::TemplateBuildStartV2;
use crate::templates::builds::{BuildRequest, BuildsError, DockerfileBuild, RequestedBuild};

/// Largest build-context archive accepted by `PUT /templates/{id}/files/{hash}`.
const MAX_UPLOAD_BYTES: usize = 1 << 30;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/templates", get(list).post(request_dockerfile_build))
        .route(
            "/templates/{id}",
            get(get_one).delete(delete).patch(update_v1),
        )
        .route("/v2/templates/{id}", axum::routing::patch(update_v2))
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates/tags", post(assign_tags).delete(remove_tags))
        .route("/templates/{id}/tags", get(list_tags))
        .route("/v3/templates", post(request_build_v3))
        .route("/v2/templates", post(request_build_v3))
        .route(
            "/templates/{id}/files/{hash}",
            get(upload_link)
                .put(upload)
                .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES)),
        )
        .route(
            "/v2/templates/{id}/builds/{build_id}",
            post(start_sdk_build),
        )
        .route(
            "/templates/{id}/builds/{build_id}",
            post(start_dockerfile_build).delete(cancel_build),
        )
        .route(
            "/templates/{id}/builds/{build_id}/status",
            get(build_status),
        )
}

impl From<BuildsError> for ApiError {
    fn from(error: BuildsError) -> Self {
        use crate::templates::builder::service::ServiceError;
        use crate::templates::builder::uploads::UploadError;
        use crate::templates::builder::versions::VersionError;
        match &error {
            BuildsError::TemplateNotFound(_) | BuildsError::BuildNotFound { .. } => {
                ApiError::not_found(error.to_string())
            }
            BuildsError::AlreadyStarted(_) | BuildsError::Conflict(_) => {
                ApiError::new(StatusCode::CONFLICT, error.to_string())
            }
            BuildsError::BuiltIn(_) => ApiError::new(StatusCode::CONFLICT, error.to_string()),
            BuildsError::BadRequest(_)
            | BuildsError::Upload(
                UploadError::BadHash(_)
                | UploadError::UnsafePath { .. }
                | UploadError::SpecialFile { .. },
            )
            | BuildsError::Version(VersionError::BadId(_)) => {
                ApiError::bad_request(error.to_string())
            }
            BuildsError::Service(service) => match service {
                ServiceError::Toml(_)
                | ServiceError::Context(_)
                | ServiceError::Dockerfile(_)
                | ServiceError::Sdk(_)
                | ServiceError::NoDockerfile(_) => ApiError::bad_request(error.to_string()),
                ServiceError::AlreadyRunning { .. } => {
                    ApiError::new(StatusCode::CONFLICT, error.to_string())
                }
                _ => ApiError::internal(&error),
            },
            _ => ApiError::internal(&error),
        }
    }
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
        policies: record.policies.clone(),
    }
}

/// `PATCH /templates/{id}`, `PATCH /v2/templates/{id}`: make the team's template public or not,
/// and (Warren's own) set the monitor policies its new sandboxes start with.
async fn update(
    state: &AppState,
    key: &Authenticated,
    id: &str,
    body: api::TemplateUpdateRequest,
) -> Result<TemplateRecord, ApiError> {
    let record = key.owned_template(state, id).await?;
    let policies = body
        .policies
        .map(super::sandboxes::checked_policies)
        .transpose()?;
    let now = crate::lifecycle::now_millis();
    let store = state.lifecycle.store();
    if !store
        .update_template_settings(&record.id, body.public, policies.as_ref(), now)
        .await?
    {
        return Err(ApiError::not_found(format!("template '{id}' not found")));
    }
    Ok(record)
}

async fn update_v1(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<api::TemplateUpdateRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    update(&state, &key, &id, body).await?;
    Ok(Json(serde_json::json!({})))
}

async fn update_v2(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<api::TemplateUpdateRequest>,
) -> Result<Json<api::TemplateUpdateResponse>, ApiError> {
    let record = update(&state, &key, &id, body).await?;
    Ok(Json(api::TemplateUpdateResponse {
        names: record.aliases,
    }))
}

async fn list(
    State(state): State<AppState>,
    key: Authenticated,
) -> Result<Json<Vec<api::Template>>, ApiError> {
    let records = state.lifecycle.store().list_templates().await?;
    let visible = records
        .iter()
        .filter(|t| t.public || t.team_id == key.team());
    Ok(Json(visible.map(template).collect()))
}

/// The SDK's `Sandbox.delete_snapshot` calls this: snapshots are templates in E2B's model. Deleting a
/// built template is not offered yet.
async fn get_one(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<api::TemplateWithBuilds>, ApiError> {
    let record = key.visible_template(&state, &id).await?;
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

/// `POST /templates/tags`: more tags for the build that `target` (`name:tag` or `name`) names.
async fn assign_tags(
    State(state): State<AppState>,
    key: Authenticated,
    ApiJson(body): ApiJson<api::AssignTemplateTagsRequest>,
) -> Result<(StatusCode, Json<api::AssignedTemplateTags>), ApiError> {
    let build_id = state
        .builds
        .assign_tags(key.team(), &body.target, &body.tags)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(api::AssignedTemplateTags {
            tags: body.tags,
            build_id,
        }),
    ))
}

/// `DELETE /templates/tags`.
async fn remove_tags(
    State(state): State<AppState>,
    key: Authenticated,
    ApiJson(body): ApiJson<api::DeleteTemplateTagsRequest>,
) -> Result<StatusCode, ApiError> {
    state
        .builds
        .remove_tags(key.team(), &body.name, &body.tags)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /templates/{id}/tags`.
async fn list_tags(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<Vec<api::TemplateTag>>, ApiError> {
    let tags = state.builds.list_tags(key.team(), &id).await?;
    Ok(Json(
        tags.into_iter()
            .map(|t| api::TemplateTag {
                tag: t.tag,
                build_id: t.build_id,
                created_at: time(t.created_at).to_rfc3339(),
            })
            .collect(),
    ))
}

/// `name` or `name:tag` into the name and its tags.
fn split_tag(name: &str, tags: Option<Vec<String>>) -> (String, Vec<String>) {
    let mut tags = tags.unwrap_or_default();
    match name.split_once(':') {
        Some((name, tag)) => {
            tags.push(tag.to_string());
            (name.to_string(), tags)
        }
        None => (name.to_string(), tags),
    }
}

fn requested(build: RequestedBuild, tags: Vec<String>) -> api::TemplateRequestResponse {
    api::TemplateRequestResponse {
        template_id: build.template_id,
        build_id: build.build_id,
        public: false,
        names: build.aliases.clone(),
        tags,
        aliases: build.aliases,
    }
}

/// The privileges a build request asks for: none unless given, and any only with an admin key, as a
/// template's sandboxes inherit them and every team may start public ones.
fn privileges(
    key: &Authenticated,
    asked: Option<api::TemplatePrivileges>,
) -> Result<api::TemplatePrivileges, ApiError> {
    let asked = asked.unwrap_or_default();
    if asked.any() && key.require_admin().is_err() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "privileges (rawSockets, ioUring) need an admin API key",
        ));
    }
    Ok(asked)
}

/// `POST /v3/templates` (and `/v2/templates`): hand out the template and build ids of a new build.
async fn request_build_v3(
    State(state): State<AppState>,
    key: Authenticated,
    ApiJson(body): ApiJson<api::TemplateBuildRequestV3>,
) -> Result<(StatusCode, Json<api::TemplateRequestResponse>), ApiError> {
    let Some(name) = body.name.as_deref().or(body.alias.as_deref()) else {
        return Err(ApiError::bad_request("name is required"));
    };
    let (name, tags) = split_tag(name, body.tags);
    let privileges = privileges(&key, body.privileges)?;
    let build = state
        .builds
        .request(BuildRequest {
            team_id: key.team().to_string(),
            name: Some(name),
            cpu_count: body.cpu_count,
            memory_mb: body.memory_mb,
            dockerfile: None,
            tags: tags.clone(),
            privileges,
        })
        .await?;
    Ok((StatusCode::ACCEPTED, Json(requested(build, tags))))
}

/// Legacy `POST /templates`: a Dockerfile build, started with `POST /templates/{id}/builds/{buildID}`.
async fn request_dockerfile_build(
    State(state): State<AppState>,
    key: Authenticated,
    ApiJson(body): ApiJson<api::TemplateBuildRequest>,
) -> Result<(StatusCode, Json<api::TemplateRequestResponse>), ApiError> {
    let privileges = privileges(&key, body.privileges)?;
    let build = state
        .builds
        .request(BuildRequest {
            team_id: key.team().to_string(),
            name: body.alias,
            cpu_count: body.cpu_count,
            memory_mb: body.memory_mb,
            dockerfile: Some(DockerfileBuild {
                dockerfile: body.dockerfile,
                start_cmd: body.start_cmd,
                ready_cmd: body.ready_cmd,
                context_hash: body.context_hash,
            }),
            tags: Vec::new(),
            privileges,
        })
        .await?;
    Ok((StatusCode::ACCEPTED, Json(requested(build, Vec::new()))))
}

/// `GET /templates/{id}/files/{hash}`: is the archive here, and if not, where to PUT it.
async fn upload_link(
    State(state): State<AppState>,
    key: Authenticated,
    headers: HeaderMap,
    Path((id, hash)): Path<(String, String)>,
) -> Result<(StatusCode, Json<api::TemplateBuildFileUpload>), ApiError> {
    let template = key.owned_template(&state, &id).await?;
    if state.builds.files_present(&template.id, &hash).await? {
        return Ok((
            StatusCode::CREATED,
            Json(api::TemplateBuildFileUpload {
                present: true,
                url: None,
            }),
        ));
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| state.lifecycle.config().api_listen.to_string());
    let token = state.builds.upload_token(&hash);
    Ok((
        StatusCode::CREATED,
        Json(api::TemplateBuildFileUpload {
            present: false,
            url: Some(format!(
                "http://{host}/templates/{}/files/{hash}?token={token}",
                template.id
            )),
        }),
    ))
}

/// `PUT /templates/{id}/files/{hash}?token=…`: the archive itself (tar, gzip or not). The token of the
/// upload link stands in for the API key, which the SDK does not send here.
async fn upload(
    State(state): State<AppState>,
    query: QueryPairs,
    Path((id, hash)): Path<(String, String)>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    state.builds.known_template(&id).await?;
    let Some(token) = query.get("token").map(str::to_string) else {
        return Err(ApiError::unauthorized(
            "upload token missing: ask GET /templates/{id}/files/{hash} for the link",
        ));
    };
    let builds = std::sync::Arc::clone(&state.builds);
    let stored = tokio::task::spawn_blocking(move || {
        builds.put_files(&hash, &token, &mut std::io::Cursor::new(body))
    })
    .await
    .map_err(|join| ApiError::internal(&join))??;
    match stored {
        Some(_) => Ok(StatusCode::OK),
        None => Err(ApiError::unauthorized(
            "upload token unknown, used, or for another hash",
        )),
    }
}

/// `POST /v2/templates/{id}/builds/{buildID}`: start a requested build from the SDK's steps.
async fn start_sdk_build(
    State(state): State<AppState>,
    key: Authenticated,
    Path((id, build_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<TemplateBuildStartV2>,
) -> Result<StatusCode, ApiError> {
    let template = key.owned_template(&state, &id).await?;
    let builds = std::sync::Arc::clone(&state.builds);
    tokio::task::spawn_blocking(move || builds.start_sdk(&template.id, &build_id, &body))
        .await
        .map_err(|join| ApiError::internal(&join))??;
    Ok(StatusCode::ACCEPTED)
}

/// Legacy `POST /templates/{id}/builds/{buildID}`: start a Dockerfile build.
async fn start_dockerfile_build(
    State(state): State<AppState>,
    key: Authenticated,
    Path((id, build_id)): Path<(String, String)>,
    OptionalJson(_body): OptionalJson<serde_json::Value>,
) -> Result<StatusCode, ApiError> {
    let template = key.owned_template(&state, &id).await?;
    let builds = std::sync::Arc::clone(&state.builds);
    tokio::task::spawn_blocking(move || builds.start_dockerfile(&template.id, &build_id))
        .await
        .map_err(|join| ApiError::internal(&join))??;
    Ok(StatusCode::ACCEPTED)
}

/// `DELETE /templates/{id}/builds/{buildID}` (Warren's own; E2B has no cancel): stops a running build,
/// which then fails with "the build was cancelled" naming the step it was in.
async fn cancel_build(
    State(state): State<AppState>,
    key: Authenticated,
    Path((id, build_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    key.owned_template(&state, &id).await?;
    state.builds.cancel(&id, &build_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /templates/{id}/builds/{buildID}/status?logsOffset=&limit=&level=`.
async fn build_status(
    State(state): State<AppState>,
    key: Authenticated,
    query: QueryPairs,
    Path((id, build_id)): Path<(String, String)>,
) -> Result<Json<TemplateBuildInfo>, ApiError> {
    let number = |key: &str| -> Result<Option<usize>, ApiError> {
        query
            .get(key)
            .map(|v| {
                v.parse::<usize>().map_err(|_| {
                    ApiError::bad_request(format!("{key} must be a non-negative integer"))
                })
            })
            .transpose()
    };
    let offset = number("logsOffset")?.unwrap_or(0);
    let limit = number("limit")?;
    let level = match query.get("level") {
        None => None,
        Some("debug") => Some(LogLevel::Debug),
        Some("info") => Some(LogLevel::Info),
        Some("warn") => Some(LogLevel::Warn),
        Some("error") => Some(LogLevel::Error),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "level {other:?} is not one of debug, info, warn, error"
            )))
        }
    };
    key.visible_template(&state, &id).await?;
    let info = state
        .builds
        .status(&id, &build_id, offset, limit, level)
        .await?;
    Ok(Json(info))
}

/// `DELETE /templates/{id}[?force=true]`: a built template (refused with 409 while sandboxes use it
/// unless forced), or else a snapshot of that id.
async fn delete(
    State(state): State<AppState>,
    key: Authenticated,
    query: QueryPairs,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let force = match query.get("force") {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") | Some("") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "force must be true or false, not {other:?}"
            )))
        }
    };
    match key.owned_template(&state, &id).await {
        Ok(template) => {
            state.builds.delete(&template.id, force).await?;
            Ok(StatusCode::NO_CONTENT)
        }
        // Snapshots are templates to the SDK too.
        Err(e) if e.status == StatusCode::NOT_FOUND => {
            super::snapshots::delete_by_id(&state, &key, &id).await
        }
        Err(other) => Err(other),
    }
}

/// `GET /templates/aliases/{alias}`.
async fn alias(
    State(state): State<AppState>,
    key: Authenticated,
    Path(alias): Path<String>,
) -> Result<Json<api::TemplateAliasResponse>, ApiError> {
    let record = key
        .visible_template(&state, &alias)
        .await
        .map_err(|_| ApiError::not_found(format!("template alias '{alias}' not found")))?;
    Ok(Json(api::TemplateAliasResponse {
        template_id: record.id,
        public: record.public,
    }))
}
