//! Attacks from one sandbox on its neighbours and the host through the shared bridge (issue 14, part
//! 2), each performed for real from inside a sandbox. The attacker keeps CAP_NET_RAW
//! (`NetworkSpec::raw_sockets`), the strongest a sandbox can be, and forges frames with python3's
//! packet sockets. Every address is a sandbox's, the bridge's, or one in a namespace the test makes.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use warren_runtime::{Runtime, Sandbox};

/// A command line that runs `code` with python3 inside a sandbox (hex keeps the shell out of it).
fn python(code: &str) -> String {
    let hex: String = code.bytes().map(|b| format!("{b:02x}")).collect();
    format!("python3 -c \"exec(bytes.fromhex('{hex}'))\"")
}

fn run_ok(sandbox: &Sandbox, command: &str) -> String {
    let (out, code) = common::exec(sandbox, command);
    assert_eq!(code, 0, "`{command}` failed in {}: {out}", sandbox.id);
    out
}

fn hex_mac(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("0277{a:02x}{b:02x}{c:02x}{d:02x}")
}

fn colon_mac(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("02:77:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

fn host_command(program: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(program).args(args).output().expect(program);
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

/// The bridge's MAC as 12 hex digits.
fn bridge_mac(bridge: &str) -> String {
    let (_, out) = host_command("ip", &["-o", "link", "show", bridge]);
    let mac = out
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC for {bridge}: {out}"));
    mac.replace(':', "")
}

/// Like `common::exec` with bounded waits, for a sandbox that may have been cut off: the output, or
/// why there was none.
fn try_exec(sandbox: &Sandbox, command: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect_timeout(&sandbox.agent_addr(), Duration::from_secs(2))
            .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut output = String::new();
    stream
        .read_to_string(&mut output)
        .map_err(|e| format!("read: {e}"))?;
    match output.rsplit_once("\nEXIT ") {
        Some((body, "0\n")) => Ok(body.to_string()),
        _ => Err(format!("failed: {output}")),
    }
}

/// Sandboxes of one test, destroyed on drop.
struct Sandboxes {
    runtime: common::TestRuntime,
    ids: Vec<String>,
}

impl Sandboxes {
    fn new(name: &str) -> Self {
        Self {
            runtime: common::runtime(name),
            ids: Vec::new(),
        }
    }

    fn create(&mut self, id: &str, base: &Path, raw_sockets: bool, internet: bool) -> Sandbox {
        let mut spec = common::spec(id, vec![base.to_path_buf()], common::resources());
        spec.network.raw_sockets = raw_sockets;
        spec.network.allow_internet = internet;
        self.ids.push(id.to_string());
        self.runtime.create(&spec).expect("create sandbox")
    }
}

impl Drop for Sandboxes {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = self.runtime.destroy(id);
        }
    }
}

/// Starts `code` in the background inside `sandbox`; it must create /tmp/ready once listening and
/// finish (printing its result, then creating /tmp/done) after /tmp/stop appears.
fn start_background(sandbox: &Sandbox, code: &str) {
    run_ok(
        sandbox,
        &format!(
            "rm -f /tmp/ready /tmp/stop /tmp/done; ( {} > /tmp/out 2>&1; touch /tmp/done ) < /dev/null > /dev/null 2>&1 &",
            python(code)
        ),
    );
    wait_for_file(sandbox, "/tmp/ready");
}

fn wait_for_file(sandbox: &Sandbox, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, code) = common::exec(sandbox, &format!("test -e {path}"));
        if code == 0 {
            return;
        }
        if Instant::now() > deadline {
            let (out, _) = common::exec(sandbox, "cat /tmp/out");
            panic!("{path} never appeared in {}: {out}", sandbox.id);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops the background script and returns what it printed.
fn stop_background(sandbox: &Sandbox) -> String {
    run_ok(sandbox, "touch /tmp/stop");
    wait_for_file(sandbox, "/tmp/done");
    run_ok(sandbox, "cat /tmp/out")
}

/// The numbers after the words of `out` ("sent 12 captured 0" → value("captured") == 0).
fn value(out: &str, word: &str) -> u64 {
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == word {
            if let Some(n) = words.next().and_then(|n| n.parse().ok()) {
                return n;
            }
        }
    }
    panic!("no `{word} N` in {out:?}");
}

const ARP_ATTACK: &str = r#"
import socket, struct, time, os
A_MAC = bytes.fromhex('@A_MAC'); GW_MAC = bytes.fromhex('@GW_MAC')
B_IP = socket.inet_aton('@B_IP'); GW_IP = socket.inet_aton('@GW_IP')
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind(('eth0', 0)); s.setblocking(False)
def arp(dst, op, sha, spa, tha, tpa):
    return dst + A_MAC + b'\x08\x06' + struct.pack('!HHBBH', 1, 0x0800, 6, 4, op) + sha + spa + tha + tpa
frames = [
    arp(GW_MAC, 2, A_MAC, B_IP, GW_MAC, GW_IP),            # reply to the gateway: B is at A
    arp(b'\xff' * 6, 2, A_MAC, B_IP, b'\xff' * 6, B_IP),   # gratuitous reply
    arp(b'\xff' * 6, 1, A_MAC, B_IP, b'\x00' * 6, GW_IP),  # request claiming B's address
]
open('/tmp/ready', 'w').close()
sent = captured = 0
deadline = time.time() + 60
while not os.path.exists('/tmp/stop') and time.time() < deadline:
    for f in frames:
        s.send(f); sent += 1
    end = time.time() + 0.02
    while time.time() < end:
        try:
            data, addr = s.recvfrom(65535)
        except BlockingIOError:
            time.sleep(0.002); continue
        if addr[2] == 4:
            continue
        if data[12:14] == b'\x08\x00' and data[30:34] == B_IP:
            captured += 1
print('sent', sent, 'captured', captured)
"#;

/// ARP replies and requests from A claiming B's address must not move the host's neighbour entry
/// for B, and the host's traffic to B must keep reaching B and never A.
#[test]
fn arp_spoofing_does_not_redirect_another_sandboxs_traffic() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let mut sandboxes = Sandboxes::new("arp");
    let a = sandboxes.create("wt-arp-a", &base, true, false);
    let b = sandboxes.create("wt-arp-b", &base, false, false);
    let bridge = sandboxes.runtime.config().bridge.clone();
    let gateway = sandboxes.runtime.config().gateway;
    run_ok(&b, "true");
    let script = ARP_ATTACK
        .replace("@A_MAC", &hex_mac(a.ip))
        .replace("@GW_MAC", &bridge_mac(&bridge))
        .replace("@B_IP", &b.ip.to_string())
        .replace("@GW_IP", &gateway.to_string());
    start_background(&a, &script);
    // The host keeps talking to B while the attack runs; each exchange is a fresh connection, so a
    // moved neighbour entry would send it to A.
    let mut failures = Vec::new();
    let mut neighbours = Vec::new();
    for round in 0..20 {
        match try_exec(&b, "echo still-b") {
            Ok(out) if out.trim() == "still-b" => {}
            other => failures.push(format!("round {round}: {other:?}")),
        }
        neighbours
            .push(host_command("ip", &["neigh", "show", &b.ip.to_string(), "dev", &bridge]).1);
        std::thread::sleep(Duration::from_millis(150));
    }
    let out = stop_background(&a);
    assert!(value(&out, "sent") > 0, "the attack sent nothing: {out}");
    let a_mac = colon_mac(a.ip);
    for entry in &neighbours {
        assert!(
            !entry.contains(&a_mac),
            "the host's neighbour entry for B points at A: {entry}"
        );
    }
    assert!(failures.is_empty(), "B stopped answering: {failures:?}");
    assert!(
        neighbours.iter().any(|n| n.contains(&colon_mac(b.ip))),
        "the host never had B's real MAC for B: {neighbours:?}"
    );
    assert_eq!(value(&out, "captured"), 0, "A captured B's traffic: {out}");
}

