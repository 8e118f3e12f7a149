//! Admission against the host's real capacity, through the API: the runtime reports how many tasks
//! and how much state disk the sandboxes may still take (injected here), and a create beyond either is
//! refused with a status and a message naming the resource.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use hyper::{Method, StatusCode};
use serde_json::json;
use support::Harness;
use warren_runtime::HostCapacity;

const MIB: u64 = 1024 * 1024;

/// Creates a `base` sandbox through the API: the answer's status and body.
async fn create_base(h: &Harness) -> (StatusCode, serde_json::Value) {
    let answer = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    (answer.status, answer.json())
}

#[tokio::test]
async fn tasks_beyond_the_host_ceiling_get_429_and_disk_beyond_free_space_507() {
    let h = Harness::start(false, |c| {
        c.default_resources.max_pids = 1000;
        c.default_resources.disk_mib = 100;
    })
    .await;
    // Room for two sandboxes' task limits, and disk for many.
    *h.runtime.capacity.lock().unwrap() = HostCapacity {
        sandbox_tasks: 2500,
        disk_free_bytes: 10_000 * MIB,
        disk_reserve_bytes: 0,
        disk_promised_bytes: 0,
    };
    let first = h.create(json!({"templateID": "base"})).await;
    let second = h.create(json!({"templateID": "base"})).await;
    let (status, body) = create_base(&h).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("task capacity") && message.contains("2000 tasks"),
        "{message}"
    );
    assert_eq!(h.runtime.live_ids().len(), 2, "the third was not started");

    // Killing one frees its tasks; now the disk is what is short.
    let id = first["sandboxID"].as_str().unwrap();
    h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    *h.runtime.capacity.lock().unwrap() = HostCapacity {
        sandbox_tasks: 2500,
        disk_free_bytes: (4096 + 1000 + 99) * MIB,
        disk_reserve_bytes: 4096 * MIB,
        disk_promised_bytes: 1000 * MIB,
    };
    let (status, body) = create_base(&h).await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{body}");
    assert_eq!(body["code"], json!(507));
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("insufficient storage") && message.contains("100 MiB"),
        "{message}"
    );
    // The refusal says where the space went, so an operator can tell a full disk from promises.
    assert!(
        message.contains("4096 MiB reserve") && message.contains("1000 MiB that live sandboxes"),
        "{message}"
    );
    *h.runtime.capacity.lock().unwrap() = HostCapacity {
        sandbox_tasks: 2500,
        disk_free_bytes: 100 * MIB,
        disk_reserve_bytes: 0,
        disk_promised_bytes: 0,
    };
    let third = h.create(json!({"templateID": "base"})).await;
    for sandbox in [&second, &third] {
        let id = sandbox["sandboxID"].as_str().unwrap();
        h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await;
    }
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn an_overcommitted_server_promises_the_disk_more_than_once() {
    // The same host for both servers: 300 MiB above a 100 MiB reserve, 250 MiB of it promised to
    // live sandboxes' layers; a 100 MiB layer fits only when the room may be promised twice over.
    let host = HostCapacity {
        sandbox_tasks: u64::MAX,
        disk_free_bytes: 400 * MIB,
        disk_reserve_bytes: 100 * MIB,
        disk_promised_bytes: 250 * MIB,
    };
    for (overcommit, fits) in [(1.0, false), (2.0, true)] {
        let h = Harness::start(false, |c| {
            c.default_resources.disk_mib = 100;
            c.limits.disk_overcommit = overcommit;
        })
        .await;
        *h.runtime.capacity.lock().unwrap() = host;
        let (status, body) = create_base(&h).await;
        if fits {
            assert_eq!(status, StatusCode::CREATED, "{body}");
            let id = body["sandboxID"].as_str().unwrap();
            h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
                .await;
        } else {
            assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{body}");
            assert_eq!(h.runtime.live_ids().len(), 0, "nothing was started");
        }
        h.server.stop().await.unwrap();
    }
}
