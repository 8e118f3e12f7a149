//! The proxy's route table: where traffic for a running sandbox goes, and which sandboxes are being
//! ended. A sandbox leaves the live routes the moment its kill begins, so the proxy answers "not found"
//! at once instead of connecting to a sandbox that is being torn down. The store stays the source of
//! truth; this is a cache the lifecycle keeps in step with each transition.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::RwLock;

/// One sandbox's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Running: send traffic to this address.
    Live(Ipv4Addr),
    /// Being killed: traffic gets "not found" without touching the sandbox.
    Ending,
}

#[derive(Debug, Default)]
pub(crate) struct RouteTable {
    routes: RwLock<HashMap<String, Route>>,
}

impl RouteTable {
    pub(crate) fn set(&self, id: &str, route: Option<Route>) {
        let mut routes = self
            .routes
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match route {
            Some(route) => routes.insert(id.to_string(), route),
            None => routes.remove(id),
        };
    }

    pub(crate) fn get(&self, id: &str) -> Option<Route> {
        let routes = self
            .routes
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        routes.get(id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ending_replaces_a_live_route_and_removal_forgets_it() {
        let table = RouteTable::default();
        let ip = Ipv4Addr::new(10, 77, 0, 2);
        table.set("a", Some(Route::Live(ip)));
        assert_eq!(table.get("a"), Some(Route::Live(ip)));
        table.set("a", Some(Route::Ending));
        assert_eq!(table.get("a"), Some(Route::Ending));
        table.set("a", None);
        assert_eq!(table.get("a"), None);
        assert_eq!(table.get("b"), None);
    }
}
