//! `/templates`: list, get, delete, and builds (request, upload context files, start, status).

use super::time;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::router::UtoipaMethodRouterExt;
use utoipa_axum::routes;
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::{ApiJson, OptionalJson, QueryPairs};
use super::AppState;
use crate::store::TemplateRecord;
use crate::templates::builder::job::{LogLevel, TemplateBuildInfo};
use crate::templates::builder::sdk_template::TemplateBuildStartV2;
use crate::templates::builds::{BuildRequest, BuildsError, DockerfileBuild, RequestedBuild};

/// Largest build-context archive accepted by `PUT /templates/{id}/files/{hash}`.
const MAX_UPLOAD_BYTES: usize = 1 << 30;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, request_dockerfile_build))
        .routes(routes!(get_one, delete, update_v1))
        .routes(routes!(update_v2))
        .routes(routes!(alias))
        .routes(routes!(assign_tags, remove_tags))
        .routes(routes!(list_tags))
        .routes(routes!(request_build_v3))
        .routes(routes!(request_build_v2))
        .routes(routes!(upload_link, upload).layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES)))
        .routes(routes!(start_sdk_build))
        .routes(routes!(start_dockerfile_build, cancel_build))
        .routes(routes!(build_status))
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

#[utoipa::path(
    patch,
    path = "/templates/{templateID}",
    operation_id = "updateTemplate",
    description = "Make the team's template public or private; Warren's own `policies` sets the monitor policies its new sandboxes start with.",
    params(
        ("templateID" = String, Path),
    ),
    request_body(content = api::TemplateUpdateRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Updated"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn update_v1(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<api::TemplateUpdateRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    update(&state, &key, &id, body).await?;
    Ok(Json(serde_json::json!({})))
}

