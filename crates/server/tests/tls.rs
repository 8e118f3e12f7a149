//! HTTPS on the API and the proxy with the local CA (`tls::TlsSource::LocalCa`), against a real
//! server on the fake runtime: HTTP/1.1 and HTTP/2 by ALPN, `api.<domain>` on the proxy's port,
//! websocket-style upgrades through TLS, and no trust without the CA.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use rustls::RootCertStore;
use serde_json::json;
use support::Harness;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use warren_server::tls::TlsSource;

const DOMAIN: &str = "warren.test";

fn roots_with(ca_pem: &[u8]) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(cert.unwrap()).unwrap();
    }
    assert!(!roots.is_empty(), "the CA file holds no certificate");
    roots
}

async fn tls_connect(
    addr: SocketAddr,
    name: &str,
    roots: RootCertStore,
    alpn: &[u8],
) -> Result<TlsStream<tokio::net::TcpStream>, std::io::Error> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_string()).unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
}

struct Answer {
    status: StatusCode,
    version: hyper::Version,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// One request over a fresh TLS connection to `addr`, presenting `name` in SNI and Host.
#[allow(clippy::too_many_arguments)] // one request, spelled out at each call
async fn https(
    addr: SocketAddr,
    name: &str,
    roots: RootCertStore,
    h2: bool,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<serde_json::Value>,
) -> Answer {
    let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
    let stream = tls_connect(addr, name, roots, alpn).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(alpn));
    let io = TokioIo::new(stream);
    let mut request = if h2 {
        Request::builder().uri(format!("https://{name}{path}"))
    } else {
        Request::builder().uri(path).header("host", name)
    }
    .method(method);
    for (header, value) in headers {
        request = request.header(*header, *value);
    }
    let body = match body {
        Some(json) => {
            request = request.header("content-type", "application/json");
            Bytes::from(json.to_string())
        }
        None => Bytes::new(),
    };
    let request = request.body(Full::new(body)).unwrap();
    let response = if h2 {
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(connection);
        sender.send_request(request).await.unwrap()
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        sender.send_request(request).await.unwrap()
    };
    let status = response.status();
    let version = response.version();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        version,
        body,
    }
}

