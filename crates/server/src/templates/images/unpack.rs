//! Unpacks one image layer (a tar, gzip- or zstd-compressed or plain) into an empty directory as an
//! overlayfs lower layer: OCI whiteouts (`.wh.<name>`) become overlay whiteouts (0/0 character devices)
//! and opaque markers (`.wh..wh..opq`) become the `trusted.overlay.opaque` xattr on their directory.
//!
//! A layer comes from a registry: its contents are hostile. Every write goes through
//! [`ConfinedDir`] (openat2 with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), so an entry whose path
//! climbs out (`../x`), or runs through a symlink an earlier entry planted (`etc -> /` then
//! `etc/passwd`), fails the unpack instead of writing outside the layer; a hard link may only point at
//! a file already unpacked in this layer; device nodes are skipped (sandboxes have their own `/dev`).
//! Absolute names are read as relative to the layer root, as Docker does.

use std::ffi::{CString, OsStr};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use warren_runtime::confined::{ConfinedDir, ConfinedError, EntryKind};

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("reading the layer archive")]
    Read(#[source] std::io::Error),
    #[error("layer entry {path:?}: {message}")]
    Hostile { path: String, message: &'static str },
    #[error("layer entry {path:?}")]
    Confined {
        path: String,
        #[source]
        source: ConfinedError,
    },
    #[error("layer entry {path:?}: {op}")]
    Sys {
        path: String,
        op: &'static str,
        #[source]
        source: nix::Error,
    },
}

/// What an unpack did, for the build log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UnpackStats {
    pub entries: u64,
    pub bytes: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
    /// Character/block devices in the layer: not created.
    pub skipped_devices: u64,
}

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// Decompresses by magic number: gzip (`1f 8b`), zstd (`28 b5 2f fd`), otherwise a plain tar.
pub fn decompressed(reader: impl Read + 'static) -> Result<Box<dyn Read>, UnpackError> {
    let mut reader = BufReader::new(reader);
    let head = reader.fill_buf().map_err(UnpackError::Read)?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(reader)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Ok(Box::new(
            zstd::stream::read::Decoder::with_buffer(reader).map_err(UnpackError::Read)?,
        ))
    } else {
        Ok(Box::new(reader))
    }
}

/// Unpacks the (compressed or plain) layer `archive` into `dest`, an empty directory Warren made.
pub fn unpack_layer(archive: impl Read + 'static, dest: &Path) -> Result<UnpackStats, UnpackError> {
    let root = ConfinedDir::open_root(dest).map_err(|source| UnpackError::Confined {
        path: dest.display().to_string(),
        source,
    })?;
    let mut tar = tar::Archive::new(decompressed(archive)?);
    let mut stats = UnpackStats::default();
    for entry in tar.entries().map_err(UnpackError::Read)? {
        let mut entry = entry.map_err(UnpackError::Read)?;
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let Some(rel) = clean_path(&raw, &shown)? else {
            continue; // the root itself
        };
        stats.entries += 1;
        apply_entry(&root, &rel, &shown, &mut entry, &mut stats)?;
    }
    Ok(stats)
}

