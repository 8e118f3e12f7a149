//! The seccomp policy (`warren_runtime::seccomp::POLICY`) replayed inside a sandbox, as root: every
//! denied syscall answers EPERM, `clone` with a namespace flag EPERM and `clone3` ENOSYS. For the calls
//! whose answer does not depend on a capability the sandbox lacks, the same call made on the host (no
//! filter) is the control: it must not answer EPERM, so the sandbox's EPERM is the filter's doing.
//! Ordinary work still runs under the filter: python, node, pip installing a wheel, apt-get installing
//! a package (all offline: sandboxes here have no internet).

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use warren_runtime::seccomp::{IO_URING, POLICY};
use warren_runtime::Runtime;

/// The calls the sandbox must refuse whatever [`POLICY`] says (so dropping one from the policy fails
/// this test), with arguments under which the unfiltered kernel does not answer EPERM to root without
/// CAP_SYS_ADMIN: the host's answers are the control. `S` is the address of the string "/", `P` the
/// caller's pid.
fn controls() -> Vec<(&'static str, i64, &'static str)> {
    vec![
        ("keyctl", libc::SYS_keyctl, "0, -3, 0"), // KEYCTL_GET_KEYRING_ID of the session keyring
        ("add_key", libc::SYS_add_key, "0, 0, 0, 0, 0"), // EFAULT
        ("request_key", libc::SYS_request_key, "0, 0, 0, 0"), // EFAULT
        ("userfaultfd", libc::SYS_userfaultfd, "1"), // UFFD_USER_MODE_ONLY: allowed to anyone
        ("unshare", libc::SYS_unshare, "0"),      // no flags: a no-op
        ("setns", libc::SYS_setns, "-1, 0"),      // EBADF
        ("open_tree", libc::SYS_open_tree, "-100, S, 0"), // an O_PATH fd of "/" (no clone)
        (
            "name_to_handle_at",
            libc::SYS_name_to_handle_at,
            "-100, S, 0, 0, 0",
        ), // EFAULT
        ("kcmp", libc::SYS_kcmp, "P, P, 0, 0, 0"), // KCMP_FILE of fd 0 with itself
        ("mbind", libc::SYS_mbind, "0, 0, 0, 0, 0, 0"),
        ("get_mempolicy", libc::SYS_get_mempolicy, "0, 0, 0, 0, 0"),
        ("set_mempolicy", libc::SYS_set_mempolicy, "0, 0, 0"), // MPOL_DEFAULT
        ("move_pages", libc::SYS_move_pages, "0, 0, 0, 0, 0, 0"),
        (
            "perf_event_open",
            libc::SYS_perf_event_open,
            "0, 0, -1, -1, 0",
        ), // EFAULT
        ("sysfs", libc::SYS_sysfs, "1, 0"),
        ("ustat", libc::SYS_ustat, "0, 0"),
        ("lookup_dcookie", libc::SYS_lookup_dcookie, "0, 0, 0"),
        ("nfsservctl", libc::SYS_nfsservctl, "0, 0, 0"),
        ("_sysctl", libc::SYS__sysctl, "0"),
        ("uselib", libc::SYS_uselib, "0"),
        ("io_uring_setup", libc::SYS_io_uring_setup, "1, 0"), // EFAULT
        (
            "io_uring_enter",
            libc::SYS_io_uring_enter,
            "-1, 0, 0, 0, 0, 0",
        ), // EBADF
        (
            "io_uring_register",
            libc::SYS_io_uring_register,
            "-1, 0, 0, 0",
        ), // EBADF
        ("clone3", libc::SYS_clone3, "0, 0"),                 // EINVAL (size 0)
    ]
}

/// A python3 program that calls each (name, nr, args) and prints `name errno-name` (or `name ok`).
fn probe(calls: &[(String, i64, String)]) -> String {
    let mut lines = vec![
        "import ctypes, errno, os".to_string(),
        "libc = ctypes.CDLL(None, use_errno=True)".to_string(),
        "libc.syscall.restype = ctypes.c_long".to_string(),
        "S = ctypes.cast(ctypes.c_char_p(b'/'), ctypes.c_void_p).value".to_string(),
        "P = os.getpid()".to_string(),
        "def call(name, nr, *args):".to_string(),
        "    ctypes.set_errno(0)".to_string(),
        "    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])".to_string(),
        "    e = ctypes.get_errno()".to_string(),
        "    print(name, errno.errorcode.get(e, e) if r < 0 else 'ok')".to_string(),
    ];
    for (name, nr, args) in calls {
        lines.push(format!("call('{name}', {nr}, {args})"));
    }
    lines.join("\n")
}

