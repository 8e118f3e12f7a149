//! Row mapping shared by both back ends: a stored row becomes a record the same way whichever
//! database it came from, and a record's JSON columns are written the same way. Each back end
//! supplies typed column reads through [`Columns`]; the SQL stays in the back ends.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;

use sqlx::postgres::{PgRow, Postgres};
use sqlx::sqlite::{Sqlite, SqliteRow};
use sqlx::{Decode, Row, Type};

use super::{
    ApiKeyRecord, BuildRecord, BuildState, ChecksumStatus, LogLevel, MetricSample, PauseKind,
    SandboxEvent, SandboxLogLine, SandboxRecord, SecretRecord, ServerRecord, SnapshotRecord,
    StoreError, TeamRecord, TemplateRecord, TemplateTag, VolumeRecord, WebhookRecord,
    WorkspaceMove, WorkspaceRecord,
};
use crate::lifecycle::state::SandboxState;
use crate::secrets::Sealed;
use warren_runtime::network::egress::{Cidr, EgressRules, HeaderRule, HostPattern, UpstreamProxy};

/// A value both databases decode the same way (text, 64-bit integers, doubles, bytes, and `Option`s
/// of those).
pub(super) trait Column:
    for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres>
{
}

impl<T> Column for T where
    T: for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres>
{
}

/// A row of either back end, read by column name.
pub(super) trait Columns {
    fn try_get<T: Column>(&self, name: &str) -> Result<T, sqlx::Error>;

    /// A boolean column: an integer 0/1 in both schemas (see `migrations.rs`).
    fn flag(&self, name: &str) -> Result<bool, sqlx::Error> {
        Ok(self.try_get::<i64>(name)? != 0)
    }

    fn flag_opt(&self, name: &str) -> Result<Option<bool>, sqlx::Error> {
        Ok(self.try_get::<Option<i64>>(name)?.map(|n| n != 0))
    }
}

impl Columns for SqliteRow {
    fn try_get<T: Column>(&self, name: &str) -> Result<T, sqlx::Error> {
        Row::try_get(self, name)
    }
}

impl Columns for PgRow {
    fn try_get<T: Column>(&self, name: &str) -> Result<T, sqlx::Error> {
        Row::try_get(self, name)
    }
}

/// A boolean as both schemas store it.
pub(super) fn flag(value: bool) -> i64 {
    i64::from(value)
}

