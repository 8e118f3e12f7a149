//! Template builds as the API sees them: a build is requested (a template id and a fresh build id are
//! handed out), its files uploaded, then started; the build service runs it in the background and the
//! finished version becomes the template's current build in the store. Template names are aliases: a
//! rebuild under the same name keeps the template id and adds a build.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rand::Rng;
use warren_proto::api::ENVD_VERSION;

use super::build::e2b_toml::E2bToml;
use super::build::job::{LogLevel, TemplateBuildInfo};
use super::build::sdk_template::TemplateBuildStartV2;
use super::build::service::{BuildService, ServiceError, TemplateDir};
use super::build::uploads::UploadError;
use super::build::versions::{BuiltTemplate, VersionError};
use super::BASE_TEMPLATE_ID;
use crate::config::DefaultResources;
use crate::lifecycle::now_millis;
use crate::lifecycle::state::SandboxState;
use crate::store::{SandboxFilter, Store, StoreError, TemplateRecord};

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

fn new_template_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..20)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
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
            if cpus == 0 || cpus > super::build::e2b_toml::MAX_CPU_COUNT {
                return Err(BuildsError::BadRequest(format!(
                    "cpuCount {cpus} is out of range 1..={}",
                    super::build::e2b_toml::MAX_CPU_COUNT
                )));
            }
        }
        if let Some(memory) = request.memory_mb {
            if memory < super::build::e2b_toml::MIN_MEMORY_MB {
                return Err(BuildsError::BadRequest(format!(
                    "memoryMB {memory} is below the minimum of {}",
                    super::build::e2b_toml::MIN_MEMORY_MB
                )));
            }
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
                    })
                    .await?;
                (id, aliases)
            }
        };
        self.lock_pending().insert(
            (template_id.clone(), build_id.clone()),
            PendingBuild {
                cpu_count: request.cpu_count,
                memory_mb: request.memory_mb,
                dockerfile: request.dockerfile,
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
        let plan = match self
            .service
            .plan_sdk(body, pending.cpu_count, pending.memory_mb)
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
    ) -> Result<super::build::plan::BuildPlan, BuildsError> {
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
        Ok(template.plan(&Default::default(), self.service.rootfs())?)
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
        plan: super::build::plan::BuildPlan,
    ) -> Result<(), BuildsError> {
        let builds = Arc::clone(self);
        let id = template_id.to_string();
        let on_done = Box::new(move |result: Result<BuiltTemplate, _>| {
            let recorded = builds
                .runtime
                .block_on(builds.record_result(&id, result.ok()));
            if let Err(error) = recorded {
                tracing::error!(template = %id, %error, "cannot record a finished build");
            }
        });
        match self.service.start(template_id, build_id, plan, on_done) {
            Ok(_) => Ok(()),
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
        self.store.upsert_template(&record).await
    }

    /// Makes sure the built-in template `id` (public, the default team's) is built from `plan`: its newest
    /// version is used as it is when it was built from the same plan (same final layer key, start and
    /// ready commands); otherwise a build starts in the background and the template becomes `ready`
    /// when it finishes (while an older version exists, that one stays current meanwhile). Returns the
    /// id of the started build, or None when the cached version serves.
    pub async fn ensure_builtin(
        self: &Arc<Self>,
        id: &str,
        aliases: &[&str],
        plan: super::build::plan::BuildPlan,
    ) -> Result<Option<String>, BuildsError> {
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
        };
        self.store.upsert_template(&record).await?;
        if let Some(built) = cached {
            self.record_result(id, Some(built)).await?;
            return Ok(None);
        }
        let build_id = uuid::Uuid::new_v4().to_string();
        let pending = PendingBuild {
            cpu_count: plan.cpu_count,
            memory_mb: plan.memory_mb,
            dockerfile: None,
        };
        self.launch(id, &build_id, pending, plan)?;
        Ok(Some(build_id))
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
        let status = if self.lock_pending().contains_key(&key) {
            super::build::job::BuildStatus::Waiting
        } else if self.service.versions().load(&template.id, build_id).is_ok() {
            super::build::job::BuildStatus::Ready
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
            reason: None,
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
        rand::thread_rng().fill(&mut bytes);
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
                    super::build::job::BuildStatus::Waiting
                        | super::build::job::BuildStatus::Building
                )
            })
        {
            return Err(BuildsError::Conflict(format!(
                "template {} is being built",
                template.id
            )));
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
        Ok(())
    }
}
