//! The sandbox's init, between fork and exec of the agent: cgroup, session, namespaces, hostname,
//! rootfs, pivot_root, stdio, no_new_privs, seccomp, capabilities, exec. Runs in a single-threaded
//! child of the supervisor.

use super::SupervisorConfig;
use crate::rootfs::sandbox_mounts::{self, AGENT_LOG, AGENT_PATH};
use crate::{capabilities, namespaces, seccomp};
use std::ffi::CString;
use std::io::Read;
use std::os::fd::OwnedFd;

/// Builds the sandbox and execs the agent. Returns only on failure, with the reason.
/// `go` is the read end of the supervisor's pipe: one byte once the network is wired, end of file
/// if the set-up failed.
pub(super) fn run_init(config: &SupervisorConfig, go: OwnedFd) -> String {
    match prepare(config, go) {
        Ok(never) => match never {},
        Err(message) => message,
    }
}

enum Never {}

fn prepare(config: &SupervisorConfig, go: OwnedFd) -> Result<Never, String> {
    for procs in &config.cgroup_procs {
        std::fs::write(procs, "0").map_err(|e| format!("join cgroup {}: {e}", procs.display()))?;
    }
    super::run::phase("init joined its cgroup");
    let mut signal = [0u8; 1];
    match std::fs::File::from(go).read(&mut signal) {
        Ok(1) => {}
        Ok(_) => return Err("the supervisor gave up before the network was wired".into()),
        Err(e) => return Err(format!("wait for the network: {e}")),
    }
    let netns = namespaces::open(&config.netns_pin).map_err(|e| super::run::error_chain(&e))?;
    namespaces::join(
        &netns,
        &config.netns_pin,
        nix::sched::CloneFlags::CLONE_NEWNET,
    )
    .map_err(|e| super::run::error_chain(&e))?;
    drop(netns);
    // PID 1 leads its own session (CRIU needs the tree's root to be a session leader).
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    namespaces::unshare_init_namespaces().map_err(|e| super::run::error_chain(&e))?;
    nix::unistd::sethostname(&config.id).map_err(|e| format!("sethostname: {e}"))?;
    let chain = |e: sandbox_mounts::MountError| super::run::error_chain(&e);
    sandbox_mounts::make_private().map_err(chain)?;
    sandbox_mounts::mount_overlay(&config.rootfs, &config.overlay).map_err(chain)?;
    let agent = sandbox_mounts::open_agent(&config.agent_binary).map_err(chain)?;
    let lxcfs_files = config
        .lxcfs
        .as_deref()
        .map(crate::rootfs::lxcfs::open_files)
        .unwrap_or_default();
    let volume_trees = config
        .volumes
        .iter()
        .map(|bind| {
            sandbox_mounts::open_tree_clone(&bind.source).map(|tree| (bind.target.clone(), tree))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(chain)?;
    // From here on the host's tree is out of reach: the sandbox's own (hostile) tree is only walked
    // after the pivot.
    sandbox_mounts::pivot_into(&config.rootfs).map_err(chain)?;
    sandbox_mounts::build_rootfs(&agent).map_err(chain)?;
    drop(agent);
    sandbox_mounts::mask_proc().map_err(chain)?;
    sandbox_mounts::attach_lxcfs(&lxcfs_files).map_err(chain)?;
    drop(lxcfs_files);
    sandbox_mounts::attach_volumes(&volume_trees).map_err(chain)?;
    drop(volume_trees);
    super::run::phase("init rootfs ready");
    redirect_stdio()?;

    let filters =
        seccomp::sandbox_filters(config.syscalls).map_err(|e| super::run::error_chain(&e))?;
    if config.no_new_privs {
        capabilities::set_no_new_privs().map_err(|e| super::run::error_chain(&e))?;
    }
    for filter in &filters {
        seccomp::install(filter).map_err(|e| super::run::error_chain(&e))?;
    }
    capabilities::drop_to_sandbox_set(config.net_raw).map_err(|e| super::run::error_chain(&e))?;

    let program = CString::new(AGENT_PATH).map_err(|e| e.to_string())?;
    let env: Vec<CString> = [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        "HOME=/root".to_string(),
        format!("HOSTNAME={}", config.id),
        format!("WARREN_SANDBOX_ID={}", config.id),
    ]
    .into_iter()
    .filter_map(|var| CString::new(var).ok())
    .collect();
    // Everything but stdio closes on exec (the error pipe included: EOF tells the supervisor we made it).
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only flags fds.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    let error = nix::unistd::execve(&program, &[&program], &env).err();
    Err(format!(
        "exec {AGENT_PATH}: {}",
        error.map_or_else(|| "returned".to_string(), |e| e.to_string())
    ))
}

/// stdin from the sandbox's own /dev/null, stdout and stderr into its agent log: no fd of the init points
/// outside its rootfs.
fn redirect_stdio() -> Result<(), String> {
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::Mode;
    let null = open(
        "/dev/null",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("open /dev/null: {e}"))?;
    let log = open(
        AGENT_LOG,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o640),
    )
    .map_err(|e| format!("open {AGENT_LOG}: {e}"))?;
    for (from, to) in [(null, 0), (log, 1), (log, 2)] {
        nix::unistd::dup2(from, to).map_err(|e| format!("dup2: {e}"))?;
    }
    let _ = nix::unistd::close(null);
    let _ = nix::unistd::close(log);
    Ok(())
}
