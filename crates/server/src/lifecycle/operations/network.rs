//! A sandbox's network: its egress rules and where the proxy sends its traffic.

use warren_runtime::network::egress::{Cidr, EgressRules};

use super::{Lifecycle, LifecycleError, RouteError};
use crate::lifecycle::routes::{Route, TrafficRoute};
use crate::lifecycle::state::SandboxState;
use crate::store::SandboxRecord;

impl Lifecycle {
    /// Replaces a sandbox's egress rules (`PUT /sandboxes/{id}/network`): at once on a running one, at
    /// its next resume on a paused one; kept in the store either way.
    pub async fn set_egress(&self, id: &str, rules: EgressRules) -> Result<(), LifecycleError> {
        let (_held, record) = self.lock_live(id).await?;
        self.check_egress(id, &rules).await?;
        self.check_placeholders(&record.team_id, &Default::default(), &rules)
            .await?;
        let updated = SandboxRecord {
            egress: rules,
            ..record.clone()
        };
        if record.state == SandboxState::Running {
            let spec = self.resolved_network_spec(&updated).await?;
            let id_owned = id.to_string();
            self.on_runtime(move |runtime| runtime.set_network(&id_owned, &spec))
                .await
                .map_err(|source| LifecycleError::Runtime {
                    action: "set the egress rules of",
                    id: id.to_string(),
                    source,
                })?;
            // New header rules over HTTPS need the egress CA trusted inside.
            if let (false, Some(ip)) = (updated.egress.header_rules.is_empty(), updated.ip) {
                let addr = std::net::SocketAddr::from((ip, warren_runtime::AGENT_PORT));
                self.init_agent_at(&updated, addr, updated.envd_access_token.as_deref(), None)
                    .await?;
            }
        }
        self.store.set_sandbox_egress(id, &updated.egress).await?;
        Ok(())
    }

    /// Checks on the host what only the host can check of new egress rules (a SOCKS5 proxy's address
    /// must resolve to somewhere sandboxes may reach), before they are given to a sandbox.
    pub(crate) async fn check_egress(
        &self,
        id: &str,
        rules: &EgressRules,
    ) -> Result<(), LifecycleError> {
        if rules.upstream.is_none() {
            return Ok(());
        }
        let spec = warren_runtime::NetworkSpec {
            allow_internet: true,
            raw_sockets: false,
            egress: rules.clone(),
        };
        self.on_runtime(move |runtime| runtime.check_network(&spec))
            .await
            .map_err(|source| LifecycleError::Runtime {
                action: "check the egress proxy of",
                id: id.to_string(),
                source,
            })
    }

    /// Gives an adopted sandbox its network rules again. The egress proxy's host-name and header
    /// rules lived in the old process: without them its allowed names would be refused (the proxy
    /// fails closed), never wrongly allowed. nftables keeps the address rules across a restart,
    /// unless this start replaced the host's tables (a new ruleset version, changed host networks):
    /// then a sandbox's denied addresses would be open to it until its next update or resume, so
    /// every adopted sandbox gets all its rules again.
    pub(crate) async fn reinstall_network(&self, record: &SandboxRecord) {
        if !record.egress.needs_proxy() && !self.runtime.network_rules_replaced() {
            return;
        }
        let spec = match self.resolved_network_spec(record).await {
            Ok(spec) => spec,
            Err(error) => {
                // The proxy keeps refusing this sandbox's names (it fails closed).
                tracing::warn!(sandbox = %record.id, %error, "cannot resolve the secrets of a sandbox's egress rules");
                return;
            }
        };
        let id = record.id.clone();
        if let Err(error) = self
            .on_runtime(move |runtime| runtime.set_network(&id, &spec))
            .await
        {
            tracing::warn!(sandbox = %record.id, %error, "cannot reinstall the egress rules of an adopted sandbox");
        }
    }

    /// Where the proxy should send traffic for sandbox `id`: resumes a paused sandbox that allows it.
    pub async fn route_for_traffic(&self, id: &str) -> Result<TrafficRoute, RouteError> {
        match self.routes.get(id) {
            // Another server may have paused it since, and its address gone to a new sandbox:
            // with servers sharing the nodes, every connection reads the row.
            Some(Route::Live(route)) if !self.coordinated => return Ok(route),
            Some(Route::Ending) => return Err(RouteError::NotFound(id.to_string())),
            _ => {}
        }
        let route = |record: &SandboxRecord| {
            record.ip.map(|ip| TrafficRoute {
                ip,
                incarnation: record.init_pid.unwrap_or(0),
                traffic_token: record.traffic_access_token.clone(),
                ingress: record.ingress.clone(),
            })
        };
        let record = match self.store.get_sandbox(id).await? {
            Some(record) if !record.state.is_terminal() => record,
            _ => return Err(RouteError::NotFound(id.to_string())),
        };
        match record.state {
            SandboxState::Running => {
                route(&record).ok_or_else(|| RouteError::NotFound(id.to_string()))
            }
            SandboxState::Paused | SandboxState::Pausing if !record.auto_resume => {
                Err(RouteError::Paused(id.to_string()))
            }
            _ => {
                // Paused (auto-resume), or mid-transition: resume waits for the sandbox's lock.
                let resumed = self.resume(id, None).await.map_err(|source| match source {
                    LifecycleError::NotFound(id) => RouteError::NotFound(id),
                    other => RouteError::ResumeFailed {
                        id: id.to_string(),
                        source: Box::new(other),
                    },
                })?;
                route(&resumed.0).ok_or_else(|| RouteError::NotFound(id.to_string()))
            }
        }
    }

    /// Fill the proxy's route cache from the store (after reconciliation).
    pub(crate) fn remember_route(&self, record: &SandboxRecord) {
        if let (SandboxState::Running, Some(ip)) = (record.state, record.ip) {
            self.routes.set(&record.id, Some(Route::live(ip, record)));
        }
    }
}

/// The runtime's network settings of `record`. E2B's model: `allow_internet_access: false` is a deny
/// of everything, and allowed networks win over denied ones, so a sandbox without internet access but
/// with allowed networks goes out for those only.
pub(super) fn network_spec(record: &SandboxRecord) -> warren_runtime::NetworkSpec {
    let mut egress = record.egress.clone();
    let everything = Cidr {
        network: std::net::Ipv4Addr::UNSPECIFIED,
        prefix: 0,
    };
    let internet = match record.allow_internet {
        Some(false) => {
            // The deny-all is what the egress proxy judges redirected connections by (header rules
            // and a SOCKS5 proxy send TCP to it whatever the internet set says).
            if !egress.deny.contains(&everything) {
                egress.deny.push(everything);
            }
            if egress.allow.is_empty() && egress.allow_hosts.is_empty() {
                // Nothing may leave, so there is nothing to tunnel either.
                egress.upstream = None;
                false
            } else {
                true
            }
        }
        _ => true,
    };
    warren_runtime::NetworkSpec {
        allow_internet: internet,
        raw_sockets: false,
        egress,
    }
}
