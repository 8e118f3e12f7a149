//! The E2B-compatible REST API: a router per resource, auth and validation as extractors, handlers that
//! only call the lifecycle and the store.

pub mod auth;
pub mod error;
pub(crate) mod events;
pub mod extract;
mod meta;
mod nodes;
mod paging;
pub(crate) mod sandboxes;
mod secrets;
mod snapshots;
mod teams;
mod templates;
mod volumes;
mod webhooks;
mod workspaces;

use std::sync::Arc;

use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::templates::builds::TemplateBuilds;

#[derive(Clone)]
pub struct AppState {
    pub lifecycle: Arc<Lifecycle>,
    pub metrics: Arc<Metrics>,
    pub builds: Arc<TemplateBuilds>,
    pub dashboard: Arc<crate::dashboard::Sessions>,
    /// Turns true when the server stops: long-lived answers (the dashboard's log tail) end then
    /// instead of holding the graceful stop up.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

/// Every documented endpoint, each registered with the OpenAPI operation written on its handler: the
/// router and the document come from the same list, so neither can name a route the other lacks.
fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(sandboxes::router())
        .merge(secrets::router())
        .merge(events::router())
        .merge(webhooks::router())
        .merge(snapshots::router())
        .merge(templates::router())
        .merge(teams::router())
        .merge(workspaces::router())
        .merge(volumes::router())
        .merge(nodes::router())
        .merge(meta::router())
}

/// The OpenAPI document of the REST API, generated from the handlers' annotations and the body
/// types (served at `/openapi.json`).
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    let mut document = api_routes().into_openapi();
    link_created_sandboxes(&mut document);
    document
}

/// Adds to the 201 of both creates a link to every operation on one sandbox (every path with a
/// `{sandboxID}`), filled from the answer's `sandboxID`: clients and the fuzzer's stateful phase
/// follow them from a sandbox just made to everything that can be done with it.
fn link_created_sandboxes(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::link::Link;
    use utoipa::openapi::RefOr;
    const PARAMETER: &str = "sandboxID";
    let placeholder = format!("{{{PARAMETER}}}");
    let targets: Vec<String> = document
        .paths
        .paths
        .iter()
        .filter(|(path, _)| path.contains(&placeholder))
        .flat_map(|(_, item)| operations(item))
        .filter_map(|operation| operation.operation_id.clone())
        .collect();
    for path in ["/sandboxes", "/v2/sandboxes"] {
        let Some(item) = document.paths.paths.get_mut(path) else {
            continue;
        };
        let Some(RefOr::T(created)) = item
            .post
            .as_mut()
            .and_then(|create| create.responses.responses.get_mut("201"))
        else {
            continue;
        };
        for target in &targets {
            let link = Link::builder()
                .operation_id(target.clone())
                .parameter(PARAMETER, format!("$response.body#/{PARAMETER}"))
                .build();
            created.links.insert(target.clone(), RefOr::T(link));
        }
    }
}

fn operations(
    item: &utoipa::openapi::PathItem,
) -> impl Iterator<Item = &utoipa::openapi::path::Operation> {
    [&item.get, &item.put, &item.post, &item.delete, &item.patch]
        .into_iter()
        .flatten()
}

pub fn router(state: AppState) -> Router {
    let (api, _) = api_routes().split_for_parts();
    api.merge(crate::dashboard::router())
        .fallback(|| async { error::ApiError::not_found("no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_errors,
        ))
        .layer(axum::middleware::from_fn(drain_after_error))
        .with_state(state)
}

/// What the document says besides its operations: title, server, the two ways to authenticate and
/// the shared error answers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Warren API",
        description = "E2B-compatible control plane of a Warren node. Sandbox traffic goes through the proxy listener (Host <port>-<sandboxID>.<domain> or headers E2b-Sandbox-Id / E2b-Sandbox-Port)."
    ),
    servers((url = "http://127.0.0.1:3000")),
    security(("ApiKeyAuth" = [])),
    modifiers(&SecuritySchemes),
    components(responses(
        error::BadRequest,
        error::Unauthorized,
        error::Forbidden,
        error::NotFound,
        error::Conflict,
        error::TooManyRequests,
        error::InternalError,
        error::GuestUnresponsive,
        error::InsufficientStorage,
        error::ServiceUnavailable,
    ))
)]
struct ApiDoc;

struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme,
        };
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "ApiKeyAuth",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new(
                warren_proto::api::API_KEY_HEADER,
            ))),
        );
        components.add_security_scheme(
            "VolumeToken",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A volume's own token (POST /volumes, GET /volumes/{volumeID}); only for /volumecontent.",
                    ))
                    .build(),
            ),
        );
    }
}

/// A request refused before its body was read (a bad API key, a missing header) keeps its
/// connection: the rest of the body is read before the answer goes out, so a client still
/// writing it reads the error instead of "broken pipe" (see `warren_proto::body_drain`).
async fn drain_after_error(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    warren_proto::body_drain::drain_after_error(request, |r| next.run(r.map(axum::body::Body::new)))
        .await
}

/// Counts every 4xx and 5xx answer by method and declared route (`warren_api_errors_total`).
async fn count_errors(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let method = request.method().clone();
    let response = next.run(request).await;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        state
            .metrics
            .api_error(method.as_str(), &route, status.as_u16());
    }
    response
}

/// A time of the store (Unix milliseconds) as the API shows it (RFC 3339, UTC).
pub(crate) fn time(millis: crate::store::Millis) -> chrono::DateTime<chrono::Utc> {
    use chrono::TimeZone;
    chrono::Utc
        .timestamp_millis_opt(millis)
        .single()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    /// Every API module registers its routes through `routes!`, which takes the path and methods
    /// from the handler's OpenAPI annotation: a plain `.route(` here would serve an operation the
    /// document does not name.
    #[test]
    fn api_routes_come_only_from_annotated_handlers() {
        let modules = [
            ("events.rs", include_str!("events.rs")),
            ("meta.rs", include_str!("meta.rs")),
            ("sandboxes.rs", include_str!("sandboxes.rs")),
            ("secrets.rs", include_str!("secrets.rs")),
            ("snapshots.rs", include_str!("snapshots.rs")),
            ("teams.rs", include_str!("teams.rs")),
            ("templates.rs", include_str!("templates.rs")),
            ("volumes.rs", include_str!("volumes.rs")),
            ("webhooks.rs", include_str!("webhooks.rs")),
            ("workspaces.rs", include_str!("workspaces.rs")),
        ];
        for (name, source) in modules {
            assert!(
                source.contains("routes!("),
                "{name} registers no annotated route"
            );
            for forbidden in [".route(", ".route_service(", ".nest("] {
                assert!(
                    !source.contains(forbidden),
                    "{name} registers a route with `{forbidden}`, outside the OpenAPI document"
                );
            }
        }
    }
}
