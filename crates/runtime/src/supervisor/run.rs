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
    let status = match detach(status_fd) {
        Detached::Parent => return 0,
        Detached::Child(status) => status,
        Detached::Failed => return 1,
    };
    serve(status, config_path, None)
}

/// Entry point of `warren-supervisor standby --status-fd <fd>`: a supervisor started before there is
/// a sandbox for it, so that a create does not wait for a process to start (about a third of the
/// supervisor's time). It detaches as `run` does, then waits for one line on its stdin, the path of
/// a sandbox's configuration, and goes on as `run` would with it. End of input (the runtime dropped
/// it, or exited) ends it without a trace.
pub fn standby(status_fd: i32) -> i32 {
    let status = match detach(status_fd) {
        Detached::Parent => return 0,
        Detached::Child(status) => status,
        Detached::Failed => return 1,
    };
    // Made while nothing waits: a network namespace costs most of a millisecond to create. It
    // goes with this process if no sandbox ever comes.
    let netns = namespaces::create_netns().ok();
    if !report(&status, &format!("ready {}", std::process::id())) {
        return 0;
    }
    let mut order = String::new();
    match std::io::stdin().read_line(&mut order) {
        Ok(n) if n > 0 && order.ends_with('\n') => {}
        _ => return 0,
    }
    let _ = STARTED.set(std::time::Instant::now());
    let config_path = Path::new(order.trim_end_matches('\n'));
    // The sandbox's log replaces the runtime's /dev/null, and the order pipe is not the init's to
    // inherit. The log is named by the configuration's directory, as `LinuxRuntime` names it for `run`.
    if let Err(e) = redirect_to_log(config_path) {
        report(&status, &format!("err {e}"));
        return 1;
    }
    serve(status, config_path, netns)
}

enum Detached {
    Parent,
    Child(OwnedFd),
    Failed,
}

