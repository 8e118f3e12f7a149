//! API errors: every non-2xx answer is `{code, message}` as E2B sends it. Internal errors reach the client
//! as a plain 500 with an ID; the details go to the log under that ID.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rand::Rng;
use warren_proto::api;

use crate::lifecycle::{LifecycleError, RouteError};
use crate::store::StoreError;
use warren_runtime::{RuntimeError, RuntimeErrorKind};

// The error answers the OpenAPI document names (`components.responses`); each is an `Error` body.

#[derive(utoipa::ToResponse)]
#[response(description = "Invalid request")]
#[allow(dead_code)]
pub struct BadRequest(api::Error);

#[derive(utoipa::ToResponse)]
#[response(description = "Missing or invalid X-API-Key")]
#[allow(dead_code)]
pub struct Unauthorized(api::Error);

#[derive(utoipa::ToResponse)]
#[response(description = "No such sandbox or template")]
#[allow(dead_code)]
pub struct NotFound(api::Error);

#[derive(utoipa::ToResponse)]
#[response(description = "Not possible in the current state")]
#[allow(dead_code)]
pub struct Conflict(api::Error);

#[derive(utoipa::ToResponse)]
#[response(description = "Node quota exceeded")]
#[allow(dead_code)]
pub struct TooManyRequests(api::Error);

#[derive(utoipa::ToResponse)]
#[response(description = "Internal error; the message names an error ID found in the server log")]
#[allow(dead_code)]
pub struct InternalError(api::Error);

#[derive(utoipa::ToResponse)]
#[response(
    description = "The sandbox's guest agent did not answer its health check; nothing changed"
)]
#[allow(dead_code)]
pub struct GuestUnresponsive(api::Error);

#[derive(utoipa::ToResponse)]
#[response(
    description = "The state disk cannot take it: admission keeps room for every running sandbox's writable layer, or the disk is full (error_code insufficient_storage)"
)]
#[allow(dead_code)]
pub struct InsufficientStorage(api::Error);

#[derive(utoipa::ToResponse)]
#[response(description = "The host is out of a resource (addresses, tasks) for now; retry later")]
#[allow(dead_code)]
pub struct ServiceUnavailable(api::Error);

#[derive(utoipa::ToResponse)]
#[response(
    description = "The credential is valid but not for this resource (another volume's token)"
)]
#[allow(dead_code)]
pub struct Forbidden(api::Error);

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub error_code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            error_code: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// Log `error` with its causes under a fresh ID and answer a plain 500 naming only the ID.
    /// An error that is not the client's: a plain 500 with an error id (the cause chain goes to the
    /// log only), unless a full state disk caused it, which is 507 (the operator can fix that, and
    /// the client may retry).
    pub fn internal(error: &(dyn std::error::Error + 'static)) -> Self {
        let id = log_with_id(error);
        if full_disk_in_chain(error) {
            return ApiError {
                status: StatusCode::INSUFFICIENT_STORAGE,
                message: format!(
                    "the server's state disk is full, so the change could not be stored; retry \
                     once space is freed (error id {id})"
                ),
                error_code: Some("insufficient_storage"),
            };
        }
        if crate::node::remote::Unreachable::anywhere(error) {
            return ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: format!(
                    "the node that runs this sandbox cannot be reached just now; retry shortly \
                     (error id {id})"
                ),
                error_code: Some("node_unreachable"),
            };
        }
        if database_unreachable_in_chain(error) {
            return ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: format!(
                    "the database cannot be reached just now; retry shortly (error id {id})"
                ),
                error_code: Some("database_unavailable"),
            };
        }
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("internal server error (error id {id})"),
            error_code: Some("internal_server_error"),
        }
    }
}

/// Whether the database could not be reached (PostgreSQL restarting or gone: no connection in the
/// pool's time, a connection cut, SQLSTATE class 08 or 57P) anywhere in the cause chain of `error`.
fn database_unreachable_in_chain(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(sqlx) = error.downcast_ref::<sqlx::Error>() {
            match sqlx {
                sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
                    return true
                }
                sqlx::Error::Database(db) => {
                    let code = db.code().unwrap_or_default();
                    if code.starts_with("08") || code.starts_with("57P") {
                        return true;
                    }
                }
                _ => {}
            }
        }
        cause = error.source();
    }
    false
}

