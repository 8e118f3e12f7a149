//! PostgreSQL implementation of [`Store`], for servers that share one database (docs/cluster.md).
//! Same schema as SQLite (rendered from the same migrations, see `migrations.rs`), same row mapping
//! (`rows.rs`), same semantics: its own SQL is here and in `postgres_records.rs`.
//!
//! Concurrency: every statement runs at READ COMMITTED. A state transition is one
//! `UPDATE … WHERE state = from`: of two servers racing to move the same sandbox, the second waits
//! for the first's row lock, re-reads the row, finds another state and gets
//! [`StoreError::StateConflict`], exactly as the compare-and-set on SQLite's single writer.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Postgres, QueryBuilder, Row};

use super::rows::{
    api_key_from_row, egress_to_json, event_from_row, flag, parse_state, sandbox_from_row,
    team_from_row, template_from_row, to_json, webhook_from_row,
};
use super::{
    migrations, postgres_records as records, ApiKeyRecord, BuildRecord, BuildSandboxEvent,
    ChecksumStatus, DatabaseUrl, EventQuery, IdempotencyClaim, LifecycleEvent, LogQuery,
    MetricSample, Millis, OperationTiming, PauseKind, Policy, PolicyEvent, SandboxEvent,
    SandboxFilter, SandboxLogLine, SandboxRecord, SecretRecord, ServerRecord, ServerRenewal,
    SnapshotFilter, SnapshotRecord, Store, StoreError, TeamRecord, TemplateRecord, TemplateTag,
    TransitionUpdate, VolumeDeletion, VolumeRecord, WebhookRecord, WorkspaceMove, WorkspaceRecord,
    LAST_USED_RESOLUTION_MS,
};
use crate::lifecycle::state::SandboxState;
use warren_runtime::network::egress::EgressRules;

/// Connections one server keeps to the database.
const MAX_CONNECTIONS: u32 = 16;

/// The session advisory lock the leading server holds (`pg_try_advisory_lock`), on a connection of
/// its own outside the pool: PostgreSQL lets it go the moment that connection ends, so a server that
/// dies or loses the database stops leading by itself.
const LEAD_LOCK: i64 = 0x7761_7272_656e_4c44; // "warrenLD"

/// How long the leader's check of its own connection may take before it counts as lost.
const LEAD_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

pub struct PgStore {
    pool: PgPool,
    options: PgConnectOptions,
    server_id: String,
    /// The connection holding [`LEAD_LOCK`] while this server leads.
    leading: tokio::sync::Mutex<Option<sqlx::PgConnection>>,
}

impl PgStore {
    /// Connect to `url` and bring the schema up to date (the migrator holds an advisory lock, so
    /// servers starting together migrate once).
    pub async fn open(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let options =
            PgConnectOptions::from_str(url.expose()).map_err(|source| StoreError::Connect {
                url: url.to_string(),
                source,
            })?;
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await
            .map_err(|source| StoreError::Connect {
                url: url.to_string(),
                source,
            })?;
        let migrator = sqlx::migrate::Migrator::new(migrations::Postgres).await?;
        migrator.run(&pool).await?;
        Ok(PgStore {
            pool,
            options,
            server_id: super::new_server_id(),
            leading: tokio::sync::Mutex::new(None),
        })
    }

