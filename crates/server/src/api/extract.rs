//! Extractors that turn malformed requests into `{code, message}` 400s instead of axum's plain-text
//! rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| ApiError::bad_request(format!("cannot read body: {rejection}")))?;
        parse_body(&bytes).map(ApiJson)
    }
}

/// Parses a JSON body; a refusal names the field at fault (`policies.reapOrphansEverySecs`), not
/// just the line and column.
fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let parsed: T = serde_path_to_error::deserialize(&mut reader).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if path.is_empty() || path == "." {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            ApiError::bad_request(format!("invalid request body at {path}: {inner}"))
        }
    })?;
    reader
        .end()
        .map_err(|error| ApiError::bad_request(format!("invalid request body: {error}")))?;
    Ok(parsed)
}

/// A JSON body that may be empty (then `T::default()`).
pub struct OptionalJson<T>(pub T);

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Default,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| ApiError::bad_request(format!("cannot read body: {rejection}")))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        parse_body(&bytes).map(OptionalJson)
    }
}

/// The query string as ordered pairs (keys may repeat).
pub struct QueryPairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryPairs {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str::<Vec<(String, String)>>(query)
            .map(QueryPairs)
            .map_err(|error| ApiError::bad_request(format!("invalid query string: {error}")))
    }
}

impl QueryPairs {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A 400 naming the first parameter that is not one of `known`.
    pub fn refuse_unknown(&self, known: &[&str]) -> Result<(), ApiError> {
        match self.0.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some((name, _)) => Err(ApiError::bad_request(format!(
                "unknown query parameter {name:?}; this endpoint takes {}",
                known.join(", ")
            ))),
        }
    }

    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}