/// Whether a full disk or quota (the store's `SQLITE_FULL`, ENOSPC, EDQUOT) is anywhere in the
/// cause chain of `error`. `#[error(transparent)]` wrappers hand on their inner error's source, so
/// each level is checked for the store's, SQLx's and the OS's way of saying it.
fn full_disk_in_chain(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(store) = error.downcast_ref::<StoreError>() {
            if store.disk_full() {
                return true;
            }
        }
        if let Some(sqlx::Error::Database(db)) = error.downcast_ref::<sqlx::Error>() {
            if db.code().as_deref() == Some("13") {
                return true;
            }
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
                || matches!(
                    io.kind(),
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
                )
            {
                return true;
            }
        }
        cause = error.source();
    }
    false
}

/// Logs `error` with its cause chain under a fresh error id, and returns the id.
fn log_with_id(error: &(dyn std::error::Error + 'static)) -> String {
    let id = format!("{:016x}", rand::rng().random::<u64>());
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    tracing::error!(error_id = %id, error = %chain, "internal error");
    id
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = api::Error {
            code: self.status.as_u16(),
            message: self.message,
            error_code: self.error_code.map(str::to_string),
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<LifecycleError> for ApiError {
    fn from(error: LifecycleError) -> Self {
        match &error {
            LifecycleError::NotFound(id) => ApiError::not_found(format!(
                "sandbox \"{id}\" doesn't exist or you don't have access to it"
            )),
            LifecycleError::TemplateNotFound(id) => {
                ApiError::not_found(format!("template '{id}' not found"))
            }
            LifecycleError::NodeNotFound(node) => ApiError::not_found(format!(
                "node '{node}' is not one of this server's (GET /nodes lists them)"
            )),
            LifecycleError::WorkspaceNotFound(user) => {
                ApiError::not_found(format!("user '{user}' has no workspace"))
            }
            LifecycleError::BadRequest(message) => ApiError::bad_request(message.clone()),
            LifecycleError::Quota(refused) if refused.is_storage() => ApiError {
                status: StatusCode::INSUFFICIENT_STORAGE,
                message: refused.to_string(),
                error_code: Some("insufficient_storage"),
            },
            LifecycleError::Quota(refused) => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: refused.to_string(),
                error_code: Some("sandbox_capacity_unavailable"),
            },
            LifecycleError::Conflict(message) => {
                ApiError::new(StatusCode::CONFLICT, message.clone())
            }
            LifecycleError::Transition(invalid) => {
                ApiError::new(StatusCode::CONFLICT, invalid.to_string())
            }
            LifecycleError::Unsupported(message) => ApiError {
                status: StatusCode::NOT_IMPLEMENTED,
                message: message.clone(),
                error_code: Some("not_supported_on_this_host"),
            },
            LifecycleError::GuestUnresponsive(_) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: error.to_string(),
                error_code: Some("sandbox_guest_agent_unresponsive"),
            },
            LifecycleError::Runtime { action, id, source } => {
                runtime_failure(action, id, source, &error)
            }
            // Names the secret and the key problem, never a value.
            LifecycleError::Secrets(secrets) => ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: secrets.to_string(),
                error_code: Some("secrets_unavailable"),
            },
            LifecycleError::AgentInit { .. }
            | LifecycleError::TemplateStart { .. }
            | LifecycleError::Store(_) => ApiError::internal(&error),
        }
    }
}

/// The one mapping of the runtime's errors to answers, by whose fault they are. Messages of bad
/// input go to the client as they are (they name the problem); a host out of resources gets a fixed
/// message, an internal failure only an error id (details, which may hold host paths, are logged).
fn runtime_failure(
    action: &str,
    id: &str,
    source: &RuntimeError,
    error: &LifecycleError,
) -> ApiError {
    match source.kind() {
        RuntimeErrorKind::InvalidSpec => ApiError::bad_request(source.to_string()),
        RuntimeErrorKind::NotFound => ApiError::not_found(source.to_string()),
        RuntimeErrorKind::Conflict => ApiError::new(StatusCode::CONFLICT, source.to_string()),
        RuntimeErrorKind::Unsupported => ApiError {
            status: StatusCode::NOT_IMPLEMENTED,
            message: source.to_string(),
            error_code: Some("not_supported_on_this_host"),
        },
        RuntimeErrorKind::ResourceExhausted => {
            let logged = log_with_id(error);
            let (status, what, code) = if source.out_of_space() {
                (
                    StatusCode::INSUFFICIENT_STORAGE,
                    "storage",
                    "insufficient_storage",
                )
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "resources",
                    "host_resources_exhausted",
                )
            };
            ApiError {
                status,
                message: format!(
                    "the host is out of {what}: cannot {action} sandbox {id} now; try again later (error id {logged})"
                ),
                error_code: Some(code),
            }
        }
        RuntimeErrorKind::Internal => ApiError::internal(error),
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::internal(&error)
    }
}

