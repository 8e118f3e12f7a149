//! One supervisor process per sandbox. The runtime writes a [`SupervisorConfig`] to
//! `sandboxes/<id>/supervisor.json` and starts `warren-supervisor run <config> --status-fd N`. The
//! supervisor detaches (double fork + setsid, so it outlives the server and is never its zombie), wires
//! the network, starts the sandbox's init in fresh pid/mount/uts/ipc namespaces, reports
//! `ok <init pid> <supervisor pid>` or `err <message>` on the status fd, then waits for the init and
//! records its exit status in `sandboxes/<id>/init.exit`. A [`standby::StandbyPool`] keeps a few
//! supervisors started ahead of need (`warren-supervisor standby`), handed a configuration's path
//! on their stdin instead.

pub mod deadline;
mod init;
mod run;
pub mod standby;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use run::{adopt, run_supervisor, standby as run_standby, wait_and_record};

use crate::network::NetworkPlan;

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("supervisor config {path}")]
    Config {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("start supervisor {binary}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("status pipe")]
    Pipe(#[source] nix::Error),
    #[error("sandbox set-up failed: {0}")]
    SetupFailed(String),
    #[error("supervisor gave no answer within {0:?}")]
    Timeout(Duration),
    #[error("supervisor answered {0:?}")]
    BadAnswer(String),
}

/// What the supervisor needs to build one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SupervisorConfig {
    pub id: String,
    pub sandbox_dir: PathBuf,
    /// Empty directory the overlay is mounted on (inside the sandbox's mount namespace only).
    pub rootfs: PathBuf,
    pub overlay: crate::rootfs::sandbox_mounts::OverlayPlan,
    pub agent_binary: PathBuf,
    /// `cgroup.procs` files the init joins before anything else.
    pub cgroup_procs: Vec<PathBuf>,
    /// File the network namespace is pinned at.
    pub netns_pin: PathBuf,
    pub network: NetworkPlan,
    pub no_new_privs: bool,
    /// Keep CAP_NET_RAW ([`crate::NetworkSpec::raw_sockets`]).
    #[serde(default)]
    pub net_raw: bool,
    /// Syscalls the sandbox may use beyond the default seccomp filter (a restore keeps the filter
    /// the checkpoint was taken with: CRIU restores it).
    #[serde(default)]
    pub syscalls: crate::seccomp::SyscallPolicy,
    /// Restore this checkpoint instead of starting a fresh init (resume, fork, template start).
    #[serde(default)]
    pub restore: Option<RestorePlan>,
    /// The host's lxcfs mount, whose files the init binds over /proc (see [`crate::rootfs::lxcfs`]).
    #[serde(default)]
    pub lxcfs: Option<PathBuf>,
    /// Volumes bound into the sandbox (a fresh start attaches them; a restore maps CRIU's external
    /// mounts `volume-<n>` back to them, in this order).
    #[serde(default)]
    pub volumes: Vec<crate::rootfs::volume_disk::VolumeBind>,
}

/// How the supervisor restores a checkpoint (whose writable layer the runtime already unpacked).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestorePlan {
    pub checkpoint: PathBuf,
    /// Scratch dir for the decompressed images and CRIU's log.
    pub work_dir: PathBuf,
    /// The CRIU binary and version the runtime probed.
    pub criu_binary: PathBuf,
    pub criu_version: String,
    /// Cache of verified, unpacked image sets to restore through (a checkpoint that is copied
    /// again and again: a template's, a fork source's); `None` unpacks from the checkpoint.
    #[serde(default)]
    pub image_cache: Option<PathBuf>,
    /// Restore the memory lazily when the checkpoint's format allows it (see
    /// [`crate::checkpoint::lazy_pages`]); the supervisor then sees the transfer through before it
    /// becomes the plain waiter.
    #[serde(default)]
    pub lazy: bool,
}

/// While a lazy restore's pages are still arriving, `sandboxes/<id>/` holds this file with the pids
/// of the lazy-pages daemon and the page server.
pub const PAGES_PENDING_FILE: &str = "pages.pending";
/// A lazy restore that failed after the sandbox was handed out (a corrupt page chunk, a dead daemon)
/// leaves the reason here; the sandbox's tree was killed before it could use the missing memory.
pub const RESTORE_FAILED_FILE: &str = "restore.failed";

/// Whether the transfer `sandbox_dir` records is still under way: the file exists and one of the two
/// processes it names is alive.
pub fn pages_pending(sandbox_dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(sandbox_dir.join(PAGES_PENDING_FILE)) else {
        return false;
    };
    text.split_whitespace()
        .filter_map(|pid| pid.parse::<i32>().ok())
        .filter(|pid| *pid > 1)
        // SAFETY: kill with signal 0 only checks that the process exists.
        .any(|pid| unsafe { libc::kill(pid, 0) } == 0)
}

impl SupervisorConfig {
    pub fn path_in(sandbox_dir: &Path) -> PathBuf {
        sandbox_dir.join("supervisor.json")
    }

