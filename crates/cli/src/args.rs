//! The command line, as clap types. Parsing only: what each command does lives in `commands/`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use warren_client::types::SandboxState;

/// Default REST API address of a local `warren up`.
pub const DEFAULT_API_URL: &str = "http://127.0.0.1:3000";
/// Default sandbox proxy address of a local `warren up`.
pub const DEFAULT_SANDBOX_URL: &str = "http://127.0.0.1:3001";

const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  error (server error, bad response, local failure)
  2  usage error (bad arguments)
  3  not found (unknown sandbox, template or key)
  4  authentication failed (missing, wrong or revoked API key)
  5  refused: quota reached or conflicting state (HTTP 429 / 409)
  6  cannot reach the server
  `warren sandbox exec` exits with the command's own exit code (128+N when signal N killed it).";

/// Warren: self-hosted sandboxes for AI agents, speaking the E2B API.
#[derive(Debug, Parser)]
#[command(name = "warren", version, after_help = EXIT_CODES_HELP, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Base URL of Warren's REST API.
    #[arg(long, global = true, env = "E2B_API_URL", default_value = DEFAULT_API_URL)]
    pub api_url: String,
    /// Base URL of the sandbox proxy (envd and sandbox ports).
    #[arg(long, global = true, env = "E2B_SANDBOX_URL", default_value = DEFAULT_SANDBOX_URL)]
    pub sandbox_url: String,
    /// API key (also read from WARREN_API_KEY).
    #[arg(long, global = true, env = "E2B_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the Warren server (REST API + sandbox proxy) in the foreground.
    Up(Box<UpArgs>),
    /// Create, inspect and control sandboxes.
    #[command(subcommand, visible_alias = "sbx")]
    Sandbox(SandboxCommand),
    /// List, build and delete templates.
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Manage API keys (acts on the local store directly; needs access to the state directory).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Manage teams: each API key belongs to one and sees only its team's sandboxes (acts on the
    /// local store directly).
    #[command(subcommand)]
    Team(TeamCommand),
    /// Users mapped to their own sandbox: get a user's sandbox, see where they were moved and why.
    #[command(subcommand)]
    Workspace(WorkspaceCommand),
    /// Lifecycle and policy events of the team's sandboxes, newest last (`GET /events/sandboxes`).
    Events(EventsArgs),
    /// Stop the `warren up` running on a state directory (SIGTERM, then wait for it to exit);
    /// with --kill-sandboxes also end every sandbox it started.
    Down(DownArgs),
    /// Run this machine's sandboxes for a server elsewhere (`warren up --node`): the runtime and
    /// its API, no store, no REST API (docs/cluster.md).
    Node(Box<NodeArgs>),
    /// The nodes of a server in cluster mode: list them, drain one (its running sandboxes move to
    /// the others), let one take sandboxes again (admin keys).
    #[command(subcommand)]
    Nodes(NodesCommand),
    /// The servers sharing a cluster's database that are alive now, and which one leads (admin
    /// keys; docs/cluster.md).
    #[command(subcommand)]
    Servers(ServersCommand),
    /// Find and remove what sandboxes of deleted state directories left on this host: their
    /// processes and supervisors, mounts, cgroups and lxcfs mounts (needs root).
    Gc(GcArgs),
    /// A capture-the-flag course in a running sandbox: twelve levels of breaking a sandbox on
    /// purpose and fixing it (docs/lab.md).
    #[command(subcommand)]
    Lab(LabCommand),
}

#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Build the lab template (once), create the lab's sandbox (or resume it) and print its URL.
    Start(LabArgs),
    /// Show each level's state; solved flags are checked against the lab's secret.
    Status(LabArgs),
    /// Judge a level: look at the sandbox through the API and the lab app; when it is solved,
    /// reveal its flag on the level's page (and print it).
    Check {
        /// Level number (1 to 12).
        level: u32,
        /// What the level asks you to report (a sandbox ID, fork results).
        #[arg(long)]
        answer: Option<String>,
        #[command(flatten)]
        lab: LabArgs,
    },
    /// Stop the lab and start a new one from level 1 (new sandbox, new flags).
    Reset(LabArgs),
    /// Kill the lab's sandbox and every sandbox its levels made; the template stays cached.
    Stop(LabArgs),
}

