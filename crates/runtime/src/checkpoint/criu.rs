//! Driving the `criu` binary through its command line.
//!
//! Why the CLI and not RPC (`criu swrk`): every option Warren needs exists on the command line, the
//! one fd CRIU must inherit (the new network namespace) is passed as an ordinary inherited descriptor,
//! each run leaves a complete log next to its images, and a failed run is one exit status plus the
//! `Error` lines of that log. RPC would add protobuf bindings for CRIU's `rpc.proto` and buy only
//! notifications (action scripts), which Warren does not need: the network is wired before CRIU runs.
//! docs/checkpoints.md records why each option is there.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use super::CheckpointError;

/// Where the agent binary is bind-mounted inside every sandbox; declared to CRIU as external.
pub const AGENT_MOUNT: &str = "/.warren/agent";
/// Key under which the agent mount is recorded in the images.
const AGENT_MOUNT_KEY: &str = "agent";
/// Key under which the (external) network namespace is recorded in the images.
const NETNS_KEY: &str = "netns";
/// The fd number the new network namespace has in the `criu restore` process.
const NETNS_FD: i32 = 3;
/// Deleted-but-open files up to this size are copied into the images.
const GHOST_LIMIT: &str = "64M";
/// Default place of the binary (scripts/setup.d/30-criu.sh); `$WARREN_CRIU` overrides it.
pub const DEFAULT_CRIU: &str = "/usr/local/sbin/criu";

/// A CRIU binary that answered `criu check` on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Criu {
    binary: PathBuf,
    version: String,
}

/// What one `criu dump` needs.
#[derive(Debug, Clone)]
pub struct DumpArgs<'a> {
    pub init_pid: u32,
    /// Freezer cgroup directory of the sandbox (v1 `freezer/...` or the v2 cgroup itself).
    pub freezer_cgroup: &'a Path,
    /// Where volumes are mounted inside the sandbox, in spec order (external mounts `volume-<n>`).
    pub volume_targets: &'a [PathBuf],
    pub images: &'a Path,
    pub log: &'a Path,
}

/// What one `criu restore` needs.
#[derive(Debug)]
pub struct RestoreArgs<'a> {
    pub images: &'a Path,
    pub log: &'a Path,
    pub pidfile: &'a Path,
    /// Empty directory the overlay is mounted on, in CRIU's private mount namespace.
    pub rootfs: &'a Path,
    pub overlay: &'a crate::rootfs::sandbox_mounts::OverlayPlan,
    pub agent_binary: &'a Path,
    /// The new, wired network namespace (an open fd of its pin file).
    pub netns: &'a OwnedFd,
    /// `cgroup.procs` files CRIU joins before it forks the restored tree.
    pub cgroup_procs: &'a [PathBuf],
    /// The host's lxcfs mount, to map the images' lxcfs bind mounts back to.
    pub lxcfs: Option<&'a Path>,
    /// The volumes' host mounts, to map the images' `volume-<n>` external mounts back to.
    pub volumes: &'a [crate::rootfs::volume_disk::VolumeBind],
    /// Leave the lazy memory to the `criu lazy-pages` daemon waiting in this directory.
    pub lazy_dir: Option<&'a Path>,
}

/// Where the CRIU that scripts/setup builds keeps its kernel-feature cache (its RUNDIR): on a tmpfs,
/// so it goes with a reboot, as CRIU requires. A CRIU built otherwise just does not find it.
pub const KDAT_DIR: &str = "/dev/shm/warren-criu";

/// Makes `dir` a root-owned directory no one else may write, replacing whatever else is there:
/// /dev/shm is world-writable, and CRIU (as root) trusts the cache it finds in that directory.
/// Best effort: without the directory CRIU only probes the kernel on every run.
fn ensure_kdat_dir(dir: &Path) {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let root_only =
        |meta: &std::fs::Metadata| meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o077 == 0;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if root_only(&meta) => return,
        Ok(meta) if meta.is_dir() => {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(dir);
        }
        Err(_) => {}
    }
    let _ = std::fs::DirBuilder::new().mode(0o700).create(dir);
    // Someone else may have created it in between (the sticky /dev/shm then keeps it theirs).
    if let Ok(meta) = std::fs::symlink_metadata(dir) {
        if !root_only(&meta) {
            tracing::warn!(
                "{} is not a root-only directory; CRIU's kernel-feature cache there is not to be trusted",
                dir.display()
            );
        }
    }
}

