//! The host's egress CA: the certificate authority the egress proxy signs a certificate for a host
//! with when it must read (and add headers to) a sandbox's HTTPS requests to that host
//! (`network.rules` transforms). Sandboxes with such rules trust it (the agent adds it to their
//! trust store); nothing else does.
//!
//! The key is made once per host and kept, readable by root only, in `<state>/egress-ca/` with the
//! certificate beside it, so sandboxes that trusted it keep working across restarts. Whoever holds
//! the key can impersonate any host to those sandboxes: it never leaves the host, and the proxy only
//! uses it for the hosts a sandbox's own rules name. Leaf certificates are made on demand, kept in
//! memory for a day, and valid for a week.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

const CA_NAME: &str = "Warren egress CA (this host)";
/// How long a leaf certificate is reused before a fresh one is made.
const LEAF_REUSE: Duration = Duration::from_secs(24 * 3600);
/// Most leaf certificates kept in memory.
const MAX_LEAVES: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum EgressCaError {
    #[error("egress CA files in {dir}")]
    Files {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("egress CA key")]
    Key(#[source] rcgen::Error),
    #[error("certificate for {name}")]
    Leaf {
        name: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("TLS settings for {name}")]
    Tls {
        name: String,
        #[source]
        source: rustls::Error,
    },
}

pub struct EgressCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    /// A certificate with the CA's name and key, for signing (its bytes are never shown).
    issuer: rcgen::Certificate,
    key: KeyPair,
    leaves: Mutex<HashMap<String, (Instant, Arc<rustls::ServerConfig>)>>,
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

impl EgressCa {
    /// Loads the CA kept in `dir`, or makes one there.
    pub fn load_or_create(dir: &Path) -> Result<EgressCa, EgressCaError> {
        let files = |source| EgressCaError::Files {
            dir: dir.display().to_string(),
            source,
        };
        let key_path = dir.join("ca.key");
        let cert_path = dir.join("ca.crt");
        let (key, cert_pem) = match (
            std::fs::read_to_string(&key_path),
            std::fs::read_to_string(&cert_path),
        ) {
            (Ok(key), Ok(cert)) => (KeyPair::from_pem(&key).map_err(EgressCaError::Key)?, cert),
            _ => {
                let key = KeyPair::generate().map_err(EgressCaError::Key)?;
                let cert = ca_params().self_signed(&key).map_err(EgressCaError::Key)?;
                write_private(dir, &key_path, key.serialize_pem().as_bytes()).map_err(files)?;
                write_private(dir, &cert_path, cert.pem().as_bytes()).map_err(files)?;
                (key, cert.pem())
            }
        };
        let cert_der = rustls_pemfile::certs(&mut cert_pem.as_bytes())
            .next()
            .and_then(Result::ok)
            .ok_or_else(|| {
                files(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "ca.crt holds no certificate",
                ))
            })?;
        // Same name and key as the kept certificate, so what it signs chains to that one.
        let issuer = ca_params().self_signed(&key).map_err(EgressCaError::Key)?;
        Ok(EgressCa {
            cert_pem,
            cert_der,
            issuer,
            key,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate sandboxes are given to trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// TLS server settings presenting a certificate for `name` signed by this CA (HTTP/1.1 only).
    pub fn server_config(&self, name: &str) -> Result<Arc<rustls::ServerConfig>, EgressCaError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((made, config)) = leaves.get(name) {
            if made.elapsed() < LEAF_REUSE {
                return Ok(Arc::clone(config));
            }
        }
        let leaf_error = |source| EgressCaError::Leaf {
            name: name.to_string(),
            source,
        };
        let key = KeyPair::generate().map_err(leaf_error)?;
        let mut params = CertificateParams::new(vec![name.to_string()]).map_err(leaf_error)?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(7);
        let leaf = params
            .signed_by(&key, &self.issuer, &self.key)
            .map_err(leaf_error)?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .and_then(|builder| {
            builder.with_no_client_auth().with_single_cert(
                vec![leaf.der().clone(), self.cert_der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
        })
        .map_err(|source| EgressCaError::Tls {
            name: name.to_string(),
            source,
        })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(name.to_string(), (Instant::now(), Arc::clone(&config)));
        Ok(config)
    }
}

/// Writes `bytes` to `path` (in `dir`, made 0700) as a 0600 file.
fn write_private(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
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
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_kept_and_its_leaves_chain_to_it() {
        let dir = std::env::temp_dir().join(format!("wt-egress-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = EgressCa::load_or_create(&dir).unwrap();
        let again = EgressCa::load_or_create(&dir).unwrap();
        assert_eq!(
            first.cert_pem(),
            again.cert_pem(),
            "a restart made a new CA"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o077,
            0,
            "the CA key is readable by others: {mode:o}"
        );

        // A leaf made after the reload verifies against the first run's certificate.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(first.cert_der.clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        again
            .server_config("api.example.com")
            .expect("TLS settings for a name");
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["api.example.com".to_string()])
            .unwrap()
            .signed_by(&key, &again.issuer, &again.key)
            .unwrap();
        use rustls::client::danger::ServerCertVerifier;
        let name = rustls::pki_types::ServerName::try_from("api.example.com").unwrap();
        verifier
            .verify_server_cert(
                leaf.der(),
                &[],
                &name,
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .expect("the leaf chains to the kept CA");
        let other = rustls::pki_types::ServerName::try_from("other.example.com").unwrap();
        assert!(verifier
            .verify_server_cert(
                leaf.der(),
                &[],
                &other,
                &[],
                rustls::pki_types::UnixTime::now()
            )
            .is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
