//! The SQLite store's secret rows (migration 0020). Values arrive sealed ([`crate::secrets::Sealed`]):
//! nothing here sees a plaintext.

use sqlx::SqlitePool;

use super::rows::{metadata_json, secret_from_row};
use super::{Millis, SecretRecord, StoreError};

/// False when the team already has a secret of that name.
pub(super) async fn insert(pool: &SqlitePool, secret: &SecretRecord) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO secrets (id, team_id, name, version, nonce, ciphertext, metadata, created_at, \
         updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (team_id, name) DO NOTHING",
    )
    .bind(&secret.id)
    .bind(&secret.team_id)
    .bind(&secret.name)
    .bind(secret.version)
    .bind(&secret.sealed.nonce)
    .bind(&secret.sealed.ciphertext)
    .bind(metadata_json(&secret.metadata))
    .bind(secret.created_at)
    .bind(secret.updated_at)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Team `team_id`'s secret with this id, or else this (lower-cased) name.
pub(super) async fn get(
    pool: &SqlitePool,
    team_id: &str,
    id_or_name: &str,
) -> Result<Option<SecretRecord>, StoreError> {
    let row = sqlx::query(
        "SELECT * FROM secrets WHERE team_id = ? AND (id = ? OR name = ?) \
         ORDER BY id = ? DESC LIMIT 1",
    )
    .bind(team_id)
    .bind(id_or_name)
    .bind(id_or_name.to_ascii_lowercase())
    .bind(id_or_name)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(secret_from_row).transpose()
}

/// Oldest first, after `(created_at, id)` when given.
pub(super) async fn list(
    pool: &SqlitePool,
    team_id: &str,
    after: Option<(Millis, String)>,
    limit: u32,
) -> Result<Vec<SecretRecord>, StoreError> {
    let (at, id) = after.unwrap_or((i64::MIN, String::new()));
    let rows = sqlx::query(
        "SELECT * FROM secrets WHERE team_id = ? AND (created_at > ? OR (created_at = ? AND id > ?)) \
         ORDER BY created_at, id LIMIT ?",
    )
    .bind(team_id)
    .bind(at)
    .bind(at)
    .bind(id)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.iter().map(secret_from_row).collect()
}

/// Writes `secret`'s version, sealed value, metadata and update time if its row is still at
/// `expected_version`; false otherwise (gone, or updated by someone else meanwhile).
pub(super) async fn update(
    pool: &SqlitePool,
    secret: &SecretRecord,
    expected_version: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE secrets SET version = ?, nonce = ?, ciphertext = ?, metadata = ?, updated_at = ? \
         WHERE id = ? AND team_id = ? AND version = ?",
    )
    .bind(secret.version)
    .bind(&secret.sealed.nonce)
    .bind(&secret.sealed.ciphertext)
    .bind(metadata_json(&secret.metadata))
    .bind(secret.updated_at)
    .bind(&secret.id)
    .bind(&secret.team_id)
    .bind(expected_version)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(super) async fn delete(pool: &SqlitePool, team_id: &str, id: &str) -> Result<bool, StoreError> {
    let done = sqlx::query("DELETE FROM secrets WHERE team_id = ? AND id = ?")
        .bind(team_id)
        .bind(id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sqlx::Row;

    use super::super::{SqliteStore, Store};
    use super::*;
    use crate::secrets::{SecretKey, SecretsError};

    #[tokio::test]
    async fn rows_hold_the_sealed_value_which_opens_only_with_the_key_it_was_sealed_with() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_in(dir.path()).await.unwrap();
        let key = SecretKey::from_bytes(&[1; 32]);
        let value = "plaintext-7c41-never-stored";
        let record = SecretRecord {
            id: "sec_1".to_string(),
            team_id: "team_a".to_string(),
            name: "db-password".to_string(),
            version: 1,
            sealed: key.seal("sec_1", 1, value).unwrap(),
            metadata: BTreeMap::from([("owner".to_string(), "ops".to_string())]),
            created_at: 10,
            updated_at: 10,
        };
        assert!(store.insert_secret(&record).await.unwrap());
        let duplicate = SecretRecord {
            id: "sec_2".to_string(),
            ..record.clone()
        };
        assert!(!store.insert_secret(&duplicate).await.unwrap());

        // The raw row: no plaintext anywhere in it.
        let pool = SqlitePool::connect(&format!(
            "sqlite://{}",
            dir.path().join("warren.db").display()
        ))
        .await
        .unwrap();
        let row = sqlx::query("SELECT * FROM secrets WHERE id = 'sec_1'")
            .fetch_one(&pool)
            .await
            .unwrap();
        for column in ["nonce", "ciphertext"] {
            let bytes: Vec<u8> = row.try_get(column).unwrap();
            assert!(!bytes.windows(value.len()).any(|w| w == value.as_bytes()));
        }
        for column in ["id", "team_id", "name", "metadata"] {
            let text: String = row.try_get(column).unwrap();
            assert!(!text.contains(value));
        }
        pool.close().await;

        let read = store
            .get_secret("team_a", "DB-Password")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read, record);
        assert_eq!(
            key.open(&read.id, &read.name, read.version, &read.sealed)
                .unwrap(),
            value
        );
        let wrong = SecretKey::from_bytes(&[2; 32]);
        let error = wrong
            .open(&read.id, &read.name, read.version, &read.sealed)
            .unwrap_err();
        assert!(matches!(error, SecretsError::Undecryptable { .. }));
        assert!(error.to_string().contains("db-password"));
        assert!(store.get_secret("team_b", "sec_1").await.unwrap().is_none());

        // Compare-and-set on the version.
        let mut next = read.clone();
        next.version = 2;
        next.sealed = key.seal("sec_1", 2, "v2").unwrap();
        assert!(store.update_secret(&next, 1).await.unwrap());
        assert!(!store.update_secret(&next, 1).await.unwrap());
        let listed = store.list_secrets("team_a", None, 10).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].version, 2);
        assert!(store
            .list_secrets("team_a", Some((10, "sec_1".to_string())), 10)
            .await
            .unwrap()
            .is_empty());
        assert!(!store.delete_secret("team_b", "sec_1").await.unwrap());
        assert!(store.delete_secret("team_a", "sec_1").await.unwrap());
    }
}
