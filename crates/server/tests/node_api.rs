//! The node API (`warren node`) over a fake runtime: the node's own limits hold whoever asks, and
//! every hello reports what its sandboxes hold.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use std::sync::Arc;

use hyper::{Method, StatusCode};
use serde_json::json;
use support::{send, FakeRuntime};
use warren_runtime::{NetworkSpec, Resources, SandboxSpec};
use warren_server::node::ledger::{Ledger, NodeLimits};

fn spec(id: &str, memory_mib: u64) -> serde_json::Value {
    serde_json::to_value(SandboxSpec {
        id: id.into(),
        layers: Vec::new(),
        resources: Resources {
            vcpus: 1.0,
            memory_mib,
            disk_mib: 64,
            max_pids: 64,
        },
        network: NetworkSpec::default(),
        syscalls: Default::default(),
        volumes: Vec::new(),
    })
    .unwrap()
}

#[tokio::test]
async fn the_node_refuses_a_start_past_its_limits_and_reports_its_load() {
    let state = tempfile::tempdir().unwrap();
    let limits = NodeLimits {
        max_sandboxes: 8,
        max_vcpus: 8.0,
        max_memory_mib: 1024,
    };
    let ledger = Ledger::open(state.path(), limits, "node-under-test".into());
    let router = warren_server::node::router(
        FakeRuntime::new(false) as Arc<dyn warren_runtime::Runtime>,
        "secret".into(),
        Vec::new(),
        ("10.99.0.1".parse().unwrap(), 16),
        ledger,
        Default::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let auth = [("Authorization", "Bearer secret")];
    let call = |body: serde_json::Value| {
        let url = format!("{base}/v1/runtime");
        async move { send(Method::POST, &url, &auth, Some(body)).await.json() }
    };

    let first = call(json!({"call": "create", "spec": spec("a", 512)})).await;
    assert!(first.get("ok").is_some(), "{first}");
    let second = call(json!({"call": "create", "spec": spec("b", 512)})).await;
    assert!(second.get("ok").is_some(), "{second}");
    let refused = call(json!({"call": "create", "spec": spec("c", 512)})).await;
    assert_eq!(refused["error"]["error"], "resource_exhausted", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("node node-under-test is full")
            && message.contains("--max-total-memory-mib"),
        "{message}"
    );

    let hello = send(Method::GET, &format!("{base}/v1/hello"), &auth, None).await;
    assert_eq!(hello.status, StatusCode::OK);
    let load = &hello.json()["load"];
    assert_eq!(
        (load["sandboxes"].as_u64(), load["memory_mib"].as_u64()),
        (Some(2), Some(1024))
    );
    assert_eq!(load["max_memory_mib"].as_u64(), Some(1024));

    // A destroyed sandbox frees its share at once.
    let gone = call(json!({"call": "destroy", "id": "a"})).await;
    assert!(gone.get("ok").is_some(), "{gone}");
    let third = call(json!({"call": "create", "spec": spec("c", 512)})).await;
    assert!(third.get("ok").is_some(), "{third}");
}

/// A node no server reaches freezes its running sandboxes (not the ones frozen on purpose), lists
/// them in its hello, and lets a server's thaw take one back.
#[tokio::test]
async fn a_node_no_server_reaches_freezes_its_sandboxes_until_one_thaws_them() {
    use std::time::{Duration, Instant};
    use warren_runtime::{Runtime, RuntimeState};
    use warren_server::node::fence::Fence;

    let runtime = FakeRuntime::new(false);
    for id in ["running", "paused-in-memory"] {
        let body = spec(id, 64);
        runtime
            .create(&serde_json::from_value(body).unwrap())
            .unwrap();
    }
    runtime.freeze("paused-in-memory").unwrap();
    let fence = Arc::new(Fence::default());
    let started = Instant::now();

    // Heard from just now: nothing happens.
    fence.heard();
    assert!(fence
        .check(runtime.as_ref(), started, Duration::from_secs(60))
        .is_empty());
    // Silent past the limit: the running one is frozen, the one frozen on purpose is not the fence's.
    assert_eq!(
        fence.check(runtime.as_ref(), started, Duration::ZERO),
        ["running"]
    );
    assert_eq!(fence.held(), ["running"]);
    let state = |id: &str| {
        runtime
            .list()
            .unwrap()
            .into_iter()
            .find(|s| s.id == id)
            .unwrap()
            .state
    };
    assert_eq!(state("running"), RuntimeState::Frozen);
    assert!(fence
        .check(runtime.as_ref(), started, Duration::ZERO)
        .is_empty());

    // Through the API: the hello lists it, and a server's thaw takes it back.
    let state_dir = tempfile::tempdir().unwrap();
    let limits = NodeLimits {
        max_sandboxes: 8,
        max_vcpus: 8.0,
        max_memory_mib: 1024,
    };
    let router = warren_server::node::router(
        runtime.clone() as Arc<dyn warren_runtime::Runtime>,
        "secret".into(),
        Vec::new(),
        ("10.99.0.1".parse().unwrap(), 16),
        Ledger::open(state_dir.path(), limits, "n".into()),
        Arc::clone(&fence),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let auth = [("Authorization", "Bearer secret")];
    let hello = send(Method::GET, &format!("{base}/v1/hello"), &auth, None).await;
    assert_eq!(hello.json()["fenced"], json!(["running"]));
    let thawed = send(
        Method::POST,
        &format!("{base}/v1/runtime"),
        &auth,
        Some(json!({"call": "thaw", "id": "running"})),
    )
    .await
    .json();
    assert!(thawed.get("ok").is_some(), "{thawed}");
    assert!(fence.held().is_empty());
    assert_eq!(state("running"), RuntimeState::Running);
    assert_eq!(state("paused-in-memory"), RuntimeState::Frozen);
}
