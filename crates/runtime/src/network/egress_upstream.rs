//! A sandbox's own SOCKS5 proxy (E2B's `network.egressProxy`, "bring your own proxy"): every TCP
//! connection the sandbox's rules let out is tunneled through it, from the host.
//!
//! The nat chain of such a sandbox sends all its TCP to the host's egress proxy
//! ([`super::egress_proxy`]), which applies the sandbox's address and name rules first and then, for
//! what is allowed, dials the sandbox's SOCKS5 proxy instead of the destination: over plain TCP or
//! TLS (verified, 1.2 or newer, never falling back), with RFC 1929 user/password when given, asking
//! it to CONNECT to the address the sandbox aimed at, or to the host name when the connection was let
//! out by name (then the proxy resolves it, as its operator's network sees it). Nothing runs inside
//! the sandbox, so code there can neither see the proxy's credentials nor route around it.
//!
//! It fails closed: a proxy that cannot be reached, refuses the login or the CONNECT, or does not
//! speak SOCKS5 leaves the sandbox's connection refused, never sent out directly. UDP (DNS, QUIC) is
//! not tunneled: it leaves by the address rules alone, as in E2B.
//!
//! The proxy's own address is a host name or IPv4 address with a port. A name is resolved again at
//! every dial (the address found is used for that connection only); an address in the host's
//! always-denied ranges (private, link-local, the host's own networks) is refused, at create and at
//! dial, so a sandbox cannot use the tunnel to reach the host's neighbourhood.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::egress::{is_host_name, Cidr};
use super::egress_intercept::client_config;

/// Longest SOCKS5 user name and password (RFC 1929: one length byte each).
pub const MAX_CREDENTIAL: usize = 255;
/// Longest `tls.caCert`, as in E2B.
pub const MAX_CA_CERT: usize = 8192;
/// How long reaching the proxy, the TLS handshake and the SOCKS5 exchange may take together.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how a sandbox's TCP is tunneled.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamProxy {
    /// The proxy's host (a name or an IPv4 address), lower-case.
    pub host: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// TLS to the proxy, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
}

/// TLS settings for the hop to the proxy.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamTls {
    /// The name the proxy's certificate is checked against and sent as SNI; the host of the address
    /// when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// PEM CA certificates that replace the host's trust store for this proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<String>,
}

// The password and the CA are never printed (logs, panics, `{:?}` of a sandbox spec).
impl fmt::Debug for UpstreamProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamProxy")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .field("ca_cert", &self.ca_cert.as_ref().map(|_| "[PEM]"))
            .finish()
    }
}

impl UpstreamProxy {
    /// `address` as E2B takes it: `host:port`, the host a name or an IPv4 address. Errors name
    /// `network.egressProxy.address`.
    pub fn parse_address(address: &str) -> Result<(String, u16), String> {
        let field = "network.egressProxy.address";
        let (host, port) = address
            .trim()
            .rsplit_once(':')
            .ok_or_else(|| format!("{field}: {address:?} is not host:port"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{field}: {address:?} has no valid port (1-65535)"))?;
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if host.parse::<Ipv4Addr>().is_err() && !is_host_name(&host) {
            return Err(format!(
                "{field}: {host:?} is not a host name or an IPv4 address (IPv6 is not supported)"
            ));
        }
        Ok((host, port))
    }

    /// `host:port`, as the API shows it.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Checks what can be checked without the network: credential lengths, the TLS name and CA.
    pub fn validate(&self) -> Result<(), String> {
        let field = "network.egressProxy";
        for (name, value) in [("username", &self.username), ("password", &self.password)] {
            if let Some(value) = value {
                if value.is_empty() || value.len() > MAX_CREDENTIAL {
                    return Err(format!(
                        "{field}.{name} must be 1 to {MAX_CREDENTIAL} bytes"
                    ));
                }
            }
        }
        if self.password.is_some() && self.username.is_none() {
            return Err(format!("{field}.password needs a username"));
        }
        if let Some(tls) = &self.tls {
            if let Some(name) = &tls.server_name {
                if !is_host_name(name) {
                    return Err(format!(
                        "{field}.tls.serverName: {name:?} is not a host name"
                    ));
                }
            }
            if let Some(pem) = &tls.ca_cert {
                if pem.len() > MAX_CA_CERT {
                    return Err(format!(
                        "{field}.tls.caCert has {} bytes; at most {MAX_CA_CERT}",
                        pem.len()
                    ));
                }
                roots_from_pem(pem).map_err(|e| format!("{field}.tls.caCert: {e}"))?;
            }
        }
        Ok(())
    }

    fn tls_server_name(&self) -> String {
        self.tls
            .as_ref()
            .and_then(|tls| tls.server_name.clone())
            .unwrap_or_else(|| self.host.clone())
    }
}

/// What the sandbox's connection is to reach through the proxy.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// The address (and port) the sandbox aimed at.
    Address(SocketAddrV4),
    /// A host name the sandbox's rules let out by name, and the port.
    Name(String, u16),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Address(addr) => write!(f, "{addr}"),
            Target::Name(name, port) => write!(f, "{name}:{port}"),
        }
    }
}

pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// The proxy's address for one connection: the host itself when it is an address, else the first
/// address of the name outside `denied`; an address in `denied` is refused.
pub(crate) async fn proxy_address(
    upstream: &UpstreamProxy,
    resolver: &TokioResolver,
    denied: &[Cidr],
) -> Result<SocketAddrV4, String> {
    let is_denied = |ip: Ipv4Addr| denied.iter().any(|cidr| cidr.contains(ip));
    if let Ok(ip) = upstream.host.parse::<Ipv4Addr>() {
        if is_denied(ip) {
            return Err(format!(
                "the egress proxy's address {ip} is in a range sandboxes may never reach"
            ));
        }
        return Ok(SocketAddrV4::new(ip, upstream.port));
    }
    let lookup = resolver
        .ipv4_lookup(format!("{}.", upstream.host))
        .await
        .map_err(|e| {
            format!(
                "the egress proxy's name {} did not resolve: {e}",
                upstream.host
            )
        })?;
    let addresses: Vec<Ipv4Addr> = lookup.iter().map(|a| a.0).collect();
    addresses
        .iter()
        .copied()
        .find(|ip| !is_denied(*ip))
        .map(|ip| SocketAddrV4::new(ip, upstream.port))
        .ok_or_else(|| {
            format!(
                "the egress proxy's name {} resolves only into ranges sandboxes may never reach: {addresses:?}",
                upstream.host
            )
        })
}

/// A connection to `target` through `upstream`, ready to carry the sandbox's bytes.
pub(crate) async fn dial(
    upstream: &UpstreamProxy,
    resolver: &TokioResolver,
    denied: &[Cidr],
    system_tls: &Arc<rustls::ClientConfig>,
    target: &Target,
) -> Result<Box<dyn Io>, String> {
    tokio::time::timeout(
        DIAL_TIMEOUT,
        dial_inner(upstream, resolver, denied, system_tls, target),
    )
    .await
    .map_err(|_| format!("the egress proxy did not connect to {target} in time"))?
}

