//! cgroup v1: one hierarchy per controller, each mounted at /sys/fs/cgroup/<controller>.

use std::path::{Path, PathBuf};

use super::{
    cpu_quota_usec, keyed_value, read, read_u64, write, CgroupError, CFS_PERIOD_USEC, PARENT,
};
use crate::Resources;

/// Controllers Warren uses; `memory` first (it is the primary directory for `cgroup.procs`).
const REQUIRED: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];
const OPTIONAL: [&str; 3] = ["blkio", "devices", "cpuset"];

/// The device nodes a sandbox may open or create (the devices controller's allow-list): exactly the
/// nodes of its /dev (see `rootfs::sandbox_mounts`) and the pseudo-terminals of its devpts. Everything
/// else, the host's disks and /dev/mem included, is refused even to the sandbox's root.
pub const DEVICE_ALLOW_LIST: [&str; 8] = [
    "c 1:3 rwm",   // null
    "c 1:5 rwm",   // zero
    "c 1:7 rwm",   // full
    "c 1:8 rwm",   // random
    "c 1:9 rwm",   // urandom
    "c 5:0 rwm",   // tty
    "c 5:2 rwm",   // ptmx
    "c 136:* rwm", // pts/*
];

pub(super) fn check(mount: &Path) -> Result<(), CgroupError> {
    for controller in REQUIRED {
        if !mount.join(controller).join("cgroup.procs").exists() {
            return Err(CgroupError::NotAvailable(format!(
                "cgroup v1 controller {controller} is not mounted at {}",
                mount.join(controller).display()
            )));
        }
    }
    Ok(())
}

/// One directory per hierarchy; controllers co-mounted in one hierarchy (cpu,cpuacct) share it.
pub(super) fn dirs(mount: &Path, id: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for controller in REQUIRED.iter().chain(OPTIONAL.iter()) {
        let hierarchy = mount.join(controller);
        if !hierarchy.join("cgroup.procs").exists() {
            continue;
        }
        let canonical = std::fs::canonicalize(&hierarchy).unwrap_or_else(|_| hierarchy.clone());
        if seen.contains(&canonical) {
            continue;
        }
        seen.push(canonical);
        dirs.push(hierarchy.join(PARENT).join(id));
    }
    dirs
}

/// The directory of `controller` among `dirs` (`dirs` are `<mount>/<hierarchy>/warren/<id>`): the one
/// whose hierarchy is named after it, else (co-mounted controllers) the one holding its files.
pub(super) fn controller_dir(dirs: &[PathBuf], controller: &str) -> PathBuf {
    let hierarchy_name = |dir: &PathBuf| {
        dir.parent()
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .map(|n| n.to_os_string())
    };
    if let Some(dir) = dirs
        .iter()
        .find(|dir| hierarchy_name(dir).is_some_and(|name| name == controller))
    {
        return dir.clone();
    }
    let probe = format!("{controller}.");
    let holds_files = |dir: &&PathBuf| {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().starts_with(&probe))
    };
    dirs.iter().find(holds_files).unwrap_or(&dirs[0]).clone()
}

pub(super) fn create(dirs: &[PathBuf], resources: &Resources) -> Result<(), CgroupError> {
    for dir in dirs {
        std::fs::create_dir_all(dir).map_err(|source| CgroupError::File {
            path: dir.clone(),
            source,
        })?;
    }
    let memory = controller_dir(dirs, "memory");
    let limit = resources.memory_mib.saturating_mul(1024 * 1024);
    write(&memory.join("memory.limit_in_bytes"), &limit.to_string())?;
    // No swap on the hosts Warren targets; where there is, keep the sandbox out of it too.
    let memsw = memory.join("memory.memsw.limit_in_bytes");
    if memsw.exists() {
        write(&memsw, &limit.to_string())?;
    }
    write(&memory.join("memory.swappiness"), "0").ok();
    let cpu = controller_dir(dirs, "cpu");
    write(&cpu.join("cpu.cfs_period_us"), &CFS_PERIOD_USEC.to_string())?;
    let quota = cpu_quota_usec(resources).map_or("-1".to_string(), |q| q.to_string());
    write(&cpu.join("cpu.cfs_quota_us"), &quota)?;
    let pids = controller_dir(dirs, "pids");
    let max = if resources.max_pids == 0 {
        "max".to_string()
    } else {
        resources.max_pids.to_string()
    };
    write(&pids.join("pids.max"), &max)?;
    // blkio.weight only exists under a proportional io scheduler (bfq); equal weights when it does.
    let blkio = controller_dir(dirs, "blkio").join("blkio.weight");
    if blkio.exists() {
        write(&blkio, "100").ok();
    }
    let devices = controller_dir(dirs, "devices");
    if devices.join("devices.deny").exists() {
        restrict_devices(&devices)?;
    }
    let cpuset = controller_dir(dirs, "cpuset");
    if cpuset.join("cpuset.cpus").exists() {
        place_cpus(&cpuset, resources)?;
    }
    Ok(())
}

