//! Files the SDK uploads for COPY steps: `GET /templates/{id}/files/{hash}` answers whether `hash` is
//! present (and where to PUT it); the PUT body is a tar (usually gzipped) of the files, paths relative to
//! the SDK's context directory. Stored once per hash under `<state>/template-files/`, unpacked on demand.

use std::fs;
use std::io::{BufReader, Read, Write};
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("files hash {0:?} is not a lowercase hex SHA-256")]
    BadHash(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("upload {hash}: entry {path:?} escapes the context")]
    UnsafePath { hash: String, path: String },
    #[error(
        "upload {hash}: entry {path:?} is a device node or FIFO, which a build context cannot hold"
    )]
    SpecialFile { hash: String, path: String },
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> UploadError {
    move |source| UploadError::Io { context, source }
}

#[derive(Debug, Clone)]
pub struct UploadStore {
    root: PathBuf,
}

impl UploadStore {
    /// `state_dir/template-files`.
    pub fn new(state_dir: &Path) -> UploadStore {
        UploadStore {
            root: state_dir.join("template-files"),
        }
    }

    fn check(hash: &str) -> Result<(), UploadError> {
        if hash.len() == 64
            && hash
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        {
            Ok(())
        } else {
            Err(UploadError::BadHash(hash.to_string()))
        }
    }

    fn archive_path(&self, hash: &str) -> PathBuf {
        self.root.join(format!("{hash}.tar"))
    }

    /// Whether the archive for `hash` was uploaded.
    pub fn contains(&self, hash: &str) -> Result<bool, UploadError> {
        Self::check(hash)?;
        Ok(self.archive_path(hash).is_file())
    }

    /// Stores an upload body (tar or tar.gz) atomically: temp file, fsync, rename.
    pub fn put(&self, hash: &str, body: &mut dyn Read) -> Result<u64, UploadError> {
        Self::check(hash)?;
        fs::create_dir_all(&self.root)
            .map_err(io_err(format!("creating {}", self.root.display())))?;
        let tmp = self
            .root
            .join(format!(".{hash}.{}.part", std::process::id()));
        let mut file =
            fs::File::create(&tmp).map_err(io_err(format!("creating {}", tmp.display())))?;
        let n =
            std::io::copy(body, &mut file).map_err(io_err(format!("writing {}", tmp.display())))?;
        file.flush()
            .and_then(|_| file.sync_all())
            .map_err(io_err(format!("syncing {}", tmp.display())))?;
        let dest = self.archive_path(hash);
        fs::rename(&tmp, &dest).map_err(io_err(format!("renaming to {}", dest.display())))?;
        Ok(n)
    }

