//! `warren key create|list|revoke`: API keys, through the server crate's key functions on the local
//! store (see docs/cli.md for why not through the API).

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use warren_server::store::{ApiKeyRecord, Database, StoreError, TeamRecord};
use warren_server::Store;

use super::{print_json, CommandError};
use crate::args::{GlobalArgs, KeyCommand, StateArgs, TeamCommand};
use crate::exit_code;
use crate::state_dir;
use crate::table::Table;

/// Name of the database file in the state directory (the server's SQLite store).
const DATABASE_FILE: &str = "warren.db";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("no Warren state in {0} (run `warren up` first, or pass --state-dir)")]
    NoState(PathBuf),
    /// `database` shows a PostgreSQL URL without its password.
    #[error("cannot open the store ({database})")]
    Open {
        database: String,
        #[source]
        source: StoreError,
    },
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Key(#[from] warren_server::keys::KeyError),
}

impl KeyError {
    pub fn exit_code(&self) -> i32 {
        match self {
            KeyError::Key(warren_server::keys::KeyError::NotFound(_)) => exit_code::NOT_FOUND,
            KeyError::Key(warren_server::keys::KeyError::NoTeam(_)) => exit_code::NOT_FOUND,
            KeyError::Key(
                warren_server::keys::KeyError::BadName(_)
                | warren_server::keys::KeyError::BadTeamName(_)
                | warren_server::keys::KeyError::TeamExists(_),
            ) => exit_code::USAGE,
            KeyError::Usage(_) => exit_code::USAGE,
            _ => exit_code::ERROR,
        }
    }
}

/// A key as `--json` shows it: never the hash.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeyView {
    pub id: String,
    pub name: String,
    pub prefix: String,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
    #[serde(rename = "teamID")]
    pub team_id: String,
    pub admin: bool,
}

impl From<&ApiKeyRecord> for KeyView {
    fn from(record: &ApiKeyRecord) -> Self {
        KeyView {
            id: record.id.clone(),
            name: record.name.clone(),
            prefix: record.prefix.clone(),
            created_at: record.created_at,
            last_used_at: record.last_used_at,
            revoked_at: record.revoked_at,
            team_id: record.team_id.clone(),
            admin: record.admin,
        }
    }
}

/// The store `state` names (`--database-url`, else the state directory's SQLite file, which must
/// exist already when `must_exist`).
pub async fn open_store(state: &StateArgs, must_exist: bool) -> Result<Arc<dyn Store>, KeyError> {
    let database = state_dir::database(state).map_err(|e| KeyError::Usage(e.to_string()))?;
    if let Database::Sqlite(dir) = &database {
        if must_exist && !dir.join(DATABASE_FILE).exists() {
            return Err(KeyError::NoState(dir.clone()));
        }
    }
    warren_server::open_database(&database)
        .await
        .map_err(|source| KeyError::Open {
            database: database.to_string(),
            source,
        })
}

pub async fn run(global: &GlobalArgs, command: KeyCommand) -> Result<i32, CommandError> {
    match command {
        KeyCommand::Create {
            name,
            team,
            admin,
            state,
        } => {
            let store = open_store(&state, false).await?;
            let created = warren_server::keys::create_key(store.as_ref(), &name, &team, admin)
                .await
                .map_err(KeyError::from)?;
            if global.json {
                print_json(&serde_json::json!({
                    "id": created.record.id,
                    "name": created.record.name,
                    "teamID": created.record.team_id,
                    "admin": created.record.admin,
                    "key": created.secret,
                }))?;
            } else {
                eprintln!(
                    "created key {} ({}); it is shown only this once:",
                    created.record.id, created.record.name
                );
                println!("{}", created.secret);
            }
        }
        KeyCommand::List { state } => {
            let store = open_store(&state, true).await?;
            let keys = warren_server::keys::list_keys(store.as_ref())
                .await
                .map_err(KeyError::from)?;
            let views: Vec<KeyView> = keys.iter().map(KeyView::from).collect();
            if global.json {
                print_json(&views)?;
            } else {
                print!("{}", keys_table(&views).render());
            }
        }
        KeyCommand::Revoke { id, state } => {
            let store = open_store(&state, true).await?;
            let revoked = warren_server::keys::revoke_key(store.as_ref(), &id)
                .await
                .map_err(KeyError::from)?;
            if global.json {
                print_json(&serde_json::json!({ "revoked": revoked }))?;
            } else {
                println!("revoked {revoked} key(s) matching {id}");
            }
        }
    }
    Ok(exit_code::OK)
}