/// The bridge has a MAC of its own (derived from the gateway address), so it does not change as
/// sandboxes come and go. Without one, a Linux bridge takes the lowest MAC among its ports: the
/// gateway MAC every sandbox had cached went stale whenever a port came or went, and a sandbox's
/// packets to the host were lost until its neighbour entry was probed again (CI saw the host wait
/// minutes for an answer already sent).
#[test]
fn the_bridge_mac_stays_put_while_sandboxes_come_and_go() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let mut sandboxes = Sandboxes::new("brmac");
    let bridge = sandboxes.runtime.config().bridge.clone();
    let expected = hex_mac(sandboxes.runtime.config().gateway);
    let a = sandboxes.create("wt-brmac-a", &base, false, false);
    let b = sandboxes.create("wt-brmac-b", &base, false, false);
    run_ok(&b, "true");
    assert_eq!(bridge_mac(&bridge), expected);
    // B's cached gateway entry names the bridge's MAC.
    let arp = run_ok(&b, "cat /proc/net/arp");
    assert!(
        arp.replace(':', "").contains(&expected),
        "B's gateway entry is not the bridge's MAC {expected}: {arp}"
    );
    let mut seen = Vec::new();
    for round in 0..3 {
        sandboxes.runtime.destroy(&a.id).expect("destroy A");
        seen.push(bridge_mac(&bridge));
        let c = sandboxes.create(&format!("wt-brmac-c{round}"), &base, false, false);
        seen.push(bridge_mac(&bridge));
        sandboxes.runtime.destroy(&c.id).expect("destroy C");
        seen.push(bridge_mac(&bridge));
        // A port comes back (at whatever address is free: other tests run alongside).
        sandboxes.create("wt-brmac-a", &base, false, false);
    }
    assert!(
        seen.iter().all(|mac| *mac == expected),
        "the bridge's MAC changed (expected {expected}): {seen:?}"
    );
    assert_eq!(run_ok(&b, "echo still-b").trim(), "still-b");
}

