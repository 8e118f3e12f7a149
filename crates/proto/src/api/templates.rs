//! Template resource DTOs.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum TemplateBuildStatus {
    Building,
    Waiting,
    Ready,
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TeamUser {
    pub id: String,
    pub email: String,
}

/// One item of `GET /templates`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Template {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub public: bool,
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub created_by: Option<TeamUser>,
    pub last_spawned_at: Option<DateTime<Utc>>,
    pub spawn_count: u64,
    pub build_count: u64,
    pub envd_version: String,
    pub build_status: TemplateBuildStatus,
    /// Warren's own: the monitor policies its sandboxes start with (absent when none are set).
    #[serde(default, skip_serializing_if = "is_default")]
    pub policies: super::SandboxPolicies,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Body of `PATCH /templates/{id}` and `/v2/templates/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateUpdateRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public: Option<bool>,
    /// Warren's own: the monitor policies the template's sandboxes start with (replaces the old
    /// ones; `{}` clears them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<super::SandboxPolicies>,
}

/// Answer of `PATCH /v2/templates/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateUpdateResponse {
    pub names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuild {
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: TemplateBuildStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(
        rename = "diskSizeMB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub disk_size_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_version: Option<String>,
}

/// `GET /templates/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateWithBuilds {
    #[serde(flatten)]
    pub template: Template,
    pub builds: Vec<TemplateBuild>,
}

/// Warren's own build-request field `privileges`: what the template's sandboxes may do beyond the
/// default set. Both are off unless an admin key asks for them (docs/security.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplatePrivileges {
    /// Keep CAP_NET_RAW: raw and packet sockets (tcpdump, traceroute's raw modes).
    #[serde(default)]
    pub raw_sockets: bool,
    /// Allow `io_uring_setup`, `io_uring_enter` and `io_uring_register`.
    #[serde(default)]
    pub io_uring: bool,
}

impl TemplatePrivileges {
    /// True when either privilege is asked for.
    pub fn any(&self) -> bool {
        self.raw_sockets || self.io_uring
    }
}

/// `POST /v3/templates` body: request a build of template `name` (SDK Template builder).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildRequestV3 {
    /// `name` or `name:tag`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Older SDKs send `alias`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB", skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(
        default,
        rename = "minFreeDiskMB",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_free_disk_mb: Option<u64>,
    /// Warren's own: privileges of the template's sandboxes (admin keys only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileges: Option<TemplatePrivileges>,
}

/// Answer to a build request (`TemplateRequestResponseV3`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TemplateRequestResponse {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub public: bool,
    pub names: Vec<String>,
    pub tags: Vec<String>,
    pub aliases: Vec<String>,
}

/// Legacy `POST /templates` body: a Dockerfile build. `contextHash` (Warren) names an archive of the
/// build context uploaded through `GET`/`PUT /templates/{id}/files/{hash}` before the build starts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildRequest {
    pub dockerfile: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB", skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_hash: Option<String>,
    /// Warren's own: privileges of the template's sandboxes (admin keys only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileges: Option<TemplatePrivileges>,
}

/// `GET /templates/{id}/files/{hash}`: whether the archive is already here and where to PUT it if not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateBuildFileUpload {
    pub present: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// `GET /templates/aliases/{alias}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateAliasResponse {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub public: bool,
}

/// One build log entry as the status endpoint sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BuildLogEntry {
    pub timestamp: DateTime<Utc>,
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// Why a build failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BuildStatusReason {
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default)]
    pub log_entries: Vec<BuildLogEntry>,
}

/// `GET /templates/{id}/builds/{buildID}/status` (`TemplateBuildInfo`), as clients read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildInfo {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: TemplateBuildStatus,
    #[serde(default)]
    pub logs: Vec<String>,
    #[serde(default)]
    pub log_entries: Vec<BuildLogEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<BuildStatusReason>,
}

/// `POST /templates/tags`: point `tags` at the build that `target` (`name:tag`, or `name` for the
/// current build) names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AssignTemplateTagsRequest {
    pub target: String,
    pub tags: Vec<String>,
}

/// Answer to `POST /templates/tags` (201).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AssignedTemplateTags {
    pub tags: Vec<String>,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// `DELETE /templates/tags` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeleteTemplateTagsRequest {
    pub name: String,
    pub tags: Vec<String>,
}

/// One entry of `GET /templates/{templateID}/tags`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateTag {
    pub tag: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// RFC 3339.
    #[serde(rename = "createdAt")]
    pub created_at: String,
}
