//! The agent's HTTP surface: envd's plain endpoints (`/health`, `/init`, `/envs`, `/metrics`,
//! `/files`), Warren's `/warren/logs`, the Connect RPC routes, and the access-token check in front
//! of them.

pub mod files;
pub mod metrics;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use warren_proto::envd::ENVD_VERSION;

use crate::connect_server::{self as rpc, call_context};
use crate::filesystem::{self as fs, watch};
use crate::process;
use crate::state::Agent;

/// Header bytes accepted per request (HTTP/1 buffer and HTTP/2 header list); larger header sets
/// are refused with a protocol error and the agent keeps serving.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Serves one accepted connection (HTTP/1.1 or HTTP/2) until the client closes it.
pub async fn serve_connection(stream: tokio::net::TcpStream, app: Router) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tower::ServiceExt;
    let _ = stream.set_nodelay(true);
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            app.clone().oneshot(request.map(Body::new))
        });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .max_buf_size(MAX_HEADER_BYTES * 2)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_secs(30));
    builder
        .http2()
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(8 << 20);
    if let Err(e) = builder
        .serve_connection_with_upgrades(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!("connection ended: {e}");
    }
}

/// envd's plain error body: `{"code": <status>, "message": "..."}`.
pub fn json_error(status: StatusCode, message: &str) -> Response {
    (
        status,
        Json(serde_json::json!({ "code": status.as_u16(), "message": message })),
    )
        .into_response()
}

pub fn router(agent: Arc<Agent>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/init", post(init))
        .route("/envs", get(envs))
        .route("/metrics", get(metrics_handler))
        .route("/warren/logs", get(logs_handler))
        .route("/files", get(files::download).post(files::upload))
        .route("/{service}/{method}", post(connect_rpc))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(agent.clone(), require_token))
        .layer(middleware::map_response(add_version_header))
        .layer(middleware::from_fn(drain_after_error))
        .with_state(agent)
}

/// An error answered before the request body was read (a missing token, a bad header) would
/// otherwise close the connection under a client still writing its body, which then sees
/// "broken pipe" instead of the answer (see `warren_proto::body_drain`).
async fn drain_after_error(request: Request, next: Next) -> Response {
    warren_proto::body_drain::drain_after_error(request, |r| next.run(r.map(Body::new))).await
}

async fn add_version_header(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert("x-envd-version", HeaderValue::from_static(ENVD_VERSION));
    response
}

/// Paths reachable without `X-Access-Token` (`/files` checks token or signature itself).
fn open_path(method: &Method, path: &str) -> bool {
    matches!(
        (method.as_str(), path),
        ("GET", "/health") | ("POST", "/init") | ("GET", "/files") | ("POST", "/files")
    )
}

async fn require_token(State(agent): State<Arc<Agent>>, request: Request, next: Next) -> Response {
    if !open_path(request.method(), request.uri().path()) && !agent.token_matches(request.headers())
    {
        return json_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized access, please provide a valid access token or method signing if supported",
        );
    }
    next.run(request).await
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn not_found(request: Request) -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        &format!(
            "no such endpoint: {} {}",
            request.method(),
            request.uri().path()
        ),
    )
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitBody {
    env_vars: Option<BTreeMap<String, String>>,
    access_token: Option<String>,
    timestamp: Option<pbjson_types::Timestamp>,
    default_user: Option<String>,
    default_workdir: Option<String>,
    /// Warren's own: a CA certificate (PEM) to add to the trust store (see `trust_store`).
    #[serde(rename = "warrenTrustedCA")]
    warren_trusted_ca: Option<String>,
}

