//! `GET /files` (download, optionally gzip) and `POST /files` (multipart with one or many files,
//! or a raw `application/octet-stream` body, optionally gzip), as the user named by `username`.

// Early exits carry the finished HTTP response; boxing it would only add noise.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::Arc;

use async_compression::tokio::bufread::{GzipDecoder, GzipEncoder};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;
use tokio::io::{AsyncRead, AsyncWriteExt, BufReader};
use tokio_util::io::{ReaderStream, StreamReader};

use super::json_error;
use crate::filesystem::entry::write_metadata;
use crate::identity::{self, Identity};
use crate::paths::ResolvedPath;
use crate::state::{constant_time_eq, Agent};
use crate::users::User;
use warren_proto::envd::signature::file_signature;

const METADATA_HEADER_PREFIX: &str = "x-metadata-";
const MAX_METADATA_BYTES: usize = 4096;

#[derive(Debug, serde::Deserialize)]
pub struct FileParams {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

/// With an access token set, a file request needs the token header or a valid signature.
fn authorize(
    agent: &Agent,
    headers: &HeaderMap,
    params: &FileParams,
    operation: &str,
) -> Result<(), Response> {
    let Some(token) = agent.token() else {
        return Ok(());
    };
    if let Some(given) = headers.get("x-access-token") {
        if constant_time_eq(given.as_bytes(), token.as_bytes()) {
            return Ok(());
        }
        return Err(json_error(
            StatusCode::UNAUTHORIZED,
            "access token present in header but does not match",
        ));
    }
    let Some(sig) = &params.signature else {
        return Err(json_error(
            StatusCode::UNAUTHORIZED,
            "missing access token or signature",
        ));
    };
    let expected = file_signature(
        params.path.as_deref().unwrap_or(""),
        operation,
        params.username.as_deref().unwrap_or(""),
        &token,
        params.signature_expiration,
    );
    if !constant_time_eq(sig.as_bytes(), expected.as_bytes()) {
        return Err(json_error(StatusCode::UNAUTHORIZED, "invalid signature"));
    }
    if let Some(exp) = params.signature_expiration {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        if exp < now {
            return Err(json_error(
                StatusCode::UNAUTHORIZED,
                "signature is already expired",
            ));
        }
    }
    Ok(())
}

fn file_user(agent: &Agent, params: &FileParams) -> Result<User, Response> {
    let name = params
        .username
        .clone()
        .unwrap_or_else(|| agent.defaults().user);
    agent.user(&name).map_err(|e| {
        json_error(
            StatusCode::UNAUTHORIZED,
            &format!("error looking up user '{name}': {e}"),
        )
    })
}

fn resolve(agent: &Agent, user: &User, path: &str) -> Result<ResolvedPath, Response> {
    agent.resolve(user, path).map_err(|e| {
        json_error(
            StatusCode::BAD_REQUEST,
            &format!("invalid path '{path}': {e}"),
        )
    })
}

fn io_response(e: &std::io::Error, what: &str) -> Response {
    use std::io::ErrorKind;
    let status = match e.kind() {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        // A name longer than the filesystem takes, or a symlink where the path may have none: the
        // client's path is at fault, not the agent.
        ErrorKind::NotADirectory
        | ErrorKind::IsADirectory
        | ErrorKind::InvalidInput
        | ErrorKind::InvalidFilename => StatusCode::BAD_REQUEST,
        _ if e.raw_os_error() == Some(libc::ELOOP) => StatusCode::BAD_REQUEST,
        // What the body reader reports for a body cut short or a gzip stream that is not one.
        ErrorKind::UnexpectedEof | ErrorKind::InvalidData => StatusCode::BAD_REQUEST,
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    json_error(status, &format!("{what}: {e}"))
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim();
            let q_zero = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            name.eq_ignore_ascii_case("gzip") && !q_zero
        })
}

