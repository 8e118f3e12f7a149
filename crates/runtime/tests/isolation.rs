//! Isolation battery: what a sandbox must not see or do.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::path::PathBuf;

use warren_runtime::{Runtime, Sandbox};

fn must_fail(sandbox: &Sandbox, command: &str) -> String {
    let (out, code) = common::exec(sandbox, command);
    assert_ne!(
        code, 0,
        "`{command}` must fail inside the sandbox, printed: {out}"
    );
    out
}

fn must_pass(sandbox: &Sandbox, command: &str) -> String {
    let (out, code) = common::exec(sandbox, command);
    assert_eq!(
        code, 0,
        "`{command}` must succeed inside the sandbox, printed: {out}"
    );
    out
}

struct Pair {
    runtime: common::TestRuntime,
    a: Sandbox,
    b: Sandbox,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for id in [&self.a.id, &self.b.id] {
            let _ = self.runtime.destroy(id);
        }
    }
}

fn pair(name: &str, base: PathBuf) -> Pair {
    let runtime = common::runtime(name);
    let a = runtime
        .create(&common::spec(
            &format!("wt-{name}-a"),
            vec![base.clone()],
            common::resources(),
        ))
        .expect("create a");
    let b = runtime.create(&common::spec(
        &format!("wt-{name}-b"),
        vec![base],
        common::resources(),
    ));
    let b = match b {
        Ok(b) => b,
        Err(e) => {
            let _ = runtime.destroy(&a.id);
            panic!("create b: {e}");
        }
    };
    Pair { runtime, a, b }
}

#[test]
fn sandbox_cannot_see_host_or_other_sandboxes() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let marker = PathBuf::from(format!("/tmp/wt-host-marker-{}", std::process::id()));
    std::fs::write(&marker, b"host").unwrap();
    let p = pair("see", base);

    // Processes: only the sandbox's own tree; PID 1 is the agent; no host process (this test) is visible.
    let out = must_pass(&p.a, "ls /proc | grep -c '^[0-9]'");
    let count: u32 = out.trim().parse().unwrap();
    assert!(count < 10, "sandbox sees {count} processes");
    assert_eq!(
        must_pass(&p.a, "tr -d '\\0' < /proc/1/cmdline"),
        "/.warren/agent"
    );
    let me = std::process::id();
    let out = must_pass(
        &p.a,
        &format!("cat /proc/{me}/cmdline 2>/dev/null | tr '\\0' ' '; true"),
    );
    assert!(
        !out.contains("isolation"),
        "sees the host test process: {out}"
    );

    // Files: no host file, no state dir, no template layer path.
    must_fail(&p.a, &format!("test -e {}", marker.display()));
    must_fail(
        &p.a,
        &format!("test -e {}", p.runtime.config().state_dir.display()),
    );
    must_fail(&p.a, "test -e /var/cache/warren");

    // The other sandbox: its files and processes stay invisible.
    must_pass(
        &p.a,
        "echo secret > /tmp/only-a; (sleep 4321 >/dev/null 2>&1 &)",
    );
    must_fail(&p.b, "test -e /tmp/only-a");
    assert_eq!(
        must_pass(&p.b, "ps -eo args | grep -c '[s]leep 4321'; true").trim(),
        "0"
    );
    assert_eq!(
        must_pass(&p.a, "ps -eo args | grep -c '[s]leep 4321'; true").trim(),
        "1"
    );
    std::fs::remove_file(&marker).unwrap();
}

#[test]
fn template_layer_is_unwritable_from_inside() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let p = pair("tmpl", base.clone());
    must_pass(
        &p.a,
        "echo changed > /etc/wt-probe && rm /usr/bin/yes && echo x >> /etc/passwd",
    );
    assert!(
        !base.join("etc/wt-probe").exists(),
        "write reached the template layer"
    );
    assert!(
        base.join("usr/bin/yes").exists(),
        "delete reached the template layer"
    );
    assert!(!std::fs::read_to_string(base.join("etc/passwd"))
        .unwrap()
        .ends_with("x\n"));
    // The other sandbox of the same template sees the pristine layer.
    must_fail(&p.b, "test -e /etc/wt-probe");
    must_pass(&p.b, "test -e /usr/bin/yes");
    // The root filesystem cannot be remounted to reach the layers either.
    must_fail(&p.a, "mount -o remount,rw / 2>&1");
}

