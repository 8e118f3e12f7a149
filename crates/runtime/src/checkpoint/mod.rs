//! Checkpoint and restore of whole sandboxes with CRIU: the process tree (memory, files, sockets,
//! PTYs, pipes, timers) plus the writable layer, into a self-checking directory; restore into fresh
//! namespaces. The runtime supplies what a sandbox is made of ([`DumpTarget`], [`RestoreTarget`]); this
//! module owns the order of operations and the faults:
//!
//! - dump: freeze → `criu dump` (leaves the tree frozen) → archive the layer → checksum → rename into
//!   place. Any failure thaws the sandbox (unless it was frozen before) and leaves no directory: the
//!   sandbox runs on as it was.
//! - restore: verify the layer's checksum → unpack it into the new upper dir → lay the images out for
//!   CRIU (hard links; format-1 zstd images decompressed and verified) → CRIU restores. Memory pages
//!   are checked per chunk: with a page server ([`RestoreTarget::page_server`]) the restore is lazy
//!   (see [`lazy_pages`]) and only the pages CRIU reads itself are checked before it starts; without
//!   one every chunk is checked first, in parallel. The checkpoint is only ever read, so a failed
//!   restore leaves it intact for another try.
//!
//! docs/checkpoints.md records which CRIU options this takes on this kind of host and why.

mod address_move;
pub mod criu;
pub mod freezer;
pub mod lazy_pages;
pub mod manifest;
pub mod page_chunks;
pub mod pagemap;
pub mod store;

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use criu::Criu;
pub use freezer::FreezerCgroup;
pub use lazy_pages::{LazyTransfer, TransferEnd};
pub use manifest::Manifest;

use crate::CheckpointInfo;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoints are not available on this host: {0}")]
    CriuUnavailable(String),
    #[error("criu {action} failed: {message}")]
    Criu {
        action: &'static str,
        message: String,
    },
    #[error("checkpoint is corrupt: {0}")]
    Corrupt(String),
    #[error("writable layer: {0}")]
    Layer(String),
    #[error("network of the restored sandbox: {0}")]
    Network(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// A running sandbox, as the dump needs it.
#[derive(Debug, Clone)]
pub struct DumpTarget<'a> {
    pub sandbox_id: &'a str,
    pub ip: Ipv4Addr,
    /// Host PID of the sandbox's PID 1 (a session leader).
    pub init_pid: u32,
    pub freezer: FreezerCgroup,
    /// The overlay upper dir (the writable layer).
    pub upper: &'a Path,
    /// The read-only layers below it, top-most first; a restore must use the same ones.
    pub layers: &'a [PathBuf],
    /// Where volumes are mounted inside the sandbox, in spec order: declared external to CRIU, so
    /// their contents stay out of the checkpoint.
    pub volume_targets: &'a [PathBuf],
}

/// A new sandbox whose resources exist but whose processes do not yet.
#[derive(Debug, Clone)]
pub struct RestoreTarget<'a> {
    /// The new sandbox's address (equal to the checkpoint's for resume, another one for fork).
    pub ip: Ipv4Addr,
    /// Empty directory the overlay is mounted on, inside CRIU's private mount namespace.
    pub rootfs: &'a Path,
    /// The overlay whose upper dir holds the checkpoint's layer (see [`prepare_layer`]).
    pub overlay: &'a crate::rootfs::sandbox_mounts::OverlayPlan,
    pub agent_binary: &'a Path,
    /// Pin file of the new network namespace, already wired (veth, address, routes).
    pub netns_pin: &'a Path,
    /// `cgroup.procs` files of the new sandbox's cgroups.
    pub cgroup_procs: &'a [PathBuf],
    /// Scratch space for this restore (decompressed images, CRIU's log, pidfile).
    pub work_dir: &'a Path,
    /// Unpacked-images cache to restore through (see [`store::unpack_images_cached`]).
    pub image_cache: Option<&'a Path>,
    /// The host's lxcfs mount (see [`crate::rootfs::lxcfs`]).
    pub lxcfs: Option<&'a Path>,
    /// Volumes to bind again where the checkpoint had them (never part of the checkpoint).
    pub volumes: &'a [crate::rootfs::volume_disk::VolumeBind],
    /// Restore lazily (when the checkpoint's format allows it), with this `warren-supervisor` binary
    /// serving the pages; `None` restores every page before the tree runs.
    pub page_server: Option<&'a Path>,
}

/// Timings of one dump, for logs and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DumpTimings {
    /// The sandbox was frozen (not running) this long.
    pub frozen: Duration,
    pub criu: Duration,
    pub total: Duration,
}

/// What a dump produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Dumped {
    pub info: CheckpointInfo,
    pub timings: DumpTimings,
}

