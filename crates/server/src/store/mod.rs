//! The store: sandboxes, templates, API keys and lifecycle events. The only source of truth.
//!
//! [`Store`] is the interface the rest of the server uses. [`sqlite::SqliteStore`] (the default, a file
//! in the state directory) and [`postgres::PgStore`] (a database several servers share) implement it
//! with the same semantics, the same schema and the same row mapping (`rows.rs`); all SQL lives in the
//! implementations. [`open`] opens the one a [`Database`] names.

pub mod migrations;
pub mod postgres;
mod postgres_records;
mod rows;
pub mod sqlite;
mod sqlite_fleet;
mod sqlite_logs;
mod sqlite_metrics;
mod sqlite_secrets;
mod sqlite_servers;
mod sqlite_snapshots;
mod sqlite_template_builds;
mod sqlite_volumes;
mod sqlite_workspaces;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;

use crate::lifecycle::state::{Operation, SandboxState};

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

/// How stale `api_keys.last_used_at` may get.
pub const LAST_USED_RESOLUTION_MS: Millis = 60_000;

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// `warren.db` in this directory (the server's state directory): the default.
    Sqlite(PathBuf),
    /// A PostgreSQL database, which several servers may share.
    Postgres(DatabaseUrl),
}

impl Database {
    /// PostgreSQL at `url` when one is given, else SQLite in `state_dir`.
    pub fn choose(url: Option<&DatabaseUrl>, state_dir: &std::path::Path) -> Database {
        match url {
            Some(url) => Database::Postgres(url.clone()),
            None => Database::Sqlite(state_dir.to_path_buf()),
        }
    }
}

impl std::fmt::Display for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(dir) => {
                write!(f, "SQLite in {}", dir.join(sqlite::DATABASE_FILE).display())
            }
            Database::Postgres(url) => write!(f, "PostgreSQL at {url}"),
        }
    }
}

/// Opens (creating and migrating as needed) the store `database` names.
pub async fn open(database: &Database) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match database {
        Database::Sqlite(dir) => Arc::new(SqliteStore::open_in(dir).await?),
        Database::Postgres(url) => Arc::new(PgStore::open(url).await?),
    })
}

/// A `postgres://` URL. It may hold a password: [`std::fmt::Display`] and [`std::fmt::Debug`] show
/// it with the password replaced, so it can go into logs and errors; only [`DatabaseUrl::expose`]
/// gives the real text, for the driver.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    raw: String,
    redacted: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DatabaseUrlError {
    /// The text is never repeated: it may hold a password.
    #[error("the database URL cannot be parsed as a URL")]
    NotUrl,
    #[error(
        "the database URL must start with postgres:// or postgresql:// (it starts with {0}://)"
    )]
    Scheme(String),
}

impl FromStr for DatabaseUrl {
    type Err = DatabaseUrlError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let mut url = url::Url::parse(raw).map_err(|_| DatabaseUrlError::NotUrl)?;
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err(DatabaseUrlError::Scheme(url.scheme().to_string()));
        }
        const HIDDEN: &str = "REDACTED";
        if url.password().is_some() {
            url.set_password(Some(HIDDEN))
                .map_err(|_| DatabaseUrlError::NotUrl)?;
        }
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(key, value)| {
                let secret = key.to_ascii_lowercase().contains("password");
                (
                    key.into_owned(),
                    if secret {
                        HIDDEN.to_string()
                    } else {
                        value.into_owned()
                    },
                )
            })
            .collect();
        if !pairs.is_empty() {
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
        Ok(DatabaseUrl {
            raw: raw.to_string(),
            redacted: url.to_string(),
        })
    }
}

impl DatabaseUrl {
    /// The URL with its password, for the database driver only.
    pub fn expose(&self) -> &str {
        &self.raw
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseUrl({})", self.redacted)
    }
}

/// How the proxy talks to a sandbox's ports: E2B's `network.maskRequestHost` (the `Host` the
/// sandbox's services see, `${PORT}` standing for the port) and `network.httpsPorts` (ports whose
/// service speaks TLS itself: the proxy ends the client's connection and opens TLS to the port,
/// without checking its certificate).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxIngress {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub https_ports: Vec<u16>,
}

impl SandboxIngress {
    /// The `Host` a request to `port` carries into the sandbox, when a mask is set.
    pub fn host_for(&self, port: u16) -> Option<String> {
        self.mask_request_host
            .as_ref()
            .map(|mask| mask.replace("${PORT}", &port.to_string()))
    }

    /// Whether the service on `port` is spoken to over TLS.
    pub fn is_https(&self, port: u16) -> bool {
        self.https_ports.contains(&port)
    }

    pub fn is_default(&self) -> bool {
        *self == SandboxIngress::default()
    }
}

