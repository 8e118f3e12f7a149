//! The sandbox proxy against a real server on a fake runtime whose "agents" echo requests.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use support::Harness;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn sandbox(h: &Harness, body: serde_json::Value) -> (String, String) {
    let created = h.create(body).await;
    (
        created["sandboxID"].as_str().unwrap().to_string(),
        created["envdAccessToken"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn headers_and_host_names_route_to_the_sandbox_and_keep_the_token() {
    let h = Harness::start(false, |_| {}).await;
    let (id, token) = sandbox(&h, json!({"templateID": "base"})).await;
    let answer = h
        .proxy(
            "/files?path=/tmp/x",
            &[
                ("E2b-Sandbox-Id", &id),
                ("E2b-Sandbox-Port", "49983"),
                ("X-Access-Token", &token),
            ],
        )
        .await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let echo = answer.json();
    assert_eq!(echo["sandbox"], json!(id));
    assert_eq!(echo["path"], "/files");
    assert_eq!(
        echo["headers"]["x-access-token"],
        json!(token),
        "token passes through"
    );

    // A dashboard session never reaches the sandbox; the sandbox's own cookies do.
    let with_cookie = h
        .proxy(
            "/files",
            &[
                ("E2b-Sandbox-Id", &id),
                ("E2b-Sandbox-Port", "49983"),
                ("X-Access-Token", &token),
                ("Cookie", "app=1; warren_session=0123abcd; theme=dark"),
            ],
        )
        .await;
    assert_eq!(with_cookie.status, StatusCode::OK);
    assert_eq!(
        with_cookie.json()["headers"]["cookie"],
        json!("app=1; theme=dark")
    );

    let host = format!("49983-{id}.localhost");
    let by_host = h.proxy("/health", &[("Host", &host)]).await;
    assert_eq!(by_host.status, StatusCode::OK);
    assert_eq!(by_host.json()["sandbox"], json!(id));

    // POST bodies arrive whole.
    let url = format!("{}/echo", h.server.sandbox_url);
    let posted = support::send(
        Method::POST,
        &url,
        &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "49983")],
        Some(json!({"hello": "world"})),
    )
    .await;
    assert_eq!(posted.json()["body"], r#"{"hello":"world"}"#);
    h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn errors_are_clear() {
    let h = Harness::start(false, |_| {}).await;
    let unknown = h
        .proxy(
            "/",
            &[
                ("E2b-Sandbox-Id", "nosuchsandbox"),
                ("E2b-Sandbox-Port", "49983"),
            ],
        )
        .await;
    assert_eq!(unknown.status, StatusCode::BAD_GATEWAY);
    assert!(unknown.json()["message"]
        .as_str()
        .unwrap()
        .contains("was not found"));
    let untargeted = h.proxy("/", &[]).await;
    assert_eq!(untargeted.status, StatusCode::BAD_REQUEST);

    let (id, _) = sandbox(&h, json!({"templateID": "base"})).await;
    let closed = h
        .proxy("/", &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "1")])
        .await;
    assert_eq!(closed.status, StatusCode::BAD_GATEWAY);
    assert!(closed.json()["message"]
        .as_str()
        .unwrap()
        .contains("port is not open"));

    // Paused without auto-resume: a clear 502, and it stays paused.
    h.api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    let paused = h
        .proxy(
            "/",
            &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "49983")],
        )
        .await;
    assert_eq!(paused.status, StatusCode::BAD_GATEWAY);
    assert!(paused.json()["message"]
        .as_str()
        .unwrap()
        .contains("paused"));
    assert_eq!(
        h.api(Method::GET, &format!("/sandboxes/{id}"), None)
            .await
            .json()["state"],
        "paused"
    );

    // Killed: gone.
    h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    let killed = h
        .proxy(
            "/",
            &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "49983")],
        )
        .await;
    assert!(killed.json()["message"]
        .as_str()
        .unwrap()
        .contains("was not found"));
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn traffic_resumes_a_paused_sandbox_that_allows_it() {
    let h = Harness::start(true, |_| {}).await;
    let (id, _) = sandbox(&h, json!({"templateID": "base", "autoPause": true})).await;
    assert_eq!(
        h.api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert!(h.runtime.live_ids().is_empty());
    let answer = h
        .proxy(
            "/health",
            &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "49983")],
        )
        .await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(
        h.api(Method::GET, &format!("/sandboxes/{id}"), None)
            .await
            .json()["state"],
        "running"
    );
    h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn streams_http2_and_upgrades_pass_through() {
    let h = Harness::start(false, |_| {}).await;
    let (id, _) = sandbox(&h, json!({"templateID": "base"})).await;

    let streamed = h
        .proxy(
            "/stream",
            &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "49983")],
        )
        .await;
    assert_eq!(
        String::from_utf8_lossy(&streamed.body),
        "chunk0\nchunk1\nchunk2\nchunk3\nchunk4\n"
    );

    // HTTP/2 with prior knowledge (h2c), as gRPC-style clients speak it.
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let request = hyper::Request::get(format!("{}/h2", h.server.sandbox_url))
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", "49983")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = h2.request(request).await.unwrap();
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["path"], "/h2");

    // An HTTP/1.1 upgrade (what websockets use), then raw bytes both ways.
    let mut stream = tokio::net::TcpStream::connect(h.server.server.proxy_addr)
        .await
        .unwrap();
    let handshake = format!(
        "GET /upgrade HTTP/1.1\r\nHost: 49983-{id}.localhost\r\nConnection: upgrade\r\nUpgrade: wt-echo\r\n\r\n"
    );
    stream.write_all(handshake.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut byte))
            .await
            .unwrap()
            .unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
        .write_all(b"ping over upgraded stream")
        .await
        .unwrap();
    let mut echoed = vec![0u8; 25];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echoed, b"ping over upgraded stream");

    h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn concurrent_traffic_resumes_a_paused_sandbox_once() {
    let h = std::sync::Arc::new(Harness::start(true, |_| {}).await);
    let (id, _) = sandbox(&h, json!({"templateID": "base", "autoPause": true})).await;
    h.api(Method::POST, &format!("/sandboxes/{id}/pause"), None)
        .await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (h, id) = (h.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            h.proxy(
                "/health",
                &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "49983")],
            )
            .await
            .status
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
    let events = h.server.server.lifecycle.events(&id).await.unwrap();
    let resumes = events
        .iter()
        .filter(|e| e.to_state == warren_server::lifecycle::state::SandboxState::Resuming)
        .count();
    assert_eq!(resumes, 1);
    assert_eq!(h.runtime.inits_of(&id).len(), 2, "one start, one restore");
    h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    let h = std::sync::Arc::into_inner(h).unwrap();
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn private_sandboxes_need_the_traffic_token_on_user_ports() {
    let h = Harness::start(false, |_| {}).await;
    let created = h
        .create(json!({"templateID": "base", "network": {"allowPublicTraffic": false}}))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let traffic = created["trafficAccessToken"]
        .as_str()
        .expect("a private sandbox answers its traffic token")
        .to_string();
    let envd = created["envdAccessToken"].as_str().unwrap().to_string();
    let user_port = |token: Option<&str>| {
        let mut headers = vec![
            ("E2b-Sandbox-Id", id.clone()),
            ("E2b-Sandbox-Port", "8080".to_string()),
        ];
        if let Some(token) = token {
            headers.push(("e2b-traffic-access-token", token.to_string()));
        }
        headers
    };
    let send = |headers: Vec<(&'static str, String)>| {
        let h = &h;
        async move {
            let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            h.proxy("/", &pairs).await
        }
    };
    // Without the token, or with a wrong one: 403, and the sandbox is never contacted.
    for token in [None, Some("wrong"), Some(&traffic[..traffic.len() - 1])] {
        let answer = send(user_port(token)).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{token:?}");
        assert!(String::from_utf8_lossy(&answer.body).contains("e2b-traffic-access-token"));
    }
    // With it, the request goes through (nothing listens on 8080 in the fake: 502 port not open).
    let through = send(user_port(Some(&traffic))).await;
    assert_eq!(
        through.status,
        StatusCode::BAD_GATEWAY,
        "{}",
        String::from_utf8_lossy(&through.body)
    );
    assert!(String::from_utf8_lossy(&through.body).contains("port is not open"));
    // envd's port keeps its own token and needs no traffic token; the header never reaches it.
    let envd_answer = send(vec![
        ("E2b-Sandbox-Id", id.clone()),
        ("E2b-Sandbox-Port", "49983".to_string()),
        ("X-Access-Token", envd),
        ("e2b-traffic-access-token", traffic.clone()),
    ])
    .await;
    assert_eq!(envd_answer.status, StatusCode::OK);
    assert!(envd_answer.json()["headers"]
        .get("e2b-traffic-access-token")
        .is_none());

    // A public sandbox answers no traffic token and needs none.
    let public = h.create(json!({"templateID": "base"})).await;
    assert!(public["trafficAccessToken"].is_null(), "{public}");
    let public_id = public["sandboxID"].as_str().unwrap();
    let open = h
        .proxy(
            "/",
            &[("E2b-Sandbox-Id", public_id), ("E2b-Sandbox-Port", "8080")],
        )
        .await;
    assert_eq!(open.status, StatusCode::BAD_GATEWAY);

    for sandbox in h.runtime.live_ids() {
        h.api(Method::DELETE, &format!("/sandboxes/{sandbox}"), None)
            .await;
    }
    h.server.stop().await.unwrap();
}