async fn dial_inner(
    upstream: &UpstreamProxy,
    resolver: &TokioResolver,
    denied: &[Cidr],
    system_tls: &Arc<rustls::ClientConfig>,
    target: &Target,
) -> Result<Box<dyn Io>, String> {
    let at = proxy_address(upstream, resolver, denied).await?;
    let tcp = TcpStream::connect(at)
        .await
        .map_err(|e| format!("connect to the egress proxy at {at}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let carrier: Box<dyn Io> = match &upstream.tls {
        None => Box::new(tcp),
        Some(tls) => {
            let config = match &tls.ca_cert {
                Some(pem) => Arc::new(client_config(roots_from_pem(pem)?)?),
                None => Arc::clone(system_tls),
            };
            let name = upstream.tls_server_name();
            let server_name = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|e| format!("the egress proxy's TLS name {name:?}: {e}"))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(server_name, tcp)
                .await
                .map_err(|e| format!("TLS to the egress proxy at {at} ({name}): {e}"))?;
            Box::new(stream)
        }
    };
    let socks_target: tokio_socks::TargetAddr<'static> = match target {
        Target::Address(addr) => tokio_socks::TargetAddr::Ip(SocketAddr::V4(*addr)),
        Target::Name(name, port) => tokio_socks::TargetAddr::Domain(name.clone().into(), *port),
    };
    let tunnel = match (&upstream.username, &upstream.password) {
        (Some(user), password) => {
            tokio_socks::tcp::Socks5Stream::connect_with_password_and_socket(
                carrier,
                socks_target,
                user,
                password.as_deref().unwrap_or(""),
            )
            .await
        }
        (None, _) => {
            tokio_socks::tcp::Socks5Stream::connect_with_socket(carrier, socks_target).await
        }
    }
    .map_err(|e| format!("the egress proxy at {at} did not connect to {target}: {e}"))?;
    Ok(Box::new(tunnel))
}

/// Root certificates from PEM text: at least one, all of them parseable.
fn roots_from_pem(pem: &str) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    let mut reader = std::io::BufReader::new(pem.as_bytes());
    for cert in rustls_pemfile::certs(&mut reader) {
        let cert = cert.map_err(|e| format!("not PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("no CERTIFICATE block in it".into());
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_as_host_and_port() {
        assert_eq!(
            UpstreamProxy::parse_address("Proxy.Example.com:1080").unwrap(),
            ("proxy.example.com".to_string(), 1080)
        );
        assert_eq!(
            UpstreamProxy::parse_address("198.51.100.7:443").unwrap(),
            ("198.51.100.7".to_string(), 443)
        );
        for bad in [
            "proxy.example.com",
            "p:0",
            "p:70000",
            ":1080",
            "a b:1",
            "[::1]:1080",
        ] {
            let error = UpstreamProxy::parse_address(bad).unwrap_err();
            assert!(
                error.contains("network.egressProxy.address"),
                "{bad}: {error}"
            );
        }
    }

    fn proxy() -> UpstreamProxy {
        UpstreamProxy {
            host: "p.test".into(),
            port: 1080,
            username: Some("u".into()),
            password: Some("secret-pass".into()),
            tls: Some(UpstreamTls {
                server_name: None,
                ca_cert: None,
            }),
        }
    }

    #[test]
    fn validation_names_the_field_and_debug_hides_the_password() {
        assert_eq!(proxy().validate(), Ok(()));
        let no_user = UpstreamProxy {
            username: None,
            ..proxy()
        };
        assert!(no_user
            .validate()
            .unwrap_err()
            .contains("password needs a username"));
        let long = UpstreamProxy {
            username: Some("x".repeat(256)),
            ..proxy()
        };
        assert!(long.validate().unwrap_err().contains("username"));
        let bad_ca = UpstreamProxy {
            tls: Some(UpstreamTls {
                server_name: None,
                ca_cert: Some("not a certificate".into()),
            }),
            ..proxy()
        };
        assert!(bad_ca.validate().unwrap_err().contains("tls.caCert"));
        let bad_name = UpstreamProxy {
            tls: Some(UpstreamTls {
                server_name: Some("not a name!".into()),
                ca_cert: None,
            }),
            ..proxy()
        };
        assert!(bad_name.validate().unwrap_err().contains("tls.serverName"));
        let printed = format!("{:?}", proxy());
        assert!(!printed.contains("secret-pass"), "{printed}");
    }

    #[test]
    fn the_tls_name_defaults_to_the_host() {
        assert_eq!(proxy().tls_server_name(), "p.test");
        let named = UpstreamProxy {
            tls: Some(UpstreamTls {
                server_name: Some("socks.example".into()),
                ca_cert: None,
            }),
            ..proxy()
        };
        assert_eq!(named.tls_server_name(), "socks.example");
    }
}
