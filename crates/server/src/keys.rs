//! API keys: created with a random secret shown once, stored as a SHA-256 hash, revoked by id or name.
//! The CLI's `warren key create|list|revoke` calls these functions on an opened store.

use rand::Rng;
use sha2::{Digest, Sha256};

use crate::lifecycle::now_millis;
use crate::store::{ApiKeyRecord, Store, StoreError, TeamRecord};

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
    #[error("no team with id or name {0:?}")]
    NoTeam(String),
    #[error("team name must be 1 to 64 characters of letters, digits, '-' and '_', got {0:?}")]
    BadTeamName(String),
    #[error("a team named {0:?} exists already")]
    TeamExists(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Creates a key in team `team` (id or name); an `admin` key also manages teams and keys.
pub async fn create_key(
    store: &dyn Store,
    name: &str,
    team: &str,
    admin: bool,
) -> Result<CreatedKey, KeyError> {
    if name.is_empty() || name.chars().count() > 64 {
        return Err(KeyError::BadName(name.to_string()));
    }
    let team = store
        .get_team(team)
        .await?
        .ok_or_else(|| KeyError::NoTeam(team.to_string()))?;
    let mut random = [0u8; 20];
    rand::rng().fill(&mut random);
    let secret = format!("{SECRET_PREFIX}{}", hex::encode(random));
    let mut id_bytes = [0u8; 8];
    rand::rng().fill(&mut id_bytes);
    let record = ApiKeyRecord {
        id: format!("key_{}", hex::encode(id_bytes)),
        name: name.to_string(),
        prefix: secret.chars().take(SECRET_PREFIX.len() + 6).collect(),
        secret_hash: hash_secret(&secret),
        created_at: now_millis(),
        last_used_at: None,
        revoked_at: None,
        team_id: team.id,
        admin,
    };
    store.insert_api_key(&record).await?;
    Ok(CreatedKey { record, secret })
}

pub async fn list_keys(store: &dyn Store) -> Result<Vec<ApiKeyRecord>, KeyError> {
    Ok(store.list_api_keys().await?)
}

/// Per-team limits on what its live sandboxes may hold at once (`None`: only the node's limits).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TeamQuotas {
    pub max_sandboxes: Option<u32>,
    pub max_vcpus: Option<f64>,
    pub max_memory_mib: Option<u64>,
}

pub async fn create_team(
    store: &dyn Store,
    name: &str,
    quotas: TeamQuotas,
) -> Result<TeamRecord, KeyError> {
    let fine = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !fine {
        return Err(KeyError::BadTeamName(name.to_string()));
    }
    if store.get_team(name).await?.is_some() {
        return Err(KeyError::TeamExists(name.to_string()));
    }
    let mut id_bytes = [0u8; 8];
    rand::rng().fill(&mut id_bytes);
    let team = TeamRecord {
        id: format!("team_{}", hex::encode(id_bytes)),
        name: name.to_string(),
        max_sandboxes: quotas.max_sandboxes,
        max_vcpus: quotas.max_vcpus,
        max_memory_mib: quotas.max_memory_mib,
        created_at: now_millis(),
    };
    store.insert_team(&team).await?;
    Ok(team)
}

pub async fn list_teams(store: &dyn Store) -> Result<Vec<TeamRecord>, KeyError> {
    Ok(store.list_teams().await?)
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
