//! Prometheus metrics of the server, served at `/metrics`.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::lifecycle::state::SandboxState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    from: String,
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    /// What the reconciler found and fixed: `untracked_destroyed`, `lost`.
    action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    /// `runaway_cpu`.
    policy: String,
    /// `reported`, `killed`.
    action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    /// `create`, `pause`, `resume`.
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiErrorLabels {
    method: String,
    /// The route as declared (`/sandboxes/{id}`), or `unmatched`.
    route: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TemplateLabels {
    template: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProxyLabels {
    outcome: String,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    transitions: Family<TransitionLabels, Counter>,
    sandboxes: Family<StateLabels, Gauge>,
    admission_refused: Counter,
    proxy_requests: Family<ProxyLabels, Counter>,
    operation_seconds: Family<OperationLabels, Histogram>,
    api_errors: Family<ApiErrorLabels, Counter>,
    reconciled: Family<ReconcileLabels, Counter>,
    policy_actions: Family<PolicyLabels, Counter>,
    webhook_deliveries: Family<ProxyLabels, Counter>,
    warm_pool_sandboxes: Family<TemplateLabels, Gauge>,
    warm_pool_memory: Family<TemplateLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("warren");
        let transitions = Family::<TransitionLabels, Counter>::default();
        let sandboxes = Family::<StateLabels, Gauge>::default();
        let admission_refused = Counter::default();
        let proxy_requests = Family::<ProxyLabels, Counter>::default();
        let operation_seconds = Family::<OperationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        registry.register(
            "operation_seconds",
            "How long sandbox operations take: create (admitted to running), pause, resume",
            operation_seconds.clone(),
        );
        let api_errors = Family::<ApiErrorLabels, Counter>::default();
        registry.register(
            "api_errors",
            "API answers with a 4xx or 5xx status, by method, route and status",
            api_errors.clone(),
        );
        let reconciled = Family::<ReconcileLabels, Counter>::default();
        let policy_actions = Family::<PolicyLabels, Counter>::default();
        let webhook_deliveries = Family::<ProxyLabels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook deliveries by outcome (delivered, failed after the retries)",
            webhook_deliveries.clone(),
        );
        let warm_pool_sandboxes = Family::<TemplateLabels, Gauge>::default();
        registry.register(
            "warm_pool_sandboxes",
            "Restored, frozen sandboxes waiting in a template's warm pool",
            warm_pool_sandboxes.clone(),
        );
        let warm_pool_memory = Family::<TemplateLabels, Gauge>::default();
        registry.register(
            "warm_pool_memory_bytes",
            "Memory the sandboxes waiting in a template's warm pool hold",
            warm_pool_memory.clone(),
        );
        registry.register(
            "policy_actions",
            "What the monitor's policies found and did (runaway_cpu: reported, killed)",
            policy_actions.clone(),
        );
        registry.register(
            "reconciled",
            "Disagreements between the store and the host that the periodic reconciler fixed",
            reconciled.clone(),
        );
        registry.register(
            "sandbox_transitions",
            "Sandbox state transitions",
            transitions.clone(),
        );
        registry.register(
            "sandboxes",
            "Sandboxes by state, since start",
            sandboxes.clone(),
        );
        registry.register(
            "admission_refused",
            "Sandbox creations refused by quota",
            admission_refused.clone(),
        );
        registry.register(
            "proxy_requests",
            "Requests through the sandbox proxy",
            proxy_requests.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            transitions,
            sandboxes,
            admission_refused,
            proxy_requests,
            operation_seconds,
            api_errors,
            reconciled,
            policy_actions,
            webhook_deliveries,
            warm_pool_sandboxes,
            warm_pool_memory,
        }
    }

    /// The warm pool of `template` holds `size` sandboxes using `memory_bytes`.
    pub fn warm_pool(&self, template: &str, size: usize, memory_bytes: u64) {
        let labels = TemplateLabels {
            template: template.to_string(),
        };
        self.warm_pool_sandboxes
            .get_or_create(&labels)
            .set(size as i64);
        self.warm_pool_memory
            .get_or_create(&labels)
            .set(memory_bytes.min(i64::MAX as u64) as i64);
    }

    pub fn transition(&self, from: SandboxState, to: SandboxState) {
        self.transitions
            .get_or_create(&TransitionLabels {
                from: from.as_str().to_string(),
                to: to.as_str().to_string(),
            })
            .inc();
    }

    /// Set the per-state gauge from a count of the store's live sandboxes (done at scrape time, so it
    /// is right after restarts too).
    pub fn set_sandbox_counts(&self, states: impl IntoIterator<Item = SandboxState>) {
        let mut counts = std::collections::HashMap::new();
        for state in states {
            *counts.entry(state).or_insert(0i64) += 1;
        }
        for state in SandboxState::ALL
            .into_iter()
            .filter(|state| !state.is_terminal())
        {
            self.sandboxes
                .get_or_create(&StateLabels {
                    state: state.as_str().to_string(),
                })
                .set(counts.get(&state).copied().unwrap_or(0));
        }
    }

    pub fn sandbox_started(&self, seconds: f64) {
        self.operation_finished("create", seconds);
    }

    /// A sandbox operation (`create`, `pause`, `resume`) took `seconds`.
    pub fn operation_finished(&self, operation: &str, seconds: f64) {
        self.operation_seconds
            .get_or_create(&OperationLabels {
                operation: operation.to_string(),
            })
            .observe(seconds);
    }

    /// The API answered `status` (4xx or 5xx) to `method` on `route`.
    pub fn api_error(&self, method: &str, route: &str, status: u16) {
        self.api_errors
            .get_or_create(&ApiErrorLabels {
                method: method.to_string(),
                route: route.to_string(),
                status: status.to_string(),
            })
            .inc();
    }

    pub fn admission_refused(&self) {
        self.admission_refused.inc();
    }

    /// The periodic reconciler fixed one disagreement (`untracked_destroyed`, `lost`).
    pub fn reconciled(&self, action: &str) {
        self.reconciled
            .get_or_create(&ReconcileLabels {
                action: action.to_string(),
            })
            .inc();
    }

    /// A policy of the monitor acted on a sandbox.
    pub fn policy_action(&self, policy: &str, action: &str) {
        self.policy_actions
            .get_or_create(&PolicyLabels {
                policy: policy.to_string(),
                action: action.to_string(),
            })
            .inc();
    }

    /// One event handed to a webhook (`delivered`) or given up on (`failed`).
    pub fn webhook_delivery(&self, outcome: &str) {
        self.webhook_deliveries
            .get_or_create(&ProxyLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn proxy_request(&self, outcome: &str) {
        self.proxy_requests
            .get_or_create(&ProxyLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}
