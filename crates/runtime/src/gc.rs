//! What sandboxes of a state directory that no longer exists left on the host, and removing it
//! (`warren gc`). A state directory deleted by hand (or lost with its disk) while its sandboxes ran
//! leaves their supervisors and processes, the layer-disk and network-namespace mounts its `rm -rf`
//! could not remove, the state directory's lxcfs mount, and the sandboxes' cgroups; no server can
//! list any of it, since the store and the runtime's records went with the directory.
//!
//! Everything is found from the host's own tables, never from a sandbox's files: supervisors by
//! their command line in `/proc` (which names the sandbox's directory), mounts in
//! `/proc/self/mountinfo`, cgroups under Warren's parent cgroup. A sandbox directory is still owned
//! while its state directory holds a store (`warren.db`) or a server's lock file (`warren.lock`, all
//! a server whose store is in PostgreSQL leaves there) or the directory itself holds the runtime's
//! record or the supervisor's configuration; veths go by themselves once the sandbox's network
//! namespace has no process and no mount left, and the shared nftables sets then lose the entries of
//! every address whose veth is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::cgroups::Cgroups;
use crate::crash_recovery::processes_where;
use crate::sandbox_state::SandboxRecord;
use crate::supervisor::SupervisorConfig;

/// A cgroup younger than this is left alone: a create may be under way in a state directory that
/// has not mounted anything yet.
pub const CGROUP_GRACE: Duration = Duration::from_secs(60);

/// What `warren gc` found of one sandbox nobody owns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Leftover {
    pub id: String,
    /// Its directory, when anything names it (a supervisor or a mount).
    pub dir: Option<PathBuf>,
    pub supervisors: Vec<u32>,
    pub mounts: Vec<PathBuf>,
    /// Processes in its cgroup.
    pub cgroup_tasks: usize,
    pub cgroup: bool,
}

/// What `warren gc` found in all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Findings {
    pub sandboxes: Vec<Leftover>,
    /// lxcfs mounts of state directories without a store.
    pub lxcfs_mounts: Vec<PathBuf>,
    /// Volume mounts (`<state>/volumes/<id>/mnt`) of state directories without a store; their loop
    /// devices detach with the mounts.
    pub volume_mounts: Vec<PathBuf>,
}

/// `<state>/sandboxes/<id>` split from a path at or below a sandbox's directory.
fn sandbox_of(path: &Path) -> Option<(PathBuf, String)> {
    let parts: Vec<_> = path.components().collect();
    let at = parts
        .iter()
        .rposition(|c| c.as_os_str() == "sandboxes")
        .filter(|at| at + 1 < parts.len())?;
    let id = parts[at + 1].as_os_str().to_str()?.to_string();
    let valid = !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !id.starts_with(['.', '-']);
    if !valid {
        return None;
    }
    let dir: PathBuf = parts[..at + 2].iter().collect();
    Some((dir, id))
}

/// Whether `state` is a state directory a server still uses: it holds the SQLite store, or the lock
/// file every `warren up` makes there and leaves (a server whose store is in PostgreSQL has no
/// `warren.db`).
fn holds_state(state: &Path) -> bool {
    state.join("warren.db").exists() || state.join("warren.lock").exists()
}

/// Whether something still owns the sandbox directory `dir` (see the module's comment).
fn owned(dir: &Path) -> bool {
    let state = dir.parent().and_then(Path::parent);
    state.is_some_and(holds_state)
        || SandboxRecord::path_in(dir).exists()
        || SupervisorConfig::path_in(dir).exists()
}

/// Mount points listed in `mountinfo` text (the fifth field, with its octal escapes undone), with
/// their file system type.
pub fn mount_points(mountinfo: &str) -> Vec<(PathBuf, String)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let point = unescape(fields.get(4)?);
            let dash = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(dash + 1)?.to_string();
            Some((PathBuf::from(point), fstype))
        })
        .collect()
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|_| bytes[i] == b'\\');
        match octal.and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A supervisor's sandbox directory and, when it waits on one, its init's PID, from its command
/// line: `warren-supervisor run <dir>/supervisor.json` or `warren-supervisor wait <pid> <dir>`.
pub fn supervisor_target(args: &[&[u8]]) -> Option<(PathBuf, Option<u32>)> {
    if !args.first()?.ends_with(b"warren-supervisor") {
        return None;
    }
    let text = |i: usize| std::str::from_utf8(args.get(i)?).ok();
    match text(1)? {
        "run" => Some((Path::new(text(2)?).parent()?.to_path_buf(), None)),
        "wait" => Some((PathBuf::from(text(3)?), text(2)?.parse().ok())),
        _ => None,
    }
}

fn age(path: &Path) -> Option<Duration> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    SystemTime::now().duration_since(modified).ok()
}

