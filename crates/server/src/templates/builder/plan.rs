//! The internal build plan both inputs (an e2b.Dockerfile, the SDK's Template builder) turn into: a base,
//! an ordered list of layer-producing steps, each with the environment it runs in and a content-addressed
//! cache key, and what a sandbox of the finished template starts with.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::base_image::BaseImage;
use super::context::CopyEntry;
use crate::templates::images::registry::{ImageRunConfig, ResolvedImage};

/// PATH of the base images Warren stands in for (Docker's default for Debian images).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The user and directory a sandbox of an E2B template runs commands as and in unless the template says.
pub const SANDBOX_USER: &str = "user";
pub const SANDBOX_WORKDIR: &str = "/home/user";
/// Bumped when the meaning of a cached layer changes, so old caches are not reused.
const CACHE_FORMAT: &str = "warren-layer-v1";

/// Environment a step runs in (and, for the last one, a sandbox of the template starts with).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecState {
    /// ENV: persists into the template.
    pub env: BTreeMap<String, String>,
    /// Declared ARGs with a value: visible to RUN only, not kept in the template.
    pub build_args: BTreeMap<String, String>,
    pub user: String,
    pub workdir: String,
    /// SHELL: how shell-form RUN is run.
    pub shell: Vec<String>,
}

impl ExecState {
    /// The state a Dockerfile starts in: root in `/`, PATH set, `/bin/sh -c`.
    pub fn dockerfile_start() -> ExecState {
        ExecState {
            env: BTreeMap::from([("PATH".to_string(), DEFAULT_PATH.to_string())]),
            build_args: BTreeMap::new(),
            user: "root".into(),
            workdir: "/".into(),
            shell: vec!["/bin/sh".into(), "-c".into()],
        }
    }

    /// The state the SDK's Template builder starts in: E2B runs its steps as `user` in `/home/user`.
    pub fn sdk_start() -> ExecState {
        ExecState {
            user: SANDBOX_USER.into(),
            workdir: SANDBOX_WORKDIR.into(),
            ..ExecState::dockerfile_start()
        }
    }

    /// This state on top of a pulled image, as Docker starts a container of it: the image's ENV (its
    /// PATH among them) under this state's; with `docker_defaults` (a Dockerfile), also the image's
    /// USER and WORKDIR, else root in `/`. The SDK's Template builder keeps E2B's `user` in `/home/user`.
    pub fn on_image(mut self, config: &ImageRunConfig, docker_defaults: bool) -> ExecState {
        for entry in &config.env {
            let (key, value) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
            if !key.is_empty() {
                self.env.insert(key.to_string(), value.to_string());
            }
        }
        if docker_defaults {
            self.user = config.user.clone().unwrap_or_else(|| "root".into());
            self.workdir = config.working_dir.clone().unwrap_or_else(|| "/".into());
        }
        self
    }

    /// Variables for word expansion and the environment of RUN: ARGs, then ENV over them.
    pub fn vars(&self) -> BTreeMap<String, String> {
        let mut vars = self.build_args.clone();
        vars.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        vars
    }

    /// Makes a relative path absolute against WORKDIR.
    pub fn absolute(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else {
            let base = self.workdir.trim_end_matches('/');
            format!("{base}/{path}")
        }
    }
}

/// What a layer-producing step does.
#[derive(Debug, Clone, PartialEq)]
pub enum StepAction {
    /// Runs `argv` inside a build sandbox; the sandbox's writable layer becomes the new layer.
    Run { argv: Vec<String> },
    /// Writes files from the host into a new layer. `owner` is a `user[:group]` resolved against the
    /// template's /etc/passwd (None: root); `mode` replaces the source permission bits.
    Copy {
        entries: Vec<CopyEntry>,
        files_hash: String,
        owner: Option<String>,
        mode: Option<u32>,
    },
    /// WORKDIR: creates the directory (owned by `owner`) when it does not exist yet.
    MakeDir { path: String, owner: String },
    /// `COPY --from=<stage>`: copies `sources` (absolute paths in the stage's filesystem, symlinks
    /// followed) out of an earlier stage of the same build into a new layer. The stage is built
    /// first; its final cache key stands for its content in this step's key.
    CopyFrom {
        stage: usize,
        stage_key: String,
        sources: Vec<String>,
        dest: String,
        dest_is_dir: bool,
        owner: Option<String>,
        mode: Option<u32>,
    },
}

