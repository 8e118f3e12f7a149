//! Start-up reconciliation: make the store agree with what really runs on this host. Live sandboxes the
//! store knows are adopted, ones it knows that are gone are marked lost (failed), and ones it does not
//! know are destroyed. A pause or resume that a crash cut short is settled from what is on disk and on
//! the host: a complete checkpoint means paused, a tree still running means running, a frozen tree means
//! paused in memory; nothing that could still be resumed is thrown away.
//!
//! The runtime's [`warren_runtime::Runtime::recover`] runs first: it waits for checkpoint dumps the
//! dead server left running, lifts their network lock and reclaims half-created sandboxes, so what
//! is adopted here is reachable. A `running` sandbox found frozen (a fork or snapshot cut short) is
//! thawed; checkpoints never renamed into place (half-written) are removed.
//!
//! While the server runs, [`sweep`] repeats the safe part of this every `reconcile_interval`: a
//! sandbox running on the host that no live row names (its row deleted, or killed but still there) is
//! destroyed once two passes in a row found it so; a running or frozen sandbox whose processes are
//! gone (its supervisor killed, say) is marked failed with the reason `lost`. A sandbox whose lock is
//! held (an operation is under way) is left to the next pass. Build sandboxes (`bld-` IDs) belong to
//! their template build: one a running build works in is left alone, any other is destroyed like an
//! untracked sandbox.

use std::collections::{HashMap, HashSet};

