//! `Idempotency-Key` on create: a client that retries a create (a timeout, a dropped connection) with
//! the same key gets the sandbox the first request made, never a second one.
//!
//! The key is claimed in the store before anything is created (one row per team and key, so two
//! concurrent requests cannot both claim it). The claimant creates; on success the row records the
//! sandbox, on failure the row goes, so a retry may try again. A request that finds the key held
//! waits for the first to finish and answers its sandbox; one whose request differs from the first's
//! is refused. Keys are kept for a day.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{now_millis, CreateRequest, CreatedSandbox, Lifecycle, LifecycleError};
use crate::store::IdempotencyClaim;

/// How long a key stays bound to its sandbox.
pub const KEY_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 255;
/// How long a retry waits for the first request of its key to finish.
const WAIT_FOR_FIRST: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(25);

/// A create's `Idempotency-Key` and a digest of the request it came with.
#[derive(Debug, Clone, PartialEq)]
pub struct IdempotencyKey {
    pub key: String,
    pub request_hash: String,
}

impl IdempotencyKey {
    /// The key as sent, and what identifies the request (its route and body).
    pub fn new(key: &str, route: &str, body: &[u8]) -> Result<IdempotencyKey, LifecycleError> {
        let fine = !key.is_empty()
            && key.len() <= MAX_KEY_LEN
            && key.chars().all(|c| c.is_ascii_graphic());
        if !fine {
            return Err(LifecycleError::BadRequest(format!(
                "Idempotency-Key must be 1 to {MAX_KEY_LEN} printable ASCII characters"
            )));
        }
        let mut hash = Sha256::new();
        hash.update(route.as_bytes());
        hash.update([0]);
        hash.update(body);
        Ok(IdempotencyKey {
            key: key.to_string(),
            request_hash: hex::encode(hash.finalize()),
        })
    }
}

impl Lifecycle {
    /// [`Lifecycle::create`], at most once per `key` of the request's team.
    pub async fn create_once(
        &self,
        request: CreateRequest,
        key: &IdempotencyKey,
    ) -> Result<CreatedSandbox, LifecycleError> {
        let team = request.team_id.clone();
        let deadline = tokio::time::Instant::now() + WAIT_FOR_FIRST;
        loop {
            let now = now_millis();
            let expired_before = now - KEY_LIFETIME.as_millis() as i64;
            let claim = self
                .store()
                .claim_idempotency_key(&team, &key.key, &key.request_hash, now, expired_before)
                .await?;
            match claim {
                IdempotencyClaim::Claimed => {
                    return match self.create(request).await {
                        Ok(created) => {
                            self.store()
                                .finish_idempotency_key(&team, &key.key, &created.record.id)
                                .await?;
                            Ok(created)
                        }
                        Err(error) => {
                            if let Err(release) =
                                self.store().release_idempotency_key(&team, &key.key).await
                            {
                                tracing::warn!(%release, "cannot release an idempotency key");
                            }
                            Err(error)
                        }
                    };
                }
                IdempotencyClaim::Held { request_hash, .. } if request_hash != key.request_hash => {
                    return Err(LifecycleError::Conflict(format!(
                        "Idempotency-Key {:?} was used with a different request",
                        key.key
                    )));
                }
                IdempotencyClaim::Held {
                    sandbox_id: Some(id),
                    ..
                } => {
                    let record = self.get(&id).await?;
                    return Ok(CreatedSandbox { record });
                }
                IdempotencyClaim::Held {
                    sandbox_id: None, ..
                } => {
                    if tokio::time::Instant::now() > deadline {
                        return Err(LifecycleError::Conflict(format!(
                            "the first create with Idempotency-Key {:?} is still running",
                            key.key
                        )));
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_and_requests_told_apart() {
        let a = IdempotencyKey::new("k-1", "/v2/sandboxes", b"{\"templateID\":\"base\"}").unwrap();
        let same =
            IdempotencyKey::new("k-1", "/v2/sandboxes", b"{\"templateID\":\"base\"}").unwrap();
        let other_body =
            IdempotencyKey::new("k-1", "/v2/sandboxes", b"{\"templateID\":\"x\"}").unwrap();
        let other_route =
            IdempotencyKey::new("k-1", "/sandboxes", b"{\"templateID\":\"base\"}").unwrap();
        assert_eq!(a, same);
        assert_ne!(a.request_hash, other_body.request_hash);
        assert_ne!(a.request_hash, other_route.request_hash);
        for bad in ["", "has space", "tab\there", &"x".repeat(MAX_KEY_LEN + 1)] {
            assert!(
                matches!(
                    IdempotencyKey::new(bad, "/v2/sandboxes", b""),
                    Err(LifecycleError::BadRequest(_))
                ),
                "{bad:?}"
            );
        }
    }
}
