//! Creating a sandbox: where it starts from (a template's checkpoint or layers, or a snapshot),
//! admission, the runtime start and the agent's initialisation.

use std::collections::BTreeMap;
use std::path::PathBuf;

use warren_proto::api::{EnvdInit, TemplatePrivileges};
use warren_runtime::network::egress::EgressRules;
use warren_runtime::Sandbox;

use super::{new_access_token, new_sandbox_id, Lifecycle, LifecycleError, CLIENT_ID, DEFAULT_USER};
use crate::config::ServerConfig;
use crate::lifecycle::admission::{self, AdmissionError, Request, Usage};
use crate::lifecycle::agent_init::init_agent;
use crate::lifecycle::now_millis;
use crate::lifecycle::state::SandboxState;
use crate::store::{PauseKind, SandboxRecord, TemplateRecord, TransitionUpdate};

/// A validated create request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CreateRequest {
    /// The team the sandbox belongs to (the API key's).
    pub team_id: String,
    pub template: String,
    pub timeout: Option<i64>,
    pub auto_pause: bool,
    /// `autoPauseMemory = false`: the auto-pause keeps the files only.
    pub auto_pause_files_only: bool,
    pub auto_resume: Option<bool>,
    pub secure: bool,
    /// `network.allowPublicTraffic = false`: user ports need the traffic access token.
    pub private_traffic: bool,
    /// `network.allowOut` / `denyOut` by address.
    pub egress: EgressRules,
    /// `network.maskRequestHost` / `httpsPorts`.
    pub ingress: crate::store::SandboxIngress,
    pub allow_internet: Option<bool>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    /// The sandbox's own monitor policies.
    pub policies: warren_proto::api::SandboxPolicies,
    /// `volumeMounts`: the team's volumes (by name) and where they go.
    pub volume_mounts: Vec<warren_proto::api::SandboxVolumeMount>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreatedSandbox {
    pub record: SandboxRecord,
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
    /// The checkpoint holds files only (a filesystem snapshot): boot fresh processes over them.
    pub boot_from_disk: bool,
    /// Access token the checkpointed agent still holds, to re-initialise it with.
    pub agent_token: Option<String>,
    pub counts_as_template_spawn: bool,
    /// A built template without a checkpoint whose start_cmd must run (and ready_cmd pass) in every new
    /// sandbox, as the build's finalize step did.
    pub cold_start: Option<crate::templates::builder::versions::BuiltTemplate>,
    /// What a fresh start grants beyond the default set (the template build's); a restored checkpoint
    /// carries its own capabilities and seccomp filter.
    pub privileges: TemplatePrivileges,
    /// The template's monitor policies, which the sandbox's own go over.
    pub policies: warren_proto::api::SandboxPolicies,
    /// What commands in a new sandbox start with, as `docker exec` in a container of the image:
    /// the template's environment (ENV, the image's Env) and working directory.
    pub defaults: TemplateDefaults,
}

/// The environment and working directory a template's build ended with; a new sandbox's commands
/// start with them (the create's `envVars` over the environment; a command's own `cwd` over the
/// directory).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TemplateDefaults {
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
}

/// How a sandbox of a built template begins.
struct TemplateStartPlan {
    checkpoint: Option<PathBuf>,
    cold_start: Option<crate::templates::builder::versions::BuiltTemplate>,
    privileges: TemplatePrivileges,
    defaults: TemplateDefaults,
}

