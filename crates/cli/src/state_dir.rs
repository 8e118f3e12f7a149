//! Where Warren's state lives when `--state-dir` is not given.

use std::path::PathBuf;

use crate::args::StateArgs;

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
            state_dir: Some("/tmp/w".into()),
        };
        assert_eq!(resolve(&args), PathBuf::from("/tmp/w"));
    }
}
