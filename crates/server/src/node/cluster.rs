//! A [`Runtime`] over several nodes: a new sandbox (create, restore, boot) goes to the node with
//! the largest share of its limits free (`warren node --max-*`: sandboxes, vCPUs, memory, by the
//! scarcest), then the fewest sandboxes, that takes it; every other call goes to the node that
//! holds the sandbox. Each node's load comes with its heartbeat and is counted up by what this
//! server places in between.
//! Which node holds which sandbox is learnt from the nodes themselves (their `list`, at start and
//! whenever a sandbox is not known), never guessed: a node is the truth about what runs on it.
//!
//! A heartbeat asks every node for its hello each [`HEARTBEAT`]; a node silent for [`DOWN_AFTER`]
//! is down: its sandboxes are reported gone (not found, with [`Runtime::gone_reason`] naming the
//! node), so the server's reconciler records them lost, and nothing new is placed there. A node
//! that answers again is up again; what it still runs that the server recorded lost is then
//! untracked, and the reconciler destroys it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use warren_runtime::{
    Capabilities, CheckpointInfo, HostCapacity, NetworkSpec, ProcessInfo, Resources, Runtime,
    RuntimeError, RuntimeErrorKind, Sandbox, SandboxSpec, Stats,
};

use super::remote::{RemoteRuntime, Unreachable};
use super::wire::{NodeLoad, Seen};

/// How often every node is asked whether it is there.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a node may stay silent before it is down (with the heartbeat's own wait, a node that
/// died is down within 10 s).
pub const DOWN_AFTER: Duration = Duration::from_secs(7);
/// How long one heartbeat waits for its answer.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the heartbeat knows of one node.
#[derive(Default)]
struct Health {
    /// Since when the node has not answered, while it does not.
    silent_since: Mutex<Option<(Instant, SystemTime)>>,
    down: AtomicBool,
}

impl Health {
    /// Records a heartbeat's outcome; true when the node answers after having been silent.
    fn heard(&self, answered: bool, url: &str) -> bool {
        let mut silent = self
            .silent_since
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if answered {
            let was_silent = silent.take().is_some();
            if self.down.swap(false, Ordering::SeqCst) {
                tracing::warn!(node = url, "node answers again: up");
            }
            return was_silent;
        }
        let (since, _) = *silent.get_or_insert((Instant::now(), SystemTime::now()));
        if since.elapsed() >= DOWN_AFTER && !self.down.swap(true, Ordering::SeqCst) {
            tracing::error!(
                node = url,
                silent_secs = since.elapsed().as_secs(),
                "node down: its sandboxes are lost"
            );
        }
        false
    }

    fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    fn silent_since(&self) -> Option<SystemTime> {
        self.silent_since
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .map(|(_, at)| at)
    }
}

/// The nodes of one server.
pub struct ClusterRuntime {
    nodes: Arc<Vec<RemoteRuntime>>,
    health: Arc<Vec<Health>>,
    /// Sandbox ID → index in `nodes`.
    placed: Mutex<HashMap<String, usize>>,
    /// Sandbox ID → the node its next start must not go to (a migration's).
    avoid: Mutex<HashMap<String, usize>>,
    /// Each node's load (its last hello's, plus what this server placed since) and the
    /// sandboxes its fence froze (its last hello's).
    seen: Arc<Vec<Mutex<Seen>>>,
}

