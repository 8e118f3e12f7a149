//! The store's test suite, run on both back ends: every case in `store/cases.rs` runs once on
//! SQLite (a file in a temp dir) and once on PostgreSQL (a fresh database in the test binary's
//! private cluster, see `warren_testkit::postgres`), as `sqlite::<case>` and `postgres::<case>`.
//! Without PostgreSQL binaries the `postgres::` cases print one `SKIP:` line and pass. Below them,
//! what only PostgreSQL has: concurrent migrations, connection errors that must not show a
//! password.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

#[path = "store/cases.rs"]
mod cases;

use std::sync::Arc;

use warren_server::store::{self, Database, DatabaseUrl, PgStore, SqliteStore, Store};

/// A store and what keeps it alive (its temp dir).
struct Backend {
    store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite() -> Backend {
    let dir = tempfile::Builder::new()
        .prefix("wt-store-")
        .tempdir()
        .unwrap();
    Backend {
        store: Arc::new(SqliteStore::open_in(dir.path()).await.unwrap()),
        _dir: Some(dir),
    }
}

async fn postgres() -> Option<Backend> {
    let url: DatabaseUrl = warren_testkit::postgres::database().await?.parse().unwrap();
    Some(Backend {
        store: Arc::new(PgStore::open(&url).await.unwrap()),
        _dir: None,
    })
}

/// Runs each named case of `cases` on both back ends.
macro_rules! on_both_back_ends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    let backend = super::sqlite().await;
                    super::cases::$case(backend.store.as_ref()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let Some(backend) = super::postgres().await else {
                        return;
                    };
                    super::cases::$case(backend.store.as_ref()).await;
                }
            )*
        }
    };
}

on_both_back_ends!(
    transitions_are_compare_and_set_and_leave_events,
    metric_samples_answer_ranges_and_latest_and_are_pruned_by_age,
    old_events_are_pruned_and_their_numbers_never_come_back,
    sandbox_logs_page_both_ways_filter_and_keep_a_bound_per_sandbox,
    a_sandboxs_own_policies_survive_the_store,
    lists_filter_by_metadata_and_page,
    teams_scope_keys_and_sandbox_lists,
    keys_are_found_by_hash_until_revoked,
    templates_are_found_by_alias,
    volume_names_are_unique_per_team_and_rows_round_trip,
    a_volume_a_live_sandbox_mounts_is_not_deleted,
    builds_keep_their_state_and_a_restart_fails_unfinished_ones,
    tags_move_and_go_with_their_template,
    racing_transitions_let_exactly_one_win,
    racing_idempotency_claims_give_the_key_once,
    lifecycle_events_name_what_e2b_reports,
    snapshots_page_newest_first_and_names_find_the_newest,
    webhooks_round_trip_and_deliveries_only_move_forward,
    workspaces_keep_the_current_sandbox_and_every_move,
    secrets_are_unique_per_team_and_updated_by_version,
    long_lists_page_in_order_both_ways,
);

