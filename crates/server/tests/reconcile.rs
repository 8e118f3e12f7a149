//! Start-up reconciliation: a restarted server adopts live sandboxes, marks vanished ones lost and
//! destroys ones it never knew.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use std::path::PathBuf;

use hyper::{Method, StatusCode};
use serde_json::json;
use support::{FakeRuntime, Harness};
use warren_runtime::Runtime;
use warren_server::lifecycle::state::SandboxState;
use warren_server::Server;

#[tokio::test]
async fn restart_adopts_loses_and_destroys() {
    let runtime = FakeRuntime::new(false);
    let h = Harness::start_on(runtime.clone(), |_| {}).await;
    let adopted = h.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let frozen = h.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let vanished = h.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    h.api(Method::POST, &format!("/sandboxes/{frozen}/pause"), None)
        .await;

    // Stop the server (its state dir stays), change the host behind its back, start a new one on the
    // same state dir.
    let state_dir = h.server.state_dir().to_path_buf();
    let warren_testkit::TestServer {
        server: old,
        state_dir: keep,
        ..
    } = h.server;
    // The new server opens the same store (WARREN_TEST_DATABASE=postgres: the same database).
    let database_url = old.lifecycle.config().database_url.clone();
    old.shutdown().await.unwrap();
    runtime.destroy(&vanished).unwrap();
    runtime.start_untracked("wtuntracked");

    let mut config =
        warren_testkit::test_config(&state_dir, PathBuf::from("/nonexistent/wt-rootfs"));
    config.database_url = database_url;
    config.domain = "example.test".to_string();
    let server = Server::start(config, runtime.clone()).await.unwrap();
    let mut adopted_ids = server.reconcile.adopted.clone();
    adopted_ids.sort();
    let mut expected = vec![adopted.clone(), frozen.clone()];
    expected.sort();
    assert_eq!(adopted_ids, expected);
    assert_eq!(server.reconcile.lost, vec![vanished.clone()]);
    assert_eq!(server.reconcile.destroyed, vec!["wtuntracked".to_string()]);
    assert!(!runtime.live_ids().contains(&"wtuntracked".to_string()));

    let store = server.lifecycle.store().clone();
    let lost = store.get_sandbox(&vanished).await.unwrap().unwrap();
    assert_eq!(lost.state, SandboxState::Failed);
    assert!(lost.state_reason.unwrap().starts_with("lost"));
    let events = store.sandbox_events(&vanished).await.unwrap();
    assert_eq!(events.last().unwrap().to_state, SandboxState::Failed);

    // The adopted sandbox is reachable through the proxy right away.
    let answer = support::send(
        Method::GET,
        &format!("http://{}/health", server.proxy_addr),
        &[("E2b-Sandbox-Id", &adopted), ("E2b-Sandbox-Port", "49983")],
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    // And the frozen one resumes.
    let (record, _) = server.lifecycle.resume(&frozen, None).await.unwrap();
    assert_eq!(record.state, SandboxState::Running);

    for id in [&adopted, &frozen] {
        server.lifecycle.kill(id, "test over").await.unwrap();
    }
    assert!(runtime.live_ids().is_empty());
    server.shutdown().await.unwrap();
    drop(keep);
}

/// Address rules live in the host's nftables and survive a restart, so an adopted sandbox does
/// not need them again, unless the new server's runtime replaced the tables (a new ruleset version):
/// then every adopted sandbox gets its rules again, or its denied addresses would be open to it.
#[tokio::test]
async fn adopted_sandboxes_get_their_address_rules_again_when_the_ruleset_was_replaced() {
    let runtime = FakeRuntime::new(false);
    let h = Harness::start_on(runtime.clone(), |_| {}).await;
    let id = h
        .create(json!({"templateID": "base", "network": {"denyOut": ["198.18.0.0/15"]}}))
        .await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let state_dir = h.server.state_dir().to_path_buf();
    let warren_testkit::TestServer {
        server: mut current,
        state_dir: keep,
        ..
    } = h.server;
    for replaced in [false, true] {
        let database_url = current.lifecycle.config().database_url.clone();
        current.shutdown().await.unwrap();
        runtime.egress.lock().unwrap().clear();
        runtime
            .rules_replaced
            .store(replaced, std::sync::atomic::Ordering::SeqCst);
        let mut config =
            warren_testkit::test_config(&state_dir, PathBuf::from("/nonexistent/wt-rootfs"));
        config.database_url = database_url;
        current = Server::start(config, runtime.clone()).await.unwrap();
        assert_eq!(current.reconcile.adopted, vec![id.clone()]);
        let given = runtime.egress.lock().unwrap().get(&id).cloned();
        if replaced {
            let network =
                given.expect("the rules were not given again after the tables were replaced");
            let denied: Vec<String> = network.egress.deny.iter().map(|c| c.to_string()).collect();
            assert_eq!(denied, vec!["198.18.0.0/15".to_string()]);
        } else {
            assert!(
                given.is_none(),
                "address rules reinstalled needlessly: {given:?}"
            );
        }
    }
    current.lifecycle.kill(&id, "test over").await.unwrap();
    current.shutdown().await.unwrap();
    drop(keep);
}

/// A fork or snapshot a crash cut short leaves its source frozen under a `running` row and a
/// temporary checkpoint directory: the restart thaws the source and removes the directory.
#[tokio::test]
async fn restart_thaws_a_source_frozen_by_a_cut_short_checkpoint() {
    let runtime = FakeRuntime::new(true);
    let h = Harness::start_on(runtime.clone(), |_| {}).await;
    let id = h.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let state_dir = h.server.state_dir().to_path_buf();
    let warren_testkit::TestServer {
        server: old,
        state_dir: keep,
        ..
    } = h.server;
    // The new server opens the same store (WARREN_TEST_DATABASE=postgres: the same database).
    let database_url = old.lifecycle.config().database_url.clone();
    old.shutdown().await.unwrap();
    // What the dead server left: the source frozen, a half-written checkpoint.
    runtime.freeze(&id).unwrap();
    let half = state_dir.join("snapshots").join(".snap-x.tmp-1-2");
    std::fs::create_dir_all(half.join("images")).unwrap();

    let mut config =
        warren_testkit::test_config(&state_dir, PathBuf::from("/nonexistent/wt-rootfs"));
    config.database_url = database_url;
    let server = Server::start(config, runtime.clone()).await.unwrap();
    assert_eq!(server.reconcile.adopted, vec![id.clone()]);
    assert!(server.reconcile.orphan_dirs_removed.contains(&half));
    assert!(!half.exists());
    let listed = runtime.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, warren_runtime::RuntimeState::Running);
    let record = server
        .lifecycle
        .store()
        .get_sandbox(&id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, SandboxState::Running);

    server.lifecycle.kill(&id, "test over").await.unwrap();
    server.shutdown().await.unwrap();
    drop(keep);
}

