//! Builds the runtime of this host for [`crate::serve`].

use std::sync::Arc;

use warren_runtime::{Runtime, RuntimeError};

use crate::config::ServerConfig;

/// The Linux runtime (namespaces, cgroups, overlayfs, CRIU). Until the runtime crate ships its
/// implementation this build cannot start sandboxes and says so.
pub fn linux_runtime(_config: &ServerConfig) -> Result<Arc<dyn Runtime>, RuntimeError> {
    Err(RuntimeError::Unsupported(
        "this build has no Linux runtime yet (warren-runtime's LinuxRuntime is not merged)"
            .to_string(),
    ))
}
