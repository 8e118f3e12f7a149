//! The scheduler: at each tick, sandboxes whose end time has passed are paused (autoPause) or killed;
//! every `snapshot_retention.interval` the snapshot garbage collector applies the retention policy;
//! every `reconcile_interval` the reconciler's sweep fixes what disagrees with the host. With servers
//! sharing the store, only the leading one does these (`servers.rs`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::state::SandboxState;
use super::{now_millis, Lifecycle, LifecycleError};
use crate::store::Millis;

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpiryReport {
    pub paused: Vec<String>,
    pub killed: Vec<String>,
    pub failed: Vec<String>,
}

/// Act on every running sandbox whose end time is at or before `now`.
pub async fn expire_due(
    lifecycle: &Lifecycle,
    now: Millis,
) -> Result<ExpiryReport, LifecycleError> {
    let mut report = ExpiryReport::default();
    for record in lifecycle.store().expired_sandboxes(now).await? {
        match lifecycle.expire(&record.id, now).await {
            Ok(Some(SandboxState::Paused)) => report.paused.push(record.id),
            Ok(Some(SandboxState::Killed)) => report.killed.push(record.id),
            Ok(Some(_)) => report.failed.push(record.id),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(sandbox = %record.id, error = %error, "expiry failed");
                report.failed.push(record.id);
            }
        }
    }
    Ok(report)
}

/// Run [`expire_due`] every `interval`, and the snapshot collector every retention interval, until
/// `shutdown` turns true.
pub async fn run(
    lifecycle: Arc<Lifecycle>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reconcile_ticker = tokio::time::interval(lifecycle.config().reconcile_interval);
    reconcile_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; start-up reconciliation has just run.
    reconcile_ticker.tick().await;
    let mut suspects = std::collections::HashSet::new();
    let mut gc_ticker = tokio::time::interval(lifecycle.config().snapshot_retention.interval);
    gc_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = gc_ticker.tick() => {
                if !lifecycle.leads() {
                    continue;
                }
                match lifecycle.collect_snapshots(now_millis()).await {
                    Ok(report) if !report.deleted.is_empty() => {
                        tracing::info!(deleted = ?report.deleted, "snapshot retention applied");
                    }
                    Ok(_) => {}
                    Err(error) => tracing::error!(%error, "snapshot collection failed"),
                }
                continue;
            }
            _ = reconcile_ticker.tick() => {
                if !lifecycle.leads() {
                    // The leader's sweep covers every sandbox with a row; this server's builds
                    // and warm pools are its own to keep alive.
                    suspects.clear();
                    super::reconcile::renew_held(&lifecycle).await;
                    continue;
                }
                if let Err(error) = super::reconcile::sweep(&lifecycle, &mut suspects).await {
                    tracing::error!(%error, "periodic reconciliation failed");
                }
                continue;
            }
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        if !lifecycle.leads() {
            continue;
        }
        match expire_due(&lifecycle, now_millis()).await {
            Ok(report) if report != ExpiryReport::default() => {
                tracing::info!(paused = ?report.paused, killed = ?report.killed, failed = ?report.failed, "timeouts enforced");
            }
            Ok(_) => {}
            Err(error) => tracing::error!(%error, "scheduler pass failed"),
        }
    }
}
