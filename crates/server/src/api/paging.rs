//! Cursor paging shared by the list endpoints: `limit` validation and the opaque `nextToken`
//! (base64url of `<millis>:<id>`, the sort key of the last row a page returned).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use super::error::ApiError;
use super::extract::QueryPairs;
use crate::store::Millis;

/// Largest page a list endpoint returns.
pub const MAX_PAGE: u32 = 100;

/// The token that resumes a listing after the row sorted by (`millis`, `id`).
pub fn encode_token(millis: Millis, id: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{millis}:{id}"))
}

pub fn decode_token(token: &str) -> Result<(Millis, String), ApiError> {
    let invalid = || ApiError::bad_request("invalid nextToken");
    let bytes = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    let (millis, id) = text.split_once(':').ok_or_else(invalid)?;
    Ok((millis.parse().map_err(|_| invalid())?, id.to_string()))
}

/// Cuts `records` (fetched with `limit + 1`) to one page; when more remain, the returned headers carry
/// the token of the page's last row in `X-Next-Token`.
pub fn trim_page<T>(
    records: &mut Vec<T>,
    limit: u32,
    token: impl Fn(&T) -> String,
) -> axum::http::HeaderMap {
    let mut headers = axum::http::HeaderMap::new();
    if records.len() > limit as usize {
        records.truncate(limit as usize);
        if let Some(last) = records.last() {
            if let Ok(value) = axum::http::HeaderValue::from_str(&token(last)) {
                headers.insert(warren_proto::api::NEXT_TOKEN_HEADER, value);
            }
        }
    }
    headers
}

/// `limit` from the query: 1..=MAX_PAGE, MAX_PAGE when absent.
pub fn limit(query: &QueryPairs) -> Result<u32, ApiError> {
    match query.get("limit") {
        None => Ok(MAX_PAGE),
        Some(limit) => match limit.parse::<u32>() {
            Ok(limit) if (1..=MAX_PAGE).contains(&limit) => Ok(limit),
            _ => Err(ApiError::bad_request(format!(
                "limit must be between 1 and {MAX_PAGE}, got {limit:?}"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_token_round_trips() {
        let token = encode_token(1_700_000_000_000, "abc");
        assert_eq!(
            decode_token(&token).unwrap(),
            (1_700_000_000_000, "abc".to_string())
        );
        assert!(decode_token("!!!").is_err());
        assert!(decode_token(&URL_SAFE_NO_PAD.encode("nocolon")).is_err());
        assert!(decode_token("%%").is_err());
        assert_eq!(
            decode_token(&URL_SAFE_NO_PAD.encode("1700000000000:snap-a")).unwrap(),
            (1_700_000_000_000, "snap-a".to_string())
        );
    }
}
