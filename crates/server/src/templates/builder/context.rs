//! The build context: a host directory COPY and ADD read from, minus what `.dockerignore` excludes.
//! Resolves COPY sources (plain paths and globs) into the exact list of entries to write, and hashes them
//! for the step's cache key.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use globset::GlobBuilder;
use sha2::{Digest, Sha256};
use warren_runtime::confined::{ConfinedDir, ConfinedError};

use super::dockerignore::{DockerignoreError, IgnoreRules};

#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("build context {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Ignore(#[from] DockerignoreError),
    #[error("source {0:?} points outside the build context")]
    OutsideContext(String),
    #[error(
        "source {0:?} goes through a symlink in the build context; name the path it points to"
    )]
    ThroughSymlink(String),
    #[error("source {0:?} not found in the build context (or excluded by .dockerignore)")]
    NotFound(String),
    #[error("no files in the build context match {0:?}")]
    NoMatch(String),
    #[error("bad source pattern {pattern:?}")]
    BadPattern {
        pattern: String,
        #[source]
        source: globset::Error,
    },
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> ContextError {
    move |source| ContextError::Io { context, source }
}

/// What a copied entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// A local tar archive given to ADD: unpacked at the target directory.
    Archive,
}

/// One thing COPY writes: `source` on the host → `target`, an absolute path inside the template.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyEntry {
    pub source: PathBuf,
    pub target: String,
    pub kind: EntryKind,
    /// Permission bits of the source (`--chmod` overrides them when written).
    pub mode: u32,
    /// The source's own owner, kept when the COPY gives no `--chown` (`COPY --from` keeps owners as
    /// Docker does; the build context's files have none and become root's).
    pub owner: Option<(u32, u32)>,
}

/// A context directory and its ignore rules.
#[derive(Debug, Clone)]
pub struct BuildContext {
    root: PathBuf,
    ignore: IgnoreRules,
}

/// A source path as matched in the context, relative to its root ("" is the root itself).
#[derive(Debug, Clone, PartialEq)]
struct Source {
    relative: String,
    kind: EntryKind,
}