const IP_SPOOF: &str = r#"
import socket, struct
def packet(src, dst, sport, dport, payload):
    udp = struct.pack('!HHHH', sport, dport, 8 + len(payload), 0) + payload
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    return ip + udp
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for _ in range(5):
    s.sendto(packet('@SRC', '@DST', @SPORT, @DPORT, b'@PAYLOAD'), ('@DST', 0))
print('sent')
"#;

fn spoof(from: &Sandbox, src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, payload: &str) {
    let script = IP_SPOOF
        .replace("@SRC", &src.to_string())
        .replace("@DST", &dst.to_string())
        .replace("@SPORT", &sport.to_string())
        .replace("@DPORT", &dport.to_string())
        .replace("@PAYLOAD", payload);
    run_ok(from, &python(&script));
}

fn send_udp(from: &Sandbox, sport: u16, dst: Ipv4Addr, dport: u16, payload: &str) {
    run_ok(
        from,
        &python(&format!(
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('0.0.0.0', {sport}))\nfor _ in range(3): s.sendto(b'{payload}', ('{dst}', {dport}))\n"
        )),
    );
}

/// Datagrams `socket` receives until one carries `last` (then a short drain), or a deadline.
fn receive_until(socket: &UdpSocket, last: &str) -> Vec<String> {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut drain_until = None;
    let mut buf = [0u8; 2048];
    while Instant::now() < drain_until.unwrap_or(deadline) {
        if let Ok((n, _)) = socket.recv_from(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            if text == last && drain_until.is_none() {
                drain_until = Some(Instant::now() + Duration::from_millis(500));
            }
            got.push(text);
        }
    }
    got
}

/// A network namespace the test owns, joined to the host by a veth pair on a test-owned /30 (no
/// default route): the stand-in for "the internet".
struct Destination {
    name: String,
    host_ip: Ipv4Addr,
    ip: Ipv4Addr,
}

