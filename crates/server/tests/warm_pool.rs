//! Warm pools (`--warm-pool TEMPLATE=N`) on the fake runtime: members are restored and frozen
//! ahead of creates, a create takes one and gives it the request's settings, the pool refills, the
//! reconciler keeps members alive, and a stopping server destroys the ones nobody took.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod support;

use std::collections::HashSet;

use hyper::Method;
use serde_json::json;
use support::fake_runtime::eventually;
use support::Harness;
use warren_runtime::{Runtime, RuntimeState};

fn frozen(h: &Harness) -> HashSet<String> {
    h.runtime
        .list()
        .unwrap()
        .into_iter()
        .filter(|s| s.state == RuntimeState::Frozen)
        .map(|s| s.id)
        .collect()
}

#[tokio::test]
async fn a_create_takes_a_pooled_sandbox_and_the_pool_refills() {
    let h = Harness::start(true, |config| {
        config.warm_pools = vec![("wt-pooled".to_string(), 2)];
    })
    .await;
    let lifecycle = h.server.server.lifecycle.clone();
    support::running_state_template(&h, "wt-pooled").await;
    lifecycle.refill_pools();
    assert!(eventually(|| lifecycle.pooled_ids().len() == 2).await);
    let members = lifecycle.pooled_ids();
    assert_eq!(frozen(&h), members, "members wait frozen");
    for id in &members {
        assert!(lifecycle.store().get_sandbox(id).await.unwrap().is_none());
    }
    let metrics = h.api(Method::GET, "/metrics", None).await;
    let text = String::from_utf8_lossy(&metrics.body).to_string();
    assert!(
        text.contains("warren_warm_pool_sandboxes{template=\"wt-pooled\"} 2"),
        "{text}"
    );
    assert!(text.contains("warren_warm_pool_memory_bytes{template=\"wt-pooled\"} 134217728"));

    let restores_before = h.runtime.recorded.lock().unwrap().restored.len();
    let created = h
        .create(json!({
            "templateID": "wt-pooled",
            "timeout": 123,
            "secure": true,
            "metadata": {"who": "pool-test"},
            "envVars": {"GREETING": "hi"},
            "allow_internet_access": false,
        }))
        .await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    assert!(members.contains(&id), "{id} is one of {members:?}");
    // Thawed, initialised with what the create asked, its network set to the request's.
    assert!(!frozen(&h).contains(&id));
    let inits = h.runtime.inits_of(&id);
    let (body, _) = inits.last().expect("the agent was initialised");
    assert_eq!(body["envVars"]["GREETING"], "hi");
    assert!(body["accessToken"].is_string(), "{body}");
    let network = h.runtime.egress.lock().unwrap().get(&id).cloned();
    assert_eq!(network.map(|n| n.allow_internet), Some(false));
    let record = lifecycle.store().get_sandbox(&id).await.unwrap().unwrap();
    assert_eq!(record.state.as_str(), "running");
    assert_eq!(
        record.metadata.get("who").map(String::as_str),
        Some("pool-test")
    );
    assert!((record.end_at - record.started_at - 123_000).abs() < 5_000);
    assert!(record
        .state_reason
        .unwrap_or_default()
        .contains("warm pool"));
    let detail = h
        .api(Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .json();
    assert_eq!(detail["envdAccessToken"].as_str().map(str::len), Some(48));

    // The pool refills in the background, with a sandbox of a new ID.
    assert!(
        eventually(|| {
            let now = lifecycle.pooled_ids();
            now.len() == 2 && !now.contains(&id)
        })
        .await
    );
    assert_eq!(
        h.runtime.recorded.lock().unwrap().restored.len(),
        restores_before + 1
    );

    // The reconciler renews members' leases and leaves them be.
    let mut suspects = HashSet::new();
    for _ in 0..2 {
        let report = warren_server::lifecycle::reconcile::sweep(&lifecycle, &mut suspects)
            .await
            .unwrap();
        assert!(report.untracked_destroyed.is_empty(), "{report:?}");
    }
    let pooled = lifecycle.pooled_ids();
    let deadlines = h.runtime.deadlines.lock().unwrap().clone();
    for member in &pooled {
        assert!(deadlines.contains_key(member), "{member} has no lease");
    }

    // Creates of other templates do not touch the pool.
    let base = h.create(json!({"templateID": "base"})).await;
    assert!(!pooled.contains(base["sandboxID"].as_str().unwrap()));
    assert_eq!(lifecycle.pooled_ids(), pooled);

    // A stopping server destroys the members nobody took, and only them.
    let runtime = h.runtime.clone();
    h.server.server.shutdown().await.unwrap();
    let destroyed: HashSet<String> = runtime
        .recorded
        .lock()
        .unwrap()
        .destroyed
        .iter()
        .cloned()
        .collect();
    assert!(pooled.is_subset(&destroyed), "{pooled:?} vs {destroyed:?}");
    assert!(!destroyed.contains(&id));
}

#[tokio::test]
async fn a_create_with_volumes_or_another_checkpoint_restores_as_usual() {
    let h = Harness::start(true, |config| {
        config.warm_pools = vec![("wt-pooled".to_string(), 1)];
    })
    .await;
    let lifecycle = h.server.server.lifecycle.clone();
    support::running_state_template(&h, "wt-pooled").await;
    lifecycle.refill_pools();
    assert!(eventually(|| lifecycle.pooled_ids().len() == 1).await);
    let members = lifecycle.pooled_ids();
    let volume = h
        .api(
            Method::POST,
            "/volumes",
            Some(json!({"name": "wt-pool-vol"})),
        )
        .await;
    assert_eq!(volume.status.as_u16(), 201, "{:?}", volume.json());
    let created = h
        .create(json!({
            "templateID": "wt-pooled",
            "volumeMounts": [{"name": "wt-pool-vol", "path": "/data"}],
        }))
        .await;
    let id = created["sandboxID"].as_str().unwrap();
    assert!(!members.contains(id));
    assert_eq!(lifecycle.pooled_ids(), members, "the member waits on");
}