impl BuildContext {
    /// Opens `root`, reading `root/.dockerignore` if present.
    pub fn open(root: &Path) -> Result<BuildContext, ContextError> {
        let ignore_path = root.join(".dockerignore");
        let ignore = match fs::read_to_string(&ignore_path) {
            Ok(text) => IgnoreRules::parse(&text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => IgnoreRules::default(),
            Err(e) => return Err(io_err(format!("reading {}", ignore_path.display()))(e)),
        };
        Self::with_rules(root, ignore)
    }

    pub fn with_rules(root: &Path, ignore: IgnoreRules) -> Result<BuildContext, ContextError> {
        let meta = fs::metadata(root).map_err(io_err(format!("opening {}", root.display())))?;
        if !meta.is_dir() {
            return Err(ContextError::NotADirectory(root.to_path_buf()));
        }
        Ok(BuildContext {
            root: root.to_path_buf(),
            ignore,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every entry COPY/ADD `sources` → `dest` writes. `dest` is absolute; `dest_is_dir` says whether a
    /// file source lands inside it (trailing `/`, several sources) or becomes it. `unpack_archives` is ADD.
    pub fn entries(
        &self,
        sources: &[String],
        dest: &str,
        dest_is_dir: bool,
        unpack_archives: bool,
    ) -> Result<Vec<CopyEntry>, ContextError> {
        let mut out = Vec::new();
        for pattern in sources {
            for source in self.resolve(pattern)? {
                self.expand_source(&source, dest, dest_is_dir, unpack_archives, &mut out)?;
            }
        }
        Ok(out)
    }

    /// How many context paths `sources` name (a glob may name several).
    pub fn count_sources(&self, sources: &[String]) -> Result<usize, ContextError> {
        let mut n = 0;
        for pattern in sources {
            n += self.resolve(pattern)?.len();
        }
        Ok(n)
    }

    fn resolve(&self, pattern: &str) -> Result<Vec<Source>, ContextError> {
        let cleaned = clean_relative(pattern)?;
        if !has_glob(&cleaned) {
            if self.ignore.is_ignored(&cleaned) {
                return Err(ContextError::NotFound(pattern.to_string()));
            }
            let meta = self.metadata(&cleaned).map_err(|e| match e {
                ContextError::ThroughSymlink(_) => {
                    ContextError::ThroughSymlink(pattern.to_string())
                }
                _ => ContextError::NotFound(pattern.to_string()),
            })?;
            return Ok(vec![Source {
                relative: cleaned,
                kind: kind_of(&meta),
            }]);
        }
        let glob = GlobBuilder::new(&cleaned)
            .literal_separator(true)
            .build()
            .map_err(|source| ContextError::BadPattern {
                pattern: pattern.to_string(),
                source,
            })?
            .compile_matcher();
        let mut all = Vec::new();
        self.walk("", &mut all)?;
        let mut matched: Vec<Source> = Vec::new();
        for (relative, kind) in all {
            if !glob.is_match(&relative) {
                continue;
            }
            // A directory that matched already brings everything below it.
            if matched.iter().any(|m| {
                m.kind == EntryKind::Dir && relative.starts_with(&format!("{}/", m.relative))
            }) {
                continue;
            }
            matched.push(Source { relative, kind });
        }
        if matched.is_empty() {
            return Err(ContextError::NoMatch(pattern.to_string()));
        }
        Ok(matched)
    }

    /// Metadata of the context path `relative`, not following a symlink at its end, and refusing one
    /// on the way: the kernel resolves it below the context root (openat2, [`ConfinedDir`]), so a
    /// context holding `etc -> /etc` cannot make `COPY etc/shadow /x` read the host's file.
    fn metadata(&self, relative: &str) -> Result<fs::Metadata, ContextError> {
        if !relative.is_empty() {
            let root = ConfinedDir::open_root(&self.root)
                .map_err(|e| io_err(format!("opening {}", self.root.display()))(e.into()))?;
            match root.stat(Path::new(relative)) {
                Ok(_) => {}
                Err(ConfinedError::Escape { .. }) => {
                    return Err(ContextError::ThroughSymlink(relative.to_string()))
                }
                Err(e) => return Err(io_err(format!("reading {relative}"))(e.into())),
            }
        }
        let abs = self.abs(relative);
        fs::symlink_metadata(&abs).map_err(io_err(format!("reading {}", abs.display())))
    }

    fn abs(&self, relative: &str) -> PathBuf {
        if relative.is_empty() {
            self.root.clone()
        } else {
            self.root.join(relative)
        }
    }

    /// Non-ignored paths under `relative` (exclusive), depth first, sorted by name.
    fn walk(&self, relative: &str, out: &mut Vec<(String, EntryKind)>) -> Result<(), ContextError> {
        let dir = self.abs(relative);
        let mut names: Vec<_> = fs::read_dir(&dir)
            .map_err(io_err(format!("reading {}", dir.display())))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(io_err(format!("reading {}", dir.display())))?
            .into_iter()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let child = if relative.is_empty() {
                name
            } else {
                format!("{relative}/{name}")
            };
            let meta = self.metadata(&child)?;
            let kind = kind_of(&meta);
            let ignored = self.ignore.is_ignored(&child);
            if !ignored {
                out.push((child.clone(), kind));
            }
            // Walk ignored directories too: a later `!pattern` may re-include something inside.
            if kind == EntryKind::Dir && (!ignored || self.ignore_may_reinclude()) {
                self.walk(&child, out)?;
            }
        }
        Ok(())
    }

    fn ignore_may_reinclude(&self) -> bool {
        !self.ignore.is_empty()
    }

    fn expand_source(
        &self,
        source: &Source,
        dest: &str,
        dest_is_dir: bool,
        unpack_archives: bool,
        out: &mut Vec<CopyEntry>,
    ) -> Result<(), ContextError> {
        let abs = self.abs(&source.relative);
        let meta = self.metadata(&source.relative)?;
        let mode = meta.permissions().mode() & 0o7777;
        match source.kind {
            EntryKind::Dir => {
                // A directory's contents are copied, not the directory itself.
                out.push(CopyEntry {
                    source: abs,
                    target: dest.trim_end_matches('/').to_string(),
                    kind: EntryKind::Dir,
                    mode,
                    owner: None,
                });
                let mut below = Vec::new();
                self.walk(&source.relative, &mut below)?;
                let prefix = if source.relative.is_empty() {
                    String::new()
                } else {
                    format!("{}/", source.relative)
                };
                for (relative, kind) in below {
                    let under = relative.strip_prefix(&prefix).unwrap_or(&relative);
                    let child_abs = self.abs(&relative);
                    let child_meta = self.metadata(&relative)?;
                    out.push(CopyEntry {
                        source: child_abs,
                        target: join_target(dest, under),
                        kind,
                        mode: child_meta.permissions().mode() & 0o7777,
                        owner: None,
                    });
                }
            }
            kind => {
                let kind = if unpack_archives && kind == EntryKind::File && is_archive(&abs) {
                    EntryKind::Archive
                } else {
                    kind
                };
                let base = source
                    .relative
                    .rsplit('/')
                    .next()
                    .unwrap_or(&source.relative);
                let target = if kind == EntryKind::Archive {
                    dest.trim_end_matches('/').to_string()
                } else if dest_is_dir {
                    join_target(dest, base)
                } else {
                    dest.to_string()
                };
                out.push(CopyEntry {
                    source: abs,
                    target,
                    kind,
                    mode,
                    owner: None,
                });
            }
        }
        Ok(())
    }
}

pub(super) fn kind_of(meta: &fs::Metadata) -> EntryKind {
    let ft = meta.file_type();
    if ft.is_symlink() {
        EntryKind::Symlink
    } else if ft.is_dir() {
        EntryKind::Dir
    } else {
        EntryKind::File
    }
}

fn has_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

fn is_archive(path: &Path) -> bool {
    let name = path.to_string_lossy().to_ascii_lowercase();
    name.ends_with(".tar") || name.ends_with(".tar.gz") || name.ends_with(".tgz")
}

/// `./a//b/../c` → `a/c`; `/x` is taken relative to the context as Docker does; escaping `..` is an error.
fn clean_relative(pattern: &str) -> Result<String, ContextError> {
    let mut parts: Vec<&str> = Vec::new();
    for part in pattern.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(ContextError::OutsideContext(pattern.to_string()));
                }
            }
            other => parts.push(other),
        }
    }
    Ok(parts.join("/"))
}

