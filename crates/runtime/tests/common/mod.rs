//! Shared helpers of the runtime's integration tests: skips, the test agent, a runtime on a private
//! state dir, running commands in a sandbox, and leak checks.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use warren_runtime::{
    LinuxRuntime, LinuxRuntimeConfig, NetworkSpec, Resources, Sandbox, SandboxSpec,
};

pub const BASE_ROOTFS: &str = "/var/cache/warren/rootfs/debian12-base";

/// The base rootfs, or None after printing the SKIP line.
pub fn base_rootfs() -> Option<PathBuf> {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: the runtime tests need root");
        return None;
    }
    let base = PathBuf::from(BASE_ROOTFS);
    if !base.join(".warren-complete").exists() {
        println!("SKIP: base rootfs not built (run scripts/setup)");
        return None;
    }
    Some(base)
}

/// The agent the sandboxes run: $WARREN_TEST_AGENT, or the stand-in in tests/fixtures built statically,
/// once per test process (tests run on several threads; two builds racing into one file crash the
/// linker).
pub fn test_agent() -> PathBuf {
    static AGENT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    AGENT.get_or_init(build_test_agent).clone()
}

fn build_test_agent() -> PathBuf {
    if let Some(path) = std::env::var_os("WARREN_TEST_AGENT") {
        return PathBuf::from(path);
    }
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let binary = out_dir.join("warren-test-agent");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/test_agent.rs");
    let fresh = binary.metadata().and_then(|b| b.modified()).ok()
        > source.metadata().and_then(|s| s.modified()).ok();
    if fresh {
        return binary;
    }
    // Unique per process: test binaries of other runs may build at the same time.
    let temp = out_dir.join(format!("warren-test-agent.{}", std::process::id()));
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let status = std::process::Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "-O",
            "-C",
            "target-feature=+crt-static",
            "-o",
        ])
        .arg(&temp)
        .arg(&source)
        .status()
        .expect("run rustc for the test agent");
    assert!(status.success(), "building the test agent failed");
    std::fs::rename(&temp, &binary).expect("install the test agent");
    binary
}

pub fn state_dir(name: &str) -> PathBuf {
    PathBuf::from(format!("/tmp/wt-runtime-{name}-{}", std::process::id()))
}

/// A runtime on a private state dir, removed with the runtime when no sandbox is left in it.
pub struct TestRuntime(LinuxRuntime);

impl std::ops::Deref for TestRuntime {
    type Target = LinuxRuntime;
    fn deref(&self) -> &LinuxRuntime {
        &self.0
    }
}

