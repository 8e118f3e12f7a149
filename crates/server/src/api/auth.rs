//! `X-API-Key` authentication as an extractor: a handler that takes [`Authenticated`] only runs for a live
//! key.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use warren_proto::api::API_KEY_HEADER;

use super::error::ApiError;
use super::AppState;
use crate::keys;
use crate::store::ApiKeyRecord;

/// The key that authenticated this request.
pub struct Authenticated(pub ApiKeyRecord);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let from_header = parts
            .headers
            .get(API_KEY_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::trim);
        let from_bearer = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(secret) = from_header
            .or(from_bearer)
            .filter(|secret| !secret.is_empty())
        else {
            return Err(ApiError::unauthorized(format!(
                "missing {API_KEY_HEADER} header"
            )));
        };
        match keys::authenticate(state.lifecycle.store().as_ref(), secret).await? {
            Some(key) => Ok(Authenticated(key)),
            None => Err(ApiError::unauthorized("invalid API key")),
        }
    }
}
