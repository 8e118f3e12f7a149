//! Resuming a paused sandbox: restore its checkpoint into fresh namespaces or thaw it.

use warren_runtime::RuntimeError;

use super::{remove_snapshot, Lifecycle, LifecycleError};
use crate::lifecycle::now_millis;
use crate::lifecycle::state::SandboxState;
use crate::store::{Millis, PauseKind, SandboxRecord, TransitionUpdate};

/// What connect/resume did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeOutcome {
    Resumed,
    AlreadyRunning,
}

impl Lifecycle {
    /// Resume a paused sandbox (connect semantics: a running one just gets its timeout extended).
    /// `timeout` in seconds; `None` keeps the default.
    pub async fn resume(
        &self,
        id: &str,
        timeout: Option<i64>,
    ) -> Result<(SandboxRecord, ResumeOutcome), LifecycleError> {
        self.resume_as(id, timeout, false).await
    }

    /// [`Lifecycle::resume`]; with `reboot` (`memory: false`, the SDK's `on_resume="reboot"`) a
    /// paused sandbox boots fresh processes over its saved files whatever memory its pause kept. A
    /// sandbox paused with its files only always resumes that way.
    pub async fn resume_as(
        &self,
        id: &str,
        timeout: Option<i64>,
        reboot: bool,
    ) -> Result<(SandboxRecord, ResumeOutcome), LifecycleError> {
        let timeout = self.timeout_millis(timeout)?;
        let (_held, mut record) = self.lock_live(id).await?;
        let now = now_millis();
        match record.state {
            SandboxState::Paused => {}
            SandboxState::Running | SandboxState::Creating | SandboxState::Resuming => {
                let end_at = now + timeout;
                if end_at > record.end_at {
                    self.store.set_sandbox_end(id, end_at, now).await?;
                    record.end_at = end_at;
                }
                return Ok((record, ResumeOutcome::AlreadyRunning));
            }
            other => {
                return Err(LifecycleError::Conflict(format!(
                    "sandbox {id} is {other} and cannot be resumed now"
                )))
            }
        }
        let started = std::time::Instant::now();
        if reboot {
            self.transition(
                &mut record,
                SandboxState::Resuming,
                TransitionUpdate::default(),
            )
            .await?;
            self.reboot_locked(&mut record, now + timeout).await?;
        } else {
            self.resume_locked(&mut record, now + timeout).await?;
        }
        self.metrics
            .operation_finished("resume", started.elapsed().as_secs_f64());
        let reap = record
            .policies
            .reap_orphans_on_resume
            .unwrap_or(self.config.monitor.reap_orphans_on_resume);
        if reap {
            // The sandbox runs again either way; a failed reap is logged, not the resume's failure.
            if let Err(error) = self.reap_orphans(id, "on resume").await {
                tracing::warn!(sandbox = %id, %error, "cannot reap orphaned processes on resume");
            }
        }
        Ok((record, ResumeOutcome::Resumed))
    }

