//! The SQLite store's snapshot rows (the `snapshots` table of migration 0002), kept apart from
//! `sqlite.rs` to keep files short. [`super::SqliteStore`]'s `Store` impl calls these.

use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use super::rows::snapshot_from_row;
use super::{ChecksumStatus, SnapshotFilter, SnapshotRecord, StoreError};

pub(super) async fn insert(pool: &SqlitePool, s: &SnapshotRecord) -> Result<(), StoreError> {
    let layers = serde_json::to_string(&s.layers).unwrap_or_else(|_| "[]".to_string());
    sqlx::query(
        "INSERT INTO snapshots (id, name, sandbox_id, template_id, layers, dir, size_bytes, \
         checksum_status, vcpus, memory_mib, disk_mib, envd_access_token, created_at, team_id) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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

pub(super) async fn get(
    pool: &SqlitePool,
    id_or_name: &str,
) -> Result<Option<SnapshotRecord>, StoreError> {
    let row = sqlx::query(
        "SELECT * FROM snapshots WHERE id = ? OR name = ? \
         ORDER BY id = ? DESC, created_at DESC, id DESC LIMIT 1",
    )
    .bind(id_or_name)
    .bind(id_or_name)
    .bind(id_or_name)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(snapshot_from_row).transpose()
}

pub(super) async fn list(
    pool: &SqlitePool,
    filter: &SnapshotFilter,
) -> Result<Vec<SnapshotRecord>, StoreError> {
    let mut query: QueryBuilder<Sqlite> = QueryBuilder::new("SELECT * FROM snapshots WHERE 1 = 1");
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
            .push(" AND (created_at < ")
            .push_bind(*created_at)
            .push(" OR (created_at = ")
            .push_bind(*created_at)
            .push(" AND id < ")
            .push_bind(id.clone())
            .push("))");
    }
    query.push(" ORDER BY created_at DESC, id DESC");
    if let Some(limit) = filter.limit {
        query.push(" LIMIT ").push_bind(i64::from(limit));
    }
    let rows = query.build().fetch_all(pool).await?;
    rows.iter().map(snapshot_from_row).collect()
}

pub(super) async fn delete(pool: &SqlitePool, id: &str) -> Result<bool, StoreError> {
    let done = sqlx::query("DELETE FROM snapshots WHERE id = ?")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() > 0)
}

pub(super) async fn set_checksum_status(
    pool: &SqlitePool,
    id: &str,
    status: ChecksumStatus,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE snapshots SET checksum_status = ? WHERE id = ?")
        .bind(status.as_str())
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}
