//! A private PostgreSQL cluster for tests, from Debian's `postgresql` package: `initdb` in a
//! temporary directory (as `nobody` when the tests run as root, since PostgreSQL refuses root),
//! listening only on a unix socket inside that directory, with fsync off. One cluster per test
//! binary, started by the first test that asks; each test gets a database of its own, copied from
//! a template the store has already migrated.
//!
//! Teardown: the cluster runs under a small shell that waits for its stdin to close. The pipe's
//! writing end lives in this process only, so when the test binary exits (however it exits) the
//! shell stops PostgreSQL and removes the directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::Connection;
use warren_server::store::{DatabaseUrl, PgStore};

/// `nobody`/`nogroup` on Debian: the cluster's owner when the tests run as root.
const NOBODY: u32 = 65534;
/// Bound on the cluster's start (not a speed assertion: a loaded 2-core machine must pass).
const START_WAIT: Duration = Duration::from_secs(120);
/// The migrated database each test's database is copied from.
const TEMPLATE_DB: &str = "warren_template";

#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// Not an error of the code under test: the machine lacks PostgreSQL.
    #[error("PostgreSQL binaries not found ({0}); install Debian's postgresql package")]
    Missing(String),
    #[error("cannot start the test cluster: {0}")]
    Start(String),
    #[error("test cluster: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("cannot migrate the template database: {0}")]
    Store(#[from] warren_server::store::StoreError),
}

