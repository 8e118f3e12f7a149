//! Template build end to end on a real runtime and agent: build tests/templates/http-app (a pip install
//! and an HTTP start command), rebuild it from the cache, start a sandbox from it and fetch a page from
//! the server inside; then a failing build names its step. Prints the cold and cached build times.
//!
//! Needs root, the base rootfs (scripts/setup), the static agent (scripts/build-agent, or
//! $WARREN_TEST_AGENT) and warren-supervisor next to the test binary (cargo build --workspace); prints
//! one SKIP line otherwise.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_runtime::{LinuxRuntime, LinuxRuntimeConfig, NetworkSpec, Resources, Runtime};
use warren_server::templates::builder::agent_commands::EnvdCommands;
use warren_server::templates::builder::instantiate::start_sandbox;
use warren_server::templates::builder::job::{BuildJob, BuildStatus, JobState};
use warren_server::templates::builder::runner::BuildSettings;
use warren_server::templates::builder::sdk_template::{TemplateBuildStartV2, TemplateStep};
use warren_server::templates::builder::service::BuildService;
use warren_server::templates::builder::versions::TemplateStart;

const BASE_ROOTFS: &str = "/var/cache/warren/rootfs/debian12-base";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn agent_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("WARREN_TEST_AGENT") {
        return Some(PathBuf::from(path));
    }
    let built = repo_root().join("target/agent/x86_64-unknown-linux-gnu/agent/warren-agent");
    built.is_file().then_some(built)
}

fn pip_wheel() -> Option<PathBuf> {
    let dir = Path::new("/usr/share/python-wheels");
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().starts_with("pip-"))
                .unwrap_or(false)
        })
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn print_logs(state: &JobState) {
    for entry in &state.logs {
        eprintln!(
            "  [{}] {}",
            entry.step.as_deref().unwrap_or("-"),
            entry.message
        );
    }
}

fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: sandbox\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// Removes the test's state dir on the way out, whatever happens.
struct StateDir(PathBuf);