pub async fn download(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    Query(params): Query<FileParams>,
) -> Response {
    if let Err(r) = authorize(&agent, &headers, &params, "read") {
        return r;
    }
    let user = match file_user(&agent, &params) {
        Ok(u) => u,
        Err(r) => return r,
    };
    let path = match resolve(&agent, &user, params.path.as_deref().unwrap_or("")) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let host = path.host.clone();
    let opened = identity::blocking_as(Identity::from(&user), move || {
        let meta = std::fs::metadata(&host)?;
        if meta.is_dir() {
            return Ok(None);
        }
        let file = std::fs::File::open(&host)?;
        let compressible = compressible(&file, meta.len());
        Ok::<_, std::io::Error>(Some((file, meta.len(), compressible)))
    })
    .await;
    let (file, len, compressible) = match opened {
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                &format!("path '{}' is a directory", path.sandbox),
            )
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return json_error(
                StatusCode::NOT_FOUND,
                &format!("path '{}' does not exist", path.sandbox),
            )
        }
        Ok(Err(e)) => return io_response(&e, &format!("error opening file '{}'", path.sandbox)),
        Err(e) => return json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let name = std::path::Path::new(&path.sandbox)
        .file_name()
        .map(|n| n.to_string_lossy().replace('"', ""))
        .unwrap_or_default();
    let file = tokio::fs::File::from_std(file);
    let disposition = format!("inline; filename=\"{name}\"");
    if compressible && accepts_gzip(&headers) {
        let body = Body::from_stream(ReaderStream::with_capacity(
            // Fastest level: the SDK's HTTP client asks for gzip on every download, and a
            // transfer should not be bound by compression speed.
            GzipEncoder::with_quality(
                BufReader::with_capacity(256 << 10, file),
                async_compression::Level::Fastest,
            ),
            256 << 10,
        ));
        return (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (header::CONTENT_ENCODING, "gzip".to_string()),
                (header::CONTENT_DISPOSITION, disposition),
                (header::VARY, "Accept-Encoding".to_string()),
            ],
            body,
        )
            .into_response();
    }
    let body = Body::from_stream(ReaderStream::with_capacity(file, 256 << 10));
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
            (header::CONTENT_DISPOSITION, disposition),
            (header::VARY, "Accept-Encoding".to_string()),
        ],
        body,
    )
        .into_response()
}

/// Whether gzip would pay for this file: compresses two 64 KiB samples (start and middle) at the
/// fastest level and wants them to shrink by a tenth at least. Incompressible data (archives, images,
/// random bytes) then goes out as it is, at disk speed, instead of at compressor speed for no gain.
fn compressible(file: &std::fs::File, len: u64) -> bool {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    const SAMPLE: usize = 64 << 10;
    let mut raw = 0usize;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    for offset in [0, len / 2] {
        let mut buf = vec![0u8; SAMPLE];
        let Ok(n) = file.read_at(&mut buf, offset) else {
            return true;
        };
        raw += n;
        if encoder.write_all(&buf[..n]).is_err() {
            return true;
        }
    }
    match encoder.finish() {
        Ok(packed) => raw < 512 || packed.len() * 10 < raw * 9,
        Err(_) => true,
    }
}

/// `X-Metadata-*` headers: lowercased keys, printable ASCII, bounded size.
fn metadata_from_headers(headers: &HeaderMap) -> Result<Vec<(String, String)>, Response> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut total = 0;
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER_PREFIX) else {
            continue;
        };
        let printable = |b: &u8| (0x20..=0x7e).contains(b);
        if key.is_empty()
            || !key.as_bytes().iter().all(printable)
            || !value.as_bytes().iter().all(printable)
        {
            return Err(json_error(
                StatusCode::BAD_REQUEST,
                "metadata keys and values must be printable ASCII",
            ));
        }
        if out.iter().any(|(k, _)| k == key) {
            continue;
        }
        total += crate::filesystem::entry::METADATA_XATTR_PREFIX.len() + key.len() + value.len();
        if key.len() > 246 || total > MAX_METADATA_BYTES {
            return Err(json_error(StatusCode::BAD_REQUEST, "metadata too large"));
        }
        out.push((
            key.to_string(),
            String::from_utf8_lossy(value.as_bytes()).into_owned(),
        ));
    }
    Ok(out)
}

