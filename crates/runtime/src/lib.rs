//! The sandbox runtime: create, limit, observe, freeze, checkpoint, restore and destroy sandboxes on one
//! Linux host.
//!
//! The server only sees the [`Runtime`] trait and the plain data types below. The Linux implementation
//! (namespaces + cgroups + overlayfs + seccomp, CRIU for checkpoints) lives in its own modules.
//!
//! Methods are synchronous: they are system calls and short waits. The server calls them from
//! `tokio::task::spawn_blocking`.
//!
//! # The Linux implementation
//!
//! [`LinuxRuntime`] starts one `warren-supervisor` process per sandbox (a binary of this crate; see
//! [`LinuxRuntimeConfig::supervisor_binary`] for how it is found). Module per concern, each with its own
//! error type: [`namespaces`], [`cgroups`] (v1 and v2 behind one interface), [`rootfs`] (overlayfs over
//! the template layers plus a loop-mounted ext4 writable layer, pivot_root, /dev, /proc masking),
//! [`seccomp`], [`capabilities`], [`network`] (bridge, veth, address leases, nftables), [`supervisor`].
//!
//! No user namespace: the sandbox's root is the host's uid 0 with Docker's default capability set (minus
//! CAP_MKNOD and, unless [`NetworkSpec::raw_sockets`] asks for it, CAP_NET_RAW), a seccomp deny list, optionally `no_new_privs`, and a masked /proc, like a default Docker container.
//! A user namespace would need id-mapped (or chowned) template layers, cannot mknod the sandbox's own
//! /dev nodes, and adds the userns to everything CRIU must dump and restore; the isolation tests hold
//! without it.

pub mod checkpoint;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::SystemTime;

pub mod capabilities;
pub mod cgroups;
pub mod config;
pub mod confined;
pub mod crash_recovery;
pub mod gc;
pub mod host_capacity;
mod linux_runtime;
pub mod namespaces;
pub mod network;
pub mod process_table;
pub mod rootfs;
pub mod sandbox_state;
pub mod seccomp;
pub mod supervisor;

pub use config::{ConfigError, LinuxRuntimeConfig};
pub use host_capacity::HostCapacity;
pub use linux_runtime::LinuxRuntime;

/// An error and its causes on one line (`outer: cause: root cause`).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Port on which warren-agent (envd protocol) listens inside every sandbox.
pub const AGENT_PORT: u16 = 49983;

/// Resources a sandbox may use.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Resources {
    /// CPU quota in vCPUs (1.0 = one core's worth of time).
    pub vcpus: f64,
    /// Hard memory limit in MiB.
    pub memory_mib: u64,
    /// Size of the writable runtime layer in MiB.
    pub disk_mib: u64,
    /// Maximum number of tasks (processes + threads).
    pub max_pids: u64,
}

/// Network settings of a sandbox.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct NetworkSpec {
    /// NAT to the host's uplink when true; loopback and the host bridge only when false.
    pub allow_internet: bool,
    /// Keep CAP_NET_RAW (raw and packet sockets: tcpdump, traceroute's raw modes, hand-made
    /// frames). Off by default; `ping` works without it through ICMP datagram sockets. The bridge's
    /// port binding holds either way (docs/network.md), so this widens what a sandbox can send on
    /// its own link, not whom it can impersonate.
    pub raw_sockets: bool,
    /// Destinations allowed and denied by address (only meaningful with `allow_internet`).
    pub egress: network::egress::EgressRules,
}

/// Everything needed to start a sandbox.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SandboxSpec {
    /// Sandbox ID; also the hostname inside.
    pub id: String,
    /// Read-only template layers (directories), top-most first, as overlayfs `lowerdir` orders them; the
    /// last one is a whole root filesystem. Shared by every sandbox of the template; never written.
    pub layers: Vec<PathBuf>,
    pub resources: Resources,
    pub network: NetworkSpec,
    /// Syscalls beyond the default seccomp filter (io_uring); none by default.
    pub syscalls: seccomp::SyscallPolicy,
    /// Volumes to bind into the sandbox (their host mounts must exist); a restore binds them again
    /// in the same order.
    pub volumes: Vec<rootfs::volume_disk::VolumeBind>,
}

