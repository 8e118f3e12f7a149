//! The files of a checkpoint directory: written into a temporary sibling and renamed into place
//! (the filesystem synced, the directories fsynced), the writable layer as a zstd tar, every stored
//! file checksummed and verified before it is used.
//!
//! Layout: `manifest.json`, `images/` (CRIU's image files), `layer.tar.zst`, `dump.log`. The memory
//! pages (`pages-<n>.img`) are stored as independently compressed chunks with a checksum each
//! (`pages-<n>.img.chunks`, [`super::page_chunks`]), so that a restore can unpack and check each
//! chunk only when it is about to be used; the other images (small) are zstd-compressed where it pays
//! and carry a SHA-256 each.
//! Checkpoints of format 1 have zstd-compressed page images and whole-file checksums; they are
//! decompressed into the restore's scratch directory as before.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::manifest::StoredFile;
use super::CheckpointError;

pub const IMAGES_DIR: &str = "images";
pub const LAYER_FILE: &str = "layer.tar.zst";
/// Image files at least this big are tried with zstd.
const COMPRESS_FROM_BYTES: u64 = 256 * 1024;
/// ... and kept compressed only when that saves at least a tenth.
const KEEP_COMPRESSED_RATIO: f64 = 0.9;
/// How much of a large image is test-compressed to decide.
const SAMPLE_BYTES: usize = 1 << 20;
/// Level 1: memory pages compress 3-5x at several hundred MB/s; higher levels cost pause time.
const ZSTD_LEVEL: i32 = 1;

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let context = context.into();
    move |source| CheckpointError::Io { context, source }
}