/// Unix time in milliseconds.
pub type Millis = i64;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// `url` is shown without its password.
    #[error("cannot connect to the database at {url}")]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("database migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot create state directory {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt {what} in row {id}")]
    Corrupt {
        what: &'static str,
        id: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    /// A row with this unique name exists already.
    #[error("{what} named {name:?} exists already")]
    Duplicate { what: &'static str, name: String },
    /// The row was not in the state the caller expected (someone else moved it first).
    #[error("sandbox {id} is {actual}, expected {expected}")]
    StateConflict {
        id: String,
        expected: SandboxState,
        actual: SandboxState,
    },
}

impl StoreError {
    /// Whether the store could not write because the state disk is full (SQLite's `SQLITE_FULL`,
    /// PostgreSQL's `disk_full`, or ENOSPC/EDQUOT from the file system): the operator's problem to
    /// fix, not a bug.
    pub fn disk_full(&self) -> bool {
        let io_full = |io: &std::io::Error| {
            matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ) || matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        };
        match self {
            // SQLITE_FULL is primary result code 13, with no extended variants; PostgreSQL's
            // SQLSTATE for a full disk is 53100 (five characters: the two never meet).
            StoreError::Database(sqlx::Error::Database(db)) => {
                matches!(db.code().as_deref(), Some("13") | Some("53100"))
            }
            StoreError::Database(sqlx::Error::Io(io)) => io_full(io),
            StoreError::StateDir { source, .. } => io_full(source),
            _ => false,
        }
    }
}

/// A stored API key (never the secret itself).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRecord {
    pub id: String,
    pub name: String,
    pub prefix: String,
    pub secret_hash: String,
    pub created_at: Millis,
    pub last_used_at: Option<Millis>,
    pub revoked_at: Option<Millis>,
    /// The team whose sandboxes, snapshots and templates the key sees and acts on.
    pub team_id: String,
    /// Also manages teams and keys.
    pub admin: bool,
}

/// The team every installation starts with (keys made before teams existed belong to it).
pub const DEFAULT_TEAM: &str = "team_default";

/// A team: the unit of tenancy. `None` quotas leave only the node's own limits.
#[derive(Debug, Clone, PartialEq)]
pub struct TeamRecord {
    pub id: String,
    pub name: String,
    pub max_sandboxes: Option<u32>,
    pub max_vcpus: Option<f64>,
    pub max_memory_mib: Option<u64>,
    pub created_at: Millis,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TemplateRecord {
    pub id: String,
    pub aliases: Vec<String>,
    /// Read-only layers, top-most first; the last one is a whole root filesystem.
    pub layers: Vec<PathBuf>,
    pub build_id: String,
    /// `building`, `waiting`, `ready` or `error`.
    pub status: String,
    pub vcpus: f64,
    pub memory_mib: u64,
    pub disk_mib: u64,
    pub envd_version: String,
    pub public: bool,
    /// The team that owns it; others see it only when `public`.
    pub team_id: String,
    pub spawn_count: u64,
    pub last_spawned_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Monitor policies its sandboxes start with (their own create-time fields go over them).
    pub policies: warren_proto::api::SandboxPolicies,
}

/// How a paused sandbox was paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseKind {
    /// CRIU checkpoint on disk; nothing runs.
    Checkpoint,
    /// cgroup freezer; memory stays resident.
    Freeze,
    /// The runtime layer on disk without the processes (`pause(mode="filesystem")`); nothing runs,
    /// and a resume boots fresh processes over the files.
    Filesystem,
}

impl PauseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseKind::Checkpoint => "checkpoint",
            PauseKind::Freeze => "freeze",
            PauseKind::Filesystem => "filesystem",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "checkpoint" => Some(PauseKind::Checkpoint),
            "freeze" => Some(PauseKind::Freeze),
            "filesystem" => Some(PauseKind::Filesystem),
            _ => None,
        }
    }

    /// Paused into a directory on disk (nothing of it runs on the host), as opposed to frozen.
    pub fn on_disk(self) -> bool {
        matches!(self, PauseKind::Checkpoint | PauseKind::Filesystem)
    }

    /// How the complete checkpoint at `dir` paused its sandbox: with its memory or without.
    pub fn of_checkpoint(dir: &std::path::Path) -> Self {
        match warren_runtime::checkpoint::Manifest::read(dir) {
            Ok(manifest) if !manifest.memory => PauseKind::Filesystem,
            _ => PauseKind::Checkpoint,
        }
    }
}

/// Where a template build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildState {
    Waiting,
    Building,
    Ready,
    Error,
}

