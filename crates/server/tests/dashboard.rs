//! The dashboard's sessions through the real server: login sets an `HttpOnly`, `SameSite=Strict`
//! cookie; the cookie works as a credential on the REST API, scoped to the key's team; a
//! state-changing request needs the session's CSRF token; logout and key revocation end the session;
//! without a session JSON answers 401 and pages redirect to the login page.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, send, Answer, Harness};

/// A browser's view of a session: its cookie and CSRF token.
struct Browser {
    cookie: String,
    csrf: String,
}

async fn login(h: &Harness, key: &str) -> (Answer, Option<Browser>) {
    let url = format!("{}/dashboard/api/login", h.server.api_url);
    let answer = send(Method::POST, &url, &[], Some(json!({"apiKey": key}))).await;
    if answer.status != StatusCode::OK {
        return (answer, None);
    }
    let set_cookie = answer.headers["set-cookie"].to_str().unwrap().to_string();
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    let csrf = answer.json()["csrfToken"].as_str().unwrap().to_string();
    (answer, Some(Browser { cookie, csrf }))
}

impl Browser {
    async fn call(
        &self,
        h: &Harness,
        method: Method,
        path: &str,
        with_csrf: bool,
        body: Option<serde_json::Value>,
    ) -> Answer {
        let url = format!("{}{path}", h.server.api_url);
        let mut headers = vec![("cookie", self.cookie.as_str())];
        if with_csrf {
            headers.push(("x-csrf-token", self.csrf.as_str()));
        }
        send(method, &url, &headers, body).await
    }
}

#[tokio::test]
async fn login_sets_a_strict_http_only_cookie_and_a_bad_key_is_refused() {
    let h = Harness::start(true, |_| {}).await;
    let (answer, browser) = login(&h, &h.server.api_key).await;
    let browser = browser.unwrap_or_else(|| panic!("login failed: {:?}", answer.body));
    let set_cookie = answer.headers["set-cookie"].to_str().unwrap();
    assert!(set_cookie.starts_with("warren_session="), "{set_cookie}");
    assert!(set_cookie.contains("HttpOnly"), "{set_cookie}");
    assert!(set_cookie.contains("SameSite=Strict"), "{set_cookie}");
    assert!(set_cookie.contains("Path=/"), "{set_cookie}");
    // Plain HTTP here: `Secure` would make the browser drop the cookie.
    assert!(!set_cookie.contains("Secure"), "{set_cookie}");
    // The cookie is an opaque id, not the key.
    assert!(!browser.cookie.contains(&h.server.api_key));
    assert_eq!(answer.json()["teamId"], warren_server::store::DEFAULT_TEAM);

    let session = browser
        .call(&h, Method::GET, "/dashboard/api/session", false, None)
        .await;
    assert_eq!(session.status, StatusCode::OK);
    assert_eq!(session.json()["csrfToken"], browser.csrf.as_str());

    let (bad, none) = login(&h, "e2b_not_a_key").await;
    assert!(none.is_none());
    assert_error(&bad, StatusCode::UNAUTHORIZED, "invalid API key");
    assert!(bad.headers.get("set-cookie").is_none());
}

#[tokio::test]
async fn without_a_session_json_is_401_and_pages_go_to_login() {
    let h = Harness::start(true, |_| {}).await;
    let url = |path: &str| format!("{}{path}", h.server.api_url);
    let session = send(Method::GET, &url("/dashboard/api/session"), &[], None).await;
    assert_error(&session, StatusCode::UNAUTHORIZED, "no dashboard session");
    let list = send(Method::GET, &url("/v2/sandboxes"), &[], None).await;
    assert_eq!(list.status, StatusCode::UNAUTHORIZED);
    let forged = send(
        Method::GET,
        &url("/v2/sandboxes"),
        &[("cookie", "warren_session=0123456789abcdef")],
        None,
    )
    .await;
    assert_error(
        &forged,
        StatusCode::UNAUTHORIZED,
        "session expired or unknown",
    );
    let files = send(
        Method::GET,
        &url("/dashboard/api/sandboxes/abc/files?path=/"),
        &[],
        None,
    )
    .await;
    assert_eq!(files.status, StatusCode::UNAUTHORIZED);

    let page = send(Method::GET, &url("/dashboard/sandboxes"), &[], None).await;
    if warren_server::dashboard::assets::built() {
        assert_eq!(page.status, StatusCode::SEE_OTHER);
        assert_eq!(page.headers["location"], "/dashboard/login");
        let login_page = send(Method::GET, &url("/dashboard/login"), &[], None).await;
        assert_eq!(login_page.status, StatusCode::OK);
        assert!(String::from_utf8_lossy(&login_page.body).contains("/dashboard/assets/app.js"));
        // The page's script and styles are served without a session (the login page needs them).
        for (asset, kind) in [("app.js", "text/javascript"), ("app.css", "text/css")] {
            let served = send(
                Method::GET,
                &url(&format!("/dashboard/assets/{asset}")),
                &[],
                None,
            )
            .await;
            assert_eq!(served.status, StatusCode::OK, "{asset}");
            assert!(served.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind));
        }
        let missing = send(Method::GET, &url("/dashboard/assets/nope.js"), &[], None).await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
    } else {
        assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(String::from_utf8_lossy(&page.body).contains("dashboard assets not built"));
    }
}

