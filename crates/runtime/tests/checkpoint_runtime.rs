//! Checkpoint and restore through [`LinuxRuntime`] (the real supervisor, namespaces, loop-disk layer,
//! seccomp, bridge and nftables): pause = checkpoint without leave_running, resume under the same ID at
//! the same address with the counter going on; fork = checkpoint with leave_running, restored under a
//! new ID at a new address and hostname, diverging; nothing left behind.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::time::{Duration, Instant};

use warren_runtime::{Runtime, RuntimeError, Sandbox};

fn counter(sandbox: &Sandbox) -> u64 {
    let (out, code) = common::exec(sandbox, "tail -n 1 /tmp/counter");
    assert_eq!(code, 0, "{out}");
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("counter file says {out:?}"))
}

/// Waits until the counter passes `above`.
fn counts_past(sandbox: &Sandbox, above: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = counter(sandbox);
        if now > above {
            return now;
        }
        assert!(Instant::now() < deadline, "counter stuck at {now}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn consecutive(sandbox: &Sandbox) {
    let (out, code) = common::exec(sandbox, "cat /tmp/counter");
    assert_eq!(code, 0);
    for (at, line) in out.lines().enumerate() {
        assert_eq!(
            line,
            (at + 1).to_string(),
            "counter file breaks at line {}",
            at + 1
        );
    }
}

#[test]
fn pause_resume_and_fork_through_the_runtime() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("ckpt");
    if !runtime.capabilities().checkpoint {
        println!("SKIP: CRIU does not work on this host (run scripts/setup)");
        return;
    }
    let _cleanup = common::DestroyOnDrop(
        &runtime,
        ["wt-ck-rt", "wt-ck-rt-fork"].map(String::from).to_vec(),
    );
    let spec = common::spec("wt-ck-rt", vec![base.clone()], common::resources());
    let sandbox = runtime.create(&spec).expect("create");
    let (out, code) = common::exec(
        &sandbox,
        "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i >> /tmp/counter; sleep 0.01; done' >/dev/null 2>&1 < /dev/null &",
    );
    assert_eq!(code, 0, "{out}");
    let before = counts_past(&sandbox, 2);

    // Pause: the sandbox is gone afterwards, its checkpoint holds it.
    let snapshots = runtime.config().state_dir.join("snapshots");
    let paused = snapshots.join("pause-1");
    let info = runtime
        .checkpoint("wt-ck-rt", &paused, false)
        .expect("checkpoint");
    assert!(info.size_bytes > 0 && paused.join("manifest.json").exists());
    assert!(
        matches!(runtime.freeze("wt-ck-rt"), Err(RuntimeError::NotFound(_))),
        "paused sandbox still there"
    );
    assert!(runtime
        .list()
        .expect("list")
        .iter()
        .all(|s| s.id != "wt-ck-rt"));

    // Resume: same ID, same address, the counter goes on from its value.
    let resumed = runtime.restore(&paused, &spec).expect("restore");
    assert_eq!(
        resumed.ip, sandbox.ip,
        "a resumed sandbox keeps its address"
    );
    let after = counts_past(&resumed, before);
    consecutive(&resumed);
    let (host, _) = common::exec(&resumed, "hostname");
    assert_eq!(host.trim(), "wt-ck-rt");

    // Fork: the original keeps running; the copy has its own ID, address and hostname and diverges.
    let fork_point = snapshots.join("fork-1");
    runtime
        .checkpoint("wt-ck-rt", &fork_point, true)
        .expect("checkpoint for fork");
    let fork_spec = common::spec("wt-ck-rt-fork", vec![base], common::resources());
    let fork = runtime
        .restore(&fork_point, &fork_spec)
        .expect("restore fork");
    assert_ne!(fork.ip, resumed.ip);
    let (host, _) = common::exec(&fork, "hostname");
    assert_eq!(host.trim(), "wt-ck-rt-fork");
    common::exec(&fork, "echo fork > /tmp/who");
    common::exec(&resumed, "echo original > /tmp/who");
    assert_eq!(common::exec(&fork, "cat /tmp/who").0, "fork\n");
    assert_eq!(common::exec(&resumed, "cat /tmp/who").0, "original\n");
    counts_past(&fork, after);
    counts_past(&resumed, after);
    consecutive(&fork);

    // A restore under an ID that exists is refused and leaves both alone.
    assert!(matches!(
        runtime.restore(&fork_point, &fork_spec),
        Err(RuntimeError::AlreadyExists(_))
    ));
    assert!(fork_point.join("manifest.json").exists());

    runtime.destroy("wt-ck-rt").expect("destroy");
    runtime.destroy("wt-ck-rt-fork").expect("destroy fork");
    let ids = ["wt-ck-rt".to_string(), "wt-ck-rt-fork".to_string()];
    let left = common::leftovers(&runtime.config().state_dir, &ids);
    assert!(left.is_empty(), "{left:?}");
    assert!(common::veths_for(&[resumed.ip, fork.ip]).is_empty());
    let _ = std::fs::remove_dir_all(&runtime.config().state_dir);
}

