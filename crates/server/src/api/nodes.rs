//! `/nodes` and `/sandboxes/{id}/migrate`: cluster mode's operations (docs/cluster.md), Warren's
//! own. Nodes are listed and drained with admin keys; a sandbox is moved with any key of its team.
//! On a server that runs its sandboxes on its own machine the list is empty, a node is not found
//! and a migration is refused with 409.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_proto::api;

use super::auth::Authenticated;
use super::error::ApiError;
use super::sandboxes::created;
use super::AppState;
use crate::lifecycle::migrate::Migration;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_nodes))
        .routes(routes!(list_servers))
        .routes(routes!(drain, undrain))
        .routes(routes!(migrate))
}

#[derive(utoipa::ToSchema, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Node {
    /// `HOST:PORT` of the node's API.
    #[serde(rename = "nodeID")]
    node_id: String,
    url: String,
    /// False once the node has been silent long enough to be declared down.
    up: bool,
    /// New sandboxes are kept off it.
    draining: bool,
    /// Sandboxes of this server it holds.
    sandboxes: usize,
}

/// A server sharing the store (cluster mode): its row in the store.
#[derive(utoipa::ToSchema, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Server {
    #[serde(rename = "serverID")]
    server_id: String,
    /// The address its API was told to listen on.
    address: String,
    started_at: chrono::DateTime<chrono::Utc>,
    /// When it last renewed its row (every 2 s while it runs).
    renewed_at: chrono::DateTime<chrono::Utc>,
    /// Whether it leads: runs the timeouts, the reconciler, the monitor and webhook deliveries.
    leader: bool,
    /// The server that answered this request.
    this: bool,
    /// Build and warm-pool sandboxes it holds.
    held_sandboxes: usize,
}

#[derive(utoipa::ToSchema, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Moved {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    from: String,
    to: String,
}

#[derive(utoipa::ToSchema, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct NotMoved {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    error: String,
}

#[derive(utoipa::ToSchema, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Drained {
    moved: Vec<Moved>,
    failed: Vec<NotMoved>,
}

#[derive(utoipa::ToSchema, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Migrated {
    sandbox: api::Sandbox,
    from: String,
    to: String,
}

fn moved(migration: &Migration) -> Moved {
    Moved {
        sandbox_id: migration.record.id.clone(),
        from: migration.from.clone(),
        to: migration.to.clone(),
    }
}

#[utoipa::path(
    get,
    path = "/nodes",
    operation_id = "listNodes",
    description = "The nodes this server runs its sandboxes on (admin keys only); empty when it runs them on its own machine.",
    responses(
        (status = 200, description = "The nodes", body = [Node]),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn list_nodes(
    State(state): State<AppState>,
    key: Authenticated,
) -> Result<Json<Vec<Node>>, ApiError> {
    key.require_admin()?;
    let nodes = state.lifecycle.nodes().await?;
    Ok(Json(
        nodes
            .into_iter()
            .map(|node| Node {
                node_id: node.id,
                url: node.url,
                up: node.up,
                draining: node.draining,
                sandboxes: node.sandboxes,
            })
            .collect(),
    ))
}

#[utoipa::path(
    get,
    path = "/servers",
    operation_id = "listServers",
    description = "The servers sharing this server's store that are alive now (admin keys only): with a SQLite store, this one alone.",
    responses(
        (status = 200, description = "The live servers, oldest first", body = [Server]),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 500, response = super::error::InternalError),
    ),
)]
async fn list_servers(
    State(state): State<AppState>,
    key: Authenticated,
) -> Result<Json<Vec<Server>>, ApiError> {
    key.require_admin()?;
    let store = state.lifecycle.store();
    let since =
        crate::lifecycle::now_millis() - crate::lifecycle::servers::SERVER_LEASE.as_millis() as i64;
    let servers = store.live_servers(since).await?;
    Ok(Json(
        servers
            .into_iter()
            .map(|server| Server {
                this: server.id == store.server_id(),
                server_id: server.id,
                address: server.address,
                started_at: super::time(server.started_at),
                renewed_at: super::time(server.renewed_at),
                leader: server.leading,
                held_sandboxes: server.holds.len(),
            })
            .collect(),
    ))
}

#[utoipa::path(
    post,
    path = "/nodes/{nodeID}/drain",
    operation_id = "drainNode",
    description = "Keeps new sandboxes off the node and moves each of its running sandboxes to another node, processes intact (admin keys only). Sandboxes that could not be moved are listed with why; they stay where they were.",
    params(("nodeID" = String, Path, description = "HOST:PORT of the node")),
    responses(
        (status = 200, description = "What moved and what did not", body = Drained),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
        (status = 501, description = "This server runs its sandboxes on its own machine", body = warren_proto::api::Error),
    ),
)]
async fn drain(
    State(state): State<AppState>,
    key: Authenticated,
    Path(node): Path<String>,
) -> Result<Json<Drained>, ApiError> {
    key.require_admin()?;
    let report = state.lifecycle.drain(&node).await?;
    Ok(Json(Drained {
        moved: report.moved.iter().map(moved).collect(),
        failed: report
            .failed
            .into_iter()
            .map(|(sandbox_id, error)| NotMoved { sandbox_id, error })
            .collect(),
    }))
}

#[utoipa::path(
    delete,
    path = "/nodes/{nodeID}/drain",
    operation_id = "undrainNode",
    description = "Lets new sandboxes on the node again (admin keys only).",
    params(("nodeID" = String, Path, description = "HOST:PORT of the node")),
    responses(
        (status = 204, description = "The node takes new sandboxes again"),
        (status = 401, response = super::error::Unauthorized),
        (status = 403, response = super::error::Forbidden),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::InternalError),
        (status = 501, description = "This server runs its sandboxes on its own machine", body = warren_proto::api::Error),
    ),
)]
async fn undrain(
    State(state): State<AppState>,
    key: Authenticated,
    Path(node): Path<String>,
) -> Result<StatusCode, ApiError> {
    key.require_admin()?;
    state.lifecycle.undrain(&node).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/sandboxes/{sandboxID}/migrate",
    operation_id = "migrateSandbox",
    description = "Moves a running sandbox to another node: paused to a checkpoint and resumed there, processes, memory and files intact, with the time it had left. Refused (409) on a server without other nodes, or for a sandbox that is not running.",
    params(("sandboxID" = String, Path)),
    responses(
        (status = 200, description = "Moved", body = Migrated),
        (status = 401, response = super::error::Unauthorized),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::InternalError),
        (status = 503, response = super::error::ServiceUnavailable),
        (status = 507, response = super::error::InsufficientStorage),
    ),
)]
async fn migrate(
    State(state): State<AppState>,
    key: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<Migrated>, ApiError> {
    key.sandbox(&state, &id).await?;
    let migration = state.lifecycle.migrate(&id).await?;
    Ok(Json(Migrated {
        sandbox: created(&state, &migration.record),
        from: migration.from,
        to: migration.to,
    }))
}
