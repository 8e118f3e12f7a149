//! The SQLite store's sandbox logs (migration 0013): lines the monitor collected from each
//! sandbox's agent. [`super::SqliteStore`]'s `Store` impl calls these.

use std::collections::BTreeSet;

use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use super::rows::line_from_row;
use super::{LogLevel, LogQuery, Millis, SandboxLogLine, StoreError};

pub(super) async fn insert(
    pool: &SqlitePool,
    lines: &[SandboxLogLine],
    keep_per_sandbox: u64,
) -> Result<(), StoreError> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    // Six binds a row, well under SQLite's bound-parameter limit per chunk.
    for chunk in lines.chunks(1000) {
        let mut query: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT OR IGNORE INTO sandbox_logs (sandbox_id, seq, at, level, message, fields) ",
        );
        query.push_values(chunk, |mut row, line| {
            row.push_bind(&line.sandbox_id)
                .push_bind(line.seq)
                .push_bind(line.at)
                .push_bind(line.level.as_str())
                .push_bind(&line.message)
                .push_bind(serde_json::to_string(&line.fields).unwrap_or_else(|_| "{}".into()));
        });
        query.build().execute(&mut *tx).await?;
    }
    let keep = i64::try_from(keep_per_sandbox).unwrap_or(i64::MAX);
    let sandboxes: BTreeSet<&str> = lines.iter().map(|l| l.sandbox_id.as_str()).collect();
    for id in sandboxes {
        sqlx::query(
            "DELETE FROM sandbox_logs WHERE sandbox_id = ?1 AND seq <= \
             (SELECT seq FROM sandbox_logs WHERE sandbox_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
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

pub(super) async fn page(
    pool: &SqlitePool,
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
    let mut sql: QueryBuilder<Sqlite> =
        QueryBuilder::new("SELECT * FROM sandbox_logs WHERE sandbox_id = ");
    sql.push_bind(id);
    sql.push(" AND level IN (");
    let mut list = sql.separated(", ");
    for level in levels {
        list.push_bind(level);
    }
    sql.push(")");
    if let Some(cursor) = query.cursor {
        sql.push(if query.forward {
            " AND at >= "
        } else {
            " AND at <= "
        });
        sql.push_bind(cursor);
    }
    if let Some(search) = query.search.as_deref().filter(|s| !s.is_empty()) {
        sql.push(" AND message LIKE ");
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

pub(super) async fn after(
    pool: &SqlitePool,
    id: &str,
    after: i64,
    limit: u32,
) -> Result<Vec<SandboxLogLine>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM sandbox_logs WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?",
    )
    .bind(id)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(line_from_row).collect()
}

pub(super) async fn last_seq(pool: &SqlitePool, id: &str) -> Result<Option<i64>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT MAX(seq) FROM sandbox_logs WHERE sandbox_id = ?")
            .bind(id)
            .fetch_one(pool)
            .await?,
    )
}

pub(super) async fn prune(pool: &SqlitePool, before: Millis) -> Result<u64, StoreError> {
    let done = sqlx::query("DELETE FROM sandbox_logs WHERE at < ?")
        .bind(before)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}
