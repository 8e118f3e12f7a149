//! The logs tab's live tail: `GET /dashboard/api/sandboxes/{id}/logs/stream`, server-sent events.
//!
//! The first event carries the newest [`BACKLOG`] lines; after it, each event carries what the
//! sandbox's log gained (a command's output reaches the page as soon as the agent records it, see
//! `lifecycle::operations::log_tail`). Events:
//! - `lines`: `data` is a JSON array of log entries in the shape of `/v2/sandboxes/{id}/logs`; its
//!   `id` is the tail's position, which the browser's `EventSource` sends back as `Last-Event-ID`
//!   when it reconnects, so a reconnect continues where it was, without repeating or missing lines;
//! - `end`: the sandbox has ended and everything was sent (the page closes the stream);
//! - `failed`: reading the log failed (`data`, a JSON string, says why); the stream ends.
//!
//! Comments keep an idle stream alive through proxies; the stream ends when the server stops.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::stream::{self, Stream};
use tokio::sync::watch;

use crate::api::auth::Authenticated;
use crate::api::error::ApiError;
use crate::api::sandboxes::log_entry;
use crate::api::AppState;
use crate::lifecycle::{Lifecycle, LogItem, LogTail};

/// How many of the newest items a fresh tail starts with.
const BACKLOG: usize = 1000;
/// How often an idle stream sends a comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub fn router() -> Router<AppState> {
    Router::new().route(
        "/dashboard/api/sandboxes/{id}/logs/stream",
        get(stream_logs),
    )
}

async fn stream_logs(
    auth: Authenticated,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let record = auth.any_sandbox(&state, &id).await?;
    let resumed = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(LogTail::parse);
    let (backlog, tail) = match resumed {
        Some(tail) => (None, tail),
        None => {
            let (items, tail) = state.lifecycle.start_log_tail(&record, BACKLOG).await?;
            (Some(items), tail)
        }
    };
    let tail = Tail {
        lifecycle: Arc::clone(&state.lifecycle),
        id,
        tail,
        backlog,
        shutdown: state.shutdown.clone(),
        ended: false,
    };
    Ok(Sse::new(events(tail))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}

struct Tail {
    lifecycle: Arc<Lifecycle>,
    id: String,
    tail: LogTail,
    /// The first event's lines, not sent yet (`None` for a stream that resumes).
    backlog: Option<Vec<LogItem>>,
    shutdown: watch::Receiver<bool>,
    ended: bool,
}

fn lines_event(items: Vec<LogItem>, tail: &LogTail) -> Event {
    let entries: Vec<_> = items.into_iter().map(log_entry).collect();
    Event::default()
        .event("lines")
        .id(tail.token())
        .json_data(entries)
        .unwrap_or_else(|_| {
            Event::default()
                .event("failed")
                .data("unencodable log lines")
        })
}

fn events(tail: Tail) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(tail, |mut tail| async move {
        if tail.ended {
            return None;
        }
        if let Some(items) = tail.backlog.take() {
            let event = lines_event(items, &tail.tail);
            return Some((Ok(event), tail));
        }
        loop {
            if *tail.shutdown.borrow() {
                return None;
            }
            let step = tokio::select! {
                step = tail.lifecycle.log_tail_step(&tail.id, &mut tail.tail) => step,
                _ = tail.shutdown.changed() => return None,
            };
            let event = match step {
                Ok(Some(items)) if items.is_empty() => continue,
                Ok(Some(items)) => lines_event(items, &tail.tail),
                Ok(None) => {
                    tail.ended = true;
                    Event::default().event("end").data("the sandbox has ended")
                }
                Err(error) => {
                    tracing::warn!(sandbox = %tail.id, %error, "log tail failed");
                    tail.ended = true;
                    let message = format!("cannot read the log: {error}");
                    Event::default()
                        .event("failed")
                        .json_data(message)
                        .unwrap_or_else(|_| Event::default().event("failed"))
                }
            };
            return Some((Ok(event), tail));
        }
    })
}
