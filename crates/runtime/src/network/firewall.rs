//! nftables rules of the sandbox network, in tables `ip warren` and `bridge warren` (docs/network.md
//! has the model and what each rule stops):
//! - every sandbox port (`wv-*`) is bound to its sandbox's MAC and address (set `ports`, one element
//!   per sandbox): the bridge drops ARP and IPv4 whose sender is not the port's own, and everything
//!   else (IPv6, VLAN tags, other ethertypes), so no sandbox can poison the host's neighbour cache,
//!   teach the bridge another sandbox's MAC, or send as another sandbox's address;
//! - the host's unicast frames go out of a sandbox port only when addressed to that port's own MAC and
//!   address, so unknown-unicast flooding never hands one sandbox another's traffic;
//! - sandboxes cannot reach each other (bridge-level drop between sandbox ports);
//! - sandboxes cannot open connections to the host (only replies to the host's own connections pass);
//! - traffic leaving the bridge is forwarded and masqueraded only for addresses in set `internet`
//!   (sandboxes created with `allow_internet`; the port binding makes the source address trustworthy);
//! - chain `egress` is jumped to for every forwarded sandbox packet before it is accepted: it accepts
//!   what a sandbox's allowed networks cover and drops what its denied ones do, by sets of
//!   (sandbox address . destination interval) elements (`egress_allow`, `egress_deny`);
//! - chain `names` (nat prerouting) sends the TCP connections to ports 80 and 443 that a sandbox's
//!   address rules would deny to the egress proxy on the gateway ([`super::egress_proxy`]), by sets
//!   `names_allow` and `names_deny` (the same intervals), `names_headers` (sandboxes with header
//!   rules: all their web traffic) and `names_upstream` (sandboxes with a SOCKS5 proxy of their own:
//!   all their TCP); only such redirected connections may reach the proxy's port.
//!
//! The tables are installed once per host with `nft -f -` and carry a version
//! ([`RULESET_VERSION`]). Everything a sandbox holds in them is set elements, changed over netlink
//! ([`super::nftables`]) in one batch per create ([`admit`]), destroy ([`withdraw`]) and network
//! update ([`set_network`]): no process is started per sandbox.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, Stdio};

use sha2::Digest;

use super::egress::Cidr;
use super::nftables::{self, Batch, Element, Family, SetRef};
use super::NetworkPlan;
use crate::NetworkSpec;

