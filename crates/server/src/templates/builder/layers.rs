//! The layer cache and host-side layer writing.
//!
//! A layer is a directory tree used as one overlayfs `lowerdir`. Cached layers live at
//! `<state>/layers/<cache key>/fs`, with `<state>/layers/<cache key>/layer.json` describing them; a layer
//! counts as present only once `layer.json` exists, which is written before the atomic rename into place.
//! COPY/ADD and WORKDIR layers are written here directly (no sandbox needed), reading the layers below
//! through [`LayerStack`] for existing directories, symlinks and /etc/passwd.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{lchown, symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warren_runtime::confined::ConfinedDir;

use super::context::{join_target, kind_of, CopyEntry, EntryKind};
use super::uploads::{unpack_archive, UploadError};

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown user {0:?} (not in the template's /etc/passwd)")]
    UnknownUser(String),
    #[error("unknown group {0:?} (not in the template's /etc/group)")]
    UnknownGroup(String),
    #[error("too many symlinks resolving {0}")]
    SymlinkLoop(String),
    #[error("{0} does not exist in that stage")]
    NotInStage(String),
    #[error(transparent)]
    Archive(#[from] UploadError),
    #[error("layer metadata {path}: {source}")]
    Metadata {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> LayerError {
    move |source| LayerError::Io { context, source }
}

/// What `layer.json` says about a cached layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerInfo {
    pub key: String,
    /// The step that made it, e.g. `RUN pip install flask`.
    pub title: String,
    pub created_at: String,
    pub size_bytes: u64,
    /// Nothing changed: the layer is left out of sandbox layer stacks.
    pub empty: bool,
}

/// A layer being written: moves into the cache with [`LayerStore::commit`], or is deleted on drop.
#[derive(Debug)]
pub struct PendingLayer {
    key: String,
    dir: PathBuf,
}

impl PendingLayer {
    /// Where the layer's files go. Absent until [`PendingLayer::create_fs_dir`] or until the runtime's
    /// `commit_layer` (which wants a path that does not exist yet) writes it.
    pub fn fs_dir(&self) -> PathBuf {
        self.dir.join("fs")
    }

    pub fn create_fs_dir(&self) -> Result<PathBuf, LayerError> {
        let fs_dir = self.fs_dir();
        fs::create_dir_all(&fs_dir).map_err(io_err(format!("creating {}", fs_dir.display())))?;
        Ok(fs_dir)
    }
}

impl Drop for PendingLayer {
    fn drop(&mut self) {
        if self.dir.exists() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

#[derive(Debug, Clone)]
pub struct LayerStore {
    root: PathBuf,
}

impl LayerStore {
    /// `state_dir/layers`.
    pub fn new(state_dir: &Path) -> LayerStore {
        LayerStore {
            root: state_dir.join("layers"),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory a sandbox mounts for layer `key`.
    pub fn fs_dir(&self, key: &str) -> PathBuf {
        self.root.join(key).join("fs")
    }

    /// The cached layer `key`, if complete.
    pub fn lookup(&self, key: &str) -> Result<Option<LayerInfo>, LayerError> {
        let path = self.root.join(key).join("layer.json");
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| LayerError::Metadata { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("reading {}", path.display()))(e)),
        }
    }

    /// Removes the temp directories of layers that were being written when an earlier server process
    /// died (a SIGKILL skips [`PendingLayer`]'s drop). Only safe before this process starts builds:
    /// the server calls it at start, as the one server of its state directory. Returns how many.
    pub fn remove_unfinished(&self) -> Result<usize, LayerError> {
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err(format!("reading {}", self.root.display()))(e)),
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let is_pending = name.to_str().is_some_and(|name| name.starts_with(".tmp-"));
            // Never follow a link: only real directories of ours are removed.
            let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
            if is_pending && is_dir {
                fs::remove_dir_all(entry.path())
                    .map_err(io_err(format!("removing {}", entry.path().display())))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Starts writing layer `key` in a private temp directory.
    pub fn begin(&self, key: &str) -> Result<PendingLayer, LayerError> {
        fs::create_dir_all(&self.root)
            .map_err(io_err(format!("creating {}", self.root.display())))?;
        let dir = self.root.join(format!(
            ".tmp-{key}-{}-{}",
            std::process::id(),
            unique_suffix()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        Ok(PendingLayer {
            key: key.to_string(),
            dir,
        })
    }

    /// Records the layer and renames it into place. If another build finished the same key first, its
    /// layer wins and this one is discarded (same key, same content).
    pub fn commit(&self, pending: PendingLayer, title: &str) -> Result<LayerInfo, LayerError> {
        pending.create_fs_dir()?;
        let size_bytes = tree_size(&pending.fs_dir())?;
        let empty = is_empty_dir(&pending.fs_dir())?;
        let info = LayerInfo {
            key: pending.key.clone(),
            title: title.to_string(),
            created_at: chrono::Utc::now().to_rfc3339(),
            size_bytes,
            empty,
        };
        let json = serde_json::to_vec_pretty(&info).map_err(|source| LayerError::Metadata {
            path: pending.dir.join("layer.json"),
            source,
        })?;
        let meta_path = pending.dir.join("layer.json");
        fs::write(&meta_path, json).map_err(io_err(format!("writing {}", meta_path.display())))?;
        let dest = self.root.join(&pending.key);
        if let Some(existing) = self.lookup(&pending.key)? {
            return Ok(existing);
        }
        // An incomplete earlier attempt (no layer.json) is replaced.
        if dest.exists() {
            fs::remove_dir_all(&dest).map_err(io_err(format!("removing {}", dest.display())))?;
        }
        fs::rename(&pending.dir, &dest)
            .map_err(io_err(format!("renaming to {}", dest.display())))?;
        Ok(info)
    }

    /// Keys of all complete layers.
    pub fn list(&self) -> Result<Vec<LayerInfo>, LayerError> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_err(format!("reading {}", self.root.display()))(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io_err(format!("reading {}", self.root.display())))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            if let Some(info) = self.lookup(&name)? {
                out.push(info);
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Deletes cached layer `key` (the caller makes sure no template version or sandbox uses it).
    pub fn remove(&self, key: &str) -> Result<(), LayerError> {
        let dir = self.root.join(key);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(format!("removing {}", dir.display()))(e)),
        }
    }
}

fn unique_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

fn tree_size(path: &Path) -> Result<u64, LayerError> {
    let meta = fs::symlink_metadata(path).map_err(io_err(format!("reading {}", path.display())))?;
    let mut total = meta.len();
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(io_err(format!("reading {}", path.display())))? {
            let entry = entry.map_err(io_err(format!("reading {}", path.display())))?;
            total += tree_size(&entry.path())?;
        }
    }
    Ok(total)
}

fn is_empty_dir(path: &Path) -> Result<bool, LayerError> {
    Ok(fs::read_dir(path)
        .map_err(io_err(format!("reading {}", path.display())))?
        .next()
        .is_none())
}

/// Read-only view through a stack of layer directories (top-most first), as overlayfs would show it:
/// the first layer holding a path wins, a whiteout (0/0 character device) hides it.
#[derive(Debug, Clone)]
pub struct LayerStack {
    layers: Vec<PathBuf>,
}

impl LayerStack {
    pub fn new(layers: Vec<PathBuf>) -> LayerStack {
        LayerStack { layers }
    }

    /// Host path and metadata of absolute `path` (not following a final symlink).
    ///
    /// The layers below were written by build sandboxes, so each is searched through [`ConfinedDir`]:
    /// the kernel resolves `path` inside the layer and refuses a symlink on the way. A symlink or file
    /// at one of `path`'s directories in a layer ends the search there, as in overlayfs, where a
    /// non-directory hides whatever lower layers hold below that name (callers resolve symlinked
    /// components themselves, with [`LayerStack::resolve`]).
    pub fn lookup(&self, path: &str) -> Option<(PathBuf, fs::Metadata)> {
        let rel = path.trim_start_matches('/');
        for layer in &self.layers {
            if rel.is_empty() {
                return fs::symlink_metadata(layer).ok().map(|m| (layer.clone(), m));
            }
            let Ok(dir) = ConfinedDir::open_root(layer) else {
                continue;
            };
            match dir.stat(Path::new(rel)) {
                Ok(_) => {}
                Err(e) if e.is_not_found() => continue,
                Err(_) => return None,
            }
            let host = layer.join(rel);
            let meta = fs::symlink_metadata(&host).ok()?;
            if meta.file_type().is_char_device() && meta.rdev() == 0 {
                return None;
            }
            return Some((host, meta));
        }
        None
    }

    /// Everything below the directory at absolute `dir` (resolved, not a symlink), as overlayfs shows
    /// it: per name the top-most layer's entry, whiteouts and opaque directories hiding what is
    /// below. Appends (path relative to `dir` under `prefix`, host path, metadata), parents first.
    pub fn walk(
        &self,
        dir: &str,
        prefix: &str,
        out: &mut Vec<(String, PathBuf, fs::Metadata)>,
    ) -> Result<(), LayerError> {
        let rel = dir.trim_start_matches('/');
        let mut names: Vec<std::ffi::OsString> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for layer in &self.layers {
            let Ok(root) = ConfinedDir::open_root(layer) else {
                continue;
            };
            let listing_err = |e: warren_runtime::confined::ConfinedError| {
                io_err(format!("listing {dir} in a stage"))(e.into())
            };
            let here = if rel.is_empty() {
                root
            } else {
                match root.stat(Path::new(rel)) {
                    Ok(stat) if stat.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
                    // Not there: look lower. Anything else (a file, a whiteout) hides lower layers.
                    Err(e) if e.is_not_found() => continue,
                    _ => break,
                }
                root.open_dir(Path::new(rel)).map_err(listing_err)?
            };
            for name in here.entries().map_err(listing_err)? {
                if seen.insert(name.clone()) {
                    names.push(name);
                }
            }
            if crate::templates::images::unpack::is_opaque(&here) {
                break;
            }
        }
        names.sort();
        for name in names {
            let name = name.to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                format!("/{name}")
            } else {
                format!("/{rel}/{name}")
            };
            // A whiteout at the top-most holder of the name: nothing there.
            let Some((host, meta)) = self.lookup(&path) else {
                continue;
            };
            let relative = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let ft = meta.file_type();
            if !(ft.is_dir() || ft.is_file() || ft.is_symlink()) {
                continue;
            }
            let is_dir = ft.is_dir();
            out.push((relative.clone(), host, meta));
            if is_dir {
                self.walk(&path, &relative, out)?;
            }
        }
        Ok(())
    }

    /// Resolves symlinks in every component of absolute `path` (all but the last when `keep_last`).
    pub fn resolve(&self, path: &str, keep_last: bool) -> Result<String, LayerError> {
        let mut pending: Vec<String> = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(String::from)
            .rev()
            .collect();
        let mut resolved: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(component) = pending.pop() {
            if component == ".." {
                resolved.pop();
                continue;
            }
            let candidate = format!("/{}", join(&resolved, &component));
            let is_last = pending.is_empty();
            if keep_last && is_last {
                resolved.push(component);
                break;
            }
            match self.lookup(&candidate) {
                Some((host, meta)) if meta.file_type().is_symlink() => {
                    hops += 1;
                    if hops > 40 {
                        return Err(LayerError::SymlinkLoop(path.to_string()));
                    }
                    let target = fs::read_link(&host)
                        .map_err(io_err(format!("reading link {}", host.display())))?;
                    let target = target.to_string_lossy().into_owned();
                    if target.starts_with('/') {
                        resolved.clear();
                    }
                    for part in target
                        .split('/')
                        .filter(|c| !c.is_empty() && *c != ".")
                        .rev()
                    {
                        pending.push(part.to_string());
                    }
                }
                _ => resolved.push(component),
            }
        }
        Ok(format!("/{}", resolved.join("/")))
    }

    fn read_file(&self, path: &str) -> Option<String> {
        let (host, meta) = self.lookup(path)?;
        if !meta.is_file() {
            return None;
        }
        let layer = self.layers.iter().find(|l| host.starts_with(l))?;
        let rel = host.strip_prefix(layer).ok()?;
        let mut text = String::new();
        ConfinedDir::open_root(layer)
            .and_then(|dir| dir.open_file(rel))
            .ok()?
            .read_to_string(&mut text)
            .ok()?;
        Some(text)
    }

    /// `user[:group]` → (uid, gid) through the template's /etc/passwd and /etc/group. A user without a
    /// group gets their primary group (a bare numeric uid gets gid = uid, as Docker does).
    pub fn resolve_owner(&self, spec: &str) -> Result<(u32, u32), LayerError> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let passwd = self.read_file("/etc/passwd").unwrap_or_default();
        let (uid, primary_gid) = match user.parse::<u32>() {
            Ok(uid) => {
                let gid = passwd_entries(&passwd)
                    .find(|(_, u, _)| *u == uid)
                    .map(|(_, _, g)| g)
                    .unwrap_or(uid);
                (uid, gid)
            }
            Err(_) => passwd_entries(&passwd)
                .find(|(name, _, _)| *name == user)
                .map(|(_, u, g)| (u, g))
                .ok_or_else(|| LayerError::UnknownUser(user.to_string()))?,
        };
        let gid = match group {
            None | Some("") => primary_gid,
            Some(g) => match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => {
                    let groups = self.read_file("/etc/group").unwrap_or_default();
                    let found = passwd_entries(&groups)
                        .find(|(name, _, _)| *name == g)
                        .map(|(_, gid, _)| gid);
                    found.ok_or_else(|| LayerError::UnknownGroup(g.to_string()))?
                }
            },
        };
        Ok((uid, gid))
    }

    /// The user name for `spec` (`user[:group]` or a uid), for the agent, which takes names.
    pub fn user_name(&self, spec: &str) -> String {
        let user = spec.split(':').next().unwrap_or(spec);
        match user.parse::<u32>() {
            Ok(uid) => {
                let passwd = self.read_file("/etc/passwd").unwrap_or_default();
                let found = passwd_entries(&passwd)
                    .find(|(_, u, _)| *u == uid)
                    .map(|(name, _, _)| name.to_string());
                found.unwrap_or_else(|| user.to_string())
            }
            Err(_) => user.to_string(),
        }
    }
}

fn join(resolved: &[String], component: &str) -> String {
    if resolved.is_empty() {
        component.to_string()
    } else {
        format!("{}/{component}", resolved.join("/"))
    }
}

/// (name, field 3, field 4) of passwd or group lines: (name, uid, gid) or (name, gid, _).
fn passwd_entries(text: &str) -> impl Iterator<Item = (&str, u32, u32)> {
    text.lines().filter_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        let id = fields.next()?.parse().ok()?;
        let second = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
        Some((name, id, second))
    })
}

