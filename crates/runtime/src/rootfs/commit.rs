//! Copying a sandbox's overlay upper dir into a new read-only layer directory, keeping what overlayfs
//! needs to read it back as a lower layer: whiteouts (0:0 character devices), opaque-dir and other
//! `trusted.overlay.*` xattrs, file capabilities, owners, modes, symlinks and timestamps.

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::{mknod, FileStat, Mode, SFlag};

use crate::confined::{ConfinedDir, ConfinedError, EntryKind};

/// Top-level entries of the upper dir that belong to the runtime, not to the template.
const RUNTIME_ENTRIES: [&str; 1] = [".warren"];

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("destination {0} already exists")]
    DestinationExists(PathBuf),
    #[error("copy {path}")]
    Copy {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("read the sandbox's layer")]
    Source(#[from] ConfinedError),
}

fn copy_err(path: &Path) -> impl FnOnce(std::io::Error) -> CommitError + '_ {
    move |source| CommitError::Copy {
        path: path.to_path_buf(),
        source,
    }
}

fn nix_err(path: &Path) -> impl FnOnce(nix::Error) -> CommitError + '_ {
    move |errno| CommitError::Copy {
        path: path.to_path_buf(),
        source: std::io::Error::from(errno),
    }
}

/// Copies `upper` to `dest` (which must not exist) via a temp dir and a rename; returns bytes copied.
///
/// `upper` was written by the sandbox: it is read only through [`ConfinedDir`] (descriptor-relative,
/// no symlink followed, a directory swapped for a symlink mid-walk refused), so the layer can hold
/// nothing but the sandbox's own files. `dest` is Warren's own fresh directory.
pub fn commit_upper(upper: &Path, dest: &Path) -> Result<u64, CommitError> {
    if dest.exists() {
        return Err(CommitError::DestinationExists(dest.to_path_buf()));
    }
    let parent = dest.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent).map_err(copy_err(parent))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = parent.join(format!(".{name}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&temp);
    let result = (|| {
        let source = ConfinedDir::open_root(upper)?;
        let top = nix::sys::stat::stat(upper).map_err(nix_err(upper))?;
        std::fs::create_dir(&temp).map_err(copy_err(&temp))?;
        let bytes = copy_tree(&source, &temp, true)?;
        let path =
            CString::new(upper.as_os_str().as_bytes()).map_err(|e| copy_err(upper)(e.into()))?;
        copy_attributes(&path, &temp, &top)?;
        std::fs::rename(&temp, dest).map_err(copy_err(dest))?;
        Ok(bytes)
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&temp);
    }
    result
}

/// Copies the entries of `from` into the existing directory `to`.
fn copy_tree(from: &ConfinedDir, to: &Path, top: bool) -> Result<u64, CommitError> {
    let mut bytes = 0;
    for name in from.entries()? {
        if top && RUNTIME_ENTRIES.iter().any(|r| name == *r) {
            continue;
        }
        let rel = Path::new(&name);
        let target = to.join(&name);
        let stat = from.stat(rel)?;
        match EntryKind::of(&stat) {
            EntryKind::Dir => {
                std::fs::create_dir(&target).map_err(copy_err(&target))?;
                bytes += copy_tree(&from.open_dir(rel)?, &target, false)?;
            }
            EntryKind::Symlink => {
                let link = from.read_link(rel)?;
                std::os::unix::fs::symlink(link, &target).map_err(copy_err(&target))?;
            }
            EntryKind::File => {
                let mut input = from.open_file(rel)?;
                let mut output = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&target)
                    .map_err(copy_err(&target))?;
                bytes += std::io::copy(&mut input, &mut output).map_err(copy_err(&target))?;
            }
            EntryKind::Special => {
                // Whiteouts (char 0:0), other device nodes, fifos and sockets: recreate the node itself.
                let kind = SFlag::from_bits_truncate(stat.st_mode & libc::S_IFMT);
                mknod(
                    &target,
                    kind,
                    Mode::from_bits_truncate(stat.st_mode & 0o7777),
                    stat.st_rdev,
                )
                .map_err(nix_err(&target))?;
            }
        }
        copy_attributes(&from.entry_path(&name)?, &target, &stat)?;
    }
    Ok(bytes)
}