impl Destination {
    fn create() -> Self {
        // Tests of one process run at once: each destination gets its own name and /30.
        static SERIAL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("wt-dst-{pid}-{serial}");
        let third = ((pid + serial * 7) % 250) as u8;
        let host_ip = Ipv4Addr::new(198, 19, third, 1);
        let ip = Ipv4Addr::new(198, 19, third, 2);
        let host_link = format!("wtd{}-{serial}", pid % 10_000);
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), name.clone()],
            vec![
                "link".into(),
                "add".into(),
                host_link.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                "eth0".into(),
                "netns".into(),
                name.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{host_ip}/30"),
                "dev".into(),
                host_link.clone(),
            ],
            vec!["link".into(), "set".into(), host_link, "up".into()],
            vec![
                "-n".into(),
                name.clone(),
                "addr".into(),
                "add".into(),
                format!("{ip}/30"),
                "dev".into(),
                "eth0".into(),
            ],
            vec![
                "-n".into(),
                name.clone(),
                "link".into(),
                "set".into(),
                "eth0".into(),
                "up".into(),
            ],
        ];
        let destination = Self { name, host_ip, ip };
        for step in steps {
            let args: Vec<&str> = step.iter().map(String::as_str).collect();
            let (ok, out) = host_command("ip", &args);
            assert!(ok, "ip {args:?}: {out}");
        }
        destination
    }

    /// A UDP socket bound inside the namespace.
    fn socket(&self) -> UdpSocket {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap();
        let ip = self.ip;
        warren_runtime::namespaces::run_in(&ns, nix::sched::CloneFlags::CLONE_NEWNET, move || {
            UdpSocket::bind((ip, 0))
        })
        .expect("join the destination namespace")
        .expect("bind in the destination namespace")
    }
}

impl Drop for Destination {
    fn drop(&mut self) {
        // The veth pair goes with the namespace.
        let _ = host_command("ip", &["netns", "del", &self.name]);
    }
}

/// Packets from A with B's source address never reach the host, even as "replies" on a flow the host
/// opened to B; and a sandbox without internet cannot borrow the address of one with it to get out.
#[test]
fn ip_spoofing_of_another_sandboxs_address_is_dropped() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let mut sandboxes = Sandboxes::new("ipspoof");
    let a = sandboxes.create("wt-ipspoof-a", &base, true, false);
    let b = sandboxes.create("wt-ipspoof-b", &base, false, false);
    let c = sandboxes.create("wt-ipspoof-c", &base, false, true);
    let gateway = sandboxes.runtime.config().gateway;

    // Toward the gateway: the host opens a UDP flow to B, so B's answers count as replies.
    let host = UdpSocket::bind((gateway, 0)).expect("bind on the bridge address");
    let host_port = host.local_addr().unwrap().port();
    let b_port = 40_123;
    host.send_to(b"hello-b", (b.ip, b_port)).unwrap();
    spoof(&a, b.ip, b_port, gateway, host_port, "spoofed-as-b");
    send_udp(&b, b_port, gateway, host_port, "genuine-b");
    let got = receive_until(&host, "genuine-b");
    assert!(
        got.iter().any(|g| g == "genuine-b"),
        "B's own reply did not reach the host: {got:?}"
    );
    assert!(
        !got.iter().any(|g| g == "spoofed-as-b"),
        "A's packet with B's address reached the host: {got:?}"
    );

    // Toward "the internet" (a namespace of this test): C may go out, A may not, not even as C.
    let destination = Destination::create();
    let listener = destination.socket();
    let port = listener.local_addr().unwrap().port();
    spoof(&a, c.ip, 40_124, destination.ip, port, "spoofed-as-c");
    send_udp(&a, 40_125, destination.ip, port, "from-a");
    send_udp(&c, 40_126, destination.ip, port, "from-c");
    let got = receive_until(&listener, "from-c");
    assert!(
        got.iter().any(|g| g == "from-c"),
        "the internet-enabled sandbox did not get out (to {}): {got:?}",
        destination.host_ip
    );
    assert!(
        !got.iter().any(|g| g == "from-a"),
        "A got out without internet: {got:?}"
    );
    assert!(
        !got.iter().any(|g| g == "spoofed-as-c"),
        "A got out with C's address: {got:?}"
    );
}

const SNIFFER: &str = r#"
import socket, os, time
B_IP = socket.inet_aton('@B_IP')
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind(('eth0', 0)); s.settimeout(0.1)
open('/tmp/ready', 'w').close()
other = to_b = 0
deadline = time.time() + 60
while not os.path.exists('/tmp/stop') and time.time() < deadline:
    try:
        data, addr = s.recvfrom(65535)
    except socket.timeout:
        continue
    if addr[2] == 3:  # PACKET_OTHERHOST: unicast to a MAC that is not ours
        other += 1
    if addr[2] != 4 and data[12:14] == b'\x08\x00' and data[30:34] == B_IP:
        to_b += 1
