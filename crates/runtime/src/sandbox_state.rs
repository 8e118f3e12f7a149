//! The record of one sandbox on disk, `sandboxes/<id>/state.json`: what `list` and every operation after
//! a server restart go by.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("sandbox state {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sandbox state {path} is corrupt")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    pub ip: Ipv4Addr,
    pub init_pid: u32,
    /// Start time of the init in clock ticks since boot (field 22 of /proc/<pid>/stat): tells our init
    /// from a later process that reused its PID.
    pub init_start_ticks: u64,
    pub supervisor_pid: u32,
    pub created_at_unix_ms: u64,
    pub layers: Vec<PathBuf>,
    pub disk_mib: u64,
    pub allow_internet: bool,
    /// Volumes bound into the sandbox, in spec order (a checkpoint declares them external).
    #[serde(default)]
    pub volumes: Vec<crate::rootfs::volume_disk::VolumeBind>,
}

impl SandboxRecord {
    pub fn path_in(sandbox_dir: &Path) -> PathBuf {
        sandbox_dir.join("state.json")
    }

    pub fn created_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.created_at_unix_ms)
    }

    /// Writes atomically (temp file + rename).
    pub fn write(&self, sandbox_dir: &Path) -> Result<(), StateError> {
        let path = Self::path_in(sandbox_dir);
        let temp = sandbox_dir.join(".state.json.tmp");
        let json = serde_json::to_vec_pretty(self).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&temp, json).map_err(|source| StateError::Io {
            path: temp.clone(),
            source,
        })?;
        std::fs::rename(&temp, &path).map_err(|source| StateError::Io {
            path: path.clone(),
            source,
        })
    }

    pub fn read(sandbox_dir: &Path) -> Result<Option<Self>, StateError> {
        let path = Self::path_in(sandbox_dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| StateError::Corrupt { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StateError::Io { path, source }),
        }
    }

    /// Whether the recorded init is still the process with that PID.
    pub fn init_alive(&self) -> bool {
        crate::process_table::start_ticks(self.init_pid) == Some(self.init_start_ticks)
    }
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
