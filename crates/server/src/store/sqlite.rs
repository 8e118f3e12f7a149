//! SQLite implementation of [`Store`]: WAL journal, migrations embedded in the binary. All of the server's
//! SQL is in this file and its sibling `sqlite_snapshots.rs` (the snapshot rows).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};

use super::{
    sqlite_logs, sqlite_metrics, sqlite_secrets, sqlite_snapshots, sqlite_template_builds,
    sqlite_volumes, sqlite_workspaces, ApiKeyRecord, BuildRecord, BuildSandboxEvent,
    ChecksumStatus, EventQuery, IdempotencyClaim, LifecycleEvent, LogQuery, MetricSample, Millis,
    PauseKind, SandboxEvent, SandboxFilter, SandboxLogLine, SandboxRecord, SecretRecord,
    SnapshotFilter, SnapshotRecord, Store, StoreError, TeamRecord, TemplateRecord, TemplateTag,
    TransitionUpdate, VolumeDeletion, VolumeRecord, WebhookRecord, WorkspaceMove, WorkspaceRecord,
};
use crate::lifecycle::state::SandboxState;
use warren_runtime::network::egress::{Cidr, EgressRules, HeaderRule, HostPattern, UpstreamProxy};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Name of the database file inside the state directory.
pub const DATABASE_FILE: &str = "warren.db";

/// How stale `api_keys.last_used_at` may get.
const LAST_USED_RESOLUTION_MS: Millis = 60_000;

pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Open (creating if needed) `state_dir/warren.db` and bring its schema up to date.
    pub async fn open_in(state_dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(state_dir).map_err(|source| StoreError::StateDir {
            path: state_dir.to_path_buf(),
            source,
        })?;
        Self::open(&state_dir.join(DATABASE_FILE)).await
    }

    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(SqliteStore { pool })
    }
}

fn corrupt(
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
struct UnknownValue(String);

fn to_json<T: serde::Serialize>(value: &T) -> String {
    // Serializing maps of strings and vectors of strings cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

fn api_key_from_row(row: &SqliteRow) -> Result<ApiKeyRecord, StoreError> {
    Ok(ApiKeyRecord {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        prefix: row.try_get("prefix")?,
        secret_hash: row.try_get("secret_hash")?,
        created_at: row.try_get("created_at")?,
        last_used_at: row.try_get("last_used_at")?,
        revoked_at: row.try_get("revoked_at")?,
        team_id: row.try_get("team_id")?,
        admin: row.try_get("admin")?,
    })
}

/// `{"allow": [...], "allowHosts": [...], "deny": [...], "headerRules": [...], "upstream": {...}}`
/// of CIDR and host-pattern strings, header rules and the SOCKS5 proxy; None for no rules.
fn egress_to_json(egress: &EgressRules) -> Option<String> {
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

fn egress_from_json(id: &str, text: Option<String>) -> Result<EgressRules, StoreError> {
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

fn team_from_row(row: &SqliteRow) -> Result<TeamRecord, StoreError> {
    Ok(TeamRecord {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        max_sandboxes: row
            .try_get::<Option<i64>, _>("max_sandboxes")?
            .map(|n| n as u32),
        max_vcpus: row.try_get("max_vcpus")?,
        max_memory_mib: row
            .try_get::<Option<i64>, _>("max_memory_mib")?
            .map(|n| n as u64),
        created_at: row.try_get("created_at")?,
    })
}

fn template_from_row(row: &SqliteRow) -> Result<TemplateRecord, StoreError> {
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
        memory_mib: row.try_get::<i64, _>("memory_mib")? as u64,
        disk_mib: row.try_get::<i64, _>("disk_mib")? as u64,
        envd_version: row.try_get("envd_version")?,
        public: row.try_get("public")?,
        team_id: row.try_get("team_id")?,
        spawn_count: row.try_get::<i64, _>("spawn_count")? as u64,
        last_spawned_at: row.try_get("last_spawned_at")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        policies: serde_json::from_str(&row.try_get::<String, _>("policies")?)
            .map_err(|e| corrupt("template policies", &id, e))?,
        id,
    })
}

fn parse_state(id: &str, value: &str) -> Result<SandboxState, StoreError> {
    SandboxState::from_str(value)
        .map_err(|_| corrupt("sandbox state", id, UnknownValue(value.to_string())))
}

fn sandbox_from_row(row: &SqliteRow) -> Result<SandboxRecord, StoreError> {
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
        memory_mib: row.try_get::<i64, _>("memory_mib")? as u64,
        disk_mib: row.try_get::<i64, _>("disk_mib")? as u64,
        auto_pause: row.try_get("auto_pause")?,
        auto_pause_memory: row.try_get("auto_pause_memory")?,
        auto_resume: row.try_get("auto_resume")?,
        allow_internet: row.try_get("allow_internet")?,
        envd_access_token: row.try_get("envd_access_token")?,
        traffic_access_token: row.try_get("traffic_access_token")?,
        egress: egress_from_json(&id, row.try_get("egress")?)?,
        policies: match row.try_get::<Option<String>, _>("policies")? {
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| corrupt("sandbox policies", &id, e))?
            }
            None => Default::default(),
        },
        ingress: match row.try_get::<Option<String>, _>("ingress")? {
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| corrupt("sandbox ingress", &id, e))?
            }
            None => Default::default(),
        },
        volumes: match row.try_get::<Option<String>, _>("volume_mounts")? {
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| corrupt("sandbox volume mounts", &id, e))?
            }
            None => Vec::new(),
        },
        ip,
        init_pid: row
            .try_get::<Option<i64>, _>("init_pid")?
            .map(|pid| pid as u32),
        pause_kind,
        snapshot_dir: snapshot_dir.map(PathBuf::from),
        started_at: row.try_get("started_at")?,
        end_at: row.try_get("end_at")?,
        updated_at: row.try_get("updated_at")?,
        id,
    })
}