#[tokio::test]
async fn a_state_change_without_the_csrf_token_is_refused() {
    let h = Harness::start(true, |_| {}).await;
    let made = h.create(json!({"templateID": "base"})).await;
    let id = made["sandboxID"].as_str().unwrap().to_string();
    let browser = login(&h, &h.server.api_key).await.1.unwrap();

    // Reads need only the cookie.
    let got = browser
        .call(&h, Method::GET, &format!("/sandboxes/{id}"), false, None)
        .await;
    assert_eq!(got.status, StatusCode::OK);

    let pause = format!("/sandboxes/{id}/pause");
    let refused = browser.call(&h, Method::POST, &pause, false, None).await;
    assert_error(&refused, StatusCode::FORBIDDEN, "X-CSRF-Token");
    let wrong = send(
        Method::POST,
        &format!("{}{pause}", h.server.api_url),
        &[
            ("cookie", browser.cookie.as_str()),
            ("x-csrf-token", "not-the-token"),
        ],
        None,
    )
    .await;
    assert_error(&wrong, StatusCode::FORBIDDEN, "X-CSRF-Token");
    let kill = browser
        .call(&h, Method::DELETE, &format!("/sandboxes/{id}"), false, None)
        .await;
    assert_eq!(kill.status, StatusCode::FORBIDDEN);
    let state = h.api(Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(state.json()["state"], "running", "nothing changed");

    let paused = browser.call(&h, Method::POST, &pause, true, None).await;
    assert_eq!(
        paused.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&paused.body)
    );
    let state = h.api(Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(state.json()["state"], "paused");
}

#[tokio::test]
async fn a_session_sees_only_its_keys_team() {
    let h = Harness::start(true, |_| {}).await;
    let made = h.create(json!({"templateID": "base"})).await;
    let a_id = made["sandboxID"].as_str().unwrap().to_string();
    let b_key = h.team_key("blue").await;
    let a = login(&h, &h.server.api_key).await.1.unwrap();
    let b = login(&h, &b_key).await.1.unwrap();

    let listed = |answer: &Answer| -> Vec<String> {
        answer
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["sandboxID"].as_str().unwrap().to_string())
            .collect()
    };
    let a_list = a.call(&h, Method::GET, "/v2/sandboxes", false, None).await;
    assert_eq!(listed(&a_list), vec![a_id.clone()]);
    let b_list = b.call(&h, Method::GET, "/v2/sandboxes", false, None).await;
    assert_eq!(b_list.status, StatusCode::OK);
    assert!(listed(&b_list).is_empty(), "{:?}", b_list.json());

    let b_get = b
        .call(&h, Method::GET, &format!("/sandboxes/{a_id}"), false, None)
        .await;
    assert_error(&b_get, StatusCode::NOT_FOUND, &a_id);
    let b_kill = b
        .call(
            &h,
            Method::DELETE,
            &format!("/sandboxes/{a_id}"),
            true,
            None,
        )
        .await;
    assert_error(&b_kill, StatusCode::NOT_FOUND, &a_id);
    let b_files = b
        .call(
            &h,
            Method::GET,
            &format!("/dashboard/api/sandboxes/{a_id}/files?path=/"),
            false,
            None,
        )
        .await;
    assert_error(&b_files, StatusCode::NOT_FOUND, &a_id);
    // B's CSRF token does not work with A's cookie.
    let mixed = send(
        Method::POST,
        &format!("{}/sandboxes/{a_id}/pause", h.server.api_url),
        &[
            ("cookie", a.cookie.as_str()),
            ("x-csrf-token", b.csrf.as_str()),
        ],
        None,
    )
    .await;
    assert_eq!(mixed.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn logout_and_key_revocation_end_the_session() {
    let h = Harness::start(true, |_| {}).await;
    let browser = login(&h, &h.server.api_key).await.1.unwrap();

    let refused = browser
        .call(&h, Method::POST, "/dashboard/api/logout", false, None)
        .await;
    assert_eq!(
        refused.status,
        StatusCode::FORBIDDEN,
        "logout needs the token too"
    );
    let out = browser
        .call(&h, Method::POST, "/dashboard/api/logout", true, None)
        .await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    let cleared = out.headers["set-cookie"].to_str().unwrap();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    let after = browser
        .call(&h, Method::GET, "/v2/sandboxes", false, None)
        .await;
    assert_error(
        &after,
        StatusCode::UNAUTHORIZED,
        "session expired or unknown",
    );

    // A key revoked while its session lives ends that session at the next request.
    let key = h.team_key("green").await;
    let green = login(&h, &key).await.1.unwrap();
    let ok = green
        .call(&h, Method::GET, "/v2/sandboxes", false, None)
        .await;
    assert_eq!(ok.status, StatusCode::OK);
    let revoked = h.api(Method::DELETE, "/api-keys/green-ci", None).await;
    assert_eq!(
        revoked.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&revoked.body)
    );
    let gone = green
        .call(&h, Method::GET, "/v2/sandboxes", false, None)
        .await;
    assert_error(&gone, StatusCode::UNAUTHORIZED, "revoked");
}

#[tokio::test]
async fn the_terminal_refuses_other_origins_and_a_missing_csrf_token() {
    let h = Harness::start(true, |_| {}).await;
    let made = h.create(json!({"templateID": "base"})).await;
    let id = made["sandboxID"].as_str().unwrap().to_string();
    let browser = login(&h, &h.server.api_key).await.1.unwrap();
    let host = h.server.api_url.trim_start_matches("http://").to_string();
    let handshake = |origin: String, csrf: &str| {
        let url = format!(
            "{}/dashboard/api/sandboxes/{id}/terminal?csrf={csrf}",
            h.server.api_url
        );
        let cookie = browser.cookie.clone();
        async move {
            send(
                Method::GET,
                &url,
                &[
                    ("cookie", cookie.as_str()),
                    ("origin", origin.as_str()),
                    ("connection", "upgrade"),
                    ("upgrade", "websocket"),
                    ("sec-websocket-version", "13"),
                    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ],
                None,
            )
            .await
        }
    };
    let foreign = handshake("http://evil.example".into(), &browser.csrf).await;
    assert_error(&foreign, StatusCode::FORBIDDEN, "another origin");
    let no_token = handshake(format!("http://{host}"), "").await;
    assert_error(&no_token, StatusCode::FORBIDDEN, "csrf");
}

#[tokio::test]
async fn the_fleet_view_reads_the_teams_operation_times_and_policy_notes() {
    use warren_server::lifecycle::state::SandboxState;
    use warren_server::store::Policy;

    let h = Harness::start(true, |_| {}).await;
    let made = h.create(json!({"templateID": "base"})).await;
    let id = made["sandboxID"].as_str().unwrap().to_string();
    for action in ["pause", "resume"] {
        let done = h
            .api(
                Method::POST,
                &format!("/sandboxes/{id}/{action}"),
                Some(json!({})),
            )
            .await;
        assert!(done.status.is_success(), "{action}: {:?}", done.body);
    }
    let store = h.server.server.lifecycle.store();
    let now = warren_server::lifecycle::now_millis();
    let runaway =
        "runaway process: pid 41 (\"sh -c while :; do :; done\", user user) at 99% CPU for 3 s";
    store
        .note_sandbox_event(
            &id,
            SandboxState::Running,
            runaway,
            Some(Policy::RunawayCpu),
            now,
        )
        .await
        .unwrap();
    store
        .note_sandbox_event(&id, SandboxState::Running, "not a policy's", None, now)
        .await
        .unwrap();
    let a = login(&h, &h.server.api_key).await.1.unwrap();

    let latency = a
        .call(&h, Method::GET, "/dashboard/api/fleet/latency", false, None)
        .await;
    assert_eq!(latency.status, StatusCode::OK);
    let mut operations: Vec<String> = latency.json()["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|op| {
            assert_eq!(op["sandboxID"], id.as_str());
            assert!(op["ms"].as_i64().unwrap() >= 0, "{op}");
            op["operation"].as_str().unwrap().to_string()
        })
        .collect();
    operations.sort();
    assert_eq!(operations, ["create", "pause", "resume"]);
    let bad = a
        .call(
            &h,
            Method::GET,
            "/dashboard/api/fleet/latency?minutes=0",
            false,
            None,
        )
        .await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "minutes");

    let notes = a
        .call(
            &h,
            Method::GET,
            "/dashboard/api/fleet/policy-events",
            false,
            None,
        )
        .await;
    assert_eq!(notes.status, StatusCode::OK);
    let notes = notes.json();
    let notes = notes.as_array().unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0]["policy"], "runaway_cpu");
    assert_eq!(notes[0]["sandboxID"], id.as_str());
    assert_eq!(notes[0]["templateID"], "base");
    assert_eq!(notes[0]["message"], runaway);

    // Another team sees none of it.
    let b_key = h.team_key("blue").await;
    let b = login(&h, &b_key).await.1.unwrap();
    let b_latency = b
        .call(&h, Method::GET, "/dashboard/api/fleet/latency", false, None)
        .await;
    assert_eq!(b_latency.json()["operations"], json!([]));
    let b_notes = b
        .call(
            &h,
            Method::GET,
            "/dashboard/api/fleet/policy-events",
            false,
            None,
        )
        .await;
    assert_eq!(b_notes.json(), json!([]));
}

