//! `/sandboxes` and `/v2/sandboxes`: handlers parse and validate, then call the lifecycle.

use super::time;
use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_proto::api::{self, ENVD_VERSION};

use super::auth::Authenticated;
use super::error::ApiError;
use super::extract::{ApiJson, OptionalJson, QueryPairs};
use super::paging;
use super::AppState;
use crate::lifecycle::monitor::{cpu_count, sample_of};
use crate::lifecycle::state::SandboxState;
use crate::lifecycle::{CreateRequest, IdempotencyKey, LogItem, PauseMode, ResumeOutcome};
use crate::store::{
    LogLevel, LogQuery, MetricSample, Millis, SandboxFilter, SandboxIngress, SandboxRecord,
};
use warren_runtime::network::egress::{
    Cidr, EgressRules, HeaderRule, HostPattern, UpstreamProxy, UpstreamTls,
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_v1, list_v1))
        .routes(routes!(create_v2, list_v2))
        .routes(routes!(get_one, kill))
        .routes(routes!(set_timeout))
        .routes(routes!(update_network))
        .routes(routes!(refresh))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(connect))
        .routes(routes!(connect_v2))
        .routes(routes!(latest_metrics))
        .routes(routes!(metrics))
        .routes(routes!(processes))
        .routes(routes!(disk_usage))
        .routes(routes!(list_orphans, reap_orphans))
        .routes(routes!(signal_process))
        .routes(routes!(logs))
        .routes(routes!(logs_v2))
}

fn api_state(record: &SandboxRecord) -> api::SandboxState {
    record
        .state
        .api_state()
        .unwrap_or(api::SandboxState::Running)
}

pub(super) fn created(state: &AppState, record: &SandboxRecord) -> api::Sandbox {
    api::Sandbox {
        template_id: record.template_id.clone(),
        sandbox_id: record.id.clone(),
        client_id: record.client_id.clone(),
        envd_version: ENVD_VERSION.to_string(),
        alias: record.alias.clone(),
        envd_access_token: record.envd_access_token.clone(),
        traffic_access_token: record.traffic_access_token.clone(),
        domain: Some(state.lifecycle.config().domain.clone()),
    }
}

fn listed(record: &SandboxRecord) -> api::ListedSandbox {
    api::ListedSandbox {
        template_id: record.template_id.clone(),
        sandbox_id: record.id.clone(),
        client_id: record.client_id.clone(),
        started_at: time(record.started_at),
        end_at: time(record.end_at),
        cpu_count: cpu_count(record.vcpus),
        memory_mb: record.memory_mib,
        disk_size_mb: record.disk_mib,
        state: api_state(record),
        envd_version: ENVD_VERSION.to_string(),
        alias: record.alias.clone(),
        metadata: record.metadata.clone(),
    }
}

fn detail(state: &AppState, record: &SandboxRecord) -> api::SandboxDetail {
    api::SandboxDetail {
        template_id: record.template_id.clone(),
        sandbox_id: record.id.clone(),
        client_id: record.client_id.clone(),
        started_at: time(record.started_at),
        end_at: time(record.end_at),
        envd_version: ENVD_VERSION.to_string(),
        cpu_count: cpu_count(record.vcpus),
        memory_mb: record.memory_mib,
        disk_size_mb: record.disk_mib,
        state: api_state(record),
        alias: record.alias.clone(),
        envd_access_token: record.envd_access_token.clone(),
        allow_internet_access: record.allow_internet,
        domain: Some(state.lifecycle.config().domain.clone()),
        metadata: record.metadata.clone(),
        lifecycle: Some(api::SandboxLifecycle {
            auto_resume: record.auto_resume,
            on_timeout: if record.auto_pause {
                api::OnTimeout::Pause
            } else {
                api::OnTimeout::Kill
            },
        }),
        pause_mode: (record.state == SandboxState::Paused).then_some(api::PauseMode::Full),
        network: Some(network_detail(record)),
        policies: (record.policies != api::SandboxPolicies::default())
            .then(|| record.policies.clone()),
    }
}

/// The `network` of a sandbox's detail: its rules as stored (the DNS servers it was given are among
/// the allowed addresses), and whether its URLs are public.
fn network_detail(record: &SandboxRecord) -> api::SandboxNetwork {
    let egress = &record.egress;
    let allow: Vec<String> = egress
        .allow
        .iter()
        .map(ToString::to_string)
        .chain(egress.allow_hosts.iter().map(ToString::to_string))
        .collect();
    let deny: Vec<String> = egress.deny.iter().map(ToString::to_string).collect();
    // Header values are secrets: their names are shown, never their values.
    let rules: serde_json::Map<String, serde_json::Value> = egress
        .header_rules
        .iter()
        .map(|rule| {
            let headers: serde_json::Map<String, serde_json::Value> = rule
                .headers
                .iter()
                .map(|(name, _)| (name.clone(), serde_json::Value::from("[redacted]")))
                .collect();
            (
                rule.pattern.to_string(),
                serde_json::json!([{"transform": {"headers": headers}}]),
            )
        })
        .collect();
    // The proxy as E2B shows it: never its password nor its CA certificate.
    let egress_proxy = egress.upstream.as_ref().map(|upstream| {
        let mut shown = serde_json::json!({"address": upstream.address()});
        if let Some(user) = &upstream.username {
            shown["username"] = user.clone().into();
        }
        if let Some(tls) = &upstream.tls {
            let mut shown_tls = serde_json::json!({"enabled": true});
            if let Some(name) = &tls.server_name {
                shown_tls["serverName"] = name.clone().into();
            }
            shown["tls"] = shown_tls;
        }
        shown
    });
    api::SandboxNetwork {
        allow_public_traffic: Some(record.traffic_access_token.is_none()),
        allow_out: (!allow.is_empty()).then_some(allow),
        deny_out: (!deny.is_empty()).then_some(deny),
        rules: (!rules.is_empty()).then_some(serde_json::Value::Object(rules)),
        egress_proxy,
        mask_request_host: record.ingress.mask_request_host.clone(),
        https_ports: (!record.ingress.https_ports.is_empty())
            .then(|| record.ingress.https_ports.clone()),
        ..api::SandboxNetwork::default()
    }
}

