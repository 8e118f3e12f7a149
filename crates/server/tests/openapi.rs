//! The OpenAPI document is generated from the handlers' annotations (issue 16); these tests hold the
//! served router and the served document to each other: every operation the document names is
//! answered by a handler with a status the document declares for it, and every other method on a
//! documented path is a 405 (the router has no operation the document leaves out).

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use hyper::{Method, StatusCode};
use support::Harness;

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// The path with every `{parameter}` replaced by a value no resource has.
fn concrete(path: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').unwrap() + open;
        out.push_str("doc-probe");
        rest = &rest[close + 1..];
    }
    out + rest
}

#[tokio::test]
async fn every_documented_operation_is_served_and_nothing_else_on_its_path() {
    let h = Harness::start(false, |_| {}).await;
    let doc = h.api(Method::GET, "/openapi.json", None).await.json();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() > 40, "only {} paths documented", paths.len());
    let mut operations = 0;
    for (path, item) in paths {
        let url = concrete(path);
        for method in METHODS {
            let verb = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let answer = h.api(verb, &url, None).await;
            let status = answer.status.as_u16().to_string();
            match item.get(method) {
                Some(operation) => {
                    operations += 1;
                    let body = String::from_utf8_lossy(&answer.body);
                    assert!(
                        answer.status != StatusCode::METHOD_NOT_ALLOWED
                            && !body.contains("no such endpoint"),
                        "{method} {path} is documented but not routed ({status}: {body})"
                    );
                    assert!(
                        operation["responses"].get(&status).is_some(),
                        "{method} {path} answered {status}, which its operation does not declare: {body}"
                    );
                    assert!(
                        operation["operationId"].is_string(),
                        "{method} {path} has no operationId"
                    );
                }
                None => assert_eq!(
                    answer.status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is served but not documented"
                ),
            }
        }
    }
    assert!(operations > 70, "only {operations} operations documented");
    h.server.stop().await.unwrap();
}

#[tokio::test]
async fn every_reference_in_the_document_resolves() {
    let h = Harness::start(false, |_| {}).await;
    let doc = h.api(Method::GET, "/openapi.json", None).await.json();
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(!refs.is_empty());
    for reference in refs {
        let pointer = reference.strip_prefix('#').unwrap();
        assert!(
            doc.pointer(pointer).is_some(),
            "{reference} points at nothing"
        );
    }
    h.server.stop().await.unwrap();
}

fn collect_refs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("$ref", serde_json::Value::String(target)) => out.push(target.clone()),
                    _ => collect_refs(inner, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| collect_refs(i, out)),
        _ => {}
    }
}

#[tokio::test]
async fn a_created_sandbox_links_to_every_operation_on_a_sandbox() {
    let h = Harness::start(false, |_| {}).await;
    let doc = h.api(Method::GET, "/openapi.json", None).await.json();
    let mut on_a_sandbox = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        if path.contains("{sandboxID}") {
            for method in METHODS {
                if let Some(id) = item[method]["operationId"].as_str() {
                    on_a_sandbox.push(id.to_string());
                }
            }
        }
    }
    assert!(on_a_sandbox.contains(&"pauseSandbox".to_string()));
    for create in ["/sandboxes", "/v2/sandboxes"] {
        let links = &doc["paths"][create]["post"]["responses"]["201"]["links"];
        for id in &on_a_sandbox {
            assert_eq!(
                links[id]["parameters"]["sandboxID"], "$response.body#/sandboxID",
                "POST {create} does not link to {id}"
            );
        }
    }
    h.server.stop().await.unwrap();
}
