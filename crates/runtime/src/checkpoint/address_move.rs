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
use crate::network::netlink;
use crate::network::nftables::{Batch, Expr, Family, Hook, MetaKey, PayloadBase};

/// nftables table holding the rule; named so it can be found.
const TABLE: &str = "warren_restored_address";

/// The rules of chain `output`, as expressions with how they read in nft's syntax:
/// `oifname != "lo" ip saddr OLD meta l4proto tcp reject with tcp reset`, then
/// `oifname != "lo" ip saddr OLD drop`.
pub fn rules(old: Ipv4Addr) -> [(Vec<Expr>, String); 2] {
    let mut lo = b"lo".to_vec();
    lo.resize(16, 0);
    let from_old_off_loopback = vec![
        Expr::Meta(MetaKey::OifName),
        Expr::Cmp {
            negate: true,
            data: lo,
        },
        // The IPv4 source address: 4 bytes at offset 12 of the network header.
        Expr::Payload {
            base: PayloadBase::Network,
            offset: 12,
            len: 4,
        },
        Expr::Cmp {
            negate: false,
            data: old.octets().to_vec(),
        },
    ];
    let mut reset = from_old_off_loopback.clone();
    reset.extend([
        Expr::Meta(MetaKey::L4Proto),
        Expr::Cmp {
            negate: false,
            data: vec![libc::IPPROTO_TCP as u8],
        },
        Expr::RejectTcpReset,
    ]);
    let mut drop = from_old_off_loopback;
    drop.push(Expr::Drop);
    let prefix = format!("oifname != \"lo\" ip saddr {old}");
    [
        (
            reset,
            format!("{prefix} meta l4proto tcp reject with tcp reset"),
        ),
        (drop, format!("{prefix} drop")),
    ]
}

/// The table, its output chain and [`rules`], as one batch.
fn batch(old: Ipv4Addr) -> Batch {
    let mut batch = Batch::new();
    batch.add_table(Family::Ip, TABLE);
    batch.add_filter_chain(Family::Ip, TABLE, "output", Hook::Output, 0);
    for (expressions, label) in rules(old) {
        batch.add_rule(Family::Ip, TABLE, "output", &expressions, &label);
    }
    batch
}

/// Prepares the network namespace pinned at `netns` for a checkpoint taken at `old`.
///
/// Works from a short-lived thread that joins the namespace (a network namespace is a per-thread
/// attribute), so the sysctls, the address and the rules (one netlink batch) need no process at all
/// (a process start costs ~1.5-3 ms on some hosts).
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
        .map_err(|e| crate::error_chain(&e))?;
        batch(old).commit().map_err(|e| {
            format!(
                "drop the old address's outside traffic: {}",
                crate::error_chain(&e)
            )
        })
    });
    moved
        .and_then(|done| done)
        .map_err(|e| CheckpointError::Network(format!("keep {old} in {}: {e}", netns.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expressions of the first rule, recorded once from `strace -e sendmsg -xx nft -f` of
    /// `oifname != "lo" ip saddr 10.77.0.5 meta l4proto tcp reject with tcp reset` (nftables
    /// 1.0.6): the rule's NFTA_RULE_EXPRESSIONS payload.
    #[test]
    fn rules_are_encoded_as_nft_encodes_them() {
        let recorded = "24000180090001006d6574610000000014000280080002000000000708000100
            000000013800018008000100636d70002c000280080001000000000108000200
            0000000118000380140001006c6f000000000000000000000000000034000180
            0c0001007061796c6f6164002400028008000100000000010800020000000001
            080003000000000c08000400000000042c00018008000100636d700020000280
            080001000000000108000200000000000c000380080001000a4d000524000180
            090001006d657461000000001400028008000200000000100800010000000001
            2c00018008000100636d70002000028008000100000000010800020000000000
            0c0003800500010006000000240001800b00010072656a656374000014000280
            08000100000000010500020000000000";
        let recorded: String = recorded.split_whitespace().collect();
        let [(reset, label), (drop, _)] = rules(Ipv4Addr::new(10, 77, 0, 5));
        assert_eq!(
            hex::encode(crate::network::nftables::expressions_bytes(&reset)),
            recorded
        );
        assert!(label.ends_with("10.77.0.5 meta l4proto tcp reject with tcp reset"));
        assert_eq!(drop.last(), Some(&Expr::Drop));
        assert_eq!(drop[..4], reset[..4]);
    }
}
