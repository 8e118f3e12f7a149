//! The template build endpoints against a real server on the fake runtime: paths, status codes and
//! bodies as the E2B SDK's Template builder and the legacy API use them. Real builds (RUN steps in real
//! sandboxes) are covered by template_build.rs and tests/e2e/test_templates_e2e.py.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use hyper::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, send, Harness};

async fn request_build(h: &Harness, name: &str) -> serde_json::Value {
    let answer = h
        .api(
            Method::POST,
            "/v3/templates",
            Some(json!({"name": name, "cpuCount": 1, "memoryMB": 512})),
        )
        .await;
    assert_eq!(
        answer.status,
        StatusCode::ACCEPTED,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

#[tokio::test]
async fn v3_request_hands_out_ids_and_a_rebuild_keeps_the_template() {
    let h = Harness::start(false, |_| {}).await;
    let first = request_build(&h, "web-app:v1").await;
    let template_id = first["templateID"].as_str().unwrap().to_string();
    assert_eq!(first["aliases"], json!(["web-app"]));
    assert_eq!(first["names"], json!(["web-app"]));
    assert_eq!(first["tags"], json!(["v1"]));
    assert_eq!(first["public"], json!(false));
    assert_eq!(first["buildID"].as_str().unwrap().len(), 36);

    let second = request_build(&h, "web-app").await;
    assert_eq!(second["templateID"], json!(template_id));
    assert_ne!(second["buildID"], first["buildID"]);

    // The alias resolves, and a requested build is listed as waiting.
    let alias = h.api(Method::GET, "/templates/aliases/web-app", None).await;
    assert_eq!(alias.status, StatusCode::OK);
    assert_eq!(alias.json()["templateID"], json!(template_id));
    let listed = h.api(Method::GET, "/templates", None).await.json();
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["templateID"] == json!(template_id))
        .expect("the requested template is listed");
    assert_eq!(entry["buildStatus"], json!("waiting"));

    let status = h
        .api(
            Method::GET,
            &format!(
                "/templates/{template_id}/builds/{}/status",
                first["buildID"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!(status.status, StatusCode::OK);
    let status = status.json();
    assert_eq!(status["status"], json!("waiting"));
    assert_eq!(status["templateID"], json!(template_id));
    assert_eq!(status["logs"], json!([]));
    assert_eq!(status["logEntries"], json!([]));
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn bad_build_requests_are_refused_with_clear_errors() {
    let h = Harness::start(false, |_| {}).await;
    let post = |body: serde_json::Value| h.api(Method::POST, "/v3/templates", Some(body));
    assert_error(
        &post(json!({"cpuCount": 1})).await,
        StatusCode::BAD_REQUEST,
        "name",
    );
    assert_error(
        &post(json!({"name": "Bad Name!"})).await,
        StatusCode::BAD_REQUEST,
        "invalid template name",
    );
    assert_error(
        &post(json!({"name": "ok", "cpuCount": 0})).await,
        StatusCode::BAD_REQUEST,
        "cpuCount",
    );
    assert_error(
        &post(json!({"name": "ok", "memoryMB": 1})).await,
        StatusCode::BAD_REQUEST,
        "memoryMB",
    );
    assert_error(
        &post(json!({"name": "base"})).await,
        StatusCode::CONFLICT,
        "built-in",
    );
    assert_error(
        &post(json!({"name": 5})).await,
        StatusCode::BAD_REQUEST,
        "invalid request body",
    );
    // Without a key.
    let url = format!("{}/v3/templates", h.server.api_url);
    let answer = send(Method::POST, &url, &[], Some(json!({"name": "x"}))).await;
    assert_error(&answer, StatusCode::UNAUTHORIZED, "X-API-Key");

    // Legacy request needs a dockerfile.
    assert_error(
        &h.api(Method::POST, "/templates", Some(json!({"alias": "x"})))
            .await,
        StatusCode::BAD_REQUEST,
        "dockerfile",
    );
    assert_error(
        &h.api(
            Method::POST,
            "/templates",
            Some(json!({"alias": "x", "dockerfile": "  "})),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "empty",
    );
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn starting_unknown_or_mismatched_builds() {
    let h = Harness::start(false, |_| {}).await;
    let requested = request_build(&h, "starter").await;
    let id = requested["templateID"].as_str().unwrap();
    let build = requested["buildID"].as_str().unwrap();
    let body = json!({"fromImage": "e2bdev/base", "steps": []});
    assert_error(
        &h.api(
            Method::POST,
            &format!("/v2/templates/nope/builds/{build}"),
            Some(body.clone()),
        )
        .await,
        StatusCode::NOT_FOUND,
        "not found",
    );
    assert_error(
        &h.api(
            Method::POST,
            &format!("/v2/templates/{id}/builds/00000000-0000-4000-8000-00000000dead"),
            Some(body.clone()),
        )
        .await,
        StatusCode::NOT_FOUND,
        "not found",
    );
    assert_error(
        &h.api(
            Method::POST,
            &format!("/v2/templates/{id}/builds/{build}"),
            Some(json!({"steps": "nope"})),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid request body",
    );
    // A v3 request has no Dockerfile: the legacy start refuses it (and leaves it startable).
    assert_error(
        &h.api(
            Method::POST,
            &format!("/templates/{id}/builds/{build}"),
            None,
        )
        .await,
        StatusCode::BAD_REQUEST,
        "without a dockerfile",
    );
    let status = h
        .api(
            Method::GET,
            &format!("/templates/{id}/builds/{build}/status"),
            None,
        )
        .await;
    assert_eq!(status.json()["status"], json!("waiting"));
    assert_error(
        &h.api(
            Method::GET,
            &format!("/templates/{id}/builds/{build}/status?logsOffset=x"),
            None,
        )
        .await,
        StatusCode::BAD_REQUEST,
        "logsOffset",
    );
    assert_error(
        &h.api(
            Method::GET,
            &format!("/templates/{id}/builds/{build}/status?level=loud"),
            None,
        )
        .await,
        StatusCode::BAD_REQUEST,
        "level",
    );
    assert_error(
        &h.api(
            Method::GET,
            &format!("/templates/{id}/builds/00000000-0000-4000-8000-00000000dead/status"),
            None,
        )
        .await,
        StatusCode::NOT_FOUND,
        "not found",
    );
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn file_upload_link_takes_one_upload_then_reports_present() {
    let h = Harness::start(false, |_| {}).await;
    let requested = request_build(&h, "files").await;
    let id = requested["templateID"].as_str().unwrap();
    let hash = "ab".repeat(32);
    assert_error(
        &h.api(Method::GET, &format!("/templates/{id}/files/not-hex"), None)
            .await,
        StatusCode::BAD_REQUEST,
        "SHA-256",
    );
    let link = h
        .api(Method::GET, &format!("/templates/{id}/files/{hash}"), None)
        .await;
    assert_eq!(link.status, StatusCode::CREATED);
    let link = link.json();
    assert_eq!(link["present"], json!(false));
    let url = link["url"].as_str().unwrap().to_string();
    assert!(url.contains("token="), "{url}");

    // Without the token, or with a wrong one: refused.
    let bare = format!("{}/templates/{id}/files/{hash}", h.server.api_url);
    assert_error(
        &send(Method::PUT, &bare, &[], Some(json!("x"))).await,
        StatusCode::UNAUTHORIZED,
        "token",
    );
    assert_error(
        &send(
            Method::PUT,
            &format!("{bare}?token=wrong"),
            &[],
            Some(json!("x")),
        )
        .await,
        StatusCode::UNAUTHORIZED,
        "token",
    );
    // The SDK PUTs to the URL as given, without its API key.
    let put = send(Method::PUT, &url, &[], Some(json!("archive bytes"))).await;
    assert_eq!(
        put.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&put.body)
    );
    // The token was for one upload.
    assert_error(
        &send(Method::PUT, &url, &[], Some(json!("again"))).await,
        StatusCode::UNAUTHORIZED,
        "token",
    );
    let again = h
        .api(Method::GET, &format!("/templates/{id}/files/{hash}"), None)
        .await
        .json();
    assert_eq!(again, json!({"present": true}));
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn delete_is_refused_while_sandboxes_use_the_template_unless_forced() {
    let h = Harness::start(false, |_| {}).await;
    assert_error(
        &h.api(Method::DELETE, "/templates/nope", None).await,
        StatusCode::NOT_FOUND,
        "not found",
    );
    assert_error(
        &h.api(Method::DELETE, "/templates/base", None).await,
        StatusCode::CONFLICT,
        "built-in",
    );
    let unused = request_build(&h, "unused").await;
    let unused_id = unused["templateID"].as_str().unwrap();
    let deleted = h
        .api(Method::DELETE, &format!("/templates/{unused_id}"), None)
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(
        h.api(Method::GET, &format!("/templates/{unused_id}"), None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // A template with a live sandbox: mark the requested template ready on the base's layers (the fake
    // runtime does not build) and start a sandbox from it by alias.
    let used = request_build(&h, "used").await;
    let used_id = used["templateID"].as_str().unwrap();
    let store = h.server.server.lifecycle.store();
    let mut record = store.get_template(used_id).await.unwrap().unwrap();
    let base = store.get_template("base").await.unwrap().unwrap();
    record.layers = base.layers.clone();
    record.status = "ready".into();
    store.upsert_template(&record).await.unwrap();
    let sandbox = h.create(json!({"templateID": "used"})).await;
    assert_eq!(sandbox["templateID"], json!(used_id));

    assert_error(
        &h.api(Method::DELETE, "/templates/used", None).await,
        StatusCode::CONFLICT,
        "force",
    );
    assert_error(
        &h.api(Method::DELETE, "/templates/used?force=maybe", None)
            .await,
        StatusCode::BAD_REQUEST,
        "force",
    );
    let forced = h
        .api(Method::DELETE, "/templates/used?force=true", None)
        .await;
    assert_eq!(forced.status, StatusCode::NO_CONTENT);
    assert_eq!(
        h.api(Method::GET, "/templates/aliases/used", None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn the_openapi_document_describes_the_build_endpoints() {
    let h = Harness::start(false, |_| {}).await;
    let url = format!("{}/openapi.json", h.server.api_url);
    let doc = send(Method::GET, &url, &[], None).await.json();
    let paths = &doc["paths"];
    assert!(paths["/v3/templates"]["post"].is_object());
    assert!(paths["/templates"]["post"].is_object());
    assert!(paths["/templates/{templateID}"]["delete"].is_object());
    assert!(paths["/templates/{templateID}/files/{hash}"]["put"].is_object());
    assert!(paths["/v2/templates/{templateID}/builds/{buildID}"]["post"].is_object());
    assert!(paths["/templates/{templateID}/builds/{buildID}/status"]["get"].is_object());
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn a_restart_fails_builds_left_unfinished_with_a_reason() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_path_buf();
    let first = Harness::start(false, |c| c.state_dir = dir.clone()).await;
    let requested = request_build(&first, "restart-me").await;
    let (template_id, build_id) = (
        requested["templateID"].as_str().unwrap().to_string(),
        requested["buildID"].as_str().unwrap().to_string(),
    );
    let path = format!("/templates/{template_id}/builds/{build_id}/status");
    assert_eq!(
        first.api(Method::GET, &path, None).await.json()["status"],
        json!("waiting")
    );
    // The same store (WARREN_TEST_DATABASE=postgres: the same database).
    let database_url = first.server.server.lifecycle.config().database_url.clone();
    drop(first);

    // A new server on the same state: the build it can never run is failed, not left waiting.
    let second = Harness::start(false, |c| {
        c.state_dir = dir.clone();
        c.database_url = database_url;
    })
    .await;
    let status = second.api(Method::GET, &path, None).await;
    assert_eq!(status.status, StatusCode::OK);
    let body = status.json();
    assert_eq!(body["status"], json!("error"), "{body}");
    let reason = body["reason"]["message"].as_str().unwrap_or_default();
    assert!(
        reason.contains("stopped before this build finished"),
        "{body}"
    );
    let listed = second.api(Method::GET, "/templates", None).await.json();
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["templateID"] == json!(template_id))
        .expect("the template is still listed");
    assert_eq!(entry["buildStatus"], json!("error"));
}

/// The `policies` of a sandbox's detail (`null` when it has none).
async fn policies_of(h: &Harness, id: &str) -> serde_json::Value {
    let detail = h
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .json();
    detail["policies"].clone()
}

#[tokio::test]
async fn a_templates_policies_are_where_its_sandboxes_start_and_their_own_go_over_them() {
    let h = Harness::start(false, |_| {}).await;
    let patch = |body: serde_json::Value| h.api(Method::PATCH, "/templates/base", Some(body));
    let set = patch(json!({"policies": {
        "idleTimeoutSecs": 600,
        "runaway": {"cpuPercent": 50, "seconds": 10},
        "reapOrphansEverySecs": 60
    }}))
    .await;
    assert_eq!(set.status, StatusCode::OK, "{:?}", set.json());
    let shown = h.api(Method::GET, "/templates/base", None).await.json();
    assert_eq!(shown["templateID"], "base");
    assert_eq!(shown["policies"]["idleTimeoutSecs"], 600, "{shown}");

    let inherited = h.create(json!({"templateID": "base"})).await;
    let id = inherited["sandboxID"].as_str().unwrap();
    assert_eq!(
        policies_of(&h, id).await,
        json!({"idleTimeoutSecs": 600, "runaway": {"cpuPercent": 50.0, "seconds": 10}, "reapOrphansEverySecs": 60})
    );
    let own = h
        .create(json!({"templateID": "base", "policies": {"runaway": {"kill": true}, "idleTimeoutSecs": 0}}))
        .await;
    let id = own["sandboxID"].as_str().unwrap();
    assert_eq!(
        policies_of(&h, id).await,
        json!({
            "idleTimeoutSecs": 0,
            "runaway": {"cpuPercent": 50.0, "seconds": 10, "kill": true},
            "reapOrphansEverySecs": 60
        })
    );

    // The SDK's v2 update: public, answered with the template's names; policies are kept.
    let public = h
        .api(
            Method::PATCH,
            "/v2/templates/base",
            Some(json!({"public": false})),
        )
        .await;
    assert_eq!(public.status, StatusCode::OK, "{:?}", public.json());
    assert_eq!(public.json(), json!({"names": ["base"]}));
    let shown = h.api(Method::GET, "/templates/base", None).await.json();
    assert_eq!(
        (
            shown["public"].clone(),
            shown["policies"]["idleTimeoutSecs"].clone()
        ),
        (json!(false), json!(600))
    );

    for (body, named) in [
        (
            json!({"policies": {"memoryAlertPercent": 101}}),
            "memoryAlertPercent",
        ),
        (
            json!({"policies": {"idleTimeoutSecs": -1}}),
            "idleTimeoutSecs",
        ),
        (json!({"colour": "red"}), "colour"),
    ] {
        let refused = patch(body).await;
        assert_error(&refused, StatusCode::BAD_REQUEST, named);
    }
    let missing = h
        .api(
            Method::PATCH,
            "/templates/wtnosuchtemplate",
            Some(json!({"public": true})),
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    // Clearing them: new sandboxes start with none.
    let cleared = patch(json!({"policies": {}})).await;
    assert_eq!(cleared.status, StatusCode::OK);
    let plain = h.create(json!({"templateID": "base"})).await;
    let id = plain["sandboxID"].as_str().unwrap();
    assert_eq!(policies_of(&h, id).await, serde_json::Value::Null);
}
