//! The `filesystem.Filesystem` service. Every operation runs with the calling user's filesystem
//! credentials (see `identity`), so the kernel decides what they may read or change.

pub mod entry;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use warren_proto::connect::{Code, ConnectError};
use warren_proto::envd::filesystem::{
    EntryInfo, ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse, MoveRequest,
    MoveResponse, RemoveRequest, RemoveResponse, StatRequest, StatResponse,
};

use crate::connect_server::CallContext;
use crate::identity::{self, Identity};
use crate::paths::ResolvedPath;
use crate::state::Agent;
use entry::{entry_info, io_to_connect};

/// Resolves `path` for the caller; returns the path and the caller's identity.
pub fn resolve_for_call(
    agent: &Agent,
    ctx: &CallContext,
    path: &str,
) -> Result<(ResolvedPath, Identity), ConnectError> {
    let user = agent.rpc_user(&ctx.headers)?;
    let resolved = agent
        .resolve(&user, path)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))?;
    Ok((resolved, Identity::from(&user)))
}

/// Runs a filesystem operation as `id` on the blocking pool.
pub async fn run_as<T: Send + 'static>(
    id: Identity,
    f: impl FnOnce() -> Result<T, ConnectError> + Send + 'static,
) -> Result<T, ConnectError> {
    identity::blocking_as(id, f)
        .await
        .map_err(|e| ConnectError::new(Code::Internal, format!("filesystem task failed: {e}")))?
}

pub async fn stat(
    agent: Arc<Agent>,
    ctx: CallContext,
    req: StatRequest,
) -> Result<StatResponse, ConnectError> {
    let (path, id) = resolve_for_call(&agent, &ctx, &req.path)?;
    let root = agent.root.clone();
    let entry = run_as(id, move || {
        entry_info(&root, &path.sandbox, &path.host)
            .map_err(|e| io_to_connect(&e, &format!("error getting info of '{}'", path.sandbox)))
    })
    .await?;
    Ok(StatResponse { entry: Some(entry) })
}

pub async fn make_dir(
    agent: Arc<Agent>,
    ctx: CallContext,
    req: MakeDirRequest,
) -> Result<MakeDirResponse, ConnectError> {
    let (path, id) = resolve_for_call(&agent, &ctx, &req.path)?;
    let root = agent.root.clone();
    let entry = run_as(id, move || {
        match std::fs::metadata(&path.host) {
            Ok(m) if m.is_dir() => {
                return Err(ConnectError::new(
                    Code::AlreadyExists,
                    format!("directory already exists: {}", path.sandbox),
                ))
            }
            Ok(_) => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!(
                        "path already exists but it is not a directory: {}",
                        path.sandbox
                    ),
                ))
            }
            Err(_) => {}
        }
        std::fs::create_dir_all(&path.host).map_err(|e| {
            io_to_connect(&e, &format!("error creating directory '{}'", path.sandbox))
        })?;
        entry_info(&root, &path.sandbox, &path.host)
            .map_err(|e| io_to_connect(&e, "error getting info of the new directory"))
    })
    .await?;
    Ok(MakeDirResponse { entry: Some(entry) })
}

pub async fn move_entry(
    agent: Arc<Agent>,
    ctx: CallContext,
    req: MoveRequest,
) -> Result<MoveResponse, ConnectError> {
    let (source, id) = resolve_for_call(&agent, &ctx, &req.source)?;
    let (destination, _) = resolve_for_call(&agent, &ctx, &req.destination)?;
    let root = agent.root.clone();
    let entry = run_as(id, move || {
        std::fs::symlink_metadata(&source.host)
            .map_err(|e| io_to_connect(&e, &format!("source '{}'", source.sandbox)))?;
        if let Some(parent) = destination.host.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| io_to_connect(&e, "error creating destination directory"))?;
        }
        std::fs::rename(&source.host, &destination.host).map_err(|e| {
            io_to_connect(
                &e,
                &format!(
                    "error moving '{}' to '{}'",
                    source.sandbox, destination.sandbox
                ),
            )
        })?;
        entry_info(&root, &destination.sandbox, &destination.host)
            .map_err(|e| io_to_connect(&e, "error getting info of the moved entry"))
    })
    .await?;
    Ok(MoveResponse { entry: Some(entry) })
}

pub async fn remove(
    agent: Arc<Agent>,
    ctx: CallContext,
    req: RemoveRequest,
) -> Result<RemoveResponse, ConnectError> {
    let (path, id) = resolve_for_call(&agent, &ctx, &req.path)?;
    run_as(id, move || {
        let meta = match std::fs::symlink_metadata(&path.host) {
            Ok(m) => m,
            // Like `rm -f`: removing what is not there succeeds.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(io_to_connect(
                    &e,
                    &format!("error removing '{}'", path.sandbox),
                ))
            }
        };
        let result = if meta.is_dir() {
            std::fs::remove_dir_all(&path.host)
        } else {
            std::fs::remove_file(&path.host)
        };
        result.map_err(|e| io_to_connect(&e, &format!("error removing '{}'", path.sandbox)))
    })
    .await?;
    Ok(RemoveResponse {})
}

pub async fn list_dir(
    agent: Arc<Agent>,
    ctx: CallContext,
    req: ListDirRequest,
) -> Result<ListDirResponse, ConnectError> {
    let (path, id) = resolve_for_call(&agent, &ctx, &req.path)?;
    let depth = req.depth.max(1) as usize;
    let root = agent.root.clone();
    let entries = run_as(id, move || {
        let real = std::fs::canonicalize(&path.host)
            .map_err(|e| io_to_connect(&e, &format!("path '{}'", path.sandbox)))?;
        let meta = std::fs::metadata(&real)
            .map_err(|e| io_to_connect(&e, &format!("path '{}'", path.sandbox)))?;
        if !meta.is_dir() {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("path is not a directory: {}", path.sandbox),
            ));
        }
        let mut entries = Vec::new();
        walk(&root, &real, &path.sandbox, depth, true, &mut entries)?;
        Ok(entries)
    })
    .await?;
    Ok(ListDirResponse { entries })
}

/// Lists `dir` (host path) into `out` with sandbox paths under `shown`, `depth` levels deep.
/// Only the top directory's errors are reported; unreadable subdirectories are skipped.
fn walk(
    root: &Path,
    dir: &Path,
    shown: &str,
    depth: usize,
    top: bool,
    out: &mut Vec<EntryInfo>,
) -> Result<(), ConnectError> {
    let read = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if top => {
            return Err(io_to_connect(
                &e,
                &format!("error reading directory '{shown}'"),
            ))
        }
        Err(_) => return Ok(()),
    };
    let mut children: Vec<(String, PathBuf)> = read
        .filter_map(|e| e.ok())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    children.sort();
    for (name, host) in children {
        let sandbox = if shown == "/" {
            format!("/{name}")
        } else {
            format!("{shown}/{name}")
        };
        let Ok(info) = entry_info(root, &sandbox, &host) else {
            continue; // vanished meanwhile
        };
        // A symlink to a directory is listed with the directory's type but not walked into.
        let is_link = std::fs::symlink_metadata(&host)
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(true);
        let recurse = depth > 1
            && !is_link
            && info.r#type == warren_proto::envd::filesystem::FileType::Directory as i32;
        out.push(info);
        if recurse {
            walk(root, &host, &sandbox, depth - 1, false, out)?;
        }
    }
    Ok(())
}
