//! Pausing: a CRIU checkpoint to disk where the runtime can, else a freeze in memory; or, asked for,
//! the files only (the processes end and start fresh at resume).

use std::time::Duration;

use warren_runtime::RuntimeError;

use super::{remove_snapshot, Lifecycle, LifecycleError};
use crate::lifecycle::agent_init::agent_responds;
use crate::lifecycle::state::SandboxState;
use crate::store::{PauseKind, SandboxRecord, TransitionUpdate};

/// What a pause keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PauseMode {
    /// Memory and files: the processes go on where they were at resume.
    #[default]
    Memory,
    /// The files only (`pause(mode="filesystem")`): cheaper to keep; a resume boots fresh processes.
    Filesystem,
}

/// How long a strict or filesystem pause waits for the guest agent's health answer.
const GUEST_HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

impl Lifecycle {
    /// Pause: checkpoint to disk where the runtime can, else freeze in memory.
    pub async fn pause(&self, id: &str, reason: &str) -> Result<PauseKind, LifecycleError> {
        self.pause_as(id, reason, PauseMode::Memory, false).await
    }

    /// Pause keeping what `mode` says. `strict` (the SDK's `strict`, `requireHealthyGuest`) refuses
    /// the pause when the guest agent does not answer, leaving the sandbox running; a filesystem pause
    /// always asks that.
    pub async fn pause_as(
        &self,
        id: &str,
        reason: &str,
        mode: PauseMode,
        strict: bool,
    ) -> Result<PauseKind, LifecycleError> {
        let (_held, mut record) = self.lock_live(id).await?;
        if (strict || mode == PauseMode::Filesystem) && record.state == SandboxState::Running {
            let responds = match record.ip {
                Some(ip) => {
                    let addr = (ip, warren_runtime::AGENT_PORT).into();
                    agent_responds(addr, GUEST_HEALTH_TIMEOUT).await
                }
                None => false,
            };
            if !responds {
                return Err(LifecycleError::GuestUnresponsive(record.id.clone()));
            }
        }
        self.pause_locked(&mut record, reason, mode).await
    }

    pub(super) async fn pause_locked(
        &self,
        record: &mut SandboxRecord,
        reason: &str,
        mode: PauseMode,
    ) -> Result<PauseKind, LifecycleError> {
        let started = std::time::Instant::now();
        let was_running = record.state == SandboxState::Running;
        let paused = self.pause_running(record, reason, mode).await;
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
        mode: PauseMode,
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

        if mode == PauseMode::Filesystem {
            return self.pause_files(record, reason).await;
        }
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

    /// The filesystem pause of a sandbox now `pausing`: its runtime layer saved to disk, its
    /// processes ended. Any failure leaves it running as it was.
    async fn pause_files(
        &self,
        record: &mut SandboxRecord,
        reason: Option<String>,
    ) -> Result<PauseKind, LifecycleError> {
        let dir = self.config.snapshots_dir().join(&record.id);
        let id = record.id.clone();
        let dest = dir.clone();
        match self
            .on_runtime(move |runtime| runtime.checkpoint_disk(&id, &dest, false))
            .await
        {
            Ok(info) => {
                tracing::info!(sandbox = %record.id, bytes = info.size_bytes, "files saved; processes ended");
                self.transition(
                    record,
                    SandboxState::Paused,
                    TransitionUpdate {
                        reason: reason.map(|reason| format!("{reason} (files only)")),
                        ip: Some(None),
                        init_pid: Some(None),
                        pause_kind: Some(Some(PauseKind::Filesystem)),
                        snapshot_dir: Some(Some(info.dir)),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
                Ok(PauseKind::Filesystem)
            }
            Err(source) => {
                remove_snapshot(&dir).await;
                self.transition(
                    record,
                    SandboxState::Running,
                    TransitionUpdate {
                        reason: Some(format!("filesystem pause failed: {source}")),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
                Err(LifecycleError::Runtime {
                    action: "save the files of",
                    id: record.id.clone(),
                    source,
                })
            }
        }
    }
}