impl From<RouteError> for ApiError {
    fn from(error: RouteError) -> Self {
        match error {
            RouteError::NotFound(id) => ApiError::not_found(format!("sandbox {id} not found")),
            other => ApiError::internal(&other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(source: RuntimeError) -> ApiError {
        ApiError::from(LifecycleError::Runtime {
            action: "create",
            id: "sbx1".into(),
            source,
        })
    }

    #[test]
    fn a_node_that_cannot_be_reached_is_503() {
        let cut = answer(RuntimeError::Internal {
            context: "node http://10.0.0.2:3100: connection reset".into(),
            source: Some(Box::new(crate::node::remote::Unreachable {
                never_sent: false,
            })),
        });
        assert_eq!(cut.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(cut.error_code, Some("node_unreachable"));
        let other = answer(RuntimeError::Internal {
            context: "something else".into(),
            source: None,
        });
        assert_eq!(other.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn an_unreachable_database_is_503_and_other_store_errors_500() {
        let lifecycle =
            |error: sqlx::Error| ApiError::from(LifecycleError::Store(StoreError::Database(error)));
        let timed_out = lifecycle(sqlx::Error::PoolTimedOut);
        assert_eq!(timed_out.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(timed_out.error_code, Some("database_unavailable"));
        assert!(timed_out.message.contains("retry"), "{}", timed_out.message);
        let cut = lifecycle(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(cut.status, StatusCode::SERVICE_UNAVAILABLE);
        let missing = lifecycle(sqlx::Error::RowNotFound);
        assert_eq!(missing.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn a_full_state_disk_is_507_wherever_it_is_in_the_chain() {
        let enospc = || std::io::Error::from_raw_os_error(libc::ENOSPC);
        let store = StoreError::StateDir {
            path: "/state".into(),
            source: enospc(),
        };
        assert!(store.disk_full());
        assert_eq!(
            ApiError::from(store).status,
            StatusCode::INSUFFICIENT_STORAGE
        );
        // Wrapped twice, as a build's error wraps the store's.
        #[derive(Debug, thiserror::Error)]
        #[error(transparent)]
        struct Wrapper(#[from] StoreError);
        let wrapped = Wrapper(StoreError::StateDir {
            path: "/state".into(),
            source: enospc(),
        });
        let answer = ApiError::internal(&wrapped);
        assert_eq!(answer.status, StatusCode::INSUFFICIENT_STORAGE);
        assert!(
            answer.message.contains("state disk is full"),
            "{}",
            answer.message
        );
        assert_eq!(answer.error_code, Some("insufficient_storage"));
        let other = StoreError::StateDir {
            path: "/state".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        };
        assert!(!other.disk_full());
        assert_eq!(
            ApiError::from(other).status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn runtime_errors_map_by_whose_fault_they_are() {
        let bad = answer(RuntimeError::InvalidSpec(
            "memory_mib 4 is below the 16 MiB minimum".into(),
        ));
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        assert!(bad.message.contains("memory_mib 4"), "{}", bad.message);

        let gone = answer(RuntimeError::ProcessNotFound {
            sandbox: "sbx1".into(),
            pid: 9,
        });
        assert_eq!(gone.status, StatusCode::NOT_FOUND);
        assert_eq!(
            answer(RuntimeError::NotFound("sbx1".into())).status,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            answer(RuntimeError::AlreadyExists("sbx1".into())).status,
            StatusCode::CONFLICT
        );
        let busy = answer(RuntimeError::Busy {
            context: "a task is in vfork".into(),
            source: None,
        });
        assert_eq!(busy.status, StatusCode::CONFLICT);
        assert_eq!(
            answer(RuntimeError::Unsupported("checkpoints".into())).status,
            StatusCode::NOT_IMPLEMENTED
        );

        let addresses = answer(RuntimeError::ResourceExhausted {
            context: "no free sandbox address".into(),
            source: None,
        });
        assert_eq!(addresses.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(addresses.error_code, Some("host_resources_exhausted"));
        assert!(
            addresses.message.contains("error id"),
            "{}",
            addresses.message
        );

        // A full state disk deep in the chain: 507, and no host path in the answer.
        let full = answer(RuntimeError::Io {
            context: "write /var/lib/warren/sandboxes/sbx1/layer.img".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        });
        assert_eq!(full.status, StatusCode::INSUFFICIENT_STORAGE);
        assert!(!full.message.contains("/var/lib"), "{}", full.message);

        let internal = answer(RuntimeError::internal(
            "mount the overlay at /var/lib/warren/x",
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        ));
        assert_eq!(internal.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            !internal.message.contains("/var/lib"),
            "{}",
            internal.message
        );
        assert!(internal.message.contains("error id"));
    }
}
