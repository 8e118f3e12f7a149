//! `warren down`: stops the server of a state directory (found by its lock, `warren_server::state_lock`)
//! and, with `--kill-sandboxes`, ends what it started: every sandbox in its store, running or paused,
//! the template-build sandboxes its runtime still has, and its lxcfs mount.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_server::lifecycle::Lifecycle;
use warren_server::metrics::Metrics;
use warren_server::state_lock::{StateLock, StateLockError};
use warren_server::store::SandboxFilter;
use warren_server::ServerConfig;

use super::CommandError;
use crate::args::{DownArgs, GlobalArgs};
use crate::exit_code;
use crate::state_dir;

#[derive(Debug, thiserror::Error)]
pub enum DownError {
    #[error(transparent)]
    Lock(#[from] StateLockError),
    #[error("cannot signal the server (pid {pid}): {source}")]
    Signal {
        pid: u32,
        #[source]
        source: nix::Error,
    },
    #[error("the server (pid {pid}) did not stop within {seconds} s")]
    Timeout { pid: u32, seconds: u64 },
    #[error("cannot start the runtime to end the sandboxes: {0}")]
    Runtime(String),
    #[error("cannot end the sandboxes: {0}")]
    Sandboxes(String),
}

/// How often the lock is looked at while the server stops.
const POLL: Duration = Duration::from_millis(100);

pub async fn run(_global: &GlobalArgs, args: DownArgs) -> Result<i32, CommandError> {
    let state_dir = state_dir::resolve(&args.state);
    match StateLock::holder(&state_dir).map_err(DownError::from)? {
        None => println!("no warren server runs on {}", state_dir.display()),
        Some(pid) => {
            stop(pid, &state_dir, Duration::from_secs(args.timeout_secs)).await?;
            println!("stopped the warren server (pid {pid})");
        }
    }
    if args.kill_sandboxes {
        let database =
            state_dir::database(&args.state).map_err(|e| DownError::Sandboxes(e.to_string()))?;
        let (sandboxes, untracked) =
            kill_sandboxes(&state_dir, &database, args.agent.clone()).await?;
        println!("killed {sandboxes} sandbox(es) and {untracked} untracked one(s)");
    }
    Ok(exit_code::OK)
}

async fn stop(pid: u32, state_dir: &Path, timeout: Duration) -> Result<(), DownError> {
    let target = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM)
        .map_err(|source| DownError::Signal { pid, source })?;
    let started = Instant::now();
    while StateLock::holder(state_dir)?.is_some() {
        if started.elapsed() >= timeout {
            return Err(DownError::Timeout {
                pid,
                seconds: timeout.as_secs(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// Ends every sandbox of `state_dir` with the server stopped (holding its lock, so none starts
/// meanwhile): the store's through the lifecycle (as a kill through the API would), then whatever
/// the runtime still has that no row names. Returns both counts.
async fn kill_sandboxes(
    state_dir: &Path,
    database: &warren_server::store::Database,
    agent: Option<std::path::PathBuf>,
) -> Result<(usize, usize), DownError> {
    let _lock = StateLock::acquire(state_dir)?;
    let mut config = ServerConfig::new(state_dir.to_path_buf());
    config.agent_binary = agent;
    let runtime = warren_server::runtime_host::linux_runtime(&config)
        .map_err(|e| DownError::Runtime(e.to_string()))?;
    config.database_url = match database {
        warren_server::store::Database::Postgres(url) => Some(url.clone()),
        warren_server::store::Database::Sqlite(_) => None,
    };
    let store = warren_server::open_database(database)
        .await
        .map_err(|e| DownError::Sandboxes(e.to_string()))?;
    let lifecycle = Lifecycle::new(
        store,
        Arc::clone(&runtime),
        config,
        Arc::new(Metrics::new()),
    );
    // What a server start does first: the store and the host agree before anything is ended.
    warren_server::lifecycle::reconcile::reconcile(&lifecycle)
        .await
        .map_err(|e| DownError::Sandboxes(e.to_string()))?;
    let live = lifecycle
        .list(&SandboxFilter::default())
        .await
        .map_err(|e| DownError::Sandboxes(e.to_string()))?;
    for record in &live {
        lifecycle
            .kill(&record.id, "warren down --kill-sandboxes")
            .await
            .map_err(|e| DownError::Sandboxes(format!("{}: {e}", record.id)))?;
    }
    let untracked = tokio::task::spawn_blocking(move || -> Result<usize, String> {
        let left = runtime.list().map_err(|e| e.to_string())?;
        for sandbox in &left {
            runtime
                .destroy(&sandbox.id)
                .map_err(|e| format!("{}: {e}", sandbox.id))?;
        }
        Ok(left.len())
    })
    .await
    .map_err(|e| DownError::Sandboxes(e.to_string()))?
    .map_err(DownError::Sandboxes)?;
    warren_runtime::rootfs::lxcfs::stop(state_dir);
    Ok((live.len(), untracked))
}
