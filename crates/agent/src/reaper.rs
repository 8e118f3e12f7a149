//! Child reaping. The agent is PID 1 in a sandbox (and a child subreaper in host mode), so every
//! orphan ends up as its child: one loop collects all exit statuses with `waitpid(-1)` and hands
//! each to whoever spawned that pid; statuses of orphans are simply dropped, so no zombie stays.
//!
//! Spawning goes through [`Reaper::spawn`], which holds the same lock the reaping loop takes
//! around `waitpid`, so a child cannot be reaped before its waiter is registered (nor can the
//! loop steal the status std's `spawn` waits for when `exec` fails).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::sync::oneshot;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Signaled(i32),
}

#[derive(Default)]
pub struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<ExitStatus>>>,
}

impl Reaper {
    /// The process's one reaper: `waitpid(-1)` is process-wide, so two would steal each
    /// other's exit statuses.
    pub fn global() -> Arc<Self> {
        static GLOBAL: std::sync::OnceLock<Arc<Reaper>> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(|| Arc::new(Reaper::default())).clone()
    }

    /// Spawns `command` and registers for its exit status.
    pub fn spawn(
        &self,
        command: &mut std::process::Command,
    ) -> std::io::Result<(std::process::Child, oneshot::Receiver<ExitStatus>)> {
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let child = command.spawn()?;
        let (tx, rx) = oneshot::channel();
        // Child ids are positive and fit i32 (pid_t).
        waiters.insert(child.id() as i32, tx);
        Ok((child, rx))
    }

    /// Collects every exited child now; returns how many were reaped.
    pub fn reap_now(&self) -> usize {
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let mut reaped = 0;
        loop {
            let status = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, ExitStatus::Exited(code)),
                Ok(WaitStatus::Signaled(pid, signal, _)) => {
                    (pid, ExitStatus::Signaled(signal as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            };
            reaped += 1;
            if let Some(tx) = waiters.remove(&status.0.as_raw()) {
                let _ = tx.send(status.1);
            }
        }
        reaped
    }

    /// Reaps on every SIGCHLD (and once a second in case signals were coalesced). Runs forever.
    pub async fn run(self: Arc<Self>) {
        let mut sigchld = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("cannot watch SIGCHLD, polling instead: {e}");
                None
            }
        };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            match sigchld.as_mut() {
                Some(s) => {
                    tokio::select! {
                        _ = s.recv() => {}
                        _ = tick.tick() => {}
                    }
                }
                None => {
                    tick.tick().await;
                }
            }
            self.reap_now();
        }
    }
}

/// Makes this process the reaper of its orphaned descendants (host mode; PID 1 already is).
pub fn become_subreaper() {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) only sets a flag on this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::warn!(
            "PR_SET_CHILD_SUBREAPER failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn exit_statuses_reach_their_spawner() {
        let reaper = Reaper::global();
        let (_child, rx) = reaper
            .spawn(std::process::Command::new("/bin/sh").args(["-c", "exit 3"]))
            .unwrap();
        let (_child2, rx2) = reaper
            .spawn(std::process::Command::new("/bin/sh").args(["-c", "kill -9 $$"]))
            .unwrap();
        let task = tokio::spawn(reaper.clone().run());
        assert_eq!(rx.await.unwrap(), ExitStatus::Exited(3));
        assert_eq!(rx2.await.unwrap(), ExitStatus::Signaled(9));
        task.abort();
    }
}