use super::operations::remove_snapshot;
use super::snapshots::checkpoint_complete;
use super::state::SandboxState;
use super::{Lifecycle, LifecycleError};
use crate::store::{PauseKind, Policy, SandboxFilter, SandboxRecord, TransitionUpdate};

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
        .on_runtime(|runtime| runtime.recover())
        .await
        .map_err(|source| LifecycleError::Runtime {
            action: "recover",
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
    for record in tracked {
        let running = live.remove(&record.id);
        adopt_or_settle(lifecycle, record, running, &mut report).await?;
    }
    for id in live.into_keys() {
        // A server that joined meanwhile may have stored it since the list was read.
        let row = lifecycle.store().get_sandbox(&id).await?;
        if row.is_some_and(|row| !row.state.is_terminal()) {
            continue;
        }
        destroy(lifecycle, &id).await;
        report.destroyed.push(id);
    }
    report.orphan_dirs_removed = lifecycle.remove_orphan_snapshot_dirs().await?;
    report
        .orphan_dirs_removed
        .extend(remove_unfinished_checkpoints(&lifecycle.config().snapshots_dir()).await);
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

/// What the runtime runs now, by sandbox ID.
async fn live_sandboxes(
    lifecycle: &Lifecycle,
) -> Result<HashMap<String, warren_runtime::Sandbox>, LifecycleError> {
    Ok(lifecycle
        .on_runtime(|runtime| runtime.list())
        .await
        .map_err(|source| LifecycleError::Runtime {
            action: "list",
            id: "*".to_string(),
            source,
        })?
        .into_iter()
        .map(|sandbox| (sandbox.id.clone(), sandbox))
        .collect())
}

/// A server joining others that share its store and nodes: nothing is settled (the leader does
/// that, and the others' operations are under way), the runtime only learns where each sandbox
/// runs. The report lists the running sandboxes found.
pub async fn join(lifecycle: &Lifecycle) -> Result<ReconcileReport, LifecycleError> {
    let mut adopted: Vec<String> = live_sandboxes(lifecycle).await?.into_keys().collect();
    adopted.sort();
    Ok(ReconcileReport {
        adopted,
        ..ReconcileReport::default()
    })
}

/// Renews the supervisor deadlines of the build and warm-pool sandboxes this server holds (a
/// server that does not lead; the leader's sweep renews every sandbox's).
pub async fn renew_held(lifecycle: &Lifecycle) {
    let now = super::now_millis();
    let lease = lifecycle.config().supervisor_lease.as_millis() as i64;
    let until = now.saturating_add(lease).max(0) as u64;
    let renewals = lifecycle
        .held_without_rows()
        .into_iter()
        .map(|id| (id, until))
        .collect();
    send_renewals(lifecycle, renewals).await;
}

/// Adopts, settles or marks lost one tracked sandbox, from its row and what the runtime runs under
/// its ID (`running`). The start-up reconciliation calls it for every row; the leading server calls
/// it for the rows a dead server left mid-transition ([`take_over`]).
async fn adopt_or_settle(
    lifecycle: &Lifecycle,
    mut record: SandboxRecord,
    running: Option<warren_runtime::Sandbox>,
    report: &mut ReconcileReport,
) -> Result<(), LifecycleError> {
    match (record.state, running) {
        (SandboxState::Paused, None) if record.pause_kind.is_some_and(PauseKind::on_disk) => {
            report.kept_checkpoints.push(record.id.clone());
        }
        (SandboxState::Running, Some(sandbox))
            if sandbox.state == warren_runtime::RuntimeState::Frozen =>
        {
            // Frozen under a running record: a fork, snapshot or layer commit that leaves the
            // sandbox running was cut short. Its memory is whole; let it run on.
            if thaw(lifecycle, &record.id).await {
                adopt(lifecycle, &mut record, &sandbox, report);
            } else {
                let reason = "frozen by a checkpoint a restart cut short, and it would not thaw";
                destroy_and_lose(lifecycle, &mut record, reason, report).await?;
            }
        }
        (SandboxState::Running | SandboxState::Paused, Some(sandbox)) => {
            let frozen = sandbox.state == warren_runtime::RuntimeState::Frozen;
            let consistent = match record.state {
                SandboxState::Running => !frozen,
                _ => frozen && record.pause_kind == Some(PauseKind::Freeze),
            };
            if consistent {
                adopt(lifecycle, &mut record, &sandbox, report);
                lifecycle.reinstall_network(&record).await;
            } else {
                let reason = "state on the host did not match the store";
                destroy_and_lose(lifecycle, &mut record, reason, report).await?;
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
            // Caught mid-transition by a restart (or its server's death): its state is unknown, so
            // do not keep it.
            let reason = "its server stopped during a transition";
            destroy_and_lose(lifecycle, &mut record, reason, report).await?;
        }
        (_, None) => {
            lose(
                lifecycle,
                &mut record,
                "not running after its server stopped",
            )
            .await?;
            report.lost.push(record.id.clone());
        }
    }
    Ok(())
}

/// Settles each of `rows` (sandboxes in `creating`, `pausing` or `resuming`) that nobody is working
/// on, as a restart would: the runtime's list says what runs. A row whose lock this server holds, or
/// that changed since it was read, is left alone.
async fn settle_untended(
    lifecycle: &Lifecycle,
    rows: Vec<SandboxRecord>,
) -> Result<ReconcileReport, LifecycleError> {
    let mut report = ReconcileReport::default();
    if rows.is_empty() {
        return Ok(report);
    }
    let running = live_sandboxes(lifecycle).await?;
    for record in rows {
        let lock = lifecycle.lock_for(&record.id);
        let Ok(_held) = lock.try_lock() else {
            continue;
        };
        // Under the lock, the row as it is now: a live server may have moved it meanwhile.
        let Some(current) = lifecycle.store().get_sandbox(&record.id).await? else {
            continue;
        };
        if current.state != record.state || current.updated_at != record.updated_at {
            continue;
        }
        let running = running.get(&record.id).cloned();
        if let Err(error) = adopt_or_settle(lifecycle, current, running, &mut report).await {
            tracing::warn!(sandbox = %record.id, %error, "cannot settle a sandbox left mid-transition");
        }
    }
    Ok(report)
}

/// This server's own sandboxes left mid-transition: an operation whose last state change failed
/// (the database was away, the disk full) and that let go of the sandbox's lock; settled as a
/// restart would, so no row stays `creating`, `pausing` or `resuming` for good.
pub async fn settle_abandoned(lifecycle: &Lifecycle) -> Result<ReconcileReport, LifecycleError> {
    let rows = lifecycle.store().own_transitions().await?;
    let report = settle_untended(lifecycle, rows).await?;
    if report != ReconcileReport::default() {
        tracing::warn!(
            adopted = ?report.adopted,
            lost = ?report.lost,
            settled = ?report.settled,
            "settled sandboxes this server's operations left mid-transition"
        );
    }
    Ok(report)
}

/// The leading server's part for the servers that died (docs/cluster.md): each sandbox a dead server
/// left in `creating`, `pausing` or `resuming` is settled as a restart of that server would have
/// settled it (from the checkpoint on the shared disk and what the nodes run), and its unfinished
/// builds fail. `live`: the IDs of the servers alive now, this one among them.
pub async fn take_over(
    lifecycle: &Lifecycle,
    live: &[String],
) -> Result<ReconcileReport, LifecycleError> {
    let orphaned = lifecycle.store().orphaned_transitions(live).await?;
    let report = settle_untended(lifecycle, orphaned).await?;
    let failed = lifecycle
        .store()
        .fail_unfinished_builds(
            live,
            "the server running this build stopped before it finished",
            super::now_millis(),
        )
        .await?;
    if report != ReconcileReport::default() || failed > 0 {
        tracing::info!(
            adopted = ?report.adopted,
            lost = ?report.lost,
            settled = ?report.settled,
            failed_builds = failed,
            "took over what dead servers left"
        );
    }
    Ok(report)
}

/// Takes `record` as running at `sandbox`'s address.
fn adopt(
    lifecycle: &Lifecycle,
    record: &mut SandboxRecord,
    sandbox: &warren_runtime::Sandbox,
    report: &mut ReconcileReport,
) {
    record.ip = Some(sandbox.ip);
    record.init_pid = Some(sandbox.init_pid);
    lifecycle.remember_route(record);
    report.adopted.push(record.id.clone());
}

/// Ends what runs of `record` and records it lost for `reason`.
async fn destroy_and_lose(
    lifecycle: &Lifecycle,
    record: &mut SandboxRecord,
    reason: &str,
    report: &mut ReconcileReport,
) -> Result<(), LifecycleError> {
    destroy(lifecycle, &record.id).await;
    lose(lifecycle, record, reason).await?;
    report.lost.push(record.id.clone());
    Ok(())
}

/// Removes the temporary directories of checkpoints a restart cut short (an `AtomicDir` is renamed
/// into place only once complete, so any left is half-written). Runs before the server takes
/// requests, after the runtime's recovery waited for the dumps that were still writing.
async fn remove_unfinished_checkpoints(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut removed = Vec::new();
    let Ok(mut entries) = tokio::fs::read_dir(root).await else {
        return removed;
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let name = entry.file_name().to_string_lossy().into_owned();
        // `.resumed-*`: checkpoints a lazy resume had moved aside until its memory was all in, when
        // the server stopped before it could tell.
        if name.starts_with('.') && (name.contains(".tmp-") || name.starts_with(".resumed-")) {
            let path = entry.path();
            remove_snapshot(&path).await;
            removed.push(path);
        }
    }
    removed
}

async fn thaw(lifecycle: &Lifecycle, id: &str) -> bool {
    let owned = id.to_string();
    match lifecycle
        .on_runtime(move |runtime| runtime.thaw(&owned))
        .await
    {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(sandbox = %id, %error, "cannot thaw during reconciliation");
            false
        }
    }
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
        pause_kind: Some(Some(PauseKind::of_checkpoint(&dir))),
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
            if record.pause_kind.is_some_and(PauseKind::on_disk)
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
                "its server stopped during a transition and nothing resumable is left",
            )
            .await?;
            Ok(false)
        }
    }
}