impl BuildState {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildState::Waiting => "waiting",
            BuildState::Building => "building",
            BuildState::Ready => "ready",
            BuildState::Error => "error",
        }
    }

    pub fn parse(text: &str) -> Option<BuildState> {
        [
            BuildState::Waiting,
            BuildState::Building,
            BuildState::Ready,
            BuildState::Error,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BuildRecord {
    pub build_id: String,
    pub template_id: String,
    pub status: BuildState,
    /// Why a build failed.
    pub reason: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TemplateTag {
    pub template_id: String,
    pub tag: String,
    pub build_id: String,
    pub created_at: Millis,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRecord {
    pub id: String,
    pub team_id: String,
    pub template_id: String,
    pub alias: Option<String>,
    pub client_id: String,
    pub state: SandboxState,
    pub state_reason: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub vcpus: f64,
    pub memory_mib: u64,
    pub disk_mib: u64,
    pub auto_pause: bool,
    /// Whether the auto-pause keeps memory (a checkpoint) or only the files (`autoPauseMemory`).
    pub auto_pause_memory: bool,
    pub auto_resume: bool,
    pub allow_internet: Option<bool>,
    pub envd_access_token: Option<String>,
    /// Set for private sandboxes: the proxy's user ports need it (`e2b-traffic-access-token`).
    pub traffic_access_token: Option<String>,
    /// Egress rules by address (`network.allowOut` / `denyOut`).
    pub egress: warren_runtime::network::egress::EgressRules,
    /// The sandbox's own monitor policies (over the server's defaults).
    pub policies: warren_proto::api::SandboxPolicies,
    /// How the proxy talks to the sandbox's ports.
    pub ingress: SandboxIngress,
    /// The volumes mounted into the sandbox (create's `volumeMounts`), kept through pause, resume and
    /// fork.
    pub volumes: Vec<SandboxVolume>,
    pub ip: Option<Ipv4Addr>,
    pub init_pid: Option<u32>,
    pub pause_kind: Option<PauseKind>,
    pub snapshot_dir: Option<PathBuf>,
    pub started_at: Millis,
    pub end_at: Millis,
    pub updated_at: Millis,
}

/// A team's volume: a persistent ext4 image (docs/volumes.md).
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeRecord {
    pub id: String,
    pub team_id: String,
    pub name: String,
    /// Bearer token of the `/volumecontent` API.
    pub token: String,
    pub size_mib: u64,
    pub created_at: Millis,
}

/// One volume mounted into a sandbox, as the sandbox record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxVolume {
    pub volume_id: String,
    pub name: String,
    /// Where the volume appears inside the sandbox (absolute).
    pub path: String,
}

/// What deleting a volume did ([`Store::delete_volume`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeDeletion {
    Deleted,
    NotFound,
    /// Sandboxes that are not killed or failed mount it; nothing was deleted.
    InUse(Vec<String>),
}

/// A user's workspace: the sandbox they are on now (`None` before the first one is made).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceRecord {
    pub team_id: String,
    pub user_id: String,
    /// Template (id or alias) each new sandbox of the workspace starts from.
    pub template: String,
    pub sandbox_id: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// One entry of a workspace's history: the sandbox the user was given, how (`created`, `resumed`,
/// `replaced`), and why.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceMove {
    pub sandbox_id: String,
    pub action: String,
    pub reason: Option<String>,
    pub at: Millis,
}

/// One sample of a running sandbox's resource use, as the monitor stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSample {
    pub sandbox_id: String,
    pub at: Millis,
    /// CPU use in percent of the sandbox's vCPUs (100 = all of them busy).
    pub cpu_pct: f64,
    pub cpu_count: u32,
    pub mem_used: u64,
    pub mem_total: u64,
    pub disk_used: u64,
    pub disk_total: u64,
    pub pids: u64,
    /// The OOM killer's count in the sandbox's cgroup so far.
    pub oom_kills: u64,
    /// Page cache in its memory.
    pub mem_cache: u64,
    /// Bytes received and sent on its link so far (restart at a restore).
    pub net_rx: u64,
    pub net_tx: u64,
}

/// A line of a sandbox's log as its agent recorded it: a line a command printed, or a process
/// starting or ending.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxLogLine {
    pub sandbox_id: String,
    /// The agent's sequence number: unique per sandbox, increasing in the order recorded.
    pub seq: i64,
    pub at: Millis,
    pub level: LogLevel,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

/// E2B's log levels, least severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }

    pub fn parse(text: &str) -> Option<LogLevel> {
        match text {
            "debug" => Some(LogLevel::Debug),
            "info" => Some(LogLevel::Info),
            "warn" => Some(LogLevel::Warn),
            "error" => Some(LogLevel::Error),
            _ => None,
        }
    }
}

/// Which log lines of one sandbox to read: a page from `cursor` on (forward: at or after it,
/// oldest first; backward: at or before it, newest first), at `min_level` or above, containing
/// `search`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogQuery {
    pub cursor: Option<Millis>,
    pub forward: bool,
    pub limit: usize,
    pub min_level: LogLevel,
    pub search: Option<String>,
}