/// The leftover entry of sandbox `id` in `dir`, unless something owns the directory (then `id` is
/// remembered as owned).
fn note<'a>(
    leftovers: &'a mut BTreeMap<String, Leftover>,
    owned_ids: &mut BTreeSet<String>,
    dir: PathBuf,
    id: String,
) -> Option<&'a mut Leftover> {
    if owned(&dir) {
        owned_ids.insert(id);
        return None;
    }
    let entry = leftovers.entry(id.clone()).or_insert_with(|| Leftover {
        id,
        ..Leftover::default()
    });
    entry.dir.get_or_insert(dir);
    Some(entry)
}

/// Looks at the host (needs root for cgroups and other users' `/proc` entries).
pub fn find() -> Findings {
    let mut leftovers: BTreeMap<String, Leftover> = BTreeMap::new();
    let mut owned_ids = BTreeSet::new();
    // Only processes of the host's own PID namespace: a sandbox's process can give itself any
    // command line, and must not get its "sandbox directory" judged or anything killed for it.
    let mut supervisors: Vec<(u32, PathBuf)> = Vec::new();
    for pid in processes_where(|args| supervisor_target(args).is_some()) {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .collect();
        if let Some((dir, _init)) = supervisor_target(&args) {
            supervisors.push((pid, dir));
        }
    }
    for (pid, dir) in supervisors {
        let Some((dir, id)) = sandbox_of(&dir) else {
            continue;
        };
        if let Some(entry) = note(&mut leftovers, &mut owned_ids, dir, id) {
            entry.supervisors.push(pid);
        }
    }

    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut lxcfs_mounts = Vec::new();
    let mut volume_mounts = Vec::new();
    for (point, fstype) in mount_points(&mountinfo) {
        if fstype == "fuse.lxcfs" && point.file_name().is_some_and(|n| n == "lxcfs") {
            let state = point.parent().unwrap_or(Path::new("/"));
            if !holds_state(state) && !lxcfs_mounts.contains(&point) {
                lxcfs_mounts.push(point);
            }
            continue;
        }
        if let Some(state) = volume_state_dir(&point) {
            if !holds_state(state) && !volume_mounts.contains(&point) {
                volume_mounts.push(point);
            }
            continue;
        }
        let Some((dir, id)) = sandbox_of(&point) else {
            continue;
        };
        if let Some(entry) = note(&mut leftovers, &mut owned_ids, dir, id) {
            entry.mounts.push(point);
        }
    }

    if let Ok(cgroups) = Cgroups::detect() {
        for id in cgroups.list_ids() {
            if owned_ids.contains(&id) {
                continue;
            }
            let cgroup = cgroups.sandbox(&id);
            let known = leftovers.contains_key(&id);
            let young = cgroup
                .procs_files()
                .first()
                .and_then(|f| f.parent().and_then(age))
                .is_some_and(|a| a < CGROUP_GRACE);
            // A cgroup nothing else names is Warren's only if it is old enough not to be a create
            // in progress.
            if !known && young {
                continue;
            }
            let tasks = cgroup.pids().map(|p| p.len()).unwrap_or(0);
            let entry = leftovers.entry(id.clone()).or_insert_with(|| Leftover {
                id,
                ..Leftover::default()
            });
            entry.cgroup = true;
            entry.cgroup_tasks = tasks;
        }
    }
    Findings {
        sandboxes: leftovers.into_values().collect(),
        lxcfs_mounts,
        volume_mounts,
    }
}

/// The state directory of a volume's host mount point (`<state>/volumes/<id>/mnt`).
fn volume_state_dir(point: &Path) -> Option<&Path> {
    if point.file_name()? != "mnt" {
        return None;
    }
    let volume = point.parent()?;
    let volumes = volume.parent()?;
    (volumes.file_name()? == "volumes").then(|| volumes.parent())?
}

fn detach(point: &Path) -> Result<(), String> {
    match nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(format!("unmount {}: {e}", point.display())),
    }
}

/// Removes what [`find`] found: kills each sandbox's processes (every task of its cgroup, the init
/// with them) and its supervisors, detaches its mounts
/// (deepest first), removes its cgroup and what is left of its directory, and detaches the lxcfs
/// mounts. Returns the problems met (the rest is still done).
pub fn remove(findings: &Findings) -> Vec<String> {
    let mut problems = Vec::new();
    let kill = |pid: u32| {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    };
    let cgroups = Cgroups::detect().ok();
    for leftover in &findings.sandboxes {
        if let Some(cgroups) = &cgroups {
            if let Err(e) = cgroups.sandbox(&leftover.id).kill_all() {
                problems.push(format!("sandbox {}: {e}", leftover.id));
            }
        }
        leftover.supervisors.iter().copied().for_each(kill);
        let mut mounts = leftover.mounts.clone();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for point in &mounts {
            if let Err(e) = detach(point) {
                problems.push(format!("sandbox {}: {e}", leftover.id));
            }
        }
        if let Some(cgroups) = &cgroups {
            if let Err(e) = cgroups.sandbox(&leftover.id).remove() {
                problems.push(format!("sandbox {}: {e}", leftover.id));
            }
        }
        if let Some(dir) = &leftover.dir {
            // Only what the `rm -rf` left: nothing is mounted below it any more.
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => problems.push(format!("remove {}: {e}", dir.display())),
            }
        }
    }
    for point in findings.lxcfs_mounts.iter().chain(&findings.volume_mounts) {
        if let Err(e) = detach(point) {
            problems.push(e);
        }
    }
    problems
}

