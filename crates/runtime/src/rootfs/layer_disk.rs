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
    #[error("prepare the seeded image {path}: {message}")]
    Seeding { path: PathBuf, message: String },
}

/// Why [`LayerDisk::create_seeded`] failed: the disk, or the caller's filling of the seed.
#[derive(Debug)]
pub enum SeedError<E> {
    Disk(LayerDiskError),
    Fill(E),
}

impl<E> From<LayerDiskError> for SeedError<E> {
    fn from(error: LayerDiskError) -> Self {
        Self::Disk(error)
    }
}

/// The seeded images are trimmed, least recently used first, to this many allocated bytes.
pub const SEED_CACHE_BYTES: u64 = 2 << 30;

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

    /// Creates the image as a sparse copy of a seeded one: an image of `size_mib` whose `upper/`
    /// `fill` filled once, kept in `seeds` under `key` (what the contents depend on, e.g. a layer
    /// archive's checksum). Many sandboxes started from one checkpoint (a template's, a fork's) then
    /// each copy the allocated blocks of one image instead of unpacking the layer again. The seed is
    /// made in a mount namespace of its own, so a crash mid-fill leaves no mount or loop device on
    /// the host; concurrent first users wait for one filler.
    pub fn create_seeded<E>(
        &self,
        size_mib: u64,
        image_cache: &Path,
        seeds: &Path,
        key: &str,
        fill: impl Fn(&Path) -> Result<(), E> + Sync,
    ) -> Result<(), SeedError<E>>
    where
        E: Send,
    {
        // Trimmed by another create between our finding it and opening it: made again, once.
        for last in [false, true] {
            let seed = seeded_image(image_cache, seeds, size_mib, key, &fill)?;
            match sparse_copy(&seed, &self.image) {
                Ok(()) => break,
                Err(LayerDiskError::Image { path, source })
                    if !last && path == seed && source.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error.into()),
            }
        }
        self.mount()?;
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

/// The image `seeds/<key>-<size>m.img`, made on first use: a copy of the pristine image of that size
/// with `upper/` filled by `fill` and an empty `work/`.
fn seeded_image<E: Send>(
    image_cache: &Path,
    seeds: &Path,
    size_mib: u64,
    key: &str,
    fill: &(impl Fn(&Path) -> Result<(), E> + Sync),
) -> Result<PathBuf, SeedError<E>> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(SeedError::Disk(LayerDiskError::Seeding {
            path: seeds.to_path_buf(),
            message: format!("{key:?} is not a cache key"),
        }));
    }
    let name = format!("{key}-{size_mib}m");
    let path = seeds.join(format!("{name}.img"));
    let image_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LayerDiskError::Image { path, source }
    };
    if mark_used(&path) {
        return Ok(path);
    }
    std::fs::create_dir_all(seeds).map_err(image_err(seeds))?;
    let lock_path = seeds.join(format!(".{name}.lock"));
    let lock = std::fs::File::create(&lock_path).map_err(image_err(&lock_path))?;
    // SAFETY: flock on a file we own; released when `lock` is closed.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(image_err(&lock_path)(std::io::Error::last_os_error()).into());
    }
    // Whoever held the lock before us may have made it.
    if mark_used(&path) {
        return Ok(path);
    }
    let pristine = pristine_image(image_cache, size_mib)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let temp = seeds.join(format!(".seed-{}-{nanos}.img", std::process::id()));
    let mount_point = seeds.join(format!(".seed-{}-{nanos}.mnt", std::process::id()));
    let made = (|| {
        sparse_copy(&pristine, &temp)?;
        std::fs::create_dir(&mount_point).map_err(image_err(&mount_point))?;
        let filled = fill_privately(&temp, &mount_point, fill);
        let _ = std::fs::remove_dir(&mount_point);
        filled?;
        if !loop_device::wait_detached(&temp, std::time::Duration::from_secs(5)) {
            return Err(SeedError::Disk(LayerDiskError::Seeding {
                path: temp.clone(),
                message: "its loop device is still attached 5 s after the unmount".into(),
            }));
        }
        std::fs::rename(&temp, &path).map_err(image_err(&path))?;
        Ok(())
    })();
    if let Err(error) = made {
        let _ = std::fs::remove_file(&temp);
        return Err(error);
    }
    drop(lock);
    trim_seeds(seeds, SEED_CACHE_BYTES);
    Ok(path)
}

/// Removes the seeded images made under `key`, of every size.
pub fn forget_seeds(seeds: &Path, key: &str) {
    let prefix = format!("{key}-");
    for entry in std::fs::read_dir(seeds).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with("m.img") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether `path` exists; if so its modification time becomes now (the trimming order).
fn mark_used(path: &Path) -> bool {
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(file) => {
            let _ = file.set_modified(std::time::SystemTime::now());
            true
        }
        Err(_) => false,
    }
}

