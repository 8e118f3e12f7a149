//! A fake `Runtime` for tests only: each "sandbox" is an HTTP server on its own loopback address
//! (127.77.x.y) at the agent's port. It records `/init` bodies, echoes requests, streams, and echoes
//! upgraded connections, so the API, lifecycle and proxy run against something that answers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use warren_runtime::{
    Capabilities, CheckpointInfo, HostCapacity, ProcessInfo, Runtime, RuntimeError, RuntimeState,
    Sandbox, SandboxSpec, Stats, AGENT_PORT,
};

static NEXT_IP: AtomicU32 = AtomicU32::new(1);

fn next_ip() -> Ipv4Addr {
    let n = NEXT_IP.fetch_add(1, Ordering::SeqCst) + (std::process::id() % 50) * 1000;
    Ipv4Addr::new(127, 77, (n / 250 % 250) as u8, (n % 250 + 1) as u8)
}

struct FakeSandbox {
    sandbox: Sandbox,
    server: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
pub struct Recorded {
    pub inits: Vec<(String, serde_json::Value, Option<String>)>,
    pub destroyed: Vec<String>,
    pub created: Vec<SandboxSpec>,
    pub restored: Vec<SandboxSpec>,
    /// Sandboxes started fresh over saved files (`boot_from_disk`).
    pub booted: Vec<SandboxSpec>,
    /// Checkpoints whose caches the server dropped (`forget_checkpoint`).
    pub forgotten: Vec<std::path::PathBuf>,
}

pub struct FakeRuntime {
    /// The network `set_network` gave each sandbox last (create and restore ones are in the
    /// recorded specs).
    pub egress: Mutex<HashMap<String, warren_runtime::NetworkSpec>>,
    handle: tokio::runtime::Handle,
    checkpoint: bool,
    sandboxes: Mutex<HashMap<String, FakeSandbox>>,
    pub recorded: Arc<Mutex<Recorded>>,
    /// Make `create` fail, as a broken host would.
    pub fail_create: AtomicBool,
    /// Make `checkpoint` fail (a failed dump: the sandbox keeps running).
    pub fail_checkpoint: AtomicBool,
    /// Make `restore` fail (the checkpoint stays as it was).
    pub fail_restore: AtomicBool,
    /// What `host_capacity` reports (plenty unless a test lowers it).
    pub capacity: Mutex<HostCapacity>,
    /// The deadline `renew` gave each sandbox last.
    pub deadlines: Mutex<HashMap<String, u64>>,
    /// What `network_rules_replaced` reports (a host whose firewall tables were just replaced).
    pub rules_replaced: AtomicBool,
}

impl FakeRuntime {
    pub fn new(checkpoint: bool) -> Arc<Self> {
        Arc::new(FakeRuntime {
            handle: tokio::runtime::Handle::current(),
            checkpoint,
            egress: Mutex::new(HashMap::new()),
            sandboxes: Mutex::new(HashMap::new()),
            recorded: Arc::new(Mutex::new(Recorded::default())),
            fail_create: AtomicBool::new(false),
            fail_checkpoint: AtomicBool::new(false),
            fail_restore: AtomicBool::new(false),
            capacity: Mutex::new(HostCapacity {
                sandbox_tasks: u64::MAX,
                disk_free_bytes: u64::MAX,
                disk_reserve_bytes: 0,
                disk_promised_bytes: 0,
            }),
            deadlines: Mutex::new(HashMap::new()),
            rules_replaced: AtomicBool::new(false),
        })
    }

    pub fn live_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.sandboxes.lock().unwrap().keys().cloned().collect();
        ids.sort();
        ids
    }

    pub fn inits_of(&self, id: &str) -> Vec<(serde_json::Value, Option<String>)> {
        self.recorded
            .lock()
            .unwrap()
            .inits
            .iter()
            .filter(|(sid, _, _)| sid == id)
            .map(|(_, body, token)| (body.clone(), token.clone()))
            .collect()
    }

