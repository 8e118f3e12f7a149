//! Running build commands inside a sandbox through its agent: envd's `process.Process/Start`
//! server-streaming RPC over Connect (JSON codec, HTTP/1.1), as the user named in the
//! `Authorization: Basic base64("<user>:")` header.
//!
//! Blocking by design: builds run on a blocking thread, like the runtime calls around them.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("agent at {addr}: {message}")]
    Transport { addr: SocketAddr, message: String },
    #[error("agent at {addr} refused the command: {code}: {message}")]
    Rpc {
        addr: SocketAddr,
        code: String,
        message: String,
    },
    #[error("agent at {addr} sent a bad stream: {message}")]
    Protocol { addr: SocketAddr, message: String },
    #[error("agent at {addr}: the stream ended before the process did")]
    NoEnd { addr: SocketAddr },
}

/// A command to run: argv, environment, working directory and user (a name from /etc/passwd).
#[derive(Debug, Clone, PartialEq)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub user: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Receives a background process's output on its reader thread.
pub type OutputSink = Box<dyn FnMut(OutputStream, &[u8]) + Send>;

/// A process started in the background; dropping the handle stops following its output (the process
/// keeps running in the sandbox).
pub trait BackgroundProcess: Send {
    /// Exit code if the process has ended.
    fn exit_code(&self) -> Option<i32>;
}

/// Runs commands inside sandboxes. The product implementation is [`EnvdCommands`]; unit tests use fakes.
pub trait CommandRunner: Send + Sync {
    /// Runs to completion, passing output chunks to `on_output`; returns the exit code.
    fn run(
        &self,
        agent: SocketAddr,
        command: &CommandSpec,
        on_output: &mut dyn FnMut(OutputStream, &[u8]),
    ) -> Result<i32, CommandError>;

    /// Starts a long-running process; `on_output` gets its output from a background thread.
    fn spawn(
        &self,
        agent: SocketAddr,
        command: &CommandSpec,
        on_output: OutputSink,
    ) -> Result<Box<dyn BackgroundProcess>, CommandError>;
}

/// envd client over HTTP/1.1 + Connect JSON.
#[derive(Debug, Clone)]
pub struct EnvdCommands {
    agent: ureq::Agent,
}

impl Default for EnvdCommands {
    fn default() -> Self {
        Self::new()
    }
}

impl EnvdCommands {
    pub fn new() -> EnvdCommands {
        EnvdCommands {
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(10))
                .build(),
        }
    }

    fn start(
        &self,
        addr: SocketAddr,
        command: &CommandSpec,
    ) -> Result<Box<dyn Read + Send + Sync>, CommandError> {
        let (cmd, args) = command
            .argv
            .split_first()
            .ok_or_else(|| CommandError::Protocol {
                addr,
                message: "empty command".into(),
            })?;
        let request = json!({
            "process": {
                "cmd": cmd,
                "args": args,
                "envs": command.env,
                "cwd": command.cwd,
            },
            "stdin": false,
        });
        let payload = serde_json::to_vec(&request).map_err(|e| CommandError::Protocol {
            addr,
            message: e.to_string(),
        })?;
        let body = envelope(0, &payload);
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{}:", command.user));
        let url = format!("http://{addr}/process.Process/Start");
        let response = self
            .agent
            .post(&url)
            .set("Content-Type", "application/connect+json")
            .set("Connect-Protocol-Version", "1")
            .set("Authorization", &format!("Basic {auth}"))
            .set("Keepalive-Ping-Interval", "30")
            .send_bytes(&body);
        match response {
            Ok(r) => Ok(r.into_reader()),
            Err(ureq::Error::Status(status, r)) => {
                let text = r.into_string().unwrap_or_default();
                let (code, message) =
                    error_fields(&text).unwrap_or_else(|| (status.to_string(), text));
                Err(CommandError::Rpc {
                    addr,
                    code,
                    message,
                })
            }
            Err(e) => Err(CommandError::Transport {
                addr,
                message: e.to_string(),
            }),
        }
    }
}

