//! The E2B REST bodies this client sends and reads, with E2B's JSON field names.
//!
//! TEMPORARY: these move to `warren_proto::api` (owned by the server crate's author) once that lands;
//! this module then becomes a re-export so the wire types exist once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /sandboxes` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    #[serde(
        rename = "allow_internet_access",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub env_vars: BTreeMap<String, String>,
}

/// What `POST /sandboxes` and `POST /sandboxes/{id}/connect` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID", default)]
    pub client_id: String,
    #[serde(default)]
    pub envd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// One entry of `GET /v2/sandboxes`, and `GET /sandboxes/{id}` (which adds a few optional fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID", default)]
    pub client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    pub started_at: String,
    pub end_at: String,
    #[serde(default)]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB", default)]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB", default)]
    pub disk_size_mb: u64,
    pub state: String,
    #[serde(default)]
    pub envd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `GET /templates` entry (the fields the CLI shows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Template {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID", default)]
    pub build_id: String,
    #[serde(default)]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB", default)]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB", default)]
    pub disk_size_mb: u64,
    #[serde(default)]
    pub public: bool,
    #[serde(default)]
    pub aliases: Vec<String>,
    #[serde(default)]
    pub created_at: String,
    #[serde(default)]
    pub build_status: String,
}

/// Error body of every non-2xx answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}
