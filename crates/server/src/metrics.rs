//! Prometheus metrics of the server, served at `/metrics`.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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
struct ProxyLabels {
    outcome: String,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    transitions: Family<TransitionLabels, Counter>,
    sandboxes: Family<StateLabels, Gauge>,
    admission_refused: Counter,
    proxy_requests: Family<ProxyLabels, Counter>,
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
        }
    }

    fn state_gauge(&self, state: SandboxState) -> Gauge {
        self.sandboxes
            .get_or_create(&StateLabels {
                state: state.as_str().to_string(),
            })
            .clone()
    }

    pub fn transition(&self, from: SandboxState, to: SandboxState) {
        self.transitions
            .get_or_create(&TransitionLabels {
                from: from.as_str().to_string(),
                to: to.as_str().to_string(),
            })
            .inc();
        self.state_gauge(from).dec();
        if !to.is_terminal() {
            self.state_gauge(to).inc();
        }
    }

    pub fn transition_from_nothing(&self, to: SandboxState) {
        self.state_gauge(to).inc();
    }

    pub fn admission_refused(&self) {
        self.admission_refused.inc();
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
