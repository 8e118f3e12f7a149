//! A [`Runtime`] whose sandboxes run on a `warren node` (see the module above): each method is one
//! HTTP call, made from the blocking threads the server already runs runtime calls on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use warren_runtime::{
    Capabilities, CheckpointInfo, HostCapacity, NetworkSpec, ProcessInfo, Runtime, RuntimeError,
    Sandbox, SandboxSpec, Stats,
};

use super::wire::{self, Call, Hello};
use super::Answer;

/// How long a call may take before the server gives up on the node: a checkpoint of a large
/// sandbox or a create of a large template takes minutes at worst.
const CALL_TIMEOUT: Duration = Duration::from_secs(15 * 60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a server finds its node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTarget {
    /// `http://host:port` or `https://host:port` of the node's API.
    pub url: String,
    pub token: String,
    /// CA certificates (PEM) an `https://` node's certificate must chain to; None: the public
    /// web's roots.
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("node {url}: the CA file {path}: {reason}")]
    Ca {
        url: String,
        path: PathBuf,
        reason: String,
    },
    #[error("node {url}: a CA file is for https:// nodes; this one is plain http")]
    CaWithoutTls { url: String },
    #[error("node {url} is not reachable: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("node {url} refused the token (check --node-token-file against the node's)")]
    Unauthorized { url: String },
    #[error("node {url} runs warren {theirs}; this server is {ours}: run one version on both")]
    Version {
        url: String,
        theirs: String,
        ours: String,
    },
    #[error(
        "node {url} does not share {path} (it shares {shared}); start it with --shared-dir {path}"
    )]
    NotShared {
        url: String,
        path: PathBuf,
        shared: String,
    },
}

