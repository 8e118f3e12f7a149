//! warren-server: the E2B-compatible control plane of one node — REST API, sandbox proxy, lifecycle
//! (state machine, timeouts, admission, reconciliation), templates, store and metrics.
//!
//! [`serve`] runs it until SIGINT/SIGTERM; [`Server::start`] starts it with a given runtime and hands back
//! its addresses (tests, embedding).

pub mod api;
pub mod config;
pub mod dashboard;
pub mod keys;
pub mod lifecycle;
pub mod listener;
pub mod metrics;
pub mod node;
pub mod proxy;
pub mod runtime_host;
pub mod secrets;
pub mod state_lock;
pub mod store;
pub mod templates;
pub mod tls;
pub mod volumes;
pub mod webhooks;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use warren_runtime::Runtime;

pub use config::{DefaultResources, Limits, ServerConfig, SnapshotRetention};
pub use lifecycle::reconcile::ReconcileReport;
pub use store::{PgStore, SqliteStore, Store};

use lifecycle::Lifecycle;
use metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the store")]
    Store(#[from] store::StoreError),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("reconciliation failed")]
    Reconcile(#[source] lifecycle::LifecycleError),
    #[error("cannot fail the template builds an earlier run left unfinished")]
    Builds(#[source] store::StoreError),
    #[error("cannot start the sandbox runtime")]
    Runtime(#[source] warren_runtime::ConfigError),
    #[error("cannot create state directory {path}")]
    StateDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("API server failed")]
    Http(#[source] std::io::Error),
    #[error("cannot set up TLS")]
    Tls(#[source] tls::TlsError),
    #[error(transparent)]
    Locked(state_lock::StateLockError),
    #[error("cannot use the node: {0}")]
    Node(String),
}

/// Open the store in `state_dir` (for the CLI's key commands).
pub async fn open_store(state_dir: &std::path::Path) -> Result<Arc<dyn Store>, store::StoreError> {
    Ok(Arc::new(SqliteStore::open_in(state_dir).await?))
}

/// Open the store `database` names (for the CLI's key commands).
pub async fn open_database(
    database: &store::Database,
) -> Result<Arc<dyn Store>, store::StoreError> {
    store::open(database).await
}

/// How long a stop waits for in-flight API requests.
const API_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A running server.
pub struct Server {
    pub api_addr: SocketAddr,
    pub proxy_addr: SocketAddr,
    pub lifecycle: Arc<Lifecycle>,
    pub reconcile: ReconcileReport,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Server {
    /// Open the store, ensure the base template, reconcile with `runtime`, bind both listeners and start
    /// serving.
    pub async fn start(
        config: ServerConfig,
        runtime: Arc<dyn Runtime>,
    ) -> Result<Server, ServeError> {
        for dir in [
            config.sandboxes_dir(),
            config.templates_dir(),
            config.snapshots_dir(),
        ] {
            std::fs::create_dir_all(&dir).map_err(|source| ServeError::StateDir {
                path: dir.clone(),
                source,
            })?;
        }
        let database = store::Database::choose(config.database_url.as_ref(), &config.state_dir);
        tracing::info!(%database, "opening the store");
        let store: Arc<dyn Store> = store::open(&database).await?;
        templates::ensure_base_template(
            store.as_ref(),
            &config.base_rootfs,
            &config.default_resources,
        )
        .await?;
        let metrics = Arc::new(Metrics::new());
        let lifecycle = Arc::new(Lifecycle::new(
            store,
            Arc::clone(&runtime),
            config.clone(),
            Arc::clone(&metrics),
        ));
        // Servers sharing the store and the nodes (cluster mode): a server that finds others alive
        // joins them and leaves the fleet as it is; the one that finds none (or a store nobody
        // shares) and leads reconciles the whole fleet with the runtime, as one server always has.
        let others = if lifecycle.coordinated() {
            lifecycle
                .other_live_servers()
                .await
                .map_err(ServeError::Reconcile)?
        } else {
            Vec::new()
        };
        let address = config.api_listen.to_string();
        lifecycle::servers::beat(&lifecycle, &address)
            .await
            .map_err(ServeError::Reconcile)?;
        let alone = !lifecycle.coordinated() || (others.is_empty() && lifecycle.leads());
        let report = if alone {
            lifecycle::reconcile::reconcile(&lifecycle)
                .await
                .map_err(ServeError::Reconcile)?
        } else {
            tracing::info!(
                others = ?others.iter().map(|s| &s.id).collect::<Vec<_>>(),
                server = lifecycle.store().server_id(),
                "joining the servers that share this store"
            );
            lifecycle::reconcile::join(&lifecycle)
                .await
                .map_err(ServeError::Reconcile)?
        };
        let live_servers: Vec<String> = if alone {
            Vec::new()
        } else {
            others
                .iter()
                .map(|server| server.id.clone())
                .chain([lifecycle.store().server_id().to_string()])
                .collect()
        };

        let api_listener = TcpListener::bind(config.api_listen)
            .await
            .map_err(|source| ServeError::Listen {
                addr: config.api_listen,
                source,
            })?;
        let proxy_listener = TcpListener::bind(config.proxy_listen)
            .await
            .map_err(|source| ServeError::Listen {
                addr: config.proxy_listen,
                source,
            })?;
        let api_addr = api_listener.local_addr().map_err(ServeError::Http)?;
        let proxy_addr = proxy_listener.local_addr().map_err(ServeError::Http)?;
        let tls = match &config.tls {
            Some(source) => Some(
                tls::acceptor(
                    source,
                    &config.state_dir,
                    &config.domain,
                    &[api_addr, proxy_addr],
                )
                .map_err(ServeError::Tls)?,
            ),
            None => None,
        };

        let (shutdown, shutdown_rx) = watch::channel(false);
        // Builds of an earlier run that never finished cannot resume: fail them with a reason.
        let failed = lifecycle
            .store()
            .fail_unfinished_builds(
                &live_servers,
                "the server stopped before this build finished",
                lifecycle::now_millis(),
            )
            .await
            .map_err(ServeError::Builds)?;
        if failed > 0 {
            tracing::warn!(
                failed,
                "failed template builds an earlier run left unfinished"
            );
        }
        // Their half-written layers went with the killed process, never renamed into the cache.
        // (Not while other servers share the state directory: the layers they are writing look
        // the same.)
        let layers = templates::builder::layers::LayerStore::new(&config.state_dir);
        match if alone {
            layers.remove_unfinished()
        } else {
            Ok(0)
        } {
            Ok(0) => {}
            Ok(removed) => {
                tracing::info!(removed, "removed layers an earlier run left half-written")
            }
            Err(error) => {
                tracing::warn!(%error, "cannot remove layers an earlier run left half-written")
            }
        }
        let build_service = Arc::new(templates::builder::service::BuildService::new(
            Arc::clone(&runtime),
            Arc::new(templates::builder::agent_commands::EnvdCommands::new()),
            templates::builder::runner::BuildSettings {
                build_timeout: config.build_timeout,
                step_resources: warren_runtime::Resources {
                    disk_mib: config.build_disk_mib,
                    ..templates::builder::runner::BuildSettings::new(&config.state_dir)
                        .step_resources
                },
                admission: Some(templates::builder::runner::Admission(Arc::new(
                    LifecycleAdmission {
                        lifecycle: Arc::clone(&lifecycle),
                        handle: tokio::runtime::Handle::current(),
                    },
                ))),
                ..templates::builder::runner::BuildSettings::new(&config.state_dir)
            },
            Some(config.base_rootfs.clone()),
        ));
        let in_use = Arc::clone(&build_service);
        lifecycle.track_build_sandboxes(Arc::new(move || in_use.active_sandboxes()));
        let builds = Arc::new(templates::builds::TemplateBuilds::new(
            build_service,
            Arc::clone(lifecycle.store()),
            config.default_resources.clone(),
            config.state_dir.clone(),
        ));
        let code_interpreter = config.code_interpreter_rootfs.clone().map(|rootfs| {
            let builds = Arc::clone(&builds);
            let context = config
                .state_dir
                .join("builtin-templates")
                .join("code-interpreter");
            tokio::spawn(async move {
                match templates::code_interpreter::ensure_template(&builds, &rootfs, &context).await
                {
                    Ok(Some(build_id)) => {
                        tracing::info!(%build_id, "building the code-interpreter template")
                    }
                    Ok(None) => tracing::info!("code-interpreter template ready (cached build)"),
                    Err(error) => tracing::warn!(%error, "code-interpreter template not offered"),
                }
            })
        });
        let app = api::router(api::AppState {
            lifecycle: Arc::clone(&lifecycle),
            metrics: Arc::clone(&metrics),
            builds,
            dashboard: Arc::new(dashboard::Sessions::new(tls.is_some())),
            shutdown: shutdown_rx.clone(),
        });
        // With TLS the proxy's port also answers as `api.<domain>`: E2B_DOMAIN mode, where the SDK
        // reaches the API and the sandboxes on one HTTPS port.
        let api_on_proxy = tls
            .as_ref()
            .map(|_| proxy::ApiOnHost::new(format!("api.{}", config.domain), app.clone()));
        let api_service = hyper_util::service::TowerToHyperService::new(app);
        let api_task = tokio::spawn(listener::serve(
            api_listener,
            tls.clone(),
            move |request| {
                let response = hyper::service::Service::call(&api_service, request);
                async move {
                    match response.await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    }
                }
            },
            shutdown_rx.clone(),
            Some(API_DRAIN_TIMEOUT),
            "api",
        ));
        let proxy = Arc::new(proxy::Proxy::new(
            Arc::clone(&lifecycle),
            Arc::clone(&metrics),
        ));
        let proxy_task =
            tokio::spawn(proxy.run(proxy_listener, tls, api_on_proxy, shutdown_rx.clone()));
        let monitor_task = tokio::spawn(lifecycle::monitor::run(
            Arc::clone(&lifecycle),
            shutdown_rx.clone(),
        ));
        let webhooks_task =
            tokio::spawn(webhooks::run(Arc::clone(&lifecycle), shutdown_rx.clone()));
        let pools_task = tokio::spawn(lifecycle::pool::run(
            Arc::clone(&lifecycle),
            shutdown_rx.clone(),
        ));
        let servers_task = tokio::spawn(lifecycle::servers::run(
            Arc::clone(&lifecycle),
            address,
            shutdown_rx.clone(),
        ));
        let scheduler_task = tokio::spawn(lifecycle::scheduler::run(
            Arc::clone(&lifecycle),
            config.scheduler_interval,
            shutdown_rx,
        ));
        tracing::info!(%api_addr, %proxy_addr, checkpoint = lifecycle.capabilities().checkpoint, "warren server started");
        Ok(Server {
            api_addr,
            proxy_addr,
            lifecycle,
            reconcile: report,
            shutdown,
            tasks: [
                api_task,
                proxy_task,
                scheduler_task,
                monitor_task,
                webhooks_task,
                pools_task,
                servers_task,
            ]
            .into_iter()
            .chain(code_interpreter)
            .collect(),
        })
    }

    /// Stop accepting, finish in-flight API requests, stop the scheduler. Sandboxes keep running; the next
    /// start adopts them. Warm-pool members, which no create has taken, are destroyed.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        Ok(())
    }
}

/// The reconciler's period with nodes: a sandbox of a node that went down is recorded lost this
/// long after the node is (one `list` per node per pass).
pub const CLUSTER_RECONCILE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Run the server with this host's Linux runtime until SIGINT or SIGTERM.
pub async fn serve(mut config: ServerConfig) -> Result<(), ServeError> {
    // Servers on PostgreSQL with nodes share the state directory (the nodes' checkpoints and
    // templates live there) and coordinate through the database instead.
    let _lock = if config.nodes.is_empty() || config.database_url.is_none() {
        Some(state_lock::StateLock::acquire(&config.state_dir).map_err(ServeError::Locked)?)
    } else {
        None
    };
    let runtime = if config.nodes.is_empty() {
        runtime_host::linux_runtime(&config).map_err(ServeError::Runtime)?
    } else {
        // The nodes read and write the server's templates and snapshots, and the base template's
        // root filesystem, at the paths the server names.
        let needs: Vec<std::path::PathBuf> = [&config.state_dir, &config.base_rootfs]
            .into_iter()
            .chain(config.code_interpreter_rootfs.as_ref())
            .cloned()
            .collect();
        let targets = config.nodes.clone();
        let nodes = tokio::task::spawn_blocking(move || {
            let needs: Vec<&std::path::Path> = needs.iter().map(|p| p.as_path()).collect();
            targets
                .iter()
                .map(|target| {
                    let node = node::remote::RemoteRuntime::connect(target, &needs)
                        .map_err(|error| error.to_string())?;
                    // The proxy and the agent's /init connect to the sandboxes' addresses.
                    if let Some(route) = node.route_to_sandboxes()? {
                        tracing::info!(node = node.url(), %route, "routing to the node's sandboxes");
                    }
                    Ok(node)
                })
                .collect::<Result<Vec<_>, String>>()
        })
        .await
        .map_err(|join| ServeError::Node(join.to_string()))?
        .map_err(ServeError::Node)?;
        // A node found down loses its sandboxes at the reconciler's next pass: keep that soon.
        config.reconcile_interval = config.reconcile_interval.min(CLUSTER_RECONCILE_INTERVAL);
        Arc::new(node::cluster::ClusterRuntime::new(nodes).map_err(ServeError::Node)?)
            as Arc<dyn Runtime>
    };
    let server = Server::start(config, runtime).await?;
    wait_for_signal().await;
    tracing::info!("shutting down");
    server.shutdown().await
}

pub(crate) async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Template builds' sandboxes are admitted by the lifecycle like every other sandbox (the build
/// threads are plain threads, so they wait on the server's runtime for the answer).
struct LifecycleAdmission {
    lifecycle: Arc<lifecycle::Lifecycle>,
    handle: tokio::runtime::Handle,
}

impl templates::builder::runner::BuildAdmission for LifecycleAdmission {
    fn admit(
        &self,
        template_id: &str,
        id: &str,
        resources: &warren_runtime::Resources,
    ) -> Result<(), String> {
        let request = lifecycle::admission::Request {
            vcpus: resources.vcpus,
            memory_mib: resources.memory_mib,
            max_pids: resources.max_pids,
            disk_mib: resources.disk_mib,
        };
        self.handle.block_on(async {
            let team = self
                .lifecycle
                .store()
                .get_template(template_id)
                .await
                .map_err(|e| e.to_string())?
                .map(|template| template.team_id);
            self.lifecycle
                .admit_build_sandbox(id, team.as_deref(), request)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn started(&self, template_id: &str, build_id: &str, id: &str, step: &str) {
        let recorded = self.handle.block_on(self.lifecycle.build_sandbox_started(
            id,
            template_id,
            build_id,
            step,
        ));
        if let Err(e) = recorded {
            tracing::warn!(sandbox = %id, error = %e, "recording a build sandbox's start");
        }
    }

    fn release(&self, id: &str, how: &str) {
        if let Err(e) = self
            .handle
            .block_on(self.lifecycle.release_build_sandbox(id, how))
        {
            tracing::warn!(sandbox = %id, error = %e, "recording a build sandbox's end");
        }
    }
}