    /// Stops a live sandbox's agent from answering (a hung guest): its address refuses connections.
    pub fn silence(&self, id: &str) {
        if let Some(fake) = self.sandboxes.lock().unwrap().get(id) {
            fake.server.abort();
        }
    }

    /// The loopback address a live sandbox answers on.
    pub fn ip_of(&self, id: &str) -> Option<Ipv4Addr> {
        self.sandboxes
            .lock()
            .unwrap()
            .get(id)
            .map(|fake| fake.sandbox.ip)
    }

    /// Start a sandbox the server does not know about (for reconciliation tests).
    pub fn start_untracked(&self, id: &str) {
        let spec = SandboxSpec {
            id: id.to_string(),
            layers: vec![],
            resources: warren_runtime::Resources {
                vcpus: 1.0,
                memory_mib: 128,
                disk_mib: 128,
                max_pids: 64,
            },
            network: Default::default(),
            syscalls: Default::default(),
            volumes: Vec::new(),
        };
        self.create(&spec).unwrap();
    }

    fn start(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        let ip = next_ip();
        let listener =
            std::net::TcpListener::bind(SocketAddr::from((ip, AGENT_PORT))).map_err(|source| {
                RuntimeError::Io {
                    context: format!("bind fake agent on {ip}"),
                    source,
                }
            })?;
        listener.set_nonblocking(true).unwrap();
        let recorded = Arc::clone(&self.recorded);
        let sandbox_id = id.to_string();
        let _entered = self.handle.enter();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let server = self.handle.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let recorded = Arc::clone(&recorded);
                let sandbox_id = sandbox_id.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        fake_agent(request, Arc::clone(&recorded), sandbox_id.clone())
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let sandbox = Sandbox {
            id: id.to_string(),
            ip,
            init_pid: 4242,
            state: RuntimeState::Running,
            created_at: SystemTime::now(),
        };
        self.sandboxes.lock().unwrap().insert(
            id.to_string(),
            FakeSandbox {
                sandbox: sandbox.clone(),
                server,
            },
        );
        Ok(sandbox)
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

async fn fake_agent(
    mut request: Request<Incoming>,
    recorded: Arc<Mutex<Recorded>>,
    sandbox_id: String,
) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path().to_string();
    let token = request
        .headers()
        .get("x-access-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match path.as_str() {
        "/init" => {
            let body = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let json: serde_json::Value =
                serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            recorded
                .lock()
                .unwrap()
                .inits
                .push((sandbox_id, json, token));
            Ok(Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(full(""))
                .unwrap())
        }
        "/stream" => {
            let chunks = (0..5)
                .map(|i| Ok::<_, Infallible>(Frame::data(Bytes::from(format!("chunk{i}\n")))));
            let stream = futures_util::stream::iter(chunks);
            Ok(Response::new(StreamBody::new(stream).boxed()))
        }
        "/upgrade" => {
            let upgrade = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                if let Ok(upgraded) = upgrade.await {
                    let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
                    let _ = tokio::io::copy(&mut reader, &mut writer).await;
                }
            });
            Ok(Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header("connection", "upgrade")
                .header("upgrade", "wt-echo")
                .body(full(""))
                .unwrap())
        }
        _ => {
            let method = request.method().to_string();
            let version = format!("{:?}", request.version());
            let headers: serde_json::Map<String, serde_json::Value> = request
                .headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        serde_json::Value::String(v.to_str().unwrap_or("").to_string()),
                    )
                })
                .collect();
            let body = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let echo = serde_json::json!({
                "sandbox": sandbox_id,
                "method": method,
                "path": path,
                "version": version,
                "headers": headers,
                "body": String::from_utf8_lossy(&body),
            });
            Ok(Response::new(full(echo.to_string())))
        }
    }
}

