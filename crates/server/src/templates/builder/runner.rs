//! Executes a [`BuildPlan`]: every RUN in a real Warren sandbox on the layers so far (its writable layer
//! committed as the next layer), COPY/ADD and WORKDIR written on the host, cached layers reused by key,
//! then start_cmd + ready_cmd + checkpoint (or a cold template where this host cannot checkpoint).
//! Progress goes to a [`BuildJob`]; the result is a [`BuiltTemplate`] saved in [`TemplateVersions`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use warren_runtime::{NetworkSpec, Resources, Runtime, RuntimeError, SandboxSpec};

use super::agent_commands::{CommandError, CommandRunner, CommandSpec, OutputStream};
use super::job::{BuildJob, LineSplitter, LogLevel};
use super::layers::{
    stage_entries, write_copy_layer, write_workdir_layer, LayerError, LayerStack, LayerStore,
};
use super::plan::{BaseSource, BuildPlan, PlanStep, StepAction};
use super::versions::{BuiltTemplate, TemplateStart, TemplateVersions, VersionError};
use crate::templates::images::image_layers::{
    ensure_image_layers, ImageLayerError, LayerSource, StoredLayer,
};
use crate::templates::images::registry::{ImageLayer, RegistryClient, RegistrySettings};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("base rootfs {0} is missing; run scripts/setup (40-rootfs.sh) to build it")]
    BaseMissing(PathBuf),
    #[error("step {step} ({title}) failed with exit code {code}")]
    StepFailed {
        step: String,
        title: String,
        code: i32,
    },
    #[error("step {step} ({title}): {source}")]
    Runtime {
        step: String,
        title: String,
        #[source]
        source: RuntimeError,
    },
    #[error("step {step} ({title}): {source}")]
    Command {
        step: String,
        title: String,
        #[source]
        source: Box<CommandError>,
    },
    #[error("step {step} ({title}): {source}")]
    Layer {
        step: String,
        title: String,
        #[source]
        source: LayerError,
    },
    #[error("base image: {0}")]
    Image(#[source] ImageLayerError),
    #[error("finalize: {0}")]
    Finalize(String),
    #[error(transparent)]
    Version(#[from] VersionError),
    /// The plan asked for something the runner did not prepare (a bug, not bad input).
    #[error("internal: {0}")]
    Internal(String),
    #[error("{reason}{}", step.as_deref().map(|s| format!(" (in step {s})")).unwrap_or_default())]
    Stopped {
        step: Option<String>,
        reason: String,
    },
}

impl BuildError {
    /// The step to name in the SDK's failure reason.
    pub fn step(&self) -> Option<&str> {
        match self {
            BuildError::StepFailed { step, .. }
            | BuildError::Runtime { step, .. }
            | BuildError::Command { step, .. }
            | BuildError::Layer { step, .. } => Some(step),
            BuildError::Finalize(_) => Some(FINALIZE_STEP),
            BuildError::BaseMissing(_) | BuildError::Image(_) => Some("base"),
            BuildError::Version(_) | BuildError::Internal(_) => None,
            BuildError::Stopped { step, .. } => step.as_deref(),
        }
    }
}

/// The SDK's name for the start/ready/snapshot phase.
pub const FINALIZE_STEP: &str = "finalize";

/// Knobs of the build runner.
#[derive(Debug, Clone)]
pub struct BuildSettings {
    pub state_dir: PathBuf,
    /// Build sandboxes are named `<prefix><build id>-<step>` (tests use `wt-`).
    pub sandbox_prefix: String,
    /// Limits of each RUN sandbox (the template's cpu/memory apply to the final sandbox).
    pub step_resources: Resources,
    /// RUN steps usually download packages: NAT to the uplink.
    pub allow_internet: bool,
    /// How long ready_cmd may keep failing after start_cmd started.
    pub ready_timeout: Duration,
    /// How long a whole build may take before it is stopped (its sandbox destroyed) and fails.
    pub build_timeout: Duration,
    pub ready_interval: Duration,
    /// Which image registries may be reached without TLS (loopback ones always may).
    pub registry: RegistrySettings,
    /// Admits each build sandbox on the host like any other sandbox (the server's lifecycle);
    /// None: no check (unit tests, the CLI's local builds).
    pub admission: Option<Admission>,
    /// How long a build sandbox waits for room before the build fails saying why.
    pub admission_wait: Duration,
}

/// How the host admits a build's sandboxes: against its limits and capacity, with every other
/// sandbox counted.
pub trait BuildAdmission: Send + Sync {
    /// Admits sandbox `id` of a build of `template_id` with `resources`, or says why there is no
    /// room now.
    fn admit(&self, template_id: &str, id: &str, resources: &Resources) -> Result<(), String>;
    /// The admitted sandbox `id` is up, working on `step` of `template_id`'s build `build_id`
    /// (it leaves a lifecycle event like any sandbox).
    fn started(&self, template_id: &str, build_id: &str, id: &str, step: &str);
    /// Sandbox `id` is gone (or was never made): it stops counting; `how` says what ended it.
    fn release(&self, id: &str, how: &str);
}

/// A [`BuildAdmission`] in the build settings.
#[derive(Clone)]
pub struct Admission(pub std::sync::Arc<dyn BuildAdmission>);

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admission")
    }
}

impl BuildSettings {
    pub fn new(state_dir: &Path) -> BuildSettings {
        BuildSettings {
            state_dir: state_dir.to_path_buf(),
            sandbox_prefix: "bld-".into(),
            step_resources: Resources {
                vcpus: 2.0,
                memory_mib: 2048,
                disk_mib: 8192,
                max_pids: 4096,
            },
            allow_internet: true,
            ready_timeout: Duration::from_secs(120),
            build_timeout: Duration::from_secs(3600),
            ready_interval: Duration::from_millis(500),
            registry: RegistrySettings::from_env(),
            admission: None,
            admission_wait: Duration::from_secs(300),
        }
    }
}

/// Runs builds against a runtime and an agent client.
pub struct TemplateBuilder<'a> {
    runtime: &'a dyn Runtime,
    commands: &'a dyn CommandRunner,
    settings: BuildSettings,
    layers: LayerStore,
    versions: TemplateVersions,
}

/// Destroys a build sandbox however the step ends.
struct SandboxGuard<'a> {
    runtime: &'a dyn Runtime,
    admission: Option<&'a Admission>,
    id: String,
    armed: bool,
    job: &'a BuildJob,
}

