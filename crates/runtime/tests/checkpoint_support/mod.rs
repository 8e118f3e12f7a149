//! Test harness for the checkpoint tests: a sandbox shaped like the runtime's (fresh pid, mount, uts and
//! ipc namespaces, a pinned netns with a veth on a test bridge, overlay root with pivot_root, tmpfs /dev
//! with its own device nodes, devpts, /dev/shm, mqueue, ro sysfs, a read-only bind mount at
//! /.warren/agent, /proc masks, cgroups cpu/memory/pids/freezer, a session-leader PID 1), launched by a
//! small shell script. Everything it makes is named `wt-ck*` and removed on drop.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use warren_runtime::checkpoint::{Checkpointer, DumpTarget, FreezerCgroup, RestoreTarget};
use warren_runtime::rootfs::sandbox_mounts::OverlayPlan;

pub const BASE_ROOTFS: &str = "/var/cache/warren/rootfs/debian12-base";
const BRIDGE: &str = "wt-ck0";
const GATEWAY: &str = "10.78.0.1/16";
/// Stands in for the agent binary: any host file works as the external bind mount's source.
pub const AGENT_STAND_IN: &str = "/usr/bin/true";

static SERIAL: Mutex<()> = Mutex::new(());

/// Serialises the tests of one binary (they share the bridge).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// CRIU and the base rootfs, or a printed SKIP line and `None`.
pub fn prerequisites() -> Option<Checkpointer> {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: checkpoint tests need root");
        return None;
    }
    if !Path::new(BASE_ROOTFS).join("usr/bin/python3").exists() {
        println!("SKIP: base rootfs {BASE_ROOTFS} missing (run scripts/setup)");
        return None;
    }
    let checkpointer = Checkpointer::probe();
    if let Some(why) = checkpointer.unavailable_reason() {
        println!("SKIP: {why}");
        return None;
    }
    Some(checkpointer)
}

fn sh(command: &str) -> Result<()> {
    let out = Command::new("sh").arg("-c").arg(command).output()?;
    if !out.status.success() {
        bail!(
            "`{command}`: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        vec![root.join("wt-ck").join(id)]
    } else {
        ["cpu", "memory", "pids", "freezer"]
            .iter()
            .map(|c| root.join(c).join("wt-ck").join(id))
            .collect()
    }
}

const INNER: &str = r#"set -e
R=$1; OVERLAY=$2; AGENT=$3; shift 3
mount --make-rprivate /
mount -t overlay overlay -o "$OVERLAY" "$R"
mount -t tmpfs -o mode=755,size=1m,nosuid tmpfs "$R/dev"
mknod -m 666 "$R/dev/null" c 1 3; mknod -m 666 "$R/dev/zero" c 1 5; mknod -m 666 "$R/dev/full" c 1 7
mknod -m 666 "$R/dev/random" c 1 8; mknod -m 666 "$R/dev/urandom" c 1 9; mknod -m 666 "$R/dev/tty" c 5 0
mkdir -p "$R/dev/pts" "$R/dev/shm" "$R/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"; ln -s /proc/self/fd "$R/dev/fd"
mount -t tmpfs -o size=64m tmpfs "$R/dev/shm"
mount -t mqueue -o nosuid,nodev,noexec mqueue "$R/dev/mqueue"
mount -t proc proc "$R/proc"
mkdir -p "$R/sys"; mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
mkdir -p "$R/.warren"; [ -e "$R/.warren/agent" ] || touch "$R/.warren/agent"
mount --bind "$AGENT" "$R/.warren/agent"; mount -o remount,bind,ro "$R/.warren/agent"
hostname wt-ck
cd "$R"; mkdir -p .oldroot; pivot_root . .oldroot; umount -l /.oldroot; rmdir /.oldroot
for p in /proc/sys /proc/sysrq-trigger /proc/irq /proc/bus /proc/fs; do
  [ -e $p ] && mount --bind $p $p && mount -o remount,bind,ro $p
done
for p in /proc/kcore /proc/keys /proc/timer_list; do [ -e $p ] && mount --bind /dev/null $p; done
# Nothing inherited may point outside the sandbox (CRIU cannot dump such fds).
for fd in /proc/self/fd/*; do n=${fd##*/}; [ "$n" -gt 2 ] && eval "exec $n>&-" 2>/dev/null || true; done
exec setsid "$@" </dev/null >/dev/null 2>&1
"#;