fn event_from_row(row: &SqliteRow) -> Result<SandboxEvent, StoreError> {
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

#[async_trait]
impl Store for SqliteStore {
    async fn insert_api_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO api_keys (id, name, prefix, secret_hash, created_at, last_used_at, revoked_at, \
             team_id, admin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&key.id)
        .bind(&key.name)
        .bind(&key.prefix)
        .bind(&key.secret_hash)
        .bind(key.created_at)
        .bind(key.last_used_at)
        .bind(key.revoked_at)
        .bind(&key.team_id)
        .bind(key.admin)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn claim_idempotency_key(
        &self,
        team_id: &str,
        key: &str,
        request_hash: &str,
        now: Millis,
        expired_before: Millis,
    ) -> Result<IdempotencyClaim, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM idempotency_keys WHERE created_at < ?")
            .bind(expired_before)
            .execute(&mut *tx)
            .await?;
        let inserted = sqlx::query(
            "INSERT INTO idempotency_keys (team_id, key, request_hash, sandbox_id, created_at) \
             VALUES (?, ?, ?, NULL, ?) ON CONFLICT (team_id, key) DO NOTHING",
        )
        .bind(team_id)
        .bind(key)
        .bind(request_hash)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let claim = if inserted == 1 {
            IdempotencyClaim::Claimed
        } else {
            let row = sqlx::query(
                "SELECT request_hash, sandbox_id FROM idempotency_keys WHERE team_id = ? AND key = ?",
            )
            .bind(team_id)
            .bind(key)
            .fetch_one(&mut *tx)
            .await?;
            IdempotencyClaim::Held {
                request_hash: row.try_get("request_hash")?,
                sandbox_id: row.try_get("sandbox_id")?,
            }
        };
        tx.commit().await?;
        Ok(claim)
    }

    async fn finish_idempotency_key(
        &self,
        team_id: &str,
        key: &str,
        sandbox_id: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE idempotency_keys SET sandbox_id = ? WHERE team_id = ? AND key = ?")
            .bind(sandbox_id)
            .bind(team_id)
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn set_sandbox_egress(&self, id: &str, egress: &EgressRules) -> Result<(), StoreError> {
        sqlx::query("UPDATE sandboxes SET egress = ? WHERE id = ?")
            .bind(egress_to_json(egress))
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn release_idempotency_key(&self, team_id: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM idempotency_keys WHERE team_id = ? AND key = ? AND sandbox_id IS NULL",
        )
        .bind(team_id)
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn get_workspace(
        &self,
        team_id: &str,
        user_id: &str,
    ) -> Result<Option<WorkspaceRecord>, StoreError> {
        sqlite_workspaces::get(&self.pool, team_id, user_id).await
    }

    async fn record_workspace_move(
        &self,
        workspace: &WorkspaceRecord,
        entry: &WorkspaceMove,
    ) -> Result<(), StoreError> {
        sqlite_workspaces::record_move(&self.pool, workspace, entry).await
    }

    async fn workspace_history(
        &self,
        team_id: &str,
        user_id: &str,
    ) -> Result<Vec<WorkspaceMove>, StoreError> {
        sqlite_workspaces::history(&self.pool, team_id, user_id).await
    }

    async fn upsert_webhook(&self, w: &WebhookRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO webhooks (id, team_id, name, url, enabled, events, secret, delivered_seq, \
             created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET \
             name = excluded.name, url = excluded.url, enabled = excluded.enabled, \
             events = excluded.events, secret = excluded.secret",
        )
        .bind(&w.id)
        .bind(&w.team_id)
        .bind(&w.name)
        .bind(&w.url)
        .bind(w.enabled)
        .bind(to_json(&w.events))
        .bind(&w.secret)
        .bind(w.delivered_seq)
        .bind(w.created_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn list_webhooks(&self) -> Result<Vec<WebhookRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM webhooks ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get("id")?;
                let events: String = row.try_get("events")?;
                Ok(WebhookRecord {
                    team_id: row.try_get("team_id")?,
                    name: row.try_get("name")?,
                    url: row.try_get("url")?,
                    enabled: row.try_get("enabled")?,
                    events: serde_json::from_str(&events)
                        .map_err(|e| corrupt("webhook events", &id, e))?,
                    secret: row.try_get("secret")?,
                    delivered_seq: row.try_get("delivered_seq")?,
                    created_at: row.try_get("created_at")?,
                    id,
                })
            })
            .collect()
    }

    async fn delete_webhook(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM webhooks WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn set_webhook_delivered(&self, id: &str, seq: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE webhooks SET delivered_seq = MAX(delivered_seq, ?) WHERE id = ?")
            .bind(seq)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn latest_event_seq(&self) -> Result<i64, StoreError> {
        let seq: Option<i64> = sqlx::query_scalar("SELECT MAX(seq) FROM sandbox_events")
            .fetch_one(&self.pool)
            .await?;
        Ok(seq.unwrap_or(0))
    }

    async fn prune_sandbox_events(&self, before: Millis) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM sandbox_events WHERE at < ?")
            .bind(before)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn insert_metric_samples(&self, samples: &[MetricSample]) -> Result<(), StoreError> {
        sqlite_metrics::insert(&self.pool, samples).await
    }

    async fn metric_samples(
        &self,
        id: &str,
        from: Millis,
        to: Millis,
    ) -> Result<Vec<MetricSample>, StoreError> {
        sqlite_metrics::between(&self.pool, id, from, to).await
    }

    async fn latest_metric_samples(&self, ids: &[String]) -> Result<Vec<MetricSample>, StoreError> {
        sqlite_metrics::latest(&self.pool, ids).await
    }

    async fn prune_metric_samples(&self, before: Millis) -> Result<u64, StoreError> {
        sqlite_metrics::prune(&self.pool, before).await
    }

    async fn insert_sandbox_logs(
        &self,
        lines: &[SandboxLogLine],
        keep_per_sandbox: u64,
    ) -> Result<(), StoreError> {
        sqlite_logs::insert(&self.pool, lines, keep_per_sandbox).await
    }

    async fn sandbox_logs(
        &self,
        id: &str,
        query: &LogQuery,
    ) -> Result<Vec<SandboxLogLine>, StoreError> {
        sqlite_logs::page(&self.pool, id, query).await
    }

    async fn last_sandbox_log_seq(&self, id: &str) -> Result<Option<i64>, StoreError> {
        sqlite_logs::last_seq(&self.pool, id).await
    }

    async fn prune_sandbox_logs(&self, before: Millis) -> Result<u64, StoreError> {
        sqlite_logs::prune(&self.pool, before).await
    }

    async fn insert_secret(&self, secret: &SecretRecord) -> Result<bool, StoreError> {
        sqlite_secrets::insert(&self.pool, secret).await
    }

    async fn get_secret(
        &self,
        team_id: &str,
        id_or_name: &str,
    ) -> Result<Option<SecretRecord>, StoreError> {
        sqlite_secrets::get(&self.pool, team_id, id_or_name).await
    }

    async fn list_secrets(
        &self,
        team_id: &str,
        after: Option<(Millis, String)>,
        limit: u32,
    ) -> Result<Vec<SecretRecord>, StoreError> {
        sqlite_secrets::list(&self.pool, team_id, after, limit).await
    }

    async fn update_secret(
        &self,
        secret: &SecretRecord,
        expected_version: i64,
    ) -> Result<bool, StoreError> {
        sqlite_secrets::update(&self.pool, secret, expected_version).await
    }

    async fn delete_secret(&self, team_id: &str, id: &str) -> Result<bool, StoreError> {
        sqlite_secrets::delete(&self.pool, team_id, id).await
    }

    async fn insert_team(&self, team: &TeamRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO teams (id, name, max_sandboxes, max_vcpus, max_memory_mib, created_at) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(&team.id)
        .bind(&team.name)
        .bind(team.max_sandboxes.map(i64::from))
        .bind(team.max_vcpus)
        .bind(team.max_memory_mib.map(|n| n as i64))
        .bind(team.created_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn get_team(&self, id_or_name: &str) -> Result<Option<TeamRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT * FROM teams WHERE id = ? OR name = ? ORDER BY id = ? DESC LIMIT 1",
        )
        .bind(id_or_name)
        .bind(id_or_name)
        .bind(id_or_name)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(team_from_row).transpose()
    }

    async fn list_teams(&self) -> Result<Vec<TeamRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM teams ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(team_from_row).collect()
    }

    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM api_keys ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(api_key_from_row).collect()
    }

    async fn use_api_key(
        &self,
        secret_hash: &str,
        now: Millis,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        let row =
            sqlx::query("SELECT * FROM api_keys WHERE secret_hash = ? AND revoked_at IS NULL")
                .bind(secret_hash)
                .fetch_optional(&self.pool)
                .await?;
        let Some(mut key) = row.as_ref().map(api_key_from_row).transpose()? else {
            return Ok(None);
        };
        // Record use at most once a minute: every API request authenticates, and a write per request
        // would serialise them on SQLite's single writer.
        if key
            .last_used_at
            .is_none_or(|last| now - last >= LAST_USED_RESOLUTION_MS)
        {
            sqlx::query("UPDATE api_keys SET last_used_at = ? WHERE id = ?")
                .bind(now)
                .bind(&key.id)
                .execute(&self.pool)
                .await?;
            key.last_used_at = Some(now);
        }
        Ok(Some(key))
    }

    async fn revoke_api_key(&self, id_or_name: &str, now: Millis) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE api_keys SET revoked_at = ? WHERE (id = ? OR name = ?) AND revoked_at IS NULL",
        )
        .bind(now)
        .bind(id_or_name)
        .bind(id_or_name)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn upsert_template(&self, t: &TemplateRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO templates (id, aliases, layers, build_id, status, vcpus, memory_mib, disk_mib, \
             envd_version, public, spawn_count, last_spawned_at, created_at, updated_at, team_id, \
             policies) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (id) DO UPDATE SET aliases = excluded.aliases, layers = excluded.layers, \
             build_id = excluded.build_id, status = excluded.status, vcpus = excluded.vcpus, \
             memory_mib = excluded.memory_mib, disk_mib = excluded.disk_mib, \
             envd_version = excluded.envd_version, public = excluded.public, updated_at = excluded.updated_at",
        )
        .bind(&t.id)
        .bind(to_json(&t.aliases))
        .bind(to_json(&t.layers))
        .bind(&t.build_id)
        .bind(&t.status)
        .bind(t.vcpus)
        .bind(t.memory_mib as i64)
        .bind(t.disk_mib as i64)
        .bind(&t.envd_version)
        .bind(t.public)
        .bind(t.spawn_count as i64)
        .bind(t.last_spawned_at)
        .bind(t.created_at)
        .bind(t.updated_at)
        .bind(&t.team_id)
        .bind(to_json(&t.policies))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn update_template_settings(
        &self,
        id: &str,
        public: Option<bool>,
        policies: Option<&warren_proto::api::SandboxPolicies>,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE templates SET public = COALESCE(?, public), policies = COALESCE(?, policies), \
             updated_at = ? WHERE id = ?",
        )
        .bind(public)
        .bind(policies.map(to_json))
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn get_template(&self, id_or_alias: &str) -> Result<Option<TemplateRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT * FROM templates WHERE id = ? \
             OR EXISTS (SELECT 1 FROM json_each(templates.aliases) WHERE json_each.value = ?) \
             ORDER BY id = ? DESC LIMIT 1",
        )
        .bind(id_or_alias)
        .bind(id_or_alias)
        .bind(id_or_alias)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(template_from_row).transpose()
    }

    async fn list_templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        let rows = sqlx::query("SELECT * FROM templates ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(template_from_row).collect()
    }

    async fn record_template_spawn(&self, id: &str, now: Millis) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE templates SET spawn_count = spawn_count + 1, last_spawned_at = ? WHERE id = ?",
        )
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn delete_template(&self, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM template_tags WHERE template_id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query("DELETE FROM templates WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn assign_template_tags(
        &self,
        template_id: &str,
        build_id: &str,
        tags: &[String],
        now: Millis,
    ) -> Result<(), StoreError> {
        sqlite_template_builds::assign_tags(&self.pool, template_id, build_id, tags, now).await
    }

    async fn remove_template_tags(
        &self,
        template_id: &str,
        tags: &[String],
    ) -> Result<u64, StoreError> {
        sqlite_template_builds::remove_tags(&self.pool, template_id, tags).await
    }

    async fn list_template_tags(&self, template_id: &str) -> Result<Vec<TemplateTag>, StoreError> {
        sqlite_template_builds::list_tags(&self.pool, template_id).await
    }

    async fn upsert_build(&self, build: &BuildRecord) -> Result<(), StoreError> {
        sqlite_template_builds::upsert_build(&self.pool, build).await
    }

    async fn get_build(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<Option<BuildRecord>, StoreError> {
        sqlite_template_builds::get_build(&self.pool, template_id, build_id).await
    }

    async fn fail_unfinished_builds(&self, reason: &str, now: Millis) -> Result<u64, StoreError> {
        sqlite_template_builds::fail_unfinished_builds(&self.pool, reason, now).await
    }

    async fn insert_volume(&self, volume: &VolumeRecord) -> Result<(), StoreError> {
        sqlite_volumes::insert(&self.pool, volume).await
    }

    async fn get_volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        sqlite_volumes::get(&self.pool, id).await
    }

    async fn get_volume_by_name(
        &self,
        team_id: &str,
        name: &str,
    ) -> Result<Option<VolumeRecord>, StoreError> {
        sqlite_volumes::get_by_name(&self.pool, team_id, name).await
    }

    async fn list_volumes(&self, team_id: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        sqlite_volumes::list(&self.pool, team_id).await
    }

    async fn delete_volume(&self, id: &str) -> Result<VolumeDeletion, StoreError> {
        sqlite_volumes::delete(&self.pool, id).await
    }

    async fn insert_sandbox(&self, s: &SandboxRecord) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO sandboxes (id, template_id, alias, client_id, state, state_reason, metadata, env_vars, \
             vcpus, memory_mib, disk_mib, auto_pause, auto_resume, allow_internet, envd_access_token, ip, \
             init_pid, pause_kind, snapshot_dir, started_at, end_at, updated_at, team_id, \
             traffic_access_token, egress, policies, ingress, auto_pause_memory, volume_mounts) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.id)
        .bind(&s.template_id)
        .bind(&s.alias)
        .bind(&s.client_id)
        .bind(s.state.as_str())
        .bind(&s.state_reason)
        .bind(to_json(&s.metadata))
        .bind(to_json(&s.env_vars))
        .bind(s.vcpus)
        .bind(s.memory_mib as i64)
        .bind(s.disk_mib as i64)
        .bind(s.auto_pause)
        .bind(s.auto_resume)
        .bind(s.allow_internet)
        .bind(&s.envd_access_token)
        .bind(s.ip.map(|ip| ip.to_string()))
        .bind(s.init_pid.map(i64::from))
        .bind(s.pause_kind.map(PauseKind::as_str))
        .bind(s.snapshot_dir.as_ref().map(|dir| dir.to_string_lossy().into_owned()))
        .bind(s.started_at)
        .bind(s.end_at)
        .bind(s.updated_at)
        .bind(&s.team_id)
        .bind(&s.traffic_access_token)
        .bind(egress_to_json(&s.egress))
        .bind((s.policies != Default::default()).then(|| to_json(&s.policies)))
        .bind((!s.ingress.is_default()).then(|| to_json(&s.ingress)))
        .bind(s.auto_pause_memory)
        .bind((!s.volumes.is_empty()).then(|| to_json(&s.volumes)))
        .execute(&mut *tx)
        .await?;
        insert_event(
            &mut tx,
            &s.id,
            None,
            s.state,
            s.state_reason.as_deref(),
            s.updated_at,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRecord>, StoreError> {
        let row = sqlx::query("SELECT * FROM sandboxes WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(sandbox_from_row).transpose()
    }

    async fn list_sandboxes(
        &self,
        filter: &SandboxFilter,
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        let mut query: QueryBuilder<Sqlite> =
            QueryBuilder::new("SELECT * FROM sandboxes WHERE 1 = 1");
        if let Some(team) = &filter.team_id {
            query.push(" AND team_id = ").push_bind(team.clone());
        }
        if !filter.states.is_empty() {
            query.push(" AND state IN (");
            let mut states = query.separated(", ");
            for state in &filter.states {
                states.push_bind(state.as_str());
            }
            query.push(")");
        }
        for (key, value) in &filter.metadata {
            query
                .push(" AND EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) WHERE json_each.key = ")
                .push_bind(key.clone())
                .push(" AND json_each.value = ")
                .push_bind(value.clone())
                .push(")");
        }
        if let Some(template) = &filter.template {
            query
                .push(" AND (template_id = ")
                .push_bind(template.clone())
                .push(" OR alias = ")
                .push_bind(template.clone())
                .push(")");
        }
        if let Some(after) = filter.started_after {
            query.push(" AND started_at >= ").push_bind(after);
        }
        let (cmp, order) = if filter.descending {
            ("<", "DESC")
        } else {
            (">", "ASC")
        };
        if let Some((started_at, id)) = &filter.after {
            query
                .push(format!(" AND (started_at, id) {cmp} ("))
                .push_bind(*started_at)
                .push(", ")
                .push_bind(id.clone())
                .push(")");
        }
        query.push(format!(" ORDER BY started_at {order}, id {order}"));
        if let Some(limit) = filter.limit {
            query.push(" LIMIT ").push_bind(i64::from(limit));
        }
        let rows = query.build().fetch_all(&self.pool).await?;
        rows.iter().map(sandbox_from_row).collect()
    }

    async fn transition_sandbox(
        &self,
        id: &str,
        from: SandboxState,
        to: SandboxState,
        update: &TransitionUpdate,
        now: Millis,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut query: QueryBuilder<Sqlite> = QueryBuilder::new("UPDATE sandboxes SET state = ");
        query.push_bind(to.as_str());
        query
            .push(", state_reason = ")
            .push_bind(update.reason.clone());
        query.push(", updated_at = ").push_bind(now);
        if let Some(ip) = &update.ip {
            query.push(", ip = ").push_bind(ip.map(|ip| ip.to_string()));
        }
        if let Some(pid) = &update.init_pid {
            query.push(", init_pid = ").push_bind(pid.map(i64::from));
        }
        if let Some(kind) = &update.pause_kind {
            query
                .push(", pause_kind = ")
                .push_bind(kind.map(PauseKind::as_str));
        }
        if let Some(dir) = &update.snapshot_dir {
            query
                .push(", snapshot_dir = ")
                .push_bind(dir.as_ref().map(|dir| dir.to_string_lossy().into_owned()));
        }
        if let Some(end_at) = update.end_at {
            query.push(", end_at = ").push_bind(end_at);
        }
        query.push(" WHERE id = ").push_bind(id);
        query.push(" AND state = ").push_bind(from.as_str());
        let done = query.build().execute(&mut *tx).await?;
        if done.rows_affected() == 0 {
            let row = sqlx::query("SELECT state FROM sandboxes WHERE id = ?")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            return match row {
                None => Err(StoreError::NotFound {
                    what: "sandbox",
                    id: id.to_string(),
                }),
                Some(row) => {
                    let actual: String = row.try_get("state")?;
                    Err(StoreError::StateConflict {
                        id: id.to_string(),
                        expected: from,
                        actual: parse_state(id, &actual)?,
                    })
                }
            };
        }
        insert_event(&mut tx, id, Some(from), to, update.reason.as_deref(), now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn set_sandbox_end(
        &self,
        id: &str,
        end_at: Millis,
        now: Millis,
    ) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE sandboxes SET end_at = ?, updated_at = ? WHERE id = ?")
            .bind(end_at)
            .bind(now)
            .bind(id)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                what: "sandbox",
                id: id.to_string(),
            });
        }
        Ok(())
    }

    async fn expired_sandboxes(&self, now: Millis) -> Result<Vec<SandboxRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM sandboxes WHERE state = ? AND end_at <= ? ORDER BY end_at, id",
        )
        .bind(SandboxState::Running.as_str())
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(sandbox_from_row).collect()
    }

    async fn sandbox_events(&self, id: &str) -> Result<Vec<SandboxEvent>, StoreError> {
        let rows = sqlx::query("SELECT * FROM sandbox_events WHERE sandbox_id = ? ORDER BY seq")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(event_from_row).collect()
    }

    async fn lifecycle_events(
        &self,
        query: &EventQuery,
    ) -> Result<Vec<LifecycleEvent>, StoreError> {
        use SandboxState::*;
        // The type of an event, from its states: the transitions E2B reports, and notes that change
        // no state; the rest (steps in between) have none and are left out.
        let kind = format!(
            "CASE \
               WHEN e.from_state = '{creating}' AND e.to_state = '{running}' THEN 'sandbox.lifecycle.created' \
               WHEN e.from_state = '{resuming}' AND e.to_state = '{running}' THEN 'sandbox.lifecycle.resumed' \
               WHEN e.from_state = '{pausing}' AND e.to_state = '{paused}' THEN 'sandbox.lifecycle.paused' \
               WHEN e.to_state IN ('{killed}', '{failed}') AND e.from_state IS NOT e.to_state \
                 THEN 'sandbox.lifecycle.killed' \
               WHEN e.from_state = e.to_state THEN 'sandbox.lifecycle.updated' \
             END",
            creating = Creating.as_str(),
            running = Running.as_str(),
            resuming = Resuming.as_str(),
            pausing = Pausing.as_str(),
            paused = Paused.as_str(),
            killed = Killed.as_str(),
            failed = Failed.as_str(),
        );
        // A build sandbox has no row in `sandboxes`; its events name team and template themselves.
        let mut sql: QueryBuilder<Sqlite> = QueryBuilder::new(format!(
            "SELECT * FROM (SELECT e.seq, e.sandbox_id, e.from_state, e.to_state, e.reason, e.at, \
             COALESCE(s.team_id, e.team_id) AS team_id, \
             COALESCE(s.template_id, e.template_id) AS template_id, e.build_id AS build_id, \
             {kind} AS kind FROM sandbox_events e LEFT JOIN sandboxes s ON s.id = e.sandbox_id \
             WHERE COALESCE(s.team_id, e.team_id) = "
        ));
        sql.push_bind(&query.team_id);
        if let Some(id) = &query.sandbox_id {
            sql.push(" AND e.sandbox_id = ").push_bind(id);
        }
        if let Some(seq) = query.after_seq {
            sql.push(" AND e.seq > ").push_bind(seq);
        }
        sql.push(") WHERE kind IS NOT NULL");
        if !query.types.is_empty() {
            sql.push(" AND kind IN (");
            let mut list = sql.separated(", ");
            for kind in &query.types {
                list.push_bind(kind);
            }
            sql.push(")");
        }
        sql.push(if query.ascending {
            " ORDER BY seq ASC"
        } else {
            " ORDER BY seq DESC"
        });
        sql.push(" LIMIT ")
            .push_bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
            .push(" OFFSET ")
            .push_bind(i64::try_from(query.offset).unwrap_or(i64::MAX));
        let rows = sql.build().fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                Ok(LifecycleEvent {
                    kind: row.try_get("kind")?,
                    team_id: row.try_get("team_id")?,
                    template_id: row.try_get("template_id")?,
                    build_id: row.try_get("build_id")?,
                    event: event_from_row(row)?,
                })
            })
            .collect()
    }

    async fn note_build_sandbox_event(&self, event: &BuildSandboxEvent) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sandbox_events \
             (sandbox_id, from_state, to_state, reason, at, team_id, template_id, build_id) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&event.sandbox_id)
        .bind(event.from_state.map(SandboxState::as_str))
        .bind(event.to_state.as_str())
        .bind(&event.reason)
        .bind(event.at)
        .bind(&event.team_id)
        .bind(&event.template_id)
        .bind(&event.build_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn note_sandbox_event(
        &self,
        id: &str,
        state: SandboxState,
        reason: &str,
        now: Millis,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        insert_event(&mut tx, id, Some(state), state, Some(reason), now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn insert_snapshot(&self, snapshot: &SnapshotRecord) -> Result<(), StoreError> {
        sqlite_snapshots::insert(&self.pool, snapshot).await
    }

    async fn get_snapshot(&self, id_or_name: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        sqlite_snapshots::get(&self.pool, id_or_name).await
    }

    async fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        sqlite_snapshots::list(&self.pool, filter).await
    }

    async fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        sqlite_snapshots::delete(&self.pool, id).await
    }

    async fn set_snapshot_checksum_status(
        &self,
        id: &str,
        status: ChecksumStatus,
    ) -> Result<(), StoreError> {
        sqlite_snapshots::set_checksum_status(&self.pool, id, status).await
    }
}

