//! A sandbox's egress rules: destinations it may reach (`allow`, `allow_hosts`) and may not (`deny`),
//! as E2B's `network.allowOut` / `denyOut`. Addresses and CIDRs are enforced by nftables; host names
//! (`api.example.com`, `*.example.com`) by the host's egress proxy ([`super::egress_proxy`]), which
//! reads the name a connection asks for (TLS SNI on port 443, the HTTP `Host` on port 80) and connects
//! to what *it* resolves that name to. An allowed destination wins over a denied one; `0.0.0.0/0` in
//! `deny` blocks everything not allowed. The always-denied ranges of the host ruleset (link-local,
//! private, the host's networks) stay denied whatever a rule says: their drop comes first, and the
//! proxy never connects to an address in them.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

pub use super::egress_upstream::{UpstreamProxy, UpstreamTls};

/// Most entries a rule list may hold (each is one nft rule).
pub const MAX_ENTRIES: usize = 256;

/// An IPv4 network: an address with a prefix length (a plain address is a /32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Cidr {
    pub network: Ipv4Addr,
    pub prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("{0:?} is not an IPv4 address or CIDR")]
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

impl Cidr {
    /// Whether `ip` lies in this network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.network)
    }
}

/// A host name a sandbox may reach: one name (`api.example.com`), or every name below a domain
/// (`*.example.com`, which matches `a.example.com` and `a.b.example.com` but not `example.com`
/// itself; list both to allow both). Stored lower-case without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum HostPattern {
    Exact(String),
    Below(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPatternError {
    #[error("{0:?} is not an IPv4 address, CIDR, host name or *.domain wildcard")]
    Invalid(String),
}

impl FromStr for HostPattern {
    type Err = HostPatternError;

    fn from_str(text: &str) -> Result<HostPattern, HostPatternError> {
        let invalid = || HostPatternError::Invalid(text.to_string());
        let lower = text.trim().trim_end_matches('.').to_ascii_lowercase();
        let (below, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, lower),
        };
        if !is_host_name(&name) {
            return Err(invalid());
        }
        // A name made only of digits and dots would be read as an address by clients; refuse it
        // rather than guess.
        if name
            .split('.')
            .all(|label| label.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(invalid());
        }
        Ok(if below {
            HostPattern::Below(name)
        } else {
            HostPattern::Exact(name)
        })
    }
}

/// Whether `name` is a DNS host name: labels of letters, digits, `-` and `_`, 1 to 63 bytes each,
/// not starting or ending with `-`, 253 bytes in all.
pub fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl HostPattern {
    /// Whether `name` (as a client asked for it; case and a trailing dot do not matter) is allowed
    /// by this pattern.
    pub fn matches(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        match self {
            HostPattern::Exact(exact) => name == *exact,
            HostPattern::Below(domain) => name
                .strip_suffix(domain.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(name) => f.write_str(name),
            HostPattern::Below(domain) => write!(f, "*.{domain}"),
        }
    }
}

/// Headers the egress proxy sets on every HTTP request to the hosts `pattern` matches (E2B's
/// `network.rules` with `transform.headers`): a header of the same name the sandbox sent is replaced.
/// The values are how a secret is used without ever being inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeaderRule {
    pub pattern: HostPattern,
    pub headers: Vec<(String, String)>,
}

/// What a sandbox may reach beyond the host ruleset's defaults. Empty: everything its internet access
/// allows.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct EgressRules {
    pub allow: Vec<Cidr>,
    /// Host names allowed on ports 80 (HTTP, by `Host`) and 443 (TLS, by SNI) through the egress
    /// proxy, when their addresses would otherwise be denied.
    pub allow_hosts: Vec<HostPattern>,
    pub deny: Vec<Cidr>,
    /// Header transforms by host; they grant nothing by themselves.
    pub header_rules: Vec<HeaderRule>,
    /// The sandbox's own SOCKS5 proxy: everything TCP its rules let out is tunneled through it
    /// ([`super::egress_upstream`]).
    pub upstream: Option<UpstreamProxy>,
}

