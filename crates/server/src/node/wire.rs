//! What a server and a node say to each other: one [`Call`] per [`Runtime`] method, its answer as
//! JSON, and errors that keep what the server decides by (the variant, and whether a full disk
//! caused it).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use warren_runtime::{NetworkSpec, Runtime, RuntimeError, SandboxSpec};

/// The node API's one endpoint; the body is a [`Call`].
pub const CALL_PATH: &str = "/v1/runtime";
/// What a node answers with its version and what it can do; needs the token too.
pub const HELLO_PATH: &str = "/v1/hello";
/// `PUT` `{"draining": true|false}`: keep new sandboxes off the node, or let them on again.
pub const DRAIN_PATH: &str = "/v1/drain";

/// One runtime call, as sent to a node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case", deny_unknown_fields)]
pub enum Call {
    Create {
        spec: SandboxSpec,
    },
    Destroy {
        id: String,
    },
    Freeze {
        id: String,
    },
    Thaw {
        id: String,
    },
    Stats {
        id: String,
    },
    Processes {
        id: String,
    },
    KillProcess {
        id: String,
        pid: u32,
        signal: i32,
    },
    LargestFiles {
        id: String,
        count: usize,
    },
    SetNetwork {
        id: String,
        network: NetworkSpec,
    },
    EgressTrustAnchor {
        id: String,
    },
    CheckNetwork {
        network: NetworkSpec,
    },
    List,
    Recover,
    Checkpoint {
        id: String,
        dest: PathBuf,
        leave_running: bool,
    },
    CheckpointDisk {
        id: String,
        dest: PathBuf,
        leave_running: bool,
    },
    BootFromDisk {
        checkpoint: PathBuf,
        spec: SandboxSpec,
    },
    CommitLayer {
        id: String,
        dest: PathBuf,
    },
    HostCapacity,
    Restore {
        checkpoint: PathBuf,
        spec: SandboxSpec,
    },
    ForgetCheckpoint {
        checkpoint: PathBuf,
    },
    MemorySettled {
        id: String,
    },
    Renew {
        id: String,
        until_unix_ms: u64,
    },
}

fn spec_paths(spec: &SandboxSpec) -> Vec<&std::path::Path> {
    spec.layers
        .iter()
        .map(PathBuf::as_path)
        .chain(spec.volumes.iter().map(|v| v.source.as_path()))
        .collect()
}

impl Call {
    /// Every host path the call names (a template's layers, a checkpoint, a destination), each
    /// with whether the call writes there; the node refuses a call naming one outside the
    /// directories it shares with its server.
    pub fn paths(&self) -> Vec<(&std::path::Path, Access)> {
        fn read(paths: Vec<&std::path::Path>) -> Vec<(&std::path::Path, Access)> {
            paths.into_iter().map(|p| (p, Access::Read)).collect()
        }
        match self {
            Call::Create { spec } => read(spec_paths(spec)),
            Call::Checkpoint { dest, .. }
            | Call::CheckpointDisk { dest, .. }
            | Call::CommitLayer { dest, .. } => vec![(dest.as_path(), Access::Write)],
            Call::BootFromDisk { checkpoint, spec } | Call::Restore { checkpoint, spec } => {
                let mut paths = read(spec_paths(spec));
                paths.push((checkpoint.as_path(), Access::Read));
                paths
            }
            Call::ForgetCheckpoint { checkpoint } => vec![(checkpoint.as_path(), Access::Write)],
            _ => Vec::new(),
        }
    }

