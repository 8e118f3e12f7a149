//! What the death of the runtime's owner (the server, killed with SIGKILL) can leave behind on a
//! sandbox, and how [`crate::Runtime::recover`] finds it again:
//!
//! - a `criu dump` still running: CRIU is a child of the dead server and outlives it. It is waited for
//!   (killing it while its parasite runs inside the sandbox's tasks would kill those tasks), and
//!   killed only after [`DUMP_WAIT`]. It leaves the tree frozen, as it found it.
//! - the network lock of a dump: the host side of the veth held down ([`crate::network::set_host_link`]).
//!   A sandbox whose init lives is brought back up: nothing of the dead server still dumps it.
//! - a sandbox directory without a state record: a create or restore the server did not finish. Its
//!   supervisor may still be setting it up; it is killed and the sandbox reclaimed.
//! - the helpers of a restore (`criu restore`, the `criu lazy-pages` daemon and the page server):
//!   children of the supervisor, they outlive it when it is killed. They are found by the sandbox's
//!   restore directory in their arguments ([`restore_helpers_of`]) and killed once its tree is dead.
//!
//! Processes are told apart by their command line, read from `/proc` (their own, as the kernel
//! keeps it; a sandbox cannot write it for a host process).

use std::path::Path;
use std::time::{Duration, Instant};

/// How long a `criu dump` the dead server started may still take before it is killed.
pub const DUMP_WAIT: Duration = Duration::from_secs(60);

/// Whether process `pid` lives in the caller's PID namespace. A sandbox's processes do not (they
/// show in the host's `/proc` all the same), and they can give themselves any command line.
pub(crate) fn in_our_pid_namespace(pid: u32) -> bool {
    match (
        std::fs::read_link("/proc/self/ns/pid"),
        std::fs::read_link(format!("/proc/{pid}/ns/pid")),
    ) {
        (Ok(ours), Ok(theirs)) => ours == theirs,
        _ => false,
    }
}

/// Processes of the caller's PID namespace (never a sandbox's) whose command line (NUL-separated
/// arguments) satisfies `matches`.
pub(crate) fn processes_where(matches: impl Fn(&[&[u8]]) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .collect();
            matches(&args) && in_our_pid_namespace(*pid)
        })
        .collect()
}

/// Whether `args` is a `criu dump --tree <init_pid> ...`.
pub(crate) fn is_dump_of(args: &[&[u8]], init_pid: u32) -> bool {
    let pid = init_pid.to_string();
    args.first().is_some_and(|a| a.ends_with(b"criu"))
        && args.get(1) == Some(&&b"dump"[..])
        && args
            .windows(2)
            .any(|w| w[0] == b"--tree" && w[1] == pid.as_bytes())
}

/// Whether `args` is a supervisor of the sandbox in `sandbox_dir`: one still building it
/// (`warren-supervisor run <dir>/supervisor.json ...`) or one waiting for its init
/// (`warren-supervisor wait <pid> <dir>`).
pub(crate) fn is_supervisor_of(args: &[&[u8]], sandbox_dir: &Path) -> bool {
    let config = crate::supervisor::SupervisorConfig::path_in(sandbox_dir);
    let is_supervisor = args
        .first()
        .is_some_and(|a| a.ends_with(b"warren-supervisor"));
    let building = args.get(1) == Some(&&b"run"[..])
        && args.get(2) == Some(&config.as_os_str().as_encoded_bytes());
    let waiting = args.get(1) == Some(&&b"wait"[..])
        && args.get(3) == Some(&sandbox_dir.as_os_str().as_encoded_bytes());
    is_supervisor && (building || waiting)
}

/// Whether `args` is a helper of a restore into `sandbox_dir`: CRIU (`criu restore`, `criu
/// lazy-pages`) or the page server (`<supervisor> serve-pages <checkpoint> <images> ...`), each
/// naming a path under the sandbox's restore work directory.
pub(crate) fn is_restore_helper_of(args: &[&[u8]], sandbox_dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let work = sandbox_dir.join("restore");
    let criu = args.first().is_some_and(|a| a.ends_with(b"criu"));
    let page_server = args.get(1) == Some(&&b"serve-pages"[..]);
    (criu || page_server)
        && args
            .iter()
            .skip(1)
            .any(|a| Path::new(std::ffi::OsStr::from_bytes(a)).starts_with(&work))
}

/// Helpers of a restore into the sandbox in `sandbox_dir` still running (see
/// [`is_restore_helper_of`]).
pub fn restore_helpers_of(sandbox_dir: &Path) -> Vec<u32> {
    processes_where(|args| is_restore_helper_of(args, sandbox_dir))
}

/// Whether process `pid` is a supervisor of the sandbox in `sandbox_dir` (of our PID namespace).
pub fn is_supervisor(pid: u32, sandbox_dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    is_supervisor_of(&args, sandbox_dir) && in_our_pid_namespace(pid)
}

/// CRIU dumps of the tree whose init is `init_pid` still running on this host.
pub fn dumps_of(init_pid: u32) -> Vec<u32> {
    processes_where(|args| is_dump_of(args, init_pid))
}

