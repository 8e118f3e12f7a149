//! Lazy restore: CRIU restores the process tree without its private anonymous memory, which arrives
//! afterwards over userfaultfd, page faults first and the rest in the background.
//!
//! Three processes beside the restored tree, all children of the caller (the sandbox's supervisor):
//! - `criu lazy-pages` (the *daemon*): holds the tree's userfaultfds, resolves faults, pushes the
//!   remaining pages, and exits 0 once every page is in. Started with `--page-server --ps-socket`, it
//!   asks for page contents over a socket instead of reading the page images itself;
//! - the *page server* (`warren-supervisor serve-pages`, [`serve_pages`]) on the other end of that
//!   socket answers from the checkpoint's uncompressed page images, checking each 256 KiB chunk
//!   against the manifest the first time any page of it is asked for ([`super::page_chunks`]). A chunk
//!   that does not match is never sent: the server reports it to the caller and stops answering, so
//!   the daemon keeps the faulting threads waiting while the caller kills the tree;
//! - `criu restore --lazy-pages` itself, which exits once the tree runs.
//!
//! The pages CRIU's restore still reads itself (anything not flagged lazy: stacks, shared memory,
//! file-backed private pages) are verified before it starts.
//!
//! A userfaultfd whose last descriptor closes turns every page not yet copied into a zero page. The
//! failures Warren causes itself (a damaged chunk, a page the checkpoint does not hold) never close
//! it: the page server stops answering and the caller kills the tree while the daemon still holds
//! every fault. A daemon that dies by itself (killed from outside, crashed) does release them; the
//! caller watches its pidfd and kills the tree at once ([`LazyTransfer::watch`]), but threads that
//! fault in between may see zero pages for that moment. Holding duplicates of the daemon's
//! userfaultfds would close that gap, and does not work: the daemon closes a process's
//! userfaultfd once its pages are all in, and with a duplicate alive its epoll set keeps reporting
//! that process's later events (munmap, madvise) against freed state, and it spins forever
//! (seen with CRIU 4.1.1).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::manifest::{Manifest, StoredFile};
use super::page_chunks::ChunkedPages;
use super::pagemap::{Pagemap, PAGE_SIZE};
use super::CheckpointError;

/// CRIU's page-server commands (criu/page-xfer.c).
const PS_IOV_ADD_F: u32 = 6;
const PS_IOV_GET: u32 = 7;
const PS_IOV_CLOSE: u32 = 0x1023;
const PS_IOV_FORCE_CLOSE: u32 = 0x1024;
const PS_CMD_BITS: u32 = 16;
const PE_PRESENT_FLAG: u32 = 1 << 2;
/// The fds the daemon gets its page-server socket and status pipe on.
const DAEMON_SOCKET_FD: RawFd = 3;
const DAEMON_STATUS_FD: RawFd = 4;
/// A request asking for more than this many pages is answered in part (CRIU asks again for the rest).
const MAX_PAGES_PER_ANSWER: u32 = 1024;
/// The sub-directory of the restore's work dir the daemon and CRIU meet in (its socket lives there).
pub const LAZY_DIR: &str = "lazy";
/// How long the transfer may take before it counts as stuck.
const TRANSFER_LIMIT: Duration = Duration::from_secs(600);
/// How long the page server and the daemon may take to say they are ready. Both answer within
/// milliseconds; one that has not after this is stuck (a daemon whose start-up probe child was
/// killed was seen asleep for minutes), and the restore must fail rather than wait with it.
const READY_LIMIT: Duration = Duration::from_secs(10);

/// Waits until `fd` can be read (or its writer is gone: then a read returns what is left, or end of
/// file), at most `limit`; false when the time ran out.
fn readable_within(fd: RawFd, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd on the stack.
        let ready = unsafe { libc::poll(&mut poll, 1, millis) };
        if ready > 0 {
            return true;
        }
        if ready < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // Let the read that follows report what is wrong with the descriptor.
            return true;
        }
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let context = context.into();
    move |source| CheckpointError::Io { context, source }
}

