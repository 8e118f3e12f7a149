//! Restoring at a new address (fork, template start). CRIU restores a connected TCP socket by binding
//! its old local address, which a fork's network namespace does not have ("Can't bind inet socket
//! back: Cannot assign requested address"). So, before CRIU runs, the new namespace gets the old address
//! as a /32 on `lo` (bindable, never answered for on the bridge thanks to `arp_ignore`/`arp_announce`)
//! and an nftables rule that resets or drops anything leaving through a non-loopback interface from
//! it: loopback connections inside the sandbox live on, connections that went outside die with a reset
//! the first time they send and never reach the original sandbox's peers. docs/checkpoints.md has the
//! evidence.

use std::net::Ipv4Addr;
use std::path::Path;

use nix::sched::CloneFlags;

use super::CheckpointError;
use crate::namespaces;
use crate::network::{firewall, netlink};

/// nftables table holding the rule; named so it can be found.
const TABLE: &str = "warren_restored_address";

pub fn ruleset(old: Ipv4Addr) -> String {
    format!(
        "table ip {TABLE} {{\n  chain output {{\n    type filter hook output priority 0; policy accept;\n    \
         oifname != \"lo\" ip saddr {old} meta l4proto tcp reject with tcp reset\n    \
         oifname != \"lo\" ip saddr {old} drop\n  }}\n}}\n"
    )
}

/// Prepares the network namespace pinned at `netns` for a checkpoint taken at `old`.
///
/// Works from a short-lived thread that joins the namespace (a network namespace is a per-thread
/// attribute), so the sysctls and the address need no process at all and nft is one child that
/// inherits the thread's namespace: one process start instead of six through nsenter (~3 ms each on
/// hosts where starting a process is slow).
pub fn keep_old_address(netns: &Path, old: Ipv4Addr) -> Result<(), CheckpointError> {
    let ns = std::fs::File::open(netns).map_err(|source| CheckpointError::Io {
        context: format!("open {}", netns.display()),
        source,
    })?;
    let moved = namespaces::run_in(&ns, CloneFlags::CLONE_NEWNET, || {
        for (key, value) in [("arp_ignore", "1"), ("arp_announce", "2")] {
            let path = format!("/proc/sys/net/ipv4/conf/all/{key}");
            std::fs::write(&path, value).map_err(|e| format!("write {path}: {e}"))?;
        }
        netlink::run(async {
            netlink::Netlink::connect()?
                .add_address("lo", old, 32)
                .await
        })
        .map_err(|e| crate::supervisor_error_chain(&e))?;
        firewall::nft("drop the old address's outside traffic", &ruleset(old))
            .map_err(|e| crate::supervisor_error_chain(&e))
    });
    moved
        .and_then(|done| done)
        .map_err(|e| CheckpointError::Network(format!("keep {old} in {}: {e}", netns.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_only_touch_the_old_address_off_loopback() {
        let rules = ruleset(Ipv4Addr::new(10, 77, 0, 5));
        assert!(rules.contains(
            "oifname != \"lo\" ip saddr 10.77.0.5 meta l4proto tcp reject with tcp reset"
        ));
        assert!(rules.contains("oifname != \"lo\" ip saddr 10.77.0.5 drop"));
        assert!(rules.contains("hook output"));
    }
}