fn create_request(
    key: &Authenticated,
    body: api::NewSandbox,
    secure: bool,
) -> Result<CreateRequest, ApiError> {
    let template = body.template_id.trim().to_string();
    if template.is_empty() {
        return Err(ApiError::bad_request("templateID must not be empty"));
    }
    let files_only = body.auto_pause_memory == Some(false);
    if files_only
        && body
            .auto_resume
            .as_ref()
            .is_some_and(|config| config.enabled)
    {
        return Err(ApiError::bad_request(
            "autoPauseMemory=false cannot be combined with autoResume.enabled=true: a filesystem-only \
             pause cold-boots on resume, which traffic must not trigger (SDK: on_timeout mode \"filesystem\" \
             without auto_resume)",
        ));
    }
    let mut unsupported: Vec<&str> = Vec::new();
    for (name, value) in [("mcp", &body.mcp), ("iam", &body.iam)] {
        if value.as_ref().is_some_and(|v| !v.is_null()) {
            unsupported.push(name);
        }
    }
    if !unsupported.is_empty() {
        return Err(ApiError::bad_request(format!(
            "not supported by this server yet: {} (the sandbox was not created)",
            unsupported.join(", ")
        )));
    }
    let volume_mounts: Vec<api::SandboxVolumeMount> = match &body.volume_mounts {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(value) => serde_json::from_value(value.clone()).map_err(|e| {
            ApiError::bad_request(format!(
                "volumeMounts must be a list of {{name, path}}: {e}"
            ))
        })?,
    };
    let egress = match body.network.as_ref() {
        Some(network) => egress_rules(
            network.allow_out.as_deref(),
            network.deny_out.as_deref(),
            network.dns_servers.as_deref(),
            network.rules.as_ref(),
            network.egress_proxy.as_ref(),
        )?,
        None => EgressRules::default(),
    };
    let ingress = match body.network.as_ref() {
        Some(network) => ingress(
            network.mask_request_host.as_deref(),
            network.https_ports.as_deref(),
        )?,
        None => SandboxIngress::default(),
    };
    Ok(CreateRequest {
        team_id: key.team().to_string(),
        egress,
        ingress,
        template,
        timeout: body.timeout,
        auto_pause: body.auto_pause.unwrap_or(false),
        auto_pause_files_only: files_only,
        auto_resume: body.auto_resume.map(|config| config.enabled),
        secure,
        private_traffic: body.network.as_ref().and_then(|n| n.allow_public_traffic) == Some(false),
        allow_internet: body.allow_internet_access,
        metadata: body.metadata.unwrap_or_default(),
        env_vars: body.env_vars.unwrap_or_default(),
        policies: checked_policies(body.policies.unwrap_or_default())?,
        volume_mounts,
    })
}

/// The create body's `policies`, refused by name when out of range.
pub(super) fn checked_policies(
    policies: api::SandboxPolicies,
) -> Result<api::SandboxPolicies, ApiError> {
    for (name, value) in [
        ("memoryAlertPercent", policies.memory_alert_percent),
        ("diskAlertPercent", policies.disk_alert_percent),
    ] {
        if let Some(percent) = value {
            if !(0.0..=100.0).contains(&percent) {
                return Err(ApiError::bad_request(format!(
                    "policies.{name} must be from 0 (off) to 100, got {percent}"
                )));
            }
        }
    }
    if let Some(runaway) = &policies.runaway {
        if let Some(percent) = runaway.cpu_percent {
            if !percent.is_finite() || percent < 0.0 {
                return Err(ApiError::bad_request(format!(
                    "policies.runaway.cpuPercent must be 0 (off) or a positive percent of one core, got {percent}"
                )));
            }
        }
        if runaway.seconds == Some(0) {
            return Err(ApiError::bad_request(
                "policies.runaway.seconds must be at least 1",
            ));
        }
    }
    Ok(policies)
}

/// The header a client retries a create with to get the first create's sandbox back.
const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

#[utoipa::path(
    post,
    path = "/sandboxes",
    operation_id = "createSandbox",
    summary = "Create a sandbox",
    request_body(content = api::NewSandbox, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = api::Sandbox),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 429, response = super::error::TooManyRequests),
        (status = 500, response = super::error::InternalError),
        (status = 503, response = super::error::ServiceUnavailable),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn create_v1(
    State(state): State<AppState>,
    key: Authenticated,
    headers: HeaderMap,
    ApiJson(body): ApiJson<api::NewSandbox>,
) -> Result<(StatusCode, Json<api::Sandbox>), ApiError> {
    let secure = body.secure.unwrap_or(false);
    create_with(&state, &key, &headers, "/sandboxes", body, secure).await
}

#[utoipa::path(
    post,
    path = "/v2/sandboxes",
    operation_id = "createSandboxV2",
    summary = "Create a sandbox (always secured)",
    request_body(content = api::NewSandbox, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = api::Sandbox),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 429, response = super::error::TooManyRequests),
        (status = 500, response = super::error::InternalError),
        (status = 503, response = super::error::ServiceUnavailable),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn create_v2(
    State(state): State<AppState>,
    key: Authenticated,
    headers: HeaderMap,
    ApiJson(body): ApiJson<api::NewSandbox>,
) -> Result<(StatusCode, Json<api::Sandbox>), ApiError> {
    create_with(&state, &key, &headers, "/v2/sandboxes", body, true).await
}

async fn create_with(
    state: &AppState,
    key: &Authenticated,
    headers: &HeaderMap,
    route: &str,
    body: api::NewSandbox,
    secure: bool,
) -> Result<(StatusCode, Json<api::Sandbox>), ApiError> {
    let idempotency = match headers.get(IDEMPOTENCY_KEY_HEADER) {
        None => None,
        Some(value) => {
            let value = value
                .to_str()
                .map_err(|_| ApiError::bad_request("Idempotency-Key must be printable ASCII"))?;
            // The parsed body, serialised again: the same request in another spelling is the same.
            let canonical = serde_json::to_vec(&body).unwrap_or_default();
            Some(IdempotencyKey::new(value, route, &canonical)?)
        }
    };
    let request = create_request(key, body, secure)?;
    let created_sandbox = match &idempotency {
        Some(idempotency) => state.lifecycle.create_once(request, idempotency).await?,
        None => state.lifecycle.create(request).await?,
    };
    Ok((
        StatusCode::CREATED,
        Json(created(state, &created_sandbox.record)),
    ))
}

