//! The sandbox's writable layer: a sparse ext4 image of `disk_mib`, loop-mounted on the host at
//! `sandboxes/<id>/disk`, holding the overlay `upper/` and `work/` dirs. Writes past the size end in
//! ENOSPC inside the sandbox and touch nothing else; the image survives the sandbox's processes (CRIU can
//! dump and restore the layer as files).

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::loop_device;
use crate::confined::{ConfinedDir, ConfinedError};

#[derive(Debug, thiserror::Error)]
pub enum LayerDiskError {
    #[error("create disk image {path}")]
    Image {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mkfs.ext4 on {path} failed: {message}")]
    Mkfs { path: PathBuf, message: String },
    #[error(transparent)]
    Loop(#[from] loop_device::LoopError),
    #[error("mount {device} on {target}")]
    Mount {
        device: PathBuf,
        target: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("unmount {target}")]
    Unmount {
        target: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("prepare {path}")]
    Seed {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("seed the writable layer")]
    Confined(#[from] ConfinedError),
}

/// Paths of one sandbox's writable layer.
#[derive(Debug, Clone)]
pub struct LayerDisk {
    pub image: PathBuf,
    pub mount_point: PathBuf,
}

impl LayerDisk {
    pub fn at(sandbox_dir: &Path) -> Self {
        Self {
            image: sandbox_dir.join("disk.img"),
            mount_point: sandbox_dir.join("disk"),
        }
    }

    pub fn upper(&self) -> PathBuf {
        self.mount_point.join("upper")
    }

    pub fn work(&self) -> PathBuf {
        self.mount_point.join("work")
    }

    /// Creates the image as a sparse copy of a freshly formatted one of the same size (formatted once
    /// per size into `image_cache`), mounts it and makes `upper/` and `work/`.
    pub fn create(&self, size_mib: u64, image_cache: &Path) -> Result<(), LayerDiskError> {
        let pristine = pristine_image(image_cache, size_mib)?;
        sparse_copy(&pristine, &self.image)?;
        self.mount()?;
        for dir in [self.upper(), self.work()] {
            std::fs::create_dir(&dir).map_err(|source| LayerDiskError::Seed {
                path: dir.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Loop-mounts the existing image at the mount point (also used to re-attach after a restore).
    pub fn mount(&self) -> Result<(), LayerDiskError> {
        std::fs::create_dir_all(&self.mount_point).map_err(|source| LayerDiskError::Seed {
            path: self.mount_point.clone(),
            source,
        })?;
        let device = loop_device::attach(&self.image)?;
        mount(
            Some(&device.path),
            &self.mount_point,
            Some("ext4"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOATIME,
            None::<&str>,
        )
        .map_err(|source| LayerDiskError::Mount {
            device: device.path.clone(),
            target: self.mount_point.clone(),
            source,
        })?;
        // The mount now holds the device; our handle can go (autoclear detaches it after the unmount).
        drop(device);
        Ok(())
    }

    pub fn is_mounted(&self) -> bool {
        is_mount_point(&self.mount_point)
    }

    /// Unmounts the layer; the loop device detaches itself (waited for, so that a destroyed
    /// sandbox leaves no device behind).
    pub fn unmount(&self) -> Result<(), LayerDiskError> {
        if !self.is_mounted() {
            return Ok(());
        }
        self.unmount_mount()?;
        if !loop_device::wait_detached(&self.image, std::time::Duration::from_secs(5)) {
            tracing::warn!(image = %self.image.display(), "the layer's loop device is still attached 5 s after the unmount");
        }
        Ok(())
    }

    fn unmount_mount(&self) -> Result<(), LayerDiskError> {
        // A sandbox mount namespace that is just going away can still hold the mount for a moment.
        for _ in 0..200 {
            match umount2(&self.mount_point, MntFlags::empty()) {
                Ok(()) => return Ok(()),
                Err(nix::Error::EBUSY) => std::thread::sleep(std::time::Duration::from_millis(5)),
                Err(nix::Error::EINVAL) => return Ok(()),
                Err(source) => {
                    return Err(LayerDiskError::Unmount {
                        target: self.mount_point.clone(),
                        source,
                    })
                }
            }
        }
        umount2(&self.mount_point, MntFlags::MNT_DETACH).map_err(|source| LayerDiskError::Unmount {
            target: self.mount_point.clone(),
            source,
        })
    }

    /// Bytes used and total bytes of the layer's filesystem.
    pub fn usage(&self) -> Option<(u64, u64)> {
        if !self.is_mounted() {
            return None;
        }
        let stat = nix::sys::statvfs::statvfs(&self.mount_point).ok()?;
        let block = stat.fragment_size();
        let total = stat.blocks() * block;
        let free = stat.blocks_free() * block;
        Some((total - free, total))
    }

    /// Puts the files the runtime provides into the upper dir: the agent's mount point, hostname and
    /// hosts (and the host's resolv.conf).
    ///
    /// The upper dir is the sandbox's own, written by its root: everything here goes through
    /// [`ConfinedDir`], so a symlink or hard link the sandbox left at one of these names (or a
    /// symlinked `/etc` or `/.warren`) is replaced or refused, never followed onto the host.
    pub fn seed(&self, hostname: &str, ip: std::net::Ipv4Addr) -> Result<(), LayerDiskError> {
        let upper = ConfinedDir::open_root(&self.upper())?;
        let hosts = format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{ip}\t{hostname}\n"
        );
        let mut files: Vec<(&str, Vec<u8>, u32)> = vec![
            (".warren/agent", Vec::new(), 0o755),
            ("etc/hostname", format!("{hostname}\n").into_bytes(), 0o644),
            ("etc/hosts", hosts.into_bytes(), 0o644),
        ];
        if let Ok(resolv) = std::fs::read("/etc/resolv.conf") {
            files.push(("etc/resolv.conf", resolv, 0o644));
        }
        for (path, contents, mode) in files {
            upper.replace_file(Path::new(path), &contents, mode)?;
        }
        Ok(())
    }
}

/// A formatted, never mounted ext4 image of `size_mib` in `cache`, made on first use (temp + rename, so
/// concurrent callers never see a half-formatted one).
fn pristine_image(cache: &Path, size_mib: u64) -> Result<PathBuf, LayerDiskError> {
    let path = cache.join(format!("ext4-{size_mib}m.img"));
    if path.exists() {
        return Ok(path);
    }
    let image_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LayerDiskError::Image { path, source }
    };
    std::fs::create_dir_all(cache).map_err(image_err(cache))?;
    let temp = cache.join(format!(
        ".ext4-{size_mib}m.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let file = std::fs::File::create(&temp).map_err(image_err(&temp))?;
    file.set_len(size_mib.saturating_mul(1024 * 1024))
        .map_err(image_err(&temp))?;
    drop(file);
    // No journal (a throwaway layer; CRIU copies files, not the journal), no reserved blocks, lazy
    // inode tables: the formatted image holds well under a MiB of data.
    let output = Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-O",
            "^has_journal",
            "-E",
            "lazy_itable_init=1,nodiscard",
        ])
        .arg(&temp)
        .output()
        .map_err(|source| LayerDiskError::Mkfs {
            path: temp.clone(),
            message: source.to_string(),
        })?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&temp);
        return Err(LayerDiskError::Mkfs {
            path: temp,
            message: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    std::fs::rename(&temp, &path).map_err(image_err(&path))?;
    Ok(path)
}

/// Copies only the data extents of `from` into a new file `to` of the same length (holes stay holes).
fn sparse_copy(from: &Path, to: &Path) -> Result<(), LayerDiskError> {
    use nix::unistd::{lseek, Whence};
    use std::os::fd::{AsFd, AsRawFd};
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: std::io::Error| LayerDiskError::Image { path, source }
    };
    let errno = |path: &Path| {
        let path = path.to_path_buf();
        move |e: nix::Error| LayerDiskError::Image {
            path,
            source: e.into(),
        }
    };
    let source = std::fs::File::open(from).map_err(err(from))?;
    let length = source.metadata().map_err(err(from))?.len();
    let target = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(err(to))?;
    target.set_len(length).map_err(err(to))?;
    let mut offset: i64 = 0;
    while (offset as u64) < length {
        let data = match lseek(source.as_raw_fd(), offset, Whence::SeekData) {
            Ok(data) => data,
            Err(nix::Error::ENXIO) => break,
            Err(e) => return Err(errno(from)(e)),
        };
        let hole = lseek(source.as_raw_fd(), data, Whence::SeekHole).map_err(errno(from))?;
        let (mut read_at, mut write_at) = (data, data);
        while read_at < hole {
            let remaining = (hole - read_at) as usize;
            let copied = nix::fcntl::copy_file_range(
                source.as_fd(),
                Some(&mut read_at),
                target.as_fd(),
                Some(&mut write_at),
                remaining,
            )
            .map_err(errno(to))?;
            if copied == 0 {
                break;
            }
        }
        offset = hole;
    }
    Ok(())
}

/// Whether `path` is a mount point (listed in /proc/self/mountinfo).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.to_string_lossy();
    info.lines()
        .any(|line| line.split(' ').nth(4) == Some(&wanted))
}