#[tokio::test]
async fn api_and_proxy_serve_https_with_the_local_ca() {
    let h = Harness::start(false, |config| {
        config.tls = Some(TlsSource::LocalCa);
        config.domain = DOMAIN.to_string();
    })
    .await;
    let api = h.server.server.api_addr;
    let proxy = h.server.server.proxy_addr;
    let key = h.server.api_key.clone();
    let ca = std::fs::read(h.server.state_dir().join("tls/ca.crt")).expect("the local CA file");
    let roots = || roots_with(&ca);

    // The API over HTTPS at its IP, HTTP/1.1 and HTTP/2.
    let created = https(
        api,
        "127.0.0.1",
        roots(),
        false,
        Method::POST,
        "/v2/sandboxes",
        &[("X-API-Key", &key)],
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(
        created.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let created = created.json();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    assert_eq!(created["domain"], DOMAIN);
    let listed = https(
        api,
        "127.0.0.1",
        roots(),
        true,
        Method::GET,
        "/sandboxes",
        &[("X-API-Key", &key)],
        None,
    )
    .await;
    assert_eq!(listed.version, hyper::Version::HTTP_2);
    assert_eq!(listed.status, StatusCode::OK);
    assert!(listed.body.windows(id.len()).any(|w| w == id.as_bytes()));

    // The proxy by host name `<port>-<id>.<domain>`, the name matching the wildcard certificate.
    let host = format!("49983-{id}.{DOMAIN}");
    for h2 in [false, true] {
        let echoed = https(proxy, &host, roots(), h2, Method::GET, "/health", &[], None).await;
        assert_eq!(echoed.status, StatusCode::OK, "h2={h2}");
        assert_eq!(echoed.json()["sandbox"], json!(id), "h2={h2}");
    }

    // E2B_DOMAIN mode: the proxy's port answers as `api.<domain>` with the REST API.
    let api_name = format!("api.{DOMAIN}");
    for h2 in [false, true] {
        let through_proxy = https(
            proxy,
            &api_name,
            roots(),
            h2,
            Method::GET,
            &format!("/sandboxes/{id}"),
            &[("X-API-Key", &key)],
            None,
        )
        .await;
        assert_eq!(through_proxy.status, StatusCode::OK, "h2={h2}");
        assert_eq!(through_proxy.json()["sandboxID"], json!(id));
    }
    // Without a key it is the API's 401, not a proxy error.
    let unauthorised = https(
        proxy,
        &api_name,
        roots(),
        false,
        Method::GET,
        "/sandboxes",
        &[],
        None,
    )
    .await;
    assert_eq!(unauthorised.status, StatusCode::UNAUTHORIZED);

    // A websocket-style upgrade through TLS, then raw bytes both ways.
    let mut stream = tls_connect(proxy, &host, roots(), b"http/1.1")
        .await
        .unwrap();
    let handshake = format!(
        "GET /upgrade HTTP/1.1\r\nHost: {host}\r\nConnection: upgrade\r\nUpgrade: wt-echo\r\n\r\n"
    );
    stream.write_all(handshake.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut byte))
            .await
            .unwrap()
            .unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream.write_all(b"ping over tls upgrade").await.unwrap();
    let mut echoed = vec![0u8; 21];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echoed, b"ping over tls upgrade");

    // Without the CA nothing verifies: the certificate chains to Warren's CA only.
    for (addr, name) in [(api, "127.0.0.1"), (proxy, host.as_str())] {
        let refused = tls_connect(addr, name, other_roots(), b"http/1.1").await;
        let Err(error) = refused else {
            panic!("a handshake with {name} without the CA must fail")
        };
        assert!(
            error.to_string().contains("UnknownIssuer")
                || error.to_string().contains("certificate"),
            "{error}"
        );
    }
    // Plain HTTP on a TLS port gets no API answer.
    let mut plain = tokio::net::TcpStream::connect(api).await.unwrap();
    plain
        .write_all(b"GET /sandboxes HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut reply)).await;
    assert!(
        !reply.starts_with(b"HTTP/1.1 "),
        "{}",
        String::from_utf8_lossy(&reply)
    );

    https(
        api,
        "localhost",
        roots(),
        false,
        Method::DELETE,
        &format!("/sandboxes/{id}"),
        &[("X-API-Key", &key)],
        None,
    )
    .await;
    h.server.stop().await.unwrap();
}

/// A trust store without Warren's CA: a throwaway CA of the test's own.
fn other_roots() -> RootCertStore {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let other = params.self_signed(&key).unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(other.der().clone()).unwrap();
    roots
}

#[tokio::test]
async fn operator_certificate_files_are_served() {
    // The operator's certificate: here made by a CA of the test's own for `*.<domain>` and
    // `api.<domain>`.
    let dir = tempfile::tempdir().unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![format!("*.{DOMAIN}"), format!("api.{DOMAIN}")])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let cert = dir.path().join("server.crt");
    let key = dir.path().join("server.key");
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();

    let h = Harness::start(false, |config| {
        config.tls = Some(TlsSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        });
        config.domain = DOMAIN.to_string();
    })
    .await;
    let roots = || roots_with(ca.pem().as_bytes());
    let answer = https(
        h.server.server.proxy_addr,
        &format!("api.{DOMAIN}"),
        roots(),
        true,
        Method::GET,
        "/sandboxes",
        &[("X-API-Key", &h.server.api_key)],
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(
        !h.server.state_dir().join("tls/ca.key").exists(),
        "no local CA is made when the operator gives a certificate"
    );
    // A name the operator's certificate does not cover is refused by the client.
    let wrong = tls_connect(h.server.server.api_addr, "other.example", roots(), b"h2").await;
    assert!(wrong.is_err());
    h.server.stop().await.unwrap();
}
