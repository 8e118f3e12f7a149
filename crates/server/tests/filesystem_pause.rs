//! Filesystem-only persistence through the API, on the tests' fake runtime: `pause` with
//! `memory: false`, auto-pause with `autoPauseMemory: false`, `connect`/`resume` with
//! `memory: false` (the SDK's `on_resume="reboot"`), snapshots with `memory: false`, and the
//! strict pause (`requireHealthyGuest`). The real runtime's side is in
//! `crates/runtime/tests/checkpoint_runtime.rs` and the SDK's in `tests/e2e/test_filesystem_e2e.py`.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use support::{assert_error, Harness};
use warren_server::lifecycle::state::SandboxState;
use warren_server::lifecycle::{now_millis, scheduler};
use warren_server::store::PauseKind;

fn id_of(created: &Value) -> String {
    created["sandboxID"].as_str().unwrap().to_string()
}

fn booted(h: &Harness, id: &str) -> usize {
    let recorded = h.runtime.recorded.lock().unwrap();
    recorded.booted.iter().filter(|spec| spec.id == id).count()
}

fn restored(h: &Harness, id: &str) -> usize {
    let recorded = h.runtime.recorded.lock().unwrap();
    recorded
        .restored
        .iter()
        .filter(|spec| spec.id == id)
        .count()
}

#[tokio::test]
async fn a_filesystem_pause_ends_the_processes_and_connect_boots_them_fresh() {
    let h = Harness::start(true, |_| {}).await;
    let lifecycle = h.server.server.lifecycle.clone();
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let first_token = h.runtime.inits_of(&id)[0].0["accessToken"].clone();

    let paused = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            Some(json!({"memory": false})),
        )
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT, "{:?}", paused.body);
    let record = lifecycle.get(&id).await.unwrap();
    assert_eq!(record.state, SandboxState::Paused);
    assert_eq!(record.pause_kind, Some(PauseKind::Filesystem));
    assert!(
        !h.runtime.live_ids().contains(&id),
        "nothing runs while paused"
    );
    let dir = record.snapshot_dir.clone().unwrap();
    let shown = h.api(Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(shown.json()["state"], "paused");

    let connected = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 60})),
        )
        .await;
    assert_eq!(
        connected.status,
        StatusCode::CREATED,
        "{:?}",
        connected.body
    );
    assert_eq!((booted(&h, &id), restored(&h, &id)), (1, 0));
    let record = lifecycle.get(&id).await.unwrap();
    assert_eq!(record.state, SandboxState::Running);
    assert_eq!(record.pause_kind, None);
    assert!(!dir.exists(), "the saved files are superseded once it runs");
    // A fresh agent: initialised without a previous token, with the sandbox's own one again.
    let inits = h.runtime.inits_of(&id);
    assert_eq!(inits.len(), 2);
    assert_eq!(inits[1].1, None);
    assert_eq!(inits[1].0["accessToken"], first_token);
}

#[tokio::test]
async fn reboot_ignores_the_memory_of_a_checkpoint_and_of_a_freeze() {
    // With CRIU: the pause keeps memory, the reboot boots over the checkpoint's files instead.
    let h = Harness::start(true, |_| {}).await;
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let paused = h
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT);
    let rebooted = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"memory": false})),
        )
        .await;
    assert_eq!(rebooted.status, StatusCode::CREATED, "{:?}", rebooted.body);
    assert_eq!((booted(&h, &id), restored(&h, &id)), (1, 0));

    // Without CRIU the pause freezes; a reboot saves the files of the frozen tree, then boots.
    let h = Harness::start(false, |_| {}).await;
    let lifecycle = h.server.server.lifecycle.clone();
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let paused = h
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT);
    assert_eq!(
        lifecycle.get(&id).await.unwrap().pause_kind,
        Some(PauseKind::Freeze)
    );
    let rebooted = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/resume"),
            Some(json!({"memory": false})),
        )
        .await;
    assert_eq!(rebooted.status, StatusCode::CREATED, "{:?}", rebooted.body);
    assert_eq!(booted(&h, &id), 1);
    assert_eq!(
        lifecycle.get(&id).await.unwrap().state,
        SandboxState::Running
    );
    // A running sandbox: memory=false asks nothing of it.
    let again = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"memory": false})),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(booted(&h, &id), 1);
}

