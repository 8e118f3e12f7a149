//! nftables rules of the sandbox network, in table `ip warren` and `bridge warren`:
//! - sandboxes cannot reach each other (bridge-level drop between sandbox ports `wv-*`);
//! - sandboxes cannot open connections to the host (only replies to the host's own connections pass);
//! - traffic leaving the bridge is forwarded and masqueraded only for addresses in set `internet`
//!   (sandboxes created with `allow_internet`);
//! - chain `egress` is jumped to for every forwarded sandbox packet before it is accepted: the hook where
//!   per-sandbox egress allow/deny rules go ([`apply_egress`]).
//!
//! Rules are loaded with `nft -f -` (nftables has no stable netlink crate; the rules are installed once
//! per host and touched per sandbox only when internet access is granted).

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use crate::NetworkSpec;

#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("run nft")]
    Spawn(#[source] std::io::Error),
    #[error("nft {what} failed: {stderr}")]
    Nft { what: String, stderr: String },
    #[error("enable IPv4 forwarding")]
    Forwarding(#[source] std::io::Error),
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

fn table_exists(family: &str) -> bool {
    Command::new("nft")
        .args(["list", "table", family, TABLE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The host-wide ruleset for `bridge` and `subnet`.
pub fn ruleset(bridge: &str, subnet: &str) -> String {
    format!(
        r#"table ip {TABLE} {{
    set internet {{ type ipv4_addr; }}
    chain egress {{
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{bridge}" oifname "{bridge}" drop
        iifname "{bridge}" ip saddr != @internet drop
        iifname "{bridge}" jump egress
        iifname "{bridge}" ip saddr {subnet} accept
        iifname "{bridge}" drop
        oifname "{bridge}" ct state established,related accept
        oifname "{bridge}" drop
    }}
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "{bridge}" ct state established,related accept
        iifname "{bridge}" drop
    }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr @internet oifname != "{bridge}" masquerade
    }}
}}
table bridge {TABLE} {{
    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "wv-*" oifname "wv-*" drop
    }}
}}
"#
    )
}

/// Installs the ruleset unless it is there already (it is shared by all sandboxes of the host).
pub fn ensure_ruleset(bridge: &str, subnet: &str) -> Result<(), FirewallError> {
    if table_exists("ip") && table_exists("bridge") {
        return Ok(());
    }
    let reset = format!(
        "add table ip {TABLE}\ndelete table ip {TABLE}\nadd table bridge {TABLE}\ndelete table bridge {TABLE}\n"
    );
    nft(
        "install the sandbox ruleset",
        &(reset + &ruleset(bridge, subnet)),
    )
}

/// Grants or withholds internet access for `ip` and applies its egress rules.
/// Starts the nft run that lets `ip` reach the internet if `spec` allows it, and withholds it
/// otherwise; the run must be waited for before the sandbox is handed out.
///
/// A sandbox without internet also gets its address taken out of the set: an element left behind by
/// an earlier holder of the address that was never torn down (a crash, a hand-removed state dir)
/// must not grant it. Adding then deleting in one nft transaction succeeds whether or not the
/// element was there.
pub fn apply_egress(ip: Ipv4Addr, spec: &NetworkSpec) -> Result<PendingNft, FirewallError> {
    if !spec.allow_internet {
        return PendingNft::start(
            "withhold internet",
            &format!(
                "add element ip {TABLE} internet {{ {ip} }}\ndelete element ip {TABLE} internet {{ {ip} }}\n"
            ),
        );
    }
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(FirewallError::Forwarding)?;
    PendingNft::start(
        "allow internet",
        &format!("add element ip {TABLE} internet {{ {ip} }}\n"),
    )
}

/// Removes every rule that names `ip`.
pub fn remove_egress(ip: Ipv4Addr) -> Result<(), FirewallError> {
    // An absent element, or an absent table (the ruleset was flushed), makes nft fail, which is
    // fine: either way the address is not allowed out. No separate `nft list` first; every nft
    // start costs a few milliseconds of CPU.
    let _ = nft(
        "withdraw internet",
        &format!("delete element ip {TABLE} internet {{ {ip} }}\n"),
    );
    Ok(())
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