impl Drop for StateDir {
    fn drop(&mut self) {
        warren_runtime::rootfs::lxcfs::stop(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn builds_caches_and_starts_a_template() {
    if !nix_is_root() {
        println!("SKIP: template builds need root (real sandboxes)");
        return;
    }
    let rootfs = PathBuf::from(BASE_ROOTFS);
    if !rootfs.join(".warren-complete").exists() {
        println!("SKIP: base rootfs {BASE_ROOTFS} not built (run scripts/setup)");
        return;
    }
    let Some(agent) = agent_binary() else {
        println!("SKIP: warren-agent not built (run scripts/build-agent or set WARREN_TEST_AGENT)");
        return;
    };
    let Some(wheel) = pip_wheel() else {
        println!(
            "SKIP: no pip wheel in /usr/share/python-wheels (apt-get install python3-pip-whl)"
        );
        return;
    };
    let state = StateDir(PathBuf::from(format!(
        "/tmp/wt-templates-it-{}",
        std::process::id()
    )));
    let config = LinuxRuntimeConfig {
        state_dir: state.0.clone(),
        agent_binary: agent,
        ..LinuxRuntimeConfig::default()
    };
    let runtime: Arc<dyn Runtime> = match LinuxRuntime::new(config) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            println!("SKIP: the Linux runtime cannot run here: {e}");
            return;
        }
    };
    let commands = Arc::new(EnvdCommands::new());

    let context = state.0.join("context");
    copy_tree(&repo_root().join("tests/templates/http-app"), &context);
    std::fs::copy(
        &wheel,
        context.join("wheels").join(wheel.file_name().unwrap()),
    )
    .unwrap();

    let mut settings = BuildSettings::new(&state.0);
    settings.sandbox_prefix = "wt-".into();
    // Everything the fixture needs is in its context: no NAT for the build sandboxes.
    settings.allow_internet = false;
    settings.step_resources = Resources {
        vcpus: 1.0,
        memory_mib: 1024,
        disk_mib: 1024,
        max_pids: 1024,
    };
    settings.ready_timeout = Duration::from_secs(60);
    let service = BuildService::new(runtime.clone(), commands.clone(), settings, Some(rootfs));

    // Cold build.
    let (template, plan) = service.plan_dir(&context, &BTreeMap::new()).expect("plan");
    assert_eq!(
        template.config.template_name.as_deref(),
        Some("wt-http-app")
    );
    let job = BuildJob::new("wt-http-app", "wt-build-1");
    let t0 = Instant::now();
    let first = match service.build_now("wt-http-app", "wt-build-1", &plan, &job) {
        Ok(built) => built,
        Err(e) => {
            print_logs(&job.snapshot());
            panic!("cold build failed: {e}");
        }
    };
    let cold = t0.elapsed();
    assert_eq!(job.status(), BuildStatus::Ready);
    assert_eq!(first.cached_steps, 0);
    let logs = job.snapshot().logs;
    assert!(
        logs.iter()
            .any(|e| e.message.contains("hello from a pip-installed package")),
        "the pip-installed package ran during the build"
    );
    assert!(
        logs.iter().any(|e| e.message.contains("server.py")),
        "app files were copied"
    );
    assert!(
        !logs.iter().any(|e| e.message.contains("notes.tmp")),
        ".dockerignore excluded notes.tmp"
    );

    // Rebuild: same inputs, every layer from the cache, a new version.
    let (_, plan_again) = service.plan_dir(&context, &BTreeMap::new()).expect("plan");
    let job2 = BuildJob::new("wt-http-app", "wt-build-2");
    let t1 = Instant::now();
    let second = service
        .build_now("wt-http-app", "wt-build-2", &plan_again, &job2)
        .expect("cached build");
    let cached = t1.elapsed();
    assert_eq!(second.cached_steps, second.total_steps, "every step cached");
    assert_eq!(second.layers, first.layers);
    assert_eq!(service.versions().list("wt-http-app").unwrap().len(), 2);
    println!(
        "template build times: cold {:.1}s, cached {:.1}s ({} steps)",
        cold.as_secs_f64(),
        cached.as_secs_f64(),
        second.total_steps
    );

    // A sandbox from the template serves HTTP from the pip-installed package.
    let id = format!("wt-tpl-{}", std::process::id());
    let started = start_sandbox(
        runtime.as_ref(),
        commands.as_ref(),
        &second,
        &id,
        Resources {
            vcpus: 1.0,
            memory_mib: 512,
            disk_mib: 256,
            max_pids: 256,
        },
        NetworkSpec::default(),
        Duration::from_secs(30),
    )
    .expect("sandbox from the template");
    assert_eq!(
        started.start_process.is_some(),
        second.start == TemplateStart::Cold
    );
    let body = http_get(started.sandbox.addr(8000), "/");
    runtime.destroy(&id).expect("destroy sandbox");
    let body = body.expect("the template's HTTP server answered");
    assert!(body.starts_with("HTTP/1.0 200"), "{body}");
    assert!(
        body.contains("hello from a pip-installed package"),
        "{body}"
    );

    // The SDK's Template builder path: its request body and upload, built on the real runtime.
    let sdk_fixture = repo_root().join("tests/templates/sdk-builder");
    let sdk_body: TemplateBuildStartV2 =
        serde_json::from_str(&std::fs::read_to_string(sdk_fixture.join("request.json")).unwrap())
            .unwrap();
    let hash = sdk_body.steps[0].files_hash.clone().unwrap();
    let mut archive = std::fs::File::open(sdk_fixture.join(format!("{hash}.tar.gz"))).unwrap();
    service.uploads().put(&hash, &mut archive).unwrap();
    // Same COPY as the SDK sent, offline steps instead of its pip/apt installs.
    let request = TemplateBuildStartV2 {
        from_image: Some("debian:12".into()),
        steps: vec![
            sdk_body.steps[0].clone(),
            sdk_step("ENV", &["GREETING", "from-sdk"]),
            sdk_step("WORKDIR", &["/home/user/app"]),
            sdk_step(
                "RUN",
                &["python3 main.py > out.txt && echo $GREETING >> out.txt && id -un >> out.txt"],
            ),
        ],
        ..Default::default()
    };
    let plan = service
        .plan_sdk(&request, Some(1), Some(512))
        .expect("plan the SDK request");
    let job = BuildJob::new("wt-sdk", "wt-build-1");
    let built = match service.build_now("wt-sdk", "wt-build-1", &plan, &job) {
        Ok(built) => built,
        Err(e) => {
            print_logs(&job.snapshot());
            panic!("SDK build failed: {e}");
        }
    };
    let out = built
        .layers
        .iter()
        .map(|l| l.join("home/user/app/out.txt"))
        .find(|p| p.exists())
        .expect("out.txt in a layer");
    assert_eq!(std::fs::read_to_string(out).unwrap(), "1\nfrom-sdk\nuser\n");
    let status = serde_json::to_value(job.status_response(0, None, None)).unwrap();
    assert_eq!(status["status"], "ready");
    assert_eq!(status["buildID"], "wt-build-1");

    // A failing step fails the build, named, with its output.
    let broken = state.0.join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("e2b.Dockerfile"),
        "FROM debian:12\nRUN echo first-step-ok\nRUN echo about to fail && ls /no/such/dir\n",
    )
    .unwrap();
    let (_, plan) = service.plan_dir(&broken, &BTreeMap::new()).expect("plan");
    let job = BuildJob::new("wt-broken", "wt-build-1");
    let err = service
        .build_now("wt-broken", "wt-build-1", &plan, &job)
        .expect_err("the build fails");
    let snapshot = job.snapshot();
    let reason = snapshot.reason.clone().expect("a reason");
    assert!(
        snapshot.logs.iter().any(|e| e.message == "first-step-ok"),
        "a quick step's output is logged"
    );
    if !reason
        .log_entries
        .iter()
        .any(|e| e.message.contains("No such file or directory"))
    {
        print_logs(&snapshot);
    }
    assert_eq!(reason.step.as_deref(), Some("2"), "{err}");
    assert!(reason.message.contains("exit code 2"), "{}", reason.message);
    assert!(
        reason
            .log_entries
            .iter()
            .any(|e| e.message.contains("No such file or directory")),
        "{:?}",
        reason.log_entries
    );
    let leftovers: Vec<String> = runtime
        .list()
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .filter(|s| s.starts_with("wt-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "build sandboxes left running: {leftovers:?}"
    );
}

fn sdk_step(kind: &str, args: &[&str]) -> TemplateStep {
    TemplateStep {
        kind: kind.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

fn nix_is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}