impl Criu {
    /// Finds the binary (`$WARREN_CRIU`, then [`DEFAULT_CRIU`], then `criu` on `$PATH`) and checks that
    /// it runs on this kernel.
    pub fn probe() -> Result<Self, CheckpointError> {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(env) = std::env::var_os("WARREN_CRIU") {
            candidates.push(PathBuf::from(env));
        }
        candidates.push(PathBuf::from(DEFAULT_CRIU));
        if let Some(path) = std::env::var_os("PATH") {
            candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("criu")));
        }
        let binary = candidates
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(|| {
                CheckpointError::CriuUnavailable("no criu binary (run scripts/setup)".into())
            })?;
        Self::probe_binary(&binary)
    }

    /// Checks one binary: `criu --version` must say 4.x or newer and `criu check` must pass.
    pub fn probe_binary(binary: &Path) -> Result<Self, CheckpointError> {
        let unavailable =
            |why: String| CheckpointError::CriuUnavailable(format!("{}: {why}", binary.display()));
        let output = Command::new(binary)
            .arg("--version")
            .output()
            .map_err(|e| unavailable(e.to_string()))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let version = parse_version(&text)
            .ok_or_else(|| unavailable(format!("unexpected --version output {text:?}")))?;
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if major < 4 {
            return Err(unavailable(format!(
                "version {version} is too old for this kernel (need 4.x)"
            )));
        }
        ensure_kdat_dir(Path::new(KDAT_DIR));
        let check = Command::new(binary)
            .arg("check")
            .output()
            .map_err(|e| unavailable(e.to_string()))?;
        if !check.status.success() {
            let said = String::from_utf8_lossy(&check.stderr)
                .lines()
                .filter(|l| l.contains("Error"))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(unavailable(format!("`criu check` failed: {said}")));
        }
        Ok(Self {
            binary: binary.to_path_buf(),
            version,
        })
    }

    /// A binary the runtime probed earlier (the supervisor restoring a sandbox does not re-run the
    /// 150 ms `criu check`).
    pub fn probed(binary: PathBuf, version: String) -> Self {
        Self { binary, version }
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    /// Dumps the tree of `init_pid`, which must already be frozen; leaves it frozen.
    pub fn dump(&self, args: &DumpArgs<'_>) -> Result<(), CheckpointError> {
        let netns_inode = std::fs::metadata(format!("/proc/{}/ns/net", args.init_pid))
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .map_err(|source| CheckpointError::Io {
                context: format!("netns of pid {}", args.init_pid),
                source,
            })?;
        let mut command = Command::new(&self.binary);
        command
            .args(dump_arguments(
                args,
                netns_inode,
                &crate::rootfs::lxcfs::mounted_in(args.init_pid),
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // A dump that starts after its caller died would run unseen by the next owner's recovery
        // (between fork and exec the child still looks like the caller): the child checks, as the
        // last thing before exec, that its parent is the caller.
        // SAFETY: getpid has no preconditions.
        let caller = unsafe { libc::getpid() };
        // SAFETY: the closure only calls getppid(2), which is async-signal-safe, and allocates
        // nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::getppid() != caller {
                    return Err(std::io::Error::other("the caller of criu dump died"));
                }
                Ok(())
            });
        }
        // CRIU forks helpers of its own while it dumps (namespace dumpers, sysctl workers); one
        // whose parent was killed mid-dump was seen asleep for good. The dump leads a process group
        // that is ended with it.
        command.process_group(0);
        let mut child = command.spawn().map_err(|source| CheckpointError::Io {
            context: "start criu dump".into(),
            source,
        })?;
        let status = wait_ending_group(&mut child).map_err(|source| CheckpointError::Io {
            context: "wait for criu dump".into(),
            source,
        })?;
        outcome(status, "dump", args.log)
    }

    /// Restores the images into fresh pid/mount/uts/ipc/cgroup namespaces, in the given network namespace and
    /// cgroups; returns the host PID of the restored init, which is reparented to the nearest child
    /// subreaper of the caller once CRIU exits.
    pub fn restore(&self, args: &RestoreArgs<'_>) -> Result<u32, CheckpointError> {
        let mut command = Command::new(&self.binary);
        command
            .args(restore_arguments(args))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let netns_fd = args.netns.as_raw_fd();
        let procs: Vec<std::ffi::CString> = args
            .cgroup_procs
            .iter()
            .map(|p| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|_| CheckpointError::Invalid("cgroup path with a NUL byte".into()))?;
        let overlay =
            crate::rootfs::sandbox_mounts::PreparedOverlay::new(args.rootfs, args.overlay)
                .map_err(|e| CheckpointError::Invalid(format!("overlay: {e}")))?;
        // SAFETY: between fork and exec the closure only calls async-signal-safe functions (dup2, fcntl,
        // open, write, close, unshare, mount, mkdir, chdir, getpid) on data prepared before the fork; it allocates nothing
        // (the pid is formatted into a stack buffer).
        unsafe {
            command.pre_exec(move || {
                // dup2 onto itself keeps FD_CLOEXEC: clear it explicitly either way.
                if libc::dup2(netns_fd, NETNS_FD) < 0
                    || libc::fcntl(NETNS_FD, libc::F_SETFD, 0) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                let mut digits = [0u8; 12];
                let pid_text = format_pid(libc::getpid(), &mut digits);
                for file in &procs {
                    let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(fd, pid_text.as_ptr().cast(), pid_text.len());
                    libc::close(fd);
                    if written < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // After the cgroup joins: the restored tree inherits a cgroup namespace rooted at
                // the new sandbox's cgroups (CRIU with --manage-cgroups=ignore makes none itself).
                if libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let root = c"/";
                if libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                overlay.mount()
            });
        }
        run(command, "restore", args.log)?;
        let text = std::fs::read_to_string(args.pidfile).map_err(|source| CheckpointError::Io {
            context: format!("read {}", args.pidfile.display()),
            source,
        })?;
        text.trim().parse().map_err(|_| CheckpointError::Criu {
            action: "restore",
            message: format!("pidfile holds {text:?}"),
        })
    }
}

