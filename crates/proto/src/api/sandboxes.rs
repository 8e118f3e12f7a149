//! Sandbox resource DTOs.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `POST /sandboxes` and `POST /v2/sandboxes` body. Unknown fields are refused (a field the server
/// does not know is a feature it would otherwise silently not provide).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Time to live in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_memory: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<AutoResumeConfig>,
    /// Ignored by E2B's v2 API (always secure); honoured on v1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    #[serde(
        default,
        rename = "allow_internet_access",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<SandboxNetwork>,
    /// MCP gateway configuration (E2B); kept only to be refused by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<serde_json::Value>,
    /// Cloud IAM credentials for the sandbox (E2B); kept only to be refused by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iam: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<serde_json::Value>,
    /// Warren's own: this sandbox's monitor policies, over the server's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<SandboxPolicies>,
}

/// Warren's own `policies` of a create body: what the monitor does about this sandbox. A field left
/// out keeps the server's default (`warren up --runaway-…`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxPolicies {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runaway: Option<RunawayPolicyOverride>,
    /// Percent of the memory limit in use at which an event names the largest processes (0: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_alert_percent: Option<f64>,
    /// Percent of the disk used at which an event names the largest files (0: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_alert_percent: Option<f64>,
    /// End the sandbox (pause with autoPause, else kill) once it has been idle this many seconds:
    /// no request through the proxy and no command running but the template's start command (0:
    /// never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    /// Kill the sandbox's orphaned processes (what finished commands left running) each time it is
    /// resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reap_orphans_on_resume: Option<bool>,
    /// Kill the sandbox's orphaned processes every this many seconds while it runs (0: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reap_orphans_every_secs: Option<u64>,
}

/// A process that holds `cpuPercent` of one core for `seconds` is a runaway: an event names it, and
/// with `kill` it is killed. `cpuPercent: 0` turns the policy off for the sandbox.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunawayPolicyOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill: Option<bool>,
}

/// The `network` object of a create body (E2B's `SandboxNetworkConfig`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxNetwork {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_ports: Option<Vec<u16>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<serde_json::Value>,
}

/// `PUT /sandboxes/{id}/network` body (E2B's `SandboxNetworkUpdateConfig`): replaces the rules.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxNetworkUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<serde_json::Value>,
    #[serde(
        default,
        rename = "allow_internet_access",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
}

impl SandboxNetworkUpdate {
    /// The JSON names of the fields that ask for what an update cannot do here: a change of
    /// `allow_internet_access` (set at create).
    pub fn requested_fields(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.allow_internet_access.is_some() {
            out.push("allow_internet_access");
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AutoResumeConfig {
    pub enabled: bool,
}

/// Answer to create and connect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub traffic_access_token: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
}

/// Sandbox state as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "running" => Some(SandboxState::Running),
            "paused" => Some(SandboxState::Paused),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    Kill,
    Pause,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxLifecycle {
    pub auto_resume: bool,
    pub on_timeout: OnTimeout,
}

/// What the latest pause saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PauseMode {
    Full,
    Filesystem,
}

/// `GET /sandboxes/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub started_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub envd_version: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: SandboxState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub domain: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SandboxLifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<PauseMode>,
    /// The sandbox's egress rules and public-traffic setting, as they are enforced now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<SandboxNetwork>,
    /// Warren's own: the monitor policies it was given (its template's with its own over them);
    /// the server's defaults apply to what is not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<SandboxPolicies>,
}

/// One item of `GET /sandboxes` and `GET /v2/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub started_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: SandboxState,
    pub envd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxTimeoutRequest {
    pub timeout: i64,
}

/// `POST /sandboxes/{id}/connect`, `/v2/sandboxes/{id}/connect` and `/resume`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ConnectSandbox {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
    /// `false` asks for a cold boot from disk; Warren refuses it (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    /// Deprecated alias of auto-pause on resume (v1 resume body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxPauseRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_healthy_guest: Option<bool>,
}

/// One sample of `GET /sandboxes/{id}/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    pub timestamp: DateTime<Utc>,
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
    /// Warren's own: bytes the sandbox received and sent on its network link since it was started
    /// or last restored.
    #[serde(default)]
    pub net_rx_bytes: u64,
    #[serde(default)]
    pub net_tx_bytes: u64,
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: the newest sample of each sandbox that has one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxesWithMetrics {
    pub sandboxes: std::collections::BTreeMap<String, SandboxMetric>,
}

/// One item of Warren's own `GET /sandboxes/{id}/processes`: PIDs as the sandbox sees them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxProcess {
    pub pid: u32,
    pub ppid: u32,
    pub user: String,
    pub command: String,
    /// Percent of one core since the previous listing.
    pub cpu_percent: f64,
    pub rss_bytes: u64,
    pub started_at: DateTime<Utc>,
}

/// Warren's own `GET /sandboxes/{id}/disk`: how full the writable layer is and its largest files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxDiskUsage {
    pub used_bytes: u64,
    pub total_bytes: u64,
    pub largest: Vec<SandboxFile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxFile {
    /// As the sandbox sees it.
    pub path: String,
    pub bytes: u64,
}

/// One item of `GET /events/sandboxes[/{id}]` (E2B's lifecycle events API).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxLifecycleEvent {
    pub version: String,
    /// The store's sequence number of the event, as a string; increasing.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// Warren's detail: `from` and `to` states, and `reason` when one was given.
    pub event_data: Option<serde_json::Value>,
    pub sandbox_build_id: Option<String>,
    pub sandbox_execution_id: Option<String>,
    pub sandbox_id: String,
    pub sandbox_team_id: String,
    pub sandbox_template_id: String,
    pub timestamp: DateTime<Utc>,
}

/// `GET /sandboxes/{id}/logs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxLogs {
    pub logs: Vec<SandboxLog>,
    pub log_entries: Vec<SandboxLogEntry>,
}

/// `GET /v2/sandboxes/{id}/logs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxLogsV2 {
    pub logs: Vec<SandboxLogEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxLog {
    pub timestamp: DateTime<Utc>,
    pub line: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxLogEntry {
    pub timestamp: DateTime<Utc>,
    pub message: String,
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    pub fields: BTreeMap<String, String>,
}

/// Body of envd's `POST /init`, sent by the server right after a sandbox starts or is restored.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct EnvdInit {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env_vars: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_workdir: Option<String>,
    /// Host clock, so the sandbox can fix its own after a restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<DateTime<Utc>>,
    /// Warren's own: a CA certificate (PEM) the agent adds to the sandbox's trust store (the host's
    /// egress CA, for header rules over HTTPS).
    #[serde(
        default,
        rename = "warrenTrustedCA",
        skip_serializing_if = "Option::is_none"
    )]
    pub warren_trusted_ca: Option<String>,
}
