//! The egress proxy: how host-name rules (`network.allowOut: ["api.example.com", "*.example.com"]`)
//! are enforced on the host, never by trusting the guest.
//!
//! A sandbox whose rules name hosts gets elements in the nat chain `names`' sets (see
//! [`super::firewall`]): its TCP connections to ports 80 and 443 that its address rules would deny
//! are redirected here instead of being dropped. For each connection the
//! proxy
//! 1. finds the sandbox by the connection's source address (the bridge's port binding makes that
//!    address trustworthy) and takes its current rules; a source without rules gets nothing;
//! 2. reads the name the client asks for, without answering: the TLS ClientHello's SNI on port 443,
//!    the `Host` header on port 80 ([`super::requested_name`]);
//! 3. refuses a name no pattern allows;
//! 4. resolves the name itself, through the resolver Warren was configured with, and connects to
//!    the first address outside the always-denied ranges, on the port the sandbox asked for;
//! 5. passes on the bytes it read and then relays both ways.
//!
//! The guest's own choices never decide where a connection goes: the address it connected to is
//! ignored (so connecting to a neighbour's address while naming an allowed host reaches the allowed
//! host), a lie in SNI or `Host` reaches the host named in the lie only if that host is allowed, and
//! a guest with its own DNS server learns nothing that changes where the proxy connects. What the
//! proxy does not see: the rest of a kept-alive HTTP connection after its first request (it goes to
//! the same, allowed, server), and UDP (QUIC): those are covered by the address rules alone.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::TokioResolver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::egress::{Cidr, EgressRules};
use super::egress_ca::EgressCa;
use super::egress_intercept::{intercept, upstream_tls, Interception, Prefixed};
use super::egress_upstream::{dial, proxy_address, Io, Target, UpstreamProxy};
use super::requested_name::{self, Requested, MAX_HEAD};
use std::path::PathBuf;

