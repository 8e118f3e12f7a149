//! Template tags (E2B's `name:tag`): each tag names one build of a template, in the store's
//! `template_tags`. A build gets the tags it was requested with (`build(tags=[...])`, `name:tag` in
//! the request) or `default`, once it is ready. `Sandbox.create("name:tag")` starts that build's
//! version (its layers and checkpoint), so a rebuild never changes what an existing tag starts.

use std::path::Path;

use crate::store::{Store, StoreError, TemplateRecord};
use crate::templates::builder::versions::{TemplateVersions, VersionError};

/// The tag a build gets when it was requested without one.
pub const DEFAULT_TAG: &str = "default";

#[derive(Debug, thiserror::Error)]
pub enum TagError {
    #[error("invalid tag {0:?}: use letters, digits, '.', '-' and '_' (at most 128)")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the build {build_id} that tag {tag:?} names has no version record")]
    Version {
        tag: String,
        build_id: String,
        #[source]
        source: VersionError,
    },
}

impl From<TagError> for crate::lifecycle::LifecycleError {
    fn from(error: TagError) -> Self {
        match error {
            TagError::Store(e) => e.into(),
            other => crate::lifecycle::LifecycleError::Conflict(other.to_string()),
        }
    }
}

/// `name:tag` → (`name`, Some(`tag`)); a plain name → (`name`, None).
pub fn split_reference(reference: &str) -> (&str, Option<&str>) {
    match reference.split_once(':') {
        Some((name, tag)) => (name, Some(tag)),
        None => (reference, None),
    }
}

pub fn check_tag(tag: &str) -> Result<(), TagError> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        && !tag.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(TagError::Invalid(tag.to_string()))
    }
}

/// The build `tag` of `template` names (None: no such tag). Without a tag, the current build.
pub async fn tagged_build(
    store: &dyn Store,
    template: &TemplateRecord,
    tag: Option<&str>,
) -> Result<Option<String>, TagError> {
    let Some(tag) = tag else {
        return Ok(Some(template.build_id.clone()));
    };
    Ok(store
        .list_template_tags(&template.id)
        .await?
        .into_iter()
        .find(|t| t.tag == tag)
        .map(|t| t.build_id))
}

/// `template` as of the build `tag` names: its layers and build id (the create path then restores that
/// build's checkpoint). None when the template has no such tag.
pub async fn template_at_tag(
    store: &dyn Store,
    state_dir: &Path,
    template: TemplateRecord,
    tag: Option<&str>,
) -> Result<Option<TemplateRecord>, TagError> {
    let Some(build_id) = tagged_build(store, &template, tag).await? else {
        return Ok(None);
    };
    if build_id == template.build_id {
        return Ok(Some(template));
    }
    let built = TemplateVersions::new(state_dir)
        .load(&template.id, &build_id)
        .map_err(|source| TagError::Version {
            tag: tag.unwrap_or_default().to_string(),
            build_id: build_id.clone(),
            source,
        })?;
    let mut at = template;
    at.layers = built.layers;
    at.build_id = built.build_id;
    if let Some(cpus) = built.cpu_count {
        at.vcpus = f64::from(cpus);
    }
    if let Some(memory) = built.memory_mb {
        at.memory_mib = memory;
    }
    Ok(Some(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_tags() {
        assert_eq!(split_reference("app:v1"), ("app", Some("v1")));
        assert_eq!(split_reference("app"), ("app", None));
        for good in ["v1", "default", "1.2.3", "rc_1", "Latest"] {
            check_tag(good).unwrap();
        }
        for bad in ["", "-x", ".x", "a/b", "a:b", "sp ace", &"x".repeat(129)] {
            assert!(check_tag(bad).is_err(), "{bad}");
        }
    }
}
