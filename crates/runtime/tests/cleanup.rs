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
