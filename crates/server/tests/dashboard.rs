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
