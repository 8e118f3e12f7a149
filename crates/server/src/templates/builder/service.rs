//! The entry points the server's templates API and the CLI call: turn a template directory or an SDK
//! request into a plan, start a build job in the background, and look jobs up for status and logs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use warren_runtime::Runtime;

use super::agent_commands::CommandRunner;
use super::base_image::{default_rootfs_dir, E2B_DEFAULT_BASE_IMAGE};
use super::context::{BuildContext, ContextError};
use super::dockerfile_plan::{plan_dockerfile_with, DockerfileInput, DockerfilePlanError};
use super::e2b_toml::{E2bToml, E2bTomlError};
use super::job::BuildJob;
use super::plan::{BaseSource, BuildPlan, ExecState};
use super::runner::{BuildError, BuildSettings, TemplateBuilder};
use super::sdk_template::{plan_sdk_template, SdkPlanEnv, SdkTemplateError, TemplateBuildStartV2};
use super::uploads::UploadStore;
use super::versions::{BuiltTemplate, TemplateVersions, VersionError};
use crate::templates::images::registry::RegistryClient;
use crate::templates::images::{ImageResolver, NoRegistry};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no Dockerfile in {0}: expected e2b.Dockerfile (or Dockerfile, or the file e2b.toml names)"
    )]
    NoDockerfile(PathBuf),
    #[error(transparent)]
    Toml(#[from] E2bTomlError),
    #[error(transparent)]
    Context(#[from] ContextError),
    #[error(transparent)]
    Dockerfile(#[from] DockerfilePlanError),
    #[error(transparent)]
    Sdk(#[from] SdkTemplateError),
    #[error(transparent)]
    Version(#[from] VersionError),
    #[error("a build {build_id} of template {template_id} is already running")]
    AlreadyRunning {
        template_id: String,
        build_id: String,
    },
    #[error("starting the build thread: {0}")]
    Thread(std::io::Error),
}

/// A template directory as the E2B CLI lays it out: `e2b.toml` (optional) and `e2b.Dockerfile`.
#[derive(Debug, Clone)]
pub struct TemplateDir {
    pub config: E2bToml,
    pub dockerfile_path: PathBuf,
    pub dockerfile: String,
    pub context: PathBuf,
}

impl TemplateDir {
    /// Reads `dir/e2b.toml` if present and the Dockerfile it names (default `e2b.Dockerfile`, then
    /// `Dockerfile`). The build context is `dir`.
    pub fn open(dir: &Path) -> Result<TemplateDir, ServiceError> {
        let toml_path = dir.join("e2b.toml");
        let config = match std::fs::read_to_string(&toml_path) {
            Ok(text) => E2bToml::parse(&text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => E2bToml::default(),
            Err(source) => {
                return Err(ServiceError::Read {
                    path: toml_path,
                    source,
                })
            }
        };
        let candidates: Vec<PathBuf> = match &config.dockerfile {
            Some(name) => vec![dir.join(name)],
            None => vec![dir.join("e2b.Dockerfile"), dir.join("Dockerfile")],
        };
        let dockerfile_path = candidates
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(|| ServiceError::NoDockerfile(dir.to_path_buf()))?;
        let dockerfile =
            std::fs::read_to_string(&dockerfile_path).map_err(|source| ServiceError::Read {
                path: dockerfile_path.clone(),
                source,
            })?;
        Ok(TemplateDir {
            config,
            dockerfile_path,
            dockerfile,
            context: dir.to_path_buf(),
        })
    }

    /// The plan for this directory with `--build-arg` values (callers may edit `config` first, e.g. for
    /// command-line overrides of start_cmd).
    pub fn plan(
        &self,
        build_args: &BTreeMap<String, String>,
        rootfs: &Path,
    ) -> Result<BuildPlan, ServiceError> {
        self.plan_with(build_args, rootfs, &NoRegistry)
    }

    /// [`TemplateDir::plan`] with `images` resolving a `FROM` that is pulled from a registry.
    pub fn plan_with(
        &self,
        build_args: &BTreeMap<String, String>,
        rootfs: &Path,
        images: &dyn ImageResolver,
    ) -> Result<BuildPlan, ServiceError> {
        let context = BuildContext::open(&self.context)?;
        Ok(plan_dockerfile_with(
            &DockerfileInput {
                dockerfile: &self.dockerfile,
                context: &context,
                build_args,
                config: &self.config,
                rootfs,
            },
            images,
        )?)
    }
}

/// Plan of the default `base` template (what the SDK starts when no template is named).
pub fn default_base_plan(rootfs: &Path) -> Result<BuildPlan, ServiceError> {
    let request = TemplateBuildStartV2 {
        from_image: Some(E2B_DEFAULT_BASE_IMAGE.into()),
        ..Default::default()
    };
    let env = LocalSdkEnv {
        rootfs: rootfs.to_path_buf(),
        uploads: None,
        versions: None,
        images: Arc::new(NoRegistry),
    };
    Ok(plan_sdk_template(&request, None, None, &env)?)
}

/// Resolves SDK request inputs against this node's state: uploaded files and finished templates.
struct LocalSdkEnv {
    rootfs: PathBuf,
    uploads: Option<UploadStore>,
    versions: Option<TemplateVersions>,
    images: Arc<dyn ImageResolver>,
}

impl SdkPlanEnv for LocalSdkEnv {
    fn rootfs(&self) -> PathBuf {
        self.rootfs.clone()
    }

    fn images(&self) -> &dyn ImageResolver {
        self.images.as_ref()
    }

    fn files_dir(&self, files_hash: &str) -> Option<PathBuf> {
        self.uploads.as_ref()?.unpacked(files_hash).ok().flatten()
    }

    fn template_base(&self, name: &str) -> Option<BaseSource> {
        if let Some(built) = self.versions.as_ref()?.latest(name).ok().flatten() {
            return Some(base_from_built(&built));
        }
        // The built-in `base` has no build of its own: it is the base rootfs, which is also what
        // E2B's default image (`e2bdev/base`) resolves to here, so `fromTemplate("base")` builds on
        // it the way `fromImage("e2bdev/base")` does.
        (name == crate::templates::BASE_TEMPLATE_ID)
            .then(|| super::base_image::resolve(E2B_DEFAULT_BASE_IMAGE, &self.rootfs).ok())
            .flatten()
            .map(BaseSource::Image)
    }
}

/// A finished template as the base of another (`fromTemplate`). Its start command is not inherited.
pub fn base_from_built(built: &BuiltTemplate) -> BaseSource {
    BaseSource::Template {
        name: built.template_id.clone(),
        layers: built.layers.clone(),
        key: built.final_key.clone(),
        state: ExecState {
            env: built.env.clone(),
            build_args: BTreeMap::new(),
            user: built.user.clone(),
            workdir: built.workdir.clone(),
            shell: vec!["/bin/sh".into(), "-c".into()],
        },
    }
}

/// Tells `job` to stop with `reason` and destroys the sandbox it works in, which ends its step;
/// whether the build was still running.
pub(crate) fn stop(runtime: &dyn Runtime, job: &BuildJob, reason: &str) -> bool {
    let Some(sandbox) = job.request_stop(reason) else {
        return false;
    };
    tracing::warn!(build = %job.ids().1, reason, "stopping a build");
    if let Some(id) = sandbox {
        if let Err(error) = runtime.destroy(&id) {
            tracing::warn!(sandbox = %id, %error, "destroying a stopped build's sandbox");
        }
    }
    true
}

/// Runs builds in background threads and keeps their job records for status queries.
pub struct BuildService {
    runtime: Arc<dyn Runtime>,
    commands: Arc<dyn CommandRunner>,
    settings: BuildSettings,
    rootfs: PathBuf,
    images: Arc<dyn ImageResolver>,
    jobs: Mutex<HashMap<(String, String), BuildJob>>,
}

impl BuildService {
    /// `rootfs`: the Debian 12 base ([`default_rootfs_dir`] unless overridden).
    pub fn new(
        runtime: Arc<dyn Runtime>,
        commands: Arc<dyn CommandRunner>,
        settings: BuildSettings,
        rootfs: Option<PathBuf>,
    ) -> BuildService {
        let images: Arc<dyn ImageResolver> =
            Arc::new(RegistryClient::new(settings.registry.clone()));
        BuildService {
            runtime,
            commands,
            settings,
            images,
            rootfs: rootfs.unwrap_or_else(default_rootfs_dir),
            jobs: Mutex::new(HashMap::new()),
        }
    }

    pub fn rootfs(&self) -> &Path {
        &self.rootfs
    }

    /// Resolves `FROM` images that are pulled (the registries in [`BuildSettings::registry`]).
    pub fn images(&self) -> &dyn ImageResolver {
        self.images.as_ref()
    }

    pub fn uploads(&self) -> UploadStore {
        UploadStore::new(&self.settings.state_dir)
    }

    pub fn versions(&self) -> TemplateVersions {
        TemplateVersions::new(&self.settings.state_dir)
    }

    /// Lets the runtime drop what it cached to start copies of these checkpoints (they are about to
    /// be deleted with their template), off the async threads.
    pub async fn forget_checkpoints(&self, checkpoints: Vec<std::path::PathBuf>) {
        if checkpoints.is_empty() {
            return;
        }
        let runtime = Arc::clone(&self.runtime);
        let _ = tokio::task::spawn_blocking(move || {
            for checkpoint in &checkpoints {
                runtime.forget_checkpoint(checkpoint);
            }
        })
        .await;
    }

    /// The plan for an SDK `POST /v2/templates/{id}/builds/{buildID}` body.
    pub fn plan_sdk(
        &self,
        request: &TemplateBuildStartV2,
        cpu_count: Option<u32>,
        memory_mb: Option<u64>,
    ) -> Result<BuildPlan, ServiceError> {
        let env = LocalSdkEnv {
            rootfs: self.rootfs.clone(),
            uploads: Some(self.uploads()),
            versions: Some(self.versions()),
            images: Arc::clone(&self.images),
        };
        Ok(plan_sdk_template(request, cpu_count, memory_mb, &env)?)
    }

    /// The plan for a template directory (the CLI's `warren template build DIR`).
    pub fn plan_dir(
        &self,
        dir: &Path,
        build_args: &BTreeMap<String, String>,
    ) -> Result<(TemplateDir, BuildPlan), ServiceError> {
        let template = TemplateDir::open(dir)?;
        let plan = template.plan_with(build_args, &self.rootfs, self.images.as_ref())?;
        Ok((template, plan))
    }

    /// The sandboxes builds that have not ended work in now (the reconciler keeps these and ends
    /// other build sandboxes).
    pub fn active_sandboxes(&self) -> std::collections::HashSet<String> {
        self.lock_jobs()
            .values()
            .filter_map(BuildJob::current_sandbox)
            .collect()
    }

    fn lock_jobs(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), BuildJob>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts building `plan` in a background thread; returns its job at once. `on_done` runs on that
    /// thread with the result (the server records the version in its store there).
    pub fn start(
        self: &Arc<Self>,
        template_id: &str,
        build_id: &str,
        plan: BuildPlan,
        on_done: Box<dyn FnOnce(Result<BuiltTemplate, BuildError>) + Send>,
    ) -> Result<BuildJob, ServiceError> {
        {
            let jobs = self.lock_jobs();
            if let Some(((_, running), _)) = jobs.iter().find(|((t, _), job)| {
                t == template_id
                    && matches!(
                        job.status(),
                        super::job::BuildStatus::Waiting | super::job::BuildStatus::Building
                    )
            }) {
                return Err(ServiceError::AlreadyRunning {
                    template_id: template_id.into(),
                    build_id: running.clone(),
                });
            }
        }
        let job = BuildJob::new(template_id, build_id);
        self.lock_jobs()
            .insert((template_id.to_string(), build_id.to_string()), job.clone());
        let service = Arc::clone(self);
        let thread_job = job.clone();
        let watch_name = format!("watch-{build_id}");
        let (template_id, build_id) = (template_id.to_string(), build_id.to_string());
        std::thread::Builder::new()
            .name(format!("build-{build_id}"))
            .spawn(move || {
                let builder = TemplateBuilder::new(
                    service.runtime.as_ref(),
                    service.commands.as_ref(),
                    service.settings.clone(),
                );
                let result = builder.build(&plan, &template_id, &build_id, &thread_job);
                on_done(result);
            })
            .map_err(ServiceError::Thread)?;
        // The watchdog: a build never stays `building` past its timeout, whatever hangs.
        let watched = job.clone();
        let runtime = Arc::clone(&self.runtime);
        let limit = self.settings.build_timeout;
        std::thread::Builder::new()
            .name(watch_name)
            .spawn(move || {
                if !watched.wait_until_finished(limit) {
                    stop(
                        runtime.as_ref(),
                        &watched,
                        &format!("the build timed out after {}s", limit.as_secs()),
                    );
                }
            })
            .map_err(ServiceError::Thread)?;
        Ok(job)
    }

    /// Stops a running build of this process (`DELETE /templates/{id}/builds/{buildID}`): its
    /// sandbox is destroyed and the build fails as cancelled. False when it had ended already.
    pub fn cancel(&self, template_id: &str, build_id: &str) -> Option<bool> {
        let job = self.job(template_id, build_id)?;
        Some(stop(self.runtime.as_ref(), &job, "the build was cancelled"))
    }

    /// Runs a build on the calling thread (the CLI's local builds, tests).
    pub fn build_now(
        &self,
        template_id: &str,
        build_id: &str,
        plan: &BuildPlan,
        job: &BuildJob,
    ) -> Result<BuiltTemplate, BuildError> {
        let builder = TemplateBuilder::new(
            self.runtime.as_ref(),
            self.commands.as_ref(),
            self.settings.clone(),
        );
        builder.build(plan, template_id, build_id, job)
    }

    /// Removes cached layers (build steps and image layers) no template version uses and `in_use` (layer
    /// directories of snapshots and sandboxes) does not name — unless a build is running, which may be
    /// stacking layers it has not recorded yet (then None). New builds wait for the prune to finish.
    pub fn prune_layers_if_idle(&self, in_use: &[PathBuf]) -> Result<Option<usize>, VersionError> {
        let jobs = self.lock_jobs();
        let running = jobs.values().any(|job| {
            matches!(
                job.status(),
                super::job::BuildStatus::Waiting | super::job::BuildStatus::Building
            )
        });
        if running {
            return Ok(None);
        }
        let layers = super::layers::LayerStore::new(&self.settings.state_dir);
        let keep: std::collections::BTreeSet<String> = in_use
            .iter()
            .filter_map(|path| {
                let dir = path.strip_prefix(layers.root()).ok()?;
                Some(
                    dir.components()
                        .next()?
                        .as_os_str()
                        .to_string_lossy()
                        .into_owned(),
                )
            })
            .collect();
        let removed = self.versions().prune_layers(&layers, &keep)?;
        drop(jobs);
        Ok(Some(removed))
    }

    /// The job of a build started by this process.
    pub fn job(&self, template_id: &str, build_id: &str) -> Option<BuildJob> {
        self.lock_jobs()
            .get(&(template_id.to_string(), build_id.to_string()))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn template_dir_reads_toml_and_dockerfile() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("e2b.toml"),
            "template_name = \"web\"\nstart_cmd = \"python3 app.py\"\n",
        )
        .unwrap();
        fs::write(
            dir.path().join("e2b.Dockerfile"),
            "FROM python:3.11\nRUN echo hi\n",
        )
        .unwrap();
        let t = TemplateDir::open(dir.path()).unwrap();
        assert_eq!(t.config.template_name.as_deref(), Some("web"));
        let plan = t.plan(&BTreeMap::new(), Path::new("/nonexistent")).unwrap();
        assert_eq!(plan.start_cmd.as_deref(), Some("python3 app.py"));
        assert_eq!(plan.steps.len(), 2);
    }

    #[test]
    fn named_dockerfile_and_missing_dockerfile() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            TemplateDir::open(dir.path()),
            Err(ServiceError::NoDockerfile(_))
        ));
        fs::write(dir.path().join("Dockerfile"), "FROM debian\n").unwrap();
        assert!(TemplateDir::open(dir.path()).is_ok());
        fs::write(
            dir.path().join("e2b.toml"),
            "dockerfile = \"custom.Dockerfile\"\n",
        )
        .unwrap();
        assert!(matches!(
            TemplateDir::open(dir.path()),
            Err(ServiceError::NoDockerfile(_))
        ));
        fs::write(dir.path().join("custom.Dockerfile"), "FROM ubuntu:22.04\n").unwrap();
        assert!(TemplateDir::open(dir.path())
            .unwrap()
            .dockerfile
            .contains("ubuntu"));
    }

    /// The body and upload the official SDK produced (tests/templates/sdk-builder) plan end to end.
    #[test]
    fn official_sdk_request_and_upload_plan() {
        use crate::templates::builder::plan::StepAction;
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/templates/sdk-builder");
        let body: TemplateBuildStartV2 =
            serde_json::from_str(&fs::read_to_string(fixture.join("request.json")).unwrap())
                .unwrap();
        let hash = body.steps[0].files_hash.clone().unwrap();
        let state = tempfile::tempdir().unwrap();
        let uploads = UploadStore::new(state.path());
        let mut archive = fs::File::open(fixture.join(format!("{hash}.tar.gz"))).unwrap();
        uploads.put(&hash, &mut archive).unwrap();
        let env = LocalSdkEnv {
            rootfs: PathBuf::from("/nonexistent"),
            uploads: Some(uploads),
            versions: Some(TemplateVersions::new(state.path())),
            images: Arc::new(NoRegistry),
        };
        let plan = plan_sdk_template(&body, Some(2), Some(2048), &env).unwrap();
        let titles: Vec<&str> = plan.steps.iter().map(|s| s.title.as_str()).collect();
        assert_eq!(titles[0], "FROM python:3.11");
        assert_eq!(titles[1], "COPY app /home/user/app");
        assert_eq!(titles[2], "RUN pip install flask");
        match &plan.steps[1].action {
            StepAction::Copy { entries, owner, .. } => {
                let targets: Vec<&str> = entries.iter().map(|e| e.target.as_str()).collect();
                assert_eq!(targets, vec!["/home/user/app", "/home/user/app/main.py"]);
                assert_eq!(owner.as_deref(), Some("user"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(plan.steps[2].state.user, "root");
        assert_eq!(plan.final_state.env["APP_ENV"], "prod");
        assert_eq!(plan.final_state.workdir, "/home/user/app");
        assert_eq!(plan.final_state.user, "user");
        assert!(plan.ready_cmd.as_deref().unwrap().contains("sport = :8000"));
    }

    #[test]
    fn default_base_is_the_e2b_base_image() {
        let plan = default_base_plan(Path::new("/nonexistent")).unwrap();
        match &plan.base {
            BaseSource::Image(image) => assert_eq!(image.image, E2B_DEFAULT_BASE_IMAGE),
            other => panic!("{other:?}"),
        }
        assert_eq!(plan.final_state.user, "user");
    }
}
