//! The server on this host's real Linux runtime with the real agent: create through the API, reach the
//! agent through the proxy with the access token, pause, connect (resume), expire. Skips (with a SKIP
//! line) where the host cannot run sandboxes.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use std::path::{Path, PathBuf};

use hyper::{Method, StatusCode};
use serde_json::json;
use support::send;
use warren_server::lifecycle::{now_millis, scheduler};
use warren_server::ServerConfig;
use warren_testkit::TestServer;

const BASE_ROOTFS: &str = "/var/cache/warren/rootfs/debian12-base";

/// The static agent built by scripts/build-agent, or $WARREN_AGENT.
fn agent_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("WARREN_AGENT") {
        return Some(PathBuf::from(path));
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = workspace.join("target/agent/x86_64-unknown-linux-gnu/agent/warren-agent");
    built.is_file().then_some(built)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|status| {
            status
                .lines()
                .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn sandbox_lifecycle_on_the_real_runtime() {
    if !is_root() {
        println!("SKIP: the Linux runtime needs root");
        return;
    }
    if !Path::new(BASE_ROOTFS).join("bin/sh").exists() {
        println!("SKIP: base rootfs {BASE_ROOTFS} not built (run scripts/setup)");
        return;
    }
    let Some(agent) = agent_binary() else {
        println!("SKIP: warren-agent not built (run scripts/build-agent or set WARREN_AGENT)");
        return;
    };
    let state = tempfile::Builder::new()
        .prefix("wt-server-linux-")
        .tempdir()
        .unwrap();
    // The state dir's lxcfs daemon outlives the runtime on purpose; end it with the test.
    struct StopLxcfs(PathBuf);
    impl Drop for StopLxcfs {
        fn drop(&mut self) {
            warren_runtime::rootfs::lxcfs::stop(&self.0);
        }
    }
    let _lxcfs = StopLxcfs(state.path().to_path_buf());
    let mut probe = ServerConfig::new(state.path().to_path_buf());
    probe.agent_binary = Some(agent.clone());
    let runtime = match warren_server::runtime_host::linux_runtime(&probe) {
        Ok(runtime) => runtime,
        Err(error) => {
            println!("SKIP: no Linux runtime on this host: {error}");
            return;
        }
    };
    let h = TestServer::start(runtime.clone(), PathBuf::from(BASE_ROOTFS), |config| {
        config.state_dir = state.path().to_path_buf();
        config.agent_binary = Some(agent);
    })
    .await
    .unwrap();
    let key = [("X-API-Key", h.api_key.as_str())];
    let api = |path: &str| format!("{}{}", h.api_url, path);

    let started = std::time::Instant::now();
    let created = send(
        Method::POST,
        &api("/v2/sandboxes"),
        &key,
        Some(json!({"templateID": "base", "timeout": 120, "envVars": {"WT_MARK": "from-server-test"}})),
    )
    .await;
    assert_eq!(
        created.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    println!(
        "create (API, real runtime + agent /init): {:?}",
        started.elapsed()
    );
    let created = created.json();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let through_proxy = |path: &str| format!("{}{}", h.sandbox_url, path);
    let route = [
        ("E2b-Sandbox-Id", id.as_str()),
        ("E2b-Sandbox-Port", "49983"),
        ("X-Access-Token", token.as_str()),
    ];

    let health = send(Method::GET, &through_proxy("/health"), &route, None).await;
    assert!(health.status.is_success(), "health: {}", health.status);
    // /init reached the agent: the env vars are set and the token is enforced.
    let envs = send(Method::GET, &through_proxy("/envs"), &route, None).await;
    assert_eq!(
        envs.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&envs.body)
    );
    assert_eq!(envs.json()["WT_MARK"], "from-server-test");
    let no_token = send(Method::GET, &through_proxy("/envs"), &route[..2], None).await;
    assert_eq!(no_token.status, StatusCode::UNAUTHORIZED);

    let paused_at = std::time::Instant::now();
    let pause = send(
        Method::POST,
        &api(&format!("/sandboxes/{id}/pause")),
        &key,
        None,
    )
    .await;
    assert_eq!(
        pause.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&pause.body)
    );
    let record = h.server.lifecycle.get(&id).await.unwrap();
    println!(
        "pause: {:?} ({:?}; runtime checkpoint capability {})",
        paused_at.elapsed(),
        record.pause_kind,
        h.server.lifecycle.capabilities().checkpoint
    );
    if record.pause_kind == Some(warren_server::store::PauseKind::Checkpoint) {
        assert!(
            record.snapshot_dir.as_ref().is_some_and(|dir| dir.is_dir()),
            "checkpoint on disk"
        );
        assert!(
            runtime
                .list()
                .unwrap()
                .iter()
                .all(|sandbox| sandbox.id != id),
            "nothing runs while checkpointed"
        );
    }
    let paused = send(Method::GET, &through_proxy("/health"), &route, None).await;
    assert_eq!(paused.status, StatusCode::BAD_GATEWAY);
    let resumed_at = std::time::Instant::now();
    let connect = send(
        Method::POST,
        &api(&format!("/v2/sandboxes/{id}/connect")),
        &key,
        Some(json!({"timeout": 60})),
    )
    .await;
    println!("connect (resume): {:?}", resumed_at.elapsed());
    assert_eq!(
        connect.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&connect.body)
    );
    let envs = send(Method::GET, &through_proxy("/envs"), &route, None).await;
    assert_eq!(
        envs.json()["WT_MARK"],
        "from-server-test",
        "state survives pause/resume"
    );

    // Expire it: the scheduler kills it and the runtime forgets it.
    let report = scheduler::expire_due(&h.server.lifecycle, now_millis() + 61_000)
        .await
        .unwrap();
    assert_eq!(report.killed, vec![id.clone()]);
    assert!(runtime
        .list()
        .unwrap()
        .iter()
        .all(|sandbox| sandbox.id != id));
    let gone = send(Method::GET, &through_proxy("/health"), &route, None).await;
    assert!(gone.json()["message"]
        .as_str()
        .unwrap()
        .contains("was not found"));
    h.stop().await.unwrap();
}