impl ClusterRuntime {
    /// Over `nodes`, which must not be empty and whose sandbox subnets must differ (the server
    /// reaches every sandbox by its address).
    pub fn new(nodes: Vec<RemoteRuntime>) -> Result<Self, String> {
        if nodes.is_empty() {
            return Err("no node given".into());
        }
        for (i, a) in nodes.iter().enumerate() {
            for b in &nodes[i + 1..] {
                let (a_net, b_net) = (subnet(a), subnet(b));
                if overlaps(a_net, b_net) {
                    return Err(format!(
                        "nodes {} and {} have overlapping sandbox subnets ({}/{} and {}/{}): give each its own --subnet",
                        a.url(),
                        b.url(),
                        a_net.0,
                        a_net.1,
                        b_net.0,
                        b_net.1
                    ));
                }
            }
        }
        let nodes = Arc::new(nodes);
        let health: Arc<Vec<Health>> = Arc::new(nodes.iter().map(|_| Health::default()).collect());
        let seen: Arc<Vec<Mutex<Seen>>> = Arc::new(
            nodes
                .iter()
                .map(|n| Mutex::new(Seen::from(n.hello())))
                .collect(),
        );
        // The heartbeat ends with the runtime: it holds the health only weakly.
        let (beat_nodes, beat_health, beat_seen) = (
            Arc::downgrade(&nodes),
            Arc::downgrade(&health),
            Arc::downgrade(&seen),
        );
        std::thread::Builder::new()
            .name("node-heartbeat".into())
            .spawn(move || loop {
                std::thread::sleep(HEARTBEAT);
                let (Some(nodes), Some(health), Some(seen)) = (
                    beat_nodes.upgrade(),
                    beat_health.upgrade(),
                    beat_seen.upgrade(),
                ) else {
                    return;
                };
                for ((node, health), seen) in nodes.iter().zip(health.iter()).zip(seen.iter()) {
                    let answer = node.answers(HEARTBEAT_TIMEOUT);
                    if health.heard(answer.is_some(), node.url()) {
                        // Its link may have gone down meanwhile, and the kernel drops the routes
                        // through a link that goes down: route to its sandboxes again.
                        if let Err(error) = node.route_to_sandboxes() {
                            tracing::error!(node = node.url(), %error, "cannot route to a returning node's sandboxes");
                        }
                    }
                    if let Some(now) = answer {
                        *seen.lock().unwrap_or_else(|p| p.into_inner()) = now;
                    }
                }
            })
            .map_err(|error| format!("start the node heartbeat: {error}"))?;
        Ok(Self {
            nodes,
            health,
            placed: Mutex::new(HashMap::new()),
            avoid: Mutex::new(HashMap::new()),
            seen,
        })
    }

    fn seen(&self, at: usize) -> std::sync::MutexGuard<'_, Seen> {
        self.seen[at].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn load(&self, at: usize) -> NodeLoad {
        self.seen(at).load
    }

    /// Asks node `at` for its load now (after a start it refused, or a destroy).
    fn refresh_load(&self, at: usize) {
        if let Some(now) = self.nodes[at].answers(HEARTBEAT_TIMEOUT) {
            *self.seen(at) = now;
        }
    }