/// What a restore produced.
#[derive(Debug)]
pub struct Restored {
    /// Host PID of the restored PID 1.
    pub init_pid: u32,
    pub manifest: Manifest,
    /// Verifying and unpacking the images into the scratch directory.
    pub unpack: Duration,
    pub criu: Duration,
    pub total: Duration,
    /// The memory still on its way (a lazy restore): the caller must see it through
    /// ([`LazyTransfer::watch`]) and end it ([`LazyTransfer::finish`]).
    pub transfer: Option<LazyTransfer>,
}

/// CRIU as found on this host at start-up (or why not).
#[derive(Debug, Clone)]
pub struct Checkpointer {
    criu: Result<Criu, String>,
}

impl Checkpointer {
    /// Looks for a working CRIU; never fails (capabilities report the outcome).
    pub fn probe() -> Self {
        Self {
            criu: Criu::probe().map_err(|e| e.to_string()),
        }
    }

    pub fn with_criu(criu: Criu) -> Self {
        Self { criu: Ok(criu) }
    }

    /// The CRIU found at start-up, if any.
    pub fn criu_found(&self) -> Option<&Criu> {
        self.criu.as_ref().ok()
    }

    pub fn available(&self) -> bool {
        self.criu.is_ok()
    }

    /// Why checkpoints cannot be taken, when they cannot.
    pub fn unavailable_reason(&self) -> Option<&str> {
        self.criu.as_ref().err().map(String::as_str)
    }

    fn criu(&self) -> Result<&Criu, CheckpointError> {
        self.criu
            .as_ref()
            .map_err(|why| CheckpointError::CriuUnavailable(why.clone()))
    }

    /// Dumps the sandbox into `dest` (which must not exist). With `leave_running` the sandbox is thawed
    /// afterwards (fork, template); without, it stays frozen for the caller to destroy (pause). On error
    /// the sandbox is as it was before the call and `dest` does not exist.
    pub fn dump(
        &self,
        target: &DumpTarget<'_>,
        dest: &Path,
        leave_running: bool,
    ) -> Result<Dumped, CheckpointError> {
        let criu = self.criu()?;
        let started = Instant::now();
        let atomic = store::AtomicDir::create(dest)?;
        let images = atomic.path().join(store::IMAGES_DIR);
        std::fs::create_dir(&images).map_err(|source| CheckpointError::Io {
            context: format!("create {}", images.display()),
            source,
        })?;
        let was_frozen = target.freezer.is_frozen()?;
        if !was_frozen {
            target.freezer.freeze()?;
        }
        let mut frozen_at = Instant::now();
        let mut criu_started = Instant::now();
        let mut attempt = 1;
        let outcome = loop {
            let dumped = criu.dump(&criu::DumpArgs {
                init_pid: target.init_pid,
                freezer_cgroup: target.freezer.dir(),
                volume_targets: target.volume_targets,
                images: &images,
                log: &atomic.path().join("dump.log"),
            });
            match dumped {
                // A task frozen in the middle of vfork (its child frozen before exec) cannot be seized;
                // letting the sandbox run a moment lets the exec finish. Only when we froze it.
                Err(e) if !was_frozen && attempt < DUMP_ATTEMPTS && is_unseizable(&e) => {
                    tracing::info!(sandbox = %target.sandbox_id, attempt, error = %e, "dump retried");
                    target.freezer.thaw()?;
                    remove_if_present(&images)?;
                    std::fs::create_dir(&images).map_err(|source| CheckpointError::Io {
                        context: format!("create {}", images.display()),
                        source,
                    })?;
                    std::thread::sleep(Duration::from_millis(20 * attempt as u64));
                    target.freezer.freeze()?;
                    frozen_at = Instant::now();
                    criu_started = Instant::now();
                    attempt += 1;
                }
                other => break other,
            }
        };
        let outcome = outcome
            .map(|()| criu_started.elapsed())
            .and_then(|criu_time| {
                store::archive_layer(target.upper, atomic.path()).map(|layer| (criu_time, layer))
            });
        // The processes are stopped and the layer is saved: let them run while the images are packed.
        let keep_frozen = !leave_running && outcome.is_ok();
        let mut frozen = frozen_at.elapsed();
        if !was_frozen && !keep_frozen {
            target.freezer.thaw()?;
            frozen = frozen_at.elapsed();
        }
        let (criu_time, layer) = outcome?;
        let finish = || -> Result<Dumped, CheckpointError> {
            let images = store::pack_images(atomic.path())?;
            let manifest = Manifest {
                format: manifest::FORMAT,
                sandbox_id: target.sandbox_id.to_string(),
                ip: target.ip,
                criu_version: criu.version().to_string(),
                created_at_unix: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                layers: target.layers.to_vec(),
                images,
                layer,
                memory: true,
            };
            write_file(
                &atomic.path().join(manifest::MANIFEST_FILE),
                &manifest.to_json()?,
            )?;
            let size_bytes = manifest.stored_bytes();
            Ok(Dumped {
                info: CheckpointInfo {
                    dir: dest.to_path_buf(),
                    size_bytes,
                },
                timings: DumpTimings {
                    frozen,
                    criu: criu_time,
                    total: Duration::ZERO,
                },
            })
        };
        let mut dumped = match finish() {
            Ok(dumped) => dumped,
            Err(e) => {
                if keep_frozen && !was_frozen {
                    target.freezer.thaw()?;
                }
                return Err(e);
            }
        };
        if let Err(e) = atomic.commit() {
            if keep_frozen && !was_frozen {
                target.freezer.thaw()?;
            }
            return Err(e);
        }
        dumped.timings.total = started.elapsed();
        if keep_frozen {
            dumped.timings.frozen = frozen_at.elapsed();
        }
        Ok(dumped)
    }