#[utoipa::path(
    patch,
    path = "/v2/templates/{templateID}",
    operation_id = "updateTemplateV2",
    params(
        ("templateID" = String, Path),
    ),
    request_body(content = api::TemplateUpdateRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Updated", body = api::TemplateUpdateResponse),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
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

#[utoipa::path(
    get,
    path = "/templates",
    operation_id = "listTemplates",
    responses(
        (status = 200, description = "Templates", body = [api::Template]),
        (status = 401, response = super::error::Unauthorized),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    get,
    path = "/templates/{templateID}",
    operation_id = "getTemplate",
    params(
        ("templateID" = String, Path),
    ),
    responses(
        (status = 200, description = "Template", body = api::TemplateWithBuilds),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    post,
    path = "/templates/tags",
    operation_id = "assignTemplateTags",
    description = "Gives tags to a template's build (target is name:tag or name, for the latest build).",
    request_body(content = api::AssignTemplateTagsRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The tags and the build they now name", body = api::AssignedTemplateTags),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    delete,
    path = "/templates/tags",
    operation_id = "deleteTemplateTags",
    description = "Removes tags from a template.",
    request_body(content = api::DeleteTemplateTagsRequest, content_type = "application/json"),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    get,
    path = "/templates/{templateID}/tags",
    operation_id = "listTemplateTags",
    description = "A template's tags and the builds they name.",
    params(("templateID" = String, Path)),
    responses(
        (status = 200, description = "The tags", body = [api::TemplateTag]),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    post,
    path = "/v2/templates",
    operation_id = "requestTemplateBuildV2",
    summary = "Request a template build (SDK Template builder): hands out templateID and buildID",
    request_body(content = api::TemplateBuildRequestV3, content_type = "application/json", description = "TemplateBuildRequestV3: name (or name:tag), tags, cpuCount, memoryMB"),
    responses(
        (status = 202, description = "TemplateRequestResponseV3: templateID, buildID, public, names, tags, aliases", body = api::TemplateRequestResponse),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn request_build_v2(
    state: State<AppState>,
    key: Authenticated,
    body: ApiJson<api::TemplateBuildRequestV3>,
) -> Result<(StatusCode, Json<api::TemplateRequestResponse>), ApiError> {
    request_build_v3(state, key, body).await
}

#[utoipa::path(
    post,
    path = "/v3/templates",
    operation_id = "requestTemplateBuildV3",
    summary = "Request a template build (SDK Template builder): hands out templateID and buildID",
    request_body(content = api::TemplateBuildRequestV3, content_type = "application/json", description = "TemplateBuildRequestV3: name (or name:tag), tags, cpuCount, memoryMB; Warren's own privileges {rawSockets, ioUring} (admin keys only, 403 otherwise)"),
    responses(
        (status = 202, description = "TemplateRequestResponseV3: templateID, buildID, public, names, tags, aliases", body = api::TemplateRequestResponse),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    post,
    path = "/templates",
    operation_id = "requestDockerfileBuild",
    summary = "Request a Dockerfile build (legacy; the warren CLI). contextHash names an uploaded context archive",
    request_body(content = api::TemplateBuildRequest, content_type = "application/json", description = "dockerfile, alias, startCmd, readyCmd, cpuCount, memoryMB, contextHash; Warren's own privileges {rawSockets, ioUring} (admin keys only, 403 otherwise)"),
    responses(
        (status = 202, description = "templateID, buildID, public, names, tags, aliases", body = api::TemplateRequestResponse),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    get,
    path = "/templates/{templateID}/files/{hash}",
    operation_id = "getTemplateFilesUploadLink",
    summary = "Whether the archive of this SHA-256 is present, else a one-time upload URL",
    params(
        ("templateID" = String, Path),
        ("hash" = String, Path),
    ),
    responses(
        (status = 201, description = "TemplateBuildFileUpload: present, url", body = api::TemplateBuildFileUpload),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    put,
    path = "/templates/{templateID}/files/{hash}",
    operation_id = "uploadTemplateFiles",
    summary = "Upload a context archive (tar or tar.gz) to the URL the link handed out (token query parameter instead of the API key)",
    params(
        ("templateID" = String, Path),
        ("hash" = String, Path),
        ("token" = String, Query),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Stored"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, description = "The token is missing, unknown, already used or for another hash", body = warren_proto::api::Error),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
    security(),
)]
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
#[utoipa::path(
    post,
    path = "/v2/templates/{templateID}/builds/{buildID}",
    operation_id = "startTemplateBuildV2",
    params(
        ("templateID" = String, Path),
        ("buildID" = String, Path),
    ),
    request_body(content = TemplateBuildStartV2, content_type = "application/json", description = "TemplateBuildStartV2: fromImage/fromTemplate, steps, startCmd, readyCmd, force"),
    responses(
        (status = 202, description = "Build started"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    post,
    path = "/templates/{templateID}/builds/{buildID}",
    operation_id = "startDockerfileBuild",
    params(
        ("templateID" = String, Path),
        ("buildID" = String, Path),
    ),
    responses(
        (status = 202, description = "Build started"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    delete,
    path = "/templates/{templateID}/builds/{buildID}",
    operation_id = "cancelTemplateBuild",
    description = "Cancels a build that has not finished; its sandboxes are killed and it is recorded as failed.",
    params(("templateID" = String, Path), ("buildID" = String, Path)),
    responses(
        (status = 204, description = "Cancelled"),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    get,
    path = "/templates/{templateID}/builds/{buildID}/status",
    operation_id = "getTemplateBuildStatus",
    params(
        ("templateID" = String, Path),
        ("buildID" = String, Path),
        ("logsOffset" = Option<i64>, Query),
        ("limit" = Option<i64>, Query),
        ("level" = Option<String>, Query),
    ),
    responses(
        (status = 200, description = "TemplateBuildInfo: templateID, buildID, status, logs, logEntries, reason", body = TemplateBuildInfo),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    delete,
    path = "/templates/{templateID}",
    operation_id = "deleteTemplate",
    summary = "Delete a built template (409 while sandboxes use it unless force=true), or else the snapshot of that id",
    params(
        ("templateID" = String, Path),
        ("templateID" = String, Path),
        ("force" = Option<bool>, Query),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
#[utoipa::path(
    get,
    path = "/templates/aliases/{alias}",
    operation_id = "getTemplateAlias",
    params(
        ("alias" = String, Path),
    ),
    responses(
        (status = 200, description = "templateID, public", body = api::TemplateAliasResponse),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
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
