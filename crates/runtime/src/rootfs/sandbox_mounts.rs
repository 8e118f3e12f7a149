//! Mounts made by the sandbox's init inside its own (fresh, private) mount namespace, before it execs
//! the agent. Every mount here has its source inside the sandbox's rootfs except the overlay's own
//! layers and the agent binary bind mount at [`AGENT_PATH`] (the one external mount CRIU is told about).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

/// Where the agent binary appears inside every sandbox.
pub const AGENT_PATH: &str = "/.warren/agent";
/// The agent's stdout and stderr, inside the sandbox (on its writable layer).
pub const AGENT_LOG: &str = "/.warren/agent.log";

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount {what} on {target}")]
    Mount {
        what: String,
        target: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("prepare {path}")]
    Prepare {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pivot_root into {root}")]
    Pivot {
        root: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("layer path {0} has no name or holds a NUL byte")]
    BadLayerPath(PathBuf),
    #[error("the writable layer's {upper} and {work} must be siblings on one mount")]
    SplitWritableLayer { upper: PathBuf, work: PathBuf },
}

fn mount_err(what: &str, target: &Path) -> impl FnOnce(nix::Error) -> MountError {
    let (what, target) = (what.to_string(), target.to_path_buf());
    move |source| MountError::Mount {
        what,
        target,
        source,
    }
}

fn prepare_err(path: &Path) -> impl FnOnce(std::io::Error) -> MountError {
    let path = path.to_path_buf();
    move |source| MountError::Prepare { path, source }
}

/// How a sandbox's root overlay is put together: its read-only layers (top-most first) and the
/// writable layer's `upper` and `work` directories, which overlayfs needs on one mount (siblings).
///
/// The overlay's options are what `/proc/self/mountinfo` shows inside the sandbox, so they never name
/// a host path: [`PreparedOverlay::mount`] first mounts a small tmpfs on the rootfs mount point, binds
/// each layer there under a short name (`0`, `1`, ...; the writable layer's directory as `d`), and
/// mounts the overlay on top of that tmpfs with options relative to it
/// (`lowerdir=0:1,upperdir=d/upper,workdir=d/work`). The tmpfs and its binds stay behind in the host's
/// tree, which the sandbox's init detaches at its `pivot_root` (overlayfs keeps private clones of its
/// layers' mounts).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OverlayPlan {
    layers: Vec<PathBuf>,
    upper: PathBuf,
    work: PathBuf,
}

/// The name the writable layer's directory is bound under on the staging tmpfs.
const WRITABLE_STAGE: &str = "d";

impl OverlayPlan {
    pub fn new(layers: &[PathBuf], upper: &Path, work: &Path) -> Result<OverlayPlan, MountError> {
        let (Some(dir), Some(_), Some(_)) = (upper.parent(), upper.file_name(), work.file_name())
        else {
            return Err(MountError::BadLayerPath(upper.to_path_buf()));
        };
        if work.parent() != Some(dir) {
            return Err(MountError::SplitWritableLayer {
                upper: upper.to_path_buf(),
                work: work.to_path_buf(),
            });
        }
        Ok(OverlayPlan {
            layers: layers.to_vec(),
            upper: upper.to_path_buf(),
            work: work.to_path_buf(),
        })
    }

    /// The overlay's mount options, relative to the staging tmpfs.
    pub fn options(&self) -> String {
        let lower: Vec<String> = (0..self.layers.len()).map(|i| i.to_string()).collect();
        let name = |path: &Path| {
            path.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        };
        format!(
            "lowerdir={},upperdir={WRITABLE_STAGE}/{},workdir={WRITABLE_STAGE}/{}",
            lower.join(":"),
            name(&self.upper),
            name(&self.work)
        )
    }

    /// The host directories bound on the staging tmpfs, with the name each gets there.
    fn stages(&self) -> Vec<(&Path, String)> {
        let mut out: Vec<(&Path, String)> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, layer)| (layer.as_path(), i.to_string()))
            .collect();
        if let Some(dir) = self.upper.parent() {
            out.push((dir, WRITABLE_STAGE.to_string()));
        }
        out
    }
}

/// An [`OverlayPlan`] turned into C strings for a mount point, so that [`PreparedOverlay::mount`] makes
/// system calls only: CRIU's restore helper runs it between fork and exec.
#[derive(Debug)]
pub struct PreparedOverlay {
    target: std::ffi::CString,
    /// (host directory, its staging directory below `target`)
    stages: Vec<(std::ffi::CString, std::ffi::CString)>,
    options: std::ffi::CString,
}

fn c_path(path: &Path) -> Result<std::ffi::CString, MountError> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| MountError::BadLayerPath(path.to_path_buf()))
}

