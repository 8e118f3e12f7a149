//! The sandbox's seccomp filter: allow by default, deny (EPERM) what Docker's default profile denies to a
//! container without CAP_SYS_ADMIN: kernel modules, kexec, reboot, mounting, namespaces, keyrings, bpf,
//! perf, clock setting, swap, quotas, handle-based open, userfaultfd and friends. `clone3` answers ENOSYS
//! so libc falls back to `clone`, whose namespace flags the filter can inspect.
//!
//! io_uring (`io_uring_setup`, `io_uring_enter`, `io_uring_register`) is denied too unless the sandbox
//! opts in ([`SyscallPolicy::allow_io_uring`]): its submission queue performs operations that no
//! seccomp filter sees, and it has been the door of many kernel exploits (Docker denies it since 25.0).
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

/// Syscalls denied outright.
const DENIED: &[i64] = &[
    libc::SYS_acct,
    libc::SYS_add_key,
    libc::SYS_bpf,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_settime,
    libc::SYS_delete_module,
    libc::SYS_finit_module,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fsopen,
    libc::SYS_fspick,
    libc::SYS_get_mempolicy,
    libc::SYS_init_module,
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS_kcmp,
    libc::SYS_kexec_file_load,
    libc::SYS_kexec_load,
    libc::SYS_keyctl,
    libc::SYS_lookup_dcookie,
    libc::SYS_mbind,
    libc::SYS_mount,
    libc::SYS_mount_setattr,
    libc::SYS_move_mount,
    libc::SYS_move_pages,
    libc::SYS_name_to_handle_at,
    libc::SYS_nfsservctl,
    libc::SYS_open_by_handle_at,
    libc::SYS_open_tree,
    libc::SYS_perf_event_open,
    libc::SYS_pivot_root,
    libc::SYS_quotactl,
    libc::SYS_reboot,
    libc::SYS_request_key,
    libc::SYS_set_mempolicy,
    libc::SYS_setns,
    libc::SYS_settimeofday,
    libc::SYS_swapoff,
    libc::SYS_swapon,
    libc::SYS_sysfs,
    libc::SYS__sysctl,
    libc::SYS_umount2,
    libc::SYS_unshare,
    libc::SYS_uselib,
    libc::SYS_userfaultfd,
    libc::SYS_ustat,
    libc::SYS_vhangup,
];

/// The io_uring syscalls, denied unless the sandbox opts in.
const IO_URING: [i64; 3] = [
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

/// Namespace flags `clone` may not carry.
const NAMESPACE_FLAGS: [libc::c_int; 7] = [
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
    let mut denied = DENIED.to_vec();
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
    fn io_uring_is_denied_unless_allowed() {
        let default = denied(SyscallPolicy::default());
        assert!(IO_URING.iter().all(|nr| default.contains(nr)));
        let opted_in = denied(SyscallPolicy {
            allow_io_uring: true,
        });
        assert!(IO_URING.iter().all(|nr| !opted_in.contains(nr)));
        assert!(opted_in.contains(&libc::SYS_bpf));
    }
}
