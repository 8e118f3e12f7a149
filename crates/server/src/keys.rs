//! API keys: created with a random secret shown once, stored as a SHA-256 hash, revoked by id or name.
//! The CLI's `warren key create|list|revoke` calls these functions on an opened store.

use rand::Rng;
use sha2::{Digest, Sha256};

use crate::lifecycle::now_millis;
use crate::store::{ApiKeyRecord, Store, StoreError};

/// Prefix of every secret, like E2B's keys.
pub const SECRET_PREFIX: &str = "e2b_";

/// A key just created: the only time its secret is known.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatedKey {
    pub record: ApiKeyRecord,
    pub secret: String,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key name must be 1 to 64 characters, got {0:?}")]
    BadName(String),
    #[error("no live key with id or name {0:?}")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

pub async fn create_key(store: &dyn Store, name: &str) -> Result<CreatedKey, KeyError> {
    if name.is_empty() || name.chars().count() > 64 {
        return Err(KeyError::BadName(name.to_string()));
    }
    let mut random = [0u8; 20];
    rand::thread_rng().fill(&mut random);
    let secret = format!("{SECRET_PREFIX}{}", hex::encode(random));
    let mut id_bytes = [0u8; 8];
    rand::thread_rng().fill(&mut id_bytes);
    let record = ApiKeyRecord {
        id: format!("key_{}", hex::encode(id_bytes)),
        name: name.to_string(),
        prefix: secret.chars().take(SECRET_PREFIX.len() + 6).collect(),
        secret_hash: hash_secret(&secret),
        created_at: now_millis(),
        last_used_at: None,
        revoked_at: None,
    };
    store.insert_api_key(&record).await?;
    Ok(CreatedKey { record, secret })
}

pub async fn list_keys(store: &dyn Store) -> Result<Vec<ApiKeyRecord>, KeyError> {
    Ok(store.list_api_keys().await?)
}

/// Revoke the live key(s) with this id or name.
pub async fn revoke_key(store: &dyn Store, id_or_name: &str) -> Result<u64, KeyError> {
    match store.revoke_api_key(id_or_name, now_millis()).await? {
        0 => Err(KeyError::NotFound(id_or_name.to_string())),
        revoked => Ok(revoked),
    }
}

/// The live key whose secret this is.
pub async fn authenticate(
    store: &dyn Store,
    secret: &str,
) -> Result<Option<ApiKeyRecord>, StoreError> {
    store.use_api_key(&hash_secret(secret), now_millis()).await
}