print('other', other, 'to_b', to_b)
"#;

/// While the bridge does not know where B's MAC is (its forwarding entry is deleted before every
/// datagram), the host's frames to B are flooded; none may come out of A's port.
#[test]
fn unknown_unicast_to_another_sandbox_is_not_flooded_to_a() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let mut sandboxes = Sandboxes::new("flood");
    let a = sandboxes.create("wt-flood-a", &base, true, false);
    let b = sandboxes.create("wt-flood-b", &base, false, false);
    run_ok(&b, "true");
    start_background(&a, &SNIFFER.replace("@B_IP", &b.ip.to_string()));
    let host = UdpSocket::bind("0.0.0.0:0").unwrap();
    let b_port = warren_runtime::network::veth_name("wv", b.ip);
    let mut forgotten = 0;
    for _ in 0..40 {
        let (ok, _) = host_command(
            "bridge",
            &["fdb", "del", &colon_mac(b.ip), "dev", &b_port, "master"],
        );
        if ok {
            forgotten += 1;
        }
        host.send_to(b"to-b", (b.ip, 9)).unwrap();
        std::thread::sleep(Duration::from_millis(25));
    }
    let out = stop_background(&a);
    assert!(
        forgotten > 0,
        "the bridge never had B's MAC to forget, so nothing was flooded: {out}"
    );
    assert_eq!(value(&out, "other"), 0, "A received others' unicast: {out}");
    assert_eq!(value(&out, "to_b"), 0, "A received frames for B: {out}");
}

