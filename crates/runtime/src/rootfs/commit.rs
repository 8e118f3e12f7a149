//! Copying a sandbox's overlay upper dir into a new read-only layer directory, keeping what overlayfs
//! needs to read it back as a lower layer: whiteouts (0:0 character devices), opaque-dir and other
//! `trusted.overlay.*` xattrs, file capabilities, owners, modes, symlinks and timestamps.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::stat::{mknod, Mode, SFlag};

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
    let result = copy_tree(upper, &temp, true).and_then(|bytes| {
        std::fs::rename(&temp, dest).map_err(copy_err(dest))?;
        Ok(bytes)
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&temp);
    }
    result
}

fn copy_tree(from: &Path, to: &Path, top: bool) -> Result<u64, CommitError> {
    let meta = std::fs::symlink_metadata(from).map_err(copy_err(from))?;
    std::fs::create_dir(to).map_err(copy_err(to))?;
    let mut bytes = 0;
    let mut entries: Vec<_> = std::fs::read_dir(from)
        .map_err(copy_err(from))?
        .collect::<Result<_, _>>()
        .map_err(copy_err(from))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        if top && RUNTIME_ENTRIES.iter().any(|r| name == *r) {
            continue;
        }
        let source = entry.path();
        let target = to.join(&name);
        let entry_meta = std::fs::symlink_metadata(&source).map_err(copy_err(&source))?;
        let file_type = entry_meta.file_type();
        if file_type.is_dir() {
            bytes += copy_tree(&source, &target, false)?;
            continue;
        } else if file_type.is_symlink() {
            let link = std::fs::read_link(&source).map_err(copy_err(&source))?;
            std::os::unix::fs::symlink(link, &target).map_err(copy_err(&target))?;
        } else if file_type.is_file() {
            bytes += std::fs::copy(&source, &target).map_err(copy_err(&source))?;
        } else {
            // Whiteouts (char 0:0), other device nodes, fifos and sockets: recreate the node itself.
            let kind = SFlag::from_bits_truncate(entry_meta.mode() & libc::S_IFMT);
            mknod(
                &target,
                kind,
                Mode::from_bits_truncate(entry_meta.mode() & 0o7777),
                entry_meta.rdev(),
            )
            .map_err(nix_err(&target))?;
        }
        copy_attributes(&source, &target, &entry_meta)?;
    }
    copy_attributes(from, to, &meta)?;
    Ok(bytes)
}

/// Owner, mode, xattrs and times of `source` onto `target` (symlinks: owner and xattrs only).
fn copy_attributes(
    source: &Path,
    target: &Path,
    meta: &std::fs::Metadata,
) -> Result<(), CommitError> {
    std::os::unix::fs::lchown(target, Some(meta.uid()), Some(meta.gid()))
        .map_err(copy_err(target))?;
    copy_xattrs(source, target)?;
    if !meta.file_type().is_symlink() {
        // After chown: chown clears setuid bits, the mode puts them back.
        std::fs::set_permissions(
            target,
            std::fs::Permissions::from_mode(meta.mode() & 0o7777),
        )
        .map_err(copy_err(target))?;
    }
    let times = [
        nix::sys::time::TimeSpec::new(meta.atime(), meta.atime_nsec()),
        nix::sys::time::TimeSpec::new(meta.mtime(), meta.mtime_nsec()),
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

fn copy_xattrs(source: &Path, target: &Path) -> Result<(), CommitError> {
    let c_source =
        CString::new(source.as_os_str().as_bytes()).map_err(|e| copy_err(source)(e.into()))?;
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
