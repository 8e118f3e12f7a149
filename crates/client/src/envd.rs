//! Client of the envd protocol a sandbox's agent speaks, reached through Warren's sandbox proxy
//! (`E2B_SANDBOX_URL`) with the `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers, as the E2B SDK does.
//!
//! RPCs use the Connect protocol over HTTP/1.1 with protobuf bodies: unary calls post
//! `application/proto`, server-streaming calls post one enveloped message as `application/connect+proto`
//! and read envelopes until the end-of-stream trailer. Files go over envd's plain `/files` endpoint.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use futures_util::StreamExt;
use prost::Message;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::StatusCode;
use serde::Deserialize;

use crate::api::{parse_base_url, ErrorKind};
use warren_proto::connect::{encode_envelope, EnvelopeDecoder, ProtocolError};
use warren_proto::envd::filesystem::{
    EntryInfo, ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse,
};
use warren_proto::envd::filesystem::{RemoveRequest, RemoveResponse};
use warren_proto::envd::process::{
    process_event, process_input, process_selector, pty, CloseStdinRequest, CloseStdinResponse,
    ConnectRequest, ProcessConfig, ProcessEvent, ProcessInput, ProcessSelector, Pty,
    SendInputRequest, SendInputResponse, SendSignalRequest, SendSignalResponse, Signal,
    StartRequest, StartResponse, UpdateRequest, UpdateResponse,
};

pub use warren_proto::envd::ENVD_PORT;

/// Largest single message accepted from envd: a broken or hostile peer must not make us allocate
/// gigabytes.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// What the sandbox proxy's 502 says when the sandbox does not exist (any more).
const SANDBOX_NOT_FOUND_MESSAGE: &str = "was not found";
/// How often we ask envd to send keep-alive events on streams (seconds), like the SDK.
const KEEPALIVE_PING_SECS: u32 = 50;

#[derive(Debug, thiserror::Error)]
pub enum EnvdError {
    /// The proxy or envd answered with a non-success HTTP status before any RPC result.
    #[error("{message} (HTTP {status})")]
    Http { status: u16, message: String },
    /// envd answered with a Connect error (`not_found`, `invalid_argument`, ...).
    #[error("{message} ({code})")]
    Rpc { code: String, message: String },
    #[error("cannot reach the sandbox proxy at {url}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("connection to the sandbox broke")]
    Transport(#[source] reqwest::Error),
    #[error("bad Connect framing from envd")]
    Framing(#[from] ProtocolError),
    #[error("undecodable message from envd")]
    Decode(#[from] prost::DecodeError),
    #[error("invalid sandbox URL")]
    BadUrl(#[from] crate::api::ApiError),
    #[error("invalid header value for {0}")]
    BadHeader(&'static str),
}

impl EnvdError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            // Like E2B's proxy, Warren's answers 502 "The sandbox <id> was not found" for a sandbox
            // that is gone; the E2B SDK keys on the same words.
            EnvdError::Http {
                status: 502,
                message,
            } if message.contains(SANDBOX_NOT_FOUND_MESSAGE) => ErrorKind::NotFound,
            EnvdError::Http { status, .. } => match *status {
                404 => ErrorKind::NotFound,
                401 | 403 => ErrorKind::Unauthorized,
                409 | 429 => ErrorKind::Refused,
                400 => ErrorKind::BadRequest,
                _ => ErrorKind::Other,
            },
            EnvdError::Rpc { code, .. } => match code.as_str() {
                "not_found" => ErrorKind::NotFound,
                "unauthenticated" | "permission_denied" => ErrorKind::Unauthorized,
                "resource_exhausted" | "already_exists" | "failed_precondition" => {
                    ErrorKind::Refused
                }
                "invalid_argument" => ErrorKind::BadRequest,
                _ => ErrorKind::Other,
            },
            EnvdError::Unreachable { .. } => ErrorKind::Unreachable,
            _ => ErrorKind::Other,
        }
    }
}

/// A Connect error body (unary error response or the `error` member of a stream trailer).
#[derive(Debug, Deserialize)]
struct ConnectErrorBody {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

#[derive(Debug, Deserialize)]
struct EndStreamTrailer {
    #[serde(default)]
    error: Option<ConnectErrorBody>,
}

/// What to run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessSpec {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: HashMap<String, String>,
    pub cwd: Option<String>,
    /// Terminal size (cols, rows) for a PTY process; `None` for plain pipes.
    pub pty: Option<(u16, u16)>,
    /// Keep stdin open for [`EnvdClient::send_stdin`].
    pub stdin: bool,
}

impl ProcessSpec {
    /// `bash -l -c <command>`, the way the E2B SDK's `commands.run` starts a command.
    pub fn shell_command(command: &str) -> ProcessSpec {
        ProcessSpec {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), command.into()],
            ..ProcessSpec::default()
        }
    }
}