#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("run nft")]
    Spawn(#[source] std::io::Error),
    #[error("nft {what} failed: {stderr}")]
    Nft { what: String, stderr: String },
    #[error("enable IPv4 forwarding")]
    Forwarding(#[source] std::io::Error),
    #[error("list the host's sandbox ports")]
    Links(#[source] super::netlink::NetlinkError),
    #[error("ruleset lock /run/warren/firewall.lock")]
    Lock(#[source] std::io::Error),
    #[error("{what}")]
    Netfilter {
        what: &'static str,
        #[source]
        source: nftables::NftError,
    },
}

pub const TABLE: &str = "warren";

/// Runs `nft -f -` on `script` and waits; `what` names it in the error.
pub(crate) fn nft(what: &str, script: &str) -> Result<(), FirewallError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(FirewallError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A script is far below a pipe's capacity: this does not block.
        if let Err(e) = stdin.write_all(script.as_bytes()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(FirewallError::Spawn(e));
        }
    }
    let output = child.wait_with_output().map_err(FirewallError::Spawn)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(FirewallError::Nft {
            what: what.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// Version of [`ruleset`], written into both tables as a comment. A host whose tables carry another
/// version (or none: the first ruleset had no marker) gets them replaced by [`ensure_ruleset`]. Bump it
/// whenever the ruleset changes.
pub const RULESET_VERSION: u32 = 7;

/// The tables' comment: the version and a digest of what the ruleset took from the host
/// ([`HostNetworks`]), so a host whose resolvers or networks changed gets its tables rebuilt at the
/// next start.
fn version_marker(host: &HostNetworks, proxy: SocketAddrV4) -> String {
    let digest = sha2::Sha256::digest(format!("{host:?} {proxy}").as_bytes());
    format!(
        "comment \"warren ruleset {RULESET_VERSION} {}\"",
        hex::encode(&digest[..6])
    )
}

/// Destinations no sandbox reaches, internet access or not (the host's resolvers on port 53
/// excepted): "this" network, the private ranges (RFC 1918), carrier-grade NAT, loopback, link-local
/// (cloud metadata services such as 169.254.169.254 live there), IETF protocol assignments,
/// multicast and the reserved range; plus the networks the host itself is connected to.
pub const ALWAYS_DENIED: [&str; 10] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

/// What the ruleset takes from the host: the IPv4 resolvers sandboxes are pointed at (the host's
/// `/etc/resolv.conf`, which every sandbox gets a copy of) and the networks the host is connected
/// to, other than the sandbox bridge.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostNetworks {
    pub resolvers: Vec<Ipv4Addr>,
    pub connected: Vec<(Ipv4Addr, u8)>,
    /// Servers on other machines that open connections to this host's sandboxes (a `warren node`'s
    /// `--server-address`, docs/cluster.md); empty for a server on this machine. Given, not probed.
    pub servers: Vec<Ipv4Addr>,
}

impl HostNetworks {
    /// Reads `/etc/resolv.conf` and the kernel's IPv4 routes (`/proc/net/route`).
    pub fn probe(bridge: &str) -> HostNetworks {
        let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        HostNetworks::parse(&resolv, &routes, bridge)
    }

    fn parse(resolv: &str, routes: &str, bridge: &str) -> HostNetworks {
        let mut resolvers: Vec<Ipv4Addr> = resolv
            .lines()
            .filter_map(|line| line.trim().strip_prefix("nameserver"))
            .filter_map(|rest| rest.trim().parse::<Ipv4Addr>().ok())
            .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
            .collect();
        resolvers.dedup();
        // Iface, Destination, Gateway, Flags, RefCnt, Use, Metric, Mask (hex, little endian).
        let mut connected = Vec::new();
        for line in routes.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(iface), Some(dest), Some(mask)) =
                (fields.first(), fields.get(1), fields.get(7))
            else {
                continue;
            };
            let (Ok(dest), Ok(mask)) =
                (u32::from_str_radix(dest, 16), u32::from_str_radix(mask, 16))
            else {
                continue;
            };
            if *iface == bridge || dest == 0 || mask == 0 {
                continue;
            }
            let network = Ipv4Addr::from(u32::from_be(dest));
            let prefix = u32::from_be(mask).leading_ones() as u8;
            if !connected.contains(&(network, prefix)) {
                connected.push((network, prefix));
            }
        }
        HostNetworks {
            resolvers,
            connected,
            servers: Vec::new(),
        }
    }
}

/// The always-denied networks as [`Cidr`]s (the fixed ranges and the host's connected networks other
/// than `bridge`), for the egress proxy, which connects from the host and so is not filtered by the
/// forward chain.
pub fn always_denied(bridge: &str) -> Vec<Cidr> {
    let host = HostNetworks::probe(bridge);
    ALWAYS_DENIED
        .iter()
        .filter_map(|range| range.parse().ok())
        .chain(host.connected.iter().map(|(network, prefix)| Cidr {
            network: *network,
            prefix: *prefix,
        }))
        .collect()
}

/// `nft list table <family> warren`, or None when there is no such table.
fn list_table(family: &str) -> Option<String> {
    let output = Command::new("nft")
        .args(["list", "table", family, TABLE])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The host-wide ruleset for `bridge` and `subnet`, with the egress proxy at `proxy` (the
/// gateway's address). docs/network.md explains every rule.
pub fn ruleset(bridge: &str, subnet: &str, host: &HostNetworks, proxy: SocketAddrV4) -> String {
    let marker = version_marker(host, proxy);
    let proxy_port = proxy.port();
    let mut denied: Vec<String> = ALWAYS_DENIED.iter().map(|s| s.to_string()).collect();
    denied.extend(host.connected.iter().map(|(ip, p)| format!("{ip}/{p}")));
    let denied = denied.join(", ");
    let servers = if host.servers.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = host.servers.iter().map(Ipv4Addr::to_string).collect();
        format!(" elements = {{ {} }};", list.join(", "))
    };
    let resolvers = if host.resolvers.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = host
            .resolvers
            .iter()
            .flat_map(|ip| [format!("{ip} . udp . 53"), format!("{ip} . tcp . 53")])
            .collect();
        format!(" elements = {{ {} }};", list.join(", "))
    };
    format!(
        r#"table ip {TABLE} {{
    {marker}
    set internet {{ type ipv4_addr; }}
    set always_deny {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {denied} }}; }}
    set resolvers {{ type ipv4_addr . inet_proto . inet_service;{resolvers} }}
    set servers {{ type ipv4_addr;{servers} }}
    set egress_allow {{ type ipv4_addr . ipv4_addr; flags interval; }}
    set egress_deny {{ type ipv4_addr . ipv4_addr; flags interval; }}
    set names_allow {{ type ipv4_addr . ipv4_addr; flags interval; }}
    set names_deny {{ type ipv4_addr . ipv4_addr; flags interval; }}
    set names_headers {{ type ipv4_addr; }}
    set names_upstream {{ type ipv4_addr; }}
    chain egress {{
        ip saddr . ip daddr @egress_allow accept
        ip saddr . ip daddr @egress_deny drop
    }}
    chain names {{
        ip saddr @names_upstream ip daddr . meta l4proto . th dport @resolvers return
        ip saddr @names_upstream meta l4proto tcp dnat to {proxy}
        ip saddr @names_headers tcp dport {{ 80, 443 }} dnat to {proxy}
        ip saddr . ip daddr @names_allow return
        ip saddr . ip daddr @names_deny tcp dport {{ 80, 443 }} dnat to {proxy}
    }}
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "{bridge}" jump names
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{bridge}" oifname "{bridge}" drop
        iifname "{bridge}" ip daddr @servers ct direction reply accept
        iifname "{bridge}" ip saddr != @internet drop
        iifname "{bridge}" ip daddr . meta l4proto . th dport @resolvers accept
        iifname "{bridge}" ip daddr @always_deny drop
        iifname "{bridge}" jump egress
        iifname "{bridge}" ip saddr {subnet} accept
        iifname "{bridge}" drop
        oifname "{bridge}" ct state established,related accept
        oifname "{bridge}" ip saddr @servers ip daddr {subnet} ct state new accept
        oifname "{bridge}" drop
    }}
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "{bridge}" ct state established,related accept
        iifname "{bridge}" ct status dnat tcp dport {proxy_port} accept
        iifname "{bridge}" drop
    }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr @internet oifname != "{bridge}" masquerade
    }}
}}
table bridge {TABLE} {{
    {marker}
    set ports {{ type ifname . ether_addr . ipv4_addr; }}
    chain prerouting {{
        type filter hook prerouting priority filter; policy accept;
        iifname != "{PORT_PATTERN}" accept
        arp htype 1 arp ptype ip arp hlen 6 arp plen 4 iifname . ether saddr . arp saddr ip @ports iifname . arp saddr ether . arp saddr ip @ports accept
        iifname . ether saddr . ip saddr @ports accept
        drop
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{PORT_PATTERN}" oifname "{PORT_PATTERN}" drop
    }}
    chain output {{
        type filter hook output priority filter; policy accept;
        oifname != "{PORT_PATTERN}" accept
        ether type arp ether daddr ff:ff:ff:ff:ff:ff accept
        oifname . ether daddr . ip daddr @ports accept
        oifname . ether daddr . arp daddr ip @ports accept
        drop
    }}
}}
"#
    )
}