/// `./a/b`, `/a/b`, `a//b/` → `a/b`; None for the root; `..` anywhere is refused.
fn clean_path(raw: &[u8], shown: &str) -> Result<Option<PathBuf>, UnpackError> {
    let mut out = PathBuf::new();
    for component in Path::new(OsStr::from_bytes(raw)).components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(UnpackError::Hostile {
                    path: shown.to_string(),
                    message: "`..` in an entry's path",
                })
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

fn apply_entry<R: Read>(
    root: &ConfinedDir,
    rel: &Path,
    shown: &str,
    entry: &mut tar::Entry<'_, R>,
    stats: &mut UnpackStats,
) -> Result<(), UnpackError> {
    let confined = |source| UnpackError::Confined {
        path: shown.to_string(),
        source,
    };
    let sys = |op: &'static str| {
        move |source| UnpackError::Sys {
            path: shown.to_string(),
            op,
            source,
        }
    };
    let name = rel
        .file_name()
        .ok_or_else(|| UnpackError::Hostile {
            path: shown.to_string(),
            message: "no file name",
        })?
        .to_os_string();
    let parent_rel = rel.parent().unwrap_or(Path::new(""));
    let parent_rel = if parent_rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent_rel
    };
    let parent = root.create_dir_all(parent_rel, 0o755).map_err(confined)?;
    let name_text = name.to_string_lossy();

    if name_text == OPAQUE_MARKER {
        set_opaque(&parent).map_err(sys("mark directory opaque"))?;
        stats.opaque_dirs += 1;
        return Ok(());
    }
    if let Some(hidden) = name_text.strip_prefix(WHITEOUT_PREFIX) {
        if hidden.is_empty() || hidden == "." || hidden == ".." || hidden.contains('/') {
            return Err(UnpackError::Hostile {
                path: shown.to_string(),
                message: "whiteout without a name",
            });
        }
        remove_existing(&parent, OsStr::new(hidden)).map_err(sys("remove"))?;
        nix::sys::stat::mknodat(
            Some(parent.as_fd().as_raw_fd()),
            hidden,
            SFlag::S_IFCHR,
            Mode::empty(),
            0,
        )
        .map_err(sys("create whiteout"))?;
        stats.whiteouts += 1;
        return Ok(());
    }

    let header = entry.header();
    let mode = header.mode().map_err(UnpackError::Read)? & 0o7777;
    let uid = header.uid().map_err(UnpackError::Read)? as u32;
    let gid = header.gid().map_err(UnpackError::Read)? as u32;
    let mtime = header.mtime().unwrap_or(0) as i64;
    let kind = header.entry_type();
    let fd = parent.as_fd().as_raw_fd();

    match kind {
        tar::EntryType::Directory => {
            // An existing directory (made as a parent earlier) is kept; anything else is replaced.
            match parent.stat(Path::new(&name)) {
                Ok(stat) if EntryKind::of(&stat) == EntryKind::Dir => {}
                Ok(_) => {
                    remove_existing(&parent, &name).map_err(sys("remove"))?;
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(confined(e)),
            }
            let dir = parent
                .create_dir_all(Path::new(&name), 0o755)
                .map_err(confined)?;
            let handle = dir
                .open(
                    Path::new("."),
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                    Mode::empty(),
                )
                .map_err(confined)?;
            nix::unistd::fchown(
                handle.as_raw_fd(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
            )
            .map_err(sys("chown"))?;
            nix::sys::stat::fchmod(handle.as_raw_fd(), Mode::from_bits_truncate(mode))
                .map_err(sys("chmod"))?;
        }
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            remove_existing(&parent, &name).map_err(sys("remove"))?;
            let file = parent
                .open(
                    Path::new(&name),
                    OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(confined)?;
            let mut file = std::fs::File::from(file);
            stats.bytes += std::io::copy(entry, &mut file).map_err(UnpackError::Read)?;
            // chown before chmod: chown clears set-id bits.
            nix::unistd::fchown(
                file.as_raw_fd(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
            )
            .map_err(sys("chown"))?;
            nix::sys::stat::fchmod(file.as_raw_fd(), Mode::from_bits_truncate(mode))
                .map_err(sys("chmod"))?;
            let time = nix::sys::time::TimeSpec::new(mtime, 0);
            nix::sys::stat::futimens(file.as_raw_fd(), &time, &time).map_err(sys("set times"))?;
        }
        tar::EntryType::Symlink => {
            let target = entry
                .link_name_bytes()
                .ok_or(UnpackError::Hostile {
                    path: shown.to_string(),
                    message: "symlink without a target",
                })?
                .into_owned();
            remove_existing(&parent, &name).map_err(sys("remove"))?;
            // The target is only text here: host code never follows it (every access is confined).
            nix::unistd::symlinkat(OsStr::from_bytes(&target), Some(fd), name.as_os_str())
                .map_err(sys("create symlink"))?;
            nix::unistd::fchownat(
                Some(fd),
                name.as_os_str(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(sys("chown"))?;
        }
        tar::EntryType::Link => {
            let target = entry
                .link_name_bytes()
                .ok_or(UnpackError::Hostile {
                    path: shown.to_string(),
                    message: "hard link without a target",
                })?
                .into_owned();
            let target_shown = String::from_utf8_lossy(&target).into_owned();
            let target_rel = clean_path(&target, &target_shown)?.ok_or(UnpackError::Hostile {
                path: shown.to_string(),
                message: "hard link to the layer root",
            })?;
            // The target must be a regular file of this layer, reached without symlinks.
            let source = root.open_file(&target_rel).map_err(confined)?;
            remove_existing(&parent, &name).map_err(sys("remove"))?;
            nix::unistd::linkat(
                Some(source.as_raw_fd()),
                Path::new(""),
                Some(fd),
                Path::new(&name),
                AtFlags::AT_EMPTY_PATH,
            )
            .map_err(sys("create hard link"))?;
        }
        tar::EntryType::Fifo => {
            remove_existing(&parent, &name).map_err(sys("remove"))?;
            nix::sys::stat::mknodat(
                Some(fd),
                name.as_os_str(),
                SFlag::S_IFIFO,
                Mode::from_bits_truncate(mode),
                0,
            )
            .map_err(sys("create fifo"))?;
            nix::unistd::fchownat(
                Some(fd),
                name.as_os_str(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(sys("chown"))?;
        }
        tar::EntryType::Char | tar::EntryType::Block => {
            stats.skipped_devices += 1;
        }
        // PAX/GNU headers are consumed by the tar reader; anything else has no place in a layer.
        _ => {
            return Err(UnpackError::Hostile {
                path: shown.to_string(),
                message: "unsupported entry type",
            })
        }
    }
    Ok(())
}

/// Removes whatever is at `name` in `dir` (a file, link, whiteout or a whole directory tree), so the
/// new entry replaces it as a later tar entry does. Nothing below is followed.
fn remove_existing(dir: &ConfinedDir, name: &OsStr) -> Result<(), nix::Error> {
    let fd = dir.as_fd().as_raw_fd();
    match nix::unistd::unlinkat(Some(fd), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(()),
        Err(nix::Error::ENOENT) => Ok(()),
        Err(nix::Error::EISDIR) => {
            let sub = dir
                .open_dir(Path::new(name))
                .map_err(|_| nix::Error::EPERM)?;
            for child in sub.entries().map_err(|_| nix::Error::EIO)? {
                remove_existing(&sub, &child)?;
            }
            nix::unistd::unlinkat(Some(fd), name, UnlinkatFlags::RemoveDir)
        }
        Err(e) => Err(e),
    }
}

/// `trusted.overlay.opaque=y` on the directory `dir` itself.
/// Whether `dir` carries the overlay opaque marker [`set_opaque`] writes (read the same way, through
/// the descriptor we hold, so nothing in the layer can redirect it).
pub(crate) fn is_opaque(dir: &ConfinedDir) -> bool {
    let path = format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd());
    let (Ok(path), Ok(name)) = (CString::new(path), CString::new(OPAQUE_XATTR)) else {
        return false;
    };
    let mut value = [0u8; 2];
    // SAFETY: both strings are NUL-terminated and outlive the call; `value` is a buffer we own of
    // the length passed.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    n == 1 && value[0] == b'y'
}

fn set_opaque(dir: &ConfinedDir) -> Result<(), nix::Error> {
    let path = format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd());
    let path = CString::new(path).map_err(|_| nix::Error::EINVAL)?;
    let name = CString::new(OPAQUE_XATTR).map_err(|_| nix::Error::EINVAL)?;
    // SAFETY: both strings are NUL-terminated and outlive the call; the value is a 1-byte buffer we own.
    // The path names the O_PATH descriptor we hold for the directory (a magic link the kernel resolves
    // to that very inode), so nothing in the layer can redirect it.
    let rc = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"y".as_ptr().cast(), 1, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(nix::Error::last())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A tar built entry by entry, with raw names (the tar crate's builder refuses `..`).
    struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        fn new() -> Layer {
            Layer(tar::Builder::new(Vec::new()))
        }

        fn header(kind: tar::EntryType, name: &str, size: u64, mode: u32) -> tar::Header {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(size);
            h.set_mode(mode);
            h.set_uid(1000);
            h.set_gid(1000);
            h.set_mtime(1_700_000_000);
            // Raw bytes into the name field: no validation of `..` here on purpose.
            let field = &mut h.as_old_mut().name;
            field.fill(0);
            field[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            h
        }

        fn file(mut self, name: &str, body: &str) -> Layer {
            let h = Self::header(tar::EntryType::Regular, name, body.len() as u64, 0o644);
            self.0.append(&h, body.as_bytes()).unwrap();
            self
        }

        fn dir(mut self, name: &str) -> Layer {
            let h = Self::header(tar::EntryType::Directory, name, 0, 0o755);
            self.0.append(&h, std::io::empty()).unwrap();
            self
        }

        fn link(mut self, kind: tar::EntryType, name: &str, target: &str) -> Layer {
            let mut h = Self::header(kind, name, 0, 0o777);
            let field = &mut h.as_old_mut().linkname;
            field.fill(0);
            field[..target.len()].copy_from_slice(target.as_bytes());
            h.set_cksum();
            self.0.append(&h, std::io::empty()).unwrap();
            self
        }

        fn bytes(self) -> Vec<u8> {
            self.0.into_inner().unwrap()
        }

        fn gzip(self) -> Vec<u8> {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&self.bytes()).unwrap();
            enc.finish().unwrap()
        }
    }

    fn unpack(bytes: Vec<u8>) -> (tempfile::TempDir, PathBuf, Result<UnpackStats, UnpackError>) {
        let outer = tempfile::tempdir().unwrap();
        let dest = outer.path().join("layer");
        std::fs::create_dir(&dest).unwrap();
        let result = unpack_layer(std::io::Cursor::new(bytes), &dest);
        (outer, dest, result)
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn files_dirs_links_owners_and_modes_land_in_place() {
        if !is_root() {
            println!("SKIP: unpacking layers sets owners and trusted xattrs: needs root");
            return;
        }
        let layer = || {
            Layer::new()
                .dir("./etc/")
                .file("./etc/os-release", "ID=test\n")
                .link(tar::EntryType::Symlink, "bin", "usr/bin")
                .link(
                    tar::EntryType::Link,
                    "etc/os-release.hard",
                    "./etc/os-release",
                )
                .file("/abs/file", "absolute names are relative to the layer\n")
        };
        for bytes in [layer().gzip(), layer().bytes()] {
            let (_tmp, dest, result) = unpack(bytes);
            let stats = result.unwrap();
            assert_eq!(stats.entries, 5);
            let release = dest.join("etc/os-release");
            assert_eq!(std::fs::read_to_string(&release).unwrap(), "ID=test\n");
            let meta = std::fs::metadata(&release).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid(), meta.mode() & 0o7777),
                (1000, 1000, 0o644)
            );
            assert_eq!(meta.mtime(), 1_700_000_000);
            assert_eq!(meta.nlink(), 2);
            assert_eq!(
                std::fs::read_link(dest.join("bin")).unwrap(),
                Path::new("usr/bin")
            );
            assert!(dest.join("abs/file").is_file());
        }
    }

    #[test]
    fn whiteouts_and_opaque_dirs_become_overlay_markers() {
        if !is_root() {
            println!("SKIP: overlay whiteouts and trusted xattrs need root");
            return;
        }
        let bytes = Layer::new()
            .file("etc/.wh.motd", "")
            .dir("var/cache/")
            .file("var/cache/.wh..wh..opq", "")
            .file("var/cache/new", "x")
            .bytes();
        let (_tmp, dest, result) = unpack(bytes);
        let stats = result.unwrap();
        assert_eq!((stats.whiteouts, stats.opaque_dirs), (1, 1));
        let meta = std::fs::symlink_metadata(dest.join("etc/motd")).unwrap();
        assert_eq!(meta.mode() & libc::S_IFMT, libc::S_IFCHR);
        assert_eq!(meta.rdev(), 0);
        assert!(!dest.join("etc/.wh.motd").exists());
        assert!(!dest.join("var/cache/.wh..wh..opq").exists());
        let mut value = [0u8; 4];
        let path = CString::new(dest.join("var/cache").as_os_str().as_bytes()).unwrap();
        let name = CString::new(OPAQUE_XATTR).unwrap();
        // SAFETY: NUL-terminated strings and a buffer of the given length, all alive for the call.
        let n =
            unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), 4) };
        assert_eq!(n, 1, "opaque xattr missing");
        assert_eq!(value[0], b'y');
    }

    #[test]
    fn dot_dot_is_refused() {
        let bytes = Layer::new().file("a/../../escaped", "x").bytes();
        let (tmp, _dest, result) = unpack(bytes);
        assert!(
            matches!(result, Err(UnpackError::Hostile { .. })),
            "{result:?}"
        );
        assert!(!tmp.path().join("escaped").exists());
    }

    #[test]
    fn writes_through_a_planted_symlink_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().to_str().unwrap().to_string();
        // A directory symlink to the outside, then a file "inside" it.
        let bytes = Layer::new()
            .link(tar::EntryType::Symlink, "etc", &target)
            .file("etc/passwd", "owned\n")
            .bytes();
        let (_tmp, dest, result) = unpack(bytes);
        assert!(
            matches!(result, Err(UnpackError::Confined { .. })),
            "{result:?}"
        );
        assert!(!outside.path().join("passwd").exists());
        assert!(std::fs::symlink_metadata(dest.join("etc"))
            .unwrap()
            .file_type()
            .is_symlink());

        // A symlink as the file's own name: the file replaces the link, never writes through it.
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "original").unwrap();
        let bytes = Layer::new()
            .link(tar::EntryType::Symlink, "f", victim.to_str().unwrap())
            .file("f", "replaced\n")
            .bytes();
        let (_tmp, dest, result) = unpack(bytes);
        result.unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original");
        assert_eq!(
            std::fs::read_to_string(dest.join("f")).unwrap(),
            "replaced\n"
        );
    }

    #[test]
    fn hard_links_out_of_the_layer_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, "host secret").unwrap();
        for target in [
            secret.to_str().unwrap().to_string(), // absolute: read as layer-relative, not there
            "../../secret".to_string(),
        ] {
            let bytes = Layer::new()
                .link(tar::EntryType::Link, "stolen", &target)
                .bytes();
            let (_tmp, dest, result) = unpack(bytes);
            assert!(result.is_err(), "{target}: {result:?}");
            assert!(!dest.join("stolen").exists());
        }
        // Through a symlink planted in the layer: refused too.
        let bytes = Layer::new()
            .link(
                tar::EntryType::Symlink,
                "out",
                outside.path().to_str().unwrap(),
            )
            .link(tar::EntryType::Link, "stolen", "out/secret")
            .bytes();
        let (_tmp, dest, result) = unpack(bytes);
        assert!(
            matches!(result, Err(UnpackError::Confined { .. })),
            "{result:?}"
        );
        assert!(!dest.join("stolen").exists());
        assert_eq!(std::fs::metadata(&secret).unwrap().nlink(), 1);
    }

    #[test]
    fn later_entries_replace_earlier_ones() {
        let bytes = Layer::new()
            .dir("d/")
            .file("d/inner", "x")
            .file("d", "now a file")
            .bytes();
        let (_tmp, dest, result) = unpack(bytes);
        if let Err(UnpackError::Sys {
            source: nix::Error::EPERM,
            ..
        }) = &result
        {
            println!("SKIP: chown needs root");
            return;
        }
        result.unwrap();
        assert_eq!(
            std::fs::read_to_string(dest.join("d")).unwrap(),
            "now a file"
        );
    }

    #[test]
    fn zstd_and_plain_archives_are_recognised() {
        let plain = Layer::new().file("a", "1").bytes();
        let zstd = zstd::encode_all(&plain[..], 3).unwrap();
        for bytes in [plain, zstd] {
            let mut out = Vec::new();
            decompressed(std::io::Cursor::new(bytes))
                .unwrap()
                .read_to_end(&mut out)
                .unwrap();
            let mut archive = tar::Archive::new(&out[..]);
            let names: Vec<String> = archive
                .entries()
                .unwrap()
                .map(|e| e.unwrap().path().unwrap().display().to_string())
                .collect();
            assert_eq!(names, vec!["a"]);
        }
    }
}
