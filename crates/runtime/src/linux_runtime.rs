//! [`LinuxRuntime`]: the [`Runtime`] on Linux namespaces, cgroups, overlayfs and seccomp.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cgroups::{CgroupVersion, Cgroups, SandboxCgroup};
use crate::checkpoint::{self, CheckpointError, Checkpointer, DumpTarget, FreezerCgroup, Manifest};
use crate::config::{self, ConfigError, LinuxRuntimeConfig};
use crate::confined::ConfinedDir;
use crate::crash_recovery;
use crate::network::addresses::AddressPool;
use crate::network::egress_proxy::{EgressProxy, EgressProxyConfig};
use crate::network::netlink::{self, Netlink};
use crate::network::{self, firewall, NetworkPlan};
use crate::process_table::{self, CPU_SAMPLE_WINDOW};
use crate::rootfs::layer_disk::SeedError;
use crate::rootfs::{commit, sandbox_mounts, LayerDisk};
use crate::sandbox_state::{now_unix_ms, SandboxRecord};
use crate::supervisor::standby::{HandError, StandbyPool};
use crate::supervisor::{self, Launched, RestorePlan, SupervisorConfig, SupervisorError};
use crate::{
    namespaces, Capabilities, CheckpointInfo, HostCapacity, ProcessInfo, Runtime, RuntimeError,
    RuntimeState, Sandbox, SandboxSpec, Stats, AGENT_PORT,
};

/// Sandboxes younger than this without a state record are still being created; `list` leaves them be.
const CREATE_GRACE: Duration = Duration::from_secs(120);

/// Samples older than this are not used for CPU % (a fresh window is taken instead).
const SAMPLE_MAX_AGE: Duration = Duration::from_secs(30);
/// Entries looked at when finding a sandbox's largest files: a bounded walk for any layer.
const LARGEST_FILES_BUDGET: usize = 200_000;

/// CPU ticks per host PID at one instant.
type ProcessSample = (Instant, HashMap<u32, u64>);

pub struct LinuxRuntime {
    config: LinuxRuntimeConfig,
    supervisor_binary: PathBuf,
    cgroups: Cgroups,
    addresses: AddressPool,
    /// CRIU, if it works on this host (probed once at start).
    checkpointer: Checkpointer,
    /// Last CPU sample per sandbox (cgroup usage) and per process, for CPU % between calls.
    cpu_samples: Mutex<HashMap<String, (Instant, u64)>>,
    process_samples: Mutex<HashMap<String, ProcessSample>>,
    /// Enforces the sandboxes' host-name rules.
    egress_proxy: EgressProxy,
    /// The host's lxcfs mount, when it answers (see [`crate::rootfs::lxcfs`]).
    lxcfs: Option<PathBuf>,
    /// Supervisors started ahead of need.
    standbys: Arc<StandbyPool>,
    /// Starting this runtime replaced the host's firewall tables (see
    /// [`Runtime::network_rules_replaced`]).
    ruleset_replaced: bool,
}

fn io_error(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let context = context.into();
    move |source| RuntimeError::Io { context, source }
}

/// An internal failure while doing `context` (the cause stays attached as the source).
fn internal<E: std::error::Error + Send + Sync + 'static>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> RuntimeError {
    let context = context.into();
    move |source| RuntimeError::internal(context, source)
}

impl LinuxRuntime {
    /// Checks the host (root, overlayfs, cgroups, binaries, nftables) and prepares the state directory.
    pub fn new(mut config: LinuxRuntimeConfig) -> Result<Self, ConfigError> {
        config::check_root()?;
        config::check_overlay()?;
        let cgroups =
            Cgroups::detect().map_err(|e| ConfigError::NoCgroups(crate::error_chain(&e)))?;
        if !config.agent_binary.is_file() {
            return Err(ConfigError::NoAgent(config.agent_binary.clone()));
        }
        // Supervisors bind-mount these paths from their own working directory: make them absolute, so a
        // relative `--agent` or state dir means what it meant where the caller stood.
        for path in [&mut config.agent_binary, &mut config.state_dir] {
            if path.is_relative() {
                if let Ok(cwd) = std::env::current_dir() {
                    *path = cwd.join(&*path);
                }
            }
        }
        let supervisor_binary = config::find_supervisor(config.supervisor_binary.as_deref())?;
        if config.expedite_rcu {
            config::expedite_rcu();
        }
        if config.raise_kernel_limits {
            crate::host_capacity::raise_kernel_limits();
        }
        if !(8..=30).contains(&config.subnet_prefix) {
            return Err(ConfigError::BadSubnet(config.subnet_prefix));
        }
        let sandboxes = config.state_dir.join("sandboxes");
        std::fs::create_dir_all(&sandboxes).map_err(|source| ConfigError::StateDir {
            path: sandboxes.clone(),
            source,
        })?;
        config::restrict_state_dir(&config.state_dir)?;
        let ruleset_replaced = firewall::ensure_ruleset(
            &config.bridge,
            config.gateway,
            config.subnet_prefix,
            config.egress_proxy_port,
            &config.server_addresses,
        )
        .map_err(|e| ConfigError::Firewall(crate::error_chain(&e)))?;
        if ruleset_replaced {
            tracing::info!("installed the sandbox firewall tables (new, or replacing another version's): adopted sandboxes get their network rules again");
        }
        let egress_proxy = EgressProxy::start(EgressProxyConfig {
            listen: SocketAddrV4::new(config.gateway, config.egress_proxy_port),
            resolvers: config.egress_resolvers.clone(),
            denied: firewall::always_denied(&config.bridge),
            ca_dir: config.state_dir.join("egress-ca"),
            upstream_ca: config.egress_upstream_ca.clone(),
        })
        .map_err(|e| ConfigError::Firewall(crate::error_chain(&e)))?;
        let addresses = AddressPool::new(
            &config.state_dir,
            &config.bridge,
            config.gateway,
            config.subnet_prefix,
        );
        let checkpointer = Checkpointer::probe();
        if let Some(why) = checkpointer.unavailable_reason() {
            tracing::info!(reason = %why, "checkpoints disabled (pause falls back to freeze)");
        }
        let lxcfs = match crate::rootfs::lxcfs::ensure(&config.state_dir) {
            Ok(mount) => Some(mount),
            Err(error) => {
                tracing::warn!(error = %crate::error_chain(&error), "sandboxes see the host's /proc/meminfo and cpuinfo");
                None
            }
        };
        let standbys = StandbyPool::start(&supervisor_binary, config.standby_supervisors);
        Ok(Self {
            config,
            supervisor_binary,
            standbys,
            ruleset_replaced,
            lxcfs,
            cgroups,
            addresses,
            checkpointer,
            cpu_samples: Mutex::new(HashMap::new()),
            process_samples: Mutex::new(HashMap::new()),
            egress_proxy,
        })
    }

