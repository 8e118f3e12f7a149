//! Workspaces through the REST API: a user's first call creates their sandbox, later calls give the
//! same one (resumed when paused), a killed one is replaced with the reason in the history, 50
//! concurrent calls for one user make one sandbox, and workspaces are per team.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, Harness};

async fn handed(h: &Harness, key: &str, user: &str) -> (String, String) {
    let answer = h
        .api_as(
            key,
            Method::POST,
            &format!("/workspaces/{user}/sandbox"),
            None,
        )
        .await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let body = answer.json();
    (
        body["sandbox"]["sandboxID"].as_str().unwrap().to_string(),
        body["action"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn a_user_keeps_their_sandbox_and_gets_a_new_one_when_it_is_gone() {
    let h = Harness::start(true, |_| {}).await;
    let key = h.server.api_key.clone();
    let (first, action) = handed(&h, &key, "alice").await;
    assert_eq!(action, "created");
    let (again, action) = handed(&h, &key, "alice").await;
    assert_eq!(
        (again.as_str(), action.as_str()),
        (first.as_str(), "existing")
    );

    // Paused: the next call resumes it.
    let paused = h
        .api(Method::POST, &format!("/sandboxes/{first}/pause"), None)
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT);
    let (resumed, action) = handed(&h, &key, "alice").await;
    assert_eq!(
        (resumed.as_str(), action.as_str()),
        (first.as_str(), "resumed")
    );
    let state = h
        .api(Method::GET, &format!("/sandboxes/{first}"), None)
        .await;
    assert_eq!(state.json()["state"], "running");

    // Killed: the next call makes a new one and says why in the history.
    let killed = h
        .api(Method::DELETE, &format!("/sandboxes/{first}"), None)
        .await;
    assert_eq!(killed.status, StatusCode::NO_CONTENT);
    let (second, action) = handed(&h, &key, "alice").await;
    assert_eq!(action, "replaced");
    assert_ne!(second, first);
    let history = h.api(Method::GET, "/workspaces/alice/history", None).await;
    assert_eq!(history.status, StatusCode::OK);
    let history = history.json();
    assert_eq!(history["sandboxID"], second.as_str());
    let moves: Vec<(String, String)> = history["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["action"].as_str().unwrap().to_string(),
                m["sandboxID"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        moves,
        vec![
            ("created".to_string(), first.clone()),
            ("resumed".to_string(), first.clone()),
            ("replaced".to_string(), second.clone()),
        ]
    );
    let reason = history["history"][2]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&first) && reason.contains("killed"),
        "{reason}"
    );

    // Bad user IDs and another template than the workspace's are refused.
    let bad = h.api(Method::POST, "/workspaces/a%20b/sandbox", None).await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "user ID");
    let other = h
        .api(
            Method::POST,
            "/workspaces/alice/sandbox",
            Some(json!({"templateID": "wt-other"})),
        )
        .await;
    assert_error(&other, StatusCode::CONFLICT, "uses template 'base'");
    let unknown = h.api(Method::GET, "/workspaces/nobody/history", None).await;
    assert_error(&unknown, StatusCode::NOT_FOUND, "no workspace");

    let openapi = h.api(Method::GET, "/openapi.json", None).await.json();
    for path in [
        "/workspaces/{user_id}/sandbox",
        "/workspaces/{user_id}/history",
    ] {
        assert!(openapi["paths"][path].is_object(), "{path} undocumented");
    }
}

#[tokio::test]
async fn fifty_concurrent_calls_for_one_user_make_one_sandbox() {
    let h = Harness::start(false, |_| {}).await;
    let key = h.server.api_key.clone();
    let calls = (0..50).map(|_| handed(&h, &key, "bob"));
    let answers = futures_util::future::join_all(calls).await;
    let ids: std::collections::BTreeSet<&String> = answers.iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let created = answers
        .iter()
        .filter(|(_, action)| action == "created")
        .count();
    assert_eq!(created, 1, "{answers:?}");
    assert_eq!(h.runtime.live_ids().len(), 1, "{:?}", h.runtime.live_ids());
}

#[tokio::test]
async fn workspaces_belong_to_their_team() {
    let h = Harness::start(false, |_| {}).await;
    let blue = h.team_key("blue").await;
    let red_key = h.server.api_key.clone();
    let (red, _) = handed(&h, &red_key, "carol").await;
    let (blues, action) = handed(&h, &blue, "carol").await;
    assert_eq!(action, "created", "blue's carol is not red's carol");
    assert_ne!(red, blues);
    let seen = h
        .api_as(&blue, Method::GET, &format!("/sandboxes/{red}"), None)
        .await;
    assert_eq!(seen.status, StatusCode::NOT_FOUND);
}
