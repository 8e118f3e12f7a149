//! Sandbox addresses from the bridge's subnet, leased under `state_dir/network/leases/<ip>` (the file
//! holds the sandbox ID). Leases are files so they survive restarts; one flock serialises allocations.
//!
//! Several runtimes (each with its own state dir: tests, a second server) may share one bridge, so a
//! lease also takes a host-wide claim, `/run/warren/addresses/<bridge>/<ip>`, created exclusively. /run
//! is emptied at boot, like the veths the claims stand for. A claim whose veth does not exist and that
//! is older than [`STALE_CLAIM`] was left by a runtime that died mid-way and is taken over.

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
    claims: PathBuf,
    gateway: Ipv4Addr,
    prefix: u8,
}

/// Age after which a claim without its veth counts as abandoned.
pub const STALE_CLAIM: std::time::Duration = std::time::Duration::from_secs(300);

impl AddressPool {
    pub fn new(state_dir: &Path, bridge: &str, gateway: Ipv4Addr, prefix: u8) -> Self {
        Self::with_claims(
            state_dir,
            Path::new("/run/warren/addresses").join(bridge),
            gateway,
            prefix,
        )
    }

    pub fn with_claims(state_dir: &Path, claims: PathBuf, gateway: Ipv4Addr, prefix: u8) -> Self {
        Self {
            dir: state_dir.join("network").join("leases"),
            claims,
            gateway,
            prefix,
        }
    }

