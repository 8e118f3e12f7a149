//! Ending a sandbox: kill, the timeout it runs under, and the scheduler's expiry.

use warren_runtime::RuntimeError;

use super::{remove_snapshot, Lifecycle, LifecycleError, PauseMode};
use crate::lifecycle::now_millis;
use crate::lifecycle::routes::Route;
use crate::lifecycle::state::SandboxState;
use crate::store::{Millis, PauseKind, SandboxRecord, TransitionUpdate};

impl Lifecycle {
    /// Destroy a sandbox (running or paused).
    pub async fn kill(&self, id: &str, reason: &str) -> Result<(), LifecycleError> {
        let (_held, mut record) = self.lock_live(id).await?;
        self.kill_locked(&mut record, reason).await
    }

    async fn kill_locked(
        &self,
        record: &mut SandboxRecord,
        reason: &str,
    ) -> Result<(), LifecycleError> {
        if let Err(invalid) = record.state.check_transition(SandboxState::Killed) {
            return Err(LifecycleError::Conflict(format!(
                "sandbox {} is {} and cannot be killed now: {invalid}",
                record.id, record.state
            )));
        }
        // From here on the sandbox is gone for traffic: the proxy answers "not found" at once instead of
        // connecting to a sandbox that is being torn down.
        self.routes.set(&record.id, Some(Route::Ending));
        // The last lines the sandbox printed, before they go with it.
        if let Err(error) = self.collect_logs(record).await {
            tracing::warn!(sandbox = %record.id, %error, "the sandbox's last log lines were not stored");
        }
        let checkpointed = record.pause_kind.is_some_and(PauseKind::on_disk);
        if !checkpointed {
            let id = record.id.clone();
            match self
                .on_runtime_setup(move |runtime| runtime.destroy(&id))
                .await
            {
                Ok(()) | Err(RuntimeError::NotFound(_)) => {}
                // Its node did not answer: the sandbox is as it was (it runs on, or its node is
                // about to be declared down); the row stays, and the kill can be asked again.
                Err(source) if crate::node::remote::Unreachable::anywhere(&source) => {
                    self.routes.set(&record.id, None);
                    return Err(LifecycleError::Runtime {
                        action: "destroy",
                        id: record.id.clone(),
                        source,
                    });
                }
                Err(source) => {
                    self.fail(record, format!("destroy failed: {source}")).await;
                    return Err(LifecycleError::Runtime {
                        action: "destroy",
                        id: record.id.clone(),
                        source,
                    });
                }
            }
        }
        if let Some(dir) = record.snapshot_dir.clone() {
            remove_snapshot(&dir).await;
        }
        self.transition(
            record,
            SandboxState::Killed,
            TransitionUpdate {
                reason: Some(reason.to_string()),
                ip: Some(None),
                init_pid: Some(None),
                snapshot_dir: Some(None),
                ..TransitionUpdate::default()
            },
        )
        .await
    }

    /// Move the end time to `now + timeout`. A timeout of 0 ends the sandbox now, the way its time
    /// running out would (pause with autoPause, else kill), as E2B does.
    pub async fn set_timeout(
        &self,
        id: &str,
        timeout: i64,
    ) -> Result<SandboxRecord, LifecycleError> {
        if timeout == 0 {
            let (_held, mut record) = self.lock_live(id).await?;
            if record.state != SandboxState::Running {
                let now = now_millis();
                record.end_at = now;
                self.store.set_sandbox_end(id, now, now).await?;
            } else {
                self.end_locked(&mut record, "timeout set to 0").await?;
            }
            return Ok(record);
        }
        let timeout = self.timeout_millis(Some(timeout))?;
        let (_held, mut record) = self.lock_live(id).await?;
        let now = now_millis();
        record.end_at = now + timeout;
        self.store.set_sandbox_end(id, record.end_at, now).await?;
        Ok(record)
    }

    /// The scheduler's action for a sandbox whose time is up: pause (autoPause) or kill. Re-checks the end
    /// time under the lock, since the timeout may have moved.
    pub async fn expire(
        &self,
        id: &str,
        now: Millis,
    ) -> Result<Option<SandboxState>, LifecycleError> {
        let lock = self.lock_for(id);
        let _held = lock.lock().await;
        let mut record = match self.store.get_sandbox(id).await? {
            Some(record) if record.state == SandboxState::Running && record.end_at <= now => record,
            _ => return Ok(None),
        };
        self.end_locked(&mut record, "timeout").await?;
        Ok(Some(record.state))
    }

    /// Ends a running sandbox the way its time running out would, for `reason` (the idle policy's);
    /// `None` when it is not running (any more).
    pub async fn end_early(
        &self,
        id: &str,
        reason: &str,
    ) -> Result<Option<SandboxState>, LifecycleError> {
        let (_held, mut record) = self.lock_live(id).await?;
        if record.state != SandboxState::Running {
            return Ok(None);
        }
        self.end_locked(&mut record, reason).await?;
        Ok(Some(record.state))
    }

    /// Pause (autoPause) or kill a running sandbox whose lock the caller holds.
    async fn end_locked(
        &self,
        record: &mut SandboxRecord,
        reason: &str,
    ) -> Result<(), LifecycleError> {
        if record.auto_pause {
            let mode = if record.auto_pause_memory {
                PauseMode::Memory
            } else {
                PauseMode::Filesystem
            };
            self.pause_locked(record, reason, mode).await.map(drop)
        } else {
            self.kill_locked(record, reason).await
        }
    }
}