/// A sandbox that exists on this host.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sandbox {
    pub id: String,
    /// Address of the sandbox inside the host bridge's private range.
    pub ip: Ipv4Addr,
    /// Host PID of the sandbox's PID 1 (warren-agent).
    pub init_pid: u32,
    pub state: RuntimeState,
    pub created_at: SystemTime,
}

impl Sandbox {
    /// Where the host reaches `port` inside this sandbox.
    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.ip, port))
    }

    /// Where the host reaches the agent.
    pub fn agent_addr(&self) -> SocketAddr {
        self.addr(AGENT_PORT)
    }
}

/// What the host sees of a sandbox, independent of what any server remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RuntimeState {
    Running,
    Frozen,
}

/// Resource usage of a whole sandbox.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    /// Total CPU time used, in microseconds.
    pub cpu_usage_usec: u64,
    /// CPU use over the last sampling window, in percent of one core.
    pub cpu_percent: f64,
    pub memory_bytes: u64,
    pub memory_limit_bytes: u64,
    pub disk_used_bytes: u64,
    pub disk_limit_bytes: u64,
    pub pids: u64,
    /// Tasks the kernel's OOM killer has ended in this sandbox's cgroup since it was made (a restore
    /// makes a new cgroup, so the count starts again).
    pub oom_kills: u64,
    /// Page cache in the sandbox's memory, in bytes.
    pub memory_cache_bytes: u64,
    /// Bytes the sandbox received and sent on its network link since it was started or restored
    /// (a restore makes a new link, so the counts start again).
    pub net_rx_bytes: u64,
    pub net_tx_bytes: u64,
}

/// One process inside a sandbox, with PIDs as the sandbox sees them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    pub user: String,
    pub command: String,
    pub cpu_percent: f64,
    pub rss_bytes: u64,
    pub started_at: SystemTime,
}

/// What this host's runtime can do; the server reports it and picks fallbacks from it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Capabilities {
    pub cgroup_version: u8,
    /// CRIU works here: pause can write memory to disk, templates can start running, fork works.
    pub checkpoint: bool,
}

/// One machine of a runtime spread over several (cluster mode), as the server sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeState {
    /// `HOST:PORT` of the node's API: how operators name it.
    pub id: String,
    pub url: String,
    /// False once it has stayed silent long enough to be declared down.
    pub up: bool,
    /// New sandboxes are kept off it.
    pub draining: bool,
    /// Sandboxes of this server it holds.
    pub sandboxes: usize,
}

/// Where a checkpoint lives and what it holds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointInfo {
    /// Directory holding the CRIU images and the saved runtime layer.
    pub dir: PathBuf,
    pub size_bytes: u64,
}