    async fn resume_locked(
        &self,
        record: &mut SandboxRecord,
        end_at: Millis,
    ) -> Result<(), LifecycleError> {
        // Before the transition: a secret its rules use may have been deleted while it was paused,
        // and then it stays paused.
        let network = self.resolved_network_spec(record).await?;
        self.transition(record, SandboxState::Resuming, TransitionUpdate::default())
            .await?;
        let id = record.id.clone();
        match record.pause_kind {
            Some(PauseKind::Checkpoint) => {
                let Some(dir) = record.snapshot_dir.clone() else {
                    self.fail(record, "checkpoint directory missing".to_string())
                        .await;
                    return Err(LifecycleError::Conflict(format!(
                        "sandbox {id} has no checkpoint to resume"
                    )));
                };
                let template = match self.store.get_template(&record.template_id).await? {
                    Some(template) => template,
                    None => {
                        self.fail(record, "template gone".to_string()).await;
                        return Err(LifecycleError::TemplateNotFound(record.template_id.clone()));
                    }
                };
                // The layers the checkpoint was taken over: a rebuild since moved the template on.
                let layers = warren_runtime::checkpoint::Manifest::read(&dir)
                    .map_or_else(|_| template.layers.clone(), |m| m.layers);
                let spec = self.spec_with_layers(record, layers, network);
                let checkpoint = dir.clone();
                let restored = self
                    .on_runtime(move |runtime| runtime.restore(&checkpoint, &spec))
                    .await;
                let sandbox = match restored {
                    Ok(sandbox) => sandbox,
                    Err(source) => {
                        return Err(self
                            .stay_paused(record, "restore", "restore failed", source)
                            .await);
                    }
                };
                let token = record.envd_access_token.clone();
                if let Err(error) = self.init_agent_of(record, &sandbox, token.as_deref()).await {
                    // The restored tree is running but unusable; the checkpoint is still on disk.
                    let id = record.id.clone();
                    if let Err(destroy) = self.on_runtime(move |runtime| runtime.destroy(&id)).await
                    {
                        tracing::warn!(sandbox = %record.id, error = %destroy, "destroy after failed re-init");
                    }
                    self.transition(
                        record,
                        SandboxState::Paused,
                        TransitionUpdate {
                            reason: Some(format!("agent re-init failed: {error}")),
                            ..TransitionUpdate::default()
                        },
                    )
                    .await?;
                    return Err(error);
                }
                self.transition(
                    record,
                    SandboxState::Running,
                    TransitionUpdate {
                        ip: Some(Some(sandbox.ip)),
                        init_pid: Some(Some(sandbox.init_pid)),
                        pause_kind: Some(None),
                        snapshot_dir: Some(None),
                        end_at: Some(end_at),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
                self.retire_snapshot(&record.id, dir).await;
                Ok(())
            }
            Some(PauseKind::Filesystem) => self.reboot_locked(record, end_at).await,
            Some(PauseKind::Freeze) | None => {
                match self.on_runtime(move |runtime| runtime.thaw(&id)).await {
                    Ok(()) => {
                        self.transition(
                            record,
                            SandboxState::Running,
                            TransitionUpdate {
                                pause_kind: Some(None),
                                end_at: Some(end_at),
                                ..TransitionUpdate::default()
                            },
                        )
                        .await
                    }
                    Err(RuntimeError::NotFound(_)) => {
                        self.fail(record, "lost while paused".to_string()).await;
                        Err(LifecycleError::NotFound(record.id.clone()))
                    }
                    Err(source) => Err(self
                        .stay_paused(record, "thaw", "thaw failed", source)
                        .await),
                }
            }
        }
    }

    /// Disposes of the checkpoint a sandbox was just resumed from. A lazy restore may still be
    /// bringing its memory in from it, so it is moved aside at once (a pause may write a new one in
    /// its place) and removed only once the runtime says every page arrived; if the transfer failed
    /// (a damaged chunk: the runtime ended the sandbox), it goes back in place, and the reconciler
    /// records the sandbox failed with it (see `reconcile::sweep`).
    async fn retire_snapshot(&self, id: &str, dir: std::path::PathBuf) {
        let Some(aside) = dir.file_name().map(|name| {
            dir.with_file_name(format!(
                ".resumed-{}-{}",
                name.to_string_lossy(),
                now_millis()
            ))
        }) else {
            return remove_snapshot(&dir).await;
        };
        if tokio::fs::rename(&dir, &aside).await.is_err() {
            return remove_snapshot(&dir).await;
        }
        let runtime = self.runtime_handle();
        let id = id.to_string();
        tokio::spawn(async move {
            let settled = {
                let id = id.clone();
                tokio::task::spawn_blocking(move || runtime.memory_settled(&id)).await
            };
            match settled {
                Ok(Err(error)) => {
                    tracing::warn!(sandbox = %id, %error, "lazy restore failed; its checkpoint is kept");
                    if tokio::fs::rename(&aside, &dir).await.is_err() {
                        tracing::warn!(sandbox = %id, kept = %aside.display(), "the checkpoint stays aside");
                    }
                }
                _ => remove_snapshot(&aside).await,
            }
        });
    }

    /// Boots a paused sandbox afresh over its saved files: from its checkpoint directory (any memory
    /// in it ignored), or, frozen in memory, after saving its files first. The saved files are only
    /// read until the sandbox runs; any failure leaves it paused with them. The sandbox is `resuming`.
    async fn reboot_locked(
        &self,
        record: &mut SandboxRecord,
        end_at: Millis,
    ) -> Result<(), LifecycleError> {
        let dir = match (record.pause_kind, record.snapshot_dir.clone()) {
            (Some(kind), Some(dir)) if kind.on_disk() => dir,
            (Some(kind), _) if kind.on_disk() => {
                self.fail(record, "checkpoint directory missing".to_string())
                    .await;
                return Err(LifecycleError::Conflict(format!(
                    "sandbox {} has no saved files to boot from",
                    record.id
                )));
            }
            // Frozen in memory: its files are saved (the frozen tree ends), then booted.
            _ => {
                let dir = self.config.snapshots_dir().join(&record.id);
                let (id, dest) = (record.id.clone(), dir.clone());
                if let Err(source) = self
                    .on_runtime(move |runtime| runtime.checkpoint_disk(&id, &dest, false))
                    .await
                {
                    remove_snapshot(&dir).await;
                    return Err(self
                        .stay_paused(
                            record,
                            "save the files of",
                            "saving the files to reboot failed",
                            source,
                        )
                        .await);
                }
                self.transition(
                    record,
                    SandboxState::Paused,
                    TransitionUpdate {
                        reason: Some("files saved for a reboot".to_string()),
                        ip: Some(None),
                        init_pid: Some(None),
                        pause_kind: Some(Some(PauseKind::Filesystem)),
                        snapshot_dir: Some(Some(dir.clone())),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
                self.transition(record, SandboxState::Resuming, TransitionUpdate::default())
                    .await?;
                dir
            }
        };
        let back_to_paused = |reason: String| TransitionUpdate {
            reason: Some(reason),
            ..TransitionUpdate::default()
        };
        let template = match self.store.get_template(&record.template_id).await? {
            Some(template) => template,
            None => {
                self.fail(record, "template gone".to_string()).await;
                return Err(LifecycleError::TemplateNotFound(record.template_id.clone()));
            }
        };
        // The layers the files were saved over (a rebuild since moved the template on); an
        // unreadable manifest is the runtime's to refuse.
        let layers = warren_runtime::checkpoint::Manifest::read(&dir)
            .map_or_else(|_| template.layers.clone(), |m| m.layers);
        let (cold_start, privileges, defaults) =
            super::create::boot_plan(&self.config, &template.id, &template.build_id);
        // A secret its rules use may have been deleted while it was paused: it stays paused.
        let network = match self.resolved_network_spec(record).await {
            Ok(network) => network,
            Err(error) => {
                self.transition(
                    record,
                    SandboxState::Paused,
                    back_to_paused(format!("boot refused: {error}")),
                )
                .await?;
                return Err(error);
            }
        };
        let mut spec = self.spec_with_layers(record, layers, network);
        spec.network.raw_sockets = privileges.raw_sockets;
        spec.syscalls.allow_io_uring = privileges.io_uring;
        let checkpoint = dir.clone();
        let booted = self
            .on_runtime(move |runtime| runtime.boot_from_disk(&checkpoint, &spec))
            .await;
        let sandbox = match booted {
            Ok(sandbox) => sandbox,
            Err(source) => {
                return Err(self
                    .stay_paused(record, "boot", "boot from the saved files failed", source)
                    .await)
            }
        };
        let started = match self
            .init_agent_at(record, sandbox.agent_addr(), None, defaults.workdir)
            .await
        {
            Ok(()) => self
                .run_template_start(record, cold_start, &sandbox)
                .await
                .map_err(|source| LifecycleError::TemplateStart {
                    id: record.id.clone(),
                    source,
                }),
            Err(error) => Err(error),
        };
        if let Err(error) = started {
            let id = record.id.clone();
            if let Err(destroy) = self.on_runtime(move |runtime| runtime.destroy(&id)).await {
                tracing::warn!(sandbox = %record.id, error = %destroy, "destroy after failed boot");
            }
            self.transition(
                record,
                SandboxState::Paused,
                back_to_paused(format!("boot from the saved files failed: {error}")),
            )
            .await?;
            return Err(error);
        }
        self.transition(
            record,
            SandboxState::Running,
            TransitionUpdate {
                reason: Some("booted fresh over its saved files".to_string()),
                ip: Some(Some(sandbox.ip)),
                init_pid: Some(Some(sandbox.init_pid)),
                pause_kind: Some(None),
                snapshot_dir: Some(None),
                end_at: Some(end_at),
                ..TransitionUpdate::default()
            },
        )
        .await?;
        // Superseded by the running sandbox (a later pause saves it again).
        remove_snapshot(&dir).await;
        Ok(())
    }

    /// A resume that did not happen: the sandbox goes back to `paused` (its checkpoint, frozen tree
    /// or saved files untouched) with `what` and the runtime's error as the reason, and the runtime's failure to `action` it is the
    /// answer (or the store's failure to record that).
    async fn stay_paused(
        &self,
        record: &mut SandboxRecord,
        action: &'static str,
        what: &str,
        source: RuntimeError,
    ) -> LifecycleError {
        let update = TransitionUpdate {
            reason: Some(format!("{what}: {source}")),
            ..TransitionUpdate::default()
        };
        match self.transition(record, SandboxState::Paused, update).await {
            Ok(()) => LifecycleError::Runtime {
                action,
                id: record.id.clone(),
                source,
            },
            Err(error) => error,
        }
    }
}
