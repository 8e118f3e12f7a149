//! API errors: every non-2xx answer is `{code, message}` as E2B sends it. Internal errors reach the client
//! as a plain 500 with an ID; the details go to the log under that ID.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rand::Rng;
use warren_proto::api;

use crate::lifecycle::{LifecycleError, RouteError};
use crate::store::StoreError;

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
    pub fn internal(error: &(dyn std::error::Error + 'static)) -> Self {
        let id = format!("{:016x}", rand::thread_rng().gen::<u64>());
        let mut chain = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            chain.push_str(": ");
            chain.push_str(&cause.to_string());
            source = cause.source();
        }
        tracing::error!(error_id = %id, error = %chain, "internal error");
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("internal server error (error id {id})"),
            error_code: Some("internal_server_error"),
        }
    }
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
            LifecycleError::Runtime { .. }
            | LifecycleError::AgentInit { .. }
            | LifecycleError::TemplateStart { .. }
            | LifecycleError::Store(_) => ApiError::internal(&error),
        }
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
