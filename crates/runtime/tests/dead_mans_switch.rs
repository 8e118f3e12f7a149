//! The supervisor's dead man's switch: a sandbox whose deadline passes without renewal is ended by
//! its own supervisor, with nobody else calling the runtime; a renewed one keeps running.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::time::{Duration, Instant};

use warren_runtime::supervisor::deadline;
use warren_runtime::Runtime;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.split(' ').nth(2) != Some("Z"))
        .unwrap_or(false)
}

#[test]
fn a_sandbox_whose_deadline_passes_is_ended_by_its_supervisor() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("deadman");
    let ended = runtime
        .create(&common::spec(
            "wt-deadman",
            vec![base.clone()],
            common::resources(),
        ))
        .expect("create");
    let renewed = runtime
        .create(&common::spec(
            "wt-deadman-kept",
            vec![base],
            common::resources(),
        ))
        .expect("create");
    let dir = runtime.sandbox_dir(&ended.id);
    let first = deadline::read(&dir).expect("create writes a deadline");
    assert!(
        first > now_ms() + 60_000,
        "initial lease too short: {first}"
    );

    // Both deadlines one second away; only one is renewed for an hour.
    runtime.renew(&ended.id, now_ms() + 1000).expect("renew");
    runtime.renew(&renewed.id, now_ms() + 1000).expect("renew");
    runtime
        .renew(&renewed.id, now_ms() + 3_600_000)
        .expect("renew again");

    let started = Instant::now();
    while alive(ended.init_pid) && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !alive(ended.init_pid),
        "the supervisor did not end the sandbox"
    );
    assert!(dir.join(deadline::EXPIRED_FILE).exists());
    assert!(alive(renewed.init_pid), "the renewed sandbox was ended too");
    assert_eq!(common::exec(&renewed, "echo ok").0, "ok\n");
    assert!(matches!(
        runtime.renew(&ended.id, now_ms() + 1000),
        Err(warren_runtime::RuntimeError::NotFound(_))
    ));
    runtime.destroy(&ended.id).ok();
    runtime.destroy(&renewed.id).expect("destroy");
}

#[test]
fn a_sandbox_whose_deadline_file_vanished_ends_at_the_last_deadline_read() {
    // A stopped server whose state directory is then removed (a test's temp dir, `rm -rf` by an
    // operator) takes the deadline file with it: the sandbox must still end at its last lease.
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("deadman-gone");
    let sandbox = runtime
        .create(&common::spec(
            "wt-deadman-gone",
            vec![base],
            common::resources(),
        ))
        .expect("create");
    let dir = runtime.sandbox_dir(&sandbox.id);
    runtime.renew(&sandbox.id, now_ms() + 2000).expect("renew");
    // The waiter reads the file once a second. A read after the renewal (which wrote a new file)
    // moves the file's access time past its modification time (relatime): from then on the waiter
    // knows the short lease. Then the file goes.
    let file = dir.join(deadline::DEADLINE_FILE);
    let read_since_written =
        || std::fs::metadata(&file).is_ok_and(|m| m.accessed().unwrap() > m.modified().unwrap());
    let started = Instant::now();
    while !read_since_written() && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        read_since_written(),
        "the waiter never read its renewed deadline"
    );
    std::fs::remove_file(dir.join(deadline::DEADLINE_FILE)).unwrap();

    let started = Instant::now();
    while alive(sandbox.init_pid) && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let ended = !alive(sandbox.init_pid);
    runtime.destroy(&sandbox.id).ok();
    assert!(
        ended,
        "the sandbox outlived its last lease once the deadline file was gone"
    );
}

/// A supervisor killed from outside (SIGKILL): the sandbox runs on, and the next look at the host
/// (`list`, which the server's sweep calls every few seconds) gives it a new supervisor, recorded in
/// its state, whose dead man's switch ends it when its deadline passes. Without that, the sandbox
/// would run on unsupervised, outliving every deadline and holding its disk after the server stops.
#[test]
fn a_killed_supervisor_is_replaced_and_the_switch_holds_again() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("deadsup");
    let sandbox = runtime
        .create(&common::spec("wt-deadsup", vec![base], common::resources()))
        .expect("create");
    let dir = runtime.sandbox_dir(&sandbox.id);
    let record = warren_runtime::sandbox_state::SandboxRecord::read(&dir)
        .unwrap()
        .expect("a state record");
    let old = record.supervisor_pid;
    assert!(alive(old));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let started = Instant::now();
    while alive(old) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(old), "the supervisor did not die");
    assert_eq!(common::exec(&sandbox, "echo alive").0, "alive\n");

    let listed = runtime.list().expect("list");
    assert!(listed.iter().any(|s| s.id == sandbox.id));
    let record = warren_runtime::sandbox_state::SandboxRecord::read(&dir)
        .unwrap()
        .expect("a state record");
    let new = record.supervisor_pid;
    assert_ne!(new, old);
    assert!(alive(new), "no new supervisor");
    assert!(warren_runtime::crash_recovery::is_supervisor(new, &dir));
    // A second pass leaves the new one alone.
    runtime.list().expect("list");
    assert_eq!(
        warren_runtime::sandbox_state::SandboxRecord::read(&dir)
            .unwrap()
            .unwrap()
            .supervisor_pid,
        new
    );

    runtime.renew(&sandbox.id, now_ms() + 500).expect("renew");
    let started = Instant::now();
    while alive(sandbox.init_pid) && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !alive(sandbox.init_pid),
        "the new supervisor did not end the sandbox at its deadline"
    );
    let started = Instant::now();
    while alive(new) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(new), "the new supervisor outlived its sandbox");
    runtime.destroy(&sandbox.id).ok();
    assert!(!dir.exists(), "the sandbox's directory is gone");
}