    /// Runs the call on `runtime`; the answer as JSON.
    pub fn run(self, runtime: &dyn Runtime) -> Result<serde_json::Value, RuntimeError> {
        fn json<T: Serialize>(value: T) -> Result<serde_json::Value, RuntimeError> {
            serde_json::to_value(value)
                .map_err(|error| RuntimeError::internal("encode a runtime answer", error))
        }
        match self {
            Call::Create { spec } => json(runtime.create(&spec)?),
            Call::Destroy { id } => json(runtime.destroy(&id)?),
            Call::Freeze { id } => json(runtime.freeze(&id)?),
            Call::Thaw { id } => json(runtime.thaw(&id)?),
            Call::Stats { id } => json(runtime.stats(&id)?),
            Call::Processes { id } => json(runtime.processes(&id)?),
            Call::KillProcess { id, pid, signal } => json(runtime.kill_process(&id, pid, signal)?),
            Call::LargestFiles { id, count } => json(runtime.largest_files(&id, count)?),
            Call::SetNetwork { id, network } => json(runtime.set_network(&id, &network)?),
            Call::EgressTrustAnchor { id } => json(runtime.egress_trust_anchor(&id)),
            Call::CheckNetwork { network } => json(runtime.check_network(&network)?),
            Call::List => json(runtime.list()?),
            Call::Recover => json(runtime.recover()?),
            Call::Checkpoint {
                id,
                dest,
                leave_running,
            } => json(runtime.checkpoint(&id, &dest, leave_running)?),
            Call::CheckpointDisk {
                id,
                dest,
                leave_running,
            } => json(runtime.checkpoint_disk(&id, &dest, leave_running)?),
            Call::BootFromDisk { checkpoint, spec } => {
                json(runtime.boot_from_disk(&checkpoint, &spec)?)
            }
            Call::CommitLayer { id, dest } => json(runtime.commit_layer(&id, &dest)?),
            Call::HostCapacity => json(runtime.host_capacity()?),
            Call::Restore { checkpoint, spec } => json(runtime.restore(&checkpoint, &spec)?),
            Call::ForgetCheckpoint { checkpoint } => {
                runtime.forget_checkpoint(&checkpoint);
                json(())
            }
            Call::MemorySettled { id } => json(runtime.memory_settled(&id)?),
            Call::Renew { id, until_unix_ms } => json(runtime.renew(&id, until_unix_ms)?),
        }
    }
}

/// Whether a call reads a path or writes (makes, removes) it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// What a node says of itself ([`HELLO_PATH`]): read once when a server connects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The node's `warren` version; a server talks only to nodes of its own version.
    pub version: String,
    pub capabilities: warren_runtime::Capabilities,
    /// Whether starting the node replaced the host's firewall tables
    /// ([`Runtime::network_rules_replaced`]).
    pub network_rules_replaced: bool,
    /// The directories the node reads and writes for its server (templates, snapshots).
    pub shared_dirs: Vec<PathBuf>,
    /// The node's sandbox subnet (its bridge's gateway address and prefix length): where the
    /// server routes its connections to the node's sandboxes.
    pub sandbox_gateway: std::net::Ipv4Addr,
    pub sandbox_prefix: u8,
    /// What the node's sandboxes hold and its limits, as of this hello.
    #[serde(default)]
    pub load: NodeLoad,
    /// Sandboxes the node froze because no server reached it for a while (`fence.rs`).
    #[serde(default)]
    pub fenced: Vec<String>,
    /// The top layers of the sandboxes it runs (one per template build): their files are in its
    /// page cache, so another sandbox of the same template starts faster there.
    #[serde(default)]
    pub warm_layers: Vec<PathBuf>,
}

/// What a server's heartbeat learns of a node from its hello.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Seen {
    pub load: NodeLoad,
    pub fenced: Vec<String>,
    pub warm_layers: Vec<PathBuf>,
}

impl From<&Hello> for Seen {
    fn from(hello: &Hello) -> Seen {
        Seen {
            load: hello.load,
            fenced: hello.fenced.clone(),
            warm_layers: hello.warm_layers.clone(),
        }
    }
}

/// What a node's sandboxes hold together, and the node's limits (`warren node --max-*`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeLoad {
    pub sandboxes: u32,
    pub vcpus: f64,
    pub memory_mib: u64,
    pub max_sandboxes: u32,
    pub max_vcpus: f64,
    pub max_memory_mib: u64,
    /// Drained (`warren nodes drain`): it takes no new sandbox from any server.
    #[serde(default)]
    pub draining: bool,
}

impl NodeLoad {
    /// Why one more sandbox holding `vcpus` and `memory_mib` would go past a limit; None when it
    /// fits.
    pub fn refusal(&self, vcpus: f64, memory_mib: u64) -> Option<String> {
        if self.draining {
            return Some("draining: it takes no new sandboxes (warren nodes undrain)".into());
        }
        if self.sandboxes >= self.max_sandboxes {
            return Some(format!(
                "{} of {} sandboxes (--max-sandboxes)",
                self.sandboxes, self.max_sandboxes
            ));
        }
        if self.vcpus + vcpus > self.max_vcpus + f64::EPSILON {
            return Some(format!(
                "{} vCPUs held + {vcpus} requested > {} (--max-total-vcpus)",
                self.vcpus, self.max_vcpus
            ));
        }
        if self.memory_mib + memory_mib > self.max_memory_mib {
            return Some(format!(
                "memory {} MiB held + {memory_mib} MiB requested > {} MiB (--max-total-memory-mib)",
                self.memory_mib, self.max_memory_mib
            ));
        }
        None
    }