/// After [`remove`]: the firewall entries of sandbox addresses whose port is gone (see
/// [`crate::network::firewall::remove_stale_ports`]); returns the addresses cleaned.
pub fn remove_stale_firewall_entries(
    findings: &Findings,
) -> Result<Vec<std::net::Ipv4Addr>, String> {
    // Sandboxes just killed: give the kernel time to take their veths away.
    let settle = if findings.sandboxes.is_empty() {
        Duration::ZERO
    } else {
        Duration::from_secs(15)
    };
    crate::network::firewall::remove_stale_ports(settle).map_err(|e| format!("firewall: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_mounts_are_told_by_their_place() {
        assert_eq!(
            volume_state_dir(Path::new("/var/lib/warren/volumes/vol-1/mnt")),
            Some(Path::new("/var/lib/warren"))
        );
        for other in [
            "/var/lib/warren/sandboxes/x/disk",
            "/var/lib/warren/volumes/mnt",
            "/mnt",
        ] {
            assert_eq!(volume_state_dir(Path::new(other)), None, "{other}");
        }
    }

    #[test]
    fn a_sandbox_is_found_from_any_path_in_its_directory() {
        let (dir, id) = sandbox_of(Path::new("/var/lib/w x/sandboxes/abc123/disk")).unwrap();
        assert_eq!(
            (dir.as_path(), id.as_str()),
            (Path::new("/var/lib/w x/sandboxes/abc123"), "abc123")
        );
        let (dir, _) = sandbox_of(Path::new("/s/sandboxes/abc/netns")).unwrap();
        assert_eq!(dir, Path::new("/s/sandboxes/abc"));
        assert!(sandbox_of(Path::new("/s/sandboxes")).is_none());
        assert!(sandbox_of(Path::new("/s/sandboxes/.hidden/disk")).is_none());
        assert!(sandbox_of(Path::new("/s/templates/base/rootfs")).is_none());
    }

    #[test]
    fn mountinfo_points_are_unescaped_and_typed() {
        let info = "36 25 0:32 / /tmp/st\\040a/sandboxes/x1/disk rw,relatime shared:1 - ext4 /dev/loop3 rw\n\
                    37 25 0:33 / /tmp/st/lxcfs rw - fuse.lxcfs lxcfs rw\n";
        assert_eq!(
            mount_points(info),
            vec![
                (
                    PathBuf::from("/tmp/st a/sandboxes/x1/disk"),
                    "ext4".to_string()
                ),
                (PathBuf::from("/tmp/st/lxcfs"), "fuse.lxcfs".to_string()),
            ]
        );
    }

    #[test]
    fn supervisors_name_their_sandbox_and_init() {
        let run: Vec<&[u8]> = vec![
            b"/opt/warren-supervisor",
            b"run",
            b"/s/sandboxes/a/supervisor.json",
        ];
        assert_eq!(
            supervisor_target(&run),
            Some((PathBuf::from("/s/sandboxes/a"), None))
        );
        let wait: Vec<&[u8]> = vec![b"warren-supervisor", b"wait", b"4242", b"/s/sandboxes/b"];
        assert_eq!(
            supervisor_target(&wait),
            Some((PathBuf::from("/s/sandboxes/b"), Some(4242)))
        );
        let other: Vec<&[u8]> = vec![b"/usr/bin/sleep", b"wait", b"1", b"/s/sandboxes/c"];
        assert_eq!(supervisor_target(&other), None);
    }

    #[test]
    fn a_directory_is_owned_while_its_store_or_records_exist() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join("sandboxes").join("sb1");
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!owned(&dir), "an emptied directory is nobody's");
        std::fs::write(SupervisorConfig::path_in(&dir), b"{}").unwrap();
        assert!(owned(&dir));
        std::fs::remove_file(SupervisorConfig::path_in(&dir)).unwrap();
        std::fs::write(state.path().join("warren.db"), b"").unwrap();
        assert!(owned(&dir));
        // A server whose store is in PostgreSQL leaves only its lock file.
        std::fs::remove_file(state.path().join("warren.db")).unwrap();
        assert!(!owned(&dir));
        std::fs::write(state.path().join("warren.lock"), b"").unwrap();
        assert!(owned(&dir));
    }
}
