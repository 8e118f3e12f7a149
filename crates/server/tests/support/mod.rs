//! Shared helpers of the server's integration tests.
#![allow(dead_code)]

pub mod fake_runtime;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use warren_server::ServerConfig;
use warren_testkit::TestServer;

pub use fake_runtime::FakeRuntime;

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<serde_json::Value>,
) -> Answer {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = match body {
        Some(json) => {
            request = request.header("content-type", "application/json");
            Bytes::from(json.to_string())
        }
        None => Bytes::new(),
    };
    send_request(client, request, body).await
}

/// A request with a raw body (uploads).
pub async fn send_bytes(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Answer {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send_request(client, request, body).await
}

async fn send_request(
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    request: hyper::http::request::Builder,
    body: Bytes,
) -> Answer {
    let response = client
        .request(request.body(Full::new(body)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body,
    }
}

/// A test server on the fake runtime.
pub struct Harness {
    pub server: TestServer,
    pub runtime: Arc<FakeRuntime>,
}

impl Harness {
    pub async fn start(checkpoint: bool, adjust: impl FnOnce(&mut ServerConfig)) -> Harness {
        let runtime = FakeRuntime::new(checkpoint);
        Self::start_on(runtime, adjust).await
    }

    pub async fn start_on(
        runtime: Arc<FakeRuntime>,
        adjust: impl FnOnce(&mut ServerConfig),
    ) -> Harness {
        let server = TestServer::start(
            runtime.clone(),
            PathBuf::from("/nonexistent/wt-rootfs"),
            adjust,
        )
        .await
        .unwrap();
        Harness { server, runtime }
    }

    pub async fn api(&self, method: Method, path: &str, body: Option<serde_json::Value>) -> Answer {
        let url = format!("{}{}", self.server.api_url, path);
        send(method, &url, &[("X-API-Key", &self.server.api_key)], body).await
    }

    /// The same request with another API key.
    pub async fn api_as(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Answer {
        let url = format!("{}{}", self.server.api_url, path);
        send(method, &url, &[("X-API-Key", key)], body).await
    }

    pub async fn create(&self, body: serde_json::Value) -> serde_json::Value {
        let answer = self.api(Method::POST, "/v2/sandboxes", Some(body)).await;
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        answer.json()
    }

    /// Makes team `name` and a key of it (as the harness's admin key); returns the key.
    pub async fn team_key(&self, name: &str) -> String {
        let team = self
            .api(
                Method::POST,
                "/teams",
                Some(serde_json::json!({"name": name})),
            )
            .await;
        assert_eq!(team.status, StatusCode::CREATED, "{:?}", team.json());
        let made = self
            .api(
                Method::POST,
                "/api-keys",
                Some(serde_json::json!({"name": format!("{name}-ci"), "teamID": name})),
            )
            .await;
        assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.json());
        made.json()["key"]
            .as_str()
            .expect("the new key")
            .to_string()
    }

    pub async fn proxy(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let url = format!("{}{}", self.server.sandbox_url, path);
        send(Method::GET, &url, headers, None).await
    }
}

/// `answer` has `status` and E2B's error body `{code, message}` whose message contains `needle`.
pub fn assert_error(answer: &Answer, status: StatusCode, needle: &str) {
    assert_eq!(
        answer.status,
        status,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let body = answer.json();
    assert_eq!(body["code"], serde_json::json!(status.as_u16()));
    let message = body["message"].as_str().unwrap();
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

/// Stores template `id`, a copy of `base` whose build ended with a checkpoint of its start command
/// running (what the build runner leaves), so its sandboxes start by restoring that checkpoint.
pub async fn running_state_template(h: &Harness, id: &str) -> warren_server::store::TemplateRecord {
    use warren_runtime::Runtime;
    use warren_server::templates::builder::versions::{
        BuiltTemplate, TemplateStart, TemplateVersions,
    };

    let store = h.server.server.lifecycle.store().clone();
    let base = store.get_template("base").await.unwrap().unwrap();
    let versions = TemplateVersions::new(h.server.state_dir());
    let checkpoint = versions.build_dir(id, "b1").unwrap().join("checkpoint");
    let builder = format!("{id}-builder");
    h.runtime.start_untracked(&builder);
    h.runtime.checkpoint(&builder, &checkpoint, false).unwrap();
    versions
        .save(&BuiltTemplate {
            template_id: id.into(),
            build_id: "b1".into(),
            created_at: "2026-12-02T00:00:00Z".into(),
            layers: base.layers.clone(),
            layer_keys: Vec::new(),
            final_key: String::new(),
            env: Default::default(),
            user: "user".into(),
            workdir: "/home/user".into(),
            start_cmd: Some("python3 -m http.server".into()),
            ready_cmd: None,
            cpu_count: None,
            memory_mb: None,
            privileges: Default::default(),
            start: TemplateStart::Checkpoint { dir: checkpoint },
            build_seconds: 1.0,
            cached_steps: 0,
            total_steps: 1,
        })
        .unwrap();
    let mut template = base;
    template.id = id.to_string();
    template.aliases = Vec::new();
    template.build_id = "b1".to_string();
    store.upsert_template(&template).await.unwrap();
    template
}
