//! Volumes: one sparse ext4 image per volume (`volumes/<id>/volume.img`), loop-mounted on the host at
//! `volumes/<id>/mnt` while the server runs, and bind-mounted from there into every sandbox that asks
//! for it (see [`super::sandbox_mounts::attach_volumes`]). The image's size is the volume's quota: a
//! write past it fails with ENOSPC, in a sandbox and through the content API alike.
//!
//! The same loop machinery as the sandbox's writable layer ([`super::LayerDisk`]), with two
//! differences: the filesystem has a journal (a volume outlives sandboxes and crashes), and it is
//! mounted `nodev,nosuid` (sandboxes write it; nothing on it is trusted).
//!
//! What a volume's contents are: hostile. Host code reads and writes them only through
//! [`crate::confined::ConfinedDir`] opened at [`VolumeDisk::mount_point`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use nix::mount::{mount, MsFlags};
use serde::{Deserialize, Serialize};

use super::layer_disk::{is_mount_point, LayerDisk, LayerDiskError};
use super::loop_device;

#[derive(Debug, thiserror::Error)]
pub enum VolumeDiskError {
    #[error("volume image {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mkfs.ext4 on {path} failed: {message}")]
    Mkfs { path: PathBuf, message: String },
    #[error(transparent)]
    Loop(#[from] loop_device::LoopError),
    #[error("mount the volume image {image} on {target}")]
    Mount {
        image: PathBuf,
        target: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error(transparent)]
    Unmount(#[from] LayerDiskError),
    #[error("volume id {0:?} is not a plain name")]
    BadId(String),
}

/// One volume mounted into a sandbox: the host's mount of the volume (`source`) appears at `target`
/// (absolute, inside the sandbox).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeBind {
    pub source: PathBuf,
    pub target: PathBuf,
}

impl VolumeBind {
    /// The key under which CRIU records this mount as external (`--external mnt[...]`): by position,
    /// so a restore maps it back to whatever host mount the same position has then.
    pub fn external_key(index: usize) -> String {
        format!("volume-{index}")
    }
}

/// Serialises mounting and unmounting: two sandboxes starting at once with the same volume must not
/// both mount it.
static MOUNTS: Mutex<()> = Mutex::new(());

/// Paths of one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeDisk {
    pub dir: PathBuf,
    pub image: PathBuf,
    pub mount_point: PathBuf,
}

impl VolumeDisk {
    /// The volume `id` under `volumes_dir` (the state dir's `volumes/`).
    pub fn at(volumes_dir: &Path, id: &str) -> Result<Self, VolumeDiskError> {
        let plain = !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !plain {
            return Err(VolumeDiskError::BadId(id.to_string()));
        }
        let dir = volumes_dir.join(id);
        Ok(Self {
            image: dir.join("volume.img"),
            mount_point: dir.join("mnt"),
            dir,
        })
    }

