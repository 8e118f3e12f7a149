//! Builds the runtime of this host for [`crate::serve`].

use std::sync::Arc;

use warren_runtime::{ConfigError, LinuxRuntime, LinuxRuntimeConfig, Runtime};

use crate::config::ServerConfig;

/// The Linux runtime (namespaces, cgroups, overlayfs, CRIU) on the server's state dir, with the
/// configured agent binary. Fails with the reason when the host cannot run sandboxes.
pub fn linux_runtime(config: &ServerConfig) -> Result<Arc<dyn Runtime>, ConfigError> {
    let mut runtime_config = LinuxRuntimeConfig {
        state_dir: config.state_dir.clone(),
        expedite_rcu: config.expedite_rcu,
        no_new_privs: config.no_new_privs,
        lazy_restore: config.lazy_restore,
        standby_supervisors: config.standby_supervisors,
        egress_resolvers: config.egress_resolvers.clone(),
        egress_upstream_ca: config.egress_upstream_ca.clone(),
        ..LinuxRuntimeConfig::default()
    };
    if let Some(agent) = &config.agent_binary {
        runtime_config.agent_binary = agent.clone();
    }
    Ok(Arc::new(LinuxRuntime::new(runtime_config)?))
}