/// A running private cluster.
pub struct Cluster {
    socket_dir: PathBuf,
    bin: PathBuf,
    /// Its stdin is the watchdog's pipe (see the module documentation).
    _watchdog: Mutex<Child>,
    next: AtomicU32,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
static SKIP_SAID: OnceLock<()> = OnceLock::new();
static TEMPLATE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
static CREATE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The directory holding `initdb` and `postgres`: `WARREN_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin`.
pub fn binaries() -> Result<PathBuf, PgError> {
    if let Some(dir) = std::env::var_os("WARREN_PG_BIN") {
        let dir = PathBuf::from(dir);
        return if dir.join("initdb").is_file() {
            Ok(dir)
        } else {
            Err(PgError::Missing(format!("no initdb in {}", dir.display())))
        };
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| PgError::Missing("no /usr/lib/postgresql".into()))?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| PgError::Missing("no /usr/lib/postgresql/*/bin/initdb".into()))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `command` as the cluster's owner.
fn as_owner(mut command: Command) -> Command {
    if is_root() {
        use std::os::unix::process::CommandExt;
        command.uid(NOBODY).gid(NOBODY);
    }
    command
}

impl Cluster {
    fn start() -> Result<Cluster, PgError> {
        let bin = binaries()?;
        let dir = tempfile::Builder::new()
            .prefix("wt-pg-")
            .tempdir()
            .map_err(|e| PgError::Start(format!("temp dir: {e}")))?
            // The watchdog removes it.
            .keep();
        let socket_dir = dir.join("sock");
        std::fs::create_dir(&socket_dir).map_err(|e| PgError::Start(format!("socket dir: {e}")))?;
        if is_root() {
            for path in [&dir, &socket_dir] {
                std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY))
                    .map_err(|e| PgError::Start(format!("chown {}: {e}", path.display())))?;
            }
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(dir.join("data"))
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--no-locale",
                "-E",
                "UTF8",
            ])
            // Somewhere the owner may enter (PostgreSQL's programs look at their working directory).
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let out = as_owner(initdb)
            .output()
            .map_err(|e| PgError::Start(format!("initdb: {e}")))?;
        if !out.status.success() {
            return Err(PgError::Start(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        // Unix socket only, no TCP; durability off (the data dies with the test run anyway).
        let script = r#"
            "$1/postgres" -D "$2/data" -k "$2/sock" -c listen_addresses= -c fsync=off \
                -c synchronous_commit=off -c full_page_writes=off -c max_connections=400 \
                -c shared_buffers=64MB >"$2/postgres.log" 2>&1 &
            pg=$!
            read _ignored
            kill -INT "$pg"
            wait "$pg"
            rm -rf "$2"
        "#;
        let mut shell = Command::new("/bin/sh");
        shell
            .arg("-c")
            .arg(script)
            .arg("warren-test-postgres")
            .arg(&bin)
            .arg(&dir)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let watchdog = as_owner(shell)
            .spawn()
            .map_err(|e| PgError::Start(format!("postgres: {e}")))?;
        let cluster = Cluster {
            socket_dir,
            bin,
            _watchdog: Mutex::new(watchdog),
            next: AtomicU32::new(0),
        };
        cluster.wait_ready(&dir)?;
        Ok(cluster)
    }

    /// Waits until the server accepts connections (`pg_isready`), or the bound passes.
    fn wait_ready(&self, dir: &Path) -> Result<(), PgError> {
        let deadline = Instant::now() + START_WAIT;
        let isready = self.bin.join("pg_isready");
        loop {
            let ready = Command::new(&isready)
                .arg("-q")
                .arg("-h")
                .arg(&self.socket_dir)
                .args(["-U", "postgres", "-t", "1"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("postgres.log")).unwrap_or_default();
                return Err(PgError::Start(format!("not ready; its log:\n{log}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A URL of database `name` in this cluster (user `postgres`, through the socket).
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgres://postgres@localhost/{name}?host={}",
            self.socket_dir.display()
        )
    }

    async fn admin(&self) -> Result<sqlx::PgConnection, PgError> {
        Ok(sqlx::PgConnection::connect(&self.url("postgres")).await?)
    }

    /// A new, empty database (no migrations run).
    pub async fn empty_database(&self) -> Result<String, PgError> {
        let name = format!("t{}", self.next.fetch_add(1, Ordering::Relaxed));
        let mut admin = self.admin().await?;
        sqlx::query(&format!("CREATE DATABASE {name} TEMPLATE template0"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        Ok(self.url(&name))
    }

    /// A new database with the store's schema, copied from the migrated template.
    pub async fn database(&self) -> Result<String, PgError> {
        TEMPLATE
            .get_or_try_init(|| async {
                let mut admin = self.admin().await?;
                sqlx::query(&format!("CREATE DATABASE {TEMPLATE_DB} TEMPLATE template0"))
                    .execute(&mut admin)
                    .await?;
                admin.close().await?;
                let url: DatabaseUrl = self
                    .url(TEMPLATE_DB)
                    .parse()
                    .map_err(|e| PgError::Start(format!("{e}")))?;
                let store = PgStore::open(&url).await?;
                // A template may have no open connections while it is copied.
                store.pool().close().await;
                Ok::<(), PgError>(())
            })
            .await?;
        let name = format!("t{}", self.next.fetch_add(1, Ordering::Relaxed));
        // Copies of one template are made one at a time.
        let _one = CREATE.lock().await;
        let mut admin = self.admin().await?;
        sqlx::query(&format!("CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        Ok(self.url(&name))
    }
}

/// The test binary's cluster, started on first use; `None` (after printing one `SKIP:` line) when
/// the machine has no PostgreSQL. Any other failure to start is a test failure (a panic).
pub fn cluster() -> Option<&'static Cluster> {
    let cluster = CLUSTER.get_or_init(|| match Cluster::start() {
        Ok(cluster) => Ok(cluster),
        Err(PgError::Missing(why)) => Err(why),
        Err(other) => panic!("{other}"),
    });
    match cluster {
        Ok(cluster) => Some(cluster),
        Err(why) => {
            SKIP_SAID.get_or_init(|| {
                println!("SKIP: PostgreSQL tests: binaries not found ({why}); install postgresql")
            });
            None
        }
    }
}

/// A fresh migrated database's URL in the binary's cluster; `None` when PostgreSQL is missing.
pub async fn database() -> Option<String> {
    let cluster = cluster()?;
    Some(
        cluster
            .database()
            .await
            .unwrap_or_else(|e| panic!("cannot make a test database: {e}")),
    )
}
