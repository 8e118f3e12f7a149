//! Operations on a running sandbox: freeze/thaw, stats, processes, kill_process, list, commit_layer,
//! and the errors of bad calls.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::time::Duration;

use warren_runtime::{Runtime, RuntimeError, RuntimeState};

#[test]
fn freeze_thaw_stats_processes_and_kill() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("life");
    let sandbox = runtime
        .create(&common::spec("wt-life", vec![base], common::resources()))
        .expect("create");
    let id = sandbox.id.clone();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_eq!(sandbox.state, RuntimeState::Running);
        // The runtime (expedite_rcu on by default) switched the kernel to expedited grace periods.
        match std::fs::read_to_string("/sys/kernel/rcu_expedited") {
            Ok(value) => assert_eq!(value.trim(), "1", "rcu_expedited after LinuxRuntime::new"),
            Err(e) => println!("SKIP: rcu_expedited check: {e}"),
        }
        // Once the sandbox is up, its supervisor re-executes itself as the small `wait` image and
        // stays the init's parent. That happens after `create` returns (it is not on the create
        // path), so wait for it rather than expect it already done: under load it can lag.
        let supervisor_args = || -> Vec<String> {
            let status = std::fs::read_to_string(format!("/proc/{}/status", sandbox.init_pid))
                .unwrap_or_default();
            let Some(ppid) = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
            else {
                return Vec::new();
            };
            std::fs::read(format!("/proc/{ppid}/cmdline"))
                .unwrap_or_default()
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut args = supervisor_args();
        while args.get(1).map(String::as_str) != Some("wait")
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
            args = supervisor_args();
        }
        assert_eq!(args.get(1).map(String::as_str), Some("wait"), "{args:?}");
        assert_eq!(args.get(2), Some(&sandbox.init_pid.to_string()), "{args:?}");
        common::exec(&sandbox, "(sleep 600 >/dev/null 2>&1 &)");

        // Processes carry sandbox PIDs, parents inside the sandbox, users from its /etc/passwd.
        let processes = runtime.processes(&id).unwrap();
        let init = processes.iter().find(|p| p.pid == 1).expect("pid 1 listed");
        assert_eq!(init.ppid, 0);
        assert_eq!(init.user, "root");
        assert_eq!(init.command, "/.warren/agent");
        assert!(init.rss_bytes > 0);
        let sleeper = processes
            .iter()
            .find(|p| p.command == "sleep 600")
            .expect("sleep listed")
            .clone();
        assert!(sleeper.pid > 1);

        // Freeze: the agent stops answering; thaw: it answers again.
        runtime.freeze(&id).unwrap();
        assert_eq!(
            runtime
                .list()
                .unwrap()
                .iter()
                .find(|s| s.id == id)
                .unwrap()
                .state,
            RuntimeState::Frozen
        );
        let mut stream =
            std::net::TcpStream::connect_timeout(&sandbox.agent_addr(), Duration::from_secs(2))
                .unwrap();
        use std::io::{Read, Write};
        stream.write_all(b"echo thawed\n").unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut buf = [0u8; 64];
        assert!(stream.read(&mut buf).is_err(), "a frozen sandbox answered");
        runtime.thaw(&id).unwrap();
        drop(stream);
        assert_eq!(common::exec(&sandbox, "echo thawed").0.trim(), "thawed");

        // Stats.
        let stats = runtime.stats(&id).unwrap();
        assert!(stats.cpu_usage_usec > 0);
        assert!(
            stats.memory_bytes > 0 && stats.memory_bytes < stats.memory_limit_bytes,
            "{stats:?}"
        );
        assert_eq!(stats.memory_limit_bytes, 256 << 20);
        assert!(stats.pids >= 2, "{stats:?}");
        assert!(
            stats.disk_used_bytes > 0 && stats.disk_limit_bytes > 0,
            "{stats:?}"
        );

        // kill_process by sandbox PID.
        runtime.kill_process(&id, sleeper.pid, 9).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(runtime
            .processes(&id)
            .unwrap()
            .iter()
            .all(|p| p.pid != sleeper.pid));
        assert!(runtime.kill_process(&id, 99_999, 9).is_err());
        assert!(runtime.kill_process(&id, 1, 12_345).is_err());
    }));
    runtime.destroy(&id).unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn bad_calls_get_clear_errors() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("errors");
    assert!(matches!(
        runtime.destroy("wt-nope"),
        Err(RuntimeError::NotFound(_))
    ));
    assert!(matches!(
        runtime.stats("wt-nope"),
        Err(RuntimeError::NotFound(_))
    ));
    assert!(matches!(
        runtime.freeze("../etc"),
        Err(RuntimeError::InvalidSpec(_))
    ));
    let mut spec = common::spec(
        "wt-errors",
        vec![base.join("does-not-exist")],
        common::resources(),
    );
    assert!(
        matches!(runtime.create(&spec), Err(RuntimeError::InvalidSpec(m)) if m.contains("not a directory"))
    );
    spec.layers = vec![base.clone()];
    spec.resources.memory_mib = 1;
    assert!(
        matches!(runtime.create(&spec), Err(RuntimeError::InvalidSpec(m)) if m.contains("memory_mib"))
    );
    spec.resources = common::resources();
    let sandbox = runtime.create(&spec).expect("create");
    let _cleanup = common::DestroyOnDrop(&runtime, vec![sandbox.id.clone()]);
    assert!(matches!(
        runtime.create(&spec),
        Err(RuntimeError::AlreadyExists(_))
    ));
    // Checkpoints of a sandbox that does not exist are refused whatever CRIU can do here.
    let dest = runtime.config().state_dir.join("snap");
    assert!(matches!(
        runtime.checkpoint("wt-nope", &dest, true),
        Err(RuntimeError::NotFound(_))
    ));
    // The sandbox still works after the refused calls.
    assert_eq!(common::exec(&sandbox, "echo ok").0.trim(), "ok");
    runtime.destroy(&sandbox.id).unwrap();
    assert!(common::leftovers(
        &runtime.config().state_dir,
        std::slice::from_ref(&sandbox.id)
    )
    .is_empty());
}

