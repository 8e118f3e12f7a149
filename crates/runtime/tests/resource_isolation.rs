//! What one sandbox can take from the others and the host: kernel interfaces (io_uring), host facts
//! (cgroup paths), devices, and host-wide kernel counters (inotify).

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::path::Path;

use warren_runtime::seccomp::SyscallPolicy;
use warren_runtime::{Runtime, Sandbox};

/// Calls io_uring_setup(4, params) with python3's ctypes; prints `fd <n>` or `errno <name>`.
const IO_URING_SETUP: &str = "python3 -c 'import ctypes, errno; \
    libc = ctypes.CDLL(None, use_errno=True); \
    fd = libc.syscall(425, 4, ctypes.create_string_buffer(120)); \
    print(\"fd\", fd) if fd >= 0 else print(\"errno\", errno.errorcode[ctypes.get_errno()])'";

fn create(runtime: &common::TestRuntime, id: &str, base: &Path) -> Sandbox {
    runtime
        .create(&common::spec(
            id,
            vec![base.to_path_buf()],
            common::resources(),
        ))
        .unwrap_or_else(|e| panic!("create {id}: {e}"))
}

#[test]
fn io_uring_is_denied_unless_the_sandbox_opts_in() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let disabled =
        std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").unwrap_or_default();
    if disabled.trim() != "0" && !disabled.is_empty() {
        println!("SKIP: io_uring is disabled host-wide (kernel.io_uring_disabled={disabled})");
        return;
    }
    let runtime = common::runtime("iouring");
    let ids = vec![
        "wt-iouring-deny".to_string(),
        "wt-iouring-allow".to_string(),
    ];
    let _cleanup = common::DestroyOnDrop(&runtime, ids.clone());
    let denied = create(&runtime, &ids[0], &base);
    let mut spec = common::spec(&ids[1], vec![base.clone()], common::resources());
    spec.syscalls = SyscallPolicy {
        allow_io_uring: true,
    };
    let allowed = runtime.create(&spec).expect("create the opted-in sandbox");

    let (out, code) = common::exec(&denied, IO_URING_SETUP);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.trim(), "errno EPERM", "io_uring_setup by default");
    let (out, code) = common::exec(&allowed, IO_URING_SETUP);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.trim().starts_with("fd "),
        "io_uring_setup with the opt-in: {out}"
    );
}

/// Asserts that every line of `/proc/self/cgroup` inside `sandbox` names `/`, and that the sandbox
/// has a cgroup namespace of its own.
fn assert_cgroup_root_only(sandbox: &Sandbox) {
    // Outside, the sandbox's init sits in warren/<id> of every hierarchy Warren uses.
    let host_view = std::fs::read_to_string(format!("/proc/{}/cgroup", sandbox.init_pid)).unwrap();
    assert!(
        host_view.contains(&format!("/warren/{}", sandbox.id)),
        "{host_view}"
    );
    let (inside, code) = common::exec(
        sandbox,
        "cat /proc/self/cgroup; readlink /proc/self/ns/cgroup",
    );
    assert_eq!(code, 0, "{inside}");
    let mut lines = inside.lines().collect::<Vec<_>>();
    let ns = lines.pop().unwrap_or_default();
    assert!(ns.starts_with("cgroup:["), "{inside}");
    assert_ne!(
        ns,
        std::fs::read_link("/proc/self/ns/cgroup")
            .unwrap()
            .to_string_lossy(),
        "the sandbox has its own cgroup namespace"
    );
    assert!(!lines.is_empty(), "{inside}");
    for line in lines {
        let path = line.splitn(3, ':').nth(2).unwrap_or_default();
        assert_eq!(path, "/", "a cgroup path inside {}: {inside}", sandbox.id);
    }
}

