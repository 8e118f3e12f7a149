//! Stored secrets through the REST API on the fake runtime: CRUD with E2B's shapes, the refusals,
//! team isolation, a value never in any answer nor in the database file in clear, and placeholders
//! resolved only on the way to the agent (`envVars`) and the egress proxy (header rules).

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, Answer, Harness};

const VALUE: &str = "sv-4f1c2a9e-first-value";
const VALUE2: &str = "sv-8b7d3e10-second-value";

fn text(answer: &Answer) -> String {
    String::from_utf8_lossy(&answer.body).into_owned()
}

/// No answer ever carries a value.
fn assert_no_value(answer: &Answer) {
    let body = text(answer);
    for value in [VALUE, VALUE2] {
        assert!(!body.contains(value), "a value in an answer: {body}");
    }
}

/// Every byte of the database files (main, WAL, shared memory) lacks the values in clear.
fn assert_not_in_database(state_dir: &std::path::Path) {
    for entry in std::fs::read_dir(state_dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("warren.db") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        for value in [VALUE, VALUE2] {
            assert!(
                !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                "{name} holds a value in clear"
            );
        }
    }
}

#[tokio::test]
async fn secrets_are_created_listed_updated_and_deleted_without_their_values() {
    let h = Harness::start(false, |_| {}).await;
    let made = h
        .api(
            Method::POST,
            "/secrets",
            Some(json!({"name": "OpenAI-Key", "value": VALUE, "metadata": {"env": "prod"}})),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", text(&made));
    assert_no_value(&made);
    let secret = made.json();
    let id = secret["secretID"].as_str().unwrap().to_string();
    assert!(id.starts_with("sec_"), "{id}");
    assert_eq!(secret["name"], "openai-key");
    assert_eq!(secret["currentVersion"], 1);
    assert_eq!(secret["metadata"], json!({"env": "prod"}));
    assert!(secret["createdAt"].is_string() && secret["updatedAt"].is_string());

    // The same name in another case is the same name.
    let again = h
        .api(
            Method::POST,
            "/secrets",
            Some(json!({"name": "openai-KEY", "value": VALUE})),
        )
        .await;
    assert_error(&again, StatusCode::CONFLICT, "openai-key");
    assert_no_value(&again);

    // Refusals name the field at fault and never echo the value.
    let many: serde_json::Map<String, serde_json::Value> =
        (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (body, needle) in [
        (json!({"name": "a b", "value": VALUE}), "name"),
        (json!({"name": "sec_x", "value": VALUE}), "reserved"),
        (json!({"name": "x{y}", "value": VALUE}), "name"),
        (json!({"name": "ok"}), "value is required"),
        (
            json!({"name": "ok", "value": ""}),
            "value must not be empty",
        ),
        (
            json!({"name": "ok", "value": 4_111_222_333u64}),
            "value must be a string",
        ),
        (
            json!({"name": "ok", "value": [VALUE]}),
            "value must be a string",
        ),
        (
            json!({"name": "ok", "value": VALUE, "metadata": many}),
            "metadata",
        ),
        (
            json!({"name": "ok", "value": VALUE, "metadata": {"k": 1}}),
            "metadata.k",
        ),
        (
            json!({"name": "ok", "value": VALUE, "version": 3}),
            "unknown field \"version\"",
        ),
        (json!({"value": VALUE}), "name is required"),
    ] {
        let refused = h.api(Method::POST, "/secrets", Some(body.clone())).await;
        assert_error(&refused, StatusCode::BAD_REQUEST, needle);
        assert_no_value(&refused);
        assert!(!text(&refused).contains("4111222333"), "{}", text(&refused));
    }

    // Two more, to page through.
    for name in ["second", "third"] {
        let made = h
            .api(
                Method::POST,
                "/secrets",
                Some(json!({"name": name, "value": VALUE2})),
            )
            .await;
        assert_eq!(made.status, StatusCode::CREATED, "{}", text(&made));
    }
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let path = match &token {
            Some(token) => format!("/secrets?limit=2&nextToken={token}"),
            None => "/secrets?limit=2".to_string(),
        };
        let page = h.api(Method::GET, &path, None).await;
        assert_eq!(page.status, StatusCode::OK, "{}", text(&page));
        assert_no_value(&page);
        for item in page.json().as_array().unwrap() {
            names.push(item["name"].as_str().unwrap().to_string());
        }
        token = page
            .headers
            .get("x-next-token")
            .map(|v| v.to_str().unwrap().to_string());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(names, ["openai-key", "second", "third"]);
    assert_error(
        &h.api(Method::GET, "/secrets?limit=0", None).await,
        StatusCode::BAD_REQUEST,
        "limit",
    );

    // By id and by name (any case).
    for key in [id.as_str(), "openai-key", "OpenAI-Key"] {
        let got = h.api(Method::GET, &format!("/secrets/{key}"), None).await;
        assert_eq!(got.status, StatusCode::OK, "{}", text(&got));
        assert_no_value(&got);
        assert_eq!(got.json()["secretID"], json!(id));
    }

    // A new value is a new version; metadata alone keeps the version.
    let updated = h
        .api(
            Method::POST,
            &format!("/secrets/{id}"),
            Some(json!({"value": VALUE2})),
        )
        .await;
    assert_eq!(updated.status, StatusCode::OK, "{}", text(&updated));
    assert_no_value(&updated);
    assert_eq!(updated.json()["currentVersion"], 2);
    assert_eq!(updated.json()["metadata"], json!({"env": "prod"}));
    let relabelled = h
        .api(
            Method::POST,
            "/secrets/openai-key",
            Some(json!({"metadata": {"env": "staging"}})),
        )
        .await;
    assert_eq!(relabelled.status, StatusCode::OK, "{}", text(&relabelled));
    assert_eq!(relabelled.json()["currentVersion"], 2);
    assert_eq!(relabelled.json()["metadata"], json!({"env": "staging"}));
    for (body, needle) in [
        (json!({}), "needs a value, metadata or both"),
        (json!({"value": 12}), "value must be a string"),
        (
            json!({"value": VALUE, "name": "renamed"}),
            "unknown field \"name\"",
        ),
    ] {
        let refused = h
            .api(Method::POST, &format!("/secrets/{id}"), Some(body))
            .await;
        assert_error(&refused, StatusCode::BAD_REQUEST, needle);
        assert_no_value(&refused);
    }
    assert_error(
        &h.api(Method::POST, "/secrets/nope", Some(json!({"value": VALUE})))
            .await,
        StatusCode::NOT_FOUND,
        "nope",
    );

    assert_not_in_database(h.server.state_dir());
    // The raw row: a sealed value of the right size for the last version, no plaintext (in the
    // PostgreSQL database with WARREN_TEST_DATABASE=postgres).
    let raw = "SELECT version, ciphertext, nonce FROM secrets WHERE id = $1";
    let (version, ciphertext, nonce): (i64, Vec<u8>, Vec<u8>) =
        match &h.server.server.lifecycle.config().database_url {
            Some(url) => {
                let pool = sqlx::PgPool::connect(url.expose()).await.unwrap();
                let row = sqlx::query_as(raw)
                    .bind(&id)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                pool.close().await;
                row
            }
            None => {
                let pool = sqlx::SqlitePool::connect(&format!(
                    "sqlite://{}",
                    h.server.state_dir().join("warren.db").display()
                ))
                .await
                .unwrap();
                let row = sqlx::query_as(raw)
                    .bind(&id)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                pool.close().await;
                row
            }
        };
    assert_eq!(version, 2);
    assert_eq!(nonce.len(), 12);
    assert_eq!(ciphertext.len(), VALUE2.len() + 16);
    assert!(!String::from_utf8_lossy(&ciphertext).contains("second-value"));

    let deleted = h.api(Method::DELETE, &format!("/secrets/{id}"), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_error(
        &h.api(Method::GET, &format!("/secrets/{id}"), None).await,
        StatusCode::NOT_FOUND,
        &id,
    );
    assert_error(
        &h.api(Method::DELETE, &format!("/secrets/{id}"), None).await,
        StatusCode::NOT_FOUND,
        &id,
    );
}

#[tokio::test]
async fn a_team_never_sees_nor_uses_another_team_s_secrets() {
    let h = Harness::start(false, |_| {}).await;
    let made = h
        .api(
            Method::POST,
            "/secrets",
            Some(json!({"name": "shared-name", "value": VALUE})),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", text(&made));
    let id = made.json()["secretID"].as_str().unwrap().to_string();

    let other = h.team_key("team-b").await;
    let listed = h.api_as(&other, Method::GET, "/secrets", None).await;
    assert_eq!(listed.json(), json!([]));
    for key in [id.as_str(), "shared-name"] {
        let path = format!("/secrets/{key}");
        for (method, body) in [
            (Method::GET, None),
            (Method::POST, Some(json!({"value": VALUE2}))),
            (Method::DELETE, None),
        ] {
            let answer = h.api_as(&other, method.clone(), &path, body).await;
            assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}");
        }
    }
    // Its placeholder means nothing to team B.
    let refused = h
        .api_as(
            &other,
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "envVars": {"K": "${e2b.secrets.shared-name}"}})),
        )
        .await;
    assert_error(
        &refused,
        StatusCode::BAD_REQUEST,
        "envVars.K: placeholder ${e2b.secrets.shared-name} names no secret",
    );
    // Team B may have its own of the same name.
    let own = h
        .api_as(
            &other,
            Method::POST,
            "/secrets",
            Some(json!({"name": "shared-name", "value": VALUE2})),
        )
        .await;
    assert_eq!(own.status, StatusCode::CREATED, "{}", text(&own));
    let a = h.api(Method::GET, "/secrets/shared-name", None).await;
    assert_eq!(a.json()["secretID"], json!(id));
    assert_eq!(a.json()["currentVersion"], 1);
}

