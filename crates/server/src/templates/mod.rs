//! Templates: the built-in `base` template and lookups. Template builds (`build`) hang off this module.

pub mod builder;
pub mod builds;
pub mod code_interpreter;
pub mod images;
pub mod tags;

use std::path::Path;

use warren_proto::api::ENVD_VERSION;

use crate::config::DefaultResources;
use crate::lifecycle::now_millis;
use crate::store::{Store, StoreError, TemplateRecord};

/// ID of the template every SDK uses by default.
pub const BASE_TEMPLATE_ID: &str = "base";
/// Fixed build ID of the built-in base template (a UUID, as the SDK parses it).
const BASE_BUILD_ID: &str = "00000000-0000-4000-8000-000000000001";

/// Make sure the `base` template exists and points at `base_rootfs`, with the configured resources.
pub async fn ensure_base_template(
    store: &dyn Store,
    base_rootfs: &Path,
    resources: &DefaultResources,
) -> Result<TemplateRecord, StoreError> {
    let now = now_millis();
    let existing = store.get_template(BASE_TEMPLATE_ID).await?;
    let template = TemplateRecord {
        id: BASE_TEMPLATE_ID.to_string(),
        aliases: vec![BASE_TEMPLATE_ID.to_string()],
        layers: vec![base_rootfs.to_path_buf()],
        build_id: BASE_BUILD_ID.to_string(),
        status: "ready".to_string(),
        vcpus: resources.vcpus,
        memory_mib: resources.memory_mib,
        disk_mib: resources.disk_mib,
        envd_version: ENVD_VERSION.to_string(),
        public: true,
        team_id: crate::store::DEFAULT_TEAM.to_string(),
        spawn_count: existing.as_ref().map_or(0, |t| t.spawn_count),
        last_spawned_at: existing.as_ref().and_then(|t| t.last_spawned_at),
        created_at: existing.as_ref().map_or(now, |t| t.created_at),
        updated_at: now,
        policies: existing
            .as_ref()
            .map_or_else(Default::default, |t| t.policies.clone()),
    };
    store.upsert_template(&template).await?;
    if !base_rootfs.is_dir() {
        tracing::warn!(rootfs = %base_rootfs.display(), "base rootfs missing: sandboxes of `base` will not start (run scripts/setup)");
    }
    Ok(template)
}