const IPV6_FRAME: &str = r#"
import socket, struct
A_MAC = bytes.fromhex('@A_MAC'); GW_MAC = bytes.fromhex('@GW_MAC')
src = socket.inet_pton(socket.AF_INET6, 'fe80::77:1')
dst = socket.inet_pton(socket.AF_INET6, '@HOST_LL')
payload = b'over-ipv6'
udp = struct.pack('!HHHH', 40127, @PORT, 8 + len(payload), 0) + payload
pseudo = src + dst + struct.pack('!I3xB', len(udp), 17) + udp
if len(pseudo) % 2: pseudo += b'\0'
total = sum(struct.unpack('!%dH' % (len(pseudo) // 2), pseudo))
while total >> 16: total = (total & 0xffff) + (total >> 16)
udp = udp[:6] + struct.pack('!H', (~total & 0xffff) or 0xffff) + udp[8:]
ip6 = struct.pack('!IHBB', 0x60000000, len(udp), 17, 255) + src + dst
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
for _ in range(5): s.send(GW_MAC + A_MAC + b'\x86\xdd' + ip6 + udp)
print('sent')
"#;

/// The host's link-local address on `bridge` once it is usable (not tentative), if it gets one.
fn bridge_link_local(bridge: &str) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, out) = host_command(
            "ip",
            &["-6", "-o", "addr", "show", "dev", bridge, "scope", "link"],
        );
        let usable = out
            .lines()
            .filter(|l| !l.contains("tentative"))
            .find_map(|l| {
                let addr = l.split_whitespace().skip_while(|w| *w != "inet6").nth(1)?;
                Some(addr.split('/').next()?.to_string())
            });
        if usable.is_some() || Instant::now() > deadline {
            return usable;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A sandbox's eth0 has no IPv6, and IPv6 frames forged onto the link never reach the host.
#[test]
fn ipv6_from_a_sandbox_never_reaches_the_host() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let mut sandboxes = Sandboxes::new("ipv6");
    let a = sandboxes.create("wt-ipv6-a", &base, true, false);
    let bridge = sandboxes.runtime.config().bridge.clone();
    assert_eq!(
        run_ok(&a, "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6").trim(),
        "1"
    );
    assert_eq!(run_ok(&a, "ip -6 addr show dev eth0").trim(), "");
    let Some(host_ll) = bridge_link_local(&bridge) else {
        println!("SKIP: {bridge} has no IPv6 link-local address here (IPv6 off on the host)");
        return;
    };
    // Dual-stack: the host's flow to A over IPv4 lets A's IPv4 answer, sent after the IPv6 frames,
    // mark the end of what could arrive.
    let listener = UdpSocket::bind("[::]:0").expect("bind on IPv6");
    let port = listener.local_addr().unwrap().port();
    let a_port = 40_128;
    listener
        .send_to(b"hello-a", (a.ip.to_ipv6_mapped(), a_port))
        .unwrap();
    let script = IPV6_FRAME
        .replace("@A_MAC", &hex_mac(a.ip))
        .replace("@GW_MAC", &bridge_mac(&bridge))
        .replace("@HOST_LL", &host_ll)
        .replace("@PORT", &port.to_string());
    run_ok(&a, &python(&script));
    let gateway = sandboxes.runtime.config().gateway;
    send_udp(&a, a_port, gateway, port, "after-ipv6");
    let got = receive_until(&listener, "after-ipv6");
    assert!(
        got.iter().any(|g| g == "after-ipv6"),
        "A's IPv4 answer did not arrive: {got:?}"
    );
    assert!(
        !got.iter().any(|g| g == "over-ipv6"),
        "IPv6 from the sandbox reached the host at {host_ll}: {got:?}"
    );
}

/// Without the option a sandbox pings through ICMP datagram sockets, as root and as another user,
/// and raw and packet sockets fail with EPERM; with it they work. Destroy leaves no port binding.
#[test]
fn ping_needs_no_raw_sockets_and_raw_sockets_need_the_option() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let mut sandboxes = Sandboxes::new("raw");
    let plain = sandboxes.create("wt-raw-plain", &base, false, false);
    let raw = sandboxes.create("wt-raw-raw", &base, true, false);
    let echo = python(
        "import socket, struct\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)\n\
         s.settimeout(5)\n\
         s.sendto(struct.pack('!BBHHH', 8, 0, 0, 0, 1) + b'warren', ('127.0.0.1', 0))\n\
         data, _ = s.recvfrom(1500)\n\
         assert data[0] == 0 and data.endswith(b'warren'), data\n\
         print('echo ok')\n",
    );
    assert_eq!(run_ok(&plain, &echo).trim(), "echo ok");
    assert_eq!(
        run_ok(
            &plain,
            &format!("setpriv --reuid 65534 --regid 65534 --clear-groups {echo}")
        )
        .trim(),
        "echo ok"
    );
    let raw_probe = python(
        "import socket\n\
         for family, kind, proto in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), (socket.AF_PACKET, socket.SOCK_RAW, 0)]:\n\
         \x20   try:\n\
         \x20       socket.socket(family, kind, proto).close(); print('open')\n\
         \x20   except PermissionError as e:\n\
         \x20       print('errno', e.errno)\n",
    );
    assert_eq!(run_ok(&plain, &raw_probe), "errno 1\nerrno 1\n");
    assert_eq!(run_ok(&raw, &raw_probe), "open\nopen\n");
    let bounding = |s: &Sandbox| {
        let line = run_ok(s, "grep CapBnd /proc/self/status");
        u64::from_str_radix(line.trim().trim_start_matches("CapBnd:").trim(), 16).unwrap()
    };
    assert_eq!(
        bounding(&plain) & (1 << 13),
        0,
        "CAP_NET_RAW kept by default"
    );
    assert_ne!(
        bounding(&raw) & (1 << 13),
        0,
        "CAP_NET_RAW dropped despite the option"
    );

    let ports = || host_command("nft", &["list", "set", "bridge", "warren", "ports"]).1;
    let port = format!("\"{}\"", warren_runtime::network::veth_name("wv", plain.ip));
    assert!(
        ports().contains(&port),
        "no binding for {port}: {}",
        ports()
    );
    sandboxes.runtime.destroy(&plain.id).expect("destroy");
    assert!(
        !ports().contains(&port),
        "destroy left {port} bound: {}",
        ports()
    );
}

/// Loads `script` with `nft -f -` in the caller's network namespace.
fn nft_load(script: &str) {
    use std::io::Write;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "nft -f {script}");
}

