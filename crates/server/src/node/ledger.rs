//! What a node's sandboxes hold against the node's own limits (`warren node --max-sandboxes`,
//! `--max-total-vcpus`, `--max-total-memory-mib`). Every server placing sandboxes on the node goes
//! through it, so the node is the one place that can count them all: a start that would go past a
//! limit is refused as `ResourceExhausted` naming the node and the limit (the server then tries
//! another node), and every hello reports the totals, which the servers place new sandboxes by.
//!
//! The ledger is kept in `<state>/node-resources.json` (the node's own file, written atomically), so
//! a restarted node still knows what its running sandboxes hold; each `list` drops what no longer
//! runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use warren_runtime::{RuntimeError, SandboxSpec};

use super::wire::NodeLoad;

/// The node's limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeLimits {
    pub max_sandboxes: u32,
    pub max_vcpus: f64,
    pub max_memory_mib: u64,
}

/// What one sandbox holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Held {
    vcpus: f64,
    memory_mib: u64,
    /// Its top layer (its template build's): what the node has warm in its page cache.
    #[serde(default)]
    top_layer: Option<PathBuf>,
}

pub struct Ledger {
    path: PathBuf,
    /// Present while the node is drained: the mark outlives a restart of the node.
    draining_mark: PathBuf,
    draining: std::sync::atomic::AtomicBool,
    limits: NodeLimits,
    /// The node's name in refusals (`HOST:PORT`).
    name: String,
    held: Mutex<HashMap<String, Held>>,
}

const FILE: &str = "node-resources.json";
const DRAINING_MARK: &str = "node-draining";