/// How long a client has to send the name it asks for, and the proxy to reach the server.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum EgressProxyError {
    #[error("bind the egress proxy to {addr}")]
    Bind {
        addr: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error("start the egress proxy's thread")]
    Thread(#[source] io::Error),
    #[error("read the host's resolver configuration for the egress proxy")]
    Resolver(#[source] hickory_resolver::ResolveError),
    #[error("an egress proxy with other resolvers already listens on {0} in this process")]
    OtherSettings(SocketAddrV4),
    #[error("the egress proxy's CA")]
    Ca(#[source] super::egress_ca::EgressCaError),
    #[error("the egress proxy's TLS client settings: {0}")]
    UpstreamTls(String),
}

/// The proxies this process runs, by listening address: runtimes of one process (tests make many)
/// share one, since the kernel lets only one socket listen on an address.
static RUNNING: std::sync::Mutex<Vec<(EgressProxyConfig, Arc<Shared>)>> =
    std::sync::Mutex::new(Vec::new());

/// What the proxy needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct EgressProxyConfig {
    /// Where it listens: the bridge's gateway address (bound before the bridge exists, with
    /// `IP_FREEBIND`) and a port that only redirected connections reach.
    pub listen: SocketAddrV4,
    /// DNS servers it resolves allowed names with; empty: the host's `/etc/resolv.conf`.
    pub resolvers: Vec<SocketAddr>,
    /// Addresses it never connects to (the host ruleset's always-denied ranges).
    pub denied: Vec<Cidr>,
    /// Where the host's egress CA is kept ([`super::egress_ca`]).
    pub ca_dir: PathBuf,
    /// CA certificates (PEM files) trusted for the proxy's own HTTPS connections besides the host's
    /// trust store.
    pub upstream_ca: Vec<PathBuf>,
}

struct Shared {
    rules: RwLock<HashMap<Ipv4Addr, EgressRules>>,
    resolvers: Vec<SocketAddr>,
    denied: Vec<Cidr>,
    ca: EgressCa,
    upstream_tls: Arc<rustls::ClientConfig>,
}

/// A running proxy (one per runtime, on a thread of its own); dropping the handle leaves it running
/// until the process ends.
pub struct EgressProxy {
    listen: SocketAddrV4,
    shared: Arc<Shared>,
}

impl EgressProxy {
    /// Starts the proxy for `config.listen`, or hands out the one this process runs there already
    /// (which keeps the always-denied list it started with).
    pub fn start(config: EgressProxyConfig) -> Result<EgressProxy, EgressProxyError> {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((existing, shared)) = running.iter().find(|(c, _)| c.listen == config.listen) {
            if existing.resolvers != config.resolvers || existing.upstream_ca != config.upstream_ca
            {
                return Err(EgressProxyError::OtherSettings(config.listen));
            }
            return Ok(EgressProxy {
                listen: config.listen,
                shared: Arc::clone(shared),
            });
        }
        let listener = bind(config.listen).map_err(|source| EgressProxyError::Bind {
            addr: config.listen,
            source,
        })?;
        let resolver = resolver(&config.resolvers)?;
        let shared = Arc::new(Shared {
            rules: RwLock::new(HashMap::new()),
            resolvers: config.resolvers.clone(),
            denied: config.denied.clone(),
            ca: EgressCa::load_or_create(&config.ca_dir).map_err(EgressProxyError::Ca)?,
            upstream_tls: Arc::new(
                upstream_tls(&config.upstream_ca).map_err(EgressProxyError::UpstreamTls)?,
            ),
        });
        let serving = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("egress-proxy".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::error!(%error, "egress proxy: no tokio runtime");
                        return;
                    }
                };
                runtime.block_on(serve(listener, resolver, serving));
            })
            .map_err(EgressProxyError::Thread)?;
        running.push((config.clone(), Arc::clone(&shared)));
        Ok(EgressProxy {
            listen: config.listen,
            shared,
        })
    }

    pub fn listen(&self) -> SocketAddrV4 {
        self.listen
    }

    /// The CA certificate (PEM) a sandbox with header rules must trust.
    pub fn ca_pem(&self) -> &str {
        self.shared.ca.cert_pem()
    }

    /// Installs (or, for rules without host names, removes) the rules of the sandbox at `ip`.
    pub fn set_rules(&self, ip: Ipv4Addr, rules: &EgressRules) {
        let Ok(mut map) = self.shared.rules.write() else {
            return;
        };
        if !rules.needs_proxy() {
            map.remove(&ip);
        } else {
            map.insert(ip, rules.clone());
        }
    }

    /// Checks a sandbox's SOCKS5 proxy before its rules are installed: its settings, and that its
    /// address resolves (with the proxy's resolvers) to somewhere sandboxes may reach. Each dial
    /// resolves it again.
    pub fn check_upstream(&self, upstream: &UpstreamProxy) -> Result<(), String> {
        upstream.validate()?;
        let upstream = upstream.clone();
        let resolvers = self.shared.resolvers.clone();
        let denied = self.shared.denied.clone();
        // A thread of its own: the caller may be inside another tokio runtime.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("check the egress proxy: {e}"))?;
            runtime.block_on(async {
                let resolver = resolver(&resolvers).map_err(|e| e.to_string())?;
                tokio::time::timeout(
                    HANDSHAKE_TIMEOUT,
                    proxy_address(&upstream, &resolver, &denied),
                )
                .await
                .map_err(|_| {
                    format!(
                        "the egress proxy's name {} did not resolve in time",
                        upstream.host
                    )
                })?
                .map(|_| ())
            })
        })
        .join()
        .unwrap_or_else(|_| Err("checking the egress proxy failed".into()))
        .map_err(|e| format!("network.egressProxy: {e}"))
    }

    pub fn remove(&self, ip: Ipv4Addr) {
        if let Ok(mut map) = self.shared.rules.write() {
            map.remove(&ip);
        }
    }
}

fn bind(addr: SocketAddrV4) -> io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    // The gateway address appears when the first sandbox creates the bridge.
    socket.set_freebind_v4(true)?;
    socket.bind(&SocketAddr::V4(addr).into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    socket.set_cloexec(true)?;
    Ok(socket.into())
}