    /// Restores `checkpoint` into the prepared `target` whose empty upper dir is `upper`:
    /// [`prepare_layer`] then [`Checkpointer::restore_processes`]. The checkpoint is only read.
    pub fn restore(
        &self,
        checkpoint: &Path,
        upper: &Path,
        target: &RestoreTarget<'_>,
    ) -> Result<Restored, CheckpointError> {
        let started = Instant::now();
        let manifest = prepare_layer(checkpoint, upper)?;
        let mut restored = self.restore_processes(checkpoint, &manifest, target)?;
        restored.total = started.elapsed();
        Ok(restored)
    }

    /// Restores the process tree of `checkpoint` (whose layer is already unpacked): verifies
    /// and unpacks the images, keeps the old address usable if the sandbox has a new one, runs CRIU.
    /// The restored init is reparented to the caller's nearest child subreaper when CRIU exits.
    pub fn restore_processes(
        &self,
        checkpoint: &Path,
        manifest: &Manifest,
        target: &RestoreTarget<'_>,
    ) -> Result<Restored, CheckpointError> {
        if !manifest.memory {
            return Err(CheckpointError::Invalid(format!(
                "{} holds the filesystem only (no processes to restore); boot it from disk instead",
                checkpoint.display()
            )));
        }
        let criu = self.criu()?;
        let started = Instant::now();
        let images = target.work_dir.join(store::IMAGES_DIR);
        remove_if_present(&images)?;
        let lazy = target.page_server.is_some() && lazy_pages::worth_serving(manifest);
        match target.image_cache {
            // A lazy restore reads the checkpoint's own page files: nothing to cache.
            Some(cache) if !lazy => {
                store::unpack_images_cached(checkpoint, &manifest.images, &images, cache)?
            }
            _ => store::unpack_images(checkpoint, &manifest.images, &images)?,
        }
        let mut transfer = match target.page_server {
            Some(binary) if lazy => {
                lazy_pages::expand_eager_pages(checkpoint, manifest, &images)?;
                let mut server = std::process::Command::new(binary);
                server.arg("serve-pages");
                Some(LazyTransfer::start(
                    criu.binary(),
                    server,
                    checkpoint,
                    &images,
                    target.work_dir,
                )?)
            }
            // The cached unpack has expanded the pages already.
            _ if target.image_cache.is_some() => None,
            _ => {
                store::expand_chunked(checkpoint, &manifest.images, &images)?;
                None
            }
        };
        let unpacked = started.elapsed();
        let prepared = (|| {
            if manifest.ip != target.ip {
                address_move::keep_old_address(target.netns_pin, manifest.ip)?;
            }
            let netns: OwnedFd = std::fs::File::open(target.netns_pin)
                .map_err(|source| CheckpointError::Io {
                    context: format!("open {}", target.netns_pin.display()),
                    source,
                })?
                .into();
            let pidfile = target.work_dir.join("restore.pid");
            remove_if_present(&pidfile)?;
            Ok::<_, CheckpointError>((netns, pidfile))
        })();
        let (netns, pidfile) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                if let Some(transfer) = transfer.take() {
                    transfer.finish();
                }
                return Err(e);
            }
        };
        let criu_started = Instant::now();
        let restored = criu.restore(&criu::RestoreArgs {
            images: &images,
            log: &target.work_dir.join("restore.log"),
            pidfile: &pidfile,
            rootfs: target.rootfs,
            overlay: target.overlay,
            agent_binary: target.agent_binary,
            netns: &netns,
            cgroup_procs: target.cgroup_procs,
            lxcfs: target.lxcfs,
            volumes: target.volumes,
            lazy_dir: transfer.as_ref().map(LazyTransfer::dir),
        });
        let criu_time = criu_started.elapsed();
        let init_pid = match (restored, transfer.as_ref()) {
            (Ok(pid), Some(_)) => pid,
            (Ok(pid), None) => {
                // The images are links or decompressed copies; the checkpoint keeps the originals.
                let _ = std::fs::remove_dir_all(&images);
                pid
            }
            (Err(e), _) => {
                if let Some(transfer) = transfer.take() {
                    transfer.finish();
                }
                let _ = std::fs::remove_dir_all(&images);
                return Err(e);
            }
        };
        Ok(Restored {
            init_pid,
            manifest: manifest.clone(),
            unpack: unpacked,
            criu: criu_time,
            total: started.elapsed(),
            transfer,
        })
    }
}

