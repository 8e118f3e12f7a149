//! Volumes (docs/volumes.md): a team's persistent ext4 images, mounted into sandboxes at create and
//! read and written through `/volumecontent`. The rows live in the store; the images under the state
//! dir's `volumes/` ([`warren_runtime::rootfs::volume_disk`]).

pub mod content;

use std::path::{Path, PathBuf};

use warren_runtime::rootfs::volume_disk::{VolumeDisk, VolumeDiskError};

use crate::store::{SandboxVolume, Store, StoreError, VolumeDeletion, VolumeRecord};

/// Where the volumes are, under the state dir.
pub const VOLUMES_DIR: &str = "volumes";

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("{0}")]
    BadRequest(String),
    #[error("volume {0:?} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("volume storage")]
    Disk(#[from] VolumeDiskError),
    #[error("store failed")]
    Store(#[source] StoreError),
}

impl From<StoreError> for VolumeError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Duplicate { name, .. } => VolumeError::Conflict(format!(
                "a volume named {name:?} exists already in this team"
            )),
            other => VolumeError::Store(other),
        }
    }
}

/// A volume name: 1 to 63 letters, digits, `-`, `_` and `.`, starting with a letter or digit.
pub fn check_name(name: &str) -> Result<(), VolumeError> {
    let fine = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if fine {
        Ok(())
    } else {
        Err(VolumeError::BadRequest(format!(
            "volume name {name:?} is not valid: use 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or digit"
        )))
    }
}

/// Where a volume may be mounted inside a sandbox: absolute, normal (no `.`, `..`, empty or NUL
/// parts), not `/`, not under /proc, /sys or /dev. Returns the path cleaned of a trailing `/`.
pub fn check_mount_path(path: &str) -> Result<String, VolumeError> {
    let bad = |why: &str| {
        VolumeError::BadRequest(format!("volumeMounts path {path:?} is not allowed: {why}"))
    };
    if !path.starts_with('/') {
        return Err(bad("it must be absolute"));
    }
    if path.contains('\0') {
        return Err(bad("it holds a NUL byte"));
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return Err(bad("it is the root"));
    }
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(bad("it must not contain `.` or `..`"));
    }
    if matches!(parts[0], "proc" | "sys" | "dev") {
        return Err(bad("/proc, /sys and /dev are the kernel's"));
    }
    if parts[0] == ".warren" {
        return Err(bad("/.warren is the agent's"));
    }
    Ok(format!("/{}", parts.join("/")))
}

pub fn volumes_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(VOLUMES_DIR)
}

pub fn disk(state_dir: &Path, id: &str) -> Result<VolumeDisk, VolumeError> {
    Ok(VolumeDisk::at(&volumes_dir(state_dir), id)?)
}

fn new_volume_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!(
        "vol-{}",
        Alphanumeric
            .sample_string(&mut rand::rng(), 16)
            .to_ascii_lowercase()
    )
}

fn new_volume_token() -> String {
    use rand::Rng;
    let mut bytes = [0u8; 24];
    rand::rng().fill(&mut bytes);
    hex::encode(bytes)
}

/// Creates the volume `name` for `team_id`: the row first (so a duplicate name costs nothing), then
/// the image; a failed image takes the row away again.
pub async fn create(
    store: &dyn Store,
    state_dir: &Path,
    team_id: &str,
    name: &str,
    size_mib: u64,
) -> Result<VolumeRecord, VolumeError> {
    check_name(name)?;
    let record = VolumeRecord {
        id: new_volume_id(),
        team_id: team_id.to_string(),
        name: name.to_string(),
        token: new_volume_token(),
        size_mib,
        created_at: crate::lifecycle::now_millis(),
    };
    store.insert_volume(&record).await?;
    let volume = disk(state_dir, &record.id)?;
    let made = tokio::task::spawn_blocking(move || {
        let made = volume.create(size_mib);
        if made.is_err() {
            let _ = volume.remove();
        }
        made
    })
    .await
    .unwrap_or_else(|join| {
        Err(VolumeDiskError::Io {
            path: PathBuf::from(VOLUMES_DIR),
            source: std::io::Error::other(join.to_string()),
        })
    });
    if let Err(error) = made {
        let _ = store.delete_volume(&record.id).await;
        return Err(error.into());
    }
    Ok(record)
}

/// The team's volume `id` (another team's is "not found").
pub async fn get(store: &dyn Store, team_id: &str, id: &str) -> Result<VolumeRecord, VolumeError> {
    match store.get_volume(id).await? {
        Some(volume) if volume.team_id == team_id => Ok(volume),
        _ => Err(VolumeError::NotFound(id.to_string())),
    }
}

/// Deletes the team's volume `id`: refused while a sandbox that is not killed or failed mounts it
/// (its data would go from under a paused sandbox that still counts on it); otherwise the row goes,
/// then the mount and the image.
pub async fn delete(
    store: &dyn Store,
    state_dir: &Path,
    team_id: &str,
    id: &str,
) -> Result<(), VolumeError> {
    get(store, team_id, id).await?;
    match store.delete_volume(id).await? {
        VolumeDeletion::Deleted => {}
        VolumeDeletion::NotFound => return Err(VolumeError::NotFound(id.to_string())),
        VolumeDeletion::InUse(sandboxes) => {
            return Err(VolumeError::Conflict(format!(
                "volume {id} is mounted by sandboxes {}; kill them first",
                sandboxes.join(", ")
            )))
        }
    }
    let volume = disk(state_dir, id)?;
    tokio::task::spawn_blocking(move || volume.remove())
        .await
        .map_err(|join| VolumeDiskError::Io {
            path: PathBuf::from(VOLUMES_DIR),
            source: std::io::Error::other(join.to_string()),
        })??;
    Ok(())
}

/// The create body's `volumeMounts` resolved against the team's volumes (by name).
pub async fn resolve_mounts(
    store: &dyn Store,
    team_id: &str,
    mounts: &[warren_proto::api::SandboxVolumeMount],
) -> Result<Vec<SandboxVolume>, VolumeError> {
    let mut out: Vec<SandboxVolume> = Vec::new();
    for mount in mounts {
        let path = check_mount_path(&mount.path)?;
        if out.iter().any(|m| m.path == path) {
            return Err(VolumeError::BadRequest(format!(
                "volumeMounts: two volumes at {path}"
            )));
        }
        let Some(volume) = store.get_volume_by_name(team_id, &mount.name).await? else {
            return Err(VolumeError::BadRequest(format!(
                "volumeMounts: no volume named {:?} in this team",
                mount.name
            )));
        };
        out.push(SandboxVolume {
            volume_id: volume.id,
            name: volume.name,
            path,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_mount_paths_are_checked() {
        assert!(check_name("data-1.v_2").is_ok());
        for bad in ["", "-x", "a/b", "a b", &"x".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(check_mount_path("/mnt/data/").unwrap(), "/mnt/data");
        for bad in [
            "mnt", "/", "/proc/x", "/sys", "/dev/shm", "/a/../b", "/.warren",
        ] {
            assert!(check_mount_path(bad).is_err(), "{bad:?}");
        }
    }
}
