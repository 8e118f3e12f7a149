//! The REST API against a real server (port 0, temp state) on a fake runtime: paths, bodies, status
//! codes and error bodies as the E2B SDK expects them.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, send, Harness};
use warren_server::lifecycle::{now_millis, scheduler};
use warren_server::store::DEFAULT_TEAM;

#[tokio::test]
async fn requests_without_a_valid_key_are_refused() {
    let h = Harness::start(false, |_| {}).await;
    let url = format!("{}/sandboxes", h.server.api_url);
    assert_error(
        &send(Method::GET, &url, &[], None).await,
        StatusCode::UNAUTHORIZED,
        "X-API-Key",
    );
    let bad = send(Method::GET, &url, &[("X-API-Key", "e2b_nope")], None).await;
    assert_error(&bad, StatusCode::UNAUTHORIZED, "invalid API key");
    let revoked = warren_server::keys::create_key(
        h.server.server.lifecycle.store().as_ref(),
        "gone",
        "default",
        false,
    )
    .await
    .unwrap();
    warren_server::keys::revoke_key(h.server.server.lifecycle.store().as_ref(), "gone")
        .await
        .unwrap();
    let answer = send(Method::GET, &url, &[("X-API-Key", &revoked.secret)], None).await;
    assert_error(&answer, StatusCode::UNAUTHORIZED, "invalid API key");
    // Meta endpoints need no key.
    let openapi = send(
        Method::GET,
        &format!("{}/openapi.json", h.server.api_url),
        &[],
        None,
    )
    .await;
    assert_eq!(openapi.status, StatusCode::OK);
    assert!(openapi.json()["paths"]["/v2/sandboxes"].is_object());
    h.server.stop().await.unwrap();
}

/// Sends a request whose body comes 300 ms after its head, then a second request on the same
/// connection; returns everything the server wrote back.
async fn late_body_then_second_request(addr: &str, head: &str, body: &str, second: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    client.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    client
        .write_all(body.as_bytes())
        .await
        .expect("the connection is still open for the body");
    client
        .write_all(second.as_bytes())
        .await
        .expect("the connection is still open for a second request");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
            if String::from_utf8_lossy(&seen).matches("HTTP/1.1 ").count() >= 2 {
                break;
            }
        }
    })
    .await;
    String::from_utf8_lossy(&seen).into_owned()
}

