//! Sandbox lifecycle: the state machine, admission, the operations the API and the proxy call, the
//! timeout scheduler and start-up reconciliation.

pub mod activity;
pub mod admission;
pub mod agent_init;
mod idempotency;
pub mod monitor;
mod operations;
pub mod reconcile;
mod routes;
pub mod scheduler;
pub mod servers;
mod snapshots;
pub mod state;
pub mod workspaces;

use std::time::{SystemTime, UNIX_EPOCH};

pub use idempotency::IdempotencyKey;
pub use operations::migrate;
pub use operations::pool;
pub use operations::{
    CreateRequest, CreatedSandbox, Lifecycle, LifecycleError, LogItem, LogTail, PauseMode,
    ResumeOutcome, RouteError, SecretChange,
};
pub use routes::TrafficRoute;
pub use snapshots::{ForkOutcome, GcReport, MAX_FORKS};

use crate::store::Millis;

/// Now, in Unix milliseconds.
pub fn now_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as Millis)
        .unwrap_or(0)
}

/// The beat of a background task: ticks every `period` (a tick missed while the task was busy is
/// waited out, not made up) until the server's shutdown signal turns true.
pub(crate) struct Ticker {
    interval: tokio::time::Interval,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Ticker {
    pub(crate) fn new(
        period: std::time::Duration,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Ticker {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ticker { interval, shutdown }
    }

    /// Waits for the next tick; false once the server stops.
    pub(crate) async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.interval.tick() => !*self.shutdown.borrow(),
            _ = self.shutdown.changed() => false,
        }
    }
}