/// One event of a running process, as the client's users need it.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessOutput {
    Started { pid: u32 },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Pty(Vec<u8>),
    Ended(ProcessEnd),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProcessEnd {
    pub exit_code: i32,
    pub exited: bool,
    /// envd's text, e.g. `exit status 1` or `signal: killed`.
    pub status: String,
    pub error: Option<String>,
}

impl ProcessEnd {
    /// A shell-style exit code: the process's own, or 128+N when signal N ended it.
    pub fn shell_exit_code(&self) -> i32 {
        if self.exited {
            return self.exit_code;
        }
        signal_number(&self.status).map_or(
            if self.exit_code > 0 {
                self.exit_code
            } else {
                1
            },
            |n| 128 + n,
        )
    }
}

/// Signal number from envd's status text (`signal: killed`, `signal: terminated`, `signal: 9`).
fn signal_number(status: &str) -> Option<i32> {
    let name = status.strip_prefix("signal: ")?.trim();
    if let Ok(n) = name.parse::<i32>() {
        return Some(n);
    }
    Some(match name {
        "hangup" => 1,
        "interrupt" => 2,
        "quit" => 3,
        "aborted" => 6,
        "killed" => 9,
        "segmentation fault" => 11,
        "broken pipe" => 13,
        "alarm clock" => 14,
        "terminated" => 15,
        _ => return None,
    })
}

/// The server-streamed events of a started process.
pub struct ProcessStream {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    decoder: EnvelopeDecoder,
    finished: bool,
}

impl ProcessStream {
    /// The next event; `None` once the stream ended cleanly. Keep-alives are skipped.
    pub async fn next(&mut self) -> Result<Option<ProcessOutput>, EnvdError> {
        loop {
            if self.finished {
                return Ok(None);
            }
            if let Some(frame) = self.decoder.next_frame()? {
                if frame.is_end_stream() {
                    self.finished = true;
                    return match parse_trailer(&frame.payload) {
                        Some(err) => Err(err),
                        None => Ok(None),
                    };
                }
                let response = StartResponse::decode(frame.payload.as_slice())?;
                if let Some(output) = response.event.and_then(output_of) {
                    return Ok(Some(output));
                }
                continue;
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.decoder.push(&chunk),
                Some(Err(err)) => return Err(EnvdError::Transport(err)),
                None => {
                    self.finished = true;
                    let left_over = self.decoder.pending_bytes();
                    if left_over > 0 {
                        return Err(EnvdError::Framing(ProtocolError::Envelope(format!(
                            "stream ended inside a message ({left_over} bytes left over)"
                        ))));
                    }
                    return Err(EnvdError::Rpc {
                        code: "unavailable".into(),
                        message: "stream ended without an end-of-stream message".into(),
                    });
                }
            }
        }
    }
}

fn output_of(event: ProcessEvent) -> Option<ProcessOutput> {
    use process_event::data_event::Output;
    match event.event? {
        process_event::Event::Start(start) => Some(ProcessOutput::Started { pid: start.pid }),
        process_event::Event::Data(data) => match data.output? {
            Output::Stdout(bytes) => Some(ProcessOutput::Stdout(bytes)),
            Output::Stderr(bytes) => Some(ProcessOutput::Stderr(bytes)),
            Output::Pty(bytes) => Some(ProcessOutput::Pty(bytes)),
        },
        process_event::Event::End(end) => Some(ProcessOutput::Ended(ProcessEnd {
            exit_code: end.exit_code,
            exited: end.exited,
            status: end.status,
            error: end.error,
        })),
        process_event::Event::Keepalive(_) => None,
    }
}

/// `None` when the trailer reports success.
fn parse_trailer(payload: &[u8]) -> Option<EnvdError> {
    if payload.is_empty() {
        return None;
    }
    match serde_json::from_slice::<EndStreamTrailer>(payload) {
        Ok(trailer) => trailer.error.map(|e| EnvdError::Rpc {
            code: e.code,
            message: e.message,
        }),
        Err(_) => Some(EnvdError::Rpc {
            code: "internal".into(),
            message: "malformed end-of-stream message".into(),
        }),
    }
}

/// A client of one sandbox's envd, acting as one user.
#[derive(Debug, Clone)]
pub struct EnvdClient {
    http: reqwest::Client,
    base: url::Url,
    headers: HeaderMap,
}

