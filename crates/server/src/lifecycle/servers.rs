//! Servers sharing one store and the same nodes (cluster mode, docs/cluster.md).
//!
//! Every server renews a row of its own in the store every [`RENEW_EVERY`]; a row not renewed for
//! [`SERVER_LEASE`] is a dead server. Each server serves the API and the proxy for every sandbox, and
//! carries out the operations its own requests ask for; what must happen once for the whole fleet
//! (timeouts, the reconciler, the monitor, webhook deliveries, and settling what a dead server left
//! half done) is done by the one server that leads ([`crate::store::Store::lead`]: a PostgreSQL
//! advisory lock, which the database releases the moment the leader's connection ends). A server
//! that shares no nodes (SQLite, or a runtime of its own on this machine) is alone with its
//! sandboxes and always leads.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{now_millis, Lifecycle, LifecycleError};
use crate::store::{ServerRecord, ServerRenewal};

/// A server whose row has not been renewed for this long is dead: its half-done operations are
/// settled by the leader, and the sandboxes it held without rows become strays.
pub const SERVER_LEASE: Duration = Duration::from_secs(10);

/// How often each server renews its row (and the leader looks for dead servers' leftovers).
pub const RENEW_EVERY: Duration = Duration::from_secs(2);

/// Rows of servers dead this long are removed from the store.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

impl Lifecycle {
    /// Whether other servers may share this server's store and nodes (see `coordinated`).
    pub fn coordinated(&self) -> bool {
        self.coordinated
    }

    /// Whether this server leads (see the module doc).
    pub fn leads(&self) -> bool {
        self.leading.load(Ordering::Relaxed)
    }

    fn set_leading(&self, leading: bool) {
        let was = self.leading.swap(leading, Ordering::Relaxed);
        if was != leading && self.coordinated() {
            if leading {
                tracing::info!(server = self.store().server_id(), "this server now leads");
            } else {
                tracing::warn!(
                    server = self.store().server_id(),
                    "this server no longer leads"
                );
            }
        }
    }

    /// The sandboxes this server keeps on the runtime without rows: its builds' and warm pools'.
    pub(super) fn held_without_rows(&self) -> Vec<String> {
        let mut held: Vec<String> = self
            .build_sandboxes_in_use()
            .unwrap_or_default()
            .into_iter()
            .chain(self.pooled_ids())
            .collect();
        held.sort();
        held
    }

    /// The other servers whose rows are alive now.
    pub async fn other_live_servers(&self) -> Result<Vec<ServerRecord>, LifecycleError> {
        let since = now_millis() - SERVER_LEASE.as_millis() as i64;
        let me = self.store().server_id();
        Ok(self
            .store()
            .live_servers(since)
            .await?
            .into_iter()
            .filter(|server| server.id != me)
            .collect())
    }
}

/// One beat: renew this server's row, take or keep the lead, settle what this server's own
/// operations left mid-transition, and as the leader what dead servers left. Fails only when the
/// row could not be renewed or the lead not checked. `address` is the API's, for operators
/// reading the rows.
pub async fn beat(lifecycle: &Lifecycle, address: &str) -> Result<(), LifecycleError> {
    let store = lifecycle.store();
    let now = now_millis();
    // Only servers that share their nodes coordinate; one with a runtime of its own is alone on
    // it (the state directory's lock), so it always leads whatever its store.
    let lead = if lifecycle.coordinated() {
        store.lead().await
    } else {
        Ok(true)
    };
    let leading = *lead.as_ref().unwrap_or(&false);
    lifecycle.set_leading(leading);
    store
        .renew_server(&ServerRenewal {
            address,
            holds: &lifecycle.held_without_rows(),
            leading,
            now,
        })
        .await?;
    lead?;
    // What follows retries at the next beat: a node or the database away now is no reason to
    // stop renewing (or, at start, to refuse to start).
    if let Err(error) = tend(lifecycle, leading, now).await {
        tracing::warn!(error = %warren_runtime::error_chain(&error), "cannot settle what operations left mid-transition yet");
    }
    Ok(())
}

/// Settles this server's own abandoned transitions, and as the leader what dead servers left.
async fn tend(lifecycle: &Lifecycle, leading: bool, now: i64) -> Result<(), LifecycleError> {
    let store = lifecycle.store();
    super::reconcile::settle_abandoned(lifecycle).await?;
    if !leading || !lifecycle.coordinated() {
        return Ok(());
    }
    let since = now - SERVER_LEASE.as_millis() as i64;
    let live: Vec<String> = store
        .live_servers(since)
        .await?
        .into_iter()
        .map(|server| server.id)
        .collect();
    super::reconcile::take_over(lifecycle, &live).await?;
    store
        .forget_servers(false, now - FORGET_AFTER.as_millis() as i64)
        .await?;
    Ok(())
}

/// Beat every [`RENEW_EVERY`] until shutdown, then remove this server's row: a clean stop is not a
/// death, and the next server to start need not wait out the lease.
pub async fn run(lifecycle: Arc<Lifecycle>, address: String, shutdown: watch::Receiver<bool>) {
    let mut ticker = super::Ticker::new(RENEW_EVERY, shutdown);
    while ticker.next().await {
        if let Err(error) = beat(&lifecycle, &address).await {
            tracing::error!(%error, "cannot renew this server's row in the store");
        }
    }
    lifecycle.set_leading(false);
    if let Err(error) = lifecycle.store().forget_servers(true, 0).await {
        tracing::warn!(%error, "cannot remove this server's row from the store");
    }
}
