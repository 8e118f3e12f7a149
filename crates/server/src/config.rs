//! Server configuration: where state lives, where to listen, limits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Default directory of the Debian 12 base root filesystem built by `scripts/setup.d/40-rootfs.sh`.
pub const DEFAULT_BASE_ROOTFS: &str = "/var/cache/warren/rootfs/debian12-base";
/// Default state directory when running as root.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/warren";

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Holds `warren.db` (unless `database_url` is set), `sandboxes/`, `templates/`, `snapshots/`.
    pub state_dir: PathBuf,
    /// A PostgreSQL database to keep the store in instead of `warren.db` (docs/cluster.md).
    pub database_url: Option<crate::store::DatabaseUrl>,
    /// REST API listener (E2B_API_URL). Port 0 picks a free port.
    pub api_listen: SocketAddr,
    /// Sandbox proxy listener (E2B_SANDBOX_URL). Port 0 picks a free port.
    pub proxy_listen: SocketAddr,
    /// Sandboxes are reachable at `<port>-<sandboxID>.<domain>` through the proxy.
    pub domain: String,
    pub limits: Limits,
    /// Resources of the built-in `base` template (and the default of sandboxes).
    pub default_resources: DefaultResources,
    /// Static warren-agent binary to mount into sandboxes. The runtime uses it; the server only passes it
    /// on.
    pub agent_binary: Option<PathBuf>,
    /// Root filesystem of the `base` template.
    pub base_rootfs: PathBuf,
    /// Root filesystem the built-in `code-interpreter` template builds on
    /// (`templates::code_interpreter`). `None` (the library default): no such template; `warren up`
    /// passes `templates::code_interpreter::DEFAULT_ROOTFS` unless told otherwise. A path without a
    /// finished rootfs: the template is not offered and the log says why.
    pub code_interpreter_rootfs: Option<PathBuf>,
    /// How often the scheduler looks for expired sandboxes.
    pub scheduler_interval: Duration,
    /// How often the reconciler compares the store with what runs on the host (see
    /// `lifecycle::reconcile::sweep`).
    pub reconcile_interval: Duration,
    /// Dead man's switch: each reconciler pass renews every live sandbox's supervisor deadline to
    /// this long past its end time (or past now, when that is later). A server that is gone stops
    /// renewing, and its sandboxes end this long after. Must exceed `reconcile_interval`.
    pub supervisor_lease: Duration,
    /// How long to wait for the agent's `/init` after a start or restore.
    pub agent_init_timeout: Duration,
    /// Which snapshots the garbage collector keeps.
    pub snapshot_retention: SnapshotRetention,
    /// Resource sampling and the runaway-process policy (`lifecycle::monitor`).
    pub monitor: MonitorConfig,
    /// How long a failed webhook delivery waits before it is tried again (three retries).
    pub webhook_retry_interval: Duration,
    /// Let the runtime switch the host to expedited RCU grace periods (faster creates; see
    /// `warren_runtime::LinuxRuntimeConfig::expedite_rcu`).
    pub expedite_rcu: bool,
    /// Set `no_new_privs` in every sandbox (`warren_runtime::LinuxRuntimeConfig::no_new_privs`).
    pub no_new_privs: bool,
    /// Restore checkpoints lazily (`warren_runtime::LinuxRuntimeConfig::lazy_restore`).
    pub lazy_restore: bool,
    /// Supervisors started ahead of need
    /// (`warren_runtime::LinuxRuntimeConfig::standby_supervisors`).
    pub standby_supervisors: usize,
    /// DNS servers the egress proxy resolves allowed host names with (empty: the host's
    /// `/etc/resolv.conf`; `warren_runtime::LinuxRuntimeConfig::egress_resolvers`).
    pub egress_resolvers: Vec<SocketAddr>,
    /// CA certificates (PEM files) the egress proxy trusts besides the host's trust store
    /// (`warren_runtime::LinuxRuntimeConfig::egress_upstream_ca`).
    pub egress_upstream_ca: Vec<PathBuf>,
    /// How long a template build may take before it is stopped and fails.
    pub build_timeout: Duration,
    /// Size (MiB) of the writable layer of each build step's sandbox: the most one step may write.
    /// Admission holds all of it against the state disk while the step runs.
    pub build_disk_mib: u64,
    /// Serve the API and the proxy over HTTPS with this certificate (`None`: plain HTTP). The proxy
    /// then also answers as `api.<domain>` (E2B_DOMAIN mode, docs/tls.md).
    pub tls: Option<crate::tls::TlsSource>,
    /// The 32-byte key stored secrets are sealed with (`None`: `<state_dir>/secrets.key`, made at
    /// first start; docs/secrets.md).
    pub secrets_key_file: Option<PathBuf>,
    /// Run sandboxes on these `warren node`s instead of this machine (docs/cluster.md); empty:
    /// on this machine.
    pub nodes: Vec<crate::node::remote::NodeTarget>,
    /// Warm pools: how many sandboxes of each running-state template (by ID or alias) are kept
    /// restored and frozen, ready for the next create (`lifecycle::operations::pool`).
    pub warm_pools: Vec<(String, usize)>,
}

