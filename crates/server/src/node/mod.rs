//! The node side of cluster mode (docs/cluster.md): `warren node` runs this machine's runtime and
//! answers one server's runtime calls over HTTP; the server reaches it through
//! [`remote::RemoteRuntime`], which is a [`Runtime`] like the local one, so everything above the
//! runtime (the API, the lifecycle, the proxy, builds) works unchanged.
//!
//! A call is one `POST /v1/runtime` whose body is a [`wire::Call`]; the answer is `{"ok": <value>}`
//! or `{"error": <wire::WireError>}`. Every request carries the node's token as a bearer token.
//! Paths in calls (template layers, checkpoints, commit destinations) are the server's, so the two
//! share those directories (one machine, or a shared filesystem mounted at the same path); the node
//! refuses a call naming a path outside the directories it was told it shares.

pub mod cluster;
pub mod fence;
pub mod ledger;
pub mod remote;
pub mod wire;

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use warren_runtime::{LinuxRuntime, LinuxRuntimeConfig, Runtime, RuntimeError};

use warren_runtime::error_chain;
use wire::{Call, Hello, WireError};

/// How long a stopping node lets calls in flight finish (a checkpoint may take a while).
const NODE_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The answer to a call.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Ok(serde_json::Value),
    Error(WireError),
}

/// How `warren node` runs.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub runtime: LinuxRuntimeConfig,
    pub listen: SocketAddr,
    /// The bearer token every call must carry.
    pub token: String,
    /// Absolute directories the node shares with its server; call paths must lie inside one.
    pub shared_dirs: Vec<PathBuf>,
    /// Serve the API over HTTPS: the operator's certificate, or one signed by a local CA made in
    /// the node's state directory (`tls/ca.crt`, for the server's `--node-ca-file`).
    pub tls: Option<crate::tls::TlsSource>,
    /// What all the node's sandboxes together may hold.
    pub limits: ledger::NodeLimits,
    /// Freeze the sandboxes after this long without a server's request (`fence.rs`); None never.
    pub fence_after: Option<std::time::Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Locked(#[from] crate::state_lock::StateLockError),
    #[error("the runtime cannot start here: {0}")]
    Runtime(#[from] warren_runtime::ConfigError),
    #[error("shared directory {path}: {reason}")]
    SharedDir { path: PathBuf, reason: String },
    #[error("listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the node API: {0}")]
    Serve(#[source] std::io::Error),
    #[error("TLS for the node API: {0}")]
    Tls(String),
}

/// What the handlers share.
struct Node {
    runtime: Arc<dyn Runtime>,
    token: String,
    shared_dirs: Vec<PathBuf>,
    hello: Hello,
    ledger: ledger::Ledger,
    fence: Arc<fence::Fence>,
}

/// The node API over `runtime`, whose sandboxes live in `gateway/prefix`.
pub fn router(
    runtime: Arc<dyn Runtime>,
    token: String,
    shared_dirs: Vec<PathBuf>,
    (gateway, prefix): (std::net::Ipv4Addr, u8),
    ledger: ledger::Ledger,
    fence: Arc<fence::Fence>,
) -> Router {
    let hello = Hello {
        version: env!("CARGO_PKG_VERSION").to_string(),
        capabilities: runtime.capabilities(),
        network_rules_replaced: runtime.network_rules_replaced(),
        shared_dirs: shared_dirs.clone(),
        sandbox_gateway: gateway,
        sandbox_prefix: prefix,
        load: ledger.load(),
        fenced: Vec::new(),
        warm_layers: Vec::new(),
    };
    Router::new()
        .route(wire::HELLO_PATH, get(hello_handler))
        .route(wire::CALL_PATH, post(call_handler))
        .route(wire::DRAIN_PATH, axum::routing::put(drain_handler))
        .with_state(Arc::new(Node {
            runtime,
            token,
            shared_dirs,
            hello,
            ledger,
            fence,
        }))
}

/// Runs `warren node` until SIGINT or SIGTERM: the runtime on this machine, its API on
/// `config.listen`. Sandboxes keep running when it stops; the next start adopts them.
pub async fn serve(config: NodeConfig) -> Result<(), NodeError> {
    let shared_dirs = checked_shared_dirs(&config.shared_dirs)?;
    let _lock = crate::state_lock::StateLock::acquire(&config.runtime.state_dir)?;
    let runtime: Arc<dyn Runtime> = Arc::new(LinuxRuntime::new(config.runtime.clone())?);
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| NodeError::Listen {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(NodeError::Serve)?;
    let tls = match &config.tls {
        Some(source) => Some(
            crate::tls::acceptor(source, &config.runtime.state_dir, "warren-node", &[addr])
                .map_err(|error| NodeError::Tls(error_chain(&error)))?,
        ),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(%addr, shared = ?shared_dirs, tls = tls.is_some(), "warren node started");
    if let Some(crate::tls::TlsSource::LocalCa) = &config.tls {
        let ca = crate::tls::ensure_local_ca(&config.runtime.state_dir)
            .map_err(|error| NodeError::Tls(error_chain(&error)))?;
        println!(
            "node CA certificate (the server's --node-ca-file): {}",
            ca.cert.display()
        );
    }
    // The address line is what scripts wait for.
    println!("warren node listening on {scheme}://{addr}");
    let network = (config.runtime.gateway, config.runtime.subnet_prefix);
    let ledger = ledger::Ledger::open(&config.runtime.state_dir, config.limits, addr.to_string());
    let fence = Arc::new(fence::Fence::default());
    if let Some(after) = config.fence_after {
        fence::watch(Arc::clone(&fence), Arc::clone(&runtime), after);
    }
    let service = hyper_util::service::TowerToHyperService::new(router(
        runtime,
        config.token,
        shared_dirs,
        network,
        ledger,
        fence,
    ));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn(crate::listener::serve(
        listener,
        tls,
        move |request| {
            let response = hyper::service::Service::call(&service, request);
            async move {
                match response.await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            }
        },
        stopped,
        Some(NODE_DRAIN_TIMEOUT),
        "node",
    ));
    crate::wait_for_signal().await;
    let _ = stop.send(true);
    let _ = serving.await;
    tracing::info!("warren node stopped");
    Ok(())
}

/// The shared directories as the node will compare paths with them: absolute, existing, resolved.
fn checked_shared_dirs(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, NodeError> {
    if dirs.is_empty() {
        return Err(NodeError::SharedDir {
            path: PathBuf::new(),
            reason: "give at least one (--shared-dir, the server's state directory)".into(),
        });
    }
    dirs.iter()
        .map(|dir| {
            let refuse = |reason: String| NodeError::SharedDir {
                path: dir.clone(),
                reason,
            };
            if !dir.is_absolute() {
                return Err(refuse("not an absolute path".into()));
            }
            let resolved = dir.canonicalize().map_err(|e| refuse(e.to_string()))?;
            if resolved == Path::new("/") {
                return Err(refuse("sharing / would let a call name any file".into()));
            }
            Ok(resolved)
        })
        .collect()
}

/// The token in `path`, made (a random 256-bit token in hex, mode 0600) when the file is missing.
pub fn ensure_token(path: &Path) -> std::io::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut file) => {
            let bytes: [u8; 32] = rand::random();
            let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            file.write_all(format!("{token}\n").as_bytes())?;
            file.sync_all()?;
            Ok(token)
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => read_token(path),
        Err(error) => Err(error),
    }
}

/// The token in `path` (surrounding white space ignored); an empty file is an error.
pub fn read_token(path: &Path) -> std::io::Result<String> {
    let token = std::fs::read_to_string(path)?.trim().to_string();
    if token.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the token file is empty",
        ));
    }
    Ok(token)
}

