//! The supervisor process itself (`warren-supervisor run`).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::sched::CloneFlags;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};

use super::{init, RestorePlan, SupervisorConfig};
use crate::checkpoint::{
    self, Checkpointer, Criu, LazyTransfer, Manifest, RestoreTarget, TransferEnd,
};
use crate::namespaces;
use crate::network::netlink::{self, Netlink};

/// Entry point of `warren-supervisor run <config> --status-fd <fd>`. Returns the process exit code.
pub fn run_supervisor(config_path: &Path, status_fd: i32) -> i32 {
    let _ = STARTED.set(std::time::Instant::now());
    // SAFETY: the runtime handed us this fd (the write end of its status pipe); we own it from here on.
    let status = unsafe { OwnedFd::from_raw_fd(status_fd) };
    // Keep it from leaking into the sandbox's init.
    // SAFETY: fcntl on an fd we own.
    unsafe { libc::fcntl(status.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    // Detach: the runtime reaps this first process at once; the second one is reparented to init.
    // SAFETY: the supervisor is single-threaded here, so the child may do anything after fork.
    match unsafe { fork() } {
        Ok(ForkResult::Parent { .. }) => return 0,
        Ok(ForkResult::Child) => {}
        Err(e) => {
            report(&status, &format!("err fork supervisor: {e}"));
            return 1;
        }
    }
    let _ = nix::unistd::setsid();
    let config = match SupervisorConfig::read(config_path) {
        Ok(config) => config,
        Err(e) => {
            report(&status, &format!("err {}", error_chain(&e)));
            return 1;
        }
    };
    match start_sandbox(&config) {
        Ok((init_pid, transfer)) => {
            report(&status, &format!("ok {init_pid} {}", std::process::id()));
            drop(status);
            if let Some(transfer) = transfer {
                if let Some(code) = see_transfer_through(transfer, init_pid, &config.sandbox_dir) {
                    return code;
                }
            }
            // The set-up touched far more memory (config parsing, netlink, CRIU plumbing) than
            // waiting needs; replacing this image with a fresh one keeps only what waiting uses, so
            // an idle sandbox costs less. Same PID, so the init stays our child.
            exec_waiter(init_pid, &config.sandbox_dir);
            wait_and_record(init_pid, &config.sandbox_dir)
        }
        Err(message) => {
            report(&status, &format!("err {message}"));
            1
        }
    }
}

static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Logs how far into the set-up a phase ended (to supervisor.log), to see where create time goes.
pub(super) fn phase(name: &str) {
    let elapsed = STARTED
        .get()
        .map_or(0.0, |t| t.elapsed().as_secs_f64() * 1000.0);
    eprintln!("[{:>8.2} ms] {name}", elapsed);
}

fn report(status: &OwnedFd, line: &str) {
    let bytes = format!("{}\n", line.replace('\n', " "));
    // SAFETY: write(2) from a valid buffer to an fd we own. A short write of one small line to a pipe
    // does not happen (PIPE_BUF); a failure means the runtime is gone and nobody listens.
    let _ = unsafe { libc::write(status.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
    eprintln!("{line}");
}

pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
    crate::supervisor_error_chain(error)
}

/// Wires the network and starts the init; returns the init's host PID.
///
/// The init is forked first so that its first write to `cgroup.procs`, which waits out a kernel RCU
/// grace period (about 11 ms here, whatever the hierarchy), overlaps the network set-up instead of
/// following it. The init then waits on `go` until the network is wired and joins it.
fn start_sandbox(config: &SupervisorConfig) -> Result<(u32, Option<LazyTransfer>), String> {
    phase("config read");
    if let Some(plan) = &config.restore {
        setup_network(config).map_err(|e| format!("network: {e}"))?;
        phase("network wired");
        return restore_sandbox(config, plan);
    }
    namespaces::unshare_pid().map_err(|e| error_chain(&e))?;
    let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
    let (error_read, error_write) =
        nix::unistd::pipe2(cloexec).map_err(|e| format!("error pipe: {e}"))?;
    let (go_read, go_write) = nix::unistd::pipe2(cloexec).map_err(|e| format!("go pipe: {e}"))?;
    // SAFETY: single-threaded process (no netlink runtime has been started yet).
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(error_read);
            drop(go_write);
            let failure = init::run_init(config, go_read);
            let mut pipe = std::fs::File::from(error_write);
            let _ = pipe.write_all(failure.as_bytes());
            // SAFETY: _exit skips destructors and atexit handlers of the copied parent state.
            unsafe { libc::_exit(1) }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(error_write);
            drop(go_read);
            if let Err(e) = setup_network(config) {
                // Closing `go` unsent tells the init to give up.
                drop(go_write);
                let _ = waitpid(child, None);
                return Err(format!("network: {e}"));
            }
            phase("network wired");
            let _ = std::fs::File::from(go_write).write_all(b"g");
            let mut message = String::new();
            let _ = std::fs::File::from(error_read).read_to_string(&mut message);
            phase("init exec'd the agent");
            if message.is_empty() {
                // The pipe closed on exec: the agent is running.
                Ok((child.as_raw() as u32, None))
            } else {
                let _ = waitpid(child, None);
                Err(format!("sandbox init: {message}"))
            }
        }
        Err(e) => Err(format!("fork init: {e}")),
    }
}

/// Restores the checkpoint of `plan` as this sandbox's process tree; returns the restored init's host
/// PID and, for a lazy restore, the memory still to come. CRIU forks the tree and exits; as a child
/// subreaper the supervisor inherits the init and waits for it exactly as for one it forked.
fn restore_sandbox(
    config: &SupervisorConfig,
    plan: &RestorePlan,
) -> Result<(u32, Option<LazyTransfer>), String> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) only changes how this process's orphans are reparented.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "become subreaper: {}",
            std::io::Error::last_os_error()
        ));
    }
    let manifest = Manifest::read(&plan.checkpoint).map_err(|e| error_chain(&e))?;
    std::fs::create_dir_all(&plan.work_dir)
        .map_err(|e| format!("restore work dir {}: {e}", plan.work_dir.display()))?;
    let checkpointer = Checkpointer::with_criu(Criu::probed(
        plan.criu_binary.clone(),
        plan.criu_version.clone(),
    ));
    let target = RestoreTarget {
        ip: config.network.ip,
        rootfs: &config.rootfs,
        overlay: &config.overlay,
        agent_binary: &config.agent_binary,
        netns_pin: &config.netns_pin,
        cgroup_procs: &config.cgroup_procs,
        work_dir: &plan.work_dir,
        image_cache: plan.image_cache.as_deref(),
        lxcfs: config.lxcfs.as_deref(),
        volumes: &config.volumes,
        page_server: plan.lazy.then_some(Path::new("/proc/self/exe")),
    };
    let mut restored = checkpointer
        .restore_processes(&plan.checkpoint, &manifest, &target)
        .map_err(|e| error_chain(&e))?;
    if let Some(transfer) = &restored.transfer {
        // Before the report: whoever learns of the sandbox can see that pages are still coming.
        let _ = std::fs::write(
            config.sandbox_dir.join(super::PAGES_PENDING_FILE),
            format!("{} {}\n", transfer.daemon_pid(), transfer.server_pid()),
        );
    }
    if manifest.sandbox_id != config.id {
        if let Err(e) = checkpoint::set_hostname(restored.init_pid, &config.id) {
            end_tree(
                restored.init_pid,
                restored.transfer.take(),
                &config.sandbox_dir,
            );
            return Err(error_chain(&e));
        }
    }
    eprintln!(
        "restored {} in {:?} (unpack {:?}, criu {:?}, lazy: {})",
        plan.checkpoint.display(),
        restored.total,
        restored.unpack,
        restored.criu,
        restored.transfer.is_some()
    );
    Ok((restored.init_pid, restored.transfer))
}

