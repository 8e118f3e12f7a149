//! Host-wide kernel limits that sandboxes share, and what is left of them for admission.
//!
//! Three resources are host-wide rather than per sandbox:
//! - **Tasks.** Every sandbox has a `pids.max`, but all of them draw on one kernel: at most
//!   `kernel.pid_max` PIDs and `kernel.threads-max` tasks. [`measure`] reports how many tasks the
//!   sandboxes may hold together (the smaller ceiling less a reserve for the host), and the runtime caps
//!   Warren's parent cgroup (`warren/pids.max`) at that figure, so the sum holds even for sandboxes the
//!   server's admission never saw (template builds).
//! - **Disk.** A sandbox's writable layer is a sparse image that grows up to its size. [`measure`]
//!   reports the state disk's free space less a reserve and less what live images may still grow by.
//! - **inotify.** The kernel counts inotify instances and watches per *real uid*, and every sandbox's
//!   root is host uid 0 (no user namespace), so one sandbox could take the whole per-uid budget. Since
//!   Linux 5.11 the memory of inotify instances and watches is charged to the memory cgroup of the task
//!   that made them, so each sandbox's own memory limit already bounds what it can take.
//!   [`raise_kernel_limits`] lifts the per-uid counters to the kernel's ceiling (`INT_MAX`): at ~90
//!   bytes a watch and ~1 KiB an instance that is more kernel memory than a host has, so the per-uid
//!   counter can no longer run out before a sandbox's memory cgroup stops it.

use std::path::Path;

/// `PID_MAX_LIMIT` on 64-bit kernels: the largest `kernel.pid_max`.
pub const PID_MAX_LIMIT: u64 = 4 * 1024 * 1024;
/// The largest value the inotify per-uid sysctls take.
pub const INOTIFY_LIMIT: u64 = i32::MAX as u64;
/// Tasks kept for the host: a tenth of the ceiling, at least this many.
pub const MIN_TASK_RESERVE: u64 = 2048;
/// Disk kept free for the host, checkpoints and logs: a twentieth of the file system, at least this
/// and at most [`MAX_DISK_RESERVE`].
pub const MIN_DISK_RESERVE: u64 = 1024 * 1024 * 1024;
/// The most the reserve takes. A file system's size says little about what the host needs (a large,
/// thinly provisioned volume may report hundreds of GiB while a fraction is really free): 5 % of it
/// would keep tens of GiB from sandboxes; a few GiB covers logs, the database and a checkpoint being
/// written, and a checkpoint that finds the disk full fails cleanly and keeps the sandbox.
pub const MAX_DISK_RESERVE: u64 = 4 * 1024 * 1024 * 1024;

const PID_MAX: &str = "/proc/sys/kernel/pid_max";
const THREADS_MAX: &str = "/proc/sys/kernel/threads-max";
const INOTIFY_INSTANCES: &str = "/proc/sys/fs/inotify/max_user_instances";
const INOTIFY_WATCHES: &str = "/proc/sys/fs/inotify/max_user_watches";

#[derive(Debug, thiserror::Error)]
pub enum HostCapacityError {
    #[error("read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds {value:?}, not a number")]
    Parse { path: String, value: String },
    #[error("statvfs {path}")]
    Statvfs {
        path: String,
        #[source]
        source: nix::Error,
    },
}

/// What the sandboxes of this host may still take, measured now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostCapacity {
    /// Tasks (processes + threads) all sandboxes together may hold: the kernel's ceiling less the
    /// host's reserve.
    pub sandbox_tasks: u64,
    /// Space left on the state disk (`f_bavail`).
    pub disk_free_bytes: u64,
    /// What admission keeps free of sandboxes' writable layers.
    pub disk_reserve_bytes: u64,
    /// What the live sandboxes' sparse images may still grow by (apparent less allocated size).
    pub disk_promised_bytes: u64,
}

