//! Per-sandbox cgroups: CPU quota, memory limit, pids limit, io weight, freezer, device allow-list and
//! accounting.
//!
//! The device allow-list ([`DEVICE_ALLOW_LIST`]) needs the v1 devices controller. cgroup v2 has no
//! devices files: there the kernel asks a `BPF_PROG_TYPE_CGROUP_DEVICE` program attached to the
//! cgroup, and Warren attaches none yet, so on v2 the sandbox's devices are limited only by its private
//! /dev (a tmpfs holding just the allowed nodes) and the missing CAP_MKNOD.
//!
//! cgroup v1 (one directory per controller) and v2 (one unified directory) sit behind [`Cgroups`] and
//! [`SandboxCgroup`]; the version is detected once at start. Sandbox cgroups are named
//! `warren/<sandbox id>` in every hierarchy, so [`Cgroups::list_ids`] finds them without any other state.

mod v1;
mod v2;

pub use v1::DEVICE_ALLOW_LIST;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::Resources;

/// Name of Warren's parent cgroup in every hierarchy.
pub const PARENT: &str = "warren";
const CFS_PERIOD_USEC: u64 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup hierarchy found: {0}")]
    NotAvailable(String),
    #[error("cgroup file {path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cgroup file {path} holds {value:?}, not a number")]
    Parse { path: PathBuf, value: String },
    #[error("cgroup {0} still has processes after being killed")]
    NotEmpty(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The host's cgroup hierarchy, as detected.
#[derive(Debug, Clone)]
pub struct Cgroups {
    version: CgroupVersion,
    mount: PathBuf,
}

impl Cgroups {
    /// Detects v2 (a cgroup2 filesystem at /sys/fs/cgroup) or v1 (the controllers Warren needs mounted
    /// below it).
    pub fn detect() -> Result<Self, CgroupError> {
        Self::detect_at(Path::new("/sys/fs/cgroup"))
    }

    pub fn detect_at(mount: &Path) -> Result<Self, CgroupError> {
        let statfs = nix::sys::statfs::statfs(mount)
            .map_err(|e| CgroupError::NotAvailable(format!("{}: {e}", mount.display())))?;
        let version = if statfs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC {
            v2::check(mount)?;
            CgroupVersion::V2
        } else {
            v1::check(mount)?;
            CgroupVersion::V1
        };
        Ok(Self {
            version,
            mount: mount.to_path_buf(),
        })
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// Directories that make up the cgroup of sandbox `id` (one per v1 controller, one on v2).
    pub fn sandbox(&self, id: &str) -> SandboxCgroup {
        let dirs = match self.version {
            CgroupVersion::V1 => v1::dirs(&self.mount, id),
            CgroupVersion::V2 => vec![self.mount.join(PARENT).join(id)],
        };
        SandboxCgroup {
            version: self.version,
            id: id.to_string(),
            dirs,
        }
    }

    /// Creates the cgroup of sandbox `id` with its limits.
    pub fn create(&self, id: &str, resources: &Resources) -> Result<SandboxCgroup, CgroupError> {
        let cgroup = self.sandbox(id);
        let result = match self.version {
            CgroupVersion::V1 => v1::create(&cgroup.dirs, resources),
            CgroupVersion::V2 => v2::create(&self.mount, &cgroup.dirs[0], resources),
        };
        if let Err(err) = result {
            let _ = cgroup.remove();
            return Err(err);
        }
        Ok(cgroup)
    }

    /// Caps the tasks of all sandboxes together (`pids.max` of Warren's parent cgroup), so the sum of
    /// the sandboxes' own limits can never take the host's last PIDs. Needs the parent to exist (it
    /// does once one sandbox cgroup was made).
    pub fn cap_sandbox_tasks(&self, max: u64) -> Result<(), CgroupError> {
        let parent = match self.version {
            CgroupVersion::V1 => self.mount.join("pids").join(PARENT),
            CgroupVersion::V2 => self.mount.join(PARENT),
        };
        write(&parent.join("pids.max"), &max.to_string())
    }

    /// IDs of the sandbox cgroups that exist on this host.
    pub fn list_ids(&self) -> Vec<String> {
        let parent = match self.version {
            CgroupVersion::V1 => self.mount.join("memory").join(PARENT),
            CgroupVersion::V2 => self.mount.join(PARENT),
        };
        let mut ids: Vec<String> = std::fs::read_dir(parent)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.path().is_dir())
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect();
        ids.sort();
        ids
    }
}

/// The cgroup of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    id: String,
    dirs: Vec<PathBuf>,
}

impl SandboxCgroup {
    pub fn exists(&self) -> bool {
        self.dirs.iter().any(|dir| dir.is_dir())
    }

