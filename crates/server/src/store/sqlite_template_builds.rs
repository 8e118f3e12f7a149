//! The SQLite store's template tags (`template_tags`, migration 0007) and build records
//! (`template_builds`, migration 0008), kept apart from `sqlite.rs` to keep files short.
//! [`super::SqliteStore`]'s `Store` impl calls these.

use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use super::rows::{build_from_row, tag_from_row};
use super::{BuildRecord, Millis, StoreError, TemplateTag};

pub async fn assign_tags(
    pool: &SqlitePool,
    template_id: &str,
    build_id: &str,
    tags: &[String],
    now: Millis,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    for tag in tags {
        sqlx::query(
            "INSERT INTO template_tags (template_id, tag, build_id, created_at) VALUES (?, ?, ?, ?) \
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

pub async fn remove_tags(
    pool: &SqlitePool,
    template_id: &str,
    tags: &[String],
) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    let mut removed = 0;
    for tag in tags {
        removed += sqlx::query("DELETE FROM template_tags WHERE template_id = ? AND tag = ?")
            .bind(template_id)
            .bind(tag)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    tx.commit().await?;
    Ok(removed)
}

pub async fn list_tags(
    pool: &SqlitePool,
    template_id: &str,
) -> Result<Vec<TemplateTag>, StoreError> {
    let rows = sqlx::query(
        "SELECT template_id, tag, build_id, created_at FROM template_tags WHERE template_id = ? ORDER BY tag",
    )
    .bind(template_id)
    .fetch_all(pool)
    .await?;
    rows.iter().map(tag_from_row).collect()
}

/// A late `building` (the server records it after handing the build to its thread) never overwrites a
/// build that already finished.
pub async fn upsert_build(
    pool: &SqlitePool,
    build: &BuildRecord,
    owner: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO template_builds (build_id, template_id, status, reason, created_at, updated_at, \
         owner) VALUES (?, ?, ?, ?, ?, ?, ?) \
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

pub async fn get_build(
    pool: &SqlitePool,
    template_id: &str,
    build_id: &str,
) -> Result<Option<BuildRecord>, StoreError> {
    let row = sqlx::query("SELECT * FROM template_builds WHERE template_id = ? AND build_id = ?")
        .bind(template_id)
        .bind(build_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(build_from_row).transpose()
}

/// Marks every waiting or building build failed with `reason`, and a template whose only build that
/// was (status still waiting/building) `error`. Returns how many builds changed.
pub async fn fail_unfinished_builds(
    pool: &SqlitePool,
    live: &[String],
    reason: &str,
    now: Millis,
) -> Result<u64, StoreError> {
    // The unfinished builds of servers not among `live`.
    let orphaned = |query: &mut QueryBuilder<Sqlite>| {
        query.push("status IN ('waiting', 'building')");
        if !live.is_empty() {
            query.push(" AND (owner IS NULL OR owner NOT IN (");
            let mut list = query.separated(", ");
            for id in live {
                list.push_bind(id.clone());
            }
            query.push("))");
        }
    };
    let mut tx = pool.begin().await?;
    let mut templates = QueryBuilder::new("UPDATE templates SET status = 'error', updated_at = ");
    templates.push_bind(now);
    templates.push(
        " WHERE status IN ('waiting', 'building') AND build_id IN (SELECT build_id FROM \
         template_builds WHERE ",
    );
    orphaned(&mut templates);
    templates.push(")");
    templates.build().execute(&mut *tx).await?;
    let mut builds = QueryBuilder::new("UPDATE template_builds SET status = 'error', reason = ");
    builds.push_bind(reason.to_string());
    builds.push(", updated_at = ").push_bind(now);
    builds.push(" WHERE ");
    orphaned(&mut builds);
    let done = builds.build().execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}
