//! The proxy's route table: where traffic for a running sandbox goes, and which sandboxes are being
//! ended. A sandbox leaves the live routes the moment its kill begins, so the proxy answers "not found"
//! at once instead of connecting to a sandbox that is being torn down. The store stays the source of
//! truth; this is a cache the lifecycle keeps in step with each transition.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::RwLock;

/// Where the proxy sends a running sandbox's traffic, and what a user port asks of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficRoute {
    pub ip: Ipv4Addr,
    /// Host PID of the sandbox's init: new after every restore or boot, so that the proxy never
    /// reuses a pooled connection to an earlier run of the sandbox at the same address (a rebooted
    /// agent does not know it, and a connection held across a pause with the network locked never
    /// saw its end).
    pub incarnation: u32,
    /// A private sandbox's traffic access token: requests to its user ports must carry it.
    pub traffic_token: Option<String>,
    /// The `Host` its services see and which of its ports speak TLS.
    pub ingress: crate::store::SandboxIngress,
}

/// One sandbox's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// Running: send traffic here.
    Live(TrafficRoute),
    /// Being killed: traffic gets "not found" without touching the sandbox.
    Ending,
}

#[derive(Debug, Default)]
pub(crate) struct RouteTable {
    routes: RwLock<HashMap<String, Route>>,
}

impl Route {
    pub(crate) fn live(ip: Ipv4Addr, record: &crate::store::SandboxRecord) -> Route {
        Route::Live(TrafficRoute {
            ip,
            incarnation: record.init_pid.unwrap_or(0),
            traffic_token: record.traffic_access_token.clone(),
            ingress: record.ingress.clone(),
        })
    }
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
        routes.get(id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ending_replaces_a_live_route_and_removal_forgets_it() {
        let table = RouteTable::default();
        let ip = Ipv4Addr::new(10, 77, 0, 2);
        let live = Route::Live(TrafficRoute {
            ip,
            incarnation: 7,
            traffic_token: None,
            ingress: Default::default(),
        });
        table.set("a", Some(live.clone()));
        assert_eq!(table.get("a"), Some(live));
        table.set("a", Some(Route::Ending));
        assert_eq!(table.get("a"), Some(Route::Ending));
        table.set("a", None);
        assert_eq!(table.get("a"), None);
        assert_eq!(table.get("b"), None);
    }
}