/// What the monitor samples and how it treats runaway processes (docs/operations.md).
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorConfig {
    /// How often every running sandbox's resource use is sampled into the store.
    pub interval: Duration,
    /// How long samples are kept.
    pub retention: Duration,
    /// How long sandbox log lines are kept (and at most this many per sandbox, newest kept).
    pub log_retention: Duration,
    pub log_lines_per_sandbox: u64,
    /// How long lifecycle events are kept (their sandbox's log and the events API lose them then).
    pub event_retention: Duration,
    pub runaway: RunawayPolicy,
    /// An event names a sandbox's largest processes when its memory in use reaches this percent of
    /// its limit (0: never). OOM kills are events whatever this is.
    pub memory_alert_percent: f64,
    /// An event names a sandbox's largest files when its writable layer is this percent full (0:
    /// never).
    pub disk_alert_percent: f64,
    /// End a sandbox idle this long (no proxied request, no command but its start command); `None`:
    /// never, unless the sandbox asks (`policies.idleTimeoutSecs`).
    pub idle_timeout: Option<Duration>,
    /// Kill each sandbox's orphaned processes when it is resumed (a sandbox can ask for its own).
    pub reap_orphans_on_resume: bool,
    /// Kill each running sandbox's orphaned processes this often (`None`: never, unless the sandbox
    /// asks with `policies.reapOrphansEverySecs`).
    pub reap_orphans_every: Option<Duration>,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            interval: Duration::from_secs(5),
            retention: Duration::from_secs(3600),
            log_retention: Duration::from_secs(7 * 24 * 3600),
            log_lines_per_sandbox: 100_000,
            event_retention: Duration::from_secs(30 * 24 * 3600),
            runaway: RunawayPolicy::default(),
            memory_alert_percent: 90.0,
            disk_alert_percent: 90.0,
            idle_timeout: None,
            reap_orphans_on_resume: false,
            reap_orphans_every: None,
        }
    }
}

/// A process that uses at least `cpu_percent` of one core for `after` is a runaway: the monitor
/// records an event naming it and, when `kill` is set, kills it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunawayPolicy {
    /// Percent of one core; 0 turns the policy off.
    pub cpu_percent: f64,
    pub after: Duration,
    pub kill: bool,
}

impl Default for RunawayPolicy {
    fn default() -> Self {
        RunawayPolicy {
            cpu_percent: 90.0,
            after: Duration::from_secs(300),
            kill: false,
        }
    }
}