    /// Takes the host-wide claim on `ip`; false when another runtime holds it.
    fn claim(&self, ip: Ipv4Addr, owner: &str) -> Result<bool, AddressError> {
        let path = self.claims.join(ip.to_string());
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut file) => {
                file.write_all(owner.as_bytes()).map_err(self.store_err())?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Taking over is check-then-write: under one host-wide lock, so two runtimes that
                // both find the same stale claim cannot both take it (the first one's write makes
                // the claim fresh for the second).
                let lock =
                    std::fs::File::create(self.claims.join(".lock")).map_err(self.store_err())?;
                // SAFETY: flock on an fd we own; released when `lock` is closed.
                if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
                    return Err(self.store_err()(std::io::Error::last_os_error()));
                }
                let age = path
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok());
                let abandoned = age.is_some_and(|age| age > STALE_CLAIM)
                    && !super::host_link_exists(&super::veth_name("wv", ip));
                if abandoned {
                    std::fs::write(&path, owner).map_err(self.store_err())?;
                }
                Ok(abandoned)
            }
            Err(e) => Err(self.store_err()(e)),
        }
    }

    fn unclaim(&self, ip: Ipv4Addr, owner: &str) {
        let path = self.claims.join(ip.to_string());
        if std::fs::read_to_string(&path).is_ok_and(|held| held == owner) {
            let _ = std::fs::remove_file(path);
        }
    }

    fn owner_tag(&self, sandbox_id: &str) -> String {
        format!("{} {sandbox_id}", self.dir.display())
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
        std::fs::create_dir_all(&self.claims).map_err(self.store_err())?;
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
        let owner = self.owner_tag(sandbox_id);
        let mut found = None;
        for candidate in
            (first..=last).filter(|ip| *ip != gateway && taken.binary_search(ip).is_err())
        {
            let ip = Ipv4Addr::from(candidate);
            if self.claim(ip, &owner)? {
                found = Some(ip);
                break;
            }
        }
        let Some(ip) = found else {
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

    /// Leases exactly `ip` to `sandbox_id` (a paused sandbox resuming at its old address). `Ok(false)`
    /// when another sandbox holds it or it is outside the subnet.
    pub fn lease_exact(&self, ip: Ipv4Addr, sandbox_id: &str) -> Result<bool, AddressError> {
        let (first, last) = self.range();
        let wanted = u32::from(ip);
        if wanted < first || wanted > last || ip == self.gateway {
            return Ok(false);
        }
        std::fs::create_dir_all(&self.dir).map_err(self.store_err())?;
        let lock = std::fs::File::create(self.dir.join(".lock")).map_err(self.store_err())?;
        // SAFETY: flock on an fd we own; released when `lock` is closed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(self.store_err()(std::io::Error::last_os_error()));
        }
        let path = self.dir.join(ip.to_string());
        if !path.exists() {
            std::fs::create_dir_all(&self.claims).map_err(self.store_err())?;
            let owner = self.owner_tag(sandbox_id);
            let ours = std::fs::read_to_string(self.claims.join(ip.to_string()))
                .is_ok_and(|held| held == owner);
            if !ours && !self.claim(ip, &owner)? {
                return Ok(false);
            }
        }
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut lease) => {
                lease
                    .write_all(sandbox_id.as_bytes())
                    .map_err(self.store_err())?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Ok(std::fs::read_to_string(&path).is_ok_and(|owner| owner == sandbox_id))
            }
            Err(e) => Err(self.store_err()(e)),
        }
    }

    /// Releases `ip` if it is leased to `sandbox_id`.
    pub fn release(&self, ip: Ipv4Addr, sandbox_id: &str) -> Result<(), AddressError> {
        let path = self.dir.join(ip.to_string());
        match std::fs::read_to_string(&path) {
            Ok(owner) if owner == sandbox_id => {
                self.unclaim(ip, &self.owner_tag(sandbox_id));
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
        let pool =
            AddressPool::with_claims(&dir, dir.join("claims"), Ipv4Addr::new(10, 77, 0, 1), 16);
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
    fn leases_a_given_address_once() {
        let dir = std::env::temp_dir().join(format!("wt-leases-claim-{}", std::process::id()));
        let pool =
            AddressPool::with_claims(&dir, dir.join("claims"), Ipv4Addr::new(10, 77, 0, 1), 16);
        let ip = Ipv4Addr::new(10, 77, 3, 4);
        assert!(pool.lease_exact(ip, "a").unwrap());
        assert!(
            pool.lease_exact(ip, "a").unwrap(),
            "claiming one's own lease again is fine"
        );
        assert!(!pool.lease_exact(ip, "b").unwrap());
        assert!(
            !pool.lease_exact(Ipv4Addr::new(10, 77, 0, 1), "b").unwrap(),
            "never the gateway"
        );
        assert!(
            !pool.lease_exact(Ipv4Addr::new(10, 78, 0, 9), "b").unwrap(),
            "never outside the subnet"
        );
        assert_eq!(pool.allocate("c").unwrap(), Ipv4Addr::new(10, 77, 0, 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn claims_keep_two_pools_on_one_bridge_apart() {
        let base = std::env::temp_dir().join(format!("wt-leases-shared-{}", std::process::id()));
        let claims = base.join("claims");
        let gateway = Ipv4Addr::new(10, 79, 0, 1);
        let one = AddressPool::with_claims(&base.join("one"), claims.clone(), gateway, 16);
        let two = AddressPool::with_claims(&base.join("two"), claims, gateway, 16);
        let a = one.allocate("x").unwrap();
        let b = two.allocate("x").unwrap();
        assert_ne!(a, b);
        one.release(a, "x").unwrap();
        assert_eq!(two.allocate("y").unwrap(), a);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_stale_claim_is_taken_over_by_one_pool_only() {
        // A /30 has one address besides the gateway: both pools want the same stale claim at once.
        let base = std::env::temp_dir().join(format!("wt-leases-stale-{}", std::process::id()));
        let claims = base.join("claims");
        let gateway = Ipv4Addr::new(10, 80, 0, 1);
        let ip = Ipv4Addr::new(10, 80, 0, 2);
        for round in 0..40 {
            std::fs::create_dir_all(&claims).unwrap();
            let stale = std::fs::File::create(claims.join(ip.to_string())).unwrap();
            stale
                .set_modified(std::time::SystemTime::now() - 2 * STALE_CLAIM)
                .unwrap();
            let pools: Vec<AddressPool> = ["one", "two"]
                .iter()
                .map(|name| {
                    AddressPool::with_claims(
                        &base.join(format!("{round}-{name}")),
                        claims.clone(),
                        gateway,
                        30,
                    )
                })
                .collect();
            let barrier = std::sync::Barrier::new(2);
            let results: Vec<bool> = std::thread::scope(|scope| {
                let handles: Vec<_> = pools
                    .iter()
                    .map(|pool| {
                        let barrier = &barrier;
                        scope.spawn(move || {
                            barrier.wait();
                            pool.allocate("x").is_ok()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(
                results.iter().filter(|ok| **ok).count(),
                1,
                "round {round}: {results:?}"
            );
            std::fs::remove_dir_all(&claims).unwrap();
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn small_subnet_runs_out() {
        let dir = std::env::temp_dir().join(format!("wt-leases-small-{}", std::process::id()));
        let pool =
            AddressPool::with_claims(&dir, dir.join("claims"), Ipv4Addr::new(10, 78, 0, 1), 30);
        assert_eq!(pool.allocate("a").unwrap(), Ipv4Addr::new(10, 78, 0, 2));
        assert!(matches!(
            pool.allocate("b"),
            Err(AddressError::Exhausted(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
