//! Pausing: a CRIU checkpoint to disk where the runtime can, else a freeze in memory.

use warren_runtime::RuntimeError;

use super::{remove_snapshot, Lifecycle, LifecycleError};
use crate::lifecycle::state::SandboxState;
use crate::store::{PauseKind, SandboxRecord, TransitionUpdate};

impl Lifecycle {
    /// Pause: checkpoint to disk where the runtime can, else freeze in memory.
    pub async fn pause(&self, id: &str, reason: &str) -> Result<PauseKind, LifecycleError> {
        let (_held, mut record) = self.lock_live(id).await?;
        self.pause_locked(&mut record, reason).await
    }

    pub(super) async fn pause_locked(
        &self,
        record: &mut SandboxRecord,
        reason: &str,
    ) -> Result<PauseKind, LifecycleError> {
        let started = std::time::Instant::now();
        let was_running = record.state == SandboxState::Running;
        let paused = self.pause_running(record, reason).await;
        if was_running && paused.is_ok() {
            self.metrics
                .operation_finished("pause", started.elapsed().as_secs_f64());
        }
        paused
    }

    async fn pause_running(
        &self,
        record: &mut SandboxRecord,
        reason: &str,
    ) -> Result<PauseKind, LifecycleError> {
        match record.state {
            SandboxState::Running => {}
            SandboxState::Paused | SandboxState::Pausing => {
                return Err(LifecycleError::Conflict(format!(
                    "sandbox {} is already paused",
                    record.id
                )))
            }
            other => {
                return Err(LifecycleError::Conflict(format!(
                    "sandbox {} is {other} and cannot be paused now",
                    record.id
                )))
            }
        }
        // Lines printed since the last collection are readable while the sandbox is paused.
        if let Err(error) = self.collect_logs(record).await {
            tracing::warn!(sandbox = %record.id, %error, "the sandbox's latest log lines were not stored");
        }
        let reason = Some(reason.to_string());
        self.transition(
            record,
            SandboxState::Pausing,
            TransitionUpdate {
                reason: reason.clone(),
                ..TransitionUpdate::default()
            },
        )
        .await?;

        if self.capabilities.checkpoint {
            let dir = self.config.snapshots_dir().join(&record.id);
            let id = record.id.clone();
            let dest = dir.clone();
            match self
                .on_runtime(move |runtime| runtime.checkpoint(&id, &dest, false))
                .await
            {
                Ok(info) => {
                    tracing::info!(sandbox = %record.id, bytes = info.size_bytes, dir = %info.dir.display(), "checkpointed");
                    self.transition(
                        record,
                        SandboxState::Paused,
                        TransitionUpdate {
                            reason: reason.map(|reason| format!("{reason} (checkpointed to disk)")),
                            ip: Some(None),
                            init_pid: Some(None),
                            pause_kind: Some(Some(PauseKind::Checkpoint)),
                            snapshot_dir: Some(Some(info.dir)),
                            ..TransitionUpdate::default()
                        },
                    )
                    .await?;
                    return Ok(PauseKind::Checkpoint);
                }
                Err(error) => {
                    tracing::warn!(sandbox = %record.id, %error, "checkpoint failed; pausing by freezing instead");
                    remove_snapshot(&dir).await;
                }
            }
        }

        let id = record.id.clone();
        match self.on_runtime(move |runtime| runtime.freeze(&id)).await {
            Ok(()) => {
                self.transition(
                    record,
                    SandboxState::Paused,
                    TransitionUpdate {
                        reason: reason.map(|reason| format!("{reason} (frozen in memory)")),
                        pause_kind: Some(Some(PauseKind::Freeze)),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
                Ok(PauseKind::Freeze)
            }
            Err(RuntimeError::NotFound(_)) => {
                self.fail(record, "lost while pausing".to_string()).await;
                Err(LifecycleError::NotFound(record.id.clone()))
            }
            Err(source) => {
                self.transition(
                    record,
                    SandboxState::Running,
                    TransitionUpdate {
                        reason: Some(format!("pause failed: {source}")),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
                Err(LifecycleError::Runtime {
                    action: "freeze",
                    id: record.id.clone(),
                    source,
                })
            }
        }
    }
}
