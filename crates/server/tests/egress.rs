//! Egress rules (addresses and host names) through the REST API on the fake runtime: what the runtime is told at
//! create and on update, E2B's semantics (allow wins; no internet access = deny everything), and the
//! refusals.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, Harness};

fn strings(cidrs: &[warren_runtime::network::egress::Cidr]) -> Vec<String> {
    cidrs.iter().map(|c| c.to_string()).collect()
}

#[tokio::test]
async fn address_rules_reach_the_runtime_with_e2b_semantics() {
    let h = Harness::start(false, |_| {}).await;
    // No internet access but an allowed network: out for that network only.
    let created = h
        .create(json!({
            "templateID": "base",
            "allow_internet_access": false,
            "network": {"allowOut": ["198.51.100.0/24", "203.0.113.9"]}
        }))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let spec = h
        .runtime
        .recorded
        .lock()
        .unwrap()
        .created
        .last()
        .cloned()
        .unwrap();
    assert!(
        spec.network.allow_internet,
        "allowed networks need the way out"
    );
    assert_eq!(
        strings(&spec.network.egress.allow),
        ["198.51.100.0/24", "203.0.113.9/32"]
    );
    assert_eq!(strings(&spec.network.egress.deny), ["0.0.0.0/0"]);

    // A sandbox with internet and a deny list keeps internet for the rest.
    h.create(json!({"templateID": "base", "network": {"denyOut": ["198.51.100.0/24"]}}))
        .await;
    let spec = h
        .runtime
        .recorded
        .lock()
        .unwrap()
        .created
        .last()
        .cloned()
        .unwrap();
    assert!(spec.network.allow_internet);
    assert!(spec.network.egress.allow.is_empty());
    assert_eq!(strings(&spec.network.egress.deny), ["198.51.100.0/24"]);

    // Without internet and without allowed networks: nothing to open later either.
    let offline = h
        .create(json!({"templateID": "base", "allow_internet_access": false}))
        .await;
    let offline_id = offline["sandboxID"].as_str().unwrap();
    let spec = h
        .runtime
        .recorded
        .lock()
        .unwrap()
        .created
        .last()
        .cloned()
        .unwrap();
    // No internet, and a deny of everything for what the egress proxy would judge.
    assert!(!spec.network.allow_internet && spec.network.egress.allow.is_empty());
    assert_eq!(strings(&spec.network.egress.deny), ["0.0.0.0/0"]);
    // Allowing a network later opens the way out for it alone.
    let open = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{offline_id}/network"),
            Some(json!({"allowOut": ["198.51.100.0/24"]})),
        )
        .await;
    assert_eq!(open.status, StatusCode::NO_CONTENT);
    let given = h.runtime.egress.lock().unwrap()[offline_id].clone();
    assert!(given.allow_internet);
    assert_eq!(strings(&given.egress.deny), ["0.0.0.0/0"]);
    // Host names (and wildcards) go to the runtime as patterns; the DNS servers given become allowed
    // addresses because a name is allowed.
    let names = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{offline_id}/network"),
            Some(json!({
                "allowOut": ["API.example.com", "*.pkg.example.org", "198.51.100.0/24"],
                "dnsServers": ["203.0.113.53"]
            })),
        )
        .await;
    assert_eq!(names.status, StatusCode::NO_CONTENT, "{:?}", names.json());
    let given = h.runtime.egress.lock().unwrap()[offline_id].clone();
    let hosts: Vec<String> = given
        .egress
        .allow_hosts
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(hosts, ["api.example.com", "*.pkg.example.org"]);
    assert_eq!(
        strings(&given.egress.allow),
        ["198.51.100.0/24", "203.0.113.53/32"]
    );
    assert_eq!(strings(&given.egress.deny), ["0.0.0.0/0"]);
    // GET shows the rules as they are enforced (and they are in the store: a fresh read).
    let detail = h
        .api(Method::GET, &format!("/sandboxes/{offline_id}"), None)
        .await
        .json();
    assert_eq!(
        detail["network"]["allowOut"],
        json!([
            "198.51.100.0/24",
            "203.0.113.53/32",
            "api.example.com",
            "*.pkg.example.org"
        ])
    );
    assert_eq!(detail["network"]["allowPublicTraffic"], json!(true));
    // Refused, naming the problem, and nothing changes: a denied name, a bad entry, a bad server.
    for (body, needle) in [
        (
            json!({"denyOut": ["api.example.com"]}),
            "host names can only be allowed",
        ),
        (json!({"allowOut": ["exa mple.com"]}), "network.allowOut"),
        (
            json!({"allowOut": ["a.test"], "dnsServers": ["dns.test"]}),
            "network.dnsServers",
        ),
        (
            json!({"egressProxy": {"address": "proxy.test"}}),
            "network.egressProxy.address",
        ),
        (
            json!({"egressProxy": {"address": "proxy.test:1080", "password": "p"}}),
            "network.egressProxy.password needs a username",
        ),
        (
            json!({"egressProxy": {"address": "proxy.test:1080", "via": "x"}}),
            "network.egressProxy: unknown field \"via\"",
        ),
        (
            json!({"egressProxy": {"address": "proxy.test:1080", "tls": {"enabled": true, "caCert": "junk"}}}),
            "network.egressProxy.tls.caCert",
        ),
    ] {
        let refused = h
            .api(
                Method::PUT,
                &format!("/sandboxes/{offline_id}/network"),
                Some(body),
            )
            .await;
        assert_error(&refused, StatusCode::BAD_REQUEST, needle);
    }
    let unchanged = h.runtime.egress.lock().unwrap()[offline_id].clone();
    assert_eq!(unchanged, given);

    // Header rules reach the runtime with their values; GET names the headers, never the values.
    let secret = "Bearer never-shown";
    let with_rules = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{offline_id}/network"),
            Some(json!({
                "allowOut": ["api.example.com"],
                "rules": {"api.example.com": [
                    {"transform": {"headers": {"Authorization": "Bearer first"}}},
                    {"transform": {"headers": {"authorization": secret, "X-Team": "blue"}}}
                ]}
            })),
        )
        .await;
    assert_eq!(
        with_rules.status,
        StatusCode::NO_CONTENT,
        "{:?}",
        with_rules.json()
    );
    let given = h.runtime.egress.lock().unwrap()[offline_id].clone();
    assert_eq!(given.egress.header_rules.len(), 1);
    // The later rule's header wins over an earlier one of the same name (names are not
    // case-sensitive); the order of different headers does not matter.
    let mut headers = given.egress.header_rules[0].headers.clone();
    headers.sort();
    assert_eq!(
        headers,
        [
            ("X-Team".to_string(), "blue".to_string()),
            ("authorization".to_string(), secret.to_string()),
        ]
    );
    let detail = h
        .api(Method::GET, &format!("/sandboxes/{offline_id}"), None)
        .await;
    let text = String::from_utf8_lossy(&detail.body).into_owned();
    assert!(
        !text.contains("never-shown"),
        "GET shows the secret: {text}"
    );
    assert_eq!(
        detail.json()["network"]["rules"]["api.example.com"][0]["transform"]["headers"]
            ["authorization"],
        json!("[redacted]")
    );
    for (rules, needle) in [
        (
            json!(["api.example.com"]),
            "network.rules must be an object",
        ),
        (json!({"*": []}), "network.rules"),
        (
            json!({"a.test": [{"transform": {"body": "x"}}]}),
            "only headers",
        ),
        (
            json!({"a.test": [{"transform": {"headers": {"X": "a\nb"}}}]}),
            "not valid",
        ),
        (
            json!({"a.test": [{"transform": {"headers": {"bad header": "v"}}}]}),
            "valid header name",
        ),
    ] {
        let refused = h
            .api(
                Method::PUT,
                &format!("/sandboxes/{offline_id}/network"),
                Some(json!({"rules": rules})),
            )
            .await;
        assert_error(&refused, StatusCode::BAD_REQUEST, needle);
    }

    // An update of the first sandbox keeps E2B's meaning: its deny-everything stays.
    let update = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{id}/network"),
            Some(json!({"allowOut": ["203.0.113.0/24"]})),
        )
        .await;
    assert_eq!(update.status, StatusCode::NO_CONTENT);
    let given = h.runtime.egress.lock().unwrap()[&id].egress.clone();
    assert_eq!(strings(&given.allow), ["203.0.113.0/24"]);
    assert_eq!(strings(&given.deny), ["0.0.0.0/0"]);
    // Clearing the rules of a sandbox with internet gives it everything back.
    let first_deny = h
        .create(json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"]}}))
        .await;
    let open_id = first_deny["sandboxID"].as_str().unwrap();
    let cleared = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{open_id}/network"),
            Some(json!({"denyOut": []})),
        )
        .await;
    assert_eq!(
        cleared.status,
        StatusCode::NO_CONTENT,
        "{:?}",
        cleared.json()
    );
    let given = h.runtime.egress.lock().unwrap()[open_id].clone();
    assert!(given.allow_internet && given.egress.is_empty());

    // A SOCKS5 proxy of the sandbox's own reaches the runtime whole; GET shows where it is and who
    // logs in, never the password or the CA; an update without it stops tunneling.
    let tunneled = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{open_id}/network"),
            Some(json!({
                "denyOut": ["0.0.0.0/0"],
                "allowOut": ["api.example.com"],
                "egressProxy": {"address": "Proxy.Example.com:1080", "username": "u",
                    "password": "socks-pass-never-shown",
                    "tls": {"enabled": true, "serverName": "socks.example.com"}}
            })),
        )
        .await;
    assert_eq!(
        tunneled.status,
        StatusCode::NO_CONTENT,
        "{:?}",
        tunneled.json()
    );
    let upstream = h.runtime.egress.lock().unwrap()[open_id]
        .egress
        .upstream
        .clone()
        .expect("the proxy reaches the runtime");
    assert_eq!(
        (
            upstream.address(),
            upstream.username.as_deref(),
            upstream.password.as_deref()
        ),
        (
            "proxy.example.com:1080".to_string(),
            Some("u"),
            Some("socks-pass-never-shown")
        )
    );
    let detail = h
        .api(Method::GET, &format!("/sandboxes/{open_id}"), None)
        .await;
    assert!(!String::from_utf8_lossy(&detail.body).contains("socks-pass-never-shown"));
    assert_eq!(
        detail.json()["network"]["egressProxy"],
        json!({"address": "proxy.example.com:1080", "username": "u",
            "tls": {"enabled": true, "serverName": "socks.example.com"}})
    );
    let direct = h
        .api(
            Method::PUT,
            &format!("/sandboxes/{open_id}/network"),
            Some(json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["api.example.com"]})),
        )
        .await;
    assert_eq!(direct.status, StatusCode::NO_CONTENT);
    assert_eq!(
        h.runtime.egress.lock().unwrap()[open_id].egress.upstream,
        None
    );

    for sandbox in h.runtime.live_ids() {
        h.api(Method::DELETE, &format!("/sandboxes/{sandbox}"), None)
            .await;
    }
    h.server.stop().await.unwrap();
}