/// The dead man's switch: every tracked sandbox that runs on the host gets a deadline of its end
/// time (or now, when later) plus `supervisor_lease`, every template-build sandbox and warm-pool
/// member now plus the lease. Failures are logged: a sandbox that just went
/// away is the next pass's business.
async fn renew_deadlines(
    lifecycle: &Lifecycle,
    tracked: &[SandboxRecord],
    live: &HashMap<String, warren_runtime::Sandbox>,
    building: Option<&HashSet<String>>,
    pooled: &HashSet<String>,
) {
    let now = super::now_millis();
    let lease = lifecycle.config().supervisor_lease.as_millis() as i64;
    let mut renewals: Vec<(String, u64)> = tracked
        .iter()
        .filter(|record| live.contains_key(&record.id))
        .map(|record| {
            let until = record.end_at.max(now).saturating_add(lease);
            (record.id.clone(), until.max(0) as u64)
        })
        .collect();
    // Template-build sandboxes live as long as their build does (its timeout bounds it), warm-pool
    // members as long as their pool holds them.
    renewals.extend(
        live.keys()
            .filter(|id| build_in_use(building, id) || pooled.contains(*id))
            .map(|id| (id.clone(), now.saturating_add(lease).max(0) as u64)),
    );
    send_renewals(lifecycle, renewals).await;
}