    pub fn config(&self) -> &LinuxRuntimeConfig {
        &self.config
    }

    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.config.state_dir.join("sandboxes").join(id)
    }

    fn record(&self, id: &str) -> Result<SandboxRecord, RuntimeError> {
        validate_id(id)?;
        SandboxRecord::read(&self.sandbox_dir(id))
            .map_err(internal(format!("read the state of sandbox {id}")))?
            .ok_or_else(|| RuntimeError::NotFound(id.to_string()))
    }

    /// The record of a sandbox whose init is alive.
    fn live_record(&self, id: &str) -> Result<SandboxRecord, RuntimeError> {
        let record = self.record(id)?;
        if !record.init_alive() {
            return Err(RuntimeError::NotFound(id.to_string()));
        }
        Ok(record)
    }

    fn cgroup(&self, id: &str) -> SandboxCgroup {
        self.cgroups.sandbox(id)
    }

    fn sandbox_of(&self, record: &SandboxRecord) -> Sandbox {
        let frozen = self.cgroup(&record.id).is_frozen().unwrap_or(false);
        Sandbox {
            id: record.id.clone(),
            ip: record.ip,
            init_pid: record.init_pid,
            state: if frozen {
                RuntimeState::Frozen
            } else {
                RuntimeState::Running
            },
            created_at: record.created_at(),
        }
    }

    /// Leases an address whose veth name is not in use on the host (another runtime with its own state
    /// dir may share the bridge).
    fn allocate_ip(&self, id: &str) -> Result<Ipv4Addr, RuntimeError> {
        let mut skipped = Vec::new();
        let result = loop {
            let ip = self.addresses.allocate(id).map_err(address_error)?;
            if !network::host_link_exists(&network::veth_name("wv", ip)) {
                break Ok(ip);
            }
            skipped.push(ip);
            if skipped.len() > 256 {
                break Err(RuntimeError::ResourceExhausted {
                    context: "no free sandbox address: veth names taken".into(),
                    source: None,
                });
            }
        };
        for ip in skipped {
            let _ = self.addresses.release(ip, id);
        }
        result
    }

    /// The address of a sandbox being restored: its old one when it resumes under its own ID and the
    /// address is still free, a new one otherwise (fork, template start).
    fn restore_ip(
        &self,
        spec: &SandboxSpec,
        manifest: &Manifest,
    ) -> Result<Ipv4Addr, RuntimeError> {
        if manifest.sandbox_id == spec.id
            && !network::host_link_exists(&network::veth_name("wv", manifest.ip))
            && self
                .addresses
                .lease_exact(manifest.ip, &spec.id)
                .map_err(internal("lease the checkpoint's address"))?
        {
            return Ok(manifest.ip);
        }
        self.allocate_ip(&spec.id)
    }

    /// Where restores under a new ID keep verified, unpacked checkpoint images.
    fn image_cache(&self) -> PathBuf {
        self.config.state_dir.join("cache").join("images")
    }

    /// Where seeded layer images are kept (see [`LayerDisk::create_seeded`]).
    fn seed_cache(&self) -> PathBuf {
        self.config.state_dir.join("cache").join("layers")
    }

    /// Makes the sandbox's writable layer: empty, or holding the layer saved in a checkpoint. A
    /// checkpoint started under another ID (a template's, a fork's, a snapshot's) is usually
    /// started many times: its layer is unpacked once into a seeded image that each such sandbox
    /// copies. A resume, the only start of its checkpoint, unpacks into its own disk.
    fn create_layer(
        &self,
        spec: &SandboxSpec,
        disk: &LayerDisk,
        saved: Option<(&Path, &Manifest)>,
    ) -> Result<(), RuntimeError> {
        let images = self.config.state_dir.join("images");
        let failed = || format!("create the writable layer of sandbox {}", spec.id);
        match saved {
            Some((checkpoint, manifest)) if manifest.sandbox_id != spec.id => {
                let extract = |upper: &Path| {
                    checkpoint::store::extract_layer(checkpoint, &manifest.layer, upper)
                };
                disk.create_seeded(
                    spec.resources.disk_mib,
                    &images,
                    &self.seed_cache(),
                    &manifest.layer.sha256,
                    extract,
                )
                .map_err(|error| match error {
                    SeedError::Disk(error) => internal(failed())(error),
                    SeedError::Fill(error) => checkpoint_error(error),
                })
            }
            Some((checkpoint, manifest)) => {
                disk.create(spec.resources.disk_mib, &images)
                    .map_err(internal(failed()))?;
                checkpoint::store::extract_layer(checkpoint, &manifest.layer, &disk.upper())
                    .map_err(checkpoint_error)
            }
            None => disk
                .create(spec.resources.disk_mib, &images)
                .map_err(internal(failed())),
        }
    }

    /// Builds sandbox `spec.id` in `dir`: a fresh one, or (with `restore`) one whose layer and
    /// processes come from a checkpoint.
    fn create_inner(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        start: Start<'_>,
    ) -> Result<Sandbox, RuntimeError> {
        let restore = match start {
            Start::Restore(checkpoint, manifest) => Some((checkpoint, manifest)),
            Start::Fresh | Start::FromDisk(_) => None,
        };
        let started = Instant::now();
        for bind in &spec.volumes {
            // A plain directory here would bind the host's directory instead of the volume.
            if !crate::rootfs::layer_disk::is_mount_point(&bind.source) {
                return Err(RuntimeError::InvalidSpec(format!(
                    "volume source {} is not mounted",
                    bind.source.display()
                )));
            }
        }
        let ip = match restore {
            Some((_, manifest)) => self.restore_ip(spec, manifest)?,
            None => self.allocate_ip(&spec.id)?,
        };
        let cgroup = self
            .cgroups
            .create(&spec.id, &spec.resources)
            .map_err(internal(format!(
                "create the cgroups of sandbox {}",
                spec.id
            )))?;
        self.cap_sandbox_tasks();
        let cgroups_done = started.elapsed();
        let disk = LayerDisk::at(dir);
        let booted_from;
        let saved_layer = match start {
            Start::Restore(checkpoint, manifest) => Some((checkpoint, manifest)),
            Start::FromDisk(checkpoint) => {
                booted_from = Manifest::read(checkpoint).map_err(checkpoint_error)?;
                Some((checkpoint, &booted_from))
            }
            Start::Fresh => None,
        };
        self.create_layer(spec, &disk, saved_layer)?;
        let mut restore_plan = None;
        match restore {
            Some((checkpoint, manifest)) => {
                if manifest.sandbox_id != spec.id || manifest.ip != ip {
                    // A copy under a new name or address: its /etc/hostname and /etc/hosts follow.
                    disk.seed(&spec.id, ip)
                        .map_err(internal(format!("seed the layer of sandbox {}", spec.id)))?;
                }
                let criu = self.checkpointer.criu_found().ok_or_else(|| {
                    RuntimeError::Unsupported(
                        "restore needs CRIU, which does not work on this host".into(),
                    )
                })?;
                restore_plan = Some(RestorePlan {
                    checkpoint: checkpoint.to_path_buf(),
                    work_dir: dir.join("restore"),
                    criu_binary: criu.binary().to_path_buf(),
                    criu_version: criu.version().to_string(),
                    // A copy under a new name (template start, fork) is one of many restores of
                    // the same checkpoint; a resume is the only one of its pause checkpoint.
                    image_cache: (manifest.sandbox_id != spec.id).then(|| self.image_cache()),
                    lazy: self.config.lazy_restore,
                });
            }
            None => disk
                .seed(&spec.id, ip)
                .map_err(internal(format!("seed the layer of sandbox {}", spec.id)))?,
        }
        let rootfs = dir.join("rootfs");
        std::fs::create_dir(&rootfs).map_err(io_error(format!("create {}", rootfs.display())))?;
        let network_plan = NetworkPlan {
            bridge: self.config.bridge.clone(),
            gateway: self.config.gateway,
            prefix: self.config.subnet_prefix,
            ip,
        };
        // The port binding and the sandbox's rules are in place before its link can come up.
        firewall::admit(&network_plan, &spec.network).map_err(internal(format!(
            "admit sandbox {} to the firewall",
            spec.id
        )))?;
        self.egress_proxy.set_rules(ip, &spec.network.egress);
        let overlay = sandbox_mounts::OverlayPlan::new(&spec.layers, &disk.upper(), &disk.work())
            .map_err(internal("plan the overlay"))?;
        let supervisor_config = SupervisorConfig {
            id: spec.id.clone(),
            sandbox_dir: dir.to_path_buf(),
            rootfs,
            overlay,
            agent_binary: self.config.agent_binary.clone(),
            cgroup_procs: cgroup.procs_files(),
            netns_pin: dir.join("netns"),
            network: network_plan,
            no_new_privs: self.config.no_new_privs,
            net_raw: spec.network.raw_sockets,
            syscalls: spec.syscalls,
            restore: restore_plan,
            lxcfs: self.lxcfs.clone(),
            volumes: spec.volumes.clone(),
        };
        let prepared = started.elapsed();
        let config_path = supervisor_config
            .write()
            .map_err(internal("write the supervisor config"))?;
        crate::supervisor::deadline::write(
            dir,
            now_unix_ms() + crate::supervisor::deadline::INITIAL_LEASE_MS,
        )
        .map_err(io_error(format!("write the deadline of {}", spec.id)))?;
        let launched = self
            .launch_supervisor(&config_path, &dir.join("supervisor.log"))
            .map_err(internal(format!(
                "start the supervisor of sandbox {}",
                spec.id
            )))?;
        let record = SandboxRecord {
            id: spec.id.clone(),
            ip,
            init_pid: launched.init_pid,
            init_start_ticks: process_table::start_ticks(launched.init_pid).unwrap_or(0),
            supervisor_pid: launched.supervisor_pid,
            created_at_unix_ms: now_unix_ms(),
            layers: spec.layers.clone(),
            disk_mib: spec.resources.disk_mib,
            allow_internet: spec.network.allow_internet,
            volumes: spec.volumes.clone(),
        };
        record
            .write(dir)
            .map_err(internal(format!("write the state of sandbox {}", spec.id)))?;
        let launched_at = started.elapsed();
        if restore.is_some() {
            // The supervisor kept the host side down while CRIU restored the sockets.
            let host = network::veth_name("wv", ip);
            network::set_host_link(&host, true)
                .map_err(internal(format!("bring {host} up after restore")))?;
            forget_neighbour(&self.config.bridge, ip);
        }
        if let Err(error) = self.wait_for_agent(&record, &disk) {
            // A lazy restore that found a damaged page ended the tree: that is the reason to give.
            if let Ok(why) =
                std::fs::read_to_string(dir.join(crate::supervisor::RESTORE_FAILED_FILE))
            {
                return Err(RuntimeError::failed(format!(
                    "the lazy restore of sandbox {} failed and its processes were ended: {}",
                    spec.id,
                    why.trim()
                )));
            }
            return Err(error);
        }
        tracing::debug!(
            sandbox = %spec.id,
            restore = restore.is_some(),
            cgroups_ms = cgroups_done.as_secs_f64() * 1e3,
            layer_ms = (prepared - cgroups_done).as_secs_f64() * 1e3,
            supervisor_ms = (launched_at - prepared).as_secs_f64() * 1e3,
            agent_ms = (started.elapsed() - launched_at).as_secs_f64() * 1e3,
            "sandbox started"
        );
        Ok(self.sandbox_of(&record))
    }

    /// Starts the supervisor of the sandbox configured at `config_path`: a standby one when the pool
    /// has one ready (a standby found dead is passed over), else a new process.
    fn launch_supervisor(
        &self,
        config_path: &Path,
        log: &Path,
    ) -> Result<Launched, SupervisorError> {
        while let Some(standby) = self.standbys.take() {
            let handed = standby.hand(config_path, self.config.agent_timeout);
            // Refilled once this sandbox's set-up no longer needs the CPU.
            self.standbys.top_up();
            match handed {
                Ok(launched) => return Ok(launched),
                Err(HandError::Gone) => continue,
                Err(HandError::Failed(error)) => return Err(error),
            }
        }
        supervisor::launch(
            &self.supervisor_binary,
            config_path,
            log,
            self.config.agent_timeout,
        )
    }

    /// The pids of the supervisors waiting in the standby pool (for tests and leftover checks).
    pub fn standby_supervisor_pids(&self) -> Vec<u32> {
        self.standbys.pids()
    }

    /// Waits until the agent accepts TCP connections, or fails with the tail of its log.
    fn wait_for_agent(&self, record: &SandboxRecord, disk: &LayerDisk) -> Result<(), RuntimeError> {
        let addr = SocketAddr::from((record.ip, AGENT_PORT));
        let started = Instant::now();
        let deadline = started + self.config.agent_timeout;
        let mut pause = Duration::from_micros(250);
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            let gone = !record.init_alive();
            if gone || Instant::now() > deadline {
                // The log is on the sandbox's own layer: read it confined (a symlink there must not
                // pull a host file into the error message; a FIFO must not hang us).
                let log = ConfinedDir::open_root(&disk.upper())
                    .and_then(|upper| {
                        upper.read_tail(
                            Path::new(sandbox_mounts::AGENT_LOG.trim_start_matches('/')),
                            16 * 1024,
                        )
                    })
                    .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                    .unwrap_or_default();
                let tail: String = log
                    .lines()
                    .rev()
                    .take(10)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                let what = if gone {
                    "exited"
                } else {
                    "did not accept connections in time"
                };
                return Err(RuntimeError::failed(format!(
                    "agent of sandbox {} {what} ({addr}); agent log: {tail}",
                    record.id
                )));
            }
            std::thread::sleep(pause);
            // A refused connect on the bridge costs microseconds, so poll tightly while a normal
            // start is still plausible and back off only for an agent that is slow to come up.
            let ceiling = if started.elapsed() < Duration::from_millis(200) {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(20)
            };
            pause = (pause * 2).min(ceiling);
        }
    }

    /// Removes everything of sandbox `id` that exists, in reverse order of creation. Idempotent.
    /// A running sandbox whose supervisor is gone (killed from outside) gets a new one, so that its
    /// dead man's switch holds again; returns the record as it is now. A failure is logged and the
    /// sandbox is left as it is: it still runs, and the next pass tries again.
    fn keep_supervised(&self, mut record: SandboxRecord, dir: &Path) -> SandboxRecord {
        if crash_recovery::is_supervisor(record.supervisor_pid, dir) {
            return record;
        }
        // One that is still building the sandbox (a restore) counts too.
        if let Some(pid) = crash_recovery::supervisors_of(dir).first() {
            record.supervisor_pid = *pid;
            return record;
        }
        let log = dir.join("supervisor.log");
        match crate::supervisor::adopt_running(&self.supervisor_binary, record.init_pid, dir, &log)
        {
            Ok(pid) => {
                tracing::warn!(sandbox = %record.id, old = record.supervisor_pid, new = pid, "the sandbox's supervisor was gone; a new one watches it");
                record.supervisor_pid = pid;
                if let Err(error) = record.write(dir) {
                    tracing::warn!(sandbox = %record.id, %error, "cannot record the new supervisor");
                }
            }
            Err(error) => {
                tracing::warn!(sandbox = %record.id, %error, "cannot start a new supervisor for the sandbox");
            }
        }
        record
    }

    /// What a dump of sandbox `id` into `dest` reads from: its freezer and its runtime layer. `dest`
    /// may not lie inside the sandbox's own directory (its teardown would take the checkpoint along).
    fn dump_sources(
        &self,
        id: &str,
        dest: &Path,
    ) -> Result<(FreezerCgroup, PathBuf), RuntimeError> {
        let dir = self.sandbox_dir(id);
        if dest.starts_with(&dir) {
            return Err(RuntimeError::InvalidSpec(format!(
                "checkpoint destination {} lies inside the sandbox's own directory",
                dest.display()
            )));
        }
        let freezer =
            FreezerCgroup::at(&self.cgroup(id).freezer_dir()).map_err(checkpoint_error)?;
        Ok((freezer, LayerDisk::at(&dir).upper()))
    }

    /// Makes the new sandbox's directory and starts it; on failure whatever was made goes again.
    fn start_new(&self, spec: &SandboxSpec, start: Start<'_>) -> Result<Sandbox, RuntimeError> {
        let dir = self.sandbox_dir(&spec.id);
        if self.cgroup(&spec.id).exists() {
            return Err(RuntimeError::AlreadyExists(spec.id.clone()));
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(RuntimeError::AlreadyExists(spec.id.clone()))
            }
            Err(e) => return Err(io_error(format!("create {}", dir.display()))(e)),
        }
        match self.create_inner(spec, &dir, start) {
            Ok(sandbox) => Ok(sandbox),
            Err(error) => {
                if let Err(cleanup) = self.teardown(&spec.id) {
                    tracing::warn!(sandbox = %spec.id, error = %cleanup, "cleanup after failed start");
                }
                Err(error)
            }
        }
    }

    fn teardown(&self, id: &str) -> Result<(), RuntimeError> {
        let dir = self.sandbox_dir(id);
        let record = SandboxRecord::read(&dir).ok().flatten();
        let cgroup = self.cgroup(id);
        if let Some(record) = &record {
            if record.init_alive() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(record.init_pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        cgroup
            .kill_all()
            .map_err(internal(format!("kill the tasks of sandbox {id}")))?;
        if let Some(record) = &record {
            wait_supervisor_exit(record.supervisor_pid);
        }
        // A restore that never finished (no record) or whose memory was still arriving can have
        // left its helpers running: children of a supervisor that may be gone, outside the
        // sandbox's cgroup. Its tree is dead now, so no thread can fault on a page they hold.
        if record.is_none() || dir.join(crate::supervisor::PAGES_PENDING_FILE).exists() {
            let killed = crash_recovery::wait_then_kill(
                || crash_recovery::restore_helpers_of(&dir),
                Duration::ZERO,
            );
            if killed > 0 {
                tracing::warn!(sandbox = %id, killed, "killed the helpers of an unfinished restore");
            }
        }
        let leases = self.addresses.leases_of(id);
        // The bindings go first (nothing of the sandbox runs any more), before the address is
        // released: a later holder's binding must not be the one a late withdrawal deletes.
        for ip in &leases {
            let plan = NetworkPlan {
                bridge: self.config.bridge.clone(),
                gateway: self.config.gateway,
                prefix: self.config.subnet_prefix,
                ip: *ip,
            };
            if let Err(e) = firewall::withdraw(&plan) {
                // The tables are gone (flushed by hand): nothing of the sandbox is left in them
                // either.
                tracing::warn!(sandbox = %id, error = %crate::error_chain(&e), "withdraw the port binding");
            }
            self.egress_proxy.remove(*ip);
            delete_host_link(&plan.host_veth())?;
        }
        namespaces::remove_pinned_netns(&dir.join("netns")).map_err(internal(format!(
            "remove the network namespace of sandbox {id}"
        )))?;
        LayerDisk::at(&dir)
            .unmount()
            .map_err(internal(format!("unmount the layer of sandbox {id}")))?;
        cgroup
            .remove()
            .map_err(internal(format!("remove the cgroups of sandbox {id}")))?;
        for ip in leases {
            self.addresses.release(ip, id).map_err(internal(format!(
                "release the address {ip} of sandbox {id}"
            )))?;
        }
        remove_sandbox_dir(&dir)?;
        if let Ok(mut samples) = self.cpu_samples.lock() {
            samples.remove(id);
        }
        if let Ok(mut samples) = self.process_samples.lock() {
            samples.remove(id);
        }
        Ok(())
    }

    /// Sandbox IDs present in this runtime's state dir. Cgroups alone do not count: other runtimes
    /// (other state dirs) share the `warren` cgroup parent, and their sandboxes are not ours to judge.
    fn known_ids(&self) -> Vec<String> {
        let sandboxes = self.config.state_dir.join("sandboxes");
        let mut ids: Vec<String> = std::fs::read_dir(sandboxes)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect();
        ids.sort();
        ids
    }

    fn cpu_percent(&self, id: &str, usage_usec: u64) -> f64 {
        let now = Instant::now();
        let earlier = self
            .cpu_samples
            .lock()
            .ok()
            .and_then(|s| s.get(id).copied());
        let (then, before) = match earlier {
            Some((then, before))
                if now - then >= Duration::from_millis(50) && now - then < SAMPLE_MAX_AGE =>
            {
                (then, before)
            }
            _ => {
                std::thread::sleep(CPU_SAMPLE_WINDOW);
                let before = usage_usec;
                let after = self.cgroup(id).cpu_usage_usec().unwrap_or(before);
                let taken = Instant::now();
                if let Ok(mut samples) = self.cpu_samples.lock() {
                    samples.insert(id.to_string(), (taken, after));
                }
                // Divide by the time that really passed: on a busy host the sleep overruns the window,
                // and the nominal window would then report more than the quota allows.
                return (after.saturating_sub(before)) as f64
                    / (taken - now).as_micros().max(1) as f64
                    * 100.0;
            }
        };
        if let Ok(mut samples) = self.cpu_samples.lock() {
            samples.insert(id.to_string(), (now, usage_usec));
        }
        usage_usec.saturating_sub(before) as f64 / (now - then).as_micros().max(1) as f64 * 100.0
    }

    /// Host PID of the process the sandbox calls `pid`.
    fn host_pid_of(&self, id: &str, pid: u32) -> Result<u32, RuntimeError> {
        let host_pids = self
            .cgroup(id)
            .pids()
            .map_err(internal(format!("list the tasks of sandbox {id}")))?;
        host_pids
            .into_iter()
            .find(|host| {
                process_table::read_host_process(*host).is_some_and(|p| p.sandbox_pid == pid)
            })
            .ok_or_else(|| RuntimeError::ProcessNotFound {
                sandbox: id.to_string(),
                pid,
            })
    }
}

/// IDs become hostnames, directory and cgroup names: keep them to a safe alphabet.
/// Bytes received and sent by host link `name` (0 when it cannot be read).
fn link_bytes(name: &str) -> (u64, u64) {
    let read = |counter: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{name}/statistics/{counter}"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    };
    (read("rx_bytes"), read("tx_bytes"))
}

fn validate_id(id: &str) -> Result<(), RuntimeError> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !id.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::InvalidSpec(format!(
            "invalid sandbox id {id:?}: use 1-63 letters, digits, '-', '_' or '.', not starting with '.' or '-'"
        )))
    }
}