/// A team's webhook: where its sandboxes' lifecycle events go.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookRecord {
    pub id: String,
    pub team_id: String,
    pub name: String,
    pub url: String,
    pub enabled: bool,
    /// Event types delivered (`sandbox.lifecycle.created`, …).
    pub events: Vec<String>,
    pub secret: Option<String>,
    /// The last event (`sandbox_events.seq`) handed over or given up on.
    pub delivered_seq: i64,
    pub created_at: Millis,
}

/// Which lifecycle events to read ([`Store::lifecycle_events`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventQuery {
    pub team_id: String,
    /// One sandbox's, or every sandbox's of the team.
    pub sandbox_id: Option<String>,
    /// Only these types (`sandbox.lifecycle.created`, …); all when empty.
    pub types: Vec<String>,
    /// Events after this sequence number only (for following).
    pub after_seq: Option<i64>,
    pub offset: u64,
    pub limit: u64,
    /// Oldest first; newest first otherwise.
    pub ascending: bool,
}

/// A stored event as E2B's lifecycle events API names it.
#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleEvent {
    /// `sandbox.lifecycle.created`, `…paused`, `…resumed`, `…killed` (failures too) or `…updated`
    /// (an event without a state change: a policy's report, a failed fork dump).
    pub kind: String,
    pub event: SandboxEvent,
    pub team_id: String,
    pub template_id: String,
    /// The template build whose sandbox this is (build sandboxes only).
    pub build_id: Option<String>,
}

/// A transition of a template build's sandbox, which has no sandbox record of its own: the event
/// names its team, template and build.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildSandboxEvent {
    pub sandbox_id: String,
    pub team_id: String,
    pub template_id: String,
    pub build_id: String,
    pub from_state: Option<SandboxState>,
    pub to_state: SandboxState,
    pub reason: String,
    pub at: Millis,
}

/// One stored state transition.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxEvent {
    pub seq: i64,
    pub sandbox_id: String,
    pub from_state: Option<SandboxState>,
    pub to_state: SandboxState,
    pub reason: Option<String>,
    pub at: Millis,
}

/// Which fleet-hygiene check recorded a note (`sandbox_events.policy`): the monitor's reports of a
/// runaway process, an OOM kill, memory pressure and a nearly full disk, orphaned processes reaped,
/// and a sandbox the reconciler destroyed. The dashboard's fleet view lists these notes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    RunawayCpu,
    OomKill,
    MemoryPressure,
    DiskFull,
    Orphans,
    Reconciler,
}

impl Policy {
    pub const ALL: [Policy; 6] = [
        Policy::RunawayCpu,
        Policy::OomKill,
        Policy::MemoryPressure,
        Policy::DiskFull,
        Policy::Orphans,
        Policy::Reconciler,
    ];

    /// The stored name; also the `policy` label of `warren_policy_actions_total`, but for
    /// `Reconciler`, whose fixes count in `warren_reconciled_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RunawayCpu => "runaway_cpu",
            Policy::OomKill => "oom_kill",
            Policy::MemoryPressure => "memory_pressure",
            Policy::DiskFull => "disk_full",
            Policy::Orphans => "orphans",
            Policy::Reconciler => "reconciler",
        }
    }

    pub fn parse(text: &str) -> Option<Policy> {
        Policy::ALL
            .into_iter()
            .find(|policy| policy.as_str() == text)
    }
}

/// A note of a fleet-hygiene check ([`Policy`]) on one of a team's sandboxes.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyEvent {
    pub policy: Policy,
    /// The template of the sandbox, when the store still has its row.
    pub template_id: Option<String>,
    pub event: SandboxEvent,
}

/// How long one create, resume or pause took (from its event, see [`SandboxState::finishes`]).
#[derive(Debug, Clone, PartialEq)]
pub struct OperationTiming {
    pub operation: Operation,
    pub sandbox_id: String,
    /// When it finished.
    pub at: Millis,
    pub took: Millis,
}

/// What changes together with a state transition.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TransitionUpdate {
    pub reason: Option<String>,
    /// How long the operation this transition finishes took ([`SandboxState::finishes`]), stored
    /// with its event. [`crate::lifecycle::Lifecycle`]'s `transition` sets it.
    pub took: Option<Millis>,
    /// `Some(None)` clears the field, `None` leaves it.
    pub ip: Option<Option<Ipv4Addr>>,
    pub init_pid: Option<Option<u32>>,
    pub pause_kind: Option<Option<PauseKind>>,
    pub snapshot_dir: Option<Option<PathBuf>>,
    pub end_at: Option<Millis>,
}

