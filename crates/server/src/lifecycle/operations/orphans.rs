//! Orphaned processes: what a finished command left running. When a command's process ends, the
//! children it put in the background are adopted by the sandbox's PID 1 (its agent); the agent did
//! not start them for a client, so nobody follows or ends them, and each resume of a sandbox whose
//! commands do this adds more. They are the processes whose parent is PID 1 and that the agent does
//! not list as its own (`process.Process/List`), with everything below them.
//!
//! A template's start command is the agent's own (it is listed); daemons it forked away from itself
//! are orphans by this rule too, which is why reaping is a choice (`policies.reapOrphansOnResume`,
//! `warren sandbox orphans --kill`) and never the default.

use std::collections::HashSet;

use warren_runtime::ProcessInfo;

use super::{Lifecycle, LifecycleError};
use crate::lifecycle::now_millis;
use crate::lifecycle::state::SandboxState;
use crate::store::{Policy, SandboxRecord};
use crate::templates::builder::agent_commands::{EnvdCommands, RunningProcess};

/// The orphans in `processes` (a sandbox's, PIDs as it sees them) given the PIDs its agent `started`:
/// children of PID 1 that are not among them, and all their descendants, in listing order.
pub fn orphan_trees(processes: &[ProcessInfo], started: &HashSet<u32>) -> Vec<ProcessInfo> {
    let mut orphaned: HashSet<u32> = processes
        .iter()
        .filter(|p| p.pid != 1 && p.ppid == 1 && !started.contains(&p.pid))
        .map(|p| p.pid)
        .collect();
    // Descendants, however deep: repeat until no process joins.
    loop {
        let before = orphaned.len();
        for p in processes {
            if orphaned.contains(&p.ppid) {
                orphaned.insert(p.pid);
            }
        }
        if orphaned.len() == before {
            break;
        }
    }
    processes
        .iter()
        .filter(|p| orphaned.contains(&p.pid))
        .cloned()
        .collect()
}

/// `pid "command"` for events and messages, the command cut short.
fn describe(processes: &[ProcessInfo]) -> String {
    processes
        .iter()
        .map(|p| {
            let command: String = p.command.chars().take(60).collect();
            format!("pid {} {command:?}", p.pid)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The processes the agent of `record` runs for its clients (envd's `process.Process/List`).
pub(crate) async fn agent_processes(
    record: &SandboxRecord,
) -> Result<Vec<RunningProcess>, LifecycleError> {
    let id = record.id.clone();
    let Some(ip) = record.ip else {
        return Err(LifecycleError::Conflict(format!(
            "sandbox {id} has no address: its agent cannot be asked for its processes"
        )));
    };
    let addr = std::net::SocketAddr::from((ip, warren_runtime::AGENT_PORT));
    let commands = EnvdCommands::new().with_access_token(record.envd_access_token.clone());
    tokio::task::spawn_blocking(move || commands.running(addr))
        .await
        .map_err(|e| LifecycleError::Conflict(format!("asking the agent of sandbox {id}: {e}")))?
        .map_err(|e| {
            LifecycleError::Conflict(format!(
                "the agent of sandbox {id} did not list its processes: {e}"
            ))
        })
}

impl Lifecycle {
    /// The orphaned processes of a running sandbox.
    pub async fn orphans(&self, id: &str) -> Result<Vec<ProcessInfo>, LifecycleError> {
        let record = self.running_record(id).await?;
        let processes = self.processes(id).await?;
        let started: HashSet<u32> = agent_processes(&record)
            .await?
            .iter()
            .map(|p| p.pid)
            .collect();
        Ok(orphan_trees(&processes, &started))
    }

    /// Kills the orphaned processes of a running sandbox (SIGKILL); returns them. `why` goes into the
    /// sandbox's event when there were any.
    pub async fn reap_orphans(
        &self,
        id: &str,
        why: &str,
    ) -> Result<Vec<ProcessInfo>, LifecycleError> {
        let orphans = self.orphans(id).await?;
        let mut reaped = Vec::new();
        for process in orphans {
            match self.signal_process(id, process.pid, libc::SIGKILL).await {
                Ok(()) => reaped.push(process),
                // Gone already: its parent orphan's death may have taken it along.
                Err(LifecycleError::Runtime { source, .. })
                    if source.kind() == warren_runtime::RuntimeErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        if !reaped.is_empty() {
            let text = format!(
                "reaped {} orphaned process(es) ({why}): {}",
                reaped.len(),
                describe(&reaped)
            );
            tracing::info!(sandbox = %id, "{text}");
            self.metrics()
                .policy_action(Policy::Orphans.as_str(), "reaped");
            self.store()
                .note_sandbox_event(
                    id,
                    SandboxState::Running,
                    &text,
                    Some(Policy::Orphans),
                    now_millis(),
                )
                .await?;
        }
        Ok(reaped)
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn process(pid: u32, ppid: u32, command: &str) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid,
            user: "user".into(),
            command: command.into(),
            cpu_percent: 0.0,
            rss_bytes: 0,
            started_at: UNIX_EPOCH,
        }
    }

    #[test]
    fn orphans_are_adopted_children_the_agent_did_not_start_with_their_descendants() {
        let processes = [
            process(1, 0, "warren-agent"),
            process(10, 1, "bash -l -c serve"),
            process(11, 10, "python3 serve.py"),
            process(20, 1, "orphan-worker"),
            process(21, 20, "orphan-worker child"),
            process(22, 21, "orphan-worker grandchild"),
            process(30, 1, "orphan-worker 2"),
        ];
        let started = HashSet::from([10]);
        let pids: Vec<u32> = orphan_trees(&processes, &started)
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(pids, [20, 21, 22, 30]);
        assert!(orphan_trees(&processes[..3], &started).is_empty());
    }
}