/// `metadata=k1%3Dv1%26k2%3Dv2`: a form-encoded list whose keys and values the SDK percent-encodes once
/// more.
fn parse_metadata(query: &QueryPairs) -> Result<BTreeMap<String, String>, ApiError> {
    let mut metadata = BTreeMap::new();
    for encoded in query.all("metadata") {
        let pairs = serde_urlencoded::from_str::<Vec<(String, String)>>(encoded)
            .map_err(|error| ApiError::bad_request(format!("invalid metadata filter: {error}")))?;
        for (key, value) in pairs {
            let key = percent_encoding::percent_decode_str(&key)
                .decode_utf8_lossy()
                .into_owned();
            let value = percent_encoding::percent_decode_str(&value)
                .decode_utf8_lossy()
                .into_owned();
            metadata.insert(key, value);
        }
    }
    Ok(metadata)
}

fn parse_states(query: &QueryPairs) -> Result<Vec<SandboxState>, ApiError> {
    let mut states = Vec::new();
    for value in query.all("state") {
        for name in value
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
        {
            let state = api::SandboxState::parse(name).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "invalid state {name:?}: expected running or paused"
                ))
            })?;
            states.extend_from_slice(SandboxState::from_api_state(state));
        }
    }
    Ok(states)
}

#[utoipa::path(
    get,
    path = "/sandboxes",
    operation_id = "listSandboxes",
    summary = "List running sandboxes",
    params(
        ("metadata" = Option<String>, Query, description = "URL-encoded key=value pairs, all must match"),
    ),
    responses(
        (status = 200, description = "Sandboxes", body = [api::ListedSandbox]),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn list_v1(
    State(state): State<AppState>,
    key: Authenticated,
    query: QueryPairs,
) -> Result<Json<Vec<api::ListedSandbox>>, ApiError> {
    let filter = SandboxFilter {
        team_id: Some(key.team().to_string()),
        states: SandboxState::from_api_state(api::SandboxState::Running).to_vec(),
        metadata: parse_metadata(&query)?,
        ..SandboxFilter::default()
    };
    let records = state.lifecycle.list(&filter).await?;
    Ok(Json(records.iter().map(listed).collect()))
}

fn encode_token(record: &SandboxRecord) -> String {
    paging::encode_token(record.started_at, &record.id)
}

#[utoipa::path(
    get,
    path = "/v2/sandboxes",
    operation_id = "listSandboxesV2",
    summary = "List sandboxes with filters and pagination",
    params(
        ("metadata" = Option<String>, Query, description = "URL-encoded key=value pairs, all must match"),
        ("state" = Option<String>, Query, description = "Comma-separated states: running, paused"),
        ("template" = Option<String>, Query),
        ("startedAfter" = Option<String>, Query),
        ("order" = Option<String>, Query),
        ("nextToken" = Option<String>, Query),
        ("limit" = Option<i64>, Query),
    ),
    responses(
        (status = 200, description = "Sandboxes", body = [api::ListedSandbox], headers(("x-next-token" = String, description = "Token of the next page; absent on the last page"))),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn list_v2(
    State(state): State<AppState>,
    key: Authenticated,
    query: QueryPairs,
) -> Result<Response, ApiError> {
    let limit = paging::limit(&query)?;
    let descending = match query.get("order") {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid order {other:?}: expected asc or desc"
            )))
        }
    };
    let started_after = match query.get("startedAfter") {
        None => None,
        Some(value) => Some(
            DateTime::parse_from_rfc3339(value)
                .map_err(|error| {
                    ApiError::bad_request(format!("invalid startedAfter {value:?}: {error}"))
                })?
                .timestamp_millis(),
        ),
    };
    let filter = SandboxFilter {
        team_id: Some(key.team().to_string()),
        states: parse_states(&query)?,
        metadata: parse_metadata(&query)?,
        template: query.get("template").map(str::to_string),
        started_after,
        descending,
        after: query
            .get("nextToken")
            .map(paging::decode_token)
            .transpose()?,
        limit: Some(limit + 1),
    };
    let mut records = state.lifecycle.list(&filter).await?;
    let headers = paging::trim_page(&mut records, limit, encode_token);
    let body: Vec<api::ListedSandbox> = records.iter().map(listed).collect();
    Ok((headers, Json(body)).into_response())
}