/// An open server-sent event stream, read one event at a time.
struct EventStream {
    body: hyper::body::Incoming,
    buffer: String,
}

impl EventStream {
    async fn open(url: &str, headers: &[(&str, &str)]) -> (StatusCode, EventStream) {
        use http_body_util::Empty;
        use hyper_util::client::legacy::Client;
        let client: Client<_, Empty<bytes::Bytes>> =
            Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let mut request = hyper::Request::builder().uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = client
            .request(request.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let stream = EventStream {
            body: response.into_body(),
            buffer: String::new(),
        };
        (status, stream)
    }

    /// The next event as (name, id, data), skipping keep-alive comments; `None` when the stream
    /// ends. Fails after 30 s without one.
    async fn next(&mut self) -> Option<(String, String, String)> {
        use http_body_util::BodyExt;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut name, mut id, mut data) = (String::new(), String::new(), String::new());
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("event: ") {
                        name = value.to_string();
                    } else if let Some(value) = line.strip_prefix("id: ") {
                        id = value.to_string();
                    } else if let Some(value) = line.strip_prefix("data: ") {
                        data.push_str(value);
                    }
                }
                if name.is_empty() && data.is_empty() {
                    continue; // a comment
                }
                return Some((name, id, data));
            }
            let frame = tokio::time::timeout(std::time::Duration::from_secs(30), self.body.frame())
                .await
                .expect("an event within 30 s")?
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }
}