/// A server sharing the store (`servers` table).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerRecord {
    pub id: String,
    /// Its API's address, as it was told to listen (for operators).
    pub address: String,
    pub started_at: Millis,
    pub renewed_at: Millis,
    /// Row-less sandboxes it keeps on the runtime (build and warm-pool sandboxes).
    pub holds: Vec<String>,
    /// Whether it led at its last renewal.
    pub leading: bool,
}

/// What a server's renewal of its row says ([`Store::renew_server`]).
#[derive(Debug, Clone, Copy)]
pub struct ServerRenewal<'a> {
    pub address: &'a str,
    pub holds: &'a [String],
    pub leading: bool,
    pub now: Millis,
}

/// A new server ID: `srv-` and 16 hex digits.
pub fn new_server_id() -> String {
    format!("srv-{:016x}", rand::random::<u64>())
}

/// A snapshot of a running sandbox: a checkpoint new sandboxes restore from.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRecord {
    pub id: String,
    pub team_id: String,
    pub name: Option<String>,
    /// The sandbox it was taken from.
    pub sandbox_id: String,
    pub template_id: String,
    /// Read-only layers under the checkpoint, top-most first (restores must use the same).
    pub layers: Vec<PathBuf>,
    pub dir: PathBuf,
    pub size_bytes: u64,
    pub checksum_status: ChecksumStatus,
    pub vcpus: f64,
    pub memory_mib: u64,
    pub disk_mib: u64,
    /// Access token the checkpointed agent holds; a restored copy is re-initialised with it.
    pub envd_access_token: Option<String>,
    pub created_at: Millis,
}

/// What is known about a snapshot's checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumStatus {
    /// Every stored file has a SHA-256 in the manifest; the runtime verifies them at each restore.
    Sha256,
    /// A restore found a file that did not match its checksum.
    Mismatch,
    /// No manifest with checksums.
    None,
}

impl ChecksumStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ChecksumStatus::Sha256 => "sha256",
            ChecksumStatus::Mismatch => "mismatch",
            ChecksumStatus::None => "none",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "sha256" => Some(ChecksumStatus::Sha256),
            "mismatch" => Some(ChecksumStatus::Mismatch),
            "none" => Some(ChecksumStatus::None),
            _ => None,
        }
    }
}

/// Filter of [`Store::list_snapshots`]; newest first.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SnapshotFilter {
    /// Only this team's snapshots.
    pub team_id: Option<String>,
    pub sandbox_id: Option<String>,
    /// Matches the id or the name.
    pub name: Option<String>,
    /// Continue after this `(created_at, id)` position.
    pub after: Option<(Millis, String)>,
    pub limit: Option<u32>,
}

/// Filter of [`Store::list_sandboxes`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SandboxFilter {
    /// Only this team's sandboxes.
    pub team_id: Option<String>,
    /// Any of these states; empty means every state.
    pub states: Vec<SandboxState>,
    /// Every pair must match.
    pub metadata: BTreeMap<String, String>,
    pub template: Option<String>,
    pub started_after: Option<Millis>,
    /// Newest first when true.
    pub descending: bool,
    /// Continue after this `(started_at, id)` position.
    pub after: Option<(Millis, String)>,
    pub limit: Option<u32>,
}

#[async_trait]
pub trait Store: Send + Sync {
    // API keys
    async fn insert_api_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError>;
    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError>;
    /// Live (not revoked) key with this secret hash; records the use (at most once a minute).
    async fn use_api_key(
        &self,
        secret_hash: &str,
        now: Millis,
    ) -> Result<Option<ApiKeyRecord>, StoreError>;
    /// Revoke by id or name; returns how many keys were revoked.
    async fn revoke_api_key(&self, id_or_name: &str, now: Millis) -> Result<u64, StoreError>;

    // Teams
    async fn insert_team(&self, team: &TeamRecord) -> Result<(), StoreError>;
    async fn get_team(&self, id_or_name: &str) -> Result<Option<TeamRecord>, StoreError>;
    async fn list_teams(&self) -> Result<Vec<TeamRecord>, StoreError>;

