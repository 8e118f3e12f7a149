//! LXCFS: sandboxes see their own limits in `/proc/meminfo`, `/proc/cpuinfo`, `/proc/stat`,
//! `/proc/uptime`, `/proc/loadavg`, `/proc/diskstats`, `/proc/swaps` and
//! `/sys/devices/system/cpu/online`, so `free`, `top`, the JVM, pandas and `make -j` size themselves
//! to the sandbox instead of the host.
//!
//! One `lxcfs` daemon (Debian's package) serves the whole host from `<state dir>/lxcfs`: it answers each
//! read from the cgroups of the process that reads, so one mount serves every sandbox. The sandbox's
//! init clones each of its files with `open_tree` before `pivot_root` (the host's tree is still in
//! reach then) and attaches them over the sandbox's own entries once its /proc is mounted.
//!
//! Checkpoints: CRIU cannot dump FUSE mounts, so each of these bind mounts is declared to it as an
//! external mount (`--external mnt[/proc/meminfo]:lxcfs-proc-meminfo` on dump, the key mapped back to
//! the host file on restore), the way the agent binary is. A restored sandbox reads the same daemon.
//!
//! Where lxcfs is not installed, or cannot start, sandboxes run without it (and see the host's
//! figures); the runtime logs why.

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The files lxcfs virtualises, relative to both its mount and the sandbox's root.
pub const VIRTUALISED: [&str; 8] = [
    "proc/cpuinfo",
    "proc/meminfo",
    "proc/stat",
    "proc/uptime",
    "proc/loadavg",
    "proc/diskstats",
    "proc/swaps",
    "sys/devices/system/cpu/online",
];

/// How long a freshly started daemon has to answer.
const START_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum LxcfsError {
    #[error("lxcfs is not installed (apt-get install lxcfs)")]
    NotInstalled,
    #[error("cannot prepare {path}")]
    Prepare {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start lxcfs")]
    Start(#[source] std::io::Error),
    #[error("lxcfs at {0} did not answer within {START_TIMEOUT:?}")]
    NoAnswer(PathBuf),
}

/// Where Warren mounts lxcfs for `state_dir`.
pub fn mountpoint(state_dir: &Path) -> PathBuf {
    state_dir.join("lxcfs")
}

/// Whether the lxcfs at `mountpoint` answers (a dead daemon leaves its mount failing with ENOTCONN).
pub fn answers(mountpoint: &Path) -> bool {
    std::fs::read(mountpoint.join("proc/meminfo")).is_ok_and(|bytes| !bytes.is_empty())
}

/// Makes sure an lxcfs daemon serves `<state_dir>/lxcfs`, starting one if none answers. The daemon
/// outlives this process on purpose: running sandboxes keep reading it after `warren up` stops.
pub fn ensure(state_dir: &Path) -> Result<PathBuf, LxcfsError> {
    let mount = mountpoint(state_dir);
    if answers(&mount) {
        return Ok(mount);
    }
    let binary = find_binary().ok_or(LxcfsError::NotInstalled)?;
    // A stale mount of a daemon that died: detach it before mounting afresh.
    let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
    std::fs::create_dir_all(&mount).map_err(|source| LxcfsError::Prepare {
        path: mount.clone(),
        source,
    })?;
    // lxcfs stays in the foreground; it runs in a session of its own so that a signal to the group of
    // `warren up` does not take it down with the sandboxes' /proc. A thread reaps it if it ever exits.
    let mut command = Command::new(binary);
    command
        .arg("--enable-cfs")
        .arg("--enable-loadavg")
        .arg("--pidfile")
        .arg(state_dir.join("lxcfs.pid"))
        .arg(&mount)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(LxcfsError::Start)?;
    let pid = child.id();
    std::thread::spawn(move || {
        let status = child.wait();
        tracing::warn!(
            pid,
            ?status,
            "lxcfs exited; sandboxes started from now on see the host's /proc"
        );
    });
    let deadline = Instant::now() + START_TIMEOUT;
    while !answers(&mount) {
        if Instant::now() >= deadline {
            return Err(LxcfsError::NoAnswer(mount));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(mount)
}

/// Detaches Warren's lxcfs mount of `state_dir`. The daemon exits once no sandbox holds one of its
/// files any more (at once when none runs). For test harnesses and for tearing a state dir down; a
/// serving Warren leaves its daemon running.
pub fn stop(state_dir: &Path) {
    let mount = mountpoint(state_dir);
    if nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).is_ok() {
        let _ = std::fs::remove_dir(&mount);
    }
}

fn find_binary() -> Option<PathBuf> {
    ["/usr/bin/lxcfs", "/usr/local/bin/lxcfs"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
}

/// The CRIU external-mount key of the bind mount at `/<relative>`.
pub fn external_key(relative: &str) -> String {
    format!("lxcfs-{}", relative.replace('/', "-"))
}

/// Which of [`VIRTUALISED`] are mount points in the sandbox whose init is `init_pid` (read from the
/// kernel's `/proc/<pid>/mountinfo`, not from the sandbox's files).
pub fn mounted_in(init_pid: u32) -> Vec<&'static str> {
    let Ok(info) = std::fs::read_to_string(format!("/proc/{init_pid}/mountinfo")) else {
        return Vec::new();
    };
    let points: Vec<&str> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .collect();
    VIRTUALISED
        .into_iter()
        .filter(|relative| points.contains(&format!("/{relative}").as_str()))
        .collect()
}

/// A detached clone of each lxcfs file that answers, to attach inside the sandbox after its pivot.
/// Runs in the sandbox's init before `pivot_root`.
pub fn open_files(mount: &Path) -> Vec<(&'static str, OwnedFd)> {
    VIRTUALISED
        .into_iter()
        .filter(|relative| std::fs::metadata(mount.join(relative)).is_ok())
        .filter_map(|relative| {
            super::sandbox_mounts::open_tree_clone(&mount.join(relative))
                .ok()
                .map(|fd| (relative, fd))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_keys_are_distinct_and_free_of_slashes() {
        let keys: Vec<String> = VIRTUALISED.iter().map(|r| external_key(r)).collect();
        for key in &keys {
            assert!(!key.contains('/'), "{key}");
        }
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len());
        assert_eq!(external_key("proc/meminfo"), "lxcfs-proc-meminfo");
    }

    #[test]
    fn nothing_is_mounted_in_a_process_that_does_not_exist() {
        assert!(mounted_in(u32::MAX).is_empty());
    }
}
