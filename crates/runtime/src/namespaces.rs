//! Namespaces of a sandbox. pid, mount, uts, ipc and cgroup are made by the supervisor for the sandbox's
//! init (unshare of the pid namespace before the fork, the others in the child, after it joined its
//! cgroups: the cgroup namespace's root is then the sandbox's own cgroup, so `/proc/self/cgroup` inside
//! reads `/` instead of the host's `/warren/<id>`). The network namespace is
//! made separately and pinned by a bind mount at `sandboxes/<id>/netns`, so the network can be set up
//! before the init exists, and so a CRIU restore can join a fresh one. No user namespace: see the crate
//! docs for why.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    #[error("unshare {0}")]
    Unshare(&'static str, #[source] nix::Error),
    #[error("join namespace {path}")]
    Join {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("open namespace {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pin namespace at {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
}

/// The namespaces the sandbox's init gets besides the network one (the pid one via [`unshare_pid`]).
pub const INIT_NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWCGROUP);

pub fn open(path: &Path) -> Result<File, NamespaceError> {
    File::open(path).map_err(|source| NamespaceError::Open {
        path: path.to_path_buf(),
        source,
    })
}

pub fn join(ns: &File, path: &Path, kind: CloneFlags) -> Result<(), NamespaceError> {
    setns(ns.as_fd(), kind).map_err(|source| NamespaceError::Join {
        path: path.to_path_buf(),
        source,
    })
}

/// Runs `work` on a short-lived thread that has joined `ns` (of kind `kind`; network and UTS
/// namespaces are per-thread attributes), so the caller's own namespaces stay as they are. A child
/// process the thread starts inherits them. `Err` says why the thread could not join or panicked.
pub fn run_in<T: Send>(
    ns: &File,
    kind: CloneFlags,
    work: impl FnOnce() -> T + Send,
) -> Result<T, String> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                setns(ns.as_fd(), kind).map_err(|e| format!("join namespace: {e}"))?;
                Ok(work())
            })
            .join()
            .unwrap_or_else(|_| Err("namespace thread panicked".to_string()))
    })
}

/// Creates a network namespace, pins it at `pin` (an existing empty file) and returns the calling
/// thread to the namespace it was in. Returns the new namespace.
pub fn create_pinned_netns(pin: &Path) -> Result<File, NamespaceError> {
    let created = create_netns()?;
    pin_netns(&created, pin)?;
    Ok(created)
}

/// Creates a network namespace and returns the calling thread to the namespace it was in. Nothing
/// but the returned file keeps the new namespace alive until it is pinned.
pub fn create_netns() -> Result<File, NamespaceError> {
    let here_path = Path::new("/proc/thread-self/ns/net");
    let original = open(here_path)?;
    unshare(CloneFlags::CLONE_NEWNET).map_err(|e| NamespaceError::Unshare("net", e))?;
    let created = open(here_path);
    join(&original, here_path, CloneFlags::CLONE_NEWNET)?;
    created
}

/// Pins the network namespace `netns` at `pin` (an existing empty file) with a bind mount.
pub fn pin_netns(netns: &File, pin: &Path) -> Result<(), NamespaceError> {
    use std::os::fd::AsRawFd;
    let source = PathBuf::from(format!("/proc/self/fd/{}", netns.as_raw_fd()));
    mount(
        Some(&source),
        pin,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|source| NamespaceError::Pin {
        path: pin.to_path_buf(),
        source,
    })
}

/// Unpins a network namespace (it goes away once no process is in it).
pub fn remove_pinned_netns(pin: &Path) -> Result<(), NamespaceError> {
    match umount2(pin, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        Err(source) => Err(NamespaceError::Pin {
            path: pin.to_path_buf(),
            source,
        }),
    }
}

/// The next child of the caller becomes PID 1 of a new pid namespace.
pub fn unshare_pid() -> Result<(), NamespaceError> {
    unshare(CloneFlags::CLONE_NEWPID).map_err(|e| NamespaceError::Unshare("pid", e))
}

/// Gives the caller (the sandbox's init, already in its cgroups) its own mount, uts, ipc and cgroup
/// namespaces.
pub fn unshare_init_namespaces() -> Result<(), NamespaceError> {
    unshare(INIT_NAMESPACES).map_err(|e| NamespaceError::Unshare("mount+uts+ipc+cgroup", e))
}
