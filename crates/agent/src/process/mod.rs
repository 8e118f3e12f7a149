//! The `process.Process` service: start commands (pipes or PTY), stream their output, attach to
//! running ones, feed input, resize terminals and deliver signals.

pub mod spawn;
pub mod table;

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncReadExt;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use warren_proto::connect::{Code, ConnectError};
use warren_proto::envd::process::{
    process_event::{self, data_event::Output, Event},
    process_input, stream_input_request, CloseStdinRequest, CloseStdinResponse, ConnectRequest,
    ConnectResponse, ListRequest, ListResponse, ProcessConfig, ProcessEvent, SendInputRequest,
    SendInputResponse, SendSignalRequest, SendSignalResponse, Signal, StartRequest, StartResponse,
    StreamInputRequest, StreamInputResponse, UpdateRequest, UpdateResponse,
};

use crate::connect_server::{CallContext, MessageStream};
use crate::identity;
use crate::logbook::LineSplitter;
use crate::reaper::ExitStatus;
use crate::state::Agent;
use spawn::{SpawnRequest, SpawnedIo};
use table::{ProcessHandle, EVENT_BUFFER};

const STD_CHUNK: usize = 32 << 10;
const PTY_CHUNK: usize = 16 << 10;
/// How long SendSignal(SIGKILL) waits for the process to be reaped before it answers anyway.
const KILL_WAIT: Duration = Duration::from_secs(10);
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub async fn list(
    agent: Arc<Agent>,
    _ctx: CallContext,
    _req: ListRequest,
) -> Result<ListResponse, ConnectError> {
    Ok(ListResponse {
        processes: agent.processes.list().iter().map(|p| p.info()).collect(),
    })
}

pub async fn start(
    agent: Arc<Agent>,
    ctx: CallContext,
    req: StartRequest,
) -> Result<MessageStream<StartResponse>, ConnectError> {
    let user = agent.rpc_user(&ctx.headers)?;
    let config = req
        .process
        .clone()
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "process config is required"))?;
    if config.cmd.is_empty() {
        return Err(ConnectError::new(Code::InvalidArgument, "cmd is required"));
    }
    let cwd = agent
        .resolve(&user, config.cwd.as_deref().unwrap_or(""))
        .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))?;
    let cwd_host = cwd.host.clone();
    let id = identity::Identity::from(&user);
    let cwd_ok = identity::blocking_as(id.clone(), move || cwd_host.is_dir())
        .await
        .unwrap_or(false);
    if !cwd_ok {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("cwd '{}' does not exist", cwd.sandbox),
        ));
    }

    let defaults = agent.defaults();
    let host_home = crate::paths::to_host(&agent.root, &crate::paths::normalize(&user.home));
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string()),
        ),
        ("HOME".into(), host_home.to_string_lossy().into_owned()),
        ("USER".into(), user.name.clone()),
        ("LOGNAME".into(), user.name.clone()),
    ];
    env.extend(defaults.env_vars.clone());
    env.extend(config.envs.iter().map(|(k, v)| (k.clone(), v.clone())));

    let switch = identity::can_switch() && !(user.uid == 0 && nix::unistd::geteuid().is_root());
    let pty = req.pty.as_ref().map(|p| {
        let size = p.size.unwrap_or_default();
        (clamp_u16(size.cols, 80), clamp_u16(size.rows, 24))
    });
    let spawned = spawn::spawn(
        &agent.reaper,
        SpawnRequest {
            cmd: config.cmd.clone(),
            args: config.args.clone(),
            env,
            cwd: cwd.host.clone(),
            identity: switch.then_some(id),
            pty,
            stdin: req.stdin.unwrap_or(true),
        },
    )
    .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))?;

    let pid = spawned.pid;
    log_start(
        &agent,
        pid,
        &user.name,
        &config,
        req.tag.as_deref(),
        pty.is_some(),
    );
    let (events, first_subscriber) = broadcast::channel(EVENT_BUFFER);
    let (ended_tx, ended) = watch::channel(None);
    let (reaped_tx, reaped) = watch::channel(false);
    let (stdin, pty_master, readers) = match spawned.io {
        SpawnedIo::Pipes {
            stdout,
            stderr,
            stdin,
        } => {
            let readers = vec![
                tokio::spawn(pump_pipe(stdout, events.clone(), false, agent.clone(), pid)),
                tokio::spawn(pump_pipe(stderr, events.clone(), true, agent.clone(), pid)),
            ];
            (stdin, None, readers)
        }
        SpawnedIo::Pty { master } => {
            // SAFETY: `master` is an OwnedFd moved into the AsyncFd, so the descriptor stays open
            // and the same for the AsyncFd's whole life.
            let registered = unsafe { AsyncFd::register(master) };
            let master = Arc::new(registered.map_err(|e| {
                ConnectError::new(Code::Internal, format!("error registering pty: {e}"))
            })?);
            let readers = vec![tokio::spawn(pump_pty(master.clone(), events.clone()))];
            (None, Some(master), readers)
        }
    };
    let handle = Arc::new(ProcessHandle {
        pid,
        config,
        tag: req.tag.clone(),
        events: events.clone(),
        ended,
        reaped,
        stdin: tokio::sync::Mutex::new(stdin),
        pty: pty_master,
    });
    agent.processes.insert(handle.clone());
    // One deadline for the process and its stream, so the stream always reports the timeout itself
    // rather than the end (killed, -1) that the timeout caused.
    let deadline = ctx
        .timeout
        .map(|timeout| tokio::time::Instant::now() + timeout);
    if let Some(deadline) = deadline {
        // Like envd, the command's timeout bounds the process, not just this stream.
        let doomed = handle.clone();
        let mut ended = handle.ended.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {
                    let _ = doomed.signal(nix::sys::signal::Signal::SIGKILL);
                }
                _ = ended.wait_for(|e| e.is_some()) => {}
            }
        });
    }

    // Supervisor: all output first, then the end event, then forget the process.
    let supervisor_agent = agent.clone();
    let supervisor_handle = handle.clone();
    tokio::spawn(async move {
        let status = spawned.exit.await;
        let _ = reaped_tx.send(true);
        // Output still buffered in the pipes is delivered; a pipe held open by a leftover
        // grandchild is not waited for longer than a moment after the process itself ended.
        for reader in readers {
            let _ = tokio::time::timeout(Duration::from_millis(500), reader).await;
        }
        let end = end_event(status.ok());
        log_end(&supervisor_agent, pid, &end);
        let _ = ended_tx.send(Some(end.clone()));
        let _ = events.send(Event::End(end));
        supervisor_agent.processes.remove(pid);
        // Drop the PTY master / stdin with the handle.
        drop(supervisor_handle);
    });

    let stream = event_stream(&ctx, handle, first_subscriber, deadline, |event| {
        StartResponse {
            event: Some(ProcessEvent { event: Some(event) }),
        }
    });
    Ok(stream)
}