/// The ruleset of a Warren before port binding (no version marker), as main installed it.
const FIRST_RULESET: &str = r#"table ip warren {
    set internet { type ipv4_addr; }
    chain forward {
        type filter hook forward priority filter; policy accept;
        iifname "warren0" ip saddr != @internet drop
    }
}
table bridge warren {
    chain forward {
        type filter hook forward priority filter; policy accept;
        iifname "wv-*" oifname "wv-*" drop
    }
}
add element ip warren internet { 10.77.9.9 }
"#;

/// A host with an older ruleset gets the current one, and what live sandboxes held carries over:
/// their internet grants and a binding for every sandbox port present. Runs in a network namespace
/// of its own, so the host's tables are never touched.
#[test]
fn an_older_ruleset_is_replaced_keeping_live_sandboxes() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: the runtime tests need root");
        return;
    }
    let listing = std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("own network namespace");
        nft_load(FIRST_RULESET);
        let (ok, out) = host_command(
            "ip",
            &[
                "link",
                "add",
                "wv-9-8",
                "type",
                "veth",
                "peer",
                "name",
                "wt-peer-9-8",
            ],
        );
        assert!(ok, "{out}");
        let gateway = Ipv4Addr::new(10, 77, 0, 1);
        let replaced =
            warren_runtime::network::firewall::ensure_ruleset("warren0", gateway, 16, 49090, &[])
                .expect("replace the ruleset");
        assert!(replaced, "an older ruleset was not reported replaced");
        let first = host_command("nft", &["list", "ruleset"]).1;
        // Current already: left alone (an element added now survives a second call).
        nft_load(
            "add element bridge warren ports { \"wv-9-7\" . 02:77:0a:4d:09:07 . 10.77.9.7 }\n",
        );
        let replaced =
            warren_runtime::network::firewall::ensure_ruleset("warren0", gateway, 16, 49090, &[])
                .expect("keep the ruleset");
        assert!(!replaced, "a current ruleset was reported replaced");
        let second = host_command("nft", &["list", "ruleset"]).1;
        (first, second)
    })
    .join()
    .expect("namespace thread");
    let (first, second) = listing;
    let marker = format!(
        "comment \"warren ruleset {} ",
        warren_runtime::network::firewall::RULESET_VERSION
    );
    assert_eq!(first.matches(&marker).count(), 2, "{first}");
    assert!(first.contains("10.77.9.9"), "internet grant lost: {first}");
    assert!(
        first.contains("\"wv-9-8\" . 02:77:0a:4d:09:08 . 10.77.9.8"),
        "live port not enrolled: {first}"
    );
    assert!(first.contains("chain prerouting"), "{first}");
    assert!(
        second.contains("\"wv-9-7\""),
        "a current ruleset was replaced: {second}"
    );
}

/// Tables of the current version built for other host networks (the host's resolvers or routes
/// changed since) are replaced, and the sandboxes' egress elements go over into the new ones: no
/// sandbox runs without its address or name rules while a restarted server starts. Runs in a
/// network namespace of its own, so the host's tables are never touched.
#[test]
fn a_ruleset_for_other_host_networks_is_replaced_keeping_egress_rules() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: the runtime tests need root");
        return;
    }
    use warren_runtime::network::firewall::{ensure_ruleset, ruleset, HostNetworks};
    let gateway = Ipv4Addr::new(10, 77, 0, 1);
    let (replaced, listing) = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("own network namespace");
        // A resolver no host here has: the digest differs from what this host's probe gives.
        let elsewhere = HostNetworks {
            resolvers: vec![Ipv4Addr::new(192, 0, 2, 53)],
            connected: Vec::new(),
            servers: Vec::new(),
        };
        let proxy = std::net::SocketAddrV4::new(gateway, 49090);
        nft_load(&ruleset("warren0", "10.77.0.0/16", &elsewhere, proxy));
        nft_load(concat!(
            "add element ip warren egress_deny { 10.77.9.5 . 198.18.0.0/15, 10.77.9.6 . 198.18.0.7 }\n",
            "add element ip warren egress_allow { 10.77.9.6 . 198.19.0.0/16 }\n",
            "add element ip warren names_headers { 10.77.9.5 }\n",
        ));
        let replaced = ensure_ruleset("warren0", gateway, 16, 49090, &[]).expect("replace the ruleset");
        (replaced, host_command("nft", &["list", "table", "ip", "warren"]).1)
    })
    .join()
    .expect("namespace thread");
    assert!(
        replaced,
        "tables for other host networks were kept: {listing}"
    );
    assert!(
        !listing.contains("192.0.2.53"),
        "the old tables are still there: {listing}"
    );
    for element in [
        "10.77.9.5 . 198.18.0.0/15",
        "10.77.9.6 . 198.18.0.7",
        "10.77.9.6 . 198.19.0.0/16",
    ] {
        assert!(listing.contains(element), "{element} lost: {listing}");
    }
    let headers = listing
        .split("set names_headers {")
        .nth(1)
        .expect("set names_headers");
    assert!(
        headers
            .split('}')
            .next()
            .unwrap_or("")
            .contains("10.77.9.5"),
        "names_headers element lost: {listing}"
    );
}