fn run_python_here(program: &str) -> BTreeMap<String, String> {
    let out = std::process::Command::new("python3")
        .args(["-c", program])
        .output()
        .expect("run python3 on the host");
    assert!(out.status.success(), "{out:?}");
    answers(&String::from_utf8_lossy(&out.stdout))
}

fn answers(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(name, answer)| (name.to_string(), answer.trim().to_string()))
        .collect()
}

fn in_sandbox(sandbox: &warren_runtime::Sandbox, program: &str) -> String {
    let hex: String = program.bytes().map(|b| format!("{b:02x}")).collect();
    let (out, code) = common::exec(
        sandbox,
        &format!("python3 -c \"exec(bytes.fromhex('{hex}'))\" 2>&1"),
    );
    assert_eq!(code, 0, "probe failed inside: {out}");
    out
}

#[test]
fn every_denied_syscall_answers_eperm_inside_and_is_the_filters_doing() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let controls = controls();
    let mut calls: Vec<(String, i64, String)> = controls
        .iter()
        .map(|(name, nr, args)| (name.to_string(), *nr, args.to_string()))
        .collect();
    for (name, nr) in POLICY.iter().flat_map(|group| group.syscalls.iter()) {
        if !calls.iter().any(|(n, _, _)| n == name) {
            calls.push((name.to_string(), *nr, "0, 0, 0, 0, 0, 0".to_string()));
        }
    }
    for nr in IO_URING {
        assert!(
            calls.iter().any(|(_, n, _)| *n == nr),
            "io_uring {nr} untested"
        );
    }

    let runtime = common::runtime("seccomp");
    let _cleanup = common::DestroyOnDrop(&runtime, vec!["wt-seccomp".into()]);
    let sandbox = runtime
        .create(&common::spec("wt-seccomp", vec![base], common::resources()))
        .expect("create");
    let inside = answers(&in_sandbox(&sandbox, &probe(&calls)));
    let mut wrong = Vec::new();
    for (name, _, _) in &calls {
        let expected = if name == "clone3" { "ENOSYS" } else { "EPERM" };
        if inside.get(name).map(String::as_str) != Some(expected) {
            wrong.push(format!("{name}: {:?} (want {expected})", inside.get(name)));
        }
    }
    assert!(wrong.is_empty(), "inside the sandbox: {wrong:?}");

    // clone with each namespace flag (CLONE_NEWUSER first): EPERM, never a child.
    let clone_probe = [
        "import ctypes, errno, os",
        "libc = ctypes.CDLL(None, use_errno=True)",
        "libc.syscall.restype = ctypes.c_long",
        "for flag in [0x10000000, 0x00020000, 0x04000000, 0x08000000, 0x20000000, 0x40000000, 0x02000000]:",
        "    r = libc.syscall(ctypes.c_long(56), ctypes.c_long(flag | 17), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))",
        "    if r == 0: os._exit(0)",
        "    if r > 0: os.waitpid(r, 0)",
        "    print(hex(flag), 'child' if r > 0 else errno.errorcode[ctypes.get_errno()])",
    ]
    .join("\n");
    let out = in_sandbox(&sandbox, &clone_probe);
    assert_eq!(out.lines().count(), 7, "{out}");
    assert!(out.lines().all(|l| l.ends_with(" EPERM")), "clone: {out}");
    // A plain fork (clone without namespace flags) still works.
    let (out, code) = common::exec(&sandbox, "sh -c 'echo child'");
    assert_eq!((out.trim(), code), ("child", 0));

    // The control: on the host (no filter) none of these answers EPERM.
    let host_calls: Vec<_> = calls
        .iter()
        .filter(|(name, _, _)| controls.iter().any(|(n, _, _)| n == name))
        .cloned()
        .collect();
    let host = run_python_here(&probe(&host_calls));
    let eperm_on_host: Vec<_> = host_calls
        .iter()
        .filter(|(name, _, _)| host.get(name).is_none_or(|a| a == "EPERM"))
        .map(|(name, _, _)| format!("{name}: {:?}", host.get(name)))
        .collect();
    assert!(
        eperm_on_host.is_empty(),
        "these answer EPERM without the filter too, so they prove nothing: {eperm_on_host:?}"
    );
}