impl Runtime for FakeRuntime {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cgroup_version: 1,
            checkpoint: self.checkpoint,
        }
    }

    fn network_rules_replaced(&self) -> bool {
        self.rules_replaced
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn host_capacity(&self) -> Result<HostCapacity, RuntimeError> {
        Ok(*self.capacity.lock().unwrap())
    }

    fn renew(&self, id: &str, until_unix_ms: u64) -> Result<(), RuntimeError> {
        if !self.sandboxes.lock().unwrap().contains_key(id) {
            return Err(RuntimeError::NotFound(id.to_string()));
        }
        self.deadlines
            .lock()
            .unwrap()
            .insert(id.to_string(), until_unix_ms);
        Ok(())
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        if self.fail_create.load(Ordering::SeqCst) {
            return Err(RuntimeError::failed(
                "wt injected failure: secret detail".to_string(),
            ));
        }
        if self.sandboxes.lock().unwrap().contains_key(&spec.id) {
            return Err(RuntimeError::AlreadyExists(spec.id.clone()));
        }
        self.recorded.lock().unwrap().created.push(spec.clone());
        self.start(&spec.id)
    }

    fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
        let removed = self.sandboxes.lock().unwrap().remove(id);
        match removed {
            Some(sandbox) => {
                sandbox.server.abort();
                self.recorded.lock().unwrap().destroyed.push(id.to_string());
                Ok(())
            }
            None => Err(RuntimeError::NotFound(id.to_string())),
        }
    }

    fn freeze(&self, id: &str) -> Result<(), RuntimeError> {
        let mut sandboxes = self.sandboxes.lock().unwrap();
        let sandbox = sandboxes
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
        sandbox.sandbox.state = RuntimeState::Frozen;
        Ok(())
    }

    fn thaw(&self, id: &str) -> Result<(), RuntimeError> {
        let mut sandboxes = self.sandboxes.lock().unwrap();
        let sandbox = sandboxes
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))?;
        sandbox.sandbox.state = RuntimeState::Running;
        Ok(())
    }

    fn stats(&self, id: &str) -> Result<Stats, RuntimeError> {
        if !self.sandboxes.lock().unwrap().contains_key(id) {
            return Err(RuntimeError::NotFound(id.to_string()));
        }
        Ok(Stats {
            cpu_usage_usec: 1000,
            cpu_percent: 12.5,
            memory_bytes: 64 << 20,
            memory_limit_bytes: 512 << 20,
            disk_used_bytes: 1 << 20,
            disk_limit_bytes: 2048 << 20,
            pids: 3,
            oom_kills: 0,
            memory_cache_bytes: 8 << 20,
            net_rx_bytes: 1500,
            net_tx_bytes: 700,
        })
    }

    fn processes(&self, _id: &str) -> Result<Vec<ProcessInfo>, RuntimeError> {
        Ok(Vec::new())
    }

    fn kill_process(&self, _id: &str, _pid: u32, _signal: i32) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn set_network(
        &self,
        id: &str,
        network: &warren_runtime::NetworkSpec,
    ) -> Result<(), RuntimeError> {
        if !self.sandboxes.lock().unwrap().contains_key(id) {
            return Err(RuntimeError::NotFound(id.to_string()));
        }
        self.egress
            .lock()
            .unwrap()
            .insert(id.to_string(), network.clone());
        Ok(())
    }

    fn recover(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        // Nothing of this fake outlives its owner: recovering is listing.
        self.list()
    }
    fn list(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        Ok(self
            .sandboxes
            .lock()
            .unwrap()
            .values()
            .map(|s| s.sandbox.clone())
            .collect())
    }

    fn checkpoint(
        &self,
        id: &str,
        dest: &Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        if !self.checkpoint {
            return Err(RuntimeError::Unsupported("no CRIU in the fake".to_string()));
        }
        if self.fail_checkpoint.load(Ordering::SeqCst) {
            return Err(RuntimeError::failed("fake dump failure".to_string()));
        }
        if !self.sandboxes.lock().unwrap().contains_key(id) {
            return Err(RuntimeError::NotFound(id.to_string()));
        }
        std::fs::create_dir_all(dest).map_err(|source| RuntimeError::Io {
            context: "mkdir".into(),
            source,
        })?;
        std::fs::write(dest.join("fake-checkpoint"), id).map_err(|source| RuntimeError::Io {
            context: "write".into(),
            source,
        })?;
        // Written last, as the real runtime does: a directory with a manifest is a complete checkpoint.
        std::fs::write(dest.join("manifest.json"), "{}").map_err(|source| RuntimeError::Io {
            context: "write".into(),
            source,
        })?;
        if !leave_running {
            let removed = self.sandboxes.lock().unwrap().remove(id);
            if let Some(sandbox) = removed {
                sandbox.server.abort();
            }
        }
        Ok(CheckpointInfo {
            dir: dest.to_path_buf(),
            size_bytes: 2,
        })
    }

    fn checkpoint_disk(
        &self,
        id: &str,
        dest: &Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        if !self.sandboxes.lock().unwrap().contains_key(id) {
            return Err(RuntimeError::NotFound(id.to_string()));
        }
        let io = |context: &str| {
            let context = context.to_string();
            move |source| RuntimeError::Io { context, source }
        };
        std::fs::create_dir_all(dest).map_err(io("mkdir"))?;
        std::fs::write(dest.join("fake-checkpoint"), id).map_err(io("write"))?;
        let file = warren_runtime::checkpoint::manifest::StoredFile {
            path: "layer.tar.zst".into(),
            name: "layer.tar".into(),
            stored_bytes: 1,
            raw_bytes: 1,
            zstd: true,
            sha256: "00".into(),
            chunks: None,
        };
        let manifest = warren_runtime::checkpoint::Manifest {
            format: warren_runtime::checkpoint::manifest::FORMAT,
            sandbox_id: id.to_string(),
            ip: Ipv4Addr::LOCALHOST,
            criu_version: String::new(),
            created_at_unix: 0,
            layers: Vec::new(),
            images: Vec::new(),
            layer: file,
            memory: false,
        };
        std::fs::write(dest.join("manifest.json"), manifest.to_json().unwrap())
            .map_err(io("write"))?;
        if !leave_running {
            let removed = self.sandboxes.lock().unwrap().remove(id);
            if let Some(sandbox) = removed {
                sandbox.server.abort();
            }
        }
        Ok(CheckpointInfo {
            dir: dest.to_path_buf(),
            size_bytes: 1,
        })
    }

    fn boot_from_disk(
        &self,
        checkpoint: &Path,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, RuntimeError> {
        if self.fail_restore.load(Ordering::SeqCst) {
            return Err(RuntimeError::failed("fake boot failure".to_string()));
        }
        std::fs::read_to_string(checkpoint.join("fake-checkpoint")).map_err(|source| {
            RuntimeError::Io {
                context: "read checkpoint".into(),
                source,
            }
        })?;
        if self.sandboxes.lock().unwrap().contains_key(&spec.id) {
            return Err(RuntimeError::AlreadyExists(spec.id.clone()));
        }
        self.recorded.lock().unwrap().booted.push(spec.clone());
        self.start(&spec.id)
    }

    fn commit_layer(&self, _id: &str, _dest: &Path) -> Result<u64, RuntimeError> {
        Err(RuntimeError::Unsupported("fake".into()))
    }

    fn forget_checkpoint(&self, checkpoint: &Path) {
        self.recorded
            .lock()
            .unwrap()
            .forgotten
            .push(checkpoint.to_path_buf());
    }

    fn restore(&self, checkpoint: &Path, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        if self.fail_restore.load(Ordering::SeqCst) {
            return Err(RuntimeError::failed("fake restore failure".to_string()));
        }
        // The checkpoint must exist; forks and snapshots restore it under new ids.
        std::fs::read_to_string(checkpoint.join("fake-checkpoint")).map_err(|source| {
            RuntimeError::Io {
                context: "read checkpoint".into(),
                source,
            }
        })?;
        self.recorded.lock().unwrap().restored.push(spec.clone());
        self.start(&spec.id)
    }
}

/// Wait (bounded) for a condition that becomes true asynchronously.
#[allow(dead_code)]
pub async fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    condition()
}
