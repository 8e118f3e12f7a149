//! The SQLite store's metric samples (migration 0010): what the monitor measured of each running
//! sandbox, kept for the retention period. [`super::SqliteStore`]'s `Store` impl calls these.

use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use super::rows::{int, sample_from_row};
use super::{MetricSample, Millis, StoreError};

pub(super) async fn insert(pool: &SqlitePool, samples: &[MetricSample]) -> Result<(), StoreError> {
    if samples.is_empty() {
        return Ok(());
    }
    // Thirteen binds a row: well under SQLite's 32,766 bound parameters for a few hundred sandboxes;
    // bigger fleets go in chunks.
    for chunk in samples.chunks(1000) {
        let mut query: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT OR REPLACE INTO sandbox_metrics \
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
        query.build().execute(pool).await?;
    }
    Ok(())
}

pub(super) async fn between(
    pool: &SqlitePool,
    id: &str,
    from: Millis,
    to: Millis,
) -> Result<Vec<MetricSample>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM sandbox_metrics WHERE sandbox_id = ? AND at >= ? AND at <= ? ORDER BY at",
    )
    .bind(id)
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?;
    rows.iter().map(sample_from_row).collect()
}

pub(super) async fn latest(
    pool: &SqlitePool,
    ids: &[String],
) -> Result<Vec<MetricSample>, StoreError> {
    let mut found = Vec::new();
    for id in ids {
        let row = sqlx::query(
            "SELECT * FROM sandbox_metrics WHERE sandbox_id = ? ORDER BY at DESC LIMIT 1",
        )
        .bind(id)
        .fetch_optional(pool)
        .await?;
        if let Some(row) = row {
            found.push(sample_from_row(&row)?);
        }
    }
    Ok(found)
}

pub(super) async fn prune(pool: &SqlitePool, before: Millis) -> Result<u64, StoreError> {
    let done = sqlx::query("DELETE FROM sandbox_metrics WHERE at < ?")
        .bind(before)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}
