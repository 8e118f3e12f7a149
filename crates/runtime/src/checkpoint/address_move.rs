//! Restoring at a new address (fork, template start). CRIU restores a connected TCP socket by binding
//! its old local address, which a fork's network namespace does not have ("Can't bind inet socket
//! back: Cannot assign requested address"). So, before CRIU runs, the new namespace gets the old address
//! as a /32 on `lo` (bindable, never answered for on the bridge thanks to `arp_ignore`/`arp_announce`)
//! and an nftables rule that resets or drops anything leaving through a non-loopback interface from
//! it: loopback connections inside the sandbox live on, connections that went outside die with a reset
//! the first time they send and never reach the original sandbox's peers. docs/checkpoints.md has the
//! evidence.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use super::CheckpointError;
use crate::network::netlink;

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
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
                    CheckpointError::Network(format!("join {}: {e}", netns.display()))
                })?;
                for (key, value) in [("arp_ignore", "1"), ("arp_announce", "2")] {
                    let path = format!("/proc/sys/net/ipv4/conf/all/{key}");
                    std::fs::write(&path, value).map_err(|source| CheckpointError::Io {
                        context: format!("write {path}"),
                        source,
                    })?;
                }
                netlink::run(async {
                    netlink::Netlink::connect()?
                        .add_address("lo", old, 32)
                        .await
                })
                .map_err(|e| {
                    CheckpointError::Network(format!(
                        "add {old}/32 to lo: {}",
                        crate::supervisor_error_chain(&e)
                    ))
                })?;
                run(Command::new("nft").args(["-f", "-"]), Some(&ruleset(old)))
            })
            .join()
            .unwrap_or(Err(CheckpointError::Network(
                "address move thread panicked".into(),
            )))
    })
}

fn run(command: &mut Command, input: Option<&str>) -> Result<(), CheckpointError> {
    let what = format!("{command:?}");
    let mut child = command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| CheckpointError::Io {
            context: format!("start {what}"),
            source,
        })?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|source| CheckpointError::Io {
                context: format!("feed {what}"),
                source,
            })?;
    }
    let output = child
        .wait_with_output()
        .map_err(|source| CheckpointError::Io {
            context: format!("wait for {what}"),
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(CheckpointError::Network(format!(
            "{what}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
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
