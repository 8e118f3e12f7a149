//! Reading sandboxes: one, a filtered list, their events and their latest resource sample.

use warren_runtime::{RuntimeError, Stats};

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
        if record.pause_kind == Some(PauseKind::Checkpoint) {
            return Ok(None);
        }
        let id = record.id.clone();
        match self.on_runtime(move |runtime| runtime.stats(&id)).await {
            Ok(stats) => Ok(Some(stats)),
            Err(RuntimeError::NotFound(_)) => Ok(None),
            Err(source) => Err(runtime_error("read stats of", &record.id)(source)),
        }
    }
}