#[derive(Debug, Args, Clone)]
pub struct LabArgs {
    /// Where the host keeps the lab (its sandbox and the secret its flags derive from); default
    /// $XDG_CONFIG_HOME/warren/lab.json, else ~/.config/warren/lab.json.
    #[arg(long, env = "WARREN_LAB_FILE")]
    pub lab_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Only list what would be removed.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct DownArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// Also kill every sandbox of the state directory (running and paused) and template-build
    /// sandboxes, and detach its lxcfs mount, once the server has stopped.
    #[arg(long)]
    pub kill_sandboxes: bool,
    /// The static warren-agent binary (only --kill-sandboxes starts the runtime, which checks it).
    #[arg(long, env = "WARREN_AGENT")]
    pub agent: Option<PathBuf>,
    /// Seconds to wait for the server to exit.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this sandbox's events (killed sandboxes too).
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Only events of this type: created, paused, resumed, updated, killed (repeatable).
    #[arg(long = "type", short = 't')]
    pub types: Vec<String>,
    /// How many of the latest events to show first (at most 100).
    #[arg(long, short = 'n', default_value_t = 20)]
    pub limit: u32,
    /// Keep printing new events as they happen, until interrupted.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(Debug, Subcommand)]
pub enum WorkspaceCommand {
    /// The user's sandbox: created from the workspace's template the first time, resumed when
    /// paused, replaced when it was killed or lost.
    Get {
        user: String,
        /// Template of the workspace (first call only; default `base`).
        #[arg(long)]
        template: Option<String>,
        /// Seconds the sandbox runs from now.
        #[arg(long)]
        timeout: Option<u32>,
    },
    /// Every sandbox the user was given, oldest first, with the reason.
    History { user: String },
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Address of the REST API.
    #[arg(long, default_value = "127.0.0.1:3000")]
    pub listen: String,
    /// Address of the sandbox proxy.
    #[arg(long, default_value = "127.0.0.1:3001")]
    pub proxy_listen: String,
    #[command(flatten)]
    pub state: StateArgs,
    /// Root filesystem of the `base` template.
    #[arg(long, env = "WARREN_BASE_ROOTFS")]
    pub base_rootfs: Option<PathBuf>,
    /// Root filesystem of the built-in `code-interpreter` template (scripts/setup builds it into
    /// /var/cache/warren/rootfs/debian12-code-interpreter); the server builds the template on it at start.
    #[arg(long, env = "WARREN_CODE_INTERPRETER_ROOTFS")]
    pub code_interpreter_rootfs: Option<PathBuf>,
    /// Do not offer the built-in `code-interpreter` template (no build at start, no build sandbox).
    #[arg(long, conflicts_with = "code_interpreter_rootfs")]
    pub no_code_interpreter: bool,
    /// Hostname suffix for `Host: <port>-<id>.<domain>` routing in the proxy.
    #[arg(long, env = "WARREN_DOMAIN")]
    pub domain: Option<String>,
    /// Most sandboxes (running or paused in memory) this node admits at once; more get 429.
    #[arg(long, env = "WARREN_MAX_SANDBOXES")]
    pub max_sandboxes: Option<u32>,
    /// Most vCPUs all running sandboxes of this node may hold together; more get 429.
    #[arg(long, env = "WARREN_MAX_TOTAL_VCPUS")]
    pub max_total_vcpus: Option<f64>,
    /// Most memory (MiB) all running sandboxes of this node may hold together; more get 429.
    #[arg(long, env = "WARREN_MAX_TOTAL_MEMORY_MIB")]
    pub max_total_memory_mib: Option<u64>,
    /// Most sandboxes set up or torn down at once (create, resume, fork, kill); the others wait
    /// their turn, so that commands in running sandboxes keep their speed while many sandboxes come
    /// and go (default 0: two per CPU).
    #[arg(long, env = "WARREN_SETUP_CONCURRENCY")]
    pub setup_concurrency: Option<usize>,
    /// Size (MiB) of each new volume; a volume keeps the size it was made with (default 1024).
    #[arg(long, env = "WARREN_VOLUME_SIZE_MIB")]
    pub volume_size_mib: Option<u64>,
    /// Task limit (pids.max) of each sandbox; admission keeps the sum of all sandboxes' limits under
    /// the host's capacity (kernel pid_max/threads-max less a reserve), refusing more with 429.
    #[arg(long, env = "WARREN_SANDBOX_MAX_PIDS")]
    pub sandbox_max_pids: Option<u64>,
    /// Size (MiB) of the writable layer of `base` sandboxes (and the default of built templates);
    /// admission refuses with 507 when the state disk's free space (less a reserve and what running
    /// sandboxes may still write) cannot hold a sandbox's layer.
    #[arg(long, env = "WARREN_SANDBOX_DISK_MIB")]
    pub sandbox_disk_mib: Option<u64>,
    /// How many times over the state disk's free space (above the reserve) admission may promise
    /// it to sandboxes' writable layers, which are sparse and grow as they are written. 1 (the
    /// default): every sandbox could fill its layer at once and the host's disk would still hold.
    /// Above 1 more sandboxes fit, and sandboxes that do fill their layers together can run the
    /// state disk out of space (docs/security.md).
    #[arg(long, env = "WARREN_DISK_OVERCOMMIT", value_name = "RATIO", value_parser = parse_overcommit)]
    pub disk_overcommit: Option<f64>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// The 32-byte key (raw, or 64 hex digits) stored secrets are sealed with. Default:
    /// <state-dir>/secrets.key, made (mode 0600) at first start. Back it up with the database:
    /// without it stored secrets cannot be read (docs/secrets.md).
    #[arg(long = "secrets-key-file", env = "WARREN_SECRETS_KEY_FILE")]
    pub secrets_key_file: Option<PathBuf>,
    /// Run sandboxes on the `warren node` at this URL (http://HOST:PORT) instead of on this
    /// machine; repeat for more nodes (a new sandbox goes to the one with the fewest). Nodes must
    /// share this server's state directory and template root filesystems at the same paths
    /// (docs/cluster.md); the runtime's own flags then belong to the nodes.
    #[arg(
        long,
        env = "WARREN_NODE",
        value_name = "URL",
        value_delimiter = ',',
        requires = "node_token_file",
        conflicts_with_all = [
            "agent", "keep_rcu_normal", "no_new_privs", "no_lazy_restore",
            "egress_resolvers", "egress_upstream_ca", "standby_supervisors",
        ]
    )]
    pub node: Vec<String>,
    /// CA certificates (PEM) the nodes' certificates must chain to, for `https://` node URLs (a
    /// node started with `--tls` prints where its CA is). Without it, https nodes need
    /// certificates from a public CA.
    #[arg(
        long,
        env = "WARREN_NODE_CA_FILE",
        value_name = "PATH",
        requires = "node"
    )]
    pub node_ca_file: Option<PathBuf>,
    /// The file holding the nodes' token (a node writes it, mode 0600, at first start; give every
    /// node of a server the same file with `warren node --token-file`).
    #[arg(
        long,
        env = "WARREN_NODE_TOKEN_FILE",
        value_name = "PATH",
        requires = "node"
    )]
    pub node_token_file: Option<PathBuf>,
    /// Keep N sandboxes of a running-state template (its ID or alias) restored and frozen, ready
    /// for the next create of it, which then only thaws one and hands it its ID's settings (env,
    /// token, timeout, metadata, network rules); refilled in the background. Repeat for more
    /// templates. Each held sandbox takes its memory and counts in the node's limits.
    #[arg(long = "warm-pool", value_name = "TEMPLATE=N", value_parser = parse_warm_pool)]
    pub warm_pool: Vec<(String, usize)>,
    /// Seconds a template build may take before it is stopped (its sandbox destroyed) and fails
    /// naming the step it was in.
    #[arg(long, env = "WARREN_BUILD_TIMEOUT_SECS", default_value_t = 3600)]
    pub build_timeout_secs: u64,
    /// Size (MiB) of the writable layer of a template build step's sandbox, the most one step may
    /// write; admission holds all of it against the state disk while the step runs.
    #[arg(long, env = "WARREN_BUILD_DISK_MIB", default_value_t = 8192)]
    pub build_disk_mib: u64,
    /// Seconds between two samples of every running sandbox's CPU, memory, disk and tasks (the
    /// series of `GET /sandboxes/{id}/metrics`).
    #[arg(long, env = "WARREN_METRICS_INTERVAL_SECS", default_value_t = 5)]
    pub metrics_interval_secs: u64,
    /// Seconds a sample is kept.
    #[arg(long, env = "WARREN_METRICS_RETENTION_SECS", default_value_t = 3600)]
    pub metrics_retention_secs: u64,
    /// Seconds a line of a sandbox's log (what its commands printed, `GET /sandboxes/{id}/logs`)
    /// is kept, ended sandboxes' too.
    #[arg(long, env = "WARREN_LOG_RETENTION_SECS", default_value_t = 7 * 24 * 3600)]
    pub log_retention_secs: u64,
    /// Most log lines kept per sandbox (its oldest go first).
    #[arg(long, env = "WARREN_LOG_LINES_PER_SANDBOX", default_value_t = 100_000)]
    pub log_lines_per_sandbox: u64,
    /// Seconds a lifecycle event (`GET /events/sandboxes`, the sandbox's log) is kept.
    #[arg(long, env = "WARREN_EVENT_RETENTION_SECS", default_value_t = 30 * 24 * 3600)]
    pub event_retention_secs: u64,
    /// A process using at least this percent of one core for --runaway-secs is a runaway: an event
    /// on its sandbox names it (0 turns the policy off).
    #[arg(long, env = "WARREN_RUNAWAY_CPU_PERCENT", default_value_t = 90.0)]
    pub runaway_cpu_percent: f64,
    /// Seconds a process must stay above --runaway-cpu-percent to be a runaway.
    #[arg(long, env = "WARREN_RUNAWAY_SECS", default_value_t = 300)]
    pub runaway_secs: u64,
    /// Kill runaway processes (SIGKILL) besides reporting them.
    #[arg(long, env = "WARREN_RUNAWAY_KILL")]
    pub runaway_kill: bool,
    /// An event names a sandbox's largest processes when its memory in use reaches this percent of
    /// its limit (0: never). OOM kills are events regardless.
    #[arg(long, env = "WARREN_MEMORY_ALERT_PERCENT", default_value_t = 90.0)]
    pub memory_alert_percent: f64,
    /// An event names a sandbox's largest files when its disk is this percent full (0: never).
    #[arg(long, env = "WARREN_DISK_ALERT_PERCENT", default_value_t = 90.0)]
    pub disk_alert_percent: f64,
    /// End sandboxes idle this many seconds (no request through the proxy, no command running but
    /// the template's start command): pause with autoPause, else kill. 0: never (a sandbox can ask
    /// for its own with `policies.idleTimeoutSecs`).
    #[arg(long, env = "WARREN_IDLE_TIMEOUT_SECS", default_value_t = 0)]
    pub idle_timeout_secs: u64,
    /// Seconds a failed webhook delivery waits before each of its three retries.
    #[arg(long, env = "WARREN_WEBHOOK_RETRY_SECS", default_value_t = 10)]
    pub webhook_retry_secs: u64,
    /// Kill a sandbox's orphaned processes (what its finished commands left running) each time it is
    /// resumed (a sandbox can ask for its own with `policies.reapOrphansOnResume`).
    #[arg(long, env = "WARREN_REAP_ORPHANS_ON_RESUME")]
    pub reap_orphans_on_resume: bool,
    /// Kill every running sandbox's orphaned processes every SECONDS (0: never; a sandbox can ask
    /// for its own period with `policies.reapOrphansEverySecs`).
    #[arg(long, env = "WARREN_REAP_ORPHANS_EVERY_SECS", default_value_t = 0)]
    pub reap_orphans_every_secs: u64,
    /// Serve the API and the proxy over HTTPS with a certificate signed by a local CA Warren makes
    /// once in the state dir (tls/ca.crt; clients trust that file). With TLS the proxy's port also
    /// answers as `api.<domain>`: E2B_DOMAIN mode (docs/tls.md).
    #[arg(long, env = "WARREN_TLS", conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls: bool,
    /// Serve HTTPS with this certificate chain (PEM), e.g. one for `*.<domain>` and `api.<domain>`.
    #[arg(long, env = "WARREN_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "WARREN_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ServersCommand {
    /// List the live servers, oldest first.
    #[command(visible_alias = "ls")]
    List,
}

