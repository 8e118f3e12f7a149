//! Calls the agent's `POST /init` after a sandbox starts or is restored, as E2B's orchestrator does:
//! environment variables, the envd access token, the default user and the host clock.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use warren_proto::api::{EnvdInit, ENVD_ACCESS_TOKEN_HEADER};

#[derive(Debug, thiserror::Error)]
pub enum AgentInitError {
    #[error("agent at {addr} did not answer /init within {waited:?}: {last_error}")]
    Unreachable {
        addr: SocketAddr,
        waited: Duration,
        last_error: String,
    },
    #[error("agent at {addr} refused /init with {status}: {body}")]
    Refused {
        addr: SocketAddr,
        status: u16,
        body: String,
    },
    #[error("cannot encode /init request")]
    Encode(#[source] serde_json::Error),
}

/// POST `body` to `http://addr/init`, retrying connection failures until `timeout` passes.
/// `previous_token` is the token the agent already holds (after a restore), sent in `X-Access-Token`.
pub async fn init_agent(
    addr: SocketAddr,
    body: &EnvdInit,
    previous_token: Option<&str>,
    timeout: Duration,
) -> Result<(), AgentInitError> {
    let payload = Bytes::from(serde_json::to_vec(body).map_err(AgentInitError::Encode)?);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let started = Instant::now();
    let mut delay = Duration::from_millis(20);
    loop {
        let mut request = hyper::Request::post(format!("http://{addr}/init"))
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(token) = previous_token {
            request = request.header(ENVD_ACCESS_TOKEN_HEADER, token);
        }
        let request = match request.body(Full::new(payload.clone())) {
            Ok(request) => request,
            Err(error) => {
                return Err(AgentInitError::Unreachable {
                    addr,
                    waited: started.elapsed(),
                    last_error: error.to_string(),
                })
            }
        };
        let remaining = timeout.saturating_sub(started.elapsed());
        let last_error = match tokio::time::timeout(remaining, client.request(request)).await {
            Ok(Ok(response)) => {
                let status = response.status();
                if status.is_success() {
                    return Ok(());
                }
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map(|collected| String::from_utf8_lossy(&collected.to_bytes()).into_owned())
                    .unwrap_or_default();
                return Err(AgentInitError::Refused {
                    addr,
                    status: status.as_u16(),
                    body,
                });
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => "timed out".to_string(),
        };
        if started.elapsed() + delay >= timeout {
            return Err(AgentInitError::Unreachable {
                addr,
                waited: started.elapsed(),
                last_error,
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(250));
    }
}

/// Whether the agent at `addr` answers `GET /health` with a success within `timeout` (one try: a
/// strict pause asks whether the guest responds now, not whether it would eventually).
pub async fn agent_responds(addr: SocketAddr, timeout: Duration) -> bool {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let Ok(request) = hyper::Request::get(format!("http://{addr}/health")).body(Full::default())
    else {
        return false;
    };
    matches!(
        tokio::time::timeout(timeout, client.request(request)).await,
        Ok(Ok(response)) if response.status().is_success()
    )
}
