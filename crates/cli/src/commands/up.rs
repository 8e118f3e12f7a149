//! `warren up`: makes sure an API key exists, prints the `export` lines a client needs, then runs the
//! server (REST API + proxy + lifecycle) in the foreground until SIGINT/SIGTERM.

use std::io::IsTerminal;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use warren_server::tls::{LocalCaFiles, TlsSource};
use warren_server::ServerConfig;

use super::key::{self, KeyError};
use super::CommandError;
use crate::args::{GlobalArgs, UpArgs};
use crate::exit_code;
use crate::state_dir;

/// Name of the key `warren up` creates when the store has none.
const FIRST_KEY_NAME: &str = "default";

#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("cannot prepare the first API key")]
    FirstKey(#[source] KeyError),
    #[error("cannot make the local TLS CA")]
    LocalCa(#[source] warren_server::tls::TlsError),
    #[error("the server stopped with an error")]
    Serve(#[source] warren_server::ServeError),
}

pub async fn run(_global: &GlobalArgs, args: UpArgs) -> Result<i32, CommandError> {
    init_logging();
    let api_listen = parse_listen("--listen", &args.listen)?;
    let proxy_listen = parse_listen("--proxy-listen", &args.proxy_listen)?;
    let state_dir = state_dir::resolve(&args.state);
    let mut config = server_config(state_dir.clone(), api_listen, proxy_listen, &args);
    config.database_url = state_dir::database_url(&args.state)?;
    config.egress_resolvers = args
        .runtime
        .egress_resolvers
        .iter()
        .map(|raw| parse_resolver(raw))
        .collect::<Result<_, _>>()?;

    if let Some(token_file) = &args.node_token_file {
        let token = warren_server::node::read_token(token_file).map_err(|e| {
            CommandError::Usage(format!("--node-token-file {}: {e}", token_file.display()))
        })?;
        config.nodes = args
            .node
            .iter()
            .map(|url| warren_server::node::remote::NodeTarget {
                url: url.clone(),
                token: token.clone(),
                ca_file: args.node_ca_file.clone(),
            })
            .collect();
    }
    config.tls = tls_source(&args);
    let local_ca = match config.tls {
        Some(TlsSource::LocalCa) => {
            Some(warren_server::tls::ensure_local_ca(&state_dir).map_err(UpError::LocalCa)?)
        }
        _ => None,
    };

    let first_key = ensure_first_key(&args.state)
        .await
        .map_err(UpError::FirstKey)?;
    let scheme = match config.tls {
        Some(_) => Scheme::Https,
        None => Scheme::Http,
    };
    let mode = match (&config.tls, &args.domain) {
        (Some(_), Some(domain)) => Exports::Domain {
            domain: domain.clone(),
            proxy_port: proxy_listen.port(),
        },
        _ => Exports::Urls {
            api: api_listen,
            proxy: proxy_listen,
            scheme,
        },
    };
    print!("{}", export_lines(&mode, first_key.as_deref()));
    if let Some(ca) = &local_ca {
        print!("{}", trust_lines(ca));
    }
    tracing::info!(
        state_dir = %state_dir.display(),
        database = %state_dir::database(&args.state)?,
        "starting warren"
    );

    warren_server::serve(config).await.map_err(UpError::Serve)?;
    Ok(exit_code::OK)
}

fn server_config(
    state_dir: PathBuf,
    api_listen: SocketAddr,
    proxy_listen: SocketAddr,
    args: &UpArgs,
) -> ServerConfig {
    let mut config = ServerConfig::new(state_dir);
    config.api_listen = api_listen;
    config.proxy_listen = proxy_listen;
    config.agent_binary = args.runtime.agent.clone();
    if let Some(rootfs) = &args.base_rootfs {
        config.base_rootfs = rootfs.clone();
    }
    config.code_interpreter_rootfs = (!args.no_code_interpreter).then(|| {
        args.code_interpreter_rootfs.clone().unwrap_or_else(|| {
            PathBuf::from(warren_server::templates::code_interpreter::DEFAULT_ROOTFS)
        })
    });
    if let Some(domain) = &args.domain {
        config.domain = domain.clone();
    }
    if let Some(max) = args.max_sandboxes {
        config.limits.max_sandboxes = max;
    }
    if let Some(max) = args.max_total_vcpus {
        config.limits.max_total_vcpus = max;
    }
    if let Some(max) = args.max_total_memory_mib {
        config.limits.max_total_memory_mib = max;
    }
    if let Some(mib) = args.volume_size_mib {
        config.limits.volume_size_mib = mib;
    }
    if let Some(slots) = args.setup_concurrency {
        config.limits.setup_concurrency = slots;
    }
    if let Some(max) = args.sandbox_max_pids {
        config.default_resources.max_pids = max;
    }
    if let Some(mib) = args.sandbox_disk_mib {
        config.default_resources.disk_mib = mib;
    }
    if let Some(ratio) = args.disk_overcommit {
        config.limits.disk_overcommit = ratio;
    }
    config.expedite_rcu = !args.runtime.keep_rcu_normal;
    config.no_new_privs = args.runtime.no_new_privs;
    config.lazy_restore = !args.runtime.no_lazy_restore;
    config.standby_supervisors = usize::from(args.runtime.standby_supervisors);
    config.egress_upstream_ca = args.runtime.egress_upstream_ca.clone();
    config.secrets_key_file = args.secrets_key_file.clone();
    config.warm_pools = args.warm_pool.clone();
    config.build_timeout = std::time::Duration::from_secs(args.build_timeout_secs.max(1));
    config.build_disk_mib = args.build_disk_mib.max(64);
    config.webhook_retry_interval = std::time::Duration::from_secs(args.webhook_retry_secs);
    config.monitor = warren_server::config::MonitorConfig {
        interval: std::time::Duration::from_secs(args.metrics_interval_secs.max(1)),
        retention: std::time::Duration::from_secs(args.metrics_retention_secs.max(1)),
        log_retention: std::time::Duration::from_secs(args.log_retention_secs.max(1)),
        log_lines_per_sandbox: args.log_lines_per_sandbox.max(1),
        event_retention: std::time::Duration::from_secs(args.event_retention_secs.max(1)),
        runaway: warren_server::config::RunawayPolicy {
            cpu_percent: args.runaway_cpu_percent.max(0.0),
            after: std::time::Duration::from_secs(args.runaway_secs),
            kill: args.runaway_kill,
        },
        memory_alert_percent: args.memory_alert_percent.max(0.0),
        disk_alert_percent: args.disk_alert_percent.max(0.0),
        idle_timeout: (args.idle_timeout_secs > 0)
            .then(|| std::time::Duration::from_secs(args.idle_timeout_secs)),
        reap_orphans_on_resume: args.reap_orphans_on_resume,
        reap_orphans_every: (args.reap_orphans_every_secs > 0)
            .then(|| std::time::Duration::from_secs(args.reap_orphans_every_secs)),
    };
    config
}

/// `IP` (port 53) or `IP:PORT` of `--egress-resolver`.
pub(crate) fn parse_resolver(raw: &str) -> Result<SocketAddr, CommandError> {
    let raw = raw.trim();
    if let Ok(ip) = raw.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    parse_listen("--egress-resolver", raw)
}

pub(crate) fn parse_listen(flag: &str, raw: &str) -> Result<SocketAddr, CommandError> {
    raw.parse().map_err(|_| {
        CommandError::Usage(format!(
            "{flag} wants IP:PORT, e.g. 127.0.0.1:3000; got {raw:?}"
        ))
    })
}

/// Creates a key when the store has no live one; returns its secret (the only time it is known).
async fn ensure_first_key(state: &crate::args::StateArgs) -> Result<Option<String>, KeyError> {
    let store = key::open_store(state, false).await?;
    let keys = warren_server::keys::list_keys(store.as_ref()).await?;
    if keys.iter().any(|k| k.revoked_at.is_none()) {
        return Ok(None);
    }
    let created = warren_server::keys::create_key(
        store.as_ref(),
        FIRST_KEY_NAME,
        warren_server::store::DEFAULT_TEAM,
        true,
    )
    .await?;
    Ok(Some(created.secret))
}

/// `--tls` or `--tls-cert`/`--tls-key` (clap makes them exclusive and the pair go together).
fn tls_source(args: &UpArgs) -> Option<TlsSource> {
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ if args.tls => Some(TlsSource::LocalCa),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scheme {
    Http,
    Https,
}

/// How a client finds the API and the sandboxes.
#[derive(Debug, Clone, PartialEq)]
enum Exports {
    /// `E2B_API_URL` and `E2B_SANDBOX_URL` at the listen addresses.
    Urls {
        api: SocketAddr,
        proxy: SocketAddr,
        scheme: Scheme,
    },
    /// E2B_DOMAIN mode: the SDK builds `https://api.<domain>` and `https://<port>-<id>.<domain>`.
    Domain { domain: String, proxy_port: u16 },
}

/// What a client should `export`; a listener on all interfaces is reached at 127.0.0.1 from here.
fn export_lines(mode: &Exports, first_key: Option<&str>) -> String {
    let mut out = match mode {
        // The SDK's volume content client takes its own URL (else https://api.<domain>).
        Exports::Urls { api, proxy, scheme } => format!(
            "export E2B_API_URL={api}\nexport E2B_SANDBOX_URL={}\nexport E2B_VOLUME_API_URL={api}\n",
            local_url(*proxy, *scheme),
            api = local_url(*api, *scheme),
        ),
        Exports::Domain { domain, proxy_port } => {
            let mut out = format!("export E2B_DOMAIN={domain}\n");
            if *proxy_port != 443 {
                out.push_str(&format!(
                    "# the SDK reaches https://api.{domain} and https://<port>-<id>.{domain} on port 443: \
                     run with --proxy-listen <ip>:443 (this proxy listens on {proxy_port})\n"
                ));
            }
            out.push_str(&format!(
                "# DNS: api.{domain} and *.{domain} must resolve to this host (docs/tls.md)\n"
            ));
            out
        }
    };
    match first_key {
        Some(secret) => out.push_str(&format!("export E2B_API_KEY={secret}\n")),
        None => out.push_str(
            "# E2B_API_KEY: keys already exist and are stored hashed; `warren key create` makes a new one\n",
        ),
    }
    out
}

/// Where the local CA is and how the SDKs trust it.
fn trust_lines(ca: &LocalCaFiles) -> String {
    let path = ca.cert.display();
    let made = if ca.created { "made now" } else { "kept" };
    format!(
        "# TLS: certificate signed by Warren's local CA ({made}): {path}\n\
         # trust it: SSL_CERT_FILE for the Python SDK (replaces the system bundle; see docs/tls.md),\n\
         # NODE_EXTRA_CA_CERTS for the JS SDK, REQUESTS_CA_BUNDLE for requests, curl --cacert\n\
         export SSL_CERT_FILE={path}\n\
         export NODE_EXTRA_CA_CERTS={path}\n"
    )
}

fn local_url(addr: SocketAddr, scheme: Scheme) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        ip => ip,
    };
    let scheme = match scheme {
        Scheme::Http => "http",
        Scheme::Https => "https",
    };
    format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
}

/// The default log filter: `info`, except the netlink message parser, which warns on every veth
/// Warren creates that the kernel's IPv6 link attributes are longer than it knows (harmless).
const DEFAULT_LOG_FILTER: &str = "info,netlink_packet_route=error";

/// Server logs on stderr; `RUST_LOG` overrides [`DEFAULT_LOG_FILTER`].
pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // A second initialisation (only possible in tests) is harmless; ignore it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_point_at_loopback_and_carry_a_new_key() {
        let api: SocketAddr = "0.0.0.0:3000".parse().expect("addr");
        let proxy: SocketAddr = "127.0.0.1:3001".parse().expect("addr");
        let plain = Exports::Urls {
            api,
            proxy,
            scheme: Scheme::Http,
        };
        assert_eq!(
            export_lines(&plain, Some("e2b_x")),
            "export E2B_API_URL=http://127.0.0.1:3000\nexport E2B_SANDBOX_URL=http://127.0.0.1:3001\nexport E2B_VOLUME_API_URL=http://127.0.0.1:3000\nexport E2B_API_KEY=e2b_x\n"
        );
        let without = export_lines(&plain, None);
        assert!(
            without
                .lines()
                .nth(3)
                .expect("fourth line")
                .starts_with("# E2B_API_KEY"),
            "{without}"
        );
        let v6: SocketAddr = "[::1]:9".parse().expect("addr");
        assert_eq!(local_url(v6, Scheme::Http), "http://[::1]:9");
        let https = Exports::Urls {
            api,
            proxy,
            scheme: Scheme::Https,
        };
        assert!(export_lines(&https, None)
            .starts_with("export E2B_API_URL=https://127.0.0.1:3000\nexport E2B_SANDBOX_URL=https://127.0.0.1:3001\n"));
    }

    #[test]
    fn domain_mode_exports_the_domain_and_no_urls() {
        let on_443 = export_lines(
            &Exports::Domain {
                domain: "warren.test".into(),
                proxy_port: 443,
            },
            Some("e2b_x"),
        );
        assert!(
            on_443.starts_with("export E2B_DOMAIN=warren.test\n"),
            "{on_443}"
        );
        assert!(!on_443.contains("E2B_SANDBOX_URL") && !on_443.contains("E2B_API_URL"));
        assert!(!on_443.contains("port 443"), "{on_443}");
        let elsewhere = export_lines(
            &Exports::Domain {
                domain: "warren.test".into(),
                proxy_port: 3001,
            },
            None,
        );
        assert!(elsewhere.contains("--proxy-listen <ip>:443"), "{elsewhere}");
    }

    #[test]
    fn trust_lines_name_the_ca_file() {
        let lines = trust_lines(&LocalCaFiles {
            cert: "/var/lib/warren/tls/ca.crt".into(),
            key: "/var/lib/warren/tls/ca.key".into(),
            created: true,
        });
        assert!(lines.contains("export SSL_CERT_FILE=/var/lib/warren/tls/ca.crt\n"));
        assert!(lines.contains("export NODE_EXTRA_CA_CERTS=/var/lib/warren/tls/ca.crt\n"));
        assert!(!lines.contains("ca.key"), "{lines}");
    }

    #[test]
    fn listen_addresses_must_be_ip_and_port() {
        assert!(parse_listen("--listen", "127.0.0.1:0").is_ok());
        assert_eq!(
            parse_resolver("198.18.0.53").unwrap(),
            "198.18.0.53:53".parse().unwrap()
        );
        assert_eq!(
            parse_resolver("198.18.0.53:5353").unwrap(),
            "198.18.0.53:5353".parse().unwrap()
        );
        assert!(parse_resolver("dns.test").is_err());
        let err = parse_listen("--listen", "localhost").expect_err("not an IP");
        assert_eq!(err.exit_code(), exit_code::USAGE);
    }

    #[tokio::test]
    async fn first_key_is_created_once() {
        let dir = std::env::temp_dir().join(format!("wt-cli-up-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = crate::args::StateArgs {
            state_dir: Some(dir.clone()),
            database_url: None,
        };
        let first = ensure_first_key(&state).await.expect("first");
        assert!(first.is_some_and(|k| k.starts_with(warren_server::keys::SECRET_PREFIX)));
        assert_eq!(ensure_first_key(&state).await.expect("second"), None);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
