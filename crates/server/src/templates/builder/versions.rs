//! Finished template builds ("versions"): what a sandbox of a template is made from. Each build has its
//! own record at `<state>/templates/<template id>/builds/<build id>/template.json` (plus its checkpoint,
//! if any); layers are shared through the layer cache. A rebuild adds a record and leaves older ones, so
//! sandboxes created from them keep working. Deleting a template is refused while sandboxes use it unless
//! forced; unreferenced layers are pruned separately.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::layers::{LayerError, LayerStore};

#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("template record {path}: {source}")]
    Record {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("template {template_id} has no build {build_id}")]
    NotFound {
        template_id: String,
        build_id: String,
    },
    #[error(
        "template {template_id} is used by {sandboxes} sandbox(es); stop them or delete with force"
    )]
    InUse {
        template_id: String,
        sandboxes: usize,
    },
    #[error("invalid id {0:?}")]
    BadId(String),
    #[error(transparent)]
    Layer(#[from] LayerError),
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> VersionError {
    move |source| VersionError::Io { context, source }
}

/// How a sandbox of the template begins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TemplateStart {
    /// No start command: a fresh sandbox on the layers.
    Plain,
    /// start_cmd ran, ready_cmd passed, and the sandbox was checkpointed here: restore it.
    Checkpoint { dir: PathBuf },
    /// start_cmd must be run (and ready_cmd awaited) at every create: this host cannot checkpoint.
    Cold,
}

/// One finished build of a template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuiltTemplate {
    pub template_id: String,
    pub build_id: String,
    pub created_at: String,
    /// Read-only layers for `SandboxSpec::layers`, top-most first; the last is the base rootfs.
    pub layers: Vec<PathBuf>,
    /// Cache keys of the build's own layers (empty ones included), base first.
    pub layer_keys: Vec<String>,
    /// Key of the last layer: a template built `fromTemplate` this one chains onto it.
    pub final_key: String,
    pub env: BTreeMap<String, String>,
    pub user: String,
    pub workdir: String,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
    /// Privileges the build's admin asked for; records written before they existed have none.
    #[serde(default)]
    pub privileges: warren_proto::api::TemplatePrivileges,
    pub start: TemplateStart,
    /// Wall time of the build and how many of its steps came from the cache.
    pub build_seconds: f64,
    pub cached_steps: usize,
    pub total_steps: usize,
}

fn check_id(id: &str) -> Result<(), VersionError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(VersionError::BadId(id.to_string()))
    }
}

#[derive(Debug, Clone)]
pub struct TemplateVersions {
    root: PathBuf,
}

impl TemplateVersions {
    /// `state_dir/templates`.
    pub fn new(state_dir: &Path) -> TemplateVersions {
        TemplateVersions {
            root: state_dir.join("templates"),
        }
    }

    /// Directory of one build (its record and checkpoint).
    pub fn build_dir(&self, template_id: &str, build_id: &str) -> Result<PathBuf, VersionError> {
        check_id(template_id)?;
        check_id(build_id)?;
        Ok(self.root.join(template_id).join("builds").join(build_id))
    }

    /// Writes the record atomically (temp + fsync + rename).
    pub fn save(&self, record: &BuiltTemplate) -> Result<(), VersionError> {
        let dir = self.build_dir(&record.template_id, &record.build_id)?;
        fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let path = dir.join("template.json");
        let tmp = dir.join(".template.json.tmp");
        let json = serde_json::to_vec_pretty(record).map_err(|source| VersionError::Record {
            path: path.clone(),
            source,
        })?;
        {
            use std::io::Write;
            let mut file =
                fs::File::create(&tmp).map_err(io_err(format!("creating {}", tmp.display())))?;
            file.write_all(&json)
                .and_then(|_| file.sync_all())
                .map_err(io_err(format!("writing {}", tmp.display())))?;
        }
        fs::rename(&tmp, &path).map_err(io_err(format!("renaming to {}", path.display())))
    }

