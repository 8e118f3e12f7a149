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

/// A template of many layers (an image of 120: Docker allows 127) mounts: the overlay's options name
/// each layer by a short staged name, not its host path, so they stay far below the one page a mount
/// option may take. Every layer is seen, the top-most one winning.
#[test]
fn a_template_of_many_layers_mounts() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("layers");
    let layers_dir = runtime.config().state_dir.join("test-layers");
    // Top-most first: layer 0 is on top.
    let mut layers = Vec::new();
    for i in 0..119 {
        let layer = layers_dir.join(format!("a-long-directory-name-like-a-layer-digest-{i:03}"));
        std::fs::create_dir_all(layer.join("layers")).unwrap();
        std::fs::write(layer.join("layers").join(format!("{i}")), "").unwrap();
        std::fs::write(layer.join("which"), format!("{i}\n")).unwrap();
        layers.push(layer);
    }
    layers.push(base);
    let sandbox = runtime
        .create(&common::spec("wt-layers", layers, common::resources()))
        .expect("create with 120 layers");
    let (out, code) = common::exec(&sandbox, "cat /which; ls /layers | wc -l");
    runtime.destroy("wt-layers").expect("destroy");
    std::fs::remove_dir_all(&layers_dir).unwrap();
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "0\n119\n");
}
