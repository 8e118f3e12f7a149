//! The E2B control-plane REST API as the official SDKs (2.x) speak it: request and response bodies, with
//! E2B's JSON field names. Plain data only; no server logic.

pub mod sandboxes;
pub mod snapshots;
pub mod templates;
pub mod volumes;
pub mod workspaces;

pub use sandboxes::*;
pub use snapshots::*;
pub use templates::*;
pub use volumes::*;
pub use workspaces::*;

use serde::{Deserialize, Serialize};

/// envd protocol version Warren's agent implements, as reported in `envdVersion`. The SDK enables
/// features by comparing against it.
pub use crate::envd::ENVD_VERSION;

/// Header carrying the API key.
pub const API_KEY_HEADER: &str = "X-API-Key";
/// Response header carrying the token of the next page of a list.
pub const NEXT_TOKEN_HEADER: &str = "x-next-token";
/// Proxy routing headers the SDK sends when `E2B_SANDBOX_URL` is set.
pub const SANDBOX_ID_HEADER: &str = "E2b-Sandbox-Id";
pub const SANDBOX_PORT_HEADER: &str = "E2b-Sandbox-Port";
/// Header carrying envd's access token (checked by the agent, passed through by the proxy).
pub const ENVD_ACCESS_TOKEN_HEADER: &str = "X-Access-Token";

/// Error body of every non-2xx answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Error {
    /// The HTTP status code, repeated.
    pub code: u16,
    pub message: String,
    /// Machine-readable error kind, e.g. `internal_server_error`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "error_code"
    )]
    pub error_code: Option<String>,
}