#[utoipa::path(
    get,
    path = "/sandboxes/{sandboxID}",
    operation_id = "getSandbox",
    params(
        ("sandboxID" = String, Path),
    ),
    responses(
        (status = 200, description = "Sandbox", body = api::SandboxDetail),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn get_one(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<api::SandboxDetail>, ApiError> {
    let record = key.sandbox(&state, &id).await?;
    Ok(Json(detail(&state, &record)))
}

#[utoipa::path(
    delete,
    path = "/sandboxes/{sandboxID}",
    operation_id = "killSandbox",
    params(
        ("sandboxID" = String, Path),
    ),
    responses(
        (status = 204, description = "Killed"),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn kill(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    key.sandbox(&state, &id).await?;
    state.lifecycle.kill(&id, "killed through the API").await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/sandboxes/{sandboxID}/timeout",
    operation_id = "setSandboxTimeout",
    params(
        ("sandboxID" = String, Path),
    ),
    request_body(content = api::SandboxTimeoutRequest, content_type = "application/json"),
    responses(
        (status = 204, description = "Timeout set"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn set_timeout(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<api::SandboxTimeoutRequest>,
) -> Result<StatusCode, ApiError> {
    key.sandbox(&state, &id).await?;
    state.lifecycle.set_timeout(&id, body.timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /sandboxes/{id}/network` (`Sandbox.update_network`): replaces the sandbox's address rules
/// (`allowOut` / `denyOut`) at once and atomically; what the server does not enforce yet is refused
/// by name and nothing changes.
#[utoipa::path(
    put,
    path = "/sandboxes/{sandboxID}/network",
    operation_id = "updateSandboxNetwork",
    description = "Replaces the sandbox's address rules (allowOut/denyOut: IPv4 addresses and CIDRs) at once, without a restart; they are kept for its resume and forks. Host names and the other fields this server does not enforce are refused with 400 naming them; nothing changes then.",
    params(
        ("sandboxID" = String, Path),
    ),
    request_body(content = api::SandboxNetworkUpdate, content_type = "application/json"),
    responses(
        (status = 204, description = "Rules replaced"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn update_network(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<api::SandboxNetworkUpdate>,
) -> Result<StatusCode, ApiError> {
    key.sandbox(&state, &id).await?;
    let asked = body.requested_fields();
    if !asked.is_empty() {
        return Err(ApiError::bad_request(format!(
            "not supported by this server yet: {} (the sandbox's network is unchanged)",
            asked.join(", ")
        )));
    }
    let rules = egress_rules(
        body.allow_out.as_deref(),
        body.deny_out.as_deref(),
        body.dns_servers.as_deref(),
        body.rules.as_ref(),
        body.egress_proxy.as_ref(),
    )?;
    state.lifecycle.set_egress(&id, rules).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Most `httpsPorts` entries.
const MAX_HTTPS_PORTS: usize = 64;

/// `network.maskRequestHost` (a `host[:port]` with `${PORT}` for the port a request is for) and
/// `network.httpsPorts`; anything malformed is a 400 naming the field.
fn ingress(mask: Option<&str>, https_ports: Option<&[u16]>) -> Result<SandboxIngress, ApiError> {
    let mask = match mask {
        None => None,
        Some(mask) => {
            let mask = mask.trim();
            let example = mask.replace("${PORT}", "65535");
            let (host, port) = match example.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (example.as_str(), None),
            };
            let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p != 0));
            let host_ok = host.parse::<std::net::Ipv4Addr>().is_ok()
                || warren_runtime::network::egress::is_host_name(host);
            if mask.is_empty() || mask.len() > 255 || !port_ok || !host_ok {
                return Err(ApiError::bad_request(format!(
                    "network.maskRequestHost: {mask:?} is not a host[:port] (a host name or IPv4 \
                     address, ${{PORT}} standing for the port)"
                )));
            }
            Some(mask.to_string())
        }
    };
    let mut ports: Vec<u16> = Vec::new();
    let given = https_ports.unwrap_or_default();
    if given.len() > MAX_HTTPS_PORTS {
        return Err(ApiError::bad_request(format!(
            "network.httpsPorts has {} entries; at most {MAX_HTTPS_PORTS}",
            given.len()
        )));
    }
    for &port in given {
        if port == 0 || port == warren_runtime::AGENT_PORT {
            return Err(ApiError::bad_request(format!(
                "network.httpsPorts: {port} is not a port of the sandbox's own services"
            )));
        }
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    Ok(SandboxIngress {
        mask_request_host: mask,
        https_ports: ports,
    })
}

/// Most `dnsServers` entries, as in E2B.
const MAX_DNS_SERVERS: usize = 10;

/// `allowOut` (addresses, CIDRs, host names, `*.domain` wildcards), `denyOut` (addresses and CIDRs)
/// and `dnsServers` as egress rules; anything malformed is a 400 naming the field and the entry.
/// As in E2B, the DNS servers are allowed (all traffic to them) only when `allowOut` names a host.
fn egress_rules(
    allow: Option<&[String]>,
    deny: Option<&[String]>,
    dns_servers: Option<&[String]>,
    rules: Option<&serde_json::Value>,
    egress_proxy: Option<&serde_json::Value>,
) -> Result<EgressRules, ApiError> {
    let upstream = match egress_proxy {
        None | Some(serde_json::Value::Null) => None,
        Some(value) => Some(upstream_proxy(value).map_err(ApiError::bad_request)?),
    };
    let header_rules = match rules {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(rules) => header_rules(rules).map_err(ApiError::bad_request)?,
    };
    let (mut allow, allow_hosts) =
        EgressRules::parse_allow("network.allowOut", allow.unwrap_or_default())
            .map_err(ApiError::bad_request)?;
    let deny = EgressRules::parse_list("network.denyOut", deny.unwrap_or_default())
        .map_err(ApiError::bad_request)?;
    let dns_servers = dns_servers.unwrap_or_default();
    if dns_servers.len() > MAX_DNS_SERVERS {
        return Err(ApiError::bad_request(format!(
            "network.dnsServers has {} entries; at most {MAX_DNS_SERVERS}",
            dns_servers.len()
        )));
    }
    for server in dns_servers {
        let ip: std::net::Ipv4Addr = server.trim().parse().map_err(|_| {
            ApiError::bad_request(format!(
                "network.dnsServers: {server:?} is not an IPv4 address"
            ))
        })?;
        let cidr = Cidr {
            network: ip,
            prefix: 32,
        };
        if !allow_hosts.is_empty() && !allow.contains(&cidr) {
            allow.push(cidr);
        }
    }
    Ok(EgressRules {
        allow,
        allow_hosts,
        deny,
        header_rules,
        upstream,
    })
}

/// E2B's `network.egressProxy`: `{"address": "host:port", "username", "password", "tls": {"enabled",
/// "serverName", "caCert"}}` (`tls` may also be a plain bool). Unknown fields are refused by name.
fn upstream_proxy(value: &serde_json::Value) -> Result<UpstreamProxy, String> {
    let field = "network.egressProxy";
    let object = value
        .as_object()
        .ok_or_else(|| format!("{field} must be an object with an address"))?;
    if let Some(other) = object
        .keys()
        .find(|k| !["address", "username", "password", "tls"].contains(&k.as_str()))
    {
        return Err(format!("{field}: unknown field {other:?}"));
    }
    let text = |name: &str| -> Result<Option<String>, String> {
        match object.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{field}.{name} must be a string")),
        }
    };
    let address = text("address")?.ok_or_else(|| format!("{field}.address is required"))?;
    let (host, port) = UpstreamProxy::parse_address(&address)?;
    let tls = match object.get("tls") {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => None,
        Some(serde_json::Value::Bool(true)) => Some(UpstreamTls::default()),
        Some(serde_json::Value::Object(tls)) => {
            if let Some(other) = tls
                .keys()
                .find(|k| !["enabled", "serverName", "caCert"].contains(&k.as_str()))
            {
                return Err(format!("{field}.tls: unknown field {other:?}"));
            }
            let tls_text = |name: &str| -> Result<Option<String>, String> {
                match tls.get(name) {
                    None | Some(serde_json::Value::Null) => Ok(None),
                    Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                    Some(_) => Err(format!("{field}.tls.{name} must be a string")),
                }
            };
            let settings = UpstreamTls {
                server_name: tls_text("serverName")?,
                ca_cert: tls_text("caCert")?,
            };
            match tls.get("enabled") {
                Some(serde_json::Value::Bool(true)) | None => Some(settings),
                Some(serde_json::Value::Bool(false)) if settings == UpstreamTls::default() => None,
                Some(serde_json::Value::Bool(false)) => {
                    return Err(format!(
                        "{field}.tls: serverName and caCert need enabled: true"
                    ))
                }
                Some(_) => return Err(format!("{field}.tls.enabled must be a bool")),
            }
        }
        Some(_) => return Err(format!("{field}.tls must be a bool or an object")),
    };
    let upstream = UpstreamProxy {
        host,
        port,
        username: text("username")?,
        password: text("password")?,
        tls,
    };
    upstream.validate()?;
    Ok(upstream)
}

/// Most hosts in `network.rules`, and headers per host.
const MAX_RULE_HOSTS: usize = 64;
const MAX_RULE_HEADERS: usize = 32;

/// E2B's `network.rules`: `{"<host or *.domain>": [{"transform": {"headers": {"Name": "value"}}}]}`.
/// The headers of a host's rules are applied in order (a later one of the same name wins).
fn header_rules(value: &serde_json::Value) -> Result<Vec<HeaderRule>, String> {
    let object = value
        .as_object()
        .ok_or("network.rules must be an object of host name to a list of rules")?;
    if object.len() > MAX_RULE_HOSTS {
        return Err(format!(
            "network.rules names {} hosts; at most {MAX_RULE_HOSTS}",
            object.len()
        ));
    }
    let mut out: Vec<HeaderRule> = Vec::new();
    for (host, list) in object {
        let at = |what: &str| format!("network.rules[{host:?}]: {what}");
        let pattern: HostPattern = host.parse().map_err(|e| format!("network.rules: {e}"))?;
        let list = list
            .as_array()
            .ok_or_else(|| at("must be a list of rules"))?;
        let mut headers: Vec<(String, String)> = Vec::new();
        for rule in list {
            let rule = rule
                .as_object()
                .ok_or_else(|| at("a rule must be an object"))?;
            if let Some(other) = rule.keys().find(|k| k.as_str() != "transform") {
                return Err(at(&format!("unknown rule field {other:?}")));
            }
            let Some(transform) = rule.get("transform") else {
                continue;
            };
            let transform = transform
                .as_object()
                .ok_or_else(|| at("transform must be an object"))?;
            if let Some(other) = transform.keys().find(|k| k.as_str() != "headers") {
                return Err(at(&format!(
                    "transform field {other:?} is not supported (only headers)"
                )));
            }
            let Some(set) = transform.get("headers") else {
                continue;
            };
            let set = set
                .as_object()
                .ok_or_else(|| at("transform.headers must be an object of name to value"))?;
            for (name, value) in set {
                let value = value
                    .as_str()
                    .ok_or_else(|| at(&format!("header {name:?} must have a string value")))?;
                if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    return Err(at(&format!("{name:?} is not a valid header name")));
                }
                if hyper::header::HeaderValue::from_str(value).is_err() {
                    return Err(at(&format!("the value of header {name:?} is not valid")));
                }
                headers.retain(|(existing, _)| !existing.eq_ignore_ascii_case(name));
                headers.push((name.clone(), value.to_string()));
            }
        }
        if headers.len() > MAX_RULE_HEADERS {
            return Err(at(&format!("at most {MAX_RULE_HEADERS} headers")));
        }
        if out.iter().any(|rule| rule.pattern == pattern) {
            return Err(format!("network.rules names {pattern} twice"));
        }
        out.push(HeaderRule { pattern, headers });
    }
    Ok(out)
}

#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
struct RefreshRequest {
    duration: Option<i64>,
}

#[utoipa::path(
    post,
    path = "/sandboxes/{sandboxID}/refreshes",
    operation_id = "refreshSandbox",
    params(
        ("sandboxID" = String, Path),
    ),
    request_body(content = Option<RefreshRequest>, content_type = "application/json"),
    responses(
        (status = 204, description = "Refreshed"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn refresh(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<RefreshRequest>,
) -> Result<StatusCode, ApiError> {
    key.sandbox(&state, &id).await?;
    let timeout = body
        .duration
        .unwrap_or(state.lifecycle.config().limits.default_timeout.as_secs() as i64);
    state.lifecycle.set_timeout(&id, timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/sandboxes/{sandboxID}/pause",
    operation_id = "pauseSandbox",
    description = "Checkpoints to disk where the host has CRIU, else freezes in memory (see /health pauseMode).",
    params(
        ("sandboxID" = String, Path),
    ),
    request_body(content = Option<api::SandboxPauseRequest>, content_type = "application/json"),
    responses(
        (status = 204, description = "Paused"),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
        (status = 503, response = super::error::GuestUnresponsive),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn pause(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<api::SandboxPauseRequest>,
) -> Result<StatusCode, ApiError> {
    key.sandbox(&state, &id).await?;
    let mode = if body.memory == Some(false) {
        PauseMode::Filesystem
    } else {
        PauseMode::Memory
    };
    let strict = body.require_healthy_guest == Some(true);
    state
        .lifecycle
        .pause_as(&id, "paused through the API", mode, strict)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/sandboxes/{sandboxID}/resume",
    operation_id = "resumeSandbox",
    params(
        ("sandboxID" = String, Path),
    ),
    request_body(content = Option<api::ConnectSandbox>, content_type = "application/json"),
    responses(
        (status = 201, description = "Resumed", body = api::Sandbox),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
        (status = 503, response = super::error::ServiceUnavailable),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn resume(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<api::ConnectSandbox>,
) -> Result<(StatusCode, Json<api::Sandbox>), ApiError> {
    key.sandbox(&state, &id).await?;
    let record = state.lifecycle.get(&id).await?;
    if record.state.api_state() == Some(api::SandboxState::Running) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already running"),
        ));
    }
    let reboot = body.memory == Some(false);
    let (record, _) = state.lifecycle.resume_as(&id, body.timeout, reboot).await?;
    Ok((StatusCode::CREATED, Json(created(&state, &record))))
}

#[utoipa::path(
    post,
    path = "/v2/sandboxes/{sandboxID}/connect",
    operation_id = "connectSandboxV2",
    params(
        ("sandboxID" = String, Path),
    ),
    request_body(content = Option<api::ConnectSandbox>, content_type = "application/json"),
    responses(
        (status = 200, description = "Already running", body = api::Sandbox),
        (status = 201, description = "Resumed", body = api::Sandbox),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
        (status = 503, response = super::error::ServiceUnavailable),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn connect_v2(
    state: State<AppState>,
    key: Authenticated,
    id: Path<String>,
    body: OptionalJson<api::ConnectSandbox>,
) -> Result<(StatusCode, Json<api::Sandbox>), ApiError> {
    connect(state, key, id, body).await
}

#[utoipa::path(
    post,
    path = "/sandboxes/{sandboxID}/connect",
    operation_id = "connectSandbox",
    params(
        ("sandboxID" = String, Path),
    ),
    request_body(content = Option<api::ConnectSandbox>, content_type = "application/json"),
    responses(
        (status = 200, description = "Already running", body = api::Sandbox),
        (status = 201, description = "Resumed", body = api::Sandbox),
        (status = 400, response = super::error::BadRequest),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
        (status = 503, response = super::error::ServiceUnavailable),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn connect(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<api::ConnectSandbox>,
) -> Result<(StatusCode, Json<api::Sandbox>), ApiError> {
    key.sandbox(&state, &id).await?;
    let reboot = body.memory == Some(false);
    let (record, outcome) = state.lifecycle.resume_as(&id, body.timeout, reboot).await?;
    let status = match outcome {
        ResumeOutcome::Resumed => StatusCode::CREATED,
        ResumeOutcome::AlreadyRunning => StatusCode::OK,
    };
    Ok((status, Json(created(&state, &record))))
}

fn metric(sample: &MetricSample) -> api::SandboxMetric {
    let at = time(sample.at);
    api::SandboxMetric {
        timestamp: at,
        timestamp_unix: at.timestamp(),
        cpu_count: sample.cpu_count,
        cpu_used_pct: sample.cpu_pct,
        mem_used: sample.mem_used,
        mem_total: sample.mem_total,
        mem_cache: sample.mem_cache,
        disk_used: sample.disk_used,
        disk_total: sample.disk_total,
        net_rx_bytes: sample.net_rx,
        net_tx_bytes: sample.net_tx,
    }
}

/// A time in the query string (absent or empty: `None`); `unit` names it in the refusal.
fn unix_time(query: &QueryPairs, name: &str, unit: &str) -> Result<Option<i64>, ApiError> {
    match query.get(name) {
        None | Some("") => Ok(None),
        Some(text) => text.parse::<i64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!("{name} must be unix {unit}, got {text:?}"))
        }),
    }
}

/// A `start`/`end` query value: unix seconds.
fn unix_seconds(query: &QueryPairs, name: &str) -> Result<Option<i64>, ApiError> {
    unix_time(query, name, "seconds")
}

/// A log cursor: unix milliseconds.
fn unix_millis(query: &QueryPairs, name: &str) -> Result<Option<Millis>, ApiError> {
    unix_time(query, name, "milliseconds")
}

/// `GET /sandboxes/{id}/metrics?start=&end=` (unix seconds, both optional): the samples the monitor
/// took in that range, oldest first; without a range, from the sandbox's start to now. A sandbox
/// too young to have a stored sample gets one measured now when the range reaches the present.
#[utoipa::path(
    get,
    path = "/sandboxes/{sandboxID}/metrics",
    operation_id = "getSandboxMetrics",
    params(
        ("sandboxID" = String, Path),
        ("start" = Option<i64>, Query, description = "Unix seconds; default: the sandbox's start"),
        ("end" = Option<i64>, Query, description = "Unix seconds; default: now"),
    ),
    responses(
        (status = 200, description = "The monitor's samples in the range, oldest first; a sample measured now when none is stored yet and the range reaches the present (empty while checkpointed)", body = [api::SandboxMetric]),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
        (status = 400, response = super::error::BadRequest),
    ),
)]
async fn metrics(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    query: QueryPairs,
) -> Result<Json<Vec<api::SandboxMetric>>, ApiError> {
    let record = key.sandbox(&state, &id).await?;
    let start = unix_seconds(&query, "start")?;
    let end = unix_seconds(&query, "end")?;
    if let (Some(start), Some(end)) = (start, end) {
        if start > end {
            return Err(ApiError::bad_request(format!(
                "start ({start}) is after end ({end})"
            )));
        }
    }
    let now = crate::lifecycle::now_millis();
    let from = start.map_or(record.started_at, |s| s.saturating_mul(1000));
    let to = end.map_or(now, |e| e.saturating_mul(1000).saturating_add(999));
    let samples = state
        .lifecycle
        .store()
        .metric_samples(&record.id, from, to)
        .await?;
    if samples.is_empty() && to >= now {
        if let Some(stats) = state.lifecycle.stats(&id).await? {
            return Ok(Json(vec![metric(&sample_of(&record, &stats, now))]));
        }
    }
    Ok(Json(samples.iter().map(metric).collect()))
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: the newest stored sample of each of the team's
/// sandboxes named (others' and unknown IDs are left out, as E2B does).
#[utoipa::path(
    get,
    path = "/sandboxes/metrics",
    operation_id = "getSandboxesMetrics",
    summary = "Newest stored sample of each of the team's sandboxes named (others and unknown IDs are left out)",
    params(
        ("sandbox_ids" = String, Query, description = "Comma-separated sandbox IDs, at most 100"),
    ),
    responses(
        (status = 200, description = "SandboxesWithMetrics: {sandboxes: {id: SandboxMetric}}", body = api::SandboxesWithMetrics),
        (status = 400, description = "sandbox_ids missing or naming more than 100"),
        (status = 401, response = super::error::Unauthorized),
    ),
)]
async fn latest_metrics(
    State(state): State<AppState>,
    key: Authenticated,
    query: QueryPairs,
) -> Result<Json<api::SandboxesWithMetrics>, ApiError> {
    let Some(ids) = query.get("sandbox_ids") else {
        return Err(ApiError::bad_request(
            "sandbox_ids is required: a comma-separated list of sandbox IDs",
        ));
    };
    const MOST: usize = 100;
    let mut owned = Vec::new();
    for id in ids.split(',').map(str::trim).filter(|id| !id.is_empty()) {
        if owned.len() == MOST {
            return Err(ApiError::bad_request(format!(
                "sandbox_ids names more than {MOST} sandboxes"
            )));
        }
        if key.sandbox(&state, id).await.is_ok() {
            owned.push(id.to_string());
        }
    }
    let latest = state
        .lifecycle
        .store()
        .latest_metric_samples(&owned)
        .await?;
    Ok(Json(api::SandboxesWithMetrics {
        sandboxes: latest
            .iter()
            .map(|sample| (sample.sandbox_id.clone(), metric(sample)))
            .collect(),
    }))
}

/// Warren's own `GET /sandboxes/{id}/processes`: every process of a running sandbox, busiest first.
#[utoipa::path(
    get,
    path = "/sandboxes/{sandboxID}/processes",
    operation_id = "listSandboxProcesses",
    summary = "Warren's own: a running sandbox's processes, busiest first (PIDs as the sandbox sees them)",
    params(
        ("sandboxID" = String, Path),
    ),
    responses(
        (status = 200, description = "SandboxProcess list: pid, ppid, user, command, cpuPercent (of one core, since the previous listing), rssBytes, startedAt", body = [api::SandboxProcess]),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, description = "the sandbox is not running"),
    ),
)]
async fn processes(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<Vec<api::SandboxProcess>>, ApiError> {
    key.sandbox(&state, &id).await?;
    let mut list = state.lifecycle.processes(&id).await?;
    list.sort_by(|a, b| {
        b.cpu_percent
            .total_cmp(&a.cpu_percent)
            .then(a.pid.cmp(&b.pid))
    });
    Ok(Json(api_processes(list)))
}

fn api_processes(list: Vec<warren_runtime::ProcessInfo>) -> Vec<api::SandboxProcess> {
    list.into_iter()
        .map(|p| api::SandboxProcess {
            pid: p.pid,
            ppid: p.ppid,
            user: p.user,
            command: p.command,
            cpu_percent: p.cpu_percent,
            rss_bytes: p.rss_bytes,
            started_at: DateTime::<Utc>::from(p.started_at),
        })
        .collect()
}

/// Warren's own `GET /sandboxes/{id}/orphans`: the processes finished commands left running (adopted
/// by the sandbox's init, not started by its agent for a client), with their descendants.
#[utoipa::path(
    get,
    path = "/sandboxes/{sandboxID}/orphans",
    operation_id = "listSandboxOrphans",
    summary = "Warren's own: processes finished commands left running (adopted by PID 1, not the agent's own), with their descendants",
    params(
        ("sandboxID" = String, Path),
    ),
    responses(
        (status = 200, description = "SandboxProcess list (as /processes)", body = [api::SandboxProcess]),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, description = "the sandbox is not running, or its agent did not list its processes"),
    ),
)]
async fn list_orphans(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<Vec<api::SandboxProcess>>, ApiError> {
    key.sandbox(&state, &id).await?;
    Ok(Json(api_processes(state.lifecycle.orphans(&id).await?)))
}

/// Warren's own `DELETE /sandboxes/{id}/orphans`: kills them; answers the ones killed.
#[utoipa::path(
    delete,
    path = "/sandboxes/{sandboxID}/orphans",
    operation_id = "reapSandboxOrphans",
    summary = "Warren's own: kill the orphaned processes; answers the ones killed",
    params(
        ("sandboxID" = String, Path),
    ),
    responses(
        (status = 200, description = "SandboxProcess list (as /processes)", body = [api::SandboxProcess]),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, description = "the sandbox is not running, or its agent did not list its processes"),
    ),
)]
async fn reap_orphans(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<Vec<api::SandboxProcess>>, ApiError> {
    key.sandbox(&state, &id).await?;
    Ok(Json(api_processes(
        state.lifecycle.reap_orphans(&id, "on request").await?,
    )))
}

/// Warren's own `GET /sandboxes/{id}/disk?count=N`: how full a running sandbox's writable layer is
/// and its N (10) largest files.
#[utoipa::path(
    get,
    path = "/sandboxes/{sandboxID}/disk",
    operation_id = "getSandboxDiskUsage",
    summary = "Warren's own: how full a running sandbox's writable layer is, and the largest files it wrote",
    params(
        ("sandboxID" = String, Path),
        ("count" = Option<i64>, Query, description = "How many files (10)"),
    ),
    responses(
        (status = 200, description = "usedBytes, totalBytes, largest: [{path, bytes}] (paths as the sandbox sees them, largest first)", body = api::SandboxDiskUsage),
        (status = 400, description = "count out of range"),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, description = "the sandbox is not running"),
    ),
)]
async fn disk_usage(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    query: QueryPairs,
) -> Result<Json<api::SandboxDiskUsage>, ApiError> {
    let record = key.sandbox(&state, &id).await?;
    let count = match query.get("count") {
        None => 10,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "count must be a number from 1 to 1000, got {text:?}"
                )))
            }
        },
    };
    let largest = state.lifecycle.largest_files(&id, count).await?;
    let (used, total) = match state.lifecycle.stats(&id).await? {
        Some(stats) => {
            let sample = sample_of(&record, &stats, crate::lifecycle::now_millis());
            (sample.disk_used, sample.disk_total)
        }
        None => (0, record.disk_mib * 1024 * 1024),
    };
    Ok(Json(api::SandboxDiskUsage {
        used_bytes: used,
        total_bytes: total,
        largest: largest
            .into_iter()
            .map(|f| api::SandboxFile {
                path: f.path.to_string_lossy().into_owned(),
                bytes: f.bytes,
            })
            .collect(),
    }))
}

