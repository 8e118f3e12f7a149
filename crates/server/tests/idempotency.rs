//! `Idempotency-Key` on create through the REST API: a retried create answers the first create's
//! sandbox (also when the retries race the first), a changed request under the same key is refused,
//! a failed create leaves the key free for the retry, and keys are per team.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, send, Harness};

async fn create(h: &Harness, key: &str, body: serde_json::Value) -> support::Answer {
    let url = format!("{}/v2/sandboxes", h.server.api_url);
    send(
        Method::POST,
        &url,
        &[("X-API-Key", &h.server.api_key), ("Idempotency-Key", key)],
        Some(body),
    )
    .await
}

fn id_of(answer: &support::Answer) -> String {
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()["sandboxID"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_retried_create_returns_the_first_sandbox() {
    let h = Harness::start(false, |_| {}).await;
    let body = json!({"templateID": "base", "metadata": {"job": "1"}});
    let first = id_of(&create(&h, "job-1", body.clone()).await);
    let retry = id_of(&create(&h, "job-1", body.clone()).await);
    assert_eq!(first, retry);
    assert_eq!(h.runtime.live_ids(), vec![first.clone()]);

    // Racing retries of a new key: every one answers the same single sandbox.
    let racers = (0..6).map(|_| create(&h, "job-2", body.clone()));
    let answers = futures_util::future::join_all(racers).await;
    let ids: Vec<String> = answers.iter().map(id_of).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_ne!(ids[0], first);
    assert_eq!(h.runtime.live_ids().len(), 2, "{:?}", h.runtime.live_ids());

    // The same key with another request is refused; another key makes another sandbox.
    let changed = create(
        &h,
        "job-1",
        json!({"templateID": "base", "metadata": {"job": "2"}}),
    )
    .await;
    assert_error(&changed, StatusCode::CONFLICT, "different request");
    let other = id_of(&create(&h, "job-3", body.clone()).await);
    assert_ne!(other, first);

    // A create that fails leaves the key free: the corrected retry under it succeeds.
    let failed = create(&h, "job-4", json!({"templateID": "wt-missing"})).await;
    assert_eq!(failed.status, StatusCode::NOT_FOUND);
    let fixed = create(&h, "job-4", json!({"templateID": "wt-missing"})).await;
    assert_eq!(
        fixed.status,
        StatusCode::NOT_FOUND,
        "a failed create was remembered"
    );

    for bad in ["", "has space", &"k".repeat(300)] {
        let answer = create(&h, bad, body.clone()).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, "Idempotency-Key");
    }
    // Without the header every create is a new sandbox, as before.
    let url = format!("{}/v2/sandboxes", h.server.api_url);
    let plain = send(
        Method::POST,
        &url,
        &[("X-API-Key", &h.server.api_key)],
        Some(body),
    )
    .await;
    assert_ne!(id_of(&plain), first);

    for id in h.runtime.live_ids() {
        h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await;
    }
    h.server.stop().await.unwrap();
}
