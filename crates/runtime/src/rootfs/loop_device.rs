//! Attaching an image file to a free loop device (LOOP_CTL_GET_FREE + LOOP_CONFIGURE), with autoclear so
//! the device detaches itself when its last user (the mount) goes away.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no free loop device")]
    NoFreeDevice(#[source] std::io::Error),
    #[error("attach {image} to {device}")]
    Configure {
        image: PathBuf,
        device: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` of <linux/loop.h>.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` of <linux/loop.h>.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A configured loop device. Dropping it closes our handle; with autoclear the kernel detaches the device
/// once nothing else (a mount) holds it.
pub struct LoopDevice {
    pub path: PathBuf,
    _file: File,
}

/// Attaches `image` to a free loop device with autoclear set.
pub fn attach(image: &Path) -> Result<LoopDevice, LoopError> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|source| LoopError::Open {
            path: image.to_path_buf(),
            source,
        })?;
    let control_path = Path::new("/dev/loop-control");
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open(control_path)
        .map_err(|source| LoopError::Open {
            path: control_path.to_path_buf(),
            source,
        })?;
    // Another process can take the device between GET_FREE and CONFIGURE (EBUSY): ask again.
    let mut last_error = std::io::Error::from_raw_os_error(libc::EBUSY);
    for _ in 0..64 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if number < 0 {
            return Err(LoopError::NoFreeDevice(std::io::Error::last_os_error()));
        }
        let device_path = PathBuf::from(format!("/dev/loop{number}"));
        let device = match OpenOptions::new().read(true).write(true).open(&device_path) {
            Ok(device) => device,
            Err(source) => {
                return Err(LoopError::Open {
                    path: device_path,
                    source,
                })
            }
        };
        let mut name = [0u8; 64];
        let image_bytes = image.as_os_str().as_encoded_bytes();
        let len = image_bytes.len().min(63);
        name[..len].copy_from_slice(&image_bytes[..len]);
        let config = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: 0,
                lo_sizelimit: 0,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags: LO_FLAGS_AUTOCLEAR,
                lo_file_name: name,
                lo_crypt_name: [0; 64],
                lo_encrypt_key: [0; 32],
                lo_init: [0; 2],
            },
            reserved: [0; 8],
        };
        // SAFETY: `config` is a fully initialised `struct loop_config` that outlives the call; the kernel
        // only reads it.
        let rc = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                LOOP_CONFIGURE,
                &config as *const LoopConfig,
            )
        };
        if rc == 0 {
            return Ok(LoopDevice {
                path: device_path,
                _file: device,
            });
        }
        last_error = std::io::Error::last_os_error();
        if last_error.raw_os_error() != Some(libc::EBUSY) {
            break;
        }
    }
    Err(LoopError::Configure {
        image: image.to_path_buf(),
        device: PathBuf::from("/dev/loop?"),
        source: last_error,
    })
}

/// Waits (at most `limit`) until no loop device is backed by `image`: autoclear detaches a device
/// when its last user lets go, which may be a sandbox's mount namespace that is still going away
/// after the host's unmount. Whether it is gone.
pub fn wait_detached(image: &Path, limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if devices_backed_under(image).is_empty() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Loop devices whose backing file lies under `dir` (for leak checks and cleanup).
pub fn devices_backed_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let backing =
            std::fs::read_to_string(entry.path().join("loop/backing_file")).unwrap_or_default();
        if Path::new(backing.trim()).starts_with(dir) {
            found.push(PathBuf::from(format!("/dev/{name}")));
        }
    }
    found
}
