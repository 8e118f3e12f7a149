//! cgroup v2: one unified hierarchy at /sys/fs/cgroup.

use std::path::Path;

use super::{
    cpu_quota_usec, keyed_value, read, read_u64, write, CgroupError, CFS_PERIOD_USEC, PARENT,
};
use crate::Resources;

const CONTROLLERS: [&str; 4] = ["cpu", "memory", "pids", "io"];

pub(super) fn check(mount: &Path) -> Result<(), CgroupError> {
    let available = read(&mount.join("cgroup.controllers"))?;
    for needed in ["cpu", "memory", "pids"] {
        if !available.split_whitespace().any(|c| c == needed) {
            return Err(CgroupError::NotAvailable(format!(
                "cgroup v2 controller {needed} is not available"
            )));
        }
    }
    Ok(())
}

fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let available = read(&dir.join("cgroup.controllers"))?;
    for controller in CONTROLLERS {
        if available.split_whitespace().any(|c| c == controller) {
            write(
                &dir.join("cgroup.subtree_control"),
                &format!("+{controller}"),
            )?;
        }
    }
    Ok(())
}

pub(super) fn create(mount: &Path, dir: &Path, resources: &Resources) -> Result<(), CgroupError> {
    let parent = mount.join(PARENT);
    enable_controllers(mount)?;
    std::fs::create_dir_all(&parent).map_err(|source| CgroupError::File {
        path: parent.clone(),
        source,
    })?;
    enable_controllers(&parent)?;
    std::fs::create_dir(dir).map_err(|source| CgroupError::File {
        path: dir.to_path_buf(),
        source,
    })?;
    let limit = resources.memory_mib.saturating_mul(1024 * 1024);
    write(&dir.join("memory.max"), &limit.to_string())?;
    if dir.join("memory.swap.max").exists() {
        write(&dir.join("memory.swap.max"), "0")?;
    }
    let quota = cpu_quota_usec(resources).map_or("max".to_string(), |q| q.to_string());
    write(&dir.join("cpu.max"), &format!("{quota} {CFS_PERIOD_USEC}"))?;
    let max = if resources.max_pids == 0 {
        "max".to_string()
    } else {
        resources.max_pids.to_string()
    };
    write(&dir.join("pids.max"), &max)?;
    if dir.join("io.weight").exists() {
        write(&dir.join("io.weight"), "default 100").ok();
    }
    Ok(())
}

pub(super) fn set_frozen(dir: &Path, frozen: bool) -> Result<(), CgroupError> {
    write(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })?;
    for _ in 0..1000 {
        if is_frozen(dir)? == frozen {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(CgroupError::File {
        path: dir.join("cgroup.events"),
        source: std::io::Error::new(std::io::ErrorKind::TimedOut, "freezer did not settle"),
    })
}

pub(super) fn is_frozen(dir: &Path) -> Result<bool, CgroupError> {
    Ok(keyed_value(&read(&dir.join("cgroup.events"))?, "frozen") == Some(1))
}

pub(super) fn stat_field(path: &Path, key: &str) -> Result<u64, CgroupError> {
    let text = read(path)?;
    keyed_value(&text, key).ok_or(CgroupError::Parse {
        path: path.to_path_buf(),
        value: key.to_string(),
    })
}

pub(super) fn memory(dir: &Path) -> Result<(u64, u64), CgroupError> {
    let usage = read_u64(&dir.join("memory.current"))?;
    let inactive_file = keyed_value(&read(&dir.join("memory.stat"))?, "inactive_file").unwrap_or(0);
    let limit = read_u64(&dir.join("memory.max"))?;
    Ok((usage.saturating_sub(inactive_file), limit))
}