fn resolver(servers: &[SocketAddr]) -> Result<TokioResolver, EgressProxyError> {
    let mut options = ResolverOpts::default();
    options.timeout = Duration::from_secs(3);
    options.attempts = 2;
    if servers.is_empty() {
        return Ok(TokioResolver::builder_tokio()
            .map_err(EgressProxyError::Resolver)?
            .with_options(options)
            .build());
    }
    let mut group = NameServerConfigGroup::new();
    for server in servers {
        group.merge(NameServerConfigGroup::from_ips_clear(
            &[server.ip()],
            server.port(),
            true,
        ));
    }
    Ok(TokioResolver::builder_with_config(
        ResolverConfig::from_parts(None, vec![], group),
        TokioConnectionProvider::default(),
    )
    .with_options(options)
    .build())
}

async fn serve(listener: std::net::TcpListener, resolver: TokioResolver, shared: Arc<Shared>) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "egress proxy: cannot listen");
            return;
        }
    };
    let resolver = Arc::new(resolver);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "egress proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        let resolver = Arc::clone(&resolver);
        tokio::spawn(async move {
            if let Err(refusal) = relay(stream, peer, &resolver, &shared).await {
                tracing::info!(sandbox = %peer.ip(), name = refusal.name.as_deref().unwrap_or("-"),
                    reason = %refusal.reason, "egress proxy refused a connection");
            }
        });
    }
}

/// Why a connection was not relayed.
struct Refusal {
    name: Option<String>,
    reason: String,
}

fn refuse(name: Option<&str>, reason: impl Into<String>) -> Refusal {
    Refusal {
        name: name.map(str::to_string),
        reason: reason.into(),
    }
}

async fn relay(
    mut client: TcpStream,
    peer: SocketAddr,
    resolver: &TokioResolver,
    shared: &Shared,
) -> Result<(), Refusal> {
    let IpAddr::V4(source) = peer.ip() else {
        return Err(refuse(None, "not an IPv4 client"));
    };
    let rules = shared
        .rules
        .read()
        .ok()
        .and_then(|map| map.get(&source).cloned())
        .ok_or_else(|| refuse(None, "no egress rules for this source"))?;
    let original = original_destination(&client)
        .map_err(|e| refuse(None, format!("original destination: {e}")))?;
    let port = original.port();
    let allowed_address = |ip: Ipv4Addr| {
        rules.allows_address(ip) && !shared.denied.iter().any(|cidr| cidr.contains(ip))
    };
    let names_matter = !rules.allow_hosts.is_empty() || !rules.header_rules.is_empty();
    if !(names_matter && matches!(port, 80 | 443)) {
        // Only a sandbox with its own SOCKS5 proxy has such connections sent here: all its TCP.
        if rules.upstream.is_none() {
            return Err(refuse(None, format!("port {port} is not proxied")));
        }
        if !allowed_address(*original.ip()) {
            return Err(refuse(
                None,
                format!("{original} is not allowed by the sandbox's rules"),
            ));
        }
        let target = Target::Address(original);
        let mut server = open_server(&rules, &target, resolver, shared)
            .await
            .map_err(|reason| refuse(None, reason))?;
        tracing::debug!(sandbox = %source, %target, "egress proxy tunneling");
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        return Ok(());
    }
    let tls = port == 443;
    let (name, head) =
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_name(&mut client, tls)).await {
            Ok(Ok(found)) => found,
            Ok(Err(reason)) => return Err(refuse(None, reason)),
            Err(_) => return Err(refuse(None, "no name within the handshake timeout")),
        };
    let by_name = rules.allows_host(&name);
    let headers = rules.headers_for(&name).map(<[(String, String)]>::to_vec);
    // Where the connection goes: to the name whenever the name matters (it is allowed by name, or
    // its requests get headers: a secret never goes to an address the guest chose), which the
    // proxy resolves itself or, with the sandbox's SOCKS5 proxy, leaves to that proxy; otherwise
    // the address the guest connected to, which its address rules must allow.
    let resolve_here = |name: String| async move {
        tokio::time::timeout(HANDSHAKE_TIMEOUT, resolve(resolver, &name, &shared.denied))
            .await
            .map_err(|_| refuse(Some(&name), "resolving timed out"))?
            .map_err(|reason| refuse(Some(&name), reason))
    };
    let (target, by_address) = if by_name || headers.is_some() {
        if rules.upstream.is_some() {
            // A name with header rules only (not allowed by name) still needs its address allowed,
            // which only matters when something is denied.
            let by_address = by_name
                || rules.deny.is_empty()
                || allowed_address(resolve_here(name.clone()).await?);
            (Target::Name(name.clone(), port), by_address)
        } else {
            let ip = resolve_here(name.clone()).await?;
            (
                Target::Address(SocketAddrV4::new(ip, port)),
                allowed_address(ip),
            )
        }
    } else {
        (Target::Address(original), allowed_address(*original.ip()))
    };
    if !by_name && !by_address {
        if !tls {
            let _ = client
                .write_all(
                    format!(
                        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n\
                         {name} is not allowed by this sandbox's network.allowOut\n"
                    )
                    .as_bytes(),
                )
                .await;
        }
        return Err(refuse(Some(&name), "not in allowOut"));
    }
    let mut server = open_server(&rules, &target, resolver, shared)
        .await
        .map_err(|reason| refuse(Some(&name), reason))?;
    if let Some(headers) = headers {
        let tls = if tls {
            let server = shared
                .ca
                .server_config(&name)
                .map_err(|e| refuse(Some(&name), e.to_string()))?;
            Some((server, Arc::clone(&shared.upstream_tls)))
        } else {
            None
        };
        tracing::debug!(sandbox = %source, %name, %target, "egress proxy adding headers");
        return intercept(
            Prefixed::new(head, client),
            Interception {
                name: name.clone(),
                server,
                headers,
                tls,
            },
        )
        .await
        .map_err(|reason| refuse(Some(&name), reason));
    }
    server
        .write_all(&head)
        .await
        .map_err(|e| refuse(Some(&name), format!("send to {target}: {e}")))?;
    tracing::debug!(sandbox = %source, %name, %target, "egress proxy relaying");
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    Ok(())
}