/// `warren team create|list`.
pub async fn run_team(global: &GlobalArgs, command: TeamCommand) -> Result<i32, CommandError> {
    match command {
        TeamCommand::Create {
            name,
            max_sandboxes,
            max_vcpus,
            max_memory_mib,
            state,
        } => {
            let store = open_store(&state, false).await?;
            let quotas = warren_server::keys::TeamQuotas {
                max_sandboxes,
                max_vcpus,
                max_memory_mib,
            };
            let team = warren_server::keys::create_team(store.as_ref(), &name, quotas)
                .await
                .map_err(KeyError::from)?;
            if global.json {
                print_json(&TeamView::from(&team))?;
            } else {
                println!("{}", team.id);
            }
        }
        TeamCommand::List { state } => {
            let store = open_store(&state, true).await?;
            let teams = warren_server::keys::list_teams(store.as_ref())
                .await
                .map_err(KeyError::from)?;
            let views: Vec<TeamView> = teams.iter().map(TeamView::from).collect();
            if global.json {
                print_json(&views)?;
            } else {
                let mut table =
                    Table::new(["id", "name", "max sandboxes", "max vcpus", "max memory"]);
                let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
                for team in &views {
                    table.row([
                        team.id.clone(),
                        team.name.clone(),
                        or_dash(team.max_sandboxes.map(|n| n.to_string())),
                        or_dash(team.max_vcpus.map(|n| n.to_string())),
                        or_dash(team.max_memory_mib.map(|n| format!("{n} MiB"))),
                    ]);
                }
                print!("{}", table.render());
            }
        }
    }
    Ok(exit_code::OK)
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TeamView {
    pub id: String,
    pub name: String,
    pub max_sandboxes: Option<u32>,
    pub max_vcpus: Option<f64>,
    pub max_memory_mib: Option<u64>,
}

impl From<&TeamRecord> for TeamView {
    fn from(team: &TeamRecord) -> Self {
        TeamView {
            id: team.id.clone(),
            name: team.name.clone(),
            max_sandboxes: team.max_sandboxes,
            max_vcpus: team.max_vcpus,
            max_memory_mib: team.max_memory_mib,
        }
    }
}

pub fn keys_table(keys: &[KeyView]) -> Table {
    let mut table = Table::new([
        "id",
        "name",
        "team",
        "admin",
        "prefix",
        "created",
        "last used",
        "revoked",
    ]);
    for key in keys {
        table.row([
            key.id.clone(),
            key.name.clone(),
            key.team_id.clone(),
            if key.admin { "yes" } else { "no" }.to_string(),
            format!("{}…", key.prefix),
            format_millis(Some(key.created_at)),
            format_millis(key.last_used_at),
            format_millis(key.revoked_at),
        ]);
    }
    table
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` UTC; `-` for none.
fn format_millis(millis: Option<i64>) -> String {
    match millis.and_then(chrono::DateTime::from_timestamp_millis) {
        Some(time) => time.format("%Y-%m-%d %H:%M:%S").to_string(),
        None => "-".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_render_as_utc_times() {
        assert_eq!(format_millis(None), "-");
        assert_eq!(format_millis(Some(0)), "1970-01-01 00:00:00");
        assert_eq!(format_millis(Some(951_782_400_000)), "2000-02-29 00:00:00");
        assert_eq!(
            format_millis(Some(1_796_216_400_123)),
            "2026-12-02 13:00:00"
        );
    }

    #[test]
    fn table_never_shows_more_than_the_prefix() {
        let view = KeyView {
            id: "key_1".into(),
            name: "ci".into(),
            prefix: "e2b_abcdef".into(),
            created_at: 0,
            last_used_at: None,
            revoked_at: None,
            team_id: "team_default".into(),
            admin: false,
        };
        let text = keys_table(&[view]).render();
        assert_eq!(
            text,
            "ID     NAME  TEAM          ADMIN  PREFIX       CREATED              LAST USED  REVOKED\n\
             key_1  ci    team_default  no     e2b_abcdef…  1970-01-01 00:00:00  -          -\n"
        );
    }

    #[tokio::test]
    async fn create_list_revoke_on_a_fresh_store() {
        let dir = std::env::temp_dir().join(format!("wt-cli-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = StateArgs {
            state_dir: Some(dir.clone()),
            database_url: None,
        };
        assert!(matches!(
            open_store(&state, true).await,
            Err(KeyError::NoState(_))
        ));
        let store = open_store(&state, false).await.expect("store");
        let created = warren_server::keys::create_key(store.as_ref(), "t", "default", false)
            .await
            .expect("create");
        let listed = warren_server::keys::list_keys(store.as_ref())
            .await
            .expect("list");
        assert_eq!(
            listed.iter().map(KeyView::from).collect::<Vec<_>>(),
            vec![KeyView::from(&created.record)]
        );
        warren_server::keys::revoke_key(store.as_ref(), &created.record.id)
            .await
            .expect("revoke");
        let again = warren_server::keys::revoke_key(store.as_ref(), &created.record.id).await;
        let err = KeyError::from(again.expect_err("already revoked"));
        assert_eq!(err.exit_code(), exit_code::NOT_FOUND);
        drop(store);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
