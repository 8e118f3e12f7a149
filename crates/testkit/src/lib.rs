//! warren-testkit: start a real Warren server on port 0 with temporary state directories, for tests.
//!
//! The server keeps its store in SQLite in the state directory, or, with
//! `WARREN_TEST_DATABASE=postgres` in the environment, in a fresh database of the test binary's
//! private PostgreSQL cluster ([`postgres`]).

pub mod postgres;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use warren_runtime::Runtime;
use warren_server::{keys, Server, ServerConfig};

#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("cannot create a temporary state directory")]
    TempDir(#[source] std::io::Error),
    #[error("server did not start")]
    Serve(#[from] warren_server::ServeError),
    #[error("cannot create an API key")]
    Key(#[from] keys::KeyError),
    #[error("WARREN_TEST_DATABASE=postgres, but this machine has no PostgreSQL")]
    NoPostgres,
    #[error("WARREN_TEST_DATABASE must be sqlite or postgres, not {0:?}")]
    UnknownDatabase(String),
}

/// A server on loopback with free ports, a temporary state dir and one API key. Dropping it stops
/// nothing by itself; call [`TestServer::stop`].
pub struct TestServer {
    pub server: Server,
    pub api_key: String,
    pub api_url: String,
    pub sandbox_url: String,
    /// Removed on drop, what the server mounted in it (volumes) detached first.
    pub state_dir: StateDir,
}

/// A test server's temporary state directory. Dropping it detaches every mount below it (the loop-
/// mounted volume images a server leaves mounted while it may still need them), deepest first, then
/// removes it: otherwise each test that made a volume left a mount and a loop device behind, and the
/// removal emptied the mounted volume instead.
pub struct StateDir(tempfile::TempDir);

impl StateDir {
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        let mut points: Vec<PathBuf> = warren_runtime::gc::mount_points(&mountinfo)
            .into_iter()
            .map(|(point, _)| point)
            .filter(|point| point.starts_with(self.0.path()))
            .collect();
        points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
        for point in points {
            if let Ok(c_point) = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()) {
                // SAFETY: a valid NUL-terminated path; MNT_DETACH only detaches the mount.
                unsafe { libc::umount2(c_point.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// Configuration for a test server: loopback, port 0 for both listeners, state in `state_dir`.
pub fn test_config(state_dir: &Path, base_rootfs: PathBuf) -> ServerConfig {
    let mut config = ServerConfig::new(state_dir.to_path_buf());
    config.api_listen = ([127, 0, 0, 1], 0).into();
    config.proxy_listen = ([127, 0, 0, 1], 0).into();
    config.base_rootfs = base_rootfs;
    config.scheduler_interval = Duration::from_millis(200);
    config
}

/// The database `WARREN_TEST_DATABASE` asks for: `postgres` gives a fresh one in the private
/// cluster; unset or `sqlite` keeps the state directory's SQLite file.
async fn test_database_url() -> Result<Option<warren_server::store::DatabaseUrl>, TestkitError> {
    match std::env::var("WARREN_TEST_DATABASE").as_deref() {
        Err(_) | Ok("") | Ok("sqlite") => Ok(None),
        Ok("postgres") => {
            let Some(url) = postgres::database().await else {
                return Err(TestkitError::NoPostgres);
            };
            Ok(Some(url.parse().map_err(|_| TestkitError::NoPostgres)?))
        }
        Ok(other) => Err(TestkitError::UnknownDatabase(other.to_string())),
    }
}

impl TestServer {
    /// Start with `runtime`; `adjust` may change the configuration first.
    pub async fn start(
        runtime: Arc<dyn Runtime>,
        base_rootfs: PathBuf,
        adjust: impl FnOnce(&mut ServerConfig),
    ) -> Result<TestServer, TestkitError> {
        let state_dir = tempfile::Builder::new()
            .prefix("wt-warren-state-")
            .tempdir()
            .map_err(TestkitError::TempDir)?;
        let mut config = test_config(state_dir.path(), base_rootfs);
        config.database_url = test_database_url().await?;
        adjust(&mut config);
        let server = Server::start(config, runtime).await?;
        let key = keys::create_key(
            server.lifecycle.store().as_ref(),
            "testkit",
            warren_server::store::DEFAULT_TEAM,
            true,
        )
        .await?;
        Ok(TestServer {
            api_url: format!("http://{}", server.api_addr),
            sandbox_url: format!("http://{}", server.proxy_addr),
            server,
            api_key: key.secret,
            state_dir: StateDir(state_dir),
        })
    }

    pub fn state_dir(&self) -> &Path {
        self.state_dir.path()
    }

    /// Environment variables that point the E2B SDK at this server.
    pub fn sdk_env(&self) -> Vec<(String, String)> {
        vec![
            ("E2B_API_URL".to_string(), self.api_url.clone()),
            ("E2B_SANDBOX_URL".to_string(), self.sandbox_url.clone()),
            ("E2B_API_KEY".to_string(), self.api_key.clone()),
        ]
    }

    /// Stop the server (sandboxes stay; kill them first) and remove the state directory.
    pub async fn stop(self) -> Result<(), TestkitError> {
        self.server.shutdown().await?;
        drop(self.state_dir);
        Ok(())
    }
}