impl EgressRules {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
            && self.allow_hosts.is_empty()
            && self.deny.is_empty()
            && self.header_rules.is_empty()
            && self.upstream.is_none()
    }

    /// Whether the egress proxy takes part in this sandbox's connections (host names, header rules
    /// or a SOCKS5 proxy).
    pub fn needs_proxy(&self) -> bool {
        !self.allow_hosts.is_empty() || !self.header_rules.is_empty() || self.upstream.is_some()
    }

    /// Whether `name` is allowed by one of the host patterns.
    pub fn allows_host(&self, name: &str) -> bool {
        self.allow_hosts.iter().any(|pattern| pattern.matches(name))
    }

    /// Whether a connection to `ip` is allowed by the address rules (allow wins over deny).
    pub fn allows_address(&self, ip: Ipv4Addr) -> bool {
        self.allow.iter().any(|cidr| cidr.contains(ip))
            || !self.deny.iter().any(|cidr| cidr.contains(ip))
    }

    /// The headers to set on requests to `name`, as E2B picks them: an exact pattern first, then the
    /// longest matching wildcard; rule sets are not merged.
    pub fn headers_for(&self, name: &str) -> Option<&[(String, String)]> {
        let exact = self.header_rules.iter().find(|rule| {
            matches!(rule.pattern, HostPattern::Exact(_)) && rule.pattern.matches(name)
        });
        let best = exact.or_else(|| {
            self.header_rules
                .iter()
                .filter(|rule| rule.pattern.matches(name))
                .max_by_key(|rule| match &rule.pattern {
                    HostPattern::Below(domain) => domain.len(),
                    HostPattern::Exact(_) => usize::MAX,
                })
        });
        best.map(|rule| rule.headers.as_slice())
    }

    /// Parses E2B's `allowOut`: addresses and CIDRs, and host names; `which` names the field in
    /// errors (`network.allowOut`).
    pub fn parse_allow(
        which: &str,
        entries: &[String],
    ) -> Result<(Vec<Cidr>, Vec<HostPattern>), String> {
        check_length(which, entries)?;
        let mut cidrs: Vec<Cidr> = Vec::new();
        let mut hosts: Vec<HostPattern> = Vec::new();
        for entry in entries {
            let entry = entry.trim();
            match entry.parse::<Cidr>() {
                Ok(cidr) => {
                    if !cidrs.contains(&cidr) {
                        cidrs.push(cidr);
                    }
                }
                // Something address-shaped that did not parse is a bad address, not a host name.
                Err(error @ (CidrError::BadPrefix(_) | CidrError::HostBits(..))) => {
                    return Err(format!("{which}: {error}"))
                }
                Err(CidrError::NotAnAddress(_)) => {
                    let host = entry
                        .parse::<HostPattern>()
                        .map_err(|e| format!("{which}: {e}"))?;
                    if !hosts.contains(&host) {
                        hosts.push(host);
                    }
                }
            }
        }
        Ok((cidrs, hosts))
    }

    /// Parses E2B's `denyOut`: addresses and CIDRs only (as in E2B, a name cannot be denied: block
    /// everything and allow the names instead); `which` names the field in errors.
    pub fn parse_list(which: &str, entries: &[String]) -> Result<Vec<Cidr>, String> {
        check_length(which, entries)?;
        let mut out: Vec<Cidr> = Vec::new();
        for entry in entries {
            let cidr = entry.trim().parse::<Cidr>().map_err(|e| match e {
                CidrError::NotAnAddress(_) if entry.trim().parse::<HostPattern>().is_ok() => {
                    format!(
                        "{which}: {entry:?} is a host name; host names can only be allowed \
                     (deny 0.0.0.0/0 and list the names in network.allowOut)"
                    )
                }
                e => format!("{which}: {e}"),
            })?;
            if !out.contains(&cidr) {
                out.push(cidr);
            }
        }
        Ok(out)
    }
}

