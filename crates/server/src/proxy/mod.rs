//! The sandbox proxy: one listener; each request goes to `<sandbox ip>:<port>` of the sandbox it names.
//! HTTP/1.1 and HTTP/2 (h2c) downstream, streaming bodies both ways, websockets and other upgrades. Built
//! on hyper directly to keep the path short. Headers (envd's access token included) pass through untouched
//! apart from hop-by-hop ones and, for a sandbox with `network.maskRequestHost`, `Host`; the agent does
//! its own token checks. Ports in the sandbox's `network.httpsPorts` are spoken to over TLS.

mod backend_tls;
mod signed_url;
pub mod target;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_TYPE, HOST, UPGRADE};
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use warren_proto::body_drain::{drain_after_error, SharedBody};
use warren_proto::envd::ENVD_PORT;

use crate::lifecycle::activity::ActivityGuard;
use crate::lifecycle::{now_millis, Lifecycle, RouteError};
use crate::metrics::Metrics;
use target::{target_of, Target, TargetError};

pub type ProxyBody = BoxBody<Bytes, hyper::Error>;
/// A client's request body, with a second handle kept to read what is left of it after an
/// error answer (see `warren_proto::body_drain`).
type RequestBody = SharedBody<Incoming>;

/// Headers that describe one connection, not the message; never forwarded.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "transfer-encoding",
];

pub struct Proxy {
    lifecycle: Arc<Lifecycle>,
    metrics: Arc<Metrics>,
    client: Client<HttpConnector, RequestBody>,
}

