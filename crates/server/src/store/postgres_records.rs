//! The PostgreSQL store's SQL for template tags and builds, volumes, snapshots, secrets,
//! workspaces, metric samples, sandbox logs and the fleet view, kept apart from `postgres.rs` to
//! keep files short. [`super::PgStore`]'s `Store` impl calls these.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::{PgPool, Postgres, QueryBuilder, Row};

use super::rows::{
    build_from_row, event_from_row, int, line_from_row, metadata_json, sample_from_row,
    sandbox_from_row, secret_from_row, server_from_row, snapshot_from_row, tag_from_row,
    volume_from_row, workspace_from_row, workspace_move_from_row,
};
use super::{
    BuildRecord, LogLevel, LogQuery, MetricSample, Millis, OperationTiming, Policy, PolicyEvent,
    SandboxLogLine, SandboxRecord, SecretRecord, ServerRecord, ServerRenewal, SnapshotFilter,
    SnapshotRecord, StoreError, TemplateTag, VolumeDeletion, VolumeRecord, WorkspaceMove,
    WorkspaceRecord,
};

pub(super) async fn assign_tags(
    pool: &PgPool,
    template_id: &str,
    build_id: &str,
    tags: &[String],
    now: Millis,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    for tag in tags {
        sqlx::query(
            "INSERT INTO template_tags (template_id, tag, build_id, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id, \
             created_at = excluded.created_at",
        )
        .bind(template_id)
        .bind(tag)
        .bind(build_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

pub(super) async fn remove_tags(
    pool: &PgPool,
    template_id: &str,
    tags: &[String],
) -> Result<u64, StoreError> {
    let done = sqlx::query("DELETE FROM template_tags WHERE template_id = $1 AND tag = ANY($2)")
        .bind(template_id)
        .bind(tags)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

pub(super) async fn list_tags(
    pool: &PgPool,
    template_id: &str,
) -> Result<Vec<TemplateTag>, StoreError> {
    let rows = sqlx::query(
        "SELECT template_id, tag, build_id, created_at FROM template_tags WHERE template_id = $1 \
         ORDER BY tag",
    )
    .bind(template_id)
    .fetch_all(pool)
    .await?;
    rows.iter().map(tag_from_row).collect()
}

/// A late `building` never overwrites a build that already finished (as on SQLite).
pub(super) async fn upsert_build(
    pool: &PgPool,
    build: &BuildRecord,
    owner: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO template_builds (build_id, template_id, status, reason, created_at, updated_at, \
         owner) VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (build_id) DO UPDATE SET status = excluded.status, reason = excluded.reason, \
         updated_at = excluded.updated_at, owner = excluded.owner \
         WHERE NOT (excluded.status = 'building' AND template_builds.status IN ('ready', 'error'))",
    )
    .bind(&build.build_id)
    .bind(&build.template_id)
    .bind(build.status.as_str())
    .bind(&build.reason)
    .bind(build.created_at)
    .bind(build.updated_at)
    .bind(owner)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn get_build(
    pool: &PgPool,
    template_id: &str,
    build_id: &str,
) -> Result<Option<BuildRecord>, StoreError> {
    let row = sqlx::query("SELECT * FROM template_builds WHERE template_id = $1 AND build_id = $2")
        .bind(template_id)
        .bind(build_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(build_from_row).transpose()
}

/// `$1`, the live servers' IDs, may be empty: then every unfinished build is orphaned.
const ORPHANED_BUILD: &str = "status IN ('waiting', 'building') AND \
     (cardinality($1::text[]) = 0 OR owner IS NULL OR NOT (owner = ANY($1::text[])))";

pub(super) async fn fail_unfinished_builds(
    pool: &PgPool,
    live: &[String],
    reason: &str,
    now: Millis,
) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(&format!(
        "UPDATE templates SET status = 'error', updated_at = $2 WHERE status IN ('waiting', 'building') \
         AND build_id IN (SELECT build_id FROM template_builds WHERE {ORPHANED_BUILD})"
    ))
    .bind(live)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    let done = sqlx::query(&format!(
        "UPDATE template_builds SET status = 'error', reason = $2, updated_at = $3 \
         WHERE {ORPHANED_BUILD}"
    ))
    .bind(live)
    .bind(reason)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

pub(super) async fn renew_server(
    pool: &PgPool,
    id: &str,
    renewal: &ServerRenewal<'_>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO servers (id, address, started_at, renewed_at, holds, leader) \
         VALUES ($1, $2, $3, $3, $4, $5) \
         ON CONFLICT (id) DO UPDATE SET address = excluded.address, \
         renewed_at = excluded.renewed_at, holds = excluded.holds, leader = excluded.leader",
    )
    .bind(id)
    .bind(renewal.address)
    .bind(renewal.now)
    .bind(super::rows::to_json(&renewal.holds))
    .bind(i64::from(renewal.leading))
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn live_servers(
    pool: &PgPool,
    since: Millis,
) -> Result<Vec<ServerRecord>, StoreError> {
    let rows = sqlx::query("SELECT * FROM servers WHERE renewed_at >= $1 ORDER BY started_at, id")
        .bind(since)
        .fetch_all(pool)
        .await?;
    rows.iter().map(server_from_row).collect()
}

pub(super) async fn forget_servers(
    pool: &PgPool,
    id: Option<&str>,
    before: Millis,
) -> Result<u64, StoreError> {
    let done = sqlx::query("DELETE FROM servers WHERE renewed_at < $1 OR id = $2")
        .bind(before)
        .bind(id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

pub(super) async fn transitions_of(
    pool: &PgPool,
    owner: &str,
) -> Result<Vec<SandboxRecord>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM sandboxes WHERE state IN ('creating', 'pausing', 'resuming') AND owner = $1 \
         ORDER BY started_at, id",
    )
    .bind(owner)
    .fetch_all(pool)
    .await?;
    rows.iter().map(sandbox_from_row).collect()
}

pub(super) async fn orphaned_transitions(
    pool: &PgPool,
    live: &[String],
) -> Result<Vec<SandboxRecord>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM sandboxes WHERE state IN ('creating', 'pausing', 'resuming') \
         AND (cardinality($1::text[]) = 0 OR owner IS NULL OR NOT (owner = ANY($1::text[]))) \
         ORDER BY started_at, id",
    )
    .bind(live)
    .fetch_all(pool)
    .await?;
    rows.iter().map(sandbox_from_row).collect()
}

pub(super) async fn insert_volume(pool: &PgPool, volume: &VolumeRecord) -> Result<(), StoreError> {
    let result = sqlx::query(
        "INSERT INTO volumes (id, team_id, name, token, size_mib, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&volume.id)
    .bind(&volume.team_id)
    .bind(&volume.name)
    .bind(&volume.token)
    .bind(volume.size_mib as i64)
    .bind(volume.created_at)
    .execute(pool)
    .await;
    match result {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(StoreError::Duplicate {
            what: "volume",
            name: volume.name.clone(),
        }),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn get_volume(
    pool: &PgPool,
    id: &str,
) -> Result<Option<VolumeRecord>, StoreError> {
    let row = sqlx::query("SELECT * FROM volumes WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(volume_from_row).transpose()
}

pub(super) async fn get_volume_by_name(
    pool: &PgPool,
    team_id: &str,
    name: &str,
) -> Result<Option<VolumeRecord>, StoreError> {
    let row = sqlx::query("SELECT * FROM volumes WHERE team_id = $1 AND name = $2")
        .bind(team_id)
        .bind(name)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(volume_from_row).transpose()
}

pub(super) async fn list_volumes(
    pool: &PgPool,
    team_id: &str,
) -> Result<Vec<VolumeRecord>, StoreError> {
    let rows = sqlx::query("SELECT * FROM volumes WHERE team_id = $1 ORDER BY created_at, id")
        .bind(team_id)
        .fetch_all(pool)
        .await?;
    rows.iter().map(volume_from_row).collect()
}

/// Deletes the row unless a live sandbox mounts the volume. The volume's row is locked first, so a
/// concurrent delete of the same volume waits and then finds nothing.
pub(super) async fn delete_volume(pool: &PgPool, id: &str) -> Result<VolumeDeletion, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT id FROM volumes WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    let users: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM sandboxes WHERE state NOT IN ('killed', 'failed') AND volume_mounts IS NOT NULL \
         AND EXISTS (SELECT 1 FROM jsonb_array_elements(sandboxes.volume_mounts::jsonb) AS m \
                     WHERE m ->> 'volumeId' = $1) ORDER BY id",
    )
    .bind(id)
    .fetch_all(&mut *tx)
    .await?;
    if !users.is_empty() {
        return Ok(VolumeDeletion::InUse(users));
    }
    let deleted = sqlx::query("DELETE FROM volumes WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(if deleted == 0 {
        VolumeDeletion::NotFound
    } else {
        VolumeDeletion::Deleted
    })
}

pub(super) async fn insert_snapshot(pool: &PgPool, s: &SnapshotRecord) -> Result<(), StoreError> {
    let layers = serde_json::to_string(&s.layers).unwrap_or_else(|_| "[]".to_string());
    sqlx::query(
        "INSERT INTO snapshots (id, name, sandbox_id, template_id, layers, dir, size_bytes, \
         checksum_status, vcpus, memory_mib, disk_mib, envd_access_token, created_at, team_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(&s.id)
    .bind(&s.name)
    .bind(&s.sandbox_id)
    .bind(&s.template_id)
    .bind(layers)
    .bind(s.dir.to_string_lossy().into_owned())
    .bind(s.size_bytes as i64)
    .bind(s.checksum_status.as_str())
    .bind(s.vcpus)
    .bind(s.memory_mib as i64)
    .bind(s.disk_mib as i64)
    .bind(&s.envd_access_token)
    .bind(s.created_at)
    .bind(&s.team_id)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn get_snapshot(
    pool: &PgPool,
    id_or_name: &str,
) -> Result<Option<SnapshotRecord>, StoreError> {
    let row = sqlx::query(
        "SELECT * FROM snapshots WHERE id = $1 OR name = $1 \
         ORDER BY id = $1 DESC, created_at DESC, id DESC LIMIT 1",
    )
    .bind(id_or_name)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(snapshot_from_row).transpose()
}

pub(super) async fn list_snapshots(
    pool: &PgPool,
    filter: &SnapshotFilter,
) -> Result<Vec<SnapshotRecord>, StoreError> {
    let mut query: QueryBuilder<Postgres> =
        QueryBuilder::new("SELECT * FROM snapshots WHERE 1 = 1");
    if let Some(team) = &filter.team_id {
        query.push(" AND team_id = ").push_bind(team.clone());
    }
    if let Some(sandbox_id) = &filter.sandbox_id {
        query
            .push(" AND sandbox_id = ")
            .push_bind(sandbox_id.clone());
    }
    if let Some(name) = &filter.name {
        query
            .push(" AND (id = ")
            .push_bind(name.clone())
            .push(" OR name = ")
            .push_bind(name.clone())
            .push(")");
    }
    if let Some((created_at, id)) = &filter.after {
        query
            .push(" AND (created_at, id) < (")
            .push_bind(*created_at)
            .push(", ")
            .push_bind(id.clone())
            .push(")");
    }
    query.push(" ORDER BY created_at DESC, id DESC");
    if let Some(limit) = filter.limit {
        query.push(" LIMIT ").push_bind(i64::from(limit));
    }
    let rows = query.build().fetch_all(pool).await?;
    rows.iter().map(snapshot_from_row).collect()
}

pub(super) async fn insert_secret(
    pool: &PgPool,
    secret: &SecretRecord,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO secrets (id, team_id, name, version, nonce, ciphertext, metadata, created_at, \
         updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (team_id, name) DO NOTHING",
    )
    .bind(&secret.id)
    .bind(&secret.team_id)
    .bind(&secret.name)
    .bind(secret.version)
    .bind(&secret.sealed.nonce)
    .bind(&secret.sealed.ciphertext)
    .bind(metadata_json(&secret.metadata))
    .bind(secret.created_at)
    .bind(secret.updated_at)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn get_secret(
    pool: &PgPool,
    team_id: &str,
    id_or_name: &str,
) -> Result<Option<SecretRecord>, StoreError> {
    let row = sqlx::query(
        "SELECT * FROM secrets WHERE team_id = $1 AND (id = $2 OR name = $3) \
         ORDER BY id = $2 DESC LIMIT 1",
    )
    .bind(team_id)
    .bind(id_or_name)
    .bind(id_or_name.to_ascii_lowercase())
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(secret_from_row).transpose()
}

pub(super) async fn list_secrets(
    pool: &PgPool,
    team_id: &str,
    after: Option<(Millis, String)>,
    limit: u32,
) -> Result<Vec<SecretRecord>, StoreError> {
    let (at, id) = after.unwrap_or((i64::MIN, String::new()));
    let rows = sqlx::query(
        "SELECT * FROM secrets WHERE team_id = $1 AND (created_at, id) > ($2, $3) \
         ORDER BY created_at, id LIMIT $4",
    )
    .bind(team_id)
    .bind(at)
    .bind(id)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(secret_from_row).collect()
}

pub(super) async fn update_secret(
    pool: &PgPool,
    secret: &SecretRecord,
    expected_version: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE secrets SET version = $1, nonce = $2, ciphertext = $3, metadata = $4, updated_at = $5 \
         WHERE id = $6 AND team_id = $7 AND version = $8",
    )
    .bind(secret.version)
    .bind(&secret.sealed.nonce)
    .bind(&secret.sealed.ciphertext)
    .bind(metadata_json(&secret.metadata))
    .bind(secret.updated_at)
    .bind(&secret.id)
    .bind(&secret.team_id)
    .bind(expected_version)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn get_workspace(
    pool: &PgPool,
    team_id: &str,
    user_id: &str,
) -> Result<Option<WorkspaceRecord>, StoreError> {
    let row = sqlx::query("SELECT * FROM workspaces WHERE team_id = $1 AND user_id = $2")
        .bind(team_id)
        .bind(user_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(workspace_from_row).transpose()
}

pub(super) async fn record_workspace_move(
    pool: &PgPool,
    workspace: &WorkspaceRecord,
    entry: &WorkspaceMove,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO workspaces (team_id, user_id, template, sandbox_id, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (team_id, user_id) DO UPDATE SET \
         template = excluded.template, sandbox_id = excluded.sandbox_id, updated_at = excluded.updated_at",
    )
    .bind(&workspace.team_id)
    .bind(&workspace.user_id)
    .bind(&workspace.template)
    .bind(&workspace.sandbox_id)
    .bind(workspace.created_at)
    .bind(workspace.updated_at)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO workspace_history (team_id, user_id, sandbox_id, action, reason, at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&workspace.team_id)
    .bind(&workspace.user_id)
    .bind(&entry.sandbox_id)
    .bind(&entry.action)
    .bind(&entry.reason)
    .bind(entry.at)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn workspace_history(
    pool: &PgPool,
    team_id: &str,
    user_id: &str,
) -> Result<Vec<WorkspaceMove>, StoreError> {
    let rows = sqlx::query(
        "SELECT sandbox_id, action, reason, at FROM workspace_history \
         WHERE team_id = $1 AND user_id = $2 ORDER BY seq",
    )
    .bind(team_id)
    .bind(user_id)
    .fetch_all(pool)
    .await?;
    rows.iter().map(workspace_move_from_row).collect()
}

pub(super) async fn insert_metric_samples(
    pool: &PgPool,
    samples: &[MetricSample],
) -> Result<(), StoreError> {
    // One statement may not touch a row twice: of samples with the same key, the last wins (as
    // SQLite's INSERT OR REPLACE has it).
    let mut latest: BTreeMap<(&str, Millis), &MetricSample> = BTreeMap::new();
    for sample in samples {
        latest.insert((sample.sandbox_id.as_str(), sample.at), sample);
    }
    let unique: Vec<&MetricSample> = latest.into_values().collect();
    // Thirteen binds a row, well under PostgreSQL's 65,535 per statement.
    for chunk in unique.chunks(1000) {
        let mut query: QueryBuilder<Postgres> = QueryBuilder::new(
            "INSERT INTO sandbox_metrics \
             (sandbox_id, at, cpu_pct, cpu_count, mem_used, mem_total, disk_used, disk_total, pids, \
             oom_kills, mem_cache, net_rx, net_tx) ",
        );
        query.push_values(chunk, |mut row, s| {
            row.push_bind(&s.sandbox_id)
                .push_bind(s.at)
                .push_bind(s.cpu_pct)
                .push_bind(i64::from(s.cpu_count))
                .push_bind(int(s.mem_used))
                .push_bind(int(s.mem_total))
                .push_bind(int(s.disk_used))
                .push_bind(int(s.disk_total))
                .push_bind(int(s.pids))
                .push_bind(int(s.oom_kills))
                .push_bind(int(s.mem_cache))
                .push_bind(int(s.net_rx))
                .push_bind(int(s.net_tx));
        });
        query.push(
            " ON CONFLICT (sandbox_id, at) DO UPDATE SET cpu_pct = excluded.cpu_pct, \
             cpu_count = excluded.cpu_count, mem_used = excluded.mem_used, \
             mem_total = excluded.mem_total, disk_used = excluded.disk_used, \
             disk_total = excluded.disk_total, pids = excluded.pids, oom_kills = excluded.oom_kills, \
             mem_cache = excluded.mem_cache, net_rx = excluded.net_rx, net_tx = excluded.net_tx",
        );
        query.build().execute(pool).await?;
    }
    Ok(())
}

pub(super) async fn metric_samples(
    pool: &PgPool,
    id: &str,
    from: Millis,
    to: Millis,
) -> Result<Vec<MetricSample>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM sandbox_metrics WHERE sandbox_id = $1 AND at >= $2 AND at <= $3 ORDER BY at",
    )
    .bind(id)
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?;
    rows.iter().map(sample_from_row).collect()
}

/// The newest sample of each of `ids`, in the order of `ids`.
pub(super) async fn latest_metric_samples(
    pool: &PgPool,
    ids: &[String],
) -> Result<Vec<MetricSample>, StoreError> {
    let rows = sqlx::query(
        "SELECT DISTINCT ON (sandbox_id) * FROM sandbox_metrics WHERE sandbox_id = ANY($1) \
         ORDER BY sandbox_id, at DESC",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    let mut found: BTreeMap<String, MetricSample> = BTreeMap::new();
    for row in &rows {
        let sample = sample_from_row(row)?;
        found.insert(sample.sandbox_id.clone(), sample);
    }
    Ok(ids.iter().filter_map(|id| found.remove(id)).collect())
}

pub(super) async fn insert_logs(
    pool: &PgPool,
    lines: &[SandboxLogLine],
    keep_per_sandbox: u64,
) -> Result<(), StoreError> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    for chunk in lines.chunks(1000) {
        let mut query: QueryBuilder<Postgres> = QueryBuilder::new(
            "INSERT INTO sandbox_logs (sandbox_id, seq, at, level, message, fields) ",
        );
        query.push_values(chunk, |mut row, line| {
            row.push_bind(&line.sandbox_id)
                .push_bind(line.seq)
                .push_bind(line.at)
                .push_bind(line.level.as_str())
                .push_bind(&line.message)
                .push_bind(serde_json::to_string(&line.fields).unwrap_or_else(|_| "{}".into()));
        });
        query.push(" ON CONFLICT (sandbox_id, seq) DO NOTHING");
        query.build().execute(&mut *tx).await?;
    }
    let keep = i64::try_from(keep_per_sandbox).unwrap_or(i64::MAX);
    let sandboxes: BTreeSet<&str> = lines.iter().map(|l| l.sandbox_id.as_str()).collect();
    for id in sandboxes {
        sqlx::query(
            "DELETE FROM sandbox_logs WHERE sandbox_id = $1 AND seq <= \
             (SELECT seq FROM sandbox_logs WHERE sandbox_id = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)",
        )
        .bind(id)
        .bind(keep)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// `LIKE` matches `_` and `%` as wildcards: a search for them finds them literally.
fn like_pattern(text: &str) -> String {
    let mut pattern = String::from("%");
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

pub(super) async fn log_page(
    pool: &PgPool,
    id: &str,
    query: &LogQuery,
) -> Result<Vec<SandboxLogLine>, StoreError> {
    let levels: Vec<&str> = [
        LogLevel::Debug,
        LogLevel::Info,
        LogLevel::Warn,
        LogLevel::Error,
    ]
    .into_iter()
    .filter(|level| *level >= query.min_level)
    .map(LogLevel::as_str)
    .collect();
    let mut sql: QueryBuilder<Postgres> =
        QueryBuilder::new("SELECT * FROM sandbox_logs WHERE sandbox_id = ");
    sql.push_bind(id);
    sql.push(" AND level = ANY(").push_bind(levels).push(")");
    if let Some(cursor) = query.cursor {
        sql.push(if query.forward {
            " AND at >= "
        } else {
            " AND at <= "
        });
        sql.push_bind(cursor);
    }
    if let Some(search) = query.search.as_deref().filter(|s| !s.is_empty()) {
        // ILIKE: case does not matter, as with SQLite's LIKE.
        sql.push(" AND message ILIKE ");
        sql.push_bind(like_pattern(search));
        sql.push(" ESCAPE '\\'");
    }
    sql.push(if query.forward {
        " ORDER BY at, seq"
    } else {
        " ORDER BY at DESC, seq DESC"
    });
    sql.push(" LIMIT ");
    sql.push_bind(i64::try_from(query.limit).unwrap_or(i64::MAX));
    let rows = sql.build().fetch_all(pool).await?;
    rows.iter().map(line_from_row).collect()
}

pub(super) async fn logs_after(
    pool: &PgPool,
    id: &str,
    after: i64,
    limit: u32,
) -> Result<Vec<SandboxLogLine>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM sandbox_logs WHERE sandbox_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(id)
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(line_from_row).collect()
}

/// A team's events, as `lifecycle_events` reads them (see `sqlite_fleet.rs`).
const TEAM_EVENTS: &str = "sandbox_events e LEFT JOIN sandboxes s ON s.id = e.sandbox_id \
                           WHERE COALESCE(s.team_id, e.team_id) = $1";

pub(super) async fn policy_events(
    pool: &PgPool,
    team_id: &str,
    limit: u32,
) -> Result<Vec<PolicyEvent>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT e.*, s.template_id AS sandbox_template FROM {TEAM_EVENTS} \
         AND e.policy IS NOT NULL ORDER BY e.seq DESC LIMIT $2"
    ))
    .bind(team_id)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        let name: String = row.try_get("policy")?;
        let Some(policy) = Policy::parse(&name) else {
            continue;
        };
        events.push(PolicyEvent {
            policy,
            template_id: row.try_get("sandbox_template")?,
            event: event_from_row(row)?,
        });
    }
    Ok(events)
}

pub(super) async fn operation_timings(
    pool: &PgPool,
    team_id: &str,
    since: Millis,
    limit: u32,
) -> Result<Vec<OperationTiming>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT e.* FROM {TEAM_EVENTS} \
         AND e.took_ms IS NOT NULL AND e.at >= $2 ORDER BY e.at DESC, e.seq DESC LIMIT $3"
    ))
    .bind(team_id)
    .bind(since)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    let mut timings = Vec::with_capacity(rows.len());
    for row in &rows {
        let took: Millis = row.try_get("took_ms")?;
        let event = event_from_row(row)?;
        let Some(operation) = event
            .from_state
            .and_then(|from| from.finishes(event.to_state))
        else {
            continue;
        };
        timings.push(OperationTiming {
            operation,
            sandbox_id: event.sandbox_id,
            at: event.at,
            took,
        });
    }
    Ok(timings)
}
