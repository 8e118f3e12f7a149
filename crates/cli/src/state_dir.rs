//! Where Warren's state lives when `--state-dir` is not given.

use std::path::PathBuf;

use warren_server::store::{Database, DatabaseUrl};

use crate::args::StateArgs;
use crate::commands::CommandError;

/// Default state directory of a root process.
pub const ROOT_STATE_DIR: &str = "/var/lib/warren";

/// `--state-dir` / `WARREN_STATE_DIR`, else `/var/lib/warren` as root, else `~/.local/share/warren`
/// (`$XDG_DATA_HOME/warren` when that is set).
pub fn resolve(args: &StateArgs) -> PathBuf {
    if let Some(dir) = &args.state_dir {
        return dir.clone();
    }
    default_for(
        nix::unistd::geteuid().is_root(),
        std::env::var_os("XDG_DATA_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

/// `--database-url` / `WARREN_DATABASE_URL`, checked (the error never repeats the URL, which may
/// hold a password).
pub fn database_url(args: &StateArgs) -> Result<Option<DatabaseUrl>, CommandError> {
    args.database_url
        .as_deref()
        .map(|raw| {
            raw.parse::<DatabaseUrl>()
                .map_err(|e| CommandError::Usage(format!("--database-url: {e}")))
        })
        .transpose()
}

/// Where the store is: the PostgreSQL database given, else SQLite in the state directory.
pub fn database(args: &StateArgs) -> Result<Database, CommandError> {
    Ok(Database::choose(
        database_url(args)?.as_ref(),
        &resolve(args),
    ))
}

fn default_for(is_root: bool, xdg_data_home: Option<PathBuf>, home: Option<PathBuf>) -> PathBuf {
    if is_root {
        return PathBuf::from(ROOT_STATE_DIR);
    }
    if let Some(data) = xdg_data_home.filter(|p| p.is_absolute()) {
        return data.join("warren");
    }
    match home {
        Some(home) => home.join(".local/share/warren"),
        None => PathBuf::from(ROOT_STATE_DIR),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_uses_var_lib() {
        assert_eq!(
            default_for(true, None, Some("/root".into())),
            PathBuf::from("/var/lib/warren")
        );
    }

    #[test]
    fn users_use_their_data_dir() {
        assert_eq!(
            default_for(false, None, Some("/home/a".into())),
            PathBuf::from("/home/a/.local/share/warren")
        );
        assert_eq!(
            default_for(false, Some("/x/data".into()), Some("/home/a".into())),
            PathBuf::from("/x/data/warren")
        );
        assert_eq!(
            default_for(false, Some("relative".into()), Some("/home/a".into())),
            PathBuf::from("/home/a/.local/share/warren")
        );
    }

    #[test]
    fn explicit_dir_wins() {
        let args = StateArgs {
            database_url: None,
            state_dir: Some("/tmp/w".into()),
        };
        assert_eq!(resolve(&args), PathBuf::from("/tmp/w"));
    }

    #[test]
    fn a_database_url_picks_postgresql_and_a_bad_one_is_refused_without_its_password() {
        let args = |url: &str| StateArgs {
            state_dir: Some("/tmp/w".into()),
            database_url: Some(url.to_string()),
        };
        let chosen = database(&args("postgres://w:pw-secret@db/warren")).unwrap();
        assert!(matches!(chosen, Database::Postgres(_)));
        assert!(!chosen.to_string().contains("pw-secret"), "{chosen}");
        let without = StateArgs {
            state_dir: Some("/tmp/w".into()),
            database_url: None,
        };
        assert_eq!(
            database(&without).unwrap(),
            Database::Sqlite("/tmp/w".into())
        );
        for bad in [
            "mysql://w:pw-secret@db/warren",
            "postgres://w:pw-secret@[db/warren",
        ] {
            let error = database(&args(bad)).unwrap_err();
            assert_eq!(error.exit_code(), crate::exit_code::USAGE);
            assert!(!error.to_string().contains("pw-secret"), "{error}");
            assert!(error.to_string().contains("--database-url"), "{error}");
        }
    }
}
