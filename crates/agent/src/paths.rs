//! Turning a path a client sent into the file it names: `~` expansion, relative paths against the
//! user's home (or the default workdir), lexical normalisation, then placement under the agent's
//! root (`/` in a sandbox, `--root DIR` in host mode). `..` can never climb above the root;
//! what the user may then touch is decided by the kernel (see `identity`).

use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("cannot expand another user's home directory in '{0}'")]
    OtherUsersHome(String),
    #[error("path contains a NUL byte")]
    Nul,
}

/// A resolved path: as the sandbox sees it and where it lives on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPath {
    /// Absolute, normalised, as shown to clients (e.g. `/home/user/a.txt`).
    pub sandbox: String,
    /// The same file under the agent's root.
    pub host: PathBuf,
}

/// Resolves `path` for a user whose home is `home`. An empty path means `default_workdir`, or
/// the home directory when none is set.
pub fn resolve(
    root: &Path,
    home: &str,
    default_workdir: Option<&str>,
    path: &str,
) -> Result<ResolvedPath, PathError> {
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    let path = if path.is_empty() {
        default_workdir.unwrap_or(home)
    } else {
        path
    };
    let expanded = if let Some(rest) = path.strip_prefix('~') {
        if !(rest.is_empty() || rest.starts_with('/')) {
            return Err(PathError::OtherUsersHome(path.to_string()));
        }
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    };
    let sandbox = normalize(&expanded);
    Ok(ResolvedPath {
        host: to_host(root, &sandbox),
        sandbox,
    })
}

/// Lexically normalises an absolute path: drops `.`, resolves `..` (never above `/`).
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(p) => parts.push(p.to_str().unwrap_or_default()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    format!("/{}", parts.join("/"))
}

/// Where sandbox path `sandbox` (absolute, normalised) lives under `root`.
pub fn to_host(root: &Path, sandbox: &str) -> PathBuf {
    let rel = sandbox.trim_start_matches('/');
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_like_envd() {
        let root = Path::new("/");
        let r = |p: &str| resolve(root, "/home/user", None, p).unwrap().sandbox;
        assert_eq!(r("a.txt"), "/home/user/a.txt");
        assert_eq!(r("~/x/../y"), "/home/user/y");
        assert_eq!(r("~"), "/home/user");
        assert_eq!(r(""), "/home/user");
        assert_eq!(r("/tmp/./a"), "/tmp/a");
        assert_eq!(r("../../etc/shadow"), "/etc/shadow");
        assert_eq!(r("/../../../.."), "/");
        assert_eq!(
            resolve(root, "/home/user", Some("/work"), "")
                .unwrap()
                .sandbox,
            "/work"
        );
        assert_eq!(
            resolve(root, "/home/user", None, "~root/x"),
            Err(PathError::OtherUsersHome("~root/x".into()))
        );
        assert_eq!(resolve(root, "/h", None, "a\0b"), Err(PathError::Nul));
    }

    #[test]
    fn host_root_contains_every_resolved_path() {
        let root = Path::new("/srv/box");
        let p = resolve(root, "/home/user", None, "../../../../etc/shadow").unwrap();
        assert_eq!(p.host, PathBuf::from("/srv/box/etc/shadow"));
        assert_eq!(p.sandbox, "/etc/shadow");
        assert_eq!(to_host(root, "/"), PathBuf::from("/srv/box"));
    }
}
