//! A node that no server has reached for a while fences itself: it freezes every sandbox it runs.
//!
//! A server declares a node down after [`super::cluster::DOWN_AFTER`] of silence and records its
//! running sandboxes lost; a paused copy of one may then be resumed on another node. A node cut off
//! from its servers (its link down, the servers' machine gone) does not know that, and its sandboxes
//! would run on, next to their new copies. So the node keeps its own clock: every authenticated
//! request (any server's heartbeat, each second) resets it, and after [`FENCE_AFTER`] without one,
//! shorter than the servers' `DOWN_AFTER`, the node freezes each running sandbox (the cgroup
//! freezer: memory and processes kept, no instruction runs) before any server can have given
//! its work to another node.
//!
//! Every hello lists the sandboxes the fence froze. When a server reaches the node again, its
//! reconciler thaws each of them whose row still says running (the node was silent, not declared
//! down) and leaves the others frozen: their rows are lost, and the reconciler destroys them as
//! sandboxes no row names. A sandbox frozen on purpose (paused in memory, mid-fork) is not touched.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_runtime::{Runtime, RuntimeState};

/// How long a node waits without hearing from any server before it freezes its sandboxes. Under
/// the servers' `DOWN_AFTER` (7 s), so the fence is up before any server declares the node down.
pub const FENCE_AFTER: Duration = Duration::from_secs(5);

/// How often the node checks.
const CHECK_EVERY: Duration = Duration::from_millis(500);

#[derive(Default)]
pub struct Fence {
    last_heard: Mutex<Option<Instant>>,
    /// Sandboxes the fence froze and no server has thawed or destroyed yet.
    frozen: Mutex<HashSet<String>>,
}

impl Fence {
    fn frozen(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.frozen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A server reached the node.
    pub fn heard(&self) {
        *self.last_heard.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// The sandboxes the fence holds frozen, sorted.
    pub fn held(&self) -> Vec<String> {
        let mut held: Vec<String> = self.frozen().iter().cloned().collect();
        held.sort();
        held
    }

    /// Sandbox `id` was thawed or destroyed by a server: no longer the fence's.
    pub fn release(&self, id: &str) {
        self.frozen().remove(id);
    }

    /// Freezes every running sandbox when no server has been heard from for `after` (counting
    /// from `started` when none ever was); returns the ones it froze now.
    pub fn check(&self, runtime: &dyn Runtime, started: Instant, after: Duration) -> Vec<String> {
        let since = self
            .last_heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(started);
        if since.elapsed() < after {
            return Vec::new();
        }
        let Ok(sandboxes) = runtime.list() else {
            return Vec::new();
        };
        let mut froze = Vec::new();
        for sandbox in sandboxes {
            if sandbox.state != RuntimeState::Running || self.frozen().contains(&sandbox.id) {
                continue;
            }
            match runtime.freeze(&sandbox.id) {
                Ok(()) => {
                    self.frozen().insert(sandbox.id.clone());
                    froze.push(sandbox.id);
                }
                Err(error) => {
                    tracing::error!(sandbox = %sandbox.id, %error, "cannot freeze a sandbox while no server reaches this node")
                }
            }
        }
        froze
    }
}

/// Checks the fence every [`CHECK_EVERY`] on a thread of its own until the process ends.
pub fn watch(fence: Arc<Fence>, runtime: Arc<dyn Runtime>, after: Duration) {
    let started = Instant::now();
    let spawned = std::thread::Builder::new()
        .name("node-fence".into())
        .spawn(move || loop {
            std::thread::sleep(CHECK_EVERY);
            let froze = fence.check(runtime.as_ref(), started, after);
            if !froze.is_empty() {
                tracing::error!(
                    silent_secs = after.as_secs(),
                    sandboxes = ?froze,
                    "no server has reached this node: its sandboxes are frozen until one does"
                );
            }
        });
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the node's fence: its sandboxes run on when it is cut off");
    }
}