/// `POST /init`: env vars, access token, default user and workdir. The first init may set a
/// token freely; later ones must present the current token (header or body). Init requests
/// older than one already applied are acknowledged and ignored. The clock is not set: a
/// sandbox shares the host kernel's clock.
async fn init(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let parsed: InitBody = if body.iter().all(u8::is_ascii_whitespace) {
        InitBody {
            env_vars: None,
            access_token: None,
            timestamp: None,
            default_user: None,
            default_workdir: None,
            warren_trusted_ca: None,
        }
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => {
                return json_error(StatusCode::BAD_REQUEST, &format!("invalid init body: {e}"))
            }
        }
    };
    if let Some(current) = agent.token() {
        let header_ok = agent.token_matches(&headers);
        let body_ok = parsed
            .access_token
            .as_deref()
            .map(|t| crate::state::constant_time_eq(t.as_bytes(), current.as_bytes()))
            .unwrap_or(false);
        if !header_ok && !body_ok {
            return json_error(StatusCode::UNAUTHORIZED, "access token validation failed");
        }
    }
    if let Some(ts) = &parsed.timestamp {
        let nanos = ts.seconds as i128 * 1_000_000_000 + ts.nanos as i128;
        let mut last = agent
            .last_init_nanos
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if nanos < *last {
            return StatusCode::NO_CONTENT.into_response();
        }
        *last = nanos;
    }
    let trust_vars = match parsed.warren_trusted_ca.as_deref() {
        Some(pem) => match crate::trust_store::install(&agent.root, pem) {
            Ok(vars) => vars,
            Err(e) => {
                return json_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot add the trusted CA: {e}"),
                )
            }
        },
        None => BTreeMap::new(),
    };
    {
        let mut defaults = agent.defaults.write().unwrap_or_else(|p| p.into_inner());
        if let Some(vars) = parsed.env_vars {
            defaults.env_vars = vars;
        }
        for (name, value) in trust_vars {
            defaults.env_vars.entry(name).or_insert(value);
        }
        if let Some(user) = parsed.default_user.filter(|u| !u.is_empty()) {
            defaults.user = user;
        }
        if let Some(workdir) = parsed.default_workdir.filter(|w| !w.is_empty()) {
            defaults.workdir = Some(workdir);
        }
    }
    *agent
        .access_token
        .write()
        .unwrap_or_else(|p| p.into_inner()) = parsed.access_token.filter(|t| !t.is_empty());
    (StatusCode::NO_CONTENT, [("cache-control", "no-store")]).into_response()
}

async fn envs(State(agent): State<Arc<Agent>>) -> Json<BTreeMap<String, String>> {
    Json(agent.defaults().env_vars)
}

async fn metrics_handler(State(agent): State<Arc<Agent>>) -> Json<metrics::Metrics> {
    Json(metrics::collect(&agent.cpu_sampler, &agent.root))
}

#[derive(Debug, serde::Deserialize)]
struct LogsQuery {
    #[serde(default)]
    after: u64,
    limit: Option<usize>,
    /// With nothing after `after` yet, wait this long (milliseconds, at most [`MAX_LOG_WAIT`]) for
    /// an entry before answering.
    #[serde(default)]
    wait_ms: u64,
}