fn validate_spec(spec: &SandboxSpec) -> Result<(), RuntimeError> {
    validate_id(&spec.id)?;
    if spec.layers.is_empty() {
        return Err(RuntimeError::InvalidSpec(
            "a sandbox needs at least one rootfs layer".into(),
        ));
    }
    for layer in &spec.layers {
        if !layer.is_dir() {
            return Err(RuntimeError::InvalidSpec(format!(
                "rootfs layer {} is not a directory",
                layer.display()
            )));
        }
    }
    let r = &spec.resources;
    if !r.vcpus.is_finite() || r.vcpus < 0.0 {
        return Err(RuntimeError::InvalidSpec(format!(
            "invalid vcpus {}",
            r.vcpus
        )));
    }
    if r.memory_mib < 16 {
        return Err(RuntimeError::InvalidSpec(format!(
            "memory_mib {} is below the 16 MiB minimum",
            r.memory_mib
        )));
    }
    if r.disk_mib < 16 {
        return Err(RuntimeError::InvalidSpec(format!(
            "disk_mib {} is below the 16 MiB minimum",
            r.disk_mib
        )));
    }
    Ok(())
}

/// Drops the host's ARP entry for `ip`: a sandbox resumed at its old address has a new veth (a new
/// MAC), and a stale entry black-holes the first packets until the kernel re-probes (about 5 s).
/// Over netlink, from a thread of its own (the caller may be inside a tokio runtime).
fn forget_neighbour(bridge: &str, ip: Ipv4Addr) {
    let bridge = bridge.to_string();
    let forgotten = std::thread::spawn(move || {
        netlink::run(async { Netlink::connect()?.delete_neighbour(&bridge, ip).await })
    })
    .join()
    .unwrap_or(Err(netlink::NetlinkError::Panicked));
    if let Err(e) = forgotten {
        tracing::debug!(%ip, error = %crate::error_chain(&e), "forget the neighbour");
    }
}

