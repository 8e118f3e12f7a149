//! The operations on sandboxes. Each one takes the sandbox's lock, checks the transition table, calls the
//! runtime and stores the transition. HTTP handlers and the proxy only call these. This file holds the
//! `Lifecycle` itself, its errors and the helpers every operation shares; each operation has its own file.

mod create;
mod kill;
mod log_tail;
pub use log_tail::LogTail;
mod logs;
pub mod migrate;
pub use logs::LogItem;
mod network;
mod orphans;
pub(crate) use orphans::agent_processes;
mod pause;
pub mod pool;
mod query;
mod resume;
mod secrets;
pub use secrets::SecretChange;

pub(crate) use create::StartSource;
pub use create::{CreateRequest, CreatedSandbox};
pub use pause::PauseMode;
pub use resume::ResumeOutcome;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rand::distr::{Alphanumeric, SampleString};
use rand::Rng;
use warren_runtime::{Capabilities, Resources, Runtime, RuntimeError, SandboxSpec};

use super::admission::AdmissionError;
use super::agent_init::AgentInitError;
use super::now_millis;
use super::routes::{Route, RouteTable};
use super::state::{InvalidTransition, SandboxState};
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::store::{Millis, SandboxFilter, SandboxRecord, Store, StoreError, TransitionUpdate};

/// User the agent runs commands as unless a request names another.
const DEFAULT_USER: &str = "user";
/// Client ID reported for every sandbox of this node.
const CLIENT_ID: &str = "warren";

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("template '{0}' not found")]
    TemplateNotFound(String),
    #[error("user {0} has no workspace")]
    WorkspaceNotFound(String),
    #[error("node {0} not found")]
    NodeNotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Quota(#[from] AdmissionError),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Transition(#[from] InvalidTransition),
    #[error("runtime failed to {action} sandbox {id}")]
    Runtime {
        action: &'static str,
        id: String,
        #[source]
        source: RuntimeError,
    },
    #[error("agent of sandbox {id} did not initialise")]
    AgentInit {
        id: String,
        #[source]
        source: AgentInitError,
    },
    #[error("template start of sandbox {id} failed")]
    TemplateStart {
        id: String,
        #[source]
        source: crate::templates::builder::instantiate::InstantiateError,
    },
    #[error("store failed")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Unsupported(String),
    /// The guest agent did not answer a health check that the operation requires; nothing changed.
    #[error(
        "the guest agent of sandbox {0} is not responding; the sandbox keeps running unchanged"
    )]
    GuestUnresponsive(String),
    #[error(transparent)]
    Secrets(#[from] crate::secrets::SecretsError),
}

/// Why the proxy cannot reach a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("sandbox {0} is paused and does not resume on traffic; resume it through the API")]
    Paused(String),
    #[error("sandbox {id} could not be resumed")]
    ResumeFailed {
        id: String,
        #[source]
        source: Box<LifecycleError>,
    },
    #[error("store failed")]
    Store(#[from] StoreError),
}

pub struct Lifecycle {
    store: Arc<dyn Store>,
    runtime: Arc<dyn Runtime>,
    config: ServerConfig,
    capabilities: Capabilities,
    metrics: Arc<Metrics>,
    /// One lock per sandbox: operations on one sandbox happen one after another.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Serialises admission checks with the insert that follows them.
    admission: tokio::sync::Mutex<()>,
    /// Running sandboxes' addresses (and the ones being killed), for the proxy's fast path.
    routes: RouteTable,
    /// Requests through the proxy, per sandbox (the idle policy's input).
    activity: Arc<crate::lifecycle::activity::Activity>,
    /// Per running sandbox, the last agent log entry collected.
    log_cursors: Mutex<HashMap<String, u64>>,
    /// The sandboxes template builds work in now (set once the build service exists).
    build_sandboxes: Mutex<Option<BuildSandboxSource>>,
    /// What the template builds' sandboxes hold, by sandbox: admitted like every other sandbox
    /// and counted in every admission while they live.
    build_usage: Mutex<HashMap<String, BuildHold>>,
    /// The operator's key for stored secrets (loaded, or made, once).
    keyring: crate::secrets::Keyring,
    /// Room for sandboxes being set up or torn down at once (`--setup-concurrency`, see
    /// `on_runtime_setup`).
    setup_slots: tokio::sync::Semaphore,
    /// Restored, frozen sandboxes waiting for creates of their template (`--warm-pool`).
    pools: pool::WarmPools,
    /// Whether this server leads the servers sharing its store (`lifecycle::servers`).
    pub(in crate::lifecycle) leading: std::sync::atomic::AtomicBool,
    /// Whether other servers may change this server's sandboxes: a shared store and nodes. Then
    /// the proxy's route cache is not trusted (another server may pause a sandbox and its address
    /// go to a new one), and the row is read for every connection.
    pub(in crate::lifecycle) coordinated: bool,
}

