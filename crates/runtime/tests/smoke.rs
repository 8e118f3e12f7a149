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