impl PreparedOverlay {
    pub fn new(target: &Path, plan: &OverlayPlan) -> Result<PreparedOverlay, MountError> {
        let stages = plan
            .stages()
            .into_iter()
            .map(|(source, name)| Ok((c_path(source)?, c_path(&target.join(name))?)))
            .collect::<Result<_, MountError>>()?;
        Ok(PreparedOverlay {
            target: c_path(target)?,
            stages,
            options: std::ffi::CString::new(plan.options())
                .map_err(|_| MountError::BadLayerPath(target.to_path_buf()))?,
        })
    }

    /// Mounts the staging tmpfs, its binds and the overlay at the target (see [`OverlayPlan`]).
    /// `nodev`: device nodes on the layers mean nothing inside; the sandbox's devices live on its own
    /// /dev tmpfs. Not `nosuid`: sudo works inside. Async-signal-safe: no allocation, system calls
    /// only; the working directory is `/` afterwards.
    pub fn mount(&self) -> std::io::Result<()> {
        let check = |result: libc::c_int| {
            if result == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        let (tmpfs, overlay) = (c"tmpfs", c"overlay");
        // SAFETY: every pointer is a NUL-terminated string owned by `self` or a static literal, alive
        // for the duration of each call; the calls do not keep them.
        unsafe {
            check(libc::mount(
                c"warren-layers".as_ptr(),
                self.target.as_ptr(),
                tmpfs.as_ptr(),
                libc::MS_NODEV | libc::MS_NOSUID | libc::MS_NOEXEC,
                c"mode=0700,size=64k".as_ptr().cast(),
            ))?;
            for (source, stage) in &self.stages {
                check(libc::mkdir(stage.as_ptr(), 0o700))?;
                check(libc::mount(
                    source.as_ptr(),
                    stage.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
            // The options are relative: resolved from the working directory, the tmpfs's root.
            check(libc::chdir(self.target.as_ptr()))?;
            let mounted = check(libc::mount(
                overlay.as_ptr(),
                self.target.as_ptr(),
                overlay.as_ptr(),
                libc::MS_NODEV,
                self.options.as_ptr().cast(),
            ));
            check(libc::chdir(c"/".as_ptr()))?;
            mounted
        }
    }
}

/// Makes every mount private so nothing done here propagates back to the host.
pub fn make_private() -> Result<(), MountError> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(mount_err("private propagation", Path::new("/")))
}

/// Mounts the sandbox's root overlay at `target` (before [`pivot_into`]), staged so that its options
/// name no host path (see [`OverlayPlan`]).
pub fn mount_overlay(target: &Path, plan: &OverlayPlan) -> Result<(), MountError> {
    PreparedOverlay::new(target, plan)?.mount().map_err(|e| {
        mount_err("overlay", target)(nix::Error::from_raw(e.raw_os_error().unwrap_or(0)))
    })
}

/// A detached bind mount of the agent binary (`open_tree(OPEN_TREE_CLONE)`), made before
/// [`pivot_into`] while the host's tree is still there and attached by [`build_rootfs`] afterwards. A
/// plain bind from `/proc/self/fd/N` would not do: once the old root is detached, its mounts are no
/// longer in this mount namespace, and the kernel refuses to bind from them.
pub fn open_agent(agent_binary: &Path) -> Result<OwnedFd, MountError> {
    open_tree_clone(agent_binary)
}

/// A detached bind mount (`open_tree(OPEN_TREE_CLONE)`) of the host path `source`.
pub fn open_tree_clone(source: &Path) -> Result<OwnedFd, MountError> {
    let path = std::ffi::CString::new(source.as_os_str().as_encoded_bytes())
        .map_err(|_| MountError::BadLayerPath(source.to_path_buf()))?;
    // SAFETY: open_tree reads the NUL-terminated path and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(mount_err("clone mount", source)(nix::Error::last()));
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Attaches the lxcfs files (from [`super::lxcfs::open_files`]) over the sandbox's own `/proc` and
/// `/sys` entries. Runs after [`mask_proc`]; the targets are in the fresh procfs and sysfs this init
/// mounted, which nothing in the sandbox could have replaced.
pub fn attach_lxcfs(files: &[(&str, OwnedFd)]) -> Result<(), MountError> {
    for (relative, tree) in files {
        let target = Path::new("/").join(relative);
        if std::fs::symlink_metadata(&target).is_err() {
            continue;
        }
        attach(tree, &target)?;
    }
    Ok(())
}

/// Attaches each volume (`trees`: its target inside the sandbox and a detached clone of the host's
/// mount of it, made before the pivot) at its target, making the directory when it is missing.
/// Runs after the pivot and after /proc is masked: the target resolves in the sandbox's own tree, and
/// a target that resolves into /proc, /sys or /dev (a symlink in the template) is refused.
pub fn attach_volumes(trees: &[(PathBuf, OwnedFd)]) -> Result<(), MountError> {
    for (target, tree) in trees {
        let dir = ensure_dir(target)?;
        let real = std::fs::canonicalize(&dir).map_err(prepare_err(&dir))?;
        if ["/proc", "/sys", "/dev"]
            .iter()
            .any(|kernel| real.starts_with(kernel))
            || real == Path::new("/")
        {
            return Err(MountError::Prepare {
                path: target.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("resolves to {}, where no volume may go", real.display()),
                ),
            });
        }
        attach(tree, &real)?;
    }
    Ok(())
}

/// Attaches the detached mount `tree` at `target`.
fn attach(tree: &OwnedFd, target: &Path) -> Result<(), MountError> {
    let c_target = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())
        .map_err(|_| MountError::BadLayerPath(target.to_path_buf()))?;
    // SAFETY: move_mount reads the two NUL-terminated paths; the descriptor is ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c_target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(mount_err("detached mount", target)(nix::Error::last()));
    }
    Ok(())
}

/// Mounts everything the sandbox needs below its root, after [`pivot_into`]: proc, sys, /dev, the
/// agent binary (`agent`, from [`open_agent`]) and the agent's directory.
///
/// This runs after the pivot on purpose: the tree below the root is the sandbox's own and may hold
/// symlinks its root planted (`/proc -> /host/dir`, `/.warren/agent -> /etc/shadow`). With the host's
/// root detached, every path here resolves inside the sandbox, and no process but this init is in
/// the mount namespace to race it. Mount points that are not what they must be (a symlink or a file
/// where a directory goes) are replaced.
pub fn build_rootfs(agent: &OwnedFd) -> Result<(), MountError> {
    let nosuid_nodev_noexec = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let proc = ensure_dir(Path::new("/proc"))?;
    mount(
        Some("proc"),
        &proc,
        Some("proc"),
        nosuid_nodev_noexec,
        None::<&str>,
    )
    .map_err(mount_err("proc", &proc))?;
    let sys = ensure_dir(Path::new("/sys"))?;
    mount(
        Some("sysfs"),
        &sys,
        Some("sysfs"),
        nosuid_nodev_noexec | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(mount_err("sysfs", &sys))?;
    build_dev(&ensure_dir(Path::new("/dev"))?)?;

    // The agent's directory is a bind mount of itself: a mount point cannot be renamed, so root inside
    // cannot move /.warren (and the agent's mount with it) aside and plant another in its place.
    let warren = ensure_dir(
        Path::new(AGENT_PATH)
            .parent()
            .unwrap_or(Path::new("/.warren")),
    )?;
    mount(
        Some(&warren),
        &warren,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(mount_err("agent directory", &warren))?;
    let agent_target = Path::new(AGENT_PATH);
    match std::fs::symlink_metadata(agent_target) {
        Ok(meta) if meta.file_type().is_file() => {}
        Ok(_) => {
            remove_any(agent_target)?;
            std::fs::write(agent_target, b"").map_err(prepare_err(agent_target))?;
        }
        Err(_) => std::fs::write(agent_target, b"").map_err(prepare_err(agent_target))?,
    }
    attach(agent, agent_target)?;
    mount(
        None::<&str>,
        agent_target,
        None::<&str>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(mount_err("agent binary read-only", agent_target))?;
    Ok(())
}

/// Makes `dir` a real directory: a symlink, file or whiteout there is removed first.
fn ensure_dir(dir: &Path) -> Result<PathBuf, MountError> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => return Ok(dir.to_path_buf()),
        Ok(_) => remove_any(dir)?,
        Err(_) => {}
    }
    std::fs::create_dir_all(dir).map_err(prepare_err(dir))?;
    Ok(dir.to_path_buf())
}

fn remove_any(path: &Path) -> Result<(), MountError> {
    std::fs::remove_file(path).map_err(prepare_err(path))
}

/// /dev as a small tmpfs with its own device nodes (no host device is bind-mounted), devpts, shm, mqueue.
fn build_dev(dev: &Path) -> Result<(), MountError> {
    mount(
        Some("tmpfs"),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME,
        Some("mode=755,size=65536k"),
    )
    .map_err(mount_err("tmpfs /dev", dev))?;
    let nodes: [(&str, u64, u64); 6] = [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ];
    for (name, major, minor) in nodes {
        let path = dev.join(name);
        mknod(
            &path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        )
        .map_err(mount_err("device node", &path))?;
        // mknod honours the umask; set the mode explicitly.
        nix::sys::stat::fchmodat(
            None,
            &path,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(mount_err("device node mode", &path))?;
    }
    let pts = ensure_dir(&dev.join("pts"))?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )
    .map_err(mount_err("devpts", &pts))?;
    let shm = ensure_dir(&dev.join("shm"))?;
    mount(
        Some("shm"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=1777,size=65536k"),
    )
    .map_err(mount_err("tmpfs /dev/shm", &shm))?;
    let mqueue = ensure_dir(&dev.join("mqueue"))?;
    mount(
        Some("mqueue"),
        &mqueue,
        Some("mqueue"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(mount_err("mqueue", &mqueue))?;
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let path = dev.join(link);
        symlink(to, &path).map_err(prepare_err(&path))?;
    }
    Ok(())
}

/// pivot_root into `root` and drop the old root (runc's pivot_root(".", ".") way: no put_old dir).
pub fn pivot_into(root: &Path) -> Result<(), MountError> {
    let pivot_err = |source| MountError::Pivot {
        root: root.to_path_buf(),
        source,
    };
    nix::unistd::chdir(root).map_err(pivot_err)?;
    nix::unistd::pivot_root(".", ".").map_err(pivot_err)?;
    // The old root is now stacked on "/": make it private (no propagation) and detach it.
    mount(
        None::<&str>,
        ".",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(pivot_err)?;
    umount2(".", MntFlags::MNT_DETACH).map_err(pivot_err)?;
    nix::unistd::chdir("/").map_err(pivot_err)?;
    Ok(())
}

/// Hides the parts of /proc that expose or change the host (as Docker does): read-only binds over
/// kernel knobs, /dev/null over kernel memory and key listings. Run after pivot_root.
///
/// `/proc/pressure` is read-only too (Docker leaves it writable): a write there registers a PSI
/// trigger on the host-wide pressure figures: kernel state (a polling thread, a timer) that no limit
/// of the sandbox's cgroup accounts for.
pub fn mask_proc() -> Result<(), MountError> {
    for path in [
        "/proc/sys",
        "/proc/sysrq-trigger",
        "/proc/irq",
        "/proc/bus",
        "/proc/fs",
        "/proc/pressure",
    ] {
        let path = Path::new(path);
        if !path.exists() {
            continue;
        }
        mount(
            Some(path),
            path,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(mount_err("read-only bind", path))?;
        mount(
            None::<&str>,
            path,
            None::<&str>,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(mount_err("read-only remount", path))?;
    }
    for path in [
        "/proc/kcore",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/sched_debug",
        "/proc/latency_stats",
        "/proc/kallsyms",
        "/proc/slabinfo",
        "/proc/vmallocinfo",
    ] {
        let path = Path::new(path);
        if !path.exists() {
            continue;
        }
        mount(
            Some("/dev/null"),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(mount_err("mask", path))?;
    }
    // Directories of host hardware detail (ACPI tables, firmware, SCSI, power capping): an empty
    // read-only tmpfs over each.
    for path in [
        "/proc/acpi",
        "/proc/scsi",
        "/sys/firmware",
        "/sys/devices/virtual/powercap",
    ] {
        let path = Path::new(path);
        if !path.is_dir() {
            continue;
        }
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=0,mode=555"),
        )
        .map_err(mount_err("mask", path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_options_name_no_host_path() {
        let layers = vec![PathBuf::from("/t/top"), PathBuf::from("/t/base")];
        let plan = OverlayPlan::new(&layers, Path::new("/s/upper"), Path::new("/s/work")).unwrap();
        assert_eq!(
            plan.options(),
            "lowerdir=0:1,upperdir=d/upper,workdir=d/work"
        );
        let stages = plan.stages();
        assert_eq!(
            stages,
            vec![
                (Path::new("/t/top"), "0".to_string()),
                (Path::new("/t/base"), "1".to_string()),
                (Path::new("/s"), "d".to_string()),
            ]
        );
    }

    #[test]
    fn the_writable_layer_must_be_one_directory() {
        assert!(matches!(
            OverlayPlan::new(&[], Path::new("/a/upper"), Path::new("/b/work")),
            Err(MountError::SplitWritableLayer { .. })
        ));
        // Layer paths with overlayfs's separators are fine now: they never reach the options.
        let plan = OverlayPlan::new(
            &[PathBuf::from("/t/a:b,c")],
            Path::new("/u/x"),
            Path::new("/u/y"),
        );
        assert_eq!(
            plan.unwrap().options(),
            "lowerdir=0,upperdir=d/x,workdir=d/y"
        );
    }
}
