//! Measures create→agent-answers latency (p50/p90/max) and the per-sandbox memory overhead.
//!
//! Run as root: `cargo bench -p warren-runtime --bench create_latency` (env: WARREN_BENCH_N sandboxes,
//! default 50; WARREN_TEST_AGENT to use the real agent instead of the test stand-in).
//! `create` returns only once the agent's port accepts a TCP connection, so its duration is the
//! create→agent-answers time.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use warren_runtime::{Resources, Runtime};

fn mem_available_kib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let n: usize = std::env::var("WARREN_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let runtime = common::runtime("bench");
    let resources = Resources {
        vcpus: 1.0,
        memory_mib: 512,
        disk_mib: 1024,
        max_pids: 256,
    };
    // Warm the page cache and the bridge once.
    let warm = runtime
        .create(&common::spec(
            "wt-bench-warm",
            vec![base.clone()],
            resources.clone(),
        ))
        .expect("create");
    runtime.destroy(&warm.id).expect("destroy");

    let before = mem_available_kib();
    let mut latencies = Vec::new();
    let mut sandboxes = Vec::new();
    for i in 0..n {
        let spec = common::spec(
            &format!("wt-bench-{i}"),
            vec![base.clone()],
            resources.clone(),
        );
        let start = Instant::now();
        let sandbox = runtime.create(&spec).expect("create");
        latencies.push(start.elapsed().as_secs_f64() * 1000.0);
        sandboxes.push(sandbox);
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = mem_available_kib();
    let mut cgroup_bytes = 0;
    let mut supervisor_kib = 0;
    for sandbox in &sandboxes {
        cgroup_bytes += runtime
            .stats(&sandbox.id)
            .map(|s| s.memory_bytes)
            .unwrap_or(0);
        let record =
            warren_runtime::sandbox_state::SandboxRecord::read(&runtime.sandbox_dir(&sandbox.id))
                .ok()
                .flatten();
        supervisor_kib += record.map_or(0, |r| rss_kib(r.supervisor_pid));
    }
    if let Some(last) = sandboxes.last() {
        // Where the supervisor's share of the time went (phase lines of its log).
        let log = std::fs::read_to_string(runtime.sandbox_dir(&last.id).join("supervisor.log"))
            .unwrap_or_default();
        println!("supervisor phases of {}:\n{log}", last.id);
    }
    let start = Instant::now();
    for sandbox in &sandboxes {
        runtime.destroy(&sandbox.id).expect("destroy");
    }
    let destroy_ms = start.elapsed().as_secs_f64() * 1000.0 / n as f64;
    let _ = std::fs::remove_dir_all(&runtime.config().state_dir);

    latencies.sort_by(f64::total_cmp);
    println!("sandboxes: {n} (agent: {})", common::test_agent().display());
    println!(
        "create→agent-answers ms: p50 {:.1}  p90 {:.1}  max {:.1}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        percentile(&latencies, 1.0)
    );
    println!("destroy ms (mean): {destroy_ms:.1}");
    println!(
        "memory per sandbox: host MemAvailable drop {:.1} MiB; of it in the sandbox cgroup {:.1} MiB; supervisor RSS {:.1} MiB",
        (before.saturating_sub(after)) as f64 / 1024.0 / n as f64,
        cgroup_bytes as f64 / (1 << 20) as f64 / n as f64,
        supervisor_kib as f64 / 1024.0 / n as f64
    );
}
