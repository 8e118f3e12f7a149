//! `/secrets`: E2B's stored secrets. A value goes in with a create or an update and never comes out:
//! every answer carries the id, name, version, metadata and times only, and no refusal quotes a
//! value (the body is read as JSON and checked here field by field, so a parse error cannot echo
//! it either). Sandboxes use values through `${e2b.secrets.<name>}` placeholders (docs/secrets.md).

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::{TimeZone, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::{ApiJson, QueryPairs};
use super::paging;
use super::AppState;
use crate::lifecycle::SecretChange;
use crate::store::SecretRecord;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(get_one, update, delete))
}

/// A stored secret as every answer shows it: never its value.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct Secret {
    /// `sec_` and 24 hex digits.
    #[serde(rename = "secretID")]
    secret_id: String,
    /// Lower-cased; unique in the team.
    name: String,
    /// Version of the value, from 1; each new value is the next.
    current_version: i64,
    metadata: BTreeMap<String, String>,
    created_at: chrono::DateTime<Utc>,
    updated_at: chrono::DateTime<Utc>,
}

/// The body of `POST /secrets`, for the OpenAPI document only: the handler reads the body field by
/// field (`fields`, `string_field`, `metadata_field`) so that no refusal can quote a value.
#[derive(utoipa::ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct NewSecret {
    /// 1-128 bytes of ASCII letters, digits, '_', '-', '.'; stored lower-cased; may not start with
    /// `sec_`.
    name: String,
    /// 1 byte to 64 KiB, no NUL; write-only: sealed with the operator's key and never returned.
    value: String,
    metadata: Option<BTreeMap<String, String>>,
}

/// The body of `POST /secrets/{secretID}`, for the OpenAPI document only (read as `NewSecret` is): a
/// value, metadata or both; a value becomes the next version (and reaches the egress rules of
/// running sandboxes that use it), metadata replaces the old.
#[derive(utoipa::ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct SecretUpdate {
    value: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
}

fn time(millis: i64) -> chrono::DateTime<Utc> {
    Utc.timestamp_millis_opt(millis)
        .single()
        .unwrap_or_default()
}

fn shown(record: &SecretRecord) -> Secret {
    Secret {
        secret_id: record.id.clone(),
        name: record.name.clone(),
        current_version: record.version,
        metadata: record.metadata.clone(),
        created_at: time(record.created_at),
        updated_at: time(record.updated_at),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("secret '{id}' not found"))
}

/// The body as an object whose fields are all among `known`.
fn fields(body: Value, known: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let Value::Object(map) = body else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown field {unknown:?}; this endpoint takes {}",
            known.join(", ")
        )));
    }
    Ok(map)
}

/// A string field; the refusal names the field, never what it held.
fn string_field(map: &mut Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match map.remove(field) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(ApiError::bad_request(format!("{field} must be a string"))),
    }
}

fn metadata_field(
    map: &mut Map<String, Value>,
) -> Result<Option<BTreeMap<String, String>>, ApiError> {
    match map.remove("metadata") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(entries)) => entries
            .into_iter()
            .map(|(key, value)| match value {
                Value::String(text) => Ok((key, text)),
                _ => Err(ApiError::bad_request(format!(
                    "metadata.{key} must be a string"
                ))),
            })
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(ApiError::bad_request(
            "metadata must be an object of strings",
        )),
    }
}

/// `POST /secrets`: 201 with the new secret (version 1); 409 when the team has one of that name.
#[utoipa::path(
    post,
    path = "/secrets",
    operation_id = "createSecret",
    summary = "Store a new secret (version 1)",
    request_body(content = NewSecret, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = Secret),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 409, description = "The team has a secret of that name", body = warren_proto::api::Error),
        (status = 500, description = "The secrets key is unusable (the message names the key file)", body = warren_proto::api::Error),
    ),
)]
async fn create(
    State(state): State<AppState>,
    key: Authenticated,
    ApiJson(body): ApiJson<Value>,
) -> Result<(StatusCode, Json<Secret>), ApiError> {
    let mut map = fields(body, &["name", "value", "metadata"])?;
    let name =
        string_field(&mut map, "name")?.ok_or_else(|| ApiError::bad_request("name is required"))?;
    let value = string_field(&mut map, "value")?
        .ok_or_else(|| ApiError::bad_request("value is required"))?;
    let metadata = metadata_field(&mut map)?.unwrap_or_default();
    let record = state
        .lifecycle
        .create_secret(key.team(), &name, &value, metadata)
        .await?;
    Ok((StatusCode::CREATED, Json(shown(&record))))
}