#[test]
fn a_failed_create_leaves_nothing() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let mut config = warren_runtime::LinuxRuntimeConfig {
        state_dir: common::state_dir("failcreate"),
        agent_binary: std::path::PathBuf::from("/bin/false"),
        supervisor_binary: Some(std::path::PathBuf::from(env!(
            "CARGO_BIN_EXE_warren-supervisor"
        ))),
        ..Default::default()
    };
    config.agent_timeout = Duration::from_secs(5);
    // /bin/false of the host is dynamically linked against the host's libc, present in the rootfs too:
    // it runs, exits 1, and the agent never listens.
    let runtime = warren_runtime::LinuxRuntime::new(config).unwrap();
    let error = runtime
        .create(&common::spec(
            "wt-failcreate",
            vec![base],
            common::resources(),
        ))
        .unwrap_err();
    assert!(error.to_string().contains("exited"), "{error}");
    let left = common::leftovers(&runtime.config().state_dir, &["wt-failcreate".to_string()]);
    warren_runtime::rootfs::lxcfs::stop(&runtime.config().state_dir);
    let _ = std::fs::remove_dir_all(&runtime.config().state_dir);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn list_finds_sandboxes_of_a_previous_runtime_and_reclaims_dead_ones() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let first = common::runtime("list");
    let live = first
        .create(&common::spec(
            "wt-list-live",
            vec![base.clone()],
            common::resources(),
        ))
        .expect("create");
    let dead = first
        .create(&common::spec(
            "wt-list-dead",
            vec![base],
            common::resources(),
        ))
        .expect("create");
    drop(first);
    // The init of one dies behind the runtime's back.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dead.init_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // A new runtime on the same state dir (a restarted server) sees only the live one.
    let second = common::runtime("list");
    let listed = second.list().unwrap();
    let ids: Vec<_> = listed.iter().map(|s| s.id.as_str()).collect();
    second.destroy(&live.id).unwrap();
    assert_eq!(ids, vec!["wt-list-live"]);
    assert_eq!(listed[0].ip, live.ip);
    assert_eq!(listed[0].init_pid, live.init_pid);
    let left = common::leftovers(
        &second.config().state_dir,
        &[live.id.clone(), dead.id.clone()],
    );
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn commit_layer_makes_a_layer_new_sandboxes_stack_on() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("commit");
    let builder = runtime
        .create(&common::spec(
            "wt-commit-build",
            vec![base.clone()],
            common::resources(),
        ))
        .expect("create");
    let (out, code) = common::exec(
        &builder,
        "echo built > /opt/marker && rm /usr/bin/yes && mkdir -p /srv/app && echo v1 > /srv/app/v",
    );
    assert_eq!(code, 0, "{out}");
    let layer = runtime.config().state_dir.join("templates/wt-layer");
    let bytes = runtime.commit_layer(&builder.id, &layer).unwrap();
    runtime.destroy(&builder.id).unwrap();
    assert!(bytes >= 9, "{bytes}");
    assert!(!layer.join(".warren").exists());
    let child = runtime
        .create(&common::spec(
            "wt-commit-use",
            vec![layer.clone(), base.clone()],
            common::resources(),
        ))
        .expect("create");
    let (out, code) = common::exec(
        &child,
        "cat /opt/marker /srv/app/v; test ! -e /usr/bin/yes && echo deleted",
    );
    runtime.destroy(&child.id).unwrap();
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "built\nv1\ndeleted\n");
    assert!(base.join("usr/bin/yes").exists());
}
