//! Directory watching with inotify: the streaming `WatchDir` and the polling watcher trio
//! (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use warren_proto::connect::{Code, ConnectError};
use warren_proto::envd::filesystem::{
    watch_dir_response, CreateWatcherRequest, CreateWatcherResponse, EventType, FilesystemEvent,
    GetWatcherEventsRequest, GetWatcherEventsResponse, RemoveWatcherRequest, RemoveWatcherResponse,
    WatchDirRequest, WatchDirResponse,
};

use super::entry::{entry_info, io_to_connect};
use super::{resolve_for_call, run_as};
use crate::connect_server::{CallContext, MessageStream};
use crate::state::Agent;

/// Events a polling watcher keeps before dropping the oldest.
const MAX_BUFFERED_EVENTS: usize = 10_000;

struct PollingWatcher {
    events: Arc<Mutex<Vec<FilesystemEvent>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
pub struct WatcherTable {
    watchers: Mutex<HashMap<String, PollingWatcher>>,
    next_id: std::sync::atomic::AtomicU64,
}

struct WatchSpec {
    host: PathBuf,
    sandbox: String,
    recursive: bool,
    include_entry: bool,
    root: PathBuf,
}

/// Checks the caller may read the directory and returns what to watch.
async fn prepare(
    agent: &Arc<Agent>,
    ctx: &CallContext,
    path: &str,
    recursive: bool,
    include_entry: bool,
) -> Result<WatchSpec, ConnectError> {
    let (resolved, id) = resolve_for_call(agent, ctx, path)?;
    let host = resolved.host.clone();
    let sandbox = resolved.sandbox.clone();
    let real = run_as(id, move || {
        let meta = std::fs::metadata(&host)
            .map_err(|e| io_to_connect(&e, &format!("path '{sandbox}'")))?;
        if !meta.is_dir() {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("path '{sandbox}' is not a directory"),
            ));
        }
        std::fs::read_dir(&host).map_err(|e| io_to_connect(&e, &format!("path '{sandbox}'")))?;
        std::fs::canonicalize(&host).map_err(|e| io_to_connect(&e, "resolving path"))
    })
    .await?;
    Ok(WatchSpec {
        host: real,
        sandbox: resolved.sandbox,
        recursive,
        include_entry,
        root: agent.root.clone(),
    })
}

/// Starts watching; events go to `tx` until it closes. The watch is in place when this returns.
fn start_watching(
    spec: WatchSpec,
    tx: mpsc::Sender<FilesystemEvent>,
) -> Result<tokio::task::JoinHandle<()>, ConnectError> {
    let internal = |e: std::io::Error| ConnectError::new(Code::Internal, format!("inotify: {e}"));
    let inotify = Inotify::init().map_err(internal)?;
    let mut dirs: HashMap<WatchDescriptor, String> = HashMap::new();
    let mut watches = inotify.watches();
    add_tree(&mut watches, &spec.host, "", spec.recursive, &mut dirs).map_err(internal)?;
    let mut events = inotify
        .into_event_stream(vec![0u8; 64 * 1024])
        .map_err(internal)?;
    Ok(tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                _ = tx.closed() => return,
            };
            let Some(Ok(event)) = next else {
                return;
            };
            let Some(dir_rel) = dirs.get(&event.wd).cloned() else {
                continue;
            };
            let name = event
                .name
                .as_ref()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let rel = match (dir_rel.is_empty(), name.is_empty()) {
                (true, _) => name.clone(),
                (false, true) => dir_rel.clone(),
                (false, false) => format!("{dir_rel}/{name}"),
            };
            if spec.recursive
                && event.mask.contains(EventMask::ISDIR)
                && event
                    .mask
                    .intersects(EventMask::CREATE | EventMask::MOVED_TO)
            {
                let _ = add_tree(&mut watches, &spec.host.join(&rel), &rel, true, &mut dirs);
            }
            if event.mask.contains(EventMask::IGNORED) {
                dirs.remove(&event.wd);
                continue;
            }
            let Some(kind) = event_type(event.mask) else {
                continue;
            };
            if rel.is_empty() {
                continue; // events on the watched directory itself
            }
            let entry = if spec.include_entry
                && matches!(
                    kind,
                    EventType::Create | EventType::Write | EventType::Chmod
                ) {
                let sandbox = format!("{}/{rel}", spec.sandbox.trim_end_matches('/'));
                entry_info(&spec.root, &sandbox, &spec.host.join(&rel)).ok()
            } else {
                None
            };
            let fs_event = FilesystemEvent {
                name: rel,
                r#type: kind as i32,
                entry,
            };
            if tx.send(fs_event).await.is_err() {
                return;
            }
        }
    }))
}