/// What a template build's sandbox holds, and whose it is.
struct BuildHold {
    /// The template's team (its quotas count the sandbox).
    team: Option<String>,
    request: super::admission::Request,
    /// Template and build, once the sandbox is up (its events name them).
    started: Option<(String, String)>,
}

/// Answers which template-build sandboxes a running build works in.
pub type BuildSandboxSource = Arc<dyn Fn() -> std::collections::HashSet<String> + Send + Sync>;

fn runtime_error(action: &'static str, id: &str) -> impl FnOnce(RuntimeError) -> LifecycleError {
    let id = id.to_string();
    move |source| LifecycleError::Runtime { action, id, source }
}

/// A random sandbox ID: 20 lower-case letters and digits, starting with a letter (a DNS label that
/// contains no `-`, so `<port>-<id>` splits cleanly).
pub(crate) fn new_sandbox_id() -> String {
    let mut rng = rand::rng();
    let first = rng.random_range(b'a'..=b'z') as char;
    let rest: String = Alphanumeric
        .sample_string(&mut rng, 19)
        .to_ascii_lowercase();
    format!("{first}{rest}")
}

pub(crate) fn new_access_token() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill(&mut bytes);
    hex::encode(bytes)
}

impl Lifecycle {
    pub fn new(
        store: Arc<dyn Store>,
        runtime: Arc<dyn Runtime>,
        config: ServerConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let capabilities = runtime.capabilities();
        let store_shared = store.shared();
        let runtime_nodes = runtime.nodes();
        let keyring =
            crate::secrets::Keyring::load(config.secrets_key_file.as_deref(), &config.state_dir);
        let setup_slots = tokio::sync::Semaphore::new(match config.limits.setup_concurrency {
            0 => 2 * std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
            n => n,
        });
        Lifecycle {
            keyring,
            store,
            runtime,
            config,
            capabilities,
            metrics,
            locks: Mutex::new(HashMap::new()),
            admission: tokio::sync::Mutex::new(()),
            routes: RouteTable::default(),
            activity: Arc::default(),
            log_cursors: Mutex::new(HashMap::new()),
            build_sandboxes: Mutex::new(None),
            build_usage: Mutex::new(HashMap::new()),
            setup_slots,
            pools: pool::WarmPools::default(),
            leading: std::sync::atomic::AtomicBool::new(false),
            coordinated: store_shared && !runtime_nodes.is_empty(),
        }
    }

