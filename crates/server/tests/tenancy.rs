//! Tenancy through the REST API: an admin key makes a team and a key for it; each team's key sees and
//! acts on its own sandboxes and snapshots only (another team's answer exactly as missing ones do),
//! per-team quotas answer 429, and only admin keys reach /teams and /api-keys.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, Harness};

#[tokio::test]
async fn teams_see_and_touch_only_their_own_sandboxes() {
    let h = Harness::start(true, |_| {}).await;
    // The harness key is the first key of an install: an admin of the default team.
    let team = h
        .api(
            Method::POST,
            "/teams",
            Some(json!({"name": "blue", "maxSandboxes": 1})),
        )
        .await;
    assert_eq!(team.status, StatusCode::CREATED, "{:?}", team.json());
    let team_id = team.json()["teamID"].as_str().unwrap().to_string();
    let made = h
        .api(
            Method::POST,
            "/api-keys",
            Some(json!({"name": "blue-ci", "teamID": "blue"})),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED);
    assert_eq!(made.json()["teamID"], team_id.as_str());
    let blue = made.json()["key"].as_str().unwrap().to_string();

    let red_sandbox = h.create(json!({"templateID": "base"})).await;
    let red_id = red_sandbox["sandboxID"].as_str().unwrap().to_string();

    // Blue cannot see, list, change, pause, fork, snapshot or kill red's sandbox: 404, as for none.
    let get = h
        .api_as(&blue, Method::GET, &format!("/sandboxes/{red_id}"), None)
        .await;
    assert_error(&get, StatusCode::NOT_FOUND, &red_id);
    for (method, path, body) in [
        (Method::DELETE, format!("/sandboxes/{red_id}"), None),
        (
            Method::POST,
            format!("/sandboxes/{red_id}/timeout"),
            Some(json!({"timeout": 5})),
        ),
        (Method::POST, format!("/sandboxes/{red_id}/pause"), None),
        (
            Method::POST,
            format!("/sandboxes/{red_id}/connect"),
            Some(json!({"timeout": 30})),
        ),
        (
            Method::POST,
            format!("/sandboxes/{red_id}/fork"),
            Some(json!({"count": 1})),
        ),
        (
            Method::POST,
            format!("/sandboxes/{red_id}/snapshots"),
            Some(json!({})),
        ),
        (Method::GET, format!("/sandboxes/{red_id}/metrics"), None),
        (Method::GET, format!("/sandboxes/{red_id}/logs"), None),
        (Method::GET, format!("/v2/sandboxes/{red_id}/logs"), None),
    ] {
        let answer = h.api_as(&blue, method.clone(), &path, body).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}");
    }
    let listed = h.api_as(&blue, Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(listed.json().as_array().unwrap().len(), 0);
    assert_eq!(
        h.runtime.live_ids(),
        vec![red_id.clone()],
        "red's sandbox was touched"
    );

    // Blue's own sandbox is blue's; red's lists do not show it. Its quota of one answers 429 next.
    let answer = h
        .api_as(
            &blue,
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let blue_id = answer.json()["sandboxID"].as_str().unwrap().to_string();
    let again = h
        .api_as(
            &blue,
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_error(&again, StatusCode::TOO_MANY_REQUESTS, "team blue quota");
    let red_list = h.api(Method::GET, "/v2/sandboxes", None).await;
    let red_ids: Vec<String> = red_list
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandboxID"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(red_ids, std::slice::from_ref(&red_id));
    let red_sees_blue = h
        .api(Method::GET, &format!("/sandboxes/{blue_id}"), None)
        .await;
    assert_eq!(red_sees_blue.status, StatusCode::NOT_FOUND);

    // Snapshots are the team's too: blue's is not red's to list, use or delete.
    let snapshot = h
        .api_as(
            &blue,
            Method::POST,
            &format!("/sandboxes/{blue_id}/snapshots"),
            Some(json!({})),
        )
        .await;
    assert_eq!(
        snapshot.status,
        StatusCode::CREATED,
        "{:?}",
        snapshot.json()
    );
    let snapshot_id = snapshot.json()["snapshotID"].as_str().unwrap().to_string();
    let red_snapshots = h.api(Method::GET, "/snapshots", None).await;
    assert_eq!(red_snapshots.json().as_array().unwrap().len(), 0);
    let from_snapshot = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": snapshot_id})),
        )
        .await;
    assert_eq!(from_snapshot.status, StatusCode::NOT_FOUND);
    let delete = h
        .api(Method::DELETE, &format!("/snapshots/{snapshot_id}"), None)
        .await;
    assert_eq!(delete.status, StatusCode::NOT_FOUND);

    // Only admin keys manage tenancy.
    for (method, path) in [(Method::GET, "/teams"), (Method::GET, "/api-keys")] {
        let answer = h.api_as(&blue, method, path, None).await;
        assert_error(&answer, StatusCode::FORBIDDEN, "admin");
    }
    let dup = h
        .api(Method::POST, "/teams", Some(json!({"name": "blue"})))
        .await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    let bad = h
        .api(Method::POST, "/teams", Some(json!({"name": "no spaces"})))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let nowhere = h
        .api(
            Method::POST,
            "/api-keys",
            Some(json!({"name": "x", "teamID": "green"})),
        )
        .await;
    assert_error(&nowhere, StatusCode::NOT_FOUND, "green");

    // A revoked key is refused from then on.
    let blue_key_id = made.json()["id"].as_str().unwrap().to_string();
    let revoke = h
        .api(Method::DELETE, &format!("/api-keys/{blue_key_id}"), None)
        .await;
    assert_eq!(revoke.status, StatusCode::NO_CONTENT);
    let after = h.api_as(&blue, Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);

    for id in h.runtime.live_ids() {
        h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await;
    }
    h.server.stop().await.unwrap();
}