fn add_tree(
    watches: &mut Watches,
    dir: &Path,
    rel: &str,
    recursive: bool,
    dirs: &mut HashMap<WatchDescriptor, String>,
) -> std::io::Result<()> {
    let mask = WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::DELETE
        | WatchMask::DELETE_SELF
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::MOVE_SELF
        | WatchMask::ATTRIB
        | WatchMask::ONLYDIR;
    let wd = watches.add(dir, mask)?;
    dirs.insert(wd, rel.to_string());
    if recursive {
        for child in std::fs::read_dir(dir)?.flatten() {
            if child.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let name = child.file_name().to_string_lossy().into_owned();
                let child_rel = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                // Subdirectories we cannot watch are skipped, not fatal.
                let _ = add_tree(watches, &child.path(), &child_rel, true, dirs);
            }
        }
    }
    Ok(())
}

fn event_type(mask: EventMask) -> Option<EventType> {
    if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
        Some(EventType::Create)
    } else if mask.contains(EventMask::MODIFY) {
        Some(EventType::Write)
    } else if mask.intersects(EventMask::DELETE | EventMask::DELETE_SELF) {
        Some(EventType::Remove)
    } else if mask.intersects(EventMask::MOVED_FROM | EventMask::MOVE_SELF) {
        Some(EventType::Rename)
    } else if mask.contains(EventMask::ATTRIB) {
        Some(EventType::Chmod)
    } else {
        None
    }
}

pub async fn watch_dir(
    agent: Arc<Agent>,
    ctx: CallContext,
    req: WatchDirRequest,
) -> Result<MessageStream<WatchDirResponse>, ConnectError> {
    let spec = prepare(&agent, &ctx, &req.path, req.recursive, req.include_entry).await?;
    let (event_tx, mut event_rx) = mpsc::channel(1024);
    let watcher = start_watching(spec, event_tx)?;
    let (tx, rx) = mpsc::channel::<Result<WatchDirResponse, ConnectError>>(64);
    let keepalive = ctx.keepalive_interval();
    tokio::spawn(async move {
        let _stop_watcher_on_exit = AbortOnDrop(watcher);
        let start = WatchDirResponse {
            event: Some(watch_dir_response::Event::Start(
                watch_dir_response::StartEvent {},
            )),
        };
        if tx.send(Ok(start)).await.is_err() {
            return;
        }
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
        loop {
            let message = tokio::select! {
                event = event_rx.recv() => match event {
                    Some(e) => watch_dir_response::Event::Filesystem(e),
                    None => return,
                },
                _ = ticker.tick() => watch_dir_response::Event::Keepalive(watch_dir_response::KeepAlive {}),
                _ = tx.closed() => return,
            };
            if tx
                .send(Ok(WatchDirResponse {
                    event: Some(message),
                }))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    Ok(ReceiverStream::new(rx).boxed())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub async fn create_watcher(
    agent: Arc<Agent>,
    ctx: CallContext,
    req: CreateWatcherRequest,
) -> Result<CreateWatcherResponse, ConnectError> {
    let spec = prepare(&agent, &ctx, &req.path, req.recursive, req.include_entry).await?;
    let (event_tx, mut event_rx) = mpsc::channel(1024);
    let watcher = start_watching(spec, event_tx)?;
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let task = tokio::spawn(async move {
        let _stop_watcher_on_exit = AbortOnDrop(watcher);
        while let Some(e) = event_rx.recv().await {
            let mut buffered = sink.lock().unwrap_or_else(|p| p.into_inner());
            if buffered.len() >= MAX_BUFFERED_EVENTS {
                buffered.remove(0);
            }
            buffered.push(e);
        }
    });
    let table = &agent.watchers;
    let n = table
        .next_id
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = format!("w{}-{n}", std::process::id());
    table
        .watchers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), PollingWatcher { events, task });
    Ok(CreateWatcherResponse { watcher_id: id })
}

pub async fn get_watcher_events(
    agent: Arc<Agent>,
    _ctx: CallContext,
    req: GetWatcherEventsRequest,
) -> Result<GetWatcherEventsResponse, ConnectError> {
    let watchers = agent
        .watchers
        .watchers
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let watcher = watchers.get(&req.watcher_id).ok_or_else(|| {
        ConnectError::new(
            Code::NotFound,
            format!("watcher with id {} not found", req.watcher_id),
        )
    })?;
    let events = std::mem::take(&mut *watcher.events.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(GetWatcherEventsResponse { events })
}

pub async fn remove_watcher(
    agent: Arc<Agent>,
    _ctx: CallContext,
    req: RemoveWatcherRequest,
) -> Result<RemoveWatcherResponse, ConnectError> {
    let removed = agent
        .watchers
        .watchers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&req.watcher_id);
    match removed {
        Some(w) => {
            w.task.abort();
            Ok(RemoveWatcherResponse {})
        }
        None => Err(ConnectError::new(
            Code::NotFound,
            format!("watcher with id {} not found", req.watcher_id),
        )),
    }
}