/// Creates the directories missing above `host` (below `root`) the way envd does: as root, mode
/// 0755, each handed to the writing user. A user can thus write `/0/a/b.txt` although `/` is not
/// theirs; directories that already exist are left as they are.
///
/// Root only ever works through real directories: the walk holds each directory open and opens the
/// next component without following a symlink, so a link the user planted (or swaps in during the
/// walk) cannot steer a root-made directory into a place the user could not write. From a symlink on,
/// the rest of the chain is created with the user's own credentials, and the kernel decides.
fn ensure_parents(
    root: &std::path::Path,
    host: &std::path::Path,
    id: &Identity,
) -> std::io::Result<()> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::{fstatat, mkdirat, Mode, SFlag};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    let Some(parent) = host.parent() else {
        return Ok(());
    };
    let Ok(below_root) = parent.strip_prefix(root) else {
        return Ok(());
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let open_at = |dir: &OwnedFd, name: &std::ffi::OsStr| -> nix::Result<OwnedFd> {
        let fd = openat(Some(dir.as_raw_fd()), name, flags, Mode::empty())?;
        // SAFETY: openat returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let mut dir = OwnedFd::from(std::fs::File::open(root)?);
    let mut walked = root.to_path_buf();
    for part in below_root.components() {
        let name = part.as_os_str();
        let next = match open_at(&dir, name) {
            Ok(next) => next,
            Err(nix::errno::Errno::ENOENT) => {
                match mkdirat(Some(dir.as_raw_fd()), name, Mode::from_bits_truncate(0o755)) {
                    // EEXIST: made by a concurrent write meanwhile; opened (without following) below.
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                let made = open_at(&dir, name).map_err(|e| {
                    std::io::Error::other(format!("{}: {e}", walked.join(name).display()))
                })?;
                if identity::can_switch() {
                    nix::unistd::fchown(
                        made.as_raw_fd(),
                        Some(id.uid.into()),
                        Some(id.gid.into()),
                    )?;
                }
                made
            }
            Err(nix::errno::Errno::ENOTDIR | nix::errno::Errno::ELOOP) => {
                let stat = fstatat(
                    Some(dir.as_raw_fd()),
                    name,
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )?;
                if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFLNK {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotADirectory,
                        format!("path is a file: {}", walked.join(name).display()),
                    ));
                }
                // A symlink: whatever is left is the user's to make, as the user.
                let parent = parent.to_path_buf();
                return identity::with_fs_identity(id, move || {
                    let made = std::fs::create_dir_all(&parent);
                    match made {
                        Ok(()) if !std::fs::metadata(&parent)?.is_dir() => {
                            Err(std::io::Error::new(
                                std::io::ErrorKind::NotADirectory,
                                format!("path is a file: {}", parent.display()),
                            ))
                        }
                        other => other,
                    }
                });
            }
            Err(e) => return Err(e.into()),
        };
        walked.push(name);
        dir = next;
    }
    Ok(())
}