    /// The share of the node still free, by its scarcest limit (0 full, 1 empty).
    pub fn free_share(&self) -> f64 {
        let free = |held: f64, max: f64| {
            if max <= 0.0 {
                0.0
            } else {
                ((max - held) / max).clamp(0.0, 1.0)
            }
        };
        free(self.sandboxes as f64, self.max_sandboxes as f64)
            .min(free(self.vcpus, self.max_vcpus))
            .min(free(self.memory_mib as f64, self.max_memory_mib as f64))
    }

    /// This load with one more sandbox holding `vcpus` and `memory_mib`.
    pub fn plus(&self, vcpus: f64, memory_mib: u64) -> NodeLoad {
        NodeLoad {
            sandboxes: self.sandboxes + 1,
            vcpus: self.vcpus + vcpus,
            memory_mib: self.memory_mib + memory_mib,
            ..*self
        }
    }
}

/// A [`RuntimeError`] on the wire: its variant and message, and whether a full disk caused it (so
/// the server still answers 507 for one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum WireError {
    NotFound { sandbox: String },
    ProcessNotFound { sandbox: String, pid: u32 },
    AlreadyExists { sandbox: String },
    InvalidSpec { message: String },
    Busy { message: String, out_of_space: bool },
    ResourceExhausted { message: String, out_of_space: bool },
    Unsupported { message: String },
    Internal { message: String, out_of_space: bool },
}

impl From<&RuntimeError> for WireError {
    fn from(error: &RuntimeError) -> Self {
        let out_of_space = error.out_of_space();
        // The whole chain: the node's log has it too, but the server's log is where operators look.
        let message = warren_runtime::error_chain(error);
        match error {
            RuntimeError::NotFound(sandbox) => WireError::NotFound {
                sandbox: sandbox.clone(),
            },
            RuntimeError::ProcessNotFound { sandbox, pid } => WireError::ProcessNotFound {
                sandbox: sandbox.clone(),
                pid: *pid,
            },
            RuntimeError::AlreadyExists(sandbox) => WireError::AlreadyExists {
                sandbox: sandbox.clone(),
            },
            RuntimeError::InvalidSpec(message) => WireError::InvalidSpec {
                message: message.clone(),
            },
            RuntimeError::Busy { .. } => WireError::Busy {
                message,
                out_of_space,
            },
            RuntimeError::ResourceExhausted { .. } => WireError::ResourceExhausted {
                message,
                out_of_space,
            },
            RuntimeError::Unsupported(message) => WireError::Unsupported {
                message: message.clone(),
            },
            RuntimeError::Io { .. } | RuntimeError::Internal { .. } => WireError::Internal {
                message,
                out_of_space,
            },
        }
    }
}