impl Drop for SandboxGuard<'_> {
    fn drop(&mut self) {
        self.job.left_sandbox(&self.id);
        if self.armed {
            if let Err(e) = self.runtime.destroy(&self.id) {
                tracing::warn!(sandbox = %self.id, error = %e, "destroying build sandbox");
            }
        }
        // Destroyed here, or torn down by its checkpoint: it no longer holds anything.
        if let Some(admission) = self.admission {
            admission.0.release(
                &self.id,
                if self.armed {
                    "destroyed: its build step ended"
                } else {
                    "checkpointed as the template's snapshot"
                },
            );
        }
    }
}

impl<'a> TemplateBuilder<'a> {
    pub fn new(
        runtime: &'a dyn Runtime,
        commands: &'a dyn CommandRunner,
        settings: BuildSettings,
    ) -> Self {
        let layers = LayerStore::new(&settings.state_dir);
        let versions = TemplateVersions::new(&settings.state_dir);
        TemplateBuilder {
            runtime,
            commands,
            settings,
            layers,
            versions,
        }
    }

    pub fn layers(&self) -> &LayerStore {
        &self.layers
    }

    pub fn versions(&self) -> &TemplateVersions {
        &self.versions
    }

    /// Builds `plan` as `template_id`/`build_id`, reporting to `job` (left ready or error).
    pub fn build(
        &self,
        plan: &BuildPlan,
        template_id: &str,
        build_id: &str,
        job: &BuildJob,
    ) -> Result<BuiltTemplate, BuildError> {
        let mut steps: Vec<(String, String)> = plan
            .steps
            .iter()
            .map(|s| (s.id.clone(), s.title.clone()))
            .collect();
        steps.push((FINALIZE_STEP.into(), finalize_title(plan)));
        job.set_steps(steps);
        let result = match self.build_inner(plan, template_id, build_id, job) {
            // A stopped build fails however its step noticed (a destroyed sandbox breaks it).
            Err(error) => match job.stop_reason() {
                Some(reason) => Err(BuildError::Stopped {
                    step: error.step().map(String::from),
                    reason,
                }),
                None => Err(error),
            },
            Ok(built) => Ok(built),
        };
        match &result {
            Ok(built) => {
                job.log(
                    LogLevel::Info,
                    None,
                    format!(
                        "template {template_id} build {build_id} ready in {:.1}s ({} of {} steps cached)",
                        built.build_seconds, built.cached_steps, built.total_steps
                    ),
                );
                job.ready();
            }
            Err(e) => job.fail(e.to_string(), e.step()),
        }
        result
    }

    fn build_inner(
        &self,
        plan: &BuildPlan,
        template_id: &str,
        build_id: &str,
        job: &BuildJob,
    ) -> Result<BuiltTemplate, BuildError> {
        let started = Instant::now();
        // Validate ids before any sandbox exists.
        let build_dir = self.versions.build_dir(template_id, build_id)?;
        for warning in &plan.warnings {
            job.log(LogLevel::Warn, None, warning.clone());
        }
        // Earlier stages of a multi-stage Dockerfile first (only those the template uses).
        let mut stages: Vec<Option<BuiltStack>> = vec![None; plan.stages.len()];
        for index in plan.needed_stages() {
            let stage = &plan.stages[index];
            let name = stage
                .name
                .clone()
                .unwrap_or_else(|| format!("stage {index}"));
            for warning in &stage.plan.warnings {
                job.log(LogLevel::Warn, None, format!("{name}: {warning}"));
            }
            job.log(LogLevel::Info, None, format!("building {name}"));
            stages[index] = Some(self.build_stack(&stage.plan, &stages, build_id, job)?);
        }
        let BuiltStack {
            layers: stack,
            keys,
            cached_steps,
        } = self.build_stack(plan, &stages, build_id, job)?;

        job.step_started(FINALIZE_STEP);
        let start = self.finalize(plan, &stack, build_id, &build_dir, job)?;
        job.step_finished(FINALIZE_STEP, false);

        let built = BuiltTemplate {
            template_id: template_id.into(),
            build_id: build_id.into(),
            created_at: chrono::Utc::now().to_rfc3339(),
            layers: stack,
            layer_keys: keys,
            final_key: plan.final_key(),
            env: plan.final_state.env.clone(),
            user: plan.final_state.user.clone(),
            workdir: plan.final_state.workdir.clone(),
            start_cmd: plan.start_cmd.clone(),
            ready_cmd: plan.ready_cmd.clone(),
            cpu_count: plan.cpu_count,
            memory_mb: plan.memory_mb,
            privileges: plan.privileges,
            start,
            build_seconds: started.elapsed().as_secs_f64(),
            cached_steps,
            total_steps: plan.steps.len(),
        };
        self.versions.save(&built)?;
        Ok(built)
    }

    /// The layers of `plan`'s base and steps (built, or found in the cache), top-most first, with
    /// their keys base first; `stages` holds the stages built so far.
    fn build_stack(
        &self,
        plan: &BuildPlan,
        stages: &[Option<BuiltStack>],
        build_id: &str,
        job: &BuildJob,
    ) -> Result<BuiltStack, BuildError> {
        if let BaseSource::Image(image) = &plan.base {
            if !image.rootfs.is_dir() {
                return Err(BuildError::BaseMissing(image.rootfs.clone()));
            }
            job.log(
                LogLevel::Info,
                Some("base"),
                format!(
                    "FROM {} (Debian 12 base at {})",
                    image.image,
                    image.rootfs.display()
                ),
            );
        }
        let mut stack = plan.base.layers();
        let mut keys = Vec::new();
        if let BaseSource::Stage { index, .. } = &plan.base {
            let built = stage_stack(stages, *index)?;
            stack = built.layers.clone();
            keys = built.keys.clone();
        }
        if let BaseSource::Registry(image) = &plan.base {
            job.log(
                LogLevel::Info,
                Some("base"),
                format!(
                    "FROM {} ({}, {} layers)",
                    image.canonical,
                    image.manifest_digest,
                    image.layers.len()
                ),
            );
            let client = RegistryClient::new(self.settings.registry.clone());
            let mut report = |layer: &ImageLayer, stored: &StoredLayer| {
                let what = match &stored.source {
                    LayerSource::Cached => "cached".to_string(),
                    LayerSource::Pulled(stats) => format!(
                        "pulled {} bytes, {} entries, {} whiteouts, {} opaque dirs{}",
                        layer.size,
                        stats.entries,
                        stats.whiteouts,
                        stats.opaque_dirs,
                        if stats.skipped_devices > 0 {
                            format!(", {} device nodes skipped", stats.skipped_devices)
                        } else {
                            String::new()
                        }
                    ),
                };
                job.log(
                    LogLevel::Info,
                    Some("base"),
                    format!("layer {}: {what}", layer.digest),
                );
            };
            let stored = ensure_image_layers(&self.layers, &client, image, &mut report)
                .map_err(BuildError::Image)?;
            for layer in stored {
                stack.insert(0, layer.fs_dir);
                keys.push(layer.key);
            }
        }
        let mut cached_steps = 0;
        for step in &plan.steps {
            job.step_started(&step.id);
            job.log(
                LogLevel::Info,
                Some(&step.id),
                format!("[{}] {}", step.id, step.title),
            );
            let cached = if step.force {
                None
            } else {
                self.layers
                    .lookup(&step.cache_key)
                    .map_err(|source| layer_err(step, source))?
            };
            let info = match cached {
                Some(info) => {
                    cached_steps += 1;
                    job.log(
                        LogLevel::Info,
                        Some(&step.id),
                        format!("CACHED {}", short(&step.cache_key)),
                    );
                    job.step_finished(&step.id, true);
                    info
                }
                None => {
                    let t = Instant::now();
                    let info = self.execute(step, &stack, stages, build_id, job)?;
                    job.log(
                        LogLevel::Info,
                        Some(&step.id),
                        format!(
                            "done in {:.1}s, layer {} ({} bytes)",
                            t.elapsed().as_secs_f64(),
                            short(&info.key),
                            info.size_bytes
                        ),
                    );
                    job.step_finished(&step.id, false);
                    info
                }
            };
            if !info.empty {
                stack.insert(0, self.layers.fs_dir(&step.cache_key));
            }
            keys.push(step.cache_key.clone());
        }

        Ok(BuiltStack {
            layers: stack,
            keys,
            cached_steps,
        })
    }