/// Writes `reader` to `path` as `user`, creating missing parent directories (see
/// `ensure_parents`). The file is opened with the user's credentials, so the kernel decides what
/// they may overwrite; like envd it is then (re)owned by the user, which is the `chmod` event a
/// watcher sees between `create` and `write`.
async fn write_file(
    root: &std::path::Path,
    user: &User,
    path: &ResolvedPath,
    reader: impl AsyncRead + Unpin,
    metadata: &[(String, String)],
) -> Result<(), Response> {
    let id = Identity::from(user);
    let host = path.host.clone();
    let root = root.to_path_buf();
    let owner = id.clone();
    let parents = tokio::task::spawn_blocking(move || ensure_parents(&root, &host, &owner)).await;
    match parents {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(io_response(
                &e,
                &format!("error creating the parents of '{}'", path.sandbox),
            ))
        }
        Err(e) => {
            return Err(json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &e.to_string(),
            ))
        }
    }
    let host = path.host.clone();
    let owner = id.clone();
    let opened = identity::blocking_as(id.clone(), move || {
        let existing = std::fs::metadata(&host).ok();
        if existing.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "path is a directory",
            ));
        }
        // Handing the file to its writer is best effort: it only fails where the user may not
        // chown (another user's file they can write to, or an agent that is not root).
        if existing.is_some() {
            let _ = std::os::unix::fs::chown(&host, Some(owner.uid), Some(owner.gid));
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&host)?;
        if existing.is_none() {
            let _ = std::os::unix::fs::fchown(&file, Some(owner.uid), Some(owner.gid));
        }
        Ok(file)
    })
    .await;
    let file = match opened {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            return Err(io_response(
                &e,
                &format!("error writing '{}'", path.sandbox),
            ))
        }
        Err(e) => {
            return Err(json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &e.to_string(),
            ))
        }
    };
    let mut file = tokio::io::BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(file));
    let mut reader = reader;
    let copied = tokio::io::copy(&mut reader, &mut file).await;
    let flushed = match copied {
        Ok(_) => file.flush().await,
        Err(e) => Err(e),
    };
    if let Err(e) = flushed {
        return Err(io_response(
            &e,
            &format!("error writing '{}'", path.sandbox),
        ));
    }
    let host = path.host.clone();
    let metadata = metadata.to_vec();
    let result = identity::blocking_as(id, move || write_metadata(&host, &metadata)).await;
    match result {
        Ok(Ok(())) => Ok(()),
        // Filesystems without user xattrs only lose metadata, like envd.
        Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOTSUP) => Ok(()),
        Ok(Err(e)) => Err(io_response(&e, "error writing file metadata")),
        Err(e) => Err(json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &e.to_string(),
        )),
    }
}

fn written_entry(path: &ResolvedPath, metadata: &[(String, String)]) -> serde_json::Value {
    let name = std::path::Path::new(&path.sandbox)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut entry = serde_json::json!({ "path": path.sandbox, "name": name, "type": "file" });
    if !metadata.is_empty() {
        let map: HashMap<&str, &str> = metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        entry["metadata"] = serde_json::json!(map);
    }
    entry
}

fn body_reader(body: Body) -> impl AsyncRead + Unpin {
    StreamReader::new(body.into_data_stream().map_err(std::io::Error::other))
}

