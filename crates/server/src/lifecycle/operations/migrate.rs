//! Moving running sandboxes between nodes (cluster mode, docs/cluster.md): a pause to a checkpoint
//! in the directory the nodes share, then a resume the runtime places anywhere but where the
//! sandbox was. The processes go on where they were; the sandbox keeps its ID, its files and
//! whatever time it had left. Draining a node does this to every running sandbox on it, after
//! keeping new sandboxes off it.

use super::{runtime_error, Lifecycle, LifecycleError};
use crate::lifecycle::now_millis;
use crate::lifecycle::state::SandboxState;
use crate::store::{PauseKind, SandboxFilter, SandboxRecord};

/// Where a migration took a sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Migration {
    pub record: SandboxRecord,
    pub from: String,
    pub to: String,
}

/// What a drain did: the sandboxes moved, and those that could not be (with why).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrainReport {
    pub moved: Vec<Migration>,
    pub failed: Vec<(String, String)>,
}

impl Lifecycle {
    /// Moves running sandbox `id` to another node.
    pub async fn migrate(&self, id: &str) -> Result<Migration, LifecycleError> {
        let record = self.get(id).await?;
        if record.state != SandboxState::Running {
            return Err(LifecycleError::Conflict(format!(
                "sandbox {id} is {}: only a running sandbox migrates",
                record.state
            )));
        }
        let from = self.node_of(id).await?.ok_or_else(|| {
            LifecycleError::Conflict(format!(
                "sandbox {id} is on no node of this server (one that runs its sandboxes on its own machine has none to move it to)"
            ))
        })?;
        let (sandbox, node) = (id.to_string(), from.clone());
        self.on_runtime(move |runtime| runtime.avoid_node(&sandbox, &node))
            .await
            .map_err(runtime_error("migrate", id))?;
        let kind = self.pause(id, "moved to another node").await?;
        if kind != PauseKind::Checkpoint {
            // A freeze keeps the processes where they are: thaw them there.
            self.resume(id, None).await?;
            return Err(LifecycleError::Conflict(format!(
                "sandbox {id} could only be paused in memory on {from} (no checkpoint): its processes cannot move"
            )));
        }
        let left_secs = ((record.end_at - now_millis()) / 1000).max(1);
        let (record, _) = self.resume(id, Some(left_secs)).await?;
        let to = self.node_of(id).await?.unwrap_or_default();
        tracing::info!(sandbox = %id, %from, %to, "sandbox migrated");
        Ok(Migration { record, from, to })
    }

    /// Keeps new sandboxes off `node` and moves every running sandbox on it elsewhere.
    pub async fn drain(&self, node: &str) -> Result<DrainReport, LifecycleError> {
        self.known_node(node).await?;
        let name = node.to_string();
        self.on_runtime(move |runtime| runtime.set_draining(&name, true))
            .await
            .map_err(runtime_error("drain", node))?;
        let running = self
            .store()
            .list_sandboxes(&SandboxFilter {
                states: vec![SandboxState::Running],
                ..SandboxFilter::default()
            })
            .await?;
        let mut report = DrainReport::default();
        for record in running {
            if self.node_of(&record.id).await?.as_deref() != Some(node) {
                continue;
            }
            match self.migrate(&record.id).await {
                Ok(moved) => report.moved.push(moved),
                Err(error) => report.failed.push((record.id.clone(), error.to_string())),
            }
        }
        Ok(report)
    }

    /// Lets new sandboxes on `node` again.
    pub async fn undrain(&self, node: &str) -> Result<(), LifecycleError> {
        self.known_node(node).await?;
        let name = node.to_string();
        self.on_runtime(move |runtime| runtime.set_draining(&name, false))
            .await
            .map_err(runtime_error("undrain", node))
    }

    /// The nodes of the runtime (empty on one machine).
    pub async fn nodes(&self) -> Result<Vec<warren_runtime::NodeState>, LifecycleError> {
        self.on_runtime(|runtime| Ok(runtime.nodes()))
            .await
            .map_err(runtime_error("list nodes", "*"))
    }

    /// Fails unless `node` is one of the runtime's: 501 on a server without nodes, else 404.
    async fn known_node(&self, node: &str) -> Result<(), LifecycleError> {
        let nodes = self.nodes().await?;
        if nodes.is_empty() {
            return Err(LifecycleError::Unsupported(
                "draining a node: this server runs its sandboxes on its own machine".into(),
            ));
        }
        if nodes.iter().any(|known| known.id == node) {
            Ok(())
        } else {
            Err(LifecycleError::NodeNotFound(node.to_string()))
        }
    }

    async fn node_of(&self, id: &str) -> Result<Option<String>, LifecycleError> {
        let sandbox = id.to_string();
        self.on_runtime(move |runtime| Ok(runtime.node_of(&sandbox)))
            .await
            .map_err(runtime_error("find the node of", id))
    }
}