    // Templates
    /// Inserts a template, or updates an existing one's build fields (its `policies` are kept: only
    /// [`Store::update_template_settings`] changes them).
    async fn upsert_template(&self, template: &TemplateRecord) -> Result<(), StoreError>;
    /// Changes what is given of a template's `public` flag and policies; false when no such template.
    async fn update_template_settings(
        &self,
        id: &str,
        public: Option<bool>,
        policies: Option<&warren_proto::api::SandboxPolicies>,
        now: Millis,
    ) -> Result<bool, StoreError>;
    /// By id or alias.
    async fn get_template(&self, id_or_alias: &str) -> Result<Option<TemplateRecord>, StoreError>;
    async fn list_templates(&self) -> Result<Vec<TemplateRecord>, StoreError>;
    async fn record_template_spawn(&self, id: &str, now: Millis) -> Result<(), StoreError>;
    /// Remove the template row (and its tags); returns whether it existed.
    async fn delete_template(&self, id: &str) -> Result<bool, StoreError>;
    /// Points each of `tags` of `template_id` at `build_id` (moving a tag that named another build).
    async fn assign_template_tags(
        &self,
        template_id: &str,
        build_id: &str,
        tags: &[String],
        now: Millis,
    ) -> Result<(), StoreError>;
    /// Removes `tags` of `template_id`; returns how many existed.
    async fn remove_template_tags(
        &self,
        template_id: &str,
        tags: &[String],
    ) -> Result<u64, StoreError>;
    /// The tags of `template_id`, by tag.
    async fn list_template_tags(&self, template_id: &str) -> Result<Vec<TemplateTag>, StoreError>;
    /// Records a build or its new state (created_at is kept from the first write).
    async fn upsert_build(&self, build: &BuildRecord) -> Result<(), StoreError>;
    async fn get_build(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<Option<BuildRecord>, StoreError>;
    /// Fails the builds left waiting or building by a server not among `live` (and templates whose
    /// current build that was); returns how many. Each build's owner is the server that last
    /// stored it; with `live` empty, every unfinished build fails (one server, at its start).
    async fn fail_unfinished_builds(
        &self,
        live: &[String],
        reason: &str,
        now: Millis,
    ) -> Result<u64, StoreError>;

    // Servers sharing the store (cluster mode, docs/cluster.md)
    /// This process's ID: the owner recorded on every sandbox row and build it writes.
    fn server_id(&self) -> &str;
    /// Whether other servers can share this store at once (PostgreSQL). A SQLite file is one
    /// server's alone.
    fn shared(&self) -> bool;
    /// Records that this server is alive at `now` (its row is inserted the first time), reachable at
    /// `address`, keeping the sandboxes in `holds` on the runtime without sandbox rows, and
    /// whether it leads.
    async fn renew_server(&self, renewal: &ServerRenewal<'_>) -> Result<(), StoreError>;
    /// The servers renewed at or after `since`, this one included when it was.
    async fn live_servers(&self, since: Millis) -> Result<Vec<ServerRecord>, StoreError>;
    /// Removes this server's row (a clean stop) and the rows not renewed since `before`.
    async fn forget_servers(&self, this_one: bool, before: Millis) -> Result<u64, StoreError>;
    /// Takes the lead among the servers sharing the store, or keeps it: true while this server holds
    /// it. One server leads at a time; it runs what must run once (timeouts, the reconciler, the
    /// monitor, webhooks). A store nobody shares always leads.
    async fn lead(&self) -> Result<bool, StoreError>;
    /// Sandboxes in `creating`, `pausing` or `resuming` last written by a server not among `live`:
    /// operations a dead server left half done.
    async fn orphaned_transitions(&self, live: &[String])
        -> Result<Vec<SandboxRecord>, StoreError>;
    /// Sandboxes in `creating`, `pausing` or `resuming` last written by this server.
    async fn own_transitions(&self) -> Result<Vec<SandboxRecord>, StoreError>;

    // Sandboxes
    /// Insert a new sandbox and its first event (`None → record.state`).
    /// Stores a new volume; [`StoreError::Duplicate`] when the team has one of that name.
    async fn insert_volume(&self, volume: &VolumeRecord) -> Result<(), StoreError>;
    /// The volume with this id, whatever its team (the content API checks the token instead).
    async fn get_volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError>;
    async fn get_volume_by_name(
        &self,
        team_id: &str,
        name: &str,
    ) -> Result<Option<VolumeRecord>, StoreError>;
    async fn list_volumes(&self, team_id: &str) -> Result<Vec<VolumeRecord>, StoreError>;
    /// Deletes the volume's row unless a sandbox that is not killed or failed mounts it (checked in
    /// the same transaction).
    async fn delete_volume(&self, id: &str) -> Result<VolumeDeletion, StoreError>;

    async fn insert_sandbox(&self, sandbox: &SandboxRecord) -> Result<(), StoreError>;
    async fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRecord>, StoreError>;
    async fn list_sandboxes(
        &self,
        filter: &SandboxFilter,
    ) -> Result<Vec<SandboxRecord>, StoreError>;
    /// Move a sandbox `from → to` (compare-and-set on `from`), apply `update` and store the event, in one
    /// transaction. The caller has checked the transition table.
    async fn transition_sandbox(
        &self,
        id: &str,
        from: SandboxState,
        to: SandboxState,
        update: &TransitionUpdate,
        now: Millis,
    ) -> Result<(), StoreError>;
    async fn set_sandbox_end(
        &self,
        id: &str,
        end_at: Millis,
        now: Millis,
    ) -> Result<(), StoreError>;
    /// Running sandboxes whose end time is at or before `now`.
    async fn expired_sandboxes(&self, now: Millis) -> Result<Vec<SandboxRecord>, StoreError>;
    async fn sandbox_events(&self, id: &str) -> Result<Vec<SandboxEvent>, StoreError>;
    /// Events of the kinds E2B's lifecycle API has (the steps in between, `creating` and the like,
    /// are left out), of a team's sandboxes, killed ones included.
    async fn lifecycle_events(&self, query: &EventQuery)
        -> Result<Vec<LifecycleEvent>, StoreError>;
    /// Store a transition of a template build's sandbox (see [`BuildSandboxEvent`]).
    async fn note_build_sandbox_event(&self, event: &BuildSandboxEvent) -> Result<(), StoreError>;
    /// Store an event that is no state change (`state → state`), e.g. a failed fork dump; `policy`
    /// names the fleet-hygiene check that made it, if one did.
    async fn note_sandbox_event(
        &self,
        id: &str,
        state: SandboxState,
        reason: &str,
        policy: Option<Policy>,
        now: Millis,
    ) -> Result<(), StoreError>;
    /// The notes of fleet-hygiene checks on team `team_id`'s sandboxes, newest first.
    async fn policy_events(
        &self,
        team_id: &str,
        limit: u32,
    ) -> Result<Vec<PolicyEvent>, StoreError>;
    /// How long team `team_id`'s creates, resumes and pauses that finished at or after `since`
    /// took, newest first.
    async fn operation_timings(
        &self,
        team_id: &str,
        since: Millis,
        limit: u32,
    ) -> Result<Vec<OperationTiming>, StoreError>;

    // Snapshots
    async fn insert_snapshot(&self, snapshot: &SnapshotRecord) -> Result<(), StoreError>;
    /// By id, or the newest with this name.
    async fn get_snapshot(&self, id_or_name: &str) -> Result<Option<SnapshotRecord>, StoreError>;
    async fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
    ) -> Result<Vec<SnapshotRecord>, StoreError>;
    /// Returns whether a row was deleted.
    async fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError>;
    async fn set_snapshot_checksum_status(
        &self,
        id: &str,
        status: ChecksumStatus,
    ) -> Result<(), StoreError>;

    // Idempotency keys of creates
    /// Claims `key` for team `team_id` unless a live (younger than `expired_before`) claim exists;
    /// answers the existing one then.
    async fn claim_idempotency_key(
        &self,
        team_id: &str,
        key: &str,
        request_hash: &str,
        now: Millis,
        expired_before: Millis,
    ) -> Result<IdempotencyClaim, StoreError>;
    /// Records the sandbox the claimed create made.
    async fn finish_idempotency_key(
        &self,
        team_id: &str,
        key: &str,
        sandbox_id: &str,
    ) -> Result<(), StoreError>;
    /// Replaces a sandbox's egress rules.
    async fn set_sandbox_egress(
        &self,
        id: &str,
        egress: &warren_runtime::network::egress::EgressRules,
    ) -> Result<(), StoreError>;
    /// Drops the claim of a create that failed, so a retry may try again.
    async fn release_idempotency_key(&self, team_id: &str, key: &str) -> Result<(), StoreError>;

    // Workspaces
    async fn get_workspace(
        &self,
        team_id: &str,
        user_id: &str,
    ) -> Result<Option<WorkspaceRecord>, StoreError>;
    /// Stores the workspace as it is now and the move that made it so, together.
    async fn record_workspace_move(
        &self,
        workspace: &WorkspaceRecord,
        entry: &WorkspaceMove,
    ) -> Result<(), StoreError>;
    async fn workspace_history(
        &self,
        team_id: &str,
        user_id: &str,
    ) -> Result<Vec<WorkspaceMove>, StoreError>;

    // Webhooks
    async fn upsert_webhook(&self, webhook: &WebhookRecord) -> Result<(), StoreError>;
    async fn list_webhooks(&self) -> Result<Vec<WebhookRecord>, StoreError>;
    /// Returns whether a row was deleted.
    async fn delete_webhook(&self, id: &str) -> Result<bool, StoreError>;
    async fn set_webhook_delivered(&self, id: &str, seq: i64) -> Result<(), StoreError>;
    /// The newest event's sequence number (0 with none): a new webhook starts after it.
    async fn latest_event_seq(&self) -> Result<i64, StoreError>;
    /// Deletes events recorded before `before`; returns how many.
    async fn prune_sandbox_events(&self, before: Millis) -> Result<u64, StoreError>;

    // Metrics history
    async fn insert_metric_samples(&self, samples: &[MetricSample]) -> Result<(), StoreError>;
    /// The samples of sandbox `id` taken in `from..=to`, oldest first.
    async fn metric_samples(
        &self,
        id: &str,
        from: Millis,
        to: Millis,
    ) -> Result<Vec<MetricSample>, StoreError>;
    /// The newest sample of each of `ids` that has one.
    async fn latest_metric_samples(&self, ids: &[String]) -> Result<Vec<MetricSample>, StoreError>;
    /// Deletes samples taken before `before`; returns how many.
    async fn prune_metric_samples(&self, before: Millis) -> Result<u64, StoreError>;

    // Sandbox logs
    /// Stores lines (one already stored, by sandbox and sequence number, is left as it is) and
    /// keeps at most `keep_per_sandbox` of each sandbox written to, dropping its oldest.
    async fn insert_sandbox_logs(
        &self,
        lines: &[SandboxLogLine],
        keep_per_sandbox: u64,
    ) -> Result<(), StoreError>;
    async fn sandbox_logs(
        &self,
        id: &str,
        query: &LogQuery,
    ) -> Result<Vec<SandboxLogLine>, StoreError>;
    /// Sandbox `id`'s lines with a sequence number above `after`, in order, at most `limit`.
    async fn sandbox_logs_after(
        &self,
        id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<SandboxLogLine>, StoreError>;
    /// The highest sequence number stored for sandbox `id`.
    async fn last_sandbox_log_seq(&self, id: &str) -> Result<Option<i64>, StoreError>;
    /// Deletes lines recorded before `before`; returns how many.
    async fn prune_sandbox_logs(&self, before: Millis) -> Result<u64, StoreError>;

    // Secrets (values sealed by the caller)
    /// False when the team already has a secret of that name.
    async fn insert_secret(&self, secret: &SecretRecord) -> Result<bool, StoreError>;
    /// Team `team_id`'s secret with this id, or else this name (matched lower-cased).
    async fn get_secret(
        &self,
        team_id: &str,
        id_or_name: &str,
    ) -> Result<Option<SecretRecord>, StoreError>;
    /// A team's secrets, oldest first, after `(created_at, id)` when given.
    async fn list_secrets(
        &self,
        team_id: &str,
        after: Option<(Millis, String)>,
        limit: u32,
    ) -> Result<Vec<SecretRecord>, StoreError>;
    /// Stores `secret`'s new version, value and metadata if its row is still at
    /// `expected_version`; false otherwise.
    async fn update_secret(
        &self,
        secret: &SecretRecord,
        expected_version: i64,
    ) -> Result<bool, StoreError>;
    /// Returns whether a row was deleted.
    async fn delete_secret(&self, team_id: &str, id: &str) -> Result<bool, StoreError>;
}

/// A stored secret: its value only sealed with the operator's key (see `crate::secrets`).
#[derive(Debug, Clone, PartialEq)]
pub struct SecretRecord {
    pub id: String,
    pub team_id: String,
    /// Lower-cased.
    pub name: String,
    /// Version of the value, from 1; the sealed value is bound to it.
    pub version: i64,
    pub sealed: crate::secrets::Sealed,
    pub metadata: BTreeMap<String, String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// What [`Store::claim_idempotency_key`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum IdempotencyClaim {
    /// The key is this caller's now.
    Claimed,
    /// An earlier request holds it: with this request hash, and the sandbox it made once done.
    Held {
        request_hash: String,
        sandbox_id: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database's error with only a code, as either driver reports one.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "coded"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[test]
    fn a_full_disk_is_recognised_on_both_back_ends() {
        let error = |code| StoreError::Database(sqlx::Error::Database(Box::new(Coded(code))));
        // SQLITE_FULL, PostgreSQL's disk_full.
        assert!(error("13").disk_full());
        assert!(error("53100").disk_full());
        // A unique violation on either, and PostgreSQL's out_of_memory.
        for code in ["2067", "23505", "53200"] {
            assert!(!error(code).disk_full(), "{code}");
        }
    }

    #[test]
    fn database_urls_show_no_password() {
        let url: DatabaseUrl =
            "postgres://warren:s3cret@db:5432/warren?sslmode=disable&password=other"
                .parse()
                .unwrap();
        let shown = format!("{url} {url:?} {}", Database::Postgres(url.clone()));
        assert!(
            !shown.contains("s3cret") && !shown.contains("other"),
            "{shown}"
        );
        assert!(
            shown.contains("postgres://warren:REDACTED@db:5432/warren?sslmode=disable"),
            "{shown}"
        );
        assert!(url.expose().contains("s3cret"));
        let plain: DatabaseUrl = "postgresql://db/warren".parse().unwrap();
        assert_eq!(plain.to_string(), "postgresql://db/warren");
        assert_eq!(
            "sqlite:///tmp/x".parse::<DatabaseUrl>(),
            Err(DatabaseUrlError::Scheme("sqlite".into()))
        );
    }
}