/// Names of the sandboxes' host-side veths (see [`super::NetworkPlan::host_veth`]).
const PORT_PATTERN: &str = "wv-*";

/// The element of set `ports` that binds sandbox port `plan.host_veth()` to the sandbox's MAC and
/// address.
pub fn port_element(plan: &NetworkPlan) -> String {
    let mac = plan
        .sandbox_mac()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    format!("\"{}\" . {mac} . {}", plan.host_veth(), plan.ip)
}

/// Installs the ruleset unless the current version is there already (it is shared by all sandboxes
/// of the host). Tables of another version are replaced in one nft transaction that carries over
/// what live sandboxes hold: the `internet` elements, and a port binding for every sandbox veth on
/// the host (its address follows from its name and `network`, see [`enrolled_ports`]), so that
/// upgrading Warren does not cut off the sandboxes it adopts. Their egress rules (allow/deny
/// intervals, names, headers) are not carried over, since another version may keep them otherwise:
/// returns true when the tables were replaced, and the caller gives each live sandbox its network
/// rules again ([`set_network`]).
pub fn ensure_ruleset(
    bridge: &str,
    gateway: Ipv4Addr,
    prefix: u8,
    proxy_port: u16,
    servers: &[Ipv4Addr],
) -> Result<bool, FirewallError> {
    let network = super::network_address(gateway, prefix);
    // Two runtimes starting at once must not both replace: the second would drop what the first's
    // sandboxes added in between. The lock is host-wide, like the tables.
    let lock = RulesetLock::take()?;
    let ip_table = list_table("ip");
    let bridge_table = list_table("bridge");
    let host = HostNetworks {
        servers: servers.to_vec(),
        ..HostNetworks::probe(bridge)
    };
    let proxy = SocketAddrV4::new(gateway, proxy_port);
    let marker = version_marker(&host, proxy);
    let current = |table: &Option<String>| table.as_ref().is_some_and(|t| t.contains(&marker));
    if current(&ip_table) && current(&bridge_table) {
        return Ok(false);
    }
    let mut script = format!(
        "add table ip {TABLE}\ndelete table ip {TABLE}\nadd table bridge {TABLE}\ndelete table bridge {TABLE}\n"
    );
    script.push_str(&ruleset(
        bridge,
        &format!("{network}/{prefix}"),
        &host,
        proxy,
    ));
    let granted = ip_table.as_deref().map(listed_internet).unwrap_or_default();
    if !granted.is_empty() {
        let list: Vec<String> = granted.iter().map(Ipv4Addr::to_string).collect();
        script.push_str(&format!(
            "add element ip {TABLE} internet {{ {} }}\n",
            list.join(", ")
        ));
    }
    // Tables of this same version under another host digest (the host's resolvers or networks
    // changed): the sets are the same, so the sandboxes' egress elements go over as they are and
    // no sandbox runs without its rules while the server starts. Another version's are not
    // carried: the runtime reports the replacement and the server installs them again.
    if ip_table.as_deref().and_then(listed_version) == Some(RULESET_VERSION) {
        for set in EGRESS_SETS {
            if let Some(elements) = ip_table.as_deref().and_then(|t| listed_elements(t, set)) {
                script.push_str(&format!("add element ip {TABLE} {set} {{ {elements} }}\n"));
            }
        }
    }
    let ports = enrolled_ports(host_port_names()?, bridge, network, prefix);
    if !ports.is_empty() {
        let list: Vec<String> = ports.iter().map(port_element).collect();
        script.push_str(&format!(
            "add element bridge {TABLE} ports {{ {} }}\n",
            list.join(", ")
        ));
    }
    let result = nft("install the sandbox ruleset", &script);
    drop(lock);
    result.map(|()| true)
}

/// flock on `/run/warren/firewall.lock`, released when the file closes on drop.
struct RulesetLock {
    _file: std::fs::File,
}

impl RulesetLock {
    fn take() -> Result<Self, FirewallError> {
        use std::os::fd::AsRawFd;
        let dir = std::path::Path::new("/run/warren");
        std::fs::create_dir_all(dir).map_err(FirewallError::Lock)?;
        let file = std::fs::File::create(dir.join("firewall.lock")).map_err(FirewallError::Lock)?;
        // SAFETY: flock on an fd we own; released when the file is closed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(FirewallError::Lock(std::io::Error::last_os_error()));
        }
        Ok(Self { _file: file })
    }
}

/// Addresses in set `internet` of a listed `ip warren` table.
fn listed_internet(table: &str) -> Vec<Ipv4Addr> {
    set_body(table, "internet")
        .unwrap_or_default()
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|word| word.parse().ok())
        .collect()
}

/// The sets of the `ip` table that hold sandboxes' egress rules (address and name rules), carried
/// over when tables of the same version are replaced.
const EGRESS_SETS: [&str; 6] = [
    "egress_allow",
    "egress_deny",
    "names_allow",
    "names_deny",
    "names_headers",
    "names_upstream",
];