/// Owner, mode, xattrs and times of `source` (a path whose last component is not followed) onto
/// `target` (symlinks: owner and xattrs only).
fn copy_attributes(source: &CStr, target: &Path, stat: &FileStat) -> Result<(), CommitError> {
    let symlink = EntryKind::of(stat) == EntryKind::Symlink;
    std::os::unix::fs::lchown(target, Some(stat.st_uid), Some(stat.st_gid))
        .map_err(copy_err(target))?;
    copy_xattrs(source, target)?;
    if !symlink {
        // After chown: chown clears setuid bits, the mode puts them back.
        std::fs::set_permissions(
            target,
            std::fs::Permissions::from_mode(stat.st_mode & 0o7777),
        )
        .map_err(copy_err(target))?;
    }
    let times = [
        nix::sys::time::TimeSpec::new(stat.st_atime, stat.st_atime_nsec),
        nix::sys::time::TimeSpec::new(stat.st_mtime, stat.st_mtime_nsec),
    ];
    nix::sys::stat::utimensat(
        None,
        target,
        &times[0],
        &times[1],
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .map_err(nix_err(target))?;
    Ok(())
}

fn copy_xattrs(c_source: &CStr, target: &Path) -> Result<(), CommitError> {
    let source = Path::new(OsStr::from_bytes(c_source.to_bytes()));
    let c_target =
        CString::new(target.as_os_str().as_bytes()).map_err(|e| copy_err(target)(e.into()))?;
    let mut names = vec![0u8; 4096];
    // SAFETY: both buffers are valid for their stated lengths; the paths are NUL-terminated.
    let len =
        unsafe { libc::llistxattr(c_source.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if len < 0 {
        let error = std::io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOTSUP) => Ok(()),
            _ => Err(copy_err(source)(error)),
        };
    }
    names.truncate(len as usize);
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Ok(c_name) = CString::new(name) else {
            continue;
        };
        let mut value = vec![0u8; 65536];
        // SAFETY: as above; `value` is valid for its length.
        let size = unsafe {
            libc::lgetxattr(
                c_source.as_ptr(),
                c_name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if size < 0 {
            continue;
        }
        // SAFETY: as above; `size` bytes of `value` were written by the kernel.
        let rc = unsafe {
            libc::lsetxattr(
                c_target.as_ptr(),
                c_name.as_ptr(),
                value.as_ptr().cast(),
                size as usize,
                0,
            )
        };
        if rc != 0 {
            return Err(copy_err(target)(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_copies_files_links_and_skips_runtime_entries() {
        let base = std::env::temp_dir().join(format!("wt-commit-{}", std::process::id()));
        let upper = base.join("upper");
        std::fs::create_dir_all(upper.join("etc/app")).unwrap();
        std::fs::create_dir_all(upper.join(".warren")).unwrap();
        std::fs::write(upper.join("etc/app/config"), b"hello").unwrap();
        std::fs::write(upper.join(".warren/agent.log"), b"log").unwrap();
        std::os::unix::fs::symlink("config", upper.join("etc/app/link")).unwrap();
        let dest = base.join("layer");
        let bytes = commit_upper(&upper, &dest).unwrap();
        assert_eq!(bytes, 5);
        assert_eq!(
            std::fs::read(dest.join("etc/app/config")).unwrap(),
            b"hello"
        );
        assert_eq!(
            std::fs::read_link(dest.join("etc/app/link")).unwrap(),
            PathBuf::from("config")
        );
        assert!(!dest.join(".warren").exists());
        assert!(matches!(
            commit_upper(&upper, &dest),
            Err(CommitError::DestinationExists(_))
        ));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