/// A response body that keeps its sandbox's request open (for the idle policy) until it is done.
struct Guarded {
    inner: ProxyBody,
    _open: ActivityGuard,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

fn body_of(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A JSON error page `{code, message}`; the SDK reads `message`.
fn error_response(status: StatusCode, message: String) -> Response<ProxyBody> {
    let body = serde_json::json!({ "code": status.as_u16(), "message": message }).to_string();
    let mut response = Response::new(body_of(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Headers named in `Connection` are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| !(keep_upgrade && name == UPGRADE))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if !keep_upgrade {
        headers.remove(UPGRADE);
    }
}

impl Proxy {
    pub fn new(lifecycle: Arc<Lifecycle>, metrics: Arc<Metrics>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Proxy {
            lifecycle,
            metrics,
            client,
        }
    }

    /// Accept connections until `shutdown` turns true; with `tls`, over HTTPS. With `api`, requests
    /// for its host name go to the REST API instead (E2B_DOMAIN mode: `api.<domain>` and
    /// `<port>-<id>.<domain>` on one HTTPS port).
    pub async fn run(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        api: Option<ApiOnHost>,
        shutdown: watch::Receiver<bool>,
    ) {
        let api = api.map(Arc::new);
        let service = move |request: Request<Incoming>| {
            let proxy = Arc::clone(&self);
            let api = api.clone();
            async move {
                match api {
                    Some(api) if api.is_for(&request) => api.call(request).await,
                    _ => drain_after_error(request, |request| proxy.handle(request))
                        .await
                        .map(axum::body::Body::new),
                }
            }
        };
        crate::listener::serve(listener, tls, service, shutdown, None, "proxy").await;
    }

    pub async fn handle(&self, request: Request<RequestBody>) -> Response<ProxyBody> {
        let (parts, body) = request.into_parts();
        let target = match target_of(&parts) {
            Ok(target) => target,
            // A URL that names no sandbox may still be a pre-signed file URL.
            Err(TargetError::Missing) => match self.signed_file_target(&parts).await {
                Ok(target) => target,
                Err(response) => return response,
            },
            Err(error) => {
                self.metrics.proxy_request("bad_request");
                return error_response(StatusCode::BAD_REQUEST, error.to_string());
            }
        };
        let route = match self.lifecycle.route_for_traffic(&target.sandbox_id).await {
            Ok(route) => route,
            Err(error) => {
                self.metrics.proxy_request("unavailable");
                return route_error_response(&target, error);
            }
        };
        let mut parts = parts;
        // A dashboard session is Warren's credential, never the sandbox's to see.
        crate::dashboard::sessions::strip_session_cookie(&mut parts.headers);
        // A private sandbox's user ports need its traffic token; envd's port has its own token.
        let presented = parts.headers.remove(TRAFFIC_TOKEN_HEADER);
        if let Some(expected) = &route.traffic_token {
            let matches = presented
                .as_ref()
                .is_some_and(|value| same_secret(value.as_bytes(), expected.as_bytes()));
            if target.port != ENVD_PORT && !matches {
                self.metrics.proxy_request("forbidden");
                return error_response(
                    StatusCode::FORBIDDEN,
                    format!(
                        "sandbox {} is private: send its traffic access token in the {TRAFFIC_TOKEN_HEADER} header",
                        target.sandbox_id
                    ),
                );
            }
        }
        // `network.maskRequestHost`: the Host the sandbox's services see.
        if let Some(host) = route.ingress.host_for(target.port) {
            if let Ok(value) = HeaderValue::from_str(&host) {
                parts.headers.insert(HOST, value);
            }
        }
        let https = route.ingress.is_https(target.port);
        let addr = SocketAddr::from((route.ip, target.port));
        let request = Request::from_parts(parts, body);
        let open = self
            .lifecycle
            .activity()
            .begin(&target.sandbox_id, now_millis());
        let response =
            if request.headers().contains_key(UPGRADE) && request.version() == Version::HTTP_11 {
                self.forward_upgrade(request, addr, https, &target, open)
                    .await
            } else {
                let (parts, body) = self
                    .forward(request, addr, https, &target, route.incarnation)
                    .await
                    .into_parts();
                let body = Guarded {
                    inner: body,
                    _open: open,
                };
                Response::from_parts(parts, body.boxed())
            };
        self.metrics
            .proxy_request(if response.status() == StatusCode::BAD_GATEWAY {
                "port_closed"
            } else {
                "forwarded"
            });
        response
    }

    /// The sandbox of a signed `/files` URL that names none (see `signed_url`).
    async fn signed_file_target(
        &self,
        parts: &hyper::http::request::Parts,
    ) -> Result<Target, Response<ProxyBody>> {
        let Some(request) = signed_url::signed_file_request(parts) else {
            self.metrics.proxy_request("bad_request");
            return Err(error_response(
                StatusCode::BAD_REQUEST,
                TargetError::Missing.to_string(),
            ));
        };
        match signed_url::sandbox_of(self.lifecycle.store().as_ref(), &request).await {
            Ok(Some(target)) => Ok(target),
            Ok(None) => {
                self.metrics.proxy_request("unavailable");
                Err(error_response(
                    StatusCode::UNAUTHORIZED,
                    "the signature matches no live sandbox (invalid, or its sandbox is gone)"
                        .to_string(),
                ))
            }
            Err(error) => {
                tracing::error!(%error, "proxy lookup of a signed URL failed");
                Err(error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal proxy error".to_string(),
                ))
            }
        }
    }

    async fn forward(
        &self,
        request: Request<RequestBody>,
        addr: SocketAddr,
        https: bool,
        target: &Target,
        incarnation: u32,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = request.into_parts();
        let authority = parts
            .uri
            .authority()
            .map(|authority| authority.as_str().to_string());
        let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
        // The sandbox ID and its incarnation ride in the authority's user part: the client's connection
        // pool is keyed by the whole authority, so neither a later sandbox that gets the same address nor
        // the same sandbox restored or rebooted there inherits a stale pooled connection. The client
        // connects to the host part only and never sends the user part.
        parts.uri = match format!("http://{}-{incarnation}@{addr}{path}", target.sandbox_id).parse()
        {
            Ok(uri) => uri,
            Err(error) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    format!("invalid request path: {error}"),
                )
            }
        };
        if !parts.headers.contains_key(HOST) {
            if let Some(value) =
                authority.and_then(|authority| HeaderValue::from_str(&authority).ok())
            {
                parts.headers.insert(HOST, value);
            }
        }
        parts.version = Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers, false);
        let sent = if https {
            // A connection of its own per request: TLS to the port, HTTP/1.1 over it.
            let host = parts
                .headers
                .get(HOST)
                .and_then(|value| value.to_str().ok())
                .map(str::to_string);
            let stream = match open_backend(addr, true, host.as_deref(), target).await {
                Ok(stream) => stream,
                Err(response) => return response,
            };
            if let Some(path) = parts.uri.path_and_query() {
                if let Ok(uri) = path.as_str().parse() {
                    parts.uri = uri;
                }
            }
            match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok((mut sender, connection)) => {
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    sender.send_request(Request::from_parts(parts, body)).await
                }
                Err(_) => return port_closed(target),
            }
            .map_err(UpstreamFailure::Tls)
        } else {
            self.client
                .request(Request::from_parts(parts, body))
                .await
                .map_err(UpstreamFailure::Pooled)
        };
        match sent {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers, false);
                Response::from_parts(parts, body.boxed())
            }
            Err(UpstreamFailure::Pooled(error)) if error.is_connect() => port_closed(target),
            Err(error) => {
                tracing::debug!(sandbox = %target.sandbox_id, port = target.port, %error, "upstream request failed");
                error_response(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "request to port {} of sandbox {} failed: {error}",
                        target.port, target.sandbox_id
                    ),
                )
            }
        }
    }

    /// Websockets and other HTTP/1.1 upgrades: forward the handshake on a fresh connection, then splice the
    /// two upgraded streams.
    async fn forward_upgrade(
        &self,
        mut request: Request<RequestBody>,
        addr: SocketAddr,
        https: bool,
        target: &Target,
        open: ActivityGuard,
    ) -> Response<ProxyBody> {
        let client_upgrade = hyper::upgrade::on(&mut request);
        let host = request
            .headers()
            .get(HOST)
            .and_then(|value| value.to_str().ok())
            .map(str::to_string);
        let stream = match open_backend(addr, https, host.as_deref(), target).await {
            Ok(stream) => stream,
            Err(response) => return response,
        };
        let (mut sender, connection) =
            match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok(handshake) => handshake,
                Err(_) => return port_closed(target),
            };
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(%error, "upstream upgrade connection ended with an error");
            }
        });
        let (mut parts, body) = request.into_parts();
        if let Some(path) = parts.uri.path_and_query() {
            if let Ok(uri) = path.as_str().parse() {
                parts.uri = uri;
            }
        }
        strip_hop_by_hop(&mut parts.headers, true);
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("upgrade"));
        let mut response = match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(response) => response,
            Err(error) => {
                return error_response(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "upgrade to port {} of sandbox {} failed: {error}",
                        target.port, target.sandbox_id
                    ),
                )
            }
        };
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let server_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                // The upgraded connection counts as a request open for as long as it lasts.
                let _open = open;
                match tokio::try_join!(client_upgrade, server_upgrade) {
                    Ok((client, server)) => {
                        let mut client = TokioIo::new(client);
                        let mut server = TokioIo::new(server);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                    Err(error) => tracing::debug!(%error, "upgrade did not complete"),
                }
            });
        }
        let (parts, body) = response.into_parts();
        Response::from_parts(parts, body.boxed())
    }
}

