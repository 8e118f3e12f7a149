//! The sandbox's freezer cgroup, as CRIU sees it: v1 `freezer/<path>` with `freezer.state`, or the v2
//! cgroup itself with `cgroup.freeze` / `cgroup.events`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::CheckpointError;

/// How long a freeze may take before the checkpoint gives up (a task stuck in an uninterruptible
/// sleep on slow I/O can delay it).
const FREEZE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FreezerCgroup {
    V1(PathBuf),
    V2(PathBuf),
}

impl FreezerCgroup {
    /// Picks the kind from the files present in `dir`.
    pub fn at(dir: &Path) -> Result<Self, CheckpointError> {
        if dir.join("freezer.state").exists() {
            Ok(Self::V1(dir.to_path_buf()))
        } else if dir.join("cgroup.freeze").exists() {
            Ok(Self::V2(dir.to_path_buf()))
        } else {
            Err(CheckpointError::Invalid(format!(
                "{} is not a freezer cgroup",
                dir.display()
            )))
        }
    }

    pub fn dir(&self) -> &Path {
        match self {
            Self::V1(dir) | Self::V2(dir) => dir,
        }
    }

    pub fn is_frozen(&self) -> Result<bool, CheckpointError> {
        match self {
            Self::V1(dir) => Ok(read(&dir.join("freezer.state"))?.trim() == "FROZEN"),
            Self::V2(dir) => Ok(read(&dir.join("cgroup.events"))?
                .lines()
                .any(|l| l.trim() == "frozen 1")),
        }
    }

    fn request_freeze(&self) -> Result<(), CheckpointError> {
        match self {
            Self::V1(dir) => write(&dir.join("freezer.state"), "FROZEN"),
            Self::V2(dir) => write(&dir.join("cgroup.freeze"), "1"),
        }
    }

    /// Freezes and waits until every task is frozen.
    ///
    /// The v1 freezer sends its freeze request once: a task that missed it (one that was just forked, or
    /// a vfork parent waiting on its child) leaves the cgroup FREEZING for good. So the request is
    /// repeated while waiting, and every second the cgroup is thawed for a moment and frozen again,
    /// which lets such tasks move on to a point where they can be frozen (what runc does too).
    pub fn freeze(&self) -> Result<(), CheckpointError> {
        self.request_freeze()?;
        let deadline = Instant::now() + FREEZE_TIMEOUT;
        let mut polls: u32 = 0;
        while !self.is_frozen()? {
            polls += 1;
            if polls.is_multiple_of(500) {
                self.thaw()?;
                std::thread::sleep(Duration::from_millis(5));
                self.request_freeze()?;
            } else if polls.is_multiple_of(25) {
                self.request_freeze()?;
            }
            if Instant::now() > deadline {
                // Leave it as it was: a half-frozen sandbox would hang its clients.
                let _ = self.thaw();
                return Err(CheckpointError::Invalid(format!(
                    "{} did not freeze within {FREEZE_TIMEOUT:?}",
                    self.dir().display()
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    pub fn thaw(&self) -> Result<(), CheckpointError> {
        match self {
            Self::V1(dir) => write(&dir.join("freezer.state"), "THAWED"),
            Self::V2(dir) => write(&dir.join("cgroup.freeze"), "0"),
        }
    }
}

fn read(path: &Path) -> Result<String, CheckpointError> {
    std::fs::read_to_string(path).map_err(|source| CheckpointError::Io {
        context: format!("read {}", path.display()),
        source,
    })
}

fn write(path: &Path, value: &str) -> Result<(), CheckpointError> {
    std::fs::write(path, value).map_err(|source| CheckpointError::Io {
        context: format!("write {value} to {}", path.display()),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_follows_the_files() {
        let dir = std::env::temp_dir().join(format!("wt-freezer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(FreezerCgroup::at(&dir).is_err());
        std::fs::write(dir.join("cgroup.freeze"), "0").unwrap();
        std::fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        let cgroup = FreezerCgroup::at(&dir).unwrap();
        assert!(matches!(cgroup, FreezerCgroup::V2(_)));
        assert!(cgroup.is_frozen().unwrap());
        std::fs::write(dir.join("freezer.state"), "THAWED\n").unwrap();
        let cgroup = FreezerCgroup::at(&dir).unwrap();
        assert!(matches!(cgroup, FreezerCgroup::V1(_)));
        assert!(!cgroup.is_frozen().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
