//! Running build commands inside a sandbox through its agent: envd's `process.Process/Start`
//! server-streaming RPC over Connect (binary proto codec, HTTP/1.1, the shared `warren_proto` types), as
//! the user named in the
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
use serde_json::Value;
use warren_proto::connect::{encode_envelope, Codec, FLAG_COMPRESSED, FLAG_END_STREAM};
use warren_proto::envd::process::{
    process_event, ProcessConfig, ProcessEvent, StartRequest, StartResponse,
};

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
    /// envd's process tag (`process.Process/List` reports it).
    pub tag: Option<String>,
}

/// A process an agent runs for a client, as `process.Process/List` names it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningProcess {
    /// As the sandbox numbers it.
    pub pid: u32,
    pub tag: Option<String>,
}

/// The tag a template's start_cmd runs under: the idle policy does not count it as work.
pub const START_CMD_TAG: &str = "warren-start-cmd";

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

    /// The processes the agent runs for its clients, asked on a connection of its own with a short
    /// timeout (to tell whether an agent whose stream broke still answers).
    fn processes(&self, agent: SocketAddr) -> Result<Vec<RunningProcess>, CommandError>;
}

/// The keepalive interval asked of the agent (`Keepalive-Ping-Interval`), in seconds.
const KEEPALIVE_SECS: u64 = 30;
/// How long a command's stream may stay silent (no output, no keepalive) before the step fails.
const STREAM_SILENCE_LIMIT: Duration = Duration::from_secs(4 * KEEPALIVE_SECS);

/// envd client over HTTP/1.1 + Connect JSON.
#[derive(Debug, Clone)]
pub struct EnvdCommands {
    agent: ureq::Agent,
    /// `X-Access-Token` of a sandbox created with `secure` (the server's create path sets it).
    access_token: Option<String>,
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
                // A fresh connection per command. Pooled ones are keyed by address, and build
                // sandboxes come and go on reused addresses: a connection kept from an earlier
                // sandbox was handed to the next one on the same address, and its request then
                // waited forever on a peer that no longer existed (builds stuck in `building`
                // with nothing in the log when several ran at once).
                .max_idle_connections(0)
                .max_idle_connections_per_host(0)
                // The agent sends a keepalive at least every KEEPALIVE_SECS, however quiet the
                // command; a stream silent for much longer is dead, and the step fails naming itself.
                .timeout_read(STREAM_SILENCE_LIMIT)
                .build(),
            access_token: None,
        }
    }

    /// Sends `token` as `X-Access-Token` with every request.
    pub fn with_access_token(mut self, token: Option<String>) -> EnvdCommands {
        self.access_token = token;
        self
    }

    /// The processes the agent at `addr` runs for its clients (`process.Process/List`).
    pub fn running(&self, addr: SocketAddr) -> Result<Vec<RunningProcess>, CommandError> {
        let url = format!("http://{addr}/process.Process/List");
        let mut request = self
            .agent
            .post(&url)
            .set("Content-Type", "application/json")
            .set("Connect-Protocol-Version", "1")
            .set(
                "Authorization",
                &format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode("root:")
                ),
            );
        if let Some(token) = &self.access_token {
            request = request.set("X-Access-Token", token);
        }
        let text = match request.send_string("{}") {
            Ok(response) => response
                .into_string()
                .map_err(|e| CommandError::Transport {
                    addr,
                    message: e.to_string(),
                })?,
            Err(ureq::Error::Status(status, response)) => {
                let text = response.into_string().unwrap_or_default();
                let (code, message) =
                    error_fields(&text).unwrap_or_else(|| (status.to_string(), text));
                return Err(CommandError::Rpc {
                    addr,
                    code,
                    message,
                });
            }
            Err(error) => {
                return Err(CommandError::Transport {
                    addr,
                    message: error.to_string(),
                })
            }
        };
        let value: Value = serde_json::from_str(&text).map_err(|e| CommandError::Protocol {
            addr,
            message: format!("process list: {e}"),
        })?;
        Ok(value
            .get("processes")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|p| RunningProcess {
                        pid: p
                            .get("pid")
                            .and_then(Value::as_u64)
                            .and_then(|pid| u32::try_from(pid).ok())
                            .unwrap_or(0),
                        tag: p.get("tag").and_then(Value::as_str).map(str::to_string),
                    })
                    .collect()
            })
            .unwrap_or_default())
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
        let request = StartRequest {
            process: Some(ProcessConfig {
                cmd: cmd.clone(),
                args: args.to_vec(),
                envs: command
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                cwd: Some(command.cwd.clone()),
            }),
            pty: None,
            tag: command.tag.clone(),
            stdin: Some(false),
        };
        let body = encode_envelope(0, &Codec::Proto.encode(&request));
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{}:", command.user));
        let url = format!("http://{addr}/process.Process/Start");
        let mut request = self
            .agent
            .post(&url)
            .set("Content-Type", Codec::Proto.content_type(true))
            .set("Connect-Protocol-Version", "1")
            .set("Authorization", &format!("Basic {auth}"))
            .set("Keepalive-Ping-Interval", &KEEPALIVE_SECS.to_string());
        if let Some(token) = &self.access_token {
            request = request.set("X-Access-Token", token);
        }
        let response = request.send_bytes(&body);
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
    fn processes(&self, agent: SocketAddr) -> Result<Vec<RunningProcess>, CommandError> {
        EnvdCommands {
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(10))
                .max_idle_connections(0)
                .build(),
            access_token: self.access_token.clone(),
        }
        .running(agent)
    }

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