#[tokio::test]
async fn a_failed_boot_leaves_the_sandbox_paused_with_its_files() {
    let h = Harness::start(true, |_| {}).await;
    let lifecycle = h.server.server.lifecycle.clone();
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let paused = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            Some(json!({"memory": false})),
        )
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT);
    let dir = lifecycle.get(&id).await.unwrap().snapshot_dir.unwrap();
    h.runtime
        .fail_restore
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let failed = h
        .api(Method::POST, &format!("/sandboxes/{id}/connect"), None)
        .await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let record = lifecycle.get(&id).await.unwrap();
    assert_eq!(record.state, SandboxState::Paused);
    assert_eq!(record.pause_kind, Some(PauseKind::Filesystem));
    assert!(dir.join("fake-checkpoint").exists(), "the files are kept");
    h.runtime
        .fail_restore
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let resumed = h
        .api(Method::POST, &format!("/sandboxes/{id}/connect"), None)
        .await;
    assert_eq!(resumed.status, StatusCode::CREATED);
}

#[tokio::test]
async fn a_hung_guest_refuses_strict_and_filesystem_pauses_and_keeps_running() {
    let h = Harness::start(true, |_| {}).await;
    let lifecycle = h.server.server.lifecycle.clone();
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    h.runtime.silence(&id);
    for body in [
        json!({"requireHealthyGuest": true}),
        json!({"memory": false}),
    ] {
        let refused = h
            .api(
                Method::POST,
                &format!("/sandboxes/{id}/pause"),
                Some(body.clone()),
            )
            .await;
        assert_error(
            &refused,
            StatusCode::SERVICE_UNAVAILABLE,
            "guest agent of sandbox",
        );
        assert_eq!(
            lifecycle.get(&id).await.unwrap().state,
            SandboxState::Running,
            "{body}"
        );
    }
    // Not strict: the memory pause does not ask the guest.
    let paused = h
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT);

    // A responding guest passes the strict check.
    let other = id_of(&h.create(json!({"templateID": "base"})).await);
    let paused = h
        .api(
            Method::POST,
            &format!("/sandboxes/{other}/pause"),
            Some(json!({"requireHealthyGuest": true})),
        )
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn auto_pause_at_timeout_keeps_files_only_when_asked() {
    let h = Harness::start(true, |_| {}).await;
    let lifecycle = h.server.server.lifecycle.clone();
    let files = id_of(
        &h.create(json!({"templateID": "base", "timeout": 60, "autoPause": true, "autoPauseMemory": false}))
            .await,
    );
    let memory = id_of(
        &h.create(json!({"templateID": "base", "timeout": 60, "autoPause": true}))
            .await,
    );
    let report = scheduler::expire_due(&lifecycle, now_millis() + 61_000)
        .await
        .unwrap();
    let mut paused = report.paused.clone();
    paused.sort();
    let mut expected = vec![files.clone(), memory.clone()];
    expected.sort();
    assert_eq!(paused, expected);
    assert_eq!(
        lifecycle.get(&files).await.unwrap().pause_kind,
        Some(PauseKind::Filesystem)
    );
    assert_eq!(
        lifecycle.get(&memory).await.unwrap().pause_kind,
        Some(PauseKind::Checkpoint)
    );

    // Traffic must not cold-boot a sandbox: the SDK refuses auto-resume with a filesystem pause,
    // and so does the API.
    let refused = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(
                json!({"templateID": "base", "autoPause": true, "autoPauseMemory": false,
                        "autoResume": {"enabled": true}}),
            ),
        )
        .await;
    assert_error(&refused, StatusCode::BAD_REQUEST, "autoPauseMemory=false");
}

#[tokio::test]
async fn a_filesystem_snapshot_boots_new_sandboxes_fresh_and_needs_no_criu() {
    let h = Harness::start(false, |_| {}).await;
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let with_memory = h
        .api(Method::POST, &format!("/sandboxes/{id}/snapshots"), None)
        .await;
    assert_eq!(with_memory.status, StatusCode::NOT_IMPLEMENTED);
    let snapshot = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/snapshots"),
            Some(json!({"memory": false, "name": "files-only"})),
        )
        .await;
    assert_eq!(snapshot.status, StatusCode::CREATED, "{:?}", snapshot.body);
    let snapshot_id = snapshot.json()["snapshotID"].as_str().unwrap().to_string();
    assert!(
        h.runtime.live_ids().contains(&id),
        "the source keeps running"
    );

    let child = id_of(&h.create(json!({"templateID": snapshot_id})).await);
    assert_eq!((booted(&h, &child), restored(&h, &child)), (1, 0));
    let inits = h.runtime.inits_of(&child);
    assert_eq!(inits.len(), 1);
    assert_eq!(inits[0].1, None, "a fresh agent holds no earlier token");
}
