//! Test support shared by warren-client's and warren-cli's integration tests: a real Warren server
//! (testkit) whose "sandboxes" are real warren-agent processes in host mode, each on a loopback address of
//! its own, so REST, proxy routing and envd's Connect protocol all run for real without root (only the
//! namespaces are missing). The runtime here is a test double of the runtime crate (tests only); the agent
//! is the real binary built by `cargo build --workspace`. Without it, `start_server` prints
//! `SKIP: ...` and returns `None`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use warren_runtime::{
    Capabilities, CheckpointInfo, HostCapacity, ProcessInfo, Runtime, RuntimeError, RuntimeState,
    Sandbox, SandboxSpec, Stats, AGENT_PORT,
};
use warren_testkit::TestServer;

/// Finds the agent binary: `WARREN_AGENT_BIN`, the static build of scripts/build-agent, or the debug
/// build next to this test binary.
pub fn agent_binary() -> Option<PathBuf> {
    if let Some(explicit) = std::env::var_os("WARREN_AGENT_BIN") {
        return Some(PathBuf::from(explicit));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let static_build = repo.join("target/agent/x86_64-unknown-linux-gnu/agent/warren-agent");
    let debug_build = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(|dir| dir.join("warren-agent")));
    [Some(static_build), debug_build]
        .into_iter()
        .flatten()
        .find(|path| path.is_file())
}

static NEXT_HOST: AtomicU32 = AtomicU32::new(1);

/// A loopback address of its own per sandbox, so each agent can listen on the real envd port.
fn next_ip() -> Ipv4Addr {
    let n = NEXT_HOST.fetch_add(1, Ordering::SeqCst) + (std::process::id() % 200) * 250;
    Ipv4Addr::new(127, 78, (n / 250 % 250) as u8, (n % 250 + 1) as u8)
}

struct HostSandbox {
    sandbox: Sandbox,
    agent: Child,
    root: PathBuf,
}

/// Runs each sandbox as a host-mode warren-agent on its own loopback IP; pause = SIGSTOP.
struct HostAgentRuntime {
    agent: PathBuf,
    sandboxes: Mutex<HashMap<String, HostSandbox>>,
}

impl HostAgentRuntime {
    fn signal(
        &self,
        id: &str,
        signal: nix::sys::signal::Signal,
        state: RuntimeState,
    ) -> Result<(), RuntimeError> {
        let mut sandboxes = self.sandboxes.lock().expect("lock");
        let entry = sandboxes
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
        let pid = nix::unistd::Pid::from_raw(entry.sandbox.init_pid as i32);
        nix::sys::signal::kill(pid, signal)
            .map_err(|e| RuntimeError::internal("kill the agent", e))?;
        entry.sandbox.state = state;
        Ok(())
    }
}

/// A directory standing for the sandbox's `/`: users `root` and `user`, a home, a /tmp.
fn make_root(id: &str) -> std::io::Result<PathBuf> {
    let root = std::env::temp_dir().join(format!("wt-client-{id}"));
    std::fs::create_dir_all(root.join("etc"))?;
    std::fs::create_dir_all(root.join("home/user"))?;
    std::fs::create_dir_all(root.join("tmp"))?;
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n",
    )?;
    std::fs::write(root.join("etc/group"), "root:x:0:\nuser:x:1000:\n")?;
    if nix::unistd::geteuid().is_root() {
        nix::unistd::chown(
            &root.join("home/user"),
            Some(1000.into()),
            Some(1000.into()),
        )?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    }
    Ok(root)
}

