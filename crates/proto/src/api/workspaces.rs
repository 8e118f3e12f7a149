//! Warren's workspaces (not part of E2B's API): each user of a team mapped to their own sandbox.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::Sandbox;

/// Body of `POST /workspaces/{user_id}/sandbox` (every field optional).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceSandboxRequest {
    /// Template of the workspace's sandboxes; only the first call may set it (later calls must name
    /// the same one or none). Default `base`.
    #[serde(
        default,
        rename = "templateID",
        skip_serializing_if = "Option::is_none"
    )]
    pub template_id: Option<String>,
    /// Seconds the sandbox runs from now before it is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// Answer of `POST /workspaces/{user_id}/sandbox`: the user's sandbox (connect to it as to any) and what
/// was done to hand it over: `created`, `existing`, `resumed` or `replaced`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSandbox {
    #[serde(rename = "userID")]
    pub user_id: String,
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub action: String,
    pub sandbox: Sandbox,
}

/// One move of a workspace's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceMove {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at: DateTime<Utc>,
}

/// Answer of `GET /workspaces/{user_id}/history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceHistory {
    #[serde(rename = "userID")]
    pub user_id: String,
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The sandbox the user is on now.
    #[serde(rename = "sandboxID", default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    pub history: Vec<WorkspaceMove>,
}