/// A connection towards `target`: through the sandbox's SOCKS5 proxy when it has one, else direct
/// (to an address only: a name is resolved by the caller unless a SOCKS5 proxy takes it).
async fn open_server(
    rules: &EgressRules,
    target: &Target,
    resolver: &TokioResolver,
    shared: &Shared,
) -> Result<Box<dyn Io>, String> {
    match (&rules.upstream, target) {
        (Some(upstream), _) => {
            dial(
                upstream,
                resolver,
                &shared.denied,
                &shared.upstream_tls,
                target,
            )
            .await
        }
        (None, Target::Address(addr)) => {
            let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
                .await
                .map_err(|_| format!("connect to {addr} timed out"))?
                .map_err(|e| format!("connect to {addr}: {e}"))?;
            Ok(Box::new(stream))
        }
        (None, Target::Name(..)) => Err("a name target needs a SOCKS5 proxy".into()),
    }
}

/// Reads from `client` until the name it asks for is known; the name and every byte read.
async fn read_name(client: &mut TcpStream, tls: bool) -> Result<(String, Vec<u8>), String> {
    let mut head = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("the client closed before naming a host".into());
        }
        head.extend_from_slice(&chunk[..n]);
        let found = if tls {
            requested_name::tls_server_name(&head)
        } else {
            requested_name::http_host(&head)
        };
        match found {
            Requested::Name(name) => return Ok((name, head)),
            Requested::Refused(reason) => return Err(reason.to_string()),
            Requested::Incomplete if head.len() >= MAX_HEAD => {
                return Err("no name in the first 16 KiB".into())
            }
            Requested::Incomplete => {}
        }
    }
}

/// The first IPv4 address of `name` outside `denied`.
async fn resolve(
    resolver: &TokioResolver,
    name: &str,
    denied: &[Cidr],
) -> Result<Ipv4Addr, String> {
    let lookup = resolver
        .ipv4_lookup(format!("{name}."))
        .await
        .map_err(|e| format!("resolve: {e}"))?;
    let addresses: Vec<Ipv4Addr> = lookup.iter().map(|a| a.0).collect();
    addresses
        .iter()
        .copied()
        .find(|ip| !denied.iter().any(|cidr| cidr.contains(*ip)))
        .ok_or_else(|| format!("every address of the name is always denied: {addresses:?}"))
}

/// The address and port the client connected to before nftables redirected it here.
fn original_destination(stream: &TcpStream) -> io::Result<SocketAddrV4> {
    let original = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::OriginalDst)
        .map_err(io::Error::from)?;
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(original.sin_addr.s_addr)),
        u16::from_be(original.sin_port),
    ))
}
