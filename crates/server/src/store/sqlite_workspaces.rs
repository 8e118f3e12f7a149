//! The SQLite store's workspace rows (migration 0009): which sandbox each user of a team is on, and
//! the history of every move. [`super::SqliteStore`]'s `Store` impl calls these.

use sqlx::SqlitePool;

use super::rows::{workspace_from_row, workspace_move_from_row};
use super::{StoreError, WorkspaceMove, WorkspaceRecord};

pub(super) async fn get(
    pool: &SqlitePool,
    team_id: &str,
    user_id: &str,
) -> Result<Option<WorkspaceRecord>, StoreError> {
    let row = sqlx::query("SELECT * FROM workspaces WHERE team_id = ? AND user_id = ?")
        .bind(team_id)
        .bind(user_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(workspace_from_row).transpose()
}

/// Stores `workspace` (insert or update) and the move that led to it, in one transaction.
pub(super) async fn record_move(
    pool: &SqlitePool,
    workspace: &WorkspaceRecord,
    entry: &WorkspaceMove,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO workspaces (team_id, user_id, template, sandbox_id, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (team_id, user_id) DO UPDATE SET \
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
         VALUES (?, ?, ?, ?, ?, ?)",
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

pub(super) async fn history(
    pool: &SqlitePool,
    team_id: &str,
    user_id: &str,
) -> Result<Vec<WorkspaceMove>, StoreError> {
    let rows = sqlx::query(
        "SELECT sandbox_id, action, reason, at FROM workspace_history \
         WHERE team_id = ? AND user_id = ? ORDER BY seq",
    )
    .bind(team_id)
    .bind(user_id)
    .fetch_all(pool)
    .await?;
    rows.iter().map(workspace_move_from_row).collect()
}