/// Whether a call may `access` `path`: absolute, no `..`, and inside a shared directory
/// (reading may name a shared directory itself, as a template's root filesystem; writing only
/// what is below one). The paths are compared as written: the shared directories are resolved once
/// at start, and a path a server sends is one it made under them.
fn is_shared(path: &Path, access: wire::Access, shared: &[PathBuf]) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && shared
            .iter()
            .any(|dir| path.starts_with(dir) && (access == wire::Access::Read || path != dir))
}

fn authorized(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|given| {
            warren_proto::envd::signature::constant_time_eq(given.as_bytes(), token.as_bytes())
        })
}

fn refused(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "message": message }))).into_response()
}

async fn hello_handler(State(node): State<Arc<Node>>, headers: HeaderMap) -> Response {
    if !authorized(&headers, &node.token) {
        return refused(
            StatusCode::UNAUTHORIZED,
            "a valid node token is required".into(),
        );
    }
    node.fence.heard();
    Json(Hello {
        load: node.ledger.load(),
        fenced: node.fence.held(),
        warm_layers: node.ledger.warm_layers(),
        ..node.hello.clone()
    })
    .into_response()
}

#[derive(serde::Deserialize)]
struct Drain {
    draining: bool,
}

async fn drain_handler(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    if !authorized(&headers, &node.token) {
        return refused(
            StatusCode::UNAUTHORIZED,
            "a valid node token is required".into(),
        );
    }
    node.fence.heard();
    let drain: Drain = match serde_json::from_str(&body) {
        Ok(drain) => drain,
        Err(error) => {
            return refused(
                StatusCode::BAD_REQUEST,
                format!("expected {{\"draining\": true|false}}: {error}"),
            )
        }
    };
    match node.ledger.set_draining(drain.draining) {
        Ok(()) => {
            tracing::info!(draining = drain.draining, "node drain set");
            Json(node.ledger.load()).into_response()
        }
        Err(error) => refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot record the drain: {error}"),
        ),
    }
}