/// What `COPY --from` copies out of a stage (`stage`: its layers): each of `sources` (absolute paths
/// there, symlinks in them followed inside the stage) → `dest` (a directory's contents, a file into
/// `dest` when `dest_is_dir`, else as `dest`). Entries keep their owners and modes. The layers were
/// written by the stage's build sandboxes, so they are hostile: every path is found through
/// [`LayerStack::lookup`] (the kernel refuses symlinks on the way inside each layer), directories are
/// listed through [`ConfinedDir`], and only directories, regular files and symlinks (copied as
/// links, never followed) are taken. Committed layers never change, so what was checked is what is
/// read.
pub fn stage_entries(
    stage: &LayerStack,
    sources: &[String],
    dest: &str,
    dest_is_dir: bool,
) -> Result<Vec<CopyEntry>, LayerError> {
    let mut out = Vec::new();
    for source in sources {
        let resolved = stage.resolve(source, false)?;
        let (host, meta) = stage
            .lookup(&resolved)
            .ok_or_else(|| LayerError::NotInStage(source.clone()))?;
        let entry = |host: PathBuf, target: String, meta: &fs::Metadata| CopyEntry {
            source: host,
            target,
            kind: kind_of(meta),
            mode: meta.permissions().mode() & 0o7777,
            owner: Some((meta.uid(), meta.gid())),
        };
        if meta.is_dir() {
            out.push(entry(host, join_target(dest, ""), &meta));
            let mut below = Vec::new();
            stage.walk(&resolved, "", &mut below)?;
            for (relative, host, meta) in below {
                out.push(entry(host, join_target(dest, &relative), &meta));
            }
        } else if meta.is_file() {
            let name = resolved.rsplit('/').next().unwrap_or_default();
            let target = if dest_is_dir {
                join_target(dest, name)
            } else {
                dest.to_string()
            };
            out.push(entry(host, target, &meta));
        } else {
            return Err(LayerError::NotInStage(format!(
                "{source} (not a file or directory)"
            )));
        }
    }
    Ok(out)
}

