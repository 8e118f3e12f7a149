//! The escape battery: container escapes that have worked against other runtimes, replayed as root
//! inside a sandbox. Each must fail, and the test checks on the host that nothing changed. Attacks
//! already covered elsewhere are not repeated here (docs/security.md lists every attack with its
//! test): modules, `mount`, `unshare -m`/`-U`, `mknod` of a block device, `/proc/sys/vm/drop_caches`,
//! `/proc/sysrq-trigger` (isolation.rs), symlinks planted for host code (host_file_escapes.rs).
//! Ptrace of the real agent is in tests/e2e/test_escapes_e2e.py (this suite runs a stand-in agent).

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use warren_runtime::{Runtime, Sandbox};

/// Runs a python3 program inside (hex-encoded, so no shell quoting), as root; returns its output.
fn python(sandbox: &Sandbox, program: &str) -> String {
    let hex: String = program.bytes().map(|b| format!("{b:02x}")).collect();
    let (out, code) = common::exec(
        sandbox,
        &format!("python3 -c \"exec(bytes.fromhex('{hex}'))\" 2>&1"),
    );
    assert_eq!(code, 0, "probe failed inside: {out}");
    out
}

fn sh(sandbox: &Sandbox, command: &str) -> (String, i32) {
    common::exec(sandbox, command)
}

struct One {
    runtime: common::TestRuntime,
    sandbox: Sandbox,
}

impl Drop for One {
    fn drop(&mut self) {
        let _ = self.runtime.destroy(&self.sandbox.id);
    }
}

fn one(name: &str, base: PathBuf) -> One {
    let runtime = common::runtime(name);
    let sandbox = runtime
        .create(&common::spec(
            &format!("wt-esc-{name}"),
            vec![base],
            common::resources(),
        ))
        .expect("create");
    One { runtime, sandbox }
}

fn sha(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// runc CVE-2019-5736: a process inside opens the executable of a host-side helper running in the
/// container (`/proc/<pid>/exe`) and writes over it, so the host runs the attacker's code next time.
/// Here the only host binary a sandbox process ever sees running is the agent (PID 1; the init forks
/// from the supervisor and execs it before anything of the sandbox runs). Every way to write to it
/// must fail, and the host's file must be unchanged.
#[test]
fn the_agent_binary_cannot_be_overwritten_through_proc_exe() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let o = one("exe", base);
    let agent = o.runtime.config().agent_binary.clone();
    let before = sha(&agent);
    let out = python(
        &o.sandbox,
        r#"
import os, errno
def attempt(what, f):
    try:
        fd = f()
        os.close(fd)
        print("OPENED", what)
    except OSError as e:
        print("refused", what, errno.errorcode[e.errno])
pids = [p for p in os.listdir("/proc") if p.isdigit()]
for p in pids:
    exe = "/proc/%s/exe" % p
    if os.readlink(exe) != "/.warren/agent":
        continue
    attempt(exe, lambda: os.open(exe, os.O_WRONLY))
    # runc's exploit: hold an O_PATH fd and reopen it for writing through /proc/self/fd.
    path_fd = os.open(exe, os.O_PATH)
    attempt("reopen " + exe, lambda: os.open("/proc/self/fd/%d" % path_fd, os.O_WRONLY | os.O_TRUNC))
    os.close(path_fd)
attempt("/.warren/agent", lambda: os.open("/.warren/agent", os.O_WRONLY))
for f in [lambda: os.rename("/.warren/agent", "/tmp/a"), lambda: os.unlink("/.warren/agent"),
          lambda: os.link("/.warren/agent", "/tmp/agent-link"), lambda: os.chmod("/.warren/agent", 0o777)]:
    try:
        f()
        print("CHANGED the agent's name or mode")
    except OSError as e:
        print("refused", errno.errorcode[e.errno])
"#,
    );
    assert!(out.contains("refused /proc/1/exe"), "{out}");
    assert!(out.contains("refused reopen /proc/1/exe"), "{out}");
    assert!(!out.contains("OPENED") && !out.contains("CHANGED"), "{out}");
    assert_eq!(sha(&agent), before, "the host's agent binary changed");
}

