//! Typed client for Warren's E2B-compatible REST API (`E2B_API_URL`).

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use warren_proto::api::{
    ConnectSandbox, Error as ErrorBody, ListedSandbox, NewSandbox, Sandbox, SandboxDetail,
    SandboxPauseRequest, SandboxState, SandboxTimeoutRequest, Template, API_KEY_HEADER,
    NEXT_TOKEN_HEADER,
};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server answered with a non-success status.
    #[error("{message} (HTTP {status})")]
    Status { status: u16, message: String },
    /// No answer: connection refused, DNS, timeout.
    #[error("cannot reach {url}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer did not have the expected shape.
    #[error("unexpected response from {url}")]
    Decode {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("invalid URL {url:?}")]
    BadUrl {
        url: String,
        #[source]
        source: url::ParseError,
    },
}

/// What kind of failure an error is, for callers that react to it (the CLI maps these to exit codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    NotFound,
    Unauthorized,
    /// Quota reached (429) or a conflicting state (409).
    Refused,
    BadRequest,
    Unreachable,
    Other,
}

impl ApiError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ApiError::Status { status, .. } => match StatusCode::from_u16(*status) {
                Ok(StatusCode::NOT_FOUND) => ErrorKind::NotFound,
                Ok(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => ErrorKind::Unauthorized,
                Ok(StatusCode::TOO_MANY_REQUESTS | StatusCode::CONFLICT) => ErrorKind::Refused,
                Ok(StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY) => {
                    ErrorKind::BadRequest
                }
                _ => ErrorKind::Other,
            },
            ApiError::Unreachable { .. } => ErrorKind::Unreachable,
            ApiError::Decode { .. } | ApiError::BadUrl { .. } => ErrorKind::Other,
        }
    }

    /// Builds the error for a non-success answer from its status and body: E2B's `{"code", "message"}`
    /// when the body has it, else the body text, else the status's reason phrase.
    pub fn from_status_and_body(status: StatusCode, body: &[u8]) -> ApiError {
        let message = match serde_json::from_slice::<ErrorBody>(body) {
            Ok(parsed) if !parsed.message.is_empty() => parsed.message,
            _ => {
                let text = String::from_utf8_lossy(body).trim().to_string();
                if text.is_empty() {
                    status
                        .canonical_reason()
                        .unwrap_or("request failed")
                        .to_string()
                } else {
                    text.chars().take(500).collect()
                }
            }
        };
        ApiError::Status {
            status: status.as_u16(),
            message,
        }
    }
}

/// Filters for [`ApiClient::list_sandboxes`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListQuery {
    /// Empty means both running and paused.
    pub states: Vec<SandboxState>,
    pub metadata: BTreeMap<String, String>,
    pub limit: Option<u32>,
}

/// A client of one Warren server, holding its base URL and API key.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: url::Url,
    api_key: Option<String>,
}

