//! The sandbox's seccomp filter, written as a policy: allow by default, and deny (EPERM) the groups in
//! [`POLICY`], each with the reason it is denied. docs/security.md ("Seccomp policy") explains each
//! group; the test `crates/runtime/tests/seccomp_policy.rs` calls every denied syscall inside a
//! sandbox and checks the filter's answer, with the same calls on the host as the control.
//!
//! The policy is Docker's default profile for a container without CAP_SYS_ADMIN, tightened where that
//! costs a sandbox nothing: keyrings, userfaultfd, the kernel log and fanotify are denied outright
//! instead of left to capability checks and sysctls the host may have relaxed; `unshare` is denied
//! whatever its flags and `clone` with any namespace flag (no user namespaces inside, so none of the
//! capabilities they grant); `clone3` answers ENOSYS so libc falls back to `clone`, whose flags the
//! filter can inspect.
//!
//! io_uring (`io_uring_setup`, `io_uring_enter`, `io_uring_register`) is denied too unless the sandbox
//! opts in ([`SyscallPolicy::allow_io_uring`]): its submission queue performs operations that no
//! seccomp filter sees, and it has been the door of many kernel exploits (Docker denies it since 25.0).
//!
//! What the agent itself needs (processes and PTYs, file I/O, inotify, sockets, setuid/setgid to run as
//! the sandbox's user, prctl, wait, signals, pidfds) is all in the default allow; nothing in the
//! policy is a call the agent makes. CRIU is unaffected: its dump suspends the filter of the tasks it
//! infects (PTRACE_O_SUSPEND_SECCOMP, as host root) and its restore installs the saved filter last.
//!
//! The program is compiled with `seccompiler` and installed directly with seccomp(2): the sandbox's
//! init still holds CAP_SYS_ADMIN when it installs it, so `no_new_privs` stays a separate choice.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("build seccomp filter")]
    Build(#[source] seccompiler::BackendError),
    #[error("compile seccomp filter")]
    Compile(#[source] seccompiler::BackendError),
    #[error("install seccomp filter")]
    Install(#[source] std::io::Error),
}

/// One group of the policy: syscalls denied for one reason.
#[derive(Debug, Clone, Copy)]
pub struct DeniedGroup {
    /// Why the group is denied (docs/security.md repeats it).
    pub reason: &'static str,
    /// (name, number) of each syscall.
    pub syscalls: &'static [(&'static str, i64)],
}

macro_rules! syscalls {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), sys::$name)),*]
    };
}

