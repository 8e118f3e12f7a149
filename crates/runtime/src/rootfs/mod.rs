//! The sandbox's root filesystem: overlayfs of the read-only template layers and a size-limited
//! writable layer, the mounts inside the sandbox's mount namespace, pivot_root, and committing the
//! writable layer as a new template layer.

pub mod commit;
pub mod disk_usage;
pub mod layer_disk;
pub mod loop_device;
pub mod lxcfs;
pub mod sandbox_mounts;
pub mod volume_disk;

pub use layer_disk::LayerDisk;