/// CVE-2022-0492: mount a cgroup v1 hierarchy, set `release_agent` to a script and let a cgroup
/// empty: the host's kernel runs the script as host root. Every step must fail, the host's
/// `release_agent` files must be unchanged and the script must never have run.
#[test]
fn cgroup_release_agent_cannot_be_set() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let v1: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|e| e.path().join("release_agent"))
        .filter(|p| p.exists())
        .collect();
    let before: Vec<String> = v1
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let marker = PathBuf::from(format!("/tmp/wt-release-agent-ran-{}", std::process::id()));
    let o = one("relagent", base);
    let attack = format!(
        "printf '#!/bin/sh\\ntouch {m}\\n' > /cmd; chmod +x /cmd; \
         mkdir -p /tmp/cg; \
         for c in rdma memory pids freezer devices; do mount -t cgroup -o $c cgroup /tmp/cg 2>&1 && echo MOUNTED $c; done; \
         unshare -UrmC sh -c 'mount -t cgroup -o rdma cgroup /tmp/cg && echo MOUNTED in userns' 2>&1; \
         grep -c cgroup /proc/self/mounts; \
         for f in $(find /sys /proc -name release_agent 2>/dev/null); do echo /cmd > $f 2>&1 && echo WROTE $f; done; \
         mkdir /tmp/cg/x 2>&1 && echo 1 > /tmp/cg/x/notify_on_release && sh -c 'echo $$ > /tmp/cg/x/cgroup.procs'; true",
        m = marker.display()
    );
    let (out, _) = sh(&o.sandbox, &attack);
    assert!(!out.contains("MOUNTED") && !out.contains("WROTE"), "{out}");
    let after: Vec<String> = v1
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_eq!(before, after, "a host release_agent changed");
    assert!(!marker.exists(), "the host ran the sandbox's release agent");
}

/// Kernel-wide knobs that make the host run a program of the attacker's choice (`core_pattern` with
/// a pipe, `modprobe`, `uevent_helper`) and other writable knobs of /proc/sys and /sys/kernel: every
/// write fails and the host's values stay. A scan then opens for writing every file under /proc
/// (other than per-process directories) and /sys that its mode says is writable: none may open.
#[test]
fn kernel_knobs_in_proc_sys_and_sys_cannot_be_written() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let knobs = [
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/kernel/modprobe",
        "/proc/sys/kernel/randomize_va_space",
        "/proc/sys/kernel/hostname",
        "/proc/sys/vm/overcommit_memory",
        "/proc/sys/fs/inotify/max_user_watches",
        "/proc/sys/net/ipv4/ip_forward",
        "/sys/kernel/uevent_helper",
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/kernel/mm/ksm/run",
    ];
    let present: Vec<&str> = knobs
        .iter()
        .copied()
        .filter(|k| Path::new(k).exists())
        .collect();
    let read_all = || -> Vec<String> {
        present
            .iter()
            .map(|k| std::fs::read_to_string(k).unwrap_or_default())
            .collect()
    };
    let before = read_all();
    let o = one("knobs", base);
    let marker = format!("/tmp/wt-knob-ran-{}", std::process::id());
    let script: String = present
        .iter()
        .map(|k| {
            let value = match *k {
                "/proc/sys/kernel/core_pattern" => format!("|/bin/touch {marker}"),
                "/proc/sys/kernel/modprobe" | "/sys/kernel/uevent_helper" => "/cmd".to_string(),
                _ => "0".to_string(),
            };
            format!("echo '{value}' > {k} 2>/dev/null && echo WROTE {k}; ")
        })
        .collect();
    let (out, _) = sh(
        &o.sandbox,
        &format!("{script} sysctl -w kernel.core_pattern=core 2>&1; true"),
    );
    assert!(!out.contains("WROTE"), "{out}");
    assert!(!out.contains("= core"), "sysctl -w succeeded: {out}");
    // A crash inside uses the host's core_pattern, unchanged.
    let _ = sh(&o.sandbox, "sh -c 'kill -SEGV $$'");
    assert_eq!(read_all(), before, "a host kernel knob changed");
    assert!(
        !Path::new(&marker).exists(),
        "the host ran a handler the sandbox set"
    );

    let scan = python(
        &o.sandbox,
        r#"
import os, stat
opened = []
def scan(top, skip):
    for root, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = [d for d in dirs if not skip(os.path.join(root, d))]
        for f in files:
            p = os.path.join(root, f)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o222:
                continue
            try:
                fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            os.close(fd)
            opened.append(p)
scan("/proc", lambda d: d.split("/")[2].isdigit() or d in ("/proc/self", "/proc/thread-self"))
scan("/sys", lambda d: False)
print("\n".join(opened))
print("scanned")
"#,
    );
    let opened: Vec<&str> = scan
        .lines()
        .filter(|l| *l != "scanned" && !l.is_empty())
        .collect();
    assert!(scan.contains("scanned"), "{scan}");
    assert!(opened.is_empty(), "writable from inside: {opened:?}");
}

