//! The supervisor's dead man's switch. The runtime writes a deadline (Unix milliseconds) into the
//! sandbox's directory when it starts a sandbox and whenever the server renews it
//! ([`crate::Runtime::renew`]); the supervisor's waiter ends the sandbox (SIGKILL to its init, which
//! takes the whole PID namespace with it) once the wall clock passes it. A server that stops
//! renewing (stopped, crashed, its state directory deleted) thus leaves no sandbox running longer
//! than the lease it last gave. The file is host-side state beside the sandbox's rootfs mount point,
//! never inside the sandbox's tree.

use std::path::Path;

/// File holding the deadline, in the sandbox's directory.
pub const DEADLINE_FILE: &str = "deadline";
/// Written by the waiter when it ended the sandbox for its deadline.
pub const EXPIRED_FILE: &str = "deadline.expired";
/// How long a sandbox runs without a renewal when the runtime starts it.
pub const INITIAL_LEASE_MS: u64 = 10 * 60 * 1000;

/// Writes `until` atomically (temporary file, then rename): the waiter never reads half a number.
pub fn write(sandbox_dir: &Path, until_unix_ms: u64) -> std::io::Result<()> {
    let temp = sandbox_dir.join(format!(".{DEADLINE_FILE}.tmp"));
    std::fs::write(&temp, format!("{until_unix_ms}\n"))?;
    std::fs::rename(&temp, sandbox_dir.join(DEADLINE_FILE))
}

/// The deadline, if one was written and reads as a number.
pub fn read(sandbox_dir: &Path) -> Option<u64> {
    std::fs::read_to_string(sandbox_dir.join(DEADLINE_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_trip_and_garbage_is_none() {
        let dir = std::env::temp_dir().join(format!("wt-deadline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read(&dir), None);
        write(&dir, 1_700_000_000_123).unwrap();
        assert_eq!(read(&dir), Some(1_700_000_000_123));
        std::fs::write(dir.join(DEADLINE_FILE), "soon").unwrap();
        assert_eq!(read(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