impl StepAction {
    /// The part of the step that decides its output, for the cache key (not host paths).
    fn key_material(&self) -> String {
        match self {
            StepAction::Run { argv } => format!("RUN\0{}", argv.join("\0")),
            StepAction::Copy {
                files_hash,
                owner,
                mode,
                ..
            } => format!(
                "COPY\0{files_hash}\0{}\0{}",
                owner.as_deref().unwrap_or(""),
                mode.map(|m| format!("{m:o}")).unwrap_or_default()
            ),
            StepAction::MakeDir { path, owner } => format!("MKDIR\0{path}\0{owner}"),
            StepAction::CopyFrom {
                stage_key,
                sources,
                dest,
                dest_is_dir,
                owner,
                mode,
                ..
            } => format!(
                "COPYFROM\0{stage_key}\0{}\0{dest}\0{dest_is_dir}\0{}\0{}",
                sources.join("\0"),
                owner.as_deref().unwrap_or(""),
                mode.map(|m| format!("{m:o}")).unwrap_or_default()
            ),
        }
    }
}

/// One step that produces a layer.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanStep {
    /// The step's name in logs and errors: "base", or the instruction's 1-based number as the SDK counts.
    pub id: String,
    /// Human-readable instruction, e.g. `RUN pip install flask`.
    pub title: String,
    pub action: StepAction,
    pub state: ExecState,
    pub cache_key: String,
    /// Rebuild even if cached (the SDK's `force` / `skip_cache()`).
    pub force: bool,
}

/// Where the first layer comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum BaseSource {
    Image(BaseImage),
    /// An image pulled from a registry: its layers are fetched into the layer store by the build (so
    /// [`BaseSource::layers`] is empty until then); its manifest digest keys everything above it.
    Registry(Box<ResolvedImage>),
    /// Another Warren template (`fromTemplate`): its layers, top-most first, and its final state.
    Template {
        name: String,
        layers: Vec<PathBuf>,
        key: String,
        state: ExecState,
    },
    /// An earlier stage of the same Dockerfile (`FROM builder`): its layers exist once the build
    /// has built that stage; its final key and state are known from the plan.
    Stage {
        index: usize,
        key: String,
        state: ExecState,
    },
}

impl BaseSource {
    /// Layers below every step, top-most first.
    pub fn layers(&self) -> Vec<PathBuf> {
        match self {
            BaseSource::Image(image) => vec![image.rootfs.clone()],
            BaseSource::Registry(_) | BaseSource::Stage { .. } => Vec::new(),
            BaseSource::Template { layers, .. } => layers.clone(),
        }
    }

    fn key(&self) -> String {
        match self {
            BaseSource::Image(image) => {
                sha256_hex(&[CACHE_FORMAT, "base", &rootfs_identity(&image.rootfs)])
            }
            BaseSource::Registry(image) => {
                sha256_hex(&[CACHE_FORMAT, "image", &image.manifest_digest])
            }
            BaseSource::Template { key, .. } | BaseSource::Stage { key, .. } => key.clone(),
        }
    }
}

/// Identifies one build of the base rootfs: its path and its completion stamp's mtime, so a rebuilt
/// rootfs invalidates every layer on top of it.
pub fn rootfs_identity(rootfs: &Path) -> String {
    let stamp = rootfs.join(".warren-complete");
    let modified = std::fs::metadata(&stamp)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos().to_string())
        .unwrap_or_else(|| "unstamped".into());
    format!("{}\0{modified}", rootfs.display())
}

fn sha256_hex(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0x1e]);
    }
    hex::encode(hasher.finalize())
}

/// A complete build plan.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildPlan {
    pub base: BaseSource,
    pub steps: Vec<PlanStep>,
    /// ENV, user and workdir a sandbox of this template starts with.
    pub final_state: ExecState,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
    /// What the template's sandboxes may do beyond the default set; the finalize sandbox (whose
    /// checkpoint new sandboxes restore) gets it, RUN steps never do (their layers stay cacheable).
    pub privileges: warren_proto::api::TemplatePrivileges,
    /// Notes for the build log (substituted base releases, ignored flags, unused build args).
    pub warnings: Vec<String>,
    /// The earlier stages of a multi-stage Dockerfile, in order (each with no stages of its own);
    /// steps and bases refer to them by index.
    pub stages: Vec<Stage>,
}