impl Runtime for HostAgentRuntime {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cgroup_version: 1,
            checkpoint: false,
        }
    }

    /// Host-mode agents share the host: no share of it is set aside for them.
    fn renew(&self, _id: &str, _until_unix_ms: u64) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn host_capacity(&self) -> Result<HostCapacity, RuntimeError> {
        Ok(HostCapacity {
            sandbox_tasks: u64::MAX,
            disk_free_bytes: u64::MAX,
            disk_reserve_bytes: 0,
            disk_promised_bytes: 0,
        })
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        let io = |context: &str| {
            let context = context.to_string();
            move |source| RuntimeError::Io { context, source }
        };
        let root = make_root(&spec.id).map_err(io("sandbox root"))?;
        let ip = next_ip();
        let listen = SocketAddr::from((ip, AGENT_PORT));
        let agent = Command::new(&self.agent)
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--root")
            .arg(&root)
            .env("WARREN_SANDBOX_ID", &spec.id)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("spawn agent"))?;
        let sandbox = Sandbox {
            id: spec.id.clone(),
            ip,
            init_pid: agent.id(),
            state: RuntimeState::Running,
            created_at: SystemTime::now(),
        };
        // Bounded wait for the agent's port (not a timing assertion).
        let ready = (0..400).any(|_| {
            if TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(25));
            false
        });
        let mut entry = HostSandbox {
            sandbox: sandbox.clone(),
            agent,
            root,
        };
        if !ready {
            let _ = entry.agent.kill();
            let _ = entry.agent.wait();
            let _ = std::fs::remove_dir_all(&entry.root);
            return Err(RuntimeError::failed(format!(
                "agent did not listen on {listen}"
            )));
        }
        self.sandboxes
            .lock()
            .expect("lock")
            .insert(spec.id.clone(), entry);
        Ok(sandbox)
    }

    fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
        let mut entry = self
            .sandboxes
            .lock()
            .expect("lock")
            .remove(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        let pid = nix::unistd::Pid::from_raw(entry.sandbox.init_pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        let _ = entry.agent.kill();
        let _ = entry.agent.wait();
        let _ = std::fs::remove_dir_all(&entry.root);
        Ok(())
    }

    fn freeze(&self, id: &str) -> Result<(), RuntimeError> {
        self.signal(id, nix::sys::signal::Signal::SIGSTOP, RuntimeState::Frozen)
    }

    fn thaw(&self, id: &str) -> Result<(), RuntimeError> {
        self.signal(id, nix::sys::signal::Signal::SIGCONT, RuntimeState::Running)
    }

    fn stats(&self, _id: &str) -> Result<Stats, RuntimeError> {
        Ok(Stats::default())
    }

    fn processes(&self, _id: &str) -> Result<Vec<ProcessInfo>, RuntimeError> {
        Ok(Vec::new())
    }

    fn kill_process(&self, _id: &str, _pid: u32, _signal: i32) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported("host-agent test runtime".into()))
    }

    fn set_network(
        &self,
        _id: &str,
        _network: &warren_runtime::NetworkSpec,
    ) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported("host-agent test runtime".into()))
    }

    fn recover(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        // Nothing of this fake outlives its owner: recovering is listing.
        self.list()
    }
    fn list(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        Ok(self
            .sandboxes
            .lock()
            .expect("lock")
            .values()
            .map(|s| s.sandbox.clone())
            .collect())
    }

    fn checkpoint(
        &self,
        _id: &str,
        _dest: &Path,
        _leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        Err(RuntimeError::Unsupported(
            "host-agent test runtime has no checkpoints".into(),
        ))
    }

    fn commit_layer(&self, _id: &str, _dest: &Path) -> Result<u64, RuntimeError> {
        Err(RuntimeError::Unsupported(
            "host-agent test runtime has no layers".into(),
        ))
    }

    fn restore(&self, _checkpoint: &Path, _spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        Err(RuntimeError::Unsupported(
            "host-agent test runtime has no checkpoints".into(),
        ))
    }
}

impl Drop for HostAgentRuntime {
    fn drop(&mut self) {
        let ids: Vec<String> = self
            .sandboxes
            .lock()
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        for id in ids {
            let _ = self.destroy(&id);
        }
    }
}

pub struct Harness {
    pub server: TestServer,
    _runtime: Arc<HostAgentRuntime>,
    rootfs: PathBuf,
}

impl Harness {
    pub async fn stop(self) {
        self.server.stop().await.expect("stop");
        std::fs::remove_dir_all(&self.rootfs).expect("remove the rootfs stand-in");
    }
}

pub async fn start_server() -> Option<Harness> {
    let Some(agent) = agent_binary() else {
        println!(
            "SKIP: no warren-agent binary (run `cargo build --workspace` or scripts/build-agent)"
        );
        return None;
    };
    let runtime = Arc::new(HostAgentRuntime {
        agent,
        sandboxes: Mutex::new(HashMap::new()),
    });
    let n = NEXT_HOST.fetch_add(1, Ordering::SeqCst);
    let rootfs = std::env::temp_dir().join(format!("wt-client-rootfs-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&rootfs).expect("rootfs dir");
    let server = TestServer::start(runtime.clone(), rootfs.clone(), |_| {})
        .await
        .expect("server starts");
    Some(Harness {
        server,
        _runtime: runtime,
        rootfs,
    })
}