/// A request refused before its body was read (bad key; no sandbox behind a proxy host) is
/// answered on a connection that stays open, so a client still writing its body reads the
/// error instead of "broken pipe".
#[tokio::test]
async fn a_refusal_before_the_body_arrives_keeps_the_connection() {
    let h = Harness::start(false, |_| {}).await;
    let body = r#"{"templateID":"base"}"#;
    let api = h.server.api_url.trim_start_matches("http://");
    let seen = late_body_then_second_request(
        api,
        &format!(
            "POST /sandboxes HTTP/1.1\r\nHost: api\r\nX-API-Key: e2b_nope\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        ),
        body,
        "GET /health HTTP/1.1\r\nHost: api\r\n\r\n",
    )
    .await;
    assert!(seen.starts_with("HTTP/1.1 401"), "{seen}");
    assert_eq!(
        seen.matches("HTTP/1.1 ").count(),
        2,
        "second answer missing: {seen}"
    );

    let proxy = h.server.sandbox_url.trim_start_matches("http://");
    let seen = late_body_then_second_request(
        proxy,
        &format!(
            "POST /run HTTP/1.1\r\nHost: 49983-nosuchsandbox.warren.local\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        ),
        body,
        "GET / HTTP/1.1\r\nHost: 49983-nosuchsandbox.warren.local\r\n\r\n",
    )
    .await;
    assert!(
        seen.starts_with("HTTP/1.1 4") || seen.starts_with("HTTP/1.1 5"),
        "{seen}"
    );
    assert_eq!(
        seen.matches("HTTP/1.1 ").count(),
        2,
        "second answer missing: {seen}"
    );
    h.server.stop().await.unwrap();
}

/// A template build's sandbox has no sandbox record, yet it leaves lifecycle events like any
/// other: created when it is up and killed when it goes, under its template's team, naming the
/// build (`sandboxBuildID`); another team does not see them.
#[tokio::test]
async fn build_sandboxes_leave_lifecycle_events_for_their_team() {
    let h = Harness::start(false, |_| {}).await;
    let lifecycle = &h.server.server.lifecycle;
    let request = warren_server::lifecycle::admission::Request {
        vcpus: 1.0,
        memory_mib: 256,
        max_pids: 256,
        disk_mib: 256,
    };
    lifecycle
        .admit_build_sandbox("bld-ev-1", Some(DEFAULT_TEAM), request)
        .await
        .unwrap();
    lifecycle
        .build_sandbox_started("bld-ev-1", "base", "build-7", "step 2: RUN make")
        .await
        .unwrap();
    lifecycle
        .release_build_sandbox("bld-ev-1", "destroyed: its build step ended")
        .await
        .unwrap();
    // Admitted but never up: no event.
    lifecycle
        .admit_build_sandbox("bld-ev-2", Some(DEFAULT_TEAM), request)
        .await
        .unwrap();
    lifecycle
        .release_build_sandbox("bld-ev-2", "its creation failed")
        .await
        .unwrap();

    let events = h
        .api(
            Method::GET,
            "/events/sandboxes/bld-ev-1?orderAsc=true",
            None,
        )
        .await;
    assert_eq!(events.status, StatusCode::OK, "{:?}", events.json());
    let events = events.json();
    let events = events.as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["sandbox.lifecycle.created", "sandbox.lifecycle.killed"],
        "{events:?}"
    );
    for event in events {
        assert_eq!(event["sandboxTeamId"], DEFAULT_TEAM, "{event}");
        assert_eq!(event["sandboxTemplateId"], "base", "{event}");
        assert_eq!(event["sandboxBuildId"], "build-7", "{event}");
    }
    assert!(events[0]["eventData"]["reason"]
        .as_str()
        .unwrap()
        .contains("RUN make"));
    let team = h
        .api(Method::GET, "/events/sandboxes?limit=100", None)
        .await
        .json();
    assert!(team
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["sandboxId"] != "bld-ev-2"));
    assert!(team
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["sandboxId"] == "bld-ev-1"));

    let blue = h.team_key("blue").await;
    let seen = h
        .api_as(&blue, Method::GET, "/events/sandboxes?limit=100", None)
        .await;
    assert_eq!(seen.status, StatusCode::OK);
    assert!(
        seen.json()
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["sandboxId"] != "bld-ev-1"),
        "another team sees the build's events: {:?}",
        seen.json()
    );
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn create_initialises_the_agent_and_reports_the_sandbox() {
    let h = Harness::start(false, |_| {}).await;
    let created = h
        .create(json!({"templateID": "base", "timeout": 60, "metadata": {"team": "a"}, "envVars": {"FOO": "bar"}}))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    assert_eq!(created["templateID"], "base");
    assert_eq!(created["clientID"], "warren");
    assert_eq!(created["envdVersion"], warren_proto::api::ENVD_VERSION);
    assert_eq!(created["domain"], "localhost");
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    assert!(token.len() >= 32);

    let inits = h.runtime.inits_of(&id);
    assert_eq!(inits.len(), 1);
    let (body, previous) = &inits[0];
    assert_eq!(body["envVars"]["FOO"], "bar");
    assert_eq!(body["accessToken"], json!(token));
    assert_eq!(body["defaultUser"], "user");
    assert!(body["timestamp"].is_string());
    assert_eq!(previous, &None);
    let spec = h.runtime.recorded.lock().unwrap().created[0].clone();
    assert_eq!(
        spec.layers,
        vec![std::path::PathBuf::from("/nonexistent/wt-rootfs")]
    );

    let detail = h.api(Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(detail.status, StatusCode::OK);
    let detail = detail.json();
    assert_eq!(detail["state"], "running");
    assert_eq!(detail["metadata"]["team"], "a");
    assert_eq!(detail["cpuCount"], 2);
    assert_eq!(detail["memoryMB"], 512);
    assert_eq!(detail["envdAccessToken"], json!(token));
    assert_eq!(detail["lifecycle"]["onTimeout"], "kill");
    let started =
        chrono::DateTime::parse_from_rfc3339(detail["startedAt"].as_str().unwrap()).unwrap();
    let end = chrono::DateTime::parse_from_rfc3339(detail["endAt"].as_str().unwrap()).unwrap();
    assert_eq!((end - started).num_seconds(), 60);

    // v1 create is not secure unless asked.
    let v1 = h
        .api(
            Method::POST,
            "/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_eq!(v1.status, StatusCode::CREATED);
    assert!(v1.json().get("envdAccessToken").is_none());

    for sandbox in h.runtime.live_ids() {
        assert_eq!(
            h.api(Method::DELETE, &format!("/sandboxes/{sandbox}"), None)
                .await
                .status,
            StatusCode::NO_CONTENT
        );
    }
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn bad_requests_get_the_right_status() {
    let h = Harness::start(false, |c| c.limits.max_timeout = Duration::from_secs(3600)).await;
    let unknown = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "nope"})),
        )
        .await;
    assert_error(&unknown, StatusCode::NOT_FOUND, "template 'nope' not found");
    let negative = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "timeout": -1})),
        )
        .await;
    assert_error(&negative, StatusCode::BAD_REQUEST, "timeout");
    let long = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "timeout": 3601})),
        )
        .await;
    assert_error(&long, StatusCode::BAD_REQUEST, "maximum of 3600");
    let malformed = h
        .api(Method::POST, "/v2/sandboxes", Some(json!({"timeout": 5})))
        .await;
    assert_error(&malformed, StatusCode::BAD_REQUEST, "templateID");
    // What the server does not provide is refused by name, never dropped (MCP, IAM, fields
    // it does not know), a volume the team does not have is named, and a malformed network setting
    // names its field.
    for (body, named) in [
        (
            json!({"templateID": "base", "network": {"egressProxy": {"address": "p.test"}}}),
            "network.egressProxy.address",
        ),
        (
            json!({"templateID": "base", "network": {"allowOut": ["api example.com"]}}),
            "network.allowOut: \"api example.com\" is not an IPv4 address, CIDR, host name",
        ),
        (
            json!({"templateID": "base", "network": {"denyOut": ["api.example.com"]}}),
            "host names can only be allowed",
        ),
        (
            json!({"templateID": "base", "network": {"denyOut": ["198.51.100.7/24"]}}),
            "network.denyOut: \"198.51.100.7/24\" has host bits set",
        ),
        (
            json!({"templateID": "base", "volumeMounts": [{"name": "v", "path": "/data"}]}),
            "volumeMounts: no volume named \"v\"",
        ),
        (json!({"templateID": "base", "mcp": {"x": {}}}), "mcp"),
        (
            json!({"templateID": "base", "frobnicate": true}),
            "frobnicate",
        ),
        (
            json!({"templateID": "base", "network": {"allowOutt": []}}),
            "allowOutt",
        ),
    ] {
        let answer = h.api(Method::POST, "/v2/sandboxes", Some(body)).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, named);
    }
    assert!(
        h.runtime.live_ids().is_empty(),
        "a refused create made a sandbox"
    );
    // The defaults spelled out are fine.
    let defaults = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "network": {"allowPublicTraffic": true, "allowOut": []}, "mcp": null})),
        )
        .await;
    assert_eq!(defaults.status, StatusCode::CREATED);
    let id = defaults.json()["sandboxID"].as_str().unwrap().to_string();
    // Address rules replace the running sandbox's rules in the runtime at once.
    let update = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{id}/network"),
            Some(json!({"allowOut": ["198.51.100.0/24"], "denyOut": ["0.0.0.0/0"]})),
        )
        .await;
    assert_eq!(update.status, StatusCode::NO_CONTENT, "{:?}", update.json());
    let given = h
        .runtime
        .egress
        .lock()
        .unwrap()
        .get(&id)
        .cloned()
        .expect("rules given")
        .egress;
    assert_eq!(
        given
            .allow
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>(),
        ["198.51.100.0/24"]
    );
    assert_eq!(
        given.deny.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        ["0.0.0.0/0"]
    );
    let unsupported = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{id}/network"),
            Some(json!({"allowOut": ["api.example.com"], "allow_internet_access": false})),
        )
        .await;
    assert_error(
        &unsupported,
        StatusCode::BAD_REQUEST,
        "allow_internet_access",
    );
    assert_eq!(
        h.runtime
            .egress
            .lock()
            .unwrap()
            .get(&id)
            .map(|r| r.egress.allow.len()),
        Some(1),
        "a refused update changed the rules"
    );
    let empty = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{id}/network"),
            Some(json!({})),
        )
        .await;
    assert_eq!(empty.status, StatusCode::NO_CONTENT);
    let gone = h
        .api(
            Method::PUT,
            "/sandboxes/doesnotexist/network",
            Some(json!({"denyOut": ["0.0.0.0/0"]})),
        )
        .await;
    assert_error(&gone, StatusCode::NOT_FOUND, "doesnotexist");
    for sandbox in h.runtime.live_ids() {
        h.api(Method::DELETE, &format!("/sandboxes/{sandbox}"), None)
            .await;
    }
    let missing = h.api(Method::GET, "/sandboxes/doesnotexist", None).await;
    assert_error(&missing, StatusCode::NOT_FOUND, "doesnotexist");
    assert_eq!(
        h.api(Method::DELETE, "/sandboxes/doesnotexist", None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let timeout = h
        .api(
            Method::POST,
            "/sandboxes/doesnotexist/timeout",
            Some(json!({"timeout": 5})),
        )
        .await;
    assert_eq!(timeout.status, StatusCode::NOT_FOUND);
    let template = h.api(Method::GET, "/templates/nope", None).await;
    assert_error(
        &template,
        StatusCode::NOT_FOUND,
        "template 'nope' not found",
    );
    let list = h
        .api(Method::GET, "/v2/sandboxes?state=sleeping", None)
        .await;
    assert_error(&list, StatusCode::BAD_REQUEST, "sleeping");
    assert!(h.runtime.live_ids().is_empty(), "nothing was started");
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn quotas_refuse_with_429() {
    let h = Harness::start(false, |c| c.limits.max_sandboxes = 1).await;
    let first = h.create(json!({"templateID": "base"})).await;
    let refused = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_error(&refused, StatusCode::TOO_MANY_REQUESTS, "sandbox limit");
    let id = first["sandboxID"].as_str().unwrap();
    h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    let again = h.create(json!({"templateID": "base"})).await;
    h.api(
        Method::DELETE,
        &format!("/sandboxes/{}", again["sandboxID"].as_str().unwrap()),
        None,
    )
    .await;

    // A template build's sandbox holds a place like any other: while it lives, a create is refused,
    // and a second build sandbox is not admitted either.
    let build = warren_server::lifecycle::admission::Request {
        vcpus: 1.0,
        memory_mib: 512,
        max_pids: 1024,
        disk_mib: 1024,
    };
    let lifecycle = &h.server.server.lifecycle;
    lifecycle
        .admit_build_sandbox("bld-test-1", None, build)
        .await
        .expect("room for one build sandbox");
    let refused = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_error(&refused, StatusCode::TOO_MANY_REQUESTS, "sandbox limit");
    let second = lifecycle
        .admit_build_sandbox("bld-test-2", None, build)
        .await;
    assert!(second.unwrap_err().to_string().contains("sandbox limit"));
    lifecycle
        .release_build_sandbox("bld-test-1", "destroyed: its build step ended")
        .await
        .unwrap();
    let after = h.create(json!({"templateID": "base"})).await;
    h.api(
        Method::DELETE,
        &format!("/sandboxes/{}", after["sandboxID"].as_str().unwrap()),
        None,
    )
    .await;

    let h2 = Harness::start(false, |c| c.limits.max_total_memory_mib = 256).await;
    let refused = h2
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_error(&refused, StatusCode::TOO_MANY_REQUESTS, "memory");
    let metrics = send(
        Method::GET,
        &format!("{}/metrics", h2.server.api_url),
        &[],
        None,
    )
    .await;
    assert!(String::from_utf8_lossy(&metrics.body).contains("warren_admission_refused_total 1"));
    h.server.stop().await.unwrap();
    h2.server.stop().await.unwrap();
}

#[tokio::test]
async fn lists_filter_and_paginate() {
    let h = Harness::start(false, |_| {}).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let created = h
            .create(json!({"templateID": "base", "metadata": {"n": i.to_string(), "kind": "x y"}}))
            .await;
        ids.push(created["sandboxID"].as_str().unwrap().to_string());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let paused = &ids[0];
    assert_eq!(
        h.api(Method::POST, &format!("/sandboxes/{paused}/pause"), None)
            .await
            .status,
        StatusCode::NO_CONTENT
    );

    let all = h.api(Method::GET, "/v2/sandboxes", None).await.json();
    assert_eq!(all.as_array().unwrap().len(), 3);
    let running = h
        .api(Method::GET, "/v2/sandboxes?state=running", None)
        .await
        .json();
    assert_eq!(running.as_array().unwrap().len(), 2);
    let paused_list = h
        .api(Method::GET, "/v2/sandboxes?state=paused", None)
        .await
        .json();
    assert_eq!(paused_list[0]["sandboxID"], json!(paused));
    assert_eq!(paused_list[0]["state"], "paused");
    let v1 = h.api(Method::GET, "/sandboxes", None).await.json();
    assert_eq!(
        v1.as_array().unwrap().len(),
        2,
        "v1 lists running sandboxes"
    );

    // The SDK double-encodes metadata: {"kind": "x y", "n": "1"}.
    let filtered = h
        .api(
            Method::GET,
            "/v2/sandboxes?metadata=kind%3Dx%252520y%26n%3D1",
            None,
        )
        .await
        .json();
    assert_eq!(filtered.as_array().unwrap().len(), 1);
    assert_eq!(filtered[0]["sandboxID"], json!(ids[1]));

    // Pages of one, newest first, following x-next-token.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let path = match &token {
            Some(token) => format!("/v2/sandboxes?limit=1&nextToken={token}"),
            None => "/v2/sandboxes?limit=1".to_string(),
        };
        let page = h.api(Method::GET, &path, None).await;
        assert_eq!(page.status, StatusCode::OK);
        for item in page.json().as_array().unwrap() {
            seen.push(item["sandboxID"].as_str().unwrap().to_string());
        }
        token = page
            .headers
            .get("x-next-token")
            .map(|v| v.to_str().unwrap().to_string());
        if token.is_none() {
            break;
        }
        assert!(seen.len() <= 3, "pagination does not end");
    }
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first);
    let asc = h
        .api(Method::GET, "/v2/sandboxes?order=asc&limit=2", None)
        .await;
    assert_eq!(asc.json()[0]["sandboxID"], json!(ids[0]));
    assert!(asc.headers.contains_key("x-next-token"));

    for id in &ids {
        assert_eq!(
            h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
                .await
                .status,
            StatusCode::NO_CONTENT
        );
    }
    assert!(h.runtime.live_ids().is_empty());
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn timeouts_kill_or_pause_at_expiry() {
    let h = Harness::start(false, |_| {}).await;
    let lifecycle = h.server.server.lifecycle.clone();
    let killed = h
        .create(json!({"templateID": "base", "timeout": 3600}))
        .await;
    let killed = killed["sandboxID"].as_str().unwrap().to_string();
    let paused = h
        .create(json!({"templateID": "base", "timeout": 3600, "autoPause": true}))
        .await;
    let paused = paused["sandboxID"].as_str().unwrap().to_string();

    // Nothing is due yet.
    let report = scheduler::expire_due(&lifecycle, now_millis())
        .await
        .unwrap();
    assert_eq!(report, Default::default());

    // The seed's policy: long timeout while working, then set_timeout(60); gone a minute later.
    for id in [&killed, &paused] {
        let answer = h
            .api(
                Method::POST,
                &format!("/sandboxes/{id}/timeout"),
                Some(json!({"timeout": 60})),
            )
            .await;
        assert_eq!(answer.status, StatusCode::NO_CONTENT);
    }
    let report = scheduler::expire_due(&lifecycle, now_millis() + 30_000)
        .await
        .unwrap();
    assert_eq!(report, Default::default(), "not yet due after 30 s");
    let report = scheduler::expire_due(&lifecycle, now_millis() + 61_000)
        .await
        .unwrap();
    assert_eq!(report.killed, vec![killed.clone()]);
    assert_eq!(report.paused, vec![paused.clone()]);

    assert_eq!(
        h.api(Method::GET, &format!("/sandboxes/{killed}"), None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let info = h
        .api(Method::GET, &format!("/sandboxes/{paused}"), None)
        .await
        .json();
    assert_eq!(info["state"], "paused");
    assert_eq!(info["lifecycle"]["onTimeout"], "pause");
    assert_eq!(
        h.runtime.live_ids(),
        vec![paused.clone()],
        "frozen, not destroyed (no checkpoint)"
    );

    // Connect resumes a paused sandbox (201), then just extends a running one (200).
    let connect = h
        .api(
            Method::POST,
            &format!("/v2/sandboxes/{paused}/connect"),
            Some(json!({"timeout": 30})),
        )
        .await;
    assert_eq!(connect.status, StatusCode::CREATED);
    assert_eq!(connect.json()["sandboxID"], json!(paused));
    let again = h
        .api(
            Method::POST,
            &format!("/sandboxes/{paused}/connect"),
            Some(json!({"timeout": 30})),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK);

    let logs = h
        .api(Method::GET, &format!("/sandboxes/{paused}/logs"), None)
        .await
        .json();
    let lines: Vec<&str> = logs["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_str().unwrap())
        .collect();
    assert_eq!(
        lines,
        vec![
            "sandbox - -> creating",
            "sandbox creating -> running",
            "sandbox running -> pausing: timeout",
            "sandbox pausing -> paused: timeout (frozen in memory)",
            "sandbox paused -> resuming",
            "sandbox resuming -> running",
        ]
    );
    h.api(Method::DELETE, &format!("/sandboxes/{paused}"), None)
        .await;
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn pause_checkpoints_and_resume_restores_when_the_runtime_can() {
    let h = Harness::start(true, |_| {}).await;
    let created = h
        .create(json!({"templateID": "base", "envVars": {"A": "1"}}))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    assert_eq!(
        h.api(
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            Some(json!({}))
        )
        .await
        .status,
        StatusCode::NO_CONTENT
    );
    let snapshot = h.server.state_dir().join("snapshots").join(&id);
    assert!(snapshot.join("fake-checkpoint").is_file());
    assert!(
        h.runtime.live_ids().is_empty(),
        "a checkpointed sandbox runs nothing"
    );
    let twice = h
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_error(&twice, StatusCode::CONFLICT, "already paused");
    let metrics = h
        .api(Method::GET, &format!("/sandboxes/{id}/metrics"), None)
        .await
        .json();
    assert_eq!(metrics, json!([]));

    let resumed = h
        .api(
            Method::POST,
            &format!("/sandboxes/{id}/resume"),
            Some(json!({"timeout": 120})),
        )
        .await;
    assert_eq!(resumed.status, StatusCode::CREATED);
    assert!(!snapshot.exists(), "snapshot removed after restore");
    assert_eq!(h.runtime.live_ids(), vec![id.clone()]);
    let inits = h.runtime.inits_of(&id);
    assert_eq!(
        inits.len(),
        2,
        "the agent is initialised again after restore"
    );
    assert_eq!(inits[1].0["envVars"]["A"], "1");
    assert_eq!(
        inits[1].1.as_deref(),
        Some(token.as_str()),
        "re-init carries the old token"
    );
    let running = h
        .api(Method::POST, &format!("/sandboxes/{id}/resume"), None)
        .await;
    assert_error(&running, StatusCode::CONFLICT, "already running");

    let metrics = h
        .api(Method::GET, &format!("/sandboxes/{id}/metrics"), None)
        .await
        .json();
    assert_eq!(metrics[0]["memUsed"], json!(64 << 20));
    assert_eq!(metrics[0]["cpuCount"], 2);

    let templates = h.api(Method::GET, "/templates", None).await.json();
    assert_eq!(templates[0]["templateID"], "base");
    assert_eq!(templates[0]["spawnCount"], 1);
    let base = h.api(Method::GET, "/templates/base", None).await.json();
    assert_eq!(base["builds"][0]["status"], "ready");

    assert_eq!(
        h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    // Prometheus: one create, pause and resume timed; the refusals counted by declared route.
    let scraped =
        String::from_utf8_lossy(&h.api(Method::GET, "/metrics", None).await.body).into_owned();
    for operation in ["create", "pause", "resume"] {
        assert!(
            scraped.contains(&format!(
                "warren_operation_seconds_count{{operation=\"{operation}\"}} 1"
            )),
            "{operation} timed once:\n{scraped}"
        );
    }
    for (method, route, status) in [
        ("DELETE", "/sandboxes/{sandboxID}", 404),
        ("POST", "/sandboxes/{sandboxID}/pause", 409),
        ("POST", "/sandboxes/{sandboxID}/resume", 409),
    ] {
        let line = format!(
            "warren_api_errors_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} 1"
        );
        assert!(scraped.contains(&line), "{line} in\n{scraped}");
    }
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn runtime_failures_are_a_plain_500_with_an_id() {
    let h = Harness::start(false, |c| c.limits.max_sandboxes = 1).await;
    h.runtime
        .fail_create
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let failed = h
        .api(
            Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
        )
        .await;
    assert_error(&failed, StatusCode::INTERNAL_SERVER_ERROR, "error id");
    assert!(
        !String::from_utf8_lossy(&failed.body).contains("secret detail"),
        "details stay in the log"
    );
    assert_eq!(
        h.api(Method::GET, "/v2/sandboxes", None).await.json(),
        json!([])
    );
    let metrics = send(
        Method::GET,
        &format!("{}/metrics", h.server.api_url),
        &[],
        None,
    )
    .await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains(r#"warren_sandbox_transitions_total{from="creating",to="failed"} 1"#),
        "{text}"
    );

    // The failed sandbox holds no quota.
    h.runtime
        .fail_create
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let created = h.create(json!({"templateID": "base"})).await;
    let metrics = send(
        Method::GET,
        &format!("{}/metrics", h.server.api_url),
        &[],
        None,
    )
    .await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains(r#"warren_sandboxes{state="running"} 1"#),
        "{text}"
    );
    h.api(
        Method::DELETE,
        &format!("/sandboxes/{}", created["sandboxID"].as_str().unwrap()),
        None,
    )
    .await;
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn concurrent_creates_never_exceed_the_quota() {
    let h = std::sync::Arc::new(Harness::start(false, |c| c.limits.max_sandboxes = 3).await);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            h.api(
                Method::POST,
                "/v2/sandboxes",
                Some(json!({"templateID": "base"})),
            )
            .await
            .status
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(h.runtime.live_ids().len(), 3);
    for id in h.runtime.live_ids() {
        h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await;
    }
    let h = std::sync::Arc::into_inner(h).unwrap();
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn the_running_scheduler_kills_an_expired_sandbox() {
    let h = Harness::start(false, |c| c.scheduler_interval = Duration::from_millis(50)).await;
    let created = h.create(json!({"templateID": "base", "timeout": 1})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let mut status = StatusCode::OK;
    for _ in 0..200 {
        status = h
            .api(Method::GET, &format!("/sandboxes/{id}"), None)
            .await
            .status;
        if status == StatusCode::NOT_FOUND {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the scheduler never expired the sandbox"
    );
    assert!(h.runtime.live_ids().is_empty());
    let events = h
        .server
        .server
        .lifecycle
        .store()
        .sandbox_events(&id)
        .await
        .unwrap();
    assert_eq!(events.last().unwrap().reason.as_deref(), Some("timeout"));
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn timeout_zero_ends_the_sandbox_now() {
    let h = Harness::start(false, |_| {}).await;
    let killed = h
        .create(json!({"templateID": "base", "timeout": 3600}))
        .await;
    let killed = killed["sandboxID"].as_str().unwrap().to_string();
    let paused = h
        .create(json!({"templateID": "base", "timeout": 3600, "autoPause": true}))
        .await;
    let paused = paused["sandboxID"].as_str().unwrap().to_string();
    for id in [&killed, &paused] {
        let answer = h
            .api(
                Method::POST,
                &format!("/sandboxes/{id}/timeout"),
                Some(json!({"timeout": 0})),
            )
            .await;
        assert_eq!(answer.status, StatusCode::NO_CONTENT);
    }
    // Ended by the call itself, the way expiry would: no scheduler tick in between.
    assert_eq!(
        h.api(Method::GET, &format!("/sandboxes/{killed}"), None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let info = h
        .api(Method::GET, &format!("/sandboxes/{paused}"), None)
        .await
        .json();
    assert_eq!(info["state"], "paused");
    // Negative timeouts stay refused.
    let answer = h
        .api(
            Method::POST,
            &format!("/sandboxes/{paused}/timeout"),
            Some(json!({"timeout": -1})),
        )
        .await;
    assert_error(&answer, StatusCode::BAD_REQUEST, "timeout");
    h.server.stop().await.unwrap();
}

/// `GET /servers`: a server on its own store lists itself, leading; team keys are refused.
#[tokio::test]
async fn the_server_list_shows_this_server_leading() {
    let h = Harness::start(false, |_| {}).await;
    let url = format!("{}/servers", h.server.api_url);
    let key = h.server.api_key.clone();
    // The first beat runs before the server answers: its row is there.
    let answer = send(Method::GET, &url, &[("X-API-Key", &key)], None).await;
    assert_eq!(answer.status, StatusCode::OK);
    let servers = answer.json();
    let servers = servers.as_array().unwrap();
    assert_eq!(servers.len(), 1, "{servers:?}");
    let server = &servers[0];
    assert_eq!(
        server["serverID"],
        h.server.server.lifecycle.store().server_id()
    );
    assert_eq!(
        (&server["leader"], &server["this"]),
        (&json!(true), &json!(true))
    );
    assert!(server["startedAt"].as_str().unwrap().ends_with('Z'));
    let team_key = warren_server::keys::create_key(
        h.server.server.lifecycle.store().as_ref(),
        "member",
        DEFAULT_TEAM,
        false,
    )
    .await
    .unwrap();
    let refused = send(Method::GET, &url, &[("X-API-Key", &team_key.secret)], None).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    h.server.stop().await.unwrap();
}