/// One earlier stage of a multi-stage build.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// `FROM ... AS name`, if it had one.
    pub name: Option<String>,
    pub plan: BuildPlan,
}

impl BuildPlan {
    /// The stages this plan's steps and base use, directly or through other stages, in build
    /// order; stages nothing uses are not built (as BuildKit does).
    pub fn needed_stages(&self) -> Vec<usize> {
        fn uses(plan: &BuildPlan) -> Vec<usize> {
            let mut used: Vec<usize> = plan
                .steps
                .iter()
                .filter_map(|step| match &step.action {
                    StepAction::CopyFrom { stage, .. } => Some(*stage),
                    _ => None,
                })
                .collect();
            if let BaseSource::Stage { index, .. } = &plan.base {
                used.push(*index);
            }
            used
        }
        let mut needed = vec![false; self.stages.len()];
        let mut pending = uses(self);
        while let Some(index) = pending.pop() {
            if index < needed.len() && !needed[index] {
                needed[index] = true;
                pending.extend(uses(&self.stages[index].plan));
            }
        }
        (0..needed.len()).filter(|i| needed[*i]).collect()
    }

    /// The cache key of the last layer (the base's when there are no steps).
    pub fn final_key(&self) -> String {
        self.steps
            .last()
            .map(|s| s.cache_key.clone())
            .unwrap_or_else(|| self.base.key())
    }
}

/// Accumulates steps, chaining cache keys: key = H(parent key, action, state). A forced step forces the
/// rest, as later layers sit on top of a new one.
#[derive(Debug)]
pub struct PlanBuilder {
    base: BaseSource,
    steps: Vec<PlanStep>,
    pub state: ExecState,
    parent_key: String,
    forcing: bool,
    pub warnings: Vec<String>,
}

impl PlanBuilder {
    /// Starts a plan on `base`; an image base that needs setup gets a "base" step running its script as root.
    pub fn new(base: BaseSource, start: ExecState) -> PlanBuilder {
        let parent_key = base.key();
        let state = match &base {
            BaseSource::Template { state, .. } | BaseSource::Stage { state, .. } => state.clone(),
            BaseSource::Image(_) | BaseSource::Registry(_) => start.clone(),
        };
        let mut builder = PlanBuilder {
            base: base.clone(),
            steps: Vec::new(),
            state,
            parent_key,
            forcing: false,
            warnings: Vec::new(),
        };
        if let BaseSource::Image(image) = &base {
            if let Some(note) = &image.note {
                builder.warnings.push(note.clone());
            }
            if let Some(script) = image.setup_script() {
                let root = ExecState::dockerfile_start();
                builder.push(
                    "base".into(),
                    format!("FROM {}", image.image),
                    StepAction::Run {
                        argv: vec!["/bin/sh".into(), "-c".into(), script],
                    },
                    root,
                    false,
                );
            }
        }
        if let BaseSource::Registry(image) = &base {
            let run = &image.config;
            if !run.entrypoint.is_empty() || !run.cmd.is_empty() {
                let mut argv = run.entrypoint.clone();
                argv.extend(run.cmd.iter().cloned());
                builder.warnings.push(format!(
                    "{}: the image's ENTRYPOINT/CMD {argv:?} is not run; a template starts its start_cmd",
                    image.image
                ));
            }
            let root = ExecState {
                user: "root".into(),
                workdir: "/".into(),
                ..start.clone()
            };
            builder.push(
                "base".into(),
                format!("FROM {} (Warren: user, home, shell)", image.image),
                StepAction::Run {
                    argv: vec![
                        "/bin/sh".into(),
                        "-c".into(),
                        crate::templates::images::image_setup::SETUP_SCRIPT.into(),
                    ],
                },
                root,
                false,
            );
        }
        builder
    }

    fn push(
        &mut self,
        id: String,
        title: String,
        action: StepAction,
        state: ExecState,
        force: bool,
    ) {
        self.forcing |= force;
        let state_json = serde_json::to_string(&state).unwrap_or_default();
        let key = sha256_hex(&[
            CACHE_FORMAT,
            &self.parent_key,
            &action.key_material(),
            &state_json,
        ]);
        self.parent_key = key.clone();
        self.steps.push(PlanStep {
            id,
            title,
            action,
            state,
            cache_key: key,
            force: self.forcing,
        });
    }

