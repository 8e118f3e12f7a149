//! Building `EntryInfo` for a path, and user metadata kept in `user.e2b.*` extended attributes.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use pbjson_types::Timestamp;
use warren_proto::connect::{Code, ConnectError};
use warren_proto::envd::filesystem::{EntryInfo, FileType};

use crate::users;

/// Prefix of the extended attributes that carry user metadata.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";

/// Maps an I/O error on `what` to the Connect code the SDK expects.
pub fn io_to_connect(e: &std::io::Error, what: &str) -> ConnectError {
    use std::io::ErrorKind;
    let code = match e.kind() {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::NotADirectory
        | ErrorKind::IsADirectory
        | ErrorKind::InvalidInput
        | ErrorKind::InvalidFilename => Code::InvalidArgument,
        ErrorKind::DirectoryNotEmpty => Code::FailedPrecondition,
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => Code::ResourceExhausted,
        _ if e.raw_os_error() == Some(libc::ELOOP) => Code::FailedPrecondition,
        _ => Code::Internal,
    };
    ConnectError::new(code, format!("{what}: {e}"))
}

/// The entry at `host` (not following a final symlink), reported at sandbox path `sandbox`.
///
/// A symlink is described the way envd does: `type` and `mode` are those of what it finally points
/// to, `symlink_target` is that file's absolute sandbox path (every link on the way resolved), and
/// the link's own size, owner, times and `L...` permission string. A link that cannot be resolved
/// inside the sandbox (dangling, a loop, outside the root) has no target and an unspecified type.
/// `is_symlink` stays unset: envd has no such field, and the SDK would report the link's type as
/// `symlink` where E2B reports the target's.
pub fn entry_info(root: &Path, sandbox: &str, host: &Path) -> std::io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(host)?;
    let is_symlink = meta.file_type().is_symlink();
    let (file_type, mode, symlink_target) = if is_symlink {
        match resolve_link(root, host) {
            Some((target, target_meta)) => (
                kind_of(&target_meta),
                target_meta.mode() & 0o7777,
                Some(target),
            ),
            None => (FileType::Unspecified, meta.mode() & 0o7777, None),
        }
    } else {
        (kind_of(&meta), meta.mode() & 0o7777, None)
    };
    let name = Path::new(sandbox)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".to_string());
    Ok(EntryInfo {
        name,
        r#type: file_type as i32,
        path: sandbox.to_string(),
        size: meta.size() as i64,
        mode,
        permissions: permissions_string(meta.mode()),
        owner: users::user_name(root, meta.uid()),
        group: users::group_name(root, meta.gid()),
        modified_time: Some(Timestamp {
            seconds: meta.mtime(),
            nanos: meta.mtime_nsec() as i32,
        }),
        symlink_target,
        metadata: if is_symlink {
            HashMap::new()
        } else {
            read_metadata(host)
        },
        is_symlink: false,
    })
}

fn kind_of(meta: &std::fs::Metadata) -> FileType {
    let t = meta.file_type();
    if t.is_dir() {
        FileType::Directory
    } else if t.is_file()
        || t.is_fifo()
        || t.is_socket()
        || t.is_char_device()
        || t.is_block_device()
    {
        FileType::File
    } else {
        FileType::Unspecified
    }
}

/// The sandbox path a symlink finally points to, and that file's metadata; `None` when it does not
/// resolve to something under `root`.
fn resolve_link(root: &Path, host: &Path) -> Option<(String, std::fs::Metadata)> {
    let real = std::fs::canonicalize(host).ok()?;
    let real_root = std::fs::canonicalize(root).ok()?;
    let inside = real.strip_prefix(&real_root).ok()?;
    let target_meta = std::fs::metadata(&real).ok()?;
    Some((format!("/{}", inside.to_string_lossy()), target_meta))
}

/// `ls -l` style permission string, e.g. `drwxr-xr-x`.
pub fn permissions_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'L',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 'S',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'D',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn c_path(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_bytes()).ok()
}