/// Syscall numbers under their plain names (so the policy reads as the names `strace` prints).
#[allow(non_upper_case_globals)]
mod sys {
    pub const acct: i64 = libc::SYS_acct;
    pub const add_key: i64 = libc::SYS_add_key;
    pub const bpf: i64 = libc::SYS_bpf;
    pub const clock_adjtime: i64 = libc::SYS_clock_adjtime;
    pub const clock_settime: i64 = libc::SYS_clock_settime;
    pub const delete_module: i64 = libc::SYS_delete_module;
    pub const fanotify_init: i64 = libc::SYS_fanotify_init;
    pub const finit_module: i64 = libc::SYS_finit_module;
    pub const fsconfig: i64 = libc::SYS_fsconfig;
    pub const fsmount: i64 = libc::SYS_fsmount;
    pub const fsopen: i64 = libc::SYS_fsopen;
    pub const fspick: i64 = libc::SYS_fspick;
    pub const get_mempolicy: i64 = libc::SYS_get_mempolicy;
    pub const init_module: i64 = libc::SYS_init_module;
    pub const ioperm: i64 = libc::SYS_ioperm;
    pub const iopl: i64 = libc::SYS_iopl;
    pub const kcmp: i64 = libc::SYS_kcmp;
    pub const kexec_file_load: i64 = libc::SYS_kexec_file_load;
    pub const kexec_load: i64 = libc::SYS_kexec_load;
    pub const keyctl: i64 = libc::SYS_keyctl;
    pub const lookup_dcookie: i64 = libc::SYS_lookup_dcookie;
    pub const mbind: i64 = libc::SYS_mbind;
    pub const mount: i64 = libc::SYS_mount;
    pub const mount_setattr: i64 = libc::SYS_mount_setattr;
    pub const move_mount: i64 = libc::SYS_move_mount;
    pub const move_pages: i64 = libc::SYS_move_pages;
    pub const name_to_handle_at: i64 = libc::SYS_name_to_handle_at;
    pub const nfsservctl: i64 = libc::SYS_nfsservctl;
    pub const open_by_handle_at: i64 = libc::SYS_open_by_handle_at;
    pub const open_tree: i64 = libc::SYS_open_tree;
    pub const perf_event_open: i64 = libc::SYS_perf_event_open;
    pub const pivot_root: i64 = libc::SYS_pivot_root;
    pub const quotactl: i64 = libc::SYS_quotactl;
    pub const quotactl_fd: i64 = libc::SYS_quotactl_fd;
    pub const reboot: i64 = libc::SYS_reboot;
    pub const request_key: i64 = libc::SYS_request_key;
    pub const set_mempolicy: i64 = libc::SYS_set_mempolicy;
    pub const setns: i64 = libc::SYS_setns;
    pub const settimeofday: i64 = libc::SYS_settimeofday;
    pub const swapoff: i64 = libc::SYS_swapoff;
    pub const swapon: i64 = libc::SYS_swapon;
    pub const syslog: i64 = libc::SYS_syslog;
    pub const sysfs: i64 = libc::SYS_sysfs;
    pub const _sysctl: i64 = libc::SYS__sysctl;
    pub const umount2: i64 = libc::SYS_umount2;
    pub const unshare: i64 = libc::SYS_unshare;
    pub const uselib: i64 = libc::SYS_uselib;
    pub const userfaultfd: i64 = libc::SYS_userfaultfd;
    pub const ustat: i64 = libc::SYS_ustat;
    pub const vhangup: i64 = libc::SYS_vhangup;
}

/// The deny list, by reason. Every syscall here answers EPERM inside a sandbox.
pub const POLICY: &[DeniedGroup] = &[
    DeniedGroup {
        reason: "kernel code and the running kernel: loading modules, kexec, reboot, raw port I/O",
        syscalls: syscalls![
            init_module,
            finit_module,
            delete_module,
            kexec_load,
            kexec_file_load,
            reboot,
            ioperm,
            iopl,
        ],
    },
    DeniedGroup {
        reason: "mounts and namespaces: the sandbox's tree is fixed by its init; no new namespace \
                 (user namespaces included) and no joining another",
        syscalls: syscalls![
            mount,
            umount2,
            pivot_root,
            fsopen,
            fsconfig,
            fsmount,
            fspick,
            move_mount,
            open_tree,
            mount_setattr,
            unshare,
            setns,
        ],
    },
    DeniedGroup {
        reason: "file handles: open_by_handle_at opened host files from a container (Shocker); \
                 name_to_handle_at is its other half",
        syscalls: syscalls![open_by_handle_at, name_to_handle_at],
    },
    DeniedGroup {
        reason: "kernel keyrings: not namespaced, shared with the host's root",
        syscalls: syscalls![add_key, keyctl, request_key],
    },
    DeniedGroup {
        reason: "exploit primitives with no use in a sandbox: userfaultfd (stalls the kernel at a \
                 chosen page), bpf, perf_event_open, kcmp",
        syscalls: syscalls![userfaultfd, bpf, perf_event_open, kcmp],
    },
    DeniedGroup {
        reason: "host-wide state: clocks, swap, quotas, process accounting, the kernel log, \
                 fanotify, the terminal hang-up",
        syscalls: syscalls![
            clock_adjtime,
            clock_settime,
            settimeofday,
            swapon,
            swapoff,
            quotactl,
            quotactl_fd,
            acct,
            syslog,
            fanotify_init,
            vhangup,
        ],
    },
    DeniedGroup {
        reason: "NUMA placement: the host's memory layout is not the sandbox's to choose",
        syscalls: syscalls![mbind, get_mempolicy, set_mempolicy, move_pages],
    },
    DeniedGroup {
        reason: "obsolete interfaces (most already gone from the kernel)",
        syscalls: syscalls![lookup_dcookie, nfsservctl, sysfs, _sysctl, uselib, ustat],
    },
];