/// Mounts `image` at `mount_point` in a new mount namespace of a thread of its own, makes `upper/`
/// and `work/` and runs `fill` on `upper/` (a process it starts runs in that namespace too). The
/// mount is the namespace's alone: it goes away with the thread, even if `fill` panics, and the loop
/// device (autoclear) with it.
fn fill_privately<E: Send>(
    image: &Path,
    mount_point: &Path,
    fill: &(impl Fn(&Path) -> Result<(), E> + Sync),
) -> Result<(), SeedError<E>> {
    let seeding = |message: String| {
        SeedError::Disk(LayerDiskError::Seeding {
            path: image.to_path_buf(),
            message,
        })
    };
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
                    .map_err(|e| seeding(format!("new mount namespace: {e}")))?;
                // Nothing mounted here may show up in the host's namespace.
                super::sandbox_mounts::make_private()
                    .map_err(|e| seeding(format!("make the mount namespace private: {e}")))?;
                let disk = LayerDisk {
                    image: image.to_path_buf(),
                    mount_point: mount_point.to_path_buf(),
                };
                disk.mount()?;
                let filled = (|| {
                    for dir in [disk.upper(), disk.work()] {
                        std::fs::create_dir(&dir)
                            .map_err(|source| LayerDiskError::Seed { path: dir, source })?;
                    }
                    fill(&disk.upper()).map_err(SeedError::Fill)
                })();
                umount2(mount_point, MntFlags::empty())
                    .map_err(|e| seeding(format!("unmount: {e}")))?;
                filled
            })
            .join()
            .unwrap_or_else(|_| Err(seeding("the filling thread panicked".into())))
    })
}

/// Removes the least recently used seeded images until their allocated bytes are at most
/// `max_bytes`, and the leftovers of fills whose process is gone.
fn trim_seeds(seeds: &Path, max_bytes: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir(seeds) else {
        return;
    };
    let mut images = Vec::new();
    let mut locks = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if let Some(rest) = name.strip_prefix(".seed-") {
            let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
            let alive = pid.is_some_and(|pid| {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            });
            if !alive {
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_dir(&path);
            }
            continue;
        }
        if name.starts_with('.') && name.ends_with(".lock") {
            locks.push(path);
            continue;
        }
        if name.ends_with(".img") && !name.starts_with('.') {
            if let Ok(meta) = entry.metadata() {
                images.push((meta.modified().ok(), meta.blocks() * 512, path));
            }
        }
    }
    let mut total: u64 = images.iter().map(|(_, bytes, _)| bytes).sum();
    images.sort();
    for (_, bytes, path) in images {
        if total <= max_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(bytes);
        }
    }
    // A lock whose image is gone and that nobody holds (a filler holds it until its rename).
    for lock in locks {
        let name = lock.file_name().unwrap_or_default().to_string_lossy();
        let image = seeds.join(format!(
            "{}.img",
            name.trim_start_matches('.').trim_end_matches(".lock")
        ));
        let Ok(file) = std::fs::File::open(&lock) else {
            continue;
        };
        // SAFETY: flock on a file we own; released when `file` is closed.
        let free = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } == 0;
        if free && !image.exists() {
            let _ = std::fs::remove_file(&lock);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wt-seeds-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn image(path: &Path, used_secs_ago: u64) {
        std::fs::write(path, vec![1u8; 1 << 20]).unwrap();
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(used_secs_ago))
            .unwrap();
    }

    #[test]
    fn trimming_drops_the_least_recently_used_seeds_and_dead_fills() {
        let dir = temp("trim");
        image(&dir.join("old-64m.img"), 300);
        image(&dir.join("mid-64m.img"), 200);
        image(&dir.join("new-64m.img"), 100);
        // No process has this PID (above any pid_max); ours is alive.
        let dead = dir.join(".seed-2147483647-1.img");
        let ours = dir.join(format!(".seed-{}-2.img", std::process::id()));
        std::fs::write(&dead, b"x").unwrap();
        std::fs::write(&ours, b"x").unwrap();
        std::fs::create_dir(dir.join(".seed-2147483647-1.mnt")).unwrap();
        // Locks: of a kept image, of a trimmed one, of one never made, and one held.
        for lock in ["mid-64m", "old-64m", "gone-64m", "held-64m"] {
            std::fs::write(dir.join(format!(".{lock}.lock")), b"").unwrap();
        }
        let held = std::fs::File::open(dir.join(".held-64m.lock")).unwrap();
        // SAFETY: flock on a file we own.
        let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) };
        assert_eq!(locked, 0);

        trim_seeds(&dir, (5 << 20) / 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        drop(held);
        let mut expected = vec![
            format!(".seed-{}-2.img", std::process::id()),
            ".held-64m.lock".to_string(),
            ".mid-64m.lock".to_string(),
            "mid-64m.img".to_string(),
            "new-64m.img".to_string(),
        ];
        expected.sort();
        assert_eq!(left, expected);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_key_that_could_name_another_path_is_refused_before_any_fill() {
        let dir = temp("key");
        let filled = std::sync::atomic::AtomicBool::new(false);
        let fill = |_: &Path| {
            filled.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<(), String>(())
        };
        for key in ["", "../x", "a/b", "a b"] {
            let result = seeded_image(&dir.join("images"), &dir, 64, key, &fill);
            assert!(
                matches!(result, Err(SeedError::Disk(LayerDiskError::Seeding { .. }))),
                "{key:?}"
            );
        }
        assert!(!filled.into_inner(), "a refused key was filled");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