impl EnvdClient {
    /// `sandbox_url` is the proxy (`E2B_SANDBOX_URL`); `access_token` is the sandbox's `envdAccessToken`
    /// when it was created with `secure`; `user` is the account processes run as and files belong to.
    pub fn new(
        sandbox_url: &str,
        sandbox_id: &str,
        access_token: Option<&str>,
        user: &str,
    ) -> Result<EnvdClient, EnvdError> {
        let base = parse_base_url(sandbox_url)?;
        let mut headers = HeaderMap::new();
        headers.insert(
            "E2b-Sandbox-Id",
            header_value(sandbox_id, "E2b-Sandbox-Id")?,
        );
        headers.insert("E2b-Sandbox-Port", HeaderValue::from(ENVD_PORT));
        if let Some(token) = access_token {
            headers.insert("X-Access-Token", header_value(token, "X-Access-Token")?);
        }
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
        headers.insert(
            AUTHORIZATION,
            header_value(&format!("Basic {basic}"), "Authorization")?,
        );
        let http = crate::http_builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|source| EnvdError::Unreachable {
                url: base.to_string(),
                source,
            })?;
        Ok(EnvdClient {
            http,
            base,
            headers,
        })
    }

    /// Starts a process and returns its event stream (first event: `Started { pid }`).
    pub async fn start(&self, spec: &ProcessSpec) -> Result<ProcessStream, EnvdError> {
        let request = StartRequest {
            process: Some(ProcessConfig {
                cmd: spec.cmd.clone(),
                args: spec.args.clone(),
                envs: spec.envs.clone(),
                cwd: spec.cwd.clone(),
            }),
            pty: spec.pty.map(|(cols, rows)| Pty {
                size: Some(pty::Size {
                    cols: cols.into(),
                    rows: rows.into(),
                }),
            }),
            tag: None,
            // A PTY takes input through `send_pty_input`; like the SDK, leave `stdin` unset for it.
            stdin: if spec.pty.is_some() {
                None
            } else {
                Some(spec.stdin)
            },
        };
        self.server_stream("process.Process/Start", &request.encode_to_vec())
            .await
    }

    /// Attaches to a process that is already running (one started earlier by [`EnvdClient::start`],
    /// whose stream was lost): its events from now on. Output written while nobody was attached is
    /// not replayed.
    pub async fn connect(&self, pid: u32) -> Result<ProcessStream, EnvdError> {
        let request = ConnectRequest {
            process: Some(select_pid(pid)),
        };
        // `ConnectResponse` and `StartResponse` are the same message (one `ProcessEvent` as field 1),
        // so one stream decoder reads both.
        self.server_stream("process.Process/Connect", &request.encode_to_vec())
            .await
    }

    async fn server_stream(
        &self,
        method: &str,
        message: &[u8],
    ) -> Result<ProcessStream, EnvdError> {
        let body = encode_envelope(0, message);
        let response = self
            .http
            .post(self.url(method)?)
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/connect+proto")
            .header("Connect-Protocol-Version", "1")
            .header("Keepalive-Ping-Interval", KEEPALIVE_PING_SECS.to_string())
            .body(body)
            .send()
            .await
            .map_err(|source| EnvdError::Unreachable {
                url: self.base.to_string(),
                source,
            })?;
        let response = check_status(response).await?;
        Ok(ProcessStream {
            body: response.bytes_stream().boxed(),
            decoder: EnvelopeDecoder::new(MAX_MESSAGE_BYTES),
            finished: false,
        })
    }

    /// Sends bytes to a process's stdin (started with `stdin: true`).
    pub async fn send_stdin(&self, pid: u32, data: Vec<u8>) -> Result<(), EnvdError> {
        self.send_input(pid, process_input::Input::Stdin(data))
            .await
    }

    /// Sends bytes to a PTY process, as if typed.
    pub async fn send_pty_input(&self, pid: u32, data: Vec<u8>) -> Result<(), EnvdError> {
        self.send_input(pid, process_input::Input::Pty(data)).await
    }

    async fn send_input(&self, pid: u32, input: process_input::Input) -> Result<(), EnvdError> {
        let request = SendInputRequest {
            process: Some(select_pid(pid)),
            input: Some(ProcessInput { input: Some(input) }),
        };
        self.unary::<_, SendInputResponse>("process.Process/SendInput", &request)
            .await
            .map(drop)
    }

    pub async fn close_stdin(&self, pid: u32) -> Result<(), EnvdError> {
        let request = CloseStdinRequest {
            process: Some(select_pid(pid)),
        };
        self.unary::<_, CloseStdinResponse>("process.Process/CloseStdin", &request)
            .await
            .map(drop)
    }

    /// Tells a PTY process its terminal has a new size.
    pub async fn resize_pty(&self, pid: u32, cols: u16, rows: u16) -> Result<(), EnvdError> {
        let request = UpdateRequest {
            process: Some(select_pid(pid)),
            pty: Some(Pty {
                size: Some(pty::Size {
                    cols: cols.into(),
                    rows: rows.into(),
                }),
            }),
        };
        self.unary::<_, UpdateResponse>("process.Process/Update", &request)
            .await
            .map(drop)
    }

    pub async fn kill(&self, pid: u32) -> Result<(), EnvdError> {
        let request = SendSignalRequest {
            process: Some(select_pid(pid)),
            signal: Signal::Sigkill as i32,
        };
        self.unary::<_, SendSignalResponse>("process.Process/SendSignal", &request)
            .await
            .map(drop)
    }

    pub async fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<EntryInfo>, EnvdError> {
        let request = ListDirRequest {
            path: path.into(),
            depth,
        };
        Ok(self
            .unary::<_, ListDirResponse>("filesystem.Filesystem/ListDir", &request)
            .await?
            .entries)
    }

    pub async fn make_dir(&self, path: &str) -> Result<Option<EntryInfo>, EnvdError> {
        let request = MakeDirRequest { path: path.into() };
        Ok(self
            .unary::<_, MakeDirResponse>("filesystem.Filesystem/MakeDir", &request)
            .await?
            .entry)
    }

    pub async fn remove(&self, path: &str) -> Result<(), EnvdError> {
        let request = RemoveRequest { path: path.into() };
        self.unary::<_, RemoveResponse>("filesystem.Filesystem/Remove", &request)
            .await
            .map(drop)
    }

    /// Reads a whole file (`GET /files?path=`).
    pub async fn read_file(&self, path: &str) -> Result<Bytes, EnvdError> {
        let response = self
            .http
            .get(self.url("files")?)
            .headers(self.headers.clone())
            .query(&[("path", path)])
            .send()
            .await
            .map_err(|source| EnvdError::Unreachable {
                url: self.base.to_string(),
                source,
            })?;
        check_status(response)
            .await?
            .bytes()
            .await
            .map_err(EnvdError::Transport)
    }

    /// Writes a whole file, creating parent directories (`POST /files?path=`, multipart like the SDK).
    pub async fn write_file(&self, path: &str, data: Vec<u8>) -> Result<(), EnvdError> {
        let part = reqwest::multipart::Part::bytes(data).file_name(path.to_string());
        let form = reqwest::multipart::Form::new().part("file", part);
        let response = self
            .http
            .post(self.url("files")?)
            .headers(self.headers.clone())
            .query(&[("path", path)])
            .multipart(form)
            .send()
            .await
            .map_err(|source| EnvdError::Unreachable {
                url: self.base.to_string(),
                source,
            })?;
        check_status(response).await.map(drop)
    }

    async fn unary<Req: Message, Resp: Message + Default>(
        &self,
        method: &str,
        request: &Req,
    ) -> Result<Resp, EnvdError> {
        let response = self
            .http
            .post(self.url(method)?)
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/proto")
            .header("Connect-Protocol-Version", "1")
            .body(request.encode_to_vec())
            .send()
            .await
            .map_err(|source| EnvdError::Unreachable {
                url: self.base.to_string(),
                source,
            })?;
        let response = check_status(response).await?;
        let body = response.bytes().await.map_err(EnvdError::Transport)?;
        Ok(Resp::decode(body)?)
    }

    fn url(&self, path: &str) -> Result<url::Url, EnvdError> {
        self.base.join(path).map_err(|source| {
            EnvdError::BadUrl(crate::api::ApiError::BadUrl {
                url: format!("{}{path}", self.base),
                source,
            })
        })
    }
}

