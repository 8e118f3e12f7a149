//! Measures what the proxy adds to a request: sequential keep-alive GETs straight to a fake sandbox's
//! agent port and the same GETs through the proxy; prints p50/p99 of each.
//!
//! `cargo run --release -p warren-server --example proxy_latency [requests]`

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

#[path = "../tests/support/fake_runtime.rs"]
#[allow(dead_code)]
mod fake_runtime;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use warren_server::lifecycle::CreateRequest;

async fn measure(
    url: &str,
    headers: &[(&str, &str)],
    count: usize,
) -> anyhow::Result<Vec<Duration>> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut samples = Vec::with_capacity(count);
    for i in 0..count + 50 {
        let mut request = hyper::Request::get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let started = Instant::now();
        let response = client
            .request(request.body(Full::new(Bytes::new()))?)
            .await?;
        anyhow::ensure!(
            response.status().is_success(),
            "status {}",
            response.status()
        );
        response.into_body().collect().await?;
        if i >= 50 {
            samples.push(started.elapsed());
        }
    }
    samples.sort();
    Ok(samples)
}

fn report(name: &str, samples: &[Duration]) {
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!(
        "{name:>8}: n={} p50={:?} p99={:?}",
        samples.len(),
        at(0.50),
        at(0.99)
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(2000);
    let runtime = fake_runtime::FakeRuntime::new(false);
    let server =
        warren_testkit::TestServer::start(runtime, PathBuf::from("/nonexistent/wt-rootfs"), |_| {})
            .await?;
    let created = server
        .server
        .lifecycle
        .create(CreateRequest {
            template: "base".to_string(),
            ..CreateRequest::default()
        })
        .await?;
    let id = created.record.id.clone();
    let ip = created.record.ip.ok_or_else(|| anyhow::anyhow!("no ip"))?;
    let direct = measure(&format!("http://{ip}:49983/health"), &[], count).await?;
    let proxied = measure(
        &format!("{}/health", server.sandbox_url),
        &[("E2b-Sandbox-Id", &id), ("E2b-Sandbox-Port", "49983")],
        count,
    )
    .await?;
    report("direct", &direct);
    report("proxied", &proxied);
    server.server.lifecycle.kill(&id, "done").await?;
    server.stop().await?;
    Ok(())
}
