//! Template builds as the API sees them: a build is requested (a template id and a fresh build id are
//! handed out), its files uploaded, then started; the build service runs it in the background and the
//! finished version becomes the template's current build in the store. Template names are aliases: a
//! rebuild under the same name keeps the template id and adds a build.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rand::Rng;
use warren_proto::api::{TemplatePrivileges, ENVD_VERSION};

use super::builder::e2b_toml::E2bToml;
use super::builder::job::{LogLevel, TemplateBuildInfo};
use super::builder::runner::BuildError;
use super::builder::sdk_template::TemplateBuildStartV2;
use super::builder::service::{BuildService, ServiceError, TemplateDir};
use super::builder::uploads::UploadError;
use super::builder::versions::{BuiltTemplate, VersionError};
use super::tags::{check_tag, split_reference, tagged_build, TagError, DEFAULT_TAG};
use super::BASE_TEMPLATE_ID;
use crate::config::DefaultResources;
use crate::lifecycle::now_millis;
use crate::lifecycle::state::SandboxState;
use crate::store::{
    BuildRecord, BuildState, SandboxFilter, SnapshotFilter, Store, StoreError, TemplateRecord,
};

#[derive(Debug, thiserror::Error)]
pub enum BuildsError {
    #[error("template '{0}' not found")]
    TemplateNotFound(String),
    #[error("build '{build_id}' of template '{template_id}' not found")]
    BuildNotFound {
        template_id: String,
        build_id: String,
    },
    #[error("build '{0}' was already started")]
    AlreadyStarted(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Conflict(String),
    #[error("the built-in template '{0}' cannot be changed")]
    BuiltIn(String),
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Upload(#[from] UploadError),
    #[error(transparent)]
    Version(#[from] VersionError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("creating {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a Dockerfile build (legacy `POST /templates`, the CLI) brings beyond resources.
#[derive(Debug, Clone, Default)]
pub struct DockerfileBuild {
    pub dockerfile: String,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// Hash of an uploaded archive of the build context (`PUT /templates/{id}/files/{hash}`).
    pub context_hash: Option<String>,
}

/// A build request.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    /// The team that builds (and then owns) the template.
    pub team_id: String,
    /// Template name (alias); an unnamed request gets a new template.
    pub name: Option<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
    pub dockerfile: Option<DockerfileBuild>,
    /// Tags the build gets once ready (`default` when empty).
    pub tags: Vec<String>,
    /// Beyond the default set; the API lets only admin keys ask for any.
    pub privileges: TemplatePrivileges,
}

/// The ids a request was given.
#[derive(Debug, Clone)]
pub struct RequestedBuild {
    pub template_id: String,
    pub build_id: String,
    pub aliases: Vec<String>,
}

#[derive(Debug, Clone)]
struct PendingBuild {
    cpu_count: Option<u32>,
    memory_mb: Option<u64>,
    dockerfile: Option<DockerfileBuild>,
    tags: Vec<String>,
    privileges: TemplatePrivileges,
}

pub struct TemplateBuilds {
    service: Arc<BuildService>,
    store: Arc<dyn Store>,
    defaults: DefaultResources,
    state_dir: PathBuf,
    runtime: tokio::runtime::Handle,
    pending: Mutex<HashMap<(String, String), PendingBuild>>,
    /// Upload URLs carry a one-time token (the SDK PUTs to them without its API key): token → hash.
    upload_tokens: Mutex<HashMap<String, String>>,
}

fn check_name(name: &str) -> Result<(), BuildsError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && !name.starts_with(['-', '_']);
    if ok {
        Ok(())
    } else {
        Err(BuildsError::BadRequest(format!(
            "invalid template name {name:?}: use lowercase letters, digits, '-' and '_'"
        )))
    }
}

fn tag_error(error: TagError) -> BuildsError {
    match error {
        TagError::Store(e) => BuildsError::Store(e),
        other => BuildsError::BadRequest(other.to_string()),
    }
}

fn new_template_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..20)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

impl TemplateBuilds {
    /// Must be called inside the server's tokio runtime (finished builds record themselves through it).
    pub fn new(
        service: Arc<BuildService>,
        store: Arc<dyn Store>,
        defaults: DefaultResources,
        state_dir: PathBuf,
    ) -> TemplateBuilds {
        TemplateBuilds {
            service,
            store,
            defaults,
            state_dir,
            runtime: tokio::runtime::Handle::current(),
            pending: Mutex::new(HashMap::new()),
            upload_tokens: Mutex::new(HashMap::new()),
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), PendingBuild>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands out a build id (and a template id unless the name is already known).
    pub async fn request(&self, request: BuildRequest) -> Result<RequestedBuild, BuildsError> {
        if let Some(cpus) = request.cpu_count {
            if cpus == 0 || cpus > super::builder::e2b_toml::MAX_CPU_COUNT {
                return Err(BuildsError::BadRequest(format!(
                    "cpuCount {cpus} is out of range 1..={}",
                    super::builder::e2b_toml::MAX_CPU_COUNT
                )));
            }
        }
        if let Some(memory) = request.memory_mb {
            if memory < super::builder::e2b_toml::MIN_MEMORY_MB {
                return Err(BuildsError::BadRequest(format!(
                    "memoryMB {memory} is below the minimum of {}",
                    super::builder::e2b_toml::MIN_MEMORY_MB
                )));
            }
        }
        for tag in &request.tags {
            check_tag(tag).map_err(|e| BuildsError::BadRequest(e.to_string()))?;
        }
        if let Some(dockerfile) = &request.dockerfile {
            if dockerfile.dockerfile.trim().is_empty() {
                return Err(BuildsError::BadRequest("dockerfile is empty".into()));
            }
        }
        let existing = match &request.name {
            Some(name) => {
                check_name(name)?;
                if name == BASE_TEMPLATE_ID {
                    return Err(BuildsError::BuiltIn(name.clone()));
                }
                match self.store.get_template(name).await? {
                    Some(other) if other.team_id != request.team_id => {
                        return Err(BuildsError::Conflict(format!(
                            "template name '{name}' belongs to another team"
                        )))
                    }
                    found => found,
                }
            }
            None => None,
        };
        let build_id = uuid::Uuid::new_v4().to_string();
        let (template_id, aliases) = match existing {
            Some(record) => (record.id, record.aliases),
            None => {
                let id = new_template_id();
                let aliases: Vec<String> = request.name.iter().cloned().collect();
                let now = now_millis();
                self.store
                    .upsert_template(&TemplateRecord {
                        id: id.clone(),
                        aliases: aliases.clone(),
                        layers: Vec::new(),
                        build_id: build_id.clone(),
                        status: "waiting".into(),
                        vcpus: request.cpu_count.map_or(self.defaults.vcpus, f64::from),
                        memory_mib: request.memory_mb.unwrap_or(self.defaults.memory_mib),
                        disk_mib: self.defaults.disk_mib,
                        envd_version: ENVD_VERSION.to_string(),
                        public: false,
                        team_id: request.team_id.clone(),
                        spawn_count: 0,
                        last_spawned_at: None,
                        created_at: now,
                        updated_at: now,
                        policies: Default::default(),
                    })
                    .await?;
                (id, aliases)
            }
        };
        self.record_build(&template_id, &build_id, BuildState::Waiting, None)
            .await?;
        self.lock_pending().insert(
            (template_id.clone(), build_id.clone()),
            PendingBuild {
                cpu_count: request.cpu_count,
                memory_mb: request.memory_mb,
                dockerfile: request.dockerfile,
                tags: request.tags,
                privileges: request.privileges,
            },
        );
        Ok(RequestedBuild {
            template_id,
            build_id,
            aliases,
        })
    }

    fn take_pending(&self, template_id: &str, build_id: &str) -> Result<PendingBuild, BuildsError> {
        let key = (template_id.to_string(), build_id.to_string());
        if let Some(pending) = self.lock_pending().remove(&key) {
            return Ok(pending);
        }
        if self.service.job(template_id, build_id).is_some() {
            return Err(BuildsError::AlreadyStarted(build_id.into()));
        }
        Err(BuildsError::BuildNotFound {
            template_id: template_id.into(),
            build_id: build_id.into(),
        })
    }

    /// `POST /v2/templates/{id}/builds/{buildID}`: the SDK's Template builder body.
    pub fn start_sdk(
        self: &Arc<Self>,
        template_id: &str,
        build_id: &str,
        body: &TemplateBuildStartV2,
    ) -> Result<(), BuildsError> {
        let pending = self.take_pending(template_id, build_id)?;
        // fromTemplate names a template by alias or id; version records are kept by id.
        let mut body = body.clone();
        // Only the building team's templates and public ones can be built on.
        if let Some(name) = body.from_template.clone() {
            let (name, _tag) = super::tags::split_reference(&name);
            let found =
                self.runtime.block_on(async {
                    let own = self.store.get_template(template_id).await?;
                    let base = self.store.get_template(name).await?;
                    Ok::<_, StoreError>(base.filter(|b| {
                        b.public || own.as_ref().is_some_and(|o| o.team_id == b.team_id)
                    }))
                });
            match found {
                Ok(Some(base)) => body.from_template = Some(base.id),
                Ok(None) => {
                    self.put_back(template_id, build_id, pending);
                    return Err(BuildsError::BadRequest(format!(
                        "base template {name:?} not found or has no ready build"
                    )));
                }
                Err(e) => {
                    self.put_back(template_id, build_id, pending);
                    return Err(e.into());
                }
            }
        }
        let plan = match self
            .service
            .plan_sdk(&body, pending.cpu_count, pending.memory_mb)
        {
            Ok(plan) => plan,
            Err(e) => {
                self.put_back(template_id, build_id, pending);
                return Err(e.into());
            }
        };
        self.launch(template_id, build_id, pending, plan)
    }

    /// `POST /templates/{id}/builds/{buildID}`: a Dockerfile build requested with `POST /templates`.
    pub fn start_dockerfile(
        self: &Arc<Self>,
        template_id: &str,
        build_id: &str,
    ) -> Result<(), BuildsError> {
        let pending = self.take_pending(template_id, build_id)?;
        let Some(dockerfile) = pending.dockerfile.clone() else {
            self.put_back(template_id, build_id, pending);
            return Err(BuildsError::BadRequest(
                "this build was requested without a dockerfile: start it with POST /v2/templates/{id}/builds/{buildID}".into(),
            ));
        };
        match self.dockerfile_plan(&dockerfile, &pending) {
            Ok(plan) => self.launch(template_id, build_id, pending, plan),
            Err(e) => {
                self.put_back(template_id, build_id, pending);
                Err(e)
            }
        }
    }

    fn dockerfile_plan(
        &self,
        dockerfile: &DockerfileBuild,
        pending: &PendingBuild,
    ) -> Result<super::builder::plan::BuildPlan, BuildsError> {
        let context = match &dockerfile.context_hash {
            Some(hash) => self.service.uploads().unpacked(hash)?.ok_or_else(|| {
                BuildsError::BadRequest(format!(
                    "context files {hash} were not uploaded (PUT /templates/{{id}}/files/{hash})"
                ))
            })?,
            None => {
                let empty = self.state_dir.join("template-files").join("empty-context");
                std::fs::create_dir_all(&empty).map_err(|source| BuildsError::Io {
                    path: empty.clone(),
                    source,
                })?;
                empty
            }
        };
        let template = TemplateDir {
            config: E2bToml {
                start_cmd: dockerfile.start_cmd.clone(),
                ready_cmd: dockerfile.ready_cmd.clone(),
                cpu_count: pending.cpu_count,
                memory_mb: pending.memory_mb,
                ..E2bToml::default()
            },
            dockerfile_path: context.join("e2b.Dockerfile"),
            dockerfile: dockerfile.dockerfile.clone(),
            context,
        };
        Ok(template.plan_with(
            &Default::default(),
            self.service.rootfs(),
            self.service.images(),
        )?)
    }

    fn put_back(&self, template_id: &str, build_id: &str, pending: PendingBuild) {
        self.lock_pending()
            .insert((template_id.to_string(), build_id.to_string()), pending);
    }

    fn launch(
        self: &Arc<Self>,
        template_id: &str,
        build_id: &str,
        pending: PendingBuild,
        plan: super::builder::plan::BuildPlan,
    ) -> Result<(), BuildsError> {
        let mut plan = plan;
        plan.privileges = pending.privileges;
        let builds = Arc::clone(self);
        let id = template_id.to_string();
        let tags = pending.tags.clone();
        let build = build_id.to_string();
        let on_done = Box::new(move |result: Result<BuiltTemplate, BuildError>| {
            let (built, reason) = match result {
                Ok(built) => (Some(built), None),
                Err(error) => (None, Some(error.to_string())),
            };
            let recorded = builds.runtime.block_on(async {
                let state = if built.is_some() {
                    BuildState::Ready
                } else {
                    BuildState::Error
                };
                builds.record_build(&id, &build, state, reason).await?;
                builds.record_result(&id, built, &tags).await
            });
            if let Err(error) = recorded {
                tracing::error!(template = %id, %error, "cannot record a finished build");
            }
        });
        match self.service.start(template_id, build_id, plan, on_done) {
            Ok(_) => {
                // The build thread may already have recorded its end; the store keeps that.
                let started = self.runtime.block_on(self.record_build(
                    template_id,
                    build_id,
                    BuildState::Building,
                    None,
                ));
                if let Err(error) = started {
                    tracing::warn!(build = %build_id, %error, "recording a started build");
                }
                Ok(())
            }
            Err(ServiceError::AlreadyRunning {
                template_id,
                build_id: running,
            }) => {
                self.put_back(&template_id, build_id, pending);
                Err(BuildsError::Conflict(format!(
                    "build {running} of template {template_id} is still running"
                )))
            }
            Err(e) => {
                self.put_back(template_id, build_id, pending);
                Err(e.into())
            }
        }
    }

    /// A finished build becomes the template's current version; a failed first build marks it `error`.
    async fn record_result(
        &self,
        template_id: &str,
        built: Option<BuiltTemplate>,
        tags: &[String],
    ) -> Result<(), StoreError> {
        let Some(mut record) = self.store.get_template(template_id).await? else {
            return Ok(());
        };
        record.updated_at = now_millis();
        match built {
            Some(built) => {
                record.layers = built.layers.clone();
                record.build_id = built.build_id.clone();
                record.status = "ready".into();
                if let Some(cpus) = built.cpu_count {
                    record.vcpus = f64::from(cpus);
                }
                if let Some(memory) = built.memory_mb {
                    record.memory_mib = memory;
                }
            }
            None if record.status != "ready" => record.status = "error".into(),
            None => return Ok(()),
        }
        self.store.upsert_template(&record).await?;
        if record.status == "ready" {
            let default = [DEFAULT_TAG.to_string()];
            let tags = if tags.is_empty() { &default[..] } else { tags };
            self.store
                .assign_template_tags(&record.id, &record.build_id, tags, now_millis())
                .await?;
        }
        Ok(())
    }

    async fn record_build(
        &self,
        template_id: &str,
        build_id: &str,
        status: BuildState,
        reason: Option<String>,
    ) -> Result<(), StoreError> {
        let now = now_millis();
        self.store
            .upsert_build(&BuildRecord {
                build_id: build_id.to_string(),
                template_id: template_id.to_string(),
                status,
                reason,
                created_at: now,
                updated_at: now,
            })
            .await
    }

    /// A template of `team_id` by id or name, for changing its tags.
    async fn owned_template(
        &self,
        team_id: &str,
        name: &str,
    ) -> Result<TemplateRecord, BuildsError> {
        match self.store.get_template(name).await? {
            Some(t) if t.team_id == team_id && t.id != BASE_TEMPLATE_ID => Ok(t),
            Some(t) if t.id == BASE_TEMPLATE_ID => Err(BuildsError::BuiltIn(t.id)),
            _ => Err(BuildsError::TemplateNotFound(name.into())),
        }
    }

    /// `POST /templates/tags`: points `tags` at the build `target` (`name:tag`, or `name` for the
    /// current build) names. Returns that build's id.
    pub async fn assign_tags(
        &self,
        team_id: &str,
        target: &str,
        tags: &[String],
    ) -> Result<String, BuildsError> {
        if tags.is_empty() {
            return Err(BuildsError::BadRequest("tags is empty".into()));
        }
        for tag in tags {
            check_tag(tag).map_err(|e| BuildsError::BadRequest(e.to_string()))?;
        }
        let (name, tag) = split_reference(target);
        let template = self.owned_template(team_id, name).await?;
        let build_id = tagged_build(self.store.as_ref(), &template, tag)
            .await
            .map_err(tag_error)?
            .ok_or_else(|| BuildsError::TemplateNotFound(target.into()))?;
        self.store
            .assign_template_tags(&template.id, &build_id, tags, now_millis())
            .await?;
        Ok(build_id)
    }

    /// `DELETE /templates/tags`: 404 when none of `tags` existed.
    pub async fn remove_tags(
        &self,
        team_id: &str,
        name: &str,
        tags: &[String],
    ) -> Result<(), BuildsError> {
        let template = self.owned_template(team_id, name).await?;
        if self.store.remove_template_tags(&template.id, tags).await? == 0 {
            return Err(BuildsError::TemplateNotFound(format!(
                "{name}:{}",
                tags.join(",")
            )));
        }
        Ok(())
    }

    /// `GET /templates/{id}/tags`.
    pub async fn list_tags(
        &self,
        team_id: &str,
        id_or_name: &str,
    ) -> Result<Vec<crate::store::TemplateTag>, BuildsError> {
        let template = match self.store.get_template(id_or_name).await? {
            Some(t) if t.public || t.team_id == team_id => t,
            _ => return Err(BuildsError::TemplateNotFound(id_or_name.into())),
        };
        Ok(self.store.list_template_tags(&template.id).await?)
    }

    /// Stops a build that is running: its sandbox is destroyed and it fails as cancelled. A build
    /// that has ended is a conflict; one this server does not know is not found.
    pub async fn cancel(&self, template_id: &str, build_id: &str) -> Result<(), BuildsError> {
        let template = self
            .store
            .get_template(template_id)
            .await?
            .ok_or_else(|| BuildsError::TemplateNotFound(template_id.into()))?;
        let service = Arc::clone(&self.service);
        let (id, build) = (template.id.clone(), build_id.to_string());
        let stopped = tokio::task::spawn_blocking(move || service.cancel(&id, &build))
            .await
            .map_err(|e| BuildsError::Conflict(format!("cancel: {e}")))?;
        match stopped {
            Some(true) => Ok(()),
            Some(false) => Err(BuildsError::Conflict(format!(
                "build '{build_id}' of template '{template_id}' has already ended"
            ))),
            None => Err(BuildsError::BuildNotFound {
                template_id: template_id.into(),
                build_id: build_id.into(),
            }),
        }
    }

    /// Registers the built-in template `id` (public, the default team's) for `plan` and says whether it
    /// needs a build: its newest version serves as it is when it was built from the same plan (same
    /// final layer key, start and ready commands), and becomes current. Otherwise start the build with
    /// [`TemplateBuilds::start_builtin`]; while an older version exists, that one stays current meanwhile.
    pub async fn register_builtin(
        &self,
        id: &str,
        aliases: &[&str],
        plan: &super::builder::plan::BuildPlan,
    ) -> Result<bool, BuildsError> {
        let latest = self.service.versions().latest(id)?;
        let cached = latest.filter(|built| {
            built.final_key == plan.final_key()
                && built.start_cmd == plan.start_cmd
                && built.ready_cmd == plan.ready_cmd
        });
        let existing = self.store.get_template(id).await?;
        let now = now_millis();
        let record = TemplateRecord {
            id: id.to_string(),
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
            layers: existing
                .as_ref()
                .map_or_else(Vec::new, |t| t.layers.clone()),
            build_id: existing
                .as_ref()
                .map_or_else(String::new, |t| t.build_id.clone()),
            status: existing
                .as_ref()
                .map_or_else(|| "building".to_string(), |t| t.status.clone()),
            vcpus: plan.cpu_count.map_or(self.defaults.vcpus, f64::from),
            memory_mib: plan.memory_mb.unwrap_or(self.defaults.memory_mib),
            disk_mib: self.defaults.disk_mib,
            envd_version: ENVD_VERSION.to_string(),
            public: true,
            team_id: crate::store::DEFAULT_TEAM.to_string(),
            spawn_count: existing.as_ref().map_or(0, |t| t.spawn_count),
            last_spawned_at: existing.as_ref().and_then(|t| t.last_spawned_at),
            created_at: existing.as_ref().map_or(now, |t| t.created_at),
            updated_at: now,
            policies: existing
                .as_ref()
                .map_or_else(Default::default, |t| t.policies.clone()),
        };
        self.store.upsert_template(&record).await?;
        match cached {
            Some(built) => {
                self.record_result(id, Some(built), &[]).await?;
                Ok(false)
            }
            None => Ok(true),
        }
    }

    /// Starts a build of the built-in template `id` registered with [`TemplateBuilds::register_builtin`];
    /// returns its build id. Blocking: call off the async threads.
    pub fn start_builtin(
        self: &Arc<Self>,
        id: &str,
        plan: super::builder::plan::BuildPlan,
    ) -> Result<String, BuildsError> {
        let build_id = uuid::Uuid::new_v4().to_string();
        let pending = PendingBuild {
            cpu_count: plan.cpu_count,
            memory_mb: plan.memory_mb,
            dockerfile: None,
            tags: Vec::new(),
            privileges: plan.privileges,
        };
        self.launch(id, &build_id, pending, plan)?;
        Ok(build_id)
    }

    /// The SDK's status body. A requested build not started yet is `waiting`; a build of an earlier
    /// server run is known from its version record.
    pub async fn status(
        &self,
        template_id: &str,
        build_id: &str,
        logs_offset: usize,
        limit: Option<usize>,
        level: Option<LogLevel>,
    ) -> Result<TemplateBuildInfo, BuildsError> {
        let template = self
            .store
            .get_template(template_id)
            .await?
            .ok_or_else(|| BuildsError::TemplateNotFound(template_id.into()))?;
        if let Some(job) = self.service.job(&template.id, build_id) {
            return Ok(job.status_response(logs_offset, limit, level));
        }
        let key = (template.id.clone(), build_id.to_string());
        let mut reason = None;
        let status = if self.lock_pending().contains_key(&key) {
            super::builder::job::BuildStatus::Waiting
        } else if let Some(record) = self.store.get_build(&template.id, build_id).await? {
            // A build of an earlier run (or requested then lost to a restart).
            reason = record
                .reason
                .map(|message| super::builder::job::BuildReason {
                    message,
                    step: None,
                    log_entries: Vec::new(),
                });
            match record.status {
                BuildState::Waiting => super::builder::job::BuildStatus::Waiting,
                BuildState::Building => super::builder::job::BuildStatus::Building,
                BuildState::Ready => super::builder::job::BuildStatus::Ready,
                BuildState::Error => super::builder::job::BuildStatus::Error,
            }
        } else if self.service.versions().load(&template.id, build_id).is_ok() {
            super::builder::job::BuildStatus::Ready
        } else {
            return Err(BuildsError::BuildNotFound {
                template_id: template_id.into(),
                build_id: build_id.into(),
            });
        };
        Ok(TemplateBuildInfo {
            template_id: template.id,
            build_id: build_id.into(),
            status,
            logs: Vec::new(),
            log_entries: Vec::new(),
            reason,
        })
    }

    /// Whether files of `hash` are already here (`GET /templates/{id}/files/{hash}`).
    pub async fn files_present(&self, template_id: &str, hash: &str) -> Result<bool, BuildsError> {
        self.known_template(template_id).await?;
        Ok(self.service.uploads().contains(hash)?)
    }

    /// A token for one upload of `hash`.
    pub fn upload_token(&self, hash: &str) -> String {
        let mut bytes = [0u8; 16];
        rand::rng().fill(&mut bytes);
        let token = hex::encode(bytes);
        self.upload_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.clone(), hash.to_string());
        token
    }

