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