/// `dest` + `/` + `rest`, without doubled slashes.
pub fn join_target(dest: &str, rest: &str) -> String {
    let dest = dest.trim_end_matches('/');
    if rest.is_empty() {
        return if dest.is_empty() {
            "/".into()
        } else {
            dest.into()
        };
    }
    format!("{dest}/{rest}")
}

/// Content hash of everything a COPY writes: targets, kinds, modes, file contents and link targets.
pub fn hash_entries(entries: &[CopyEntry]) -> Result<String, ContextError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    for entry in entries {
        hasher.update(entry.target.as_bytes());
        hasher.update([0]);
        hasher.update(format!("{:?}:{:o}", entry.kind, entry.mode).as_bytes());
        hasher.update([0]);
        match entry.kind {
            EntryKind::File | EntryKind::Archive => {
                let mut f = fs::File::open(&entry.source)
                    .map_err(io_err(format!("reading {}", entry.source.display())))?;
                loop {
                    let n = f
                        .read(&mut buf)
                        .map_err(io_err(format!("reading {}", entry.source.display())))?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                }
            }
            EntryKind::Symlink => {
                let target = fs::read_link(&entry.source)
                    .map_err(io_err(format!("reading {}", entry.source.display())))?;
                hasher.update(target.as_os_str().as_encoded_bytes());
            }
            EntryKind::Dir => {}
        }
        hasher.update([0xff]);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, content: &str) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    fn sample() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "app.py", "print(1)");
        write(dir.path(), "util.py", "x = 1");
        write(dir.path(), "requirements.txt", "flask");
        write(dir.path(), "pkg/a.txt", "a");
        write(dir.path(), "pkg/sub/b.txt", "b");
        write(dir.path(), "pkg/secret.env", "KEY=1");
        write(dir.path(), "node_modules/x/index.js", "");
        write(dir.path(), ".dockerignore", "node_modules\n**/*.env\n");
        dir
    }

    fn targets(entries: &[CopyEntry]) -> Vec<&str> {
        entries.iter().map(|e| e.target.as_str()).collect()
    }

    #[test]
    fn sources_through_a_symlinked_directory_are_refused() {
        // `link -> <host dir>` in an uploaded context: COPY link/secret must not read the host's file.
        let host = tempfile::tempdir().unwrap();
        write(host.path(), "secret", "host data");
        let dir = sample();
        std::os::unix::fs::symlink(host.path(), dir.path().join("link")).unwrap();
        let ctx = BuildContext::open(dir.path()).unwrap();
        assert!(matches!(
            ctx.entries(&["link/secret".into()], "/x", false, false),
            Err(ContextError::ThroughSymlink(_))
        ));
        // The link itself is copied as a link, and globs do not descend into it.
        let entries = ctx.entries(&["link".into()], "/x", false, false).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].kind, EntryKind::Symlink);
        let globbed = ctx.entries(&["link/*".into()], "/x/", true, false);
        assert!(globbed.is_err(), "{globbed:?}");
    }

    #[test]
    fn file_into_directory_and_file_renamed() {
        let dir = sample();
        let ctx = BuildContext::open(dir.path()).unwrap();
        let e = ctx
            .entries(&["requirements.txt".into()], "/home/user/", true, false)
            .unwrap();
        assert_eq!(targets(&e), vec!["/home/user/requirements.txt"]);
        let e = ctx
            .entries(&["./app.py".into()], "/srv/main.py", false, false)
            .unwrap();
        assert_eq!(targets(&e), vec!["/srv/main.py"]);
        assert_eq!(e[0].kind, EntryKind::File);
    }

    #[test]
    fn directory_contents_are_copied_without_ignored_files() {
        let dir = sample();
        let ctx = BuildContext::open(dir.path()).unwrap();
        let e = ctx
            .entries(&["pkg".into()], "/opt/pkg", true, false)
            .unwrap();
        assert_eq!(
            targets(&e),
            vec![
                "/opt/pkg",
                "/opt/pkg/a.txt",
                "/opt/pkg/sub",
                "/opt/pkg/sub/b.txt"
            ]
        );
        let e = ctx.entries(&[".".into()], "/app/", true, false).unwrap();
        let t = targets(&e);
        assert!(t.contains(&"/app/app.py"));
        assert!(t.contains(&"/app/.dockerignore"));
        assert!(!t.iter().any(|p| p.contains("node_modules")), "{t:?}");
        assert!(!t.iter().any(|p| p.ends_with(".env")), "{t:?}");
    }

    #[test]
    fn globs_match_at_their_level() {
        let dir = sample();
        let ctx = BuildContext::open(dir.path()).unwrap();
        let e = ctx.entries(&["*.py".into()], "/app/", true, false).unwrap();
        assert_eq!(targets(&e), vec!["/app/app.py", "/app/util.py"]);
        assert_eq!(ctx.count_sources(&["*.py".into()]).unwrap(), 2);
        assert!(matches!(
            ctx.entries(&["*.rs".into()], "/app/", true, false),
            Err(ContextError::NoMatch(_))
        ));
    }

    #[test]
    fn missing_ignored_and_escaping_sources_fail() {
        let dir = sample();
        let ctx = BuildContext::open(dir.path()).unwrap();
        assert!(matches!(
            ctx.entries(&["nope.txt".into()], "/a", false, false),
            Err(ContextError::NotFound(_))
        ));
        assert!(matches!(
            ctx.entries(&["pkg/secret.env".into()], "/a", false, false),
            Err(ContextError::NotFound(_))
        ));
        assert!(matches!(
            ctx.entries(&["../etc/passwd".into()], "/a", false, false),
            Err(ContextError::OutsideContext(_))
        ));
        assert!(BuildContext::open(&dir.path().join("app.py")).is_err());
    }

    #[test]
    fn hash_changes_with_content_and_target_only() {
        let dir = sample();
        let ctx = BuildContext::open(dir.path()).unwrap();
        let h1 = hash_entries(&ctx.entries(&["pkg".into()], "/p", true, false).unwrap()).unwrap();
        let h1_again =
            hash_entries(&ctx.entries(&["pkg".into()], "/p", true, false).unwrap()).unwrap();
        assert_eq!(h1, h1_again);
        let h_other_dest =
            hash_entries(&ctx.entries(&["pkg".into()], "/q", true, false).unwrap()).unwrap();
        assert_ne!(h1, h_other_dest);
        write(dir.path(), "pkg/a.txt", "changed");
        let h2 = hash_entries(&ctx.entries(&["pkg".into()], "/p", true, false).unwrap()).unwrap();
        assert_ne!(h1, h2);
        // An ignored file changing does not change the hash.
        write(dir.path(), "pkg/secret.env", "KEY=2");
        let h3 = hash_entries(&ctx.entries(&["pkg".into()], "/p", true, false).unwrap()).unwrap();
        assert_eq!(h2, h3);
    }

    #[test]
    fn add_marks_local_archives() {
        let dir = sample();
        write(dir.path(), "bundle.tar.gz", "not really");
        let ctx = BuildContext::open(dir.path()).unwrap();
        let e = ctx
            .entries(&["bundle.tar.gz".into()], "/opt/", true, true)
            .unwrap();
        assert_eq!(e[0].kind, EntryKind::Archive);
        assert_eq!(e[0].target, "/opt");
        let e = ctx
            .entries(&["bundle.tar.gz".into()], "/opt/", true, false)
            .unwrap();
        assert_eq!(e[0].kind, EntryKind::File);
    }
}