impl CommandRunner for EnvdCommands {
    fn run(
        &self,
        agent: SocketAddr,
        command: &CommandSpec,
        on_output: &mut dyn FnMut(OutputStream, &[u8]),
    ) -> Result<i32, CommandError> {
        let reader = self.start(agent, command)?;
        follow(agent, reader, on_output)
    }

    fn spawn(
        &self,
        agent: SocketAddr,
        command: &CommandSpec,
        mut on_output: OutputSink,
    ) -> Result<Box<dyn BackgroundProcess>, CommandError> {
        let reader = self.start(agent, command)?;
        let state = Arc::new(SpawnState {
            exit_code: std::sync::Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let thread_state = state.clone();
        std::thread::Builder::new()
            .name("build-start-cmd".into())
            .spawn(move || {
                let stop = &thread_state.stop;
                let result = follow(agent, reader, &mut |stream, bytes| {
                    if !stop.load(Ordering::Relaxed) {
                        on_output(stream, bytes)
                    }
                });
                let code = result.unwrap_or(-1);
                if let Ok(mut slot) = thread_state.exit_code.lock() {
                    *slot = Some(code);
                }
            })
            .map_err(|e| CommandError::Transport {
                addr: agent,
                message: format!("spawning output thread: {e}"),
            })?;
        Ok(Box::new(SpawnedProcess { state }))
    }
}

struct SpawnState {
    exit_code: std::sync::Mutex<Option<i32>>,
    stop: AtomicBool,
}

struct SpawnedProcess {
    state: Arc<SpawnState>,
}

impl BackgroundProcess for SpawnedProcess {
    fn exit_code(&self) -> Option<i32> {
        self.state.exit_code.lock().ok().and_then(|c| *c)
    }
}

impl Drop for SpawnedProcess {
    fn drop(&mut self) {
        // The reader thread ends when the sandbox goes away and its connection closes.
        self.state.stop.store(true, Ordering::Relaxed);
    }
}

fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn error_fields(text: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(text).ok()?;
    let err = if v.get("error").is_some() {
        &v["error"]
    } else {
        &v
    };
    Some((
        err.get("code")?.as_str()?.to_string(),
        err.get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    ))
}

/// Reads StartResponse envelopes until the process's end event; returns its exit code.
fn follow(
    addr: SocketAddr,
    mut reader: Box<dyn Read + Send + Sync>,
    on_output: &mut dyn FnMut(OutputStream, &[u8]),
) -> Result<i32, CommandError> {
    let transport = |e: std::io::Error| CommandError::Transport {
        addr,
        message: e.to_string(),
    };
    let protocol = |message: String| CommandError::Protocol { addr, message };
    loop {
        let mut header = [0u8; 5];
        match reader.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(CommandError::NoEnd { addr })
            }
            Err(e) => return Err(transport(e)),
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > 64 << 20 {
            return Err(protocol(format!("message of {len} bytes")));
        }
        let mut payload = vec![0u8; len];
        reader.read_exact(&mut payload).map_err(transport)?;
        let message: Value =
            serde_json::from_slice(&payload).map_err(|e| protocol(e.to_string()))?;
        if header[0] & 0b10 != 0 {
            // End of stream: an error, or a clean end without the process's end event.
            if let Some((code, message)) = message
                .get("error")
                .map(|e| e.to_string())
                .and_then(|t| error_fields(&t))
            {
                return Err(CommandError::Rpc {
                    addr,
                    code,
                    message,
                });
            }
            return Err(CommandError::NoEnd { addr });
        }
        if header[0] & 0b01 != 0 {
            return Err(protocol("compressed message, none was asked for".into()));
        }
        match decode_event(&message).map_err(protocol)? {
            Event::Output(stream, bytes) => on_output(stream, &bytes),
            Event::End(code) => return Ok(code),
            Event::Other => {}
        }
    }
}

#[derive(Debug, PartialEq)]
enum Event {
    Output(OutputStream, Vec<u8>),
    End(i32),
    Other,
}

/// `{"event": {"data": {"stdout": "<base64>"}}}`, `{"event": {"end": {"exitCode": 1, ...}}}`, ...
fn decode_event(message: &Value) -> Result<Event, String> {
    let event = &message["event"];
    if let Some(data) = event.get("data") {
        for (key, stream) in [
            ("stdout", OutputStream::Stdout),
            ("stderr", OutputStream::Stderr),
            ("pty", OutputStream::Stdout),
        ] {
            if let Some(text) = data.get(key).and_then(Value::as_str) {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| format!("bad base64 in {key}: {e}"))?;
                return Ok(Event::Output(stream, bytes));
            }
        }
        return Ok(Event::Other);
    }
    if let Some(end) = event.get("end") {
        let code = end.get("exitCode").and_then(Value::as_i64).unwrap_or(0);
        let exited = end.get("exited").and_then(Value::as_bool).unwrap_or(true);
        if !exited {
            // Killed by a signal: report like a shell does (128 + n is unknown here; use -1).
            let status = end.get("status").and_then(Value::as_str).unwrap_or("");
            return Ok(Event::End(if code != 0 {
                code as i32
            } else {
                signal_code(status)
            }));
        }
        return Ok(Event::End(code as i32));
    }
    Ok(Event::Other)
}