fn parse_version(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.trim().strip_prefix("Version: "))
        .map(|v| v.trim().to_string())
}

fn format_pid(pid: libc::pid_t, buf: &mut [u8; 12]) -> &[u8] {
    let mut n = pid.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        // n % 10 < 10: the cast cannot truncate.
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || at == 0 {
            break;
        }
    }
    &buf[at..]
}

/// `lxcfs`: the lxcfs bind mounts the sandbox has (see [`crate::rootfs::lxcfs`]), external like the
/// agent's.
fn dump_arguments(args: &DumpArgs<'_>, netns_inode: u64, lxcfs: &[&str]) -> Vec<OsString> {
    let mut out: Vec<OsString> = ["dump", "--tree"].map(OsString::from).to_vec();
    out.push(args.init_pid.to_string().into());
    out.push("--images-dir".into());
    out.push(args.images.into());
    out.push("--log-file".into());
    out.push(args.log.into());
    out.push("-v4".into());
    out.push("--freeze-cgroup".into());
    out.push(args.freezer_cgroup.into());
    for option in [
        "--leave-running",
        "--tcp-established",
        "--skip-in-flight",
        // Seizing waits this long (seconds) for a task to stop; a task frozen inside vfork never
        // does, and the dump is retried after a short thaw instead of stalling for CRIU's default 10.
        "--timeout",
        "2",
        // Warren locks the network itself, by holding the host side of the veth down (see
        // network::set_host_link); the restore takes the method recorded here.
        "--network-lock",
        "skip",
        "--manage-cgroups=ignore",
        "--ghost-limit",
        GHOST_LIMIT,
        "--external",
    ] {
        out.push(option.into());
    }
    out.push(format!("mnt[{AGENT_MOUNT}]:{AGENT_MOUNT_KEY}").into());
    out.push("--external".into());
    out.push(format!("net[{netns_inode}]:{NETNS_KEY}").into());
    for relative in lxcfs {
        out.push("--external".into());
        out.push(
            format!(
                "mnt[/{relative}]:{}",
                crate::rootfs::lxcfs::external_key(relative)
            )
            .into(),
        );
    }
    for (index, target) in args.volume_targets.iter().enumerate() {
        let mut mapping = OsString::from("mnt[");
        mapping.push(target);
        mapping.push(format!(
            "]:{}",
            crate::rootfs::volume_disk::VolumeBind::external_key(index)
        ));
        out.push("--external".into());
        out.push(mapping);
    }
    out
}