/// How a request to a sandbox's port failed: on the pooled plain-HTTP client, or on a connection of
/// its own over TLS.
#[derive(Debug)]
enum UpstreamFailure {
    Pooled(hyper_util::client::legacy::Error),
    Tls(hyper::Error),
}

impl std::fmt::Display for UpstreamFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamFailure::Pooled(error) => write!(f, "{error}"),
            UpstreamFailure::Tls(error) => write!(f, "{error}"),
        }
    }
}

trait BackendIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> BackendIo for T {}

/// A connection to a sandbox's port: plain TCP, or TLS when the port is one of its `httpsPorts`
/// (SNI from `host` when that is a name).
async fn open_backend(
    addr: SocketAddr,
    https: bool,
    host: Option<&str>,
    target: &Target,
) -> Result<Box<dyn BackendIo>, Response<ProxyBody>> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|_| port_closed(target))?;
    let _ = stream.set_nodelay(true);
    if !https {
        return Ok(Box::new(stream));
    }
    let name = backend_tls::server_name(host, addr.ip());
    let failed = |why: String| {
        error_response(
            StatusCode::BAD_GATEWAY,
            format!(
                "TLS to port {} of sandbox {} failed (it is one of the sandbox's httpsPorts): {why}",
                target.port, target.sandbox_id
            ),
        )
    };
    match tokio::time::timeout(
        Duration::from_secs(10),
        backend_tls::connector().connect(name, stream),
    )
    .await
    {
        Ok(Ok(tls)) => Ok(Box::new(tls)),
        Ok(Err(error)) => Err(failed(error.to_string())),
        Err(_) => Err(failed("no handshake within 10 s".into())),
    }
}

/// The REST API answering on the proxy's listener under one host name (`api.<domain>`).
pub struct ApiOnHost {
    host: String,
    router: TowerToHyperService<axum::Router>,
}

impl ApiOnHost {
    pub fn new(host: String, router: axum::Router) -> Self {
        ApiOnHost {
            host: host.to_ascii_lowercase(),
            router: TowerToHyperService::new(router),
        }
    }

    /// Whether the request's host (Host header, or the authority of an HTTP/2 request) is the API's.
    fn is_for(&self, request: &Request<Incoming>) -> bool {
        let host = request
            .headers()
            .get(HOST)
            .and_then(|value| value.to_str().ok())
            .or_else(|| {
                request
                    .uri()
                    .authority()
                    .map(|authority| authority.as_str())
            });
        host.is_some_and(|host| target::without_port(host).eq_ignore_ascii_case(&self.host))
    }

    async fn call(&self, request: Request<Incoming>) -> Response<axum::body::Body> {
        match hyper::service::Service::call(&self.router, request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// The header a private sandbox's user-port requests carry its traffic access token in (the SDK's
/// `sandbox.traffic_access_token`). Removed before the request reaches the sandbox.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Compares two secrets in time that depends on their lengths only.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn port_closed(target: &Target) -> Response<ProxyBody> {
    error_response(
        StatusCode::BAD_GATEWAY,
        format!(
            "The sandbox {} is running but port is not open: nothing listens on port {}",
            target.sandbox_id, target.port
        ),
    )
}

/// E2B's proxy answers 502 with "... was not found" for a sandbox that is gone; the SDK turns that message
/// into `SandboxNotRunningException`, so Warren says the same.
fn route_error_response(target: &Target, error: RouteError) -> Response<ProxyBody> {
    match error {
        RouteError::NotFound(id) => error_response(StatusCode::BAD_GATEWAY, format!("The sandbox {id} was not found")),
        RouteError::Paused(id) => error_response(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox {id} is paused and does not resume on traffic; resume it through the API"),
        ),
        RouteError::ResumeFailed { id, source } => {
            tracing::warn!(sandbox = %id, error = %source, port = target.port, "resume on traffic failed");
            error_response(StatusCode::BAD_GATEWAY, format!("The sandbox {id} could not be resumed"))
        }
        RouteError::Store(error) => {
            tracing::error!(%error, "proxy lookup failed");
            error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal proxy error".to_string())
        }
    }
}