    fn execute(
        &self,
        step: &PlanStep,
        stack: &[PathBuf],
        stages: &[Option<BuiltStack>],
        build_id: &str,
        job: &BuildJob,
    ) -> Result<super::layers::LayerInfo, BuildError> {
        let pending = self
            .layers
            .begin(&step.cache_key)
            .map_err(|source| layer_err(step, source))?;
        match &step.action {
            StepAction::Run { argv } => {
                let sandbox_id = self.sandbox_id(build_id, &step.id);
                let below = LayerStack::new(stack.to_vec());
                let spec = SandboxSpec {
                    id: sandbox_id.clone(),
                    layers: stack.to_vec(),
                    resources: self.settings.step_resources.clone(),
                    network: NetworkSpec {
                        allow_internet: self.settings.allow_internet,
                        raw_sockets: false,
                        egress: Default::default(),
                    },
                    syscalls: Default::default(),
                    volumes: Vec::new(),
                };
                let sandbox = self
                    .create_sandbox(&spec, &step.id, job)?
                    .map_err(|source| runtime_err(step, source))?;
                let _guard = SandboxGuard {
                    runtime: self.runtime,
                    admission: self.settings.admission.as_ref(),
                    id: sandbox_id.clone(),
                    armed: true,
                    job,
                };
                job.entered_sandbox(&sandbox_id)
                    .map_err(|reason| BuildError::Stopped {
                        step: Some(step.id.clone()),
                        reason,
                    })?;
                let command = CommandSpec {
                    argv: argv.clone(),
                    env: step.state.vars(),
                    cwd: step.state.workdir.clone(),
                    user: below.user_name(&step.state.user),
                    tag: None,
                };
                let code = self
                    .run_logged(sandbox.agent_addr(), &command, &step.id, job)
                    .map_err(|source| {
                        if matches!(source, CommandError::Transport { .. }) {
                            self.diagnose_lost_stream(&sandbox, &step.id, job);
                        }
                        BuildError::Command {
                            step: step.id.clone(),
                            title: step.title.clone(),
                            source: Box::new(source),
                        }
                    })?;
                if code != 0 {
                    return Err(BuildError::StepFailed {
                        step: step.id.clone(),
                        title: step.title.clone(),
                        code,
                    });
                }
                self.runtime
                    .commit_layer(&sandbox_id, &pending.fs_dir())
                    .map_err(|source| runtime_err(step, source))?;
            }
            StepAction::Copy {
                entries,
                owner,
                mode,
                ..
            } => {
                let fs_dir = pending
                    .create_fs_dir()
                    .map_err(|source| layer_err(step, source))?;
                write_copy_layer(
                    &fs_dir,
                    &LayerStack::new(stack.to_vec()),
                    entries,
                    owner.as_deref(),
                    *mode,
                )
                .map_err(|source| layer_err(step, source))?;
            }
            StepAction::MakeDir { path, owner } => {
                let fs_dir = pending
                    .create_fs_dir()
                    .map_err(|source| layer_err(step, source))?;
                write_workdir_layer(&fs_dir, &LayerStack::new(stack.to_vec()), path, owner)
                    .map_err(|source| layer_err(step, source))?;
            }
            StepAction::CopyFrom {
                stage,
                sources,
                dest,
                dest_is_dir,
                owner,
                mode,
                ..
            } => {
                let from = LayerStack::new(stage_stack(stages, *stage)?.layers.clone());
                let entries = stage_entries(&from, sources, dest, *dest_is_dir)
                    .map_err(|source| layer_err(step, source))?;
                let fs_dir = pending
                    .create_fs_dir()
                    .map_err(|source| layer_err(step, source))?;
                write_copy_layer(
                    &fs_dir,
                    &LayerStack::new(stack.to_vec()),
                    &entries,
                    owner.as_deref(),
                    *mode,
                )
                .map_err(|source| layer_err(step, source))?;
            }
        }
        self.layers
            .commit(pending, &step.title)
            .map_err(|source| layer_err(step, source))
    }

