//! Resource limits: CPU quota, memory limit, disk size, pids limit; the host stays responsive.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::time::{Duration, Instant};

use warren_runtime::{LinuxRuntime, Resources, Runtime, Sandbox};

struct Guard<'a>(&'a LinuxRuntime, Vec<String>);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        for id in &self.1 {
            let _ = self.0.destroy(id);
        }
    }
}

fn host_is_responsive() {
    let status = std::process::Command::new("true")
        .status()
        .expect("host can fork");
    assert!(status.success());
}

/// CPU time the sandbox used over `window`, as a fraction of one core.
fn cpu_share(runtime: &LinuxRuntime, sandbox: &Sandbox, window: Duration) -> f64 {
    let before = runtime.stats(&sandbox.id).unwrap().cpu_usage_usec;
    let start = Instant::now();
    std::thread::sleep(window);
    let after = runtime.stats(&sandbox.id).unwrap().cpu_usage_usec;
    (after - before) as f64 / start.elapsed().as_micros() as f64
}

#[test]
fn busy_loops_are_held_to_the_cpu_quota() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("cpu");
    let resources = Resources {
        vcpus: 0.5,
        ..common::resources()
    };
    let sandbox = runtime
        .create(&common::spec("wt-cpu", vec![base], resources))
        .expect("create");
    let _guard = Guard(&runtime, vec![sandbox.id.clone()]);
    // Two loops could use two cores; the quota allows half of one.
    common::exec(
        &sandbox,
        "for i in 1 2; do (while true; do :; done) >/dev/null 2>&1 & done",
    );
    std::thread::sleep(Duration::from_millis(300));
    let share = cpu_share(&runtime, &sandbox, Duration::from_secs(2));
    assert!(share > 0.2, "the loops did not run: {share:.2} of a core");
    assert!(
        share < 0.6,
        "quota of 0.5 vCPU exceeded: {share:.2} of a core"
    );
    let stats = runtime.stats(&sandbox.id).unwrap();
    assert!(stats.cpu_percent < 60.0, "{stats:?}");
    // The process list names the culprits.
    let processes = runtime.processes(&sandbox.id).unwrap();
    let busy: Vec<_> = processes.iter().filter(|p| p.cpu_percent > 5.0).collect();
    assert!(!busy.is_empty(), "{processes:?}");
    assert!(busy.iter().all(|p| p.command.contains("sh")), "{busy:?}");
    host_is_responsive();
}

#[test]
fn allocating_twice_the_memory_limit_kills_only_the_hog() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("mem");
    let resources = Resources {
        memory_mib: 64,
        ..common::resources()
    };
    let sandbox = runtime
        .create(&common::spec("wt-mem", vec![base.clone()], resources))
        .expect("create");
    let neighbour = runtime
        .create(&common::spec("wt-mem-n", vec![base], common::resources()))
        .expect("create");
    let _guard = Guard(&runtime, vec![sandbox.id.clone(), neighbour.id.clone()]);
    let (out, code) = common::exec(
        &sandbox,
        "python3 -c \"b = b'x' * (128 << 20); print(len(b))\"",
    );
    assert_eq!(
        code, 137,
        "the hog must be SIGKILLed by the OOM killer: {out}"
    );
    // The sandbox's agent (PID 1) and the neighbour live on.
    assert_eq!(common::exec(&sandbox, "echo alive").0.trim(), "alive");
    assert_eq!(common::exec(&neighbour, "echo alive").0.trim(), "alive");
    let stats = runtime.stats(&sandbox.id).unwrap();
    assert_eq!(stats.memory_limit_bytes, 64 << 20);
    host_is_responsive();
}

#[test]
fn filling_the_disk_ends_in_enospc() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("disk");
    let resources = Resources {
        disk_mib: 32,
        ..common::resources()
    };
    let sandbox = runtime
        .create(&common::spec("wt-disk", vec![base.clone()], resources))
        .expect("create");
    let neighbour = runtime
        .create(&common::spec("wt-disk-n", vec![base], common::resources()))
        .expect("create");
    let _guard = Guard(&runtime, vec![sandbox.id.clone(), neighbour.id.clone()]);
    let (out, code) = common::exec(
        &sandbox,
        "dd if=/dev/zero of=/home/user/fill bs=1M count=100 2>&1",
    );
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("No space left on device"), "{out}");
    let stats = runtime.stats(&sandbox.id).unwrap();
    assert!(
        stats.disk_used_bytes > stats.disk_limit_bytes * 9 / 10,
        "{stats:?}"
    );
    assert!(stats.disk_limit_bytes <= 32 << 20, "{stats:?}");
    // Deleting frees it again, and the neighbour never noticed.
    assert_eq!(
        common::exec(&sandbox, "rm /home/user/fill && echo freed")
            .0
            .trim(),
        "freed"
    );
    let (out, code) = common::exec(
        &neighbour,
        "dd if=/dev/zero of=/home/user/ok bs=1M count=8 2>&1",
    );
    assert_eq!(code, 0, "{out}");
    host_is_responsive();
}

#[test]
fn fork_bomb_stops_at_the_pids_limit() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("pids");
    let resources = Resources {
        max_pids: 64,
        vcpus: 0.5,
        ..common::resources()
    };
    let sandbox = runtime
        .create(&common::spec("wt-pids", vec![base], resources))
        .expect("create");
    let _guard = Guard(&runtime, vec![sandbox.id.clone()]);
    common::exec(&sandbox, "(bash -c ':(){ :|:& };:' >/dev/null 2>&1 &)");
    let mut peak = 0;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        peak = peak.max(runtime.stats(&sandbox.id).unwrap().pids);
        host_is_responsive();
    }
    assert!(peak >= 48, "the bomb never reached the limit (peak {peak})");
    assert!(peak <= 64, "pids limit exceeded: {peak}");
    // Destroy still takes everything down.
    runtime
        .destroy(&sandbox.id)
        .expect("destroy during a fork bomb");
    let left = common::leftovers(
        &runtime.config().state_dir,
        std::slice::from_ref(&sandbox.id),
    );
    assert!(left.is_empty(), "{left:?}");
}
