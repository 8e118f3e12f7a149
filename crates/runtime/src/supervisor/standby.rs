//! Supervisors started ahead of need. Starting a process from the server (fork of a large,
//! multi-threaded process, exec, dynamic linking, Rust's start-up) is about a third of a supervisor's
//! time in a create (docs/performance.md). A standby supervisor has done all that already: it waits,
//! detached, for one line on its stdin (the path of a sandbox's configuration) and then works as
//! `warren-supervisor run` does. The pool keeps a few ready and tops itself up in the background;
//! when it is empty a create starts a supervisor the ordinary way.
//!
//! A standby holds nothing: no cgroup, mount, namespace or address until it is handed a sandbox. It
//! reads end of input when the pool drops it or the server exits, however it exits, and then ends.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::{read_line_within, Launched, SupervisorError};

/// How long a new standby may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// One detached supervisor waiting for its sandbox.
#[derive(Debug)]
pub struct Standby {
    /// Write end of the standby's stdin; dropping it ends the standby.
    order: File,
    /// Read end of its status pipe.
    status: OwnedFd,
    pid: u32,
}

/// Why a standby could not start a sandbox.
#[derive(Debug)]
pub enum HandError {
    /// It was gone before it could take the order: nothing was started, another way may be tried.
    Gone,
    /// It took the order and the start failed (or it died without a report).
    Failed(SupervisorError),
}

impl Standby {
    /// Starts `binary standby` and waits until the detached supervisor says it is ready.
    pub fn spawn(binary: &Path) -> Result<Self, SupervisorError> {
        let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
        let (status_read, status_write) =
            nix::unistd::pipe2(cloexec).map_err(SupervisorError::Pipe)?;
        let (order_read, order_write) =
            nix::unistd::pipe2(cloexec).map_err(SupervisorError::Pipe)?;
        let spawn_error = |source| SupervisorError::Spawn {
            binary: binary.to_path_buf(),
            source,
        };
        // Orders come on stdin, the status goes out on stdout (the supervisor moves it off fd 1):
        // nothing runs between fork and exec, so this is a posix_spawn, not a fork of the server.
        let mut command = Command::new(binary);
        command
            .arg("standby")
            .arg("--status-fd")
            .arg("1")
            .stdin(Stdio::from(order_read))
            .stdout(Stdio::from(status_write))
            .stderr(Stdio::null())
            .current_dir("/");
        let mut child = command.spawn().map_err(spawn_error)?;
        // The command held the child's ends of both pipes.
        drop(command);
        // The first process only forks the detached one and exits.
        child.wait().map_err(spawn_error)?;
        let line = read_line_within(&status_read, READY_TIMEOUT)?;
        let pid = line
            .trim_end()
            .strip_prefix("ready ")
            .and_then(|pid| pid.parse::<u32>().ok())
            .filter(|pid| *pid > 1)
            .ok_or_else(|| {
                if line.is_empty() {
                    SupervisorError::SetupFailed("a standby supervisor exited at start".into())
                } else {
                    SupervisorError::BadAnswer(line.clone())
                }
            })?;
        Ok(Self {
            order: File::from(order_write),
            status: status_read,
            pid,
        })
    }

    /// The detached standby's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the standby is still alive (it may have been killed from outside).
    fn alive(&self) -> bool {
        // SAFETY: kill with signal 0 only checks that the process exists. The standby is not our
        // child (it was reparented), so a reused pid is possible in principle; the write below then
        // still fails or the report never comes, and the create fails with that reason.
        unsafe { libc::kill(self.pid as libc::pid_t, 0) == 0 }
    }

    /// Hands the standby the sandbox configured at `config_path` and waits up to `timeout` for its
    /// report, as [`super::launch`] does for a new supervisor.
    pub fn hand(mut self, config_path: &Path, timeout: Duration) -> Result<Launched, HandError> {
        if !self.alive() {
            return Err(HandError::Gone);
        }
        let mut order = config_path.as_os_str().as_encoded_bytes().to_vec();
        order.push(b'\n');
        if self.order.write_all(&order).is_err() {
            return Err(HandError::Gone);
        }
        let line = read_line_within(&self.status, timeout).map_err(HandError::Failed)?;
        super::parse_report(&line).map_err(HandError::Failed)
    }
}

/// A few standby supervisors, topped up in the background.
pub struct StandbyPool {
    binary: PathBuf,
    size: usize,
    idle: Mutex<Vec<Standby>>,
    /// A top-up thread is running (at most one at a time).
    filling: Mutex<bool>,
}

impl StandbyPool {
    /// A pool of `size` standbys of `binary` (0: none, every create starts its supervisor), filled
    /// in the background from now on.
    pub fn start(binary: &Path, size: usize) -> Arc<Self> {
        let pool = Arc::new(Self {
            binary: binary.to_path_buf(),
            size,
            idle: Mutex::new(Vec::new()),
            filling: Mutex::new(false),
        });
        pool.top_up();
        pool
    }

    /// A ready standby, if there is one. The pool does not refill until [`Self::top_up`] is called:
    /// a new standby started at once would take CPU from the very create that took this one.
    pub fn take(self: &Arc<Self>) -> Option<Standby> {
        let taken = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if taken.is_none() {
            self.top_up();
        }
        taken
    }

    /// How many standbys are ready now.
    pub fn ready(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The pids of the ready standbys.
    pub fn pids(&self) -> Vec<u32> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.iter().map(Standby::pid).collect()
    }

    /// Starts standbys in the background until the pool is full again.
    pub fn top_up(self: &Arc<Self>) {
        if self.size == 0 {
            return;
        }
        {
            let mut filling = self.filling.lock().unwrap_or_else(|p| p.into_inner());
            if *filling || self.ready() >= self.size {
                return;
            }
            *filling = true;
        }
        // The thread holds the pool weakly: a runtime dropped meanwhile takes its standbys with it.
        let pool: Weak<Self> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("standby-supervisors".into())
            .spawn(move || fill(&pool));
        if spawned.is_err() {
            *self.filling.lock().unwrap_or_else(|p| p.into_inner()) = false;
        }
    }
}

/// Starts standbys until the pool is full or gone; a failure is logged and ends this round (the
/// next take tries again).
fn fill(pool: &Weak<StandbyPool>) {
    loop {
        let Some(pool) = pool.upgrade() else { return };
        {
            // Checked under the flag: a take that pops after this sees the flag cleared and starts
            // a new round.
            let mut filling = pool.filling.lock().unwrap_or_else(|p| p.into_inner());
            if pool.ready() >= pool.size {
                *filling = false;
                return;
            }
        }
        match Standby::spawn(&pool.binary) {
            Ok(standby) => pool
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(standby),
            Err(error) => {
                tracing::warn!(error = %crate::error_chain(&error), "cannot start a standby supervisor");
                *pool.filling.lock().unwrap_or_else(|p| p.into_inner()) = false;
                return;
            }
        }
    }
}