/// A copy of `fd` numbered above the daemon's fixed descriptors (so that the dup2s onto those never
/// clobber a source before it is used); the original is closed.
fn above_fixed_fds(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor (or -1) and leaves `fd` as it is.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if copy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// Whether the checkpoint's page images carry chunk sums (format 2): only those can be served lazily.
pub fn servable(manifest: &Manifest) -> bool {
    manifest.images.iter().any(|f| f.chunks.is_some())
}

/// Below this much memory a checkpoint is restored eagerly. A lazy restore has a fixed cost (the
/// daemon and the page server start and shake hands: about 20 ms of a 90 ms template start here)
/// that pays only when it spares CRIU reading enough pages first: an eager start of a running-state
/// template with 9 MiB of pages took 71 ms p50 against 92 ms lazily (`benches/run.py --only create`,
/// same binary, `--no-lazy-restore`), while at 100 MiB lazy wins by hundreds of milliseconds
/// (docs/performance.md). An eager restore costs about 1.5 to 2 ms more per MiB of pages on this
/// host, a lazy one nearly the same at any size: the two meet near 20 MiB.
pub const LAZY_MIN_BYTES: u64 = 24 << 20;

/// Whether restoring `manifest` lazily is possible ([`servable`]) and worth it ([`LAZY_MIN_BYTES`]).
pub fn worth_serving(manifest: &Manifest) -> bool {
    let pages: u64 = manifest
        .images
        .iter()
        .filter(|f| f.chunks.is_some())
        .map(|f| f.raw_bytes)
        .sum();
    servable(manifest) && pages >= LAZY_MIN_BYTES
}

fn pages_of(manifest: &Manifest) -> HashMap<u32, &StoredFile> {
    manifest
        .images
        .iter()
        .filter_map(|f| {
            let id = f.name.strip_prefix("pages-")?.strip_suffix(".img")?;
            Some((id.parse().ok()?, f))
        })
        .collect()
}

/// The task pagemaps (`pagemap-<pid>.img`) of `manifest`, read from the unpacked `images`.
fn task_pagemaps(
    manifest: &Manifest,
    images: &Path,
) -> Result<HashMap<u64, Pagemap>, CheckpointError> {
    let mut out = HashMap::new();
    for file in &manifest.images {
        let Some(pid) = file
            .name
            .strip_prefix("pagemap-")
            .and_then(|rest| rest.strip_suffix(".img"))
            .and_then(|pid| pid.parse::<u64>().ok())
        else {
            continue;
        };
        out.insert(pid, Pagemap::read(&images.join(&file.name))?);
    }
    Ok(out)
}

/// Writes into the raw page files laid out in `images` (sparse, see [`super::store::unpack_images`])
/// every stored page CRIU's restore reads itself when the lazy ones are left to the daemon, checked:
/// all present pages of shared-memory pagemaps and the present pages of task pagemaps not flagged lazy.
pub fn expand_eager_pages(
    checkpoint: &Path,
    manifest: &Manifest,
    images: &Path,
) -> Result<(), CheckpointError> {
    let pages = pages_of(manifest);
    let mut opened: HashMap<u32, (ChunkedPages, File)> = HashMap::new();
    for file in &manifest.images {
        if !(file.name.starts_with("pagemap-") && file.name.ends_with(".img")) {
            continue;
        }
        let shmem = file.name.starts_with("pagemap-shmem-");
        let map = Pagemap::read(&images.join(&file.name))?;
        let stored = pages.get(&map.pages_id).ok_or_else(|| {
            CheckpointError::Corrupt(format!(
                "{} names pages-{}.img, which the manifest does not list",
                file.name, map.pages_id
            ))
        })?;
        let Some(sums) = &stored.chunks else {
            continue;
        };
        let (source, out) = match opened.entry(map.pages_id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let out = std::fs::OpenOptions::new()
                    .write(true)
                    .open(images.join(&stored.name))
                    .map_err(io_err(format!("open the raw {}", stored.name)))?;
                let source = ChunkedPages::open(
                    &checkpoint.join(&stored.path),
                    &stored.name,
                    stored.raw_bytes,
                    sums,
                )?;
                e.insert((source, out))
            }
        };
        for entry in map.entries.iter().filter(|e| e.present()) {
            if shmem || !entry.lazy() {
                source.expand_range(entry.offset, entry.bytes(), out)?;
            }
        }
    }
    Ok(())
}

