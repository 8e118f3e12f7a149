//! The agent's shared state: where its root is, the defaults `/init` sets, the access token,
//! and the tables of processes and watchers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::http::HeaderMap;
use base64::Engine;
use warren_proto::connect::{Code, ConnectError};

use crate::filesystem::watch::WatcherTable;
use crate::paths::{self, ResolvedPath};
use crate::process::table::ProcessTable;
use crate::reaper::Reaper;
use crate::users::{self, User};

/// The user commands and file operations default to (E2B's templates use `user`).
pub const DEFAULT_USER: &str = "user";

/// What `/init` configures.
#[derive(Debug, Clone)]
pub struct Defaults {
    pub user: String,
    pub workdir: Option<String>,
    pub env_vars: BTreeMap<String, String>,
}

pub struct Agent {
    /// `/` in a sandbox; `--root` in host mode.
    pub root: PathBuf,
    /// Whether we are PID 1 (sandbox mode).
    pub is_pid1: bool,
    pub defaults: RwLock<Defaults>,
    pub access_token: RwLock<Option<String>>,
    /// Latest `/init` timestamp applied (nanoseconds), so stale inits are ignored.
    pub last_init_nanos: RwLock<i128>,
    pub reaper: Arc<Reaper>,
    pub processes: ProcessTable,
    pub watchers: WatcherTable,
    pub cpu_sampler: crate::http_api::metrics::CpuSampler,
    /// What commands printed and when processes started and ended.
    pub logbook: crate::logbook::Logbook,
}

impl Agent {
    pub fn new(root: PathBuf, is_pid1: bool, reaper: Arc<Reaper>) -> Arc<Self> {
        Arc::new(Agent {
            root,
            is_pid1,
            defaults: RwLock::new(Defaults {
                user: DEFAULT_USER.to_string(),
                workdir: None,
                env_vars: BTreeMap::new(),
            }),
            access_token: RwLock::new(None),
            last_init_nanos: RwLock::new(i128::MIN),
            reaper,
            processes: ProcessTable::default(),
            watchers: WatcherTable::default(),
            cpu_sampler: Default::default(),
            logbook: Default::default(),
        })
    }

    pub fn defaults(&self) -> Defaults {
        self.defaults
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn token(&self) -> Option<String> {
        self.access_token
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether `headers` carry the access token (always true when none is set).
    pub fn token_matches(&self, headers: &HeaderMap) -> bool {
        match self.token() {
            None => true,
            Some(expected) => headers
                .get("x-access-token")
                .map(|v| constant_time_eq(v.as_bytes(), expected.as_bytes()))
                .unwrap_or(false),
        }
    }

    /// Looks up a user by name in the sandbox's passwd.
    pub fn user(&self, name: &str) -> Result<User, users::UserError> {
        users::lookup_user(&self.root, name)
    }

    /// The default user; a rootfs without the built-in default `user` (and no `/init` choice)
    /// falls back to `root`.
    pub fn default_user(&self) -> Result<User, users::UserError> {
        let name = self.defaults().user;
        match self.user(&name) {
            Err(users::UserError::Unknown(_)) if name == DEFAULT_USER => self.user("root"),
            other => other,
        }
    }

    /// The user an RPC acts as: `Authorization: Basic base64(name:)`, else the default user.
    pub fn rpc_user(&self, headers: &HeaderMap) -> Result<User, ConnectError> {
        let requested = basic_auth_username(headers);
        let name = requested.clone().unwrap_or_else(|| self.defaults().user);
        let found = match &requested {
            Some(n) => self.user(n),
            None => self.default_user(),
        };
        found.map_err(|e| {
            // envd's exact wording, which SDK users match on; the cause goes to the log.
            let what = if requested.is_some() {
                "invalid username"
            } else {
                "invalid default user"
            };
            tracing::info!(user = %name, error = %e, "{what}");
            ConnectError::new(Code::Unauthenticated, format!("{what}: '{name}'"))
        })
    }

    /// Resolves a client path for `user` (see `paths::resolve`).
    pub fn resolve(&self, user: &User, path: &str) -> Result<ResolvedPath, paths::PathError> {
        let defaults = self.defaults();
        paths::resolve(&self.root, &user.home, defaults.workdir.as_deref(), path)
    }
}

/// The user name from a Basic `Authorization` header (the SDK sends `base64("name:")`).
pub fn basic_auth_username(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let encoded = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let name = text.split(':').next().unwrap_or("").to_string();
    (!name.is_empty()).then_some(name)
}

pub use warren_proto::envd::signature::constant_time_eq;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_user_falls_back_to_root_only_when_user_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        let agent = Agent::new(dir.path().to_path_buf(), false, Reaper::global());
        assert_eq!(agent.rpc_user(&HeaderMap::new()).unwrap().name, "root");
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Basic dXNlcjo=".parse().unwrap()); // "user:"
        assert_eq!(
            agent.rpc_user(&headers).unwrap_err().code,
            Code::Unauthenticated
        );
        agent.defaults.write().unwrap().user = "ghost".into();
        assert!(agent.rpc_user(&HeaderMap::new()).is_err());
    }

    #[test]
    fn basic_auth_carries_the_user_name() {
        let mut headers = HeaderMap::new();
        assert_eq!(basic_auth_username(&headers), None);
        headers.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(basic_auth_username(&headers), Some("root".into()));
        headers.insert("authorization", "Basic !!!".parse().unwrap());
        assert_eq!(basic_auth_username(&headers), None);
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
