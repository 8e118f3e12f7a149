//! Running processes, by pid (and tag), with the channels their output and end are published on.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::{broadcast, watch};
use warren_proto::connect::{Code, ConnectError};
use warren_proto::envd::process::{
    process_event, process_selector::Selector, ProcessConfig, ProcessInfo, ProcessSelector,
};

/// Output events buffered per subscriber before a slow one starts losing chunks.
pub const EVENT_BUFFER: usize = 4096;

pub struct ProcessHandle {
    pub pid: u32,
    pub config: ProcessConfig,
    pub tag: Option<String>,
    /// Data and end events, for every attached stream (Start and Connect).
    pub events: broadcast::Sender<process_event::Event>,
    /// Set once the process has ended (for streams that attach late).
    pub ended: watch::Receiver<Option<process_event::EndEvent>>,
    /// Turns true the moment the process has been reaped (before its output is drained).
    pub reaped: watch::Receiver<bool>,
    pub stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    pub pty: Option<Arc<AsyncFd<OwnedFd>>>,
}

impl ProcessHandle {
    pub fn info(&self) -> ProcessInfo {
        ProcessInfo {
            config: Some(self.config.clone()),
            pid: self.pid,
            tag: self.tag.clone(),
        }
    }

    /// Sends `signal` to the process group (falls back to the process alone).
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> Result<(), ConnectError> {
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        if nix::sys::signal::killpg(pid, signal).is_ok() {
            return Ok(());
        }
        nix::sys::signal::kill(pid, signal)
            .map_err(|e| ConnectError::new(Code::Internal, format!("error sending signal: {e}")))
    }

    /// Waits until the process has been reaped, at most `bound`; true when it has.
    pub async fn wait_reaped(&self, bound: std::time::Duration) -> bool {
        let mut reaped = self.reaped.clone();
        let waited = tokio::time::timeout(bound, reaped.wait_for(|done| *done)).await;
        matches!(waited, Ok(Ok(_)))
    }

    /// Writes to the PTY master, waiting while the terminal's input buffer is full.
    pub async fn write_pty(&self, data: &[u8]) -> Result<(), ConnectError> {
        let Some(master) = &self.pty else {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                "tty not assigned to process, input should be written to stdin",
            ));
        };
        let mut written = 0;
        while written < data.len() {
            let mut guard = master.writable().await.map_err(io_error)?;
            match guard.try_io(|fd| {
                nix::unistd::write(fd.get_ref(), &data[written..]).map_err(std::io::Error::from)
            }) {
                Ok(Ok(n)) => written += n,
                Ok(Err(e)) => return Err(io_error(e)),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), ConnectError> {
        use tokio::io::AsyncWriteExt;
        if self.pty.is_some() {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                "tty assigned to process, input should be written to the pty",
            ));
        }
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                "stdin not enabled or closed",
            ));
        };
        pipe.write_all(data).await.map_err(|e| {
            ConnectError::new(
                Code::Internal,
                format!("error writing to stdin of process '{}': {e}", self.pid),
            )
        })
    }

    pub async fn close_stdin(&self) -> Result<(), ConnectError> {
        if self.pty.is_some() {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                "cannot close stdin for a PTY process, send Ctrl+D (0x04) instead",
            ));
        }
        self.stdin.lock().await.take();
        Ok(())
    }

    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), ConnectError> {
        let Some(master) = &self.pty else {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                "tty not assigned to process",
            ));
        };
        super::spawn::resize_pty(&master.get_ref().as_raw_fd(), cols, rows).map_err(io_error)
    }
}

fn io_error(e: std::io::Error) -> ConnectError {
    ConnectError::new(Code::Internal, e.to_string())
}

#[derive(Default)]
pub struct ProcessTable {
    by_pid: Mutex<HashMap<u32, Arc<ProcessHandle>>>,
}

impl ProcessTable {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<ProcessHandle>>> {
        self.by_pid.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, handle: Arc<ProcessHandle>) {
        self.map().insert(handle.pid, handle);
    }

    pub fn remove(&self, pid: u32) {
        self.map().remove(&pid);
    }

    pub fn list(&self) -> Vec<Arc<ProcessHandle>> {
        let mut all: Vec<_> = self.map().values().cloned().collect();
        all.sort_by_key(|p| p.pid);
        all
    }

    pub fn get(
        &self,
        selector: Option<&ProcessSelector>,
    ) -> Result<Arc<ProcessHandle>, ConnectError> {
        let map = self.map();
        match selector.and_then(|s| s.selector.as_ref()) {
            Some(Selector::Pid(pid)) => map.get(pid).cloned().ok_or_else(|| {
                ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
            }),
            Some(Selector::Tag(tag)) => map
                .values()
                .find(|p| p.tag.as_deref() == Some(tag.as_str()))
                .cloned()
                .ok_or_else(|| {
                    ConnectError::new(Code::NotFound, format!("process with tag {tag} not found"))
                }),
            None => Err(ConnectError::new(
                Code::InvalidArgument,
                "process selector (pid or tag) is required",
            )),
        }
    }
}
