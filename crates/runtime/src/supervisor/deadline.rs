//! The supervisor's dead man's switch. The runtime writes a deadline (Unix milliseconds) into the
//! sandbox's directory when it starts a sandbox and whenever the server renews it
//! ([`crate::Runtime::renew`]); the supervisor's waiter ends the sandbox (SIGKILL to its init, which
//! takes the whole PID namespace with it) once the lease it gives has run out. A server that stops
//! renewing (stopped, crashed, its state directory deleted) thus leaves no sandbox running longer
//! than the lease it last gave. The file is host-side state beside the sandbox's rootfs mount point,
//! never inside the sandbox's tree.
//!
//! The lease runs on the boot clock, not the wall clock: when the waiter sees a new deadline it
//! notes how much of the lease is left by the wall clock at that moment, then counts that down on
//! `CLOCK_BOOTTIME`. A wall clock stepped forward (NTP after a long drift, an operator's `date -s`)
//! would otherwise end every sandbox at once; stepped back, it would keep them past their lease.

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

/// A deadline as the waiter holds it: the wall-clock deadline last read, and when it was read on
/// both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    deadline_unix_ms: u64,
    seen_wall_ms: u64,
    seen_boot_ms: u64,
}

impl Lease {
    /// The lease a freshly read deadline gives, read at `wall_ms` (wall clock) and `boot_ms` (boot
    /// clock).
    pub fn seen(deadline_unix_ms: u64, wall_ms: u64, boot_ms: u64) -> Lease {
        Lease {
            deadline_unix_ms,
            seen_wall_ms: wall_ms,
            seen_boot_ms: boot_ms,
        }
    }

    /// The lease after reading `deadline_unix_ms` again: the same deadline keeps counting down from
    /// when it was first seen; a different one (a renewal) starts again from now.
    pub fn reread(self, deadline_unix_ms: u64, wall_ms: u64, boot_ms: u64) -> Lease {
        if deadline_unix_ms == self.deadline_unix_ms {
            self
        } else {
            Lease::seen(deadline_unix_ms, wall_ms, boot_ms)
        }
    }

    /// Whether the lease has run out by the boot clock at `boot_ms`, whatever the wall clock did.
    pub fn expired(&self, boot_ms: u64) -> bool {
        let granted = self.deadline_unix_ms.saturating_sub(self.seen_wall_ms);
        boot_ms.saturating_sub(self.seen_boot_ms) > granted
    }
}

/// Milliseconds on `CLOCK_BOOTTIME`: steady (never stepped) and counting time the host was
/// suspended, as a lease should.
pub fn boot_clock_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec on the stack.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    (now.tv_sec as u64) * 1000 + (now.tv_nsec as u64) / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_step_neither_ends_a_lease_early_nor_stretches_it() {
        let hour = 3_600_000;
        let wall = 10 * hour;
        // A ten-minute lease seen at wall 10 h / boot 50 ms.
        let lease = Lease::seen(wall + 600_000, wall, 50);
        // The wall clock steps an hour forward; one real second passed: still leased.
        let lease = lease.reread(wall + 600_000, wall + hour, 1_050);
        assert!(!lease.expired(1_050));
        // Ten real minutes and a bit: over, even with the wall clock stepped back meanwhile.
        let later = lease.reread(wall + 600_000, wall - hour, 50 + 600_001);
        assert!(later.expired(50 + 600_001));
        assert!(!later.expired(50 + 600_000));
    }

    #[test]
    fn a_renewal_starts_the_count_again() {
        let lease = Lease::seen(10_000, 5_000, 0);
        assert!(lease.expired(5_001));
        let renewed = lease.reread(15_000, 9_000, 4_000);
        assert!(!renewed.expired(5_001));
        assert!(!renewed.expired(10_000));
        assert!(renewed.expired(10_001));
        // A deadline already past when read: over at once.
        assert!(Lease::seen(1_000, 2_000, 7).expired(8));
    }

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