    /// The nodes a new sandbox may go to (up, not draining, not `avoided`).
    fn candidates(&self, avoided: Option<usize>) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&at| !self.down(at) && !self.load(at).draining && Some(at) != avoided)
            .collect()
    }

    fn index_of(&self, node: &str) -> Result<usize, RuntimeError> {
        self.nodes
            .iter()
            .position(|n| n.id() == node)
            .ok_or_else(|| RuntimeError::NotFound(format!("node {node}")))
    }

    /// Whether node `at` is down (silent for [`DOWN_AFTER`]).
    fn down(&self, at: usize) -> bool {
        self.health[at].is_down()
    }

    fn placed(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.placed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn remember(&self, node: usize, sandboxes: &[Sandbox]) {
        let mut placed = self.placed();
        placed.retain(|_, at| *at != node);
        for sandbox in sandboxes {
            placed.insert(sandbox.id.clone(), node);
        }
    }

    /// The node holding sandbox `id`: as last seen, else asked of every node.
    /// A sandbox of a node that is down is not found: the server records it lost.
    fn node_of(&self, id: &str) -> Result<&RemoteRuntime, RuntimeError> {
        let known = self.placed().get(id).copied();
        let mut silent = None;
        let at = match known {
            Some(at) => Some(at),
            None => {
                for (at, node) in self.nodes.iter().enumerate() {
                    if self.down(at) {
                        continue;
                    }
                    match node.list() {
                        Ok(sandboxes) => self.remember(at, &sandboxes),
                        Err(error) => silent = Some(error),
                    }
                }
                self.placed().get(id).copied()
            }
        };
        match (at, silent) {
            (Some(at), _) if !self.down(at) => Ok(&self.nodes[at]),
            // A node that did not answer (and is not down yet) may hold it: not "gone".
            (None, Some(error)) => Err(error),
            _ => Err(RuntimeError::NotFound(id.to_string())),
        }
    }

    /// Starts sandbox `spec` on the node that takes it best: not full, then the largest free share
    /// in steps of a tenth, then one that already runs a sandbox of the same template (its
    /// layers warm in that node's page cache), then the largest free share exactly, then the
    /// fewest sandboxes. A node that is full (`ResourceExhausted`) or that the call never reached
    /// is passed over for the next. A node the call may have reached without answering is not:
    /// the sandbox could be running there.
    fn place(
        &self,
        spec: &SandboxSpec,
        start: impl Fn(&RemoteRuntime) -> Result<Sandbox, RuntimeError>,
    ) -> Result<Sandbox, RuntimeError> {
        let (id, resources, top_layer) = (&spec.id, &spec.resources, spec.layers.first());
        let avoided = self
            .avoid
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(id);
        let mut order = self.candidates(avoided);
        {
            let placed = self.placed();
            let count = |at: usize| placed.values().filter(|&&node| node == at).count();
            let loads: Vec<NodeLoad> = (0..self.nodes.len()).map(|at| self.load(at)).collect();
            let warm: Vec<bool> = (0..self.nodes.len())
                .map(|at| top_layer.is_some_and(|top| self.seen(at).warm_layers.contains(top)))
                .collect();
            order.sort_by(|&a, &b| {
                let full = |at: usize| {
                    loads[at]
                        .refusal(resources.vcpus, resources.memory_mib)
                        .is_some()
                };
                let tenths = |at: usize| (loads[at].free_share() * 10.0).floor() as i64;
                full(a)
                    .cmp(&full(b))
                    .then(tenths(b).cmp(&tenths(a)))
                    .then(warm[b].cmp(&warm[a]))
                    .then(loads[b].free_share().total_cmp(&loads[a].free_share()))
                    .then(count(a).cmp(&count(b)))
                    .then(a.cmp(&b))
            });
        }
        let mut last = None;
        for at in order {
            match start(&self.nodes[at]) {
                Ok(sandbox) => {
                    self.placed().insert(id.to_string(), at);
                    let mut seen = self.seen(at);
                    seen.load = seen.load.plus(resources.vcpus, resources.memory_mib);
                    if let Some(top) = top_layer {
                        if !seen.warm_layers.contains(top) {
                            seen.warm_layers.push(top.clone());
                        }
                    }
                    return Ok(sandbox);
                }
                Err(error)
                    if error.kind() == RuntimeErrorKind::ResourceExhausted
                        || Unreachable::never_sent(&error) =>
                {
                    tracing::warn!(node = self.nodes[at].url(), %error, "node passed over");
                    self.refresh_load(at);
                    last = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        Err(last.unwrap_or_else(|| RuntimeError::ResourceExhausted {
            context: "no node can take a sandbox: every other node is down or draining".into(),
            source: None,
        }))
    }

    /// Every node's sandboxes, by `each`, but a down node's; fails when a node that is not down
    /// yet does not answer (a sandbox the server cannot see is not a sandbox that is gone, until
    /// its node is declared down).
    fn gather(
        &self,
        each: impl Fn(&RemoteRuntime) -> Result<Vec<Sandbox>, RuntimeError>,
    ) -> Result<Vec<Sandbox>, RuntimeError> {
        let mut all = Vec::new();
        for (at, node) in self.nodes.iter().enumerate() {
            if self.down(at) {
                continue;
            }
            let sandboxes = each(node)?;
            self.remember(at, &sandboxes);
            all.extend(sandboxes);
        }
        Ok(all)
    }

    /// Sandbox `id` no longer runs (destroyed, or checkpointed and ended): what it held on its
    /// node is free again, and the next placement should know at once.
    fn ended(&self, id: &str) {
        let at = self.placed().remove(id);
        if let Some(at) = at {
            self.refresh_load(at);
        }
    }
}

fn subnet(node: &RemoteRuntime) -> (std::net::Ipv4Addr, u8) {
    let hello = node.hello();
    (
        warren_runtime::network::network_address(hello.sandbox_gateway, hello.sandbox_prefix),
        hello.sandbox_prefix,
    )
}

fn overlaps(a: (std::net::Ipv4Addr, u8), b: (std::net::Ipv4Addr, u8)) -> bool {
    let shorter = a.1.min(b.1);
    warren_runtime::network::network_address(a.0, shorter)
        == warren_runtime::network::network_address(b.0, shorter)
}

impl Runtime for ClusterRuntime {
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.nodes[0].capabilities();
        // Checkpoints move between nodes: all of them must take and restore them.
        capabilities.checkpoint = self.nodes.iter().all(|n| n.capabilities().checkpoint);
        capabilities
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        self.place(spec, |node| node.create(spec))
    }

    fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
        let result = self.node_of(id)?.destroy(id);
        if result.is_ok() {
            self.ended(id);
        }
        result
    }

    fn fenced(&self) -> Vec<String> {
        (0..self.nodes.len())
            .filter(|&at| !self.down(at))
            .flat_map(|at| self.seen(at).fenced.clone())
            .collect()
    }

    fn room_for(&self, resources: &Resources) -> Option<String> {
        let candidates = self.candidates(None);
        let mut full = Vec::new();
        for at in candidates {
            match self.load(at).refusal(resources.vcpus, resources.memory_mib) {
                None => return None,
                Some(why) => full.push(format!("{}: {why}", self.nodes[at].id())),
            }
        }
        Some(if full.is_empty() {
            "no node is up and taking sandboxes".to_string()
        } else {
            full.join("; ")
        })
    }

    fn freeze(&self, id: &str) -> Result<(), RuntimeError> {
        self.node_of(id)?.freeze(id)
    }

    fn thaw(&self, id: &str) -> Result<(), RuntimeError> {
        let node = self.node_of(id)?;
        // A sandbox its node's fence froze comes back after the node's link did; the heartbeat
        // routes to the node again within a beat, but the sandbox must be reachable the moment
        // it runs again.
        if let Err(error) = node.route_to_sandboxes() {
            tracing::warn!(node = node.url(), %error, "cannot route to the node's sandboxes");
        }
        node.thaw(id)
    }

    fn stats(&self, id: &str) -> Result<Stats, RuntimeError> {
        self.node_of(id)?.stats(id)
    }

    fn processes(&self, id: &str) -> Result<Vec<ProcessInfo>, RuntimeError> {
        self.node_of(id)?.processes(id)
    }

    fn kill_process(&self, id: &str, pid: u32, signal: i32) -> Result<(), RuntimeError> {
        self.node_of(id)?.kill_process(id, pid, signal)
    }

    fn largest_files(
        &self,
        id: &str,
        count: usize,
    ) -> Result<Vec<warren_runtime::rootfs::disk_usage::LargeFile>, RuntimeError> {
        self.node_of(id)?.largest_files(id, count)
    }

    fn set_network(&self, id: &str, network: &NetworkSpec) -> Result<(), RuntimeError> {
        self.node_of(id)?.set_network(id, network)
    }

    fn egress_trust_anchor(&self, id: &str) -> Option<String> {
        self.node_of(id).ok()?.egress_trust_anchor(id)
    }

    fn check_network(&self, network: &NetworkSpec) -> Result<(), RuntimeError> {
        // Where the sandbox will run is not known yet: it must be fine on every node.
        self.nodes
            .iter()
            .try_for_each(|node| node.check_network(network))
    }

    fn list(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        self.gather(|node| node.list())
    }

    fn recover(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        self.gather(|node| node.recover())
    }

    fn checkpoint(
        &self,
        id: &str,
        dest: &Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let info = self.node_of(id)?.checkpoint(id, dest, leave_running)?;
        if !leave_running {
            self.ended(id);
        }
        Ok(info)
    }

    fn checkpoint_disk(
        &self,
        id: &str,
        dest: &Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let info = self.node_of(id)?.checkpoint_disk(id, dest, leave_running)?;
        if !leave_running {
            self.ended(id);
        }
        Ok(info)
    }

    fn boot_from_disk(
        &self,
        checkpoint: &Path,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, RuntimeError> {
        self.place(spec, |node| node.boot_from_disk(checkpoint, spec))
    }

    fn commit_layer(&self, id: &str, dest: &Path) -> Result<u64, RuntimeError> {
        self.node_of(id)?.commit_layer(id, dest)
    }

    /// The sum over the nodes that answer: admission weighs a request against the whole cluster,
    /// and placement then picks a node with room (a full node passes the create on). A node that
    /// cannot be reached adds nothing; none reachable is an error.
    fn host_capacity(&self) -> Result<HostCapacity, RuntimeError> {
        let mut total = HostCapacity {
            sandbox_tasks: 0,
            disk_free_bytes: 0,
            disk_reserve_bytes: 0,
            disk_promised_bytes: 0,
        };
        let mut last = None;
        let mut answered = false;
        for (at, node) in self.nodes.iter().enumerate() {
            if self.down(at) {
                continue;
            }
            let capacity = match node.host_capacity() {
                Ok(capacity) => capacity,
                Err(error) if Unreachable::never_sent(&error) => {
                    last = Some(error);
                    continue;
                }
                Err(error) => return Err(error),
            };
            answered = true;
            total.sandbox_tasks += capacity.sandbox_tasks;
            total.disk_free_bytes += capacity.disk_free_bytes;
            total.disk_reserve_bytes += capacity.disk_reserve_bytes;
            total.disk_promised_bytes += capacity.disk_promised_bytes;
        }
        match (answered, last) {
            (false, Some(error)) => Err(error),
            _ => Ok(total),
        }
    }

    fn restore(&self, checkpoint: &Path, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        self.place(spec, |node| node.restore(checkpoint, spec))
    }

    fn forget_checkpoint(&self, checkpoint: &Path) {
        for node in self.nodes.iter() {
            node.forget_checkpoint(checkpoint);
        }
    }

    fn network_rules_replaced(&self) -> bool {
        self.nodes.iter().any(|node| node.network_rules_replaced())
    }

    /// A sandbox no node holds has no memory on its way (as on one machine, where a sandbox that
    /// is gone has nothing pending either).
    fn memory_settled(&self, id: &str) -> Result<(), RuntimeError> {
        match self.node_of(id) {
            Ok(node) => node.memory_settled(id),
            Err(RuntimeError::NotFound(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn renew(&self, id: &str, until_unix_ms: u64) -> Result<(), RuntimeError> {
        self.node_of(id)?.renew(id, until_unix_ms)
    }

    fn nodes(&self) -> Vec<warren_runtime::NodeState> {
        let placed = self.placed();
        self.nodes
            .iter()
            .enumerate()
            .map(|(at, node)| warren_runtime::NodeState {
                id: node.id().to_string(),
                url: node.url().to_string(),
                up: !self.down(at),
                draining: self.load(at).draining,
                sandboxes: placed.values().filter(|&&n| n == at).count(),
            })
            .collect()
    }

    fn node_of(&self, id: &str) -> Option<String> {
        let at = *self.placed().get(id)?;
        Some(self.nodes[at].id().to_string())
    }

    fn set_draining(&self, node: &str, draining: bool) -> Result<(), RuntimeError> {
        let at = self.index_of(node)?;
        // The node keeps the mark, so every server sharing it sees it (in its hello) and a
        // restarted node is still drained.
        let load = self.nodes[at].set_draining(draining)?;
        self.seen(at).load = load;
        tracing::info!(node, draining, "node drain set");
        Ok(())
    }

    fn avoid_node(&self, id: &str, node: &str) -> Result<(), RuntimeError> {
        let at = self.index_of(node)?;
        let elsewhere = (0..self.nodes.len())
            .any(|other| other != at && !self.down(other) && !self.load(other).draining);
        if !elsewhere {
            return Err(RuntimeError::ResourceExhausted {
                context: format!(
                    "no node but {node} can take sandbox {id} (the others are down or draining)"
                ),
                source: None,
            });
        }
        self.avoid
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(id.to_string(), at);
        Ok(())
    }

    fn gone_reason(&self, id: &str) -> Option<String> {
        let at = *self.placed().get(id)?;
        if !self.down(at) {
            return None;
        }
        let since = self.health[at]
            .silent_since()
            .and_then(|at| at.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|since| format!(" since {} (Unix seconds)", since.as_secs()))
            .unwrap_or_default();
        Some(format!(
            "its node {} is down: it has not answered{since}",
            self.nodes[at].url()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn subnets_overlap_when_one_holds_the_other() {
        let net = |a, b, c, d, p| (Ipv4Addr::new(a, b, c, d), p);
        assert!(overlaps(net(10, 77, 0, 0, 16), net(10, 77, 0, 0, 16)));
        assert!(overlaps(net(10, 77, 0, 0, 16), net(10, 77, 5, 0, 24)));
        assert!(overlaps(net(10, 0, 0, 0, 8), net(10, 81, 0, 0, 16)));
        assert!(!overlaps(net(10, 81, 0, 0, 16), net(10, 82, 0, 0, 16)));
        assert!(!overlaps(net(10, 77, 0, 0, 24), net(10, 77, 1, 0, 24)));
    }
}
