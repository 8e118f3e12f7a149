//! 1,000 create/destroy cycles leave no mount, loop device, veth, lease, cgroup or directory behind.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use warren_runtime::{Resources, Runtime};

const CYCLES: usize = 1000;
/// Cycles run on this many threads at once (the server creates sandboxes concurrently too).
const WORKERS: usize = 4;

#[test]
fn thousand_create_destroy_cycles_leave_nothing() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("cleanup");
    let resources = Resources {
        vcpus: 0.5,
        memory_mib: 64,
        disk_mib: 16,
        max_pids: 32,
    };
    let next = AtomicUsize::new(0);
    let ids: Vec<String> = (0..WORKERS).map(|w| format!("wt-cycle-{w}")).collect();
    let ips = std::sync::Mutex::new(std::collections::BTreeSet::new());
    std::thread::scope(|scope| {
        for id in &ids {
            let (runtime, base, resources, next, ips) = (&runtime, &base, &resources, &next, &ips);
            scope.spawn(move || {
                while next.fetch_add(1, Ordering::SeqCst) < CYCLES {
                    let spec = common::spec(id, vec![base.clone()], resources.clone());
                    let sandbox = runtime
                        .create(&spec)
                        .unwrap_or_else(|e| panic!("create {id}: {e}"));
                    ips.lock().unwrap().insert(sandbox.ip);
                    runtime
                        .destroy(id)
                        .unwrap_or_else(|e| panic!("destroy {id}: {e}"));
                }
            });
        }
    });
    let state_dir = runtime.config().state_dir.clone();
    let left = common::leftovers(&state_dir, &ids);
    assert!(left.is_empty(), "{left:?}");
    let ips: Vec<_> = ips.into_inner().unwrap().into_iter().collect();
    let veths = common::veths_for(&ips);
    assert!(veths.is_empty(), "{veths:?}");
    assert!(runtime.list().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&state_dir);
}

/// A restore the server gave up on (no state record yet) can leave its helpers running after their
/// supervisor is gone: `criu lazy-pages` and the page server, outside the sandbox's cgroup. Tearing
/// the sandbox down ends them too. The helper here is a stand-in that names the sandbox's restore
/// directory as CRIU does (`tail -f` under the name `criu`, which runs until it is killed).
#[test]
fn destroying_an_unfinished_restore_kills_the_helpers_it_left() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: the runtime needs root");
        return;
    }
    let runtime = common::runtime("helpers");
    let state_dir = runtime.config().state_dir.clone();
    let id = "wt-helpers";
    let images = state_dir
        .join("sandboxes")
        .join(id)
        .join("restore")
        .join("images");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::write(images.join("pages-1.img"), b"").unwrap();
    let bin = state_dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink("/usr/bin/tail", bin.join("criu")).unwrap();
    let mut helper = std::process::Command::new(bin.join("criu"))
        .arg("-f")
        .arg(images.join("pages-1.img"))
        .spawn()
        .unwrap();
    // An unrelated process naming the same file is left alone.
    let mut bystander = std::process::Command::new("/usr/bin/tail")
        .arg("-f")
        .arg(images.join("pages-1.img"))
        .spawn()
        .unwrap();
    // Both have the file open before the sandbox goes (a `tail` that starts after the directory
    // is removed exits by itself, which would prove nothing).
    let file = images.join("pages-1.img");
    for pid in [helper.id(), bystander.id()] {
        let opened = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == file))
        {
            assert!(
                std::time::Instant::now() < opened,
                "tail never opened {file:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    runtime.destroy(id).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(status) = helper.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let _ = helper.kill();
    let _ = helper.wait();
    let alive = bystander.try_wait().unwrap().is_none();
    let _ = bystander.kill();
    let _ = bystander.wait();
    let _ = std::fs::remove_dir_all(&state_dir);
    let status = status.expect("the restore's helper still runs after the sandbox was destroyed");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    assert!(alive, "a process that is not a restore helper was killed");
}