/// The signal a `signal` query value names: a number, or a name with or without `SIG`.
fn parse_signal(text: &str) -> Result<i32, ApiError> {
    if let Ok(number) = text.parse::<i32>() {
        return Ok(number);
    }
    let name = text.trim().to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    Ok(match name {
        "KILL" => libc::SIGKILL,
        "TERM" => libc::SIGTERM,
        "INT" => libc::SIGINT,
        "HUP" => libc::SIGHUP,
        "QUIT" => libc::SIGQUIT,
        "STOP" => libc::SIGSTOP,
        "CONT" => libc::SIGCONT,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        _ => {
            return Err(ApiError::bad_request(format!(
                "unknown signal {text:?}: use a number or KILL, TERM, INT, HUP, QUIT, STOP, CONT, USR1, USR2"
            )))
        }
    })
}

/// Warren's own `DELETE /sandboxes/{id}/processes/{pid}?signal=TERM`: signals one process (SIGKILL
/// unless `signal` says otherwise).
#[utoipa::path(
    delete,
    path = "/sandboxes/{sandboxID}/processes/{pid}",
    operation_id = "signalSandboxProcess",
    summary = "Warren's own: signal one process of a running sandbox (SIGKILL unless signal says otherwise)",
    params(
        ("sandboxID" = String, Path),
        ("pid" = i64, Path),
        ("signal" = Option<String>, Query, description = "Number or name: KILL, TERM, INT, HUP, QUIT, STOP, CONT, USR1, USR2"),
    ),
    responses(
        (status = 204, description = "Signalled"),
        (status = 400, description = "pid 1 (the sandbox's agent), a pid that is not a number, or an unknown signal"),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, description = "the sandbox is not running"),
    ),
)]
async fn signal_process(
    State(state): State<AppState>,
    key: Authenticated,
    Path((id, pid)): Path<(String, String)>,
    query: QueryPairs,
) -> Result<StatusCode, ApiError> {
    key.sandbox(&state, &id).await?;
    let pid: u32 = pid
        .parse()
        .map_err(|_| ApiError::bad_request(format!("pid must be a number, got {pid:?}")))?;
    let signal = query
        .get("signal")
        .map_or(Ok(libc::SIGKILL), parse_signal)?;
    state.lifecycle.signal_process(&id, pid, signal).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Most lines one log request returns (E2B's default page is 1000).
const MAX_LOG_LIMIT: usize = 10_000;

fn log_limit(query: &QueryPairs) -> Result<usize, ApiError> {
    match query.get("limit") {
        None | Some("") => Ok(1000),
        Some(text) => match text.parse::<usize>() {
            Ok(limit) if limit <= MAX_LOG_LIMIT => Ok(limit),
            _ => Err(ApiError::bad_request(format!(
                "limit must be a whole number from 0 to {MAX_LOG_LIMIT}, got {text:?}"
            ))),
        },
    }
}

pub(crate) fn log_entry(item: LogItem) -> api::SandboxLogEntry {
    api::SandboxLogEntry {
        timestamp: time(item.at),
        message: item.message,
        level: item.level.as_str().to_string(),
        fields: item.fields,
    }
}

/// `GET /sandboxes/{id}/logs?start=<unix ms>&limit=`: the sandbox's log from `start` on, oldest
/// first: its lifecycle events and what its commands printed (docs/operations.md "Sandbox logs").
#[utoipa::path(
    get,
    path = "/sandboxes/{sandboxID}/logs",
    operation_id = "getSandboxLogs",
    params(
        ("sandboxID" = String, Path),
        ("start" = Option<i64>, Query, description = "Unix milliseconds: lines at or after it"),
        ("limit" = Option<i64>, Query, description = "Most lines returned"),
    ),
    responses(
        (status = 200, description = "Lifecycle events and the lines the sandbox's commands printed, oldest first", body = api::SandboxLogs),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
        (status = 400, response = super::error::BadRequest),
    ),
)]
async fn logs(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    query: QueryPairs,
) -> Result<Json<api::SandboxLogs>, ApiError> {
    query.refuse_unknown(&["start", "limit"])?;
    let record = key.any_sandbox(&state, &id).await?;
    let page = LogQuery {
        cursor: unix_millis(&query, "start")?,
        forward: true,
        limit: log_limit(&query)?,
        min_level: LogLevel::Debug,
        search: None,
    };
    let items = state.lifecycle.sandbox_log(&record, &page).await?;
    Ok(Json(api::SandboxLogs {
        logs: items
            .iter()
            .map(|item| api::SandboxLog {
                timestamp: time(item.at),
                line: item.message.clone(),
            })
            .collect(),
        log_entries: items.into_iter().map(log_entry).collect(),
    }))
}

