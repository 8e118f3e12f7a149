//! warren-client: a typed client for Warren's E2B-compatible REST API ([`api`]) and for the envd
//! protocol a sandbox's agent speaks, reached through Warren's sandbox proxy ([`envd`]).

pub mod api;
pub mod envd;

/// The E2B REST bodies (shared with the server): `warren_proto::api`.
pub use warren_proto::api as types;

pub use api::{ApiClient, ApiError, ErrorKind, ListQuery};
pub use envd::{EnvdClient, EnvdError, ProcessEnd, ProcessOutput, ProcessSpec, ProcessStream};
pub use warren_proto::envd::filesystem::EntryInfo;