/// The root overlay's options name the staging names Warren mounts it from, never the host's
/// template layers or the writable layer's directory, and no mount inside names the state dir or the
/// base rootfs (the overlay's options are where they used to show).
fn assert_mountinfo_names_no_host_path(sandbox: &Sandbox, host_paths: &[&std::path::Path]) {
    let (inside, code) = common::exec(sandbox, "cat /proc/self/mountinfo");
    assert_eq!(code, 0, "{inside}");
    let root = inside
        .lines()
        .find(|line| line.split(' ').nth(4) == Some("/"))
        .unwrap_or_else(|| panic!("no root mount in {inside}"));
    let options = root.rsplit(' ').next().unwrap_or_default();
    for key in ["lowerdir=", "upperdir=", "workdir="] {
        let value = options
            .split(',')
            .find_map(|o| o.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in the root overlay's options: {root}"));
        let staged = if key == "lowerdir=" {
            value.chars().all(|c| c.is_ascii_digit() || c == ':')
        } else {
            value.starts_with("d/") && !value[2..].contains('/')
        };
        assert!(staged, "{key}{value} is not a staging name: {root}");
    }
    for path in host_paths {
        let text = path.to_string_lossy();
        assert!(
            !inside.contains(text.as_ref()),
            "mountinfo inside {} names {text}:\n{inside}",
            sandbox.id
        );
    }
}

#[test]
fn proc_self_cgroup_and_mountinfo_show_no_host_path() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("cgns");
    let ids = vec!["wt-cgns-a".to_string(), "wt-cgns-fork".to_string()];
    let _cleanup = common::DestroyOnDrop(&runtime, ids.clone());
    let sandbox = create(&runtime, &ids[0], &base);
    assert_cgroup_root_only(&sandbox);
    let state_dir = runtime.config().state_dir.clone();
    let host_paths = [state_dir.as_path(), base.as_path()];
    assert_mountinfo_names_no_host_path(&sandbox, &host_paths);
    if !runtime.capabilities().checkpoint {
        println!("SKIP: CRIU does not work on this host; the restored half is not checked");
        return;
    }
    // A restored copy (fork) gets the namespace back, rooted at its own new cgroup.
    let fork_point = runtime.config().state_dir.join("snapshots/cgns-fork");
    runtime
        .checkpoint(&ids[0], &fork_point, true)
        .expect("checkpoint");
    let fork = runtime
        .restore(
            &fork_point,
            &common::spec(&ids[1], vec![base.to_path_buf()], common::resources()),
        )
        .expect("restore");
    let _ = std::fs::remove_dir_all(&fork_point);
    assert_cgroup_root_only(&fork);
    assert_mountinfo_names_no_host_path(&fork, &host_paths);
}

#[test]
fn only_the_sandbox_dev_nodes_open() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let devices = std::path::Path::new("/sys/fs/cgroup/devices/devices.list");
    if !devices.exists() {
        println!("SKIP: no cgroup v1 devices controller (on v2 Warren attaches no device program)");
        return;
    }
    let runtime = common::runtime("devices");
    let id = "wt-devices-a".to_string();
    let _cleanup = common::DestroyOnDrop(&runtime, vec![id.clone()]);
    let sandbox = create(&runtime, &id, &base);
    let list = std::fs::read_to_string(format!("/sys/fs/cgroup/devices/warren/{id}/devices.list"))
        .expect("the sandbox has a devices cgroup");
    let mut rules: Vec<&str> = list.lines().collect();
    rules.sort();
    let mut expected = warren_runtime::cgroups::DEVICE_ALLOW_LIST.to_vec();
    expected.sort();
    assert_eq!(rules, expected, "devices.list of the sandbox");

    // A node the sandbox could not have made itself (no CAP_MKNOD): the host puts the loop control
    // device (c 10:237, harmless to open) into the sandbox's /dev.
    let made = std::process::Command::new("nsenter")
        .args(["-t", &sandbox.init_pid.to_string(), "-m", "-r", "--"])
        .args(["mknod", "/dev/wt-loop-control", "c", "10", "237"])
        .output()
        .expect("run nsenter");
    assert!(
        made.status.success(),
        "mknod in the sandbox's /dev from the host: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let open = |path: &str| {
        common::exec(
            &sandbox,
            &format!(
                "python3 -c 'import os; os.close(os.open(\"{path}\", os.O_RDONLY)); print(\"opened\")'"
            ),
        )
    };
    let (out, code) = open("/dev/wt-loop-control");
    assert_ne!(code, 0, "root inside opened c 10:237: {out}");
    assert!(
        out.contains("PermissionError") || out.contains("Operation not permitted"),
        "{out}"
    );
    for node in ["/dev/null", "/dev/urandom", "/dev/ptmx"] {
        let (out, code) = open(node);
        assert_eq!((out.trim(), code), ("opened", 0), "{node}");
    }
}

/// Takes inotify instances and watches as root inside a sandbox: up to INSTANCES instances, then
/// watches on DIRS directories from each instance in turn up to WATCHES watches, stopping at the first
/// failure. Writes `<instances> <error> <watches> <error>` to /tmp/inotify.out, then holds everything.
const INOTIFY_HOG: &str = r#"
import ctypes, errno, os, resource, sys, time
INSTANCES, DIRS, WATCHES, HOLD = (int(a) for a in sys.argv[1:5])
libc = ctypes.CDLL(None, use_errno=True)
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
dirs = []
for i in range(DIRS):
    os.makedirs("/tmp/w/%d" % i, exist_ok=True)
    dirs.append(b"/tmp/w/%d" % i)