fn messages(data: &str) -> Vec<String> {
    serde_json::from_str::<serde_json::Value>(data)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["message"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn the_log_tail_pushes_new_lines_resumes_after_its_last_event_and_ends_with_the_sandbox() {
    let h = Harness::start(true, |_| {}).await;
    let made = h.create(json!({"templateID": "base"})).await;
    let id = made["sandboxID"].as_str().unwrap().to_string();
    let browser = login(&h, &h.server.api_key).await.1.unwrap();
    let url = format!(
        "{}/dashboard/api/sandboxes/{id}/logs/stream",
        h.server.api_url
    );
    let (status, mut stream) = EventStream::open(&url, &[("cookie", &browser.cookie)]).await;
    assert_eq!(status, StatusCode::OK);

    // First the backlog: the sandbox's life so far.
    let (name, first_id, data) = stream.next().await.unwrap();
    assert_eq!(name, "lines");
    let backlog = messages(&data);
    assert!(
        backlog.iter().any(|m| m.contains("creating -> running")),
        "{backlog:?}"
    );
    assert!(
        !backlog.iter().any(|m| m.contains("pausing")),
        "{backlog:?}"
    );

    // Then what happens while the stream is open, pushed.
    let paused = h
        .api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(paused.status, StatusCode::NO_CONTENT);
    let mut pushed = Vec::new();
    while !pushed
        .iter()
        .any(|m: &String| m.contains("pausing -> paused"))
    {
        let (name, _, data) = stream.next().await.unwrap();
        assert_eq!(name, "lines");
        pushed.extend(messages(&data));
    }
    assert!(
        pushed.iter().all(|m| !m.contains("creating")),
        "nothing of the backlog is sent again: {pushed:?}"
    );

    // A reconnect with the first event's id continues after it: the pause, not the backlog.
    let (_, mut resumed) = EventStream::open(
        &url,
        &[("cookie", &browser.cookie), ("last-event-id", &first_id)],
    )
    .await;
    let (_, _, data) = resumed.next().await.unwrap();
    let again = messages(&data);
    assert!(
        again.iter().any(|m| m.contains("running -> pausing")),
        "{again:?}"
    );
    assert!(!again.iter().any(|m| m.contains("creating")), "{again:?}");

    // Killed: the kill is pushed, then the stream ends.
    let killed = h
        .api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    assert_eq!(killed.status, StatusCode::NO_CONTENT);
    let mut last = String::new();
    while let Some((name, _, data)) = stream.next().await {
        if name == "lines" {
            assert!(!messages(&data).is_empty());
        }
        last = name;
    }
    assert_eq!(last, "end");

    // Another team's session cannot open it.
    let b_key = h.team_key("blue").await;
    let b = login(&h, &b_key).await.1.unwrap();
    let (status, _) = EventStream::open(&url, &[("cookie", &b.cookie)]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