pub(super) fn corrupt(
    what: &'static str,
    id: &str,
    source: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    StoreError::Corrupt {
        what,
        id: id.to_string(),
        source: Box::new(source),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown value {0:?}")]
pub(super) struct UnknownValue(String);

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> String {
    // Serializing maps of strings and vectors of strings cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

pub(super) fn api_key_from_row(row: &impl Columns) -> Result<ApiKeyRecord, StoreError> {
    Ok(ApiKeyRecord {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        prefix: row.try_get("prefix")?,
        secret_hash: row.try_get("secret_hash")?,
        created_at: row.try_get("created_at")?,
        last_used_at: row.try_get("last_used_at")?,
        revoked_at: row.try_get("revoked_at")?,
        team_id: row.try_get("team_id")?,
        admin: row.flag("admin")?,
    })
}

/// `{"allow": [...], "allowHosts": [...], "deny": [...], "headerRules": [...], "upstream": {...}}`
/// of CIDR and host-pattern strings, header rules and the SOCKS5 proxy; None for no rules.
pub(super) fn egress_to_json(egress: &EgressRules) -> Option<String> {
    if egress.is_empty() {
        return None;
    }
    let list = |cidrs: &[Cidr]| cidrs.iter().map(Cidr::to_string).collect::<Vec<_>>();
    Some(to_json(&serde_json::json!({
        "allow": list(&egress.allow),
        "allowHosts": egress.allow_hosts.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "deny": list(&egress.deny),
        "headerRules": egress.header_rules.iter().map(|rule| serde_json::json!({
            "host": rule.pattern.to_string(),
            "headers": rule.headers,
        })).collect::<Vec<_>>(),
        "upstream": egress.upstream,
    })))
}

pub(super) fn egress_from_json(id: &str, text: Option<String>) -> Result<EgressRules, StoreError> {
    let Some(text) = text else {
        return Ok(EgressRules::default());
    };
    #[derive(serde::Deserialize)]
    struct Stored {
        allow: Vec<String>,
        #[serde(default, rename = "allowHosts")]
        allow_hosts: Vec<String>,
        deny: Vec<String>,
        #[serde(default, rename = "headerRules")]
        header_rules: Vec<StoredHeaderRule>,
        #[serde(default)]
        upstream: Option<UpstreamProxy>,
    }
    #[derive(serde::Deserialize)]
    struct StoredHeaderRule {
        host: String,
        headers: Vec<(String, String)>,
    }
    let stored: Stored =
        serde_json::from_str(&text).map_err(|e| corrupt("sandbox egress rules", id, e))?;
    let parse = |list: &[String]| -> Result<Vec<Cidr>, StoreError> {
        list.iter()
            .map(|c| {
                c.parse::<Cidr>()
                    .map_err(|e| corrupt("sandbox egress rules", id, e))
            })
            .collect()
    };
    let allow_hosts = stored
        .allow_hosts
        .iter()
        .map(|h| {
            h.parse::<HostPattern>()
                .map_err(|e| corrupt("sandbox egress rules", id, e))
        })
        .collect::<Result<_, _>>()?;
    let header_rules = stored
        .header_rules
        .into_iter()
        .map(|rule| {
            Ok(HeaderRule {
                pattern: rule
                    .host
                    .parse::<HostPattern>()
                    .map_err(|e| corrupt("sandbox egress rules", id, e))?,
                headers: rule.headers,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(EgressRules {
        allow: parse(&stored.allow)?,
        allow_hosts,
        deny: parse(&stored.deny)?,
        header_rules,
        upstream: stored.upstream,
    })
}

pub(super) fn team_from_row(row: &impl Columns) -> Result<TeamRecord, StoreError> {
    Ok(TeamRecord {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        max_sandboxes: row
            .try_get::<Option<i64>>("max_sandboxes")?
            .map(|n| n as u32),
        max_vcpus: row.try_get("max_vcpus")?,
        max_memory_mib: row
            .try_get::<Option<i64>>("max_memory_mib")?
            .map(|n| n as u64),
        created_at: row.try_get("created_at")?,
    })
}

pub(super) fn template_from_row(row: &impl Columns) -> Result<TemplateRecord, StoreError> {
    let id: String = row.try_get("id")?;
    let aliases: String = row.try_get("aliases")?;
    let layers: String = row.try_get("layers")?;
    Ok(TemplateRecord {
        aliases: serde_json::from_str(&aliases).map_err(|e| corrupt("template aliases", &id, e))?,
        layers: serde_json::from_str::<Vec<PathBuf>>(&layers)
            .map_err(|e| corrupt("template layers", &id, e))?,
        build_id: row.try_get("build_id")?,
        status: row.try_get("status")?,
        vcpus: row.try_get("vcpus")?,
        memory_mib: row.try_get::<i64>("memory_mib")? as u64,
        disk_mib: row.try_get::<i64>("disk_mib")? as u64,
        envd_version: row.try_get("envd_version")?,
        public: row.flag("public")?,
        team_id: row.try_get("team_id")?,
        spawn_count: row.try_get::<i64>("spawn_count")? as u64,
        last_spawned_at: row.try_get("last_spawned_at")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        policies: serde_json::from_str(&row.try_get::<String>("policies")?)
            .map_err(|e| corrupt("template policies", &id, e))?,
        id,
    })
}

pub(super) fn parse_state(id: &str, value: &str) -> Result<SandboxState, StoreError> {
    SandboxState::from_str(value)
        .map_err(|_| corrupt("sandbox state", id, UnknownValue(value.to_string())))
}

pub(super) fn sandbox_from_row(row: &impl Columns) -> Result<SandboxRecord, StoreError> {
    let id: String = row.try_get("id")?;
    let state: String = row.try_get("state")?;
    let metadata: String = row.try_get("metadata")?;
    let env_vars: String = row.try_get("env_vars")?;
    let ip: Option<String> = row.try_get("ip")?;
    let pause_kind: Option<String> = row.try_get("pause_kind")?;
    let snapshot_dir: Option<String> = row.try_get("snapshot_dir")?;
    let ip = match ip {
        Some(ip) => Some(Ipv4Addr::from_str(&ip).map_err(|e| corrupt("sandbox ip", &id, e))?),
        None => None,
    };
    let pause_kind = match pause_kind {
        Some(kind) => Some(
            PauseKind::parse(&kind)
                .ok_or_else(|| corrupt("sandbox pause kind", &id, UnknownValue(kind.clone())))?,
        ),
        None => None,
    };
    Ok(SandboxRecord {
        team_id: row.try_get("team_id")?,
        state: parse_state(&id, &state)?,
        template_id: row.try_get("template_id")?,
        alias: row.try_get("alias")?,
        client_id: row.try_get("client_id")?,
        state_reason: row.try_get("state_reason")?,
        metadata: serde_json::from_str::<BTreeMap<String, String>>(&metadata)
            .map_err(|e| corrupt("sandbox metadata", &id, e))?,
        env_vars: serde_json::from_str::<BTreeMap<String, String>>(&env_vars)
            .map_err(|e| corrupt("sandbox env vars", &id, e))?,
        vcpus: row.try_get("vcpus")?,
        memory_mib: row.try_get::<i64>("memory_mib")? as u64,
        disk_mib: row.try_get::<i64>("disk_mib")? as u64,
        auto_pause: row.flag("auto_pause")?,
        auto_pause_memory: row.flag("auto_pause_memory")?,
        auto_resume: row.flag("auto_resume")?,
        allow_internet: row.flag_opt("allow_internet")?,
        envd_access_token: row.try_get("envd_access_token")?,
        traffic_access_token: row.try_get("traffic_access_token")?,
        egress: egress_from_json(&id, row.try_get("egress")?)?,
        policies: match row.try_get::<Option<String>>("policies")? {
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| corrupt("sandbox policies", &id, e))?
            }
            None => Default::default(),
        },
        ingress: match row.try_get::<Option<String>>("ingress")? {
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| corrupt("sandbox ingress", &id, e))?
            }
            None => Default::default(),
        },
        volumes: match row.try_get::<Option<String>>("volume_mounts")? {
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| corrupt("sandbox volume mounts", &id, e))?
            }
            None => Vec::new(),
        },
        ip,
        init_pid: row
            .try_get::<Option<i64>>("init_pid")?
            .map(|pid| pid as u32),
        pause_kind,
        snapshot_dir: snapshot_dir.map(PathBuf::from),
        started_at: row.try_get("started_at")?,
        end_at: row.try_get("end_at")?,
        updated_at: row.try_get("updated_at")?,
        id,
    })
}

pub(super) fn event_from_row(row: &impl Columns) -> Result<SandboxEvent, StoreError> {
    let sandbox_id: String = row.try_get("sandbox_id")?;
    let from_state: Option<String> = row.try_get("from_state")?;
    let to_state: String = row.try_get("to_state")?;
    Ok(SandboxEvent {
        seq: row.try_get("seq")?,
        from_state: match from_state {
            Some(state) => Some(parse_state(&sandbox_id, &state)?),
            None => None,
        },
        to_state: parse_state(&sandbox_id, &to_state)?,
        reason: row.try_get("reason")?,
        at: row.try_get("at")?,
        sandbox_id,
    })
}

pub(super) fn line_from_row(row: &impl Columns) -> Result<SandboxLogLine, StoreError> {
    let level: String = row.try_get("level")?;
    let fields: String = row.try_get("fields")?;
    Ok(SandboxLogLine {
        sandbox_id: row.try_get("sandbox_id")?,
        seq: row.try_get("seq")?,
        at: row.try_get("at")?,
        level: LogLevel::parse(&level).unwrap_or(LogLevel::Info),
        message: row.try_get("message")?,
        fields: serde_json::from_str::<BTreeMap<String, String>>(&fields).unwrap_or_default(),
    })
}

pub(super) fn sample_from_row(row: &impl Columns) -> Result<MetricSample, StoreError> {
    let count = |name: &str| -> Result<u64, StoreError> {
        Ok(u64::try_from(row.try_get::<i64>(name)?).unwrap_or(0))
    };
    Ok(MetricSample {
        sandbox_id: row.try_get("sandbox_id")?,
        at: row.try_get("at")?,
        cpu_pct: row.try_get("cpu_pct")?,
        cpu_count: u32::try_from(count("cpu_count")?).unwrap_or(u32::MAX),
        mem_used: count("mem_used")?,
        mem_total: count("mem_total")?,
        disk_used: count("disk_used")?,
        disk_total: count("disk_total")?,
        pids: count("pids")?,
        oom_kills: count("oom_kills")?,
        mem_cache: count("mem_cache")?,
        net_rx: count("net_rx")?,
        net_tx: count("net_tx")?,
    })
}

/// SQLite integers are signed: counts beyond i64 (never met in practice) are stored as its maximum.
pub(super) fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(super) fn secret_from_row(row: &impl Columns) -> Result<SecretRecord, StoreError> {
    let id: String = row.try_get("id")?;
    let metadata: String = row.try_get("metadata")?;
    let metadata = serde_json::from_str::<BTreeMap<String, String>>(&metadata).map_err(|e| {
        StoreError::Corrupt {
            what: "secret metadata",
            id: id.clone(),
            source: Box::new(e),
        }
    })?;
    Ok(SecretRecord {
        team_id: row.try_get("team_id")?,
        name: row.try_get("name")?,
        version: row.try_get("version")?,
        sealed: Sealed {
            nonce: row.try_get("nonce")?,
            ciphertext: row.try_get("ciphertext")?,
        },
        metadata,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        id,
    })
}

pub(super) fn metadata_json(metadata: &BTreeMap<String, String>) -> String {
    serde_json::to_string(metadata).unwrap_or_else(|_| "{}".to_string())
}

pub(super) fn snapshot_from_row(row: &impl Columns) -> Result<SnapshotRecord, StoreError> {
    let id: String = row.try_get("id")?;
    let layers: String = row.try_get("layers")?;
    let dir: String = row.try_get("dir")?;
    let status: String = row.try_get("checksum_status")?;
    Ok(SnapshotRecord {
        team_id: row.try_get("team_id")?,
        name: row.try_get("name")?,
        sandbox_id: row.try_get("sandbox_id")?,
        template_id: row.try_get("template_id")?,
        layers: serde_json::from_str::<Vec<PathBuf>>(&layers)
            .map_err(|e| corrupt("snapshot layers", &id, e))?,
        dir: PathBuf::from(dir),
        size_bytes: row.try_get::<i64>("size_bytes")? as u64,
        checksum_status: ChecksumStatus::parse(&status)
            .ok_or_else(|| corrupt("snapshot checksum status", &id, UnknownStatus(status)))?,
        vcpus: row.try_get("vcpus")?,
        memory_mib: row.try_get::<i64>("memory_mib")? as u64,
        disk_mib: row.try_get::<i64>("disk_mib")? as u64,
        envd_access_token: row.try_get("envd_access_token")?,
        created_at: row.try_get("created_at")?,
        id,
    })
}

pub(super) fn volume_from_row(row: &impl Columns) -> Result<VolumeRecord, StoreError> {
    Ok(VolumeRecord {
        id: row.try_get("id")?,
        team_id: row.try_get("team_id")?,
        name: row.try_get("name")?,
        token: row.try_get("token")?,
        size_mib: row.try_get::<i64>("size_mib")? as u64,
        created_at: row.try_get("created_at")?,
    })
}

pub(super) fn workspace_from_row(row: &impl Columns) -> Result<WorkspaceRecord, StoreError> {
    Ok(WorkspaceRecord {
        team_id: row.try_get("team_id")?,
        user_id: row.try_get("user_id")?,
        template: row.try_get("template")?,
        sandbox_id: row.try_get("sandbox_id")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

#[derive(Debug, thiserror::Error)]
#[error("unknown checksum status {0:?}")]
struct UnknownStatus(String);

pub(super) fn webhook_from_row(row: &impl Columns) -> Result<WebhookRecord, StoreError> {
    let id: String = row.try_get("id")?;
    let events: String = row.try_get("events")?;
    Ok(WebhookRecord {
        team_id: row.try_get("team_id")?,
        name: row.try_get("name")?,
        url: row.try_get("url")?,
        enabled: row.flag("enabled")?,
        events: serde_json::from_str(&events).map_err(|e| corrupt("webhook events", &id, e))?,
        secret: row.try_get("secret")?,
        delivered_seq: row.try_get("delivered_seq")?,
        created_at: row.try_get("created_at")?,
        id,
    })
}

pub(super) fn tag_from_row(row: &impl Columns) -> Result<TemplateTag, StoreError> {
    Ok(TemplateTag {
        template_id: row.try_get("template_id")?,
        tag: row.try_get("tag")?,
        build_id: row.try_get("build_id")?,
        created_at: row.try_get("created_at")?,
    })
}

pub(super) fn build_from_row(row: &impl Columns) -> Result<BuildRecord, StoreError> {
    let build_id: String = row.try_get("build_id")?;
    let status: String = row.try_get("status")?;
    Ok(BuildRecord {
        template_id: row.try_get("template_id")?,
        status: BuildState::parse(&status).ok_or_else(|| StoreError::Corrupt {
            what: "build status",
            id: build_id.clone(),
            source: format!("unknown build status {status:?}").into(),
        })?,
        reason: row.try_get("reason")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        build_id,
    })
}

pub(super) fn workspace_move_from_row(row: &impl Columns) -> Result<WorkspaceMove, StoreError> {
    Ok(WorkspaceMove {
        sandbox_id: row.try_get("sandbox_id")?,
        action: row.try_get("action")?,
        reason: row.try_get("reason")?,
        at: row.try_get("at")?,
    })
}

pub(super) fn server_from_row(row: &impl Columns) -> Result<ServerRecord, StoreError> {
    let id: String = row.try_get("id")?;
    let holds: String = row.try_get("holds")?;
    Ok(ServerRecord {
        address: row.try_get("address")?,
        started_at: row.try_get("started_at")?,
        renewed_at: row.try_get("renewed_at")?,
        holds: serde_json::from_str(&holds).map_err(|e| corrupt("server holds", &id, e))?,
        leading: row.flag("leader")?,
        id,
    })
}