/// Kills a restored tree that must not run on (its memory transfer failed, or its set-up did), then
/// ends the transfer: in that order, so no thread ever sees a page the transfer did not deliver.
fn end_tree(init_pid: u32, transfer: Option<LazyTransfer>, sandbox_dir: &Path) {
    // SAFETY: kill(2) on the restored init, our child; SIGKILL of a pid namespace's init ends every
    // task in it, threads waiting on a missing page included.
    unsafe { libc::kill(init_pid as libc::pid_t, libc::SIGKILL) };
    let _ = waitpid(nix::unistd::Pid::from_raw(init_pid as i32), None);
    if let Some(transfer) = transfer {
        transfer.finish();
    }
    let _ = std::fs::remove_file(sandbox_dir.join(super::PAGES_PENDING_FILE));
}

/// Waits until a lazy restore's memory has all arrived (returns `None`: go on as the plain waiter)
/// or the sandbox ended: its init exited, or the transfer failed, when the tree is killed and the
/// reason written to [`super::RESTORE_FAILED_FILE`] (returns the exit code of this process).
fn see_transfer_through(
    mut transfer: LazyTransfer,
    init_pid: u32,
    sandbox_dir: &Path,
) -> Option<i32> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, init_pid as libc::pid_t, 0) };
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns (when not -1).
    let pidfd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) });
    let end = transfer.watch(pidfd.as_ref().map_or(-1, |fd| fd.as_raw_fd()));
    phase(&format!("memory transfer ended: {end:?}"));
    match end {
        TransferEnd::Complete => {
            transfer.finish();
            let _ = std::fs::remove_file(sandbox_dir.join(super::PAGES_PENDING_FILE));
            None
        }
        TransferEnd::Failed(why) => {
            let _ = std::fs::write(
                sandbox_dir.join(super::RESTORE_FAILED_FILE),
                format!("{why}\n"),
            );
            end_tree(init_pid, Some(transfer), sandbox_dir);
            let _ = std::fs::write(
                sandbox_dir.join("init.exit"),
                format!("{}\n", 128 + libc::SIGKILL),
            );
            Some(0)
        }
        TransferEnd::InitGone => {
            transfer.finish();
            let _ = std::fs::remove_file(sandbox_dir.join(super::PAGES_PENDING_FILE));
            Some(wait_and_record(init_pid, sandbox_dir))
        }
    }
}