/// Supervisors of the sandbox in `sandbox_dir`.
pub fn supervisors_of(sandbox_dir: &Path) -> Vec<u32> {
    processes_where(|args| is_supervisor_of(args, sandbox_dir))
}

/// Waits until no process `find` names is left, up to `limit`; then kills what is left (SIGKILL)
/// and waits for it to go (bounded). Returns how many processes were killed.
pub fn wait_then_kill(find: impl Fn() -> Vec<u32>, limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    while !find().is_empty() && Instant::now() < deadline {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    let left = find();
    for pid in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let gone_by = Instant::now() + Duration::from_secs(5);
    while !find().is_empty() && Instant::now() < gone_by {
        std::thread::sleep(Duration::from_millis(5));
    }
    left.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<&[u8]> {
        line.split(' ').map(str::as_bytes).collect()
    }

    /// The attack: a sandbox's process names itself like a supervisor (or a CRIU dump). It lives in
    /// another PID namespace, so nothing here takes it for one.
    #[test]
    fn processes_of_another_pid_namespace_are_never_taken_for_the_hosts() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIP: a new PID namespace needs root");
            return;
        }
        let mut ours = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut theirs = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "sleep", "31"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let inner = loop {
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", theirs.id()))
                    .unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                break pid.parse::<u32>().unwrap();
            }
            assert!(Instant::now() < deadline, "unshare started no child");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(in_our_pid_namespace(ours.id()));
        assert!(
            !in_our_pid_namespace(inner),
            "a process of another PID namespace"
        );
        let found = processes_where(|args| args.last() == Some(&&b"31"[..]));
        assert!(!found.contains(&inner), "{found:?}");
        assert!(
            found.contains(&theirs.id()),
            "unshare itself runs here: {found:?}"
        );
        for child in [&mut ours, &mut theirs] {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(inner as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    #[test]
    fn restore_helpers_are_recognised_by_the_sandboxes_restore_directory() {
        let dir = Path::new("/state/sandboxes/abc");
        let daemon = words(
            "/usr/local/sbin/criu lazy-pages --images-dir /state/sandboxes/abc/restore/images \
             --work-dir /state/sandboxes/abc/restore/lazy --page-server --ps-socket 3",
        );
        let server = words(
            "/proc/self/exe serve-pages /state/snapshots/abc /state/sandboxes/abc/restore/images 3 6",
        );
        let restore =
            words("/usr/local/sbin/criu restore --images-dir /state/sandboxes/abc/restore/images");
        for helper in [&daemon, &server, &restore] {
            assert!(is_restore_helper_of(helper, dir), "{helper:?}");
        }
        // Another sandbox whose ID starts the same, a dump, and programs that merely name the path.
        assert!(!is_restore_helper_of(
            &daemon,
            Path::new("/state/sandboxes/ab")
        ));
        assert!(!is_restore_helper_of(
            &words("/usr/local/sbin/criu dump --tree 7 --images-dir /state/snapshots/abc"),
            dir
        ));
        assert!(!is_restore_helper_of(
            &words("/bin/cat /state/sandboxes/abc/restore/restore.log"),
            dir
        ));
        assert!(!is_restore_helper_of(
            &words("/proc/self/exe serve-pages /state/snapshots/abc /elsewhere 3 6"),
            dir
        ));
    }

    #[test]
    fn dumps_are_recognised_by_their_tree() {
        let dump = words("/usr/local/sbin/criu dump --tree 4242 --images-dir /x -v4");
        assert!(is_dump_of(&dump, 4242));
        assert!(!is_dump_of(&dump, 424));
        assert!(!is_dump_of(
            &words("/usr/local/sbin/criu restore --tree 4242"),
            4242
        ));
        assert!(!is_dump_of(&words("/bin/sh dump --tree 4242"), 4242));
        assert!(!is_dump_of(&[], 4242));
    }

    #[test]
    fn supervisors_are_recognised_by_their_sandbox() {
        let dir = Path::new("/var/lib/warren/sandboxes/abc");
        let building = "/opt/warren-supervisor run /var/lib/warren/sandboxes/abc/supervisor.json --status-fd 5";
        let waiting = "/opt/warren-supervisor wait 4242 /var/lib/warren/sandboxes/abc";
        assert!(is_supervisor_of(&words(building), dir));
        assert!(is_supervisor_of(&words(waiting), dir));
        let other = Path::new("/var/lib/warren/sandboxes/abcd");
        assert!(!is_supervisor_of(&words(building), other));
        assert!(!is_supervisor_of(&words(waiting), other));
        assert!(!is_supervisor_of(
            &words("/bin/cat run /var/lib/warren/sandboxes/abc/supervisor.json"),
            dir
        ));
    }

    #[test]
    fn waiting_ends_by_killing_what_is_left() {
        let mut child = std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .unwrap();
        let pid = child.id();
        let alive = move || {
            // A zombie (killed, not yet reaped by this test) counts as gone.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    !s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(false)
        };
        let find = || if alive() { vec![pid] } else { Vec::new() };
        assert_eq!(wait_then_kill(find, Duration::from_millis(50)), 1);
        assert!(!alive());
        child.wait().unwrap();
        assert_eq!(wait_then_kill(find, Duration::from_millis(50)), 0);
    }
}
