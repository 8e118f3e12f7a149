//! Pre-signed `/files` URLs: the SDK's `download_url()` / `upload_url()` of a secured sandbox carry
//! `signature` (and optionally `signature_expiration`) instead of the access token. The agent checks
//! them; the proxy uses them to find the sandbox when the URL names none (`E2B_SANDBOX_URL` mode).

use base64::Engine;
use sha2::{Digest, Sha256};

/// Signing operation of a download.
pub const READ: &str = "read";
/// Signing operation of an upload.
pub const WRITE: &str = "write";

/// The v1 signature the SDK computes: `v1_` + unpadded base64 of
/// sha256(`path:operation:username:token[:expiration]`).
pub fn file_signature(
    path: &str,
    operation: &str,
    username: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let raw = match expiration {
        None => format!("{path}:{operation}:{username}:{token}"),
        Some(exp) => format!("{path}:{operation}:{username}:{token}:{exp}"),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// Compares two secrets in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdk_formula() {
        // Computed with the SDK's formula: base64(sha256(b"/a:read:user:tok")), unpadded.
        let sig = file_signature("/a", READ, "user", "tok", None);
        assert_eq!(sig, "v1_Fh5abAPjRBN6FHQ5HTJwGAHjHfzJmhV0f2EtHLgLVa0");
        assert_ne!(sig, file_signature("/a", WRITE, "user", "tok", None));
        assert_ne!(sig, file_signature("/a", READ, "user", "tok", Some(1)));
        assert!(constant_time_eq(sig.as_bytes(), sig.as_bytes()));
        assert!(!constant_time_eq(b"v1_a", b"v1_b"));
        assert!(!constant_time_eq(b"v1_a", b"v1_ab"));
    }
}