/// The ruleset version in a listed table's marker comment (`warren ruleset N <digest>`).
fn listed_version(table: &str) -> Option<u32> {
    let rest = &table[table.find("warren ruleset ")? + "warren ruleset ".len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The elements of set `name` in a listed table, as nft prints them (which it also reads back), on
/// one line; None when the set is missing or empty.
fn listed_elements(table: &str, name: &str) -> Option<String> {
    let body = set_body(table, name)?;
    let start = body.find("elements = {")? + "elements = ".len();
    let elements = enclosed(&body[start..])?;
    let line = elements.split_whitespace().collect::<Vec<_>>().join(" ");
    (!line.is_empty()).then_some(line)
}

/// What is between the braces of `set <name> { ... }` in a listed table.
fn set_body<'a>(table: &'a str, name: &str) -> Option<&'a str> {
    let header = format!("set {name} {{");
    let start = table.find(&header)? + header.len() - 1;
    enclosed(&table[start..])
}

/// The text inside the brace `text` starts with, up to its matching closing brace.
fn enclosed(text: &str) -> Option<&str> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(&text[1..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// Names of the links in this network namespace that look like sandbox ports. Asked through
/// netlink, which answers for the caller's namespace (`/sys/class/net` shows the namespace sysfs was
/// mounted in), from a thread of its own (the caller may be inside a tokio runtime).
fn host_port_names() -> Result<Vec<String>, FirewallError> {
    std::thread::spawn(|| {
        super::netlink::run(async { super::netlink::Netlink::connect()?.link_names().await })
    })
    .join()
    .unwrap_or(Err(super::netlink::NetlinkError::Panicked))
    .map(|names| {
        names
            .into_iter()
            .filter(|name| name.starts_with("wv-"))
            .collect()
    })
    .map_err(FirewallError::Links)
}

/// The plans of the sandbox ports named `names`: `wv-X-Y` is the sandbox at the address of `network`
/// whose last two octets are X and Y (how [`super::veth_name`] names them). Names that do not parse or
/// whose address falls outside `network/prefix` are left out.
fn enrolled_ports(
    names: Vec<String>,
    bridge: &str,
    network: Ipv4Addr,
    prefix: u8,
) -> Vec<NetworkPlan> {
    names
        .into_iter()
        .filter_map(|name| {
            let mut parts = name.strip_prefix("wv-")?.split('-');
            let x: u8 = parts.next()?.parse().ok()?;
            let y: u8 = parts.next()?.parse().ok()?;
            if parts.next().is_some() {
                return None;
            }
            let [a, b, _, _] = network.octets();
            let ip = Ipv4Addr::new(a, b, x, y);
            (super::network_address(ip, prefix) == network).then(|| NetworkPlan {
                bridge: bridge.to_string(),
                gateway: network,
                prefix,
                ip,
            })
        })
        .collect()
}

/// The sets a sandbox's elements live in.
const PORTS: SetRef<'static> = SetRef {
    family: Family::Bridge,
    table: TABLE,
    set: "ports",
};
const fn ip_set(set: &'static str) -> SetRef<'static> {
    SetRef {
        family: Family::Ip,
        table: TABLE,
        set,
    }
}
const INTERNET: SetRef<'static> = ip_set("internet");
const NAMES_HEADERS: SetRef<'static> = ip_set("names_headers");
const NAMES_UPSTREAM: SetRef<'static> = ip_set("names_upstream");
const EGRESS_ALLOW: SetRef<'static> = ip_set("egress_allow");
const EGRESS_DENY: SetRef<'static> = ip_set("egress_deny");
const NAMES_ALLOW: SetRef<'static> = ip_set("names_allow");
const NAMES_DENY: SetRef<'static> = ip_set("names_deny");

/// Sets whose elements are a sandbox address alone.
const ADDRESS_SETS: [SetRef<'static>; 3] = [INTERNET, NAMES_HEADERS, NAMES_UPSTREAM];
/// Sets whose elements are (sandbox address . destination interval).
const INTERVAL_SETS: [SetRef<'static>; 4] = [EGRESS_ALLOW, EGRESS_DENY, NAMES_ALLOW, NAMES_DENY];

/// The key of the `ports` element of `plan`: the port's name (`IFNAMSIZ` bytes), the MAC (padded
/// to 8 bytes) and the address, each field of the concatenation padded to 4 bytes as the kernel
/// lays it out.
fn port_key(plan: &NetworkPlan) -> Element {
    let mut key = plan.host_veth().into_bytes();
    key.resize(16, 0);
    key.extend_from_slice(&plan.sandbox_mac());
    key.extend_from_slice(&[0, 0]);
    key.extend_from_slice(&plan.ip.octets());
    Element { key, key_end: None }
}

fn address_key(ip: Ipv4Addr) -> Element {
    Element {
        key: ip.octets().to_vec(),
        key_end: None,
    }
}

/// The element of an interval set that covers `cidr` for the sandbox at `ip`.
fn interval_key(ip: Ipv4Addr, cidr: &Cidr) -> Element {
    let mask = if cidr.prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(cidr.prefix.min(32)))
    };
    let first = u32::from(cidr.network) & mask;
    let last = first | !mask;
    let key = |address: u32| [ip.octets(), address.to_be_bytes()].concat();
    Element {
        key: key(first),
        key_end: Some(key(last)),
    }
}

/// The networks of `cidrs` that no other one contains (an interval set refuses overlapping
/// elements, and a contained network adds nothing to a list that only matches or not).
fn outermost(cidrs: &[Cidr]) -> Vec<Cidr> {
    let contains = |outer: &Cidr, inner: &Cidr| {
        outer.prefix <= inner.prefix
            && super::network_address(inner.network, outer.prefix)
                == super::network_address(outer.network, outer.prefix)
    };
    let mut kept: Vec<Cidr> = Vec::new();
    for cidr in cidrs {
        let cidr = Cidr {
            network: super::network_address(cidr.network, cidr.prefix.min(32)),
            prefix: cidr.prefix.min(32),
        };
        if kept.iter().any(|k| contains(k, &cidr)) {
            continue;
        }
        kept.retain(|k| !contains(&cidr, k));
        kept.push(cidr);
    }
    kept
}

/// The element a sandbox should hold in a set, with how it reads in nft's syntax (for errors).
struct Wanted {
    set: SetRef<'static>,
    element: Element,
    label: String,
}

/// Everything the sandbox at `ip` with `spec` holds in the `ip warren` sets: the internet grant,
/// its address rules, and how its web traffic reaches the egress proxy (one of: everything TCP
/// through its own SOCKS5 proxy, all web traffic for header rules, or web traffic its address rules
/// deny when it has host names).
fn wanted_elements(ip: Ipv4Addr, spec: &NetworkSpec) -> Vec<Wanted> {
    let mut wanted = Vec::new();
    let address = |set| Wanted {
        set,
        element: address_key(ip),
        label: ip.to_string(),
    };
    let intervals = |set, cidrs: &[Cidr]| -> Vec<Wanted> {
        outermost(cidrs)
            .iter()
            .map(|cidr| Wanted {
                set,
                element: interval_key(ip, cidr),
                label: format!("{ip} . {cidr}"),
            })
            .collect()
    };
    if spec.allow_internet {
        wanted.push(address(INTERNET));
    }
    let rules = &spec.egress;
    wanted.extend(intervals(EGRESS_ALLOW, &rules.allow));
    wanted.extend(intervals(EGRESS_DENY, &rules.deny));
    if rules.upstream.is_some() {
        // The proxy applies the address and name rules itself and tunnels what they allow.
        wanted.push(address(NAMES_UPSTREAM));
    } else if !rules.header_rules.is_empty() {
        // Requests to hosts with header rules must reach the proxy wherever the guest sends them.
        wanted.push(address(NAMES_HEADERS));
    } else if !rules.allow_hosts.is_empty() && !rules.deny.is_empty() {
        // Without anything denied every name is allowed anyway.
        wanted.extend(intervals(NAMES_ALLOW, &rules.allow));
        wanted.extend(intervals(NAMES_DENY, &rules.deny));
    }
    wanted
}

fn netfilter(what: &'static str) -> impl FnOnce(nftables::NftError) -> FirewallError {
    move |source| FirewallError::Netfilter { what, source }
}

/// Adds to `batch` what makes the sandbox at `ip` hold exactly `wanted` in the `ip warren` sets,
/// whatever it (or an earlier holder of the address that was never torn down) held before: address
/// elements are added, or added then deleted (which works whether or not they were there); interval
/// elements are listed, and those of `ip` that are not wanted deleted, the missing ones added.
fn replace_elements(
    batch: &mut Batch,
    ip: Ipv4Addr,
    wanted: &[Wanted],
) -> Result<(), FirewallError> {
    for set in ADDRESS_SETS {
        batch.add(set, address_key(ip), ip.to_string());
        if !wanted.iter().any(|w| w.set == set) {
            batch.delete(set, address_key(ip), ip.to_string());
        }
    }
    let mine = ip.octets();
    for set in INTERVAL_SETS {
        let held: Vec<Element> = nftables::list(set)
            .map_err(netfilter("list the sandbox's egress rules"))?
            .into_iter()
            .filter(|element| element.key.starts_with(&mine))
            .collect();
        for element in &held {
            if !wanted.iter().any(|w| w.set == set && &w.element == element) {
                batch.delete(set, element.clone(), describe_interval(element));
            }
        }
        for w in wanted.iter().filter(|w| w.set == set) {
            if !held.contains(&w.element) {
                batch.add(set, w.element.clone(), w.label.clone());
            }
        }
    }
    Ok(())
}

/// `a.b.c.d . first-last` for an element of an interval set, as listed.
fn describe_interval(element: &Element) -> String {
    let address = |bytes: &[u8]| -> String {
        match <[u8; 4]>::try_from(bytes) {
            Ok(octets) => Ipv4Addr::from(octets).to_string(),
            Err(_) => hex::encode(bytes),
        }
    };
    let key = &element.key;
    let end = element.key_end.as_deref().unwrap_or(key);
    if key.len() != 8 || end.len() != 8 {
        return hex::encode(key);
    }
    format!(
        "{} . {}-{}",
        address(&key[..4]),
        address(&key[4..]),
        address(&end[4..])
    )
}

/// Binds the sandbox's port to its MAC and address and gives it what `spec` allows (the internet,
/// its egress rules, its way to the egress proxy), taking away whatever else an earlier holder of
/// the address left, in one transaction. It must be done before the sandbox is handed out, and
/// before a restored sandbox's link comes up: until then the bridge drops everything from the port.
pub fn admit(plan: &NetworkPlan, spec: &NetworkSpec) -> Result<(), FirewallError> {
    if spec.allow_internet {
        enable_forwarding()?;
    }
    let mut batch = Batch::new();
    batch.add(PORTS, port_key(plan), port_element(plan));
    replace_elements(&mut batch, plan.ip, &wanted_elements(plan.ip, spec))?;
    batch
        .commit()
        .map_err(netfilter("admit the sandbox's port"))
}

fn enable_forwarding() -> Result<(), FirewallError> {
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(FirewallError::Forwarding)
}

/// The addresses of set `ports` elements whose port is not one of `links`.
fn stale_port_addresses(elements: &[Element], links: &[String]) -> Vec<Ipv4Addr> {
    elements
        .iter()
        .filter_map(|element| {
            let key = &element.key;
            if key.len() != 28 {
                return None;
            }
            let name_len = key[..16].iter().position(|b| *b == 0).unwrap_or(16);
            let port = String::from_utf8_lossy(&key[..name_len]);
            let ip = Ipv4Addr::new(key[24], key[25], key[26], key[27]);
            (!links.iter().any(|link| *link == port)).then_some(ip)
        })
        .collect()
}

/// Removes from the shared tables what sandboxes whose port (veth) no longer exists left there: the
/// port binding, the internet grant and the egress rules of their addresses (a state directory
/// deleted by hand never withdrew them). A live sandbox always has its port, so nothing of it is
/// touched. Returns the addresses cleaned.
///
/// `settle`: first wait (at most that long) until the set of sandbox ports has stopped changing for a
/// second — the veths of sandboxes just killed go only once the kernel has torn their network
/// namespaces down.
pub fn remove_stale_ports(settle: std::time::Duration) -> Result<Vec<Ipv4Addr>, FirewallError> {
    let deadline = std::time::Instant::now() + settle;
    let mut links = host_port_names()?;
    let mut still_since = std::time::Instant::now();
    while std::time::Instant::now() < deadline
        && still_since.elapsed() < std::time::Duration::from_secs(1)
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = host_port_names()?;
        if now != links {
            links = now;
            still_since = std::time::Instant::now();
        }
    }
    let _lock = RulesetLock::take()?;
    let Ok(ports) = nftables::list(PORTS) else {
        // No table (no server ever ran here): nothing to clean.
        return Ok(Vec::new());
    };
    let stale = stale_port_addresses(&ports, &host_port_names()?);
    for ip in &stale {
        let plan = NetworkPlan {
            bridge: String::new(),
            gateway: Ipv4Addr::UNSPECIFIED,
            prefix: 32,
            ip: *ip,
        };
        withdraw(&plan)?;
    }
    Ok(stale)
}

/// Removes everything [`admit`] added for `plan`, in one transaction. Done before the address is
/// released: a later holder's binding must not be the one it deletes.
pub fn withdraw(plan: &NetworkPlan) -> Result<(), FirewallError> {
    let mut batch = Batch::new();
    // Add-then-delete succeeds whether or not the element is there.
    batch.add(PORTS, port_key(plan), port_element(plan));
    batch.delete(PORTS, port_key(plan), port_element(plan));
    replace_elements(&mut batch, plan.ip, &[])?;
    batch
        .commit()
        .map_err(netfilter("withdraw the sandbox's port"))
}

/// Replaces the internet access and egress rules of the sandbox at `ip` in one transaction (a
/// running sandbox's `update_network`): the old rules hold until the new ones do.
pub fn set_network(ip: Ipv4Addr, spec: &NetworkSpec) -> Result<(), FirewallError> {
    if spec.allow_internet {
        enable_forwarding()?;
    }
    let mut batch = Batch::new();
    replace_elements(&mut batch, ip, &wanted_elements(ip, spec))?;
    batch
        .commit()
        .map_err(netfilter("replace the sandbox's egress rules"))
}

/// Whether `ip` is currently allowed out.
pub fn internet_allowed(ip: Ipv4Addr) -> bool {
    nftables::list(INTERNET).is_ok_and(|elements| elements.contains(&address_key(ip)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::egress::EgressRules;

    #[test]
    fn ports_whose_link_is_gone_are_stale() {
        let elements = vec![
            port_key(&plan(Ipv4Addr::new(10, 77, 0, 2))),
            port_key(&plan(Ipv4Addr::new(10, 77, 0, 3))),
            Element {
                key: vec![1, 2, 3],
                key_end: None,
            },
        ];
        let links = vec!["wv-0-3".to_string()];
        assert_eq!(
            stale_port_addresses(&elements, &links),
            vec![Ipv4Addr::new(10, 77, 0, 2)]
        );
        assert!(stale_port_addresses(&[], &[]).is_empty());
    }

    fn plan(ip: Ipv4Addr) -> NetworkPlan {
        NetworkPlan {
            bridge: "warren0".into(),
            gateway: Ipv4Addr::new(10, 77, 0, 1),
            prefix: 16,
            ip,
        }
    }

    #[test]
    fn servers_elsewhere_reach_the_sandboxes_and_get_their_replies_only() {
        let proxy = SocketAddrV4::new(Ipv4Addr::new(10, 81, 0, 1), 49090);
        let alone = ruleset("warren0", "10.81.0.0/16", &HostNetworks::default(), proxy);
        assert!(alone.contains("set servers { type ipv4_addr; }"), "{alone}");
        let host = HostNetworks {
            servers: vec![Ipv4Addr::new(198, 18, 10, 1)],
            ..HostNetworks::default()
        };
        assert_ne!(
            version_marker(&host, proxy),
            version_marker(&HostNetworks::default(), proxy)
        );
        let rules = ruleset("warren0", "10.81.0.0/16", &host, proxy);
        assert!(rules.contains("elements = { 198.18.10.1 };"), "{rules}");
        let position = |rule: &str| {
            rules
                .find(rule)
                .unwrap_or_else(|| panic!("{rule}: {rules}"))
        };
        // Replies to a server's connections leave before the internet and always-deny drops...
        let replies = position("iifname \"warren0\" ip daddr @servers ct direction reply accept");
        assert!(replies < position("iifname \"warren0\" ip saddr != @internet drop"));
        assert!(replies < position("ip daddr @always_deny drop"));
        // ...and a server's new connections enter the sandbox subnet before the final drop.
        let incoming = position(
            "oifname \"warren0\" ip saddr @servers ip daddr 10.81.0.0/16 ct state new accept",
        );
        let last_drop = rules.rfind("oifname \"warren0\" drop").expect("final drop");
        assert!(incoming < last_drop, "{rules}");
    }

    #[test]
    fn ruleset_is_versioned_and_binds_ports() {
        let host = HostNetworks {
            resolvers: vec![Ipv4Addr::new(10, 255, 255, 53)],
            connected: vec![(Ipv4Addr::new(192, 0, 2, 0), 24)],
            servers: Vec::new(),
        };
        let proxy = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 49090);
        let rules = ruleset("warren0", "10.77.0.0/16", &host, proxy);
        assert_eq!(rules.matches(&version_marker(&host, proxy)).count(), 2);
        assert_ne!(
            version_marker(&host, proxy),
            version_marker(&HostNetworks::default(), proxy)
        );
        let other = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 49091);
        assert_ne!(version_marker(&host, proxy), version_marker(&host, other));
        // Only connections nftables redirected reach the proxy.
        assert!(rules.contains("ct status dnat tcp dport 49090 accept"));
        assert!(rules.contains("iifname \"warren0\" jump names"));
        // Allow wins over deny, for addresses and for names.
        let allow = rules.find("@egress_allow accept").expect("allow rule");
        let deny = rules.find("@egress_deny drop").expect("deny rule");
        assert!(allow < deny, "{rules}");
        let names_allow = rules.find("@names_allow return").expect("names allow");
        let names_deny = rules
            .find("@names_deny tcp dport { 80, 443 } dnat to 10.77.0.1:49090")
            .expect("names deny");
        assert!(names_allow < names_deny, "{rules}");
        // Link-local (metadata), private ranges and the host's own network are dropped for every
        // sandbox, before the internet accept; the host's resolver stays reachable on port 53 only.
        let deny = rules
            .find("ip daddr @always_deny drop")
            .expect("always-deny rule");
        let dns = rules
            .find("th dport @resolvers accept")
            .expect("resolver rule");
        let accept = rules
            .find("ip saddr 10.77.0.0/16 accept")
            .expect("internet accept");
        assert!(dns < deny && deny < accept, "{rules}");
        for range in [
            "169.254.0.0/16",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "192.0.2.0/24",
        ] {
            assert!(rules.contains(range), "{range} not denied: {rules}");
        }
        assert!(rules.contains("10.255.255.53 . udp . 53, 10.255.255.53 . tcp . 53"));
        assert!(rules.contains("iifname \"warren0\" jump egress"));
        assert!(rules.contains("masquerade"));
        assert!(rules.contains("iifname . ether saddr . ip saddr @ports accept"));
        assert!(rules.contains("oifname . ether daddr . ip daddr @ports accept"));
    }

    fn sets_of(ip: Ipv4Addr, egress: EgressRules, internet: bool) -> Vec<(&'static str, String)> {
        let spec = NetworkSpec {
            allow_internet: internet,
            raw_sockets: false,
            egress,
        };
        wanted_elements(ip, &spec)
            .into_iter()
            .map(|w| (w.set.set, w.label))
            .collect()
    }

    #[test]
    fn names_are_proxied_only_where_addresses_would_be_denied() {
        use crate::network::egress::{Cidr, HostPattern};
        let ip = Ipv4Addr::new(10, 77, 1, 2);
        let everything: Cidr = "0.0.0.0/0".parse().unwrap();
        let rules = EgressRules {
            allow: vec!["198.51.100.0/24".parse().unwrap()],
            allow_hosts: vec![HostPattern::Exact("api.example.com".into())],
            deny: vec![everything],
            header_rules: vec![],
            upstream: None,
        };
        let pairs = |list: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
            list.iter().map(|(s, l)| (*s, l.to_string())).collect()
        };
        assert_eq!(
            sets_of(ip, rules.clone(), true),
            pairs(&[
                ("internet", "10.77.1.2"),
                ("egress_allow", "10.77.1.2 . 198.51.100.0/24"),
                ("egress_deny", "10.77.1.2 . 0.0.0.0/0"),
                ("names_allow", "10.77.1.2 . 198.51.100.0/24"),
                ("names_deny", "10.77.1.2 . 0.0.0.0/0"),
            ])
        );
        // Names with nothing denied, or no names: nothing goes to the proxy.
        for rules in [
            EgressRules {
                deny: vec![],
                ..rules.clone()
            },
            EgressRules {
                allow_hosts: vec![],
                ..rules.clone()
            },
        ] {
            let sets = sets_of(ip, rules, false);
            assert!(
                sets.iter().all(|(set, _)| !set.starts_with("names")),
                "{sets:?}"
            );
        }
        // Header rules send all web traffic to the proxy, which applies the address rules itself.
        let with_headers = EgressRules {
            header_rules: vec![crate::network::egress::HeaderRule {
                pattern: HostPattern::Exact("api.example.com".into()),
                headers: vec![("Authorization".into(), "Bearer x".into())],
            }],
            ..EgressRules::default()
        };
        assert_eq!(
            sets_of(ip, with_headers, false),
            pairs(&[("names_headers", "10.77.1.2")])
        );
        // A SOCKS5 proxy of the sandbox's own: all TCP goes to the proxy whatever the names say.
        let tunneled = EgressRules {
            upstream: Some(crate::network::egress::UpstreamProxy {
                host: "proxy.example.com".into(),
                port: 1080,
                username: None,
                password: None,
                tls: None,
            }),
            ..rules.clone()
        };
        let sets = sets_of(ip, tunneled, false);
        assert!(sets.contains(&("names_upstream", "10.77.1.2".to_string())));
        assert!(
            !sets.iter().any(|(set, _)| set.starts_with("names_a")
                || set.starts_with("names_d")
                || *set == "names_headers"),
            "{sets:?}"
        );
        assert!(sets.contains(&("egress_deny", "10.77.1.2 . 0.0.0.0/0".to_string())));
    }

    #[test]
    fn an_interval_covers_the_network_from_its_first_to_its_last_address() {
        let ip = Ipv4Addr::new(10, 77, 1, 2);
        let element = interval_key(ip, &"198.51.100.0/24".parse().unwrap());
        assert_eq!(element.key, vec![10, 77, 1, 2, 198, 51, 100, 0]);
        assert_eq!(element.key_end, Some(vec![10, 77, 1, 2, 198, 51, 100, 255]));
        let all = interval_key(ip, &"0.0.0.0/0".parse().unwrap());
        assert_eq!(all.key_end, Some(vec![10, 77, 1, 2, 255, 255, 255, 255]));
        let one = interval_key(ip, &"192.0.2.7".parse().unwrap());
        assert_eq!(one.key[4..], one.key_end.as_ref().unwrap()[4..]);
        assert_eq!(
            describe_interval(&element),
            "10.77.1.2 . 198.51.100.0-198.51.100.255"
        );
    }

    #[test]
    fn networks_inside_others_of_the_same_list_are_left_out() {
        let cidrs: Vec<Cidr> = [
            "10.1.0.0/16",
            "10.0.0.0/8",
            "192.0.2.0/24",
            "10.0.0.0/8",
            "192.0.2.9",
        ]
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
        let kept: Vec<String> = outermost(&cidrs).iter().map(|c| c.to_string()).collect();
        assert_eq!(kept, vec!["10.0.0.0/8", "192.0.2.0/24"]);
    }

    #[test]
    fn host_resolvers_and_networks_are_read_from_resolv_conf_and_routes() {
        let resolv = "# generated\nnameserver 10.255.255.53\nnameserver 127.0.0.53\nnameserver ::1\nsearch x\n";
        let routes =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                      eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                      warren0\t00004D0A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
                      eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let host = HostNetworks::parse(resolv, routes, "warren0");
        assert_eq!(host.resolvers, vec![Ipv4Addr::new(10, 255, 255, 53)]);
        assert_eq!(host.connected, vec![(Ipv4Addr::new(192, 0, 2, 0), 24)]);
    }

    #[test]
    fn a_port_is_bound_to_the_mac_and_address_its_name_comes_from() {
        assert_eq!(
            port_element(&plan(Ipv4Addr::new(10, 77, 1, 200))),
            "\"wv-1-200\" . 02:77:0a:4d:01:c8 . 10.77.1.200"
        );
    }

    #[test]
    fn internet_elements_are_read_from_a_listing() {
        let listing = "table ip warren {\n\tset internet {\n\t\ttype ipv4_addr\n\t\telements = { 10.77.0.5, 10.77.1.9 }\n\t}\n\n\tchain forward {\n\t\tiifname \"warren0\" ip saddr 10.77.0.0/16 accept\n\t}\n}\n";
        assert_eq!(
            listed_internet(listing),
            vec![Ipv4Addr::new(10, 77, 0, 5), Ipv4Addr::new(10, 77, 1, 9)]
        );
        assert!(
            listed_internet("table ip warren {\n\tset internet {\n\t\ttype ipv4_addr\n\t}\n}")
                .is_empty()
        );
    }

    #[test]
    fn egress_elements_and_the_version_are_read_from_a_listing() {
        let listing = "table ip warren {\n\tcomment \"warren ruleset 6 0a1b2c3d4e5f\"\n\tset egress_deny {\n\t\ttype ipv4_addr . ipv4_addr\n\t\tflags interval\n\t\telements = { 10.77.0.5 . 198.18.0.0/15,\n\t\t\t     10.77.0.6 . 198.18.0.7 }\n\t}\n\tset egress_allow {\n\t\ttype ipv4_addr . ipv4_addr\n\t\tflags interval\n\t}\n}\n";
        assert_eq!(listed_version(listing), Some(6));
        assert_eq!(
            listed_elements(listing, "egress_deny").as_deref(),
            Some("10.77.0.5 . 198.18.0.0/15, 10.77.0.6 . 198.18.0.7")
        );
        assert_eq!(listed_elements(listing, "egress_allow"), None);
        assert_eq!(listed_elements(listing, "names_deny"), None);
        assert_eq!(listed_version("table ip warren {\n}"), None);
    }

    #[test]
    fn existing_ports_are_enrolled_from_their_names() {
        let names = [
            "wv-0-5", "wv-3-250", "wv-x-1", "wv-1-2-3", "wv-1-300", "eth0",
        ]
        .map(String::from)
        .to_vec();
        let ips: Vec<Ipv4Addr> = enrolled_ports(names, "warren0", Ipv4Addr::new(10, 77, 0, 0), 16)
            .into_iter()
            .map(|p| p.ip)
            .collect();
        assert_eq!(
            ips,
            vec![Ipv4Addr::new(10, 77, 0, 5), Ipv4Addr::new(10, 77, 3, 250)]
        );
        let narrow = enrolled_ports(
            vec!["wv-0-5".into(), "wv-9-9".into()],
            "warren0",
            Ipv4Addr::new(10, 77, 0, 0),
            24,
        );
        assert_eq!(narrow.len(), 1, "wv-9-9 is outside 10.77.0.0/24");
    }
}