#[test]
fn sandbox_cannot_load_modules_mount_or_escape() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let p = pair("priv", base);
    let s = &p.a;
    // finit_module / init_module / kexec_load / bpf / perf_event_open / keyctl, as raw syscalls: EPERM.
    let probe = [
        "import ctypes, sys",
        "libc = ctypes.CDLL(None, use_errno=True)",
        "bad = []",
        "for nr, args in [(313, (0, 0, 0)), (175, (0, 0, 0)), (246, (0, 0, 0, 0)), (321, (0, 0, 0)), (298, (0, 0, 0, 0, 0)), (250, (0, 0, 0, 0, 0))]:",
        "    r = libc.syscall(nr, *args)",
        "    e = ctypes.get_errno()",
        "    if r != -1 or e != 1: bad.append((nr, r, e))",
        "print(bad)",
        "sys.exit(1 if bad else 0)",
    ]
    .join("\n");
    let hex: String = probe.bytes().map(|b| format!("{b:02x}")).collect();
    must_pass(s, &format!("python3 -c \"exec(bytes.fromhex('{hex}'))\""));
    // Mounting, new namespaces, device nodes, the host disk.
    must_fail(s, "mount -t tmpfs none /mnt 2>&1");
    must_fail(s, "unshare -m true 2>&1");
    must_fail(s, "unshare -U true 2>&1");
    must_fail(s, "mknod /tmp/vda b 254 0 2>&1");
    must_fail(s, "ls /dev/vda /dev/sda /dev/nvme0n1 2>&1");
    let devices = must_pass(s, "ls /dev | tr '\\n' ' '");
    for node in [
        "null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm",
    ] {
        assert!(
            devices.split(' ').any(|d| d == node),
            "/dev lacks {node}: {devices}"
        );
    }
    // Capabilities: no CAP_SYS_ADMIN (21) or CAP_SYS_MODULE (16) even in the bounding set; seccomp on.
    let status = must_pass(
        s,
        "grep -E '^(CapBnd|CapEff|Seccomp|NoNewPrivs):' /proc/self/status",
    );
    let bnd = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .unwrap()
        .trim();
    let bnd = u64::from_str_radix(bnd, 16).unwrap();
    assert_eq!(
        bnd & (1 << 21),
        0,
        "CAP_SYS_ADMIN in bounding set: {status}"
    );
    assert_eq!(
        bnd & (1 << 16),
        0,
        "CAP_SYS_MODULE in bounding set: {status}"
    );
    assert_eq!(bnd & (1 << 27), 0, "CAP_MKNOD in bounding set: {status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    // No no_new_privs by default (as in Docker): the sandbox's `user` can sudo, and gets root with
    // the same reduced bounding set and seccomp filter.
    assert!(status.contains("NoNewPrivs:\t0"), "{status}");
    let via_sudo = must_pass(
        s,
        "setpriv --reuid=1000 --regid=1000 --init-groups sudo -n sh -c 'id -u; grep -E \"^(CapBnd|Seccomp):\" /proc/self/status'",
    );
    assert!(via_sudo.starts_with("0\n"), "sudo as user: {via_sudo}");
    assert!(
        via_sudo.contains("Seccomp:\t2"),
        "sudo escaped seccomp: {via_sudo}"
    );
    let sudo_bnd = via_sudo
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap());
    assert_eq!(
        sudo_bnd,
        Some(bnd),
        "sudo widened the bounding set: {via_sudo}"
    );
    // Kernel knobs and memory are masked.
    must_fail(s, "echo 1 > /proc/sys/vm/drop_caches 2>&1");
    for masked in [
        "/proc/kcore",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/kallsyms",
    ] {
        if std::path::Path::new(masked).exists() {
            assert_eq!(
                must_pass(s, &format!("wc -c < {masked}")).trim(),
                "0",
                "{masked} is not masked"
            );
        }
    }
    must_fail(s, "echo b > /proc/sysrq-trigger 2>&1");
    // ptrace of PID 1 is the sandbox's own agent at most; the host's processes do not exist here.
    must_fail(s, "test -e /proc/1/root/var/cache/warren");
}

#[test]
fn sandboxes_cannot_reach_each_other_or_the_host() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let p = pair("net", base);
    let connect = |ip: std::net::Ipv4Addr, port: u16| {
        format!("python3 -c \"import socket; socket.create_connection(('{ip}', {port}), timeout=2)\" 2>&1")
    };
    // Positive controls: the host reaches both agents (exec works) and a sandbox reaches itself.
    must_pass(&p.a, &connect(p.a.ip, 49983));
    must_pass(&p.a, &format!("ip -4 addr show eth0 | grep -q {}", p.a.ip));
    // Sandbox to sandbox: dropped.
    must_fail(&p.a, &connect(p.b.ip, 49983));
    must_fail(&p.b, &connect(p.a.ip, 49983));
    // Sandbox to a host service on the bridge address: dropped.
    let listener =
        std::net::TcpListener::bind("10.77.0.1:0").expect("listen on the bridge address");
    let port = listener.local_addr().unwrap().port();
    must_fail(&p.a, &connect(std::net::Ipv4Addr::new(10, 77, 0, 1), port));
    // Without allow_internet the address is not in the NAT set.
    assert!(!warren_runtime::network::firewall::internet_allowed(p.a.ip));
}