fn restore_arguments(args: &RestoreArgs<'_>) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec!["restore".into(), "--images-dir".into(), args.images.into()];
    out.push("--log-file".into());
    out.push(args.log.into());
    out.push("-v4".into());
    out.push("--root".into());
    out.push(args.rootfs.into());
    out.push("--pidfile".into());
    out.push(args.pidfile.into());
    for option in [
        "--restore-detached",
        "--tcp-established",
        "--manage-cgroups=ignore",
        "--external",
    ] {
        out.push(option.into());
    }
    let mut agent = OsString::from(format!("mnt[{AGENT_MOUNT_KEY}]:"));
    agent.push(args.agent_binary);
    out.push(agent);
    if let Some(mount) = args.lxcfs {
        for relative in crate::rootfs::lxcfs::VIRTUALISED {
            let mut mapping = OsString::from(format!(
                "mnt[{}]:",
                crate::rootfs::lxcfs::external_key(relative)
            ));
            mapping.push(mount.join(relative));
            out.push("--external".into());
            out.push(mapping);
        }
    }
    for (index, bind) in args.volumes.iter().enumerate() {
        let mut mapping = OsString::from(format!(
            "mnt[{}]:",
            crate::rootfs::volume_disk::VolumeBind::external_key(index)
        ));
        mapping.push(&bind.source);
        out.push("--external".into());
        out.push(mapping);
    }
    out.push("--inherit-fd".into());
    out.push(format!("fd[{NETNS_FD}]:{NETNS_KEY}").into());
    if let Some(dir) = args.lazy_dir {
        out.push("--lazy-pages".into());
        out.push("--work-dir".into());
        out.push(dir.into());
    }
    out
}

/// Runs CRIU; a failure carries the Error lines of its log (the log itself usually goes away with the
/// failed attempt's temporary directory or sandbox).
fn run(mut command: Command, action: &'static str, log: &Path) -> Result<(), CheckpointError> {
    let status = command.status().map_err(|source| CheckpointError::Io {
        context: format!("start criu {action}"),
        source,
    })?;
    outcome(status, action, log)
}

