//! Header transforms (`network.rules`): the egress proxy reads a sandbox's HTTP requests to a host
//! with rules and sets the rules' headers on each before passing it on, so a secret (an API key, a
//! bearer token) is added on the host, on the way out, and never sits inside the sandbox.
//!
//! For HTTPS the proxy ends the sandbox's TLS itself with a certificate for the requested name from
//! the host's egress CA ([`super::egress_ca`], which such sandboxes trust), and opens its own TLS
//! connection to the real host, verifying the host's certificate against the host's trust store.
//! Only HTTP/1.1 is spoken on both sides. Every request on the connection must name the host the
//! connection was opened for (SNI, or the first request's `Host`); a request for another host gets
//! `421 Misdirected Request`, so the secret of one host is never sent with a request for another.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::egress_upstream::Io;
use tokio::net::TcpStream;

/// A stream whose first bytes were already read: they are given back before the rest.
pub(crate) struct Prefixed<S> {
    head: Vec<u8>,
    offset: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(crate) fn new(head: Vec<u8>, inner: S) -> Self {
        Prefixed {
            head,
            offset: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.offset < self.head.len() {
            let n = (self.head.len() - self.offset).min(buf.remaining());
            let start = self.offset;
            buf.put_slice(&self.head[start..start + n]);
            self.offset += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

type ProxyBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

/// One intercepted connection: the sandbox's side (TLS ended here when `tls` is given), a connection
/// already open towards the real host (`server`: direct, or through the sandbox's SOCKS5 proxy), over
/// which TLS verified with the client settings of `tls` is spoken when given, and the headers to set.
pub(crate) struct Interception {
    pub name: String,
    pub server: Box<dyn Io>,
    pub headers: Vec<(String, String)>,
    pub tls: Option<(Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>)>,
}

pub(crate) async fn intercept(
    client: Prefixed<TcpStream>,
    interception: Interception,
) -> Result<(), String> {
    let Interception {
        name,
        server,
        headers,
        tls,
    } = interception;
    let (sandbox_side, server_side): (Box<dyn Io>, Box<dyn Io>) = match tls {
        Some((server_config, client_config)) => {
            let accepted = tokio_rustls::TlsAcceptor::from(server_config)
                .accept(client)
                .await
                .map_err(|e| format!("TLS from the sandbox: {e}"))?;
            let server_name = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|e| format!("server name: {e}"))?;
            let connected = tokio_rustls::TlsConnector::from(client_config)
                .connect(server_name, server)
                .await
                .map_err(|e| format!("TLS to {name}: {e}"))?;
            (Box::new(accepted), Box::new(connected))
        }
        None => (Box::new(client), server),
    };
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(server_side))
        .await
        .map_err(|e| format!("HTTP to {name}: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let name = Arc::new(name);
    let headers = Arc::new(headers);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let sender = Arc::clone(&sender);
        let name = Arc::clone(&name);
        let headers = Arc::clone(&headers);
        async move {
            Ok::<_, std::convert::Infallible>(forward(request, &sender, &name, &headers).await)
        }
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(sandbox_side), service)
        .await
        .map_err(|e| format!("HTTP from the sandbox: {e}"))
}

fn plain(status: StatusCode, text: String) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(text))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

/// The host a request names: its `Host` header (or the URI's authority), lower-case, no port.
fn requested_host(request: &Request<Incoming>) -> Option<String> {
    let raw = request
        .headers()
        .get(hyper::header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_string()))?;
    let host = match raw.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => raw.as_str(),
    };
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

async fn forward(
    mut request: Request<Incoming>,
    sender: &tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    name: &str,
    headers: &[(String, String)],
) -> Response<ProxyBody> {
    if requested_host(&request).as_deref() != Some(name) {
        return plain(
            StatusCode::MISDIRECTED_REQUEST,
            format!("this connection is for {name}; open another for other hosts\n"),
        );
    }
    for (header, value) in headers {
        let (Ok(header), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(header.as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) else {
            continue;
        };
        request.headers_mut().insert(header, value);
    }
    let mut sender = sender.lock().await;
    if sender.ready().await.is_err() {
        return plain(
            StatusCode::BAD_GATEWAY,
            format!("the connection to {name} closed\n"),
        );
    }
    match sender.send_request(request).await {
        Ok(response) => response.map(BodyExt::boxed),
        Err(error) => plain(
            StatusCode::BAD_GATEWAY,
            format!("request to {name} failed: {error}\n"),
        ),
    }
}

/// TLS client settings for the proxy's own connections to real hosts: the host's trust store
/// (`/etc/ssl/certs`) and any extra CA certificates (PEM files) the operator gave.
pub(crate) fn upstream_tls(extra: &[std::path::PathBuf]) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    for path in extra {
        let pem = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| format!("parse {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("add {}: {e}", path.display()))?;
        }
    }
    let mut config = client_config(roots)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// TLS client settings of the egress proxy's own connections: TLS 1.2 or newer (ring), verified
/// against `roots`.
pub(crate) fn client_config(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig, String> {
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn a_prefixed_stream_gives_back_its_head_first() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (mut a, b) = tokio::io::duplex(64);
            tokio::io::AsyncWriteExt::write_all(&mut a, b" world")
                .await
                .unwrap();
            drop(a);
            let mut stream = Prefixed::new(b"hello".to_vec(), b);
            let mut all = String::new();
            stream.read_to_string(&mut all).await.unwrap();
            assert_eq!(all, "hello world");
        });
    }
}