    /// Admits a template build's sandbox `id` asking for `request`, against the host's limits and
    /// capacity with every live sandbox and every other build sandbox counted, and against the
    /// quotas of `team` (the template's) with that team's; it counts itself until
    /// [`Lifecycle::release_build_sandbox`].
    pub async fn admit_build_sandbox(
        &self,
        id: &str,
        team: Option<&str>,
        request: super::admission::Request,
    ) -> Result<(), LifecycleError> {
        let _admitting = self.admission.lock().await;
        let live = self.resource_holders().await?;
        let capacity = self
            .on_runtime(|runtime| runtime.host_capacity())
            .await
            .map_err(runtime_error("measure the host for", id))?;
        let max_pids = self.config.default_resources.max_pids;
        let usage =
            self.usage_with_builds(super::admission::Usage::of(&live, max_pids), Some(id), None);
        super::admission::admit(&self.config.limits, usage, request, capacity)
            .map_err(LifecycleError::from)?;
        if let Some(team_id) = team {
            if let Some(record) = self.store.get_team(team_id).await? {
                let own = live.iter().filter(|s| s.team_id == team_id);
                let usage = self.usage_with_builds(
                    super::admission::Usage::of(own, max_pids),
                    Some(id),
                    Some(team_id),
                );
                super::admission::admit_team(&record, usage, request)
                    .map_err(LifecycleError::from)?;
            }
        }
        self.build_usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id.to_string(),
                BuildHold {
                    team: team.map(str::to_string),
                    request,
                    started: None,
                },
            );
        Ok(())
    }

    /// The admitted build sandbox `id` is up, working on `step` of `template_id`'s build
    /// `build_id`: recorded as created, under the template's team, like any sandbox's start.
    pub async fn build_sandbox_started(
        &self,
        id: &str,
        template_id: &str,
        build_id: &str,
        step: &str,
    ) -> Result<(), StoreError> {
        let team = {
            let mut builds = self.build_usage.lock().unwrap_or_else(|p| p.into_inner());
            let Some(hold) = builds.get_mut(id) else {
                return Ok(());
            };
            hold.started = Some((template_id.to_string(), build_id.to_string()));
            hold.team.clone()
        };
        let Some(team_id) = team else {
            return Ok(());
        };
        self.store
            .note_build_sandbox_event(&crate::store::BuildSandboxEvent {
                sandbox_id: id.to_string(),
                team_id,
                template_id: template_id.to_string(),
                build_id: build_id.to_string(),
                from_state: Some(SandboxState::Creating),
                to_state: SandboxState::Running,
                reason: format!("template build {build_id}: {step}"),
                at: now_millis(),
            })
            .await
    }

    /// The sandboxes whose state holds host resources (what admission counts).
    pub(crate) async fn resource_holders(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        self.store
            .list_sandboxes(&SandboxFilter {
                states: SandboxState::ALL
                    .into_iter()
                    .filter(|s| s.holds_resources())
                    .collect(),
                ..SandboxFilter::default()
            })
            .await
    }

    /// The build sandbox `id` is gone (`how` says why): it no longer counts, and if it was up, it
    /// is recorded as killed.
    pub async fn release_build_sandbox(&self, id: &str, how: &str) -> Result<(), StoreError> {
        let hold = self
            .build_usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        let Some(BuildHold {
            team: Some(team_id),
            started: Some((template_id, build_id)),
            ..
        }) = hold
        else {
            return Ok(());
        };
        self.store
            .note_build_sandbox_event(&crate::store::BuildSandboxEvent {
                sandbox_id: id.to_string(),
                team_id,
                template_id,
                build_id,
                from_state: Some(SandboxState::Running),
                to_state: SandboxState::Killed,
                reason: how.to_string(),
                at: now_millis(),
            })
            .await
    }

    /// `usage` plus what the live build sandboxes hold (but `except`; only `team`'s when given).
    pub(crate) fn usage_with_builds(
        &self,
        mut usage: super::admission::Usage,
        except: Option<&str>,
        team: Option<&str>,
    ) -> super::admission::Usage {
        let builds = self.build_usage.lock().unwrap_or_else(|p| p.into_inner());
        for (id, hold) in builds.iter() {
            let (owner, held) = (&hold.team, &hold.request);
            if Some(id.as_str()) == except || team.is_some_and(|t| owner.as_deref() != Some(t)) {
                continue;
            }
            usage.sandboxes += 1;
            usage.vcpus += held.vcpus;
            usage.memory_mib += held.memory_mib;
            usage.tasks += held.max_pids;
            // Their disks are on the host already, where the capacity measurement sees them.
        }
        usage
    }

    /// Where the reconciler learns which template-build sandboxes are in use: it renews their
    /// deadlines and ends the others.
    pub fn track_build_sandboxes(&self, source: BuildSandboxSource) {
        *self
            .build_sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(source);
    }

    /// The template-build sandboxes in use now; `None` when no build service told (then every
    /// build sandbox counts as in use).
    pub(crate) fn build_sandboxes_in_use(&self) -> Option<std::collections::HashSet<String>> {
        let source = self
            .build_sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        source.map(|answer| answer())
    }

    /// Requests through the proxy, per sandbox.
    pub fn activity(&self) -> &Arc<crate::lifecycle::activity::Activity> {
        &self.activity
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Run a blocking runtime call off the async threads.
    /// The runtime, for work that outlives the operation that starts it.
    pub(crate) fn runtime_handle(&self) -> Arc<dyn Runtime> {
        Arc::clone(&self.runtime)
    }

    pub(crate) async fn on_runtime<T, F>(&self, call: F) -> Result<T, RuntimeError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Runtime) -> Result<T, RuntimeError> + Send + 'static,
    {
        let runtime = Arc::clone(&self.runtime);
        tokio::task::spawn_blocking(move || call(runtime.as_ref()))
            .await
            .unwrap_or_else(|join| {
                Err(RuntimeError::failed(format!(
                    "runtime call panicked: {join}"
                )))
            })
    }

    /// A runtime call that sets a sandbox up or tears it down (create, restore, boot, destroy):
    /// as [`Lifecycle::on_runtime`], with at most `--setup-concurrency` such calls at a time (two
    /// per CPU by default). They are mostly CPU work (mounts, namespaces, cgroups, the network, the
    /// agent's start); many more of them at once only lengthen the run queue that everything else
    /// on the host waits in, commands in running sandboxes included, without finishing sooner
    /// (docs/performance.md has the figures). The others wait here, in order.
    pub(crate) async fn on_runtime_setup<T, F>(&self, call: F) -> Result<T, RuntimeError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Runtime) -> Result<T, RuntimeError> + Send + 'static,
    {
        let _slot = self
            .setup_slots
            .acquire()
            .await
            .map_err(|closed| RuntimeError::failed(format!("setup slots closed: {closed}")))?;
        self.on_runtime(call).await
    }

    pub(crate) fn lock_for(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(locks.entry(id.to_string()).or_default())
    }

    pub(crate) fn forget_lock(&self, id: &str) {
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        locks.remove(id);
    }

    /// Check the table, store the transition and its event, and keep the caches in step.
    pub(crate) async fn transition(
        &self,
        record: &mut SandboxRecord,
        to: SandboxState,
        update: TransitionUpdate,
    ) -> Result<(), LifecycleError> {
        record.state.check_transition(to)?;
        let now = now_millis();
        // The in-between state (`creating`, `resuming`, `pausing`) was entered at the record's last
        // update: the operation took since then.
        let update = TransitionUpdate {
            took: record
                .state
                .finishes(to)
                .map(|_| now.saturating_sub(record.updated_at)),
            ..update
        };
        self.store
            .transition_sandbox(&record.id, record.state, to, &update, now)
            .await?;
        tracing::info!(sandbox = %record.id, from = %record.state, to = %to, reason = ?update.reason, "sandbox transition");
        self.metrics.transition(record.state, to);
        record.state = to;
        record.state_reason = update.reason;
        record.updated_at = now;
        if let Some(ip) = update.ip {
            record.ip = ip;
        }
        if let Some(pid) = update.init_pid {
            record.init_pid = pid;
        }
        if let Some(kind) = update.pause_kind {
            record.pause_kind = kind;
        }
        if let Some(dir) = update.snapshot_dir {
            record.snapshot_dir = dir;
        }
        if let Some(end_at) = update.end_at {
            record.end_at = end_at;
        }
        match (to, record.ip) {
            (SandboxState::Running, Some(ip)) => {
                self.routes.set(&record.id, Some(Route::live(ip, record)))
            }
            _ => self.routes.set(&record.id, None),
        }
        if to.is_terminal() {
            self.forget_lock(&record.id);
        }
        Ok(())
    }

    /// Move to `failed`, logging (not returning) a store error: the caller is already reporting one.
    async fn fail(&self, record: &mut SandboxRecord, reason: String) {
        tracing::warn!(sandbox = %record.id, %reason, "sandbox failed");
        let update = TransitionUpdate {
            reason: Some(reason),
            ip: Some(None),
            init_pid: Some(None),
            ..TransitionUpdate::default()
        };
        if let Err(error) = self.transition(record, SandboxState::Failed, update).await {
            tracing::error!(sandbox = %record.id, %error, "cannot record failure");
        }
    }

    /// Take the sandbox's lock and read it; `NotFound` (and no lock left behind) unless it is live.
    pub(crate) async fn lock_live(
        &self,
        id: &str,
    ) -> Result<(tokio::sync::OwnedMutexGuard<()>, SandboxRecord), LifecycleError> {
        let held = self.lock_for(id).lock_owned().await;
        match self.live_record(id).await {
            Ok(record) => Ok((held, record)),
            Err(error) => {
                drop(held);
                self.forget_lock(id);
                Err(error)
            }
        }
    }

    /// A live (non-terminal) sandbox, or `NotFound`.
    async fn live_record(&self, id: &str) -> Result<SandboxRecord, LifecycleError> {
        match self.store.get_sandbox(id).await? {
            Some(record) if !record.state.is_terminal() => Ok(record),
            _ => Err(LifecycleError::NotFound(id.to_string())),
        }
    }

    /// Validate a timeout in seconds against the node's maximum.
    pub fn timeout_millis(&self, timeout: Option<i64>) -> Result<Millis, LifecycleError> {
        let max = self.config.limits.max_timeout.as_secs() as i64;
        let seconds = match timeout {
            None => self.config.limits.default_timeout.as_secs() as i64,
            Some(seconds) if seconds <= 0 => {
                return Err(LifecycleError::BadRequest(format!(
                    "timeout must be a positive number of seconds, got {seconds}"
                )))
            }
            Some(seconds) if seconds > max => {
                return Err(LifecycleError::BadRequest(format!(
                    "timeout {seconds} s is longer than this server's maximum of {max} s"
                )))
            }
            Some(seconds) => seconds,
        };
        Ok(seconds * 1000)
    }

    pub(crate) fn spec_with_layers(
        &self,
        record: &SandboxRecord,
        layers: Vec<PathBuf>,
        network: warren_runtime::NetworkSpec,
    ) -> SandboxSpec {
        SandboxSpec {
            id: record.id.clone(),
            layers,
            resources: Resources {
                vcpus: record.vcpus,
                memory_mib: record.memory_mib,
                disk_mib: record.disk_mib,
                max_pids: self.config.default_resources.max_pids,
            },
            network,
            syscalls: Default::default(),
            volumes: record
                .volumes
                .iter()
                .filter_map(|mount| {
                    let disk = warren_runtime::rootfs::volume_disk::VolumeDisk::at(
                        &self.config.state_dir.join(crate::volumes::VOLUMES_DIR),
                        &mount.volume_id,
                    )
                    .ok()?;
                    // The runtime refuses a volume that is not mounted; the error says which.
                    if let Err(error) = disk.ensure_mounted() {
                        tracing::warn!(volume = %mount.volume_id, %error, "cannot mount volume");
                    }
                    Some(warren_runtime::rootfs::volume_disk::VolumeBind {
                        source: disk.mount_point,
                        target: PathBuf::from(&mount.path),
                    })
                })
                .collect(),
        }
    }
}

pub(crate) async fn remove_snapshot(dir: &std::path::Path) {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => tracing::warn!(dir = %dir.display(), %error, "cannot remove snapshot"),
    }
}