/// Retention of snapshots (`POST /sandboxes/{id}/snapshots`). Pause checkpoints are never collected: a
/// paused sandbox needs its own to resume.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRetention {
    /// Keep at most this many snapshots per source sandbox (newest first); `None`: no limit.
    pub keep_last_per_sandbox: Option<u32>,
    /// Delete snapshots older than this; `None`: no age limit.
    pub max_age: Option<Duration>,
    /// How often the collector runs.
    pub interval: Duration,
}

impl Default for SnapshotRetention {
    fn default() -> Self {
        SnapshotRetention {
            keep_last_per_sandbox: Some(10),
            max_age: Some(Duration::from_secs(7 * 24 * 3600)),
            interval: Duration::from_secs(60),
        }
    }
}

/// Fleet limits of this node; admission refuses with 429 beyond them.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub max_sandboxes: u32,
    pub max_total_vcpus: f64,
    pub max_total_memory_mib: u64,
    /// Timeout of a sandbox whose request named none.
    pub default_timeout: Duration,
    /// Largest timeout a request may ask for.
    pub max_timeout: Duration,
    /// Size (MiB) of each new volume's filesystem: writes past it fail with ENOSPC inside sandboxes
    /// and 507 through the content API (docs/volumes.md).
    pub volume_size_mib: u64,
    /// Most sandboxes set up or torn down at once (create, restore, boot, destroy); the rest wait
    /// their turn. 0: two per CPU of the host.
    pub setup_concurrency: usize,
    /// How many times over the state disk's space above the reserve may be promised to sandboxes'
    /// writable layers (sparse images that grow as they are written). 1: every layer could fill at
    /// once and the host's disk would still not run out.
    pub disk_overcommit: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DefaultResources {
    pub vcpus: f64,
    pub memory_mib: u64,
    pub disk_mib: u64,
    pub max_pids: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sandboxes: 64,
            max_total_vcpus: 64.0,
            max_total_memory_mib: 16 * 1024,
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            volume_size_mib: 1024,
            setup_concurrency: 0,
            disk_overcommit: 1.0,
        }
    }
}

impl Default for DefaultResources {
    fn default() -> Self {
        DefaultResources {
            vcpus: 2.0,
            memory_mib: 512,
            disk_mib: 2048,
            max_pids: 4096,
        }
    }
}

impl ServerConfig {
    /// Configuration with the documented defaults (API on 127.0.0.1:3000, proxy on 0.0.0.0:3001).
    pub fn new(state_dir: PathBuf) -> Self {
        ServerConfig {
            state_dir,
            database_url: None,
            api_listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
            proxy_listen: SocketAddr::from(([0, 0, 0, 0], 3001)),
            domain: "localhost".to_string(),
            limits: Limits::default(),
            default_resources: DefaultResources::default(),
            agent_binary: None,
            base_rootfs: PathBuf::from(DEFAULT_BASE_ROOTFS),
            code_interpreter_rootfs: None,
            scheduler_interval: Duration::from_secs(1),
            reconcile_interval: Duration::from_secs(30),
            supervisor_lease: Duration::from_secs(600),
            agent_init_timeout: Duration::from_secs(10),
            snapshot_retention: SnapshotRetention::default(),
            monitor: MonitorConfig::default(),
            webhook_retry_interval: Duration::from_secs(10),
            expedite_rcu: true,
            no_new_privs: false,
            lazy_restore: true,
            standby_supervisors: 2,
            egress_resolvers: Vec::new(),
            egress_upstream_ca: Vec::new(),
            build_timeout: Duration::from_secs(3600),
            build_disk_mib: 8192,
            tls: None,
            secrets_key_file: None,
            nodes: Vec::new(),
            warm_pools: Vec::new(),
        }
    }

    pub fn sandboxes_dir(&self) -> PathBuf {
        self.state_dir.join("sandboxes")
    }

    pub fn templates_dir(&self) -> PathBuf {
        self.state_dir.join("templates")
    }

    pub fn snapshots_dir(&self) -> PathBuf {
        self.state_dir.join("snapshots")
    }
}
