//! HTTPS for the REST API and the sandbox proxy.
//!
//! Two sources of a certificate: the operator's own (`TlsSource::Files`, e.g. a wildcard for
//! `*.<domain>` that also names `api.<domain>`), or a local CA Warren makes once and keeps in
//! `<state>/tls/` (`ca.key` 0600 in a 0700 folder, `ca.crt` beside it), which signs a fresh server
//! certificate at every start for the names in [`server_names`]. Clients trust `ca.crt`
//! (`SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`, ...); the key never leaves the state dir.
//!
//! Both listeners offer HTTP/2 and HTTP/1.1 by ALPN (the SDK speaks HTTP/2 over TLS); websockets
//! use HTTP/1.1 upgrades as they do without TLS.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

const CA_NAME: &str = "Warren local CA (this host)";
/// Folder of the local CA under the state dir.
const CA_DIR: &str = "tls";

/// Where the server's certificate comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum TlsSource {
    /// The operator's certificate chain and private key (PEM files).
    Files { cert: PathBuf, key: PathBuf },
    /// A certificate signed by the local CA in the state dir (made on first use).
    LocalCa,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the local CA in {dir}")]
    Write {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key")]
    NoKey { path: PathBuf },
    #[error("cannot make a certificate")]
    Generate(#[source] rcgen::Error),
    #[error("the certificate and key are not usable for TLS")]
    Rustls(#[source] rustls::Error),
}

/// The local CA's files.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalCaFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Made by this call (first start) rather than found.
    pub created: bool,
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_NAME);
    name.push(DnType::OrganizationName, "Warren");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(3650);
    params
}

/// The local CA kept in `<state_dir>/tls/`, made there when missing.
pub fn ensure_local_ca(state_dir: &Path) -> Result<LocalCaFiles, TlsError> {
    let dir = state_dir.join(CA_DIR);
    let cert = dir.join("ca.crt");
    let key = dir.join("ca.key");
    if cert.is_file() && key.is_file() {
        return Ok(LocalCaFiles {
            cert,
            key,
            created: false,
        });
    }
    let pair = KeyPair::generate().map_err(TlsError::Generate)?;
    let ca = ca_params().self_signed(&pair).map_err(TlsError::Generate)?;
    let write = |source| TlsError::Write {
        dir: dir.clone(),
        source,
    };
    write_file(&dir, &key, pair.serialize_pem().as_bytes(), 0o600).map_err(write)?;
    write_file(&dir, &cert, ca.pem().as_bytes(), 0o644).map_err(write)?;
    Ok(LocalCaFiles {
        cert,
        key,
        created: true,
    })
}

/// The names a local-CA server certificate carries: `<domain>`, `*.<domain>` (sandboxes),
/// `api.<domain>`, `localhost`, loopback and each listen address that names one IP.
pub fn server_names(domain: &str, listens: &[SocketAddr]) -> Vec<SanType> {
    let mut dns = vec![
        domain.to_string(),
        format!("*.{domain}"),
        format!("api.{domain}"),
        "localhost".to_string(),
    ];
    dns.dedup();
    let mut ips: Vec<IpAddr> = vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()];
    for listen in listens {
        if !listen.ip().is_unspecified() && !ips.contains(&listen.ip()) {
            ips.push(listen.ip());
        }
    }
    let mut names: Vec<SanType> = dns
        .into_iter()
        .filter_map(|name| name.try_into().ok().map(SanType::DnsName))
        .collect();
    names.extend(ips.into_iter().map(SanType::IpAddress));
    names
}

/// The TLS acceptor both listeners use.
pub fn acceptor(
    source: &TlsSource,
    state_dir: &Path,
    domain: &str,
    listens: &[SocketAddr],
) -> Result<TlsAcceptor, TlsError> {
    let (chain, key) = match source {
        TlsSource::Files { cert, key } => (read_chain(cert)?, read_key(key)?),
        TlsSource::LocalCa => local_ca_leaf(state_dir, domain, listens)?,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
    .map_err(TlsError::Rustls)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

type Chain = Vec<CertificateDer<'static>>;

fn local_ca_leaf(
    state_dir: &Path,
    domain: &str,
    listens: &[SocketAddr],
) -> Result<(Chain, PrivateKeyDer<'static>), TlsError> {
    let files = ensure_local_ca(state_dir)?;
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let ca_key = KeyPair::from_pem(&read(&files.key)?).map_err(TlsError::Generate)?;
    let ca_der = read_chain(&files.cert)?.remove(0);
    // Same name and key as the kept certificate, so what it signs chains to that one.
    let issuer = ca_params()
        .self_signed(&ca_key)
        .map_err(TlsError::Generate)?;
    let key = KeyPair::generate().map_err(TlsError::Generate)?;
    let mut params = CertificateParams::default();
    params.subject_alt_names = server_names(domain, listens);
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("api.{domain}"));
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(365);
    let leaf = params
        .signed_by(&key, &issuer, &ca_key)
        .map_err(TlsError::Generate)?;
    Ok((
        vec![leaf.der().clone(), ca_der],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    ))
}

/// The certificates of PEM file `path` (a chain, or CAs to trust).
pub(crate) fn read_chain(path: &Path) -> Result<Chain, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let chain: Chain = rustls_pemfile::certs(&mut pem.as_slice())
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    match rustls_pemfile::private_key(&mut pem.as_slice()) {
        Ok(Some(key)) => Ok(key),
        _ => Err(TlsError::NoKey {
            path: path.to_path_buf(),
        }),
    }
}

/// Writes `bytes` to `path` (in `dir`, made 0700) with `mode`.
fn write_file(dir: &Path, path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_local_ca_is_made_once_with_a_private_key() {
        let dir = tempfile::tempdir().unwrap();
        let first = ensure_local_ca(dir.path()).unwrap();
        assert!(first.created);
        let mode = std::fs::metadata(&first.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "key mode {mode:o}");
        let pem = std::fs::read_to_string(&first.cert).unwrap();
        let again = ensure_local_ca(dir.path()).unwrap();
        assert!(!again.created);
        assert_eq!(std::fs::read_to_string(&again.cert).unwrap(), pem);
        acceptor(&TlsSource::LocalCa, dir.path(), "warren.test", &[]).unwrap();
    }

    #[test]
    fn operator_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem").unwrap();
        let source = TlsSource::Files {
            cert: empty.clone(),
            key: empty.clone(),
        };
        assert!(matches!(
            acceptor(&source, dir.path(), "x", &[]),
            Err(TlsError::NoCertificate { .. })
        ));
        let missing = TlsSource::Files {
            cert: dir.path().join("nope.pem"),
            key: empty,
        };
        assert!(matches!(
            acceptor(&missing, dir.path(), "x", &[]),
            Err(TlsError::Read { .. })
        ));
    }

    #[test]
    fn names_cover_the_api_the_sandboxes_and_the_listen_ips() {
        let names = server_names(
            "warren.test",
            &[
                "198.18.0.1:443".parse().unwrap(),
                "0.0.0.0:3001".parse().unwrap(),
            ],
        );
        let shown: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
        let all = shown.join(" ");
        for want in [
            "*.warren.test",
            "api.warren.test",
            "198.18.0.1",
            "127.0.0.1",
        ] {
            assert!(all.contains(want), "{want} missing from {all}");
        }
        assert!(!all.contains("0.0.0.0"), "{all}");
    }
}