/// Deletes a host link through netlink, on a thread of its own (the caller may be inside a tokio runtime).
fn delete_host_link(name: &str) -> Result<(), RuntimeError> {
    if !network::host_link_exists(name) {
        return Ok(());
    }
    let name = name.to_string();
    std::thread::spawn(move || netlink::run(async { Netlink::connect()?.delete_link(&name).await }))
        .join()
        .map_err(|_| RuntimeError::failed("netlink thread panicked"))?
        .map_err(internal("delete a host link"))
}

/// Waits (bounded) for a sandbox's supervisor to exit after its init died.
fn wait_supervisor_exit(pid: u32) {
    let is_supervisor = || {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains("warren-supervisor"))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while is_supervisor() && Instant::now() < deadline {
        // A zombie supervisor (reparented to an init that reaps late) holds nothing.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if state
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl LinuxRuntime {
    /// Keeps Warren's parent cgroup at the host's task capacity for sandboxes (see
    /// [`crate::host_capacity`]); a failure only loses that backstop, so it is logged.
    fn cap_sandbox_tasks(&self) {
        let capped = crate::host_capacity::measure(&self.config.state_dir, [])
            .map_err(|e| crate::error_chain(&e))
            .and_then(|facts| {
                self.cgroups
                    .cap_sandbox_tasks(facts.capacity().sandbox_tasks)
                    .map_err(|e| crate::error_chain(&e))
            });
        if let Err(error) = capped {
            tracing::warn!(%error, "cannot cap the tasks of all sandboxes together");
        }
    }
}

impl Runtime for LinuxRuntime {
    fn renew(&self, id: &str, until_unix_ms: u64) -> Result<(), RuntimeError> {
        self.live_record(id)?;
        crate::supervisor::deadline::write(&self.sandbox_dir(id), until_unix_ms)
            .map_err(io_error(format!("renew the deadline of {id}")))
    }

    fn host_capacity(&self) -> Result<HostCapacity, RuntimeError> {
        let images = self
            .known_ids()
            .into_iter()
            .map(|id| LayerDisk::at(&self.sandbox_dir(&id)).image);
        crate::host_capacity::measure(&self.config.state_dir, images)
            .map(|facts| facts.capacity())
            .map_err(internal("measure the host's capacity"))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cgroup_version: match self.cgroups.version() {
                CgroupVersion::V1 => 1,
                CgroupVersion::V2 => 2,
            },
            checkpoint: self.checkpointer.available(),
        }
    }

    fn create(&self, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        validate_spec(spec)?;
        self.start_new(spec, Start::Fresh)
    }

    fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
        validate_id(id)?;
        if !self.sandbox_dir(id).exists() && !self.cgroup(id).exists() {
            return Err(RuntimeError::NotFound(id.to_string()));
        }
        self.teardown(id)
    }

    fn freeze(&self, id: &str) -> Result<(), RuntimeError> {
        self.live_record(id)?;
        self.cgroup(id)
            .freeze()
            .map_err(internal(format!("freeze sandbox {id}")))
    }

    fn thaw(&self, id: &str) -> Result<(), RuntimeError> {
        self.live_record(id)?;
        self.cgroup(id)
            .thaw()
            .map_err(internal(format!("thaw sandbox {id}")))
    }

    fn stats(&self, id: &str) -> Result<Stats, RuntimeError> {
        let record = self.live_record(id)?;
        let cgroup = self.cgroup(id);
        let cpu_usage_usec = cgroup
            .cpu_usage_usec()
            .map_err(internal(format!("read the CPU use of sandbox {id}")))?;
        let (memory_bytes, memory_limit_bytes) = cgroup
            .memory()
            .map_err(internal(format!("read the memory use of sandbox {id}")))?;
        let (disk_used_bytes, disk_limit_bytes) = LayerDisk::at(&self.sandbox_dir(id))
            .usage()
            .unwrap_or((0, record.disk_mib * 1024 * 1024));
        let cpu_percent = self.cpu_percent(id, cpu_usage_usec);
        // The host's end of the veth: what it receives, the sandbox sent.
        let (mut net_rx_bytes, mut net_tx_bytes) = (0, 0);
        for ip in self.addresses.leases_of(id) {
            let plan = NetworkPlan {
                bridge: self.config.bridge.clone(),
                gateway: self.config.gateway,
                prefix: self.config.subnet_prefix,
                ip,
            };
            let (host_rx, host_tx) = link_bytes(&plan.host_veth());
            net_rx_bytes += host_tx;
            net_tx_bytes += host_rx;
        }
        Ok(Stats {
            cpu_usage_usec,
            cpu_percent,
            memory_bytes,
            memory_limit_bytes,
            disk_used_bytes,
            disk_limit_bytes,
            pids: cgroup
                .pids_current()
                .map_err(internal(format!("count the tasks of sandbox {id}")))?,
            oom_kills: cgroup.oom_kills().unwrap_or(0),
            memory_cache_bytes: cgroup.memory_cache().unwrap_or(0),
            net_rx_bytes,
            net_tx_bytes,
        })
    }

    fn largest_files(
        &self,
        id: &str,
        count: usize,
    ) -> Result<Vec<crate::rootfs::disk_usage::LargeFile>, RuntimeError> {
        self.live_record(id)?;
        let disk = LayerDisk::at(&self.sandbox_dir(id));
        if !disk.is_mounted() {
            return Err(RuntimeError::Busy {
                context: format!("the writable layer of sandbox {id} is not mounted"),
                source: None,
            });
        }
        crate::rootfs::disk_usage::largest_files(&disk.upper(), count, LARGEST_FILES_BUDGET)
            .map_err(internal(format!("walk the writable layer of sandbox {id}")))
    }

    fn processes(&self, id: &str) -> Result<Vec<ProcessInfo>, RuntimeError> {
        let record = self.live_record(id)?;
        let host_pids = self
            .cgroup(id)
            .pids()
            .map_err(internal(format!("list the tasks of sandbox {id}")))?;
        let now = Instant::now();
        let earlier = self
            .process_samples
            .lock()
            .ok()
            .and_then(|mut s| s.remove(id));
        let (then, before) = match earlier {
            Some((then, before))
                if now - then >= Duration::from_millis(50) && now - then < SAMPLE_MAX_AGE =>
            {
                (then, before)
            }
            _ => {
                let (then, before) = process_table::cpu_sample(&host_pids);
                std::thread::sleep(CPU_SAMPLE_WINDOW);
                (then, before)
            }
        };
        let (list, sample) =
            process_table::process_list(&host_pids, record.init_pid, &before, then.elapsed());
        if let Ok(mut samples) = self.process_samples.lock() {
            samples.insert(id.to_string(), (Instant::now(), sample));
        }
        Ok(list)
    }

    fn kill_process(&self, id: &str, pid: u32, signal: i32) -> Result<(), RuntimeError> {
        self.live_record(id)?;
        let signal = nix::sys::signal::Signal::try_from(signal)
            .map_err(|_| RuntimeError::InvalidSpec(format!("invalid signal number {signal}")))?;
        let host_pid = self.host_pid_of(id, pid)?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(host_pid as i32), signal)
            .map_err(internal(format!("kill process {pid} in sandbox {id}")))
    }

    fn egress_trust_anchor(&self, _id: &str) -> Option<String> {
        Some(self.egress_proxy.ca_pem().to_string())
    }

    fn check_network(&self, network: &crate::NetworkSpec) -> Result<(), RuntimeError> {
        match &network.egress.upstream {
            Some(upstream) => self
                .egress_proxy
                .check_upstream(upstream)
                .map_err(RuntimeError::InvalidSpec),
            None => Ok(()),
        }
    }

    fn network_rules_replaced(&self) -> bool {
        self.ruleset_replaced
    }

    fn set_network(&self, id: &str, network: &crate::NetworkSpec) -> Result<(), RuntimeError> {
        let record = self.live_record(id)?;
        // The proxy gets the new names first when names are added (nft then starts redirecting to
        // it) and last when they go: at no point is a redirected connection judged by stale rules
        // that allow more than either the old or the new ones.
        if network.egress.needs_proxy() {
            self.egress_proxy.set_rules(record.ip, &network.egress);
        }
        firewall::set_network(record.ip, network)
            .map_err(internal(format!("set the network of sandbox {id}")))?;
        self.egress_proxy.set_rules(record.ip, &network.egress);
        Ok(())
    }

    fn list(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        let mut sandboxes = Vec::new();
        for id in self.known_ids() {
            if validate_id(&id).is_err() {
                continue;
            }
            let dir = self.sandbox_dir(&id);
            match SandboxRecord::read(&dir) {
                Ok(Some(record)) if record.init_alive() => {
                    let record = self.keep_supervised(record, &dir);
                    sandboxes.push(self.sandbox_of(&record));
                }
                Ok(None)
                    if dir
                        .metadata()
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t.elapsed().unwrap_or_default() < CREATE_GRACE) => {}
                // Dead init or a corrupt record: nothing of ours runs there; reclaim what is left.
                _ => {
                    if let Err(error) = self.teardown(&id) {
                        tracing::warn!(sandbox = %id, %error, "reclaiming a dead sandbox");
                    }
                }
            }
        }
        Ok(sandboxes)
    }

    fn recover(&self) -> Result<Vec<Sandbox>, RuntimeError> {
        let mut sandboxes = Vec::new();
        for id in self.known_ids() {
            if validate_id(&id).is_err() {
                continue;
            }
            let dir = self.sandbox_dir(&id);
            match SandboxRecord::read(&dir) {
                Ok(Some(record)) if record.init_alive() => {
                    let dumps = || crash_recovery::dumps_of(record.init_pid);
                    let killed = crash_recovery::wait_then_kill(dumps, crash_recovery::DUMP_WAIT);
                    if killed > 0 {
                        tracing::warn!(sandbox = %id, killed, "killed a checkpoint dump that did not end");
                    }
                    if record.init_alive() {
                        // No dump runs any more: whatever network lock is left is stale.
                        let host = network::veth_name("wv", record.ip);
                        network::set_host_link(&host, true)
                            .map_err(internal(format!("bring {host} up after a restart")))?;
                        let record = self.keep_supervised(record, &dir);
                        sandboxes.push(self.sandbox_of(&record));
                        continue;
                    }
                }
                Ok(Some(record)) => {
                    // The init is dead, but a dump of it that the dead server started can live on:
                    // CRIU was seen asleep for minutes over a tree that was gone. Nobody will read
                    // its images.
                    let dumps = || crash_recovery::dumps_of(record.init_pid);
                    let killed = crash_recovery::wait_then_kill(dumps, Duration::ZERO);
                    if killed > 0 {
                        tracing::warn!(sandbox = %id, killed, "killed a checkpoint dump of a dead sandbox");
                    }
                }
                Ok(None) => {
                    // A create or restore whose caller died: its supervisor may still be building it.
                    crash_recovery::wait_then_kill(
                        || crash_recovery::supervisors_of(&dir),
                        Duration::ZERO,
                    );
                }
                Err(_) => {}
            }
            tracing::info!(sandbox = %id, "reclaiming what a dead or unfinished sandbox left");
            if let Err(error) = self.teardown(&id) {
                tracing::warn!(sandbox = %id, %error, "reclaiming a dead sandbox");
            }
        }
        Ok(sandboxes)
    }

    fn checkpoint(
        &self,
        id: &str,
        dest: &Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let record = self.live_record(id)?;
        // A tree whose memory is still arriving is dumped once it is all in.
        self.memory_settled(id)?;
        if !self.checkpointer.available() {
            return Err(checkpoint_error(CheckpointError::CriuUnavailable(
                self.checkpointer
                    .unavailable_reason()
                    .unwrap_or("no criu")
                    .to_string(),
            )));
        }
        let (freezer, upper) = self.dump_sources(id, dest)?;
        let volume_targets: Vec<PathBuf> = record
            .volumes
            .iter()
            .map(|bind| bind.target.clone())
            .collect();
        let target = DumpTarget {
            sandbox_id: id,
            ip: record.ip,
            init_pid: record.init_pid,
            freezer,
            upper: &upper,
            layers: &record.layers,
            volume_targets: &volume_targets,
        };
        // The network is locked for the dump by holding the veth's host side down.
        let host = network::veth_name("wv", record.ip);
        network::set_host_link(&host, false)
            .map_err(internal(format!("lock the network ({host} down)")))?;
        let dumped = self.checkpointer.dump(&target, dest, leave_running);
        if leave_running || dumped.is_err() {
            if let Err(e) = network::set_host_link(&host, true) {
                tracing::warn!(sandbox = %id, error = %e, "bring {host} up after the checkpoint");
            }
        }
        let dumped = dumped.map_err(checkpoint_error)?;
        tracing::info!(
            sandbox = %id,
            bytes = dumped.info.size_bytes,
            frozen_ms = dumped.timings.frozen.as_millis() as u64,
            total_ms = dumped.timings.total.as_millis() as u64,
            leave_running,
            "checkpoint written"
        );
        if !leave_running {
            // The checkpoint is complete and durable; the frozen tree goes now. A failing teardown
            // leaves remains that `list` reclaims, not a lost snapshot.
            if let Err(error) = self.teardown(id) {
                tracing::warn!(sandbox = %id, %error, "teardown after pause");
            }
        }
        Ok(dumped.info)
    }

    fn forget_checkpoint(&self, checkpoint: &Path) {
        // Nothing was cached for a checkpoint whose manifest cannot be read.
        if let Ok(manifest) = Manifest::read(checkpoint) {
            crate::rootfs::layer_disk::forget_seeds(&self.seed_cache(), &manifest.layer.sha256);
            checkpoint::store::forget_images(&self.image_cache(), &manifest.images);
        }
    }

    fn memory_settled(&self, id: &str) -> Result<(), RuntimeError> {
        validate_id(id)?;
        let dir = self.sandbox_dir(id);
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        while crate::supervisor::pages_pending(&dir) {
            if started.elapsed() > MEMORY_SETTLE_LIMIT {
                return Err(RuntimeError::failed(format!(
                    "the memory of sandbox {id} is still being restored after {MEMORY_SETTLE_LIMIT:?}"
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        match std::fs::read_to_string(dir.join(crate::supervisor::RESTORE_FAILED_FILE)) {
            Ok(why) => Err(RuntimeError::failed(format!(
                "the lazy restore of sandbox {id} failed and its processes were ended: {}",
                why.trim()
            ))),
            Err(_) => Ok(()),
        }
    }

    fn commit_layer(&self, id: &str, dest: &Path) -> Result<u64, RuntimeError> {
        self.live_record(id)?;
        let cgroup = self.cgroup(id);
        let was_frozen = cgroup
            .is_frozen()
            .map_err(internal(format!("read the freezer of sandbox {id}")))?;
        if !was_frozen {
            cgroup
                .freeze()
                .map_err(internal(format!("freeze sandbox {id}")))?;
        }
        let disk = LayerDisk::at(&self.sandbox_dir(id));
        nix::unistd::sync();
        let result = commit::commit_upper(&disk.upper(), dest)
            .map_err(internal(format!("commit the layer of sandbox {id}")));
        if !was_frozen {
            cgroup
                .thaw()
                .map_err(internal(format!("thaw sandbox {id}")))?;
        }
        result
    }

    fn restore(&self, checkpoint: &Path, spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
        validate_spec(spec)?;
        if !self.checkpointer.available() {
            return Err(checkpoint_error(CheckpointError::CriuUnavailable(
                self.checkpointer
                    .unavailable_reason()
                    .unwrap_or("no criu")
                    .to_string(),
            )));
        }
        let manifest = Manifest::read(checkpoint).map_err(checkpoint_error)?;
        same_layers(checkpoint, &manifest, spec)?;
        if !manifest.memory {
            return Err(RuntimeError::InvalidSpec(format!(
                "checkpoint {} holds the filesystem only; boot it from disk instead",
                checkpoint.display()
            )));
        }
        // The checkpoint is only read: whatever fails here, it stays as it was.
        self.start_new(spec, Start::Restore(checkpoint, &manifest))
    }

    fn checkpoint_disk(
        &self,
        id: &str,
        dest: &Path,
        leave_running: bool,
    ) -> Result<CheckpointInfo, RuntimeError> {
        let record = self.live_record(id)?;
        let (freezer, upper) = self.dump_sources(id, dest)?;
        let target = DumpTarget {
            sandbox_id: id,
            ip: record.ip,
            init_pid: record.init_pid,
            freezer,
            upper: &upper,
            layers: &record.layers,
            // Volumes are mounts beside the runtime layer, never in it: the saved files leave them
            // out, and a boot mounts them again from the sandbox's spec.
            volume_targets: &[],
        };
        let dumped =
            checkpoint::dump_disk(&target, dest, leave_running).map_err(checkpoint_error)?;
        tracing::info!(
            sandbox = %id,
            bytes = dumped.info.size_bytes,
            frozen_ms = dumped.timings.frozen.as_millis() as u64,
            leave_running,
            "filesystem checkpoint written"
        );
        if !leave_running {
            if let Err(error) = self.teardown(id) {
                tracing::warn!(sandbox = %id, %error, "teardown after filesystem pause");
            }
        }
        Ok(dumped.info)
    }

    fn boot_from_disk(
        &self,
        checkpoint: &Path,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, RuntimeError> {
        validate_spec(spec)?;
        let manifest = Manifest::read(checkpoint).map_err(checkpoint_error)?;
        same_layers(checkpoint, &manifest, spec)?;
        // Only the layer archive is read; the checkpoint stays as it was.
        self.start_new(spec, Start::FromDisk(checkpoint))
    }
}

/// A checkpoint's runtime layer lies over the read-only layers it was taken over, and no others.
fn same_layers(
    checkpoint: &Path,
    manifest: &Manifest,
    spec: &SandboxSpec,
) -> Result<(), RuntimeError> {
    if manifest.layers == spec.layers {
        return Ok(());
    }
    Err(RuntimeError::InvalidSpec(format!(
        "checkpoint {} was taken over layers {:?}; the spec names {:?}",
        checkpoint.display(),
        manifest.layers,
        spec.layers
    )))
}

/// How a new sandbox's processes and runtime layer begin.
#[derive(Clone, Copy)]
enum Start<'a> {
    /// Fresh processes over an empty runtime layer.
    Fresh,
    /// Fresh processes over the runtime layer saved in a checkpoint (its memory, if any, ignored).
    FromDisk(&'a Path),
    /// The checkpoint's processes and runtime layer.
    Restore(&'a Path, &'a Manifest),
}

/// An address lease failure: an empty pool is the host's limit, anything else the runtime's fault.
fn address_error(error: crate::network::addresses::AddressError) -> RuntimeError {
    match error {
        crate::network::addresses::AddressError::Exhausted(_) => RuntimeError::ResourceExhausted {
            context: "lease a sandbox address".into(),
            source: Some(Box::new(error)),
        },
        other_error => RuntimeError::internal("lease a sandbox address", other_error),
    }
}

/// The runtime's view of a checkpoint failure.
/// How long [`Runtime::memory_settled`] waits for a lazy restore's pages (500 MiB take well under a
/// second here; the supervisor itself gives up on a transfer after ten minutes).
const MEMORY_SETTLE_LIMIT: Duration = Duration::from_secs(660);

fn checkpoint_error(error: CheckpointError) -> RuntimeError {
    match error {
        CheckpointError::CriuUnavailable(why) => {
            RuntimeError::Unsupported(format!("checkpoints: {why}"))
        }
        CheckpointError::Io { context, source } => RuntimeError::Io { context, source },
        CheckpointError::Criu { .. } if checkpoint::is_unseizable(&error) => RuntimeError::Busy {
            context: "a task of the sandbox cannot be stopped for the checkpoint now (in vfork?); try again".into(),
            source: Some(Box::new(error)),
        },
        other_error => RuntimeError::internal("checkpoint", other_error),
    }
}

/// Removes a destroyed sandbox's directory. A process of the sandbox that was just killed (a lazy
/// restore's helper) can still be finishing a write into it while it is removed, which fails with
/// "directory not empty": that is tried again for a moment, as nothing else will write there.
fn remove_sandbox_dir(dir: &Path) -> Result<(), RuntimeError> {
    let mut tries = 0;
    loop {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
            Err(e) => return Err(io_error(format!("remove {}", dir.display()))(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(validate_id("sbx-1_a.b").is_ok());
        for bad in ["", ".x", "-x", "a/b", "a b", &"x".repeat(64)] {
            assert!(validate_id(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