fn check_length(which: &str, entries: &[String]) -> Result<(), String> {
    if entries.len() > MAX_ENTRIES {
        return Err(format!(
            "{which} has {} entries; at most {MAX_ENTRIES}",
            entries.len()
        ));
    }
    Ok(())
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
        assert!(error.contains("host names can only be allowed"), "{error}");
        let error =
            EgressRules::parse_list("network.denyOut", &["not a thing".into()]).unwrap_err();
        assert!(error.contains("not an IPv4 address"), "{error}");
        let many: Vec<String> = (0..=MAX_ENTRIES)
            .map(|i| format!("198.18.{}.{}", i / 256, i % 256))
            .collect();
        assert!(EgressRules::parse_list("network.allowOut", &many).is_err());
        assert!(EgressRules::parse_allow("network.allowOut", &many).is_err());
    }

    #[test]
    fn allow_lists_split_into_addresses_and_host_names() {
        let (cidrs, hosts) = EgressRules::parse_allow(
            "network.allowOut",
            &[
                "198.51.100.0/24".into(),
                "API.Example.com.".into(),
                "*.pkg.example.org".into(),
                "api.example.com".into(),
            ],
        )
        .unwrap();
        assert_eq!(cidrs, vec!["198.51.100.0/24".parse().unwrap()]);
        assert_eq!(
            hosts,
            vec![
                HostPattern::Exact("api.example.com".into()),
                HostPattern::Below("pkg.example.org".into())
            ]
        );
        for bad in [
            "198.51.100.7/24",
            "10.0.0.0/40",
            "exa mple.com",
            "*",
            "*.",
            "-a.com",
            "1.2.3",
        ] {
            let error = EgressRules::parse_allow("network.allowOut", &[bad.into()]).unwrap_err();
            assert!(error.starts_with("network.allowOut: "), "{bad}: {error}");
        }
    }

    #[test]
    fn header_rules_pick_the_exact_name_then_the_longest_wildcard() {
        let rule = |pattern: &str, value: &str| HeaderRule {
            pattern: pattern.parse().unwrap(),
            headers: vec![("Authorization".into(), value.into())],
        };
        let rules = EgressRules {
            header_rules: vec![
                rule("*.example.com", "wide"),
                rule("*.api.example.com", "narrow"),
                rule("api.example.com", "exact"),
            ],
            ..EgressRules::default()
        };
        let value = |name: &str| rules.headers_for(name).map(|h| h[0].1.clone());
        assert_eq!(value("api.example.com").as_deref(), Some("exact"));
        assert_eq!(value("v1.api.example.com").as_deref(), Some("narrow"));
        assert_eq!(value("www.example.com").as_deref(), Some("wide"));
        assert_eq!(value("example.com"), None);
        let everything: Cidr = "0.0.0.0/0".parse().unwrap();
        let near: Cidr = "198.51.100.0/24".parse().unwrap();
        let rules = EgressRules {
            allow: vec![near],
            deny: vec![everything],
            ..EgressRules::default()
        };
        assert!(rules.allows_address(Ipv4Addr::new(198, 51, 100, 9)));
        assert!(!rules.allows_address(Ipv4Addr::new(203, 0, 113, 9)));
        assert!(EgressRules::default().allows_address(Ipv4Addr::new(203, 0, 113, 9)));
    }

    #[test]
    fn host_patterns_match_names_and_wildcards_only_below_their_domain() {
        let exact: HostPattern = "api.example.com".parse().unwrap();
        assert!(exact.matches("api.example.com"));
        assert!(exact.matches("API.example.com."));
        assert!(!exact.matches("xapi.example.com"));
        assert!(!exact.matches("api.example.com.evil.test"));
        let below: HostPattern = "*.example.com".parse().unwrap();
        assert!(below.matches("a.example.com"));
        assert!(below.matches("a.b.example.com"));
        assert!(!below.matches("example.com"));
        assert!(!below.matches("badexample.com"));
        assert!(!below.matches(".example.com"));
        assert_eq!(below.to_string(), "*.example.com");
        let cidr: Cidr = "198.18.0.0/15".parse().unwrap();
        assert!(cidr.contains(Ipv4Addr::new(198, 19, 255, 1)));
        assert!(!cidr.contains(Ipv4Addr::new(198, 20, 0, 1)));
        assert!("0.0.0.0/0"
            .parse::<Cidr>()
            .unwrap()
            .contains(Ipv4Addr::new(8, 8, 8, 8)));
    }
}
