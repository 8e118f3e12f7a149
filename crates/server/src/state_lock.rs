//! One server per state directory: `warren up` holds an exclusive `flock` on `<state>/warren.lock`
//! for as long as it runs, with its PID written in the file. A second server on the same directory
//! is refused naming the first; `warren down` finds the server to stop by it. The kernel drops the
//! lock when the process ends, however it ends (the file is opened close-on-exec, so no child
//! keeps it).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StateLockError {
    #[error("another warren server (pid {pid}) runs on {dir}: stop it first (warren down)")]
    Held { pid: String, dir: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

fn path_of(state_dir: &Path) -> PathBuf {
    state_dir.join("warren.lock")
}

fn open(state_dir: &Path) -> Result<File, StateLockError> {
    let path = path_of(state_dir);
    std::fs::create_dir_all(state_dir).map_err(|source| StateLockError::Io {
        path: state_dir.to_path_buf(),
        source,
    })?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|source| StateLockError::Io { path, source })
}

/// Tries the lock without waiting: true when taken.
fn try_lock(file: &File) -> bool {
    // SAFETY: flock on an fd this function's caller owns.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn read_pid(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.rewind();
    let _ = file.read_to_string(&mut text);
    text.trim().to_string()
}

impl StateLock {
    /// Takes the lock of `state_dir` for this process and writes its PID into it.
    pub fn acquire(state_dir: &Path) -> Result<StateLock, StateLockError> {
        let mut file = open(state_dir)?;
        if !try_lock(&file) {
            return Err(StateLockError::Held {
                pid: read_pid(&mut file),
                dir: state_dir.to_path_buf(),
            });
        }
        let path = path_of(state_dir);
        let io = |source| StateLockError::Io {
            path: path.clone(),
            source,
        };
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(StateLock { _file: file })
    }

    /// The PID of the server holding `state_dir`'s lock, if one does.
    pub fn holder(state_dir: &Path) -> Result<Option<u32>, StateLockError> {
        if !path_of(state_dir).exists() {
            return Ok(None);
        }
        let mut file = open(state_dir)?;
        if try_lock(&file) {
            return Ok(None);
        }
        Ok(read_pid(&mut file).parse().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_named_by_pid_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(StateLock::holder(dir.path()).unwrap(), None);
        let held = StateLock::acquire(dir.path()).unwrap();
        // flock locks belong to the open file: a second open in this process conflicts too.
        assert_eq!(
            StateLock::holder(dir.path()).unwrap(),
            Some(std::process::id())
        );
        match StateLock::acquire(dir.path()) {
            Err(StateLockError::Held { pid, .. }) => {
                assert_eq!(pid, std::process::id().to_string())
            }
            other => panic!("a second server got {other:?}"),
        }
        drop(held);
        assert_eq!(StateLock::holder(dir.path()).unwrap(), None);
        StateLock::acquire(dir.path()).expect("free again");
    }
}