/// Mount namespace tricks: a chroot-escape (root keeps CAP_SYS_CHROOT), bind mounts and a new mount
/// namespace through util-linux and through raw syscalls, and a hard link to the agent. The host
/// marker must stay invisible and no new mount may appear.
#[test]
fn mount_namespace_and_chroot_tricks_stay_inside() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let marker = PathBuf::from(format!("/tmp/wt-esc-marker-{}", std::process::id()));
    std::fs::write(&marker, b"host").unwrap();
    let o = one("mnt", base);
    let mounts_before = sh(&o.sandbox, "wc -l < /proc/self/mountinfo").0;
    let out = python(
        &o.sandbox,
        &format!(
            r#"
import os, errno, subprocess
marker = "{marker}"
# The classic chroot escape: chroot into a subdirectory while keeping a handle above it, then climb.
os.makedirs("/tmp/jail", exist_ok=True)
up = os.open("/", os.O_RDONLY)
os.chroot("/tmp/jail")
os.fchdir(up)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
print("escaped root sees marker:", os.path.exists(marker), os.path.exists("/tmp/jail"))
for cmd in ["mount --bind / /mnt", "mount --bind /proc/1/root /mnt", "mount -t proc proc /mnt",
            "mount --make-rshared /", "unshare -m sh -c 'mount --bind / /mnt'", "unshare -Um true",
            "unshare -pf --mount-proc true", "nsenter -t 1 -m true", "umount -l /proc/sys",
            "mount -o remount,rw /proc/sys"]:
    r = subprocess.run(cmd, shell=True, capture_output=True)
    print("ALLOWED" if r.returncode == 0 else "refused", cmd)
"#,
            marker = marker.display()
        ),
    );
    std::fs::remove_file(&marker).unwrap();
    assert!(
        out.contains("escaped root sees marker: False True"),
        "the chroot escape left the sandbox's root: {out}"
    );
    assert!(!out.contains("ALLOWED"), "{out}");
    let mounts_after = sh(&o.sandbox, "wc -l < /proc/self/mountinfo").0;
    assert_eq!(mounts_before, mounts_after, "a mount appeared");
}

