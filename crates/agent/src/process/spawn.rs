//! Starting a child: as the requested user, in its own process group (or session, with a real
//! pseudo-terminal as its controlling tty), with a clean signal state and only the environment
//! we give it.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::pty::{openpty, Winsize};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::identity::Identity;
use crate::reaper::{ExitStatus, Reaper};

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("error starting process '{cmd}': {source}")]
    Exec {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("error opening a pseudo-terminal: {0}")]
    Pty(#[source] nix::Error),
    #[error("error setting up process I/O: {0}")]
    Io(#[source] std::io::Error),
}

pub struct SpawnRequest {
    pub cmd: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// `None`: keep the agent's own credentials (host mode without root, or root itself).
    pub identity: Option<Identity>,
    /// Columns and rows of a PTY to run the command on.
    pub pty: Option<(u16, u16)>,
    /// Keep a stdin pipe open (non-PTY only).
    pub stdin: bool,
}

pub enum SpawnedIo {
    Pipes {
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
        stdin: Option<pipe::Sender>,
    },
    /// The PTY master, non-blocking.
    Pty { master: OwnedFd },
}

pub struct Spawned {
    pub pid: u32,
    pub exit: oneshot::Receiver<ExitStatus>,
    pub io: SpawnedIo,
}

pub fn spawn(reaper: &Reaper, request: SpawnRequest) -> Result<Spawned, SpawnError> {
    let mut command = std::process::Command::new(&request.cmd);
    command
        .args(&request.args)
        .env_clear()
        .envs(request.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&request.cwd);

    let mut pty_master = None;
    if let Some((cols, rows)) = request.pty {
        let size = Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = openpty(Some(&size), None).map_err(SpawnError::Pty)?;
        for fd in [&pty.master, &pty.slave] {
            fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
                .map_err(SpawnError::Pty)?;
        }
        let clone = |fd: &OwnedFd| fd.try_clone().map_err(SpawnError::Io);
        command
            .stdin(Stdio::from(clone(&pty.slave)?))
            .stdout(Stdio::from(clone(&pty.slave)?))
            .stderr(Stdio::from(clone(&pty.slave)?));
        pty_master = Some(pty.master);
        // `pty.slave` is dropped (closed in the agent) once the child has its copies.
    } else {
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if request.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            });
    }

    let identity = request.identity.clone();
    let with_tty = request.pty.is_some();
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // raw syscalls on data prepared before the fork.
    unsafe {
        command.pre_exec(move || child_setup(identity.as_ref(), with_tty));
    }

    let (mut child, exit) = reaper
        .spawn(&mut command)
        .map_err(|source| SpawnError::Exec {
            cmd: request.cmd.clone(),
            source,
        })?;
    let pid = child.id();
    let io = match pty_master {
        Some(master) => {
            let flags = fcntl(master.as_raw_fd(), FcntlArg::F_GETFL).map_err(SpawnError::Pty)?;
            fcntl(
                master.as_raw_fd(),
                FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
            )
            .map_err(SpawnError::Pty)?;
            SpawnedIo::Pty { master }
        }
        None => {
            let missing = || SpawnError::Io(std::io::Error::other("child pipe missing"));
            let stdout = child.stdout.take().ok_or_else(missing)?;
            let stderr = child.stderr.take().ok_or_else(missing)?;
            let stdin = child.stdin.take();
            SpawnedIo::Pipes {
                stdout: pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))
                    .map_err(SpawnError::Io)?,
                stderr: pipe::Receiver::from_owned_fd(OwnedFd::from(stderr))
                    .map_err(SpawnError::Io)?,
                stdin: match stdin {
                    Some(s) => Some(
                        pipe::Sender::from_owned_fd(OwnedFd::from(s)).map_err(SpawnError::Io)?,
                    ),
                    None => None,
                },
            }
        }
    };
    // The reaper owns the exit status; dropping `child` neither waits nor kills.
    drop(child);
    Ok(Spawned { pid, exit, io })
}

/// In the child, between fork and exec.
fn child_setup(identity: Option<&Identity>, with_tty: bool) -> std::io::Result<()> {
    // SAFETY: plain syscalls on this (single-threaded, just-forked) process.
    unsafe {
        // Signals: default dispositions for what the agent handles or ignores, empty mask.
        for sig in [
            libc::SIGPIPE,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGCHLD,
            libc::SIGQUIT,
        ] {
            libc::signal(sig, libc::SIG_DFL);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());

        if with_tty {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        } else if libc::setpgid(0, 0) < 0 {
            return Err(std::io::Error::last_os_error());
        }

        if let Some(id) = identity {
            if libc::syscall(
                libc::SYS_setgroups,
                id.groups.len() as libc::size_t,
                id.groups.as_ptr(),
            ) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_setresgid, id.gid, id.gid, id.gid) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_setresuid, id.uid, id.uid, id.uid) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Sets the window size of a PTY master.
pub fn resize_pty(master: &impl AsRawFd, cols: u16, rows: u16) -> std::io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which is valid for the call.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ as _, &size) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