async fn insert_event(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    id: &str,
    from: Option<SandboxState>,
    to: SandboxState,
    reason: Option<&str>,
    at: Millis,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO sandbox_events (sandbox_id, from_state, to_state, reason, at) VALUES (?, ?, ?, ?, ?)")
        .bind(id)
        .bind(from.map(SandboxState::as_str))
        .bind(to.as_str())
        .bind(reason)
        .bind(at)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LogLevel;
    use crate::store::SandboxVolume;
    use crate::store::DEFAULT_TEAM;

    fn sandbox(id: &str, started_at: Millis) -> SandboxRecord {
        SandboxRecord {
            id: id.to_string(),
            team_id: DEFAULT_TEAM.to_string(),
            template_id: "base".to_string(),
            alias: None,
            client_id: "warren".to_string(),
            state: SandboxState::Creating,
            state_reason: None,
            metadata: BTreeMap::from([
                ("k".to_string(), "v w".to_string()),
                ("odd.\"key'".to_string(), "x".to_string()),
            ]),
            env_vars: BTreeMap::new(),
            vcpus: 1.0,
            memory_mib: 256,
            disk_mib: 512,
            auto_pause: false,
            auto_pause_memory: true,
            auto_resume: false,
            allow_internet: None,
            envd_access_token: None,
            traffic_access_token: None,
            egress: EgressRules::default(),
            policies: Default::default(),
            ingress: Default::default(),
            volumes: Vec::new(),
            ip: None,
            init_pid: None,
            pause_kind: None,
            snapshot_dir: None,
            started_at,
            end_at: started_at + 1000,
            updated_at: started_at,
        }
    }

    async fn store() -> (SqliteStore, tempfile::TempDir) {
        let dir = tempfile::Builder::new()
            .prefix("wt-store-")
            .tempdir()
            .unwrap();
        (SqliteStore::open_in(dir.path()).await.unwrap(), dir)
    }

    #[tokio::test]
    async fn transitions_are_compare_and_set_and_leave_events() {
        let (store, _dir) = store().await;
        store.insert_sandbox(&sandbox("a", 1)).await.unwrap();
        let update = TransitionUpdate {
            ip: Some(Some(Ipv4Addr::new(10, 77, 0, 2))),
            ..TransitionUpdate::default()
        };
        store
            .transition_sandbox(
                "a",
                SandboxState::Creating,
                SandboxState::Running,
                &update,
                5,
            )
            .await
            .unwrap();
        let stale = store
            .transition_sandbox(
                "a",
                SandboxState::Creating,
                SandboxState::Failed,
                &TransitionUpdate::default(),
                6,
            )
            .await;
        assert!(matches!(
            stale,
            Err(StoreError::StateConflict {
                actual: SandboxState::Running,
                ..
            })
        ));
        let missing = store
            .transition_sandbox(
                "b",
                SandboxState::Creating,
                SandboxState::Running,
                &TransitionUpdate::default(),
                6,
            )
            .await;
        assert!(matches!(missing, Err(StoreError::NotFound { .. })));
        let row = store.get_sandbox("a").await.unwrap().unwrap();
        assert_eq!(row.state, SandboxState::Running);
        assert_eq!(row.ip, Some(Ipv4Addr::new(10, 77, 0, 2)));
        let events = store.sandbox_events("a").await.unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].from_state, None);
        assert_eq!(events[1].from_state, Some(SandboxState::Creating));
        assert_eq!(events[1].to_state, SandboxState::Running);
    }

    #[tokio::test]
    async fn metric_samples_answer_ranges_and_latest_and_are_pruned_by_age() {
        let (store, _dir) = store().await;
        let sample = |id: &str, at: Millis| MetricSample {
            sandbox_id: id.into(),
            at,
            cpu_pct: at as f64 / 1000.0,
            cpu_count: 2,
            mem_used: 1 << 20,
            mem_total: 512 << 20,
            disk_used: 3 << 20,
            disk_total: 2048 << 20,
            pids: 4,
            oom_kills: 0,
            mem_cache: 5 << 20,
            net_rx: at as u64 * 3,
            net_tx: at as u64,
        };
        let samples: Vec<_> = (1..=5)
            .flat_map(|s| [sample("a", s * 1000), sample("b", s * 1000 + 500)])
            .collect();
        store.insert_metric_samples(&samples).await.unwrap();
        let ranged = store.metric_samples("a", 2000, 4000).await.unwrap();
        assert_eq!(
            ranged.iter().map(|s| s.at).collect::<Vec<_>>(),
            [2000, 3000, 4000]
        );
        assert_eq!(
            ranged[0],
            sample("a", 2000),
            "a sample reads back as written"
        );
        let latest = store
            .latest_metric_samples(&["a".into(), "b".into(), "nobody".into()])
            .await
            .unwrap();
        assert_eq!(
            latest
                .iter()
                .map(|s| (s.sandbox_id.as_str(), s.at))
                .collect::<Vec<_>>(),
            [("a", 5000), ("b", 5500)]
        );
        assert_eq!(store.prune_metric_samples(3000).await.unwrap(), 4);
        assert_eq!(store.metric_samples("a", 0, 10_000).await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn old_events_are_pruned_and_their_numbers_never_come_back() {
        let (store, _dir) = store().await;
        store.insert_sandbox(&sandbox("a", 1000)).await.unwrap();
        for at in [2000, 3000] {
            store
                .note_sandbox_event("a", SandboxState::Creating, "note", at)
                .await
                .unwrap();
        }
        let seqs = |events: Vec<SandboxEvent>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
        let before = seqs(store.sandbox_events("a").await.unwrap());
        let newest = store.latest_event_seq().await.unwrap();
        assert_eq!(before.last(), Some(&newest));
        let all = before.len() as u64;
        assert_eq!(store.prune_sandbox_events(10_000).await.unwrap(), all);
        assert!(store.sandbox_events("a").await.unwrap().is_empty());
        store
            .note_sandbox_event("a", SandboxState::Creating, "later", 20_000)
            .await
            .unwrap();
        let after = seqs(store.sandbox_events("a").await.unwrap());
        assert!(
            after[0] > newest,
            "a deleted number was handed out again: {after:?}"
        );
    }

    #[tokio::test]
    async fn sandbox_logs_page_both_ways_filter_and_keep_a_bound_per_sandbox() {
        let (store, _dir) = store().await;
        let line = |id: &str, seq: i64, level: LogLevel, message: &str| SandboxLogLine {
            sandbox_id: id.into(),
            seq,
            at: seq * 1000,
            level,
            message: message.into(),
            fields: BTreeMap::from([("pid".to_string(), "7".to_string())]),
        };
        let lines = vec![
            line("a", 1, LogLevel::Info, "process 7 started"),
            line("a", 2, LogLevel::Info, "hello 50%_done"),
            line("a", 3, LogLevel::Warn, "careful"),
            line("a", 4, LogLevel::Error, "process 7 ended: exit status 1"),
            line("b", 1, LogLevel::Info, "other sandbox"),
        ];
        store.insert_sandbox_logs(&lines, 100).await.unwrap();
        // Stored again (a collection that overlapped another): nothing doubles.
        store.insert_sandbox_logs(&lines[..2], 100).await.unwrap();
        let query = |cursor, forward, min_level, search: Option<&str>| LogQuery {
            cursor,
            forward,
            limit: 2,
            min_level,
            search: search.map(str::to_string),
        };
        let seqs = |found: Vec<SandboxLogLine>| found.iter().map(|l| l.seq).collect::<Vec<_>>();
        let all = query(None, true, LogLevel::Debug, None);
        let first = store.sandbox_logs("a", &all).await.unwrap();
        assert_eq!(first[0], lines[0], "a line reads back as written");
        assert_eq!(seqs(first), [1, 2]);
        let next = query(Some(3000), true, LogLevel::Debug, None);
        assert_eq!(seqs(store.sandbox_logs("a", &next).await.unwrap()), [3, 4]);
        let back = query(Some(3000), false, LogLevel::Debug, None);
        assert_eq!(seqs(store.sandbox_logs("a", &back).await.unwrap()), [3, 2]);
        let warn = query(None, true, LogLevel::Warn, None);
        assert_eq!(seqs(store.sandbox_logs("a", &warn).await.unwrap()), [3, 4]);
        // `%` and `_` are matched as themselves, and case does not matter.
        let found = query(None, true, LogLevel::Debug, Some("50%_D"));
        assert_eq!(seqs(store.sandbox_logs("a", &found).await.unwrap()), [2]);
        let none = query(None, true, LogLevel::Debug, Some("5_%"));
        assert!(store.sandbox_logs("a", &none).await.unwrap().is_empty());
        assert_eq!(store.last_sandbox_log_seq("a").await.unwrap(), Some(4));
        assert_eq!(store.last_sandbox_log_seq("nobody").await.unwrap(), None);

        // Over the bound, a sandbox's oldest lines go; another sandbox's are not touched.
        store
            .insert_sandbox_logs(&[line("a", 5, LogLevel::Info, "five")], 3)
            .await
            .unwrap();
        let ten = LogQuery { limit: 10, ..all };
        let kept = store.sandbox_logs("a", &ten).await.unwrap();
        assert_eq!(seqs(kept), [3, 4, 5]);
        assert_eq!(store.prune_sandbox_logs(4000).await.unwrap(), 2);
        assert!(store.sandbox_logs("b", &ten).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_sandboxs_own_policies_survive_the_store() {
        let (store, _dir) = store().await;
        let mut record = sandbox("p", 1);
        record.policies.runaway = Some(warren_proto::api::RunawayPolicyOverride {
            cpu_percent: Some(50.0),
            seconds: None,
            kill: Some(true),
        });
        store.insert_sandbox(&record).await.unwrap();
        store.insert_sandbox(&sandbox("q", 2)).await.unwrap();
        assert_eq!(
            store.get_sandbox("p").await.unwrap().unwrap().policies,
            record.policies
        );
        assert_eq!(
            store.get_sandbox("q").await.unwrap().unwrap().policies,
            Default::default()
        );
    }

    #[tokio::test]
    async fn lists_filter_by_metadata_and_page() {
        let (store, _dir) = store().await;
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            store
                .insert_sandbox(&sandbox(id, i as Millis))
                .await
                .unwrap();
        }
        let filter = SandboxFilter {
            metadata: BTreeMap::from([
                ("k".to_string(), "v w".to_string()),
                ("odd.\"key'".to_string(), "x".to_string()),
            ]),
            limit: Some(2),
            ..SandboxFilter::default()
        };
        let first: Vec<String> = store
            .list_sandboxes(&filter)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(first, ["a", "b"]);
        let next = SandboxFilter {
            after: Some((1, "b".to_string())),
            ..filter.clone()
        };
        let rest: Vec<String> = store
            .list_sandboxes(&next)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(rest, ["c"]);
        let none = SandboxFilter {
            metadata: BTreeMap::from([("k".to_string(), "other".to_string())]),
            ..SandboxFilter::default()
        };
        assert!(store.list_sandboxes(&none).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn teams_scope_keys_and_sandbox_lists() {
        let (store, _dir) = store().await;
        // The migration made the default team.
        let default = store
            .get_team("default")
            .await
            .unwrap()
            .expect("default team");
        assert_eq!(default.id, DEFAULT_TEAM);
        let team = TeamRecord {
            id: "team_b".to_string(),
            name: "b".to_string(),
            max_sandboxes: Some(2),
            max_vcpus: Some(1.5),
            max_memory_mib: None,
            created_at: 5,
        };
        store.insert_team(&team).await.unwrap();
        assert_eq!(store.get_team("b").await.unwrap(), Some(team.clone()));
        assert_eq!(store.get_team("team_b").await.unwrap(), Some(team.clone()));
        assert!(store.insert_team(&team).await.is_err(), "duplicate team");
        assert_eq!(store.list_teams().await.unwrap().len(), 2);
        let mut mine = sandbox("sbx-a", 1);
        mine.team_id = "team_b".to_string();
        store.insert_sandbox(&mine).await.unwrap();
        store.insert_sandbox(&sandbox("sbx-d", 2)).await.unwrap();
        let only_b = store
            .list_sandboxes(&SandboxFilter {
                team_id: Some("team_b".to_string()),
                ..SandboxFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(only_b.len(), 1);
        assert_eq!(only_b[0].id, "sbx-a");
        assert_eq!(only_b[0].team_id, "team_b");
        let all = store
            .list_sandboxes(&SandboxFilter::default())
            .await
            .unwrap();
        assert_eq!(all.len(), 2);
    }

    #[tokio::test]
    async fn keys_are_found_by_hash_until_revoked() {
        let (store, _dir) = store().await;
        let key = ApiKeyRecord {
            id: "key_1".to_string(),
            name: "ci".to_string(),
            prefix: "e2b_abc".to_string(),
            secret_hash: "hash".to_string(),
            created_at: 1,
            last_used_at: None,
            revoked_at: None,
            team_id: DEFAULT_TEAM.to_string(),
            admin: false,
        };
        store.insert_api_key(&key).await.unwrap();
        let used = store.use_api_key("hash", 7).await.unwrap().unwrap();
        assert_eq!(used.last_used_at, Some(7));
        let soon = store.use_api_key("hash", 8).await.unwrap().unwrap();
        assert_eq!(soon.last_used_at, Some(7), "not rewritten within a minute");
        let later = store
            .use_api_key("hash", 7 + LAST_USED_RESOLUTION_MS)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(later.last_used_at, Some(7 + LAST_USED_RESOLUTION_MS));
        assert_eq!(store.revoke_api_key("ci", 8).await.unwrap(), 1);
        assert_eq!(store.use_api_key("hash", 9).await.unwrap(), None);
        assert_eq!(store.revoke_api_key("ci", 10).await.unwrap(), 0);
        assert_eq!(store.list_api_keys().await.unwrap()[0].revoked_at, Some(8));
    }

    #[tokio::test]
    async fn templates_are_found_by_alias() {
        let (store, _dir) = store().await;
        let template = TemplateRecord {
            id: "tpl1".to_string(),
            aliases: vec!["python".to_string()],
            layers: vec![PathBuf::from("/layers/a"), PathBuf::from("/rootfs")],
            build_id: "b".to_string(),
            status: "ready".to_string(),
            vcpus: 1.0,
            memory_mib: 1,
            disk_mib: 1,
            envd_version: "0".to_string(),
            public: false,
            team_id: DEFAULT_TEAM.to_string(),
            spawn_count: 0,
            last_spawned_at: None,
            created_at: 1,
            updated_at: 1,
            policies: Default::default(),
        };
        store.upsert_template(&template).await.unwrap();
        assert_eq!(
            store.get_template("python").await.unwrap(),
            Some(template.clone())
        );
        assert_eq!(
            store.get_template("tpl1").await.unwrap(),
            Some(template.clone())
        );
        assert_eq!(store.get_template("nope").await.unwrap(), None);

        // Settings change what is given; a rebuild (an upsert) keeps the policies.
        let policies = warren_proto::api::SandboxPolicies {
            idle_timeout_secs: Some(30),
            ..Default::default()
        };
        let set = store.update_template_settings("tpl1", None, Some(&policies), 5);
        assert!(set.await.unwrap());
        let public = store.update_template_settings("tpl1", Some(true), None, 6);
        assert!(public.await.unwrap());
        let missing = store.update_template_settings("nope", Some(true), None, 6);
        assert!(!missing.await.unwrap());
        store
            .upsert_template(&TemplateRecord {
                build_id: "b2".to_string(),
                ..template
            })
            .await
            .unwrap();
        let now = store.get_template("tpl1").await.unwrap().unwrap();
        assert_eq!((now.policies, now.build_id.as_str()), (policies, "b2"));
    }

    fn volume(id: &str, team: &str, name: &str) -> VolumeRecord {
        VolumeRecord {
            id: id.to_string(),
            team_id: team.to_string(),
            name: name.to_string(),
            token: format!("token-{id}"),
            size_mib: 64,
            created_at: 7,
        }
    }

    #[tokio::test]
    async fn volume_names_are_unique_per_team_and_rows_round_trip() {
        let (store, _dir) = store().await;
        let first = volume("v1", DEFAULT_TEAM, "data");
        store.insert_volume(&first).await.unwrap();
        let duplicate = store
            .insert_volume(&volume("v2", DEFAULT_TEAM, "data"))
            .await;
        assert!(
            matches!(duplicate, Err(StoreError::Duplicate { ref name, .. }) if name == "data"),
            "{duplicate:?}"
        );
        // Another team may use the same name.
        store
            .insert_volume(&volume("v3", "other", "data"))
            .await
            .unwrap();
        assert_eq!(store.get_volume("v1").await.unwrap(), Some(first.clone()));
        assert_eq!(
            store
                .get_volume_by_name(DEFAULT_TEAM, "data")
                .await
                .unwrap(),
            Some(first.clone())
        );
        assert_eq!(
            store.get_volume_by_name("nobody", "data").await.unwrap(),
            None
        );
        let listed = store.list_volumes(DEFAULT_TEAM).await.unwrap();
        assert_eq!(listed, vec![first]);
        assert_eq!(store.list_volumes("other").await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_volume_a_live_sandbox_mounts_is_not_deleted() {
        let (store, _dir) = store().await;
        store
            .insert_volume(&volume("v1", DEFAULT_TEAM, "data"))
            .await
            .unwrap();
        let mut user = sandbox("sb1", 1);
        user.volumes = vec![SandboxVolume {
            volume_id: "v1".to_string(),
            name: "data".to_string(),
            path: "/mnt/data".to_string(),
        }];
        store.insert_sandbox(&user).await.unwrap();
        assert_eq!(
            store.get_sandbox("sb1").await.unwrap().unwrap().volumes,
            user.volumes
        );
        assert_eq!(
            store.delete_volume("v1").await.unwrap(),
            VolumeDeletion::InUse(vec!["sb1".to_string()])
        );
        assert!(store.get_volume("v1").await.unwrap().is_some());
        store
            .transition_sandbox(
                "sb1",
                SandboxState::Creating,
                SandboxState::Killed,
                &TransitionUpdate::default(),
                5,
            )
            .await
            .unwrap();
        assert_eq!(
            store.delete_volume("v1").await.unwrap(),
            VolumeDeletion::Deleted
        );
        assert_eq!(
            store.delete_volume("v1").await.unwrap(),
            VolumeDeletion::NotFound
        );
        assert!(store.get_volume("v1").await.unwrap().is_none());
    }
}
