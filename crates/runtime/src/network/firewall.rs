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
//! - chain `egress` is jumped to for every forwarded sandbox packet before it is accepted: the hook where
//!   per-sandbox egress allow/deny rules go (map `egress_rules`, a chain `eg-X-Y` per sandbox);
//! - chain `prerouting` (nat) sends a sandbox with host-name rules through its chain `en-X-Y` (map
//!   `egress_names`), which redirects its TCP connections to ports 80 and 443 that its address rules
//!   would deny to the egress proxy on the gateway ([`super::egress_proxy`]); only such redirected
//!   connections may reach the proxy's port.
//!
//! Rules are loaded with `nft -f -` (nftables has no stable netlink crate). The tables are installed
//! once per host and carry a version ([`RULESET_VERSION`]); per sandbox there is one nft run at create
//! ([`admit`], concurrent with the supervisor) and one at destroy ([`withdraw`]).

use std::io::Write;

use sha2::Digest;

use super::egress::{Cidr, EgressRules};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, Stdio};

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
}

pub const TABLE: &str = "warren";

/// Runs `nft -f -` on `script` and waits; `what` names it in the error.
pub(crate) fn nft(what: &str, script: &str) -> Result<(), FirewallError> {
    PendingNft::start(what, script)?.wait()
}

/// An `nft -f -` run that has been started and fed its script but not waited for, so the caller can
/// do other work while it runs (one process start is ~3 ms on some hosts). Dropping it waits.
pub struct PendingNft {
    what: String,
    child: Option<std::process::Child>,
}

impl PendingNft {
    fn start(what: &str, script: &str) -> Result<Self, FirewallError> {
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(FirewallError::Spawn)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A script is a few lines, far below a pipe's capacity: this does not block.
            if let Err(e) = stdin.write_all(script.as_bytes()) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(FirewallError::Spawn(e));
            }
        }
        Ok(Self {
            what: what.to_string(),
            child: Some(child),
        })
    }

    /// Waits for nft; its error output names what failed.
    pub fn wait(mut self) -> Result<(), FirewallError> {
        let Some(child) = self.child.take() else {
            return Ok(());
        };
        let output = child.wait_with_output().map_err(FirewallError::Spawn)?;
        if output.status.success() {
            Ok(())
        } else {
            Err(FirewallError::Nft {
                what: std::mem::take(&mut self.what),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            })
        }
    }
}