#[tokio::test]
async fn placeholders_become_values_only_on_the_way_to_the_agent_and_the_egress_proxy() {
    let h = Harness::start(true, |_| {}).await;
    let made = h
        .api(
            Method::POST,
            "/secrets",
            Some(json!({"name": "api-key", "value": VALUE})),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", text(&made));

    // An unknown or malformed placeholder is refused by name, and nothing is created.
    for (body, needle) in [
        (
            json!({"templateID": "base", "envVars": {"K": "${e2b.secrets.missing}"}}),
            "envVars.K: placeholder ${e2b.secrets.missing} names no secret",
        ),
        (
            json!({"templateID": "base", "envVars": {"K": "${e2b.secrets.api-key"}}),
            "envVars.K: an unterminated",
        ),
        (
            json!({"templateID": "base", "network": {
                "allowOut": ["api.example.com"],
                "rules": {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.nope}"}}}]}
            }}),
            "headers.Authorization: placeholder ${e2b.secrets.nope}",
        ),
    ] {
        let refused = h.api(Method::POST, "/v2/sandboxes", Some(body)).await;
        assert_error(&refused, StatusCode::BAD_REQUEST, needle);
    }
    assert!(h.runtime.recorded.lock().unwrap().created.is_empty());

    let created = h
        .create(json!({
            "templateID": "base",
            "envVars": {"K": "${e2b.secrets.api-key}", "L": "x-${e2b.secrets.API-KEY}-y", "M": "plain"},
            "network": {
                "denyOut": ["0.0.0.0/0"],
                "allowOut": ["api.example.com"],
                "rules": {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.api-key}"}}}]}
            }
        }))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    assert!(!created.to_string().contains(VALUE));

    // The agent got the values; the egress proxy got the header with the value.
    let inits = h.runtime.inits_of(&id);
    let env = &inits.last().unwrap().0["envVars"];
    assert_eq!(env["K"], json!(VALUE));
    assert_eq!(env["L"], json!(format!("x-{VALUE}-y")));
    assert_eq!(env["M"], json!("plain"));
    let header = |h: &Harness| {
        h.runtime.egress.lock().unwrap()[&id].egress.header_rules[0].headers[0]
            .1
            .clone()
    };
    let spec = h
        .runtime
        .recorded
        .lock()
        .unwrap()
        .created
        .last()
        .cloned()
        .unwrap();
    assert_eq!(
        spec.network.egress.header_rules[0].headers[0].1,
        format!("Bearer {VALUE}")
    );

    // The answers keep the placeholders (or less).
    for path in [
        format!("/sandboxes/{id}"),
        "/v2/sandboxes".to_string(),
        "/sandboxes".to_string(),
        format!("/events/sandboxes/{id}"),
        "/events/sandboxes".to_string(),
        "/secrets".to_string(),
        "/secrets/api-key".to_string(),
    ] {
        let answer = h.api(Method::GET, &path, None).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {}", text(&answer));
        assert_no_value(&answer);
    }

    // A new value reaches the running sandbox's rules at once.
    let updated = h
        .api(
            Method::POST,
            "/secrets/api-key",
            Some(json!({"value": VALUE2})),
        )
        .await;
    assert_eq!(updated.status, StatusCode::OK, "{}", text(&updated));
    assert_eq!(header(&h), format!("Bearer {VALUE2}"));

    // Pause and resume: the agent and the proxy get the current value again.
    let paused = h
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT, "{}", text(&paused));
    let resumed = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/resume"),
            Some(json!({})),
        )
        .await;
    assert_eq!(resumed.status, StatusCode::CREATED, "{}", text(&resumed));
    assert_no_value(&resumed);
    let inits = h.runtime.inits_of(&id);
    assert_eq!(inits.last().unwrap().0["envVars"]["K"], json!(VALUE2));
    assert_eq!(header(&h), format!("Bearer {VALUE2}"));

    // A fork gets the current value too, in its environment and its rules.
    let forked = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/fork"),
            Some(json!({"count": 1, "timeout": 60})),
        )
        .await;
    assert_eq!(forked.status, StatusCode::CREATED, "{}", text(&forked));
    assert_no_value(&forked);
    let fork_id = forked.json()[0]["sandbox"]["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();
    let inits = h.runtime.inits_of(&fork_id);
    assert_eq!(inits.last().unwrap().0["envVars"]["K"], json!(VALUE2));
    let restored = h
        .runtime
        .recorded
        .lock()
        .unwrap()
        .restored
        .last()
        .cloned()
        .unwrap();
    assert_eq!(
        restored.network.egress.header_rules[0].headers[0].1,
        format!("Bearer {VALUE2}")
    );

    // Deleted while paused: the resume is refused naming the placeholder, and it stays paused.
    let paused = h
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT, "{}", text(&paused));
    let deleted = h.api(Method::DELETE, "/secrets/api-key", None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let refused = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/resume"),
            Some(json!({})),
        )
        .await;
    assert_error(
        &refused,
        StatusCode::BAD_REQUEST,
        "${e2b.secrets.api-key} names no secret",
    );
    let detail = h.api(Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(detail.json()["state"], "paused");
    assert_not_in_database(h.server.state_dir());
}

#[tokio::test]
async fn a_missing_key_file_makes_secrets_unusable_with_a_clear_error_and_nothing_else() {
    let h = Harness::start(false, |config| {
        config.secrets_key_file = Some("/nonexistent/warren-test/secrets.key".into());
    })
    .await;
    let refused = h
        .api(
            Method::POST,
            "/secrets",
            Some(json!({"name": "k", "value": VALUE})),
        )
        .await;
    assert_error(
        &refused,
        StatusCode::INTERNAL_SERVER_ERROR,
        "/nonexistent/warren-test/secrets.key",
    );
    assert_no_value(&refused);
    // Sandboxes that use no secret are not affected.
    h.create(json!({"templateID": "base"})).await;
}