async fn call_handler(State(node): State<Arc<Node>>, headers: HeaderMap, body: String) -> Response {
    if !authorized(&headers, &node.token) {
        return refused(
            StatusCode::UNAUTHORIZED,
            "a valid node token is required".into(),
        );
    }
    node.fence.heard();
    let call: Call = match serde_json::from_str(&body) {
        Ok(call) => call,
        Err(error) => {
            return refused(
                StatusCode::BAD_REQUEST,
                format!("not a runtime call: {error}"),
            )
        }
    };
    if let Some((outside, _)) = call
        .paths()
        .into_iter()
        .find(|(path, access)| !is_shared(path, *access, &node.shared_dirs))
    {
        let error = RuntimeError::InvalidSpec(format!(
            "{} is not inside a directory this node shares with its server ({})",
            outside.display(),
            node.shared_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        return Json(Answer::Error(WireError::from(&error))).into_response();
    }
    // A start holds its resources in the node's ledger first: past a limit, it is refused here.
    let starting = match &call {
        Call::Create { spec } | Call::Restore { spec, .. } | Call::BootFromDisk { spec, .. } => {
            if let Err(error) = node.ledger.reserve(spec) {
                return Json(Answer::Error(WireError::from(&error))).into_response();
            }
            Some(spec.id.clone())
        }
        _ => None,
    };
    // Destroyed, or checkpointed and ended (a pause, a migration's first half): it holds nothing.
    let destroyed = match &call {
        Call::Destroy { id }
        | Call::Checkpoint {
            id,
            leave_running: false,
            ..
        }
        | Call::CheckpointDisk {
            id,
            leave_running: false,
            ..
        } => Some(id.clone()),
        _ => None,
    };
    let listing = matches!(call, Call::List | Call::Recover);
    let thawed = match &call {
        Call::Thaw { id } => Some(id.clone()),
        _ => None,
    };
    let runtime = Arc::clone(&node.runtime);
    let answer = tokio::task::spawn_blocking(move || call.run(runtime.as_ref()))
        .await
        .unwrap_or_else(|join| {
            Err(RuntimeError::failed(format!(
                "runtime call panicked: {join}"
            )))
        });
    match (&answer, starting, &destroyed) {
        (Err(_), Some(id), _) => node.ledger.release(&id),
        (Ok(_), _, Some(id)) => {
            node.ledger.release(id);
            node.fence.release(id);
        }
        _ => {}
    }
    if let (Ok(_), Some(id)) = (&answer, thawed) {
        node.fence.release(&id);
    }
    if let (Ok(value), true) = (&answer, listing) {
        if let Ok(sandboxes) = serde_json::from_value::<Vec<warren_runtime::Sandbox>>(value.clone())
        {
            node.ledger.retain(sandboxes.iter().map(|s| s.id.as_str()));
        }
    }
    match answer {
        Ok(value) => Json(Answer::Ok(value)).into_response(),
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), "runtime call failed");
            Json(Answer::Error(WireError::from(&error))).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_inside_a_shared_directory_pass() {
        use wire::Access::{Read, Write};
        let shared = vec![PathBuf::from("/srv/warren")];
        for access in [Read, Write] {
            assert!(is_shared(
                Path::new("/srv/warren/snapshots/a"),
                access,
                &shared
            ));
        }
        assert!(is_shared(Path::new("/srv/warren"), Read, &shared));
        assert!(!is_shared(Path::new("/srv/warren"), Write, &shared));
        for path in [
            "/srv/warren/../etc/shadow",
            "/srv/warrenx/a",
            "srv/warren/a",
            "/etc/passwd",
        ] {
            assert!(!is_shared(Path::new(path), Read, &shared), "{path}");
        }
    }

    #[test]
    fn the_token_is_required_and_compared_whole() {
        let mut headers = HeaderMap::new();
        assert!(!authorized(&headers, "secret"));
        headers.insert(header::AUTHORIZATION, "Bearer secre".parse().unwrap());
        assert!(!authorized(&headers, "secret"));
        headers.insert(header::AUTHORIZATION, "secret".parse().unwrap());
        assert!(!authorized(&headers, "secret"));
        headers.insert(header::AUTHORIZATION, "Bearer secret".parse().unwrap());
        assert!(authorized(&headers, "secret"));
    }

    #[test]
    fn a_token_file_is_made_once_private_and_then_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.token");
        let made = ensure_token(&path).unwrap();
        assert_eq!(made.len(), 64);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(ensure_token(&path).unwrap(), made);
        assert_eq!(read_token(&path).unwrap(), made);
        std::fs::write(&path, "\n").unwrap();
        assert!(read_token(&path).is_err());
    }

    #[test]
    fn shared_directories_must_be_absolute_existing_and_not_the_root() {
        assert!(checked_shared_dirs(&[]).is_err());
        assert!(checked_shared_dirs(&[PathBuf::from("relative")]).is_err());
        assert!(checked_shared_dirs(&[PathBuf::from("/")]).is_err());
        assert!(checked_shared_dirs(&[PathBuf::from("/nonexistent-warren-dir")]).is_err());
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            checked_shared_dirs(&[dir.path().to_path_buf()]).unwrap(),
            vec![dir.path().canonicalize().unwrap()]
        );
    }
}