pub async fn upload(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    Query(params): Query<FileParams>,
    body: Body,
) -> Response {
    if let Err(r) = authorize(&agent, &headers, &params, "write") {
        return r;
    }
    let user = match file_user(&agent, &params) {
        Ok(u) => u,
        Err(r) => return r,
    };
    let metadata = match metadata_from_headers(&headers) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let gzipped = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().eq_ignore_ascii_case("gzip"))
        .unwrap_or(false);
    let mut written = Vec::new();

    if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        let boundary = match multer::parse_boundary(&content_type) {
            Ok(b) => b,
            Err(e) => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    &format!("invalid multipart request: {e}"),
                )
            }
        };
        let mut multipart = multer::Multipart::new(body.into_data_stream(), boundary);
        let mut seen: Vec<String> = Vec::new();
        loop {
            let field = match multipart.next_field().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        &format!("error reading multipart form: {e}"),
                    )
                }
            };
            if field.name() != Some("file") {
                continue;
            }
            let requested = match (&params.path, field.file_name()) {
                (Some(p), _) => p.clone(),
                (None, Some(name)) => name.to_string(),
                (None, None) => {
                    return json_error(StatusCode::BAD_REQUEST, "file part without a path")
                }
            };
            let path = match resolve(&agent, &user, &requested) {
                Ok(p) => p,
                Err(r) => return r,
            };
            if seen.contains(&path.sandbox) {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    &format!("you cannot upload multiple files to the same path '{}' in one upload request", path.sandbox),
                );
            }
            seen.push(path.sandbox.clone());
            // A multipart stream that breaks off or breaks its own format is the client's fault (400).
            let reader = StreamReader::new(
                field.map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            );
            if let Err(r) = write_file(&agent.root, &user, &path, reader, &metadata).await {
                return r;
            }
            written.push(written_entry(&path, &metadata));
        }
    } else {
        let Some(requested) = params.path.clone() else {
            return json_error(
                StatusCode::BAD_REQUEST,
                "the 'path' query parameter is required for a raw upload",
            );
        };
        let path = match resolve(&agent, &user, &requested) {
            Ok(p) => p,
            Err(r) => return r,
        };
        let result = if gzipped {
            write_file(
                &agent.root,
                &user,
                &path,
                GzipDecoder::new(BufReader::new(body_reader(body))),
                &metadata,
            )
            .await
        } else {
            write_file(&agent.root, &user, &path, body_reader(body), &metadata).await
        };
        if let Err(r) = result {
            return r;
        }
        written.push(written_entry(&path, &metadata));
    }
    (
        StatusCode::OK,
        axum::Json(serde_json::Value::Array(written)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root directory for the parent-making tests: `etc` root's (0755), `home/u` the user's.
    fn parents_root(name: &str) -> Option<(std::path::PathBuf, Identity)> {
        if !identity::can_switch() {
            println!("SKIP: making parents as another user needs root");
            return None;
        }
        let root = std::env::temp_dir().join(format!("wt-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("home/u/data")).unwrap();
        let nobody = Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![],
        };
        for dir in ["home/u", "home/u/data"] {
            std::os::unix::fs::chown(root.join(dir), Some(nobody.uid), Some(nobody.gid)).unwrap();
        }
        Some((root, nobody))
    }

    fn owner(path: &std::path::Path) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(path).unwrap().uid()
    }

    #[test]
    fn parents_are_made_for_the_user_through_real_directories() {
        let Some((root, nobody)) = parents_root("parents") else {
            return;
        };
        // Like envd: root makes them, even where the user could not, and hands them over.
        ensure_parents(&root, &root.join("etc/a/b/file"), &nobody).unwrap();
        assert_eq!(owner(&root.join("etc/a")), nobody.uid);
        assert_eq!(owner(&root.join("etc/a/b")), nobody.uid);
        assert_eq!(
            owner(&root.join("etc")),
            0,
            "existing directories are left alone"
        );
        let planted = root.join("home/u/file");
        std::fs::write(&planted, "").unwrap();
        let err = ensure_parents(&root, &planted.join("x/y"), &nobody).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotADirectory, "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_planted_symlink_does_not_lend_root_to_the_user() {
        let Some((root, nobody)) = parents_root("symlink") else {
            return;
        };
        // The user's link into a directory only root may write (relative, so it stays under the
        // test's root): root must not make the user a directory there.
        std::os::unix::fs::symlink("../../etc", root.join("home/u/link")).unwrap();
        let err = ensure_parents(&root, &root.join("home/u/link/cron.d/job"), &nobody).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
        assert!(!root.join("etc/cron.d").exists());
        // Through a link to somewhere the user may write, the directories are made, as the user.
        std::os::unix::fs::symlink("data", root.join("home/u/mine")).unwrap();
        ensure_parents(&root, &root.join("home/u/mine/x/y/file"), &nobody).unwrap();
        assert_eq!(owner(&root.join("home/u/data/x/y")), nobody.uid);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn compression_only_where_it_pays() {
        let dir = std::env::temp_dir().join(format!("wt-agent-gz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = dir.join("text");
        std::fs::write(&text, "all work and no play\n".repeat(20_000)).unwrap();
        assert!(compressible(&std::fs::File::open(&text).unwrap(), 420_000));
        let noise = dir.join("noise");
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let bytes: Vec<u8> = (0..300_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        std::fs::write(&noise, &bytes).unwrap();
        assert!(!compressible(
            &std::fs::File::open(&noise).unwrap(),
            300_000
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn gzip_negotiation() {
        let mut h = HeaderMap::new();
        assert!(!accepts_gzip(&h));
        h.insert(header::ACCEPT_ENCODING, "br, gzip".parse().unwrap());
        assert!(accepts_gzip(&h));
        h.insert(header::ACCEPT_ENCODING, "gzip;q=0".parse().unwrap());
        assert!(!accepts_gzip(&h));
    }
}
