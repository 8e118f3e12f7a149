//! Checkpoints of running sandboxes that outlive a pause: fork (one checkpoint, N new sandboxes restored
//! from it), snapshots (a stored checkpoint that works as a template), their deletion and the garbage
//! collector that applies the retention policy.
//!
//! The source sandbox keeps running through all of this (`leave_running`): its state does not change, so
//! what happened to it is stored as a `running → running` event. A failed dump leaves it as it was.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use rand::distr::{Alphanumeric, SampleString};

use super::now_millis;
use super::operations::{
    new_access_token, new_sandbox_id, remove_snapshot, Lifecycle, LifecycleError, StartSource,
};
use super::state::SandboxState;
use crate::store::{
    ChecksumStatus, Millis, SandboxFilter, SandboxRecord, SnapshotFilter, SnapshotRecord,
};

/// Most forks one request may ask for (E2B's limit).
pub const MAX_FORKS: u32 = 20;
/// Timeout of forks whose request named none (E2B's default).
const DEFAULT_FORK_TIMEOUT_S: i64 = 15;
/// Directory-name prefixes under `snapshots/`: a fork's transient checkpoint and a stored snapshot.
const FORK_DIR_PREFIX: &str = "fork-";
const SNAPSHOT_ID_PREFIX: &str = "snap-";

/// One requested fork: the new sandbox, or why it did not start.
pub type ForkOutcome = Result<SandboxRecord, LifecycleError>;

/// What one garbage-collection pass deleted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GcReport {
    pub deleted: Vec<String>,
    /// Snapshot directories on disk that no row names (left by a crash), removed.
    pub orphans_removed: Vec<PathBuf>,
}

fn random_suffix() -> String {
    Alphanumeric
        .sample_string(&mut rand::rng(), 16)
        .to_ascii_lowercase()
}

/// Whether `dir` holds a complete checkpoint (the runtime writes its manifest last, then renames the
/// directory into place).
pub(crate) fn checkpoint_complete(dir: &Path) -> bool {
    dir.join(warren_runtime::checkpoint::manifest::MANIFEST_FILE)
        .is_file()
}

impl Lifecycle {
    fn require_checkpoints(&self, what: &str) -> Result<(), LifecycleError> {
        if self.capabilities().checkpoint {
            Ok(())
        } else {
            Err(LifecycleError::Unsupported(format!(
                "{what} needs CRIU checkpoints, which this host cannot take"
            )))
        }
    }

    /// Checkpoint running sandbox `record` into `dir`, leaving it running. On failure the partial
    /// directory is removed and an event records the failure; the sandbox's state does not change.
    async fn checkpoint_running(
        &self,
        record: &SandboxRecord,
        dir: &Path,
        purpose: &str,
        memory: bool,
    ) -> Result<u64, LifecycleError> {
        if record.state != SandboxState::Running {
            return Err(LifecycleError::Conflict(format!(
                "sandbox {} is {} and cannot be checkpointed for {purpose} now",
                record.id, record.state
            )));
        }
        let id = record.id.clone();
        let dest = dir.to_path_buf();
        let started = std::time::Instant::now();
        match self
            .on_runtime(move |runtime| match memory {
                true => runtime.checkpoint(&id, &dest, true),
                false => runtime.checkpoint_disk(&id, &dest, true),
            })
            .await
        {
            Ok(info) => {
                tracing::info!(sandbox = %record.id, purpose, bytes = info.size_bytes, seconds = started.elapsed().as_secs_f64(), "checkpointed, left running");
                self.store()
                    .note_sandbox_event(
                        &record.id,
                        record.state,
                        &format!("checkpointed for {purpose} ({} bytes)", info.size_bytes),
                        None,
                        now_millis(),
                    )
                    .await?;
                Ok(info.size_bytes)
            }
            Err(source) => {
                remove_snapshot(dir).await;
                let reason = format!("checkpoint for {purpose} failed, still running: {source}");
                if let Err(error) = self
                    .store()
                    .note_sandbox_event(&record.id, record.state, &reason, None, now_millis())
                    .await
                {
                    tracing::error!(sandbox = %record.id, %error, "cannot record failed checkpoint");
                }
                Err(LifecycleError::Runtime {
                    action: "checkpoint",
                    id: record.id.clone(),
                    source,
                })
            }
        }
    }

