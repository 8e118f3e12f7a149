//! warren-agent: the daemon inside every Warren sandbox. It is the sandbox's PID 1 (reaps
//! orphans, forwards SIGTERM, never exits because a child misbehaves) and serves E2B's envd
//! protocol (HTTP + Connect) so the official e2b SDKs can run commands, open terminals and move
//! files.

mod connect_server;
mod filesystem;
mod http_api;
mod identity;
mod logbook;
mod paths;
mod process;
mod reaper;
mod state;
mod trust_store;
mod users;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "warren-agent",
    version,
    about = "Warren's in-sandbox daemon: speaks E2B's envd protocol.",
    long_about = "Warren's in-sandbox daemon: speaks E2B's envd protocol (HTTP + Connect).\n\n\
        With no arguments it is a sandbox's PID 1 and listens on 0.0.0.0:49983.\n\
        Host mode, for tests: `warren-agent --listen 127.0.0.1:PORT --root DIR` runs as an\n\
        ordinary process; DIR stands for the sandbox's `/`: users come from DIR/etc/passwd and\n\
        DIR/etc/group, and every client path (files, cwd, HOME) is placed under DIR. Commands\n\
        run on the host itself. As root it switches to the requested user; otherwise every\n\
        command and file operation runs as the invoking user."
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:49983")]
    listen: SocketAddr,
    /// Directory that stands for the sandbox's root.
    #[arg(long, default_value = "/")]
    root: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WARREN_AGENT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let root = std::fs::canonicalize(&args.root)
        .with_context(|| format!("root directory {}", args.root.display()))?;
    // SAFETY: umask only changes this process's file creation mask.
    unsafe { libc::umask(0o022) };
    let is_pid1 = std::process::id() == 1;
    if is_pid1 {
        // Not dumpable: root inside the sandbox has no CAP_SYS_PTRACE, so it can neither ptrace the
        // agent nor read its memory, environment or fds (/proc/1/mem, environ, fd; pidfd_getfd). The
        // programs the agent starts are dumpable again after their exec. CRIU (host root) still dumps
        // it and restores the flag.
        // SAFETY: prctl(PR_SET_DUMPABLE, 0) changes only this process's dumpable flag.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    } else {
        reaper::become_subreaper();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args.listen, root, is_pid1))
}

async fn serve(listen: SocketAddr, root: PathBuf, is_pid1: bool) -> anyhow::Result<()> {
    let reaper = reaper::Reaper::global();
    tokio::spawn(reaper.clone().run());
    let agent = state::Agent::new(root.clone(), is_pid1, reaper);
    let app = http_api::router(agent.clone());
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    tracing::info!(
        %listen,
        root = %root.display(),
        pid1 = is_pid1,
        version = warren_proto::envd::ENVD_VERSION,
        sandbox = std::env::var("WARREN_SANDBOX_ID").unwrap_or_default(),
        "warren-agent serving"
    );
    tokio::spawn(shutdown_on_sigterm(agent.clone()));
    loop {
        let (stream, _peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning or exiting.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(http_api::serve_connection(stream, app.clone()));
    }
}

/// SIGTERM: pass it on to every child, give them a moment, then exit. As PID 1 that is every
/// process in the sandbox; in host mode only the commands this agent started.
async fn shutdown_on_sigterm(agent: Arc<state::Agent>) {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        tracing::warn!("cannot handle SIGTERM");
        return;
    };
    term.recv().await;
    tracing::info!("SIGTERM: stopping children");
    let forward = |signal: nix::sys::signal::Signal| {
        if agent.is_pid1 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-1), signal);
        } else {
            for p in agent.processes.list() {
                let _ = p.signal(signal);
            }
        }
    };
    forward(nix::sys::signal::Signal::SIGTERM);
    for _ in 0..50 {
        agent.reaper.reap_now();
        if agent.processes.list().is_empty() && !has_children() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    forward(nix::sys::signal::Signal::SIGKILL);
    agent.reaper.reap_now();
    std::process::exit(0);
}

/// Whether any child process is left (ECHILD means none).
fn has_children() -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    !matches!(
        waitid(
            Id::All,
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT
        ),
        Err(nix::errno::Errno::ECHILD)
    )
}