/// One test sandbox.
pub struct TestSandbox {
    pub id: String,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    netns: String,
    veth: String,
    launcher: Option<Child>,
    pub init_pid: u32,
    /// Bumped each time the sandbox gets a fresh upper (restores).
    generation: u32,
    upper: PathBuf,
    /// Host file bind-mounted at /.warren/agent by restores.
    pub agent: PathBuf,
    layers: Vec<PathBuf>,
    /// A lazy restore's memory transfer, watched on its own thread until it ends.
    transfer: Option<std::thread::JoinHandle<warren_runtime::checkpoint::TransferEnd>>,
}

impl TestSandbox {
    /// Directories, cgroups and a wired network namespace; no processes yet.
    pub fn prepare(id: &str, host_octet: u8) -> Result<Self> {
        let ip = Ipv4Addr::new(10, 78, 0, host_octet);
        let dir = PathBuf::from(format!("/tmp/wt-ck/{id}"));
        let sandbox = Self {
            id: id.to_string(),
            ip,
            dir,
            netns: format!("wt-ck-{id}"),
            veth: format!("wtck{host_octet}"),
            launcher: None,
            init_pid: 0,
            generation: 0,
            upper: PathBuf::from(format!("/tmp/wt-ck/{id}/upper0")),
            agent: PathBuf::from(AGENT_STAND_IN),
            layers: vec![PathBuf::from(BASE_ROOTFS)],
            transfer: None,
        };
        let _ = std::fs::remove_dir_all(&sandbox.dir);
        std::fs::create_dir_all(sandbox.rootfs())?;
        std::fs::create_dir_all(sandbox.upper())?;
        std::fs::create_dir_all(sandbox.work())?;
        for cg in cgroup_dirs(id) {
            std::fs::create_dir_all(&cg).with_context(|| format!("cgroup {}", cg.display()))?;
        }
        let memory = Path::new("/sys/fs/cgroup/memory/wt-ck")
            .join(id)
            .join("memory.limit_in_bytes");
        if memory.exists() {
            std::fs::write(memory, (2u64 << 30).to_string())?;
        }
        sandbox.wire_network()?;
        Ok(sandbox)
    }

    /// No default route: the sandbox reaches the bridge's subnet only (lookups fail at once instead of
    /// timing out, and no test traffic can leave the host).
    fn wire_network(&self) -> Result<()> {
        if !Path::new("/sys/class/net").join(BRIDGE).exists() {
            sh(&format!("ip link add {BRIDGE} type bridge && ip addr add {GATEWAY} dev {BRIDGE} && ip link set {BRIDGE} up"))?;
        }
        let (ns, veth, ip) = (&self.netns, &self.veth, self.ip);
        sh(&format!(
            "ip netns del {ns} 2>/dev/null; ip link del {veth} 2>/dev/null; ip netns add {ns} && \
             ip link add {veth} type veth peer name eth0 netns {ns} && ip link set {veth} master {BRIDGE} up && \
             ip -n {ns} addr add {ip}/16 dev eth0 && ip -n {ns} link set eth0 up && ip -n {ns} link set lo up"
        ))
    }

    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    pub fn upper(&self) -> PathBuf {
        self.upper.clone()
    }

    pub fn work(&self) -> PathBuf {
        self.dir.join(format!("work{}", self.generation))
    }

