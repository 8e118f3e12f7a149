//! Host-side access to files a sandbox can write: its writable layer, a build sandbox's layer, anything
//! under a directory whose contents are hostile.
//!
//! Host code runs as root, so following a symlink a sandbox planted (`/etc/hostname -> /host/file`), or
//! a directory it swapped for one while we walk it, means reading or writing host files with root's
//! rights. Every such access goes through [`ConfinedDir`]: a directory opened once from a trusted path,
//! below which every path is resolved by the kernel with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
//! | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`. A symlink anywhere in the path, a `..` that would leave
//! the directory, a mount point or a `/proc` magic link makes the call fail instead of being followed,
//! and the check and the use are one system call, so a path swapped between them cannot win.
//!
//! What the other operations guarantee:
//! - writes replace the directory entry ([`ConfinedDir::replace_file`]: a new file, then `renameat`), so
//!   a symlink or a hard link to some other inode at that name is replaced, never written through;
//! - reads open with `O_NONBLOCK` and accept only regular files (a FIFO planted at a log's path cannot
//!   hang the host, a device node cannot be read);
//! - names handed to the `*at` calls are single components resolved against a directory fd we hold.

use std::ffi::{CString, OsStr, OsString};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

#[derive(Debug, thiserror::Error)]
pub enum ConfinedError {
    #[error("{path}: {op}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: a symlink, mount point or path outside {root} is in the way; not followed")]
    Escape { path: PathBuf, root: PathBuf },
    #[error("{0}: must be a relative path without `..`")]
    BadPath(PathBuf),
    #[error("{path}: expected a {expected}")]
    WrongType {
        path: PathBuf,
        expected: &'static str,
    },
}

impl ConfinedError {
    /// Whether the call failed because nothing exists at the path.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ConfinedError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// For callers whose errors carry `std::io::Error`: the kind of the underlying failure (an escape
/// reads as permission denied), the whole message kept.
impl From<ConfinedError> for std::io::Error {
    fn from(error: ConfinedError) -> std::io::Error {
        let kind = match &error {
            ConfinedError::Io { source, .. } => source.kind(),
            ConfinedError::Escape { .. } => std::io::ErrorKind::PermissionDenied,
            ConfinedError::BadPath(_) | ConfinedError::WrongType { .. } => {
                std::io::ErrorKind::InvalidInput
            }
        };
        std::io::Error::new(kind, error)
    }
}

const RESOLVE: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS)
    .union(ResolveFlag::RESOLVE_NO_XDEV);

/// A directory whose contents are not trusted, and the only way Warren's host code touches them.
#[derive(Debug)]
pub struct ConfinedDir {
    fd: OwnedFd,
    /// For messages only: where this directory is on the host.
    path: PathBuf,
    /// For messages only: the root the confinement started from.
    root: PathBuf,
}

/// What is at a name, not following a symlink there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    Symlink,
    /// Device nodes (overlayfs whiteouts among them), FIFOs, sockets.
    Special,
}

impl EntryKind {
    pub fn of(stat: &FileStat) -> EntryKind {
        match SFlag::from_bits_truncate(stat.st_mode & libc::S_IFMT) {
            SFlag::S_IFDIR => EntryKind::Dir,
            SFlag::S_IFREG => EntryKind::File,
            SFlag::S_IFLNK => EntryKind::Symlink,
            _ => EntryKind::Special,
        }
    }
}