impl ApiClient {
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<ApiClient, ApiError> {
        let base = parse_base_url(base_url)?;
        let http = crate::http_builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|source| ApiError::Unreachable {
                url: base.to_string(),
                source,
            })?;
        Ok(ApiClient {
            http,
            base,
            api_key,
        })
    }

    pub fn base_url(&self) -> &url::Url {
        &self.base
    }

    /// `GET /health`: the server's status and capabilities (`checkpoint`, `pauseMode`, ...).
    pub async fn health(&self) -> Result<serde_json::Value, ApiError> {
        self.send_json(self.request(Method::GET, "health")?).await
    }

    pub async fn create_sandbox(&self, body: &NewSandbox) -> Result<Sandbox, ApiError> {
        self.send_json(self.request(Method::POST, "sandboxes")?.json(body))
            .await
    }

    /// Every sandbox matching `query`, following `x-next-token` pages until `limit` is reached.
    pub async fn list_sandboxes(&self, query: &ListQuery) -> Result<Vec<ListedSandbox>, ApiError> {
        let mut all = Vec::new();
        let mut next_token: Option<String> = None;
        loop {
            let mut params: Vec<(&str, String)> = Vec::new();
            if !query.states.is_empty() {
                let states: Vec<&str> = query.states.iter().map(|s| s.as_str()).collect();
                params.push(("state", states.join(",")));
            }
            if !query.metadata.is_empty() {
                params.push(("metadata", encode_metadata_filter(&query.metadata)));
            }
            if let Some(limit) = query.limit {
                params.push((
                    "limit",
                    (limit as usize - all.len().min(limit as usize)).to_string(),
                ));
            }
            if let Some(token) = &next_token {
                params.push(("nextToken", token.clone()));
            }
            let response = self
                .send(self.request(Method::GET, "v2/sandboxes")?.query(&params))
                .await?;
            next_token = response
                .headers()
                .get(NEXT_TOKEN_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_string);
            let url = response.url().to_string();
            let page: Vec<ListedSandbox> = response
                .json()
                .await
                .map_err(|source| ApiError::Decode { url, source })?;
            let page_was_empty = page.is_empty();
            all.extend(page);
            let reached_limit = query.limit.is_some_and(|limit| all.len() >= limit as usize);
            if next_token.is_none() || page_was_empty || reached_limit {
                break;
            }
        }
        if let Some(limit) = query.limit {
            all.truncate(limit as usize);
        }
        Ok(all)
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxDetail, ApiError> {
        self.send_json(self.request(Method::GET, &format!("sandboxes/{}", path_segment(id)))?)
            .await
    }

    /// The user's own sandbox (`POST /workspaces/{user_id}/sandbox`): created, resumed or replaced as
    /// needed.
    pub async fn workspace_sandbox(
        &self,
        user_id: &str,
        body: &warren_proto::api::WorkspaceSandboxRequest,
    ) -> Result<warren_proto::api::WorkspaceSandbox, ApiError> {
        self.send_json(
            self.request(
                Method::POST,
                &format!("workspaces/{}/sandbox", path_segment(user_id)),
            )?
            .json(body),
        )
        .await
    }

    /// Every sandbox the user was given, and why (`GET /workspaces/{user_id}/history`).
    pub async fn workspace_history(
        &self,
        user_id: &str,
    ) -> Result<warren_proto::api::WorkspaceHistory, ApiError> {
        self.send_json(self.request(
            Method::GET,
            &format!("workspaces/{}/history", path_segment(user_id)),
        )?)
        .await
    }

    pub async fn kill_sandbox(&self, id: &str) -> Result<(), ApiError> {
        self.send(self.request(Method::DELETE, &format!("sandboxes/{}", path_segment(id)))?)
            .await
            .map(drop)
    }

    /// Warren's own `GET /sandboxes/{id}/processes`: a running sandbox's processes, busiest first.
    pub async fn sandbox_processes(
        &self,
        id: &str,
    ) -> Result<Vec<warren_proto::api::SandboxProcess>, ApiError> {
        self.send_json(self.request(
            Method::GET,
            &format!("sandboxes/{}/processes", path_segment(id)),
        )?)
        .await
    }

    /// `GET /events/sandboxes[/{id}]`: lifecycle events, with E2B's query parameters (`offset`,
    /// `limit`, `orderAsc`, `types`) and Warren's `after` (events after this id only).
    pub async fn lifecycle_events(
        &self,
        sandbox_id: Option<&str>,
        query: &[(&str, String)],
    ) -> Result<Vec<warren_proto::api::SandboxLifecycleEvent>, ApiError> {
        let path = match sandbox_id {
            Some(id) => format!("events/sandboxes/{}", path_segment(id)),
            None => "events/sandboxes".to_string(),
        };
        self.send_json(self.request(Method::GET, &path)?.query(query))
            .await
    }

    /// `GET /v2/sandboxes/{id}/logs` with `query` (cursor, limit, direction, level, search).
    pub async fn sandbox_logs(
        &self,
        id: &str,
        query: &[(&str, String)],
    ) -> Result<Vec<warren_proto::api::SandboxLogEntry>, ApiError> {
        let path = format!("v2/sandboxes/{}/logs", path_segment(id));
        let page: warren_proto::api::SandboxLogsV2 = self
            .send_json(self.request(Method::GET, &path)?.query(query))
            .await?;
        Ok(page.logs)
    }

    /// Warren's own `GET /sandboxes/{id}/disk?count=N`.
    pub async fn sandbox_disk_usage(
        &self,
        id: &str,
        count: usize,
    ) -> Result<warren_proto::api::SandboxDiskUsage, ApiError> {
        self.send_json(
            self.request(Method::GET, &format!("sandboxes/{}/disk", path_segment(id)))?
                .query(&[("count", count.to_string())]),
        )
        .await
    }

    /// Warren's own `GET /sandboxes/{id}/orphans` (or `DELETE` with `kill`, which ends them).
    pub async fn sandbox_orphans(
        &self,
        id: &str,
        kill: bool,
    ) -> Result<Vec<warren_proto::api::SandboxProcess>, ApiError> {
        let method = if kill { Method::DELETE } else { Method::GET };
        self.send_json(self.request(method, &format!("sandboxes/{}/orphans", path_segment(id)))?)
            .await
    }

    /// Warren's own `DELETE /sandboxes/{id}/processes/{pid}?signal=…`.
    pub async fn signal_process(&self, id: &str, pid: u32, signal: &str) -> Result<(), ApiError> {
        self.send(
            self.request(
                Method::DELETE,
                &format!("sandboxes/{}/processes/{pid}", path_segment(id)),
            )?
            .query(&[("signal", signal)]),
        )
        .await
        .map(drop)
    }

    /// `GET /sandboxes/{id}/metrics[?start=…]`: the sampled series, oldest first.
    pub async fn sandbox_metrics(
        &self,
        id: &str,
        start_unix: Option<i64>,
    ) -> Result<Vec<warren_proto::api::SandboxMetric>, ApiError> {
        let mut request = self.request(
            Method::GET,
            &format!("sandboxes/{}/metrics", path_segment(id)),
        )?;
        if let Some(start) = start_unix {
            request = request.query(&[("start", start.to_string())]);
        }
        self.send_json(request).await
    }

    pub async fn pause_sandbox(&self, id: &str) -> Result<(), ApiError> {
        self.pause_sandbox_as(id, &SandboxPauseRequest::default())
            .await
    }

    /// Pauses keeping what `request` says (`memory: false`: the files only; `requireHealthyGuest`).
    pub async fn pause_sandbox_as(
        &self,
        id: &str,
        request: &SandboxPauseRequest,
    ) -> Result<(), ApiError> {
        self.send(
            self.request(
                Method::POST,
                &format!("sandboxes/{}/pause", path_segment(id)),
            )?
            .json(request),
        )
        .await
        .map(drop)
    }

    /// Connects to a sandbox, resuming it when paused, and sets its timeout (`POST /sandboxes/{id}/connect`).
    pub async fn connect_sandbox(&self, id: &str, timeout_secs: i64) -> Result<Sandbox, ApiError> {
        self.connect_sandbox_as(
            id,
            &ConnectSandbox {
                timeout: Some(timeout_secs),
                ..ConnectSandbox::default()
            },
        )
        .await
    }

    /// [`Self::connect_sandbox`] with the whole body (`memory: false` boots a paused sandbox afresh
    /// over its files).
    pub async fn connect_sandbox_as(
        &self,
        id: &str,
        body: &ConnectSandbox,
    ) -> Result<Sandbox, ApiError> {
        self.send_json(
            self.request(
                Method::POST,
                &format!("sandboxes/{}/connect", path_segment(id)),
            )?
            .json(body),
        )
        .await
    }

    pub async fn set_timeout(&self, id: &str, timeout_secs: i64) -> Result<(), ApiError> {
        let body = SandboxTimeoutRequest {
            timeout: timeout_secs,
        };
        self.send(
            self.request(
                Method::POST,
                &format!("sandboxes/{}/timeout", path_segment(id)),
            )?
            .json(&body),
        )
        .await
        .map(drop)
    }

    pub async fn list_templates(&self) -> Result<Vec<Template>, ApiError> {
        self.send_json(self.request(Method::GET, "templates")?)
            .await
    }

    /// Legacy `POST /templates`: request a Dockerfile build; start it with [`Self::start_dockerfile_build`].
    pub async fn request_dockerfile_build(
        &self,
        body: &warren_proto::api::TemplateBuildRequest,
    ) -> Result<warren_proto::api::TemplateRequestResponse, ApiError> {
        self.send_json(self.request(Method::POST, "templates")?.json(body))
            .await
    }

    /// `GET /templates/{id}/files/{hash}`: whether an archive is already on the server, or where to put it.
    pub async fn template_files_link(
        &self,
        template_id: &str,
        hash: &str,
    ) -> Result<warren_proto::api::TemplateBuildFileUpload, ApiError> {
        let path = format!(
            "templates/{}/files/{}",
            path_segment(template_id),
            path_segment(hash)
        );
        self.send_json(self.request(Method::GET, &path)?).await
    }

    /// PUTs an archive to the URL [`Self::template_files_link`] handed out.
    pub async fn upload_template_files(&self, url: &str, archive: Vec<u8>) -> Result<(), ApiError> {
        let url = url::Url::parse(url).map_err(|source| ApiError::BadUrl {
            url: url.to_string(),
            source,
        })?;
        self.send(self.http.put(url).body(archive)).await.map(drop)
    }

    /// Legacy `POST /templates/{id}/builds/{buildID}`: start a requested Dockerfile build.
    pub async fn start_dockerfile_build(
        &self,
        template_id: &str,
        build_id: &str,
    ) -> Result<(), ApiError> {
        let path = format!(
            "templates/{}/builds/{}",
            path_segment(template_id),
            path_segment(build_id)
        );
        self.send(self.request(Method::POST, &path)?)
            .await
            .map(drop)
    }

    /// `GET /templates/{id}/builds/{buildID}/status?logsOffset=N`.
    pub async fn template_build_status(
        &self,
        template_id: &str,
        build_id: &str,
        logs_offset: usize,
    ) -> Result<warren_proto::api::TemplateBuildInfo, ApiError> {
        let path = format!(
            "templates/{}/builds/{}/status",
            path_segment(template_id),
            path_segment(build_id)
        );
        self.send_json(
            self.request(Method::GET, &path)?
                .query(&[("logsOffset", logs_offset.to_string())]),
        )
        .await
    }

    /// `DELETE /templates/{id}[?force=true]`.
    pub async fn delete_template(&self, template_id: &str, force: bool) -> Result<(), ApiError> {
        let path = format!("templates/{}", path_segment(template_id));
        let mut request = self.request(Method::DELETE, &path)?;
        if force {
            request = request.query(&[("force", "true")]);
        }
        self.send(request).await.map(drop)
    }

    /// Moves a running sandbox to another node (`POST /sandboxes/{id}/migrate`, cluster mode);
    /// the answer has `sandbox`, `from` and `to`.
    pub async fn migrate_sandbox(&self, id: &str) -> Result<serde_json::Value, ApiError> {
        self.send_json(self.request(
            Method::POST,
            &format!("sandboxes/{}/migrate", path_segment(id)),
        )?)
        .await
    }

    /// The server's nodes (`GET /nodes`, admin keys): `nodeID`, `url`, `up`, `draining`,
    /// `sandboxes` each.
    pub async fn list_nodes(&self) -> Result<Vec<serde_json::Value>, ApiError> {
        self.send_json(self.request(Method::GET, "nodes")?).await
    }

    /// The live servers sharing the store (`GET /servers`, admin keys).
    pub async fn list_servers(&self) -> Result<Vec<serde_json::Value>, ApiError> {
        self.send_json(self.request(Method::GET, "servers")?).await
    }

    /// Drains a node (`POST /nodes/{id}/drain`); the answer lists what `moved` and what `failed`.
    pub async fn drain_node(&self, node: &str) -> Result<serde_json::Value, ApiError> {
        self.send_json(self.request(Method::POST, &format!("nodes/{}/drain", path_segment(node)))?)
            .await
    }

    /// Lets new sandboxes on a drained node again (`DELETE /nodes/{id}/drain`).
    pub async fn undrain_node(&self, node: &str) -> Result<(), ApiError> {
        self.send(self.request(
            Method::DELETE,
            &format!("nodes/{}/drain", path_segment(node)),
        )?)
        .await
        .map(drop)
    }

    fn request(&self, method: Method, path: &str) -> Result<RequestBuilder, ApiError> {
        let url = self.base.join(path).map_err(|source| ApiError::BadUrl {
            url: format!("{}{path}", self.base),
            source,
        })?;
        let mut request = self.http.request(method, url);
        if let Some(key) = &self.api_key {
            request = request.header(API_KEY_HEADER, key);
        }
        Ok(request)
    }

    async fn send(&self, request: RequestBuilder) -> Result<Response, ApiError> {
        let response = request
            .send()
            .await
            .map_err(|source| ApiError::Unreachable {
                url: self.base.to_string(),
                source,
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.bytes().await.unwrap_or_default();
        Err(ApiError::from_status_and_body(status, &body))
    }

    async fn send_json<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T, ApiError> {
        let response = self.send(request).await?;
        let url = response.url().to_string();
        response
            .json()
            .await
            .map_err(|source| ApiError::Decode { url, source })
    }
}

/// Parses a base URL and makes sure it ends in `/`, so that `join("sandboxes")` keeps a path prefix.
pub(crate) fn parse_base_url(raw: &str) -> Result<url::Url, ApiError> {
    let with_slash = if raw.ends_with('/') {
        raw.to_string()
    } else {
        format!("{raw}/")
    };
    url::Url::parse(&with_slash).map_err(|source| ApiError::BadUrl {
        url: raw.to_string(),
        source,
    })
}

/// The `metadata` query value of `GET /v2/sandboxes`: `k1=v1&k2=v2`, each part form-encoded (as the SDK's
/// `urlencode` does); the query string encoding then wraps it once more.
fn encode_metadata_filter(metadata: &BTreeMap<String, String>) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(metadata)
        .finish()
}

/// An ID as one path segment: anything outside unreserved characters is percent-encoded so an ID can
/// never add path segments or a query.
fn path_segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_kinds() {
        let kind = |status: u16| {
            ApiError::Status {
                status,
                message: String::new(),
            }
            .kind()
        };
        assert_eq!(kind(404), ErrorKind::NotFound);
        assert_eq!(kind(401), ErrorKind::Unauthorized);
        assert_eq!(kind(403), ErrorKind::Unauthorized);
        assert_eq!(kind(429), ErrorKind::Refused);
        assert_eq!(kind(409), ErrorKind::Refused);
        assert_eq!(kind(400), ErrorKind::BadRequest);
        assert_eq!(kind(500), ErrorKind::Other);
        assert_eq!(kind(502), ErrorKind::Other);
    }

    #[test]
    fn error_message_comes_from_e2b_error_body() {
        let err = ApiError::from_status_and_body(
            StatusCode::NOT_FOUND,
            br#"{"code":404,"message":"template 'nope' not found"}"#,
        );
        assert_eq!(err.to_string(), "template 'nope' not found (HTTP 404)");
        assert_eq!(err.kind(), ErrorKind::NotFound);
    }

    #[test]
    fn error_message_falls_back_to_text_then_reason() {
        let err = ApiError::from_status_and_body(StatusCode::BAD_GATEWAY, b"  upstream gone \n");
        assert_eq!(err.to_string(), "upstream gone (HTTP 502)");
        let err = ApiError::from_status_and_body(StatusCode::UNAUTHORIZED, b"");
        assert_eq!(err.to_string(), "Unauthorized (HTTP 401)");
    }

    #[test]
    fn base_url_keeps_its_path_prefix() {
        let base = parse_base_url("http://127.0.0.1:3000/api").expect("valid");
        assert_eq!(
            base.join("sandboxes").expect("joins").as_str(),
            "http://127.0.0.1:3000/api/sandboxes"
        );
        assert!(parse_base_url("not a url").is_err());
    }

    #[test]
    fn ids_cannot_escape_their_path_segment() {
        assert_eq!(path_segment("abc-123_x"), "abc-123_x");
        assert_eq!(path_segment("../templates?x=1"), "..%2Ftemplates%3Fx%3D1");
    }

    #[test]
    fn metadata_filter_is_form_encoded() {
        let metadata = BTreeMap::from([
            ("a b".to_string(), "1&2".to_string()),
            ("k".to_string(), "v".to_string()),
        ]);
        assert_eq!(encode_metadata_filter(&metadata), "a+b=1%262&k=v");
    }

    #[tokio::test]
    async fn unreachable_server_is_reported_as_such() {
        // Bind then drop a listener so the port is (very likely) closed.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let client = ApiClient::new(&format!("http://{addr}"), None).expect("client");
        let err = client.list_templates().await.expect_err("nothing listens");
        assert_eq!(err.kind(), ErrorKind::Unreachable, "{err:?}");
    }

    #[tokio::test]
    async fn sends_the_api_key_and_maps_a_401() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            let body = br#"{"code":401,"message":"Invalid API key"}"#;
            let head = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            socket.write_all(head.as_bytes()).await.expect("write");
            socket.write_all(body).await.expect("write");
            String::from_utf8_lossy(&request).to_lowercase()
        });
        let client =
            ApiClient::new(&format!("http://{addr}"), Some("wk_secret".into())).expect("client");
        let err = client.get_sandbox("sbx1").await.expect_err("401");
        assert_eq!(err.kind(), ErrorKind::Unauthorized);
        assert_eq!(err.to_string(), "Invalid API key (HTTP 401)");
        let request = server.await.expect("server task");
        assert!(request.starts_with("get /sandboxes/sbx1 "), "{request}");
        assert!(request.contains("x-api-key: wk_secret"), "{request}");
    }
}
