//! The SQLite store's volume rows (migration 0019). [`super::SqliteStore`]'s `Store` impl calls these.

use sqlx::SqlitePool;

use super::rows::volume_from_row;
use super::{StoreError, VolumeDeletion, VolumeRecord};

pub(super) async fn insert(pool: &SqlitePool, volume: &VolumeRecord) -> Result<(), StoreError> {
    let result = sqlx::query(
        "INSERT INTO volumes (id, team_id, name, token, size_mib, created_at) VALUES (?, ?, ?, ?, ?, ?)",
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

pub(super) async fn get(pool: &SqlitePool, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
    let row = sqlx::query("SELECT * FROM volumes WHERE id = ?")
        .bind(id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(volume_from_row).transpose()
}

pub(super) async fn get_by_name(
    pool: &SqlitePool,
    team_id: &str,
    name: &str,
) -> Result<Option<VolumeRecord>, StoreError> {
    let row = sqlx::query("SELECT * FROM volumes WHERE team_id = ? AND name = ?")
        .bind(team_id)
        .bind(name)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(volume_from_row).transpose()
}

pub(super) async fn list(
    pool: &SqlitePool,
    team_id: &str,
) -> Result<Vec<VolumeRecord>, StoreError> {
    let rows = sqlx::query("SELECT * FROM volumes WHERE team_id = ? ORDER BY created_at, id")
        .bind(team_id)
        .fetch_all(pool)
        .await?;
    rows.iter().map(volume_from_row).collect()
}

/// Deletes the row unless a live sandbox (any state but killed or failed) lists the volume in its
/// `volume_mounts`; the check and the delete are one transaction.
pub(super) async fn delete(pool: &SqlitePool, id: &str) -> Result<VolumeDeletion, StoreError> {
    let mut tx = pool.begin().await?;
    let users: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM sandboxes WHERE state NOT IN ('killed', 'failed') AND volume_mounts IS NOT NULL \
         AND EXISTS (SELECT 1 FROM json_each(sandboxes.volume_mounts) \
                     WHERE json_extract(json_each.value, '$.volumeId') = ?) ORDER BY id",
    )
    .bind(id)
    .fetch_all(&mut *tx)
    .await?;
    if !users.is_empty() {
        return Ok(VolumeDeletion::InUse(users));
    }
    let deleted = sqlx::query("DELETE FROM volumes WHERE id = ?")
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