impl Drop for TestRuntime {
    fn drop(&mut self) {
        let dir = &self.0.config().state_dir;
        let empty =
            std::fs::read_dir(dir.join("sandboxes")).map_or(true, |mut d| d.next().is_none());
        if empty {
            warren_runtime::rootfs::lxcfs::stop(dir);
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The configuration of a test runtime on a private state dir, for tests that change a setting.
pub fn config(name: &str) -> LinuxRuntimeConfig {
    LinuxRuntimeConfig {
        state_dir: state_dir(name),
        agent_binary: test_agent(),
        supervisor_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_warren-supervisor"))),
        ..LinuxRuntimeConfig::default()
    }
}

pub fn runtime(name: &str) -> TestRuntime {
    TestRuntime(LinuxRuntime::new(config(name)).expect("runtime"))
}

pub fn resources() -> Resources {
    Resources {
        vcpus: 1.0,
        memory_mib: 256,
        disk_mib: 64,
        max_pids: 256,
    }
}

pub fn spec(id: &str, layers: Vec<PathBuf>, resources: Resources) -> SandboxSpec {
    SandboxSpec {
        id: id.to_string(),
        layers,
        resources,
        network: NetworkSpec::default(),
        syscalls: Default::default(),
        volumes: Vec::new(),
    }
}

/// Runs `command` with /bin/sh inside the sandbox through the test agent; returns (output, exit code).
pub fn exec(sandbox: &Sandbox, command: &str) -> (String, i32) {
    let mut stream = TcpStream::connect_timeout(&sandbox.agent_addr(), Duration::from_secs(5))
        .expect("connect agent");
    // A command that never answers is a failure to report, not a suite that hangs.
    stream
        .set_read_timeout(Some(Duration::from_secs(180)))
        .expect("read timeout");
    stream
        .write_all(format!("{command}\n").as_bytes())
        .expect("send command");
    let mut output = String::new();
    stream
        .read_to_string(&mut output)
        .unwrap_or_else(|e| panic!("no answer from `{command}` in {}: {e}", sandbox.id));
    let (body, code) = output.rsplit_once("\nEXIT ").expect("exit line");
    (body.to_string(), code.trim().parse().expect("exit code"))
}

/// Everything of `state_dir`'s sandboxes still on the host: mounts, loop devices, veths, cgroups.
pub fn leftovers(state_dir: &Path, ids: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let dir = state_dir.to_string_lossy().into_owned();
    // The state dir's lxcfs serves every sandbox of it and outlives them (TestRuntime stops it).
    let lxcfs = format!(
        " {} ",
        warren_runtime::rootfs::lxcfs::mountpoint(state_dir).display()
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    found.extend(
        mountinfo
            .lines()
            .filter(|l| l.contains(&dir) && !l.contains(&lxcfs))
            .map(|l| format!("mount: {l}")),
    );
    found.extend(
        warren_runtime::rootfs::loop_device::devices_backed_under(state_dir)
            .into_iter()
            .map(|d| format!("loop: {}", d.display())),
    );
    let leases = state_dir.join("network/leases");
    for lease in std::fs::read_dir(&leases)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|l| !l.file_name().to_string_lossy().starts_with('.'))
    {
        found.push(format!("lease: {}", lease.path().display()));
    }
    for id in ids {
        for controller in [
            "memory", "cpu", "cpuacct", "pids", "freezer", "blkio", "devices", "unified",
        ] {
            let path = Path::new("/sys/fs/cgroup")
                .join(controller)
                .join("warren")
                .join(id);
            if path.exists() {
                found.push(format!("cgroup: {}", path.display()));
            }
        }
        let v2 = Path::new("/sys/fs/cgroup/warren").join(id);
        if v2.exists() {
            found.push(format!("cgroup: {}", v2.display()));
        }
        if state_dir.join("sandboxes").join(id).exists() {
            found.push(format!("dir: sandboxes/{id}"));
        }
    }
    found
}

/// Host veths of sandboxes (`wv-*`) whose address is in `ips`.
/// Host veths left for `ips` by this test's runtime. An address released by the test may already be
/// leased again by another runtime on the same bridge (a server or a second checkout): its host-wide
/// claim then names another state dir, and its veth is not ours.
pub fn veths_for(ips: &[std::net::Ipv4Addr]) -> Vec<String> {
    ips.iter()
        .filter(|ip| {
            let claim = std::path::Path::new("/run/warren/addresses/warren0").join(ip.to_string());
            let ours = format!("-{}/", std::process::id());
            std::fs::read_to_string(claim).map_or(true, |owner| owner.contains(&ours))
        })
        .map(|ip| warren_runtime::network::veth_name("wv", *ip))
        .filter(|name| warren_runtime::network::host_link_exists(name))
        .collect()
}

/// Destroys the named sandboxes when dropped, so a failing assertion leaves nothing behind.
pub struct DestroyOnDrop<'a>(pub &'a LinuxRuntime, pub Vec<String>);

impl Drop for DestroyOnDrop<'_> {
    fn drop(&mut self) {
        use warren_runtime::Runtime;
        for id in &self.1 {
            let _ = self.0.destroy(id);
        }
    }
}

impl From<LinuxRuntime> for TestRuntime {
    fn from(runtime: LinuxRuntime) -> Self {
        Self(runtime)
    }
}