pub async fn connect(
    agent: Arc<Agent>,
    ctx: CallContext,
    req: ConnectRequest,
) -> Result<MessageStream<ConnectResponse>, ConnectError> {
    let handle = agent.processes.get(req.process.as_ref())?;
    let rx = handle.events.subscribe();
    Ok(event_stream(&ctx, handle, rx, None, |event| {
        ConnectResponse {
            event: Some(ProcessEvent { event: Some(event) }),
        }
    }))
}

/// The stream of a Start or Connect call: start event, output, keepalives, end.
fn event_stream<M: Send + 'static>(
    ctx: &CallContext,
    handle: Arc<ProcessHandle>,
    mut rx: broadcast::Receiver<Event>,
    deadline: Option<tokio::time::Instant>,
    wrap: fn(Event) -> M,
) -> MessageStream<M> {
    let (tx, out) = mpsc::channel::<Result<M, ConnectError>>(64);
    let keepalive = ctx.keepalive_interval();
    tokio::spawn(async move {
        let start = Event::Start(process_event::StartEvent { pid: handle.pid });
        if tx.send(Ok(wrap(start))).await.is_err() {
            return;
        }
        let timeout_error = || {
            ConnectError::new(
                Code::DeadlineExceeded,
                "the command's timeout expired and it was killed",
            )
        };
        // An end at or after the deadline is the timeout's doing.
        let expired = move || deadline.is_some_and(|at| tokio::time::Instant::now() >= at);
        let already_ended = handle.ended.borrow().clone();
        if let Some(end) = already_ended {
            // Output this subscriber was sent before the end still goes out first.
            while let Ok(event) = rx.try_recv() {
                if matches!(event, Event::End(_)) {
                    break;
                }
                if tx.send(Ok(wrap(event))).await.is_err() {
                    return;
                }
            }
            let last = if expired() {
                Err(timeout_error())
            } else {
                Ok(wrap(Event::End(end)))
            };
            let _ = tx.send(last).await;
            return;
        }
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
        loop {
            let timed_out = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = timed_out => {
                    let _ = handle.signal(nix::sys::signal::Signal::SIGKILL);
                    let _ = tx.send(Err(timeout_error())).await;
                    return;
                }
                event = rx.recv() => match event {
                    Ok(Event::End(end)) => {
                        let last = if expired() { Err(timeout_error()) } else { Ok(wrap(Event::End(end))) };
                        let _ = tx.send(last).await;
                        return;
                    }
                    Ok(other) => {
                        if tx.send(Ok(wrap(other))).await.is_err() {
                            return;
                        }
                        ticker.reset();
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(pid = handle.pid, "slow stream lost {n} output chunks");
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = ticker.tick() => {
                    let ka = Event::Keepalive(process_event::KeepAlive {});
                    if tx.send(Ok(wrap(ka))).await.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    ReceiverStream::new(out).boxed()
}

/// A field map with `pid` (every entry about a process carries it).
fn pid_fields(pid: u32) -> BTreeMap<String, String> {
    BTreeMap::from([("pid".to_string(), pid.to_string())])
}

/// `cmd` and `args` as one would type them in a shell.
fn command_line(cmd: &str, args: &[String]) -> String {
    std::iter::once(cmd)
        .chain(args.iter().map(String::as_str))
        .map(|word| {
            let plain = !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
            if plain {
                word.to_string()
            } else {
                format!("'{}'", word.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn log_start(
    agent: &Agent,
    pid: u32,
    user: &str,
    config: &ProcessConfig,
    tag: Option<&str>,
    pty: bool,
) {
    let line = command_line(&config.cmd, &config.args);
    let mut fields = pid_fields(pid);
    fields.insert("user".into(), user.to_string());
    fields.insert("event".into(), "process_start".into());
    if let Some(tag) = tag {
        fields.insert("tag".into(), tag.to_string());
    }
    let what = if pty { "terminal" } else { "process" };
    let mut message = format!("{what} {pid} started as {user}: {line}");
    message.truncate(crate::logbook::MAX_LINE);
    agent.logbook.record("info", message, fields);
}

fn log_end(agent: &Agent, pid: u32, end: &process_event::EndEvent) {
    let mut fields = pid_fields(pid);
    fields.insert("event".into(), "process_end".into());
    fields.insert("exit_code".into(), end.exit_code.to_string());
    let level = if end.exited && end.exit_code == 0 {
        "info"
    } else {
        "error"
    };
    let message = format!("process {pid} ended: {}", end.status);
    agent.logbook.record(level, message, fields);
}

/// Records each line of a command's output: stdout at level info, stderr at warn.
fn log_lines(agent: &Agent, pid: u32, is_stderr: bool, lines: Vec<String>) {
    let (stream, level) = if is_stderr {
        ("stderr", "warn")
    } else {
        ("stdout", "info")
    };
    for line in lines {
        let mut fields = pid_fields(pid);
        fields.insert("stream".into(), stream.into());
        agent.logbook.record(level, line, fields);
    }
}

async fn pump_pipe(
    mut pipe: tokio::net::unix::pipe::Receiver,
    events: broadcast::Sender<Event>,
    is_stderr: bool,
    agent: Arc<Agent>,
    pid: u32,
) {
    let mut buf = vec![0u8; STD_CHUNK];
    let mut lines = LineSplitter::default();
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => {
                log_lines(&agent, pid, is_stderr, lines.finish().into_iter().collect());
                return;
            }
            Ok(n) => {
                log_lines(&agent, pid, is_stderr, lines.feed(&buf[..n]));
                let chunk = buf[..n].to_vec();
                let output = if is_stderr {
                    Output::Stderr(chunk)
                } else {
                    Output::Stdout(chunk)
                };
                let _ = events.send(Event::Data(process_event::DataEvent {
                    output: Some(output),
                }));
            }
        }
    }
}

async fn pump_pty(master: Arc<AsyncFd<OwnedFd>>, events: broadcast::Sender<Event>) {
    let mut buf = vec![0u8; PTY_CHUNK];
    loop {
        let Ok(mut guard) = master.readable().await else {
            return;
        };
        match guard.try_io(|fd| {
            nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(fd.get_ref()), &mut buf)
                .map_err(std::io::Error::from)
        }) {
            // EIO: every slave fd is closed, the session is over.
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => {
                let _ = events.send(Event::Data(process_event::DataEvent {
                    output: Some(Output::Pty(buf[..n].to_vec())),
                }));
            }
            Err(_would_block) => continue,
        }
    }
}

/// The end event as envd reports it (Go's `ProcessState` wording).
fn end_event(status: Option<ExitStatus>) -> process_event::EndEvent {
    match status {
        Some(ExitStatus::Exited(code)) => process_event::EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: (code != 0).then(|| format!("exit status {code}")),
        },
        Some(ExitStatus::Signaled(sig)) => {
            let name = signal_name(sig);
            process_event::EndEvent {
                exit_code: -1,
                exited: false,
                status: format!("signal: {name}"),
                error: Some(format!("signal: {name}")),
            }
        }
        None => process_event::EndEvent {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some("the process's exit status was lost".into()),
        },
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGKILL => "killed".into(),
        libc::SIGTERM => "terminated".into(),
        libc::SIGINT => "interrupt".into(),
        libc::SIGHUP => "hangup".into(),
        libc::SIGSEGV => "segmentation fault".into(),
        libc::SIGABRT => "aborted".into(),
        libc::SIGPIPE => "broken pipe".into(),
        other => format!("signal {other}"),
    }
}

fn clamp_u16(v: u32, default: u16) -> u16 {
    if v == 0 {
        default
    } else {
        v.min(u16::MAX as u32) as u16
    }
}

pub async fn update(
    agent: Arc<Agent>,
    _ctx: CallContext,
    req: UpdateRequest,
) -> Result<UpdateResponse, ConnectError> {
    let handle = agent.processes.get(req.process.as_ref())?;
    if let Some(size) = req.pty.and_then(|p| p.size) {
        handle.resize(clamp_u16(size.cols, 80), clamp_u16(size.rows, 24))?;
    }
    Ok(UpdateResponse {})
}

async fn write_input(
    handle: &ProcessHandle,
    input: Option<process_input::Input>,
) -> Result<(), ConnectError> {
    match input {
        Some(process_input::Input::Stdin(data)) => handle.write_stdin(&data).await,
        Some(process_input::Input::Pty(data)) => handle.write_pty(&data).await,
        None => Ok(()),
    }
}

pub async fn send_input(
    agent: Arc<Agent>,
    _ctx: CallContext,
    req: SendInputRequest,
) -> Result<SendInputResponse, ConnectError> {
    let handle = agent.processes.get(req.process.as_ref())?;
    write_input(&handle, req.input.and_then(|i| i.input)).await?;
    Ok(SendInputResponse {})
}

pub async fn stream_input(
    agent: Arc<Agent>,
    _ctx: CallContext,
    mut requests: MessageStream<StreamInputRequest>,
) -> Result<StreamInputResponse, ConnectError> {
    let mut target: Option<Arc<ProcessHandle>> = None;
    while let Some(request) = requests.next().await {
        match request?.event {
            Some(stream_input_request::Event::Start(start)) => {
                target = Some(agent.processes.get(start.process.as_ref())?);
            }
            Some(stream_input_request::Event::Data(data)) => {
                let handle = target.as_ref().ok_or_else(|| {
                    ConnectError::new(
                        Code::FailedPrecondition,
                        "input sent before the start event",
                    )
                })?;
                write_input(handle, data.input.and_then(|i| i.input)).await?;
            }
            Some(stream_input_request::Event::Keepalive(_)) | None => {}
        }
    }
    Ok(StreamInputResponse {})
}

pub async fn send_signal(
    agent: Arc<Agent>,
    _ctx: CallContext,
    req: SendSignalRequest,
) -> Result<SendSignalResponse, ConnectError> {
    let handle = agent.processes.get(req.process.as_ref())?;
    let signal = match Signal::try_from(req.signal) {
        Ok(Signal::Sigkill) => nix::sys::signal::Signal::SIGKILL,
        Ok(Signal::Sigterm) => nix::sys::signal::Signal::SIGTERM,
        _ => {
            return Err(ConnectError::new(
                Code::Unimplemented,
                format!("invalid signal: {}", req.signal),
            ))
        }
    };
    handle.signal(signal)?;
    if signal == nix::sys::signal::Signal::SIGKILL {
        // `commands.kill(pid)` returns once the process is gone, so a `kill -0 pid` right after it fails.
        // SIGKILL cannot be caught; only a process stuck in the kernel outlasts the bound, and then the
        // signal is still pending on it.
        if !handle.wait_reaped(KILL_WAIT).await {
            tracing::warn!(
                pid = handle.pid,
                "process not reaped {KILL_WAIT:?} after SIGKILL"
            );
        }
    }
    Ok(SendSignalResponse {})
}

pub async fn close_stdin(
    agent: Arc<Agent>,
    _ctx: CallContext,
    req: CloseStdinRequest,
) -> Result<CloseStdinResponse, ConnectError> {
    let handle = agent.processes.get(req.process.as_ref())?;
    handle.close_stdin().await?;
    Ok(CloseStdinResponse {})
}