    /// The pool (tests reach the raw rows through it).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

#[async_trait]
impl Store for PgStore {
    async fn insert_api_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO api_keys (id, name, prefix, secret_hash, created_at, last_used_at, revoked_at, \
             team_id, admin) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&key.id)
        .bind(&key.name)
        .bind(&key.prefix)
        .bind(&key.secret_hash)
        .bind(key.created_at)
        .bind(key.last_used_at)
        .bind(key.revoked_at)
        .bind(&key.team_id)
        .bind(flag(key.admin))
        .execute(&self.pool)
        .await?;
        Ok(())
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
            sqlx::query("SELECT * FROM api_keys WHERE secret_hash = $1 AND revoked_at IS NULL")
                .bind(secret_hash)
                .fetch_optional(&self.pool)
                .await?;
        let Some(mut key) = row.as_ref().map(api_key_from_row).transpose()? else {
            return Ok(None);
        };
        // At most one write a minute per key, as on SQLite: every request authenticates.
        if key
            .last_used_at
            .is_none_or(|last| now - last >= LAST_USED_RESOLUTION_MS)
        {
            sqlx::query("UPDATE api_keys SET last_used_at = $1 WHERE id = $2")
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
            "UPDATE api_keys SET revoked_at = $1 WHERE (id = $2 OR name = $2) AND revoked_at IS NULL",
        )
        .bind(now)
        .bind(id_or_name)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn insert_team(&self, team: &TeamRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO teams (id, name, max_sandboxes, max_vcpus, max_memory_mib, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
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
            "SELECT * FROM teams WHERE id = $1 OR name = $1 ORDER BY id = $1 DESC LIMIT 1",
        )
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

    async fn upsert_template(&self, t: &TemplateRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO templates (id, aliases, layers, build_id, status, vcpus, memory_mib, disk_mib, \
             envd_version, public, spawn_count, last_spawned_at, created_at, updated_at, team_id, \
             policies) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
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
        .bind(flag(t.public))
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
            "UPDATE templates SET public = COALESCE($1, public), policies = COALESCE($2, policies), \
             updated_at = $3 WHERE id = $4",
        )
        .bind(public.map(flag))
        .bind(policies.map(to_json))
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn get_template(&self, id_or_alias: &str) -> Result<Option<TemplateRecord>, StoreError> {
        // `?`: the JSON array holds this string.
        let row = sqlx::query(
            "SELECT * FROM templates WHERE id = $1 OR aliases::jsonb ? $1 \
             ORDER BY id = $1 DESC LIMIT 1",
        )
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
            "UPDATE templates SET spawn_count = spawn_count + 1, last_spawned_at = $1 WHERE id = $2",
        )
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn delete_template(&self, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM template_tags WHERE template_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query("DELETE FROM templates WHERE id = $1")
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
        records::assign_tags(&self.pool, template_id, build_id, tags, now).await
    }

    async fn remove_template_tags(
        &self,
        template_id: &str,
        tags: &[String],
    ) -> Result<u64, StoreError> {
        records::remove_tags(&self.pool, template_id, tags).await
    }

    async fn list_template_tags(&self, template_id: &str) -> Result<Vec<TemplateTag>, StoreError> {
        records::list_tags(&self.pool, template_id).await
    }

    async fn upsert_build(&self, build: &BuildRecord) -> Result<(), StoreError> {
        records::upsert_build(&self.pool, build, &self.server_id).await
    }

    async fn get_build(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<Option<BuildRecord>, StoreError> {
        records::get_build(&self.pool, template_id, build_id).await
    }

    async fn fail_unfinished_builds(
        &self,
        live: &[String],
        reason: &str,
        now: Millis,
    ) -> Result<u64, StoreError> {
        records::fail_unfinished_builds(&self.pool, live, reason, now).await
    }

    fn server_id(&self) -> &str {
        &self.server_id
    }

    fn shared(&self) -> bool {
        true
    }

    async fn renew_server(&self, renewal: &ServerRenewal<'_>) -> Result<(), StoreError> {
        records::renew_server(&self.pool, &self.server_id, renewal).await
    }

    async fn live_servers(&self, since: Millis) -> Result<Vec<ServerRecord>, StoreError> {
        records::live_servers(&self.pool, since).await
    }

    async fn forget_servers(&self, this_one: bool, before: Millis) -> Result<u64, StoreError> {
        let id = this_one.then_some(self.server_id.as_str());
        records::forget_servers(&self.pool, id, before).await
    }

    async fn lead(&self) -> Result<bool, StoreError> {
        use sqlx::Connection;
        let mut leading = self.leading.lock().await;
        if let Some(connection) = leading.as_mut() {
            // Still the leader while the connection that holds the lock still answers.
            match tokio::time::timeout(LEAD_CHECK_TIMEOUT, connection.ping()).await {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(error)) => {
                    tracing::warn!(%error, "lost the connection that held the lead");
                }
                Err(_) => tracing::warn!("the connection that held the lead stopped answering"),
            }
            // Dropping it closes it (if it still can), which releases the lock on the database's
            // side; a dead connection's lock goes when PostgreSQL notices.
            *leading = None;
            return Ok(false);
        }
        let mut connection = sqlx::PgConnection::connect_with(&self.options).await?;
        let won: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(LEAD_LOCK)
            .fetch_one(&mut connection)
            .await?;
        if won {
            *leading = Some(connection);
        }
        Ok(won)
    }

    async fn orphaned_transitions(
        &self,
        live: &[String],
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        records::orphaned_transitions(&self.pool, live).await
    }

    async fn own_transitions(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        records::transitions_of(&self.pool, &self.server_id).await
    }

    async fn insert_volume(&self, volume: &VolumeRecord) -> Result<(), StoreError> {
        records::insert_volume(&self.pool, volume).await
    }

    async fn get_volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        records::get_volume(&self.pool, id).await
    }

