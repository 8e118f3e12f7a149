//! Acting as a sandbox user. Commands get the user's uid, gid and groups at exec (see
//! `process::spawn`). File operations run on a blocking thread that switches its own filesystem
//! uid/gid and groups for the duration of the call, so the kernel applies the user's
//! permissions (`EACCES` for `/etc/shadow`) and new files are owned by the user. Both are Linux
//! per-thread credentials (raw syscalls, not glibc's process-wide `setgroups`).

use crate::users::User;

/// Credentials of a sandbox user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl From<&User> for Identity {
    fn from(u: &User) -> Self {
        Identity {
            uid: u.uid,
            gid: u.gid,
            groups: u.groups.clone(),
        }
    }
}

/// Whether this agent may switch identities (it runs as root).
pub fn can_switch() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs `f` on the current (blocking) thread with `id`'s filesystem credentials; without root
/// it runs as the agent's own user. Credentials are restored before returning, even on panic.
pub fn with_fs_identity<T>(id: &Identity, f: impl FnOnce() -> T) -> T {
    if !can_switch() || id.uid == 0 {
        return f();
    }
    let _guard = FsIdentityGuard::enter(id);
    f()
}

struct FsIdentityGuard;

impl FsIdentityGuard {
    fn enter(id: &Identity) -> Self {
        // SAFETY: setgroups/setfsgid/setfsuid as raw syscalls change only this thread's
        // credentials; the slice outlives the call. Failures leave the thread as root, which
        // the kernel then checks as root: acceptable only because callers never get here
        // without being root already, and the calls do not fail for root with valid ids.
        unsafe {
            libc::syscall(
                libc::SYS_setgroups,
                id.groups.len() as libc::size_t,
                id.groups.as_ptr(),
            );
            libc::syscall(libc::SYS_setfsgid, id.gid);
            libc::syscall(libc::SYS_setfsuid, id.uid);
        }
        FsIdentityGuard
    }
}

impl Drop for FsIdentityGuard {
    fn drop(&mut self) {
        let none: [libc::gid_t; 0] = [];
        // SAFETY: as above; restores root's filesystem ids (which also restores the
        // filesystem capabilities the kernel dropped) and an empty group list.
        unsafe {
            libc::syscall(libc::SYS_setfsuid, 0u32);
            libc::syscall(libc::SYS_setfsgid, 0u32);
            libc::syscall(libc::SYS_setgroups, 0 as libc::size_t, none.as_ptr());
        }
    }
}

/// Runs `f` with `id`'s filesystem credentials on tokio's blocking pool.
pub async fn blocking_as<T: Send + 'static>(
    id: Identity,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || with_fs_identity(&id, f)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn files_created_under_an_identity_belong_to_it() {
        if !can_switch() {
            println!("SKIP: needs root to switch filesystem identity");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "x").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let id = Identity {
            uid: 1234,
            gid: 1234,
            groups: vec![1234],
        };
        let created = dir.path().join("mine");
        let (write, read) = with_fs_identity(&id, || {
            (
                std::fs::write(&created, "y"),
                std::fs::read(&secret).map(|_| ()),
            )
        });
        write.unwrap();
        assert_eq!(
            read.unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
        let meta = std::fs::metadata(&created).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1234, 1234));
        // Back to root afterwards.
        std::fs::read(&secret).unwrap();
    }
}
