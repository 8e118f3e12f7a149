//! The built-in `code-interpreter` template: what `e2b_code_interpreter`'s `Sandbox.create()` starts
//! (its default template is `code-interpreter-v1`).
//!
//! The template is an ordinary Warren template build, started by the server itself at start-up:
//! - its base is the code-interpreter rootfs (`scripts/setup.d/45-code-interpreter-rootfs.sh`: the
//!   Debian 12 base plus Debian's ipykernel, numpy, pandas and matplotlib), given to the builder as the
//!   build's Debian base, so the build needs no network;
//! - its steps (the embedded `template/e2b.Dockerfile`) copy in the interpreter server
//!   (`template/server.py`, port 49999, the HTTP API the SDK calls) and the kernel's start-up file;
//! - its start command is the server, so the finished template is checkpointed with a warm Python kernel.
//!
//! The build is cached: when the newest version of the template was built from the same plan (same
//! rootfs stamp, same embedded files, same start command), the server uses it as it is.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::builder::service::{ServiceError, TemplateDir};
use super::builds::{BuildsError, TemplateBuilds};

/// The template id, and the name E2B's SDKs ask for by default.
pub const TEMPLATE_ID: &str = "code-interpreter-v1";
/// Names the template answers to: the SDK's default and the plain one.
pub const ALIASES: &[&str] = &["code-interpreter-v1", "code-interpreter"];
/// Where `scripts/setup.d/45-code-interpreter-rootfs.sh` puts the rootfs.
pub const DEFAULT_ROOTFS: &str = "/var/cache/warren/rootfs/debian12-code-interpreter";
/// The stamp the setup script writes last into a finished rootfs.
const ROOTFS_STAMP: &str = ".warren-complete";

/// The build context, embedded in the binary: (file name, contents).
const CONTEXT_FILES: &[(&str, &str)] = &[
    ("e2b.Dockerfile", include_str!("template/e2b.Dockerfile")),
    ("e2b.toml", include_str!("template/e2b.toml")),
    ("server.py", include_str!("template/server.py")),
    (
        "kernel_startup.py",
        include_str!("template/kernel_startup.py"),
    ),
    (
        "ipython_kernel_config.py",
        include_str!("template/ipython_kernel_config.py"),
    ),
    (
        "javascript_kernel.py",
        include_str!("template/javascript_kernel.py"),
    ),
    (
        "javascript_harness.js",
        include_str!("template/javascript_harness.js"),
    ),
    (
        "javascript_kernel.json",
        include_str!("template/javascript_kernel.json"),
    ),
    (
        "typescript_kernel.json",
        include_str!("template/typescript_kernel.json"),
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum CodeInterpreterError {
    #[error("code-interpreter rootfs {0} is missing or incomplete (run scripts/setup)")]
    RootfsMissing(PathBuf),
    #[error("writing the code-interpreter build context {path}: {source}")]
    Context {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("planning the code-interpreter template: {0}")]
    Plan(#[source] ServiceError),
    #[error("starting the code-interpreter template build: {0}")]
    Build(#[source] BuildsError),
    #[error("the code-interpreter build's start-up thread failed: {0}")]
    Thread(#[source] tokio::task::JoinError),
}

/// Whether `rootfs` is a finished code-interpreter rootfs.
pub fn rootfs_ready(rootfs: &Path) -> bool {
    rootfs.join(ROOTFS_STAMP).is_file() && rootfs.join("usr/bin/python3").exists()
}

/// Writes the embedded build context into `dir` (replacing what an older binary wrote) and opens it.
pub fn write_context(dir: &Path) -> Result<TemplateDir, CodeInterpreterError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CodeInterpreterError::Context { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for (name, contents) in CONTEXT_FILES {
        let path = dir.join(name);
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() != Some(*contents) {
            std::fs::write(&path, contents).map_err(io(&path))?;
        }
    }
    TemplateDir::open(dir).map_err(CodeInterpreterError::Plan)
}

/// Registers the template and builds it unless a cached version serves (see the module doc). The
/// context is written to `context_dir`. Returns the id of a started build.
pub async fn ensure_template(
    builds: &Arc<TemplateBuilds>,
    rootfs: &Path,
    context_dir: &Path,
) -> Result<Option<String>, CodeInterpreterError> {
    if !rootfs_ready(rootfs) {
        return Err(CodeInterpreterError::RootfsMissing(rootfs.to_path_buf()));
    }
    let template = write_context(context_dir)?;
    let plan = template
        .plan(&Default::default(), rootfs)
        .map_err(CodeInterpreterError::Plan)?;
    let needs_build = builds
        .register_builtin(TEMPLATE_ID, ALIASES, &plan)
        .await
        .map_err(CodeInterpreterError::Build)?;
    if !needs_build {
        return Ok(None);
    }
    let builds = Arc::clone(builds);
    tokio::task::spawn_blocking(move || builds.start_builtin(TEMPLATE_ID, plan))
        .await
        .map_err(CodeInterpreterError::Thread)?
        .map(Some)
        .map_err(CodeInterpreterError::Build)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_opens_with_the_server_as_start_command() {
        let dir = tempfile::tempdir().unwrap();
        let template = write_context(dir.path()).unwrap();
        assert_eq!(
            template.config.start_cmd.as_deref(),
            Some("python3 /opt/warren/interpreter/server.py")
        );
        assert!(template
            .config
            .ready_cmd
            .as_deref()
            .unwrap()
            .contains("49999/health"));
        assert!(template.dockerfile.contains("COPY server.py"));
        // Writing again over an up-to-date context changes nothing and still opens.
        std::fs::write(dir.path().join("server.py"), "stale").unwrap();
        write_context(dir.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("server.py")).unwrap(),
            include_str!("template/server.py")
        );
    }

    #[test]
    fn plan_builds_on_the_given_rootfs_and_its_key_follows_the_files() {
        let rootfs = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(rootfs.path().join("usr/bin")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let template = write_context(dir.path()).unwrap();
        let plan = template.plan(&Default::default(), rootfs.path()).unwrap();
        assert!(plan.base.layers().contains(&rootfs.path().to_path_buf()));
        let key = plan.final_key();
        std::fs::write(dir.path().join("server.py"), "print('changed')").unwrap();
        let changed = TemplateDir::open(dir.path())
            .unwrap()
            .plan(&Default::default(), rootfs.path())
            .unwrap();
        assert_ne!(changed.final_key(), key);
    }

    #[test]
    fn a_rootfs_without_its_stamp_is_not_ready() {
        let rootfs = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(rootfs.path().join("usr/bin")).unwrap();
        std::fs::write(rootfs.path().join("usr/bin/python3"), "").unwrap();
        assert!(!rootfs_ready(rootfs.path()));
        std::fs::write(rootfs.path().join(ROOTFS_STAMP), "").unwrap();
        assert!(rootfs_ready(rootfs.path()));
    }
}