/// Writes COPY/ADD entries into `layer` (the new layer's `fs` directory), on top of `below`.
pub fn write_copy_layer(
    layer: &Path,
    below: &LayerStack,
    entries: &[CopyEntry],
    owner: Option<&str>,
    mode: Option<u32>,
) -> Result<(), LayerError> {
    let (uid, gid) = match owner {
        Some(spec) => below.resolve_owner(spec)?,
        None => (0, 0),
    };
    let mut stack_layers = vec![layer.to_path_buf()];
    stack_layers.extend(below.layers.iter().cloned());
    let view = LayerStack::new(stack_layers);
    let copy_owner = (uid, gid);
    for (i, entry) in entries.iter().enumerate() {
        let (uid, gid) = match (owner, entry.owner) {
            (None, Some(own)) => own,
            _ => copy_owner,
        };
        let target = view.resolve(&entry.target, true)?;
        ensure_parents(layer, &view, &target, uid, gid)?;
        check_inside(layer, &target)?;
        let host = layer.join(target.trim_start_matches('/'));
        match entry.kind {
            EntryKind::Dir => {
                // The first entry of a directory source is the destination itself: an existing directory
                // keeps its attributes; a new one is created for the owner.
                let is_destination_root = entry_is_root(entries, i);
                if !host.exists() {
                    if let Some((_, meta)) = below.lookup(&target).filter(|(_, m)| m.is_dir()) {
                        mkdir_like(&host, &meta)?;
                    } else {
                        fs::create_dir(&host)
                            .map_err(io_err(format!("creating {}", host.display())))?;
                        let bits = if is_destination_root {
                            0o755
                        } else {
                            mode.unwrap_or(entry.mode)
                        };
                        set_owner_mode(&host, uid, gid, Some(bits))?;
                    }
                }
            }
            EntryKind::File => {
                if let Ok(meta) = fs::symlink_metadata(&host) {
                    if meta.is_dir() {
                        fs::remove_dir_all(&host)
                            .map_err(io_err(format!("replacing {}", host.display())))?;
                    } else {
                        fs::remove_file(&host)
                            .map_err(io_err(format!("replacing {}", host.display())))?;
                    }
                }
                fs::copy(&entry.source, &host).map_err(io_err(format!(
                    "copying {} to {}",
                    entry.source.display(),
                    target
                )))?;
                set_owner_mode(&host, uid, gid, Some(mode.unwrap_or(entry.mode)))?;
            }
            EntryKind::Symlink => {
                let link = fs::read_link(&entry.source)
                    .map_err(io_err(format!("reading link {}", entry.source.display())))?;
                let _ = fs::remove_file(&host);
                symlink(&link, &host)
                    .map_err(io_err(format!("creating link {}", host.display())))?;
                lchown(&host, Some(uid), Some(gid))
                    .map_err(io_err(format!("chown {}", host.display())))?;
            }
            EntryKind::Archive => {
                if !host.exists() {
                    fs::create_dir_all(&host)
                        .map_err(io_err(format!("creating {}", host.display())))?;
                }
                unpack_archive(&entry.source, &host, &entry.source.display().to_string())?;
            }
        }
    }
    Ok(())
}