fn setup_network(config: &SupervisorConfig) -> Result<(), String> {
    let plan = &config.network;
    std::fs::write(&config.netns_pin, b"")
        .map_err(|e| format!("netns pin {}: {e}", config.netns_pin.display()))?;
    let netns = namespaces::create_pinned_netns(&config.netns_pin).map_err(|e| error_chain(&e))?;
    phase("netns pinned");
    let host = plan.host_veth();
    netlink::run(async {
        let host_side = Netlink::connect()?;
        let bridge = host_side
            .ensure_bridge(&plan.bridge, plan.gateway_mac(), plan.gateway, plan.prefix)
            .await?;
        host_side
            .create_veth_into(
                &host,
                netns.as_raw_fd(),
                bridge,
                plan.sandbox_mac(),
                config.restore.is_some(),
            )
            .await
    })
    .map_err(|e| error_chain(&e))?;
    phase("veth pair made");
    namespaces::join(&netns, &config.netns_pin, CloneFlags::CLONE_NEWNET)
        .map_err(|e| error_chain(&e))?;
    set_sandbox_sysctls()?;
    netlink::run(async {
        Netlink::connect()?
            .configure_sandbox_side(plan.ip, plan.prefix, plan.gateway)
            .await
    })
    .map_err(|e| error_chain(&e))?;
    Ok(())
}

/// Per-namespace settings of the sandbox's network, written from inside its namespace before `eth0`
/// comes up:
/// - `ping_group_range` over every group, so ICMP echo works through unprivileged ICMP datagram
///   sockets and `ping` needs no CAP_NET_RAW;
/// - no IPv6 on `eth0`: the bridge passes only IPv4 and ARP from a sandbox port (see
///   docs/network.md), so a link-local address there would only send router solicitations into a
///   drop rule. Loopback keeps `::1`. A kernel without IPv6 has no such file, which is as good.
fn set_sandbox_sysctls() -> Result<(), String> {
    std::fs::write("/proc/sys/net/ipv4/ping_group_range", "0 2147483647")
        .map_err(|e| format!("write net.ipv4.ping_group_range: {e}"))?;
    match std::fs::write("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", "1") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("disable IPv6 on eth0: {e}")),
    }
}

