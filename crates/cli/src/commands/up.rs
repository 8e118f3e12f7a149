//! `warren up`: makes sure an API key exists, prints the `export` lines a client needs, then runs the
//! server (REST API + proxy + lifecycle) in the foreground until SIGINT/SIGTERM.

use std::io::IsTerminal;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

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
    #[error("the server stopped with an error")]
    Serve(#[source] warren_server::ServeError),
}

pub async fn run(_global: &GlobalArgs, args: UpArgs) -> Result<i32, CommandError> {
    init_logging();
    let api_listen = parse_listen("--listen", &args.listen)?;
    let proxy_listen = parse_listen("--proxy-listen", &args.proxy_listen)?;
    let state_dir = state_dir::resolve(&args.state);
    let mut config = server_config(state_dir.clone(), api_listen, proxy_listen, &args);
    config.egress_resolvers = args
        .egress_resolvers
        .iter()
        .map(|raw| parse_resolver(raw))
        .collect::<Result<_, _>>()?;

    let first_key = ensure_first_key(&state_dir)
        .await
        .map_err(UpError::FirstKey)?;
    print!(
        "{}",
        export_lines(api_listen, proxy_listen, first_key.as_deref())
    );
    tracing::info!(state_dir = %state_dir.display(), "starting warren");

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
    config.agent_binary = args.agent.clone();
    if let Some(rootfs) = &args.base_rootfs {
        config.base_rootfs = rootfs.clone();
    }
    config.code_interpreter_rootfs =
        Some(args.code_interpreter_rootfs.clone().unwrap_or_else(|| {
            PathBuf::from(warren_server::templates::code_interpreter::DEFAULT_ROOTFS)
        }));
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
    if let Some(max) = args.sandbox_max_pids {
        config.default_resources.max_pids = max;
    }
    if let Some(mib) = args.sandbox_disk_mib {
        config.default_resources.disk_mib = mib;
    }
    config.expedite_rcu = !args.keep_rcu_normal;
    config.no_new_privs = args.no_new_privs;
    config.egress_upstream_ca = args.egress_upstream_ca.clone();
    config.build_timeout = std::time::Duration::from_secs(args.build_timeout_secs.max(1));
    config
}

/// `IP` (port 53) or `IP:PORT` of `--egress-resolver`.
fn parse_resolver(raw: &str) -> Result<SocketAddr, CommandError> {
    let raw = raw.trim();
    if let Ok(ip) = raw.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    parse_listen("--egress-resolver", raw)
}

fn parse_listen(flag: &str, raw: &str) -> Result<SocketAddr, CommandError> {
    raw.parse().map_err(|_| {
        CommandError::Usage(format!(
            "{flag} wants IP:PORT, e.g. 127.0.0.1:3000; got {raw:?}"
        ))
    })
}

/// Creates a key when the store has no live one; returns its secret (the only time it is known).
async fn ensure_first_key(state_dir: &std::path::Path) -> Result<Option<String>, KeyError> {
    let store = key::open_store(state_dir, false).await?;
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

/// What a client should `export`; a listener on all interfaces is reached at 127.0.0.1 from here.
fn export_lines(api: SocketAddr, proxy: SocketAddr, first_key: Option<&str>) -> String {
    let mut out = format!(
        "export E2B_API_URL={}\nexport E2B_SANDBOX_URL={}\n",
        local_url(api),
        local_url(proxy)
    );
    match first_key {
        Some(secret) => out.push_str(&format!("export E2B_API_KEY={secret}\n")),
        None => out.push_str(
            "# E2B_API_KEY: keys already exist and are stored hashed; `warren key create` makes a new one\n",
        ),
    }
    out
}

fn local_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// The default log filter: `info`, except the netlink message parser, which warns on every veth
/// Warren creates that the kernel's IPv6 link attributes are longer than it knows (harmless).
const DEFAULT_LOG_FILTER: &str = "info,netlink_packet_route=error";

/// Server logs on stderr; `RUST_LOG` overrides [`DEFAULT_LOG_FILTER`].
fn init_logging() {
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
        assert_eq!(
            export_lines(api, proxy, Some("e2b_x")),
            "export E2B_API_URL=http://127.0.0.1:3000\nexport E2B_SANDBOX_URL=http://127.0.0.1:3001\nexport E2B_API_KEY=e2b_x\n"
        );
        let without = export_lines(api, proxy, None);
        assert!(
            without
                .lines()
                .nth(2)
                .expect("third line")
                .starts_with("# E2B_API_KEY"),
            "{without}"
        );
        let v6: SocketAddr = "[::1]:9".parse().expect("addr");
        assert_eq!(local_url(v6), "http://[::1]:9");
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
        let first = ensure_first_key(&dir).await.expect("first");
        assert!(first.is_some_and(|k| k.starts_with(warren_server::keys::SECRET_PREFIX)));
        assert_eq!(ensure_first_key(&dir).await.expect("second"), None);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
