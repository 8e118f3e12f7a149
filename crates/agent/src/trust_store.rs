//! Adds the host's egress CA to the sandbox's trust store when `/init` carries it (sandboxes whose
//! network rules set headers on HTTPS requests: the host's egress proxy presents certificates signed
//! by that CA for those hosts). The certificate is written on its own and appended to every system
//! bundle the image has, once; the usual variables point TLS clients that keep their own bundle
//! (Python's requests, Node) at it.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

/// The CA on its own (Debian's place for local CAs).
const OWN: &str = "usr/local/share/ca-certificates/warren-egress-ca.crt";

/// System bundles: Debian, Ubuntu, Alpine and Arch; Fedora and RHEL; others.
const BUNDLES: [&str; 3] = [
    "etc/ssl/certs/ca-certificates.crt",
    "etc/pki/tls/certs/ca-bundle.crt",
    "etc/ssl/cert.pem",
];

/// Largest certificate accepted.
const MAX_PEM: usize = 16 * 1024;

/// Installs `pem` under `root` and returns the variables TLS clients need to see it.
pub fn install(root: &Path, pem: &str) -> io::Result<BTreeMap<String, String>> {
    let pem = pem.trim();
    if pem.len() > MAX_PEM
        || !pem.starts_with("-----BEGIN CERTIFICATE-----")
        || !pem.ends_with("-----END CERTIFICATE-----")
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the trusted CA is not one PEM certificate",
        ));
    }
    let own = root.join(OWN);
    if let Some(parent) = own.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&own, format!("{pem}\n"))?;
    let mut bundle_used = None;
    for bundle in BUNDLES {
        let path = root.join(bundle);
        let Ok(existing) = std::fs::read_to_string(&path) else {
            continue;
        };
        if !existing.contains(pem) {
            let mut file = std::fs::OpenOptions::new().append(true).open(&path)?;
            let separator = if existing.ends_with('\n') || existing.is_empty() {
                ""
            } else {
                "\n"
            };
            file.write_all(format!("{separator}{pem}\n").as_bytes())?;
        }
        bundle_used.get_or_insert(bundle);
    }
    let bundle = match bundle_used {
        Some(bundle) => bundle,
        None => {
            // An image without a bundle gets one holding just this CA.
            let path = root.join(BUNDLES[0]);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, format!("{pem}\n"))?;
            BUNDLES[0]
        }
    };
    let bundle = format!("/{bundle}");
    Ok(BTreeMap::from([
        ("SSL_CERT_FILE".to_string(), bundle.clone()),
        ("REQUESTS_CA_BUNDLE".to_string(), bundle),
        ("NODE_EXTRA_CA_CERTS".to_string(), format!("/{OWN}")),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";

    #[test]
    fn the_ca_is_added_once_to_the_bundles_the_image_has() {
        let root = std::env::temp_dir().join(format!("wt-trust-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("etc/ssl/certs")).unwrap();
        std::fs::write(root.join(BUNDLES[0]), "existing").unwrap();
        let vars = install(&root, PEM).unwrap();
        install(&root, &format!("\n{PEM}\n")).unwrap();
        let bundle = std::fs::read_to_string(root.join(BUNDLES[0])).unwrap();
        assert_eq!(bundle, format!("existing\n{PEM}\n"));
        assert!(!root.join(BUNDLES[1]).exists());
        assert_eq!(
            std::fs::read_to_string(root.join(OWN)).unwrap(),
            format!("{PEM}\n")
        );
        assert_eq!(vars["SSL_CERT_FILE"], "/etc/ssl/certs/ca-certificates.crt");
        assert!(install(&root, "not a certificate").is_err());
        let _ = std::fs::remove_dir_all(&root);
    }
}
