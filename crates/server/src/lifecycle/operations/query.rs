//! Reading sandboxes: one, a filtered list, their events and their latest resource sample.

use warren_runtime::{ProcessInfo, RuntimeError, Stats};

use super::{runtime_error, Lifecycle, LifecycleError};
use crate::lifecycle::state::SandboxState;
use crate::store::{PauseKind, SandboxEvent, SandboxFilter, SandboxRecord};

impl Lifecycle {
    /// Sandbox as the API shows it (live ones only).
    pub async fn get(&self, id: &str) -> Result<SandboxRecord, LifecycleError> {
        self.live_record(id).await
    }

    pub async fn list(&self, filter: &SandboxFilter) -> Result<Vec<SandboxRecord>, LifecycleError> {
        let mut filter = filter.clone();
        if filter.states.is_empty() {
            filter.states = SandboxState::ALL
                .into_iter()
                .filter(|s| !s.is_terminal())
                .collect();
        }
        Ok(self.store.list_sandboxes(&filter).await?)
    }

    pub async fn events(&self, id: &str) -> Result<Vec<SandboxEvent>, LifecycleError> {
        self.live_record(id).await?;
        Ok(self.store.sandbox_events(id).await?)
    }

    /// Latest resource sample of a sandbox; empty when it has no running processes (checkpointed).
    pub async fn stats(&self, id: &str) -> Result<Option<Stats>, LifecycleError> {
        let record = self.live_record(id).await?;
        if record.pause_kind.is_some_and(PauseKind::on_disk) {
            return Ok(None);
        }
        let id = record.id.clone();
        match self.on_runtime(move |runtime| runtime.stats(&id)).await {
            Ok(stats) => Ok(Some(stats)),
            Err(RuntimeError::NotFound(_)) => Ok(None),
            Err(source) => Err(runtime_error("read stats of", &record.id)(source)),
        }
    }

    /// A running sandbox's record; a paused one has no processes to list or signal (409).
    pub(super) async fn running_record(&self, id: &str) -> Result<SandboxRecord, LifecycleError> {
        let record = self.live_record(id).await?;
        if record.state != SandboxState::Running {
            return Err(LifecycleError::Conflict(format!(
                "sandbox {id} is {}: only a running sandbox's processes can be seen or signalled",
                record.state.as_str()
            )));
        }
        Ok(record)
    }

    /// The processes of a running sandbox, PIDs as the sandbox sees them; CPU % (of one core) is
    /// measured since the previous listing.
    pub async fn processes(&self, id: &str) -> Result<Vec<ProcessInfo>, LifecycleError> {
        let record = self.running_record(id).await?;
        let runtime_id = record.id.clone();
        self.on_runtime(move |runtime| runtime.processes(&runtime_id))
            .await
            .map_err(runtime_error("list the processes of", &record.id))
    }

    /// The `count` largest files a running sandbox wrote, largest first.
    pub async fn largest_files(
        &self,
        id: &str,
        count: usize,
    ) -> Result<Vec<warren_runtime::rootfs::disk_usage::LargeFile>, LifecycleError> {
        let record = self.running_record(id).await?;
        let runtime_id = record.id.clone();
        self.on_runtime(move |runtime| runtime.largest_files(&runtime_id, count))
            .await
            .map_err(runtime_error("list the largest files of", &record.id))
    }

    /// Sends `signal` to process `pid` (as the sandbox numbers it) of a running sandbox. PID 1 is the
    /// sandbox's agent: ending it ends the sandbox, which is what killing the sandbox is for.
    pub async fn signal_process(
        &self,
        id: &str,
        pid: u32,
        signal: i32,
    ) -> Result<(), LifecycleError> {
        if pid <= 1 {
            return Err(LifecycleError::BadRequest(format!(
                "pid {pid} is the sandbox's own init (its agent): kill the sandbox instead"
            )));
        }
        let record = self.running_record(id).await?;
        let runtime_id = record.id.clone();
        self.on_runtime(move |runtime| runtime.kill_process(&runtime_id, pid, signal))
            .await
            .map_err(runtime_error("signal a process of", &record.id))
    }
}