impl HostCapacity {
    /// Bytes new writable layers may still be promised, when the state disk's space above the
    /// reserve may be promised `overcommit` times over (1: every layer could fill at once and the
    /// reserve would still hold).
    pub fn sandbox_disk_bytes(&self, overcommit: f64) -> u64 {
        let room = self.disk_free_bytes.saturating_sub(self.disk_reserve_bytes);
        let promisable = (room as f64 * overcommit.max(1.0)).min(u64::MAX as f64) as u64;
        promisable.saturating_sub(self.disk_promised_bytes)
    }
}

/// The raw numbers [`HostCapacity`] is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFacts {
    pub pid_max: u64,
    pub threads_max: u64,
    /// Size of the state disk's file system.
    pub disk_total_bytes: u64,
    /// Space unprivileged writers may still use there (`f_bavail`).
    pub disk_available_bytes: u64,
    /// Apparent size minus allocated size, summed over the live sandboxes' images.
    pub images_unallocated_bytes: u64,
}

impl HostFacts {
    pub fn capacity(&self) -> HostCapacity {
        // The kernel keeps the first 300 PIDs for itself once they wrap.
        let ceiling = self.threads_max.min(self.pid_max.saturating_sub(300));
        let task_reserve = (ceiling / 10).max(MIN_TASK_RESERVE);
        let disk_reserve = (self.disk_total_bytes / 20).clamp(MIN_DISK_RESERVE, MAX_DISK_RESERVE);
        HostCapacity {
            sandbox_tasks: ceiling.saturating_sub(task_reserve),
            disk_free_bytes: self.disk_available_bytes,
            disk_reserve_bytes: disk_reserve,
            disk_promised_bytes: self.images_unallocated_bytes,
        }
    }
}

fn read_number(path: &str) -> Result<u64, HostCapacityError> {
    let text = std::fs::read_to_string(path).map_err(|source| HostCapacityError::Read {
        path: path.to_string(),
        source,
    })?;
    text.trim().parse().map_err(|_| HostCapacityError::Parse {
        path: path.to_string(),
        value: text.trim().to_string(),
    })
}

/// Reads the host's task ceilings and the state disk under `state_dir`; `images` are the writable
/// layer images of the sandboxes that exist now.
pub fn measure(
    state_dir: &Path,
    images: impl IntoIterator<Item = std::path::PathBuf>,
) -> Result<HostFacts, HostCapacityError> {
    use std::os::unix::fs::MetadataExt;
    let stat =
        nix::sys::statvfs::statvfs(state_dir).map_err(|source| HostCapacityError::Statvfs {
            path: state_dir.display().to_string(),
            source,
        })?;
    let fragment = stat.fragment_size() as u64;
    let images_unallocated_bytes = images
        .into_iter()
        .filter_map(|image| std::fs::metadata(image).ok())
        .map(|meta| meta.size().saturating_sub(meta.blocks() * 512))
        .sum();
    Ok(HostFacts {
        pid_max: read_number(PID_MAX)?,
        threads_max: read_number(THREADS_MAX)?,
        disk_total_bytes: stat.blocks() as u64 * fragment,
        disk_available_bytes: stat.blocks_available() as u64 * fragment,
        images_unallocated_bytes,
    })
}

