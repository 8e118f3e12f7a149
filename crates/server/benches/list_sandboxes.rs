//! `GET /sandboxes` with a few thousand rows, on each store back end: a real server (fake runtime,
//! as the API tests use) whose store holds `ROWS` running sandboxes; prints p50/p99 of `REQUESTS`
//! sequential requests per back end. PostgreSQL is the test binary's private cluster
//! (`warren_testkit::postgres`); without it that row says SKIP.
//!
//!     cargo bench -p warren-server --bench list_sandboxes

#![allow(clippy::unwrap_used)] // A panic here is the bench's failure report.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use support::Harness;
use warren_server::lifecycle::state::SandboxState;
use warren_server::store::{DatabaseUrl, SandboxRecord, DEFAULT_TEAM};

const ROWS: usize = 3000;
const REQUESTS: usize = 200;

fn record(i: usize) -> SandboxRecord {
    SandboxRecord {
        id: format!("bench{i:05}"),
        team_id: DEFAULT_TEAM.to_string(),
        template_id: "base".to_string(),
        alias: Some("base".to_string()),
        client_id: "bench".to_string(),
        state: SandboxState::Running,
        state_reason: None,
        metadata: BTreeMap::from([("n".to_string(), i.to_string())]),
        env_vars: BTreeMap::new(),
        vcpus: 1.0,
        memory_mib: 512,
        disk_mib: 1024,
        auto_pause: false,
        auto_pause_memory: true,
        auto_resume: false,
        allow_internet: None,
        envd_access_token: None,
        traffic_access_token: None,
        egress: Default::default(),
        policies: Default::default(),
        ingress: Default::default(),
        volumes: Vec::new(),
        ip: None,
        init_pid: None,
        pause_kind: None,
        snapshot_dir: None,
        started_at: i as i64,
        end_at: i64::MAX / 2,
        updated_at: i as i64,
    }
}

async fn measure(name: &str, database: Option<DatabaseUrl>) {
    let h = Harness::start(false, |config| {
        config.database_url = database;
        // The fake runtime knows none of these rows: no reconciler pass may end them meanwhile.
        config.reconcile_interval = Duration::from_secs(3600);
        config.supervisor_lease = Duration::from_secs(7200);
    })
    .await;
    let store = h.server.server.lifecycle.store();
    for i in 0..ROWS {
        store.insert_sandbox(&record(i)).await.unwrap();
    }
    let mut took = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let started = Instant::now();
        let answer = h.api(Method::GET, "/sandboxes", None).await;
        took.push(started.elapsed());
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.json().as_array().unwrap().len(), ROWS);
    }
    took.sort();
    let at = |q: f64| took[((took.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "GET /sandboxes, {ROWS} rows, {name:>10}: p50 {:>7.2} ms  p99 {:>7.2} ms",
        at(0.5).as_secs_f64() * 1000.0,
        at(0.99).as_secs_f64() * 1000.0
    );
    h.server.stop().await.unwrap();
}

#[tokio::main]
async fn main() {
    measure("sqlite", None).await;
    match warren_testkit::postgres::database().await {
        Some(url) => measure("postgresql", Some(url.parse().unwrap())).await,
        None => println!("GET /sandboxes, {ROWS} rows, postgresql: SKIP (no PostgreSQL binaries)"),
    }
}