    /// Stores an uploaded archive if `token` was issued for `hash` (blocking: call off the async
    /// threads). Returns `None` for a wrong or used token.
    pub fn put_files(
        &self,
        hash: &str,
        token: &str,
        body: &mut dyn std::io::Read,
    ) -> Result<Option<u64>, BuildsError> {
        let issued = self
            .upload_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(token);
        if issued.as_deref() != Some(hash) {
            return Ok(None);
        }
        Ok(Some(self.service.uploads().put(hash, body)?))
    }

    pub async fn known_template(&self, template_id: &str) -> Result<TemplateRecord, BuildsError> {
        self.store
            .get_template(template_id)
            .await?
            .ok_or_else(|| BuildsError::TemplateNotFound(template_id.into()))
    }

    /// Deletes a template and its versions; refused while live sandboxes use it unless `force`.
    pub async fn delete(&self, id_or_alias: &str, force: bool) -> Result<(), BuildsError> {
        let template = self.known_template(id_or_alias).await?;
        if template.id == BASE_TEMPLATE_ID {
            return Err(BuildsError::BuiltIn(template.id));
        }
        let live = self
            .store
            .list_sandboxes(&SandboxFilter {
                states: vec![
                    SandboxState::Creating,
                    SandboxState::Running,
                    SandboxState::Pausing,
                    SandboxState::Paused,
                    SandboxState::Resuming,
                ],
                template: Some(template.id.clone()),
                ..SandboxFilter::default()
            })
            .await?
            .len();
        if self
            .service
            .job(&template.id, &template.build_id)
            .is_some_and(|job| {
                matches!(
                    job.status(),
                    super::builder::job::BuildStatus::Waiting
                        | super::builder::job::BuildStatus::Building
                )
            })
        {
            return Err(BuildsError::Conflict(format!(
                "template {} is being built",
                template.id
            )));
        }
        if live == 0 || force {
            // Before the files go: the runtime finds what it cached (a seeded layer, unpacked
            // images) from the checkpoint's manifest.
            let checkpoints = self
                .service
                .versions()
                .checkpoints(&template.id)
                .unwrap_or_default();
            self.service.forget_checkpoints(checkpoints).await;
        }
        match self.service.versions().delete(&template.id, live, force) {
            Err(VersionError::InUse { .. }) => {
                return Err(BuildsError::Conflict(format!(
                "template {} is used by {live} sandbox(es); stop them or delete with ?force=true",
                template.id
            )))
            }
            other => other?,
        };
        self.lock_pending().retain(|(t, _), _| t != &template.id);
        self.store.delete_template(&template.id).await?;
        if live == 0 {
            self.prune_unused_layers().await;
        }
        Ok(())
    }

