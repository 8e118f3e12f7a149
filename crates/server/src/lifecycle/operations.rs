//! The operations on sandboxes. Each one takes the sandbox's lock, checks the transition table, calls the
//! runtime and stores the transition. HTTP handlers and the proxy only call these.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rand::distributions::{Alphanumeric, DistString};
use rand::Rng;
use warren_proto::api::EnvdInit;
use warren_runtime::{Capabilities, Resources, Runtime, RuntimeError, Sandbox, SandboxSpec, Stats};

use super::admission::{self, AdmissionError, Request, Usage};
use super::agent_init::{init_agent, AgentInitError};
use super::now_millis;
use super::routes::{Route, RouteTable, TrafficRoute};
use super::state::{InvalidTransition, SandboxState};
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::store::{
    Millis, PauseKind, SandboxEvent, SandboxFilter, SandboxRecord, Store, StoreError,
    TemplateRecord, TransitionUpdate,
};
use warren_runtime::network::egress::{Cidr, EgressRules};

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
        source: crate::templates::build::instantiate::InstantiateError,
    },
    #[error("store failed")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Unsupported(String),
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

/// A validated create request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CreateRequest {
    /// The team the sandbox belongs to (the API key's).
    pub team_id: String,
    pub template: String,
    pub timeout: Option<i64>,
    pub auto_pause: bool,
    pub auto_resume: Option<bool>,
    pub secure: bool,
    /// `network.allowPublicTraffic = false`: user ports need the traffic access token.
    pub private_traffic: bool,
    /// `network.allowOut` / `denyOut` by address.
    pub egress: EgressRules,
    pub allow_internet: Option<bool>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreatedSandbox {
    pub record: SandboxRecord,
}

/// What connect/resume did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeOutcome {
    Resumed,
    AlreadyRunning,
}

/// What a new sandbox starts from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StartSource {
    pub template_id: String,
    pub alias: Option<String>,
    /// Read-only layers, top-most first.
    pub layers: Vec<PathBuf>,
    pub vcpus: f64,
    pub memory_mib: u64,
    pub disk_mib: u64,
    /// Restore this checkpoint (template build, snapshot or fork) instead of starting fresh.
    pub checkpoint: Option<PathBuf>,
    /// Access token the checkpointed agent still holds, to re-initialise it with.
    pub agent_token: Option<String>,
    pub counts_as_template_spawn: bool,
    /// A built template without a checkpoint whose start_cmd must run (and ready_cmd pass) in every new
    /// sandbox, as the build's finalize step did.
    pub cold_start: Option<crate::templates::build::versions::BuiltTemplate>,
}

/// How a sandbox of a built template begins: the checkpoint its build left (start command running,
/// ready check passed), or else the build record when its start command must run at create. Neither
/// for templates without a build record (the built-in `base`) or without a start command.
fn template_start(
    config: &ServerConfig,
    template: &TemplateRecord,
) -> (
    Option<PathBuf>,
    Option<crate::templates::build::versions::BuiltTemplate>,
) {
    let versions = crate::templates::build::versions::TemplateVersions::new(&config.state_dir);
    match versions.load(&template.id, &template.build_id) {
        Ok(built) => match &built.start {
            crate::templates::build::versions::TemplateStart::Checkpoint { dir } => {
                (Some(dir.clone()), None)
            }
            _ if built.start_cmd.is_some() => (None, Some(built)),
            _ => (None, None),
        },
        Err(_) => (None, None),
    }
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
}

fn runtime_error(action: &'static str, id: &str) -> impl FnOnce(RuntimeError) -> LifecycleError {
    let id = id.to_string();
    move |source| LifecycleError::Runtime { action, id, source }
}

/// A random sandbox ID: 20 lower-case letters and digits, starting with a letter (a DNS label that
/// contains no `-`, so `<port>-<id>` splits cleanly).
pub(crate) fn new_sandbox_id() -> String {
    let mut rng = rand::thread_rng();
    let first = rng.gen_range(b'a'..=b'z') as char;
    let rest: String = Alphanumeric
        .sample_string(&mut rng, 19)
        .to_ascii_lowercase();
    format!("{first}{rest}")
}