/// Saves the writable layer of the sandbox into `dest` (which must not exist) as a filesystem-only
/// checkpoint: no processes, so no CRIU. The sandbox is frozen while its layer is archived, so the
/// archive is one moment of its disk; with `leave_running` it is thawed afterwards (unless it was
/// frozen before), without it stays frozen for the caller to destroy. On error the sandbox is as it
/// was and `dest` does not exist.
pub fn dump_disk(
    target: &DumpTarget<'_>,
    dest: &Path,
    leave_running: bool,
) -> Result<Dumped, CheckpointError> {
    let started = Instant::now();
    let atomic = store::AtomicDir::create(dest)?;
    let was_frozen = target.freezer.is_frozen()?;
    if !was_frozen {
        target.freezer.freeze()?;
    }
    let frozen_at = Instant::now();
    let finish = || -> Result<Dumped, CheckpointError> {
        let layer = store::archive_layer(target.upper, atomic.path())?;
        let manifest = Manifest {
            format: manifest::FORMAT,
            sandbox_id: target.sandbox_id.to_string(),
            ip: target.ip,
            criu_version: String::new(),
            created_at_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            layers: target.layers.to_vec(),
            images: Vec::new(),
            layer,
            memory: false,
        };
        write_file(
            &atomic.path().join(manifest::MANIFEST_FILE),
            &manifest.to_json()?,
        )?;
        Ok(Dumped {
            info: CheckpointInfo {
                dir: dest.to_path_buf(),
                size_bytes: manifest.stored_bytes(),
            },
            timings: DumpTimings::default(),
        })
    };
    let outcome = finish().and_then(|dumped| atomic.commit().map(|_| dumped));
    let frozen = frozen_at.elapsed();
    if !was_frozen && (leave_running || outcome.is_err()) {
        target.freezer.thaw()?;
    }
    let mut dumped = outcome?;
    dumped.timings.frozen = frozen;
    dumped.timings.total = started.elapsed();
    Ok(dumped)
}

/// Reads and checks the manifest of `checkpoint` and unpacks its writable layer into the empty dir
/// `upper` (checksum verified first).
pub fn prepare_layer(checkpoint: &Path, upper: &Path) -> Result<Manifest, CheckpointError> {
    let manifest = Manifest::read(checkpoint)?;
    store::extract_layer(checkpoint, &manifest.layer, upper)?;
    Ok(manifest)
}

/// Sets the hostname in the UTS namespace of `pid` (a fork restored under a new sandbox ID).
pub fn set_hostname(pid: u32, hostname: &str) -> Result<(), CheckpointError> {
    let path = format!("/proc/{pid}/ns/uts");
    let ns = std::fs::File::open(&path).map_err(|source| CheckpointError::Io {
        context: format!("open {path}"),
        source,
    })?;
    crate::namespaces::run_in(&ns, nix::sched::CloneFlags::CLONE_NEWUTS, || {
        nix::unistd::sethostname(hostname).map_err(|e| e.to_string())
    })
    .and_then(|set| set)
    .map_err(|e| CheckpointError::Invalid(format!("set hostname of pid {pid}: {e}")))
}

/// How often a dump is tried when CRIU cannot seize a task.
const DUMP_ATTEMPTS: u32 = 4;

/// Whether CRIU failed because a task could not be stopped (a vfork in flight): worth a retry.
pub(crate) fn is_unseizable(error: &CheckpointError) -> bool {
    matches!(error, CheckpointError::Criu { message, .. } if message.contains("Unseizable") || message.contains("Timeout reached"))
}

fn remove_if_present(path: &Path) -> Result<(), CheckpointError> {
    let result = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CheckpointError::Io {
            context: format!("remove {}", path.display()),
            source,
        }),
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    use std::io::Write;
    let mut file = std::fs::File::create(path).map_err(|source| CheckpointError::Io {
        context: format!("create {}", path.display()),
        source,
    })?;
    // Durable with the rest of the checkpoint by AtomicDir::commit's syncfs.
    file.write_all(bytes).map_err(|source| CheckpointError::Io {
        context: format!("write {}", path.display()),
        source,
    })
}