/// How a sandbox of a built template begins: the checkpoint its build left (start command running,
/// ready check passed), or else the build record when its start command must run at create. Neither
/// for templates without a build record (the built-in `base`) or without a start command.
fn template_start(config: &ServerConfig, template: &TemplateRecord) -> TemplateStartPlan {
    let versions = crate::templates::builder::versions::TemplateVersions::new(&config.state_dir);
    let Ok(built) = versions.load(&template.id, &template.build_id) else {
        return TemplateStartPlan {
            checkpoint: None,
            cold_start: None,
            privileges: TemplatePrivileges::default(),
            defaults: TemplateDefaults::default(),
        };
    };
    let privileges = built.privileges;
    // A build that never set WORKDIR ends in `/`; then commands keep E2B's default, the user's home.
    let defaults = TemplateDefaults {
        env: built.env.clone(),
        workdir: (built.workdir != "/").then(|| built.workdir.clone()),
    };
    let (checkpoint, cold_start) = match &built.start {
        crate::templates::builder::versions::TemplateStart::Checkpoint { dir } => {
            (Some(dir.clone()), None)
        }
        _ if built.start_cmd.is_some() => (None, Some(built)),
        _ => (None, None),
    };
    TemplateStartPlan {
        checkpoint,
        cold_start,
        privileges,
        defaults,
    }
}

/// How a sandbox of `template` boots fresh over saved files (a filesystem resume, a reboot, a
/// filesystem snapshot): what its build grants, the start command to run again (even when the
/// build's own sandboxes restore a checkpoint that has it running) and the working directory.
pub(crate) fn boot_plan(
    config: &ServerConfig,
    template_id: &str,
    build_id: &str,
) -> (
    Option<crate::templates::builder::versions::BuiltTemplate>,
    TemplatePrivileges,
    TemplateDefaults,
) {
    let versions = crate::templates::builder::versions::TemplateVersions::new(&config.state_dir);
    match versions.load(template_id, build_id) {
        Ok(built) => {
            let privileges = built.privileges;
            let defaults = TemplateDefaults {
                env: built.env.clone(),
                workdir: (built.workdir != "/").then(|| built.workdir.clone()),
            };
            let cold_start = built.start_cmd.is_some().then_some(built);
            (cold_start, privileges, defaults)
        }
        Err(_) => (
            None,
            TemplatePrivileges::default(),
            TemplateDefaults::default(),
        ),
    }
}