/// The kernel's word that `target`'s parent directory in `layer` is a real directory inside it: the
/// resolution above re-roots symlinks by hand, and this refuses a write if it ever got one wrong
/// (an earlier entry of the same COPY may have put a symlink on the way).
fn check_inside(layer: &Path, target: &str) -> Result<(), LayerError> {
    let parent = Path::new(target.trim_start_matches('/'))
        .parent()
        .filter(|p| !p.as_os_str().is_empty());
    let Some(parent) = parent else {
        return Ok(());
    };
    ConfinedDir::open_root(layer)
        .and_then(|dir| dir.open_dir(parent))
        .map(drop)
        .map_err(|e| io_err(format!("writing {target} into the layer"))(e.into()))
}

fn entry_is_root(entries: &[CopyEntry], i: usize) -> bool {
    // Later sources of a multi-source COPY start with their own destination entry: a Dir whose target
    // is not below the previous directory source.
    let target = &entries[i].target;
    !entries[..i]
        .iter()
        .any(|e| e.kind == EntryKind::Dir && target.starts_with(&format!("{}/", e.target)))
}

/// WORKDIR: creates `path` (owned by `owner`) unless it exists below.
pub fn write_workdir_layer(
    layer: &Path,
    below: &LayerStack,
    path: &str,
    owner: &str,
) -> Result<(), LayerError> {
    let target = below.resolve(path, false)?;
    if below.lookup(&target).is_some_and(|(_, m)| m.is_dir()) {
        return Ok(());
    }
    let (uid, gid) = below.resolve_owner(owner)?;
    let mut stack_layers = vec![layer.to_path_buf()];
    stack_layers.extend(below.layers.iter().cloned());
    let view = LayerStack::new(stack_layers);
    ensure_parents(layer, &view, &target, 0, 0)?;
    let host = layer.join(target.trim_start_matches('/'));
    fs::create_dir(&host).map_err(io_err(format!("creating {}", host.display())))?;
    set_owner_mode(&host, uid, gid, Some(0o755))
}