pub(crate) fn new_access_token() -> String {
    let mut bytes = [0u8; 24];
    rand::thread_rng().fill(&mut bytes);
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
        Lifecycle {
            store,
            runtime,
            config,
            capabilities,
            metrics,
            locks: Mutex::new(HashMap::new()),
            admission: tokio::sync::Mutex::new(()),
            routes: RouteTable::default(),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Run a blocking runtime call off the async threads.
    pub(crate) async fn on_runtime<T, F>(&self, call: F) -> Result<T, RuntimeError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Runtime) -> Result<T, RuntimeError> + Send + 'static,
    {
        let runtime = Arc::clone(&self.runtime);
        tokio::task::spawn_blocking(move || call(runtime.as_ref()))
            .await
            .unwrap_or_else(|join| {
                Err(RuntimeError::Other(format!(
                    "runtime call panicked: {join}"
                )))
            })
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
            network: network_spec(record),
            syscalls: Default::default(),
        }
    }

    /// Replaces a sandbox's egress rules (`PUT /sandboxes/{id}/network`): at once on a running one, at
    /// its next resume on a paused one; kept in the store either way.
    pub async fn set_egress(&self, id: &str, rules: EgressRules) -> Result<(), LifecycleError> {
        let (_held, record) = self.lock_live(id).await?;
        let updated = SandboxRecord {
            egress: rules,
            ..record.clone()
        };
        if record.state == SandboxState::Running {
            let spec = network_spec(&updated);
            let id_owned = id.to_string();
            self.on_runtime(move |runtime| runtime.set_network(&id_owned, &spec))
                .await
                .map_err(|source| LifecycleError::Runtime {
                    action: "set the egress rules of",
                    id: id.to_string(),
                    source,
                })?;
            // New header rules over HTTPS need the egress CA trusted inside.
            if let (false, Some(ip)) = (updated.egress.header_rules.is_empty(), updated.ip) {
                let addr = std::net::SocketAddr::from((ip, warren_runtime::AGENT_PORT));
                self.init_agent_at(&updated, addr, updated.envd_access_token.as_deref())
                    .await?;
            }
        }
        self.store.set_sandbox_egress(id, &updated.egress).await?;
        Ok(())
    }

    /// Gives an adopted sandbox its network rules again: nftables kept them across the restart, but
    /// the egress proxy's host-name rules lived in the old process. Without this its allowed names
    /// would be refused (the proxy fails closed), never wrongly allowed.
    pub(crate) async fn reinstall_network(&self, record: &SandboxRecord) {
        if record.egress.allow_hosts.is_empty() {
            return;
        }
        let spec = network_spec(record);
        let id = record.id.clone();
        if let Err(error) = self
            .on_runtime(move |runtime| runtime.set_network(&id, &spec))
            .await
        {
            tracing::warn!(sandbox = %record.id, %error, "cannot reinstall the egress rules of an adopted sandbox");
        }
    }

    /// The ready template `id_or_alias` as team `team_id` sees it: its own or a public one.
    async fn template(
        &self,
        team_id: &str,
        id_or_alias: &str,
    ) -> Result<TemplateRecord, LifecycleError> {
        let visible = |t: &TemplateRecord| t.public || t.team_id == team_id;
        let (name, tag) = crate::templates::tags::split_reference(id_or_alias);
        match self.store.get_template(name).await?.filter(visible) {
            Some(template) if template.status == "ready" => {
                let store = self.store.as_ref();
                crate::templates::tags::template_at_tag(
                    store,
                    &self.config.state_dir,
                    template,
                    tag,
                )
                .await
                .map_err(|e| LifecycleError::Conflict(e.to_string()))?
                .ok_or_else(|| LifecycleError::TemplateNotFound(id_or_alias.to_string()))
            }
            Some(template) => Err(LifecycleError::Conflict(format!(
                "template '{id_or_alias}' is not ready (status {})",
                template.status
            ))),
            None => Err(LifecycleError::TemplateNotFound(id_or_alias.to_string())),
        }
    }

    async fn init_agent_of(
        &self,
        record: &SandboxRecord,
        sandbox: &Sandbox,
        previous_token: Option<&str>,
    ) -> Result<(), LifecycleError> {
        self.init_agent_at(record, sandbox.agent_addr(), previous_token)
            .await
    }

    /// `POST /init` to the agent at `addr` with what `record` gives it; a sandbox whose egress has
    /// header rules also gets the host's egress CA to trust.
    async fn init_agent_at(
        &self,
        record: &SandboxRecord,
        addr: std::net::SocketAddr,
        previous_token: Option<&str>,
    ) -> Result<(), LifecycleError> {
        let trusted_ca = if record.egress.header_rules.is_empty() {
            None
        } else {
            self.on_runtime(|runtime| Ok(runtime.egress_trust_anchor()))
                .await
                .ok()
                .flatten()
        };
        let body = EnvdInit {
            env_vars: record.env_vars.clone(),
            access_token: record.envd_access_token.clone(),
            default_user: Some(DEFAULT_USER.to_string()),
            default_workdir: None,
            timestamp: Some(chrono::Utc::now()),
            warren_trusted_ca: trusted_ca,
        };
        init_agent(addr, &body, previous_token, self.config.agent_init_timeout)
            .await
            .map_err(|source| LifecycleError::AgentInit {
                id: record.id.clone(),
                source,
            })
    }

    /// Where a sandbox of `id_or_alias` starts from: a ready template (its build checkpoint when the
    /// build left one, else a cold start on its layers), or else a snapshot of that id or name.
    async fn start_source(
        &self,
        team_id: &str,
        id_or_alias: &str,
    ) -> Result<StartSource, LifecycleError> {
        match self.template(team_id, id_or_alias).await {
            Ok(template) => {
                let (checkpoint, cold_start) = template_start(&self.config, &template);
                Ok(StartSource {
                    template_id: template.id.clone(),
                    alias: (id_or_alias != template.id).then(|| id_or_alias.to_string()),
                    layers: template.layers.clone(),
                    vcpus: template.vcpus,
                    memory_mib: template.memory_mib,
                    disk_mib: template.disk_mib,
                    checkpoint,
                    agent_token: None,
                    counts_as_template_spawn: true,
                    cold_start,
                })
            }
            Err(LifecycleError::TemplateNotFound(name)) => {
                let snapshot = self.store.get_snapshot(&name).await?;
                let Some(snapshot) = snapshot.filter(|s| s.team_id == team_id) else {
                    return Err(LifecycleError::TemplateNotFound(name));
                };
                Ok(StartSource {
                    template_id: snapshot.template_id.clone(),
                    alias: Some(snapshot.id.clone()),
                    layers: snapshot.layers.clone(),
                    vcpus: snapshot.vcpus,
                    memory_mib: snapshot.memory_mib,
                    disk_mib: snapshot.disk_mib,
                    checkpoint: Some(snapshot.dir.clone()),
                    agent_token: snapshot.envd_access_token.clone(),
                    counts_as_template_spawn: false,
                    cold_start: None,
                })
            }
            Err(other) => Err(other),
        }
    }

    /// Admit, start and initialise a sandbox.
    pub async fn create(&self, request: CreateRequest) -> Result<CreatedSandbox, LifecycleError> {
        let timeout = self.timeout_millis(request.timeout)?;
        let source = self
            .start_source(&request.team_id, &request.template)
            .await?;
        let now = now_millis();
        let record = SandboxRecord {
            id: new_sandbox_id(),
            team_id: request.team_id,
            template_id: source.template_id.clone(),
            alias: source.alias.clone(),
            client_id: CLIENT_ID.to_string(),
            state: SandboxState::Creating,
            state_reason: None,
            metadata: request.metadata,
            env_vars: request.env_vars,
            vcpus: source.vcpus,
            memory_mib: source.memory_mib,
            disk_mib: source.disk_mib,
            auto_pause: request.auto_pause,
            auto_resume: request.auto_resume.unwrap_or(request.auto_pause),
            allow_internet: request.allow_internet,
            envd_access_token: request.secure.then(new_access_token),
            traffic_access_token: request.private_traffic.then(new_access_token),
            egress: request.egress,
            ip: None,
            init_pid: None,
            pause_kind: None,
            snapshot_dir: None,
            started_at: now,
            end_at: now + timeout,
            updated_at: now,
        };
        let record = self.admit_and_start(record, &source).await?;
        if source.counts_as_template_spawn {
            if let Err(error) = self
                .store
                .record_template_spawn(&source.template_id, now_millis())
                .await
            {
                tracing::warn!(template = %source.template_id, %error, "cannot count template spawn");
            }
        }
        Ok(CreatedSandbox { record })
    }

    /// Admit `record` (state `creating`), store it, start it from `source` (restore its checkpoint or a
    /// fresh start) and initialise its agent (with the token a restored agent still holds).
    pub(crate) async fn admit_and_start(
        &self,
        mut record: SandboxRecord,
        source: &StartSource,
    ) -> Result<SandboxRecord, LifecycleError> {
        let lock = self.lock_for(&record.id);
        let _held = lock.lock().await;
        {
            let _admitting = self.admission.lock().await;
            let live = self
                .store
                .list_sandboxes(&SandboxFilter {
                    states: SandboxState::ALL
                        .into_iter()
                        .filter(|s| s.holds_resources())
                        .collect(),
                    ..SandboxFilter::default()
                })
                .await?;
            let max_pids = self.config.default_resources.max_pids;
            let request = Request {
                vcpus: record.vcpus,
                memory_mib: record.memory_mib,
                max_pids,
                disk_mib: record.disk_mib,
            };
            let capacity = match self.on_runtime(|runtime| runtime.host_capacity()).await {
                Ok(capacity) => capacity,
                Err(source) => {
                    self.forget_lock(&record.id);
                    return Err(LifecycleError::Runtime {
                        action: "measure the host for",
                        id: record.id.clone(),
                        source,
                    });
                }
            };
            let team = self.store.get_team(&record.team_id).await?;
            let team_live = live.iter().filter(|s| s.team_id == record.team_id);
            let usage = Usage::of(&live, max_pids);
            let refused = admission::admit(&self.config.limits, usage, request, capacity)
                .err()
                .or_else(|| {
                    let team = team.as_ref()?;
                    admission::admit_team(team, Usage::of(team_live, max_pids), request).err()
                });
            if let Some(refused) = refused {
                self.metrics.admission_refused();
                self.forget_lock(&record.id);
                return Err(refused.into());
            }
            self.store.insert_sandbox(&record).await?;
        }
        let admitted = std::time::Instant::now();

        let spec = self.spec_with_layers(&record, source.layers.clone());
        let checkpoint = source.checkpoint.clone();
        let (action, started) = match checkpoint {
            Some(dir) => (
                "restore",
                self.on_runtime(move |runtime| runtime.restore(&dir, &spec))
                    .await,
            ),
            None => (
                "start",
                self.on_runtime(move |runtime| runtime.create(&spec)).await,
            ),
        };
        let sandbox = match started {
            Ok(sandbox) => sandbox,
            Err(source) => {
                let reason = format!("{action} failed: {source}");
                self.fail(&mut record, reason).await;
                return Err(LifecycleError::Runtime {
                    action,
                    id: record.id.clone(),
                    source,
                });
            }
        };
        if let Err(error) = self
            .init_agent_of(&record, &sandbox, source.agent_token.as_deref())
            .await
        {
            let id = record.id.clone();
            if let Err(destroy) = self.on_runtime(move |runtime| runtime.destroy(&id)).await {
                tracing::warn!(sandbox = %record.id, error = %destroy, "destroy after failed init");
            }
            self.fail(&mut record, format!("agent init failed: {error}"))
                .await;
            return Err(error);
        }
        if let Err(source) = self.run_template_start(&record, source, &sandbox).await {
            let id = record.id.clone();
            if let Err(destroy) = self.on_runtime(move |runtime| runtime.destroy(&id)).await {
                tracing::warn!(sandbox = %record.id, error = %destroy, "destroy after failed start_cmd");
            }
            self.fail(&mut record, format!("template start failed: {source}"))
                .await;
            return Err(LifecycleError::TemplateStart {
                id: record.id.clone(),
                source,
            });
        }
        self.transition(
            &mut record,
            SandboxState::Running,
            TransitionUpdate {
                ip: Some(Some(sandbox.ip)),
                init_pid: Some(Some(sandbox.init_pid)),
                reason: source
                    .checkpoint
                    .as_ref()
                    .map(|dir| format!("restored from {}", dir.display())),
                ..TransitionUpdate::default()
            },
        )
        .await?;
        self.metrics
            .sandbox_started(admitted.elapsed().as_secs_f64());
        Ok(record)
    }

    /// A built template with a start command and no checkpoint: run start_cmd in the new sandbox and
    /// wait for its ready command, as the build's finalize step did.
    async fn run_template_start(
        &self,
        record: &SandboxRecord,
        source: &StartSource,
        sandbox: &Sandbox,
    ) -> Result<(), crate::templates::build::instantiate::InstantiateError> {
        use crate::templates::build::{agent_commands::EnvdCommands, instantiate};
        let Some(built) = source.cold_start.clone() else {
            return Ok(());
        };
        let sandbox = sandbox.clone();
        let id = sandbox.id.clone();
        let commands = EnvdCommands::new().with_access_token(record.envd_access_token.clone());
        let ready_timeout = self
            .config
            .agent_init_timeout
            .max(std::time::Duration::from_secs(60));
        tokio::task::spawn_blocking(move || {
            instantiate::run_start_cmd(&commands, &built, &sandbox, ready_timeout).map(drop)
        })
        .await
        .unwrap_or_else(|join| {
            tracing::error!(sandbox = %id, error = %join, "start_cmd thread panicked");
            Err(instantiate::InstantiateError::StartExited { id, code: -1 })
        })
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

    /// Sandbox as the API shows it (live ones only).
    pub async fn get(&self, id: &str) -> Result<SandboxRecord, LifecycleError> {
        self.live_record(id).await
    }

    pub async fn list(&self, filter: &SandboxFilter) -> Result<Vec<SandboxRecord>, LifecycleError> {
        let mut filter = filter.clone();
        if filter.states.is_empty() {
            filter.states = SandboxState::ALL
                .into_iter()
                .filter(|s| !s.is_terminal())
                .collect();
        }
        Ok(self.store.list_sandboxes(&filter).await?)
    }

    pub async fn events(&self, id: &str) -> Result<Vec<SandboxEvent>, LifecycleError> {
        self.live_record(id).await?;
        Ok(self.store.sandbox_events(id).await?)
    }

    /// Destroy a sandbox (running or paused).
    pub async fn kill(&self, id: &str, reason: &str) -> Result<(), LifecycleError> {
        let (_held, mut record) = self.lock_live(id).await?;
        self.kill_locked(&mut record, reason).await
    }

    async fn kill_locked(
        &self,
        record: &mut SandboxRecord,
        reason: &str,
    ) -> Result<(), LifecycleError> {
        if let Err(invalid) = record.state.check_transition(SandboxState::Killed) {
            return Err(LifecycleError::Conflict(format!(
                "sandbox {} is {} and cannot be killed now: {invalid}",
                record.id, record.state
            )));
        }
        // From here on the sandbox is gone for traffic: the proxy answers "not found" at once instead of
        // connecting to a sandbox that is being torn down.
        self.routes.set(&record.id, Some(Route::Ending));
        let checkpointed = record.pause_kind == Some(PauseKind::Checkpoint);
        if !checkpointed {
            let id = record.id.clone();
            match self.on_runtime(move |runtime| runtime.destroy(&id)).await {
                Ok(()) | Err(RuntimeError::NotFound(_)) => {}
                Err(source) => {
                    self.fail(record, format!("destroy failed: {source}")).await;
                    return Err(LifecycleError::Runtime {
                        action: "destroy",
                        id: record.id.clone(),
                        source,
                    });
                }
            }
        }
        if let Some(dir) = record.snapshot_dir.clone() {
            remove_snapshot(&dir).await;
        }
        self.transition(
            record,
            SandboxState::Killed,
            TransitionUpdate {
                reason: Some(reason.to_string()),
                ip: Some(None),
                init_pid: Some(None),
                snapshot_dir: Some(None),
                ..TransitionUpdate::default()
            },
        )
        .await
    }

    /// Move the end time to `now + timeout`. A timeout of 0 ends the sandbox now, the way its time
    /// running out would (pause with autoPause, else kill), as E2B does.
    pub async fn set_timeout(
        &self,
        id: &str,
        timeout: i64,
    ) -> Result<SandboxRecord, LifecycleError> {
        if timeout == 0 {
            let (_held, mut record) = self.lock_live(id).await?;
            if record.state != SandboxState::Running {
                let now = now_millis();
                record.end_at = now;
                self.store.set_sandbox_end(id, now, now).await?;
            } else if record.auto_pause {
                self.pause_locked(&mut record, "timeout set to 0").await?;
            } else {
                self.kill_locked(&mut record, "timeout set to 0").await?;
            }
            return Ok(record);
        }
        let timeout = self.timeout_millis(Some(timeout))?;
        let (_held, mut record) = self.lock_live(id).await?;
        let now = now_millis();
        record.end_at = now + timeout;
        self.store.set_sandbox_end(id, record.end_at, now).await?;
        Ok(record)
    }

    /// Pause: checkpoint to disk where the runtime can, else freeze in memory.
    pub async fn pause(&self, id: &str, reason: &str) -> Result<PauseKind, LifecycleError> {
        let (_held, mut record) = self.lock_live(id).await?;
        self.pause_locked(&mut record, reason).await
    }

    async fn pause_locked(
        &self,
        record: &mut SandboxRecord,
        reason: &str,
    ) -> Result<PauseKind, LifecycleError> {
        match record.state {
            SandboxState::Running => {}
            SandboxState::Paused | SandboxState::Pausing => {
                return Err(LifecycleError::Conflict(format!(
                    "sandbox {} is already paused",
                    record.id
                )))
            }
            other => {
                return Err(LifecycleError::Conflict(format!(
                    "sandbox {} is {other} and cannot be paused now",
                    record.id
                )))
            }
        }
        let reason = Some(reason.to_string());
        self.transition(
            record,
            SandboxState::Pausing,
            TransitionUpdate {
                reason: reason.clone(),
                ..TransitionUpdate::default()
            },
        )
        .await?;

        if self.capabilities.checkpoint {
            let dir = self.config.snapshots_dir().join(&record.id);
            let id = record.id.clone();
            let dest = dir.clone();
            match self
                .on_runtime(move |runtime| runtime.checkpoint(&id, &dest, false))
                .await
            {
                Ok(info) => {
                    tracing::info!(sandbox = %record.id, bytes = info.size_bytes, dir = %info.dir.display(), "checkpointed");
                    self.transition(
                        record,
                        SandboxState::Paused,
                        TransitionUpdate {
                            reason: reason.map(|reason| format!("{reason} (checkpointed to disk)")),
                            ip: Some(None),
                            init_pid: Some(None),
                            pause_kind: Some(Some(PauseKind::Checkpoint)),
                            snapshot_dir: Some(Some(info.dir)),
                            ..TransitionUpdate::default()
                        },
                    )
                    .await?;
                    return Ok(PauseKind::Checkpoint);
                }
                Err(error) => {
                    tracing::warn!(sandbox = %record.id, %error, "checkpoint failed; pausing by freezing instead");
                    remove_snapshot(&dir).await;
                }
            }
        }

        let id = record.id.clone();
        match self.on_runtime(move |runtime| runtime.freeze(&id)).await {
            Ok(()) => {
                self.transition(
                    record,
                    SandboxState::Paused,
                    TransitionUpdate {
                        reason: reason.map(|reason| format!("{reason} (frozen in memory)")),
                        pause_kind: Some(Some(PauseKind::Freeze)),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
                Ok(PauseKind::Freeze)
            }
            Err(RuntimeError::NotFound(_)) => {
                self.fail(record, "lost while pausing".to_string()).await;
                Err(LifecycleError::NotFound(record.id.clone()))
            }
            Err(source) => {
                self.transition(
                    record,
                    SandboxState::Running,
                    TransitionUpdate {
                        reason: Some(format!("pause failed: {source}")),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
                Err(LifecycleError::Runtime {
                    action: "freeze",
                    id: record.id.clone(),
                    source,
                })
            }
        }
    }

    /// Resume a paused sandbox (connect semantics: a running one just gets its timeout extended).
    /// `timeout` in seconds; `None` keeps the default.
    pub async fn resume(
        &self,
        id: &str,
        timeout: Option<i64>,
    ) -> Result<(SandboxRecord, ResumeOutcome), LifecycleError> {
        let timeout = self.timeout_millis(timeout)?;
        let (_held, mut record) = self.lock_live(id).await?;
        let now = now_millis();
        match record.state {
            SandboxState::Paused => {}
            SandboxState::Running | SandboxState::Creating | SandboxState::Resuming => {
                let end_at = now + timeout;
                if end_at > record.end_at {
                    self.store.set_sandbox_end(id, end_at, now).await?;
                    record.end_at = end_at;
                }
                return Ok((record, ResumeOutcome::AlreadyRunning));
            }
            other => {
                return Err(LifecycleError::Conflict(format!(
                    "sandbox {id} is {other} and cannot be resumed now"
                )))
            }
        }
        self.resume_locked(&mut record, now + timeout).await?;
        Ok((record, ResumeOutcome::Resumed))
    }

    async fn resume_locked(
        &self,
        record: &mut SandboxRecord,
        end_at: Millis,
    ) -> Result<(), LifecycleError> {
        self.transition(record, SandboxState::Resuming, TransitionUpdate::default())
            .await?;
        let id = record.id.clone();
        match record.pause_kind {
            Some(PauseKind::Checkpoint) => {
                let Some(dir) = record.snapshot_dir.clone() else {
                    self.fail(record, "checkpoint directory missing".to_string())
                        .await;
                    return Err(LifecycleError::Conflict(format!(
                        "sandbox {id} has no checkpoint to resume"
                    )));
                };
                let template = match self.store.get_template(&record.template_id).await? {
                    Some(template) => template,
                    None => {
                        self.fail(record, "template gone".to_string()).await;
                        return Err(LifecycleError::TemplateNotFound(record.template_id.clone()));
                    }
                };
                // The layers the checkpoint was taken over: a rebuild since moved the template on.
                let layers = warren_runtime::checkpoint::Manifest::read(&dir)
                    .map_or_else(|_| template.layers.clone(), |m| m.layers);
                let spec = self.spec_with_layers(record, layers);
                let checkpoint = dir.clone();
                let restored = self
                    .on_runtime(move |runtime| runtime.restore(&checkpoint, &spec))
                    .await;
                let sandbox = match restored {
                    Ok(sandbox) => sandbox,
                    Err(source) => {
                        self.transition(
                            record,
                            SandboxState::Paused,
                            TransitionUpdate {
                                reason: Some(format!("restore failed: {source}")),
                                ..TransitionUpdate::default()
                            },
                        )
                        .await?;
                        return Err(LifecycleError::Runtime {
                            action: "restore",
                            id,
                            source,
                        });
                    }
                };
                let token = record.envd_access_token.clone();
                if let Err(error) = self.init_agent_of(record, &sandbox, token.as_deref()).await {
                    // The restored tree is running but unusable; the checkpoint is still on disk.
                    let id = record.id.clone();
                    if let Err(destroy) = self.on_runtime(move |runtime| runtime.destroy(&id)).await
                    {
                        tracing::warn!(sandbox = %record.id, error = %destroy, "destroy after failed re-init");
                    }
                    self.transition(
                        record,
                        SandboxState::Paused,
                        TransitionUpdate {
                            reason: Some(format!("agent re-init failed: {error}")),
                            ..TransitionUpdate::default()
                        },
                    )
                    .await?;
                    return Err(error);
                }
                self.transition(
                    record,
                    SandboxState::Running,
                    TransitionUpdate {
                        ip: Some(Some(sandbox.ip)),
                        init_pid: Some(Some(sandbox.init_pid)),
                        pause_kind: Some(None),
                        snapshot_dir: Some(None),
                        end_at: Some(end_at),
                        ..TransitionUpdate::default()
                    },
                )
                .await?;
                remove_snapshot(&dir).await;
                Ok(())
            }
            Some(PauseKind::Freeze) | None => {
                match self.on_runtime(move |runtime| runtime.thaw(&id)).await {
                    Ok(()) => {
                        self.transition(
                            record,
                            SandboxState::Running,
                            TransitionUpdate {
                                pause_kind: Some(None),
                                end_at: Some(end_at),
                                ..TransitionUpdate::default()
                            },
                        )
                        .await
                    }
                    Err(RuntimeError::NotFound(_)) => {
                        self.fail(record, "lost while paused".to_string()).await;
                        Err(LifecycleError::NotFound(record.id.clone()))
                    }
                    Err(source) => {
                        self.transition(
                            record,
                            SandboxState::Paused,
                            TransitionUpdate {
                                reason: Some(format!("thaw failed: {source}")),
                                ..TransitionUpdate::default()
                            },
                        )
                        .await?;
                        Err(LifecycleError::Runtime {
                            action: "thaw",
                            id: record.id.clone(),
                            source,
                        })
                    }
                }
            }
        }
    }

    /// The scheduler's action for a sandbox whose time is up: pause (autoPause) or kill. Re-checks the end
    /// time under the lock, since the timeout may have moved.
    pub async fn expire(
        &self,
        id: &str,
        now: Millis,
    ) -> Result<Option<SandboxState>, LifecycleError> {
        let lock = self.lock_for(id);
        let _held = lock.lock().await;
        let mut record = match self.store.get_sandbox(id).await? {
            Some(record) if record.state == SandboxState::Running && record.end_at <= now => record,
            _ => return Ok(None),
        };
        if record.auto_pause {
            self.pause_locked(&mut record, "timeout").await?;
        } else {
            self.kill_locked(&mut record, "timeout").await?;
        }
        Ok(Some(record.state))
    }

    /// Latest resource sample of a sandbox; empty when it has no running processes (checkpointed).
    pub async fn stats(&self, id: &str) -> Result<Option<Stats>, LifecycleError> {
        let record = self.live_record(id).await?;
        if record.pause_kind == Some(PauseKind::Checkpoint) {
            return Ok(None);
        }
        let id = record.id.clone();
        match self.on_runtime(move |runtime| runtime.stats(&id)).await {
            Ok(stats) => Ok(Some(stats)),
            Err(RuntimeError::NotFound(_)) => Ok(None),
            Err(source) => Err(runtime_error("read stats of", &record.id)(source)),
        }
    }

    /// Where the proxy should send traffic for sandbox `id`: resumes a paused sandbox that allows it.
    pub async fn route_for_traffic(&self, id: &str) -> Result<TrafficRoute, RouteError> {
        match self.routes.get(id) {
            Some(Route::Live(route)) => return Ok(route),
            Some(Route::Ending) => return Err(RouteError::NotFound(id.to_string())),
            None => {}
        }
        let route = |record: &SandboxRecord| {
            record.ip.map(|ip| TrafficRoute {
                ip,
                traffic_token: record.traffic_access_token.clone(),
            })
        };
        let record = match self.store.get_sandbox(id).await? {
            Some(record) if !record.state.is_terminal() => record,
            _ => return Err(RouteError::NotFound(id.to_string())),
        };
        match record.state {
            SandboxState::Running => {
                route(&record).ok_or_else(|| RouteError::NotFound(id.to_string()))
            }
            SandboxState::Paused | SandboxState::Pausing if !record.auto_resume => {
                Err(RouteError::Paused(id.to_string()))
            }
            _ => {
                // Paused (auto-resume), or mid-transition: resume waits for the sandbox's lock.
                let resumed = self.resume(id, None).await.map_err(|source| match source {
                    LifecycleError::NotFound(id) => RouteError::NotFound(id),
                    other => RouteError::ResumeFailed {
                        id: id.to_string(),
                        source: Box::new(other),
                    },
                })?;
                route(&resumed.0).ok_or_else(|| RouteError::NotFound(id.to_string()))
            }
        }
    }

    /// Fill the proxy's route cache from the store (after reconciliation).
    pub(crate) fn remember_route(&self, record: &SandboxRecord) {
        if let (SandboxState::Running, Some(ip)) = (record.state, record.ip) {
            self.routes.set(&record.id, Some(Route::live(ip, record)));
        }
    }
}

/// The runtime's network settings of `record`. E2B's model: `allow_internet_access: false` is a deny
/// of everything, and allowed networks win over denied ones, so a sandbox without internet access but
/// with allowed networks goes out for those only.
fn network_spec(record: &SandboxRecord) -> warren_runtime::NetworkSpec {
    let mut egress = record.egress.clone();
    let internet = match record.allow_internet {
        Some(false) if egress.allow.is_empty() && egress.allow_hosts.is_empty() => false,
        Some(false) => {
            let everything = Cidr {
                network: std::net::Ipv4Addr::UNSPECIFIED,
                prefix: 0,
            };
            if !egress.deny.contains(&everything) {
                egress.deny.push(everything);
            }
            true
        }
        _ => true,
    };
    warren_runtime::NetworkSpec {
        allow_internet: internet,
        raw_sockets: false,
        egress,
    }
}

pub(crate) async fn remove_snapshot(dir: &std::path::Path) {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => tracing::warn!(dir = %dir.display(), %error, "cannot remove snapshot"),
    }
}
