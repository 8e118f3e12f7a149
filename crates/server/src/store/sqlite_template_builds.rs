//! The SQLite store's template tags (`template_tags`, migration 0007) and build records
//! (`template_builds`, migration 0008), kept apart from `sqlite.rs` to keep files short.
//! [`super::SqliteStore`]'s `Store` impl calls these.

use sqlx::{Row, SqlitePool};

use super::{BuildRecord, BuildState, Millis, StoreError, TemplateTag};

pub async fn assign_tags(
    pool: &SqlitePool,
    template_id: &str,
    build_id: &str,
    tags: &[String],
    now: Millis,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    for tag in tags {
        sqlx::query(
            "INSERT INTO template_tags (template_id, tag, build_id, created_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id, \
             created_at = excluded.created_at",
        )
        .bind(template_id)
        .bind(tag)
        .bind(build_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

pub async fn remove_tags(
    pool: &SqlitePool,
    template_id: &str,
    tags: &[String],
) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    let mut removed = 0;
    for tag in tags {
        removed += sqlx::query("DELETE FROM template_tags WHERE template_id = ? AND tag = ?")
            .bind(template_id)
            .bind(tag)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    tx.commit().await?;
    Ok(removed)
}

pub async fn list_tags(
    pool: &SqlitePool,
    template_id: &str,
) -> Result<Vec<TemplateTag>, StoreError> {
    let rows = sqlx::query(
        "SELECT template_id, tag, build_id, created_at FROM template_tags WHERE template_id = ? ORDER BY tag",
    )
    .bind(template_id)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(TemplateTag {
                template_id: row.try_get("template_id")?,
                tag: row.try_get("tag")?,
                build_id: row.try_get("build_id")?,
                created_at: row.try_get("created_at")?,
            })
        })
        .collect()
}

/// A late `building` (the server records it after handing the build to its thread) never overwrites a
/// build that already finished.
pub async fn upsert_build(pool: &SqlitePool, build: &BuildRecord) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO template_builds (build_id, template_id, status, reason, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?) \
         ON CONFLICT (build_id) DO UPDATE SET status = excluded.status, reason = excluded.reason, \
         updated_at = excluded.updated_at \
         WHERE NOT (excluded.status = 'building' AND template_builds.status IN ('ready', 'error'))",
    )
    .bind(&build.build_id)
    .bind(&build.template_id)
    .bind(build.status.as_str())
    .bind(&build.reason)
    .bind(build.created_at)
    .bind(build.updated_at)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn get_build(
    pool: &SqlitePool,
    template_id: &str,
    build_id: &str,
) -> Result<Option<BuildRecord>, StoreError> {
    let row = sqlx::query("SELECT * FROM template_builds WHERE template_id = ? AND build_id = ?")
        .bind(template_id)
        .bind(build_id)
        .fetch_optional(pool)
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let status: String = row.try_get("status")?;
    Ok(Some(BuildRecord {
        build_id: row.try_get("build_id")?,
        template_id: row.try_get("template_id")?,
        status: BuildState::parse(&status).ok_or_else(|| StoreError::Corrupt {
            what: "build status",
            id: build_id.to_string(),
            source: format!("unknown build status {status:?}").into(),
        })?,
        reason: row.try_get("reason")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    }))
}

/// Marks every waiting or building build failed with `reason`, and a template whose only build that
/// was (status still waiting/building) `error`. Returns how many builds changed.
pub async fn fail_unfinished_builds(
    pool: &SqlitePool,
    reason: &str,
    now: Millis,
) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE templates SET status = 'error', updated_at = ? WHERE status IN ('waiting', 'building') \
         AND build_id IN (SELECT build_id FROM template_builds WHERE status IN ('waiting', 'building'))",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?;
    let done = sqlx::query(
        "UPDATE template_builds SET status = 'error', reason = ?, updated_at = ? \
         WHERE status IN ('waiting', 'building')",
    )
    .bind(reason)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::super::sqlite::SqliteStore;
    use super::super::Store;
    use super::*;

    fn build(id: &str, status: BuildState) -> BuildRecord {
        BuildRecord {
            build_id: id.into(),
            template_id: "t1".into(),
            status,
            reason: None,
            created_at: 1,
            updated_at: 1,
        }
    }

    #[tokio::test]
    async fn builds_keep_their_state_and_a_restart_fails_unfinished_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_in(dir.path()).await.unwrap();
        store
            .upsert_build(&build("b1", BuildState::Waiting))
            .await
            .unwrap();
        store
            .upsert_build(&build("b2", BuildState::Ready))
            .await
            .unwrap();
        // Finished is final for a late `building`.
        store
            .upsert_build(&build("b2", BuildState::Building))
            .await
            .unwrap();
        let b2 = store.get_build("t1", "b2").await.unwrap().unwrap();
        assert_eq!(b2.status, BuildState::Ready);
        store
            .upsert_build(&build("b3", BuildState::Building))
            .await
            .unwrap();

        assert_eq!(
            store.fail_unfinished_builds("restarted", 5).await.unwrap(),
            2
        );
        for id in ["b1", "b3"] {
            let b = store.get_build("t1", id).await.unwrap().unwrap();
            assert_eq!(b.status, BuildState::Error, "{id}");
            assert_eq!(b.reason.as_deref(), Some("restarted"));
            assert_eq!((b.created_at, b.updated_at), (1, 5));
        }
        assert_eq!(
            store.get_build("t1", "b2").await.unwrap().unwrap().status,
            BuildState::Ready
        );
        assert_eq!(store.get_build("t2", "b1").await.unwrap(), None);
        assert_eq!(store.fail_unfinished_builds("again", 6).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn tags_move_and_go_with_their_template() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_in(dir.path()).await.unwrap();
        let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        store
            .assign_template_tags("t1", "b1", &tags(&["v1", "stable"]), 1)
            .await
            .unwrap();
        store
            .assign_template_tags("t1", "b2", &tags(&["stable"]), 2)
            .await
            .unwrap();
        let listed: Vec<(String, String)> = store
            .list_template_tags("t1")
            .await
            .unwrap()
            .into_iter()
            .map(|t| (t.tag, t.build_id))
            .collect();
        assert_eq!(
            listed,
            vec![("stable".into(), "b2".into()), ("v1".into(), "b1".into())]
        );
        assert_eq!(
            store
                .remove_template_tags("t1", &tags(&["v1", "nope"]))
                .await
                .unwrap(),
            1
        );
        store.delete_template("t1").await.unwrap();
        assert!(store.list_template_tags("t1").await.unwrap().is_empty());
    }
}