impl Lifecycle {
    /// Admit, start and initialise a sandbox.
    pub async fn create(&self, request: CreateRequest) -> Result<CreatedSandbox, LifecycleError> {
        let timer = std::time::Instant::now();
        let timeout = self.timeout_millis(request.timeout)?;
        let volumes = crate::volumes::resolve_mounts(
            self.store.as_ref(),
            &request.team_id,
            &request.volume_mounts,
        )
        .await
        .map_err(|error| match error {
            crate::volumes::VolumeError::BadRequest(message) => LifecycleError::BadRequest(message),
            crate::volumes::VolumeError::Store(error) => LifecycleError::Store(error),
            other => LifecycleError::BadRequest(other.to_string()),
        })?;
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
            // Kept with the sandbox, so a resume gives the agent the same environment again.
            env_vars: {
                let mut env = source.defaults.env.clone();
                env.extend(request.env_vars);
                env
            },
            vcpus: source.vcpus,
            memory_mib: source.memory_mib,
            disk_mib: source.disk_mib,
            auto_pause: request.auto_pause,
            auto_pause_memory: !request.auto_pause_files_only,
            auto_resume: request.auto_resume.unwrap_or(request.auto_pause),
            allow_internet: request.allow_internet,
            envd_access_token: request.secure.then(new_access_token),
            traffic_access_token: request.private_traffic.then(new_access_token),
            egress: request.egress,
            ingress: request.ingress,
            volumes,
            policies: crate::lifecycle::monitor::merge_policies(&source.policies, request.policies),
            ip: None,
            init_pid: None,
            pause_kind: None,
            snapshot_dir: None,
            started_at: now,
            end_at: now + timeout,
            updated_at: now,
        };
        self.check_egress(&record.id, &record.egress).await?;
        self.check_placeholders(&record.team_id, &record.env_vars, &record.egress)
            .await?;
        tracing::debug!(sandbox = %record.id, ms = ms_since(timer), "create request resolved");
        let record = match self.take_pooled(&source, !record.volumes.is_empty()) {
            Some(member) => self.start_pooled(record, &source, member).await?,
            None => self.admit_and_start(record, &source).await?,
        };
        if source.counts_as_template_spawn {
            if let Err(error) = self
                .store
                .record_template_spawn(&source.template_id, now_millis())
                .await
            {
                tracing::warn!(template = %source.template_id, %error, "cannot count template spawn");
            }
        }
        tracing::debug!(sandbox = %record.id, total_ms = ms_since(timer), "sandbox created");
        Ok(CreatedSandbox { record })
    }

    /// Admit `record` (state `creating`), store it, start it from `source` (restore its checkpoint or a
    /// fresh start) and initialise its agent (with the token a restored agent still holds).
    pub(crate) async fn admit_and_start(
        &self,
        mut record: SandboxRecord,
        source: &StartSource,
    ) -> Result<SandboxRecord, LifecycleError> {
        // Before anything is stored: a secret its rules use may be gone (a fork of a sandbox whose
        // secret was deleted since).
        let timer = std::time::Instant::now();
        let network = self.resolved_network_spec(&record).await?;
        let lock = self.lock_for(&record.id);
        let _held = lock.lock().await;
        let resolved = ms_since(timer);
        self.admit_and_insert(&record, None).await?;
        let admitted = std::time::Instant::now();
        let admit_ms = ms_since(timer) - resolved;

        let mut spec = self.spec_with_layers(&record, source.layers.clone(), network);
        spec.network.raw_sockets = source.privileges.raw_sockets;
        spec.syscalls.allow_io_uring = source.privileges.io_uring;
        let checkpoint = source.checkpoint.clone();
        let (action, started) = match checkpoint {
            Some(dir) if source.boot_from_disk => (
                "boot",
                self.on_runtime_setup(move |runtime| runtime.boot_from_disk(&dir, &spec))
                    .await,
            ),
            Some(dir) => (
                "restore",
                self.on_runtime_setup(move |runtime| runtime.restore(&dir, &spec))
                    .await,
            ),
            None => (
                "start",
                self.on_runtime_setup(move |runtime| runtime.create(&spec))
                    .await,
            ),
        };
        let runtime_ms = ms_since(admitted);
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
            .init_agent_at(
                &record,
                sandbox.agent_addr(),
                source.agent_token.as_deref(),
                source.defaults.workdir.clone(),
            )
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
        let init_ms = ms_since(admitted) - runtime_ms;
        if let Err(source) = self
            .run_template_start(&record, source.cold_start.clone(), &sandbox)
            .await
        {
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
        tracing::debug!(
            sandbox = %record.id,
            network_ms = resolved,
            admit_ms,
            runtime_ms,
            agent_init_ms = init_ms,
            stored_ms = ms_since(admitted) - runtime_ms - init_ms,
            "sandbox admitted and started"
        );
        self.metrics
            .sandbox_started(admitted.elapsed().as_secs_f64());
        Ok(record)
    }

    /// Hand `member` of the template's warm pool out as `record`: it takes the member's ID (and so
    /// its address and hostname), is admitted and stored, then thawed and given what any restored
    /// sandbox gets (network rules, environment, token, clock).
    async fn start_pooled(
        &self,
        mut record: SandboxRecord,
        source: &StartSource,
        member: super::pool::Member,
    ) -> Result<SandboxRecord, LifecycleError> {
        let id = member.sandbox.id.clone();
        record.id = id.clone();
        let network = match self.resolved_network_spec(&record).await {
            Ok(network) => network,
            Err(error) => {
                self.discard_member(&id).await;
                return Err(error);
            }
        };
        let lock = self.lock_for(&id);
        let _held = lock.lock().await;
        if let Err(error) = self.admit_and_insert(&record, Some(&id)).await {
            self.discard_member(&id).await;
            return Err(error);
        }
        self.member_handed_out(&id).await;
        let admitted = std::time::Instant::now();
        let changed = (network != member.network).then_some(network);
        let thawed = self
            .on_runtime(move |runtime| {
                if let Some(network) = &changed {
                    runtime.set_network(&id, network)?;
                }
                runtime.thaw(&id)
            })
            .await;
        let ready = match thawed {
            Ok(()) => {
                self.init_agent_at(
                    &record,
                    member.sandbox.agent_addr(),
                    source.agent_token.as_deref(),
                    source.defaults.workdir.clone(),
                )
                .await
            }
            Err(source) => Err(LifecycleError::Runtime {
                action: "thaw a warm-pool member as",
                id: record.id.clone(),
                source,
            }),
        };
        if let Err(error) = ready {
            let id = record.id.clone();
            if let Err(destroy) = self.on_runtime(move |runtime| runtime.destroy(&id)).await {
                tracing::warn!(sandbox = %record.id, error = %destroy, "destroy after failed hand-out");
            }
            self.fail(&mut record, format!("warm-pool hand-out failed: {error}"))
                .await;
            return Err(error);
        }
        self.transition(
            &mut record,
            SandboxState::Running,
            TransitionUpdate {
                ip: Some(Some(member.sandbox.ip)),
                init_pid: Some(Some(member.sandbox.init_pid)),
                reason: Some(format!(
                    "restored from {} (warm pool)",
                    member.checkpoint.display()
                )),
                ..TransitionUpdate::default()
            },
        )
        .await?;
        self.metrics
            .sandbox_started(admitted.elapsed().as_secs_f64());
        Ok(record)
    }

    /// A member taken for a create that was then refused: destroyed (the pool refills).
    async fn discard_member(&self, id: &str) {
        self.destroy_member(id, "the create that took it was refused")
            .await;
        self.forget_lock(id);
    }

    /// Admit `record` against the node's limits and its team's quotas, with every live sandbox,
    /// build sandbox and warm-pool member counted (but `except`, which becomes `record`), and store
    /// it. On refusal the record's lock is forgotten and nothing is stored.
    async fn admit_and_insert(
        &self,
        record: &SandboxRecord,
        except: Option<&str>,
    ) -> Result<(), LifecycleError> {
        let _admitting = self.admission.lock().await;
        let live = self.resource_holders().await?;
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
        // Template builds' sandboxes and warm-pool members hold resources too.
        let usage = self.usage_with_builds(Usage::of(&live, max_pids), except, None);
        let refused = admission::admit(&self.config.limits, usage, request, capacity)
            .err()
            .or_else(|| {
                let team = team.as_ref()?;
                let own = self.usage_with_builds(
                    Usage::of(team_live, max_pids),
                    None,
                    Some(&record.team_id),
                );
                admission::admit_team(team, own, request).err()
            })
            .or_else(|| {
                let resources = warren_runtime::Resources {
                    vcpus: record.vcpus,
                    memory_mib: record.memory_mib,
                    disk_mib: record.disk_mib,
                    max_pids,
                };
                self.runtime
                    .room_for(&resources)
                    .map(AdmissionError::NodesFull)
            });
        if let Some(refused) = refused {
            self.metrics.admission_refused();
            self.forget_lock(&record.id);
            return Err(refused.into());
        }
        self.store.insert_sandbox(record).await?;
        Ok(())
    }

    /// Where a sandbox of `id_or_alias` starts from: a ready template (its build checkpoint when the
    /// build left one, else a cold start on its layers), or else a snapshot of that id or name.
    pub(super) async fn start_source(
        &self,
        team_id: &str,
        id_or_alias: &str,
    ) -> Result<StartSource, LifecycleError> {
        match self.template(team_id, id_or_alias).await {
            Ok(template) => {
                let start = template_start(&self.config, &template);
                Ok(StartSource {
                    template_id: template.id.clone(),
                    alias: (id_or_alias != template.id).then(|| id_or_alias.to_string()),
                    layers: template.layers.clone(),
                    vcpus: template.vcpus,
                    memory_mib: template.memory_mib,
                    disk_mib: template.disk_mib,
                    checkpoint: start.checkpoint,
                    boot_from_disk: false,
                    agent_token: None,
                    counts_as_template_spawn: true,
                    cold_start: start.cold_start,
                    privileges: start.privileges,
                    policies: template.policies.clone(),
                    defaults: start.defaults,
                })
            }
            Err(LifecycleError::TemplateNotFound(name)) => {
                let snapshot = self.store.get_snapshot(&name).await?;
                let Some(snapshot) = snapshot.filter(|s| s.team_id == team_id) else {
                    return Err(LifecycleError::TemplateNotFound(name));
                };
                if PauseKind::of_checkpoint(&snapshot.dir) == PauseKind::Filesystem {
                    return self.files_snapshot_source(snapshot).await;
                }
                Ok(StartSource {
                    template_id: snapshot.template_id.clone(),
                    alias: Some(snapshot.id.clone()),
                    layers: snapshot.layers.clone(),
                    vcpus: snapshot.vcpus,
                    memory_mib: snapshot.memory_mib,
                    disk_mib: snapshot.disk_mib,
                    checkpoint: Some(snapshot.dir.clone()),
                    boot_from_disk: false,
                    agent_token: snapshot.envd_access_token.clone(),
                    counts_as_template_spawn: false,
                    cold_start: None,
                    privileges: TemplatePrivileges::default(),
                    policies: Default::default(),
                    defaults: TemplateDefaults::default(),
                })
            }
            Err(other) => Err(other),
        }
    }

    /// A filesystem snapshot: its sandboxes boot fresh over the saved files, running the start command
    /// of the snapshot's template again as a cold start of that template would.
    async fn files_snapshot_source(
        &self,
        snapshot: crate::store::SnapshotRecord,
    ) -> Result<StartSource, LifecycleError> {
        let build_id = self
            .store
            .get_template(&snapshot.template_id)
            .await?
            .map(|template| template.build_id)
            .unwrap_or_default();
        let (cold_start, privileges, defaults) =
            boot_plan(&self.config, &snapshot.template_id, &build_id);
        Ok(StartSource {
            template_id: snapshot.template_id.clone(),
            alias: Some(snapshot.id.clone()),
            layers: snapshot.layers.clone(),
            vcpus: snapshot.vcpus,
            memory_mib: snapshot.memory_mib,
            disk_mib: snapshot.disk_mib,
            checkpoint: Some(snapshot.dir.clone()),
            boot_from_disk: true,
            agent_token: None,
            counts_as_template_spawn: false,
            cold_start,
            privileges,
            policies: Default::default(),
            defaults,
        })
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

    pub(super) async fn init_agent_of(
        &self,
        record: &SandboxRecord,
        sandbox: &Sandbox,
        previous_token: Option<&str>,
    ) -> Result<(), LifecycleError> {
        self.init_agent_at(record, sandbox.agent_addr(), previous_token, None)
            .await
    }

    /// `POST /init` to the agent at `addr` with what `record` gives it; a sandbox whose egress has
    /// header rules also gets the host's egress CA to trust. `default_workdir` is given at create
    /// (the agent keeps it through pause and resume).
    pub(super) async fn init_agent_at(
        &self,
        record: &SandboxRecord,
        addr: std::net::SocketAddr,
        previous_token: Option<&str>,
        default_workdir: Option<String>,
    ) -> Result<(), LifecycleError> {
        let trusted_ca = if record.egress.header_rules.is_empty() {
            None
        } else {
            let id = record.id.clone();
            self.on_runtime(move |runtime| Ok(runtime.egress_trust_anchor(&id)))
                .await
                .ok()
                .flatten()
        };
        let body = EnvdInit {
            // Placeholders become values here, on their way to the agent; the record keeps them.
            env_vars: self.resolved_env(record).await?,
            access_token: record.envd_access_token.clone(),
            default_user: Some(DEFAULT_USER.to_string()),
            default_workdir,
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

    /// A built template with a start command and no checkpoint: run start_cmd in the new sandbox and
    /// wait for its ready command, as the build's finalize step did.
    pub(super) async fn run_template_start(
        &self,
        record: &SandboxRecord,
        cold_start: Option<crate::templates::builder::versions::BuiltTemplate>,
        sandbox: &Sandbox,
    ) -> Result<(), crate::templates::builder::instantiate::InstantiateError> {
        use crate::templates::builder::{agent_commands::EnvdCommands, instantiate};
        let Some(built) = cold_start else {
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
}

fn ms_since(start: std::time::Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}