impl Ledger {
    /// The ledger of the node whose state directory is `state_dir`; what an earlier run recorded is
    /// read back (an unreadable file is started afresh, with a warning: the next `list` and the
    /// sandboxes' next starts fill it again).
    pub fn open(state_dir: &Path, limits: NodeLimits, name: String) -> Ledger {
        let path = state_dir.join(FILE);
        let held = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|error| {
                tracing::warn!(path = %path.display(), %error, "node resource ledger unreadable; starting afresh");
                HashMap::new()
            }),
            Err(_) => HashMap::new(),
        };
        let draining_mark = state_dir.join(DRAINING_MARK);
        Ledger {
            path,
            draining: std::sync::atomic::AtomicBool::new(draining_mark.exists()),
            draining_mark,
            limits,
            name,
            held: Mutex::new(held),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The totals and the limits, for the hello.
    pub fn load(&self) -> NodeLoad {
        NodeLoad {
            draining: self.draining(),
            ..load_of(&self.held(), self.limits)
        }
    }

    fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Keeps new sandboxes off the node (its mark is kept in the state directory), or lets them
    /// on again.
    pub fn set_draining(&self, draining: bool) -> std::io::Result<()> {
        if draining {
            std::fs::write(&self.draining_mark, b"drained by a server's request\n")?;
        } else {
            match std::fs::remove_file(&self.draining_mark) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
        }
        self.draining
            .store(draining, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// The distinct top layers of the sandboxes held, sorted.
    pub fn warm_layers(&self) -> Vec<PathBuf> {
        let mut layers: Vec<PathBuf> = self
            .held()
            .values()
            .filter_map(|held| held.top_layer.clone())
            .collect();
        layers.sort();
        layers.dedup();
        layers
    }

    /// Holds what sandbox `spec` asks for if the limits allow it (a sandbox already held, being
    /// restored again, counts once).
    pub fn reserve(&self, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        let (id, resources) = (spec.id.as_str(), &spec.resources);
        let mut held = self.held();
        let mut without = held.clone();
        without.remove(id);
        let load = NodeLoad {
            draining: self.draining(),
            ..load_of(&without, self.limits)
        };
        if let Some(why) = load.refusal(resources.vcpus, resources.memory_mib) {
            return Err(RuntimeError::ResourceExhausted {
                context: format!("node {} is full: {why}", self.name),
                source: None,
            });
        }
        held.insert(
            id.to_string(),
            Held {
                vcpus: resources.vcpus,
                memory_mib: resources.memory_mib,
                top_layer: spec.layers.first().cloned(),
            },
        );
        self.save(&held);
        Ok(())
    }

    /// Sandbox `id` holds nothing any more (destroyed, or its start failed).
    pub fn release(&self, id: &str) {
        let mut held = self.held();
        if held.remove(id).is_some() {
            self.save(&held);
        }
    }

    /// Only the sandboxes in `running` hold anything (what the runtime listed).
    pub fn retain<'a>(&self, running: impl IntoIterator<Item = &'a str>) {
        let running: std::collections::HashSet<&str> = running.into_iter().collect();
        let mut held = self.held();
        let before = held.len();
        held.retain(|id, _| running.contains(id.as_str()));
        if held.len() != before {
            self.save(&held);
        }
    }

    fn save(&self, held: &HashMap<String, Held>) {
        let write = || -> std::io::Result<()> {
            let temp = self.path.with_extension("json.tmp");
            std::fs::write(
                &temp,
                serde_json::to_vec(held).map_err(std::io::Error::other)?,
            )?;
            std::fs::rename(&temp, &self.path)
        };
        if let Err(error) = write() {
            tracing::warn!(path = %self.path.display(), %error, "cannot save the node's resource ledger");
        }
    }
}

fn load_of(held: &HashMap<String, Held>, limits: NodeLimits) -> NodeLoad {
    NodeLoad {
        sandboxes: held.len() as u32,
        vcpus: held.values().map(|h| h.vcpus).sum(),
        memory_mib: held.values().map(|h| h.memory_mib).sum(),
        max_sandboxes: limits.max_sandboxes,
        max_vcpus: limits.max_vcpus,
        max_memory_mib: limits.max_memory_mib,
        draining: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, vcpus: f64, memory_mib: u64) -> SandboxSpec {
        SandboxSpec {
            id: id.into(),
            layers: vec![PathBuf::from(format!("/templates/{id}/layer"))],
            resources: warren_runtime::Resources {
                vcpus,
                memory_mib,
                disk_mib: 64,
                max_pids: 64,
            },
            network: Default::default(),
            syscalls: Default::default(),
            volumes: Vec::new(),
        }
    }

    #[test]
    fn a_start_past_a_limit_is_refused_naming_it_and_releases_make_room() {
        let dir = tempfile::tempdir().unwrap();
        let limits = NodeLimits {
            max_sandboxes: 3,
            max_vcpus: 4.0,
            max_memory_mib: 1024,
        };
        let ledger = Ledger::open(dir.path(), limits, "n1:3100".into());
        ledger.reserve(&spec("a", 1.0, 512)).unwrap();
        ledger.reserve(&spec("b", 1.0, 512)).unwrap();
        let refused = ledger.reserve(&spec("c", 1.0, 1)).unwrap_err();
        assert!(
            refused.to_string().contains("node n1:3100 is full")
                && refused.to_string().contains("memory"),
            "{refused}"
        );
        // The same sandbox again (a restore of it) counts once.
        ledger.reserve(&spec("b", 1.0, 512)).unwrap();
        ledger.release("b");
        ledger.reserve(&spec("c", 2.0, 256)).unwrap();
        let refused = ledger.reserve(&spec("d", 1.5, 1)).unwrap_err();
        assert!(refused.to_string().contains("vCPU"), "{refused}");
        ledger.reserve(&spec("d", 1.0, 1)).unwrap();
        let refused = ledger.reserve(&spec("e", 0.0, 0)).unwrap_err();
        assert!(refused.to_string().contains("sandboxes"), "{refused}");
        assert_eq!(
            (ledger.load().sandboxes, ledger.load().memory_mib),
            (3, 769)
        );
        assert_eq!(
            ledger.warm_layers(),
            [
                "/templates/a/layer",
                "/templates/c/layer",
                "/templates/d/layer"
            ]
            .map(PathBuf::from)
        );

        // A restarted node reads it back; a list drops what no longer runs.
        let again = Ledger::open(dir.path(), limits, "n1:3100".into());
        assert_eq!(again.load(), ledger.load());
        again.retain(["a"]);
        assert_eq!((again.load().sandboxes, again.load().vcpus), (1, 1.0));
        let third = Ledger::open(dir.path(), limits, "n1:3100".into());
        assert_eq!(third.load().sandboxes, 1);
    }

    #[test]
    fn a_drained_node_takes_nothing_new_until_undrained_even_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let limits = NodeLimits {
            max_sandboxes: 8,
            max_vcpus: 8.0,
            max_memory_mib: 8192,
        };
        let ledger = Ledger::open(dir.path(), limits, "n1:3100".into());
        ledger.set_draining(true).unwrap();
        assert!(ledger.load().draining);
        let refused = ledger.reserve(&spec("a", 1.0, 64)).unwrap_err();
        assert!(refused.to_string().contains("draining"), "{refused}");
        let restarted = Ledger::open(dir.path(), limits, "n1:3100".into());
        assert!(restarted.load().draining, "the mark outlives a restart");
        restarted.set_draining(false).unwrap();
        restarted.reserve(&spec("a", 1.0, 64)).unwrap();
        assert!(
            !Ledger::open(dir.path(), limits, "n1:3100".into())
                .load()
                .draining
        );
    }
}
