//! A sandbox's egress rules by address: destinations it may reach (`allow`) and may not (`deny`), as
//! E2B's `network.allowOut` / `denyOut` with IPs and CIDRs. An allowed destination wins over a denied
//! one; `0.0.0.0/0` in `deny` blocks everything not allowed. The always-denied ranges of the host
//! ruleset (link-local, private, the host's networks) stay denied whatever a rule says: their drop
//! comes first.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// Most entries a rule list may hold (each is one nft rule).
pub const MAX_ENTRIES: usize = 256;

/// An IPv4 network: an address with a prefix length (a plain address is a /32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub network: Ipv4Addr,
    pub prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("{0:?} is not an IPv4 address or CIDR (host names need the egress proxy, which this server does not have yet)")]
    NotAnAddress(String),
    #[error("{0:?} has a prefix length above 32")]
    BadPrefix(String),
    #[error("{0:?} has host bits set; write the network address ({1})")]
    HostBits(String, Cidr),
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Cidr, CidrError> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: Ipv4Addr = address
            .parse()
            .map_err(|_| CidrError::NotAnAddress(text.to_string()))?;
        let prefix = match prefix {
            None => 32,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= 32 => p,
                Ok(_) => return Err(CidrError::BadPrefix(text.to_string())),
                Err(_) => return Err(CidrError::NotAnAddress(text.to_string())),
            },
        };
        let cidr = Cidr { network, prefix };
        let masked = Cidr {
            network: Ipv4Addr::from(u32::from(network) & cidr.mask()),
            prefix,
        };
        if masked != cidr {
            return Err(CidrError::HostBits(text.to_string(), masked));
        }
        Ok(cidr)
    }
}

impl Cidr {
    fn mask(&self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// What a sandbox may reach beyond the host ruleset's defaults. Empty: everything its internet access
/// allows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EgressRules {
    pub allow: Vec<Cidr>,
    pub deny: Vec<Cidr>,
}

impl EgressRules {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Parses E2B's lists; `which` names the field in errors (`network.allowOut`).
    pub fn parse_list(which: &str, entries: &[String]) -> Result<Vec<Cidr>, String> {
        if entries.len() > MAX_ENTRIES {
            return Err(format!(
                "{which} has {} entries; at most {MAX_ENTRIES}",
                entries.len()
            ));
        }
        let mut out: Vec<Cidr> = Vec::new();
        for entry in entries {
            let cidr = entry
                .trim()
                .parse::<Cidr>()
                .map_err(|e| format!("{which}: {e}"))?;
            if !out.contains(&cidr) {
                out.push(cidr);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_networks_parse_and_print() {
        let one: Cidr = "198.51.100.7".parse().unwrap();
        assert_eq!(one.to_string(), "198.51.100.7/32");
        let net: Cidr = "198.51.100.0/24".parse().unwrap();
        assert_eq!(net.to_string(), "198.51.100.0/24");
        assert_eq!("0.0.0.0/0".parse::<Cidr>().unwrap().prefix, 0);
        assert!(matches!(
            "example.com".parse::<Cidr>(),
            Err(CidrError::NotAnAddress(_))
        ));
        assert!(matches!(
            "*.example.com".parse::<Cidr>(),
            Err(CidrError::NotAnAddress(_))
        ));
        assert!(matches!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::BadPrefix(_))
        ));
        assert!(matches!(
            "198.51.100.7/24".parse::<Cidr>(),
            Err(CidrError::HostBits(_, _))
        ));
    }

    #[test]
    fn lists_are_deduplicated_bounded_and_name_the_field() {
        let list = EgressRules::parse_list(
            "network.allowOut",
            &["198.51.100.7".into(), " 198.51.100.7/32 ".into()],
        )
        .unwrap();
        assert_eq!(list.len(), 1);
        let error =
            EgressRules::parse_list("network.denyOut", &["api.example.com".into()]).unwrap_err();
        assert!(error.starts_with("network.denyOut: "), "{error}");
        assert!(error.contains("host names"), "{error}");
        let many: Vec<String> = (0..=MAX_ENTRIES)
            .map(|i| format!("198.18.{}.{}", i / 256, i % 256))
            .collect();
        assert!(EgressRules::parse_list("network.allowOut", &many).is_err());
    }
}
