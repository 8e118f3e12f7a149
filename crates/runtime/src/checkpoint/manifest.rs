//! `manifest.json` of a checkpoint: what was dumped, where, and the checksum of every stored file. It is
//! written last, inside the temporary directory that is then renamed into place, so a checkpoint
//! directory with a manifest is complete.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::page_chunks::PageChunks;
use super::CheckpointError;

pub const MANIFEST_FILE: &str = "manifest.json";
/// Bumped when the layout changes; formats this Warren does not know are refused with a clear error.
/// Format 2 stores the memory-page images in independently compressed chunks, each with a checksum
/// ([`StoredFile::chunks`]), which a lazy restore serves from directly; format 1 (whole-file zstd page
/// images, whole-file SHA-256) is still read and restored the eager way.
pub const FORMAT: u32 = 2;
/// The formats [`Manifest::from_json`] accepts.
const READABLE_FORMATS: std::ops::RangeInclusive<u32> = 1..=FORMAT;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub sandbox_id: String,
    /// Address the sandbox had when dumped; sockets in the images are bound to it.
    pub ip: Ipv4Addr,
    pub criu_version: String,
    pub created_at_unix: u64,
    /// Read-only layers under the writable one when dumped, top-most first.
    pub layers: Vec<PathBuf>,
    /// CRIU image files, under `images/`.
    pub images: Vec<StoredFile>,
    /// The writable layer as a zstd-compressed tar.
    pub layer: StoredFile,
    /// Whether the processes were dumped too. A filesystem-only checkpoint (`false`) has no images
    /// and no CRIU version: it can only be booted from disk, never restored. Manifests written before
    /// this field existed all held memory.
    #[serde(default = "holds_memory_by_default")]
    pub memory: bool,
}

fn holds_memory_by_default() -> bool {
    true
}

/// One file of the checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredFile {
    /// Path relative to the checkpoint directory.
    pub path: String,
    /// Name the file has when handed back to CRIU (the stored one minus `.zst`).
    pub name: String,
    pub stored_bytes: u64,
    pub raw_bytes: u64,
    pub zstd: bool,
    /// SHA-256 of the stored bytes, hex; empty for a file checked by `chunks` instead.
    pub sha256: String,
    /// The chunks of a memory-page image of format 2 (`zstd` is false: chunks are compressed one by
    /// one); a file with them has no `sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<PageChunks>,
}

impl Manifest {
    pub fn read(checkpoint: &Path) -> Result<Self, CheckpointError> {
        let path = checkpoint.join(MANIFEST_FILE);
        let bytes = std::fs::read(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::Invalid(format!(
                "{} is not a checkpoint (no {MANIFEST_FILE})",
                checkpoint.display()
            )),
            _ => CheckpointError::Io {
                context: format!("read {}", path.display()),
                source,
            },
        })?;
        Self::from_json(&bytes).map_err(|e| match e {
            CheckpointError::Invalid(why) => {
                CheckpointError::Invalid(format!("{}: {why}", path.display()))
            }
            other => other,
        })
    }

    /// Parses and checks manifest bytes (a checkpoint's, so possibly hostile or damaged): the format
    /// version must be this Warren's, every file a plain relative path.
    pub fn from_json(bytes: &[u8]) -> Result<Self, CheckpointError> {
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| CheckpointError::Invalid(format!("manifest: {e}")))?;
        if !READABLE_FORMATS.contains(&manifest.format) {
            return Err(CheckpointError::Invalid(format!(
                "checkpoint format {}, this Warren reads {} to {}",
                manifest.format,
                READABLE_FORMATS.start(),
                READABLE_FORMATS.end()
            )));
        }
        for file in manifest.images.iter().chain([&manifest.layer]) {
            if !is_plain_relative(&file.path) || !is_plain_name(&file.name) {
                return Err(CheckpointError::Invalid(format!(
                    "bad file name {:?}",
                    file.path
                )));
            }
            let checked = match &file.chunks {
                Some(chunks) => !file.zstd && chunks.fits(file.raw_bytes, file.stored_bytes),
                None => !file.sha256.is_empty(),
            };
            if !checked {
                return Err(CheckpointError::Invalid(format!(
                    "{}: no usable checksum",
                    file.path
                )));
            }
        }
        Ok(manifest)
    }

    pub fn to_json(&self) -> Result<Vec<u8>, CheckpointError> {
        serde_json::to_vec_pretty(self)
            .map_err(|e| CheckpointError::Invalid(format!("encode manifest: {e}")))
    }

    /// Bytes on disk of the whole checkpoint (as stored, i.e. compressed).
    pub fn stored_bytes(&self) -> u64 {
        self.images
            .iter()
            .chain([&self.layer])
            .map(|f| f.stored_bytes)
            .sum()
    }
}

/// `a/b` style: no absolute paths, no `..`, no empty parts.
fn is_plain_relative(path: &str) -> bool {
    !path.is_empty()
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

fn is_plain_name(name: &str) -> bool {
    is_plain_relative(name) && !name.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let file = |path: &str, name: &str| StoredFile {
            path: path.into(),
            name: name.into(),
            stored_bytes: 10,
            raw_bytes: 20,
            zstd: true,
            sha256: "00".into(),
            chunks: None,
        };
        Manifest {
            format: FORMAT,
            sandbox_id: "sb1".into(),
            ip: Ipv4Addr::new(10, 77, 0, 2),
            criu_version: "4.1.1".into(),
            created_at_unix: 1,
            layers: vec![PathBuf::from("/var/cache/warren/rootfs/debian12-base")],
            images: vec![file("images/pages-1.img.zst", "pages-1.img")],
            layer: file("layer.tar.zst", "layer.tar"),
            memory: true,
        }
    }

    #[test]
    fn round_trips_and_refuses_escapes() {
        let dir = std::env::temp_dir().join(format!("wt-manifest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = sample();
        std::fs::write(dir.join(MANIFEST_FILE), manifest.to_json().unwrap()).unwrap();
        assert_eq!(Manifest::read(&dir).unwrap(), manifest);
        assert_eq!(manifest.stored_bytes(), 20);

        let mut bad = sample();
        bad.images[0].name = "../../etc/passwd".into();
        std::fs::write(dir.join(MANIFEST_FILE), bad.to_json().unwrap()).unwrap();
        assert!(matches!(
            Manifest::read(&dir),
            Err(CheckpointError::Invalid(_))
        ));

        let mut old = sample();
        old.format = 0;
        std::fs::write(dir.join(MANIFEST_FILE), old.to_json().unwrap()).unwrap();
        assert!(
            matches!(Manifest::read(&dir), Err(CheckpointError::Invalid(m)) if m.contains("format"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn manifests_without_the_memory_field_held_memory() {
        let mut json: serde_json::Value =
            serde_json::from_slice(&sample().to_json().unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("memory");
        let read = Manifest::from_json(&serde_json::to_vec(&json).unwrap()).unwrap();
        assert!(read.memory);

        let mut disk_only = sample();
        disk_only.memory = false;
        disk_only.images.clear();
        let read = Manifest::from_json(&disk_only.to_json().unwrap()).unwrap();
        assert!(!read.memory);
    }

    #[test]
    fn missing_manifest_is_a_clear_error() {
        let err = Manifest::read(Path::new("/nonexistent-wt-checkpoint")).unwrap_err();
        assert!(err.to_string().contains("not a checkpoint"), "{err}");
    }
}
