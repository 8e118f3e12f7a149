//! Image layers in the build layer store, content-addressed by blob digest: layer `sha256:<hex>` is
//! the cached layer `img-<hex>` (`<state>/layers/img-<hex>/fs`). A layer any template already pulled is
//! neither fetched nor unpacked again; every template version lists the image layers it stacks in its
//! `layer_keys`, so [`super::super::builder::versions::TemplateVersions::prune_layers`] removes an image
//! layer once no version (and no live sandbox the caller names) uses it.
//!
//! A layer is fetched to a temp file inside its pending directory (verified against its digest while
//! downloading), unpacked beside it, and only then renamed into place with its metadata, so a crash or
//! a bad blob never leaves a half layer that looks cached.

use std::path::PathBuf;

use super::super::builder::layers::{LayerError, LayerStore};
use super::registry::{ImageLayer, RegistryClient, RegistryError, ResolvedImage};
use super::unpack::{unpack_layer, UnpackError, UnpackStats};

#[derive(Debug, thiserror::Error)]
pub enum ImageLayerError {
    #[error("image layer digest {0:?} is not a sha256 digest")]
    BadDigest(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("unpacking layer {digest}")]
    Unpack {
        digest: String,
        #[source]
        source: UnpackError,
    },
    #[error(transparent)]
    Store(#[from] LayerError),
    #[error("reading the downloaded layer {digest}")]
    Io {
        digest: String,
        #[source]
        source: std::io::Error,
    },
}

/// The layer-store key of an image layer blob.
pub fn layer_key(digest: &str) -> Result<String, ImageLayerError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| ImageLayerError::BadDigest(digest.to_string()))?;
    Ok(format!("img-{}", hex.to_ascii_lowercase()))
}

/// How one layer was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerSource {
    /// Already in the store.
    Cached,
    /// Downloaded and unpacked now.
    Pulled(UnpackStats),
}

/// One image layer ready to mount.
#[derive(Debug, Clone)]
pub struct StoredLayer {
    pub key: String,
    pub fs_dir: PathBuf,
    pub source: LayerSource,
}

/// Makes sure every layer of `image` is in `store`; returns them bottom-most first, as the manifest
/// lists them. `progress` hears about each layer as it is done.
pub fn ensure_image_layers(
    store: &LayerStore,
    client: &RegistryClient,
    image: &ResolvedImage,
    progress: &mut dyn FnMut(&ImageLayer, &StoredLayer),
) -> Result<Vec<StoredLayer>, ImageLayerError> {
    let mut out = Vec::with_capacity(image.layers.len());
    for layer in &image.layers {
        let stored = ensure_layer(store, client, image, layer)?;
        progress(layer, &stored);
        out.push(stored);
    }
    Ok(out)
}

fn ensure_layer(
    store: &LayerStore,
    client: &RegistryClient,
    image: &ResolvedImage,
    layer: &ImageLayer,
) -> Result<StoredLayer, ImageLayerError> {
    let key = layer_key(&layer.digest)?;
    if store.lookup(&key)?.is_some() {
        return Ok(StoredLayer {
            fs_dir: store.fs_dir(&key),
            key,
            source: LayerSource::Cached,
        });
    }
    let pending = store.begin(&key)?;
    let blob = pending.fs_dir().with_file_name("blob");
    client.fetch_blob(image, layer, &blob)?;
    let fs_dir = pending.create_fs_dir()?;
    let file = std::fs::File::open(&blob).map_err(|source| ImageLayerError::Io {
        digest: layer.digest.clone(),
        source,
    })?;
    let stats = unpack_layer(file, &fs_dir).map_err(|source| ImageLayerError::Unpack {
        digest: layer.digest.clone(),
        source,
    })?;
    std::fs::remove_file(&blob).map_err(|source| ImageLayerError::Io {
        digest: layer.digest.clone(),
        source,
    })?;
    store.commit(pending, &format!("image layer {}", layer.digest))?;
    Ok(StoredLayer {
        fs_dir: store.fs_dir(&key),
        key,
        source: LayerSource::Pulled(stats),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_blob_digest() {
        let hex = "ab".repeat(32);
        assert_eq!(
            layer_key(&format!("sha256:{hex}")).unwrap(),
            format!("img-{hex}")
        );
        for bad in [
            "sha512:00",
            "sha256:../../etc",
            "sha256:abc",
            &format!("sha256:{}", "zz".repeat(32)),
        ] {
            assert!(layer_key(bad).is_err(), "{bad}");
        }
    }
}