impl From<WireError> for RuntimeError {
    fn from(error: WireError) -> Self {
        // A full disk on the node stays one here: RuntimeError::kind looks for the I/O error.
        let cause = |out_of_space: bool| -> Option<Box<dyn std::error::Error + Send + Sync>> {
            out_of_space.then(|| {
                Box::new(std::io::Error::from(std::io::ErrorKind::StorageFull))
                    as Box<dyn std::error::Error + Send + Sync>
            })
        };
        match error {
            WireError::NotFound { sandbox } => RuntimeError::NotFound(sandbox),
            WireError::ProcessNotFound { sandbox, pid } => {
                RuntimeError::ProcessNotFound { sandbox, pid }
            }
            WireError::AlreadyExists { sandbox } => RuntimeError::AlreadyExists(sandbox),
            WireError::InvalidSpec { message } => RuntimeError::InvalidSpec(message),
            WireError::Busy {
                message,
                out_of_space,
            } => RuntimeError::Busy {
                context: message,
                source: cause(out_of_space),
            },
            WireError::ResourceExhausted {
                message,
                out_of_space,
            } => RuntimeError::ResourceExhausted {
                context: message,
                source: cause(out_of_space),
            },
            WireError::Unsupported { message } => RuntimeError::Unsupported(message),
            WireError::Internal {
                message,
                out_of_space,
            } => RuntimeError::Internal {
                context: message,
                source: cause(out_of_space),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_refuses_past_its_scarcest_limit_and_counts_up() {
        let load = NodeLoad {
            sandboxes: 2,
            vcpus: 3.0,
            memory_mib: 1024,
            max_sandboxes: 8,
            max_vcpus: 4.0,
            max_memory_mib: 4096,
            draining: false,
        };
        assert_eq!(load.refusal(1.0, 512), None);
        assert!(load
            .refusal(1.5, 512)
            .unwrap()
            .contains("--max-total-vcpus"));
        assert!(load
            .refusal(0.5, 3073)
            .unwrap()
            .contains("--max-total-memory-mib"));
        // vCPUs are the scarcest: a quarter free.
        assert!((load.free_share() - 0.25).abs() < 1e-9);
        let more = load.plus(1.0, 512);
        assert_eq!((more.sandboxes, more.memory_mib), (3, 1536));
        assert_eq!(more.free_share(), 0.0);
        let full = NodeLoad {
            sandboxes: 8,
            ..load
        };
        assert!(full.refusal(0.0, 0).unwrap().contains("--max-sandboxes"));
        let drained = NodeLoad {
            draining: true,
            ..load
        };
        assert!(drained.refusal(0.0, 0).unwrap().contains("draining"));
    }

    fn round_trip(error: RuntimeError) -> RuntimeError {
        let wire = WireError::from(&error);
        let text = serde_json::to_string(&wire).unwrap();
        RuntimeError::from(serde_json::from_str::<WireError>(&text).unwrap())
    }

    #[test]
    fn errors_keep_their_kind_and_what_they_name_across_the_wire() {
        let cases = vec![
            RuntimeError::NotFound("abc".into()),
            RuntimeError::ProcessNotFound {
                sandbox: "abc".into(),
                pid: 7,
            },
            RuntimeError::AlreadyExists("abc".into()),
            RuntimeError::InvalidSpec("layers must be absolute".into()),
            RuntimeError::Busy {
                context: "criu cannot seize a task".into(),
                source: None,
            },
            RuntimeError::Unsupported("fork".into()),
            RuntimeError::failed("mount failed"),
        ];
        for error in cases {
            let back = round_trip(RuntimeError::from(WireError::from(&error)));
            assert_eq!(back.kind(), error.kind(), "{error}");
            assert_eq!(back.to_string(), error.to_string());
        }
    }

    #[test]
    fn a_full_disk_on_the_node_is_still_a_full_disk() {
        let error = RuntimeError::Io {
            context: "write the checkpoint".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert!(error.out_of_space());
        let back = round_trip(error);
        assert!(back.out_of_space());
        assert_eq!(
            back.kind(),
            warren_runtime::RuntimeErrorKind::ResourceExhausted
        );
        assert!(back.to_string().contains("write the checkpoint"), "{back}");
    }

    #[test]
    fn calls_name_every_path_they_carry() {
        let call: Call = serde_json::from_value(serde_json::json!({
            "call": "restore",
            "checkpoint": "/srv/shared/snapshots/x",
            "spec": {
                "id": "sb",
                "layers": ["/srv/shared/templates/base/rootfs"],
                "resources": {"vcpus": 1.0, "memory_mib": 512, "disk_mib": 1024, "max_pids": 100},
                "network": {"allow_internet": false, "raw_sockets": false, "egress": {
                    "allow": [], "allow_hosts": [], "deny": [], "header_rules": [], "upstream": null}},
                "syscalls": {},
                "volumes": [{"source": "/mnt/vol", "target": "/data"}]
            }
        }))
        .unwrap();
        let mut paths: Vec<_> = call
            .paths()
            .iter()
            .map(|(p, access)| (p.display().to_string(), *access))
            .collect();
        paths.sort_by(|a, b| a.0.cmp(&b.0));
        let read = |p: &str| (p.to_string(), Access::Read);
        assert_eq!(
            paths,
            [
                read("/mnt/vol"),
                read("/srv/shared/snapshots/x"),
                read("/srv/shared/templates/base/rootfs"),
            ]
        );
        let commit: Call = serde_json::from_value(serde_json::json!({
            "call": "commit_layer", "id": "sb", "dest": "/srv/shared/templates/t/layer"
        }))
        .unwrap();
        assert_eq!(
            commit.paths(),
            [(
                std::path::Path::new("/srv/shared/templates/t/layer"),
                Access::Write
            )]
        );
    }

    #[test]
    fn an_unknown_call_or_field_is_refused() {
        assert!(serde_json::from_str::<Call>(r#"{"call": "format_disk"}"#).is_err());
        assert!(
            serde_json::from_str::<Call>(r#"{"call": "destroy", "id": "a", "force": true}"#)
                .is_err()
        );
    }
}
