//! The SQLite store's metric samples (migration 0010): what the monitor measured of each running
//! sandbox, kept for the retention period. [`super::SqliteStore`]'s `Store` impl calls these.

use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};

use super::{MetricSample, Millis, StoreError};

fn sample_from_row(row: &SqliteRow) -> Result<MetricSample, StoreError> {
    let count = |name: &str| -> Result<u64, StoreError> {
        Ok(u64::try_from(row.try_get::<i64, _>(name)?).unwrap_or(0))
    };
    Ok(MetricSample {
        sandbox_id: row.try_get("sandbox_id")?,
        at: row.try_get("at")?,
        cpu_pct: row.try_get("cpu_pct")?,
        cpu_count: u32::try_from(count("cpu_count")?).unwrap_or(u32::MAX),
        mem_used: count("mem_used")?,
        mem_total: count("mem_total")?,
        disk_used: count("disk_used")?,
        disk_total: count("disk_total")?,
        pids: count("pids")?,
        oom_kills: count("oom_kills")?,
        mem_cache: count("mem_cache")?,
        net_rx: count("net_rx")?,
        net_tx: count("net_tx")?,
    })
}

/// SQLite integers are signed: counts beyond i64 (never met in practice) are stored as its maximum.
fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

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