/// Reads StartResponse envelopes to the end of the stream; returns the exit code of the process's end
/// event. Output that arrives after the end event (the agent may flush late) is still delivered.
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
    let mut exit_code: Option<i32> = None;
    loop {
        let mut header = [0u8; 5];
        match reader.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return exit_code.ok_or(CommandError::NoEnd { addr });
            }
            Err(e) if exit_code.is_some() => {
                tracing::debug!(%addr, error = %e, "stream broke after the end event");
                return exit_code.ok_or(CommandError::NoEnd { addr });
            }
            Err(e) => return Err(transport(e)),
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > 64 << 20 {
            return Err(protocol(format!("message of {len} bytes")));
        }
        let mut payload = vec![0u8; len];
        reader.read_exact(&mut payload).map_err(transport)?;
        if header[0] & FLAG_END_STREAM != 0 {
            // End of stream (always JSON): an error, or a clean end without the process's end event.
            let text = String::from_utf8_lossy(&payload).into_owned();
            let error = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("error").map(|e| e.to_string()))
                .and_then(|t| error_fields(&t));
            if let Some(code) = exit_code {
                return Ok(code);
            }
            if let Some((code, message)) = error {
                return Err(CommandError::Rpc {
                    addr,
                    code,
                    message,
                });
            }
            return Err(CommandError::NoEnd { addr });
        }
        if header[0] & FLAG_COMPRESSED != 0 {
            return Err(protocol("compressed message, none was asked for".into()));
        }
        let response: StartResponse = Codec::Proto
            .decode(&payload)
            .map_err(|e| protocol(e.to_string()))?;
        match decode_event(response.event) {
            Event::Output(stream, bytes) => on_output(stream, &bytes),
            Event::End(code) => exit_code = Some(code),
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

fn decode_event(event: Option<ProcessEvent>) -> Event {
    use process_event::data_event::Output;
    match event.and_then(|e| e.event) {
        Some(process_event::Event::Data(data)) => match data.output {
            Some(Output::Stdout(bytes)) | Some(Output::Pty(bytes)) => {
                Event::Output(OutputStream::Stdout, bytes)
            }
            Some(Output::Stderr(bytes)) => Event::Output(OutputStream::Stderr, bytes),
            None => Event::Other,
        },
        Some(process_event::Event::End(end)) => {
            if end.exited || end.exit_code != 0 {
                Event::End(end.exit_code)
            } else {
                Event::End(signal_code(&end.status))
            }
        }
        _ => Event::Other,
    }
}

/// A shell's code for a process ended by a signal ("signal: killed" → 128 + 9); -1 when unknown.
fn signal_code(status: &str) -> i32 {
    let signal = match status.trim_start_matches("signal: ") {
        "killed" => 9,
        "terminated" => 15,
        "interrupt" => 2,
        "segmentation fault" | "segmentation fault (core dumped)" => 11,
        "aborted" | "aborted (core dumped)" => 6,
        _ => return -1,
    };
    128 + signal
}

#[cfg(test)]
mod tests {
    use super::*;
    use process_event::data_event::Output;
    use process_event::{DataEvent, EndEvent, Event as Ev, StartEvent};

    fn event(ev: Ev) -> Vec<u8> {
        let response = StartResponse {
            event: Some(ProcessEvent { event: Some(ev) }),
        };
        encode_envelope(0, &Codec::Proto.encode(&response))
    }

    fn end_stream(json: &str) -> Vec<u8> {
        encode_envelope(FLAG_END_STREAM, json.as_bytes())
    }

    fn reader(parts: Vec<Vec<u8>>) -> Box<dyn Read + Send + Sync> {
        Box::new(std::io::Cursor::new(parts.concat()))
    }

    fn addr() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    fn end(exit_code: i32, exited: bool, status: &str) -> Ev {
        Ev::End(EndEvent {
            exit_code,
            exited,
            status: status.into(),
            error: None,
        })
    }

    #[test]
    fn follows_output_until_end() {
        let r = reader(vec![
            event(Ev::Start(StartEvent { pid: 7 })),
            event(Ev::Data(DataEvent {
                output: Some(Output::Stdout(b"hi\n".to_vec())),
            })),
            event(Ev::Keepalive(Default::default())),
            event(Ev::Data(DataEvent {
                output: Some(Output::Stderr(b"oops\n".to_vec())),
            })),
            event(end(3, true, "exit status 3")),
            end_stream("{}"),
        ]);
        let mut out = Vec::new();
        let code = follow(addr(), r, &mut |s, b| out.push((s, b.to_vec()))).unwrap();
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
    fn output_after_the_end_event_is_kept() {
        let r = reader(vec![
            event(end(0, true, "exit status 0")),
            event(Ev::Data(DataEvent {
                output: Some(Output::Stdout(b"late\n".to_vec())),
            })),
            end_stream("{}"),
        ]);
        let mut out = Vec::new();
        assert_eq!(
            follow(addr(), r, &mut |_, b| out.extend_from_slice(b)).unwrap(),
            0
        );
        assert_eq!(out, b"late\n");
        // A stream that just closes after the end event is fine too.
        let r = reader(vec![event(end(4, true, "exit status 4"))]);
        assert_eq!(follow(addr(), r, &mut |_, _| {}).unwrap(), 4);
    }

    #[test]
    fn errors_in_end_stream_and_truncation() {
        let r = reader(vec![end_stream(
            r#"{"error": {"code": "not_found", "message": "no such user"}}"#,
        )]);
        match follow(addr(), r, &mut |_, _| {}) {
            Err(CommandError::Rpc { code, message, .. }) => {
                assert_eq!(code, "not_found");
                assert_eq!(message, "no such user");
            }
            other => panic!("{other:?}"),
        }
        let r = reader(vec![event(Ev::Start(StartEvent { pid: 1 }))]);
        assert!(matches!(
            follow(addr(), r, &mut |_, _| {}),
            Err(CommandError::NoEnd { .. })
        ));
        let r = reader(vec![encode_envelope(0, b"\xff\xff not proto")]);
        assert!(matches!(
            follow(addr(), r, &mut |_, _| {}),
            Err(CommandError::Protocol { .. })
        ));
    }

    #[test]
    fn killed_processes_get_a_shell_style_code() {
        let ev = |e| decode_event(Some(ProcessEvent { event: Some(e) }));
        assert_eq!(ev(end(0, false, "signal: killed")), Event::End(137));
        assert_eq!(ev(end(0, false, "signal: terminated")), Event::End(143));
        assert_eq!(ev(end(0, false, "???")), Event::End(-1));
        assert_eq!(ev(end(0, true, "exit status 0")), Event::End(0));
    }
}
