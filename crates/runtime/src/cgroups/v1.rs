//! cgroup v1: one hierarchy per controller, each mounted at /sys/fs/cgroup/<controller>.

use std::path::{Path, PathBuf};

use super::{
    cpu_quota_usec, keyed_value, read, read_u64, write, CgroupError, CFS_PERIOD_USEC, PARENT,
};
use crate::Resources;

/// Controllers Warren uses; `memory` first (it is the primary directory for `cgroup.procs`).
const REQUIRED: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];
const OPTIONAL: [&str; 2] = ["blkio", "devices"];

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
    Ok(())
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