    /// The `cgroup.procs` files a process writes `0` into to join this cgroup.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|dir| dir.join("cgroup.procs"))
            .collect()
    }

    fn primary(&self) -> &Path {
        // v1: the memory hierarchy (dirs[0]); v2: the only directory.
        &self.dirs[0]
    }

    fn controller(&self, name: &str) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => v1::controller_dir(&self.dirs, name),
            CgroupVersion::V2 => self.dirs[0].clone(),
        }
    }

    /// The directory of the freezer (v1 `freezer/warren/<id>`, v2 the cgroup itself), as CRIU's
    /// `--freeze-cgroup` wants it.
    pub fn freezer_dir(&self) -> PathBuf {
        self.controller("freezer")
    }

    /// Host PIDs of the processes in the cgroup.
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let path = self.primary().join("cgroup.procs");
        let text = read(&path)?;
        Ok(text
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect())
    }

    pub fn freeze(&self) -> Result<(), CgroupError> {
        match self.version {
            CgroupVersion::V1 => v1::set_frozen(&self.controller("freezer"), true),
            CgroupVersion::V2 => v2::set_frozen(&self.dirs[0], true),
        }
    }

    pub fn thaw(&self) -> Result<(), CgroupError> {
        match self.version {
            CgroupVersion::V1 => v1::set_frozen(&self.controller("freezer"), false),
            CgroupVersion::V2 => v2::set_frozen(&self.dirs[0], false),
        }
    }

    pub fn is_frozen(&self) -> Result<bool, CgroupError> {
        match self.version {
            CgroupVersion::V1 => v1::is_frozen(&self.controller("freezer")),
            CgroupVersion::V2 => v2::is_frozen(&self.dirs[0]),
        }
    }

    /// Total CPU time of the cgroup in microseconds.
    pub fn cpu_usage_usec(&self) -> Result<u64, CgroupError> {
        match self.version {
            CgroupVersion::V1 => {
                Ok(read_u64(&self.controller("cpuacct").join("cpuacct.usage"))? / 1000)
            }
            CgroupVersion::V2 => v2::stat_field(&self.dirs[0].join("cpu.stat"), "usage_usec"),
        }
    }

    /// Memory in use (page cache that can be dropped is not counted) and the hard limit, in bytes.
    pub fn memory(&self) -> Result<(u64, u64), CgroupError> {
        match self.version {
            CgroupVersion::V1 => v1::memory(&self.controller("memory")),
            CgroupVersion::V2 => v2::memory(&self.dirs[0]),
        }
    }

    /// Page cache charged to the cgroup (file-backed memory the kernel can drop), in bytes.
    pub fn memory_cache(&self) -> Result<u64, CgroupError> {
        let (dir, key) = match self.version {
            CgroupVersion::V1 => (self.controller("memory"), "total_cache"),
            CgroupVersion::V2 => (self.dirs[0].clone(), "file"),
        };
        Ok(keyed_value(&read(&dir.join("memory.stat"))?, key).unwrap_or(0))
    }

    pub fn pids_current(&self) -> Result<u64, CgroupError> {
        read_u64(&self.controller("pids").join("pids.current"))
    }

    /// Whether the memory controller has OOM-killed a task of this cgroup.
    pub fn oom_kills(&self) -> Result<u64, CgroupError> {
        match self.version {
            CgroupVersion::V1 => v1::oom_kills(&self.controller("memory")),
            CgroupVersion::V2 => v2::stat_field(&self.dirs[0].join("memory.events"), "oom_kill"),
        }
    }

    /// SIGKILLs every process in the cgroup (thawing it so frozen tasks can die) and waits until it is
    /// empty.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        if !self.exists() {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids().unwrap_or_default();
            if pids.is_empty() {
                return Ok(());
            }
            for pid in &pids {
                // Processes may exit between the read and the kill; ESRCH is fine.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = self.thaw();
            if Instant::now() > deadline {
                return Err(CgroupError::NotEmpty(self.id.clone()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Removes the (empty) cgroup directories. Missing directories are fine.
    pub fn remove(&self) -> Result<(), CgroupError> {
        for dir in &self.dirs {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    // EBUSY while the last task is still being torn down.
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(source) => {
                        return Err(CgroupError::File {
                            path: dir.clone(),
                            source,
                        })
                    }
                }
            }
        }
        Ok(())
    }
}

fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::File {
        path: path.to_path_buf(),
        source,
    })
}

fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    let text = read(path)?;
    let value = text.trim();
    if value == "max" {
        return Ok(u64::MAX);
    }
    value.parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        value: value.to_string(),
    })
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|source| CgroupError::File {
        path: path.to_path_buf(),
        source,
    })
}

fn cpu_quota_usec(resources: &Resources) -> Option<u64> {
    if resources.vcpus <= 0.0 {
        return None;
    }
    // The kernel refuses quotas under 1 ms.
    Some(((resources.vcpus * CFS_PERIOD_USEC as f64) as u64).max(1000))
}

/// Reads a `key value` line from a flat-keyed cgroup file.
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some(key))
            .then(|| parts.next()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_follows_vcpus_with_a_floor() {
        let mut resources = Resources {
            vcpus: 0.5,
            memory_mib: 1,
            disk_mib: 1,
            max_pids: 1,
        };
        assert_eq!(cpu_quota_usec(&resources), Some(50_000));
        resources.vcpus = 0.001;
        assert_eq!(cpu_quota_usec(&resources), Some(1000));
        resources.vcpus = 0.0;
        assert_eq!(cpu_quota_usec(&resources), None);
    }

    #[test]
    fn keyed_values_are_found_by_exact_key() {
        let text = "usage_usec 42\nuser_usec 40\noom_kill 3\n";
        assert_eq!(keyed_value(text, "usage_usec"), Some(42));
        assert_eq!(keyed_value(text, "oom_kill"), Some(3));
        assert_eq!(keyed_value(text, "usage"), None);
    }
}
