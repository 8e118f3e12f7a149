//! The SQLite store's server rows (`servers`, migration 0023) and the owner-based queries beside
//! them. A SQLite file has one server at a time, so its server always leads; the rows are kept all
//! the same, so both back ends answer the same questions the same way.

use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use super::rows::{sandbox_from_row, server_from_row};
use super::{Millis, SandboxRecord, ServerRecord, ServerRenewal, StoreError};

pub async fn renew(
    pool: &SqlitePool,
    id: &str,
    renewal: &ServerRenewal<'_>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO servers (id, address, started_at, renewed_at, holds, leader) \
         VALUES (?, ?, ?, ?, ?, ?) \
         ON CONFLICT (id) DO UPDATE SET address = excluded.address, \
         renewed_at = excluded.renewed_at, holds = excluded.holds, leader = excluded.leader",
    )
    .bind(id)
    .bind(renewal.address)
    .bind(renewal.now)
    .bind(renewal.now)
    .bind(super::rows::to_json(&renewal.holds))
    .bind(i64::from(renewal.leading))
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn live(pool: &SqlitePool, since: Millis) -> Result<Vec<ServerRecord>, StoreError> {
    let rows = sqlx::query("SELECT * FROM servers WHERE renewed_at >= ? ORDER BY started_at, id")
        .bind(since)
        .fetch_all(pool)
        .await?;
    rows.iter().map(server_from_row).collect()
}

pub async fn forget(
    pool: &SqlitePool,
    id: Option<&str>,
    before: Millis,
) -> Result<u64, StoreError> {
    let done = sqlx::query("DELETE FROM servers WHERE renewed_at < ? OR id = ?")
        .bind(before)
        .bind(id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

pub async fn orphaned_transitions(
    pool: &SqlitePool,
    live: &[String],
) -> Result<Vec<SandboxRecord>, StoreError> {
    let mut query: QueryBuilder<Sqlite> = QueryBuilder::new(
        "SELECT * FROM sandboxes WHERE state IN ('creating', 'pausing', 'resuming')",
    );
    if !live.is_empty() {
        query.push(" AND (owner IS NULL OR owner NOT IN (");
        let mut list = query.separated(", ");
        for id in live {
            list.push_bind(id);
        }
        query.push("))");
    }
    query.push(" ORDER BY started_at, id");
    let rows = query.build().fetch_all(pool).await?;
    rows.iter().map(sandbox_from_row).collect()
}

pub async fn transitions_of(
    pool: &SqlitePool,
    owner: &str,
) -> Result<Vec<SandboxRecord>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM sandboxes WHERE state IN ('creating', 'pausing', 'resuming') AND owner = ? \
         ORDER BY started_at, id",
    )
    .bind(owner)
    .fetch_all(pool)
    .await?;
    rows.iter().map(sandbox_from_row).collect()
}