/// TLS to a node whose certificate chains to a CA in `path`.
fn client_tls(path: &Path) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in crate::tls::read_chain(path).map_err(|e| warren_runtime::error_chain(&e))? {
        roots.add(certificate).map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

/// The cause of a call that did not get an answer from its node.
#[derive(Debug, thiserror::Error)]
#[error("the node did not answer")]
pub struct Unreachable {
    /// The connection was never made: the node did not get the call.
    pub never_sent: bool,
}

impl Unreachable {
    /// Whether `error` is a call its node never got.
    pub fn never_sent(error: &RuntimeError) -> bool {
        std::error::Error::source(error)
            .and_then(|source| source.downcast_ref::<Unreachable>())
            .is_some_and(|unreachable| unreachable.never_sent)
    }

    /// Whether a node could not be reached (or stopped answering) anywhere in `error`'s chain:
    /// nothing is known to have changed on it.
    pub fn anywhere(error: &(dyn std::error::Error + 'static)) -> bool {
        let mut cause = Some(error);
        while let Some(error) = cause {
            if error.downcast_ref::<Unreachable>().is_some() {
                return true;
            }
            cause = error.source();
        }
        false
    }
}

/// The runtime of one remote node.
pub struct RemoteRuntime {
    url: String,
    call_url: String,
    authorization: String,
    agent: ureq::Agent,
    hello: Hello,
}

impl RemoteRuntime {
    /// Connects to the node at `target`: checks the token and the version, and that the node
    /// shares every directory in `needs_shared` (the server's state and template sources), so a
    /// misconfiguration is found at start and not at the first create.
    pub fn connect(target: &NodeTarget, needs_shared: &[&Path]) -> Result<Self, ConnectError> {
        let url = target.url.trim_end_matches('/').to_string();
        let mut builder = ureq::AgentBuilder::new()
            .timeout_connect(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT);
        if let Some(path) = &target.ca_file {
            if !url.starts_with("https://") {
                return Err(ConnectError::CaWithoutTls { url });
            }
            builder = builder.tls_config(client_tls(path).map_err(|reason| ConnectError::Ca {
                url: url.clone(),
                path: path.clone(),
                reason,
            })?);
        }
        let agent = builder.build();
        let authorization = format!("Bearer {}", target.token);
        let hello: Hello = match agent
            .get(&format!("{url}{}", wire::HELLO_PATH))
            .set("Authorization", &authorization)
            .call()
        {
            Ok(response) => response
                .into_string()
                .map_err(|e| e.to_string())
                .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
                .map_err(|reason| ConnectError::Unreachable {
                    url: url.clone(),
                    reason: format!("not a warren node's answer: {reason}"),
                })?,
            Err(ureq::Error::Status(401, _)) => return Err(ConnectError::Unauthorized { url }),
            Err(error) => {
                return Err(ConnectError::Unreachable {
                    url,
                    reason: error.to_string(),
                });
            }
        };
        let ours = env!("CARGO_PKG_VERSION");
        if hello.version != ours {
            return Err(ConnectError::Version {
                url,
                theirs: hello.version,
                ours: ours.to_string(),
            });
        }
        for path in needs_shared {
            if !hello.shared_dirs.iter().any(|dir| path.starts_with(dir)) {
                return Err(ConnectError::NotShared {
                    url,
                    path: path.to_path_buf(),
                    shared: hello
                        .shared_dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        Ok(Self {
            call_url: format!("{url}{}", wire::CALL_PATH),
            url,
            authorization,
            agent,
            hello,
        })
    }

    /// What the node said of itself when the server connected.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Makes this machine route the node's sandbox subnet through the node, when the node is
    /// another machine named by an IPv4 address in its URL; a node on this machine (loopback) or
    /// named by a host name needs no route here, or one the operator sets up. Returns the route
    /// made, if any.
    pub fn route_to_sandboxes(&self) -> Result<Option<String>, String> {
        let Some(host) = url::Url::parse(&self.url)
            .ok()
            .and_then(|url| url.host_str().map(str::to_string))
            .and_then(|host| host.parse::<std::net::Ipv4Addr>().ok())
        else {
            return Ok(None);
        };
        if host.is_loopback() {
            return Ok(None);
        }
        let prefix = self.hello.sandbox_prefix;
        let network = warren_runtime::network::network_address(self.hello.sandbox_gateway, prefix);
        warren_runtime::network::route_via(network, prefix, host)
            .map(|()| Some(format!("{network}/{prefix} via {host}")))
            .map_err(|error| {
                format!(
                    "cannot route {network}/{prefix} (node {}'s sandboxes) via {host}: {}",
                    self.url,
                    warren_runtime::error_chain(&error)
                )
            })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// `HOST:PORT` of the node's URL: its name in the API and the CLI.
    pub fn id(&self) -> &str {
        self.url
            .split_once("://")
            .map_or(self.url.as_str(), |(_, rest)| rest)
    }

    /// Keeps new sandboxes off the node, for every server (the node keeps the mark), or lets
    /// them on again; the node's load as it answers.
    pub fn set_draining(&self, draining: bool) -> Result<wire::NodeLoad, RuntimeError> {
        let failed = |reason: String| RuntimeError::Internal {
            context: format!("node {}: drain: {reason}", self.url),
            source: None,
        };
        let text = self
            .agent
            .put(&format!("{}{}", self.url, wire::DRAIN_PATH))
            .set("Authorization", &self.authorization)
            .set("Content-Type", "application/json")
            .send_string(&serde_json::json!({ "draining": draining }).to_string())
            .map_err(|error| failed(error.to_string()))?
            .into_string()
            .map_err(|error| failed(error.to_string()))?;
        serde_json::from_str(&text).map_err(|error| failed(error.to_string()))
    }

    /// The node's load and the sandboxes its fence froze, if it answers its hello within
    /// `timeout` (a heartbeat); None when it does not.
    pub fn answers(&self, timeout: Duration) -> Option<wire::Seen> {
        let response = self
            .agent
            .get(&format!("{}{}", self.url, wire::HELLO_PATH))
            .set("Authorization", &self.authorization)
            .timeout(timeout)
            .call()
            .ok()?;
        // It answered; a hello that does not parse still means it is there.
        Some(
            response
                .into_string()
                .ok()
                .and_then(|text| serde_json::from_str::<Hello>(&text).ok())
                .map_or_else(
                    || wire::Seen::from(&self.hello),
                    |hello| wire::Seen::from(&hello),
                ),
        )
    }

    fn call<T: DeserializeOwned>(&self, call: Call) -> Result<T, RuntimeError> {
        let unreachable = |reason: String| RuntimeError::Internal {
            context: format!("node {}: {reason}", self.url),
            source: None,
        };
        let body = serde_json::to_string(&call)
            .map_err(|error| RuntimeError::internal("encode a runtime call", error))?;
        let text = match self
            .agent
            .post(&self.call_url)
            .set("Authorization", &self.authorization)
            .set("Content-Type", "application/json")
            .send_string(&body)
        {
            Ok(response) => response
                .into_string()
                .map_err(|e| unreachable(format!("reading its answer: {e}")))?,
            Err(ureq::Error::Status(status, response)) => {
                let said = response.into_string().unwrap_or_default();
                return Err(unreachable(format!("answered {status}: {said}")));
            }
            Err(error) => {
                // Refused or unresolvable: the node never saw the call, so another node may take
                // it. Anything later (a timeout, a cut connection) may have reached it.
                let never_sent = matches!(
                    error.kind(),
                    ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns
                );
                return Err(RuntimeError::Internal {
                    context: format!("node {}: {error}", self.url),
                    source: Some(Box::new(Unreachable { never_sent })),
                });
            }
        };
        match serde_json::from_str::<Answer>(&text)
            .map_err(|e| unreachable(format!("not a runtime answer: {e}")))?
        {
            Answer::Ok(value) => serde_json::from_value(value)
                .map_err(|e| unreachable(format!("an answer of the wrong shape: {e}"))),
            Answer::Error(error) => Err(error.into()),
        }
    }

    /// Volumes are the server's own mounts, which a node elsewhere does not have.
    fn refuse_volumes(spec: &SandboxSpec) -> Result<(), RuntimeError> {
        if spec.volumes.is_empty() {
            Ok(())
        } else {
            Err(RuntimeError::Unsupported(
                "volumes on a sandbox that runs on a remote node (warren up --node)".into(),
            ))
        }
    }
}

impl Runtime for RemoteRuntime {
    fn capabilities(&self) -> Capabilities {
        self.hello.capabilities.clone()
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        Self::refuse_volumes(spec)?;
        self.call(Call::Create { spec: spec.clone() })
    }

    fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
        self.call(Call::Destroy { id: id.into() })
    }

    fn freeze(&self, id: &str) -> Result<(), RuntimeError> {
        self.call(Call::Freeze { id: id.into() })
    }

    fn thaw(&self, id: &str) -> Result<(), RuntimeError> {
        self.call(Call::Thaw { id: id.into() })
    }

    fn stats(&self, id: &str) -> Result<Stats, RuntimeError> {
        self.call(Call::Stats { id: id.into() })
    }

    fn processes(&self, id: &str) -> Result<Vec<ProcessInfo>, RuntimeError> {
        self.call(Call::Processes { id: id.into() })
    }

    fn kill_process(&self, id: &str, pid: u32, signal: i32) -> Result<(), RuntimeError> {
        self.call(Call::KillProcess {
            id: id.into(),
            pid,
            signal,
        })
    }

    fn largest_files(
        &self,
        id: &str,
        count: usize,
    ) -> Result<Vec<warren_runtime::rootfs::disk_usage::LargeFile>, RuntimeError> {
        self.call(Call::LargestFiles {
            id: id.into(),
            count,
        })
    }

    fn set_network(&self, id: &str, network: &NetworkSpec) -> Result<(), RuntimeError> {
        self.call(Call::SetNetwork {
            id: id.into(),
            network: network.clone(),
        })
    }

    fn egress_trust_anchor(&self, id: &str) -> Option<String> {
        match self.call(Call::EgressTrustAnchor { id: id.into() }) {
            Ok(anchor) => anchor,
            Err(error) => {
                tracing::warn!(%error, "cannot read the node's egress CA");
                None
            }
        }
    }

    fn check_network(&self, network: &NetworkSpec) -> Result<(), RuntimeError> {
        self.call(Call::CheckNetwork {
            network: network.clone(),
        })
    }

    fn list(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        self.call(Call::List)
    }

    fn recover(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        self.call(Call::Recover)
    }

    fn checkpoint(
        &self,
        id: &str,
        dest: &Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        self.call(Call::Checkpoint {
            id: id.into(),
            dest: dest.into(),
            leave_running,
        })
    }

    fn checkpoint_disk(
        &self,
        id: &str,
        dest: &Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        self.call(Call::CheckpointDisk {
            id: id.into(),
            dest: dest.into(),
            leave_running,
        })
    }

    fn boot_from_disk(
        &self,
        checkpoint: &Path,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, RuntimeError> {
        Self::refuse_volumes(spec)?;
        self.call(Call::BootFromDisk {
            checkpoint: checkpoint.into(),
            spec: spec.clone(),
        })
    }

    fn commit_layer(&self, id: &str, dest: &Path) -> Result<u64, RuntimeError> {
        self.call(Call::CommitLayer {
            id: id.into(),
            dest: dest.into(),
        })
    }

    fn host_capacity(&self) -> Result<HostCapacity, RuntimeError> {
        self.call(Call::HostCapacity)
    }

    fn restore(&self, checkpoint: &Path, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        Self::refuse_volumes(spec)?;
        self.call(Call::Restore {
            checkpoint: checkpoint.into(),
            spec: spec.clone(),
        })
    }

    fn forget_checkpoint(&self, checkpoint: &Path) {
        if let Err(error) = self.call::<()>(Call::ForgetCheckpoint {
            checkpoint: checkpoint.into(),
        }) {
            tracing::warn!(%error, checkpoint = %checkpoint.display(), "the node could not drop a checkpoint's caches");
        }
    }

    fn network_rules_replaced(&self) -> bool {
        self.hello.network_rules_replaced
    }

    fn memory_settled(&self, id: &str) -> Result<(), RuntimeError> {
        self.call(Call::MemorySettled { id: id.into() })
    }

    fn renew(&self, id: &str, until_unix_ms: u64) -> Result<(), RuntimeError> {
        self.call(Call::Renew {
            id: id.into(),
            until_unix_ms,
        })
    }
}
