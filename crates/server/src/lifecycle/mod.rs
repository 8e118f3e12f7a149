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
mod snapshots;
pub mod state;
pub mod workspaces;

use std::time::{SystemTime, UNIX_EPOCH};

pub use idempotency::IdempotencyKey;
pub use operations::{
    CreateRequest, CreatedSandbox, Lifecycle, LifecycleError, ResumeOutcome, RouteError,
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