/// Takes ownership of the status fd and forks: the runtime reaps the first process at once, the
/// second one (a new session) goes on and is reparented to init.
fn detach(status_fd: i32) -> Detached {
    let status_fd = if status_fd == libc::STDOUT_FILENO {
        // The runtime hands the status pipe over as stdout, so that it can start this process
        // without running code between its fork and exec (which makes the kernel copy the whole
        // server's page tables): move it to an fd of its own, and give stdout what stderr has.
        // SAFETY: fcntl and dup2 on the standard fds of this process.
        let moved = unsafe { libc::fcntl(libc::STDOUT_FILENO, libc::F_DUPFD_CLOEXEC, 3) };
        // SAFETY: as above.
        if moved < 0 || unsafe { libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) } < 0 {
            eprintln!(
                "move the status pipe off stdout: {}",
                std::io::Error::last_os_error()
            );
            return Detached::Failed;
        }
        moved
    } else {
        status_fd
    };
    // SAFETY: the runtime handed us this fd (the write end of its status pipe); we own it from here on.
    let status = unsafe { OwnedFd::from_raw_fd(status_fd) };
    // Keep it from leaking into the sandbox's init.
    // SAFETY: fcntl on an fd we own.
    unsafe { libc::fcntl(status.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the supervisor is single-threaded here, so the child may do anything after fork.
    match unsafe { fork() } {
        Ok(ForkResult::Parent { .. }) => Detached::Parent,
        Ok(ForkResult::Child) => {
            let _ = nix::unistd::setsid();
            Detached::Child(status)
        }
        Err(e) => {
            report(&status, &format!("err fork supervisor: {e}"));
            Detached::Failed
        }
    }
}

/// Points stdin at /dev/null and stdout and stderr at `supervisor.log` beside `config_path`.
fn redirect_to_log(config_path: &Path) -> Result<(), String> {
    let dir = config_path
        .parent()
        .ok_or_else(|| format!("no directory in {}", config_path.display()))?;
    let log_path = dir.join("supervisor.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("open {}: {e}", log_path.display()))?;
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("open /dev/null: {e}"))?;
    for (from, to) in [
        (null.as_raw_fd(), 0),
        (log.as_raw_fd(), 1),
        (log.as_raw_fd(), 2),
    ] {
        // SAFETY: dup2 between fds this process owns; the standard fds are replaced, not leaked.
        if unsafe { libc::dup2(from, to) } < 0 {
            return Err(format!(
                "redirect fd {to}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// The supervisor's work once detached: read the configuration, start the sandbox, report, then
/// wait for the init as a small image.
fn serve(status: OwnedFd, config_path: &Path, netns: Option<std::fs::File>) -> i32 {
    let config = match SupervisorConfig::read(config_path) {
        Ok(config) => config,
        Err(e) => {
            report(&status, &format!("err {}", error_chain(&e)));
            return 1;
        }
    };
    match start_sandbox(&config, netns) {
        Ok((init_pid, transfer)) => {
            if !report(&status, &format!("ok {init_pid} {}", std::process::id())) {
                // Nobody reads the report: the runtime that asked for this sandbox is gone (killed
                // mid-create) or gave up waiting, so no record will ever name it. End it rather than
                // leave a sandbox only a leftover sweep could find.
                end_tree(init_pid, transfer, &config.sandbox_dir);
                return 1;
            }
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

/// Writes `line` to the status pipe; false when nobody can read it any more (the read end is closed).
fn report(status: &OwnedFd, line: &str) -> bool {
    let bytes = format!("{}\n", line.replace('\n', " "));
    // SAFETY: write(2) from a valid buffer to an fd we own. A short write of one small line to a pipe
    // does not happen (PIPE_BUF). SIGPIPE is ignored in Rust programs, so a closed read end is EPIPE.
    let written = unsafe { libc::write(status.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
    eprintln!("{line}");
    written == bytes.len() as isize
}

pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
    crate::error_chain(error)
}

/// Wires the network and starts the init; returns the init's host PID.
///
/// The init is forked first so that its first write to `cgroup.procs`, which waits out a kernel RCU
/// grace period (about 11 ms here, whatever the hierarchy), overlaps the network set-up instead of
/// following it. The init then waits on `go` until the network is wired and joins it.
fn start_sandbox(
    config: &SupervisorConfig,
    netns: Option<std::fs::File>,
) -> Result<(u32, Option<LazyTransfer>), String> {
    phase("config read");
    if let Some(plan) = &config.restore {
        setup_network(config, netns).map_err(|e| format!("network: {e}"))?;
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
            if let Err(e) = setup_network(config, netns) {
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

/// Pins the sandbox's network namespace (`made`, one made ahead, or a new one), wires its veth to
/// the bridge and configures its side.
fn setup_network(config: &SupervisorConfig, made: Option<std::fs::File>) -> Result<(), String> {
    let plan = &config.network;
    std::fs::write(&config.netns_pin, b"")
        .map_err(|e| format!("netns pin {}: {e}", config.netns_pin.display()))?;
    let netns = match made {
        Some(netns) => namespaces::pin_netns(&netns, &config.netns_pin).map(|()| netns),
        None => namespaces::create_pinned_netns(&config.netns_pin),
    }
    .map_err(|e| error_chain(&e))?;
    phase("netns pinned");
    let host = plan.host_veth();
    // One netlink runtime for both sides: the sandbox side's socket is opened after this thread
    // has joined the sandbox's namespace.
    netlink::run(async {
        let host_side = Netlink::connect()?;
        let bridge = host_side
            .ensure_bridge(&plan.bridge, plan.gateway_mac())
            .await?;
        host_side
            .ensure_address(bridge, &plan.bridge, plan.gateway, plan.prefix)
            .await?;
        host_side
            .create_veth_into(
                &host,
                netns.as_raw_fd(),
                bridge,
                plan.sandbox_mac(),
                config.restore.is_some(),
            )
            .await?;
        phase("veth pair made");
        // Failures here are not netlink's: they come back as the inner error.
        if let Err(e) = namespaces::join(&netns, &config.netns_pin, CloneFlags::CLONE_NEWNET) {
            return Ok(Err(error_chain(&e)));
        }
        if let Err(e) = set_sandbox_sysctls() {
            return Ok(Err(e));
        }
        Netlink::connect()?
            .configure_sandbox_side(plan.ip, plan.prefix, plan.gateway)
            .await
            .map(Ok)
    })
    .map_err(|e| error_chain(&e))??;
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