/// The longest a log read waits for a new entry.
const MAX_LOG_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `GET /warren/logs?after=<seq>&limit=<n>[&wait_ms=<ms>]` (Warren's own): the entries of the
/// agent's log after `after`, oldest first, for the server to collect; with `wait_ms`, a long poll.
async fn logs_handler(
    State(agent): State<Arc<Agent>>,
    axum::extract::Query(query): axum::extract::Query<LogsQuery>,
) -> Json<crate::logbook::Page> {
    let wait = std::time::Duration::from_millis(query.wait_ms).min(MAX_LOG_WAIT);
    Json(
        agent
            .logbook
            .after_waiting(query.after, query.limit.unwrap_or(5000), wait)
            .await,
    )
}

/// Dispatches `POST /<service>/<method>` to the RPC handlers.
async fn connect_rpc(
    State(agent): State<Arc<Agent>>,
    Path((service, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (ctx, kind) = match call_context(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let a = agent;
    match (service.as_str(), method.as_str()) {
        ("process.Process", "List") => {
            rpc::unary(ctx, kind, body, |c, r| process::list(a, c, r)).await
        }
        ("process.Process", "Start") => {
            rpc::server_stream(ctx, kind, body, |c, r| process::start(a, c, r)).await
        }
        ("process.Process", "Connect") => {
            rpc::server_stream(ctx, kind, body, |c, r| process::connect(a, c, r)).await
        }
        ("process.Process", "Update") => {
            rpc::unary(ctx, kind, body, |c, r| process::update(a, c, r)).await
        }
        ("process.Process", "SendInput") => {
            rpc::unary(ctx, kind, body, |c, r| process::send_input(a, c, r)).await
        }
        ("process.Process", "StreamInput") => {
            rpc::client_stream(ctx, kind, body, |c, r| process::stream_input(a, c, r)).await
        }
        ("process.Process", "SendSignal") => {
            rpc::unary(ctx, kind, body, |c, r| process::send_signal(a, c, r)).await
        }
        ("process.Process", "CloseStdin") => {
            rpc::unary(ctx, kind, body, |c, r| process::close_stdin(a, c, r)).await
        }
        ("filesystem.Filesystem", "Stat") => {
            rpc::unary(ctx, kind, body, |c, r| fs::stat(a, c, r)).await
        }
        ("filesystem.Filesystem", "MakeDir") => {
            rpc::unary(ctx, kind, body, |c, r| fs::make_dir(a, c, r)).await
        }
        ("filesystem.Filesystem", "Move") => {
            rpc::unary(ctx, kind, body, |c, r| fs::move_entry(a, c, r)).await
        }
        ("filesystem.Filesystem", "ListDir") => {
            rpc::unary(ctx, kind, body, |c, r| fs::list_dir(a, c, r)).await
        }
        ("filesystem.Filesystem", "Remove") => {
            rpc::unary(ctx, kind, body, |c, r| fs::remove(a, c, r)).await
        }
        ("filesystem.Filesystem", "WatchDir") => {
            rpc::server_stream(ctx, kind, body, |c, r| watch::watch_dir(a, c, r)).await
        }
        ("filesystem.Filesystem", "CreateWatcher") => {
            rpc::unary(ctx, kind, body, |c, r| watch::create_watcher(a, c, r)).await
        }
        ("filesystem.Filesystem", "GetWatcherEvents") => {
            rpc::unary(ctx, kind, body, |c, r| watch::get_watcher_events(a, c, r)).await
        }
        ("filesystem.Filesystem", "RemoveWatcher") => {
            rpc::unary(ctx, kind, body, |c, r| watch::remove_watcher(a, c, r)).await
        }
        _ => rpc::unknown_procedure(&format!("/{service}/{method}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request as HttpRequest;
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    use warren_proto::connect::{encode_envelope, Codec, EnvelopeDecoder};
    use warren_proto::envd::process::{
        process_event::Event, ProcessConfig, StartRequest, StartResponse,
    };

    /// An agent whose default user is the current user, rooted in a temp dir.
    fn agent() -> (tempfile::TempDir, Arc<Agent>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
        std::fs::write(
            dir.path().join("etc/passwd"),
            format!("user:x:{uid}:{gid}::/:/bin/sh\n"),
        )
        .unwrap();
        let reaper = crate::reaper::Reaper::global();
        tokio::spawn(reaper.clone().run());
        let agent = Agent::new(dir.path().to_path_buf(), false, reaper);
        (dir, agent)
    }

    async fn call(
        agent: &Arc<Agent>,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, String, Vec<u8>) {
        let request = HttpRequest::post(path)
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap();
        let response = router(agent.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let ct = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let bytes = response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        (status, ct, bytes)
    }

    #[tokio::test]
    async fn unary_json_errors_and_unknown_procedures() {
        let (_dir, agent) = agent();
        let (status, ct, body) = call(
            &agent,
            "/process.Process/List",
            "application/json",
            b"{}".to_vec(),
        )
        .await;
        assert_eq!((status, ct.as_str()), (StatusCode::OK, "application/json"));
        assert_eq!(body, b"{}");
        let (status, _, body) = call(
            &agent,
            "/process.Process/List",
            "application/json",
            b"{".to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8(body)
            .unwrap()
            .contains("invalid_argument"));
        let (status, _, body) = call(
            &agent,
            "/process.Process/Nope",
            "application/json",
            b"{}".to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(String::from_utf8(body).unwrap().contains("unimplemented"));
        let (status, _, _) = call(
            &agent,
            "/filesystem.Filesystem/Stat",
            "text/plain",
            b"{}".to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let (status, _, body) = call(
            &agent,
            "/filesystem.Filesystem/Stat",
            "application/json",
            br#"{"path":"/missing"}"#.to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(String::from_utf8(body).unwrap().contains("not_found"));
    }

    #[tokio::test]
    async fn access_token_is_enforced() {
        let (_dir, agent) = agent();
        *agent.access_token.write().unwrap() = Some("t0k".into());
        let (status, _, _) = call(
            &agent,
            "/process.Process/List",
            "application/json",
            b"{}".to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let request = HttpRequest::get("/health").body(Body::empty()).unwrap();
        let response = router(agent.clone()).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }

    /// A client whose body arrives after the 401 still reads the 401, and the connection stays
    /// usable (without draining, the agent closed it with the body unread and the client's
    /// write failed with "broken pipe").
    #[tokio::test]
    async fn a_rejected_request_whose_body_comes_late_gets_its_answer_on_an_open_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (_dir, agent) = agent();
        *agent.access_token.write().unwrap() = Some("t0k".into());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = router(agent);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_connection(stream, app.clone()));
            }
        });
        let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
        client
            .write_all(
                b"POST /process.Process/List HTTP/1.1\r\nHost: agent\r\n\
                  Content-Type: application/json\r\nContent-Length: 2\r\n\r\n",
            )
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        client.write_all(b"{}").await.unwrap();
        client
            .write_all(b"GET /health HTTP/1.1\r\nHost: agent\r\n\r\n")
            .await
            .unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        let read_both = async {
            loop {
                let n = client.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
                if String::from_utf8_lossy(&seen).contains("HTTP/1.1 204") {
                    break;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), read_both)
            .await
            .expect("the agent answered both requests");
        let seen = String::from_utf8_lossy(&seen);
        assert!(seen.starts_with("HTTP/1.1 401"), "{seen}");
        assert!(
            seen.contains("HTTP/1.1 204"),
            "second request unanswered: {seen}"
        );
    }

    #[tokio::test]
    async fn server_stream_in_binary_proto() {
        let (_dir, agent) = agent();
        let request = StartRequest {
            process: Some(ProcessConfig {
                cmd: "/bin/sh".into(),
                args: vec!["-c".into(), "printf hi; exit 4".into()],
                ..Default::default()
            }),
            stdin: Some(false),
            ..Default::default()
        };
        let body = encode_envelope(0, &Codec::Proto.encode(&request));
        let (status, ct, bytes) = call(
            &agent,
            "/process.Process/Start",
            "application/connect+proto",
            body,
        )
        .await;
        assert_eq!(
            (status, ct.as_str()),
            (StatusCode::OK, "application/connect+proto")
        );
        let mut decoder = EnvelopeDecoder::new(1 << 20);
        decoder.push(&bytes);
        let mut events = Vec::new();
        let mut end_stream = None;
        while let Some(frame) = decoder.next_frame().unwrap() {
            if frame.is_end_stream() {
                end_stream = Some(frame.payload);
            } else {
                let msg: StartResponse = Codec::Proto.decode(&frame.payload).unwrap();
                events.push(msg.event.unwrap().event.unwrap());
            }
        }
        assert_eq!(end_stream.as_deref(), Some(&b"{}"[..]));
        assert!(matches!(events.first(), Some(Event::Start(_))));
        let Some(Event::End(end)) = events.last() else {
            panic!("no end event: {events:?}");
        };
        assert_eq!((end.exit_code, end.exited), (4, true));
        let out: Vec<u8> = events
            .iter()
            .filter_map(|e| match e {
                Event::Data(d) => match &d.output {
                    Some(
                        warren_proto::envd::process::process_event::data_event::Output::Stdout(b),
                    ) => Some(b.clone()),
                    _ => None,
                },
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(out, b"hi");
    }
}
