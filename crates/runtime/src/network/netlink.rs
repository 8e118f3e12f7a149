//! rtnetlink operations: the host bridge, the veth pair, moving the peer into the sandbox's network
//! namespace and configuring it there. A netlink socket talks to the network namespace of the thread
//! that opened it, so each [`Netlink`] belongs to one namespace.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::RawFd;

use futures::TryStreamExt;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("open netlink socket")]
    Socket(#[source] std::io::Error),
    #[error("start netlink runtime")]
    Runtime(#[source] std::io::Error),
    #[error("{what}")]
    Request {
        what: String,
        #[source]
        source: Box<rtnetlink::Error>,
    },
    #[error("link {0} not found")]
    NoLink(String),
    #[error("netlink thread panicked")]
    Panicked,
}

fn errno(error: &rtnetlink::Error) -> i32 {
    match error {
        rtnetlink::Error::NetlinkError(message) => -message.raw_code(),
        _ => 0,
    }
}

/// Runs `work` on a current-thread tokio runtime (the caller's thread, so its network namespace).
pub fn run<T>(
    work: impl std::future::Future<Output = Result<T, NetlinkError>>,
) -> Result<T, NetlinkError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(NetlinkError::Runtime)?;
    runtime.block_on(work)
}

/// A netlink connection in the current thread's network namespace. Must be made inside [`run`].
pub struct Netlink {
    handle: rtnetlink::Handle,
}

