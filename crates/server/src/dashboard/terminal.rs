//! The terminal: a WebSocket from the browser, bridged to a login shell on a PTY that the sandbox's
//! agent runs (envd's process service, through the same client as `warren sandbox shell`).
//!
//! Frames: binary from the browser is keyboard input (written in order, in chunks, each awaited, so
//! a large paste arrives whole); text from the browser is a JSON control message (`resize`, `close`).
//! Binary to the browser is PTY output; text is JSON status (`started` with the shell's pid, `exited`,
//! `error`).
//!
//! The shell outlives the WebSocket: a browser that lost its connection reconnects with `?pid=` and
//! attaches to the same shell (envd's `Connect`); output written while detached is not replayed. A
//! `close` control message (the page's "end session") kills the shell.

use std::collections::HashMap;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use warren_client::{EnvdClient, ProcessOutput, ProcessSpec, ProcessStream};

use super::{envd_for, sessions};
use crate::api::auth::Authenticated;
use crate::api::error::ApiError;
use crate::api::AppState;

/// Input is forwarded to envd in pieces of at most this size.
const INPUT_CHUNK: usize = 32 * 1024;

pub fn router() -> Router<AppState> {
    Router::new().route("/dashboard/api/sandboxes/{id}/terminal", get(terminal))
}

#[derive(Deserialize)]
struct TerminalQuery {
    /// The session's CSRF token (a WebSocket handshake cannot carry custom headers).
    #[serde(default)]
    csrf: String,
    /// Attach to this running shell instead of starting one.
    pid: Option<u32>,
    cols: Option<u16>,
    rows: Option<u16>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Control {
    Resize { cols: u16, rows: u16 },
    Close,
}

/// Refuses a handshake from another origin, and one made with a session but without its CSRF token.
fn check_handshake(state: &AppState, headers: &HeaderMap, csrf: &str) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let origin_host = origin.split_once("://").map(|(_, rest)| rest);
        if origin_host.is_none() || origin_host != host {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "terminal WebSocket from another origin",
            ));
        }
    }
    if let Some(id) = sessions::session_id(headers) {
        let session = state
            .dashboard
            .get(&id)
            .ok_or_else(|| ApiError::unauthorized("dashboard session expired or unknown"))?;
        if !sessions::same_token(csrf, &session.csrf) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "missing or wrong csrf parameter for this dashboard session",
            ));
        }
    }
    Ok(())
}

async fn terminal(
    auth: Authenticated,
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<TerminalQuery>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    check_handshake(&state, &headers, &query.csrf)?;
    let record = auth.sandbox(&state, &id).await?;
    let envd = envd_for(&state, &record).await?;
    let size = (
        query.cols.unwrap_or(80).clamp(2, 1000),
        query.rows.unwrap_or(24).clamp(2, 1000),
    );
    Ok(upgrade.on_upgrade(move |socket| bridge(socket, envd, query.pid, size)))
}

fn status(value: serde_json::Value) -> Message {
    Message::Text(value.to_string().into())
}

async fn open(
    envd: &EnvdClient,
    pid: Option<u32>,
    size: (u16, u16),
) -> Result<(ProcessStream, u32), warren_client::EnvdError> {
    if let Some(pid) = pid {
        let stream = envd.connect(pid).await?;
        envd.resize_pty(pid, size.0, size.1).await?;
        return Ok((stream, pid));
    }
    let spec = ProcessSpec {
        cmd: "/bin/bash".into(),
        args: vec!["-i".into(), "-l".into()],
        envs: HashMap::from(
            [
                ("TERM", "xterm-256color"),
                ("LANG", "C.UTF-8"),
                ("LC_ALL", "C.UTF-8"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        ),
        cwd: None,
        pty: Some(size),
        stdin: false,
    };
    let mut stream = envd.start(&spec).await?;
    match stream.next().await? {
        Some(ProcessOutput::Started { pid }) => Ok((stream, pid)),
        other => Err(warren_client::EnvdError::Rpc {
            code: "internal".into(),
            message: format!("envd did not start the shell (first event: {other:?})"),
        }),
    }
}

async fn bridge(socket: WebSocket, envd: EnvdClient, pid: Option<u32>, size: (u16, u16)) {
    let (mut sink, mut source) = socket.split();
    let (mut stream, pid) = match open(&envd, pid, size).await {
        Ok(opened) => opened,
        Err(error) => {
            let _ = sink
                .send(status(
                    serde_json::json!({"type": "error", "message": error.to_string()}),
                ))
                .await;
            let _ = sink.close().await;
            return;
        }
    };
    if sink
        .send(status(serde_json::json!({"type": "started", "pid": pid})))
        .await
        .is_err()
    {
        return;
    }
    let output = async {
        loop {
            let message = match stream.next().await {
                Ok(Some(
                    ProcessOutput::Pty(bytes)
                    | ProcessOutput::Stdout(bytes)
                    | ProcessOutput::Stderr(bytes),
                )) => Message::Binary(bytes.into()),
                Ok(Some(ProcessOutput::Started { .. })) => continue,
                Ok(Some(ProcessOutput::Ended(end))) => {
                    status(serde_json::json!({"type": "exited", "code": end.shell_exit_code()}))
                }
                Ok(None) => status(serde_json::json!({"type": "exited", "code": null})),
                Err(error) => {
                    status(serde_json::json!({"type": "error", "message": error.to_string()}))
                }
            };
            let last = matches!(message, Message::Text(_));
            if sink.send(message).await.is_err() || last {
                break;
            }
        }
        let _ = sink.close().await;
    };
    let input = async {
        while let Some(Ok(message)) = source.next().await {
            let result = match message {
                Message::Binary(bytes) => {
                    let mut sent = Ok(());
                    for chunk in bytes.chunks(INPUT_CHUNK) {
                        sent = envd.send_pty_input(pid, chunk.to_vec()).await;
                        if sent.is_err() {
                            break;
                        }
                    }
                    sent
                }
                Message::Text(text) => match serde_json::from_str::<Control>(text.as_str()) {
                    Ok(Control::Resize { cols, rows }) => {
                        envd.resize_pty(pid, cols.clamp(2, 1000), rows.clamp(2, 1000))
                            .await
                    }
                    Ok(Control::Close) => {
                        let _ = envd.kill(pid).await;
                        break;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "ignoring an unreadable terminal control message");
                        Ok(())
                    }
                },
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => Ok(()),
            };
            if let Err(error) = result {
                tracing::debug!(pid, %error, "terminal input not delivered");
                break;
            }
        }
    };
    tokio::select! {
        () = output => {}
        () = input => {}
    }
}
