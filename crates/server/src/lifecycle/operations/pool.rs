//! Warm pools (`--warm-pool TEMPLATE=N`): sandboxes of a running-state template restored ahead of
//! time and held frozen, so that a create of that template only thaws one instead of restoring its
//! checkpoint. Each member gets its ID, address and hostname when it is restored; everything a
//! create sets on top (environment, access token, timeout, metadata, network rules, the agent's
//! clock) is given at hand-out, as for any restored sandbox, so a pooled sandbox cannot be told from
//! a fresh one.
//!
//! Members have no store row. They are admitted against the node's limits like template-build
//! sandboxes (counted by every admission while they wait, never by a team's quota), the reconciler
//! renews their supervisors' deadlines and leaves them alone, and the server destroys them when it
//! stops; after a crash the next start finds them untracked and destroys them, and their
//! supervisors end them once their lease runs out anyway.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::create::StartSource;
use super::{new_sandbox_id, Lifecycle, LifecycleError};
use crate::lifecycle::admission::Request;
use crate::lifecycle::now_millis;
use crate::lifecycle::state::SandboxState;
use crate::store::{SandboxRecord, DEFAULT_TEAM};

/// How often the pools are topped up even when nothing asked (a template rebuilt, room freed).
const REFILL_INTERVAL: Duration = Duration::from_secs(15);

/// One restored, frozen sandbox waiting for a create.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub sandbox: warren_runtime::Sandbox,
    /// The checkpoint it was restored from; a template rebuilt since has another.
    pub checkpoint: PathBuf,
    /// The network it was restored with (the node's defaults).
    pub network: warren_runtime::NetworkSpec,
    /// Its memory charge once frozen.
    pub memory_bytes: u64,
}

/// The members by template reference (as `--warm-pool` names it), and what wakes the filler.
#[derive(Default)]
pub(crate) struct WarmPools {
    members: Mutex<HashMap<String, Vec<Member>>>,
    refill: tokio::sync::Notify,
}

impl WarmPools {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Member>>> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every member's sandbox ID.
    pub(crate) fn ids(&self) -> HashSet<String> {
        self.lock()
            .values()
            .flatten()
            .map(|m| m.sandbox.id.clone())
            .collect()
    }
}

impl Lifecycle {
    /// The sandboxes the warm pools hold now (no store row; the reconciler leaves them be).
    pub fn pooled_ids(&self) -> HashSet<String> {
        self.pools.ids()
    }

    /// Ask the pool task to top the pools up now (it also does every few seconds by itself).
    pub fn refill_pools(&self) {
        self.pools.refill.notify_one();
    }

    /// A pooled sandbox for a create from `source`, if its template has a pool with one restored
    /// from the same checkpoint, and the create asks nothing a restore would have to do differently
    /// (volumes are mounted when a sandbox is set up).
    pub(super) fn take_pooled(&self, source: &StartSource, volumes: bool) -> Option<Member> {
        let reference = self
            .config
            .warm_pools
            .iter()
            .map(|(reference, _)| reference)
            .find(|r| **r == source.template_id || source.alias.as_ref() == Some(*r))?;
        // Hit or miss, the filler looks again (a miss: the template may be new or rebuilt).
        self.pools.refill.notify_one();
        let checkpoint = source.checkpoint.as_ref()?;
        if volumes
            || source.boot_from_disk
            || source.cold_start.is_some()
            || !source.counts_as_template_spawn
        {
            return None;
        }
        let mut pools = self.pools.lock();
        let members = pools.get_mut(reference)?;
        let at = members.iter().position(|m| &m.checkpoint == checkpoint)?;
        let member = members.remove(at);
        drop(pools);
        self.publish_pool_sizes();
        Some(member)
    }

    /// Top every configured pool up to its size: members of a template's older build go, new ones
    /// are restored until the pool is full or the node has no room.
    pub(crate) async fn fill_pools(&self, stop: &watch::Receiver<bool>) {
        for (reference, size) in self.config.warm_pools.clone() {
            let template = match self.store.get_template(&reference).await {
                Ok(Some(template)) if template.status == "ready" => Some(template),
                Ok(_) => None,
                Err(error) => {
                    tracing::warn!(template = %reference, %error, "warm pool: cannot read the template");
                    continue;
                }
            };
            let source = match &template {
                Some(template) => match self.start_source(&template.team_id, &template.id).await {
                    Ok(source) => Some(source),
                    Err(error) => {
                        tracing::warn!(template = %reference, %error, "warm pool: no start source");
                        None
                    }
                },
                None => None,
            };
            let checkpoint = source
                .as_ref()
                .filter(|source| source.cold_start.is_none())
                .and_then(|source| source.checkpoint.clone());
            if source.is_some() && checkpoint.is_none() {
                tracing::warn!(
                    template = %reference,
                    "warm pool: the template has no running-state checkpoint to restore; no pool"
                );
            }
            // Members of an older build, or of a template gone or being rebuilt, go.
            let stale: Vec<Member> = {
                let mut pools = self.pools.lock();
                let members = pools.entry(reference.clone()).or_default();
                let (keep, stale) = std::mem::take(members)
                    .into_iter()
                    .partition(|m| Some(&m.checkpoint) == checkpoint.as_ref());
                *members = keep;
                stale
            };
            if !stale.is_empty() {
                for member in stale {
                    self.destroy_member(&member.sandbox.id, "its template changed")
                        .await;
                }
                self.publish_pool_sizes();
            }
            let (Some(source), Some(checkpoint)) = (source, checkpoint) else {
                continue;
            };
            // Not cancelled mid-restore (that would leave a member nobody holds): checked between.
            while self.pool_len(&reference) < size && !*stop.borrow() {
                match self.restore_member(&source, &checkpoint).await {
                    Ok(member) => {
                        self.pools
                            .lock()
                            .entry(reference.clone())
                            .or_default()
                            .push(member);
                        self.publish_pool_sizes();
                    }
                    Err(LifecycleError::Quota(refused)) => {
                        tracing::debug!(template = %reference, %refused, "warm pool: no room on the node");
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(template = %reference, %error, "warm pool: cannot restore a member");
                        break;
                    }
                }
            }
        }
    }