/// Moves each sandbox's supervisor deadline to its Unix-millisecond `until`; failures are logged
/// (a sandbox that just went away is the next pass's business).
async fn send_renewals(lifecycle: &Lifecycle, renewals: Vec<(String, u64)>) {
    if renewals.is_empty() {
        return;
    }
    let failed = lifecycle
        .on_runtime(move |runtime| {
            Ok(renewals
                .into_iter()
                .filter_map(|(id, until)| runtime.renew(&id, until).err().map(|e| (id, e)))
                .map(|(id, error)| format!("{id}: {error}"))
                .collect::<Vec<_>>())
        })
        .await
        .unwrap_or_default();
    if !failed.is_empty() {
        tracing::warn!(?failed, "cannot renew supervisor deadlines");
    }
}

/// ID prefix of template-build sandboxes, which have no sandbox row.
const BUILD_SANDBOX_PREFIX: &str = "bld-";

/// Whether `id` is a template-build sandbox a running build works in (`building`: the build
/// service's answer; without one, every build sandbox is taken to be in use).
fn build_in_use(building: Option<&HashSet<String>>, id: &str) -> bool {
    id.starts_with(BUILD_SANDBOX_PREFIX) && building.is_none_or(|in_use| in_use.contains(id))
}

/// The row-less sandboxes (builds, warm pools) the other live servers hold; none when this server
/// shares no nodes.
async fn held_by_other_servers(lifecycle: &Lifecycle) -> Result<HashSet<String>, LifecycleError> {
    let store = lifecycle.store();
    if !lifecycle.coordinated() {
        return Ok(HashSet::new());
    }
    let since = super::now_millis() - super::servers::SERVER_LEASE.as_millis() as i64;
    Ok(store
        .live_servers(since)
        .await?
        .into_iter()
        .filter(|server| server.id != store.server_id())
        .flat_map(|server| server.holds)
        .collect())
}

/// Thaws each sandbox a node's fence froze (`node/fence.rs`) whose row still says running: its node
/// was cut off for a while but not declared down. The others stay frozen: their rows are lost, and
/// the sweep destroys them as sandboxes no row names.
async fn thaw_fenced(
    lifecycle: &Lifecycle,
    report: &mut SweepReport,
) -> Result<(), LifecycleError> {
    for id in lifecycle.runtime_handle().fenced() {
        let lock = lifecycle.lock_for(&id);
        let Ok(_held) = lock.try_lock() else {
            continue;
        };
        let running = lifecycle
            .store()
            .get_sandbox(&id)
            .await?
            .is_some_and(|row| row.state == SandboxState::Running);
        if !running {
            continue;
        }
        if thaw(lifecycle, &id).await {
            tracing::warn!(sandbox = %id, "thawed a sandbox its node froze while no server reached it");
            report.thawed.push(id);
        }
    }
    Ok(())
}

/// What one periodic pass fixed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepReport {
    /// Running on the host without a live row, two passes in a row: destroyed.
    pub untracked_destroyed: Vec<String>,
    /// Rows of running or frozen sandboxes whose processes were gone: marked failed.
    pub lost: Vec<String>,
    /// Running sandboxes a node froze while no server reached it, thawed.
    pub thawed: Vec<String>,
}