    pub fn netns_pin(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.netns)
    }

    pub fn overlay_options(&self) -> String {
        format!(
            "lowerdir={BASE_ROOTFS},upperdir={},workdir={}",
            self.upper().display(),
            self.work().display()
        )
    }

    pub fn procs_files(&self) -> Vec<PathBuf> {
        cgroup_dirs(&self.id)
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    pub fn freezer(&self) -> FreezerCgroup {
        let dirs = cgroup_dirs(&self.id);
        let dir = dirs
            .iter()
            .find(|d| d.to_string_lossy().contains("/freezer/"))
            .unwrap_or(&dirs[0]);
        FreezerCgroup::at(dir).expect("freezer cgroup")
    }

    /// A file on the sandbox's writable layer, as the host sees it.
    pub fn layer_file(&self, path: &str) -> PathBuf {
        self.upper().join(path.trim_start_matches('/'))
    }

    /// Puts `files` on the writable layer and starts `command` (via `bash -c`) as PID 1.
    pub fn launch(&mut self, files: &[(&str, &str)], command: &str) -> Result<()> {
        for (path, content) in files {
            let path = self.layer_file(path);
            std::fs::create_dir_all(path.parent().context("file without parent")?)?;
            std::fs::write(&path, content)?;
        }
        let inner = self.dir.join("inner.sh");
        std::fs::write(&inner, INNER)?;
        let procs: Vec<String> = self
            .procs_files()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let script = format!(
            "for f in {}; do echo $$ > $f; done; exec nsenter --net={} unshare --pid --mount --uts --ipc --fork bash {} {} {} {} bash -c \"$0\"",
            procs.join(" "),
            self.netns_pin().display(),
            inner.display(),
            self.rootfs().display(),
            self.overlay_options(),
            AGENT_STAND_IN,
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(command)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let launcher = child.id();
        self.launcher = Some(child);
        // sh execs nsenter, which execs unshare: the launcher's only child is the sandbox's PID 1, ready
        // once it leads its own session (after the set-up script's final `exec setsid`).
        let pid = wait_for("sandbox init", || {
            let children =
                std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children"))
                    .ok()?;
            let pid: u32 = children.split_whitespace().next()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let session = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(3)?
                .parse::<u32>()
                .ok()?;
            (session == pid).then_some(pid)
        })?;
        self.init_pid = pid;
        Ok(())
    }

    pub fn dump_target(&self) -> DumpTarget<'_> {
        DumpTarget {
            sandbox_id: &self.id,
            ip: self.ip,
            init_pid: self.init_pid,
            freezer: self.freezer(),
            upper: &self.upper,
            layers: &self.layers,
            volume_targets: &[],
        }
    }

    /// Host PIDs in the sandbox's cgroups.
    pub fn procs(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .procs_files()
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Waits until the memory of the last (lazy) restore has all arrived; fails if it did not.
    pub fn settle(&mut self) -> Result<()> {
        let Some(watcher) = self.transfer.take() else {
            return Ok(());
        };
        match watcher.join() {
            Ok(warren_runtime::checkpoint::TransferEnd::Complete) => Ok(()),
            Ok(other) => bail!("the lazy restore's transfer ended with {other:?}"),
            Err(_) => bail!("the transfer watcher panicked"),
        }
    }

    /// Kills every process (pause leaves a frozen tree behind for the caller to remove).
    pub fn kill_all(&mut self) {
        let freezer = self.freezer();
        for _ in 0..200 {
            let mut any = false;
            for procs in self.procs_files() {
                for pid in std::fs::read_to_string(&procs)
                    .unwrap_or_default()
                    .split_whitespace()
                {
                    if let Ok(pid) = pid.parse::<i32>() {
                        any = true;
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
            let _ = freezer.thaw();
            if !any {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(mut child) = self.launcher.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // With the tree gone the daemon has nothing left to serve and exits.
        let _ = self.settle();
    }

    /// After a pause: processes gone, fresh netns, a new empty upper/work, same ID and address.
    pub fn reset_for_restore(&mut self) -> Result<()> {
        self.kill_all();
        let _ = std::fs::remove_dir_all(self.upper());
        let _ = std::fs::remove_dir_all(self.work());
        self.generation += 1;
        self.upper = self.dir.join(format!("upper{}", self.generation));
        std::fs::create_dir_all(self.upper())?;
        std::fs::create_dir_all(self.work())?;
        self.wire_network()
    }

    /// Restores `checkpoint` into this (prepared or reset) sandbox.
    pub fn restore(
        &mut self,
        checkpointer: &Checkpointer,
        checkpoint: &Path,
    ) -> Result<warren_runtime::checkpoint::Restored> {
        let (rootfs, upper, overlay, netns, procs, work) = (
            self.rootfs(),
            self.upper(),
            OverlayPlan::new(&[PathBuf::from(BASE_ROOTFS)], &self.upper(), &self.work())?,
            self.netns_pin(),
            self.procs_files(),
            self.dir.join("restore-work"),
        );
        std::fs::create_dir_all(&work)?;
        let target = RestoreTarget {
            ip: self.ip,
            rootfs: &rootfs,
            overlay: &overlay,
            agent_binary: &self.agent,
            netns_pin: &netns,
            cgroup_procs: &procs,
            work_dir: &work,
            image_cache: None,
            lxcfs: None,
            volumes: &[],
            // Lazily, as the runtime does, through the supervisor binary's page server.
            page_server: Some(Path::new(env!("CARGO_BIN_EXE_warren-supervisor"))),
        };
        let mut restored = checkpointer.restore(checkpoint, &upper, &target)?;
        self.init_pid = restored.init_pid;
        if let Some(mut transfer) = restored.transfer.take() {
            self.transfer = Some(std::thread::spawn(move || {
                let end = transfer.watch(-1);
                transfer.finish();
                end
            }));
        }
        Ok(restored)
    }

    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.ip, port))
    }

    /// Waits until `port` accepts connections.
    pub fn wait_port(&self, port: u16) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&self.addr(port), Duration::from_millis(200)).is_err() {
            if Instant::now() > deadline {
                bail!("{}:{port} never accepted", self.ip);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Sends one line to `port`, returns the one-line answer.
    pub fn ask(&self, port: u16, line: &str) -> Result<String> {
        use std::io::{BufRead, BufReader, Write};
        let mut stream = TcpStream::connect_timeout(&self.addr(port), Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.write_all(format!("{line}\n").as_bytes())?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer)?;
        Ok(answer.trim().to_string())
    }
}

impl Drop for TestSandbox {
    fn drop(&mut self) {
        self.kill_all();
        let _ = sh(&format!(
            "ip netns del {} 2>/dev/null; ip link del {} 2>/dev/null; true",
            self.netns, self.veth
        ));
        for cg in cgroup_dirs(&self.id) {
            let _ = std::fs::remove_dir(&cg);
            if let Some(parent) = cg.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        let bridge_ports = Path::new("/sys/class/net").join(BRIDGE).join("brif");
        if std::fs::read_dir(&bridge_ports).is_ok_and(|mut ports| ports.next().is_none()) {
            let _ = sh(&format!("ip link del {BRIDGE}"));
        }
    }
}

/// Polls `what` until it returns `Some` or 20 s pass.
pub fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A Python process holding a list, with every kind of state CRIU must carry: a loopback TCP connection
/// inside the process, a pipe with bytes in flight, a PTY with `cat` on the other end, an interval
/// timer. It answers `append X` / `get` lines on port 7000 with JSON that exercises all of them.
pub const HOLDER_PY: &str = r#"
import json, os, pty, signal, socket, time
data = [1, 2, 3]
ticks = 0
def on_tick(*_):
    global ticks
    ticks += 1
signal.signal(signal.SIGALRM, on_tick)
signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 9000)); listener.listen()
client = socket.create_connection(("127.0.0.1", 9000)); server, _ = listener.accept()
pipe_r, pipe_w = os.pipe(); os.write(pipe_w, b"in-flight")
child, master = pty.fork()
if child == 0:
    os.execvp("cat", ["cat"])
control = socket.socket(); control.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
control.bind(("0.0.0.0", 7000)); control.listen()
while True:
    try:
        conn, _ = control.accept()
    except InterruptedError:
        continue
    with conn:
        line = conn.makefile().readline().strip()
        if not line:
            continue
        cmd, _, arg = line.partition(" ")
        if cmd == "append":
            data.append(arg)
        client.sendall(b"ping"); tcp = server.recv(4).decode()
        os.write(pipe_w, b"x"); piped = os.read(pipe_r, 64).decode()
        os.write(master, b"hello\n"); echoed = b""
        while echoed.count(b"hello\r\n") < 2 and len(echoed) < 100:
            echoed += os.read(master, 100)
        reply = {"data": data, "ticks": ticks, "tcp": tcp, "pipe": piped, "pty": echoed.decode(errors="replace")}
        conn.sendall((json.dumps(reply) + "\n").encode())
"#;
