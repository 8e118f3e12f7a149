//! Start-up reconciliation: make the store agree with what really runs on this host. Live sandboxes the
//! store knows are adopted, ones it knows that are gone are marked lost (failed), and ones it does not
//! know are destroyed.

use std::collections::HashMap;

use super::state::SandboxState;
use super::{Lifecycle, LifecycleError};
use crate::store::{PauseKind, SandboxFilter, TransitionUpdate};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReconcileReport {
    pub adopted: Vec<String>,
    pub lost: Vec<String>,
    pub destroyed: Vec<String>,
    /// Checkpointed sandboxes left paused on disk.
    pub kept_checkpoints: Vec<String>,
}

pub async fn reconcile(lifecycle: &Lifecycle) -> Result<ReconcileReport, LifecycleError> {
    let live = lifecycle
        .on_runtime(|runtime| runtime.list())
        .await
        .map_err(|source| LifecycleError::Runtime {
            action: "list",
            id: "*".to_string(),
            source,
        })?;
    let mut live: HashMap<String, warren_runtime::Sandbox> = live
        .into_iter()
        .map(|sandbox| (sandbox.id.clone(), sandbox))
        .collect();
    let tracked = lifecycle
        .store()
        .list_sandboxes(&SandboxFilter {
            states: SandboxState::ALL
                .into_iter()
                .filter(|s| !s.is_terminal())
                .collect(),
            ..SandboxFilter::default()
        })
        .await?;

    let mut report = ReconcileReport::default();
    for mut record in tracked {
        let running = live.remove(&record.id);
        match (record.state, running) {
            (SandboxState::Paused, None) if record.pause_kind == Some(PauseKind::Checkpoint) => {
                report.kept_checkpoints.push(record.id.clone());
            }
            (SandboxState::Running | SandboxState::Paused, Some(sandbox)) => {
                let frozen = sandbox.state == warren_runtime::RuntimeState::Frozen;
                let consistent = match record.state {
                    SandboxState::Running => !frozen,
                    _ => frozen && record.pause_kind == Some(PauseKind::Freeze),
                };
                if consistent {
                    record.ip = Some(sandbox.ip);
                    record.init_pid = Some(sandbox.init_pid);
                    lifecycle.remember_route(&record);
                    report.adopted.push(record.id.clone());
                } else {
                    destroy(lifecycle, &record.id).await;
                    lose(
                        lifecycle,
                        &mut record,
                        "state on the host did not match the store",
                    )
                    .await?;
                    report.lost.push(record.id.clone());
                }
            }
            (_, Some(_)) => {
                // Caught mid-transition by a restart: its state is unknown, so do not keep it.
                destroy(lifecycle, &record.id).await;
                lose(
                    lifecycle,
                    &mut record,
                    "server restarted during a transition",
                )
                .await?;
                report.lost.push(record.id.clone());
            }
            (_, None) => {
                lose(
                    lifecycle,
                    &mut record,
                    "not running on this host after restart",
                )
                .await?;
                report.lost.push(record.id.clone());
            }
        }
    }
    for id in live.into_keys() {
        destroy(lifecycle, &id).await;
        report.destroyed.push(id);
    }
    tracing::info!(
        adopted = ?report.adopted,
        lost = ?report.lost,
        destroyed = ?report.destroyed,
        kept_checkpoints = ?report.kept_checkpoints,
        "reconciled store with runtime"
    );
    Ok(report)
}

async fn destroy(lifecycle: &Lifecycle, id: &str) {
    let owned = id.to_string();
    if let Err(error) = lifecycle
        .on_runtime(move |runtime| runtime.destroy(&owned))
        .await
    {
        tracing::warn!(sandbox = %id, %error, "cannot destroy during reconciliation");
    }
}

async fn lose(
    lifecycle: &Lifecycle,
    record: &mut crate::store::SandboxRecord,
    reason: &str,
) -> Result<(), LifecycleError> {
    lifecycle
        .transition(
            record,
            SandboxState::Failed,
            TransitionUpdate {
                reason: Some(format!("lost: {reason}")),
                ip: Some(None),
                init_pid: Some(None),
                ..TransitionUpdate::default()
            },
        )
        .await
}