#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// List the server's nodes.
    #[command(visible_alias = "ls")]
    List,
    /// Keep new sandboxes off a node and move its running sandboxes to the others.
    Drain {
        /// The node, HOST:PORT as `warren nodes list` shows it.
        node: String,
    },
    /// Let a drained node take new sandboxes again.
    Undrain {
        /// The node, HOST:PORT.
        node: String,
    },
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Address of the node API (the server's `--node` URL points here). Calls carry the node's
    /// token and the sandboxes' settings, secrets of header rules included: serve it over TLS
    /// (--tls) unless it is on loopback.
    #[arg(long, env = "WARREN_NODE_LISTEN", default_value = "127.0.0.1:3100")]
    pub listen: String,
    /// The node's own state directory (its sandboxes); not the server's.
    #[arg(
        long,
        env = "WARREN_NODE_STATE_DIR",
        default_value = "/var/lib/warren-node"
    )]
    pub state_dir: PathBuf,
    /// A directory the node shares with its server at the same path: the server's state directory
    /// (templates, snapshots) and the template root filesystems. Repeat for more. Calls naming a
    /// path outside them are refused.
    #[arg(
        long = "shared-dir",
        env = "WARREN_NODE_SHARED_DIR",
        value_delimiter = ',',
        required = true
    )]
    pub shared_dirs: Vec<PathBuf>,
    /// The sandboxes' subnet, as the bridge's address and prefix (GATEWAY/PREFIX). Each node of a
    /// server needs its own; the server routes it through the node (docs/cluster.md).
    #[arg(long, env = "WARREN_NODE_SUBNET", default_value = "10.77.0.1/16", value_parser = parse_subnet)]
    pub subnet: (std::net::Ipv4Addr, u8),
    /// Address of a server on another machine (repeat for more): the node's firewall forwards its
    /// connections to the sandboxes (their ports and agents) and the replies. Connections from
    /// anywhere else are dropped, as on a single machine.
    #[arg(
        long = "server-address",
        env = "WARREN_NODE_SERVER_ADDRESS",
        value_delimiter = ','
    )]
    pub server_addresses: Vec<std::net::Ipv4Addr>,
    /// Serve the node API over HTTPS with a certificate for the --listen address, signed by a CA
    /// the node makes once in its state directory (tls/ca.crt: give it to the server as
    /// --node-ca-file). Listen on the address the server uses, not 0.0.0.0: the certificate names it.
    #[arg(long, env = "WARREN_NODE_TLS", conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls: bool,
    /// Serve HTTPS with this certificate chain (PEM) instead.
    #[arg(long, env = "WARREN_NODE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "WARREN_NODE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The file holding the token servers must present; made (mode 0600, a random token) when
    /// missing. Default: <state-dir>/node.token.
    #[arg(long, env = "WARREN_NODE_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Most sandboxes this node runs at once, for all its servers together; a start past it is
    /// refused and the server places the sandbox on another node.
    #[arg(long, env = "WARREN_NODE_MAX_SANDBOXES", default_value_t = 64)]
    pub max_sandboxes: u32,
    /// Most vCPUs the node's sandboxes hold together.
    #[arg(long, env = "WARREN_NODE_MAX_TOTAL_VCPUS", default_value_t = 64.0)]
    pub max_total_vcpus: f64,
    /// Most memory (MiB, the sandboxes' limits) the node's sandboxes hold together.
    #[arg(
        long,
        env = "WARREN_NODE_MAX_TOTAL_MEMORY_MIB",
        default_value_t = 16384
    )]
    pub max_total_memory_mib: u64,
    /// Freeze every sandbox when no server has reached the node for this many seconds (under the
    /// servers' 7 s to declare it down, so a cut-off node never runs a sandbox another node has
    /// taken over); a server that reaches it again thaws the ones it still owns. 0: never.
    #[arg(
        long,
        env = "WARREN_NODE_FENCE_AFTER",
        default_value_t = 5,
        value_name = "SECS"
    )]
    pub fence_after: u64,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// The sandbox runtime's own settings: `warren up`'s (unless its sandboxes run on nodes) and
