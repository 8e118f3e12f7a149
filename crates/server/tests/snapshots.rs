//! Fork, snapshots, retention and the faults around them, on the tests' fake runtime: API shapes and
//! status codes as the official SDK 2.63 parses them, state transitions and events.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use support::{FakeRuntime, Harness};
use warren_runtime::Runtime;
use warren_server::lifecycle::state::SandboxState;
use warren_server::store::TransitionUpdate;
use warren_server::Server;

fn id_of(created: &Value) -> String {
    created["sandboxID"].as_str().unwrap().to_string()
}

fn snapshot_dirs(h: &Harness) -> Vec<String> {
    let dir = h.server.state_dir().join("snapshots");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn fork_restores_independent_sandboxes_and_leaves_the_source_running() {
    let h = Harness::start(true, |_| {}).await;
    let source = h
        .create(json!({"templateID": "base", "metadata": {"experiment": "df"}}))
        .await;
    let source_id = id_of(&source);
    let before = h
        .api(Method::GET, &format!("/sandboxes/{source_id}"), None)
        .await
        .json();

    let answer = h
        .api(
            Method::POST,
            &format!("/sandboxes/{source_id}/fork"),
            Some(json!({"count": 3, "timeout": 60})),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let results = answer.json();
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 3);
    let mut ids = Vec::new();
    for result in results {
        assert!(result.get("error").is_none(), "{result}");
        let sandbox = &result["sandbox"];
        assert_eq!(sandbox["templateID"], "base");
        assert!(sandbox["envdVersion"].is_string());
        ids.push(id_of(sandbox));
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "every fork has its own id");
    assert!(!ids.contains(&source_id));
    assert_eq!(h.runtime.recorded.lock().unwrap().restored.len(), 3);
    // Its checkpoint is forgotten by the runtime's caches, then deleted.
    let forgotten = h.runtime.recorded.lock().unwrap().forgotten.clone();
    assert_eq!(forgotten.len(), 1, "{forgotten:?}");
    assert!(!forgotten[0].exists(), "{forgotten:?} still there");

    // The source keeps its id, state and end time; the checkpoint it gave is an event, not a transition.
    let after = h
        .api(Method::GET, &format!("/sandboxes/{source_id}"), None)
        .await
        .json();
    assert_eq!(after["state"], "running");
    assert_eq!(after["endAt"], before["endAt"]);
    let events = h
        .server
        .server
        .lifecycle
        .store()
        .sandbox_events(&source_id)
        .await
        .unwrap();
    let last = events.last().unwrap();
    assert_eq!(last.from_state, Some(SandboxState::Running));
    assert_eq!(last.to_state, SandboxState::Running);
    assert!(last.reason.as_deref().unwrap().contains("fork x3"));

    // Each fork is a sandbox of its own: listed, with the source's metadata, killable alone.
    for id in &ids {
        let fork = h
            .api(Method::GET, &format!("/sandboxes/{id}"), None)
            .await
            .json();
        assert_eq!(fork["state"], "running");
        assert_eq!(fork["metadata"]["experiment"], "df");
        let events = h
            .server
            .server
            .lifecycle
            .store()
            .sandbox_events(id)
            .await
            .unwrap();
        let states: Vec<_> = events.iter().map(|e| e.to_state).collect();
        assert_eq!(states, vec![SandboxState::Creating, SandboxState::Running]);
    }
    let kill = h
        .api(Method::DELETE, &format!("/sandboxes/{}", ids[0]), None)
        .await;
    assert_eq!(kill.status, StatusCode::NO_CONTENT);
    let source_alive = h
        .api(Method::GET, &format!("/sandboxes/{source_id}"), None)
        .await;
    assert_eq!(source_alive.status, StatusCode::OK);
    // The transient fork checkpoint is gone once the forks have their own layers.
    assert!(snapshot_dirs(&h)
        .iter()
        .all(|name| !name.starts_with("fork-")));
}

#[tokio::test]
async fn fork_refuses_bad_requests_with_the_sdks_codes() {
    let h = Harness::start(true, |_| {}).await;
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    for count in [0, 21, -1] {
        let answer = h
            .api(
                Method::POST,
                &format!("/sandboxes/{id}/fork"),
                Some(json!({ "count": count })),
            )
            .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "count {count}");
        assert_eq!(answer.json()["code"], 400);
    }
    let missing = h
        .api(Method::POST, "/sandboxes/wtnosuchsandbox/fork", None)
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    // A paused sandbox is not forked.
    h.api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    let paused = h
        .api(Method::POST, &format!("/sandboxes/{id}/fork"), None)
        .await;
    assert_eq!(paused.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn fork_without_checkpoints_says_so() {
    let h = Harness::start(false, |_| {}).await;
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let answer = h
        .api(Method::POST, &format!("/sandboxes/{id}/fork"), None)
        .await;
    assert_eq!(answer.status, StatusCode::NOT_IMPLEMENTED);
    assert!(answer.json()["message"].as_str().unwrap().contains("CRIU"));
}

#[tokio::test]
async fn each_fork_is_admitted_on_its_own() {
    let h = Harness::start(true, |config| config.limits.max_sandboxes = 3).await;
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let answer = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/fork"),
            Some(json!({"count": 4})),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let results = answer.json();
    let started = results
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.get("sandbox").is_some())
        .count();
    let refused: Vec<&Value> = results
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.get("error"))
        .collect();
    assert_eq!(started, 2);
    assert_eq!(refused.len(), 2);
    for error in refused {
        assert_eq!(error["code"], 429, "{error}");
        assert!(error["message"].is_string());
    }
}