fn signal_code(status: &str) -> i32 {
    if status.is_empty() {
        -1
    } else {
        // "signal: killed" and friends.
        137
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(messages: &[(u8, Value)]) -> Box<dyn Read + Send + Sync> {
        let mut bytes = Vec::new();
        for (flags, m) in messages {
            bytes.extend(envelope(*flags, &serde_json::to_vec(m).unwrap()));
        }
        Box::new(std::io::Cursor::new(bytes))
    }

    fn addr() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    #[test]
    fn follows_output_until_end() {
        let reader = stream(&[
            (0, json!({"event": {"start": {"pid": 7}}})),
            (0, json!({"event": {"data": {"stdout": "aGkK"}}})),
            (0, json!({"event": {"keepalive": {}}})),
            (0, json!({"event": {"data": {"stderr": "b29wcwo="}}})),
            (
                0,
                json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3"}}}),
            ),
            (2, json!({})),
        ]);
        let mut out = Vec::new();
        let code = follow(addr(), reader, &mut |s, b| out.push((s, b.to_vec()))).unwrap();
        assert_eq!(code, 3);
        assert_eq!(
            out,
            vec![
                (OutputStream::Stdout, b"hi\n".to_vec()),
                (OutputStream::Stderr, b"oops\n".to_vec())
            ]
        );
    }

    #[test]
    fn exit_code_zero_is_omitted_in_json() {
        let reader = stream(&[(
            0,
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}}),
        )]);
        assert_eq!(follow(addr(), reader, &mut |_, _| {}).unwrap(), 0);
    }

    #[test]
    fn errors_in_end_stream_and_truncation() {
        let reader = stream(&[(
            2,
            json!({"error": {"code": "not_found", "message": "no such user"}}),
        )]);
        match follow(addr(), reader, &mut |_, _| {}) {
            Err(CommandError::Rpc { code, message, .. }) => {
                assert_eq!(code, "not_found");
                assert_eq!(message, "no such user");
            }
            other => panic!("{other:?}"),
        }
        let reader = stream(&[(0, json!({"event": {"start": {"pid": 1}}}))]);
        assert!(matches!(
            follow(addr(), reader, &mut |_, _| {}),
            Err(CommandError::NoEnd { .. })
        ));
        let reader = stream(&[(0, json!({"event": {"data": {"stdout": "!!"}}}))]);
        assert!(matches!(
            follow(addr(), reader, &mut |_, _| {}),
            Err(CommandError::Protocol { .. })
        ));
    }

    #[test]
    fn killed_processes_get_a_non_zero_code() {
        let ev = json!({"event": {"end": {"exited": false, "status": "signal: killed"}}});
        assert_eq!(decode_event(&ev).unwrap(), Event::End(137));
    }
}