    async fn get_volume_by_name(
        &self,
        team_id: &str,
        name: &str,
    ) -> Result<Option<VolumeRecord>, StoreError> {
        records::get_volume_by_name(&self.pool, team_id, name).await
    }

    async fn list_volumes(&self, team_id: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        records::list_volumes(&self.pool, team_id).await
    }

    async fn delete_volume(&self, id: &str) -> Result<VolumeDeletion, StoreError> {
        records::delete_volume(&self.pool, id).await
    }

    async fn insert_sandbox(&self, s: &SandboxRecord) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO sandboxes (id, template_id, alias, client_id, state, state_reason, metadata, env_vars, \
             vcpus, memory_mib, disk_mib, auto_pause, auto_resume, allow_internet, envd_access_token, ip, \
             init_pid, pause_kind, snapshot_dir, started_at, end_at, updated_at, team_id, \
             traffic_access_token, egress, policies, ingress, auto_pause_memory, volume_mounts, owner) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
             $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30)",
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
        .bind(flag(s.auto_pause))
        .bind(flag(s.auto_resume))
        .bind(s.allow_internet.map(flag))
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
        .bind(flag(s.auto_pause_memory))
        .bind((!s.volumes.is_empty()).then(|| to_json(&s.volumes)))
        .bind(&self.server_id)
        .execute(&mut *tx)
        .await?;
        insert_event(
            &mut tx,
            NewEvent {
                id: &s.id,
                from: None,
                to: s.state,
                reason: s.state_reason.as_deref(),
                at: s.updated_at,
                took: None,
                policy: None,
            },
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRecord>, StoreError> {
        let row = sqlx::query("SELECT * FROM sandboxes WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(sandbox_from_row).transpose()
    }

    async fn list_sandboxes(
        &self,
        filter: &SandboxFilter,
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        let mut query: QueryBuilder<Postgres> =
            QueryBuilder::new("SELECT * FROM sandboxes WHERE 1 = 1");
        if let Some(team) = &filter.team_id {
            query.push(" AND team_id = ").push_bind(team.clone());
        }
        if !filter.states.is_empty() {
            let states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
            query.push(" AND state = ANY(").push_bind(states).push(")");
        }
        if !filter.metadata.is_empty() {
            // Every pair of the filter is in the stored object.
            query
                .push(" AND metadata::jsonb @> ")
                .push_bind(to_json(&filter.metadata))
                .push("::jsonb");
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
        let mut query: QueryBuilder<Postgres> = QueryBuilder::new("UPDATE sandboxes SET state = ");
        query.push_bind(to.as_str());
        query
            .push(", state_reason = ")
            .push_bind(update.reason.clone());
        query.push(", updated_at = ").push_bind(now);
        query.push(", owner = ").push_bind(&self.server_id);
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
            let row = sqlx::query("SELECT state FROM sandboxes WHERE id = $1")
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
        insert_event(
            &mut tx,
            NewEvent {
                id,
                from: Some(from),
                to,
                reason: update.reason.as_deref(),
                at: now,
                took: update.took,
                policy: None,
            },
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn set_sandbox_end(
        &self,
        id: &str,
        end_at: Millis,
        now: Millis,
    ) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE sandboxes SET end_at = $1, updated_at = $2 WHERE id = $3")
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
            "SELECT * FROM sandboxes WHERE state = $1 AND end_at <= $2 \
             ORDER BY end_at, id",
        )
        .bind(SandboxState::Running.as_str())
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(sandbox_from_row).collect()
    }

    async fn sandbox_events(&self, id: &str) -> Result<Vec<SandboxEvent>, StoreError> {
        let rows = sqlx::query("SELECT * FROM sandbox_events WHERE sandbox_id = $1 ORDER BY seq")
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
        let kind = format!(
            "CASE \
               WHEN e.from_state = '{creating}' AND e.to_state = '{running}' THEN 'sandbox.lifecycle.created' \
               WHEN e.from_state = '{resuming}' AND e.to_state = '{running}' THEN 'sandbox.lifecycle.resumed' \
               WHEN e.from_state = '{pausing}' AND e.to_state = '{paused}' THEN 'sandbox.lifecycle.paused' \
               WHEN e.to_state IN ('{killed}', '{failed}') AND e.from_state IS DISTINCT FROM e.to_state \
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
        let mut sql: QueryBuilder<Postgres> = QueryBuilder::new(format!(
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
        sql.push(") AS t WHERE kind IS NOT NULL");
        if !query.types.is_empty() {
            sql.push(" AND kind = ANY(")
                .push_bind(&query.types)
                .push(")");
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
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
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
        policy: Option<Policy>,
        now: Millis,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let event = NewEvent {
            id,
            from: Some(state),
            to: state,
            reason: Some(reason),
            at: now,
            took: None,
            policy,
        };
        insert_event(&mut tx, event).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn policy_events(
        &self,
        team_id: &str,
        limit: u32,
    ) -> Result<Vec<PolicyEvent>, StoreError> {
        records::policy_events(&self.pool, team_id, limit).await
    }

    async fn operation_timings(
        &self,
        team_id: &str,
        since: Millis,
        limit: u32,
    ) -> Result<Vec<OperationTiming>, StoreError> {
        records::operation_timings(&self.pool, team_id, since, limit).await
    }

    async fn insert_snapshot(&self, snapshot: &SnapshotRecord) -> Result<(), StoreError> {
        records::insert_snapshot(&self.pool, snapshot).await
    }

    async fn get_snapshot(&self, id_or_name: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        records::get_snapshot(&self.pool, id_or_name).await
    }

    async fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        records::list_snapshots(&self.pool, filter).await
    }

    async fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM snapshots WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn set_snapshot_checksum_status(
        &self,
        id: &str,
        status: ChecksumStatus,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE snapshots SET checksum_status = $1 WHERE id = $2")
            .bind(status.as_str())
            .bind(id)
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
        sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
            .bind(expired_before)
            .execute(&mut *tx)
            .await?;
        // A concurrent claim of the same key waits here for the first to commit, then finds it.
        let inserted = sqlx::query(
            "INSERT INTO idempotency_keys (team_id, key, request_hash, sandbox_id, created_at) \
             VALUES ($1, $2, $3, NULL, $4) ON CONFLICT (team_id, key) DO NOTHING",
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
                "SELECT request_hash, sandbox_id FROM idempotency_keys WHERE team_id = $1 AND key = $2",
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
        sqlx::query("UPDATE idempotency_keys SET sandbox_id = $1 WHERE team_id = $2 AND key = $3")
            .bind(sandbox_id)
            .bind(team_id)
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn set_sandbox_egress(&self, id: &str, egress: &EgressRules) -> Result<(), StoreError> {
        sqlx::query("UPDATE sandboxes SET egress = $1 WHERE id = $2")
            .bind(egress_to_json(egress))
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn release_idempotency_key(&self, team_id: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM idempotency_keys WHERE team_id = $1 AND key = $2 AND sandbox_id IS NULL",
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
        records::get_workspace(&self.pool, team_id, user_id).await
    }

    async fn record_workspace_move(
        &self,
        workspace: &WorkspaceRecord,
        entry: &WorkspaceMove,
    ) -> Result<(), StoreError> {
        records::record_workspace_move(&self.pool, workspace, entry).await
    }

    async fn workspace_history(
        &self,
        team_id: &str,
        user_id: &str,
    ) -> Result<Vec<WorkspaceMove>, StoreError> {
        records::workspace_history(&self.pool, team_id, user_id).await
    }

    async fn upsert_webhook(&self, w: &WebhookRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO webhooks (id, team_id, name, url, enabled, events, secret, delivered_seq, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO UPDATE SET \
             name = excluded.name, url = excluded.url, enabled = excluded.enabled, \
             events = excluded.events, secret = excluded.secret",
        )
        .bind(&w.id)
        .bind(&w.team_id)
        .bind(&w.name)
        .bind(&w.url)
        .bind(flag(w.enabled))
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
        rows.iter().map(webhook_from_row).collect()
    }

    async fn delete_webhook(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM webhooks WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn set_webhook_delivered(&self, id: &str, seq: i64) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE webhooks SET delivered_seq = GREATEST(delivered_seq, $1) WHERE id = $2",
        )
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
        let done = sqlx::query("DELETE FROM sandbox_events WHERE at < $1")
            .bind(before)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn insert_metric_samples(&self, samples: &[MetricSample]) -> Result<(), StoreError> {
        records::insert_metric_samples(&self.pool, samples).await
    }

    async fn metric_samples(
        &self,
        id: &str,
        from: Millis,
        to: Millis,
    ) -> Result<Vec<MetricSample>, StoreError> {
        records::metric_samples(&self.pool, id, from, to).await
    }

    async fn latest_metric_samples(&self, ids: &[String]) -> Result<Vec<MetricSample>, StoreError> {
        records::latest_metric_samples(&self.pool, ids).await
    }

    async fn prune_metric_samples(&self, before: Millis) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM sandbox_metrics WHERE at < $1")
            .bind(before)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn insert_sandbox_logs(
        &self,
        lines: &[SandboxLogLine],
        keep_per_sandbox: u64,
    ) -> Result<(), StoreError> {
        records::insert_logs(&self.pool, lines, keep_per_sandbox).await
    }

    async fn sandbox_logs(
        &self,
        id: &str,
        query: &LogQuery,
    ) -> Result<Vec<SandboxLogLine>, StoreError> {
        records::log_page(&self.pool, id, query).await
    }

    async fn sandbox_logs_after(
        &self,
        id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<SandboxLogLine>, StoreError> {
        records::logs_after(&self.pool, id, after, limit).await
    }

    async fn last_sandbox_log_seq(&self, id: &str) -> Result<Option<i64>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT MAX(seq) FROM sandbox_logs WHERE sandbox_id = $1")
                .bind(id)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn prune_sandbox_logs(&self, before: Millis) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM sandbox_logs WHERE at < $1")
            .bind(before)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn insert_secret(&self, secret: &SecretRecord) -> Result<bool, StoreError> {
        records::insert_secret(&self.pool, secret).await
    }

    async fn get_secret(
        &self,
        team_id: &str,
        id_or_name: &str,
    ) -> Result<Option<SecretRecord>, StoreError> {
        records::get_secret(&self.pool, team_id, id_or_name).await
    }

    async fn list_secrets(
        &self,
        team_id: &str,
        after: Option<(Millis, String)>,
        limit: u32,
    ) -> Result<Vec<SecretRecord>, StoreError> {
        records::list_secrets(&self.pool, team_id, after, limit).await
    }

    async fn update_secret(
        &self,
        secret: &SecretRecord,
        expected_version: i64,
    ) -> Result<bool, StoreError> {
        records::update_secret(&self.pool, secret, expected_version).await
    }

    async fn delete_secret(&self, team_id: &str, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM secrets WHERE team_id = $1 AND id = $2")
            .bind(team_id)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}

/// An event to store (of a sandbox with a row in `sandboxes`).
struct NewEvent<'a> {
    id: &'a str,
    from: Option<SandboxState>,
    to: SandboxState,
    reason: Option<&'a str>,
    at: Millis,
    took: Option<Millis>,
    policy: Option<Policy>,
}

async fn insert_event(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    event: NewEvent<'_>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO sandbox_events (sandbox_id, from_state, to_state, reason, at, took_ms, policy) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(event.id)
    .bind(event.from.map(SandboxState::as_str))
    .bind(event.to.as_str())
    .bind(event.reason)
    .bind(event.at)
    .bind(event.took)
    .bind(event.policy.map(Policy::as_str))
    .execute(&mut **tx)
    .await?;
    Ok(())
}
