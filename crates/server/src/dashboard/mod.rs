//! The web dashboard, served on the API listener under `/dashboard` (same TLS as the API).
//!
//! Design (docs/dashboard.md has the long form):
//! - Login exchanges an API key for a session ([`sessions`]): an opaque id in an `HttpOnly`,
//!   `SameSite=Strict` (and, with TLS, `Secure`) cookie. The key itself never reaches the browser's
//!   storage.
//! - The browser code calls the existing REST API: [`crate::api::auth::Authenticated`] accepts the
//!   session cookie where no API key is sent, so the team scoping of every route stays in one place.
//!   A state-changing request (anything but GET/HEAD/OPTIONS) made with the cookie must also send the
//!   session's CSRF token in `X-CSRF-Token`.
//! - What the REST API lacks for a browser has thin routes here: the terminal (a WebSocket bridged to
//!   the agent's PTY, [`terminal`]) and files ([`files`]), both reaching the agent with the same envd
//!   client the CLI uses; the live tail of a sandbox's log (server-sent events, [`logs`]); and the
//!   fleet page's latency history and policy notes ([`fleet`]).
//! - Pages without a session redirect to the login page; JSON routes answer 401.

pub mod assets;
mod files;
mod fleet;
mod logs;
pub mod sessions;
mod terminal;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use crate::api::error::ApiError;
use crate::api::AppState;
use crate::keys;
use crate::store::{ApiKeyRecord, SandboxRecord};
pub use sessions::Sessions;

/// Where the dashboard lives on the API listener.
pub const PREFIX: &str = "/dashboard";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/dashboard", get(page_root))
        .route("/dashboard/", get(page_root))
        .route("/dashboard/{*rest}", get(page))
        .route("/dashboard/api/login", post(login))
        .route("/dashboard/api/logout", post(logout))
        .route("/dashboard/api/session", get(session))
        .merge(files::router())
        .merge(fleet::router())
        .merge(logs::router())
        .merge(terminal::router())
}

/// The API key behind the request's session cookie, for [`crate::api::auth::Authenticated`]:
/// `Ok(None)` without a cookie, 401 for an unknown or expired session or a revoked key, 403 for a
/// state-changing request without the session's CSRF token.
pub async fn authenticate_session(
    method: &Method,
    headers: &HeaderMap,
    state: &AppState,
) -> Result<Option<ApiKeyRecord>, ApiError> {
    let Some(id) = sessions::session_id(headers) else {
        return Ok(None);
    };
    let Some(session) = state.dashboard.get(&id) else {
        return Err(ApiError::unauthorized(
            "dashboard session expired or unknown: log in again",
        ));
    };
    let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe {
        let token = headers
            .get(sessions::CSRF_HEADER)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if !sessions::same_token(token, &session.csrf) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "missing or wrong X-CSRF-Token for this dashboard session",
            ));
        }
    }
    match state
        .lifecycle
        .store()
        .use_api_key(&session.key_hash, crate::lifecycle::now_millis())
        .await?
    {
        Some(key) => Ok(Some(key)),
        None => {
            state.dashboard.remove(&id);
            Err(ApiError::unauthorized(
                "the API key of this dashboard session was revoked",
            ))
        }
    }
}

async fn page_root(State(state): State<AppState>, headers: HeaderMap) -> Response {
    app_page(&state, &headers).await
}

async fn page(
    State(state): State<AppState>,
    Path(rest): Path<String>,
    headers: HeaderMap,
) -> Response {
    if rest.starts_with("assets/") {
        return assets::serve(&rest);
    }
    if rest.starts_with("api/") {
        return ApiError::not_found("no such dashboard endpoint").into_response();
    }
    if rest == "login" {
        return assets::serve("index.html");
    }
    app_page(&state, &headers).await
}

/// The single-page app for a signed-in browser; the login page otherwise.
async fn app_page(state: &AppState, headers: &HeaderMap) -> Response {
    if !assets::built() {
        return assets::not_built();
    }
    match authenticate_session(&Method::GET, headers, state).await {
        Ok(Some(_)) => assets::serve("index.html"),
        _ => Redirect::to("/dashboard/login").into_response(),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LoginRequest {
    api_key: String,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct SessionInfo {
    team_id: String,
    key_name: String,
    csrf_token: String,
}

async fn login(
    State(state): State<AppState>,
    crate::api::extract::ApiJson(request): crate::api::extract::ApiJson<LoginRequest>,
) -> Result<Response, ApiError> {
    let secret = request.api_key.trim();
    let Some(key) = keys::authenticate(state.lifecycle.store().as_ref(), secret).await? else {
        return Err(ApiError::unauthorized("invalid API key"));
    };
    let (id, session) = state.dashboard.create(&key.secret_hash, &key.team_id);
    let info = SessionInfo {
        team_id: key.team_id,
        key_name: key.name,
        csrf_token: session.csrf,
    };
    Ok((
        [
            (header::SET_COOKIE, state.dashboard.cookie(&id)),
            (header::CACHE_CONTROL, "no-store".to_string()),
        ],
        Json(info),
    )
        .into_response())
}

async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    // The same checks as any state-changing request: a live session and its CSRF token.
    if authenticate_session(&Method::POST, &headers, &state)
        .await?
        .is_none()
    {
        return Err(ApiError::unauthorized("no dashboard session"));
    }
    if let Some(id) = sessions::session_id(&headers) {
        state.dashboard.remove(&id);
    }
    Ok((
        StatusCode::NO_CONTENT,
        [(header::SET_COOKIE, state.dashboard.clearing_cookie())],
    )
        .into_response())
}

async fn session(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let Some(key) = authenticate_session(&Method::GET, &headers, &state).await? else {
        return Err(ApiError::unauthorized("no dashboard session"));
    };
    let csrf = sessions::session_id(&headers)
        .and_then(|id| state.dashboard.get(&id))
        .map(|session| session.csrf)
        .unwrap_or_default();
    Ok((
        [(header::CACHE_CONTROL, "no-store")],
        Json(SessionInfo {
            team_id: key.team_id,
            key_name: key.name,
            csrf_token: csrf,
        }),
    )
        .into_response())
}

/// The envd account the dashboard's shells and file operations act as (E2B's default user).
const SANDBOX_USER: &str = "user";

/// An envd client straight to the agent of running sandbox `record` (resuming it first when it
/// pauses with auto-resume, as the proxy would).
async fn envd_for(
    state: &AppState,
    record: &SandboxRecord,
) -> Result<warren_client::EnvdClient, ApiError> {
    let route = state.lifecycle.route_for_traffic(&record.id).await?;
    let base = format!("http://{}:{}", route.ip, warren_client::envd::ENVD_PORT);
    warren_client::EnvdClient::new(
        &base,
        &record.id,
        record.envd_access_token.as_deref(),
        SANDBOX_USER,
    )
    .map_err(|error| envd_error(&error))
}

/// An envd failure as an API answer: its own status where it names one, 502 otherwise.
fn envd_error(error: &warren_client::EnvdError) -> ApiError {
    use warren_client::ErrorKind;
    let status = match error.kind() {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
        ErrorKind::Unauthorized => StatusCode::FORBIDDEN,
        ErrorKind::Refused => StatusCode::CONFLICT,
        ErrorKind::Unreachable | ErrorKind::Other => StatusCode::BAD_GATEWAY,
    };
    ApiError::new(status, format!("sandbox agent: {error}"))
}