    /// Creates a build sandbox once the host admits it: a full host makes the build wait (saying so
    /// once in its log) rather than fail, until there is room or the build is stopped. The outer
    /// error is the stop; the inner one the runtime's.
    fn create_sandbox(
        &self,
        spec: &SandboxSpec,
        step: &str,
        job: &BuildJob,
    ) -> Result<Result<warren_runtime::Sandbox, RuntimeError>, BuildError> {
        let Some(admission) = &self.settings.admission else {
            return Ok(self.runtime.create(spec));
        };
        let mut said = false;
        let (template_id, build_id) = job.ids();
        let give_up = Instant::now() + self.settings.admission_wait;
        loop {
            match admission.0.admit(&template_id, &spec.id, &spec.resources) {
                Ok(()) => break,
                Err(reason) => {
                    if let Some(stopped) = job.stop_reason() {
                        return Err(BuildError::Stopped {
                            step: Some(step.to_string()),
                            reason: stopped,
                        });
                    }
                    if Instant::now() >= give_up {
                        return Err(BuildError::Stopped {
                            step: Some(step.to_string()),
                            reason: format!(
                                "no room on the host for the build's sandbox after {} s: {reason}",
                                self.settings.admission_wait.as_secs()
                            ),
                        });
                    }
                    if !said {
                        job.log(
                            LogLevel::Warn,
                            Some(step),
                            format!("waiting for room on the host: {reason}"),
                        );
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
        let created = self.runtime.create(spec);
        match &created {
            Ok(_) => admission.0.started(&template_id, &build_id, &spec.id, step),
            Err(_) => admission.0.release(&spec.id, "its creation failed"),
        }
        Ok(created)
    }

    /// The stream of a step's command broke or went silent: says in the build log (and the server's)
    /// what the sandbox looked like then, so the failure can be told apart (the agent gone or
    /// unresponsive, the sandbox frozen, its link down, the command still running).
    fn diagnose_lost_stream(&self, sandbox: &warren_runtime::Sandbox, step: &str, job: &BuildJob) {
        let mut facts = Vec::new();
        let link = warren_runtime::network::veth_name("wv", sandbox.ip);
        let operstate = std::fs::read_to_string(format!("/sys/class/net/{link}/operstate"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unreadable ({e})"));
        facts.push(format!("host link {link}: {operstate}"));
        match self.runtime.stats(&sandbox.id) {
            Ok(stats) => facts.push(format!(
                "cpu {:.0}%, memory {} of {} MiB, {} tasks, {} OOM kills",
                stats.cpu_percent,
                stats.memory_bytes >> 20,
                stats.memory_limit_bytes >> 20,
                stats.pids,
                stats.oom_kills
            )),
            Err(e) => facts.push(format!("stats: {e}")),
        }
        match self.runtime.processes(&sandbox.id) {
            Ok(list) => facts.push(format!(
                "processes: {}",
                list.iter()
                    .map(|p| format!("{} {:.0}% {}", p.pid, p.cpu_percent, p.command))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            Err(e) => facts.push(format!("processes: {e}")),
        }
        let agent = match self.commands.processes(sandbox.agent_addr()) {
            Ok(list) => format!("answers, {} processes of its clients running", list.len()),
            Err(e) => format!("does not answer: {e}"),
        };
        facts.push(format!("agent {agent}"));
        let text = format!("the command's stream was lost; {}", facts.join(" | "));
        tracing::warn!(sandbox = %sandbox.id, step, "{text}");
        job.log(LogLevel::Warn, Some(step), text);
    }

    /// Runs a command, logging its output line by line under `step`.
    fn run_logged(
        &self,
        addr: std::net::SocketAddr,
        command: &CommandSpec,
        step: &str,
        job: &BuildJob,
    ) -> Result<i32, CommandError> {
        let mut stdout = LineSplitter::default();
        let mut stderr = LineSplitter::default();
        let code = self.commands.run(addr, command, &mut |stream, bytes| {
            let splitter = match stream {
                OutputStream::Stdout => &mut stdout,
                OutputStream::Stderr => &mut stderr,
            };
            for line in splitter.push(bytes) {
                job.log(LogLevel::Info, Some(step), line);
            }
        })?;
        for line in [stdout.finish(), stderr.finish()].into_iter().flatten() {
            job.log(LogLevel::Info, Some(step), line);
        }
        Ok(code)
    }

    fn sandbox_id(&self, build_id: &str, step: &str) -> String {
        let short: String = build_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(12)
            .collect();
        format!("{}{short}-{step}", self.settings.sandbox_prefix)
    }

    /// start_cmd → ready_cmd → checkpoint (or cold).
    fn finalize(
        &self,
        plan: &BuildPlan,
        stack: &[PathBuf],
        build_id: &str,
        build_dir: &Path,
        job: &BuildJob,
    ) -> Result<TemplateStart, BuildError> {
        let Some(start_cmd) = plan.start_cmd.as_deref() else {
            job.log(
                LogLevel::Info,
                Some(FINALIZE_STEP),
                "no start command: template is its layers",
            );
            return Ok(TemplateStart::Plain);
        };
        let finalize = |m: String| BuildError::Finalize(m);
        let sandbox_id = self.sandbox_id(build_id, FINALIZE_STEP);
        let mut resources = self.settings.step_resources.clone();
        if let Some(cpu) = plan.cpu_count {
            resources.vcpus = f64::from(cpu);
        }
        if let Some(mem) = plan.memory_mb {
            resources.memory_mib = mem;
        }
        let spec = SandboxSpec {
            id: sandbox_id.clone(),
            layers: stack.to_vec(),
            resources,
            network: NetworkSpec {
                allow_internet: self.settings.allow_internet,
                raw_sockets: plan.privileges.raw_sockets,
                egress: Default::default(),
            },
            syscalls: warren_runtime::seccomp::SyscallPolicy {
                allow_io_uring: plan.privileges.io_uring,
            },
            volumes: Vec::new(),
        };
        let sandbox = self
            .create_sandbox(&spec, FINALIZE_STEP, job)?
            .map_err(|e| finalize(format!("creating the start sandbox: {e}")))?;
        let mut guard = SandboxGuard {
            runtime: self.runtime,
            admission: self.settings.admission.as_ref(),
            id: sandbox_id.clone(),
            armed: true,
            job,
        };
        job.entered_sandbox(&sandbox_id)
            .map_err(|reason| BuildError::Stopped {
                step: Some(FINALIZE_STEP.to_string()),
                reason,
            })?;
        let below = LayerStack::new(stack.to_vec());
        let user = below.user_name(&plan.final_state.user);
        let shell = |cmd: &str| CommandSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
            env: plan.final_state.env.clone(),
            cwd: plan.final_state.workdir.clone(),
            user: user.clone(),
            tag: None,
        };
        job.log(
            LogLevel::Info,
            Some(FINALIZE_STEP),
            format!("starting: {start_cmd}"),
        );
        let log_job = job.clone();
        let mut splitter = LineSplitter::default();
        let process = self
            .commands
            .spawn(
                sandbox.agent_addr(),
                &CommandSpec {
                    tag: Some(super::agent_commands::START_CMD_TAG.into()),
                    ..shell(start_cmd)
                },
                Box::new(move |_, bytes| {
                    for line in splitter.push(bytes) {
                        log_job.log(LogLevel::Info, Some(FINALIZE_STEP), line);
                    }
                }),
            )
            .map_err(|e| finalize(format!("starting start_cmd: {e}")))?;

        let ready_cmd = plan.ready_cmd.as_deref();
        let deadline = Instant::now() + self.settings.ready_timeout;
        let started = Instant::now();
        loop {
            if let Some(code) = process.exit_code() {
                return Err(finalize(format!(
                    "start_cmd exited with code {code} before the template was ready"
                )));
            }
            let ready = match ready_cmd {
                Some(cmd) => {
                    match self
                        .commands
                        .run(sandbox.agent_addr(), &shell(cmd), &mut |_, _| {})
                    {
                        Ok(code) => code == 0,
                        // A probe that got no answer counts as "not ready yet", as a readiness probe
                        // does; the ready timeout still bounds the wait, and a stopped build ends here.
                        Err(error @ CommandError::Transport { .. })
                            if job.stop_reason().is_none() =>
                        {
                            job.log(
                                LogLevel::Warn,
                                Some(FINALIZE_STEP),
                                format!("ready_cmd probe got no answer, trying again: {error}"),
                            );
                            false
                        }
                        Err(error) => return Err(finalize(format!("running ready_cmd: {error}"))),
                    }
                }
                // Without a ready check: ready once start_cmd has stayed up for a moment.
                None => started.elapsed() >= Duration::from_secs(2),
            };
            if ready {
                break;
            }
            if Instant::now() >= deadline {
                return Err(finalize(format!(
                    "ready_cmd {:?} did not succeed within {}s",
                    ready_cmd.unwrap_or(""),
                    self.settings.ready_timeout.as_secs()
                )));
            }
            std::thread::sleep(self.settings.ready_interval);
        }
        job.log(
            LogLevel::Info,
            Some(FINALIZE_STEP),
            format!("ready after {:.1}s", started.elapsed().as_secs_f64()),
        );
        // Stop following start_cmd's output before the snapshot.
        drop(process);
        if !self.runtime.capabilities().checkpoint {
            job.log(
                LogLevel::Warn,
                Some(FINALIZE_STEP),
                "this host cannot checkpoint: sandboxes of this template run start_cmd when created",
            );
            return Ok(TemplateStart::Cold);
        }
        let dir = build_dir.join("checkpoint");
        match self.runtime.checkpoint(&sandbox_id, &dir, false) {
            Ok(info) => {
                guard.armed = false;
                job.log(
                    LogLevel::Info,
                    Some(FINALIZE_STEP),
                    format!("checkpoint written ({} bytes)", info.size_bytes),
                );
                Ok(TemplateStart::Checkpoint { dir: info.dir })
            }
            // The template still works without its snapshot: say so and record it cold, never as
            // checkpointed.
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                job.log(
                    LogLevel::Warn,
                    Some(FINALIZE_STEP),
                    format!(
                        "checkpoint failed ({e}): recording a cold template, start_cmd runs when sandboxes are created"
                    ),
                );
                Ok(TemplateStart::Cold)
            }
        }
    }
}

/// A stage's (or the template's own) layers, top-most first, and their keys, base first.
#[derive(Debug, Clone)]
struct BuiltStack {
    layers: Vec<PathBuf>,
    keys: Vec<String>,
    cached_steps: usize,
}

fn stage_stack(stages: &[Option<BuiltStack>], index: usize) -> Result<&BuiltStack, BuildError> {
    stages
        .get(index)
        .and_then(Option::as_ref)
        .ok_or_else(|| BuildError::Internal(format!("stage {index} was not built before its use")))
}

fn finalize_title(plan: &BuildPlan) -> String {
    match &plan.start_cmd {
        Some(cmd) => format!("start {cmd}"),
        None => "finalize".into(),
    }
}

fn short(key: &str) -> &str {
    &key[..key.len().min(12)]
}

fn layer_err(step: &PlanStep, source: LayerError) -> BuildError {
    BuildError::Layer {
        step: step.id.clone(),
        title: step.title.clone(),
        source,
    }
}

fn runtime_err(step: &PlanStep, source: RuntimeError) -> BuildError {
    BuildError::Runtime {
        step: step.id.clone(),
        title: step.title.clone(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::builder::agent_commands::{BackgroundProcess, OutputSink};
    use crate::templates::builder::base_image;
    use crate::templates::builder::context::BuildContext;
    use crate::templates::builder::dockerfile_plan::{plan_dockerfile, DockerfileInput};
    use crate::templates::builder::e2b_toml::E2bToml;
    use crate::templates::builder::job::{BuildStatus, StepStatus};
    use std::collections::BTreeMap;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::{Arc, Mutex};
    use warren_runtime::{Capabilities, CheckpointInfo, ProcessInfo, RuntimeState, Sandbox, Stats};

    /// Records calls; `commit_layer` writes a file naming the sandbox, as a RUN would leave changes.
    #[derive(Default)]
    struct FakeRuntime {
        created: Mutex<Vec<SandboxSpec>>,
        destroyed: Mutex<Vec<String>>,
        checkpoint: bool,
        checkpoint_fails: bool,
        /// Set by destroy: what breaks a hanging command's stream.
        gone: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Runtime for FakeRuntime {
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                cgroup_version: 1,
                checkpoint: self.checkpoint,
            }
        }
        fn renew(&self, _id: &str, _until_unix_ms: u64) -> Result<(), RuntimeError> {
            Ok(())
        }

        fn host_capacity(&self) -> Result<warren_runtime::HostCapacity, RuntimeError> {
            Err(RuntimeError::Unsupported(
                "not measured in these tests".into(),
            ))
        }
        fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
            self.created.lock().unwrap().push(spec.clone());
            Ok(Sandbox {
                id: spec.id.clone(),
                ip: Ipv4Addr::LOCALHOST,
                init_pid: 1,
                state: RuntimeState::Running,
                created_at: std::time::SystemTime::now(),
            })
        }
        fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
            self.destroyed.lock().unwrap().push(id.into());
            self.gone.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
        fn freeze(&self, _: &str) -> Result<(), RuntimeError> {
            Ok(())
        }
        fn thaw(&self, _: &str) -> Result<(), RuntimeError> {
            Ok(())
        }
        fn stats(&self, _: &str) -> Result<Stats, RuntimeError> {
            Ok(Stats::default())
        }
        fn processes(&self, _: &str) -> Result<Vec<ProcessInfo>, RuntimeError> {
            Ok(Vec::new())
        }
        fn kill_process(&self, _: &str, _: u32, _: i32) -> Result<(), RuntimeError> {
            Ok(())
        }
        fn set_network(&self, _: &str, _: &NetworkSpec) -> Result<(), RuntimeError> {
            Ok(())
        }
        fn recover(&self) -> Result<Vec<Sandbox>, RuntimeError> {
            // Nothing of this fake outlives its owner: recovering is listing.
            self.list()
        }
        fn list(&self) -> Result<Vec<Sandbox>, RuntimeError> {
            Ok(Vec::new())
        }
        fn checkpoint(
            &self,
            id: &str,
            dest: &Path,
            _: bool,
        ) -> Result<CheckpointInfo, RuntimeError> {
            if self.checkpoint_fails {
                return Err(RuntimeError::failed("criu dump failed"));
            }
            std::fs::create_dir_all(dest).unwrap();
            self.destroyed.lock().unwrap().push(id.into());
            Ok(CheckpointInfo {
                dir: dest.to_path_buf(),
                size_bytes: 1,
            })
        }
        fn commit_layer(&self, id: &str, dest: &Path) -> Result<u64, RuntimeError> {
            assert!(!dest.exists(), "commit_layer wants a fresh destination");
            std::fs::create_dir_all(dest).unwrap();
            std::fs::write(dest.join(format!("made-by-{id}")), "x").unwrap();
            Ok(1)
        }
        fn restore(&self, _: &Path, _: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
            Err(RuntimeError::Unsupported("fake".into()))
        }
    }

    /// Exit code 1 for commands containing "fail"; echoes the command; ready_cmd succeeds.
    #[derive(Default)]
    struct FakeCommands {
        ran: Mutex<Vec<CommandSpec>>,
        /// This many ready_cmd probes (`curl -sf ...`) get no answer (a transport error) first.
        unanswered_probes: std::sync::atomic::AtomicUsize,
    }

    struct Running;
    impl BackgroundProcess for Running {
        fn exit_code(&self) -> Option<i32> {
            None
        }
    }

    impl CommandRunner for FakeCommands {
        fn processes(
            &self,
            _: std::net::SocketAddr,
        ) -> Result<Vec<super::super::agent_commands::RunningProcess>, CommandError> {
            Ok(Vec::new())
        }
        fn run(
            &self,
            _: SocketAddr,
            command: &CommandSpec,
            on_output: &mut dyn FnMut(OutputStream, &[u8]),
        ) -> Result<i32, CommandError> {
            self.ran.lock().unwrap().push(command.clone());
            let text = command.argv.join(" ");
            use std::sync::atomic::Ordering::SeqCst;
            if text.contains("curl -sf")
                && self
                    .unanswered_probes
                    .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                return Err(CommandError::Transport {
                    addr: "10.77.0.9:49983".parse().unwrap(),
                    message: "timed out reading response".into(),
                });
            }
            on_output(OutputStream::Stdout, format!("running {text}\n").as_bytes());
            Ok(if text.contains("fail") { 1 } else { 0 })
        }
        fn spawn(
            &self,
            _: SocketAddr,
            command: &CommandSpec,
            mut on_output: OutputSink,
        ) -> Result<Box<dyn BackgroundProcess>, CommandError> {
            self.ran.lock().unwrap().push(command.clone());
            on_output(OutputStream::Stdout, b"serving\n");
            Ok(Box::new(Running))
        }
    }

    struct Setup {
        state: tempfile::TempDir,
        rootfs: tempfile::TempDir,
        context: tempfile::TempDir,
    }

    impl Setup {
        fn new() -> Setup {
            let rootfs = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(rootfs.path().join("etc")).unwrap();
            std::fs::write(
                rootfs.path().join("etc/passwd"),
                "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n",
            )
            .unwrap();
            std::fs::create_dir_all(rootfs.path().join("home/user")).unwrap();
            let context = tempfile::tempdir().unwrap();
            std::fs::write(context.path().join("requirements.txt"), "flask\n").unwrap();
            Setup {
                state: tempfile::tempdir().unwrap(),
                rootfs,
                context,
            }
        }

        fn plan(&self, text: &str, start: Option<&str>) -> BuildPlan {
            let ctx = BuildContext::open(self.context.path()).unwrap();
            let config = E2bToml {
                start_cmd: start.map(String::from),
                ready_cmd: start.map(|_| "curl -sf localhost:8000".to_string()),
                ..Default::default()
            };
            plan_dockerfile(&DockerfileInput {
                dockerfile: text,
                context: &ctx,
                build_args: &BTreeMap::new(),
                config: &config,
                rootfs: self.rootfs.path(),
            })
            .unwrap()
        }

        fn settings(&self) -> BuildSettings {
            BuildSettings {
                sandbox_prefix: "wt-".into(),
                ready_interval: Duration::from_millis(1),
                ..BuildSettings::new(self.state.path())
            }
        }
    }

    /// A command that never ends by itself: its stream breaks only when its sandbox is destroyed.
    struct HangingCommands {
        gone: Arc<std::sync::atomic::AtomicBool>,
        started: std::sync::mpsc::Sender<()>,
    }

    impl CommandRunner for HangingCommands {
        fn processes(
            &self,
            _: std::net::SocketAddr,
        ) -> Result<Vec<super::super::agent_commands::RunningProcess>, CommandError> {
            Ok(Vec::new())
        }
        fn run(
            &self,
            addr: SocketAddr,
            _: &CommandSpec,
            _: &mut dyn FnMut(OutputStream, &[u8]),
        ) -> Result<i32, CommandError> {
            let _ = self.started.send(());
            while !self.gone.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(CommandError::Transport {
                addr,
                message: "connection reset".into(),
            })
        }
        fn spawn(
            &self,
            _: SocketAddr,
            _: &CommandSpec,
            _: OutputSink,
        ) -> Result<Box<dyn BackgroundProcess>, CommandError> {
            Ok(Box::new(Running))
        }
    }

    #[test]
    fn a_stopped_build_destroys_its_sandbox_and_fails_naming_the_step_and_why() {
        let setup = Setup::new();
        let runtime = FakeRuntime::default();
        let (started, running) = std::sync::mpsc::channel();
        let commands = HangingCommands {
            gone: Arc::clone(&runtime.gone),
            started,
        };
        let builder = TemplateBuilder::new(&runtime, &commands, setup.settings());
        let plan = setup.plan("FROM debian:12\nRUN sleep infinity\n", None);
        let job = BuildJob::new("t1", "b1");
        let result = std::thread::scope(|scope| {
            let building = scope.spawn(|| builder.build(&plan, "t1", "b1", &job));
            running.recv().expect("the step started");
            assert!(super::super::service::stop(
                &runtime,
                &job,
                "the build timed out after 5s"
            ));
            building.join().unwrap()
        });
        let error = result.expect_err("a stopped build fails");
        assert!(
            matches!(&error, BuildError::Stopped { reason, .. } if reason == "the build timed out after 5s"),
            "{error}"
        );
        assert_eq!(error.step(), Some("1"), "{error}");
        assert_eq!(job.status(), BuildStatus::Error);
        let reason = job.snapshot().reason.expect("a reason").message;
        assert!(
            reason.contains("timed out") && reason.contains("(in step 1)"),
            "{reason}"
        );
        assert_eq!(
            runtime.destroyed.lock().unwrap().len(),
            2,
            "stop, then the guard"
        );
        // Stopping an ended build does nothing.
        assert!(!super::super::service::stop(&runtime, &job, "again"));
    }

    const DOCKERFILE: &str = "FROM debian:12\nWORKDIR /app\nCOPY requirements.txt .\nRUN pip install -r requirements.txt\nUSER user\nRUN echo done\n";

    #[test]
    fn builds_then_rebuild_hits_the_cache() {
        let setup = Setup::new();
        let runtime = FakeRuntime::default();
        let commands = FakeCommands::default();
        let builder = TemplateBuilder::new(&runtime, &commands, setup.settings());
        let plan = setup.plan(DOCKERFILE, None);

        let job = BuildJob::new("t1", "b1");
        let built = builder.build(&plan, "t1", "b1", &job).unwrap();
        assert_eq!(job.status(), BuildStatus::Ready);
        assert_eq!(built.cached_steps, 0);
        assert_eq!(built.total_steps, 4);
        assert_eq!(runtime.created.lock().unwrap().len(), 2);
        // Each RUN sandbox sees the layers below it, top-most first, ending with the rootfs.
        let specs = runtime.created.lock().unwrap().clone();
        assert_eq!(specs[0].layers.len(), 3);
        assert_eq!(specs[0].layers.last().unwrap(), setup.rootfs.path());
        assert_eq!(specs[1].layers.len(), 4);
        assert!(specs.iter().all(|s| s.id.starts_with("wt-")));
        assert_eq!(runtime.destroyed.lock().unwrap().len(), 2);
        let ran = commands.ran.lock().unwrap().clone();
        assert_eq!(ran[0].user, "root");
        assert_eq!(ran[0].cwd, "/app");
        assert_eq!(ran[1].user, "user");
        assert_eq!(built.layers.len(), 5);
        assert_eq!(built.start, TemplateStart::Plain);
        let copied = builder
            .layers()
            .fs_dir(&plan.steps[1].cache_key)
            .join("app/requirements.txt");
        assert_eq!(std::fs::read_to_string(copied).unwrap(), "flask\n");

        let job2 = BuildJob::new("t1", "b2");
        let rebuilt = builder.build(&plan, "t1", "b2", &job2).unwrap();
        assert_eq!(rebuilt.cached_steps, 4);
        assert_eq!(
            runtime.created.lock().unwrap().len(),
            2,
            "no sandbox for cached steps"
        );
        assert_eq!(rebuilt.layers, built.layers);
        assert!(job2.snapshot().steps[..4]
            .iter()
            .all(|s| s.status == StepStatus::Cached));
        assert_eq!(builder.versions().list("t1").unwrap().len(), 2);

        // Changing one RUN rebuilds it and what follows, not what precedes.
        let changed = setup.plan(&DOCKERFILE.replace("echo done", "echo changed"), None);
        let job3 = BuildJob::new("t1", "b3");
        let third = builder.build(&changed, "t1", "b3", &job3).unwrap();
        assert_eq!(third.cached_steps, 3);
    }

    #[test]
    fn a_multi_stage_build_builds_the_stages_it_uses_and_copies_out_of_them() {
        let setup = Setup::new();
        let runtime = FakeRuntime::default();
        let commands = FakeCommands::default();
        let builder = TemplateBuilder::new(&runtime, &commands, setup.settings());
        let plan = setup.plan(
            "FROM debian:12 AS builder\nRUN make\nFROM debian:12 AS unused\nRUN never\n\
             FROM builder AS extended\nRUN more\nFROM debian:12\n\
             COPY --from=builder / /from-builder/\nCOPY --from=extended /etc/passwd /copied-passwd\n",
            None,
        );
        assert_eq!(plan.needed_stages(), vec![0, 2]);
        let job = BuildJob::new("t1", "b1");
        let built = builder.build(&plan, "t1", "b1", &job).unwrap();
        assert_eq!(job.status(), BuildStatus::Ready);
        let ran: Vec<String> = commands
            .ran
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.argv.join(" "))
            .collect();
        assert_eq!(
            ran,
            ["/bin/sh -c make", "/bin/sh -c more"],
            "the unused stage is skipped"
        );
        // `FROM builder` stacks on the builder's layer: its RUN sandbox sees it.
        let specs = runtime.created.lock().unwrap().clone();
        assert_eq!(specs[1].layers.len(), specs[0].layers.len() + 1);
        // The template's own layers: the two COPYs on the base, not the stages' layers.
        let copy = builder.layers().fs_dir(&plan.steps[0].cache_key);
        assert!(copy.join("from-builder/made-by-wt-b1-1").is_file());
        assert!(copy.join("from-builder/etc/passwd").is_file());
        let passwd = builder.layers().fs_dir(&plan.steps[1].cache_key);
        assert!(passwd.join("copied-passwd").is_file());
        assert_eq!(built.layers.len(), 3);
        // A rebuild takes everything from the cache, stages included.
        let job2 = BuildJob::new("t1", "b2");
        let again = builder.build(&plan, "t1", "b2", &job2).unwrap();
        assert_eq!(again.cached_steps, 2);
        assert_eq!(runtime.created.lock().unwrap().len(), 2);
    }

    /// Says "no room" a given number of times, then admits; records what it admitted and released.
    #[derive(Default)]
    struct Stingy {
        refusals: std::sync::atomic::AtomicUsize,
        admitted: Mutex<Vec<String>>,
        started: Mutex<Vec<String>>,
        released: Mutex<Vec<String>>,
    }

    impl BuildAdmission for Stingy {
        fn admit(&self, _: &str, id: &str, _: &Resources) -> Result<(), String> {
            use std::sync::atomic::Ordering;
            if self
                .refusals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err("sandbox limit reached".into());
            }
            self.admitted.lock().unwrap().push(id.to_string());
            Ok(())
        }

        fn started(&self, template_id: &str, build_id: &str, id: &str, step: &str) {
            self.started
                .lock()
                .unwrap()
                .push(format!("{template_id}/{build_id}/{id}/{step}"));
        }

        fn release(&self, id: &str, how: &str) {
            assert!(!how.is_empty());
            self.released.lock().unwrap().push(id.to_string());
        }
    }

    #[test]
    fn build_sandboxes_wait_for_room_and_are_released_when_they_go() {
        let setup = Setup::new();
        let runtime = FakeRuntime::default();
        let commands = FakeCommands::default();
        let stingy = Arc::new(Stingy {
            refusals: std::sync::atomic::AtomicUsize::new(2),
            ..Stingy::default()
        });
        let settings = BuildSettings {
            admission: Some(Admission(stingy.clone())),
            ..setup.settings()
        };
        let builder = TemplateBuilder::new(&runtime, &commands, settings);
        let plan = setup.plan(DOCKERFILE, None);
        let job = BuildJob::new("t1", "b1");
        builder.build(&plan, "t1", "b1", &job).unwrap();
        let waits = job
            .snapshot()
            .logs
            .iter()
            .filter(|l| {
                l.message
                    .contains("waiting for room on the host: sandbox limit")
            })
            .count();
        assert_eq!(waits, 1, "said once per sandbox that had to wait");
        let admitted = stingy.admitted.lock().unwrap().clone();
        assert_eq!(admitted.len(), runtime.created.lock().unwrap().len());
        assert_eq!(*stingy.released.lock().unwrap(), admitted);
        let started = stingy.started.lock().unwrap().clone();
        assert_eq!(started.len(), admitted.len(), "{started:?}");
        for (line, id) in started.iter().zip(&admitted) {
            assert!(line.starts_with(&format!("t1/b1/{id}/")), "{line}");
        }

        // A stopped build stops waiting.
        let never = Arc::new(Stingy {
            refusals: std::sync::atomic::AtomicUsize::new(usize::MAX),
            ..Stingy::default()
        });
        let settings = BuildSettings {
            admission: Some(Admission(never)),
            ..setup.settings()
        };
        let builder = TemplateBuilder::new(&runtime, &commands, settings);
        let job = BuildJob::new("t1", "b2");
        job.request_stop("stopped by the test");
        let uncached = setup.plan(&DOCKERFILE.replace("echo done", "echo other"), None);
        let failed = builder.build(&uncached, "t1", "b2", &job).unwrap_err();
        assert!(
            failed.to_string().contains("stopped by the test"),
            "{failed}"
        );
    }

    #[test]
    fn failing_step_is_named_with_its_output() {
        let setup = Setup::new();
        let runtime = FakeRuntime::default();
        let commands = FakeCommands::default();
        let builder = TemplateBuilder::new(&runtime, &commands, setup.settings());
        let plan = setup.plan("FROM debian\nRUN echo ok\nRUN make fail\nRUN never\n", None);
        let job = BuildJob::new("t1", "b1");
        let err = builder.build(&plan, "t1", "b1", &job).unwrap_err();
        assert!(
            matches!(err, BuildError::StepFailed { code: 1, .. }),
            "{err}"
        );
        let snapshot = job.snapshot();
        assert_eq!(snapshot.status, BuildStatus::Error);
        let reason = snapshot.reason.unwrap();
        assert_eq!(reason.step.as_deref(), Some("2"));
        assert!(
            reason.message.contains("RUN make fail"),
            "{}",
            reason.message
        );
        assert!(reason
            .log_entries
            .iter()
            .any(|e| e.message.contains("running /bin/sh -c make fail")));
        // The failing sandbox was destroyed, and nothing after it ran.
        assert_eq!(runtime.destroyed.lock().unwrap().len(), 2);
        assert_eq!(commands.ran.lock().unwrap().len(), 2);
        assert!(builder.versions().list("t1").unwrap().is_empty());
    }

    #[test]
    fn a_ready_probe_without_an_answer_is_tried_again() {
        let setup = Setup::new();
        let commands = FakeCommands {
            unanswered_probes: 2.into(),
            ..Default::default()
        };
        let plan = setup.plan("FROM debian\n", Some("python3 -m http.server 8000"));
        let runtime = FakeRuntime::default();
        let builder = TemplateBuilder::new(&runtime, &commands, setup.settings());
        let job = BuildJob::new("t1", "b1");
        builder
            .build(&plan, "t1", "b1", &job)
            .expect("ready on the third probe");
        let warnings = job
            .snapshot()
            .logs
            .iter()
            .filter(|e| e.message.contains("ready_cmd probe got no answer"))
            .count();
        assert_eq!(warnings, 2);
        assert_eq!(
            commands
                .unanswered_probes
                .load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }

    #[test]
    fn start_cmd_checkpoints_or_records_a_cold_template() {
        let setup = Setup::new();
        let commands = FakeCommands::default();
        let plan = setup.plan(
            "FROM debian\nRUN echo hi\n",
            Some("python3 -m http.server 8000"),
        );

        let cold_runtime = FakeRuntime::default();
        let builder = TemplateBuilder::new(&cold_runtime, &commands, setup.settings());
        let built = builder
            .build(&plan, "t1", "b1", &BuildJob::new("t1", "b1"))
            .unwrap();
        assert_eq!(built.start, TemplateStart::Cold);
        assert_eq!(cold_runtime.destroyed.lock().unwrap().len(), 2);

        let criu_runtime = FakeRuntime {
            checkpoint: true,
            ..Default::default()
        };
        let builder = TemplateBuilder::new(&criu_runtime, &commands, setup.settings());
        let built = builder
            .build(&plan, "t1", "b2", &BuildJob::new("t1", "b2"))
            .unwrap();
        match &built.start {
            TemplateStart::Checkpoint { dir } => assert!(dir.ends_with("builds/b2/checkpoint")),
            other => panic!("{other:?}"),
        }
        // A failing checkpoint leaves an honest cold template, and the sandbox is destroyed.
        let broken_criu = FakeRuntime {
            checkpoint: true,
            checkpoint_fails: true,
            ..Default::default()
        };
        let builder = TemplateBuilder::new(&broken_criu, &commands, setup.settings());
        let job = BuildJob::new("t1", "b3");
        let built = builder.build(&plan, "t1", "b3", &job).unwrap();
        assert_eq!(built.start, TemplateStart::Cold);
        assert!(job
            .snapshot()
            .logs
            .iter()
            .any(|e| e.message.contains("checkpoint failed")));
        assert_eq!(
            broken_criu.destroyed.lock().unwrap().len(),
            1,
            "the finalize sandbox (the RUN is cached)"
        );

        let ran = commands.ran.lock().unwrap().clone();
        let start = ran
            .iter()
            .find(|c| c.argv.last().unwrap().contains("http.server"))
            .unwrap();
        assert_eq!(start.user, "user");
        assert_eq!(start.cwd, "/home/user");
    }

    #[test]
    fn missing_base_rootfs_is_a_clear_error() {
        let setup = Setup::new();
        let runtime = FakeRuntime::default();
        let commands = FakeCommands::default();
        let builder = TemplateBuilder::new(&runtime, &commands, setup.settings());
        let mut plan = setup.plan("FROM debian\nRUN true\n", None);
        plan.base = BaseSource::Image(
            base_image::resolve("debian", Path::new("/nonexistent/rootfs")).unwrap(),
        );
        let job = BuildJob::new("t1", "b1");
        let err = builder.build(&plan, "t1", "b1", &job).unwrap_err();
        assert!(err.to_string().contains("scripts/setup"), "{err}");
        assert_eq!(job.snapshot().reason.unwrap().step.as_deref(), Some("base"));
    }
}