/// `GET /v2/sandboxes/{id}/logs?cursor=<unix ms>&limit=&direction=forward|backward&level=&search=`:
/// a page of the log; `level` is the least severe level returned, `search` a case-insensitive
/// substring of the message. Backward pages run newest first from the cursor (default: now).
#[utoipa::path(
    get,
    path = "/v2/sandboxes/{sandboxID}/logs",
    operation_id = "getSandboxLogsV2",
    params(
        ("sandboxID" = String, Path),
        ("cursor" = Option<i64>, Query, description = "Unix milliseconds to page from"),
        ("limit" = Option<i64>, Query, description = "Most lines returned"),
        ("direction" = Option<String>, Query, description = "forward: at or after the cursor, oldest first; backward: at or before it, newest first"),
        ("level" = Option<String>, Query, description = "The least severe level returned"),
        ("search" = Option<String>, Query, description = "A case-insensitive piece of the message"),
    ),
    responses(
        (status = 200, description = "A page of the sandbox's log", body = api::SandboxLogsV2),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
        (status = 400, response = super::error::BadRequest),
    ),
)]
async fn logs_v2(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
    query: QueryPairs,
) -> Result<Json<api::SandboxLogsV2>, ApiError> {
    query.refuse_unknown(&["cursor", "limit", "direction", "level", "search"])?;
    let record = key.any_sandbox(&state, &id).await?;
    let forward = match query.get("direction") {
        None | Some("") | Some("forward") => true,
        Some("backward") => false,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "direction must be forward or backward, got {other:?}"
            )))
        }
    };
    let min_level = match query.get("level") {
        None | Some("") => LogLevel::Debug,
        Some(text) => LogLevel::parse(text).ok_or_else(|| {
            ApiError::bad_request(format!(
                "level must be debug, info, warn or error, got {text:?}"
            ))
        })?,
    };
    let page = LogQuery {
        cursor: unix_millis(&query, "cursor")?,
        forward,
        limit: log_limit(&query)?,
        min_level,
        search: query.get("search").map(str::to_string),
    };
    let items = state.lifecycle.sandbox_log(&record, &page).await?;
    Ok(Json(api::SandboxLogsV2 {
        logs: items.into_iter().map(log_entry).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filter_is_decoded_twice() {
        // The SDK's `{"a b": "c&d"}` after its own quoting and urlencode.
        let query = QueryPairs(vec![(
            "metadata".to_string(),
            "a%2520b=c%2526d&x=y".to_string(),
        )]);
        let metadata = parse_metadata(&query).unwrap();
        assert_eq!(metadata.get("a b").map(String::as_str), Some("c&d"));
        assert_eq!(metadata.get("x").map(String::as_str), Some("y"));
    }

    #[test]
    fn states_split_on_commas() {
        let query = QueryPairs(vec![("state".to_string(), "running,paused".to_string())]);
        assert_eq!(parse_states(&query).unwrap().len(), 5);
        let bad = QueryPairs(vec![("state".to_string(), "sleeping".to_string())]);
        assert!(parse_states(&bad).is_err());
    }
}