/// The page images of one checkpoint, as the page server reads them.
struct PageSource {
    pagemaps: HashMap<u64, Pagemap>,
    files: HashMap<u32, ChunkedPages>,
}

impl PageSource {
    /// Opens the stored page images of `checkpoint` (kept open: the checkpoint directory may be
    /// moved or removed while the transfer runs) and the task pagemaps laid out in `images`.
    fn open(
        checkpoint: &Path,
        manifest: &Manifest,
        images: &Path,
    ) -> Result<Self, CheckpointError> {
        let pagemaps = task_pagemaps(manifest, images)?;
        let mut files = HashMap::new();
        for (id, stored) in pages_of(manifest) {
            if let Some(sums) = &stored.chunks {
                files.insert(
                    id,
                    ChunkedPages::open(
                        &checkpoint.join(&stored.path),
                        &stored.name,
                        stored.raw_bytes,
                        sums,
                    )?,
                );
            }
        }
        Ok(Self { pagemaps, files })
    }

    /// Reads up to `nr_pages` stored pages of task `pid` from `vaddr` into `buf` (verified); returns
    /// how many it read.
    fn read(
        &mut self,
        pid: u64,
        vaddr: u64,
        nr_pages: u32,
        buf: &mut Vec<u8>,
    ) -> Result<u32, CheckpointError> {
        let map = self.pagemaps.get(&pid).ok_or_else(|| {
            CheckpointError::Corrupt(format!("pages asked for task {pid}, which has no pagemap"))
        })?;
        let (offset, count) = map
            .locate(vaddr, nr_pages.min(MAX_PAGES_PER_ANSWER))
            .ok_or_else(|| {
                CheckpointError::Corrupt(format!(
                    "task {pid}: no stored page at {vaddr:#x} (asked for {nr_pages})"
                ))
            })?;
        let file = self.files.get_mut(&map.pages_id).ok_or_else(|| {
            CheckpointError::Corrupt(format!(
                "pages-{}.img has no chunk sums to serve it with",
                map.pages_id
            ))
        })?;
        buf.resize(count as usize * PAGE_SIZE as usize, 0);
        file.read_at(buf, offset)?;
        Ok(count)
    }
}

fn header(cmd: u32, nr_pages: u32, vaddr: u64, dst_id: u64) -> [u8; 24] {
    let mut out = [0u8; 24];
    out[0..4].copy_from_slice(&cmd.to_ne_bytes());
    out[4..8].copy_from_slice(&nr_pages.to_ne_bytes());
    out[8..16].copy_from_slice(&vaddr.to_ne_bytes());
    out[16..24].copy_from_slice(&dst_id.to_ne_bytes());
    out
}

