//! Start-up reconciliation: make the store agree with what really runs on this host. Live sandboxes the
//! store knows are adopted, ones it knows that are gone are marked lost (failed), and ones it does not
//! know are destroyed. A pause or resume that a crash cut short is settled from what is on disk and on
//! the host: a complete checkpoint means paused, a tree still running means running, a frozen tree means
//! paused in memory; nothing that could still be resumed is thrown away.

use std::collections::HashMap;

use super::operations::remove_snapshot;
use super::snapshots::checkpoint_complete;
use super::state::SandboxState;
use super::{Lifecycle, LifecycleError};
use crate::store::{PauseKind, SandboxFilter, SandboxRecord, TransitionUpdate};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReconcileReport {
    pub adopted: Vec<String>,
    pub lost: Vec<String>,
    pub destroyed: Vec<String>,
    /// Checkpointed sandboxes left paused on disk.
    pub kept_checkpoints: Vec<String>,
    /// Sandboxes caught mid-pause or mid-resume, settled to `paused` or `running`.
    pub settled: Vec<String>,
    /// Fork checkpoints and snapshot directories no row names, removed.
    pub orphan_dirs_removed: Vec<std::path::PathBuf>,
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
                    lifecycle.reinstall_network(&record).await;
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
            (SandboxState::Pausing | SandboxState::Resuming, running) => {
                if settle(lifecycle, &mut record, running).await? {
                    report.settled.push(record.id.clone());
                } else {
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
    report.orphan_dirs_removed = lifecycle.remove_orphan_snapshot_dirs().await?;
    tracing::info!(
        adopted = ?report.adopted,
        lost = ?report.lost,
        destroyed = ?report.destroyed,
        kept_checkpoints = ?report.kept_checkpoints,
        settled = ?report.settled,
        orphan_dirs_removed = ?report.orphan_dirs_removed,
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

/// Settle a sandbox a restart caught in `pausing` or `resuming`, from the checkpoint on disk and the tree
/// on the host. Returns false when nothing resumable was left and the sandbox was marked lost.
async fn settle(
    lifecycle: &Lifecycle,
    record: &mut SandboxRecord,
    running: Option<warren_runtime::Sandbox>,
) -> Result<bool, LifecycleError> {
    let pause_dir = lifecycle.config().snapshots_dir().join(&record.id);
    let frozen = running
        .as_ref()
        .map(|sandbox| sandbox.state == warren_runtime::RuntimeState::Frozen);
    let paused_on_disk = |dir: std::path::PathBuf, reason: &str| TransitionUpdate {
        reason: Some(reason.to_string()),
        ip: Some(None),
        init_pid: Some(None),
        pause_kind: Some(Some(PauseKind::Checkpoint)),
        snapshot_dir: Some(Some(dir)),
        ..TransitionUpdate::default()
    };
    match (record.state, running) {
        // The dump finished (its manifest is written last) and CRIU stopped the tree: paused.
        (SandboxState::Pausing, None) if checkpoint_complete(&pause_dir) => {
            let update = paused_on_disk(
                pause_dir,
                "restart during pause: the checkpoint on disk is complete",
            );
            lifecycle
                .transition(record, SandboxState::Paused, update)
                .await?;
            Ok(true)
        }
        // Frozen (the freeze fallback, or a dump that froze it): paused in memory.
        (SandboxState::Pausing, Some(sandbox)) if frozen == Some(true) => {
            remove_snapshot(&pause_dir).await;
            let update = TransitionUpdate {
                reason: Some("restart during pause: frozen in memory".to_string()),
                ip: Some(Some(sandbox.ip)),
                init_pid: Some(Some(sandbox.init_pid)),
                pause_kind: Some(Some(PauseKind::Freeze)),
                snapshot_dir: Some(None),
                ..TransitionUpdate::default()
            };
            lifecycle
                .transition(record, SandboxState::Paused, update)
                .await?;
            Ok(true)
        }
        // The tree still runs: the pause did not happen.
        (SandboxState::Pausing, Some(sandbox)) => {
            remove_snapshot(&pause_dir).await;
            let update = TransitionUpdate {
                reason: Some("restart during pause: still running, pause not taken".to_string()),
                ip: Some(Some(sandbox.ip)),
                init_pid: Some(Some(sandbox.init_pid)),
                ..TransitionUpdate::default()
            };
            lifecycle
                .transition(record, SandboxState::Running, update)
                .await?;
            lifecycle.remember_route(record);
            Ok(true)
        }
        // A resume from disk: the checkpoint is removed only after `running` is stored, so a complete
        // one means the resume did not finish. A half-restored tree (its agent perhaps not initialised)
        // is destroyed; the next resume restores again.
        (SandboxState::Resuming, running)
            if record.pause_kind == Some(PauseKind::Checkpoint)
                && record
                    .snapshot_dir
                    .as_deref()
                    .is_some_and(checkpoint_complete) =>
        {
            if running.is_some() {
                destroy(lifecycle, &record.id).await;
            }
            let dir = record.snapshot_dir.clone().unwrap_or(pause_dir);
            let update = paused_on_disk(
                dir,
                "restart during resume: the checkpoint on disk is intact",
            );
            lifecycle
                .transition(record, SandboxState::Paused, update)
                .await?;
            Ok(true)
        }
        // A thaw: frozen still → paused, thawed → running.
        (SandboxState::Resuming, Some(sandbox)) if record.pause_kind == Some(PauseKind::Freeze) => {
            let (to, update) = if frozen == Some(true) {
                (
                    SandboxState::Paused,
                    TransitionUpdate {
                        reason: Some("restart during resume: still frozen".to_string()),
                        ..TransitionUpdate::default()
                    },
                )
            } else {
                (
                    SandboxState::Running,
                    TransitionUpdate {
                        reason: Some("restart during resume: thawed".to_string()),
                        ip: Some(Some(sandbox.ip)),
                        init_pid: Some(Some(sandbox.init_pid)),
                        pause_kind: Some(None),
                        ..TransitionUpdate::default()
                    },
                )
            };
            lifecycle.transition(record, to, update).await?;
            lifecycle.remember_route(record);
            Ok(true)
        }
        (_, running) => {
            if running.is_some() {
                destroy(lifecycle, &record.id).await;
            }
            remove_snapshot(&pause_dir).await;
            lose(
                lifecycle,
                record,
                "server restarted during a transition and nothing resumable is left",
            )
            .await?;
            Ok(false)
        }
    }
}