/// User metadata of `path` (empty where xattrs are unsupported).
pub fn read_metadata(path: &Path) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Some(cpath) = c_path(path) else {
        return out;
    };
    let mut names = vec![0u8; 4096];
    // SAFETY: the buffer is valid for `names.len()` bytes; the kernel writes at most that.
    let len = unsafe { libc::listxattr(cpath.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if len <= 0 {
        return out;
    }
    names.truncate(len as usize);
    for raw in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Ok(name) = std::str::from_utf8(raw) else {
            continue;
        };
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX) else {
            continue;
        };
        let Ok(cname) = CString::new(raw) else {
            continue;
        };
        let mut value = vec![0u8; 4096];
        // SAFETY: as above, for the value buffer.
        let n = unsafe {
            libc::getxattr(
                cpath.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if n >= 0 {
            value.truncate(n as usize);
            out.insert(
                key.to_string(),
                String::from_utf8_lossy(&value).into_owned(),
            );
        }
    }
    out
}

/// Replaces the user metadata of `path` with `metadata`.
pub fn write_metadata(path: &Path, metadata: &[(String, String)]) -> std::io::Result<()> {
    let cpath = c_path(path).ok_or_else(|| std::io::Error::other("path contains NUL"))?;
    for old in read_metadata(path).keys() {
        if metadata.iter().any(|(k, _)| k == old) {
            continue;
        }
        if let Ok(cname) = CString::new(format!("{METADATA_XATTR_PREFIX}{old}")) {
            // SAFETY: both strings are NUL-terminated and live for the call.
            unsafe { libc::removexattr(cpath.as_ptr(), cname.as_ptr()) };
        }
    }
    for (key, value) in metadata {
        let cname = CString::new(format!("{METADATA_XATTR_PREFIX}{key}"))
            .map_err(|_| std::io::Error::other("metadata key contains NUL"))?;
        // SAFETY: strings and the value buffer are valid for the call.
        let rc = unsafe {
            libc::setxattr(
                cpath.as_ptr(),
                cname.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_strings_match_ls() {
        assert_eq!(permissions_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(permissions_string(libc::S_IFREG | 0o640), "-rw-r-----");
    }

    #[test]
    fn entries_describe_files_dirs_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("f"), "hello").unwrap();
        std::os::unix::fs::symlink("f", root.join("link")).unwrap();
        let f = entry_info(root, "/f", &root.join("f")).unwrap();
        assert_eq!(
            (f.name.as_str(), f.size, f.r#type),
            ("f", 5, FileType::File as i32)
        );
        std::fs::create_dir(root.join("d")).unwrap();
        std::os::unix::fs::symlink("../link", root.join("d/hop")).unwrap();
        std::os::unix::fs::symlink("nowhere", root.join("dangling")).unwrap();
        let link = entry_info(root, "/link", &root.join("link")).unwrap();
        assert!(
            !link.is_symlink,
            "envd has no is_symlink; the SDK would say 'symlink'"
        );
        assert_eq!(link.symlink_target.as_deref(), Some("/f"));
        assert_eq!(link.r#type, FileType::File as i32);
        assert!(link.permissions.starts_with('L'));
        // Every link on the way is resolved, to an absolute sandbox path.
        let hop = entry_info(root, "/d/hop", &root.join("d/hop")).unwrap();
        assert_eq!(hop.symlink_target.as_deref(), Some("/f"));
        let dangling = entry_info(root, "/dangling", &root.join("dangling")).unwrap();
        assert_eq!(dangling.symlink_target, None);
        assert_eq!(dangling.r#type, FileType::Unspecified as i32);
        let d = entry_info(root, "/", root).unwrap();
        assert_eq!(d.r#type, FileType::Directory as i32);
        let missing = entry_info(root, "/nope", &root.join("nope")).unwrap_err();
        assert_eq!(io_to_connect(&missing, "stat").code, Code::NotFound);
    }
}
