//! Template resource DTOs.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TemplateBuildStatus {
    Building,
    Waiting,
    Ready,
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamUser {
    pub id: String,
    pub email: String,
}

/// One item of `GET /templates`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
pub struct TemplateWithBuilds {
    #[serde(flatten)]
    pub template: Template,
    pub builds: Vec<TemplateBuild>,
}
