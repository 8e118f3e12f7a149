//! `GET /metrics`: CPU, memory and disk of the sandbox in envd's JSON shape. Memory prefers the
//! sandbox's cgroup (v2 `memory.max`/`memory.current`, v1 `memory.limit_in_bytes`/
//! `memory.usage_in_bytes`) over `/proc/meminfo`, which shows the whole host.

use std::path::Path;
use std::sync::Mutex;

use serde::Serialize;

#[derive(Debug, Serialize, PartialEq)]
pub struct Metrics {
    pub ts: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f32,
    pub mem_total: u64,
    pub mem_used: u64,
    pub mem_cache: u64,
    pub mem_total_mib: u64,
    pub mem_used_mib: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// Remembers the previous `/proc/stat` sample so CPU use is measured between two calls.
#[derive(Default)]
pub struct CpuSampler {
    previous: Mutex<Option<(u64, u64)>>,
}

impl CpuSampler {
    pub fn sample_pct(&self) -> f32 {
        let Some((total, idle)) = read_cpu_times() else {
            return 0.0;
        };
        let mut prev = self.previous.lock().unwrap_or_else(|p| p.into_inner());
        let pct = match *prev {
            Some((pt, pi)) if total > pt => {
                let busy = (total - pt).saturating_sub(idle.saturating_sub(pi));
                (busy as f64 * 100.0 / (total - pt) as f64) as f32
            }
            _ => 0.0,
        };
        *prev = Some((total, idle));
        (pct * 100.0).round() / 100.0
    }
}

fn read_cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(stat.lines().next()?)
}

fn parse_cpu_line(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let values: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
    if values.len() < 4 {
        return None;
    }
    let idle = values[3] + values.get(4).copied().unwrap_or(0);
    Some((values.iter().sum(), idle))
}

fn meminfo_value(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// (total, used, cache) in bytes.
fn memory() -> (u64, u64, u64) {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let host_total = meminfo_value(&meminfo, "MemTotal").unwrap_or(0);
    let available = meminfo_value(&meminfo, "MemAvailable").unwrap_or(0);
    let cache = meminfo_value(&meminfo, "Cached").unwrap_or(0);
    let cgroup = [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ]
    .iter()
    .find_map(|(limit, usage)| Some((read_u64(limit)?, read_u64(usage)?)));
    match cgroup {
        Some((limit, usage)) if limit > 0 && limit < host_total => {
            (limit, usage.min(limit), cache.min(usage))
        }
        _ => (host_total, host_total.saturating_sub(available), cache),
    }
}

/// (used, total) bytes of the filesystem holding `root`.
fn disk(root: &Path) -> (u64, u64) {
    match nix::sys::statvfs::statvfs(root) {
        Ok(s) => {
            let frsize = s.fragment_size();
            let total = s.blocks() * frsize;
            let free = s.blocks_free() * frsize;
            (total.saturating_sub(free), total)
        }
        Err(_) => (0, 0),
    }
}

pub fn collect(sampler: &CpuSampler, root: &Path) -> Metrics {
    let (mem_total, mem_used, mem_cache) = memory();
    let (disk_used, disk_total) = disk(root);
    Metrics {
        ts: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
        cpu_count: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        cpu_used_pct: sampler.sample_pct(),
        mem_total,
        mem_used,
        mem_cache,
        mem_total_mib: mem_total >> 20,
        mem_used_mib: mem_used >> 20,
        disk_used,
        disk_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        assert_eq!(
            parse_cpu_line("cpu  10 0 10 70 10 0 0 0 0 0"),
            Some((100, 80))
        );
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4"), None);
        let mi = "MemTotal:       16000 kB\nMemAvailable:    4000 kB\nCached: 100 kB\n";
        assert_eq!(meminfo_value(mi, "MemTotal"), Some(16000 * 1024));
        assert_eq!(meminfo_value(mi, "Mem"), None);
        let m = collect(&CpuSampler::default(), Path::new("/"));
        assert!(m.mem_total > 0 && m.disk_total > 0 && m.cpu_count > 0);
    }
}