/// Device nodes: no kind of node that reaches hardware or kernel memory can be made, in /dev (a
/// tmpfs without nodev) or anywhere; a FIFO (no privilege) still can.
#[test]
fn device_nodes_cannot_be_made_anywhere() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let o = one("mknod", base);
    let out = python(
        &o.sandbox,
        r#"
import os, stat, errno
for path in ["/dev/wt-mem", "/dev/shm/wt-mem", "/tmp/wt-mem", "/.warren/wt-mem"]:
    for kind, dev in [(stat.S_IFCHR, os.makedev(1, 1)), (stat.S_IFCHR, os.makedev(10, 237)),
                      (stat.S_IFBLK, os.makedev(7, 0)), (stat.S_IFBLK, os.makedev(254, 0))]:
        try:
            os.mknod(path, kind | 0o600, dev)
            print("MADE", path)
            os.unlink(path)
        except OSError as e:
            print("refused", path, errno.errorcode[e.errno])
os.mkfifo("/tmp/wt-fifo")
print("fifo", stat.S_ISFIFO(os.stat("/tmp/wt-fifo").st_mode))
"#,
    );
    assert!(!out.contains("MADE"), "{out}");
    assert!(out.contains("fifo True"), "{out}");
}

/// `/proc/<pid>/root` of a process outside the sandbox would be the host's root: no process outside
/// is visible (none of the host's PIDs leads to a host file), and every process inside has the
/// sandbox's root.
#[test]
fn proc_pid_root_never_leads_outside() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let marker = format!("/tmp/wt-esc-root-{}", std::process::id());
    std::fs::write(&marker, b"host").unwrap();
    let o = one("pidroot", base);
    let host_pids: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.chars().all(|c| c.is_ascii_digit()))
        .collect();
    let (out, _) = sh(
        &o.sandbox,
        &format!(
            "(sleep 600 >/dev/null 2>&1 &); \
             for p in {pids}; do test -e /proc/$p/root{marker} && echo FOUND $p; done; \
             root=$(stat -c %d:%i /); n=0; \
             for p in /proc/[0-9]*; do n=$((n+1)); \
               r=$(stat -L -c %d:%i $p/root 2>/dev/null) || continue; \
               [ \"$r\" = \"$root\" ] || echo OTHER $p $r; done; echo checked $n",
            pids = host_pids.join(" "),
        ),
    );
    std::fs::remove_file(&marker).unwrap();
    assert!(!out.contains("FOUND") && !out.contains("OTHER"), "{out}");
    assert!(out.contains("checked "), "{out}");
}

/// The PIDs of a sandbox's processes, from its cgroup (host view).
fn sandbox_pids(id: &str) -> Vec<u32> {
    for dir in [
        format!("/sys/fs/cgroup/pids/warren/{id}"),
        format!("/sys/fs/cgroup/warren/{id}"),
    ] {
        if let Ok(procs) = std::fs::read_to_string(Path::new(&dir).join("cgroup.procs")) {
            return procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
        }
    }
    panic!("no cgroup for {id}");
}

/// Every open fd of every process in the sandbox, checked from the host: a file must be on a mount
/// of the sandbox's own mount namespace (its `mnt_id` is one of the init's mountinfo), and nothing
/// else but sockets, pipes and anonymous inodes may be open. A namespace fd (`net:[…]`, `mnt:[…]`)
/// or a host file left open by the supervisor, the init or CRIU would be a door for `setns` or
/// `openat` out of the sandbox.
fn leaked_fds(sandbox: &Sandbox) -> Vec<String> {
    let mountinfo =
        std::fs::read_to_string(format!("/proc/{}/mountinfo", sandbox.init_pid)).unwrap();
    let mounts: BTreeSet<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').next())
        .collect();
    let mut leaks = Vec::new();
    let pids = sandbox_pids(&sandbox.id);
    assert!(pids.contains(&sandbox.init_pid), "{pids:?}");
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy().into_owned();
            if ["socket:[", "pipe:[", "anon_inode:"]
                .iter()
                .any(|p| target.starts_with(p))
            {
                continue;
            }
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let mnt_id = info
                .lines()
                .find_map(|l| l.strip_prefix("mnt_id:"))
                .map(str::trim)
                .unwrap_or("?");
            if !mounts.contains(mnt_id) {
                leaks.push(format!(
                    "pid {pid} fd {:?} -> {target} (mnt {mnt_id})",
                    fd.file_name()
                ));
            }
        }
    }
    leaks
}

