//! Capabilities of the sandbox's processes: Docker's default set without CAP_MKNOD (a sandbox must not
//! create device nodes; on cgroup v2 no device allow-list backs that up) and without CAP_NET_RAW unless
//! the sandbox asks for raw sockets (raw and packet sockets let it forge any frame on its link; `ping`
//! needs none of that, see `net.ipv4.ping_group_range` in the supervisor), and `no_new_privs` when
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
pub const SANDBOX_CAPABILITIES: [Capability; 12] = [
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETFCAP,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_KILL,
    Capability::CAP_AUDIT_WRITE,
];

/// Kept on top of [`SANDBOX_CAPABILITIES`] when the sandbox asks for raw sockets.
pub const RAW_SOCKETS: Capability = Capability::CAP_NET_RAW;

fn kept(net_raw: bool) -> CapsHashSet {
    let mut keep: CapsHashSet = SANDBOX_CAPABILITIES.iter().copied().collect();
    if net_raw {
        keep.insert(RAW_SOCKETS);
    }
    keep
}

/// Drops everything else from the bounding set (so exec'd programs, root included, can never regain it)
/// and from the effective, permitted and inheritable sets; clears the ambient set. `net_raw` keeps
/// CAP_NET_RAW.
pub fn drop_to_sandbox_set(net_raw: bool) -> Result<(), CapabilityError> {
    let keep = kept(net_raw);
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
        let keep = kept(false);
        for cap in [
            Capability::CAP_SYS_ADMIN,
            Capability::CAP_SYS_MODULE,
            Capability::CAP_MKNOD,
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_NET_RAW,
            Capability::CAP_NET_ADMIN,
        ] {
            assert!(!keep.contains(&cap), "{cap} must be dropped");
        }
    }

    #[test]
    fn raw_sockets_add_only_net_raw() {
        let plain = kept(false);
        let raw = kept(true);
        assert_eq!(
            raw.difference(&plain).collect::<Vec<_>>(),
            vec![&Capability::CAP_NET_RAW]
        );
        assert!(!raw.contains(&Capability::CAP_NET_ADMIN));
    }
}