/// Raises `kernel.pid_max` to [`PID_MAX_LIMIT`] and the inotify per-uid limits to
/// [`INOTIFY_LIMIT`] where they are lower, logging every change (host-wide; left raised when Warren
/// stops). A value the kernel refuses is logged and left: sandboxes run either way, admission then
/// works with the lower ceiling.
pub fn raise_kernel_limits() {
    for (path, target, why) in [
        (
            PID_MAX,
            PID_MAX_LIMIT,
            "so the PID space is no smaller than threads-max",
        ),
        (
            INOTIFY_INSTANCES,
            INOTIFY_LIMIT,
            "inotify is counted per host uid and all sandboxes' root is uid 0; each sandbox's memory \
             cgroup bounds its share instead",
        ),
        (
            INOTIFY_WATCHES,
            INOTIFY_LIMIT,
            "inotify is counted per host uid and all sandboxes' root is uid 0; each sandbox's memory \
             cgroup bounds its share instead",
        ),
    ] {
        match read_number(path) {
            Ok(current) if current >= target => {}
            Ok(current) => match std::fs::write(path, target.to_string()) {
                Ok(()) => tracing::info!("raised {path} from {current} to {target}: {why}"),
                Err(error) => tracing::warn!(%error, "cannot raise {path} from {current}"),
            },
            Err(error) => tracing::warn!(%error, "cannot read {path}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024 * 1024 * 1024;

    fn facts() -> HostFacts {
        HostFacts {
            pid_max: 32_768,
            threads_max: 192_724,
            disk_total_bytes: 100 * GIB,
            disk_available_bytes: 40 * GIB,
            images_unallocated_bytes: 0,
        }
    }

    #[test]
    fn tasks_are_the_smaller_ceiling_less_a_tenth() {
        let capacity = facts().capacity();
        // pid_max binds: 32,468 usable PIDs, 3,246 kept for the host.
        assert_eq!(capacity.sandbox_tasks, 32_468 - 3_246);
        let raised = HostFacts {
            pid_max: PID_MAX_LIMIT,
            ..facts()
        };
        assert_eq!(raised.capacity().sandbox_tasks, 192_724 - 19_272);
        let tiny = HostFacts {
            pid_max: 1000,
            ..facts()
        };
        assert_eq!(tiny.capacity().sandbox_tasks, 0, "the reserve floor wins");
    }

    #[test]
    fn disk_is_free_space_less_reserve_and_promised_growth() {
        // 5% of 60 GiB = 3 GiB kept.
        let sixty = HostFacts {
            disk_total_bytes: 60 * GIB,
            ..facts()
        };
        assert_eq!(sixty.capacity().sandbox_disk_bytes(1.0), 37 * GIB);
        let promised = HostFacts {
            images_unallocated_bytes: 30 * GIB,
            ..sixty
        };
        let capacity = promised.capacity();
        assert_eq!(capacity.sandbox_disk_bytes(1.0), 7 * GIB);
        assert_eq!(capacity.disk_reserve_bytes, 3 * GIB);
        assert_eq!(capacity.disk_promised_bytes, 30 * GIB);
        // Overcommitted twice: 37 GiB above the reserve may be promised as 74, 30 of them taken.
        assert_eq!(capacity.sandbox_disk_bytes(2.0), 44 * GIB);
        // A ratio below 1 is read as 1: admission never promises less than is really there.
        assert_eq!(capacity.sandbox_disk_bytes(0.5), 7 * GIB);
        let small = HostFacts {
            disk_total_bytes: 4 * GIB,
            disk_available_bytes: GIB / 2,
            ..facts()
        };
        assert_eq!(small.capacity().sandbox_disk_bytes(1.0), 0, "1 GiB floor");
        // 5% of 252 GiB would be 12.6 GiB; the reserve stops at 4 GiB.
        let large = HostFacts {
            disk_total_bytes: 252 * GIB,
            disk_available_bytes: 30 * GIB,
            ..facts()
        };
        assert_eq!(
            large.capacity().sandbox_disk_bytes(1.0),
            26 * GIB,
            "4 GiB ceiling"
        );
    }

    #[test]
    fn measures_this_host() {
        let dir = std::env::temp_dir().join(format!("wt-capacity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = dir.join("disk.img");
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(64 * 1024 * 1024).unwrap();
        let facts = measure(&dir, [image, dir.join("missing.img")]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(facts.pid_max > 300 && facts.threads_max > 0);
        assert!(facts.disk_total_bytes >= facts.disk_available_bytes);
        // An empty sparse file: (nearly) all of it is promised, not allocated.
        assert!(facts.images_unallocated_bytes >= 60 * 1024 * 1024);
        assert!(facts.images_unallocated_bytes <= 64 * 1024 * 1024);
    }
}