#[test]
fn internet_access_is_granted_by_rule_only_when_asked() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("inet");
    let mut spec = common::spec("wt-inet", vec![base], common::resources());
    spec.network.allow_internet = true;
    let sandbox = runtime.create(&spec).expect("create");
    let allowed = warren_runtime::network::firewall::internet_allowed(sandbox.ip);
    let masquerade = std::process::Command::new("nft")
        .args(["list", "chain", "ip", "warren", "postrouting"])
        .output()
        .unwrap();
    runtime.destroy("wt-inet").expect("destroy");
    assert!(allowed, "allow_internet sandbox is not in the NAT set");
    assert!(String::from_utf8_lossy(&masquerade.stdout).contains("masquerade"));
    assert!(
        !warren_runtime::network::firewall::internet_allowed(sandbox.ip),
        "destroy left the NAT element"
    );
}

#[test]
fn host_hardware_and_kernel_details_are_masked() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("masks");
    let sandbox = runtime
        .create(&common::spec("wt-masks", vec![base], common::resources()))
        .expect("create");
    let _guard = DestroyOnDrop(&runtime, "wt-masks");
    // Kernel memory layout and slab details read as empty; firmware (ACPI tables) and power capping
    // show empty directories. The host has them (checked first, so the test means something).
    for path in ["/proc/slabinfo", "/proc/vmallocinfo"] {
        assert!(
            std::fs::metadata(path).is_ok(),
            "{path} missing on the host"
        );
        let out = must_pass(&sandbox, &format!("wc -c < {path}"));
        assert_eq!(out.trim(), "0", "{path} readable inside");
    }
    if std::path::Path::new("/sys/firmware")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        let out = must_pass(&sandbox, "ls -A /sys/firmware | wc -l");
        assert_eq!(out.trim(), "0", "/sys/firmware lists host firmware");
    }
    must_fail(&sandbox, "touch /sys/firmware/x");
    // The root filesystem refuses device nodes (nodev); /dev is the sandbox's own tmpfs.
    let root = must_pass(
        &sandbox,
        "awk '$5 == \"/\" {print $6}' /proc/self/mountinfo",
    );
    assert!(root.contains("nodev"), "root mount options: {root}");
}

struct DestroyOnDrop<'a>(&'a warren_runtime::LinuxRuntime, &'static str);

impl Drop for DestroyOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.destroy(self.1);
    }
}

#[test]
fn link_local_private_and_host_networks_are_denied_even_with_internet() {
    // Read from the installed ruleset (never by sending to such an address: the host really has
    // routes to link-local and private networks).
    let Some(_base) = common::base_rootfs() else {
        return;
    };
    let _runtime = common::runtime("always-deny");
    let list = |what: &[&str]| {
        let out = std::process::Command::new("nft")
            .args(what)
            .output()
            .expect("run nft");
        assert!(out.status.success(), "nft {what:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let denied = list(&["list", "set", "ip", "warren", "always_deny"]);
    for range in [
        "169.254.0.0/16",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "127.0.0.0/8",
    ] {
        assert!(denied.contains(range), "{range} missing: {denied}");
    }
    let host = warren_runtime::network::firewall::HostNetworks::probe("warren0");
    for (network, prefix) in &host.connected {
        let cidr = format!("{network}/{prefix}");
        let covered = denied.contains(&cidr)
            || warren_runtime::network::firewall::ALWAYS_DENIED
                .iter()
                .any(|r| cidr_contains(r, *network));
        assert!(covered, "host network {cidr} not denied: {denied}");
    }
    let forward = list(&["list", "chain", "ip", "warren", "forward"]);
    let deny = forward.find("@always_deny drop").expect("always-deny rule");
    let internet = forward.find("@internet drop").expect("internet rule");
    let dns = forward.find("@resolvers accept").expect("resolver rule");
    let accept = forward
        .find("ip saddr 10.77.0.0/16 accept")
        .expect("the internet accept");
    assert!(internet < dns && dns < deny && deny < accept, "{forward}");
    assert!(
        forward[deny..].contains("jump egress"),
        "egress must come after the always-deny drop: {forward}"
    );
}

fn cidr_contains(cidr: &str, ip: std::net::Ipv4Addr) -> bool {
    let (net, prefix) = cidr.split_once('/').unwrap();
    let net: std::net::Ipv4Addr = net.parse().unwrap();
    let prefix: u32 = prefix.parse().unwrap();
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(ip) & mask == u32::from(net) & mask
}