/// The periodic reconciler, while the server runs: a sandbox the store does not know is destroyed, a
/// sandbox whose processes vanished behind Warren's back is marked lost, each within a few periods,
/// with an event and a counter in /metrics.
#[tokio::test]
async fn the_running_server_reconciles_every_period() {
    let runtime = FakeRuntime::new(false);
    let h = Harness::start_on(runtime.clone(), |config| {
        config.reconcile_interval = std::time::Duration::from_millis(100);
    })
    .await;
    let kept = h.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let vanishing = h.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    runtime.start_untracked("wtuntracked");
    // A template-build sandbox no running build works in (its build hung or died).
    runtime.start_untracked("bld-abandoned-run1");
    runtime.destroy(&vanishing).unwrap();

    let settled = support::fake_runtime::eventually(|| {
        let live = runtime.live_ids();
        !live.contains(&"wtuntracked".to_string())
            && !live.contains(&"bld-abandoned-run1".to_string())
    });
    assert!(
        settled.await,
        "untracked sandbox still runs: {:?}",
        runtime.live_ids()
    );
    let mut lost = false;
    for _ in 0..100 {
        let answer = h
            .api(Method::GET, &format!("/sandboxes/{vanishing}"), None)
            .await;
        if answer.status == StatusCode::NOT_FOUND {
            lost = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(lost, "vanished sandbox still listed");
    let listed = h
        .api(Method::GET, "/v2/sandboxes?state=running", None)
        .await
        .json();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["sandboxID"].as_str())
        .collect();
    assert_eq!(ids, vec![kept.as_str()], "the healthy sandbox stays");
    assert_eq!(runtime.live_ids(), vec![kept.clone()]);
    // Each pass renews the dead man's switch of what runs: past the end time by the lease.
    let end_at = h
        .api(Method::GET, &format!("/sandboxes/{kept}"), None)
        .await
        .json()["endAt"]
        .as_str()
        .unwrap()
        .to_string();
    let end_at = chrono::DateTime::parse_from_rfc3339(&end_at)
        .unwrap()
        .timestamp_millis() as u64;
    let deadline = runtime.deadlines.lock().unwrap().get(&kept).copied();
    assert_eq!(deadline, Some(end_at + 600_000), "renewed to end + lease");
    let metrics = h.api(Method::GET, "/metrics", None).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("warren_reconciled_total{action=\"lost\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("warren_reconciled_total{action=\"untracked_destroyed\"} 2"),
        "{text}"
    );
}

/// An operation whose last state change never reached the store (the database was away) leaves its
/// row mid-transition with the sandbox's lock let go: the server's own beat settles it from what
/// runs, as a restart would.
#[tokio::test]
async fn the_servers_beat_settles_what_its_own_operations_left_mid_transition() {
    use warren_server::lifecycle::{now_millis, servers};
    use warren_server::store::TransitionUpdate;

    let runtime = FakeRuntime::new(false);
    let h = Harness::start_on(runtime.clone(), |_| {}).await;
    let id = h.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let lifecycle = &h.server.server.lifecycle;
    let store = lifecycle.store();
    // A pause that stored `pausing` and then lost the database before anything else.
    store
        .transition_sandbox(
            &id,
            SandboxState::Running,
            SandboxState::Pausing,
            &TransitionUpdate::default(),
            now_millis(),
        )
        .await
        .unwrap();
    // A create that stored its row and never started the sandbox.
    let mut stray = store.get_sandbox(&id).await.unwrap().unwrap();
    stray.id = "abandoned-create".into();
    stray.state = SandboxState::Creating;
    store.insert_sandbox(&stray).await.unwrap();

    servers::beat(lifecycle, "127.0.0.1:0").await.unwrap();
    let paused = store.get_sandbox(&id).await.unwrap().unwrap();
    assert_eq!(
        paused.state,
        SandboxState::Running,
        "still runs: the pause was not taken"
    );
    let created = store
        .get_sandbox("abandoned-create")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(created.state, SandboxState::Failed);
    assert!(
        created
            .state_reason
            .as_deref()
            .unwrap()
            .starts_with("lost:"),
        "{:?}",
        created.state_reason
    );
    h.server.stop().await.unwrap();
}