    /// Unpacks the archive for `hash` into `<root>/<hash>/` (once) and returns that directory.
    pub fn unpacked(&self, hash: &str) -> Result<Option<PathBuf>, UploadError> {
        if !self.contains(hash)? {
            return Ok(None);
        }
        let dir = self.root.join(hash);
        if dir.is_dir() {
            return Ok(Some(dir));
        }
        let tmp = self
            .root
            .join(format!(".{hash}.{}.unpack", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp).map_err(io_err(format!("creating {}", tmp.display())))?;
        let result = unpack_archive(&self.archive_path(hash), &tmp, hash);
        if let Err(e) = result {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, &dir).map_err(io_err(format!("renaming to {}", dir.display())))?;
        Ok(Some(dir))
    }
}

/// Unpacks a tar or gzipped tar into `dest`, refusing absolute paths and `..`.
pub fn unpack_archive(archive: &Path, dest: &Path, label: &str) -> Result<(), UploadError> {
    let mut file =
        fs::File::open(archive).map_err(io_err(format!("opening {}", archive.display())))?;
    let mut magic = [0u8; 2];
    let gzipped = file
        .read(&mut magic)
        .map(|n| n == 2 && magic == [0x1f, 0x8b])
        .unwrap_or(false);
    let file = fs::File::open(archive).map_err(io_err(format!("opening {}", archive.display())))?;
    let reader: Box<dyn Read> = if gzipped {
        Box::new(flate2::read::GzDecoder::new(BufReader::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    let mut tar = tar::Archive::new(reader);
    tar.set_preserve_permissions(true);
    tar.set_overwrite(true);
    let entries = tar
        .entries()
        .map_err(io_err(format!("reading {}", archive.display())))?;
    for entry in entries {
        let mut entry = entry.map_err(io_err(format!("reading {}", archive.display())))?;
        let path = entry
            .path()
            .map_err(io_err(format!("reading {}", archive.display())))?
            .into_owned();
        if path.components().any(|c| {
            matches!(
                c,
                Component::ParentDir | Component::RootDir | Component::Prefix(_)
            )
        }) {
            return Err(UploadError::UnsafePath {
                hash: label.to_string(),
                path: path.display().to_string(),
            });
        }
        let kind = entry.header().entry_type();
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            // Unpacking as root would mknod it on the host.
            return Err(UploadError::SpecialFile {
                hash: label.to_string(),
                path: path.display().to_string(),
            });
        }
        entry.unpack_in(dest).map_err(io_err(format!(
            "unpacking {} from {}",
            path.display(),
            archive.display()
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_gz(files: &[(&str, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for (path, content) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, path, content.as_bytes())
                .unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn put_then_unpack() {
        let state = tempfile::tempdir().unwrap();
        let store = UploadStore::new(state.path());
        let hash = "a".repeat(64);
        assert!(!store.contains(&hash).unwrap());
        assert_eq!(store.unpacked(&hash).unwrap(), None);
        let body = tar_gz(&[("app/main.py", "print(1)"), ("req.txt", "flask")]);
        store.put(&hash, &mut body.as_slice()).unwrap();
        assert!(store.contains(&hash).unwrap());
        let dir = store.unpacked(&hash).unwrap().unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("app/main.py")).unwrap(),
            "print(1)"
        );
        // Second call reuses the unpacked directory.
        assert_eq!(store.unpacked(&hash).unwrap().unwrap(), dir);
    }

    #[test]
    fn device_nodes_and_fifos_are_refused() {
        for kind in [
            tar::EntryType::Char,
            tar::EntryType::Block,
            tar::EntryType::Fifo,
        ] {
            let mut builder = tar::Builder::new(Vec::new());
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_size(0);
            header.set_mode(0o666);
            header.set_device_major(1).unwrap();
            header.set_device_minor(3).unwrap();
            header.set_cksum();
            builder
                .append_data(&mut header, "dev-null", std::io::empty())
                .unwrap();
            let scratch = tempfile::tempdir().unwrap();
            let archive = scratch.path().join("ctx.tar");
            fs::write(&archive, builder.into_inner().unwrap()).unwrap();
            let dest = scratch.path().join("dest");
            fs::create_dir(&dest).unwrap();
            let refused = unpack_archive(&archive, &dest, "h");
            assert!(
                matches!(refused, Err(UploadError::SpecialFile { .. })),
                "{kind:?}: {refused:?}"
            );
            assert!(!dest.join("dev-null").exists());
        }
    }

    #[test]
    fn bad_hashes_are_refused() {
        let state = tempfile::tempdir().unwrap();
        let store = UploadStore::new(state.path());
        assert!(matches!(
            store.contains("../x"),
            Err(UploadError::BadHash(_))
        ));
        assert!(matches!(
            store.put("ABC", &mut [].as_slice()),
            Err(UploadError::BadHash(_))
        ));
    }

    #[test]
    fn plain_tar_is_accepted() {
        let state = tempfile::tempdir().unwrap();
        let store = UploadStore::new(state.path());
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(2);
        header.set_mode(0o600);
        header.set_cksum();
        builder
            .append_data(&mut header, "x.txt", &b"hi"[..])
            .unwrap();
        let body = builder.into_inner().unwrap();
        let hash = "b".repeat(64);
        store.put(&hash, &mut body.as_slice()).unwrap();
        let dir = store.unpacked(&hash).unwrap().unwrap();
        assert_eq!(fs::read_to_string(dir.join("x.txt")).unwrap(), "hi");
    }
}