/// Answers the daemon's page requests on `socket` until it says it is done.
fn answer(socket: &mut UnixStream, source: &mut PageSource) -> Result<(), CheckpointError> {
    let mut buf = Vec::new();
    loop {
        let mut request = [0u8; 24];
        socket
            .read_exact(&mut request)
            .map_err(io_err("read a request of the lazy-pages daemon"))?;
        let word = |at: usize| {
            u32::from_ne_bytes([
                request[at],
                request[at + 1],
                request[at + 2],
                request[at + 3],
            ])
        };
        let quad = |at: usize| {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(&request[at..at + 8]);
            u64::from_ne_bytes(eight)
        };
        let (cmd, nr_pages, vaddr, dst_id) = (word(0), word(4), quad(8), quad(16));
        match cmd {
            PS_IOV_GET => {
                let count = source.read(dst_id, vaddr, nr_pages, &mut buf)?;
                let reply = header(
                    (PE_PRESENT_FLAG << PS_CMD_BITS) | PS_IOV_ADD_F,
                    count,
                    vaddr,
                    dst_id,
                );
                socket
                    .write_all(&reply)
                    .and_then(|()| socket.write_all(&buf))
                    .map_err(io_err("answer the lazy-pages daemon"))?;
            }
            PS_IOV_CLOSE | PS_IOV_FORCE_CLOSE => {
                socket
                    .write_all(&0i32.to_ne_bytes())
                    .map_err(io_err("answer the lazy-pages daemon's close"))?;
                return Ok(());
            }
            other => {
                return Err(CheckpointError::Invalid(format!(
                    "unexpected page-server command {other:#x} from the lazy-pages daemon"
                )))
            }
        }
    }
}

/// Body of `warren-supervisor serve-pages <checkpoint> <images> <socket-fd> <report-fd>`: loads the
/// manifest and pagemaps, writes `ready` on the report fd, answers the daemon, and writes `done` when
/// it closes. On any failure it writes `failed <why>` and then waits, still holding the socket, until
/// whoever reads the report fd is gone (the caller kills it first): the daemon must not see the
/// socket close while the tree may still fault. Returns the process exit code.
pub fn serve_pages(checkpoint: &Path, images: &Path, socket_fd: RawFd, report_fd: RawFd) -> i32 {
    // SAFETY: the caller passed these two fds for us to own.
    let (socket, report) = unsafe {
        (
            OwnedFd::from_raw_fd(socket_fd),
            OwnedFd::from_raw_fd(report_fd),
        )
    };
    let mut socket = UnixStream::from(socket);
    let mut report = File::from(report);
    let started = Manifest::read(checkpoint)
        .and_then(|manifest| PageSource::open(checkpoint, &manifest, images));
    let outcome = started.and_then(|mut source| {
        let _ = report.write_all(b"ready\n");
        answer(&mut socket, &mut source)
    });
    match outcome {
        Ok(()) => {
            let _ = report.write_all(b"done\n");
            0
        }
        Err(e) => {
            let line = format!("failed {}\n", crate::error_chain(&e).replace('\n', " "));
            let _ = report.write_all(line.as_bytes());
            // Wait for the reader to go (POLLERR on a pipe's write end), holding the socket.
            let mut poll = libc::pollfd {
                fd: report.as_raw_fd(),
                events: 0,
                revents: 0,
            };
            // SAFETY: one valid pollfd on the stack.
            while unsafe { libc::poll(&mut poll, 1, -1) } == 0
                || poll.revents & (libc::POLLERR | libc::POLLHUP) == 0
            {}
            drop(socket);
            1
        }
    }
}

/// How a transfer ended.
#[derive(Debug, PartialEq, Eq)]
pub enum TransferEnd {
    /// Every page is in; the daemon and the page server are gone.
    Complete,
    /// The tree must not run on: a corrupt chunk, a dead daemon or page server. The tree is still
    /// held (its userfaultfds are open); the caller kills it, then calls [`LazyTransfer::finish`].
    Failed(String),
    /// The tree's init exited (the sandbox was killed) before the transfer ended.
    InitGone,
}

/// The daemon and page server of one lazy restore.
#[derive(Debug)]
pub struct LazyTransfer {
    daemon: Child,
    server: Child,
    report: BufReader<File>,
    /// The directory the daemon and CRIU met in and the images it serves (links to the checkpoint's
    /// files); both removed by [`LazyTransfer::finish`].
    dir: PathBuf,
    images: PathBuf,
    log: PathBuf,
}