    fn pool_len(&self, reference: &str) -> usize {
        self.pools.lock().get(reference).map_or(0, Vec::len)
    }

    fn publish_pool_sizes(&self) {
        let sizes: Vec<(String, usize, u64)> = self
            .pools
            .lock()
            .iter()
            .map(|(template, members)| {
                let memory = members.iter().map(|m| m.memory_bytes).sum();
                (template.clone(), members.len(), memory)
            })
            .collect();
        for (template, size, memory) in sizes {
            self.metrics.warm_pool(&template, size, memory);
        }
    }

    /// Restore one member of `source`'s pool: admitted against the node's limits, restored with the
    /// node's default network, then frozen.
    async fn restore_member(
        &self,
        source: &StartSource,
        checkpoint: &std::path::Path,
    ) -> Result<Member, LifecycleError> {
        let now = now_millis();
        // What the restore needs of a sandbox row; it is never stored.
        let record = SandboxRecord {
            id: new_sandbox_id(),
            team_id: DEFAULT_TEAM.to_string(),
            template_id: source.template_id.clone(),
            alias: None,
            client_id: super::CLIENT_ID.to_string(),
            state: SandboxState::Creating,
            state_reason: None,
            metadata: Default::default(),
            env_vars: Default::default(),
            vcpus: source.vcpus,
            memory_mib: source.memory_mib,
            disk_mib: source.disk_mib,
            auto_pause: false,
            auto_pause_memory: true,
            auto_resume: false,
            allow_internet: None,
            envd_access_token: None,
            traffic_access_token: None,
            egress: Default::default(),
            ingress: Default::default(),
            volumes: Vec::new(),
            policies: Default::default(),
            ip: None,
            init_pid: None,
            pause_kind: None,
            snapshot_dir: None,
            started_at: now,
            end_at: now,
            updated_at: now,
        };
        let request = Request {
            vcpus: record.vcpus,
            memory_mib: record.memory_mib,
            max_pids: self.config.default_resources.max_pids,
            disk_mib: record.disk_mib,
        };
        self.admit_build_sandbox(&record.id, None, request).await?;
        let network = match self.resolved_network_spec(&record).await {
            Ok(network) => network,
            Err(error) => {
                let _ = self.release_build_sandbox(&record.id, "").await;
                return Err(error);
            }
        };
        let mut spec = self.spec_with_layers(&record, source.layers.clone(), network.clone());
        spec.network.raw_sockets = source.privileges.raw_sockets;
        spec.syscalls.allow_io_uring = source.privileges.io_uring;
        let dir = checkpoint.to_path_buf();
        let id = record.id.clone();
        let restored = self
            .on_runtime_setup(move |runtime| {
                let sandbox = runtime.restore(&dir, &spec)?;
                if let Err(error) = runtime.freeze(&sandbox.id) {
                    let _ = runtime.destroy(&sandbox.id);
                    return Err(error);
                }
                let memory = runtime.stats(&sandbox.id).map_or(0, |s| s.memory_bytes);
                Ok((sandbox, memory))
            })
            .await;
        match restored {
            Ok((sandbox, memory_bytes)) => Ok(Member {
                sandbox,
                checkpoint: checkpoint.to_path_buf(),
                network,
                memory_bytes,
            }),
            Err(source) => {
                let _ = self.release_build_sandbox(&id, "").await;
                Err(LifecycleError::Runtime {
                    action: "restore a warm-pool member of",
                    id,
                    source,
                })
            }
        }
    }

    /// Destroy a member that will not be handed out (or was refused at hand-out), and stop counting
    /// it.
    pub(super) async fn destroy_member(&self, id: &str, why: &str) {
        let owned = id.to_string();
        if let Err(error) = self
            .on_runtime_setup(move |runtime| runtime.destroy(&owned))
            .await
        {
            tracing::warn!(sandbox = %id, %error, why, "warm pool: cannot destroy a member");
        }
        let _ = self.release_build_sandbox(id, why).await;
    }

    /// A member taken for a create no longer counts as a pool member: its store row does from now.
    pub(super) async fn member_handed_out(&self, id: &str) {
        let _ = self.release_build_sandbox(id, "").await;
    }

    /// Destroy every member (the server is stopping).
    pub(crate) async fn drain_pools(&self) {
        let members: Vec<Member> = {
            let mut pools = self.pools.lock();
            pools.values_mut().flat_map(std::mem::take).collect()
        };
        for member in members {
            self.destroy_member(&member.sandbox.id, "the server stopped")
                .await;
        }
        self.publish_pool_sizes();
    }
}

/// Keep the pools filled until `shutdown`, then empty them.
pub async fn run(lifecycle: Arc<Lifecycle>, mut shutdown: watch::Receiver<bool>) {
    if lifecycle.config.warm_pools.is_empty() {
        return;
    }
    loop {
        lifecycle.fill_pools(&shutdown).await;
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            _ = lifecycle.pools.refill.notified() => {}
            _ = tokio::time::sleep(REFILL_INTERVAL) => {}
            _ = shutdown.changed() => break,
        }
    }
    lifecycle.drain_pools().await;
}
