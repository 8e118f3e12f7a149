//! The files of a volume as `/volumecontent` serves them. A volume is written by sandboxes, so its
//! contents are hostile: everything here goes through [`ConfinedDir`] opened at the volume's host
//! mount, and a symlink anywhere in a path is refused (never followed), as is `..`. A symlink itself
//! can be listed, stat'ed and removed; its target is never touched.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use chrono::{TimeZone, Utc};
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode};
use warren_proto::api::VolumeEntryStat;
use warren_runtime::confined::{ConfinedDir, ConfinedError, EntryKind};

#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    #[error("path {0:?} {1}")]
    BadPath(String, &'static str),
    #[error("{0} not found in the volume")]
    NotFound(String),
    #[error("{0} exists already")]
    Exists(String),
    #[error("{path}: {why}")]
    Refused { path: String, why: String },
    #[error("the volume is full (its quota is {quota_mib} MiB)")]
    NoSpace { quota_mib: u64 },
    #[error("volume content")]
    Io(#[source] ConfinedError),
}

/// Turns the API's `path` (relative to the volume's root; a leading `/` is the root) into a relative
/// path, `.` for the root. `..`, NUL bytes and empty components with meaning are refused.
pub fn parse_path(raw: &str) -> Result<PathBuf, ContentError> {
    if raw.contains('\0') {
        return Err(ContentError::BadPath(raw.to_string(), "holds a NUL byte"));
    }
    let mut out = PathBuf::new();
    for component in Path::new(raw).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                return Err(ContentError::BadPath(
                    raw.to_string(),
                    "must not contain `..`",
                ))
            }
            Component::Normal(name) => out.push(name),
            Component::Prefix(_) => {
                return Err(ContentError::BadPath(raw.to_string(), "is not a unix path"))
            }
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Ok(out)
}

fn is_root(rel: &Path) -> bool {
    rel == Path::new(".")
}

/// The API's spelling of a relative path: `/a/b`.
fn shown(rel: &Path) -> String {
    if is_root(rel) {
        "/".to_string()
    } else {
        format!("/{}", rel.display())
    }
}

/// One volume's files, rooted at its host mount.
pub struct VolumeFiles {
    root: ConfinedDir,
    quota_mib: u64,
}

impl VolumeFiles {
    pub fn open(mount_point: &Path, quota_mib: u64) -> Result<Self, ContentError> {
        Ok(Self {
            root: ConfinedDir::open_root(mount_point).map_err(ContentError::Io)?,
            quota_mib,
        })
    }

