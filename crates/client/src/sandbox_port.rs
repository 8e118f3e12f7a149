//! A client of one port of one sandbox, reached through Warren's sandbox proxy (`E2B_SANDBOX_URL`)
//! with the `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers, for JSON services a sandbox runs (the
//! lab's app, `warren lab`). Whatever such a service answers was written by the sandbox: callers
//! treat it as untrusted data.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::{parse_base_url, ApiError};

/// Most bytes read of one answer: a sandbox's service cannot make the caller hold more.
const MAX_ANSWER_BYTES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct SandboxPortClient {
    http: reqwest::Client,
    base: url::Url,
    headers: HeaderMap,
}

impl SandboxPortClient {
    pub fn new(sandbox_url: &str, sandbox_id: &str, port: u16) -> Result<Self, ApiError> {
        let base = parse_base_url(sandbox_url)?;
        let mut headers = HeaderMap::new();
        let id = HeaderValue::from_str(sandbox_id).map_err(|_| ApiError::Status {
            status: 400,
            message: format!("invalid sandbox ID {sandbox_id:?}"),
        })?;
        headers.insert("E2b-Sandbox-Id", id);
        headers.insert("E2b-Sandbox-Port", HeaderValue::from(port));
        let http = crate::http_builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|source| ApiError::Unreachable {
                url: base.to_string(),
                source,
            })?;
        Ok(SandboxPortClient {
            http,
            base,
            headers,
        })
    }

    /// `GET path`, the answer's JSON body.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        self.call(Method::GET, path, None::<&()>).await
    }

    /// `POST path` with a JSON body, the answer's JSON body.
    pub async fn post_json<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        self.call(Method::POST, path, Some(body)).await
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ApiError> {
        let url = self
            .base
            .join(path.trim_start_matches('/'))
            .map_err(|source| ApiError::BadUrl {
                url: path.to_string(),
                source,
            })?;
        let mut request = self
            .http
            .request(method, url.clone())
            .headers(self.headers.clone());
        if let Some(body) = body {
            request = request.json(body);
        }
        let mut response = request
            .send()
            .await
            .map_err(|source| ApiError::Unreachable {
                url: url.to_string(),
                source,
            })?;
        let status = response.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|source| ApiError::Unreachable {
                url: url.to_string(),
                source,
            })?
        {
            if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(ApiError::Status {
                    status: 502,
                    message: format!("{url} answered more than {MAX_ANSWER_BYTES} bytes"),
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(ApiError::from_status_and_body(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ApiError::Status {
            status: 502,
            message: format!("{url} answered something that is not the expected JSON: {e}"),
        })
    }
}