/// Waits for `child`, which leads a process group of its own, to exit, then kills whatever else is
/// still in that group before reaping it (the unreaped leader keeps the group's id from being
/// reused), and returns its exit status.
fn wait_ending_group(child: &mut Child) -> std::io::Result<ExitStatus> {
    let pid = child.id();
    loop {
        // SAFETY: siginfo_t is plain data and waitid only writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with WNOWAIT leaves it to be reaped by `child.wait`.
        let waited =
            unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if waited == 0 {
            break;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    // The group id is the leader's pid, which fits a pid_t.
    let group = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: killpg has no memory-safety preconditions; the group is the exited leader's own.
    unsafe { libc::killpg(group, libc::SIGKILL) };
    child.wait()
}

fn outcome(status: ExitStatus, action: &'static str, log: &Path) -> Result<(), CheckpointError> {
    if status.success() {
        return Ok(());
    }
    Err(CheckpointError::Criu {
        action,
        message: format!("{status}: {}", log_errors(log)),
    })
}

/// The `Error` lines of a CRIU log, minus the ones every run prints on this host.
pub fn log_errors(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error"))
        .filter(|l| !l.contains("RLIMIT_NOFILE"))
        .map(|l| l.split_once(") ").map_or(l, |(_, rest)| rest).trim())
        .collect();
    let tail = lines.len().saturating_sub(6);
    if lines.is_empty() {
        "no error in the log".to_string()
    } else {
        lines[tail..].join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_the_dump_leaves_behind_ends_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("helper.pid");
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!(
                "sleep 300 </dev/null >/dev/null 2>&1 & echo $! > {}; exit 3",
                pid_file.display()
            ))
            .process_group(0);
        let mut child = command.spawn().unwrap();
        let status = wait_ending_group(&mut child).unwrap();
        assert_eq!(status.code(), Some(3));
        let helper = std::fs::read_to_string(&pid_file).unwrap();
        let helper = helper.trim();
        // SIGKILL lands when the helper is next scheduled: on a busy machine it may still show as
        // running for a moment. Killed: gone, or a zombie its new parent has not reaped yet.
        let state = || {
            std::fs::read_to_string(format!("/proc/{helper}/stat"))
                .ok()
                .and_then(|stat| {
                    stat.rsplit_once(") ")
                        .and_then(|(_, rest)| rest.chars().next())
                })
        };
        let ended = |s: Option<char>| matches!(s, None | Some('Z') | Some('X'));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !ended(state()) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            ended(state()),
            "helper {helper} still runs in state {:?}",
            state()
        );
    }

    #[test]
    fn kdat_dir_ends_up_root_only() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP: ensure_kdat_dir only acts as root");
            return;
        }
        let scratch = std::env::temp_dir().join(format!("warren-kdat-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir(&scratch).unwrap();
        let root_only = |dir: &Path| {
            let meta = std::fs::symlink_metadata(dir).unwrap();
            meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o777 == 0o700
        };
        // Missing: created.
        let dir = scratch.join("kdat");
        ensure_kdat_dir(&dir);
        assert!(root_only(&dir));
        // A directory others may write: replaced, with what it held.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(dir.join("criu.kdat"), b"planted").unwrap();
        ensure_kdat_dir(&dir);
        assert!(root_only(&dir));
        assert!(!dir.join("criu.kdat").exists());
        // A symlink or a file in its place: replaced by a directory.
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&scratch, &dir).unwrap();
        ensure_kdat_dir(&dir);
        assert!(root_only(&dir));
        // A good one is left alone, contents and all.
        std::fs::write(dir.join("criu.kdat"), b"cache").unwrap();
        ensure_kdat_dir(&dir);
        assert_eq!(std::fs::read(dir.join("criu.kdat")).unwrap(), b"cache");
        std::fs::remove_dir_all(&scratch).unwrap();
    }

    #[test]
    fn version_is_parsed() {
        assert_eq!(parse_version("Version: 4.1.1\n").as_deref(), Some("4.1.1"));
        assert_eq!(
            parse_version("Version: 4.2\nGitID: v4.2\n").as_deref(),
            Some("4.2")
        );
        assert_eq!(parse_version("criu 3"), None);
    }

    #[test]
    fn pids_format_without_allocation() {
        let mut buf = [0u8; 12];
        assert_eq!(format_pid(0, &mut buf), b"0");
        assert_eq!(format_pid(4194304, &mut buf), b"4194304");
    }

    #[test]
    fn dump_declares_agent_mount_and_netns_external() {
        let args = DumpArgs {
            init_pid: 42,
            freezer_cgroup: Path::new("/sys/fs/cgroup/freezer/warren/x"),
            volume_targets: &[PathBuf::from("/mnt/data")],
            images: Path::new("/i"),
            log: Path::new("/l"),
        };
        let words: Vec<String> = dump_arguments(&args, 4026532178, &["proc/meminfo"])
            .into_iter()
            .map(|w| w.into_string().unwrap())
            .collect();
        let joined = words.join(" ");
        assert!(joined.contains("--tree 42"));
        assert!(joined.contains("--external mnt[/.warren/agent]:agent"));
        assert!(joined.contains("--external net[4026532178]:netns"));
        assert!(joined.contains("--network-lock skip"));
        assert!(joined.contains("--leave-running"));
        assert!(joined.contains("--external mnt[/proc/meminfo]:lxcfs-proc-meminfo"));
        assert!(joined.contains("--external mnt[/mnt/data]:volume-0"));
        assert!(
            !joined.contains("cpuinfo"),
            "only the mounts the sandbox has"
        );
    }

    #[test]
    fn log_errors_skip_host_noise() {
        let dir = std::env::temp_dir().join(format!("wt-criu-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("dump.log");
        std::fs::write(
            &log,
            "(00.04) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self\n(00.05) Error (criu/sk-inet.c:191): inet: Connected TCP socket\n",
        )
        .unwrap();
        let said = log_errors(&log);
        assert!(
            said.starts_with("Error (criu/sk-inet.c:191): inet: Connected TCP socket"),
            "{said}"
        );
        assert!(!said.contains("RLIMIT"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