impl ConfinedDir {
    /// Opens `root`, a trusted host path (Warren made it), as the top of a confined tree. A symlink as
    /// its last component is refused too.
    pub fn open_root(root: &Path) -> Result<ConfinedDir, ConfinedError> {
        let fd = nix::fcntl::open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(root, "open", e))?;
        Ok(ConfinedDir {
            // SAFETY: `open` returned a new descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: root.to_path_buf(),
            root: root.to_path_buf(),
        })
    }

    /// Where this directory is on the host (for messages and for tools that need a path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens `rel` below this directory with the confined resolution; `flags` gain `O_CLOEXEC`. A
    /// symlink as the last component fails like any other (`RESOLVE_NO_SYMLINKS`; no `O_NOFOLLOW`, which
    /// would hand out a descriptor of the link itself with `O_PATH`).
    pub fn open(&self, rel: &Path, flags: OFlag, mode: Mode) -> Result<OwnedFd, ConfinedError> {
        check_relative(rel)?;
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .mode(mode)
            .resolve(RESOLVE);
        match nix::fcntl::openat2(self.fd.as_raw_fd(), rel, how) {
            // SAFETY: openat2 returned a new descriptor that nothing else owns.
            Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(nix::Error::ELOOP | nix::Error::EXDEV) => Err(ConfinedError::Escape {
                path: self.path.join(rel),
                root: self.root.clone(),
            }),
            Err(e) => Err(io(&self.path.join(rel), "open", e)),
        }
    }

    /// The directory at `rel` (a real directory below this one).
    pub fn open_dir(&self, rel: &Path) -> Result<ConfinedDir, ConfinedError> {
        let fd = self.open(rel, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())?;
        Ok(self.child(fd, rel))
    }

    fn child(&self, fd: OwnedFd, rel: &Path) -> ConfinedDir {
        let path = if rel == Path::new(".") {
            self.path.clone()
        } else {
            self.path.join(rel)
        };
        ConfinedDir {
            fd,
            path,
            root: self.root.clone(),
        }
    }

    /// Makes `rel` and its missing parents (`mode`, root-owned), each a real directory; an existing
    /// symlink or file in the way is an error, never followed or replaced.
    pub fn create_dir_all(&self, rel: &Path, mode: u32) -> Result<ConfinedDir, ConfinedError> {
        check_relative(rel)?;
        let mut dir = self.open_dir(Path::new("."))?;
        for component in rel.components() {
            let Component::Normal(name) = component else {
                continue;
            };
            match nix::sys::stat::mkdirat(
                Some(dir.fd.as_raw_fd()),
                name,
                Mode::from_bits_truncate(mode),
            ) {
                Ok(()) | Err(nix::Error::EEXIST) => {}
                Err(e) => return Err(io(&dir.path.join(name), "create directory", e)),
            }
            dir = dir.open_dir(Path::new(name)).map_err(|e| match e {
                ConfinedError::Io { path, source, .. }
                    if source.raw_os_error() == Some(libc::ENOTDIR) =>
                {
                    ConfinedError::WrongType {
                        path,
                        expected: "directory",
                    }
                }
                other => other,
            })?;
        }
        Ok(dir)
    }

    /// What is at `rel`, not following a symlink there (the parents are resolved confined).
    pub fn stat(&self, rel: &Path) -> Result<FileStat, ConfinedError> {
        let (parent, name) = self.parent_and_name(rel)?;
        nix::sys::stat::fstatat(
            Some(parent.fd.as_raw_fd()),
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io(&self.path.join(rel), "stat", e))
    }

    /// Opens the regular file at `rel` for reading. FIFOs, devices, sockets, directories and symlinks
    /// are refused without blocking.
    pub fn open_file(&self, rel: &Path) -> Result<std::fs::File, ConfinedError> {
        let fd = self.open(
            rel,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
            Mode::empty(),
        )?;
        let stat = nix::sys::stat::fstat(fd.as_raw_fd())
            .map_err(|e| io(&self.path.join(rel), "stat", e))?;
        if EntryKind::of(&stat) != EntryKind::File {
            return Err(ConfinedError::WrongType {
                path: self.path.join(rel),
                expected: "regular file",
            });
        }
        let file = std::fs::File::from(fd);
        // Back to blocking reads: the O_NONBLOCK was only for the open of something that is not a file.
        nix::fcntl::fcntl(
            file.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()),
        )
        .map_err(|e| io(&self.path.join(rel), "set flags", e))?;
        Ok(file)
    }

    /// At most the last `max` bytes of the regular file at `rel`.
    pub fn read_tail(&self, rel: &Path, max: u64) -> Result<Vec<u8>, ConfinedError> {
        let mut file = self.open_file(rel)?;
        let err = |e: std::io::Error| ConfinedError::Io {
            path: self.path.join(rel),
            op: "read",
            source: e,
        };
        let len = file.metadata().map_err(err)?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(max)))
            .map_err(err)?;
        let mut out = Vec::new();
        file.take(max).read_to_end(&mut out).map_err(err)?;
        Ok(out)
    }

    /// Writes `contents` as the file at `rel` (root-owned, `mode`), creating missing parent
    /// directories. Whatever was at that name (a file, a hard link to another file, a symlink, a
    /// whiteout) is replaced, not written through; a directory there is an error.
    pub fn replace_file(
        &self,
        rel: &Path,
        contents: &[u8],
        mode: u32,
    ) -> Result<(), ConfinedError> {
        let (parent_rel, name) = split(rel)?;
        let parent = self.create_dir_all(parent_rel, 0o755)?;
        let temp = OsString::from(format!(
            ".warren-new-{}-{}",
            std::process::id(),
            next_serial()
        ));
        let write = || -> Result<(), ConfinedError> {
            let fd = parent.open(
                Path::new(&temp),
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                Mode::from_bits_truncate(mode),
            )?;
            let mut file = std::fs::File::from(fd);
            file.write_all(contents)
                .map_err(|e| io_error(&parent.path.join(&temp), "write", e))?;
            // The umask may have narrowed the mode at creation.
            nix::sys::stat::fchmod(file.as_raw_fd(), Mode::from_bits_truncate(mode))
                .map_err(|e| io(&parent.path.join(&temp), "chmod", e))?;
            nix::fcntl::renameat(
                Some(parent.fd.as_raw_fd()),
                temp.as_os_str(),
                Some(parent.fd.as_raw_fd()),
                name,
            )
            .map_err(|e| io(&self.path.join(rel), "replace", e))
        };
        let result = write();
        if result.is_err() {
            let _ = nix::unistd::unlinkat(
                Some(parent.fd.as_raw_fd()),
                temp.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        result
    }

    /// Names in this directory (without `.` and `..`), sorted.
    pub fn entries(&self) -> Result<Vec<OsString>, ConfinedError> {
        let fd = self.open(
            Path::new("."),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )?;
        let dir = nix::dir::Dir::from_fd(fd.into_raw_fd_owned())
            .map_err(|e| io(&self.path, "read directory", e))?;
        let mut names = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| io(&self.path, "read directory", e))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_os_string());
            }
        }
        names.sort();
        Ok(names)
    }

    /// The text of the symlink at `rel`.
    pub fn read_link(&self, rel: &Path) -> Result<OsString, ConfinedError> {
        let (parent, name) = self.parent_and_name(rel)?;
        nix::fcntl::readlinkat(Some(parent.fd.as_raw_fd()), name.as_os_str())
            .map_err(|e| io(&self.path.join(rel), "read link", e))
    }

    /// A path that names entry `name` of this directory through our own descriptor
    /// (`/proc/self/fd/N/name`): for the few calls that take only paths (the `l*xattr` family). The
    /// directory part is the fd we hold; only `name`, a single component, is looked up, and callers use
    /// the non-following variants.
    pub fn entry_path(&self, name: &OsStr) -> Result<CString, ConfinedError> {
        check_name(name, &self.path)?;
        let mut bytes = format!("/proc/self/fd/{}/", self.fd.as_raw_fd()).into_bytes();
        bytes.extend_from_slice(name.as_bytes());
        CString::new(bytes).map_err(|_| ConfinedError::BadPath(self.path.join(name)))
    }

    fn parent_and_name(&self, rel: &Path) -> Result<(ConfinedDir, OsString), ConfinedError> {
        let (parent, name) = split(rel)?;
        Ok((self.open_dir(parent)?, name.to_os_string()))
    }
}