#[tokio::test]
async fn a_failed_dump_leaves_the_sandbox_running_with_only_an_event() {
    let h = Harness::start(true, |_| {}).await;
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    h.runtime.fail_checkpoint.store(true, Ordering::SeqCst);
    for path in ["fork", "snapshots"] {
        let answer = h
            .api(Method::POST, &format!("/sandboxes/{id}/{path}"), None)
            .await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR, "{path}");
    }
    let record = h.server.server.lifecycle.get(&id).await.unwrap();
    assert_eq!(record.state, SandboxState::Running);
    let events = h
        .server
        .server
        .lifecycle
        .store()
        .sandbox_events(&id)
        .await
        .unwrap();
    let failures: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref().is_some_and(|r| r.contains("failed")))
        .collect();
    assert_eq!(failures.len(), 2);
    assert!(failures.iter().all(|e| e.to_state == SandboxState::Running));
    assert!(h.runtime.live_ids().contains(&id));
    assert!(snapshot_dirs(&h).is_empty(), "no partial checkpoint left");
    let snapshots = h.api(Method::GET, "/snapshots", None).await.json();
    assert_eq!(snapshots, json!([]));
}

#[tokio::test]
async fn snapshots_are_created_listed_used_as_templates_and_deleted() {
    let h = Harness::start(true, |_| {}).await;
    let source = id_of(&h.create(json!({"templateID": "base"})).await);
    let other = id_of(&h.create(json!({"templateID": "base"})).await);

    let created = h
        .api(
            Method::POST,
            &format!("/sandboxes/{source}/snapshots"),
            Some(json!({"name": "wt-lab"})),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let info = created.json();
    let snapshot_id = info["snapshotID"].as_str().unwrap().to_string();
    assert_eq!(info["names"], json!(["wt-lab", snapshot_id]));
    assert_eq!(info["sandboxID"], source);
    assert!(info["sizeBytes"].as_u64().unwrap() > 0);
    let unnamed = h
        .api(Method::POST, &format!("/sandboxes/{other}/snapshots"), None)
        .await;
    assert_eq!(unnamed.status, StatusCode::CREATED);
    let unnamed_id = unnamed.json()["snapshotID"].as_str().unwrap().to_string();

    // The source is still running.
    let detail = h
        .api(Method::GET, &format!("/sandboxes/{source}"), None)
        .await
        .json();
    assert_eq!(detail["state"], "running");

    let all = h.api(Method::GET, "/snapshots", None).await.json();
    assert_eq!(all.as_array().unwrap().len(), 2);
    let mine = h
        .api(Method::GET, &format!("/snapshots?sandboxID={source}"), None)
        .await
        .json();
    assert_eq!(mine.as_array().unwrap().len(), 1);
    assert_eq!(mine[0]["snapshotID"], snapshot_id);
    let page = h.api(Method::GET, "/snapshots?limit=1", None).await;
    assert_eq!(page.json().as_array().unwrap().len(), 1);
    let token = page.headers["x-next-token"].to_str().unwrap().to_string();
    let next = h
        .api(
            Method::GET,
            &format!("/snapshots?limit=1&nextToken={token}"),
            None,
        )
        .await
        .json();
    assert_eq!(next.as_array().unwrap().len(), 1);
    assert_ne!(next[0]["snapshotID"], page.json()[0]["snapshotID"]);
    let bad_limit = h.api(Method::GET, "/snapshots?limit=0", None).await;
    assert_eq!(bad_limit.status, StatusCode::BAD_REQUEST);

    // A snapshot id, or its name, works as a templateID: the sandbox is restored from it.
    let source_token = h
        .server
        .server
        .lifecycle
        .get(&source)
        .await
        .unwrap()
        .envd_access_token;
    assert!(source_token.is_some(), "v2 sandboxes are secured");
    for template in [snapshot_id.as_str(), "wt-lab"] {
        let restored = h.create(json!({"templateID": template})).await;
        assert_eq!(restored["templateID"], "base");
        assert_eq!(restored["alias"], snapshot_id);
        // The restored agent still holds the source's token: /init authenticates with it and sets the
        // new sandbox's own.
        let inits = h.runtime.inits_of(restored["sandboxID"].as_str().unwrap());
        assert_eq!(inits.len(), 1);
        assert_eq!(inits[0].1, source_token);
        assert_ne!(
            restored["envdAccessToken"].as_str(),
            source_token.as_deref()
        );
    }
    assert_eq!(h.runtime.recorded.lock().unwrap().restored.len(), 2);

    // The SDK deletes through DELETE /templates/{id}; DELETE /snapshots/{id} works too.
    let deleted = h
        .api(Method::DELETE, &format!("/templates/{snapshot_id}"), None)
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let again = h
        .api(Method::DELETE, &format!("/templates/{snapshot_id}"), None)
        .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    let deleted = h
        .api(Method::DELETE, &format!("/snapshots/{unnamed_id}"), None)
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let gone = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": snapshot_id})),
        )
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert!(snapshot_dirs(&h).is_empty());
    // Both deletions dropped the runtime's caches of the checkpoint first.
    assert_eq!(h.runtime.recorded.lock().unwrap().forgotten.len(), 2);
    let base = h.api(Method::DELETE, "/templates/base", None).await;
    assert_eq!(base.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn snapshot_requests_the_server_cannot_honour_are_refused() {
    let h = Harness::start(true, |_| {}).await;
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let bad_name = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/snapshots"),
            Some(json!({"name": "a/b"})),
        )
        .await;
    assert_eq!(bad_name.status, StatusCode::BAD_REQUEST);
    let missing = h
        .api(Method::POST, "/sandboxes/wtnosuch/snapshots", None)
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn retention_keeps_the_newest_per_sandbox_and_drops_old_ones() {
    let h = Harness::start(true, |config| {
        config.snapshot_retention.keep_last_per_sandbox = Some(2);
        config.snapshot_retention.max_age = Some(std::time::Duration::from_secs(3600));
    })
    .await;
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let lifecycle = h.server.server.lifecycle.clone();
    let mut taken = Vec::new();
    for _ in 0..3 {
        taken.push(lifecycle.create_snapshot(&id, None, true).await.unwrap());
        // Distinct creation times, so "newest" is well defined.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let now = warren_server::lifecycle::now_millis();
    let report = lifecycle.collect_snapshots(now).await.unwrap();
    assert_eq!(report.deleted, vec![taken[0].id.clone()]);
    assert!(!taken[0].dir.exists());
    assert_eq!(
        h.runtime.recorded.lock().unwrap().forgotten,
        vec![taken[0].dir.clone()]
    );
    assert!(taken[1].dir.exists() && taken[2].dir.exists());

    // Past the maximum age everything goes, except what a live sandbox needs (pause checkpoints are
    // not snapshot rows, so they are never candidates).
    h.api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    let paused = lifecycle.get(&id).await.unwrap();
    let pause_dir = paused.snapshot_dir.clone().unwrap();
    let later = now + 2 * 3600 * 1000;
    let report = lifecycle.collect_snapshots(later).await.unwrap();
    assert_eq!(report.deleted.len(), 2);
    assert!(pause_dir.exists());
    let (resumed, _) = lifecycle.resume(&id, None).await.unwrap();
    assert_eq!(resumed.state, SandboxState::Running);
}

#[tokio::test]
async fn a_failed_restore_leaves_the_sandbox_paused_and_the_checkpoint_intact() {
    let h = Harness::start(true, |_| {}).await;
    let id = id_of(&h.create(json!({"templateID": "base"})).await);
    let paused = h
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT);
    let lifecycle = h.server.server.lifecycle.clone();
    let dir = lifecycle.get(&id).await.unwrap().snapshot_dir.unwrap();

    h.runtime.fail_restore.store(true, Ordering::SeqCst);
    let resume = h
        .api(Method::POST, &format!("/sandboxes/{id}/resume"), None)
        .await;
    assert_eq!(resume.status, StatusCode::INTERNAL_SERVER_ERROR);
    let record = lifecycle.get(&id).await.unwrap();
    assert_eq!(record.state, SandboxState::Paused);
    assert!(record
        .state_reason
        .as_deref()
        .unwrap()
        .contains("restore failed"));
    assert!(dir.join("fake-checkpoint").exists());

    h.runtime.fail_restore.store(false, Ordering::SeqCst);
    let resume = h
        .api(Method::POST, &format!("/sandboxes/{id}/resume"), None)
        .await;
    assert_eq!(resume.status, StatusCode::CREATED);
    assert_eq!(
        lifecycle.get(&id).await.unwrap().state,
        SandboxState::Running
    );
}

/// A kill -9 in the middle of a pause or resume: the store says `pausing`/`resuming`; the next start
/// settles each from what is on disk and on the host.
#[tokio::test]
async fn restart_settles_half_finished_pauses_and_resumes() {
    let runtime = FakeRuntime::new(true);
    let h = Harness::start_on(runtime.clone(), |_| {}).await;
    let dumped = id_of(&h.create(json!({"templateID": "base"})).await);
    let still_running = id_of(&h.create(json!({"templateID": "base"})).await);
    let resuming = id_of(&h.create(json!({"templateID": "base"})).await);
    let lifecycle = h.server.server.lifecycle.clone();
    let store = lifecycle.store().clone();
    let snapshots = h.server.state_dir().join("snapshots");
    let now = warren_server::lifecycle::now_millis();
    let to = |state| (state, TransitionUpdate::default());

    // `dumped`: the dump completed and the tree is gone, but the server died before storing `paused`.
    let (pausing, update) = to(SandboxState::Pausing);
    store
        .transition_sandbox(&dumped, SandboxState::Running, pausing, &update, now)
        .await
        .unwrap();
    runtime
        .checkpoint(&dumped, &snapshots.join(&dumped), false)
        .unwrap();
    // `still_running`: died right after storing `pausing`; a partial dump directory, no manifest.
    store
        .transition_sandbox(&still_running, SandboxState::Running, pausing, &update, now)
        .await
        .unwrap();
    std::fs::create_dir_all(snapshots.join(&still_running)).unwrap();
    // `resuming`: paused to disk, then died during the restore (the restored tree is up).
    lifecycle.pause(&resuming, "test").await.unwrap();
    store
        .transition_sandbox(
            &resuming,
            SandboxState::Paused,
            SandboxState::Resuming,
            &update,
            now,
        )
        .await
        .unwrap();
    runtime.start_untracked(&resuming);
    // A fork checkpoint and a snapshot directory no row names: crash debris.
    std::fs::create_dir_all(snapshots.join("fork-wtdebris")).unwrap();
    std::fs::create_dir_all(snapshots.join("snap-wtdebris")).unwrap();

    let state_dir = h.server.state_dir().to_path_buf();
    let warren_testkit::TestServer {
        server: old,
        state_dir: keep,
        ..
    } = h.server;
    // The new server opens the same store (WARREN_TEST_DATABASE=postgres: the same database).
    let database_url = old.lifecycle.config().database_url.clone();
    old.shutdown().await.unwrap();
    let mut config =
        warren_testkit::test_config(&state_dir, PathBuf::from("/nonexistent/wt-rootfs"));
    config.database_url = database_url;
    let server = Server::start(config, runtime.clone()).await.unwrap();
    let mut settled = server.reconcile.settled.clone();
    settled.sort();
    let mut expected = vec![dumped.clone(), still_running.clone(), resuming.clone()];
    expected.sort();
    assert_eq!(settled, expected);
    assert!(server.reconcile.lost.is_empty(), "{:?}", server.reconcile);
    assert_eq!(server.reconcile.orphan_dirs_removed.len(), 2);

    let get = |id: String| {
        let lifecycle = server.lifecycle.clone();
        async move { lifecycle.get(&id).await.unwrap() }
    };
    assert_eq!(get(dumped.clone()).await.state, SandboxState::Paused);
    assert_eq!(
        get(still_running.clone()).await.state,
        SandboxState::Running
    );
    assert!(!snapshots.join(&still_running).exists());
    assert_eq!(get(resuming.clone()).await.state, SandboxState::Paused);
    assert!(
        !runtime.live_ids().contains(&resuming),
        "half-restored tree destroyed"
    );

    // Nothing was lost: both paused sandboxes resume from their checkpoints.
    for id in [&dumped, &resuming] {
        let (record, _) = server.lifecycle.resume(id, None).await.unwrap();
        assert_eq!(record.state, SandboxState::Running);
    }
    for id in [&dumped, &still_running, &resuming] {
        server.lifecycle.kill(id, "test over").await.unwrap();
    }
    server.shutdown().await.unwrap();
    drop(keep);
}

/// A template whose build ended with a checkpoint (start_cmd running, ready_cmd passed) starts by
/// restoring it; one without starts cold.
#[tokio::test]
async fn templates_from_running_state_restore_their_build_checkpoint() {
    let h = Harness::start(true, |_| {}).await;
    let store = h.server.server.lifecycle.store().clone();
    let base = store.get_template("base").await.unwrap().unwrap();
    support::running_state_template(&h, "wt-running").await;
    let mut cold = base.clone();
    cold.id = "wt-cold".to_string();
    cold.aliases = Vec::new();
    cold.build_id = "none".to_string();
    store.upsert_template(&cold).await.unwrap();

    let created_before = h.runtime.recorded.lock().unwrap().created.len();
    let running = h.create(json!({"templateID": "wt-running"})).await;
    assert_eq!(running["templateID"], "wt-running");
    let restored = h.runtime.recorded.lock().unwrap().restored.clone();
    assert_eq!(restored.len(), 1);
    assert_eq!(restored[0].id, id_of(&running));
    assert_eq!(restored[0].layers, base.layers);

    let cold = h.create(json!({"templateID": "wt-cold"})).await;
    let recorded = h.runtime.recorded.lock().unwrap();
    assert_eq!(
        recorded.restored.len(),
        1,
        "a template without a checkpoint starts cold"
    );
    assert_eq!(recorded.created.len(), created_before + 1);
    assert_eq!(recorded.created.last().unwrap().id, id_of(&cold));
}

#[tokio::test]
async fn the_openapi_document_describes_fork_and_snapshots() {
    let h = Harness::start(true, |_| {}).await;
    let answer = support::send(
        Method::GET,
        &format!("{}/openapi.json", h.server.api_url),
        &[],
        None,
    )
    .await;
    let doc = answer.json();
    for path in [
        "/sandboxes/{sandboxID}/fork",
        "/sandboxes/{sandboxID}/snapshots",
        "/snapshots",
        "/snapshots/{snapshotID}",
    ] {
        assert!(doc["paths"][path].is_object(), "{path}");
    }
    assert!(doc["components"]["schemas"]["SnapshotInfo"].is_object());
}

/// Deleting a running-state template lets the runtime drop what it cached to start copies of the
/// template's checkpoint (its seeded layer, its unpacked images) before the checkpoint goes.
#[tokio::test]
async fn deleting_a_running_state_template_forgets_its_checkpoint() {
    let h = Harness::start(true, |_| {}).await;
    support::running_state_template(&h, "wt-running-gone").await;
    let versions =
        warren_server::templates::builder::versions::TemplateVersions::new(h.server.state_dir());
    let checkpoints = versions.checkpoints("wt-running-gone").unwrap();
    assert_eq!(checkpoints.len(), 1, "{checkpoints:?}");
    assert!(h.runtime.recorded.lock().unwrap().forgotten.is_empty());

    let answer = h
        .api(Method::DELETE, "/templates/wt-running-gone", None)
        .await;
    assert!(
        answer.status.is_success(),
        "{}: {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(h.runtime.recorded.lock().unwrap().forgotten, checkpoints);
    assert!(
        !checkpoints[0].exists(),
        "the checkpoint outlived its template"
    );
}