/// Two servers on one store: the SQLite file opened twice, the PostgreSQL database twice.
#[tokio::test]
async fn sqlite_servers_share_a_store_by_lease_and_owner() {
    let dir = tempfile::tempdir().unwrap();
    let a = SqliteStore::open_in(dir.path()).await.unwrap();
    let b = SqliteStore::open_in(dir.path()).await.unwrap();
    cases::servers_share_a_store_by_lease_and_owner(&a, &b).await;
    assert!(!a.shared());
    // One server per SQLite file: it always leads.
    assert!(a.lead().await.unwrap() && b.lead().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_servers_share_a_store_by_lease_and_owner() {
    let Some(url) = warren_testkit::postgres::database().await else {
        return;
    };
    let url: DatabaseUrl = url.parse().unwrap();
    let a = PgStore::open(&url).await.unwrap();
    let b = PgStore::open(&url).await.unwrap();
    cases::servers_share_a_store_by_lease_and_owner(&a, &b).await;
    assert!(a.shared());
}

/// One server leads at a time; the lead passes on when the leader's connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_postgres_server_leads_and_the_lead_passes_when_it_goes() {
    let Some(url) = warren_testkit::postgres::database().await else {
        return;
    };
    let url: DatabaseUrl = url.parse().unwrap();
    let a = PgStore::open(&url).await.unwrap();
    let b = PgStore::open(&url).await.unwrap();
    assert!(a.lead().await.unwrap());
    assert!(!b.lead().await.unwrap(), "two leaders");
    assert!(a.lead().await.unwrap(), "the leader keeps the lead");
    assert!(!b.lead().await.unwrap());
    drop(a);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !b.lead().await.unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "the lead never passed on after the leader went"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Servers starting together on an empty database: the migrator's lock lets one migrate and the
/// others find the schema done; all of them work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_starting_together_migrate_an_empty_database_once() {
    let Some(cluster) = warren_testkit::postgres::cluster() else {
        return;
    };
    let url: DatabaseUrl = cluster.empty_database().await.unwrap().parse().unwrap();
    let opens = (0..4).map(|_| PgStore::open(&url));
    let stores = futures_util::future::join_all(opens).await;
    for store in stores {
        let store = store.unwrap();
        let team = store.get_team("default").await.unwrap();
        assert_eq!(team.unwrap().id, store::DEFAULT_TEAM);
    }
    // And a restart finds every migration applied with the checksum it has now.
    PgStore::open(&url).await.unwrap();
}

/// The rows PostgreSQL holds are what SQLite would hold: booleans as 0/1, JSON as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rows_hold_the_values_sqlite_would() {
    let Some(url) = warren_testkit::postgres::database().await else {
        return;
    };
    let store = PgStore::open(&url.parse().unwrap()).await.unwrap();
    let mut record = cases::sandbox("raw", 5);
    record.auto_pause = true;
    record.allow_internet = Some(false);
    store.insert_sandbox(&record).await.unwrap();
    let (auto_pause, allow_internet, metadata): (i64, Option<i64>, String) = sqlx::query_as(
        "SELECT auto_pause, allow_internet, metadata FROM sandboxes WHERE id = 'raw'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!((auto_pause, allow_internet), (1, Some(0)));
    let parsed: serde_json::Value = serde_json::from_str(&metadata).unwrap();
    assert_eq!(parsed["k"], "v w");
    assert_eq!(store.get_sandbox("raw").await.unwrap(), Some(record));
}

/// A database that cannot be reached: the error names it, but never with its password.
#[tokio::test]
async fn connection_errors_never_show_the_password() {
    let dir = tempfile::tempdir().unwrap();
    for raw in [
        format!(
            "postgres://warren:hunter2-in-url@localhost/db?host={}",
            dir.path().display()
        ),
        format!(
            "postgresql://warren@localhost/db?host={}&password=hunter2-in-query",
            dir.path().display()
        ),
    ] {
        let url: DatabaseUrl = raw.parse().unwrap();
        assert!(!format!("{url} {url:?}").contains("hunter2"), "{url}");
        assert_eq!(url.expose(), raw);
        let error = match store::open(&Database::Postgres(url.clone())).await {
            Ok(_) => panic!("no server listens in {}", dir.path().display()),
            Err(error) => error,
        };
        let mut chain = format!("{error:?}");
        let mut source: Option<&dyn std::error::Error> = Some(&error);
        while let Some(e) = source {
            chain.push_str(&format!(" / {e}"));
            source = e.source();
        }
        assert!(chain.contains("localhost/db"), "{chain}");
        assert!(!chain.contains("hunter2"), "{chain}");
    }
    let not_postgres = "mysql://root:hunter2@db/x"
        .parse::<DatabaseUrl>()
        .unwrap_err();
    assert!(!not_postgres.to_string().contains("hunter2"));
    let garbage = "postgres://user:hunter2@[bad"
        .parse::<DatabaseUrl>()
        .unwrap_err();
    assert!(!garbage.to_string().contains("hunter2"));
}