#[test]
fn no_host_namespace_or_file_descriptor_leaks_into_the_sandbox() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let o = one("fds", base.clone());
    // Children of the agent too: a long-running one and one holding files open.
    let (out, code) = sh(
        &o.sandbox,
        "(sleep 600 </dev/null >/dev/null 2>&1 &); (exec 7</etc/passwd; sleep 600 >/dev/null 2>&1 &); echo started",
    );
    assert_eq!((out.trim(), code), ("started", 0));
    let leaks = leaked_fds(&o.sandbox);
    assert!(leaks.is_empty(), "fresh sandbox: {leaks:?}");
    // The same after a CRIU round trip (a fork restored from a checkpoint), where CRIU made the fds.
    if !o.runtime.capabilities().checkpoint {
        println!("SKIP (fork part): CRIU does not work on this host");
        return;
    }
    let snapshot = o.runtime.config().state_dir.join("snapshots/fds");
    o.runtime
        .checkpoint(&o.sandbox.id, &snapshot, true)
        .expect("checkpoint");
    let fork_spec = common::spec("wt-esc-fds-f", vec![base], common::resources());
    let _cleanup = common::DestroyOnDrop(&o.runtime, vec![fork_spec.id.clone()]);
    let fork = o.runtime.restore(&snapshot, &fork_spec).expect("fork");
    let leaks = leaked_fds(&fork);
    assert!(leaks.is_empty(), "restored fork: {leaks:?}");
    let (out, _) = sh(
        &fork,
        "ls /proc/*/fd/ -l 2>/dev/null | grep -c -E 'net:|mnt:|pid:|user:|cgroup:'",
    );
    assert_eq!(out.trim(), "0", "namespace fds visible inside the fork");
}

/// Hard links through the shared template layer: a link made inside to a file of the read-only
/// layer, then written through, must copy the file up (overlayfs), never change the host's layer
/// file or what another sandbox of the template sees; a link to the agent crosses mounts and fails.
#[test]
fn hard_links_to_shared_layer_files_never_write_the_layer() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let file = base.join("etc/debian_version");
    let content = std::fs::read(&file).unwrap();
    let meta = std::fs::metadata(&file).unwrap();
    let runtime = common::runtime("hardlink");
    let ids = vec!["wt-esc-hl-a".to_string(), "wt-esc-hl-b".to_string()];
    let _cleanup = common::DestroyOnDrop(&runtime, ids.clone());
    let a = runtime
        .create(&common::spec(
            &ids[0],
            vec![base.clone()],
            common::resources(),
        ))
        .expect("create a");
    let b = runtime
        .create(&common::spec(
            &ids[1],
            vec![base.clone()],
            common::resources(),
        ))
        .expect("create b");
    let (out, code) = sh(
        &a,
        "ln /etc/debian_version /root/dv && echo pwned >> /root/dv && \
         chmod 4777 /root/dv && cat /etc/debian_version; \
         ln /.warren/agent /root/agent 2>&1 || echo refused-agent",
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("pwned"),
        "the link inside does not share the file: {out}"
    );
    assert!(out.contains("refused-agent"), "{out}");
    use std::os::unix::fs::MetadataExt;
    let after = std::fs::metadata(&file).unwrap();
    assert_eq!(
        std::fs::read(&file).unwrap(),
        content,
        "the layer's file changed"
    );
    assert_eq!(
        (after.nlink(), after.mode(), after.ino()),
        (meta.nlink(), meta.mode(), meta.ino()),
        "the layer's inode changed"
    );
    let (seen, _) = sh(&b, "cat /etc/debian_version");
    assert_eq!(
        seen.as_bytes(),
        &content[..],
        "the other sandbox sees the change"
    );
}