    /// Deletes a checkpoint that will not be started again, and first what the runtime cached to
    /// start copies of it (its seeded layer, its unpacked images).
    async fn discard_checkpoint(&self, dir: &std::path::Path) {
        let forgotten = dir.to_path_buf();
        let _ = self
            .on_runtime(move |runtime| {
                runtime.forget_checkpoint(&forgotten);
                Ok(())
            })
            .await;
        remove_snapshot(dir).await;
    }

    /// The layers a sandbox runs on: its template's.
    async fn layers_of(&self, record: &SandboxRecord) -> Result<Vec<PathBuf>, LifecycleError> {
        match self.store().get_template(&record.template_id).await? {
            Some(template) => Ok(template.layers),
            None => Err(LifecycleError::TemplateNotFound(record.template_id.clone())),
        }
    }

    /// `POST /sandboxes/{id}/fork`: checkpoint the running sandbox once (it keeps running, with its ID
    /// and end time) and restore `count` independent sandboxes from that checkpoint. Each fork succeeds
    /// or fails on its own; an error of the whole request means no fork was attempted.
    pub async fn fork(
        &self,
        id: &str,
        count: Option<i64>,
        timeout: Option<i64>,
    ) -> Result<Vec<ForkOutcome>, LifecycleError> {
        let count = match count.unwrap_or(1) {
            n if (1..=i64::from(MAX_FORKS)).contains(&n) => n as usize,
            n => {
                return Err(LifecycleError::BadRequest(format!(
                    "count must be between 1 and {MAX_FORKS}, got {n}"
                )))
            }
        };
        let timeout = self.timeout_millis(Some(timeout.unwrap_or(DEFAULT_FORK_TIMEOUT_S)))?;
        self.require_checkpoints("fork")?;
        let dir = self
            .config()
            .snapshots_dir()
            .join(format!("{FORK_DIR_PREFIX}{}", random_suffix()));
        let source = {
            let (_held, source) = self.lock_live(id).await?;
            self.checkpoint_running(&source, &dir, &format!("fork x{count}"), true)
                .await?;
            source
        };
        let start = match self.layers_of(&source).await {
            Ok(layers) => StartSource {
                template_id: source.template_id.clone(),
                alias: source.alias.clone(),
                layers,
                vcpus: source.vcpus,
                memory_mib: source.memory_mib,
                disk_mib: source.disk_mib,
                checkpoint: Some(dir.clone()),
                boot_from_disk: false,
                agent_token: source.envd_access_token.clone(),
                counts_as_template_spawn: false,
                cold_start: None,
                privileges: Default::default(),
                policies: source.policies.clone(),
                // The fork's record carries the source's environment; its agent keeps the directory.
                defaults: Default::default(),
            },
            Err(error) => {
                remove_snapshot(&dir).await;
                return Err(error);
            }
        };
        let now = now_millis();
        let forks = (0..count).map(|_| {
            let record = SandboxRecord {
                id: new_sandbox_id(),
                state: SandboxState::Creating,
                state_reason: Some(format!("fork of {}", source.id)),
                envd_access_token: source
                    .envd_access_token
                    .as_ref()
                    .map(|_| new_access_token()),
                traffic_access_token: source
                    .traffic_access_token
                    .as_ref()
                    .map(|_| new_access_token()),
                ip: None,
                init_pid: None,
                pause_kind: None,
                snapshot_dir: None,
                started_at: now,
                end_at: now + timeout,
                updated_at: now,
                ..source.clone()
            };
            let start = &start;
            async move { self.admit_and_start(record, start).await }
        });
        let outcomes = futures_util::future::join_all(forks).await;
        // Every fork has its own copy of the layer now; the checkpoint is not needed any more.
        self.discard_checkpoint(&dir).await;
        let started = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
        tracing::info!(sandbox = %source.id, requested = count, started, "forked");
        Ok(outcomes)
    }

