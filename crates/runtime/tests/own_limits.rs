//! Inside a sandbox, `nproc`, `free`, /proc/meminfo, /proc/cpuinfo and /proc/uptime tell the
//! sandbox's own limits and life (lxcfs plus the cpuset), and still do after a checkpoint and restore.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use warren_runtime::{Resources, Runtime, Sandbox};

/// Destroys the test's sandboxes and state dir even when an assertion fails midway.
struct Cleanup<'a>(&'a warren_runtime::LinuxRuntime, &'static [&'static str]);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for id in self.1 {
            let _ = self.0.destroy(id);
        }
        warren_runtime::rootfs::lxcfs::stop(&self.0.config().state_dir);
        let _ = std::fs::remove_dir_all(&self.0.config().state_dir);
    }
}

fn figure(sandbox: &Sandbox, command: &str) -> u64 {
    let (output, code) = common::exec(sandbox, command);
    assert_eq!(code, 0, "{command}: {output}");
    output
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{command} printed {output:?}"))
}

/// What the sandbox reports of itself: (nproc, processors in cpuinfo, MemTotal MiB, `free -m` total,
/// uptime seconds).
fn own_view(sandbox: &Sandbox) -> (u64, u64, u64, u64, u64) {
    (
        figure(sandbox, "nproc"),
        figure(sandbox, "grep -c ^processor /proc/cpuinfo"),
        figure(
            sandbox,
            "awk '/^MemTotal/ {print int($2/1024)}' /proc/meminfo",
        ),
        figure(sandbox, "free -m | awk '/^Mem:/ {print $2}'"),
        figure(sandbox, "cut -d. -f1 /proc/uptime"),
    )
}

#[test]
fn nproc_free_and_proc_show_the_sandbox_limits() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    if !std::path::Path::new("/usr/bin/lxcfs").exists() {
        println!("SKIP: lxcfs is not installed (apt-get install lxcfs)");
        return;
    }
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if host_cpus < 2 {
        println!("SKIP: one CPU on this host, a one-vCPU sandbox cannot look smaller");
        return;
    }
    let runtime = common::runtime("ownlimits");
    let _cleanup = Cleanup(&runtime, &["wt-own-limits"]);
    let resources = Resources {
        vcpus: 1.0,
        memory_mib: 192,
        ..common::resources()
    };
    let spec = common::spec("wt-own-limits", vec![base], resources);
    let sandbox = runtime.create(&spec).expect("create");
    let (nproc, cpuinfo, meminfo, free, uptime) = own_view(&sandbox);
    assert_eq!(nproc, 1, "nproc shows the host's {host_cpus} CPUs");
    assert_eq!(cpuinfo, 1, "/proc/cpuinfo lists the host's CPUs");
    assert_eq!(meminfo, 192, "/proc/meminfo shows the host's memory");
    assert_eq!(free, 192, "free -m shows the host's memory");
    let host_uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (uptime as f64) < host_uptime - 1.0 || host_uptime < 120.0,
        "uptime {uptime} s is the host's ({host_uptime} s)"
    );

    if !runtime.capabilities().checkpoint {
        println!("SKIP: CRIU does not work on this host; pause/resume part not run");
        return;
    }
    let checkpoint = runtime.config().state_dir.join("snapshots").join("own");
    runtime
        .checkpoint(&spec.id, &checkpoint, false)
        .expect("checkpoint with the lxcfs mounts");
    let restored = runtime.restore(&checkpoint, &spec).expect("restore");
    let (nproc, cpuinfo, meminfo, free, _) = own_view(&restored);
    assert_eq!((nproc, cpuinfo, meminfo, free), (1, 1, 192, 192));

    // With its sandboxes gone, stopping the state dir's lxcfs ends the daemon.
    runtime.destroy(&spec.id).expect("destroy");
    let state_dir = runtime.config().state_dir.clone();
    let pid: i32 = std::fs::read_to_string(state_dir.join("lxcfs.pid"))
        .expect("lxcfs pidfile")
        .trim()
        .parse()
        .expect("pid");
    warren_runtime::rootfs::lxcfs::stop(&state_dir);
    let mut ended = false;
    for _ in 0..500 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for the runtime's reaper thread.
        if status.is_empty() || status.split(' ').nth(2) == Some("Z") {
            ended = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(ended, "lxcfs {pid} still runs after stop");
}
