//! `warren node`: this machine's runtime, serving one server's runtime calls (docs/cluster.md).

use warren_runtime::LinuxRuntimeConfig;
use warren_server::node::NodeConfig;

use super::CommandError;
use crate::args::NodeArgs;
use crate::exit_code;

#[derive(Debug, thiserror::Error)]
pub enum NodeCommandError {
    #[error("token file {path}: {source}")]
    Token {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Node(#[from] warren_server::node::NodeError),
}

pub async fn run(args: NodeArgs) -> Result<i32, CommandError> {
    super::up::init_logging();
    let listen = super::up::parse_listen("--listen", &args.listen)?;
    let egress_resolvers = args
        .runtime
        .egress_resolvers
        .iter()
        .map(|raw| super::up::parse_resolver(raw))
        .collect::<Result<_, _>>()?;
    std::fs::create_dir_all(&args.state_dir).map_err(|source| NodeCommandError::Token {
        path: args.state_dir.clone(),
        source,
    })?;
    let token_file = args
        .token_file
        .clone()
        .unwrap_or_else(|| args.state_dir.join("node.token"));
    let token = warren_server::node::ensure_token(&token_file).map_err(|source| {
        NodeCommandError::Token {
            path: token_file.clone(),
            source,
        }
    })?;
    let mut runtime = LinuxRuntimeConfig {
        state_dir: args.state_dir.clone(),
        expedite_rcu: !args.runtime.keep_rcu_normal,
        no_new_privs: args.runtime.no_new_privs,
        lazy_restore: !args.runtime.no_lazy_restore,
        standby_supervisors: usize::from(args.runtime.standby_supervisors),
        egress_resolvers,
        egress_upstream_ca: args.runtime.egress_upstream_ca.clone(),
        gateway: args.subnet.0,
        subnet_prefix: args.subnet.1,
        server_addresses: args.server_addresses.clone(),
        ..LinuxRuntimeConfig::default()
    };
    if let Some(agent) = &args.runtime.agent {
        runtime.agent_binary = agent.clone();
    }
    println!("node token file: {}", token_file.display());
    warren_server::node::serve(NodeConfig {
        runtime,
        listen,
        token,
        shared_dirs: args.shared_dirs.clone(),
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(warren_server::tls::TlsSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => args.tls.then_some(warren_server::tls::TlsSource::LocalCa),
        },
        limits: warren_server::node::ledger::NodeLimits {
            max_sandboxes: args.max_sandboxes,
            max_vcpus: args.max_total_vcpus,
            max_memory_mib: args.max_total_memory_mib,
        },
        fence_after: (args.fence_after > 0)
            .then(|| std::time::Duration::from_secs(args.fence_after)),
    })
    .await
    .map_err(NodeCommandError::Node)?;
    Ok(exit_code::OK)
}
