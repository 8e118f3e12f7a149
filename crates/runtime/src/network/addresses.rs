//! Sandbox addresses from the bridge's subnet, leased under `state_dir/network/leases/<ip>` (the file
//! holds the sandbox ID). Leases are files so they survive restarts; one flock serialises allocations.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    #[error("no free address left in {0}")]
    Exhausted(String),
    #[error("address lease store {path}")]
    Store {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The lease store of one subnet.
#[derive(Debug, Clone)]
pub struct AddressPool {
    dir: PathBuf,
    gateway: Ipv4Addr,
    prefix: u8,
}

impl AddressPool {
    pub fn new(state_dir: &Path, gateway: Ipv4Addr, prefix: u8) -> Self {
        Self {
            dir: state_dir.join("network").join("leases"),
            gateway,
            prefix,
        }
    }

    fn store_err(&self) -> impl FnOnce(std::io::Error) -> AddressError + '_ {
        move |source| AddressError::Store {
            path: self.dir.clone(),
            source,
        }
    }

    fn range(&self) -> (u32, u32) {
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        };
        let network = u32::from(self.gateway) & mask;
        let broadcast = network | !mask;
        (network + 1, broadcast - 1)
    }

    /// Leases the lowest free address to `sandbox_id`.
    pub fn allocate(&self, sandbox_id: &str) -> Result<Ipv4Addr, AddressError> {
        std::fs::create_dir_all(&self.dir).map_err(self.store_err())?;
        let lock = std::fs::File::create(self.dir.join(".lock")).map_err(self.store_err())?;
        // SAFETY: flock on an fd we own; released when `lock` is closed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(self.store_err()(std::io::Error::last_os_error()));
        }
        let mut taken: Vec<u32> = std::fs::read_dir(&self.dir)
            .map_err(self.store_err())?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .collect();
        taken.sort_unstable();
        let (first, last) = self.range();
        let gateway = u32::from(self.gateway);
        let candidate =
            (first..=last).find(|ip| *ip != gateway && taken.binary_search(ip).is_err());
        let Some(ip) = candidate.map(Ipv4Addr::from) else {
            return Err(AddressError::Exhausted(format!(
                "{}/{}",
                self.gateway, self.prefix
            )));
        };
        let mut lease = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.dir.join(ip.to_string()))
            .map_err(self.store_err())?;
        lease
            .write_all(sandbox_id.as_bytes())
            .map_err(self.store_err())?;
        Ok(ip)
    }

    /// Releases `ip` if it is leased to `sandbox_id`.
    pub fn release(&self, ip: Ipv4Addr, sandbox_id: &str) -> Result<(), AddressError> {
        let path = self.dir.join(ip.to_string());
        match std::fs::read_to_string(&path) {
            Ok(owner) if owner == sandbox_id => {
                std::fs::remove_file(&path).map_err(self.store_err())
            }
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.store_err()(e)),
        }
    }

    /// Leases held by `sandbox_id` (normally one).
    pub fn leases_of(&self, sandbox_id: &str) -> Vec<Ipv4Addr> {
        std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|owner| owner == sandbox_id))
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_lowest_free_and_releases() {
        let dir = std::env::temp_dir().join(format!("wt-leases-{}", std::process::id()));
        let pool = AddressPool::new(&dir, Ipv4Addr::new(10, 77, 0, 1), 16);
        let a = pool.allocate("a").unwrap();
        let b = pool.allocate("b").unwrap();
        assert_eq!(a, Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(b, Ipv4Addr::new(10, 77, 0, 3));
        pool.release(a, "not-a").unwrap();
        assert_eq!(pool.leases_of("a"), vec![a]);
        pool.release(a, "a").unwrap();
        assert_eq!(pool.allocate("c").unwrap(), a);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn small_subnet_runs_out() {
        let dir = std::env::temp_dir().join(format!("wt-leases-small-{}", std::process::id()));
        let pool = AddressPool::new(&dir, Ipv4Addr::new(10, 78, 0, 1), 30);
        assert_eq!(pool.allocate("a").unwrap(), Ipv4Addr::new(10, 78, 0, 2));
        assert!(matches!(
            pool.allocate("b"),
            Err(AddressError::Exhausted(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
