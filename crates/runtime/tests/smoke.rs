#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.
mod common;

use warren_runtime::Runtime;

#[test]
fn create_exec_destroy() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("smoke");
    let sandbox = runtime
        .create(&common::spec("wt-smoke", vec![base], common::resources()))
        .expect("create");
    let (out, code) = common::exec(&sandbox, "hostname; id -u; cat /proc/1/cmdline; echo");
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("wt-smoke\n0\n/.warren/agent"), "{out}");
    runtime.destroy("wt-smoke").expect("destroy");
    let left = common::leftovers(&runtime.config().state_dir, &["wt-smoke".to_string()]);
    assert!(left.is_empty(), "{left:?}");
    assert!(common::veths_for(&[sandbox.ip]).is_empty());
}

#[test]
fn a_reused_address_answers_at_once() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("reuse");
    let first = runtime
        .create(&common::spec(
            "wt-reuse-1",
            vec![base.clone()],
            common::resources(),
        ))
        .expect("create");
    assert_eq!(common::exec(&first, "echo one").0.trim(), "one");
    runtime.destroy(&first.id).expect("destroy");
    // The next sandbox gets the same address (unless a concurrent test took it); its MAC is derived
    // from it, so the host's neighbour cache entry from the first one is still right.
    let second = runtime
        .create(&common::spec("wt-reuse-2", vec![base], common::resources()))
        .expect("create");
    let (mac, _) = common::exec(&second, "cat /sys/class/net/eth0/address");
    runtime.destroy(&second.id).expect("destroy");
    let [a, b, c, d] = second.ip.octets();
    assert_eq!(mac.trim(), format!("02:77:{a:02x}:{b:02x}:{c:02x}:{d:02x}"));
}