/// Every syscall of [`POLICY`], flattened.
fn policy_syscalls() -> impl Iterator<Item = i64> {
    POLICY
        .iter()
        .flat_map(|group| group.syscalls.iter().map(|(_, nr)| *nr))
}

/// The io_uring syscalls, denied unless the sandbox opts in.
pub const IO_URING: [i64; 3] = [
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// What a sandbox may do beyond the default filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SyscallPolicy {
    /// Allow io_uring (denied by default).
    #[serde(default)]
    pub allow_io_uring: bool,
}

/// Namespace flags `clone` may not carry (any one of them makes it EPERM).
pub const NAMESPACE_FLAGS: [libc::c_int; 7] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
];

fn target_arch() -> TargetArch {
    #[cfg(target_arch = "aarch64")]
    return TargetArch::aarch64;
    #[cfg(not(target_arch = "aarch64"))]
    TargetArch::x86_64
}

/// Syscalls `policy` denies outright.
fn denied(policy: SyscallPolicy) -> Vec<i64> {
    let mut denied: Vec<i64> = policy_syscalls().collect();
    if !policy.allow_io_uring {
        denied.extend(IO_URING);
    }
    denied
}

/// The deny-list program (EPERM) and the clone3 program (ENOSYS).
pub fn sandbox_filters(policy: SyscallPolicy) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = denied(policy)
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|flag| {
            let flag = *flag as u64;
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .and_then(|condition| SeccompRule::new(vec![condition]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(SeccompError::Build)?;
    rules.insert(libc::SYS_clone, clone_rules);
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        target_arch(),
    )
    .map_err(SeccompError::Build)?;
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        target_arch(),
    )
    .map_err(SeccompError::Build)?;
    let deny: BpfProgram = deny.try_into().map_err(SeccompError::Compile)?;
    let clone3: BpfProgram = clone3.try_into().map_err(SeccompError::Compile)?;
    Ok(vec![deny, clone3])
}

/// Installs `program` on the calling thread (needs CAP_SYS_ADMIN or no_new_privs).
pub fn install(program: &BpfProgram) -> Result<(), SeccompError> {
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `program`, which outlives the call; the kernel copies the filter.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(SeccompError::Install(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        for allow_io_uring in [false, true] {
            let filters = sandbox_filters(SyscallPolicy { allow_io_uring }).unwrap();
            assert_eq!(filters.len(), 2);
            assert!(filters.iter().all(|f| !f.is_empty()));
        }
    }

    #[test]
    fn the_policy_names_each_syscall_once_and_none_the_agent_needs() {
        let all: Vec<i64> = policy_syscalls().collect();
        let unique: std::collections::BTreeSet<i64> = all.iter().copied().collect();
        assert_eq!(all.len(), unique.len(), "a syscall is listed twice");
        // What the agent and ordinary programs call must stay allowed.
        for needed in [
            libc::SYS_clone,
            libc::SYS_execve,
            libc::SYS_setresuid,
            libc::SYS_setgroups,
            libc::SYS_prctl,
            libc::SYS_inotify_init1,
            libc::SYS_inotify_add_watch,
            libc::SYS_pidfd_open,
            libc::SYS_ptrace,
            libc::SYS_chroot,
        ] {
            assert!(!unique.contains(&needed), "{needed} is needed");
        }
    }

    #[test]
    fn io_uring_is_denied_unless_allowed() {
        let default = denied(SyscallPolicy::default());
        for nr in [
            libc::SYS_keyctl,
            libc::SYS_userfaultfd,
            libc::SYS_unshare,
            libc::SYS_syslog,
        ] {
            assert!(default.contains(&nr), "{nr} must be denied by default");
        }
        assert!(IO_URING.iter().all(|nr| default.contains(nr)));
        let opted_in = denied(SyscallPolicy {
            allow_io_uring: true,
        });
        assert!(IO_URING.iter().all(|nr| !opted_in.contains(nr)));
        assert!(opted_in.contains(&libc::SYS_bpf));
    }
}