/// Errors of the runtime, as the server sees them. Each says whose fault it is ([`RuntimeError::kind`]),
/// which is all the server needs to pick a status; the cause stays attached for the log.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("no process {pid} in sandbox {sandbox}")]
    ProcessNotFound { sandbox: String, pid: u32 },
    #[error("sandbox {0} already exists")]
    AlreadyExists(String),
    /// The request is wrong (an id, a spec, a signal, a checkpoint that does not fit): the caller's
    /// to fix.
    #[error("{0}")]
    InvalidSpec(String),
    /// The sandbox cannot do this at the moment (a task CRIU cannot seize); trying again may work.
    #[error("{context}")]
    Busy {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The host ran out of something a sandbox needs (addresses, state disk, tasks).
    #[error("{context}")]
    ResourceExhausted {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    #[error("not supported on this host: {0}")]
    Unsupported(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The runtime failed at something that should have worked; `context` says what it was doing.
    #[error("{context}")]
    Internal {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

/// Whose fault a [`RuntimeError`] is, and so how a server answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeErrorKind {
    /// Bad input: the request must change (HTTP 400).
    InvalidSpec,
    /// The sandbox or process does not exist (404).
    NotFound,
    /// It exists, or is in a state that does not allow this now (409).
    Conflict,
    /// The host is out of a resource (503, or 507 for storage).
    ResourceExhausted,
    /// This host cannot do it at all (501).
    Unsupported,
    /// The runtime's own failure (500).
    Internal,
}

impl RuntimeError {
    /// An internal failure while doing `context`, caused by `source`.
    pub fn internal(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        RuntimeError::Internal {
            context: context.into(),
            source: Some(Box::new(source)),
        }
    }

    /// An internal failure with no underlying error (what went wrong is all in `context`).
    pub fn failed(context: impl Into<String>) -> Self {
        RuntimeError::Internal {
            context: context.into(),
            source: None,
        }
    }

    /// Whose fault this is. An error caused, anywhere in its chain, by a full disk or quota is
    /// [`RuntimeErrorKind::ResourceExhausted`] whatever variant carries it.
    pub fn kind(&self) -> RuntimeErrorKind {
        if self.out_of_space() {
            return RuntimeErrorKind::ResourceExhausted;
        }
        match self {
            RuntimeError::NotFound(_) | RuntimeError::ProcessNotFound { .. } => {
                RuntimeErrorKind::NotFound
            }
            RuntimeError::AlreadyExists(_) | RuntimeError::Busy { .. } => {
                RuntimeErrorKind::Conflict
            }
            RuntimeError::InvalidSpec(_) => RuntimeErrorKind::InvalidSpec,
            RuntimeError::ResourceExhausted { .. } => RuntimeErrorKind::ResourceExhausted,
            RuntimeError::Unsupported(_) => RuntimeErrorKind::Unsupported,
            RuntimeError::Io { .. } | RuntimeError::Internal { .. } => RuntimeErrorKind::Internal,
        }
    }

    /// Whether a full disk or an exceeded quota (ENOSPC, EDQUOT) caused this.
    pub fn out_of_space(&self) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(error) = cause {
            if let Some(io) = error.downcast_ref::<std::io::Error>() {
                let full = matches!(
                    io.kind(),
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
                );
                if full || matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
                    return true;
                }
            }
            cause = error.source();
        }
        false
    }
}

/// The interface the server calls. One implementation per kind of host (Linux namespaces here; a microVM
/// one could sit behind it later).
pub trait Runtime: Send + Sync {
    fn capabilities(&self) -> Capabilities;
    /// Start a fresh sandbox whose PID 1 is warren-agent; returns once the agent's port accepts connections.
    fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError>;
    /// Kill everything, unmount, remove the veth and the cgroup, delete the runtime layer.
    fn destroy(&self, id: &str) -> Result<(), RuntimeError>;
    /// In-memory pause (cgroup freezer).
    fn freeze(&self, id: &str) -> Result<(), RuntimeError>;
    fn thaw(&self, id: &str) -> Result<(), RuntimeError>;
    fn stats(&self, id: &str) -> Result<Stats, RuntimeError>;
    fn processes(&self, id: &str) -> Result<Vec<ProcessInfo>, RuntimeError>;
    /// Send `signal` to process `pid` (as the sandbox numbers it).
    fn kill_process(&self, id: &str, pid: u32, signal: i32) -> Result<(), RuntimeError>;
    /// The `count` largest files the sandbox wrote (its writable layer), largest first, as paths
    /// inside it.
    fn largest_files(
        &self,
        id: &str,
        count: usize,
    ) -> Result<Vec<rootfs::disk_usage::LargeFile>, RuntimeError> {
        let _ = (id, count);
        Err(RuntimeError::Unsupported(
            "listing a sandbox's largest files".into(),
        ))
    }
    /// Replace the internet access and egress rules of a running sandbox, at once and atomically
    /// (`update_network`).
    fn set_network(&self, id: &str, network: &NetworkSpec) -> Result<(), RuntimeError>;
    /// The CA certificate (PEM) sandbox `id` must trust for the header rules of its egress to work
    /// over HTTPS (the egress proxy of the host it runs on signs the hosts' certificates with it);
    /// None where the runtime has no such proxy.
    fn egress_trust_anchor(&self, id: &str) -> Option<String> {
        let _ = id;
        None
    }
    /// Checks what of `network` can only be checked on the host before a new sandbox gets it or a
    /// running one's rules are replaced (a SOCKS5 proxy's address resolves to somewhere sandboxes
    /// may reach): `InvalidSpec` naming the field when not. Restores of a sandbox do not call it.
    fn check_network(&self, _network: &NetworkSpec) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// Sandboxes that exist on this host, whether or not a server remembers them.
    fn list(&self) -> Result<Vec<Sandbox>, RuntimeError>;
    /// Called once at start-up by the sole owner of this runtime's sandboxes (the server), before
    /// anything else: settles what the previous owner's death cut short (a checkpoint's CRIU still
    /// running, the network held locked, a create never finished; see [`crash_recovery`]) and
    /// returns the sandboxes that exist, as [`Runtime::list`] does. A sandbox it returns is reachable
    /// once thawed; it may still be frozen.
    fn recover(&self) -> Result<Vec<Sandbox>, RuntimeError>;
    /// Dump the process tree and the runtime layer into `dest`. With `leave_running` the sandbox keeps
    /// running (fork, template); without, it is gone afterwards (pause).
    fn checkpoint(
        &self,
        id: &str,
        dest: &std::path::Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError>;
    /// Save only the runtime layer into `dest` as a filesystem-only checkpoint (no processes, no CRIU):
    /// a sandbox booted from it starts fresh over the files. With `leave_running` the sandbox keeps
    /// running (snapshots); without, it is gone afterwards (filesystem pause).
    fn checkpoint_disk(
        &self,
        id: &str,
        dest: &std::path::Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let _ = (id, dest, leave_running);
        Err(RuntimeError::Unsupported(
            "filesystem-only checkpoints".into(),
        ))
    }
    /// Start a fresh sandbox (as [`Runtime::create`]) whose runtime layer begins as the one saved in
    /// `checkpoint`, any memory it holds ignored (filesystem resume, `on_resume="reboot"`). The
    /// checkpoint is only read.
    fn boot_from_disk(
        &self,
        checkpoint: &std::path::Path,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, RuntimeError> {
        let _ = (checkpoint, spec);
        Err(RuntimeError::Unsupported(
            "booting a sandbox from a saved filesystem".into(),
        ))
    }
    /// Copy the sandbox's writable layer (overlay upper dir, whiteouts included) to `dest`, which then
    /// serves as a read-only layer of new sandboxes (template builds).
    fn commit_layer(&self, id: &str, dest: &std::path::Path) -> Result<u64, RuntimeError>;
    /// What the sandboxes of this host may still take (tasks, state disk), measured now; admission
    /// compares requests with it.
    fn host_capacity(&self) -> Result<HostCapacity, RuntimeError>;
    /// Restore a checkpoint into fresh namespaces as sandbox `spec.id` (resume, template start, fork).
    fn restore(
        &self,
        checkpoint: &std::path::Path,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, RuntimeError>;
    /// Drops what the runtime cached to start copies of `checkpoint` fast (its unpacked images, its
    /// seeded layer), for a checkpoint that is about to be deleted and started no more (a fork's).
    /// Caches of checkpoints that live on are trimmed by size instead.
    fn forget_checkpoint(&self, checkpoint: &std::path::Path) {
        let _ = checkpoint;
    }
    /// Whether starting this runtime replaced the host's firewall tables (a new ruleset version,
    /// or host networks that changed since they were installed), which drops the egress rules live
    /// sandboxes held there: every sandbox it adopts then needs [`Runtime::set_network`] again.
    fn network_rules_replaced(&self) -> bool {
        false
    }
    /// Waits until the memory of a lazily restored sandbox has all arrived (at once for any other).
    /// An error says the transfer failed: the sandbox's processes were killed before they could run
    /// on a page that did not arrive intact, and the checkpoint it came from is still needed.
    fn memory_settled(&self, id: &str) -> Result<(), RuntimeError> {
        let _ = id;
        Ok(())
    }
    /// Why no machine of the runtime has room for one more sandbox holding `resources` (every
    /// node at its limits), as far as the runtime knows without asking; None when one may have
    /// (always, for one machine: its limits are the server's).
    fn room_for(&self, resources: &Resources) -> Option<String> {
        let _ = resources;
        None
    }
    /// Sandboxes a machine froze on its own because no server reached it for a while (a cluster
    /// node's fence); the server thaws the ones it still owns. Empty for one machine.
    fn fenced(&self) -> Vec<String> {
        Vec::new()
    }
    /// The machines of a runtime spread over several (empty for one machine).
    fn nodes(&self) -> Vec<NodeState> {
        Vec::new()
    }
    /// The node sandbox `id` runs on ([`NodeState::id`]); None on one machine or when no node
    /// holds it.
    fn node_of(&self, id: &str) -> Option<String> {
        let _ = id;
        None
    }
    /// Keeps new sandboxes off `node` while `draining`, or lets them on again.
    fn set_draining(&self, node: &str, draining: bool) -> Result<(), RuntimeError> {
        let _ = (node, draining);
        Err(RuntimeError::Unsupported(
            "draining a node: this server runs its sandboxes on its own machine".into(),
        ))
    }
    /// The next start of sandbox `id` (the restore of a migration) goes anywhere but `node`.
    fn avoid_node(&self, id: &str, node: &str) -> Result<(), RuntimeError> {
        let _ = (id, node);
        Err(RuntimeError::Unsupported(
            "moving a sandbox to another node: this server runs its sandboxes on its own machine"
                .into(),
        ))
    }
    /// Why sandbox `id` is no longer found, when the runtime knows more than that it is gone (a
    /// cluster: its node stopped answering); None otherwise.
    fn gone_reason(&self, id: &str) -> Option<String> {
        let _ = id;
        None
    }
    /// Dead man's switch: the sandbox's supervisor ends it once the clock passes `until_unix_ms`
    /// unless this is called again with a later time. A fresh or restored sandbox starts with
    /// [`supervisor::deadline::INITIAL_LEASE_MS`].
    fn renew(&self, id: &str, until_unix_ms: u64) -> Result<(), RuntimeError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_a_kind() {
        let io = || std::io::Error::from_raw_os_error(libc::EIO);
        let cases = [
            (
                RuntimeError::NotFound("a".into()),
                RuntimeErrorKind::NotFound,
            ),
            (
                RuntimeError::ProcessNotFound {
                    sandbox: "a".into(),
                    pid: 7,
                },
                RuntimeErrorKind::NotFound,
            ),
            (
                RuntimeError::AlreadyExists("a".into()),
                RuntimeErrorKind::Conflict,
            ),
            (
                RuntimeError::Busy {
                    context: "vfork".into(),
                    source: None,
                },
                RuntimeErrorKind::Conflict,
            ),
            (
                RuntimeError::InvalidSpec("bad".into()),
                RuntimeErrorKind::InvalidSpec,
            ),
            (
                RuntimeError::ResourceExhausted {
                    context: "no address".into(),
                    source: None,
                },
                RuntimeErrorKind::ResourceExhausted,
            ),
            (
                RuntimeError::Unsupported("criu".into()),
                RuntimeErrorKind::Unsupported,
            ),
            (
                RuntimeError::Io {
                    context: "read".into(),
                    source: io(),
                },
                RuntimeErrorKind::Internal,
            ),
            (
                RuntimeError::internal("mount", io()),
                RuntimeErrorKind::Internal,
            ),
            (
                RuntimeError::failed("agent exited"),
                RuntimeErrorKind::Internal,
            ),
        ];
        for (error, kind) in cases {
            assert_eq!(error.kind(), kind, "{error:?}");
        }
    }

    #[test]
    fn a_full_disk_anywhere_in_the_chain_is_exhaustion() {
        #[derive(Debug, thiserror::Error)]
        #[error("archive the layer")]
        struct Wrapper(#[source] std::io::Error);
        let full = RuntimeError::internal(
            "checkpoint",
            Wrapper(std::io::Error::from_raw_os_error(libc::ENOSPC)),
        );
        assert_eq!(full.kind(), RuntimeErrorKind::ResourceExhausted);
        let io = RuntimeError::Io {
            context: "write".into(),
            source: std::io::Error::from_raw_os_error(libc::EDQUOT),
        };
        assert_eq!(io.kind(), RuntimeErrorKind::ResourceExhausted);
        let other = RuntimeError::internal("x", std::io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(other.kind(), RuntimeErrorKind::Internal);
    }
}