/// Creates the parent directories of `target` in `layer`, copying the attributes of the directories the
/// layers below already have (so /home/user stays owned by user), new ones for (uid, gid).
fn ensure_parents(
    layer: &Path,
    view: &LayerStack,
    target: &str,
    uid: u32,
    gid: u32,
) -> Result<(), LayerError> {
    let parts: Vec<&str> = target.trim_start_matches('/').split('/').collect();
    let mut current = String::new();
    for part in &parts[..parts.len().saturating_sub(1)] {
        current.push('/');
        current.push_str(part);
        let host = layer.join(current.trim_start_matches('/'));
        if host.is_dir() {
            continue;
        }
        match view.lookup(&current) {
            Some((_, meta)) if meta.is_dir() => mkdir_like(&host, &meta)?,
            _ => {
                fs::create_dir(&host).map_err(io_err(format!("creating {}", host.display())))?;
                set_owner_mode(&host, uid, gid, Some(0o755))?;
            }
        }
    }
    Ok(())
}

fn mkdir_like(host: &Path, like: &fs::Metadata) -> Result<(), LayerError> {
    fs::create_dir(host).map_err(io_err(format!("creating {}", host.display())))?;
    set_owner_mode(host, like.uid(), like.gid(), Some(like.mode() & 0o7777))
}

