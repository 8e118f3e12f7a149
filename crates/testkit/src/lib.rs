//! warren-testkit: start a real Warren server on port 0 with temporary state directories, for tests.

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
}

/// A server on loopback with free ports, a temporary state dir and one API key. Dropping it stops
/// nothing by itself; call [`TestServer::stop`].
pub struct TestServer {
    pub server: Server,
    pub api_key: String,
    pub api_url: String,
    pub sandbox_url: String,
    /// Removed on drop.
    pub state_dir: tempfile::TempDir,
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
            state_dir,
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