    /// RUN `argv` as `user` (None: the current USER).
    pub fn run(
        &mut self,
        id: String,
        title: String,
        argv: Vec<String>,
        user: Option<String>,
        force: bool,
    ) {
        let mut state = self.state.clone();
        if let Some(user) = user {
            state.user = user;
        }
        self.push(id, title, StepAction::Run { argv }, state, force);
    }

    /// COPY/ADD: `action` is a [`StepAction::Copy`].
    pub fn copy(&mut self, id: String, title: String, action: StepAction, force: bool) {
        let state = self.state.clone();
        self.push(id, title, action, state, force);
    }

    /// WORKDIR: switch to `path` (absolute already) and create it owned by the current user.
    pub fn workdir(&mut self, id: String, title: String, path: String, force: bool) {
        self.state.workdir = path.clone();
        let owner = self.state.user.clone();
        let state = self.state.clone();
        self.push(id, title, StepAction::MakeDir { path, owner }, state, force);
    }

    pub fn finish(
        self,
        final_state: ExecState,
        start_cmd: Option<String>,
        ready_cmd: Option<String>,
        cpu_count: Option<u32>,
        memory_mb: Option<u64>,
    ) -> BuildPlan {
        BuildPlan {
            base: self.base,
            steps: self.steps,
            final_state,
            start_cmd,
            ready_cmd,
            cpu_count,
            memory_mb,
            privileges: Default::default(),
            warnings: self.warnings,
            stages: Vec::new(),
        }
    }
}

/// Parses a `--chmod` / SDK mode string (octal, e.g. `755` or `0644`).
pub fn parse_mode(text: &str) -> Option<u32> {
    let mode = u32::from_str_radix(text.trim(), 8).ok()?;
    (mode <= 0o7777).then_some(mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::builder::base_image;

    fn image_base(image: &str) -> BaseSource {
        BaseSource::Image(base_image::resolve(image, Path::new("/nonexistent/rootfs")).unwrap())
    }

    #[test]
    fn keys_chain_and_depend_on_state() {
        let mut a = PlanBuilder::new(image_base("debian:12"), ExecState::dockerfile_start());
        a.run("1".into(), "RUN x".into(), vec!["x".into()], None, false);
        a.run("2".into(), "RUN y".into(), vec!["y".into()], None, false);
        let mut b = PlanBuilder::new(image_base("debian:12"), ExecState::dockerfile_start());
        b.run("1".into(), "RUN x".into(), vec!["x".into()], None, false);
        b.state.env.insert("A".into(), "1".into());
        b.run("2".into(), "RUN y".into(), vec!["y".into()], None, false);
        assert_eq!(a.steps[0].cache_key, b.steps[0].cache_key);
        assert_ne!(a.steps[1].cache_key, b.steps[1].cache_key);
        let mut c = PlanBuilder::new(image_base("debian:12"), ExecState::dockerfile_start());
        c.run("1".into(), "RUN z".into(), vec!["z".into()], None, false);
        c.run("2".into(), "RUN y".into(), vec!["y".into()], None, false);
        // Same instruction on a different parent: different key.
        assert_ne!(a.steps[1].cache_key, c.steps[1].cache_key);
    }

    #[test]
    fn python_base_gets_a_base_step_and_force_propagates() {
        let mut p = PlanBuilder::new(image_base("python:3.11"), ExecState::dockerfile_start());
        assert_eq!(p.steps.len(), 1);
        assert_eq!(p.steps[0].id, "base");
        assert_eq!(p.steps[0].state.user, "root");
        p.run("1".into(), "RUN a".into(), vec!["a".into()], None, true);
        p.run("2".into(), "RUN b".into(), vec!["b".into()], None, false);
        assert!(!p.steps[0].force);
        assert!(p.steps[1].force && p.steps[2].force);
    }

    #[test]
    fn relative_paths_resolve_against_workdir() {
        let mut s = ExecState::sdk_start();
        assert_eq!(s.absolute("app"), "/home/user/app");
        s.workdir = "/".into();
        assert_eq!(s.absolute("app"), "/app");
        assert_eq!(s.absolute("/etc/x"), "/etc/x");
    }

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(parse_mode("755"), Some(0o755));
        assert_eq!(parse_mode("0644"), Some(0o644));
        assert_eq!(parse_mode("rwx"), None);
        assert_eq!(parse_mode("77777"), None);
    }
}