/// A directory that appears at its destination only when complete.
#[derive(Debug)]
pub struct AtomicDir {
    tmp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl AtomicDir {
    pub fn create(dest: &Path) -> Result<Self, CheckpointError> {
        if dest.exists() {
            return Err(CheckpointError::Invalid(format!(
                "{} already exists",
                dest.display()
            )));
        }
        let parent = dest
            .parent()
            .ok_or_else(|| CheckpointError::Invalid(format!("{} has no parent", dest.display())))?;
        std::fs::create_dir_all(parent).map_err(io_err(format!("create {}", parent.display())))?;
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tmp = parent.join(format!(".{name}.tmp-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&tmp).map_err(io_err(format!("create {}", tmp.display())))?;
        Ok(Self {
            tmp,
            dest: dest.to_path_buf(),
            committed: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Makes the tree durable (one `syncfs` of its filesystem instead of an fsync per file: a
    /// checkpoint has dozens of small image files), renames it into place and fsyncs the parent.
    pub fn commit(mut self) -> Result<PathBuf, CheckpointError> {
        let dir = File::open(&self.tmp).map_err(io_err(format!("open {}", self.tmp.display())))?;
        // SAFETY: syncfs on an fd we own; it only flushes the filesystem holding it.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
            return Err(io_err(format!("syncfs {}", self.tmp.display()))(
                std::io::Error::last_os_error(),
            ));
        }
        fsync_dir(&self.tmp.join(IMAGES_DIR))?;
        fsync_dir(&self.tmp)?;
        std::fs::rename(&self.tmp, &self.dest)
            .map_err(io_err(format!("rename into {}", self.dest.display())))?;
        self.committed = true;
        if let Some(parent) = self.dest.parent() {
            fsync_dir(parent)?;
        }
        Ok(self.dest.clone())
    }
}

impl Drop for AtomicDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

fn fsync_dir(dir: &Path) -> Result<(), CheckpointError> {
    match File::open(dir) {
        Ok(f) => f
            .sync_all()
            .map_err(io_err(format!("fsync {}", dir.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(format!("open {}", dir.display()))(e)),
    }
}

/// Counts and hashes what passes through.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
        (self.inner, hex::encode(self.hasher.finalize()), self.bytes)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Counts and hashes what is read through it.
struct HashingReader<R: Read> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    fn finish(self) -> (String, u64) {
        (hex::encode(self.hasher.finalize()), self.bytes)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

fn hash_file(path: &Path) -> Result<(String, u64), CheckpointError> {
    let file = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
    let mut reader = HashingReader::new(BufReader::with_capacity(1 << 20, file));
    std::io::copy(&mut reader, &mut std::io::sink())
        .map_err(io_err(format!("read {}", path.display())))?;
    Ok(reader.finish())
}

/// Compresses the larger image files in `checkpoint/images` in place where that pays, fsyncs every
/// file and returns their manifest entries.
pub fn pack_images(checkpoint: &Path) -> Result<Vec<StoredFile>, CheckpointError> {
    let dir = checkpoint.join(IMAGES_DIR);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(io_err(format!("list {}", dir.display())))?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(io_err(format!("list {}", dir.display())))?;
    names.sort();
    let mut stored = Vec::with_capacity(names.len());
    for name in names {
        let raw_path = dir.join(&name);
        if is_page_image(&name) {
            let stored_name = format!("{name}{}", super::page_chunks::STORED_SUFFIX);
            let (chunks, raw_bytes, stored_bytes) =
                super::page_chunks::pack(&raw_path, &dir.join(&stored_name))?;
            std::fs::remove_file(&raw_path)
                .map_err(io_err(format!("remove {}", raw_path.display())))?;
            stored.push(StoredFile {
                path: format!("{IMAGES_DIR}/{stored_name}"),
                name,
                stored_bytes,
                raw_bytes,
                zstd: false,
                sha256: String::new(),
                chunks: Some(chunks),
            });
            continue;
        }
        let raw_bytes = std::fs::metadata(&raw_path)
            .map_err(io_err(format!("stat {}", raw_path.display())))?
            .len();
        if raw_bytes >= COMPRESS_FROM_BYTES && sample_compresses(&raw_path)? {
            let zst_path = dir.join(format!("{name}.zst"));
            let (sha256, stored_bytes) = compress_file(&raw_path, &zst_path)?;
            if (stored_bytes as f64) < raw_bytes as f64 * KEEP_COMPRESSED_RATIO {
                std::fs::remove_file(&raw_path)
                    .map_err(io_err(format!("remove {}", raw_path.display())))?;
                stored.push(StoredFile {
                    path: format!("{IMAGES_DIR}/{name}.zst"),
                    name,
                    stored_bytes,
                    raw_bytes,
                    zstd: true,
                    sha256,
                    chunks: None,
                });
                continue;
            }
            std::fs::remove_file(&zst_path)
                .map_err(io_err(format!("remove {}", zst_path.display())))?;
        }
        let (sha256, stored_bytes) = hash_file(&raw_path)?;
        stored.push(StoredFile {
            path: format!("{IMAGES_DIR}/{name}"),
            name,
            stored_bytes,
            raw_bytes,
            zstd: false,
            sha256,
            chunks: None,
        });
    }
    Ok(stored)
}

/// CRIU's memory-page images: `pages-<n>.img`.
pub fn is_page_image(name: &str) -> bool {
    name.strip_prefix("pages-")
        .and_then(|rest| rest.strip_suffix(".img"))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether the first MiB of `path` shrinks enough under zstd to be worth compressing the whole file
/// (random or already-compressed memory does not; compressing it anyway would only cost pause time).
fn sample_compresses(path: &Path) -> Result<bool, CheckpointError> {
    let mut sample = Vec::with_capacity(SAMPLE_BYTES);
    File::open(path)
        .and_then(|f| f.take(SAMPLE_BYTES as u64).read_to_end(&mut sample))
        .map_err(io_err(format!("read {}", path.display())))?;
    let compressed = zstd::bulk::compress(&sample, ZSTD_LEVEL).map_err(io_err("zstd sample"))?;
    Ok((compressed.len() as f64) < sample.len() as f64 * KEEP_COMPRESSED_RATIO)
}

fn compress_file(from: &Path, to: &Path) -> Result<(String, u64), CheckpointError> {
    let input = File::open(from).map_err(io_err(format!("open {}", from.display())))?;
    let output = File::create(to).map_err(io_err(format!("create {}", to.display())))?;
    let hashing = HashingWriter::new(BufWriter::with_capacity(1 << 20, output));
    let mut encoder = zstd::Encoder::new(hashing, ZSTD_LEVEL).map_err(io_err("zstd encoder"))?;
    std::io::copy(&mut BufReader::with_capacity(1 << 20, input), &mut encoder)
        .map_err(io_err(format!("compress {}", from.display())))?;
    let hashing = encoder
        .finish()
        .map_err(io_err(format!("compress {}", from.display())))?;
    let (writer, sha256, bytes) = hashing.finish();
    writer
        .into_inner()
        .map_err(|e| io_err(format!("write {}", to.display()))(e.into_error()))?;
    Ok((sha256, bytes))
}

/// Archives the overlay upper dir `upper` (whiteouts, xattrs and owners included) as
/// `checkpoint/layer.tar.zst`.
pub fn archive_layer(upper: &Path, checkpoint: &Path) -> Result<StoredFile, CheckpointError> {
    let path = checkpoint.join(LAYER_FILE);
    let output = File::create(&path).map_err(io_err(format!("create {}", path.display())))?;
    let mut tar = Command::new("tar")
        .args([
            "--create",
            "--file=-",
            "--numeric-owner",
            "--xattrs",
            "--xattrs-include=*",
            "--sparse",
            "--one-file-system",
        ])
        .arg("--directory")
        .arg(upper)
        .arg(".")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err("start tar"))?;
    let mut stdout = tar
        .stdout
        .take()
        .ok_or_else(|| CheckpointError::Invalid("tar without stdout".into()))?;
    let hashing = HashingWriter::new(BufWriter::with_capacity(1 << 20, output));
    let mut encoder = zstd::Encoder::new(hashing, ZSTD_LEVEL).map_err(io_err("zstd encoder"))?;
    let raw_bytes = std::io::copy(&mut stdout, &mut encoder)
        .map_err(io_err(format!("archive {}", upper.display())))?;
    let result = tar.wait_with_output().map_err(io_err("wait for tar"))?;
    if !result.status.success() {
        return Err(CheckpointError::Layer(format!(
            "tar of {}: {}",
            upper.display(),
            String::from_utf8_lossy(&result.stderr).trim()
        )));
    }
    let hashing = encoder
        .finish()
        .map_err(io_err(format!("write {}", path.display())))?;
    let (writer, sha256, stored_bytes) = hashing.finish();
    writer
        .into_inner()
        .map_err(|e| io_err(format!("write {}", path.display()))(e.into_error()))?;
    Ok(StoredFile {
        path: LAYER_FILE.into(),
        name: "layer.tar".into(),
        stored_bytes,
        raw_bytes,
        zstd: true,
        sha256,
        chunks: None,
    })
}

fn checksum_mismatch(file: &StoredFile, found: &str) -> CheckpointError {
    CheckpointError::Corrupt(format!(
        "{}: sha256 {found}, manifest says {}",
        file.path, file.sha256
    ))
}

/// Verifies every image file and lays them out, decompressed, in `scratch` for CRIU (uncompressed ones
/// are hard-linked when `scratch` is on the same filesystem). A chunked page image becomes a sparse
/// file of its raw size, its content left to the caller ([`super::lazy_pages::expand_eager_pages`],
/// [`expand_chunked`]). The checkpoint is only read.
pub fn unpack_images(
    checkpoint: &Path,
    files: &[StoredFile],
    scratch: &Path,
) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(scratch).map_err(io_err(format!("create {}", scratch.display())))?;
    for file in files {
        let stored = checkpoint.join(&file.path);
        let target = scratch.join(&file.name);
        if file.chunks.is_some() {
            File::create(&target)
                .and_then(|f| f.set_len(file.raw_bytes))
                .map_err(io_err(format!("create {}", target.display())))?;
        } else if file.zstd {
            let input =
                File::open(&stored).map_err(io_err(format!("open {}", stored.display())))?;
            let mut hashing = HashingReader::new(input);
            let output =
                File::create(&target).map_err(io_err(format!("create {}", target.display())))?;
            let mut writer = BufWriter::with_capacity(1 << 20, output);
            {
                let mut decoder =
                    zstd::Decoder::new(&mut hashing).map_err(io_err("zstd decoder"))?;
                std::io::copy(&mut decoder, &mut writer)
                    .map_err(|e| CheckpointError::Corrupt(format!("{}: {e}", file.path)))?;
            }
            // Whatever follows the zstd frame counts too.
            std::io::copy(&mut hashing, &mut std::io::sink())
                .map_err(io_err(format!("read {}", stored.display())))?;
            writer
                .flush()
                .map_err(io_err(format!("write {}", target.display())))?;
            let (sha256, _) = hashing.finish();
            if sha256 != file.sha256 {
                return Err(checksum_mismatch(file, &sha256));
            }
        } else {
            let (sha256, _) = hash_file(&stored)?;
            if sha256 != file.sha256 {
                return Err(checksum_mismatch(file, &sha256));
            }
            if std::fs::hard_link(&stored, &target).is_err() {
                std::fs::copy(&stored, &target)
                    .map_err(io_err(format!("copy {}", stored.display())))?;
            }
        }
    }
    Ok(())
}

/// Unpacks every chunk of every chunked page image of `checkpoint` into its raw file in `scratch`,
/// each checked, on all cores (the eager restore: CRIU reads all pages before the tree runs).
pub fn expand_chunked(
    checkpoint: &Path,
    files: &[StoredFile],
    scratch: &Path,
) -> Result<(), CheckpointError> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    for file in files {
        if let Some(sums) = &file.chunks {
            let out = std::fs::OpenOptions::new()
                .write(true)
                .open(scratch.join(&file.name))
                .map_err(io_err(format!("open the raw {}", file.name)))?;
            super::page_chunks::ChunkedPages::open(
                &checkpoint.join(&file.path),
                &file.name,
                file.raw_bytes,
                sums,
            )?
            .expand_all(&out, threads)?;
        }
    }
    Ok(())
}

/// Marks a complete entry of the unpacked-images cache.
const CACHE_COMPLETE: &str = ".complete";

/// The unpacked-images cache is trimmed, oldest-used entries first, to this many bytes.
pub const IMAGE_CACHE_BYTES: u64 = 4 << 30;

/// Like [`unpack_images`] then [`expand_chunked`], through `cache`: a directory of image sets that
/// were verified and unpacked (page chunks expanded) once, keyed by the manifest's checksums. A hit hard-links the cached files into `scratch`
/// (no decompression, no hashing); a miss unpacks as usual and then keeps the result. Meant for
/// checkpoints that are restored many times (templates, fork sources); CRIU only reads its images,
/// so the cached files are never written to through the links. Any cache trouble falls back to the
/// plain unpack.
pub fn unpack_images_cached(
    checkpoint: &Path,
    files: &[StoredFile],
    scratch: &Path,
    cache: &Path,
) -> Result<(), CheckpointError> {
    let entry = cache.join(cache_key(files));
    if entry.join(CACHE_COMPLETE).is_file() && link_files(&entry, files, scratch).is_ok() {
        // Mark it used, for the trimming order.
        if let Ok(dir) = File::open(&entry) {
            let _ = dir.set_modified(std::time::SystemTime::now());
        }
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(scratch);
    unpack_images(checkpoint, files, scratch)?;
    expand_chunked(checkpoint, files, scratch)?;
    let temp = cache.join(format!(
        ".fill-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    ));
    let filled = std::fs::create_dir_all(&temp).is_ok()
        && link_files(scratch, files, &temp).is_ok()
        && std::fs::write(temp.join(CACHE_COMPLETE), b"").is_ok()
        && std::fs::rename(&temp, &entry).is_ok();
    if filled {
        trim_cache(cache, IMAGE_CACHE_BYTES);
    } else {
        // Another restore may have filled the same entry first; either way ours goes.
        let _ = std::fs::remove_dir_all(&temp);
    }
    Ok(())
}

/// Removes the entry of `cache` that [`unpack_images_cached`] made for `files`, if any.
pub fn forget_images(cache: &Path, files: &[StoredFile]) {
    let _ = std::fs::remove_dir_all(cache.join(cache_key(files)));
}

fn cache_key(files: &[StoredFile]) -> String {
    let mut hasher = Sha256::new();
    for file in files {
        hasher.update(file.name.as_bytes());
        hasher.update(b"\0");
        hasher.update(file.sha256.as_bytes());
        for sum in file.chunks.iter().flat_map(|c| &c.xxh3_128) {
            hasher.update(sum.as_bytes());
        }
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// Hard-links every image of `files` from `from` into `to` (created if missing).
fn link_files(from: &Path, files: &[StoredFile], to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for file in files {
        std::fs::hard_link(from.join(&file.name), to.join(&file.name))?;
    }
    Ok(())
}

/// Removes least recently used entries of `cache` until it holds at most `max_bytes`.
fn trim_cache(cache: &Path, max_bytes: u64) {
    let Ok(dir) = std::fs::read_dir(cache) else {
        return;
    };
    let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = dir
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let used = e.metadata().ok()?.modified().ok()?;
            let bytes = std::fs::read_dir(e.path())
                .ok()?
                .flatten()
                .filter_map(|f| f.metadata().ok())
                .map(|m| m.len())
                .sum();
            Some((used, bytes, e.path()))
        })
        .collect();
    let mut total: u64 = entries.iter().map(|(_, bytes, _)| bytes).sum();
    entries.sort();
    for (_, bytes, path) in entries {
        if total <= max_bytes {
            break;
        }
        if std::fs::remove_dir_all(&path).is_ok() {
            total = total.saturating_sub(bytes);
        }
    }
}

/// Verifies the layer archive and unpacks it into `upper` (an empty directory).
pub fn extract_layer(
    checkpoint: &Path,
    layer: &StoredFile,
    upper: &Path,
) -> Result<(), CheckpointError> {
    let stored = checkpoint.join(&layer.path);
    // Check first: a corrupt archive must not leave half a layer behind.
    let (sha256, _) = hash_file(&stored)?;
    if sha256 != layer.sha256 {
        return Err(checksum_mismatch(layer, &sha256));
    }
    std::fs::create_dir_all(upper).map_err(io_err(format!("create {}", upper.display())))?;
    let input = File::open(&stored).map_err(io_err(format!("open {}", stored.display())))?;
    let mut decoder = zstd::Decoder::new(input).map_err(io_err("zstd decoder"))?;
    let mut tar = Command::new("tar")
        .args([
            "--extract",
            "--file=-",
            "--numeric-owner",
            "--same-owner",
            "--preserve-permissions",
            "--xattrs",
            "--xattrs-include=*",
        ])
        .arg("--directory")
        .arg(upper)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err("start tar"))?;
    let copied = {
        let mut stdin = tar
            .stdin
            .take()
            .ok_or_else(|| CheckpointError::Invalid("tar without stdin".into()))?;
        std::io::copy(&mut decoder, &mut stdin)
    };
    let result = tar.wait_with_output().map_err(io_err("wait for tar"))?;
    copied.map_err(|e| CheckpointError::Layer(format!("unpack {}: {e}", layer.path)))?;
    if !result.status.success() {
        return Err(CheckpointError::Layer(format!(
            "untar into {}: {}",
            upper.display(),
            String::from_utf8_lossy(&result.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wt-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// A committed checkpoint under `root` holding a tiny raw image and a 1 MiB compressible one.
    fn packed_checkpoint(root: &Path) -> (PathBuf, Vec<StoredFile>) {
        let atomic = AtomicDir::create(&root.join("ckpt")).unwrap();
        let images = atomic.path().join(IMAGES_DIR);
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(images.join("small.img"), b"tiny").unwrap();
        std::fs::write(images.join("big-1.img"), vec![7u8; 1 << 20]).unwrap();
        let files = pack_images(atomic.path()).unwrap();
        (atomic.commit().unwrap(), files)
    }

    #[test]
    fn the_image_cache_serves_verified_copies_and_is_trimmed() {
        let root = temp("cache");
        let (ckpt, files) = packed_checkpoint(&root);
        let cache = root.join("cache");

        // A miss verifies and unpacks, then keeps a complete entry.
        unpack_images_cached(&ckpt, &files, &root.join("s1"), &cache).unwrap();
        assert_eq!(
            std::fs::read(root.join("s1/big-1.img")).unwrap(),
            vec![7u8; 1 << 20]
        );
        let entry = cache.join(cache_key(&files));
        assert!(entry.join(CACHE_COMPLETE).is_file());

        // A hit does not read the checkpoint: a replaced stored file goes unnoticed (uncompressed
        // images are hard links of the stored ones, so replace it rather than write into it)...
        std::fs::write(root.join("evil"), b"evil").unwrap();
        std::fs::rename(root.join("evil"), ckpt.join("images/small.img")).unwrap();
        unpack_images_cached(&ckpt, &files, &root.join("s2"), &cache).unwrap();
        assert_eq!(std::fs::read(root.join("s2/small.img")).unwrap(), b"tiny");
        // ...until the entry is incomplete, when the checkpoint is verified again.
        std::fs::remove_file(entry.join(CACHE_COMPLETE)).unwrap();
        let err = unpack_images_cached(&ckpt, &files, &root.join("s3"), &cache).unwrap_err();
        assert!(err.to_string().contains("sha256"), "{err}");

        // Trimming drops the least recently used entries first.
        for (name, age) in [("old", 100), ("new", 1)] {
            let dir = cache.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("pages.img"), vec![0u8; 4096]).unwrap();
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            File::open(&dir).unwrap().set_modified(when).unwrap();
        }
        let _ = std::fs::remove_dir_all(&entry);
        trim_cache(&cache, 4096);
        assert!(!cache.join("old").exists());
        assert!(cache.join("new").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn images_round_trip_and_corruption_is_caught() {
        let root = temp("images");
        let (ckpt, files) = packed_checkpoint(&root);
        let pages = files.iter().find(|f| f.name == "big-1.img").unwrap();
        assert!(pages.zstd && pages.stored_bytes < 4096, "{pages:?}");
        assert!(!files.iter().find(|f| f.name == "small.img").unwrap().zstd);
        assert!(ckpt.join("images/big-1.img.zst").exists());

        let scratch = root.join("scratch");
        unpack_images(&ckpt, &files, &scratch).unwrap();
        assert_eq!(
            std::fs::read(scratch.join("big-1.img")).unwrap(),
            vec![7u8; 1 << 20]
        );
        assert_eq!(std::fs::read(scratch.join("small.img")).unwrap(), b"tiny");

        std::fs::write(ckpt.join("images/small.img.new"), b"tinx").unwrap();
        std::fs::rename(
            ckpt.join("images/small.img.new"),
            ckpt.join("images/small.img"),
        )
        .unwrap();
        let err = unpack_images(&ckpt, &files, &root.join("scratch2")).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt(_)), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn incompressible_images_are_stored_raw() {
        let root = temp("random");
        let images = root.join(IMAGES_DIR);
        std::fs::create_dir_all(&images).unwrap();
        // xorshift noise: zstd cannot shrink it.
        let mut state = 0x9e3779b97f4a7c15u64;
        let noise: Vec<u8> = (0..(2 << 20))
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        std::fs::write(images.join("noise.img"), &noise).unwrap();
        let files = pack_images(&root).unwrap();
        assert!(
            !files[0].zstd && files[0].stored_bytes == 2 << 20,
            "{:?}",
            files[0]
        );
        assert!(!images.join("noise.img.zst").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn page_images_are_stored_in_checked_chunks() {
        let root = temp("pages");
        let atomic = AtomicDir::create(&root.join("ckpt")).unwrap();
        let images = atomic.path().join(IMAGES_DIR);
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(images.join("pages-1.img"), vec![7u8; 3 << 20]).unwrap();
        let files = pack_images(atomic.path()).unwrap();
        let ckpt = atomic.commit().unwrap();
        let pages = &files[0];
        assert!(!pages.zstd && pages.sha256.is_empty(), "{pages:?}");
        assert_eq!(pages.path, "images/pages-1.img.chunks");
        assert_eq!(pages.chunks.as_ref().unwrap().xxh3_128.len(), 12);
        assert!(pages.stored_bytes < pages.raw_bytes / 100, "{pages:?}");
        assert!(!ckpt.join("images/pages-1.img").exists());
        assert!(is_page_image("pages-12.img") && !is_page_image("pages-x.img"));
        assert!(!is_page_image("pagemap-1.img"));

        // The layout gives a sparse raw file; the eager unpack fills it, checked.
        let scratch = root.join("scratch");
        unpack_images(&ckpt, &files, &scratch).unwrap();
        assert_eq!(
            std::fs::metadata(scratch.join("pages-1.img"))
                .unwrap()
                .len(),
            3 << 20
        );
        expand_chunked(&ckpt, &files, &scratch).unwrap();
        assert_eq!(
            std::fs::read(scratch.join("pages-1.img")).unwrap(),
            vec![7u8; 3 << 20]
        );

        // Damage in the stored chunks is caught by the chunk check.
        let mut bytes = std::fs::read(ckpt.join("images/pages-1.img.chunks")).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x10;
        std::fs::write(ckpt.join("images/pages-1.img.chunks"), &bytes).unwrap();
        let err = expand_chunked(&ckpt, &files, &scratch).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt(_)), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn unfinished_dir_disappears_and_existing_dest_is_refused() {
        let root = temp("atomic");
        let dest = root.join("ckpt");
        let tmp = {
            let atomic = AtomicDir::create(&dest).unwrap();
            atomic.path().to_path_buf()
        };
        assert!(!tmp.exists() && !dest.exists());
        std::fs::create_dir_all(&dest).unwrap();
        assert!(AtomicDir::create(&dest).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn layer_round_trips_through_tar() {
        let root = temp("layer");
        let upper = root.join("upper");
        std::fs::create_dir_all(upper.join("home/user")).unwrap();
        std::fs::write(upper.join("home/user/notes.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink("notes.txt", upper.join("home/user/link")).unwrap();
        let ckpt = root.join("ckpt");
        std::fs::create_dir_all(&ckpt).unwrap();
        let layer = archive_layer(&upper, &ckpt).unwrap();
        let restored = root.join("restored");
        extract_layer(&ckpt, &layer, &restored).unwrap();
        assert_eq!(
            std::fs::read(restored.join("home/user/notes.txt")).unwrap(),
            b"hello"
        );
        assert_eq!(
            std::fs::read_link(restored.join("home/user/link")).unwrap(),
            PathBuf::from("notes.txt")
        );
        let mut bad = layer.clone();
        bad.sha256 = "0".repeat(64);
        assert!(matches!(
            extract_layer(&ckpt, &bad, &root.join("r2")),
            Err(CheckpointError::Corrupt(_))
        ));
        assert!(!root.join("r2").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