    fn error(&self, rel: &Path, error: ConfinedError) -> ContentError {
        match &error {
            ConfinedError::Escape { .. } => ContentError::Refused {
                path: shown(rel),
                why: "a symlink is in the way; volume paths do not follow symlinks".into(),
            },
            ConfinedError::BadPath(_) => ContentError::BadPath(shown(rel), "is not a valid path"),
            ConfinedError::WrongType { expected, .. } => ContentError::Refused {
                path: shown(rel),
                why: format!("is not a {expected}"),
            },
            ConfinedError::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOENT) => ContentError::NotFound(shown(rel)),
                Some(libc::EEXIST) => ContentError::Exists(shown(rel)),
                Some(libc::ENOSPC) | Some(libc::EDQUOT) => ContentError::NoSpace {
                    quota_mib: self.quota_mib,
                },
                Some(libc::ENOTDIR) => ContentError::Refused {
                    path: shown(rel),
                    why: "a parent is not a directory".into(),
                },
                Some(libc::EISDIR) => ContentError::Refused {
                    path: shown(rel),
                    why: "is a directory".into(),
                },
                Some(libc::ENOTEMPTY) => ContentError::Refused {
                    path: shown(rel),
                    why: "is a non-empty directory".into(),
                },
                _ => ContentError::Io(error),
            },
        }
    }

    fn io(&self, rel: &Path, op: &'static str, errno: nix::Error) -> ContentError {
        self.error(
            rel,
            ConfinedError::Io {
                path: rel.to_path_buf(),
                op,
                source: errno.into(),
            },
        )
    }

    /// What is at `rel`, not following a symlink there.
    pub fn stat(&self, rel: &Path) -> Result<VolumeEntryStat, ContentError> {
        let stat = if is_root(rel) {
            nix::sys::stat::fstat(self.root.as_fd().as_raw_fd())
                .map_err(|e| self.io(rel, "stat", e))?
        } else {
            self.root.stat(rel).map_err(|e| self.error(rel, e))?
        };
        let target = if EntryKind::of(&stat) == EntryKind::Symlink {
            self.root
                .read_link(rel)
                .ok()
                .map(|t| t.to_string_lossy().into_owned())
        } else {
            None
        };
        Ok(entry(rel, &stat, target))
    }

    /// The entries of the directory at `rel`, `depth` levels deep (1: its own entries).
    pub fn list(&self, rel: &Path, depth: u32) -> Result<Vec<VolumeEntryStat>, ContentError> {
        let dir = if is_root(rel) {
            self.root
                .open_dir(Path::new("."))
                .map_err(|e| self.error(rel, e))?
        } else {
            self.root.open_dir(rel).map_err(|e| self.error(rel, e))?
        };
        let mut out = Vec::new();
        for name in dir.entries().map_err(|e| self.error(rel, e))? {
            let child = if is_root(rel) {
                PathBuf::from(&name)
            } else {
                rel.join(&name)
            };
            let Ok(stat) = self.stat(&child) else {
                continue;
            };
            let is_dir = stat.kind == "directory";
            out.push(stat);
            if is_dir && depth > 1 {
                out.extend(self.list(&child, depth - 1)?);
            }
        }
        Ok(out)
    }

    /// Makes the directory `rel` (`force`: its missing parents too), then applies the owner and mode.
    pub fn make_dir(
        &self,
        rel: &Path,
        force: bool,
        owner: Owner,
    ) -> Result<VolumeEntryStat, ContentError> {
        let (parent, name) = self.parent(rel, force)?;
        let mode = owner.mode.unwrap_or(0o755);
        match nix::sys::stat::mkdirat(
            Some(parent.as_fd().as_raw_fd()),
            name.as_os_str(),
            Mode::from_bits_truncate(mode),
        ) {
            Ok(()) => {}
            Err(nix::Error::EEXIST) if force => {}
            Err(e) => return Err(self.io(rel, "create directory", e)),
        }
        let fd = self
            .root
            .open(rel, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
            .map_err(|e| self.error(rel, e))?;
        self.apply(rel, &fd, owner)?;
        self.stat(rel)
    }

    /// Opens a new temporary file beside `rel` for [`Self::finish_write`]; `force` makes missing
    /// parents.
    pub fn begin_write(&self, rel: &Path, force: bool) -> Result<PendingWrite, ContentError> {
        let (parent, name) = self.parent(rel, force)?;
        let temp = format!(".warren-upload-{}", rand_suffix());
        let fd = parent
            .open(
                Path::new(&temp),
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                Mode::from_bits_truncate(0o600),
            )
            .map_err(|e| self.error(rel, e))?;
        Ok(PendingWrite {
            parent,
            name,
            temp,
            file: Some(std::fs::File::from(fd)),
        })
    }

    /// Gives the written file its owner and mode and puts it at its name (replacing a file or a
    /// symlink there, never writing through one).
    pub fn finish_write(
        &self,
        rel: &Path,
        mut pending: PendingWrite,
        owner: Owner,
    ) -> Result<VolumeEntryStat, ContentError> {
        let file = pending
            .file
            .take()
            .ok_or_else(|| ContentError::NotFound(shown(rel)))?;
        let owner = Owner {
            mode: Some(owner.mode.unwrap_or(0o644)),
            ..owner
        };
        let fd: OwnedFd = file.into();
        self.apply(rel, &fd, owner)?;
        nix::fcntl::renameat(
            Some(pending.parent.as_fd().as_raw_fd()),
            pending.temp.as_str(),
            Some(pending.parent.as_fd().as_raw_fd()),
            pending.name.as_os_str(),
        )
        .map_err(|e| self.io(rel, "replace", e))?;
        pending.temp.clear();
        self.stat(rel)
    }

    /// A regular file to read (FIFOs, devices and symlinks refused).
    pub fn open_file(&self, rel: &Path) -> Result<std::fs::File, ContentError> {
        if is_root(rel) {
            return Err(ContentError::Refused {
                path: "/".into(),
                why: "is a directory".into(),
            });
        }
        self.root.open_file(rel).map_err(|e| self.error(rel, e))
    }

    /// Removes `rel` (a directory with everything in it; a symlink itself, not its target).
    pub fn remove(&self, rel: &Path) -> Result<(), ContentError> {
        if is_root(rel) {
            return Err(ContentError::BadPath(
                "/".into(),
                "is the volume's root, which cannot be removed",
            ));
        }
        let (parent, name) = self.parent(rel, false)?;
        self.remove_entry(&parent, &name, rel)
    }

    fn remove_entry(
        &self,
        parent: &ConfinedDir,
        name: &OsStr,
        rel: &Path,
    ) -> Result<(), ContentError> {
        let stat = nix::sys::stat::fstatat(
            Some(parent.as_fd().as_raw_fd()),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| self.io(rel, "stat", e))?;
        let flag = if EntryKind::of(&stat) == EntryKind::Dir {
            let dir = parent
                .open_dir(Path::new(name))
                .map_err(|e| self.error(rel, e))?;
            for child in dir.entries().map_err(|e| self.error(rel, e))? {
                self.remove_entry(&dir, &child, &rel.join(&child))?;
            }
            nix::unistd::UnlinkatFlags::RemoveDir
        } else {
            nix::unistd::UnlinkatFlags::NoRemoveDir
        };
        nix::unistd::unlinkat(Some(parent.as_fd().as_raw_fd()), name, flag)
            .map_err(|e| self.io(rel, "remove", e))
    }

    /// Changes the owner and mode of `rel` (a symlink is refused: its mode means nothing).
    pub fn update(&self, rel: &Path, owner: Owner) -> Result<VolumeEntryStat, ContentError> {
        let fd = if is_root(rel) {
            self.root
                .open(Path::new("."), OFlag::O_PATH, Mode::empty())
                .map_err(|e| self.error(rel, e))?
        } else {
            self.root
                .open(rel, OFlag::O_PATH, Mode::empty())
                .map_err(|e| self.error(rel, e))?
        };
        self.apply(rel, &fd, owner)?;
        self.stat(rel)
    }

    /// Applies `owner` to the inode `fd` holds (an `O_PATH` descriptor is fine: chown goes through
    /// `AT_EMPTY_PATH`, chmod through the descriptor's own `/proc/self/fd` entry, both on the inode we
    /// opened, never on a path resolved again).
    fn apply(&self, rel: &Path, fd: &OwnedFd, owner: Owner) -> Result<(), ContentError> {
        if owner.uid.is_some() || owner.gid.is_some() {
            let uid = owner.uid.unwrap_or(u32::MAX);
            let gid = owner.gid.unwrap_or(u32::MAX);
            // SAFETY: fchownat reads the empty NUL-terminated path; the descriptor is ours.
            let rc = unsafe {
                libc::fchownat(
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    uid,
                    gid,
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if rc != 0 {
                return Err(self.io(rel, "chown", nix::Error::last()));
            }
        }
        if let Some(mode) = owner.mode {
            let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .map_err(|_| ContentError::BadPath(shown(rel), "is not a valid path"))?;
            nix::sys::stat::fchmodat(
                None,
                path.as_c_str(),
                Mode::from_bits_truncate(mode & 0o7777),
                nix::sys::stat::FchmodatFlags::FollowSymlink,
            )
            .map_err(|e| self.io(rel, "chmod", e))?;
        }
        Ok(())
    }

    /// The directory `rel` goes in (made with `force`) and its last component.
    fn parent(
        &self,
        rel: &Path,
        force: bool,
    ) -> Result<(ConfinedDir, std::ffi::OsString), ContentError> {
        if is_root(rel) {
            return Err(ContentError::BadPath(
                "/".into(),
                "is the volume's root; name an entry below it",
            ));
        }
        let name = rel
            .file_name()
            .ok_or_else(|| ContentError::BadPath(shown(rel), "has no name"))?
            .to_os_string();
        let parent_rel = rel
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let parent = if force && !is_root(parent_rel) {
            self.root.create_dir_all(parent_rel, 0o755)
        } else {
            self.root.open_dir(parent_rel)
        }
        .map_err(|e| self.error(parent_rel, e))?;
        Ok((parent, name))
    }

    pub fn quota_mib(&self) -> u64 {
        self.quota_mib
    }
}

/// A file being uploaded: written under a temporary name, renamed into place at the end; removed
/// if dropped before that.
pub struct PendingWrite {
    parent: ConfinedDir,
    name: std::ffi::OsString,
    temp: String,
    file: Option<std::fs::File>,
}

impl PendingWrite {
    /// The file to write the body into (once).
    pub fn take_file(&mut self) -> Option<std::fs::File> {
        self.file.take()
    }

    pub fn put_back(&mut self, file: std::fs::File) {
        self.file = Some(file);
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if !self.temp.is_empty() {
            let _ = nix::unistd::unlinkat(
                Some(self.parent.as_fd().as_raw_fd()),
                self.temp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// The owner and mode a request asks for (`None`: leave as is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

fn rand_suffix() -> String {
    use rand::Rng;
    format!("{:016x}", rand::rng().random::<u64>())
}

fn time(seconds: i64, nanos: i64) -> String {
    Utc.timestamp_opt(seconds, nanos.clamp(0, 999_999_999) as u32)
        .single()
        .unwrap_or_default()
        .to_rfc3339()
}

fn entry(rel: &Path, stat: &FileStat, target: Option<String>) -> VolumeEntryStat {
    let kind = match EntryKind::of(stat) {
        EntryKind::Dir => "directory",
        EntryKind::File => "file",
        EntryKind::Symlink => "symlink",
        EntryKind::Special => "unknown",
    };
    let name = if is_root(rel) {
        String::new()
    } else {
        rel.file_name()
            .map(|n| String::from_utf8_lossy(n.as_bytes()).into_owned())
            .unwrap_or_default()
    };
    VolumeEntryStat {
        name,
        kind: kind.to_string(),
        path: shown(rel),
        size: stat.st_size.max(0) as u64,
        mode: stat.st_mode & 0o7777,
        uid: stat.st_uid,
        gid: stat.st_gid,
        atime: time(stat.st_atime, stat.st_atime_nsec),
        mtime: time(stat.st_mtime, stat.st_mtime_nsec),
        ctime: time(stat.st_ctime, stat.st_ctime_nsec),
        target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_relative_to_the_root_and_never_climb() {
        assert_eq!(parse_path("/a/b").unwrap(), PathBuf::from("a/b"));
        assert_eq!(parse_path("a/./b/").unwrap(), PathBuf::from("a/b"));
        assert_eq!(parse_path("/").unwrap(), PathBuf::from("."));
        assert_eq!(parse_path("").unwrap(), PathBuf::from("."));
        assert!(matches!(
            parse_path("/a/../../etc"),
            Err(ContentError::BadPath(..))
        ));
        assert!(matches!(parse_path("a\0b"), Err(ContentError::BadPath(..))));
    }
}
