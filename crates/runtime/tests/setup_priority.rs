//! The server sets sandboxes up on threads at a lower priority (nice 10, see `SETUP_NICE` in the
//! server), and the supervisor and init inherit it while they build the sandbox. The sandbox's own
//! processes must not keep it: a created one and a restored one run at the default niceness.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use warren_runtime::{LinuxRuntime, Runtime};

/// Destroys the test's sandboxes and state dir even when an assertion fails midway.
struct Cleanup<'a>(&'a LinuxRuntime, &'static [&'static str]);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for id in self.1 {
            let _ = self.0.destroy(id);
        }
        let _ = std::fs::remove_dir_all(&self.0.config().state_dir);
    }
}

/// The niceness of the sandbox's init, of a command the agent starts, and of a `sleep` started
/// earlier, one per line.
const PRIORITIES: &str = "awk '{print $19}' /proc/1/stat; nice; \
     for p in $(pgrep -x sleep); do awk '{print $19}' /proc/$p/stat; done";

#[test]
fn a_sandbox_set_up_at_a_lower_priority_runs_at_the_default_one() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("nice");
    let _cleanup = Cleanup(&runtime, &["wt-nice", "wt-nice-copy"]);
    // As the server's set-up threads do; this test's thread only.
    // SAFETY: setpriority of the calling thread.
    assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) }, 0);

    let spec = common::spec("wt-nice", vec![base.clone()], common::resources());
    let sandbox = runtime.create(&spec).expect("create");
    let (out, code) = common::exec(
        &sandbox,
        "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & sleep 0.2; echo started",
    );
    assert_eq!((out.as_str(), code), ("started\n", 0));
    let (out, code) = common::exec(&sandbox, PRIORITIES);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "0\n0\n0\n", "init, a command and a background process");

    if !runtime.capabilities().checkpoint {
        println!("SKIP: the restore half needs CRIU (run scripts/setup)");
        return;
    }
    let point = runtime.config().state_dir.join("snapshots").join("nice");
    runtime
        .checkpoint("wt-nice", &point, true)
        .expect("checkpoint");
    let copy_spec = common::spec("wt-nice-copy", vec![base], common::resources());
    let copy = runtime.restore(&point, &copy_spec).expect("restore");
    let (out, code) = common::exec(&copy, PRIORITIES);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out, "0\n0\n0\n",
        "the restored init, a command and the restored sleep"
    );

    for id in ["wt-nice", "wt-nice-copy"] {
        runtime.destroy(id).expect("destroy");
    }
    let ids = ["wt-nice".to_string(), "wt-nice-copy".to_string()];
    let left = common::leftovers(&runtime.config().state_dir, &ids);
    assert!(left.is_empty(), "{left:?}");
}