    /// `POST /sandboxes/{id}/snapshots`: checkpoint the running sandbox (it keeps running) into a stored
    /// snapshot whose id (or name) works as a `templateID`.
    /// `POST /sandboxes/{id}/snapshots`: a template-like snapshot of the running sandbox, which keeps
    /// running. With `memory` false only its files are kept (no CRIU needed) and sandboxes created
    /// from the snapshot boot fresh over them.
    pub async fn create_snapshot(
        &self,
        id: &str,
        name: Option<String>,
        memory: bool,
    ) -> Result<SnapshotRecord, LifecycleError> {
        if let Some(name) = &name {
            if name.trim().is_empty() || name.len() > 128 || name.contains('/') {
                return Err(LifecycleError::BadRequest(format!(
                    "invalid snapshot name {name:?}: 1 to 128 characters, no '/'"
                )));
            }
        }
        if memory {
            self.require_checkpoints("a snapshot with memory")?;
        }
        let snapshot_id = format!("{SNAPSHOT_ID_PREFIX}{}", random_suffix());
        let dir = self.config().snapshots_dir().join(&snapshot_id);
        let (_held, source) = self.lock_live(id).await?;
        if !source.volumes.is_empty() {
            // A sandbox started from the snapshot would have no volumes to bind where the
            // checkpoint's processes expect them (docs/volumes.md).
            let names: Vec<&str> = source.volumes.iter().map(|v| v.name.as_str()).collect();
            return Err(LifecycleError::BadRequest(format!(
                "sandbox {id} mounts volumes ({}); snapshots of sandboxes with volumes are not supported",
                names.join(", ")
            )));
        }
        let layers = self.layers_of(&source).await?;
        let size_bytes = self
            .checkpoint_running(&source, &dir, &format!("snapshot {snapshot_id}"), memory)
            .await?;
        let record = SnapshotRecord {
            id: snapshot_id,
            team_id: source.team_id.clone(),
            name,
            sandbox_id: source.id.clone(),
            template_id: source.template_id.clone(),
            layers,
            checksum_status: if checkpoint_complete(&dir) {
                ChecksumStatus::Sha256
            } else {
                ChecksumStatus::None
            },
            dir: dir.clone(),
            size_bytes,
            vcpus: source.vcpus,
            memory_mib: source.memory_mib,
            disk_mib: source.disk_mib,
            envd_access_token: source.envd_access_token.clone(),
            created_at: now_millis(),
        };
        if let Err(error) = self.store().insert_snapshot(&record).await {
            remove_snapshot(&dir).await;
            return Err(error.into());
        }
        Ok(record)
    }

