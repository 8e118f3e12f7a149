//! Supervisors started ahead of need (`LinuxRuntimeConfig::standby_supervisors`): a create hands its
//! sandbox to a waiting one, the pool refills, a standby killed from outside is passed over, and the
//! standbys end with the runtime that started them.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::time::{Duration, Instant};

use warren_runtime::{LinuxRuntime, LinuxRuntimeConfig, Runtime};

fn runtime_with_standbys(name: &str, standbys: usize) -> common::TestRuntime {
    let config = LinuxRuntimeConfig {
        standby_supervisors: standbys,
        ..common::config(name)
    };
    LinuxRuntime::new(config).expect("runtime").into()
}

/// Waits (bounded) until `condition` holds; false if it never did.
fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

fn alive(pid: u32) -> bool {
    // A dead standby is reaped by the host's init at once; a zombie would still count as alive here.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(')').expect("stat format");
    rest.split_whitespace()
        .nth(1)
        .and_then(|ppid| ppid.parse().ok())
        .expect("ppid")
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
        .unwrap_or_default()
}

#[test]
fn a_create_takes_a_standby_and_the_pool_refills() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = runtime_with_standbys("standby-take", 1);
    assert!(
        eventually(|| runtime.standby_supervisor_pids().len() == 1),
        "the pool never got its standby"
    );
    let standby = runtime.standby_supervisor_pids()[0];
    assert!(
        cmdline(standby).contains("warren-supervisor standby"),
        "{}",
        cmdline(standby)
    );

    let id = "wt-standby-take";
    let _cleanup = common::DestroyOnDrop(&runtime, vec![id.to_string()]);
    let sandbox = runtime
        .create(&common::spec(id, vec![base.clone()], common::resources()))
        .expect("create");
    // The standby became this sandbox's supervisor: the init is its child, and it now waits on it.
    assert_eq!(parent_of(sandbox.init_pid), standby);
    assert!(
        eventually(|| cmdline(standby).contains(&format!("wait {}", sandbox.init_pid))),
        "the standby did not become the sandbox's waiter: {}",
        cmdline(standby)
    );
    let (out, code) = common::exec(&sandbox, "echo hello from $(hostname)");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello from"), "{out}");

    // A new standby, not the one handed out.
    assert!(
        eventually(|| runtime
            .standby_supervisor_pids()
            .iter()
            .any(|pid| *pid != standby)),
        "the pool did not refill"
    );
    runtime.destroy(id).expect("destroy");
    assert!(
        eventually(|| !alive(standby)),
        "the sandbox's supervisor outlived it"
    );
}

#[test]
fn a_standby_killed_from_outside_is_passed_over() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = runtime_with_standbys("standby-killed", 1);
    assert!(eventually(|| runtime.standby_supervisor_pids().len() == 1));
    let standby = runtime.standby_supervisor_pids()[0];
    // SAFETY: kill(2) of the standby this test's runtime started.
    assert_eq!(unsafe { libc::kill(standby as i32, libc::SIGKILL) }, 0);
    assert!(eventually(|| !alive(standby)));

    let id = "wt-standby-killed";
    let _cleanup = common::DestroyOnDrop(&runtime, vec![id.to_string()]);
    let sandbox = runtime
        .create(&common::spec(id, vec![base], common::resources()))
        .expect("create after the standby died");
    assert_ne!(parent_of(sandbox.init_pid), standby);
    let (out, code) = common::exec(&sandbox, "true");
    assert_eq!(code, 0, "{out}");
    runtime.destroy(id).expect("destroy");
}

#[test]
fn standbys_end_with_their_runtime_and_hold_nothing() {
    if common::base_rootfs().is_none() {
        return;
    }
    let runtime = runtime_with_standbys("standby-end", 2);
    assert!(eventually(|| runtime.standby_supervisor_pids().len() == 2));
    let pids = runtime.standby_supervisor_pids();
    let state_dir = runtime.config().state_dir.clone();
    for pid in &pids {
        // Nothing of a sandbox yet: no mount namespace of its own, nothing under the state dir open.
        let own = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).expect("mnt ns");
        let ours = std::fs::read_link("/proc/self/ns/mnt").expect("own mnt ns");
        assert_eq!(own, ours, "standby {pid} has a mount namespace of its own");
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("fds") {
            let target = std::fs::read_link(fd.expect("fd").path()).unwrap_or_default();
            assert!(
                !target.starts_with(&state_dir),
                "standby {pid} holds {}",
                target.display()
            );
        }
    }
    drop(runtime);
    for pid in pids {
        assert!(
            eventually(|| !alive(pid)),
            "standby {pid} outlived its runtime"
        );
    }
}