impl Drop for PendingNft {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

/// Version of [`ruleset`], written into both tables as a comment. A host whose tables carry another
/// version (or none: the first ruleset had no marker) gets them replaced by [`ensure_ruleset`]. Bump it
/// whenever the ruleset changes.
pub const RULESET_VERSION: u32 = 5;

/// The tables' comment: the version and a digest of what the ruleset took from the host
/// ([`HostNetworks`]), so a host whose resolvers or networks changed gets its tables rebuilt at the
/// next start.
fn version_marker(host: &HostNetworks, proxy_port: u16) -> String {
    let digest = sha2::Sha256::digest(format!("{host:?} {proxy_port}").as_bytes());
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

/// The host-wide ruleset for `bridge` and `subnet`, with the egress proxy on `proxy_port` of the
/// gateway. docs/network.md explains every rule.
pub fn ruleset(bridge: &str, subnet: &str, host: &HostNetworks, proxy_port: u16) -> String {
    let marker = version_marker(host, proxy_port);
    let mut denied: Vec<String> = ALWAYS_DENIED.iter().map(|s| s.to_string()).collect();
    denied.extend(host.connected.iter().map(|(ip, p)| format!("{ip}/{p}")));
    let denied = denied.join(", ");
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
    map egress_rules {{ type ipv4_addr : verdict; }}
    map egress_names {{ type ipv4_addr : verdict; }}
    chain egress {{
        ip saddr vmap @egress_rules
    }}
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "{bridge}" ip saddr vmap @egress_names
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{bridge}" oifname "{bridge}" drop
        iifname "{bridge}" ip saddr != @internet drop
        iifname "{bridge}" ip daddr . meta l4proto . th dport @resolvers accept
        iifname "{bridge}" ip daddr @always_deny drop
        iifname "{bridge}" jump egress
        iifname "{bridge}" ip saddr {subnet} accept
        iifname "{bridge}" drop
        oifname "{bridge}" ct state established,related accept
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
/// upgrading Warren does not cut off the sandboxes it adopts.
pub fn ensure_ruleset(
    bridge: &str,
    gateway: Ipv4Addr,
    prefix: u8,
    proxy_port: u16,
) -> Result<(), FirewallError> {
    let network = super::network_address(gateway, prefix);
    // Two runtimes starting at once must not both replace: the second would drop what the first's
    // sandboxes added in between. The lock is host-wide, like the tables.
    let lock = RulesetLock::take()?;
    let ip_table = list_table("ip");
    let bridge_table = list_table("bridge");
    let host = HostNetworks::probe(bridge);
    let marker = version_marker(&host, proxy_port);
    let current = |table: &Option<String>| table.as_ref().is_some_and(|t| t.contains(&marker));
    if current(&ip_table) && current(&bridge_table) {
        return Ok(());
    }
    let mut script = format!(
        "add table ip {TABLE}\ndelete table ip {TABLE}\nadd table bridge {TABLE}\ndelete table bridge {TABLE}\n"
    );
    script.push_str(&ruleset(
        bridge,
        &format!("{network}/{prefix}"),
        &host,
        proxy_port,
    ));
    let granted = ip_table.as_deref().map(listed_internet).unwrap_or_default();
    if !granted.is_empty() {
        let list: Vec<String> = granted.iter().map(Ipv4Addr::to_string).collect();
        script.push_str(&format!(
            "add element ip {TABLE} internet {{ {} }}\n",
            list.join(", ")
        ));
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
    result
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
    let Some(start) = table.find("set internet {") else {
        return Vec::new();
    };
    let body = &table[start + "set internet ".len()..];
    let mut depth = 0usize;
    let mut end = body.len();
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            _ => {}
        }
    }
    body[..end]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|word| word.parse().ok())
        .collect()
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

/// Starts the nft run that binds the sandbox's port to its MAC and address and grants it the
/// internet if `spec` allows it (withholding it otherwise), in one transaction. It must be waited
/// for before the sandbox is handed out, and before a restored sandbox's link comes up: until it
/// is done the bridge drops everything from the port.
///
/// A sandbox without internet also gets its address taken out of the set: an element left behind by
/// an earlier holder of the address that was never torn down (a crash, a hand-removed state dir)
/// must not grant it. Adding then deleting in one nft transaction succeeds whether or not the
/// element was there.
pub fn admit(
    plan: &NetworkPlan,
    spec: &NetworkSpec,
    proxy: SocketAddrV4,
) -> Result<PendingNft, FirewallError> {
    let ip = plan.ip;
    let mut script = format!(
        "add element bridge {TABLE} ports {{ {} }}\n",
        port_element(plan)
    );
    script.push_str(&egress_script(ip, &spec.egress));
    script.push_str(&egress_names_script(ip, &spec.egress, proxy));
    script.push_str(&internet_script(ip, spec.allow_internet)?);
    PendingNft::start("admit the sandbox's port", &script)
}

/// The addresses of set `ports` elements (in `nft -j list set bridge warren ports` output) whose
/// port is not one of `links`.
fn stale_port_addresses(listing: &str, links: &[String]) -> Vec<Ipv4Addr> {
    let Ok(json) = serde_json::from_str::<serde_json::Value>(listing) else {
        return Vec::new();
    };
    let sets = json["nftables"].as_array().cloned().unwrap_or_default();
    sets.iter()
        .filter_map(|item| item["set"]["elem"].as_array().cloned())
        .flatten()
        .filter_map(|element| {
            let parts = element["concat"].as_array()?;
            let port = parts.first()?.as_str()?;
            let ip: Ipv4Addr = parts.get(2)?.as_str()?.parse().ok()?;
            (!links.iter().any(|link| link == port)).then_some(ip)
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
    let output = Command::new("nft")
        .args(["-j", "list", "set", "bridge", TABLE, "ports"])
        .stderr(Stdio::null())
        .output();
    let listing = match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        // No table (no server ever ran here): nothing to clean.
        _ => return Ok(Vec::new()),
    };
    let stale = stale_port_addresses(&listing, &host_port_names()?);
    for ip in &stale {
        let plan = NetworkPlan {
            bridge: String::new(),
            gateway: Ipv4Addr::UNSPECIFIED,
            prefix: 32,
            ip: *ip,
        };
        withdraw(&plan)?.wait()?;
    }
    Ok(stale)
}

/// Starts the nft run that removes everything [`admit`] added for `plan`. Wait for it before the
/// address is released: a later holder's binding must not be the one it deletes.
pub fn withdraw(plan: &NetworkPlan) -> Result<PendingNft, FirewallError> {
    let ip = plan.ip;
    let port = port_element(plan);
    // Add-then-delete succeeds whether or not each element is there.
    let mut script = format!(
        "add element bridge {TABLE} ports {{ {port} }}\ndelete element bridge {TABLE} ports {{ {port} }}\n\
         add element ip {TABLE} internet {{ {ip} }}\ndelete element ip {TABLE} internet {{ {ip} }}\n"
    );
    script.push_str(&egress_script(ip, &EgressRules::default()));
    script.push_str(&egress_names_script(
        ip,
        &EgressRules::default(),
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
    ));
    PendingNft::start("withdraw the sandbox's port", &script)
}

/// Replaces the internet access and egress rules of the sandbox at `ip` in one nft transaction (a
/// running sandbox's `update_network`): the old rules hold until the new ones do.
pub fn set_network(
    ip: Ipv4Addr,
    spec: &NetworkSpec,
    proxy: SocketAddrV4,
) -> Result<(), FirewallError> {
    let mut script = internet_script(ip, spec.allow_internet)?;
    script.push_str(&egress_script(ip, &spec.egress));
    script.push_str(&egress_names_script(ip, &spec.egress, proxy));
    nft("replace the sandbox's egress rules", &script)
}

/// Adds `ip` to set `internet`, or takes it out (add, then delete: either works whatever was there).
fn internet_script(ip: Ipv4Addr, allow: bool) -> Result<String, FirewallError> {
    if allow {
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(FirewallError::Forwarding)?;
        Ok(format!("add element ip {TABLE} internet {{ {ip} }}\n"))
    } else {
        Ok(format!(
            "add element ip {TABLE} internet {{ {ip} }}\ndelete element ip {TABLE} internet {{ {ip} }}\n"
        ))
    }
}

/// The sandbox's own chain `eg-X-Y`, jumped to from chain `egress` through map `egress_rules` by
/// source address: an `accept` per allowed network first (allow wins), then a `drop` per denied one.
/// Empty rules remove the chain and its map element; adding before deleting makes either script
/// succeed whatever was there before.
fn egress_script(ip: Ipv4Addr, rules: &EgressRules) -> String {
    let chain = super::veth_name("eg", ip);
    let element = format!("{{ {ip} : jump {chain} }}");
    let mut script = format!("add chain ip {TABLE} {chain}\nflush chain ip {TABLE} {chain}\n");
    if rules.is_empty() {
        script.push_str(&format!(
            "add element ip {TABLE} egress_rules {element}\ndelete element ip {TABLE} egress_rules {element}\n\
             delete chain ip {TABLE} {chain}\n"
        ));
        return script;
    }
    for cidr in &rules.allow {
        script.push_str(&format!(
            "add rule ip {TABLE} {chain} ip daddr {cidr} accept\n"
        ));
    }
    for cidr in &rules.deny {
        script.push_str(&format!(
            "add rule ip {TABLE} {chain} ip daddr {cidr} drop\n"
        ));
    }
    script.push_str(&format!("add element ip {TABLE} egress_rules {element}\n"));
    script
}

/// The sandbox's nat chain `en-X-Y`, entered from chain `prerouting` through map `egress_names`:
/// connections to allowed networks pass untouched (`return`), and TCP connections to ports 80 and 443
/// of a denied network go to the egress proxy at `proxy`, which lets through only the allowed host
/// names. With header rules, all TCP to ports 80 and 443 goes to the proxy; with a SOCKS5 proxy of
/// the sandbox's own, all TCP. Without host names, or without anything denied (then every name is allowed anyway), the
/// chain and its map element are removed.
pub(crate) fn egress_names_script(
    ip: Ipv4Addr,
    rules: &EgressRules,
    proxy: SocketAddrV4,
) -> String {
    let chain = super::veth_name("en", ip);
    let element = format!("{{ {ip} : jump {chain} }}");
    let mut script = format!("add chain ip {TABLE} {chain}\nflush chain ip {TABLE} {chain}\n");
    if rules.upstream.is_some() {
        // Every TCP connection goes through the proxy, which applies the address and name rules
        // itself and tunnels what they allow through the sandbox's SOCKS5 proxy. DNS to the host's
        // resolvers stays as it is (UDP is never tunneled; TCP 53 follows it).
        script.push_str(&format!(
            "add rule ip {TABLE} {chain} ip daddr . meta l4proto . th dport @resolvers return\n\
             add rule ip {TABLE} {chain} meta l4proto tcp dnat to {proxy}\n\
             add element ip {TABLE} egress_names {element}\n"
        ));
        return script;
    }
    if !rules.header_rules.is_empty() {
        // Requests to hosts with header rules must reach the proxy wherever the guest sends them
        // (it cannot know their addresses); the proxy applies the address rules itself.
        script.push_str(&format!(
            "add rule ip {TABLE} {chain} tcp dport {{ 80, 443 }} dnat to {proxy}\n\
             add element ip {TABLE} egress_names {element}\n"
        ));
        return script;
    }
    if rules.allow_hosts.is_empty() || rules.deny.is_empty() {
        script.push_str(&format!(
            "add element ip {TABLE} egress_names {element}\ndelete element ip {TABLE} egress_names {element}\n\
             delete chain ip {TABLE} {chain}\n"
        ));
        return script;
    }
    for cidr in &rules.allow {
        script.push_str(&format!(
            "add rule ip {TABLE} {chain} ip daddr {cidr} return\n"
        ));
    }
    for cidr in &rules.deny {
        script.push_str(&format!(
            "add rule ip {TABLE} {chain} ip daddr {cidr} tcp dport {{ 80, 443 }} dnat to {proxy}\n"
        ));
    }
    script.push_str(&format!("add element ip {TABLE} egress_names {element}\n"));
    script
}

/// Whether `ip` is currently allowed out.
pub fn internet_allowed(ip: Ipv4Addr) -> bool {
    let Ok(output) = Command::new("nft")
        .args(["list", "set", "ip", TABLE, "internet"])
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .any(|word| word == ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_whose_link_is_gone_are_stale() {
        let listing = r#"{"nftables": [{"metainfo": {}}, {"set": {"family": "bridge", "name": "ports",
            "elem": [{"concat": ["wv-0-2", "02:77:0a:4d:00:02", "10.77.0.2"]},
                     {"concat": ["wv-0-3", "02:77:0a:4d:00:03", "10.77.0.3"]}]}}]}"#;
        let links = vec!["wv-0-3".to_string()];
        assert_eq!(
            stale_port_addresses(listing, &links),
            vec![Ipv4Addr::new(10, 77, 0, 2)]
        );
        assert!(stale_port_addresses("not json", &links).is_empty());
        assert!(stale_port_addresses(r#"{"nftables": []}"#, &[]).is_empty());
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
    fn ruleset_is_versioned_and_binds_ports() {
        let host = HostNetworks {
            resolvers: vec![Ipv4Addr::new(10, 255, 255, 53)],
            connected: vec![(Ipv4Addr::new(192, 0, 2, 0), 24)],
        };
        let rules = ruleset("warren0", "10.77.0.0/16", &host, 49090);
        assert_eq!(rules.matches(&version_marker(&host, 49090)).count(), 2);
        assert_ne!(
            version_marker(&host, 49090),
            version_marker(&HostNetworks::default(), 49090)
        );
        assert_ne!(version_marker(&host, 49090), version_marker(&host, 49091));
        // Only connections nftables redirected reach the proxy.
        assert!(rules.contains("ct status dnat tcp dport 49090 accept"));
        assert!(rules.contains("ip saddr vmap @egress_names"));
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

    #[test]
    fn names_are_proxied_only_where_addresses_would_be_denied() {
        use crate::network::egress::{Cidr, HostPattern};
        let ip = Ipv4Addr::new(10, 77, 1, 2);
        let proxy = SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 49090);
        let everything: Cidr = "0.0.0.0/0".parse().unwrap();
        let rules = EgressRules {
            allow: vec!["198.51.100.0/24".parse().unwrap()],
            allow_hosts: vec![HostPattern::Exact("api.example.com".into())],
            deny: vec![everything],
            header_rules: vec![],
            upstream: None,
        };
        let script = egress_names_script(ip, &rules, proxy);
        let allowed = script
            .find("en-1-2 ip daddr 198.51.100.0/24 return")
            .expect("allowed network passes");
        let redirect = script
            .find("en-1-2 ip daddr 0.0.0.0/0 tcp dport { 80, 443 } dnat to 10.77.0.1:49090")
            .expect("denied web traffic goes to the proxy");
        assert!(allowed < redirect, "{script}");
        assert!(
            script.ends_with("add element ip warren egress_names { 10.77.1.2 : jump en-1-2 }\n")
        );
        // Names with nothing denied, or no names: no chain.
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
            let script = egress_names_script(ip, &rules, proxy);
            assert!(
                script.ends_with("delete chain ip warren en-1-2\n"),
                "{script}"
            );
            assert!(!script.contains("dnat"), "{script}");
        }
        // Header rules send all web traffic to the proxy, which applies the address rules itself.
        let with_headers = EgressRules {
            header_rules: vec![crate::network::egress::HeaderRule {
                pattern: HostPattern::Exact("api.example.com".into()),
                headers: vec![("Authorization".into(), "Bearer x".into())],
            }],
            ..EgressRules::default()
        };
        let script = egress_names_script(ip, &with_headers, proxy);
        assert!(
            script.contains("en-1-2 tcp dport { 80, 443 } dnat to 10.77.0.1:49090"),
            "{script}"
        );
        assert!(!script.contains("return"), "{script}");
        // A SOCKS5 proxy of the sandbox's own: all TCP goes to the proxy, DNS to the host's
        // resolvers excepted, whatever else the rules say.
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
        let script = egress_names_script(ip, &tunneled, proxy);
        let dns = script
            .find("en-1-2 ip daddr . meta l4proto . th dport @resolvers return")
            .expect("DNS to the host's resolvers stays direct");
        let all = script
            .find("en-1-2 meta l4proto tcp dnat to 10.77.0.1:49090")
            .expect("all TCP goes to the proxy");
        assert!(dns < all, "{script}");
        assert!(!script.contains("198.51.100.0/24"), "{script}");
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
