//! TLS to a sandbox's own HTTPS service (`network.httpsPorts`): the proxy ends the client's
//! connection as usual and opens TLS to the port. As in E2B this is not passthrough, and the
//! service's certificate is not checked (sandboxes serve self-signed ones); the handshake's
//! signature is still verified against the certificate's key, so the session is with whoever holds
//! that key. What protects the hop is that it never leaves the host: the sandbox's address is on the
//! host's bridge, bound to its port by the firewall.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Accepts any certificate; checks the handshake's signature with its key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The client settings for sandbox ports that speak TLS (HTTP/1.1 only: the proxy speaks
/// HTTP/1.1 to sandboxes).
pub(super) fn connector() -> tokio_rustls::TlsConnector {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map(|builder| {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                    .with_no_client_auth()
            })
            .unwrap_or_else(|_| {
                // The ring provider supports the default versions; never taken.
                rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth()
            });
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    });
    tokio_rustls::TlsConnector::from(Arc::clone(config))
}

/// The name sent as SNI: the request's host when it is a DNS name (a mask's or the client's),
/// else the sandbox's address (then no SNI is sent).
pub(super) fn server_name(host: Option<&str>, ip: std::net::IpAddr) -> ServerName<'static> {
    host.map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name))
        .and_then(|name| ServerName::try_from(name.to_string()).ok())
        .filter(|name| matches!(name, ServerName::DnsName(_)))
        .unwrap_or(ServerName::IpAddress(ip.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sni_is_the_host_name_or_nothing() {
        let ip: std::net::IpAddr = "10.77.0.5".parse().unwrap();
        assert_eq!(
            server_name(Some("8443-abc.example.com:443"), ip),
            ServerName::try_from("8443-abc.example.com").unwrap()
        );
        assert_eq!(
            server_name(Some("127.0.0.1:8080"), ip),
            ServerName::IpAddress(ip.into())
        );
        assert_eq!(server_name(None, ip), ServerName::IpAddress(ip.into()));
    }
}