fn set_owner_mode(host: &Path, uid: u32, gid: u32, mode: Option<u32>) -> Result<(), LayerError> {
    lchown(host, Some(uid), Some(gid)).map_err(io_err(format!("chown {}", host.display())))?;
    if let Some(mode) = mode {
        fs::set_permissions(host, fs::Permissions::from_mode(mode))
            .map_err(io_err(format!("chmod {}", host.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::builder::context::BuildContext;

    fn base_rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n",
        )
        .unwrap();
        fs::write(
            root.join("etc/group"),
            "root:x:0:\nuser:x:1000:\nstaff:x:50:\n",
        )
        .unwrap();
        fs::create_dir_all(root.join("home/user")).unwrap();
        fs::set_permissions(root.join("home/user"), fs::Permissions::from_mode(0o750)).unwrap();
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        symlink("usr/bin", root.join("bin")).unwrap();
        dir
    }

    #[test]
    fn unfinished_layers_of_a_dead_process_are_removed_and_nothing_else() {
        let state = tempfile::tempdir().unwrap();
        let store = LayerStore::new(state.path());
        assert_eq!(store.remove_unfinished().unwrap(), 0, "no layers dir yet");
        let done = store.begin("done").unwrap();
        fs::write(done.create_fs_dir().unwrap().join("f"), "kept").unwrap();
        store.commit(done, "done").unwrap();
        // What a SIGKILL leaves: a pending dir whose drop never ran.
        let left = store.begin("left").unwrap();
        fs::write(left.create_fs_dir().unwrap().join("f"), "half").unwrap();
        let left_dir = left.dir.clone();
        std::mem::forget(left);
        // A link named like one must not be followed out of the store.
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("precious"), "x").unwrap();
        symlink(outside.path(), store.root().join(".tmp-link")).unwrap();

        assert_eq!(store.remove_unfinished().unwrap(), 1);
        assert!(!left_dir.exists());
        assert!(outside.path().join("precious").exists());
        assert!(store.lookup("done").unwrap().is_some());
        assert_eq!(
            fs::read_to_string(store.fs_dir("done").join("f")).unwrap(),
            "kept"
        );
    }

    #[test]
    fn owners_resolve_through_passwd_and_group() {
        let base = base_rootfs();
        let stack = LayerStack::new(vec![base.path().to_path_buf()]);
        assert_eq!(stack.resolve_owner("user").unwrap(), (1000, 1000));
        assert_eq!(stack.resolve_owner("user:staff").unwrap(), (1000, 50));
        assert_eq!(stack.resolve_owner("0:50").unwrap(), (0, 50));
        assert_eq!(stack.resolve_owner("1234").unwrap(), (1234, 1234));
        assert!(matches!(
            stack.resolve_owner("nobody"),
            Err(LayerError::UnknownUser(_))
        ));
        assert!(matches!(
            stack.resolve_owner("user:nogroup"),
            Err(LayerError::UnknownGroup(_))
        ));
        assert_eq!(stack.user_name("1000"), "user");
        assert_eq!(stack.user_name("user:staff"), "user");
    }

    #[test]
    fn copies_out_of_a_stage_see_its_layers_as_overlayfs_and_never_the_host() {
        if !nix_is_root() {
            println!("SKIP: whiteouts and trusted.overlay xattrs need root");
            return;
        }
        let lower = tempfile::tempdir().unwrap();
        let upper = tempfile::tempdir().unwrap();
        let (l, u) = (lower.path(), upper.path());
        for dir in ["app", "opq", "etc"] {
            fs::create_dir_all(l.join(dir)).unwrap();
        }
        fs::write(l.join("app/keep.txt"), "lower").unwrap();
        fs::write(l.join("app/gone.txt"), "deleted above").unwrap();
        fs::write(l.join("opq/old.txt"), "hidden by an opaque dir").unwrap();
        fs::write(l.join("etc/secret"), "the stage's own").unwrap();
        fs::create_dir_all(u.join("app")).unwrap();
        assert!(std::process::Command::new("mknod")
            .arg(u.join("app/gone.txt"))
            .args(["c", "0", "0"])
            .status()
            .unwrap()
            .success());
        fs::write(u.join("app/new.txt"), "upper").unwrap();
        symlink("/etc/passwd", u.join("app/link")).unwrap();
        fs::create_dir_all(u.join("opq")).unwrap();
        fs::write(u.join("opq/new.txt"), "upper").unwrap();
        let opq = std::ffi::CString::new(u.join("opq").to_str().unwrap()).unwrap();
        // SAFETY: NUL-terminated strings and a buffer of the length passed.
        let set = unsafe {
            libc::lsetxattr(
                opq.as_ptr(),
                c"trusted.overlay.opaque".as_ptr(),
                b"y".as_ptr().cast(),
                1,
                0,
            )
        };
        assert_eq!(set, 0, "set the opaque xattr");
        // A symlink to a directory: resolved inside the stage, not on the host.
        symlink("/etc", u.join("data")).unwrap();
        let stage = LayerStack::new(vec![u.to_path_buf(), l.to_path_buf()]);

        let entries = stage_entries(&stage, &["/app".into()], "/dst", true).unwrap();
        let targets: Vec<(&str, EntryKind)> = entries
            .iter()
            .map(|e| (e.target.as_str(), e.kind))
            .collect();
        assert_eq!(
            targets,
            [
                ("/dst", EntryKind::Dir),
                ("/dst/keep.txt", EntryKind::File),
                ("/dst/link", EntryKind::Symlink),
                ("/dst/new.txt", EntryKind::File),
            ]
        );
        let opaque = stage_entries(&stage, &["/opq".into()], "/o", true).unwrap();
        assert_eq!(opaque.len(), 2, "{opaque:?}");
        assert_eq!(opaque[1].target, "/o/new.txt");
        let secret = stage_entries(&stage, &["/data/secret".into()], "/x", false).unwrap();
        assert_eq!(secret[0].source, l.join("etc/secret"));
        assert_eq!(secret[0].target, "/x");
        assert!(matches!(
            stage_entries(&stage, &["/app/gone.txt".into()], "/x", false),
            Err(LayerError::NotInStage(_))
        ));

        // Written into a layer: the link stays a link (the host's /etc/passwd is never read).
        let base = base_rootfs();
        let layer = tempfile::tempdir().unwrap();
        write_copy_layer(
            layer.path(),
            &LayerStack::new(vec![base.path().to_path_buf()]),
            &entries,
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            fs::read_link(layer.path().join("dst/link")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert_eq!(
            fs::read_to_string(layer.path().join("dst/keep.txt")).unwrap(),
            "lower"
        );
        assert!(!layer.path().join("dst/gone.txt").exists());
    }

    #[test]
    fn symlinks_in_lower_layers_are_followed_and_whiteouts_hide() {
        let base = base_rootfs();
        let upper = tempfile::tempdir().unwrap();
        let stack = LayerStack::new(vec![upper.path().to_path_buf(), base.path().to_path_buf()]);
        assert_eq!(stack.resolve("/bin/tool", true).unwrap(), "/usr/bin/tool");
        assert_eq!(stack.resolve("/bin", false).unwrap(), "/usr/bin");
        assert_eq!(
            stack.resolve("/home/../etc/passwd", true).unwrap(),
            "/etc/passwd"
        );
        assert!(stack.lookup("/etc/passwd").is_some());
        // A whiteout in the upper layer hides the lower file (needs CAP_MKNOD, i.e. root).
        fs::create_dir_all(upper.path().join("etc")).unwrap();
        let whiteout = upper.path().join("etc/passwd");
        let made = std::process::Command::new("mknod")
            .arg(&whiteout)
            .args(["c", "0", "0"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if made {
            assert!(stack.lookup("/etc/passwd").is_none());
        }
    }

    #[test]
    fn copy_layer_writes_files_with_owner_and_keeps_existing_dirs() {
        let base = base_rootfs();
        let ctx_dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(ctx_dir.path().join("app/sub")).unwrap();
        fs::write(ctx_dir.path().join("app/main.py"), "print(1)").unwrap();
        fs::write(ctx_dir.path().join("app/sub/x.txt"), "x").unwrap();
        fs::write(ctx_dir.path().join("tool.sh"), "#!/bin/sh").unwrap();
        let ctx = BuildContext::open(ctx_dir.path()).unwrap();
        let below = LayerStack::new(vec![base.path().to_path_buf()]);

        let layer = tempfile::tempdir().unwrap();
        let entries = ctx
            .entries(&["app".into()], "/home/user/app", true, false)
            .unwrap();
        write_copy_layer(layer.path(), &below, &entries, Some("user"), None).unwrap();
        let home = fs::metadata(layer.path().join("home/user")).unwrap();
        // The parent mirrors the base: same mode, same owner as in the rootfs.
        assert_eq!(home.mode() & 0o7777, 0o750);
        let base_home = fs::metadata(base.path().join("home/user")).unwrap();
        assert_eq!(home.uid(), base_home.uid());
        let main = fs::metadata(layer.path().join("home/user/app/main.py")).unwrap();
        let (am_root, expected_uid) = (nix_is_root(), 1000);
        if am_root {
            assert_eq!(main.uid(), expected_uid);
        }
        assert_eq!(
            fs::read_to_string(layer.path().join("home/user/app/sub/x.txt")).unwrap(),
            "x"
        );

        // COPY into /bin follows the usr-merge symlink of the base.
        let layer2 = tempfile::tempdir().unwrap();
        let entries = ctx
            .entries(&["tool.sh".into()], "/bin/", true, false)
            .unwrap();
        write_copy_layer(layer2.path(), &below, &entries, None, Some(0o755)).unwrap();
        let tool = layer2.path().join("usr/bin/tool.sh");
        assert_eq!(fs::metadata(&tool).unwrap().mode() & 0o777, 0o755);
        assert!(!layer2.path().join("bin").exists());
    }

    #[test]
    fn a_symlinked_directory_in_a_lower_layer_does_not_lead_to_host_files() {
        // A build sandbox's RUN step left `/etc -> <host dir>` in its layer; the host dir holds a
        // passwd with a user only it knows. Lookups must not find it there.
        let host = tempfile::tempdir().unwrap();
        fs::write(
            host.path().join("passwd"),
            "intruder:x:4242:4242::/:/bin/sh\n",
        )
        .unwrap();
        let lower = tempfile::tempdir().unwrap();
        symlink(host.path(), lower.path().join("etc")).unwrap();
        let upper = tempfile::tempdir().unwrap();
        let stack = LayerStack::new(vec![upper.path().to_path_buf(), lower.path().to_path_buf()]);
        assert!(stack.lookup("/etc/passwd").is_none());
        assert!(matches!(
            stack.resolve_owner("intruder"),
            Err(LayerError::UnknownUser(_))
        ));
        // Resolving the symlink by hand re-roots it inside the layers, never on the host.
        let resolved = stack.resolve("/etc/passwd", false).unwrap();
        assert!(stack.lookup(&resolved).is_none(), "{resolved}");
    }

    #[test]
    fn a_copy_cannot_write_through_a_symlink_an_earlier_entry_made() {
        // Two sources merged into one destination: the first brings `x -> <host dir>`, the second
        // a file below `x/`. It lands inside the layer (re-rooted) or fails; the host dir stays empty.
        let host = tempfile::tempdir().unwrap();
        let ctx_dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(ctx_dir.path().join("a")).unwrap();
        symlink(host.path(), ctx_dir.path().join("a/x")).unwrap();
        fs::create_dir_all(ctx_dir.path().join("b/x")).unwrap();
        fs::write(ctx_dir.path().join("b/x/payload"), "pwned").unwrap();
        let ctx = BuildContext::open(ctx_dir.path()).unwrap();
        let base = base_rootfs();
        let below = LayerStack::new(vec![base.path().to_path_buf()]);
        let layer = tempfile::tempdir().unwrap();
        let entries = ctx
            .entries(&["a".into(), "b".into()], "/dst/", true, false)
            .unwrap();
        let _ = write_copy_layer(layer.path(), &below, &entries, None, None);
        assert_eq!(
            fs::read_dir(host.path()).unwrap().count(),
            0,
            "wrote on the host"
        );
    }

    fn nix_is_root() -> bool {
        fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false)
    }

    #[test]
    fn add_unpacks_local_archives_into_the_destination() {
        let base = base_rootfs();
        let ctx_dir = tempfile::tempdir().unwrap();
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            fs::File::create(ctx_dir.path().join("bundle.tgz")).unwrap(),
            flate2::Compression::fast(),
        ));
        let mut header = tar::Header::new_gnu();
        header.set_size(5);
        header.set_mode(0o640);
        header.set_cksum();
        builder
            .append_data(&mut header, "lib/data.txt", &b"hello"[..])
            .unwrap();
        builder.into_inner().unwrap().finish().unwrap();
        let ctx = BuildContext::open(ctx_dir.path()).unwrap();
        let entries = ctx
            .entries(&["bundle.tgz".into()], "/opt/bundle/", true, true)
            .unwrap();
        let layer = tempfile::tempdir().unwrap();
        let below = LayerStack::new(vec![base.path().to_path_buf()]);
        write_copy_layer(layer.path(), &below, &entries, None, None).unwrap();
        let data = layer.path().join("opt/bundle/lib/data.txt");
        assert_eq!(fs::read_to_string(&data).unwrap(), "hello");
        assert!(!layer.path().join("opt/bundle/bundle.tgz").exists());
    }

    #[test]
    fn workdir_layer_only_when_missing() {
        let base = base_rootfs();
        let below = LayerStack::new(vec![base.path().to_path_buf()]);
        let layer = tempfile::tempdir().unwrap();
        write_workdir_layer(layer.path(), &below, "/home/user", "user").unwrap();
        assert!(is_empty_dir(layer.path()).unwrap());
        write_workdir_layer(layer.path(), &below, "/srv/app", "user").unwrap();
        assert!(layer.path().join("srv/app").is_dir());
        assert!(write_workdir_layer(layer.path(), &below, "/x", "ghost").is_err());
    }

    #[test]
    fn store_commits_atomically_and_lists() {
        let state = tempfile::tempdir().unwrap();
        let store = LayerStore::new(state.path());
        assert_eq!(store.lookup("k1").unwrap(), None);
        let pending = store.begin("k1").unwrap();
        fs::write(pending.create_fs_dir().unwrap().join("f"), "data").unwrap();
        let info = store.commit(pending, "RUN x").unwrap();
        assert!(!info.empty);
        assert_eq!(store.lookup("k1").unwrap().unwrap().title, "RUN x");
        assert_eq!(
            fs::read_to_string(store.fs_dir("k1").join("f")).unwrap(),
            "data"
        );
        // An abandoned pending layer leaves nothing behind.
        let pending = store.begin("k2").unwrap();
        let dir = pending.dir.clone();
        drop(pending);
        assert!(!dir.exists());
        let empty = store.begin("k3").unwrap();
        assert!(store.commit(empty, "WORKDIR /").unwrap().empty);
        let keys: Vec<String> = store.list().unwrap().into_iter().map(|i| i.key).collect();
        assert_eq!(keys, vec!["k1", "k3"]);
        store.remove("k1").unwrap();
        assert_eq!(store.lookup("k1").unwrap(), None);
    }
}