/// `warren node`'s.
#[derive(Debug, Args)]
pub struct RuntimeArgs {
    /// The static warren-agent binary mounted into every sandbox.
    #[arg(long, env = "WARREN_AGENT")]
    pub agent: Option<PathBuf>,
    /// Leave the kernel's RCU grace periods as they are. By default Warren sets
    /// /sys/kernel/rcu_expedited to 1 (host-wide, kept after it stops), which takes ~10 ms off every
    /// create on cgroup v1 hosts.
    #[arg(long, env = "WARREN_KEEP_RCU_NORMAL")]
    pub keep_rcu_normal: bool,
    /// Set no_new_privs on every sandbox: setuid programs (sudo, su, ping on some images) stop
    /// working inside. Off by default, as in Docker and E2B, where `user` has passwordless sudo; root
    /// inside keeps the reduced capability set and seccomp filter either way.
    #[arg(long, env = "WARREN_NO_NEW_PRIVS")]
    pub no_new_privs: bool,
    /// Restore checkpoints (resume, fork, running-state templates) eagerly: every memory page is read
    /// and checked before the processes run again. By default they run as soon as their process tree
    /// is rebuilt and the memory follows lazily, each chunk checked before it is used
    /// (docs/checkpoints.md).
    #[arg(long, env = "WARREN_NO_LAZY_RESTORE")]
    pub no_lazy_restore: bool,
    /// Sandbox supervisors kept started ahead of need, so that a create does not wait for one to
    /// start (about 2 ms of a create here); 0 starts one per create, at most 64. Each is an idle
    /// process that holds nothing until it is handed a sandbox, and exits when the server does.
    #[arg(
        long,
        env = "WARREN_STANDBY_SUPERVISORS",
        default_value_t = 2,
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(0..=64)
    )]
    pub standby_supervisors: u16,
    /// DNS server (IP or IP:PORT; repeat for more) the egress proxy resolves the host names of
    /// sandboxes' `allowOut` rules with. Default: the host's /etc/resolv.conf. The proxy, not the
    /// sandbox, decides where an allowed name's connection goes (docs/network.md).
    #[arg(
        long = "egress-resolver",
        env = "WARREN_EGRESS_RESOLVER",
        value_delimiter = ','
    )]
    pub egress_resolvers: Vec<String>,
    /// CA certificate (PEM file; repeat for more) the egress proxy trusts, besides the host's trust
    /// store, when it connects to hosts whose requests get header rules (`network.rules`).
    #[arg(
        long = "egress-upstream-ca",
        env = "WARREN_EGRESS_UPSTREAM_CA",
        value_delimiter = ','
    )]
    pub egress_upstream_ca: Vec<PathBuf>,
}