/// Gives the sandbox `ceil(vcpus)` of the host's CPUs in its cpuset, so `nproc` and
/// `sched_getaffinity` (which `make -j`, the JVM and Python's `os.cpu_count` trust) tell its share; the
/// CFS quota still bounds the time it gets. Which CPUs: a window starting at an offset derived from
/// the sandbox's ID, so sandboxes spread over the host instead of piling on CPU 0. Warren's parent
/// cpuset is first given all of the host's CPUs and memory nodes (a fresh cpuset has none).
fn place_cpus(dir: &Path, resources: &Resources) -> Result<(), CgroupError> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    let Some(root) = parent.parent() else {
        return Ok(());
    };
    for file in ["cpuset.cpus", "cpuset.mems"] {
        if read(&parent.join(file))?.trim().is_empty() {
            write(&parent.join(file), read(&root.join(file))?.trim())?;
        }
    }
    let all = parse_cpu_list(read(&parent.join("cpuset.cpus"))?.trim());
    let id = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cpus = cpu_window(&all, resources.vcpus, &id);
    write(
        &dir.join("cpuset.mems"),
        read(&parent.join("cpuset.mems"))?.trim(),
    )?;
    write(&dir.join("cpuset.cpus"), &format_cpu_list(&cpus))
}

/// The CPUs of a kernel CPU list (`0-3,8,10-11`).
pub(super) fn parse_cpu_list(list: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((from, to)) => {
                if let (Ok(from), Ok(to)) = (from.parse::<u32>(), to.parse::<u32>()) {
                    cpus.extend(from..=to);
                }
            }
            None => cpus.extend(part.parse::<u32>().ok()),
        }
    }
    cpus
}

fn format_cpu_list(cpus: &[u32]) -> String {
    cpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `ceil(vcpus)` of `all` (all of them when that is as many or more), starting at an offset that
/// depends on `id` only.
pub(super) fn cpu_window(all: &[u32], vcpus: f64, id: &str) -> Vec<u32> {
    let wanted = (vcpus.ceil().max(1.0) as usize).min(all.len());
    if wanted == all.len() {
        return all.to_vec();
    }
    let offset = id.bytes().fold(0usize, |hash, byte| {
        hash.wrapping_mul(31).wrapping_add(byte as usize)
    }) % all.len();
    let mut window: Vec<u32> = (0..wanted).map(|i| all[(offset + i) % all.len()]).collect();
    window.sort_unstable();
    window
}

/// Denies every device, then allows [`DEVICE_ALLOW_LIST`]. Runs before any task joins the cgroup.
fn restrict_devices(dir: &Path) -> Result<(), CgroupError> {
    write(&dir.join("devices.deny"), "a")?;
    for rule in DEVICE_ALLOW_LIST {
        write(&dir.join("devices.allow"), rule)?;
    }
    Ok(())
}

pub(super) fn set_frozen(freezer: &Path, frozen: bool) -> Result<(), CgroupError> {
    let target = if frozen { "FROZEN" } else { "THAWED" };
    let path = freezer.join("freezer.state");
    write(&path, target)?;
    // FREEZING is transient; wait (bounded) until the kernel reports the target state.
    for _ in 0..1000 {
        if read(&path)?.trim() == target {
            return Ok(());
        }
        write(&path, target)?;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(CgroupError::File {
        path,
        source: std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("did not reach {target}"),
        ),
    })
}

pub(super) fn is_frozen(freezer: &Path) -> Result<bool, CgroupError> {
    Ok(read(&freezer.join("freezer.state"))?.trim() != "THAWED")
}

pub(super) fn memory(memory: &Path) -> Result<(u64, u64), CgroupError> {
    let usage = read_u64(&memory.join("memory.usage_in_bytes"))?;
    let stat = read(&memory.join("memory.stat"))?;
    let inactive_file = keyed_value(&stat, "total_inactive_file").unwrap_or(0);
    let limit = read_u64(&memory.join("memory.limit_in_bytes"))?;
    Ok((usage.saturating_sub(inactive_file), limit))
}

pub(super) fn oom_kills(memory: &Path) -> Result<u64, CgroupError> {
    let text = read(&memory.join("memory.oom_control"))?;
    Ok(keyed_value(&text, "oom_kill").unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_ranges_and_singles() {
        assert_eq!(parse_cpu_list("0-3,8,10-11"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list(""), Vec::<u32>::new());
        assert_eq!(format_cpu_list(&[0, 2]), "0,2");
    }

    #[test]
    fn cpu_window_takes_the_sandbox_share_and_spreads() {
        let all = [0, 1, 2, 3];
        assert_eq!(cpu_window(&all, 4.0, "a"), all.to_vec());
        assert_eq!(cpu_window(&all, 8.0, "a"), all.to_vec());
        assert_eq!(cpu_window(&all, 1.5, "a").len(), 2);
        assert_eq!(cpu_window(&all, 0.25, "a").len(), 1);
        let firsts: std::collections::BTreeSet<u32> = (0..40)
            .map(|i| cpu_window(&all, 1.0, &format!("sandbox{i}"))[0])
            .collect();
        assert!(firsts.len() > 1, "every sandbox on one CPU: {firsts:?}");
        assert_eq!(cpu_window(&all, 2.0, "x"), cpu_window(&all, 2.0, "x"));
    }
}