    /// Garbage-collects cached layers (image layers among them) that no template version and no
    /// snapshot uses, after a template went away with no sandbox on it. Failures are logged: the
    /// delete itself succeeded.
    async fn prune_unused_layers(&self) {
        let snapshots = match self.store.list_snapshots(&SnapshotFilter::default()).await {
            Ok(snapshots) => snapshots,
            Err(error) => {
                tracing::warn!(%error, "listing snapshots for layer pruning; not pruning");
                return;
            }
        };
        // A live sandbox of a template deleted with ?force=true stands on layers no version lists any
        // more: then nothing is pruned.
        let live = match self
            .store
            .list_sandboxes(&SandboxFilter {
                states: vec![
                    SandboxState::Creating,
                    SandboxState::Running,
                    SandboxState::Pausing,
                    SandboxState::Paused,
                    SandboxState::Resuming,
                ],
                ..SandboxFilter::default()
            })
            .await
        {
            Ok(live) => live,
            Err(error) => {
                tracing::warn!(%error, "listing sandboxes for layer pruning; not pruning");
                return;
            }
        };
        for sandbox in &live {
            match self.store.get_template(&sandbox.template_id).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    tracing::info!(sandbox = %sandbox.id, template = %sandbox.template_id, "a live sandbox's template is gone; not pruning layers");
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "looking up templates for layer pruning; not pruning");
                    return;
                }
            }
        }
        let service = Arc::clone(&self.service);
        let layer_paths: Vec<PathBuf> = snapshots.into_iter().flat_map(|s| s.layers).collect();
        match tokio::task::spawn_blocking(move || service.prune_layers_if_idle(&layer_paths)).await
        {
            Ok(Ok(Some(removed))) if removed > 0 => {
                tracing::info!(removed, "pruned layers no template or snapshot uses")
            }
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "pruning unused layers"),
            Err(error) => tracing::warn!(%error, "pruning unused layers"),
        }
    }
}
