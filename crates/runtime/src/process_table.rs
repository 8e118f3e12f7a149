//! Processes of a sandbox as seen from the host's /proc, mapped to the PIDs the sandbox sees (the last
//! `NSpid` entry), with CPU % over a short window and RSS.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::ProcessInfo;

/// How long CPU use is sampled when no earlier sample is at hand.
pub const CPU_SAMPLE_WINDOW: Duration = Duration::from_millis(100);

/// Fields of /proc/<pid>/stat and status that the process list needs.
#[derive(Debug, Clone, PartialEq)]
pub struct HostProcess {
    pub host_pid: u32,
    pub host_ppid: u32,
    pub sandbox_pid: u32,
    pub uid: u32,
    pub cpu_ticks: u64,
    pub start_ticks: u64,
    pub rss_bytes: u64,
    pub command: String,
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

/// The fields after the `(comm)` of /proc/<pid>/stat, and comm itself.
fn stat_fields(pid: u32) -> Option<(String, Vec<String>)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    Some((
        comm,
        text[close + 1..]
            .split_whitespace()
            .map(str::to_string)
            .collect(),
    ))
}

/// Start time of `pid` in clock ticks since boot.
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_fields(pid)?.1.get(19)?.parse().ok()
}

pub fn read_host_process(pid: u32) -> Option<HostProcess> {
    let (comm, fields) = stat_fields(pid)?;
    let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
            .map(str::to_string)
    };
    let sandbox_pid = line("NSpid:")?.split_whitespace().last()?.parse().ok()?;
    let uid = line("Uid:")?.split_whitespace().next()?.parse().ok()?;
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let rss_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some(HostProcess {
        host_pid: pid,
        host_ppid: number(1)? as u32,
        sandbox_pid,
        uid,
        cpu_ticks: number(11)? + number(12)?,
        start_ticks: number(19)?,
        rss_bytes: rss_pages * page_size(),
        command: if args.is_empty() {
            format!("[{comm}]")
        } else {
            args.join(" ")
        },
    })
}

fn boot_time() -> SystemTime {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let seconds = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    UNIX_EPOCH + Duration::from_secs(seconds)
}

/// uid → name from the sandbox's own /etc/passwd.
fn users(root: &Path) -> HashMap<u32, String> {
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap_or_default();
    passwd
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let uid = fields.nth(1)?.parse().ok()?;
            Some((uid, name.to_string()))
        })
        .collect()
}

/// Builds the process list from the host PIDs of the sandbox's cgroup. `earlier` is a CPU sample of
/// the same processes taken `elapsed` ago.
pub fn process_list(
    host_pids: &[u32],
    init_pid: u32,
    earlier: &HashMap<u32, u64>,
    elapsed: Duration,
) -> (Vec<ProcessInfo>, HashMap<u32, u64>) {
    let processes: Vec<HostProcess> = host_pids
        .iter()
        .filter_map(|pid| read_host_process(*pid))
        .collect();
    let sandbox_pid_of: HashMap<u32, u32> = processes
        .iter()
        .map(|p| (p.host_pid, p.sandbox_pid))
        .collect();
    let users = users(Path::new(&format!("/proc/{init_pid}/root")));
    let ticks = clock_ticks_per_second() as f64;
    let boot = boot_time();
    let window = elapsed.as_secs_f64().max(1e-3);
    let mut sample = HashMap::new();
    let mut list: Vec<ProcessInfo> = processes
        .iter()
        .map(|p| {
            sample.insert(p.host_pid, p.cpu_ticks);
            let used = earlier
                .get(&p.host_pid)
                .map_or(0, |before| p.cpu_ticks.saturating_sub(*before));
            ProcessInfo {
                pid: p.sandbox_pid,
                ppid: sandbox_pid_of.get(&p.host_ppid).copied().unwrap_or(0),
                user: users
                    .get(&p.uid)
                    .cloned()
                    .unwrap_or_else(|| p.uid.to_string()),
                command: p.command.clone(),
                cpu_percent: (used as f64 / ticks) / window * 100.0,
                rss_bytes: p.rss_bytes,
                started_at: boot + Duration::from_secs_f64(p.start_ticks as f64 / ticks),
            }
        })
        .collect();
    list.sort_by_key(|p| p.pid);
    (list, sample)
}

/// CPU ticks of each of `host_pids` now.
pub fn cpu_sample(host_pids: &[u32]) -> (Instant, HashMap<u32, u64>) {
    let sample = host_pids
        .iter()
        .filter_map(|pid| read_host_process(*pid).map(|p| (p.host_pid, p.cpu_ticks)))
        .collect();
    (Instant::now(), sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = read_host_process(std::process::id()).unwrap();
        assert_eq!(me.host_pid, std::process::id());
        assert!(me.rss_bytes > 0);
        assert_eq!(start_ticks(std::process::id()), Some(me.start_ticks));
    }

    #[test]
    fn list_maps_parent_outside_to_zero() {
        let (list, sample) = process_list(
            &[std::process::id()],
            std::process::id(),
            &HashMap::new(),
            CPU_SAMPLE_WINDOW,
        );
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].ppid, 0);
        assert!(sample.contains_key(&std::process::id()));
    }
}