    pub fn load(&self, template_id: &str, build_id: &str) -> Result<BuiltTemplate, VersionError> {
        let path = self.build_dir(template_id, build_id)?.join("template.json");
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(VersionError::NotFound {
                    template_id: template_id.into(),
                    build_id: build_id.into(),
                })
            }
            Err(e) => return Err(io_err(format!("reading {}", path.display()))(e)),
        };
        serde_json::from_slice(&bytes).map_err(|source| VersionError::Record { path, source })
    }

    /// All finished builds of a template, oldest first.
    pub fn list(&self, template_id: &str) -> Result<Vec<BuiltTemplate>, VersionError> {
        check_id(template_id)?;
        let dir = self.root.join(template_id).join("builds");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(format!("reading {}", dir.display()))(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err(format!("reading {}", dir.display())))?;
            let build_id = entry.file_name().to_string_lossy().into_owned();
            match self.load(template_id, &build_id) {
                Ok(record) => out.push(record),
                // A build that never finished has a directory (checkpoint attempt) but no record.
                Err(VersionError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then(a.build_id.cmp(&b.build_id))
        });
        Ok(out)
    }

    /// The newest finished build.
    pub fn latest(&self, template_id: &str) -> Result<Option<BuiltTemplate>, VersionError> {
        Ok(self.list(template_id)?.pop())
    }

    /// Template ids with at least one directory here.
    pub fn template_ids(&self) -> Result<Vec<String>, VersionError> {
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(format!("reading {}", self.root.display()))(e)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err(format!("reading {}", self.root.display())))?;
            ids.push(entry.file_name().to_string_lossy().into_owned());
        }
        ids.sort();
        Ok(ids)
    }

    /// The checkpoints the builds of `template_id` left (running-state templates).
    pub fn checkpoints(&self, template_id: &str) -> Result<Vec<PathBuf>, VersionError> {
        Ok(self
            .list(template_id)?
            .into_iter()
            .filter_map(|built| match built.start {
                TemplateStart::Checkpoint { dir } => Some(dir),
                _ => None,
            })
            .collect())
    }

    /// Deletes every build of `template_id`. `sandboxes_in_use` is how many live sandboxes the server
    /// counts on it: refused unless zero or `force`. Their layers stay until [`Self::prune_layers`].
    pub fn delete(
        &self,
        template_id: &str,
        sandboxes_in_use: usize,
        force: bool,
    ) -> Result<usize, VersionError> {
        check_id(template_id)?;
        if sandboxes_in_use > 0 && !force {
            return Err(VersionError::InUse {
                template_id: template_id.into(),
                sandboxes: sandboxes_in_use,
            });
        }
        let removed = self.list(template_id)?.len();
        let dir = self.root.join(template_id);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(removed),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io_err(format!("removing {}", dir.display()))(e)),
        }
    }

    /// Removes cached layers no template record references and `keep` (layers of live sandboxes) does
    /// not name. Returns how many were removed.
    pub fn prune_layers(
        &self,
        layers: &LayerStore,
        keep: &BTreeSet<String>,
    ) -> Result<usize, VersionError> {
        let mut referenced: BTreeSet<String> = keep.clone();
        for template_id in self.template_ids()? {
            for record in self.list(&template_id)? {
                referenced.extend(record.layer_keys.iter().cloned());
            }
        }
        let mut removed = 0;
        for info in layers.list()? {
            if !referenced.contains(&info.key) {
                layers.remove(&info.key)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(template_id: &str, build_id: &str, created_at: &str, keys: &[&str]) -> BuiltTemplate {
        BuiltTemplate {
            template_id: template_id.into(),
            build_id: build_id.into(),
            created_at: created_at.into(),
            layers: vec![PathBuf::from("/rootfs")],
            layer_keys: keys.iter().map(|k| k.to_string()).collect(),
            final_key: keys.last().copied().unwrap_or("").to_string(),
            env: BTreeMap::new(),
            user: "user".into(),
            workdir: "/home/user".into(),
            start_cmd: None,
            ready_cmd: None,
            cpu_count: None,
            memory_mb: None,
            privileges: Default::default(),
            start: TemplateStart::Plain,
            build_seconds: 1.0,
            cached_steps: 0,
            total_steps: keys.len(),
        }
    }

    #[test]
    fn a_record_from_before_privileges_reads_as_unprivileged_and_granted_ones_survive() {
        let mut granted = record("t", "b1", "2026-12-01T00:00:00Z", &["k1"]);
        granted.privileges.raw_sockets = true;
        let text = serde_json::to_value(&granted).unwrap();
        let read: BuiltTemplate = serde_json::from_value(text.clone()).unwrap();
        assert!(read.privileges.raw_sockets && !read.privileges.io_uring);
        let mut old = text;
        old.as_object_mut().unwrap().remove("privileges").unwrap();
        let read: BuiltTemplate = serde_json::from_value(old).unwrap();
        assert_eq!(read.privileges, Default::default());
    }

    #[test]
    fn rebuilds_add_versions_and_latest_is_newest() {
        let state = tempfile::tempdir().unwrap();
        let versions = TemplateVersions::new(state.path());
        versions
            .save(&record("t1", "b1", "2026-12-02T10:00:00Z", &["a"]))
            .unwrap();
        versions
            .save(&record("t1", "b2", "2026-12-02T11:00:00Z", &["a", "b"]))
            .unwrap();
        let all = versions.list("t1").unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(versions.latest("t1").unwrap().unwrap().build_id, "b2");
        assert_eq!(versions.load("t1", "b1").unwrap().layer_keys, vec!["a"]);
        assert!(matches!(
            versions.load("t1", "b9"),
            Err(VersionError::NotFound { .. })
        ));
        assert!(matches!(
            versions.load("../x", "b1"),
            Err(VersionError::BadId(_))
        ));
        assert_eq!(versions.latest("none").unwrap(), None);
    }

    #[test]
    fn delete_is_refused_while_in_use_unless_forced() {
        let state = tempfile::tempdir().unwrap();
        let versions = TemplateVersions::new(state.path());
        versions
            .save(&record("t1", "b1", "2026-12-02T10:00:00Z", &["a"]))
            .unwrap();
        assert!(matches!(
            versions.delete("t1", 2, false),
            Err(VersionError::InUse { sandboxes: 2, .. })
        ));
        assert_eq!(versions.list("t1").unwrap().len(), 1);
        assert_eq!(versions.delete("t1", 2, true).unwrap(), 1);
        assert!(versions.list("t1").unwrap().is_empty());
        assert_eq!(versions.delete("t1", 0, false).unwrap(), 0);
    }

    #[test]
    fn prune_keeps_referenced_and_live_layers() {
        let state = tempfile::tempdir().unwrap();
        let versions = TemplateVersions::new(state.path());
        let layers = LayerStore::new(state.path());
        for key in ["a", "b", "c", "d"] {
            let pending = layers.begin(key).unwrap();
            layers.commit(pending, key).unwrap();
        }
        versions
            .save(&record("t1", "b1", "2026-12-02T10:00:00Z", &["a", "b"]))
            .unwrap();
        let keep = BTreeSet::from(["c".to_string()]);
        assert_eq!(versions.prune_layers(&layers, &keep).unwrap(), 1);
        let left: Vec<String> = layers.list().unwrap().into_iter().map(|i| i.key).collect();
        assert_eq!(left, vec!["a", "b", "c"]);
    }
}