    pub fn write(&self) -> Result<PathBuf, SupervisorError> {
        let path = Self::path_in(&self.sandbox_dir);
        let json = serde_json::to_vec_pretty(self).map_err(|e| SupervisorError::Config {
            path: path.clone(),
            source: e.into(),
        })?;
        std::fs::write(&path, json).map_err(|source| SupervisorError::Config {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    pub fn read(path: &Path) -> Result<Self, SupervisorError> {
        let bytes = std::fs::read(path).map_err(|source| SupervisorError::Config {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| SupervisorError::Config {
            path: path.to_path_buf(),
            source: e.into(),
        })
    }
}

/// Host PIDs of a freshly started sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launched {
    pub init_pid: u32,
    pub supervisor_pid: u32,
}

/// Starts a new supervisor (`warren-supervisor adopt`) for the running init `init_pid` of the sandbox
/// in `sandbox_dir`, whose own supervisor is gone; returns the new one's pid.
pub fn adopt_running(
    binary: &Path,
    init_pid: u32,
    sandbox_dir: &Path,
    log: &Path,
) -> Result<u32, SupervisorError> {
    let spawn_error = |source| SupervisorError::Spawn {
        binary: binary.to_path_buf(),
        source,
    };
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|source| SupervisorError::Config {
            path: log.to_path_buf(),
            source,
        })?;
    let output = Command::new(binary)
        .arg("adopt")
        .arg(init_pid.to_string())
        .arg(sandbox_dir)
        .stdin(Stdio::null())
        .stderr(log_file)
        .current_dir("/")
        .output()
        .map_err(spawn_error)?;
    let answer = String::from_utf8_lossy(&output.stdout).trim().to_string();
    match answer.parse::<u32>() {
        Ok(pid) if output.status.success() && pid > 1 => Ok(pid),
        _ => Err(SupervisorError::BadAnswer(answer)),
    }
}

/// Starts the supervisor for `config_path` and waits for its report.
pub fn launch(
    binary: &Path,
    config_path: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<Launched, SupervisorError> {
    let (read_end, write_end) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(SupervisorError::Pipe)?;
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|source| SupervisorError::Config {
            path: log.to_path_buf(),
            source,
        })?;
    // The status pipe goes as stdout and no code runs between fork and exec, so the standard
    // library starts the process with posix_spawn (a vfork) instead of a fork that copies the
    // server's page tables.
    let mut command = Command::new(binary);
    command
        .arg("run")
        .arg(config_path)
        .arg("--status-fd")
        .arg("1")
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .stderr(log_file)
        .current_dir("/");
    let mut child = command.spawn().map_err(|source| SupervisorError::Spawn {
        binary: binary.to_path_buf(),
        source,
    })?;
    // The command held the write end; dropping it leaves the supervisor the only writer.
    drop(command);
    // The first supervisor process only forks the detached one and exits.
    child.wait().map_err(|source| SupervisorError::Spawn {
        binary: binary.to_path_buf(),
        source,
    })?;
    let line = read_line_within(&read_end, timeout)?;
    parse_report(&line)
}

/// Reads one line (up to its newline, or end of input: then what came, possibly nothing) from the
/// pipe `fd`, waiting at most `timeout` in all. Lines on a status pipe are written whole by one
/// write(2) each, so nothing after the newline is read here and lost.
fn read_line_within(fd: &OwnedFd, timeout: Duration) -> Result<String, SupervisorError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let deadline = std::time::Instant::now() + timeout;
    let mut line = Vec::new();
    loop {
        let remaining = deadline.saturating_duration_since(std::time::Instant::now());
        let millis = u16::try_from(remaining.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        let ready = match poll(&mut fds, PollTimeout::from(millis)) {
            Err(nix::Error::EINTR) => continue,
            other => other.map_err(SupervisorError::Pipe)?,
        };
        if ready == 0 {
            return Err(SupervisorError::Timeout(timeout));
        }
        let mut buf = [0u8; 512];
        let n = match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Err(nix::Error::EINTR) => continue,
            other => other.map_err(SupervisorError::Pipe)?,
        };
        line.extend_from_slice(&buf[..n]);
        if n == 0 || line.ends_with(b"\n") {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
    }
}

fn parse_report(line: &str) -> Result<Launched, SupervisorError> {
    let line = line.trim_end();
    if let Some(message) = line.strip_prefix("err ") {
        return Err(SupervisorError::SetupFailed(message.to_string()));
    }
    let mut words = line.strip_prefix("ok ").unwrap_or("").split(' ');
    let init_pid = words.next().and_then(|w| w.parse().ok());
    let supervisor_pid = words.next().and_then(|w| w.parse().ok());
    match (init_pid, supervisor_pid) {
        (Some(init_pid), Some(supervisor_pid)) => Ok(Launched {
            init_pid,
            supervisor_pid,
        }),
        _ if line.is_empty() => Err(SupervisorError::SetupFailed(
            "supervisor exited without a report (see supervisor.log)".into(),
        )),
        _ => Err(SupervisorError::BadAnswer(line.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_parse() {
        assert_eq!(
            parse_report("ok 12 34\n").unwrap(),
            Launched {
                init_pid: 12,
                supervisor_pid: 34
            }
        );
        assert!(
            matches!(parse_report("err mount overlay: EINVAL\n"), Err(SupervisorError::SetupFailed(m)) if m.contains("overlay"))
        );
        assert!(matches!(
            parse_report(""),
            Err(SupervisorError::SetupFailed(_))
        ));
        assert!(matches!(
            parse_report("hello"),
            Err(SupervisorError::BadAnswer(_))
        ));
    }
}
