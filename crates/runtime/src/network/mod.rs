//! Sandbox networking: a host bridge (created on demand), one veth pair per sandbox with its peer in the
//! sandbox's network namespace as `eth0`, addresses leased from the bridge subnet, nftables isolation
//! and NAT.

pub mod addresses;
pub mod egress;
pub mod egress_ca;
mod egress_intercept;
pub mod egress_proxy;
pub mod egress_upstream;
pub mod firewall;
pub mod netlink;
pub mod nftables;
pub mod requested_name;

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// Everything the supervisor needs to wire one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkPlan {
    pub bridge: String,
    pub gateway: Ipv4Addr,
    pub prefix: u8,
    pub ip: Ipv4Addr,
}

impl NetworkPlan {
    /// Host-side veth name, derived from the address so it is unique on the host and findable: `wv-X-Y`
    /// for 10.77.X.Y (at most 10 bytes, under IFNAMSIZ).
    pub fn host_veth(&self) -> String {
        veth_name("wv", self.ip)
    }
}

impl NetworkPlan {
    /// MAC of the sandbox's eth0, derived from its address (locally administered, `02:77:a:b:c:d`): a
    /// later sandbox that gets the same address also gets the same MAC, so the host's neighbour cache
    /// never points a reused address at a vanished interface.
    pub fn sandbox_mac(&self) -> [u8; 6] {
        let [a, b, c, d] = self.ip.octets();
        [0x02, 0x77, a, b, c, d]
    }

    /// MAC of the bridge, derived from the gateway address the same way (no sandbox has the
    /// gateway's address, so no sandbox has this MAC). Fixed, so that sandboxes' cached gateway
    /// entries stay right while other sandboxes come and go (see `Netlink::ensure_bridge`).
    pub fn gateway_mac(&self) -> [u8; 6] {
        let [a, b, c, d] = self.gateway.octets();
        [0x02, 0x77, a, b, c, d]
    }
}

/// The network address of the subnet `gateway/prefix`.
pub fn network_address(gateway: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    };
    Ipv4Addr::from(u32::from(gateway) & mask)
}

pub fn veth_name(prefix: &str, ip: Ipv4Addr) -> String {
    let octets = ip.octets();
    format!("{prefix}-{}-{}", octets[2], octets[3])
}

/// Whether a link called `name` exists in the host's network namespace.
pub fn host_link_exists(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

/// Sets the host side of a sandbox's veth up or down, from the host's network namespace.
///
/// This is how Warren locks a sandbox's network while CRIU dumps or restores its sockets (CRIU runs
/// with `--network-lock skip`): with the host side down nothing reaches or leaves the sandbox, so no
/// peer's packet can meet a socket that is half dumped (and be acknowledged, then lost) or not yet
/// restored (and be answered with a reset). CRIU's own nftables lock did the same in ~45 ms per
/// restore; a link flag costs a netlink round trip. Runs on its own thread, so callers inside a tokio
/// runtime may use it.
pub fn set_host_link(name: &str, up: bool) -> Result<(), netlink::NetlinkError> {
    let name = name.to_string();
    std::thread::spawn(move || {
        netlink::run(async { netlink::Netlink::connect()?.set_link_state(&name, up).await })
    })
    .join()
    .unwrap_or(Err(netlink::NetlinkError::Panicked))
}

/// Routes `network/prefix` (a `warren node`'s sandbox subnet) through `gateway` (that node) in the
/// caller's network namespace, replacing any route to it.
pub fn route_via(
    network: Ipv4Addr,
    prefix: u8,
    gateway: Ipv4Addr,
) -> Result<(), netlink::NetlinkError> {
    std::thread::spawn(move || {
        netlink::run(async {
            netlink::Netlink::connect()?
                .replace_route(network, prefix, gateway)
                .await
        })
    })
    .join()
    .unwrap_or(Err(netlink::NetlinkError::Panicked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veth_names_fit_ifnamsiz() {
        let plan = NetworkPlan {
            bridge: "warren0".into(),
            gateway: Ipv4Addr::new(10, 77, 0, 1),
            prefix: 16,
            ip: Ipv4Addr::new(10, 77, 255, 254),
        };
        assert_eq!(plan.host_veth(), "wv-255-254");
    }

    #[test]
    fn network_address_clears_the_host_bits() {
        assert_eq!(
            network_address(Ipv4Addr::new(10, 77, 0, 1), 16),
            Ipv4Addr::new(10, 77, 0, 0)
        );
        assert_eq!(
            network_address(Ipv4Addr::new(10, 78, 3, 9), 30),
            Ipv4Addr::new(10, 78, 3, 8)
        );
    }
}