/// Turns an owned fd into the raw fd `nix::dir::Dir::from_fd` takes ownership of.
trait IntoRawOwned {
    fn into_raw_fd_owned(self) -> RawFd;
}

impl IntoRawOwned for OwnedFd {
    fn into_raw_fd_owned(self) -> RawFd {
        std::os::fd::IntoRawFd::into_raw_fd(self)
    }
}

fn next_serial() -> u64 {
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn check_relative(rel: &Path) -> Result<(), ConfinedError> {
    let fine = rel
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if fine && !rel.as_os_str().is_empty() {
        Ok(())
    } else {
        Err(ConfinedError::BadPath(rel.to_path_buf()))
    }
}

fn check_name(name: &OsStr, dir: &Path) -> Result<(), ConfinedError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(ConfinedError::BadPath(dir.join(name)));
    }
    Ok(())
}

/// `rel` as its parent (possibly `.`) and its last component.
fn split(rel: &Path) -> Result<(&Path, &OsStr), ConfinedError> {
    check_relative(rel)?;
    let name = rel
        .file_name()
        .ok_or_else(|| ConfinedError::BadPath(rel.to_path_buf()))?;
    let parent = rel
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Ok((parent, name))
}

fn io(path: &Path, op: &'static str, errno: nix::Error) -> ConfinedError {
    io_error(path, op, errno.into())
}

