//! The dashboard bundle embedded at compile time by `build.rs` (empty when it was not built).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

include!(concat!(env!("OUT_DIR"), "/dashboard_assets.rs"));

/// What `/dashboard` answers when the binary was built without the bundle.
pub const NOT_BUILT: &str = "dashboard assets not built: run scripts/setup (it runs npm in dashboard/), then rebuild warren";

pub fn find(name: &str) -> Option<&'static [u8]> {
    FILES
        .iter()
        .find(|(file, _)| *file == name)
        .map(|(_, bytes)| *bytes)
}

pub fn built() -> bool {
    find("index.html").is_some()
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("json") | Some("map") => "application/json",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}

/// The bundle file `name` with its content type, a 503 without a bundle, a 404 for an unknown name.
pub fn serve(name: &str) -> Response {
    if !built() {
        return not_built();
    }
    match find(name) {
        Some(bytes) => (
            [
                (header::CONTENT_TYPE, content_type(name)),
                (header::CACHE_CONTROL, "no-cache"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            bytes,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such dashboard file").into_response(),
    }
}

pub fn not_built() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        NOT_BUILT,
    )
        .into_response()
}
