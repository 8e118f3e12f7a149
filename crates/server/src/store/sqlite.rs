//! SQLite implementation of [`Store`]: WAL journal, migrations embedded in the binary (`migrations.rs`).
//! Its SQL is in this file and its `sqlite_*.rs` siblings; the mapping of rows to records is shared with
//! the PostgreSQL store (`rows.rs`).

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};

use super::rows::{
    api_key_from_row, egress_to_json, event_from_row, parse_state, sandbox_from_row, team_from_row,
    template_from_row, to_json, webhook_from_row,
};
use super::{
    sqlite_fleet, sqlite_logs, sqlite_metrics, sqlite_secrets, sqlite_servers, sqlite_snapshots,
    sqlite_template_builds, sqlite_volumes, sqlite_workspaces, ApiKeyRecord, BuildRecord,
    BuildSandboxEvent, ChecksumStatus, EventQuery, IdempotencyClaim, LifecycleEvent, LogQuery,
    MetricSample, Millis, OperationTiming, PauseKind, Policy, PolicyEvent, SandboxEvent,
    SandboxFilter, SandboxLogLine, SandboxRecord, SecretRecord, ServerRecord, ServerRenewal,
    SnapshotFilter, SnapshotRecord, Store, StoreError, TeamRecord, TemplateRecord, TemplateTag,
    TransitionUpdate, VolumeDeletion, VolumeRecord, WebhookRecord, WorkspaceMove, WorkspaceRecord,
    LAST_USED_RESOLUTION_MS,
};
use crate::lifecycle::state::SandboxState;
use warren_runtime::network::egress::EgressRules;

use super::migrations::SQLITE as MIGRATOR;

/// Name of the database file inside the state directory.
pub const DATABASE_FILE: &str = "warren.db";

pub struct SqliteStore {
    pool: SqlitePool,
    server_id: String,
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
            .after_release(|conn, _| Box::pin(async move { still_usable(conn).await }))
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(SqliteStore {
            pool,
            server_id: super::new_server_id(),
        })
    }
}

/// Whether a connection coming back to the pool may serve the next caller: not when it is still
/// inside a transaction. A transaction whose statement failed (a full disk: `SQLITE_FULL` may or may
/// not have rolled it back) and whose `ROLLBACK` then failed too would otherwise go back to the pool
/// holding SQLite's write lock, and every other writer would wait out the busy timeout and fail with
/// "database is locked" long after the disk has room again. Closing the connection ends the
/// transaction and frees the lock.
async fn still_usable(conn: &mut sqlx::SqliteConnection) -> Result<bool, sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    // SAFETY: the handle is locked for this call (no statement runs on the connection meanwhile) and
    // sqlite3_get_autocommit only reads the connection's state.
    let autocommit =
        unsafe { libsqlite3_sys::sqlite3_get_autocommit(handle.as_raw_handle().as_ptr()) };
    if autocommit == 0 {
        tracing::warn!("a store connection came back inside a transaction; closing it");
        return Ok(false);
    }
    Ok(true)
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
        rows.iter().map(webhook_from_row).collect()
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

    async fn sandbox_logs_after(
        &self,
        id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<SandboxLogLine>, StoreError> {
        sqlite_logs::after(&self.pool, id, after, limit).await
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
        sqlite_template_builds::upsert_build(&self.pool, build, &self.server_id).await
    }

    async fn get_build(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<Option<BuildRecord>, StoreError> {
        sqlite_template_builds::get_build(&self.pool, template_id, build_id).await
    }

    async fn fail_unfinished_builds(
        &self,
        live: &[String],
        reason: &str,
        now: Millis,
    ) -> Result<u64, StoreError> {
        sqlite_template_builds::fail_unfinished_builds(&self.pool, live, reason, now).await
    }

    fn server_id(&self) -> &str {
        &self.server_id
    }

    fn shared(&self) -> bool {
        false
    }

    async fn renew_server(&self, renewal: &ServerRenewal<'_>) -> Result<(), StoreError> {
        sqlite_servers::renew(&self.pool, &self.server_id, renewal).await
    }

    async fn live_servers(&self, since: Millis) -> Result<Vec<ServerRecord>, StoreError> {
        sqlite_servers::live(&self.pool, since).await
    }

    async fn forget_servers(&self, this_one: bool, before: Millis) -> Result<u64, StoreError> {
        let id = this_one.then_some(self.server_id.as_str());
        sqlite_servers::forget(&self.pool, id, before).await
    }

    async fn lead(&self) -> Result<bool, StoreError> {
        // The state directory's lock keeps every other server off this file.
        Ok(true)
    }

    async fn orphaned_transitions(
        &self,
        live: &[String],
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        sqlite_servers::orphaned_transitions(&self.pool, live).await
    }

    async fn own_transitions(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        sqlite_servers::transitions_of(&self.pool, &self.server_id).await
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
             traffic_access_token, egress, policies, ingress, auto_pause_memory, volume_mounts, owner) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
        sqlite_fleet::policy_events(&self.pool, team_id, limit).await
    }

    async fn operation_timings(
        &self,
        team_id: &str,
        since: Millis,
        limit: u32,
    ) -> Result<Vec<OperationTiming>, StoreError> {
        sqlite_fleet::operation_timings(&self.pool, team_id, since, limit).await
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
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    event: NewEvent<'_>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO sandbox_events (sandbox_id, from_state, to_state, reason, at, took_ms, policy) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
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
