//! The SQLite store's reads for the dashboard's fleet view (migration 0022): the notes of the
//! fleet-hygiene checks and the durations of creates, resumes and pauses, both kept on
//! `sandbox_events` rows. [`super::SqliteStore`]'s `Store` impl calls these.

use sqlx::{Row, SqlitePool};

use super::rows::event_from_row;
use super::{Millis, OperationTiming, Policy, PolicyEvent, StoreError};

/// A team's events: those of its sandboxes (through `sandboxes`) and of its template builds' sandboxes
/// (which carry their team themselves), as `lifecycle_events` reads them.
const TEAM_EVENTS: &str = "sandbox_events e LEFT JOIN sandboxes s ON s.id = e.sandbox_id \
                           WHERE COALESCE(s.team_id, e.team_id) = ?";

pub(super) async fn policy_events(
    pool: &SqlitePool,
    team_id: &str,
    limit: u32,
) -> Result<Vec<PolicyEvent>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT e.*, s.template_id AS sandbox_template FROM {TEAM_EVENTS} \
         AND e.policy IS NOT NULL ORDER BY e.seq DESC LIMIT ?"
    ))
    .bind(team_id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        let name: String = row.try_get("policy")?;
        // A name this server does not know (written by a newer one) is left out.
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
    pool: &SqlitePool,
    team_id: &str,
    since: Millis,
    limit: u32,
) -> Result<Vec<OperationTiming>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT e.* FROM {TEAM_EVENTS} \
         AND e.took_ms IS NOT NULL AND e.at >= ? ORDER BY e.at DESC, e.seq DESC LIMIT ?"
    ))
    .bind(team_id)
    .bind(since)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let mut timings = Vec::with_capacity(rows.len());
    for row in &rows {
        let took: Millis = row.try_get("took_ms")?;
        let event = event_from_row(row)?;
        // Only the moves that finish an operation carry a duration.
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
