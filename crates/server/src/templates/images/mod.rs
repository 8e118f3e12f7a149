//! Template bases from container images: registry pulls (`registry`), hostile-input-safe layer
//! unpacking into overlayfs lower layers (`unpack`), and the content-addressed image layers in the
//! build layer store (`image_layers`).
//!
//! At plan time a `FROM` that names a registry image is resolved to one linux/amd64 manifest and its
//! config (small requests); the layer blobs are fetched and unpacked by the build itself, once per
//! digest for every template on this node.

pub mod ecr;
pub mod image_layers;
pub mod image_setup;
pub mod registry;
pub mod unpack;

use registry::{RegistryClient, RegistryCredentials, RegistryError, ResolvedImage};

/// Resolves an image reference to a manifest and config (the registry, or a fake in tests).
pub trait ImageResolver: Send + Sync {
    fn resolve(
        &self,
        image: &str,
        credentials: Option<&RegistryCredentials>,
    ) -> Result<ResolvedImage, RegistryError>;
}

impl ImageResolver for RegistryClient {
    fn resolve(
        &self,
        image: &str,
        credentials: Option<&RegistryCredentials>,
    ) -> Result<ResolvedImage, RegistryError> {
        RegistryClient::resolve(self, image, credentials)
    }
}

/// For planners without registry access (pure planning, unit tests): every pull is refused.
pub struct NoRegistry;

impl ImageResolver for NoRegistry {
    fn resolve(
        &self,
        image: &str,
        _credentials: Option<&RegistryCredentials>,
    ) -> Result<ResolvedImage, RegistryError> {
        Err(RegistryError::Pull {
            image: image.to_string(),
            message: "this planner has no registry access".into(),
        })
    }
}