/// A sandbox's HTTPS service on `ip:port` with a self-signed certificate: answers each request with
/// `tls host=<Host header>`.
async fn https_service(ip: std::net::Ipv4Addr, port: u16) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["self-signed.test".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let host = text
                    .lines()
                    .find_map(|line| line.strip_prefix("host: "))
                    .unwrap_or("")
                    .trim()
                    .to_string();
                let body = format!("tls host={host}");
                let _ = tls
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
}

#[tokio::test]
async fn masked_hosts_and_https_ports_shape_what_the_sandbox_s_services_see() {
    let h = Harness::start(false, |_| {}).await;
    let created = h
        .create(json!({"templateID": "base", "network": {
            "maskRequestHost": "${PORT}-app.example.test",
            "httpsPorts": [8443]
        }}))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    // GET shows both settings as given.
    let detail = h.api(Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(
        detail.json()["network"]["maskRequestHost"],
        json!("${PORT}-app.example.test")
    );
    assert_eq!(detail.json()["network"]["httpsPorts"], json!([8443]));
    // The sandbox's service sees the mask, the port put in, whatever Host the client sent.
    let envd = h
        .proxy(
            "/health",
            &[
                ("Host", &format!("49983-{id}.localhost")),
                ("X-Access-Token", &token),
            ],
        )
        .await;
    assert_eq!(envd.status, StatusCode::OK);
    assert_eq!(
        envd.json()["headers"]["host"],
        json!("49983-app.example.test")
    );
    // Port 8443 speaks TLS itself (a self-signed certificate): the proxy ends the client's plain
    // HTTP and speaks TLS to it.
    let ip = h.runtime.ip_of(&id).expect("a live fake sandbox");
    https_service(ip, 8443).await;
    let https = h
        .proxy(
            "/",
            &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "8443")],
        )
        .await;
    assert_eq!(
        (
            https.status,
            String::from_utf8_lossy(&https.body).into_owned()
        ),
        (StatusCode::OK, "tls host=8443-app.example.test".to_string())
    );
    // A port that is not in httpsPorts is spoken to in plain HTTP: the TLS service refuses that,
    // so the proxy's answer is an error, not the service's page.
    https_service(ip, 9443).await;
    let plain = h
        .proxy(
            "/",
            &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "9443")],
        )
        .await;
    assert_eq!(plain.status, StatusCode::BAD_GATEWAY);
    for (network, needle) in [
        (json!({"httpsPorts": [49983]}), "network.httpsPorts"),
        (json!({"maskRequestHost": "a b"}), "network.maskRequestHost"),
        (
            json!({"maskRequestHost": "x.test:99999"}),
            "network.maskRequestHost",
        ),
        (json!({"httpsPorts": [0]}), "network.httpsPorts"),
    ] {
        let refused = h
            .api(
                Method::POST,
                "/sandboxes",
                Some(json!({"templateID": "base", "network": network})),
            )
            .await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{network}");
        assert!(
            String::from_utf8_lossy(&refused.body).contains(needle),
            "{network}: {}",
            String::from_utf8_lossy(&refused.body)
        );
    }
    h.api(Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    h.server.stop().await.unwrap();
}
