//! warren-client: a typed client for Warren's E2B-compatible REST API ([`api`]) and for the envd
//! protocol a sandbox's agent speaks, reached through Warren's sandbox proxy ([`envd`]).

pub mod api;
pub mod envd;
pub mod sandbox_port;

/// The E2B REST bodies (shared with the server): `warren_proto::api`.
pub use warren_proto::api as types;

pub use api::{ApiClient, ApiError, ErrorKind, ListQuery};
pub use envd::{EnvdClient, EnvdError, ProcessEnd, ProcessOutput, ProcessSpec, ProcessStream};
pub use sandbox_port::SandboxPortClient;
pub use warren_proto::envd::filesystem::EntryInfo;

/// A reqwest client builder with rustls' ring provider installed for the process (reqwest's TLS is
/// built without a provider of its own, and refuses to build a client until one is installed).
pub(crate) fn http_builder() -> reqwest::ClientBuilder {
    // Err only when a provider is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}
