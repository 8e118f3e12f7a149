//! Settings of the Linux runtime and the checks that the host can run it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Settings of [`crate::LinuxRuntime`]. `Default` gives the documented shared layout.
#[derive(Debug, Clone, PartialEq)]
pub struct LinuxRuntimeConfig {
    /// Root of Warren's state; sandboxes live in `state_dir/sandboxes/<id>/`.
    pub state_dir: PathBuf,
    /// The static warren-agent binary, bind-mounted read-only at `/.warren/agent` in every sandbox.
    pub agent_binary: PathBuf,
    /// The `warren-supervisor` binary. `None`: `$WARREN_SUPERVISOR`, then next to the running executable
    /// (and its parent directory, for test binaries in `target/*/deps/`), then `$PATH`.
    pub supervisor_binary: Option<PathBuf>,
    /// Host bridge the sandboxes' veths attach to.
    pub bridge: String,
    /// The bridge's own address (the sandboxes' gateway); sandboxes get the other addresses of `subnet`.
    pub gateway: Ipv4Addr,
    /// Prefix length of the sandbox subnet around `gateway`.
    pub subnet_prefix: u8,
    /// Set `no_new_privs` on the sandbox's PID 1. It makes setuid binaries (sudo) inert inside, so it
    /// is off by default (as in Docker): `sudo` as the sandbox's `user` then gives root with the
    /// sandbox's reduced capability set and seccomp filter, nothing more.
    pub no_new_privs: bool,
    /// How long `create` waits for the agent's port to accept connections.
    pub agent_timeout: std::time::Duration,
    /// Switch the kernel to expedited RCU grace periods (`/sys/kernel/rcu_expedited`) when the runtime
    /// starts. A process's first write to a cgroup v1 `cgroup.procs` waits out a normal grace period
    /// (~11 ms measured here, a third of a create), as do unmounts and network-device changes; an
    /// expedited one takes well under a millisecond, at the price of an IPI to every CPU. It is a
    /// host-wide setting, left on when Warren stops.
    pub expedite_rcu: bool,
    /// Raise `kernel.pid_max` and the inotify per-uid limits when the runtime starts (see
    /// [`crate::host_capacity::raise_kernel_limits`]). Host-wide, left raised when Warren stops.
    pub raise_kernel_limits: bool,
    /// Port of the egress proxy on `gateway` (host-name rules, docs/network.md); only connections
    /// nftables redirected there reach it.
    pub egress_proxy_port: u16,
    /// DNS servers the egress proxy resolves allowed host names with; empty: the host's
    /// `/etc/resolv.conf`.
    pub egress_resolvers: Vec<std::net::SocketAddr>,
    /// CA certificates (PEM files) the egress proxy trusts, besides the host's trust store, when it
    /// connects to a host whose requests get header rules.
    pub egress_upstream_ca: Vec<PathBuf>,
    /// Restore checkpoints lazily (resume, fork, running-state templates): the processes run as soon
    /// as CRIU has rebuilt them and their memory follows over userfaultfd, served and checked chunk
    /// by chunk from the checkpoint (see [`crate::checkpoint::lazy_pages`]). Off: every page is read
    /// and checked before the processes run. Checkpoints of format 1 are always restored eagerly.
    pub lazy_restore: bool,
    /// Supervisors kept started ahead of need (`supervisor::standby`), so a create does not wait
    /// for a process to start; 0: each create starts its own. Each one is an idle process of a few
    /// hundred KiB that holds nothing else.
    pub standby_supervisors: usize,
    /// Addresses of servers on other machines that connect to the sandboxes (a `warren node`'s,
    /// docs/cluster.md): the firewall forwards their new connections into the sandbox subnet and
    /// the sandboxes' replies back. Empty: only this machine reaches its sandboxes.
    pub server_addresses: Vec<Ipv4Addr>,
}

impl Default for LinuxRuntimeConfig {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/var/lib/warren"),
            agent_binary: PathBuf::from("/usr/local/lib/warren/warren-agent"),
            supervisor_binary: None,
            bridge: "warren0".to_string(),
            gateway: Ipv4Addr::new(10, 77, 0, 1),
            subnet_prefix: 16,
            no_new_privs: false,
            agent_timeout: std::time::Duration::from_secs(15),
            expedite_rcu: true,
            raise_kernel_limits: true,
            egress_proxy_port: 49090,
            egress_resolvers: Vec::new(),
            egress_upstream_ca: Vec::new(),
            lazy_restore: true,
            standby_supervisors: 0,
            server_addresses: Vec::new(),
        }
    }
}