    pub async fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
    ) -> Result<Vec<SnapshotRecord>, LifecycleError> {
        Ok(self.store().list_snapshots(filter).await?)
    }

    /// Snapshot directories that live sandboxes need (their pause checkpoints).
    async fn needed_dirs(&self) -> Result<HashSet<PathBuf>, LifecycleError> {
        let live = self
            .store()
            .list_sandboxes(&SandboxFilter {
                states: SandboxState::ALL
                    .into_iter()
                    .filter(|s| !s.is_terminal())
                    .collect(),
                ..SandboxFilter::default()
            })
            .await?;
        Ok(live.into_iter().filter_map(|s| s.snapshot_dir).collect())
    }

    /// Delete a snapshot (by id or name) from the store and the disk. `Ok(false)` when there is none.
    pub async fn delete_snapshot(&self, id_or_name: &str) -> Result<bool, LifecycleError> {
        let Some(snapshot) = self.store().get_snapshot(id_or_name).await? else {
            return Ok(false);
        };
        if self.needed_dirs().await?.contains(&snapshot.dir) {
            return Err(LifecycleError::Conflict(format!(
                "snapshot {} holds a paused sandbox's checkpoint",
                snapshot.id
            )));
        }
        self.store().delete_snapshot(&snapshot.id).await?;
        self.discard_checkpoint(&snapshot.dir).await;
        tracing::info!(snapshot = %snapshot.id, "snapshot deleted");
        Ok(true)
    }

    /// Apply the retention policy at `now`: per source sandbox keep the newest `keep_last_per_sandbox`,
    /// and nothing older than `max_age`. Never deletes a directory a live sandbox needs.
    pub async fn collect_snapshots(&self, now: Millis) -> Result<GcReport, LifecycleError> {
        let retention = self.config().snapshot_retention.clone();
        let all = self
            .store()
            .list_snapshots(&SnapshotFilter::default())
            .await?;
        let needed = self.needed_dirs().await?;
        let mut seen_per_sandbox: HashMap<&str, u32> = HashMap::new();
        let mut expired = Vec::new();
        for snapshot in &all {
            let rank = seen_per_sandbox
                .entry(snapshot.sandbox_id.as_str())
                .or_default();
            *rank += 1;
            let too_many = retention
                .keep_last_per_sandbox
                .is_some_and(|keep| *rank > keep);
            let too_old = retention
                .max_age
                .is_some_and(|age| now - snapshot.created_at > age.as_millis() as Millis);
            if (too_many || too_old) && !needed.contains(&snapshot.dir) {
                expired.push(snapshot.clone());
            }
        }
        let mut report = GcReport::default();
        for snapshot in expired {
            if self.store().delete_snapshot(&snapshot.id).await? {
                self.discard_checkpoint(&snapshot.dir).await;
                report.deleted.push(snapshot.id);
            }
        }
        Ok(report)
    }

    /// At start-up: remove fork checkpoints (no fork survives a restart) and snapshot directories no row
    /// names (a crash between the dump and the insert). Pause checkpoints are named after their sandbox
    /// and are never touched here.
    pub(crate) async fn remove_orphan_snapshot_dirs(&self) -> Result<Vec<PathBuf>, LifecycleError> {
        let root = self.config().snapshots_dir();
        let mut entries = match tokio::fs::read_dir(&root).await {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => {
                tracing::warn!(dir = %root.display(), %error, "cannot list snapshots");
                return Ok(Vec::new());
            }
        };
        let known: HashSet<PathBuf> = self
            .store()
            .list_snapshots(&SnapshotFilter::default())
            .await?
            .into_iter()
            .map(|snapshot| snapshot.dir)
            .collect();
        let mut removed = Vec::new();
        while let Ok(Some(entry)) = entries.next_entry().await {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let orphan = name.starts_with(FORK_DIR_PREFIX)
                || (name.starts_with(SNAPSHOT_ID_PREFIX) && !known.contains(&path));
            if orphan {
                remove_snapshot(&path).await;
                removed.push(path);
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_cannot_collide_with_sandbox_ids() {
        // Sandbox ids are 20 letters and digits, so they never contain '-'; pause checkpoints are named
        // after them and can never be mistaken for fork or snapshot directories.
        let id = new_sandbox_id();
        assert!(!id.contains('-'));
        assert!(format!("{SNAPSHOT_ID_PREFIX}{}", random_suffix()).starts_with("snap-"));
        assert_eq!(random_suffix().len(), 16);
    }

    #[test]
    fn a_directory_without_a_manifest_is_not_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!checkpoint_complete(dir.path()));
        std::fs::write(
            dir.path()
                .join(warren_runtime::checkpoint::manifest::MANIFEST_FILE),
            "{}",
        )
        .unwrap();
        assert!(checkpoint_complete(dir.path()));
    }
}