fn io_error(path: &Path, op: &'static str, source: std::io::Error) -> ConfinedError {
    ConfinedError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A scratch tree: `root/` is the confined directory, `outside/` plays the host.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let base = std::env::temp_dir().join(format!(
                "wt-confined-{name}-{}-{}",
                std::process::id(),
                next_serial()
            ));
            std::fs::create_dir_all(base.join("root")).unwrap();
            std::fs::create_dir_all(base.join("outside")).unwrap();
            std::fs::write(base.join("outside/secret"), b"host data").unwrap();
            Scratch(base)
        }
        fn root(&self) -> PathBuf {
            self.0.join("root")
        }
        fn outside(&self) -> PathBuf {
            self.0.join("outside")
        }
        fn dir(&self) -> ConfinedDir {
            ConfinedDir::open_root(&self.root()).unwrap()
        }
        fn outside_untouched(&self) {
            assert_eq!(
                std::fs::read(self.outside().join("secret")).unwrap(),
                b"host data"
            );
            let names: Vec<_> = std::fs::read_dir(self.outside())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, vec![OsString::from("secret")], "a new file outside");
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn replace_file_replaces_a_planted_symlink_instead_of_following_it() {
        let s = Scratch::new("symlink");
        std::fs::create_dir(s.root().join("etc")).unwrap();
        symlink(s.outside().join("secret"), s.root().join("etc/hostname")).unwrap();
        symlink(s.outside().join("new"), s.root().join("etc/hosts")).unwrap();
        let dir = s.dir();
        dir.replace_file(Path::new("etc/hostname"), b"sbx\n", 0o644)
            .unwrap();
        dir.replace_file(Path::new("etc/hosts"), b"hosts\n", 0o644)
            .unwrap();
        s.outside_untouched();
        let meta = std::fs::symlink_metadata(s.root().join("etc/hostname")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(
            std::fs::read(s.root().join("etc/hostname")).unwrap(),
            b"sbx\n"
        );
    }

    #[test]
    fn replace_file_never_writes_through_a_hard_link() {
        let s = Scratch::new("hardlink");
        std::fs::write(s.root().join("victim"), b"original").unwrap();
        std::fs::hard_link(s.root().join("victim"), s.root().join("hostname")).unwrap();
        s.dir()
            .replace_file(Path::new("hostname"), b"new", 0o644)
            .unwrap();
        assert_eq!(std::fs::read(s.root().join("victim")).unwrap(), b"original");
        assert_eq!(std::fs::read(s.root().join("hostname")).unwrap(), b"new");
    }

    #[test]
    fn symlinked_directories_on_the_way_are_refused() {
        let s = Scratch::new("dirlink");
        symlink(s.outside(), s.root().join("etc")).unwrap();
        symlink("../outside", s.root().join("rel")).unwrap();
        let dir = s.dir();
        for path in ["etc/hostname", "rel/hostname", "etc/sub/x"] {
            let error = dir.replace_file(Path::new(path), b"x", 0o644).unwrap_err();
            assert!(
                matches!(error, ConfinedError::Escape { .. }),
                "{path}: {error}"
            );
        }
        assert!(matches!(
            dir.read_tail(Path::new("etc/secret"), 100),
            Err(ConfinedError::Escape { .. })
        ));
        assert!(matches!(
            dir.create_dir_all(Path::new("etc/made"), 0o755),
            Err(ConfinedError::Escape { .. })
        ));
        s.outside_untouched();
    }

    #[test]
    fn dot_dot_and_absolute_paths_are_refused() {
        let s = Scratch::new("dotdot");
        let dir = s.dir();
        for path in [
            "../outside/secret",
            "/etc/passwd",
            "a/../../outside/secret",
            "",
        ] {
            assert!(matches!(
                dir.read_tail(Path::new(path), 10),
                Err(ConfinedError::BadPath(_))
            ));
        }
        assert!(dir.entry_path(OsStr::new("..")).is_err());
        assert!(dir.entry_path(OsStr::new("a/b")).is_err());
    }

    #[test]
    fn a_fifo_or_device_at_a_log_path_is_refused_without_blocking() {
        let s = Scratch::new("fifo");
        nix::unistd::mkfifo(&s.root().join("agent.log"), Mode::from_bits_truncate(0o644)).unwrap();
        symlink("/dev/zero", s.root().join("zero")).unwrap();
        let dir = s.dir();
        assert!(matches!(
            dir.read_tail(Path::new("agent.log"), 10),
            Err(ConfinedError::WrongType { .. })
        ));
        assert!(matches!(
            dir.read_tail(Path::new("zero"), 10),
            Err(ConfinedError::Escape { .. })
        ));
        std::fs::write(s.root().join("log"), b"0123456789").unwrap();
        assert_eq!(dir.read_tail(Path::new("log"), 4).unwrap(), b"6789");
        assert_eq!(dir.read_tail(Path::new("log"), 40).unwrap(), b"0123456789");
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_mid_walk_is_not_followed() {
        // Open `a`, then replace it with a symlink out: lookups through the held descriptor stay in
        // the directory that was opened; fresh lookups by path refuse the symlink.
        let s = Scratch::new("swap");
        std::fs::create_dir(s.root().join("a")).unwrap();
        std::fs::write(s.root().join("a/file"), b"inside").unwrap();
        let dir = s.dir();
        let a = dir.open_dir(Path::new("a")).unwrap();
        std::fs::rename(s.root().join("a"), s.root().join("a-moved")).unwrap();
        symlink(s.outside(), s.root().join("a")).unwrap();
        assert_eq!(a.read_tail(Path::new("file"), 100).unwrap(), b"inside");
        assert!(a.read_tail(Path::new("secret"), 100).is_err());
        assert!(matches!(
            dir.read_tail(Path::new("a/secret"), 100),
            Err(ConfinedError::Escape { .. })
        ));
        s.outside_untouched();
    }

    #[test]
    fn entries_stat_and_links_read_without_following() {
        let s = Scratch::new("entries");
        std::fs::create_dir(s.root().join("d")).unwrap();
        std::fs::write(s.root().join("f"), b"x").unwrap();
        symlink(s.outside().join("secret"), s.root().join("l")).unwrap();
        let dir = s.dir();
        assert_eq!(
            dir.entries().unwrap(),
            ["d", "f", "l"].map(OsString::from).to_vec()
        );
        assert_eq!(
            EntryKind::of(&dir.stat(Path::new("l")).unwrap()),
            EntryKind::Symlink
        );
        assert_eq!(
            EntryKind::of(&dir.stat(Path::new("d")).unwrap()),
            EntryKind::Dir
        );
        assert_eq!(
            dir.read_link(Path::new("l")).unwrap(),
            s.outside().join("secret").into_os_string()
        );
        assert!(dir.stat(Path::new("missing")).unwrap_err().is_not_found());
    }
}