    /// Makes the image (`size_mib`, sparse, ext4 with a journal; its root dir mode 0777 so every
    /// user of a sandbox can write it) and mounts it. Fails if the volume's directory exists.
    pub fn create(&self, size_mib: u64) -> Result<(), VolumeDiskError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| VolumeDiskError::Io { path, source }
        };
        if let Some(parent) = self.dir.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::create_dir(&self.dir).map_err(io(&self.dir))?;
        let file = std::fs::File::create(&self.image).map_err(io(&self.image))?;
        file.set_len(size_mib.saturating_mul(1024 * 1024))
            .map_err(io(&self.image))?;
        drop(file);
        let output = Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0",
            ])
            .arg(&self.image)
            .output()
            .map_err(io(&self.image))?;
        if !output.status.success() {
            return Err(VolumeDiskError::Mkfs {
                path: self.image.clone(),
                message: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        self.ensure_mounted()?;
        // A fresh filesystem: nothing of a sandbox is on it yet, so plain paths are safe here.
        let _ = std::fs::remove_dir(self.mount_point.join("lost+found"));
        std::fs::set_permissions(
            &self.mount_point,
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .map_err(io(&self.mount_point))?;
        Ok(())
    }

    pub fn exists(&self) -> bool {
        self.image.exists()
    }

    pub fn is_mounted(&self) -> bool {
        is_mount_point(&self.mount_point)
    }

    /// Mounts the image unless it is mounted already (after a server restart it usually still is).
    pub fn ensure_mounted(&self) -> Result<(), VolumeDiskError> {
        let _held = MOUNTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.is_mounted() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.mount_point).map_err(|source| VolumeDiskError::Io {
            path: self.mount_point.clone(),
            source,
        })?;
        let device = loop_device::attach(&self.image)?;
        mount(
            Some(&device.path),
            &self.mount_point,
            Some("ext4"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME,
            None::<&str>,
        )
        .map_err(|source| VolumeDiskError::Mount {
            image: self.image.clone(),
            target: self.mount_point.clone(),
            source,
        })?;
        // The mount holds the device now; autoclear detaches it after the unmount.
        drop(device);
        Ok(())
    }

    /// Unmounts the host's mount (the loop device detaches itself). Sandboxes that still have the
    /// volume bound keep their own mounts; the filesystem lives on until the last goes.
    pub fn unmount(&self) -> Result<(), VolumeDiskError> {
        let _held = MOUNTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.as_layer().unmount()?;
        Ok(())
    }

    /// Unmounts and deletes the volume's directory and image.
    pub fn remove(&self) -> Result<(), VolumeDiskError> {
        self.unmount()?;
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(VolumeDiskError::Io {
                path: self.dir.clone(),
                source,
            }),
        }
    }

    /// Bytes used and total bytes of the volume's filesystem (mounted only).
    pub fn usage(&self) -> Option<(u64, u64)> {
        self.as_layer().usage()
    }

    fn as_layer(&self) -> LayerDisk {
        LayerDisk {
            image: self.image.clone(),
            mount_point: self.mount_point.clone(),
        }
    }
}

/// Unmounts every volume mounted under `volumes_dir` (crash recovery and `warren gc` when no server
/// runs): their loop devices detach with the mounts. Returns how many were unmounted.
pub fn unmount_all(volumes_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(volumes_dir) else {
        return 0;
    };
    let mut count = 0;
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(volume) = VolumeDisk::at(volumes_dir, &id) else {
            continue;
        };
        if volume.is_mounted() {
            match volume.unmount() {
                Ok(()) => count += 1,
                Err(error) => tracing::warn!(volume = %id, %error, "cannot unmount volume"),
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn ids_must_be_plain_names() {
        let dir = Path::new("/var/lib/warren/volumes");
        for bad in ["", "..", "a/b", "a b", "x\0"] {
            assert!(VolumeDisk::at(dir, bad).is_err(), "{bad:?}");
        }
        let ok = VolumeDisk::at(dir, "vol-1_a").unwrap();
        assert_eq!(ok.image, dir.join("vol-1_a/volume.img"));
    }

    #[test]
    fn a_volume_is_a_quota_and_leaves_no_mount_when_removed() {
        if !root() {
            eprintln!("skipped: needs root for loop devices and mounts");
            return;
        }
        let state = tempfile::Builder::new()
            .prefix("wt-volume-")
            .tempdir()
            .unwrap();
        let volume = VolumeDisk::at(state.path(), "v1").unwrap();
        volume.create(16).unwrap();
        assert!(volume.is_mounted());
        // Mounting again is a no-op, not a second mount.
        volume.ensure_mounted().unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let wanted = volume.mount_point.to_string_lossy().to_string();
        assert_eq!(
            mounts
                .lines()
                .filter(|l| l.split(' ').nth(4) == Some(wanted.as_str()))
                .count(),
            1
        );
        // Writing past the size ends in ENOSPC.
        let mut file = std::fs::File::create(volume.mount_point.join("big")).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut error = None;
        for _ in 0..32 {
            if let Err(e) = std::io::Write::write_all(&mut file, &chunk) {
                error = Some(e);
                break;
            }
        }
        let error = error.expect("a 16 MiB volume took 32 MiB");
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
        drop(file);
        // It survives an unmount and a mount again.
        volume.unmount().unwrap();
        assert!(!volume.is_mounted());
        volume.ensure_mounted().unwrap();
        assert!(volume.mount_point.join("big").exists());
        volume.remove().unwrap();
        assert!(!volume.dir.exists());
        assert!(loop_device::wait_detached(
            &volume.image,
            std::time::Duration::from_secs(5)
        ));
    }
}