fn select_pid(pid: u32) -> ProcessSelector {
    ProcessSelector {
        selector: Some(process_selector::Selector::Pid(pid)),
    }
}

fn header_value(value: &str, name: &'static str) -> Result<HeaderValue, EnvdError> {
    HeaderValue::from_str(value).map_err(|_| EnvdError::BadHeader(name))
}

/// Turns a non-success answer into an error: a Connect error body (`{"code","message"}` with a string
/// code) becomes `Rpc`, anything else (the proxy's own answers) becomes `Http`.
async fn check_status(response: reqwest::Response) -> Result<reqwest::Response, EnvdError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.bytes().await.unwrap_or_default();
    Err(error_from_answer(status, &body))
}

fn error_from_answer(status: StatusCode, body: &[u8]) -> EnvdError {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
        let message = value
            .get("message")
            .and_then(|m| m.as_str())
            .unwrap_or_default()
            .to_string();
        if let Some(code) = value.get("code").and_then(|c| c.as_str()) {
            return EnvdError::Rpc {
                code: code.to_string(),
                message,
            };
        }
        if !message.is_empty() {
            return EnvdError::Http {
                status: status.as_u16(),
                message,
            };
        }
    }
    let text = String::from_utf8_lossy(body)
        .trim()
        .chars()
        .take(500)
        .collect::<String>();
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_string()
    } else {
        text
    };
    EnvdError::Http {
        status: status.as_u16(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_shell_conventions() {
        let end = |exit_code, exited, status: &str| ProcessEnd {
            exit_code,
            exited,
            status: status.into(),
            error: None,
        };
        assert_eq!(end(0, true, "exit status 0").shell_exit_code(), 0);
        assert_eq!(end(3, true, "exit status 3").shell_exit_code(), 3);
        assert_eq!(end(-1, false, "signal: killed").shell_exit_code(), 137);
        assert_eq!(end(-1, false, "signal: terminated").shell_exit_code(), 143);
        assert_eq!(end(-1, false, "signal: 2").shell_exit_code(), 130);
        assert_eq!(end(-1, false, "something odd").shell_exit_code(), 1);
    }

    #[test]
    fn connect_errors_and_proxy_errors_are_told_apart() {
        let err = error_from_answer(
            StatusCode::NOT_FOUND,
            br#"{"code":"not_found","message":"no such process"}"#,
        );
        assert!(
            matches!(&err, EnvdError::Rpc { code, .. } if code == "not_found"),
            "{err:?}"
        );
        assert_eq!(err.kind(), ErrorKind::NotFound);

        let err = error_from_answer(
            StatusCode::NOT_FOUND,
            br#"{"code":404,"message":"sandbox not found"}"#,
        );
        assert!(
            matches!(&err, EnvdError::Http { status: 404, message } if message == "sandbox not found")
        );
        assert_eq!(err.kind(), ErrorKind::NotFound);

        let err = error_from_answer(
            StatusCode::BAD_GATEWAY,
            br#"{"code":502,"message":"The sandbox abc was not found"}"#,
        );
        assert_eq!(err.kind(), ErrorKind::NotFound, "{err:?}");

        let err = error_from_answer(StatusCode::BAD_GATEWAY, b"<html>sandbox is paused</html>");
        assert_eq!(err.kind(), ErrorKind::Other);
        assert!(err.to_string().contains("paused"));
    }

    #[test]
    fn trailer_with_error_becomes_an_rpc_error() {
        assert!(parse_trailer(b"{}").is_none());
        assert!(parse_trailer(b"").is_none());
        let err = parse_trailer(br#"{"error":{"code":"invalid_argument","message":"bad cwd"}}"#)
            .expect("error");
        assert_eq!(err.kind(), ErrorKind::BadRequest);
        assert!(parse_trailer(b"not json").is_some());
    }

    #[test]
    fn keepalives_are_not_output() {
        let keepalive = ProcessEvent {
            event: Some(process_event::Event::Keepalive(process_event::KeepAlive {})),
        };
        assert_eq!(output_of(keepalive), None);
        let start = ProcessEvent {
            event: Some(process_event::Event::Start(process_event::StartEvent {
                pid: 7,
            })),
        };
        assert_eq!(output_of(start), Some(ProcessOutput::Started { pid: 7 }));
    }

    #[test]
    fn headers_route_through_the_proxy_as_the_user() {
        let client =
            EnvdClient::new("http://127.0.0.1:3001", "sbx1", Some("tok"), "user").expect("client");
        assert_eq!(client.headers["E2b-Sandbox-Id"], "sbx1");
        assert_eq!(client.headers["E2b-Sandbox-Port"], "49983");
        assert_eq!(client.headers["X-Access-Token"], "tok");
        assert_eq!(client.headers[AUTHORIZATION], "Basic dXNlcjo=");
        assert!(EnvdClient::new("http://127.0.0.1:3001", "bad\nid", None, "user").is_err());
    }

    #[test]
    fn shell_command_is_bash_login() {
        let spec = ProcessSpec::shell_command("echo hi");
        assert_eq!(spec.cmd, "/bin/bash");
        assert_eq!(spec.args, vec!["-l", "-c", "echo hi"]);
        assert!(!spec.stdin);
    }
}