/// Filesystem-only: the runtime layer is saved without the processes (no CRIU involved), the sandbox
/// is gone, and a sandbox booted from the saved layer has the files but fresh processes; the saved
/// checkpoint cannot be restored as if it held memory, and it is only read by the boot.
#[test]
fn a_filesystem_checkpoint_keeps_files_and_boots_fresh_processes() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("ckdisk");
    let _cleanup = common::DestroyOnDrop(
        &runtime,
        ["wt-ck-disk", "wt-ck-disk-2"].map(String::from).to_vec(),
    );
    let spec = common::spec("wt-ck-disk", vec![base.clone()], common::resources());
    let sandbox = runtime.create(&spec).expect("create");
    let (out, code) = common::exec(
        &sandbox,
        "echo kept > /root/note && rm /etc/motd && \
         setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo started",
    );
    assert_eq!(code, 0, "{out}");
    let (out, _) = common::exec(&sandbox, "pgrep -x sleep");
    assert!(!out.trim().is_empty(), "the sleeper runs before the pause");

    let dest = runtime.config().state_dir.join("saved").join("wt-ck-disk");
    let info = runtime
        .checkpoint_disk("wt-ck-disk", &dest, false)
        .expect("filesystem checkpoint");
    assert_eq!(info.dir, dest);
    assert!(
        matches!(runtime.stats("wt-ck-disk"), Err(RuntimeError::NotFound(_))),
        "the paused sandbox is gone"
    );
    let manifest = warren_runtime::checkpoint::Manifest::read(&dest).expect("manifest");
    assert!(
        !manifest.memory && manifest.images.is_empty(),
        "{manifest:?}"
    );
    let restored = runtime.restore(&dest, &spec);
    assert!(
        matches!(&restored, Err(RuntimeError::InvalidSpec(m)) if m.contains("filesystem only")),
        "{restored:?}"
    );

    let booted = runtime
        .boot_from_disk(&dest, &spec)
        .expect("boot from disk");
    let (out, code) = common::exec(&booted, "cat /root/note; test -e /etc/motd; echo motd=$?");
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "kept\nmotd=1\n", "files and deletions survive");
    let (out, _) = common::exec(&booted, "pgrep -x sleep || echo none");
    assert_eq!(out.trim(), "none", "processes start fresh");
    let (out, _) = common::exec(&booted, "hostname");
    assert_eq!(out.trim(), "wt-ck-disk");

    // The same saved layer boots a second sandbox under another name: the checkpoint was only read.
    runtime.destroy("wt-ck-disk").expect("destroy");
    let other = common::spec("wt-ck-disk-2", vec![base], common::resources());
    let second = runtime.boot_from_disk(&dest, &other).expect("second boot");
    let (out, _) = common::exec(&second, "cat /root/note; hostname");
    assert_eq!(out, "kept\nwt-ck-disk-2\n");
}