/// One periodic pass (see the module doc). `suspects` carries the untracked IDs of the previous pass.
pub async fn sweep(
    lifecycle: &Lifecycle,
    suspects: &mut HashSet<String>,
) -> Result<SweepReport, LifecycleError> {
    let live = live_sandboxes(lifecycle).await?;
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
    let tracked_ids: HashSet<&str> = tracked.iter().map(|r| r.id.as_str()).collect();
    let building = lifecycle.build_sandboxes_in_use();
    // Warm-pool members have no row either; the pool holds them. Other servers sharing the nodes
    // publish the build and pool sandboxes they hold.
    let mut pooled = lifecycle.pooled_ids();
    pooled.extend(held_by_other_servers(lifecycle).await?);
    let mut report = SweepReport::default();

    let mut still_suspect = HashSet::new();
    for id in live.keys() {
        // A build sandbox no running build works in (its build thread hung or died) is as
        // untracked as any other.
        if tracked_ids.contains(id.as_str())
            || build_in_use(building.as_ref(), id)
            || pooled.contains(id)
        {
            continue;
        }
        if !suspects.contains(id) {
            still_suspect.insert(id.clone());
            continue;
        }
        // Seen untracked twice; make sure no create inserted its row in between.
        let row = lifecycle.store().get_sandbox(id).await?;
        if row.as_ref().is_some_and(|row| !row.state.is_terminal()) {
            continue;
        }
        destroy(lifecycle, id).await;
        if let Some(row) = row {
            let reason = format!(
                "reconciler destroyed it: still running on the host although {}",
                row.state
            );
            lifecycle
                .store()
                .note_sandbox_event(
                    id,
                    row.state,
                    &reason,
                    Some(Policy::Reconciler),
                    super::now_millis(),
                )
                .await?;
        }
        tracing::warn!(sandbox = %id, "reconciler destroyed a sandbox no live row names");
        lifecycle.metrics().reconciled("untracked_destroyed");
        report.untracked_destroyed.push(id.clone());
    }
    *suspects = still_suspect;

    renew_deadlines(lifecycle, &tracked, &live, building.as_ref(), &pooled).await;
    thaw_fenced(lifecycle, &mut report).await?;

    for record in tracked {
        let holds_processes = match record.state {
            SandboxState::Running => true,
            SandboxState::Paused => record.pause_kind == Some(PauseKind::Freeze),
            _ => false,
        };
        if !holds_processes || live.contains_key(&record.id) {
            continue;
        }
        let lock = lifecycle.lock_for(&record.id);
        let Ok(_held) = lock.try_lock() else {
            continue;
        };
        // Under the lock: the row and the host as they are now.
        let Some(mut record) = lifecycle.store().get_sandbox(&record.id).await? else {
            continue;
        };
        if record.state.is_terminal() {
            continue;
        }
        let id = record.id.clone();
        let gone = matches!(
            lifecycle
                .on_runtime(move |runtime| runtime.stats(&id))
                .await,
            Err(warren_runtime::RuntimeError::NotFound(_))
        );
        if !gone {
            continue;
        }
        // A lazy restore that found a damaged page ended the tree on purpose: the sandbox failed
        // for that reason, with the checkpoint it came from kept (see `retire_snapshot`).
        let id = record.id.clone();
        let restore_failed = lifecycle
            .on_runtime(move |runtime| runtime.memory_settled(&id))
            .await
            .err();
        if let Some(error) = restore_failed {
            let kept = lifecycle.config().snapshots_dir().join(&record.id);
            let kept = crate::lifecycle::snapshots::checkpoint_complete(&kept).then_some(kept);
            lifecycle
                .transition(
                    &mut record,
                    SandboxState::Failed,
                    TransitionUpdate {
                        reason: Some(format!("{error}")),
                        ip: Some(None),
                        init_pid: Some(None),
                        snapshot_dir: kept.map(Some),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
            lifecycle.metrics().reconciled("lost");
            report.lost.push(record.id.clone());
            continue;
        }
        let id = record.id.clone();
        let reason = lifecycle
            .on_runtime(move |runtime| Ok(runtime.gone_reason(&id)))
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                "its processes are gone from the host (found by the periodic reconciler)".into()
            });
        lose(lifecycle, &mut record, &reason).await?;
        lifecycle.metrics().reconciled("lost");
        report.lost.push(record.id.clone());
    }
    if report != SweepReport::default() {
        tracing::info!(untracked_destroyed = ?report.untracked_destroyed, lost = ?report.lost, thawed = ?report.thawed, "periodic reconciliation");
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_sandbox_is_in_use_only_while_a_running_build_names_it() {
        let in_use = HashSet::from(["bld-a-run1".to_string()]);
        assert!(build_in_use(Some(&in_use), "bld-a-run1"));
        assert!(!build_in_use(Some(&in_use), "bld-b-run1"));
        assert!(
            !build_in_use(Some(&in_use), "a-run1"),
            "not a build sandbox"
        );
        assert!(build_in_use(None, "bld-b-run1"), "nobody told: kept");
        assert!(!build_in_use(None, "sandbox1"));
    }
}