def err():
    return errno.errorcode.get(ctypes.get_errno(), "?")
fds, ierr = [], "none"
while len(fds) < INSTANCES:
    fd = libc.inotify_init1(0)
    if fd < 0:
        ierr = err()
        break
    fds.append(fd)
watches, werr = 0, "none"
for fd in fds:
    if watches >= WATCHES or werr != "none":
        break
    for d in dirs:
        if watches >= WATCHES:
            break
        if libc.inotify_add_watch(fd, d, 0x100) < 0:
            werr = err()
            break
        watches += 1
with open("/tmp/inotify.tmp", "w") as out:
    out.write("%d %s %d %s\n" % (len(fds), ierr, watches, werr))
os.rename("/tmp/inotify.tmp", "/tmp/inotify.out")
time.sleep(HOLD)
"#;

/// Writes the hog into the sandbox (the test agent takes one line, so the script travels as hex).
fn install_hog(sandbox: &Sandbox) {
    let hex: String = INOTIFY_HOG.bytes().map(|b| format!("{b:02x}")).collect();
    let (out, code) = common::exec(
        sandbox,
        &format!(
            "python3 -c 'import sys; open(\"/tmp/inotify_hog.py\", \"wb\").write(bytes.fromhex(sys.argv[1]))' {hex}"
        ),
    );
    assert_eq!(code, 0, "{out}");
}

/// Polls for the hog's report (it writes it once it took what it could).
fn hog_report(sandbox: &Sandbox) -> Vec<String> {
    for _ in 0..600 {
        let (out, code) = common::exec(sandbox, "cat /tmp/inotify.out 2>/dev/null");
        if code == 0 && !out.trim().is_empty() {
            return out.split_whitespace().map(str::to_string).collect();
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!("the inotify hog never reported");
}

#[test]
fn one_sandbox_cannot_exhaust_inotify_for_another() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("inotify");
    let ids = vec!["wt-inotify-a".to_string(), "wt-inotify-b".to_string()];
    let _cleanup = common::DestroyOnDrop(&runtime, ids.clone());
    let a = create(&runtime, &ids[0], &base);
    let b = create(&runtime, &ids[1], &base);
    let sysctl = |name: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // The kernel's defaults here are 128 instances and ~190,000 watches per uid, shared by the host
    // and every sandbox's root; A takes far more than both and holds them.
    install_hog(&a);
    let (out, code) = common::exec(
        &a,
        "python3 /tmp/inotify_hog.py 4000 1000 250000 3600 >/tmp/hog.log 2>&1 &",
    );
    assert_eq!(code, 0, "{out}");
    let report = hog_report(&a);
    assert_eq!(
        report,
        ["4000", "none", "250000", "none"],
        "A's take (host limits now: {} instances, {} watches)",
        sysctl("max_user_instances"),
        sysctl("max_user_watches")
    );

    // B still gets an instance and watches.
    let (out, code) = common::exec(
        &b,
        "python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); \
         fd = libc.inotify_init1(0); assert fd >= 0, ctypes.get_errno(); \
         ws = [libc.inotify_add_watch(fd, p, 0x100) for p in (b\"/tmp\", b\"/etc\", b\"/root\")]; \
         assert min(ws) > 0, ctypes.get_errno(); print(\"watching\", len(ws))'",
    );
    assert_eq!(
        (out.trim(), code),
        ("watching 3", 0),
        "B while A holds its take"
    );
}

#[test]
fn a_sandbox_memory_limit_bounds_its_inotify_watches() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("inotifymem");
    let id = "wt-inotifymem-a".to_string();
    let _cleanup = common::DestroyOnDrop(&runtime, vec![id.clone()]);
    let mut resources = common::resources();
    resources.memory_mib = 32;
    let sandbox = runtime
        .create(&common::spec(&id, vec![base], resources))
        .expect("create");
    install_hog(&sandbox);
    // Three million watches would take ~270 MB of kernel memory, charged to the sandbox's 32 MiB.
    let (out, _) = common::exec(
        &sandbox,
        "python3 /tmp/inotify_hog.py 3000 1000 3000000 0 >/dev/null 2>&1; echo rc=$?; \
         cat /tmp/inotify.out 2>/dev/null",
    );
    println!("memory-bound hog: {}", out.replace('\n', " "));
    let stopped = out.contains("rc=137") || out.contains(" ENOMEM");
    assert!(
        stopped,
        "the hog must be stopped by the memory cgroup: {out}"
    );
}