/// `GET /secrets`: the team's secrets, oldest first, `limit` at a time with `X-Next-Token`.
#[utoipa::path(
    get,
    path = "/secrets",
    operation_id = "listSecrets",
    summary = "The team's secrets, oldest first (names and metadata, never values)",
    params(
        ("limit" = Option<i64>, Query),
        ("nextToken" = Option<String>, Query, description = "X-Next-Token of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of secrets; X-Next-Token when more remain", body = [Secret], headers(("X-Next-Token" = String))),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
    ),
)]
async fn list(
    State(state): State<AppState>,
    key: Authenticated,
    query: QueryPairs,
) -> Result<(HeaderMap, Json<Vec<Secret>>), ApiError> {
    query.refuse_unknown(&["limit", "nextToken"])?;
    let limit = paging::limit(&query)?;
    let after = query
        .get("nextToken")
        .map(paging::decode_token)
        .transpose()?;
    let mut records = state
        .lifecycle
        .list_secrets(key.team(), after, limit + 1)
        .await?;
    let headers = paging::trim_page(&mut records, limit, |r| {
        paging::encode_token(r.created_at, &r.id)
    });
    Ok((headers, Json(records.iter().map(shown).collect())))
}

/// `GET /secrets/{id}` by id or name.
#[utoipa::path(
    get,
    path = "/secrets/{secretID}",
    operation_id = "getSecret",
    params(
        ("secretID" = String, Path, description = "The secret's id, or its name"),
    ),
    responses(
        (status = 200, description = "The secret", body = Secret),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, description = "No such secret in the team", body = warren_proto::api::Error),
    ),
)]
async fn get_one(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<Secret>, ApiError> {
    let record = state.lifecycle.secret(key.team(), &id).await?;
    record
        .map(|r| Json(shown(&r)))
        .ok_or_else(|| not_found(&id))
}

/// `POST /secrets/{id}`: a `value` becomes the next version; `metadata` replaces the old.
#[utoipa::path(
    post,
    path = "/secrets/{secretID}",
    operation_id = "updateSecret",
    params(
        ("secretID" = String, Path, description = "The secret's id, or its name"),
    ),
    request_body(content = SecretUpdate, content_type = "application/json"),
    responses(
        (status = 200, description = "Updated", body = Secret),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, description = "No such secret in the team", body = warren_proto::api::Error),
        (status = 409, description = "Changed meanwhile", body = warren_proto::api::Error),
    ),
)]
async fn update(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Secret>, ApiError> {
    let mut map = fields(body, &["value", "metadata"])?;
    let value = string_field(&mut map, "value")?;
    let metadata = metadata_field(&mut map)?;
    let change = match (value, metadata) {
        (Some(value), Some(metadata)) => SecretChange::Both(value, metadata),
        (Some(value), None) => SecretChange::Value(value),
        (None, Some(metadata)) => SecretChange::Metadata(metadata),
        (None, None) => {
            return Err(ApiError::bad_request(
                "an update needs a value, metadata or both",
            ))
        }
    };
    let record = state
        .lifecycle
        .update_secret(key.team(), &id, change)
        .await?;
    record
        .map(|r| Json(shown(&r)))
        .ok_or_else(|| not_found(&id))
}

/// `DELETE /secrets/{id}`: 204.
#[utoipa::path(
    delete,
    path = "/secrets/{secretID}",
    operation_id = "deleteSecret",
    summary = "Delete a secret; running sandboxes keep the values they were given",
    params(
        ("secretID" = String, Path, description = "The secret's id, or its name"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, description = "No such secret in the team", body = warren_proto::api::Error),
    ),
)]
async fn delete(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.lifecycle.delete_secret(key.team(), &id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found(&id))
    }
}