/// Egress rules by address, for real: a sandbox with internet is denied one destination (its own
/// test "internet" namespace), then allowed it over a deny-everything (allow wins), then shut out of
/// everything, then opened again; a sandbox created without internet gets out only once a rule
/// allows it. Every change applies to the running sandbox at once. Destroy removes its elements.
#[test]
fn egress_rules_by_address_apply_at_once_and_allow_wins() {
    use warren_runtime::network::egress::{Cidr, EgressRules};
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let mut sandboxes = Sandboxes::new("egress");
    let e = sandboxes.create("wt-egress-e", &base, false, true);
    let offline = sandboxes.create("wt-egress-off", &base, false, false);
    let destination = Destination::create();
    let listener = destination.socket();
    let port = listener.local_addr().unwrap().port();
    let dest = Cidr {
        network: destination.ip,
        prefix: 32,
    };
    let everything: Cidr = "0.0.0.0/0".parse().unwrap();
    let set = |id: &str, internet: bool, allow: Vec<Cidr>, deny: Vec<Cidr>| {
        let network = warren_runtime::NetworkSpec {
            allow_internet: internet,
            raw_sockets: false,
            egress: EgressRules {
                allow,
                deny,
                ..EgressRules::default()
            },
        };
        sandboxes
            .runtime
            .set_network(id, &network)
            .expect("set network");
    };
    let assert_phase = |blocked: &str, passed: &str| {
        let got = receive_until(&listener, passed);
        assert!(
            got.iter().any(|g| g == passed),
            "{passed} did not arrive: {got:?}"
        );
        assert!(
            !got.iter().any(|g| g == blocked),
            "{blocked} got through: {got:?}"
        );
    };

    set(&e.id, true, vec![], vec![dest]);
    send_udp(&e, 40_201, destination.ip, port, "denied-1");
    set(&e.id, true, vec![dest], vec![everything]);
    send_udp(&e, 40_202, destination.ip, port, "allowed-2");
    assert_phase("denied-1", "allowed-2");

    set(&e.id, true, vec![], vec![everything]);
    send_udp(&e, 40_203, destination.ip, port, "blocked-3");
    set(&e.id, true, vec![], vec![]);
    send_udp(&e, 40_204, destination.ip, port, "open-4");
    assert_phase("blocked-3", "open-4");

    // No internet: nothing gets out until an allowed network opens the way for it alone.
    send_udp(&offline, 40_205, destination.ip, port, "offline-5");
    set(&offline.id, true, vec![dest], vec![everything]);
    send_udp(&offline, 40_206, destination.ip, port, "allowed-6");
    assert_phase("offline-5", "allowed-6");

    // Rules in place are elements of the sandbox's address in set egress_deny; destroy removes them.
    set(&e.id, true, vec![], vec![dest]);
    let mine = format!("{} . {}", e.ip, destination.ip);
    let (listed, out) = host_command("nft", &["list", "set", "ip", "warren", "egress_deny"]);
    assert!(listed && out.contains(&mine), "no element {mine}: {out}");
    sandboxes.runtime.destroy(&e.id).expect("destroy");
    for set in ["egress_deny", "egress_allow", "internet"] {
        let (_, out) = host_command("nft", &["list", "set", "ip", "warren", set]);
        assert!(
            !out.contains(&format!("{} ", e.ip)) && !out.contains(&format!("{},", e.ip)),
            "destroy left an element of {} in {set}: {out}",
            e.ip
        );
    }
}