const CODE_INTERPRETER_ROOTFS: &str = "/var/cache/warren/rootfs/debian12-code-interpreter";

#[test]
fn ordinary_work_runs_under_the_filter() {
    if common::base_rootfs().is_none() {
        return;
    }
    let rootfs = PathBuf::from(CODE_INTERPRETER_ROOTFS);
    if !rootfs.join(".warren-complete").exists() {
        println!("SKIP: {CODE_INTERPRETER_ROOTFS} not built (it has node and pip)");
        return;
    }
    let runtime = common::runtime("seccomp-work");
    let _cleanup = common::DestroyOnDrop(&runtime, vec!["wt-seccomp-work".into()]);
    let mut resources = common::resources();
    resources.memory_mib = 512;
    resources.disk_mib = 256;
    let sandbox = runtime
        .create(&common::spec("wt-seccomp-work", vec![rootfs], resources))
        .expect("create");
    let run = |what: &str, command: &str| {
        let (out, code) = common::exec(&sandbox, command);
        assert_eq!(code, 0, "{what} failed under the filter: {out}");
        out
    };
    // python: threads, a subprocess pool, a pipe, mmap.
    let out = run(
        "python",
        "python3 -c 'import concurrent.futures as f, mmap, subprocess; \
         print(sum(f.ProcessPoolExecutor(2).map(abs, [-1, -2]))); \
         m = mmap.mmap(-1, 4096); m[:2] = b\"ok\"; print(m[:2].decode()); \
         print(subprocess.run([\"echo\", \"sub\"], capture_output=True, text=True).stdout.strip())'",
    );
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["3", "ok", "sub"]
    );
    // node: its event loop tries io_uring first and must fall back when it answers EPERM.
    let out = run(
        "node",
        "node -e 'const fs = require(\"fs\"); fs.writeFileSync(\"/tmp/n\", \"node\"); \
         fs.readFile(\"/tmp/n\", \"utf8\", (e, d) => { if (e) throw e; \
         require(\"child_process\").exec(\"echo \" + d, (e, o) => { if (e) throw e; console.log(o.trim()); }); })'",
    );
    assert_eq!(out.trim(), "node");
    // pip: install a wheel made on the spot (no index, no network).
    let out = run(
        "pip",
        "cd /tmp && python3 -c 'import zipfile; z = zipfile.ZipFile(\"wt_probe-1.0-py3-none-any.whl\", \"w\"); \
         z.writestr(\"wt_probe/__init__.py\", \"VALUE = 42\\n\"); \
         z.writestr(\"wt_probe-1.0.dist-info/METADATA\", \"Metadata-Version: 2.1\\nName: wt-probe\\nVersion: 1.0\\n\"); \
         z.writestr(\"wt_probe-1.0.dist-info/WHEEL\", \"Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n\"); \
         z.writestr(\"wt_probe-1.0.dist-info/RECORD\", \"\"); z.close()' && \
         pip install -q --no-index --break-system-packages ./wt_probe-1.0-py3-none-any.whl 2>&1 && \
         python3 -c 'import wt_probe; print(wt_probe.VALUE)'",
    );
    assert!(out.trim().ends_with("42"), "{out}");
    // apt-get: install a package built on the spot (apt drops to its _apt user: setgroups, setresuid).
    let out = run(
        "apt-get",
        "mkdir -p /tmp/deb/DEBIAN /tmp/deb/usr/share/wt-probe && echo hi > /tmp/deb/usr/share/wt-probe/hi && \
         printf 'Package: wt-probe\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@t>\\nDescription: probe\\n' > /tmp/deb/DEBIAN/control && \
         dpkg-deb -b /tmp/deb /tmp/wt-probe.deb >/dev/null && \
         apt-get install -y -q /tmp/wt-probe.deb >/tmp/apt.log 2>&1; tail -3 /tmp/apt.log; \
         dpkg -s wt-probe | grep Status && cat /usr/share/wt-probe/hi",
    );
    assert!(out.contains("install ok installed"), "{out}");
    assert!(out.trim().ends_with("hi"), "{out}");
}
