//! Pause (checkpoint without leave_running, sandbox torn down) and resume (restore until the agent
//! answers) times through [`warren_runtime::LinuxRuntime`], for a sandbox holding 10, 100 and 500 MiB
//! resident in one Python process; plus fork-style checkpoints (leave_running): their duration and the
//! longest time the running original stopped answering meanwhile ("fork-stall"); and the p50 of
//! creating a sandbox from a running template (restore under a new ID).
//!
//! Run as root: `cargo bench -p warren-runtime --bench checkpoint_pause_resume` (or
//! `benches/checkpoint-pause-resume.sh`). Env: WARREN_BENCH_MIB (comma list, default 10,100,500),
//! WARREN_BENCH_REPEAT (default 3), WARREN_BENCH_KEEP=1 (keep the checkpoints and their CRIU logs), WARREN_BENCH_FILL=random|text (default random: incompressible, the
//! worst case for size; `text` is repetitive like many real heaps).

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use warren_runtime::{Resources, Runtime, Sandbox};

fn resident_bytes(runtime: &impl Runtime, id: &str) -> u64 {
    runtime.stats(id).map(|s| s.memory_bytes).unwrap_or(0)
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn start_holder(sandbox: &Sandbox, mib: u64, fill: &str) {
    let data = match fill {
        "text" => {
            format!("(b'warren sandbox heap ' * ({mib} * 1024 * 1024 // 21 + 1))[:{mib} << 20]")
        }
        _ => format!("os.urandom({mib} << 20)"),
    };
    let program = format!("import os, time; data = bytearray({data}); open('/tmp/ready', 'w').write('1'); time.sleep(1e6)");
    let (out, code) = common::exec(
        sandbox,
        &format!("setsid python3 -c \"{program}\" >/dev/null 2>&1 </dev/null &"),
    );
    assert_eq!(code, 0, "{out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::exec(sandbox, "cat /tmp/ready 2>/dev/null").0 != "1" {
        assert!(Instant::now() < deadline, "holder did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Destroys what a run made even when it panics.
struct Cleanup<'a> {
    runtime: &'a warren_runtime::LinuxRuntime,
    ids: Vec<String>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = self.runtime.destroy(id);
        }
    }
}

/// Template start: restores of one checkpoint of a running sandbox under new IDs, until each agent
/// answers (what creating a sandbox from a running template costs).
fn template_starts(
    runtime: &warren_runtime::LinuxRuntime,
    base: &std::path::Path,
    n: usize,
) -> Vec<Duration> {
    let resources = Resources {
        vcpus: 1.0,
        memory_mib: 512,
        disk_mib: 256,
        max_pids: 256,
    };
    let spec = common::spec(
        "wt-ckbench-tmpl",
        vec![base.to_path_buf()],
        resources.clone(),
    );
    let mut cleanup = Cleanup {
        runtime,
        ids: vec![spec.id.clone()],
    };
    let template = runtime.create(&spec).expect("create template sandbox");
    start_holder(&template, 10, "text");
    let checkpoint = runtime.config().state_dir.join("snapshots/template");
    runtime
        .checkpoint(&spec.id, &checkpoint, false)
        .expect("template checkpoint");
    let mut times = Vec::new();
    for i in 0..n {
        let copy = common::spec(
            &format!("wt-ckbench-t{i}"),
            vec![base.to_path_buf()],
            resources.clone(),
        );
        cleanup.ids.push(copy.id.clone());
        let started = Instant::now();
        let sandbox = runtime
            .restore(&checkpoint, &copy)
            .expect("start from template");
        times.push(started.elapsed());
        assert_eq!(common::exec(&sandbox, "cat /tmp/ready").0, "1");
        runtime.destroy(&copy.id).expect("destroy copy");
    }
    times
}

fn main() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("ckbench");
    if !runtime.capabilities().checkpoint {
        println!("SKIP: CRIU does not work on this host (run scripts/setup)");
        return;
    }
    let sizes: Vec<u64> = std::env::var("WARREN_BENCH_MIB")
        .unwrap_or_else(|_| "10,100,500".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let repeat: usize = std::env::var("WARREN_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let fill = std::env::var("WARREN_BENCH_FILL").unwrap_or_else(|_| "random".into());
    let snapshots = runtime.config().state_dir.join("snapshots");
    println!("fill: {fill}; {repeat} runs per size; times are medians");
    println!(
        "{:>8} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "MiB", "resident", "pause", "resume", "fork-stall", "fork-total", "stored"
    );
    for mib in sizes {
        let resources = Resources {
            vcpus: 2.0,
            memory_mib: mib + 512,
            disk_mib: 256,
            max_pids: 256,
        };
        let id = format!("wt-ckbench-{mib}");
        let spec = common::spec(&id, vec![base.clone()], resources);
        let _cleanup = Cleanup {
            runtime: &runtime,
            ids: vec![id.clone()],
        };
        let sandbox = runtime.create(&spec).expect("create");
        start_holder(&sandbox, mib, &fill);
        let resident = resident_bytes(&*runtime, &id);
        let (mut pauses, mut resumes, mut fork_frozen, mut fork_total) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut stored = 0;
        for run in 0..repeat {
            let fork_dest = snapshots.join(format!("{id}-fork-{run}"));
            // How long the original stops answering during a fork checkpoint: the longest gap between
            // two completed commands while it runs.
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let prober = {
                let (stop, sandbox) = (stop.clone(), sandbox.clone());
                std::thread::spawn(move || {
                    let mut last = Instant::now();
                    let mut longest = Duration::ZERO;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = common::exec(&sandbox, "true");
                        longest = longest.max(last.elapsed());
                        last = Instant::now();
                    }
                    longest
                })
            };
            std::thread::sleep(Duration::from_millis(100));
            let started = Instant::now();
            runtime
                .checkpoint(&id, &fork_dest, true)
                .expect("fork checkpoint");
            fork_total.push(started.elapsed());
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            fork_frozen.push(prober.join().expect("prober"));
            std::fs::remove_dir_all(&fork_dest).expect("remove fork checkpoint");

            let dest = snapshots.join(format!("{id}-pause-{run}"));
            let started = Instant::now();
            let info = runtime.checkpoint(&id, &dest, false).expect("pause");
            pauses.push(started.elapsed());
            stored = info.size_bytes;
            let started = Instant::now();
            let resumed = runtime.restore(&dest, &spec).expect("resume");
            resumes.push(started.elapsed());
            assert_eq!(common::exec(&resumed, "cat /tmp/ready").0, "1");
            if std::env::var_os("WARREN_BENCH_KEEP").is_none() {
                std::fs::remove_dir_all(&dest).expect("remove checkpoint");
            }
        }
        println!(
            "{:>8} {:>9.0}M {:>10.2?} {:>10.2?} {:>12} {:>12.2?} {:>9.0}M",
            mib,
            resident as f64 / (1 << 20) as f64,
            median(pauses),
            median(resumes),
            format!("{:.2?}", median(fork_frozen)),
            median(fork_total),
            stored as f64 / (1 << 20) as f64
        );
        runtime.destroy(&id).expect("destroy");
    }
    let mut starts = template_starts(&runtime, &base, 10);
    starts.sort();
    println!(
        "create from a running template (restore under a new ID until the agent answers), 10 runs: p50 {:.2?}, max {:.2?}",
        starts[starts.len() / 2],
        starts[starts.len() - 1]
    );
    if std::env::var_os("WARREN_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&runtime.config().state_dir);
    } else {
        println!("kept {}", runtime.config().state_dir.display());
    }
}
