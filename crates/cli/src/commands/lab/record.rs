//! The lab file: what the host keeps about the player's lab (its secret among it), never in the
//! sandbox. JSON, mode 0600, written whole through a temporary file and a rename.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::LabError;
use crate::args::LabArgs;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabRecord {
    pub lab_id: String,
    /// Hex of 32 random bytes: the key of every flag's HMAC.
    pub secret: String,
    pub template_id: String,
    pub sandbox_id: String,
    /// Level 12's sandboxes, made by the judge for the player to find.
    #[serde(default)]
    pub leaked: Vec<String>,
    /// Level 8: fork ID → the result the judge got from that fork and the player reported.
    #[serde(default)]
    pub fork_results: BTreeMap<String, String>,
}

impl LabRecord {
    pub fn new(template_id: &str) -> LabRecord {
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        let mut id = [0u8; 4];
        rand::rng().fill_bytes(&mut id);
        LabRecord {
            lab_id: format!("lab{}", hex(&id)),
            secret: hex(&secret),
            template_id: template_id.to_string(),
            sandbox_id: String::new(),
            leaked: Vec::new(),
            fork_results: BTreeMap::new(),
        }
    }

    /// Level `n`'s flag: `WARREN{` 32 hex digits of HMAC-SHA256(secret, lab id and level) `}`.
    pub fn flag(&self, n: u32) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.secret.as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(format!("warren-lab:{}:level:{n}", self.lab_id).as_bytes());
        let digest = mac.finalize().into_bytes();
        format!("WARREN{{{}}}", hex(&digest[..16]))
    }

    pub fn load(path: &Path) -> Result<Option<LabRecord>, LabError> {
        match std::fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|source| LabError::Corrupt {
                        path: path.to_path_buf(),
                        source,
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(LabError::File {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    pub fn save(&self, path: &Path) -> Result<(), LabError> {
        let file_err = |source| LabError::File {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(file_err)?;
        }
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self).expect("a record serialises");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(file_err)?;
        file.write_all(&text)
            .and_then(|()| file.sync_all())
            .map_err(file_err)?;
        std::fs::rename(&tmp, path).map_err(file_err)
    }
}

/// `--lab-file` / `WARREN_LAB_FILE`, else `$XDG_CONFIG_HOME/warren/lab.json` (`~/.config/...`).
pub fn path(args: &LabArgs) -> PathBuf {
    if let Some(path) = &args.lab_file {
        return path.clone();
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))
        .unwrap_or_else(|| PathBuf::from("."));
    config.join("warren").join("lab.json")
}

pub fn remove(path: &Path) -> Result<(), LabError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(LabError::File {
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_differ_per_level_and_per_lab_and_survive_a_reload() {
        let lab = LabRecord::new("t");
        assert_ne!(lab.flag(1), lab.flag(2));
        assert!(lab.flag(1).starts_with("WARREN{") && lab.flag(1).len() == 40);
        let other = LabRecord::new("t");
        assert_ne!(lab.flag(1), other.flag(1), "another secret, other flags");
        let path =
            std::env::temp_dir().join(format!("warren-lab-record-{}.json", std::process::id()));
        lab.save(&path).unwrap();
        let again = LabRecord::load(&path).unwrap().unwrap();
        assert_eq!(again.flag(7), lab.flag(7));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        remove(&path).unwrap();
        assert!(LabRecord::load(&path).unwrap().is_none());
    }
}
