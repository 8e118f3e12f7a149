//! Capabilities of the sandbox's processes: Docker's default set without CAP_MKNOD (a sandbox must not
//! create device nodes; on cgroup v2 no device allow-list backs that up), and `no_new_privs` when
//! configured.

use caps::{CapSet, Capability, CapsHashSet};

#[derive(Debug, thiserror::Error)]
pub enum CapabilityError {
    #[error("drop capability {cap} from the {set} set")]
    Drop {
        cap: Capability,
        set: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("set the {set} capability set")]
    Set {
        set: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("set no_new_privs")]
    NoNewPrivs(#[source] nix::Error),
}

/// What a sandbox keeps.
pub const SANDBOX_CAPABILITIES: [Capability; 13] = [
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_NET_RAW,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETFCAP,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_KILL,
    Capability::CAP_AUDIT_WRITE,
];

fn kept() -> CapsHashSet {
    SANDBOX_CAPABILITIES.iter().copied().collect()
}

/// Drops everything else from the bounding set (so exec'd programs, root included, can never regain it)
/// and from the effective, permitted and inheritable sets; clears the ambient set.
pub fn drop_to_sandbox_set() -> Result<(), CapabilityError> {
    let keep = kept();
    for cap in caps::all() {
        if !keep.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap).map_err(|source| CapabilityError::Drop {
                cap,
                set: "bounding",
                source,
            })?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(|source| CapabilityError::Set {
        set: "ambient",
        source,
    })?;
    caps::set(None, CapSet::Inheritable, &keep).map_err(|source| CapabilityError::Set {
        set: "inheritable",
        source,
    })?;
    caps::set(None, CapSet::Effective, &keep).map_err(|source| CapabilityError::Set {
        set: "effective",
        source,
    })?;
    caps::set(None, CapSet::Permitted, &keep).map_err(|source| CapabilityError::Set {
        set: "permitted",
        source,
    })?;
    Ok(())
}

pub fn set_no_new_privs() -> Result<(), CapabilityError> {
    nix::sys::prctl::set_no_new_privs().map_err(CapabilityError::NoNewPrivs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_set_excludes_admin_module_and_mknod() {
        let keep = kept();
        for cap in [
            Capability::CAP_SYS_ADMIN,
            Capability::CAP_SYS_MODULE,
            Capability::CAP_MKNOD,
            Capability::CAP_SYS_PTRACE,
        ] {
            assert!(!keep.contains(&cap), "{cap} must be dropped");
        }
    }
}