/// Why the host cannot run sandboxes.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the Linux runtime must run as root (uid 0); current euid is {0}")]
    NotRoot(u32),
    #[error(
        "overlayfs is not available (not listed in /proc/filesystems; try `modprobe overlay`)"
    )]
    NoOverlay,
    #[error("no usable cgroup hierarchy: {0}")]
    NoCgroups(String),
    #[error("agent binary {0} does not exist")]
    NoAgent(PathBuf),
    #[error("warren-supervisor binary not found (set WARREN_SUPERVISOR or LinuxRuntimeConfig::supervisor_binary)")]
    NoSupervisor,
    #[error("subnet prefix /{0} is not usable (8..=30)")]
    BadSubnet(u8),
    #[error("cannot install the sandbox firewall rules (is nftables installed?): {0}")]
    Firewall(String),
    #[error("cannot create state directory {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn check_root() -> Result<(), ConfigError> {
    let euid = nix::unistd::geteuid().as_raw();
    if euid != 0 {
        return Err(ConfigError::NotRoot(euid));
    }
    Ok(())
}

pub(crate) fn check_overlay() -> Result<(), ConfigError> {
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if filesystems
        .lines()
        .any(|line| line.split_whitespace().last() == Some("overlay"))
    {
        Ok(())
    } else {
        Err(ConfigError::NoOverlay)
    }
}

/// Finds the supervisor binary as [`LinuxRuntimeConfig::supervisor_binary`] documents.
pub(crate) fn find_supervisor(configured: Option<&Path>) -> Result<PathBuf, ConfigError> {
    const NAME: &str = "warren-supervisor";
    if let Some(path) = configured {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(ConfigError::NoSupervisor)
        };
    }
    let mut candidates = Vec::new();
    if let Some(env) = std::env::var_os("WARREN_SUPERVISOR") {
        candidates.push(PathBuf::from(env));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join(NAME));
            if let Some(parent) = dir.parent() {
                candidates.push(parent.join(NAME));
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|dir| dir.join(NAME)));
    }
    candidates
        .into_iter()
        .find(|path| path.is_file())
        .ok_or(ConfigError::NoSupervisor)
}

/// The kernel's switch for expedited RCU grace periods.
const RCU_EXPEDITED: &str = "/sys/kernel/rcu_expedited";

/// Turns expedited RCU grace periods on (see [`LinuxRuntimeConfig::expedite_rcu`]); says what it did.
/// A kernel without the switch, or one that refuses, is only logged: sandboxes work either way.
pub fn expedite_rcu() {
    match std::fs::read_to_string(RCU_EXPEDITED) {
        Ok(value) if value.trim() != "0" => {}
        Ok(_) => match std::fs::write(RCU_EXPEDITED, "1") {
            Ok(()) => tracing::info!(
                "set {RCU_EXPEDITED} to 1: cgroup joins, unmounts and veth changes no longer wait \
                 out a normal RCU grace period (turn off with --keep-rcu-normal)"
            ),
            Err(error) => tracing::warn!(%error, "cannot set {RCU_EXPEDITED}; creates stay slower"),
        },
        Err(error) => tracing::info!(%error, "no {RCU_EXPEDITED}; RCU grace periods stay normal"),
    }
}

/// The layer stores below the state directory: template layers, build layers, snapshots and the
/// sandboxes' writable layers and checkpoints, and the formatted images new writable layers copy.
pub const LAYER_STORES: [&str; 5] = ["templates", "layers", "snapshots", "sandboxes", "images"];

/// Makes the state directory and the layer stores in it root-only (0700): their files are other
/// tenants' data, and setuid binaries or device nodes in them must not be reachable from the host
/// by unprivileged users. Stores made later inherit the state directory's protection.
pub(crate) fn restrict_state_dir(state_dir: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let dirs = std::iter::once(state_dir.to_path_buf())
        .chain(LAYER_STORES.iter().map(|store| state_dir.join(store)))
        .filter(|dir| dir.is_dir());
    for dir in dirs {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(
            |source| ConfigError::StateDir {
                path: dir.clone(),
                source,
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn layer_stores_become_root_only() {
        let dir = std::env::temp_dir().join(format!("wt-state-perms-{}", std::process::id()));
        for store in ["sandboxes", "templates", "unrelated"] {
            std::fs::create_dir_all(dir.join(store)).unwrap();
            std::fs::set_permissions(dir.join(store), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        restrict_state_dir(&dir).unwrap();
        let mode = |name: &str| {
            std::fs::metadata(dir.join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        let modes = (
            mode(""),
            mode("sandboxes"),
            mode("templates"),
            mode("unrelated"),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(modes, (0o700, 0o700, 0o700, 0o755));
    }
}