/// Where Warren keeps its database and sandboxes.
#[derive(Debug, Args, Clone)]
pub struct StateArgs {
    /// State directory (default /var/lib/warren as root, ~/.local/share/warren otherwise).
    #[arg(long, env = "WARREN_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Keep the store in this PostgreSQL database (postgres://USER:PASSWORD@HOST:PORT/DB, or
    /// ?host=/socket/dir) instead of the embedded SQLite file warren.db in the state directory (the
    /// default). Its password never appears in logs or errors.
    #[arg(
        long,
        env = "WARREN_DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox and print its ID.
    Create(CreateArgs),
    /// List sandboxes.
    #[command(visible_alias = "ls")]
    List(ListArgs),
    /// Show one sandbox.
    Get {
        /// Sandbox ID.
        id: String,
    },
    /// Kill sandboxes.
    #[command(visible_alias = "rm")]
    Kill {
        /// Sandbox IDs.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Pause a running sandbox.
    /// Move a running sandbox to another node of the server (cluster mode): paused to a checkpoint
    /// and resumed there, processes intact.
    Migrate {
        /// Sandbox ID.
        id: String,
    },
    Pause {
        /// Sandbox ID.
        id: String,
        /// Keep the files only: the processes end and a resume boots them fresh.
        #[arg(long)]
        files_only: bool,
        /// Refuse (and keep the sandbox running) when its guest agent does not answer.
        #[arg(long)]
        strict: bool,
    },
    /// Resume a paused sandbox.
    Resume {
        /// Sandbox ID.
        id: String,
        /// New timeout in seconds from now.
        #[arg(long)]
        timeout: Option<u32>,
        /// Boot fresh processes over the saved files, ignoring any memory the pause kept.
        #[arg(long)]
        reboot: bool,
    },
    /// Set a sandbox's timeout: it ends SECONDS from now.
    Timeout {
        /// Sandbox ID.
        id: String,
        /// Seconds from now.
        seconds: u32,
    },
    /// Run a command in a sandbox; exits with the command's exit code.
    Exec(ExecArgs),
    /// Open an interactive terminal in a sandbox.
    #[command(visible_alias = "connect")]
    Shell(ShellArgs),
    /// List a running sandbox's processes, busiest first (PIDs as the sandbox sees them).
    Top {
        /// Sandbox ID.
        id: String,
    },
    /// Send a signal to one process of a running sandbox.
    KillProcess {
        /// Sandbox ID.
        id: String,
        /// PID as the sandbox sees it (`warren sandbox top`).
        pid: u32,
        /// Signal name or number.
        #[arg(long, short = 's', default_value = "KILL")]
        signal: String,
    },
    /// List a running sandbox's orphaned processes (left running by finished commands); --kill ends
    /// them.
    Orphans {
        /// Sandbox ID.
        id: String,
        /// Kill them (SIGKILL).
        #[arg(long)]
        kill: bool,
    },
    /// Show how full a running sandbox's disk is and the largest files it wrote.
    Du {
        /// Sandbox ID.
        id: String,
        /// How many files to list.
        #[arg(long, short = 'n', default_value_t = 10)]
        count: usize,
    },
    /// Show a sandbox's log: its lifecycle events and every line its commands printed, oldest
    /// first (ended sandboxes' too).
    Logs(LogsArgs),
    /// Show a sandbox's sampled resource use (CPU, memory, disk), oldest first.
    Metrics {
        /// Sandbox ID.
        id: String,
        /// Only samples of the last SECONDS.
        #[arg(long)]
        since: Option<u64>,
    },
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Sandbox ID.
    pub id: String,
    /// Only the last N lines.
    #[arg(long, short = 'n')]
    pub tail: Option<usize>,
    /// Least severe level shown: debug, info, warn or error.
    #[arg(long)]
    pub level: Option<String>,
    /// Only lines containing this text (case-insensitive).
    #[arg(long)]
    pub search: Option<String>,
    /// Keep printing new lines as they come.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Template ID or alias.
    #[arg(default_value = "base")]
    pub template: String,
    /// Seconds until the sandbox is killed (or paused with --auto-pause).
    #[arg(long)]
    pub timeout: Option<u32>,
    /// Metadata KEY=VALUE (repeatable).
    #[arg(long = "metadata", short = 'm', value_parser = parse_key_value)]
    pub metadata: Vec<(String, String)>,
    /// Environment variable KEY=VALUE for every process (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Pause instead of kill when the timeout ends.
    #[arg(long)]
    pub auto_pause: bool,
    /// Cut the sandbox off from the internet.
    #[arg(long)]
    pub no_internet: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only sandboxes in this state: running or paused (repeatable).
    #[arg(long, value_parser = parse_state)]
    pub state: Vec<SandboxState>,
    /// Only sandboxes with this metadata KEY=VALUE (repeatable).
    #[arg(long = "metadata", short = 'm', value_parser = parse_key_value)]
    pub metadata: Vec<(String, String)>,
    /// At most this many sandboxes.
    #[arg(long)]
    pub limit: Option<u32>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox ID.
    pub id: String,
    /// Working directory inside the sandbox.
    #[arg(long)]
    pub cwd: Option<String>,
    /// User to run as.
    #[arg(long, short = 'u', default_value = "user")]
    pub user: String,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Send this program's stdin to the command (until end of input), like `docker exec -i`.
    #[arg(long, short = 'i')]
    pub stdin: bool,
    /// The command; joined with spaces and run by `bash -l -c` like the E2B SDK does.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ShellArgs {
    /// Sandbox ID.
    pub id: String,
    /// User to log in as.
    #[arg(long, short = 'u', default_value = "user")]
    pub user: String,
    /// Working directory inside the sandbox.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Shell to start.
    #[arg(long, default_value = "/bin/bash")]
    pub shell: String,
}

#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// List templates.
    #[command(visible_alias = "ls")]
    List,
    /// Build a template from a directory with e2b.toml and e2b.Dockerfile (the directory is the build
    /// context), showing each step and its output. Exits non-zero with the failing step's output.
    Build(TemplateBuildArgs),
    /// Delete a template and its builds (refused while sandboxes use it unless --force).
    #[command(visible_alias = "rm")]
    Delete {
        /// Template ID or alias.
        template: String,
        /// Delete even if sandboxes use it (they keep running on their layers).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Args)]
pub struct TemplateBuildArgs {
    /// Template directory (build context).
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// Template name (alias); default: e2b.toml's template_name, else the directory's name.
    #[arg(long, short = 'n')]
    pub name: Option<String>,
    /// Dockerfile to build; default: e2b.toml's dockerfile, else e2b.Dockerfile, else Dockerfile.
    #[arg(long, short = 'd')]
    pub dockerfile: Option<PathBuf>,
    /// Command started in every sandbox of the template (overrides e2b.toml's start_cmd).
    #[arg(long, short = 'c')]
    pub start_cmd: Option<String>,
    /// Command that succeeds once start_cmd is ready (overrides e2b.toml's ready_cmd).
    #[arg(long)]
    pub ready_cmd: Option<String>,
    /// vCPUs of the template's sandboxes (overrides e2b.toml's cpu_count).
    #[arg(long)]
    pub cpu_count: Option<u32>,
    /// Memory of the template's sandboxes in MiB (overrides e2b.toml's memory_mb).
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Let the template's sandboxes keep CAP_NET_RAW (raw and packet sockets, e.g. tcpdump); needs an
    /// admin API key.
    #[arg(long)]
    pub allow_raw_sockets: bool,
    /// Let the template's sandboxes use io_uring (denied by default); needs an admin API key.
    #[arg(long)]
    pub allow_io_uring: bool,
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create an API key and print it (it is shown only once).
    Create {
        /// A name to recognise the key by.
        #[arg(long, default_value = "default")]
        name: String,
        /// The team (ID or name) whose sandboxes the key sees and acts on.
        #[arg(long, default_value = "default")]
        team: String,
        /// The key also manages teams and keys over the API (`/teams`, `/api-keys`).
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        state: StateArgs,
    },
    /// List API keys (never their secret part).
    #[command(visible_alias = "ls")]
    List {
        #[command(flatten)]
        state: StateArgs,
    },
    /// Revoke an API key by its ID.
    Revoke {
        /// Key ID (or name).
        id: String,
        #[command(flatten)]
        state: StateArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum TeamCommand {
    /// Create a team, optionally with quotas on what its live sandboxes hold at once.
    Create {
        /// Letters, digits, '-' and '_'.
        name: String,
        /// Most sandboxes (running or paused in memory) at once; more get 429.
        #[arg(long)]
        max_sandboxes: Option<u32>,
        /// Most vCPUs its running sandboxes hold together.
        #[arg(long)]
        max_vcpus: Option<f64>,
        /// Most memory (MiB) its running sandboxes hold together.
        #[arg(long)]
        max_memory_mib: Option<u64>,
        #[command(flatten)]
        state: StateArgs,
    },
    /// List teams and their quotas.
    #[command(visible_alias = "ls")]
    List {
        #[command(flatten)]
        state: StateArgs,
    },
}

fn parse_state(raw: &str) -> Result<SandboxState, String> {
    SandboxState::parse(raw).ok_or_else(|| format!("expected running or paused, got {raw:?}"))
}

/// `KEY=VALUE` → (KEY, VALUE). The value may contain `=`; the key may not be empty.
pub fn parse_key_value(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {raw:?}")),
    }
}

/// GATEWAY/PREFIX of `warren node --subnet`: an IPv4 address inside the subnet it names, prefix
/// 8 to 30.
fn parse_subnet(raw: &str) -> Result<(std::net::Ipv4Addr, u8), String> {
    let (address, prefix) = raw
        .split_once('/')
        .ok_or_else(|| format!("{raw:?} is not GATEWAY/PREFIX, e.g. 10.81.0.1/16"))?;
    let address: std::net::Ipv4Addr = address
        .parse()
        .map_err(|_| format!("{address:?} is not an IPv4 address"))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (8..=30).contains(p))
        .ok_or_else(|| format!("prefix {prefix:?} is not 8 to 30"))?;
    Ok((address, prefix))
}

/// `--disk-overcommit`: a ratio from 1 to 100.
fn parse_overcommit(value: &str) -> Result<f64, String> {
    let ratio: f64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number"))?;
    if !(1.0..=100.0).contains(&ratio) {
        return Err(format!(
            "{value} is outside 1 to 100 (1: no overcommit; a ratio below 1 would refuse space the disk has)"
        ));
    }
    Ok(ratio)
}

/// `TEMPLATE=N` of `--warm-pool`.
fn parse_warm_pool(value: &str) -> Result<(String, usize), String> {
    let (template, size) = value
        .rsplit_once('=')
        .ok_or_else(|| format!("expected TEMPLATE=N, got {value:?}"))?;
    if template.is_empty() {
        return Err(format!("no template named in {value:?}"));
    }
    let size = size
        .parse::<usize>()
        .map_err(|_| format!("pool size {size:?} is not a whole number"))?;
    if size > 64 {
        return Err(format!("pool size {size} is more than 64"));
    }
    Ok((template.to_string(), size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("warren").chain(args.iter().copied()))
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn create_takes_template_timeout_metadata_and_env() {
        let cli = parse(&[
            "sandbox",
            "create",
            "py",
            "--timeout",
            "60",
            "-m",
            "team=a",
            "--env",
            "X=1=2",
            "--auto-pause",
        ])
        .expect("parses");
        let Command::Sandbox(SandboxCommand::Create(create)) = cli.command else {
            panic!("wrong command: {:?}", cli.command);
        };
        assert_eq!(create.template, "py");
        assert_eq!(create.timeout, Some(60));
        assert_eq!(create.metadata, vec![("team".to_string(), "a".to_string())]);
        assert_eq!(create.env, vec![("X".to_string(), "1=2".to_string())]);
        assert!(create.auto_pause);
        assert!(!create.no_internet);
    }

    #[test]
    fn create_defaults_to_base_template() {
        let cli = parse(&["sandbox", "create"]).expect("parses");
        let Command::Sandbox(SandboxCommand::Create(create)) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(create.template, "base");
        assert_eq!(create.timeout, None);
    }

    #[test]
    fn exec_keeps_the_commands_own_flags() {
        let cli = parse(&[
            "sandbox", "exec", "sbx1", "--cwd", "/tmp", "ls", "-la", "--color",
        ])
        .expect("parses");
        let Command::Sandbox(SandboxCommand::Exec(exec)) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(exec.id, "sbx1");
        assert_eq!(exec.cwd.as_deref(), Some("/tmp"));
        assert_eq!(exec.user, "user");
        assert_eq!(exec.command, vec!["ls", "-la", "--color"]);
        assert!(!exec.stdin);
        let cli = parse(&["sandbox", "exec", "-i", "sbx1", "--", "cat", "-i"]).expect("parses");
        let Command::Sandbox(SandboxCommand::Exec(exec)) = cli.command else {
            panic!("wrong command");
        };
        assert!(exec.stdin);
        assert_eq!(exec.command, vec!["cat", "-i"]);
    }

    #[test]
    fn exec_without_command_is_a_usage_error() {
        let err = parse(&["sandbox", "exec", "sbx1"]).expect_err("must fail");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn global_flags_work_after_the_subcommand() {
        let cli = parse(&[
            "sandbox",
            "list",
            "--json",
            "--api-url",
            "http://h:1",
            "--api-key",
            "k",
        ])
        .expect("parses");
        assert!(cli.global.json);
        assert_eq!(cli.global.api_url, "http://h:1");
        assert_eq!(cli.global.api_key.as_deref(), Some("k"));
    }

    #[test]
    fn list_rejects_unknown_state() {
        let cli =
            parse(&["sandbox", "list", "--state", "running", "--state", "paused"]).expect("parses");
        let Command::Sandbox(SandboxCommand::List(list)) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(
            list.state,
            vec![SandboxState::Running, SandboxState::Paused]
        );
        let err = parse(&["sandbox", "list", "--state", "sleeping"]).expect_err("must fail");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn kill_needs_at_least_one_id() {
        assert!(parse(&["sandbox", "kill"]).is_err());
        let cli = parse(&["sandbox", "rm", "a", "b"]).expect("alias parses");
        let Command::Sandbox(SandboxCommand::Kill { ids }) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(ids, vec!["a", "b"]);
    }

    #[test]
    fn timeout_needs_a_number() {
        assert!(parse(&["sandbox", "timeout", "a", "60"]).is_ok());
        assert!(parse(&["sandbox", "timeout", "a", "soon"]).is_err());
    }

    #[test]
    fn key_commands_take_a_state_dir() {
        let cli =
            parse(&["key", "create", "--name", "ci", "--state-dir", "/tmp/w"]).expect("parses");
        let Command::Key(KeyCommand::Create { name, state, .. }) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(name, "ci");
        assert_eq!(state.state_dir, Some(PathBuf::from("/tmp/w")));
    }

    #[test]
    fn key_value_parsing() {
        assert_eq!(parse_key_value("a=b"), Ok(("a".into(), "b".into())));
        assert_eq!(parse_key_value("a="), Ok(("a".into(), "".into())));
        assert!(parse_key_value("=b").is_err());
        assert!(parse_key_value("ab").is_err());
    }

    #[test]
    fn overcommit_is_a_ratio_from_one_to_a_hundred() {
        assert_eq!(parse_overcommit("1"), Ok(1.0));
        assert_eq!(parse_overcommit("2.5"), Ok(2.5));
        for bad in ["0.5", "0", "-2", "101", "NaN", "inf", "two", ""] {
            assert!(parse_overcommit(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn warm_pools_are_named_with_a_size() {
        assert_eq!(parse_warm_pool("my-app=3"), Ok(("my-app".to_string(), 3)));
        assert_eq!(parse_warm_pool("a=b=2"), Ok(("a=b".to_string(), 2)));
        for bad in ["my-app", "=2", "my-app=x", "my-app=-1", "my-app=65"] {
            assert!(parse_warm_pool(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn standby_supervisors_default_to_two_and_stop_at_sixty_four() {
        let standbys = |args: &[&str]| {
            let mut all = vec!["up"];
            all.extend_from_slice(args);
            parse(&all).map(|cli| match cli.command {
                Command::Up(up) => up.runtime.standby_supervisors,
                other => panic!("wrong command: {other:?}"),
            })
        };
        assert_eq!(standbys(&[]).expect("parses"), 2);
        assert_eq!(
            standbys(&["--standby-supervisors", "0"]).expect("parses"),
            0
        );
        assert_eq!(
            standbys(&["--standby-supervisors", "64"]).expect("parses"),
            64
        );
        for bad in [
            "--standby-supervisors=65",
            "--standby-supervisors=-1",
            "--standby-supervisors=many",
        ] {
            let error = standbys(&[bad]).expect_err(bad);
            assert!(
                error.to_string().contains("--standby-supervisors"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_remote_node_comes_with_its_token_and_without_the_runtime_s_own_flags() {
        let up = |args: &[&str]| {
            let mut all = vec!["up"];
            all.extend_from_slice(args);
            parse(&all).map(|cli| match cli.command {
                Command::Up(up) => (up.node.first().cloned(), up.node_token_file.clone()),
                other => panic!("wrong command: {other:?}"),
            })
        };
        let node = ["--node", "http://10.0.0.2:3100"];
        let token = ["--node-token-file", "/etc/warren/node.token"];
        assert_eq!(
            up(&[&node[..], &token[..]].concat()).expect("parses"),
            (
                Some("http://10.0.0.2:3100".to_string()),
                Some(PathBuf::from("/etc/warren/node.token"))
            )
        );
        for bad in [
            node.to_vec(),
            token.to_vec(),
            [&node[..], &token[..], &["--agent", "/bin/agent"]].concat(),
            [&node[..], &token[..], &["--standby-supervisors", "4"]].concat(),
        ] {
            let error = up(&bad).expect_err(&bad.join(" "));
            assert!(
                error.to_string().contains("--node") || error.to_string().contains("--agent"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_node_needs_a_shared_directory() {
        let node = |args: &[&str]| {
            let mut all = vec!["node"];
            all.extend_from_slice(args);
            parse(&all).map(|cli| match cli.command {
                Command::Node(node) => node.shared_dirs.clone(),
                other => panic!("wrong command: {other:?}"),
            })
        };
        let error = node(&[]).expect_err("no shared dir");
        assert!(error.to_string().contains("--shared-dir"), "{error}");
        assert_eq!(
            node(&["--shared-dir", "/srv/a", "--shared-dir", "/srv/b"]).expect("parses"),
            [PathBuf::from("/srv/a"), PathBuf::from("/srv/b")]
        );
    }

    #[test]
    fn the_systemd_units_name_only_variables_and_flags_that_exist() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let mut variables = std::collections::BTreeSet::new();
        let mut flags = std::collections::BTreeSet::new();
        for name in ["up", "node"] {
            let command = cli.find_subcommand(name).expect("subcommand");
            for arg in command.get_arguments() {
                if let Some(env) = arg.get_env() {
                    variables.insert(env.to_string_lossy().into_owned());
                }
                if let Some(long) = arg.get_long() {
                    flags.insert(format!("--{long}"));
                }
            }
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd");
        let mut units = 0;
        for entry in std::fs::read_dir(&dir).expect("deploy/systemd") {
            let text = std::fs::read_to_string(entry.expect("entry").path()).expect("unit");
            units += 1;
            let words = |line: &str| -> Vec<String> {
                line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                    .map(str::to_string)
                    .collect()
            };
            for word in words(&text) {
                if word.starts_with("WARREN_") {
                    assert!(variables.contains(&word), "{word} is no flag's variable");
                }
            }
            for line in text.lines().filter(|l| l.starts_with("ExecStart=")) {
                for word in words(line).into_iter().filter(|w| w.starts_with("--")) {
                    assert!(
                        flags.contains(&word),
                        "{word} is no flag of warren up or node"
                    );
                }
            }
        }
        assert_eq!(units, 2);
    }
}