/// Body of `warren-supervisor adopt <init-pid> <sandbox-dir>`: starts a detached waiter for a running
/// init whose supervisor died (new session, reparented to the host's init, so it is nobody's zombie)
/// and prints its pid on stdout. The init is not the new waiter's child: it still ends the sandbox at
/// its deadline and notices its end through the pidfd, but records the exit code as unknown (-1).
pub fn adopt(init_pid: u32, sandbox_dir: &Path) -> i32 {
    // SAFETY: the supervisor binary is single-threaded here, so the child may do anything after fork.
    match unsafe { fork() } {
        Ok(ForkResult::Parent { child }) => {
            println!("{child}");
            0
        }
        Ok(ForkResult::Child) => {
            let _ = nix::unistd::setsid();
            // Stdout is the pipe the caller reads the pid from: the waiter must not hold it open.
            if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
                // SAFETY: dup2 onto fd 1 of this process; `null` stays owned and is closed after.
                unsafe { libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO) };
            }
            exec_waiter(init_pid, sandbox_dir);
            wait_and_record(init_pid, sandbox_dir)
        }
        Err(e) => {
            eprintln!("fork the waiter: {e}");
            1
        }
    }
}

/// Re-executes this binary as `warren-supervisor wait <init-pid> <sandbox-dir>`. Returns only when
/// the exec failed, in which case the caller waits in this image instead.
fn exec_waiter(init_pid: u32, sandbox_dir: &Path) {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let argv0 = std::env::args_os()
        .next()
        .and_then(|a| CString::new(a.as_bytes()).ok())
        .unwrap_or_else(|| c"warren-supervisor".to_owned());
    let (Ok(pid), Ok(dir)) = (
        CString::new(init_pid.to_string()),
        CString::new(sandbox_dir.as_os_str().as_bytes()),
    ) else {
        return;
    };
    let args = [argv0, c"wait".to_owned(), pid, dir];
    let Err(e) = nix::unistd::execv(c"/proc/self/exe", &args);
    eprintln!("exec of the waiter failed ({e}); waiting in the set-up image");
}

/// Body of `warren-supervisor wait <init-pid> <sandbox-dir>`: waits for the sandbox's init (our
/// child) and records its exit code in `init.exit`; ends the sandbox when its deadline passes (see
/// [`super::deadline`]). Returns the process exit code.
pub fn wait_and_record(init_pid: u32, sandbox_dir: &Path) -> i32 {
    let code = wait_within_deadline(init_pid, sandbox_dir);
    let _ = std::fs::write(sandbox_dir.join("init.exit"), format!("{code}\n"));
    0
}

/// Waits for the init's exit on a pidfd, waking once a second to compare the clock with the
/// deadline file; without a pidfd (old kernels) it waits without the switch.
fn wait_within_deadline(init_pid: u32, sandbox_dir: &Path) -> i32 {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, init_pid as libc::pid_t, 0) };
    if fd < 0 {
        return wait_for_init(init_pid);
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    let mut ended = false;
    // The lease of the last deadline read: a deadline file that goes away (the state directory
    // removed under a stopped server) or cannot be read leaves the lease it last gave in force,
    // never none at all.
    let mut lease: Option<super::deadline::Lease> = None;
    loop {
        let mut poll = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack.
        let ready = unsafe { libc::poll(&mut poll, 1, 1000) };
        if ready > 0 {
            return wait_for_init(init_pid);
        }
        if ended {
            continue;
        }
        let boot_ms = super::deadline::boot_clock_ms();
        if let Some(read) = super::deadline::read(sandbox_dir) {
            let wall_ms = crate::sandbox_state::now_unix_ms();
            lease = Some(match lease {
                Some(held) => held.reread(read, wall_ms, boot_ms),
                None => super::deadline::Lease::seen(read, wall_ms, boot_ms),
            });
        }
        let Some(held) = lease else {
            continue;
        };
        if held.expired(boot_ms) {
            eprintln!("the lease of {held:?} ran out without renewal: ending the sandbox");
            let _ = std::fs::write(
                sandbox_dir.join(super::deadline::EXPIRED_FILE),
                format!("{}\n", crate::sandbox_state::now_unix_ms()),
            );
            // SAFETY: pidfd_send_signal on our own pidfd; no memory is passed.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
            ended = true;
        }
    }
}

/// Waits until the init exits; returns its exit code (128 + signal when killed).
fn wait_for_init(init_pid: u32) -> i32 {
    let pid = nix::unistd::Pid::from_raw(init_pid as i32);
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, signal, _)) => return 128 + signal as i32,
            Ok(_) => continue,
            Err(nix::Error::EINTR) => continue,
            Err(_) => return -1,
        }
    }
}