impl Netlink {
    pub fn connect() -> Result<Self, NetlinkError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Socket)?;
        tokio::spawn(connection);
        Ok(Self { handle })
    }

    fn request(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
        let what = what.into();
        move |source| NetlinkError::Request {
            what,
            source: Box::new(source),
        }
    }

    /// Index of link `name`, or None when there is none.
    pub async fn link_index(&self, name: &str) -> Result<Option<u32>, NetlinkError> {
        Ok(self.link(name).await?.map(|link| link.header.index))
    }

    /// Link `name` as the kernel describes it, or None when there is none.
    async fn link(
        &self,
        name: &str,
    ) -> Result<Option<netlink_packet_route::link::LinkMessage>, NetlinkError> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match links.try_next().await {
            Ok(link) => Ok(link),
            Err(e) if errno(&e) == libc::ENODEV => Ok(None),
            Err(e) => Err(Self::request(format!("look up link {name}"))(e)),
        }
    }

    async fn require_index(&self, name: &str) -> Result<u32, NetlinkError> {
        self.link_index(name)
            .await?
            .ok_or_else(|| NetlinkError::NoLink(name.to_string()))
    }

    /// Creates bridge `name` with MAC `mac` and brings it up, unless it exists (then makes sure it
    /// has that MAC and is up). Returns its index. Its address: [`Self::ensure_address`].
    ///
    /// The MAC is set, not left to the kernel: a bridge without one of its own takes the lowest
    /// MAC among its ports, so it changed whenever a sandbox came or went, and every other sandbox's
    /// cached gateway MAC went stale; their packets to the host were lost until the neighbour entry
    /// was probed again (seconds, and with TCP's backoff on top, up to minutes of silence).
    pub async fn ensure_bridge(&self, name: &str, mac: [u8; 6]) -> Result<u32, NetlinkError> {
        // One lookup in the usual case (the bridge is there, with its MAC, up): every create asks.
        let existing = self.link(name).await?;
        let link = match existing {
            Some(link) => link,
            None => {
                match self
                    .handle
                    .link()
                    .add()
                    .bridge(name.to_string())
                    .address(mac.to_vec())
                    .execute()
                    .await
                {
                    Ok(()) => {}
                    // Another supervisor made it first.
                    Err(e) if errno(&e) == libc::EEXIST => {}
                    Err(e) => return Err(Self::request(format!("create bridge {name}"))(e)),
                }
                self.link(name)
                    .await?
                    .ok_or_else(|| NetlinkError::NoLink(name.to_string()))?
            }
        };
        let index = link.header.index;
        let current = link
            .attributes
            .iter()
            .find_map(|attribute| match attribute {
                netlink_packet_route::link::LinkAttribute::Address(mac) => Some(mac.as_slice()),
                _ => None,
            });
        if current != Some(&mac[..]) {
            self.handle
                .link()
                .set(index)
                .address(mac.to_vec())
                .execute()
                .await
                .map_err(Self::request(format!("set the MAC of {name}")))?;
        }
        let up = link
            .header
            .flags
            .contains(&netlink_packet_route::link::LinkFlag::Up);
        if !up {
            self.set_up(index, name).await?;
        }
        Ok(index)
    }

    /// Gives link `index` (named `name`) `address/prefix` unless it has it already.
    pub async fn ensure_address(
        &self,
        index: u32,
        name: &str,
        address: Ipv4Addr,
        prefix: u8,
    ) -> Result<(), NetlinkError> {
        match self
            .handle
            .address()
            .add(index, IpAddr::V4(address), prefix)
            .execute()
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == libc::EEXIST => Ok(()),
            Err(e) => Err(Self::request(format!("add {address}/{prefix} to {name}"))(
                e,
            )),
        }
    }

    /// The index and MAC of link `name`, which must exist.
    pub async fn set_up(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .set(index)
            .up()
            .execute()
            .await
            .map_err(Self::request(format!("set {name} up")))
    }

    /// Adds `address/prefix` to link `name`.
    pub async fn add_address(
        &self,
        name: &str,
        address: Ipv4Addr,
        prefix: u8,
    ) -> Result<(), NetlinkError> {
        let index = self.require_index(name).await?;
        self.handle
            .address()
            .add(index, IpAddr::V4(address), prefix)
            .execute()
            .await
            .map_err(Self::request(format!("add {address}/{prefix} to {name}")))
    }

    /// Sets link `name` up or down; a link that does not exist is an error.
    pub async fn set_link_state(&self, name: &str, up: bool) -> Result<(), NetlinkError> {
        let index = self.require_index(name).await?;
        let request = self.handle.link().set(index);
        let request = if up { request.up() } else { request.down() };
        request.execute().await.map_err(Self::request(format!(
            "set {name} {}",
            if up { "up" } else { "down" }
        )))
    }

    /// Creates the veth pair in one request: `host` here, attached to bridge `bridge_index` (and up
    /// unless `held_down`: a restore keeps it down until CRIU is done, see [`super::set_host_link`]), and
    /// its peer directly inside the namespace open at `netns_fd` as `eth0` (no later move or rename,
    /// which would each cost a network-device unregister round).
    pub async fn create_veth_into(
        &self,
        host: &str,
        netns_fd: RawFd,
        bridge_index: u32,
        sandbox_mac: [u8; 6],
        held_down: bool,
    ) -> Result<(), NetlinkError> {
        use netlink_packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkInfo};
        // rtnetlink's veth(a, b) makes b the request's main link (here: the host side, created in this
        // namespace) and a its peer, which gets the sandbox namespace's fd.
        let mut request = self
            .handle
            .link()
            .add()
            .veth("eth0".to_string(), host.to_string());
        for attribute in &mut request.message_mut().attributes {
            if let LinkAttribute::LinkInfo(infos) = attribute {
                for info in infos {
                    if let LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))) = info {
                        peer.attributes.push(LinkAttribute::NetNsFd(netns_fd));
                        peer.attributes
                            .push(LinkAttribute::Address(sandbox_mac.to_vec()));
                    }
                }
            }
        }
        // The host side is made attached to the bridge in the same request (the kernel sets a new
        // link's controller as it creates it; it does not apply the up flag there, seen on 6.18),
        // then brought up by name: two round trips instead of a lookup and a set besides.
        request
            .message_mut()
            .attributes
            .push(LinkAttribute::Controller(bridge_index));
        request
            .execute()
            .await
            .map_err(Self::request(format!("create veth {host} on the bridge")))?;
        if held_down {
            return Ok(());
        }
        let mut up = self.handle.link().set(0).up();
        up.message_mut()
            .attributes
            .push(LinkAttribute::IfName(host.to_string()));
        up.execute()
            .await
            .map_err(Self::request(format!("set {host} up")))
    }

    /// Inside the sandbox's namespace: gives `eth0` `address/prefix`, brings it and `lo` up and routes
    /// everything through `gateway`.
    pub async fn configure_sandbox_side(
        &self,
        address: Ipv4Addr,
        prefix: u8,
        gateway: Ipv4Addr,
    ) -> Result<(), NetlinkError> {
        // A fresh namespace: `lo` (always index 1, LOOPBACK_IFINDEX) is down, `eth0` has nothing.
        // Every request takes the kernel's RTNL lock, so sending them at once would not overlap.
        const LOOPBACK_INDEX: u32 = 1;
        let eth0 = self.require_index("eth0").await?;
        self.handle
            .address()
            .add(eth0, IpAddr::V4(address), prefix)
            .execute()
            .await
            .map_err(Self::request(format!("add {address}/{prefix} to eth0")))?;
        self.set_up(LOOPBACK_INDEX, "lo").await?;
        self.set_up(eth0, "eth0").await?;
        self.handle
            .route()
            .add()
            .v4()
            .gateway(gateway)
            .execute()
            .await
            .map_err(Self::request(format!("add default route via {gateway}")))?;
        Ok(())
    }

    /// Routes `network/prefix` through `gateway`, replacing a route to it that is there already.
    pub async fn replace_route(
        &self,
        network: Ipv4Addr,
        prefix: u8,
        gateway: Ipv4Addr,
    ) -> Result<(), NetlinkError> {
        self.handle
            .route()
            .add()
            .v4()
            .destination_prefix(network, prefix)
            .gateway(gateway)
            .replace()
            .execute()
            .await
            .map_err(Self::request(format!(
                "route {network}/{prefix} via {gateway}"
            )))
    }

    /// Deletes link `name` if it exists (a veth: its peer goes with it).
    pub async fn delete_link(&self, name: &str) -> Result<(), NetlinkError> {
        let Some(index) = self.link_index(name).await? else {
            return Ok(());
        };
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == libc::ENODEV => Ok(()),
            Err(e) => Err(Self::request(format!("delete link {name}"))(e)),
        }
    }

    /// Deletes the neighbour (ARP) entry for `ip` on link `link`, if there is one.
    pub async fn delete_neighbour(&self, link: &str, ip: Ipv4Addr) -> Result<(), NetlinkError> {
        use netlink_packet_route::neighbour::{
            NeighbourAddress, NeighbourAttribute, NeighbourHeader, NeighbourMessage,
        };
        let Some(index) = self.link_index(link).await? else {
            return Ok(());
        };
        let mut message = NeighbourMessage::default();
        message.header = NeighbourHeader {
            family: netlink_packet_route::AddressFamily::Inet,
            ifindex: index,
            ..NeighbourHeader::default()
        };
        message
            .attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
        match self.handle.neighbours().del(message).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == libc::ENOENT => Ok(()),
            Err(e) => Err(Self::request(format!(
                "delete the neighbour {ip} on {link}"
            ))(e)),
        }
    }

    /// Names of all links in this namespace.
    pub async fn link_names(&self) -> Result<Vec<String>, NetlinkError> {
        use netlink_packet_route::link::LinkAttribute;
        let links: Vec<_> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(Self::request("list links"))?;
        Ok(links
            .into_iter()
            .filter_map(|link| {
                link.attributes.into_iter().find_map(|attr| match attr {
                    LinkAttribute::IfName(name) => Some(name),
                    _ => None,
                })
            })
            .collect())
    }
}