impl LazyTransfer {
    /// Starts the page server (`server` is the `warren-supervisor serve-pages` command, to which the
    /// socket and report fds are appended) and the daemon, and waits until both are ready for
    /// `criu restore --lazy-pages --work-dir <returned dir>`.
    pub fn start(
        criu: &Path,
        server: Command,
        checkpoint: &Path,
        images: &Path,
        work_dir: &Path,
    ) -> Result<Self, CheckpointError> {
        Self::start_within(criu, server, checkpoint, images, work_dir, READY_LIMIT)
    }

    /// [`LazyTransfer::start`], with `ready_limit` for each of the two to say it is ready.
    fn start_within(
        criu: &Path,
        mut server: Command,
        checkpoint: &Path,
        images: &Path,
        work_dir: &Path,
        ready_limit: Duration,
    ) -> Result<Self, CheckpointError> {
        let dir = work_dir.join(LAZY_DIR);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        let (ours, theirs) = UnixStream::pair().map_err(io_err("page-server socket pair"))?;
        let (report_read, report_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| io_err("report pipe")(std::io::Error::from_raw_os_error(e as i32)))?;
        let server_socket: OwnedFd = ours.into();
        let (socket_raw, report_raw) = (server_socket.as_raw_fd(), report_write.as_raw_fd());
        server
            .arg(checkpoint)
            .arg(images)
            .arg(socket_raw.to_string())
            .arg(report_raw.to_string())
            .stdin(Stdio::null());
        // SAFETY: only fcntl(2), async-signal-safe, on fds open in the child.
        unsafe {
            server.pre_exec(move || {
                for fd in [socket_raw, report_raw] {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut server_child = server.spawn().map_err(io_err("start the page server"))?;
        drop(server_socket);
        drop(report_write);
        let stop_server = |child: &mut Child| {
            let _ = child.kill();
            let _ = child.wait();
        };
        let mut report = BufReader::new(File::from(report_read));
        let mut line = String::new();
        if readable_within(report.get_ref().as_raw_fd(), ready_limit) {
            let _ = report.read_line(&mut line);
        } else {
            line = format!("no answer within {ready_limit:?}");
        }
        if line.trim_end() != "ready" {
            stop_server(&mut server_child);
            return Err(CheckpointError::Invalid(format!(
                "page server did not start: {}",
                line.trim()
            )));
        }
        let log = dir.join("lazy-pages.log");
        let pair = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
            .and_then(|(read, write)| Ok((read, above_fixed_fds(write)?)))
            .and_then(|(read, write)| Ok((read, write, above_fixed_fds(theirs.into())?)));
        let (status_read, status_write, daemon_socket) = match pair {
            Ok(fds) => fds,
            Err(e) => {
                stop_server(&mut server_child);
                return Err(io_err("status pipe")(e));
            }
        };
        let (sock, status) = (daemon_socket.as_raw_fd(), status_write.as_raw_fd());
        let mut daemon = Command::new(criu);
        daemon
            .arg("lazy-pages")
            .arg("--images-dir")
            .arg(images)
            .arg("--work-dir")
            .arg(&dir)
            .arg("--log-file")
            .arg(&log)
            // Errors only: the page server's socket is a unix one, and CRIU warns on every request
            // that TCP options do not apply to it.
            .arg("-v1")
            .arg("--page-server")
            .args(["--ps-socket", &DAEMON_SOCKET_FD.to_string()])
            .args(["--status-fd", &DAEMON_STATUS_FD.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: dup2 and fcntl only, async-signal-safe, on fds open in the child.
        unsafe {
            daemon.pre_exec(move || {
                for (from, to) in [(sock, DAEMON_SOCKET_FD), (status, DAEMON_STATUS_FD)] {
                    if libc::dup2(from, to) < 0 || libc::fcntl(to, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let daemon_child = match daemon.spawn() {
            Ok(child) => child,
            Err(e) => {
                stop_server(&mut server_child);
                return Err(io_err("start criu lazy-pages")(e));
            }
        };
        drop(daemon_socket);
        drop(status_write);
        let mut transfer = Self {
            daemon: daemon_child,
            server: server_child,
            report,
            dir,
            images: images.to_path_buf(),
            log,
        };
        let mut ready = [0u8; 1];
        let mut status = File::from(status_read);
        if !readable_within(status.as_raw_fd(), ready_limit) {
            transfer.kill();
            return Err(CheckpointError::Criu {
                action: "lazy-pages",
                message: format!(
                    "the daemon did not get ready within {ready_limit:?}: {}",
                    super::criu::log_errors(&transfer.log)
                ),
            });
        }
        if status.read_exact(&mut ready).is_err() {
            let said = super::criu::log_errors(&transfer.log);
            transfer.kill();
            return Err(CheckpointError::Criu {
                action: "lazy-pages",
                message: said,
            });
        }
        Ok(transfer)
    }

    /// Where `criu restore --lazy-pages` must run (`--work-dir`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn daemon_pid(&self) -> u32 {
        self.daemon.id()
    }

    pub fn server_pid(&self) -> u32 {
        self.server.id()
    }

    /// Waits until the transfer ends, the page server reports a failure, or the process `init_pidfd`
    /// refers to exits.
    pub fn watch(&mut self, init_pidfd: RawFd) -> TransferEnd {
        let started = std::time::Instant::now();
        // SAFETY: pidfd_open takes a pid and flags; returns a new fd or -1.
        let daemon_fd =
            unsafe { libc::syscall(libc::SYS_pidfd_open, self.daemon.id() as libc::pid_t, 0) };
        if daemon_fd < 0 {
            return TransferEnd::Failed("pidfd of the lazy-pages daemon".into());
        }
        // SAFETY: a new descriptor that nothing else owns.
        let daemon_fd = unsafe { OwnedFd::from_raw_fd(daemon_fd as RawFd) };
        let mut report_open = true;
        loop {
            if started.elapsed() > TRANSFER_LIMIT {
                return TransferEnd::Failed(format!(
                    "the pages did not all arrive within {TRANSFER_LIMIT:?} (daemon: {})",
                    super::criu::log_errors(&self.log)
                ));
            }
            let mut fds = [
                libc::pollfd {
                    fd: init_pidfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: daemon_fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: if report_open {
                        self.report.get_ref().as_raw_fd()
                    } else {
                        -1
                    },
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: three valid pollfds on the stack.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), 3, 1000) };
            if ready <= 0 {
                continue;
            }
            if fds[0].revents != 0 {
                // A tree that ended because its daemon died (it may have run on zero pages and
                // crashed) ended for that reason.
                return match self.daemon.try_wait() {
                    Ok(Some(status)) if !status.success() => TransferEnd::Failed(format!(
                        "criu lazy-pages {status}: {}",
                        super::criu::log_errors(&self.log)
                    )),
                    _ => TransferEnd::InitGone,
                };
            }
            if fds[2].revents != 0 {
                let mut line = String::new();
                match self.report.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        // The page server is gone; unless it said `done` first, that is a failure.
                        return TransferEnd::Failed("the page server died".into());
                    }
                    Ok(_) => {
                        if let Some(why) = line.trim_end().strip_prefix("failed ") {
                            return TransferEnd::Failed(why.to_string());
                        }
                        if line.trim_end() == "done" {
                            report_open = false;
                        }
                    }
                }
            }
            if fds[1].revents != 0 {
                return match self.daemon.wait() {
                    Ok(status) if status.success() => {
                        // It closed the page server on the way out; the server said or says `done`.
                        let _ = self.server.wait();
                        TransferEnd::Complete
                    }
                    Ok(status) => TransferEnd::Failed(format!(
                        "criu lazy-pages {status}: {}",
                        super::criu::log_errors(&self.log)
                    )),
                    Err(e) => TransferEnd::Failed(format!("wait for criu lazy-pages: {e}")),
                };
            }
        }
    }

    fn kill(&mut self) {
        for child in [&mut self.daemon, &mut self.server] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Ends the daemon and the page server (if still there) and removes the meeting directory. After a failure call it only once the tree is dead.
    pub fn finish(mut self) {
        self.kill();
        // The daemon's log stays beside CRIU's restore.log.
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::rename(&self.log, parent.join("lazy-pages.log"));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.images);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::manifest::{StoredFile, FORMAT};
    use crate::checkpoint::page_chunks;
    use crate::checkpoint::pagemap::{tests::image, PE_LAZY, PE_PRESENT};

    fn stored(name: &str, path: &str) -> StoredFile {
        StoredFile {
            path: path.into(),
            name: name.into(),
            stored_bytes: 0,
            raw_bytes: 0,
            zstd: false,
            sha256: "00".into(),
            chunks: None,
        }
    }

    /// A script at `path` that records its PID in `pid_file` and then runs `rest`.
    fn script(path: &Path, pid_file: &Path, rest: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(
            path,
            format!("#!/bin/sh\necho $$ > {}\n{rest}\n", pid_file.display()),
        )
        .unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn gone(pid_file: &Path) -> bool {
        let pid = std::fs::read_to_string(pid_file).unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
        // Killed and reaped: no such process any more (or, at worst, a zombie not yet reaped).
        stat.map_or(true, |s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    }

    /// The daemon or the page server stuck before it says it is ready (seen: a `criu lazy-pages`
    /// asleep for minutes after the child of its start-up probe was killed) must fail the restore in
    /// bounded time, and neither process may outlive it.
    #[test]
    fn a_daemon_or_page_server_that_never_gets_ready_fails_the_start_and_is_killed() {
        let dir = std::env::temp_dir().join(format!("wt-lazy-stuck-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (server_pid, daemon_pid) = (dir.join("server.pid"), dir.join("daemon.pid"));
        let (server, daemon) = (dir.join("server.sh"), dir.join("criu.sh"));
        let limit = Duration::from_millis(300);
        let start = |server: &Path| {
            let began = std::time::Instant::now();
            let result =
                LazyTransfer::start_within(&daemon, Command::new(server), &dir, &dir, &dir, limit);
            (result, began.elapsed())
        };

        // A page server that is ready, beside a daemon that never is.
        script(&server, &server_pid, "echo ready >&\"$4\"; exec sleep 600");
        script(&daemon, &daemon_pid, "exec sleep 600");
        let (result, took) = start(&server);
        let error = result.unwrap_err().to_string();
        assert!(error.contains("lazy-pages"), "{error}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(
            gone(&server_pid) && gone(&daemon_pid),
            "a process outlived the failed start"
        );

        // A page server that never says it is ready: the daemon is never started.
        std::fs::remove_file(&daemon_pid).unwrap();
        script(&server, &server_pid, "exec sleep 600");
        let (result, took) = start(&server);
        let error = result.unwrap_err().to_string();
        assert!(error.contains("page server did not start"), "{error}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(
            gone(&server_pid),
            "the page server outlived the failed start"
        );
        assert!(!daemon_pid.exists(), "the daemon was started after all");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_page_server_answers_checked_pages_and_refuses_damaged_ones() {
        let dir = std::env::temp_dir().join(format!("wt-lazy-serve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (ckpt, scratch) = (dir.join("ckpt"), dir.join("scratch"));
        std::fs::create_dir_all(ckpt.join("images")).unwrap();
        std::fs::create_dir_all(&scratch).unwrap();
        // Task 1: 2 eager pages, then 128 lazy ones (two chunks' worth).
        let pagemap = image(
            1,
            &[
                (0x10000, 2, PE_PRESENT),
                (0x100000, 128, PE_PRESENT | PE_LAZY),
            ],
        );
        std::fs::write(scratch.join("pagemap-1.img"), &pagemap).unwrap();
        // Noise (stored raw, so a stored offset is a raw one), each page starting with its number.
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut pages: Vec<u8> = (0..130u64 * 4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        for page in 0..130 {
            pages[page * 4096] = page as u8;
        }
        let raw = dir.join("pages-1.img");
        std::fs::write(&raw, &pages).unwrap();
        let chunks_path = ckpt.join("images/pages-1.img.chunks");
        let (sums, raw_bytes, stored_bytes) = page_chunks::pack(&raw, &chunks_path).unwrap();
        assert_eq!(stored_bytes, raw_bytes);
        let manifest = Manifest {
            format: FORMAT,
            sandbox_id: "s".into(),
            ip: std::net::Ipv4Addr::LOCALHOST,
            criu_version: "4.1.1".into(),
            created_at_unix: 0,
            layers: Vec::new(),
            images: vec![
                stored("pagemap-1.img", "images/pagemap-1.img"),
                StoredFile {
                    raw_bytes,
                    stored_bytes,
                    sha256: String::new(),
                    chunks: Some(sums),
                    ..stored("pages-1.img", "images/pages-1.img.chunks")
                },
            ],
            layer: stored("layer.tar", "layer.tar.zst"),
            memory: true,
        };
        let sparse = || {
            File::create(scratch.join("pages-1.img"))
                .unwrap()
                .set_len(raw_bytes)
                .unwrap()
        };
        sparse();
        expand_eager_pages(&ckpt, &manifest, &scratch).unwrap();
        let laid_out = std::fs::read(scratch.join("pages-1.img")).unwrap();
        assert_eq!(laid_out[..8192], pages[..8192], "the eager pages are there");
        let mut source = PageSource::open(&ckpt, &manifest, &scratch).unwrap();

        let (mut daemon, mut server) = UnixStream::pair().unwrap();
        let ask = |daemon: &mut UnixStream, vaddr: u64, nr: u32| {
            daemon.write_all(&header(PS_IOV_GET, nr, vaddr, 1)).unwrap();
        };
        ask(&mut daemon, 0x101000, 2);
        ask(&mut daemon, 0x100000 + 127 * 4096, 5);
        daemon.write_all(&header(PS_IOV_CLOSE, 0, 0, 0)).unwrap();
        answer(&mut server, &mut source).unwrap();
        let mut reply = [0u8; 24];
        daemon.read_exact(&mut reply).unwrap();
        assert_eq!(u32::from_ne_bytes(reply[4..8].try_into().unwrap()), 2);
        let mut two = vec![0u8; 2 * 4096];
        daemon.read_exact(&mut two).unwrap();
        assert_eq!(
            two[..],
            pages[3 * 4096..5 * 4096],
            "pages 1-2 of the lazy run are 3-4 of the file"
        );
        daemon.read_exact(&mut reply).unwrap();
        assert_eq!(
            u32::from_ne_bytes(reply[4..8].try_into().unwrap()),
            1,
            "cut at the run's end"
        );
        let mut one = vec![0u8; 4096];
        daemon.read_exact(&mut one).unwrap();
        assert_eq!(one[0], 129);
        let mut status = [0u8; 4];
        daemon.read_exact(&mut status).unwrap();
        assert_eq!(i32::from_ne_bytes(status), 0);

        // A damaged lazy chunk: laying out the eager pages works, serving it fails.
        let mut damaged = pages.clone();
        damaged[100 * 4096 + 5] ^= 0xff;
        std::fs::write(&chunks_path, &damaged).unwrap();
        sparse();
        expand_eager_pages(&ckpt, &manifest, &scratch).unwrap();
        let mut source = PageSource::open(&ckpt, &manifest, &scratch).unwrap();
        ask(&mut daemon, 0x100000 + 98 * 4096, 1);
        let err = answer(&mut server, &mut source).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Corrupt(m) if m.contains("chunk 1")),
            "{err}"
        );
        // A damaged eager page is caught before the restore.
        damaged[4096 + 5] ^= 0xff;
        std::fs::write(&chunks_path, &damaged).unwrap();
        assert!(matches!(
            expand_eager_pages(&ckpt, &manifest, &scratch),
            Err(CheckpointError::Corrupt(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
