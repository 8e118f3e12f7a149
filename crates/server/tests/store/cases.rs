//! The store's behaviour, written once against [`Store`] and run on every back end (see
//! `tests/store.rs`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use warren_runtime::network::egress::EgressRules;
use warren_server::lifecycle::state::{Operation, SandboxState};
use warren_server::secrets::Sealed;
use warren_server::store::{
    ApiKeyRecord, BuildRecord, BuildSandboxEvent, BuildState, ChecksumStatus, EventQuery,
    IdempotencyClaim, LogLevel, LogQuery, MetricSample, Millis, Policy, SandboxEvent,
    SandboxFilter, SandboxLogLine, SandboxRecord, SandboxVolume, SecretRecord, ServerRenewal,
    SnapshotFilter, SnapshotRecord, Store, StoreError, TeamRecord, TemplateRecord,
    TransitionUpdate, VolumeDeletion, VolumeRecord, WebhookRecord, WorkspaceMove, WorkspaceRecord,
    DEFAULT_TEAM, LAST_USED_RESOLUTION_MS,
};
pub fn sandbox(id: &str, started_at: Millis) -> SandboxRecord {
    SandboxRecord {
        id: id.to_string(),
        team_id: DEFAULT_TEAM.to_string(),
        template_id: "base".to_string(),
        alias: None,
        client_id: "warren".to_string(),
        state: SandboxState::Creating,
        state_reason: None,
        metadata: BTreeMap::from([
            ("k".to_string(), "v w".to_string()),
            ("odd.\"key'".to_string(), "x".to_string()),
        ]),
        env_vars: BTreeMap::new(),
        vcpus: 1.0,
        memory_mib: 256,
        disk_mib: 512,
        auto_pause: false,
        auto_pause_memory: true,
        auto_resume: false,
        allow_internet: None,
        envd_access_token: None,
        traffic_access_token: None,
        egress: EgressRules::default(),
        policies: Default::default(),
        ingress: Default::default(),
        volumes: Vec::new(),
        ip: None,
        init_pid: None,
        pause_kind: None,
        snapshot_dir: None,
        started_at,
        end_at: started_at + 1000,
        updated_at: started_at,
    }
}

pub async fn transitions_are_compare_and_set_and_leave_events(store: &dyn Store) {
    store.insert_sandbox(&sandbox("a", 1)).await.unwrap();
    let update = TransitionUpdate {
        ip: Some(Some(Ipv4Addr::new(10, 77, 0, 2))),
        ..TransitionUpdate::default()
    };
    store
        .transition_sandbox(
            "a",
            SandboxState::Creating,
            SandboxState::Running,
            &update,
            5,
        )
        .await
        .unwrap();
    let stale = store
        .transition_sandbox(
            "a",
            SandboxState::Creating,
            SandboxState::Failed,
            &TransitionUpdate::default(),
            6,
        )
        .await;
    assert!(matches!(
        stale,
        Err(StoreError::StateConflict {
            actual: SandboxState::Running,
            ..
        })
    ));
    let missing = store
        .transition_sandbox(
            "b",
            SandboxState::Creating,
            SandboxState::Running,
            &TransitionUpdate::default(),
            6,
        )
        .await;
    assert!(matches!(missing, Err(StoreError::NotFound { .. })));
    let row = store.get_sandbox("a").await.unwrap().unwrap();
    assert_eq!(row.state, SandboxState::Running);
    assert_eq!(row.ip, Some(Ipv4Addr::new(10, 77, 0, 2)));
    let events = store.sandbox_events("a").await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].from_state, None);
    assert_eq!(events[1].from_state, Some(SandboxState::Creating));
    assert_eq!(events[1].to_state, SandboxState::Running);
}

pub async fn metric_samples_answer_ranges_and_latest_and_are_pruned_by_age(store: &dyn Store) {
    let sample = |id: &str, at: Millis| MetricSample {
        sandbox_id: id.into(),
        at,
        cpu_pct: at as f64 / 1000.0,
        cpu_count: 2,
        mem_used: 1 << 20,
        mem_total: 512 << 20,
        disk_used: 3 << 20,
        disk_total: 2048 << 20,
        pids: 4,
        oom_kills: 0,
        mem_cache: 5 << 20,
        net_rx: at as u64 * 3,
        net_tx: at as u64,
    };
    let samples: Vec<_> = (1..=5)
        .flat_map(|s| [sample("a", s * 1000), sample("b", s * 1000 + 500)])
        .collect();
    store.insert_metric_samples(&samples).await.unwrap();
    let ranged = store.metric_samples("a", 2000, 4000).await.unwrap();
    assert_eq!(
        ranged.iter().map(|s| s.at).collect::<Vec<_>>(),
        [2000, 3000, 4000]
    );
    assert_eq!(
        ranged[0],
        sample("a", 2000),
        "a sample reads back as written"
    );
    let latest = store
        .latest_metric_samples(&["a".into(), "b".into(), "nobody".into()])
        .await
        .unwrap();
    assert_eq!(
        latest
            .iter()
            .map(|s| (s.sandbox_id.as_str(), s.at))
            .collect::<Vec<_>>(),
        [("a", 5000), ("b", 5500)]
    );
    assert_eq!(store.prune_metric_samples(3000).await.unwrap(), 4);
    assert_eq!(store.metric_samples("a", 0, 10_000).await.unwrap().len(), 3);
}

pub async fn old_events_are_pruned_and_their_numbers_never_come_back(store: &dyn Store) {
    store.insert_sandbox(&sandbox("a", 1000)).await.unwrap();
    for at in [2000, 3000] {
        store
            .note_sandbox_event("a", SandboxState::Creating, "note", None, at)
            .await
            .unwrap();
    }
    let seqs = |events: Vec<SandboxEvent>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    let before = seqs(store.sandbox_events("a").await.unwrap());
    let newest = store.latest_event_seq().await.unwrap();
    assert_eq!(before.last(), Some(&newest));
    let all = before.len() as u64;
    assert_eq!(store.prune_sandbox_events(10_000).await.unwrap(), all);
    assert!(store.sandbox_events("a").await.unwrap().is_empty());
    store
        .note_sandbox_event("a", SandboxState::Creating, "later", None, 20_000)
        .await
        .unwrap();
    let after = seqs(store.sandbox_events("a").await.unwrap());
    assert!(
        after[0] > newest,
        "a deleted number was handed out again: {after:?}"
    );
}

pub async fn sandbox_logs_page_both_ways_filter_and_keep_a_bound_per_sandbox(store: &dyn Store) {
    let line = |id: &str, seq: i64, level: LogLevel, message: &str| SandboxLogLine {
        sandbox_id: id.into(),
        seq,
        at: seq * 1000,
        level,
        message: message.into(),
        fields: BTreeMap::from([("pid".to_string(), "7".to_string())]),
    };
    let lines = vec![
        line("a", 1, LogLevel::Info, "process 7 started"),
        line("a", 2, LogLevel::Info, "hello 50%_done"),
        line("a", 3, LogLevel::Warn, "careful"),
        line("a", 4, LogLevel::Error, "process 7 ended: exit status 1"),
        line("b", 1, LogLevel::Info, "other sandbox"),
    ];
    store.insert_sandbox_logs(&lines, 100).await.unwrap();
    // Stored again (a collection that overlapped another): nothing doubles.
    store.insert_sandbox_logs(&lines[..2], 100).await.unwrap();
    let query = |cursor, forward, min_level, search: Option<&str>| LogQuery {
        cursor,
        forward,
        limit: 2,
        min_level,
        search: search.map(str::to_string),
    };
    let seqs = |found: Vec<SandboxLogLine>| found.iter().map(|l| l.seq).collect::<Vec<_>>();
    let all = query(None, true, LogLevel::Debug, None);
    let first = store.sandbox_logs("a", &all).await.unwrap();
    assert_eq!(first[0], lines[0], "a line reads back as written");
    assert_eq!(seqs(first), [1, 2]);
    let next = query(Some(3000), true, LogLevel::Debug, None);
    assert_eq!(seqs(store.sandbox_logs("a", &next).await.unwrap()), [3, 4]);
    let back = query(Some(3000), false, LogLevel::Debug, None);
    assert_eq!(seqs(store.sandbox_logs("a", &back).await.unwrap()), [3, 2]);
    let warn = query(None, true, LogLevel::Warn, None);
    assert_eq!(seqs(store.sandbox_logs("a", &warn).await.unwrap()), [3, 4]);
    // `%` and `_` are matched as themselves, and case does not matter.
    let found = query(None, true, LogLevel::Debug, Some("50%_D"));
    assert_eq!(seqs(store.sandbox_logs("a", &found).await.unwrap()), [2]);
    let none = query(None, true, LogLevel::Debug, Some("5_%"));
    assert!(store.sandbox_logs("a", &none).await.unwrap().is_empty());
    assert_eq!(store.last_sandbox_log_seq("a").await.unwrap(), Some(4));
    assert_eq!(store.last_sandbox_log_seq("nobody").await.unwrap(), None);

    // Over the bound, a sandbox's oldest lines go; another sandbox's are not touched.
    store
        .insert_sandbox_logs(&[line("a", 5, LogLevel::Info, "five")], 3)
        .await
        .unwrap();
    let ten = LogQuery { limit: 10, ..all };
    let kept = store.sandbox_logs("a", &ten).await.unwrap();
    assert_eq!(seqs(kept), [3, 4, 5]);
    assert_eq!(store.prune_sandbox_logs(4000).await.unwrap(), 2);
    assert!(store.sandbox_logs("b", &ten).await.unwrap().is_empty());
}

pub async fn a_sandboxs_own_policies_survive_the_store(store: &dyn Store) {
    let mut record = sandbox("p", 1);
    record.policies.runaway = Some(warren_proto::api::RunawayPolicyOverride {
        cpu_percent: Some(50.0),
        seconds: None,
        kill: Some(true),
    });
    store.insert_sandbox(&record).await.unwrap();
    store.insert_sandbox(&sandbox("q", 2)).await.unwrap();
    assert_eq!(
        store.get_sandbox("p").await.unwrap().unwrap().policies,
        record.policies
    );
    assert_eq!(
        store.get_sandbox("q").await.unwrap().unwrap().policies,
        Default::default()
    );
}

pub async fn lists_filter_by_metadata_and_page(store: &dyn Store) {
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        store
            .insert_sandbox(&sandbox(id, i as Millis))
            .await
            .unwrap();
    }
    let filter = SandboxFilter {
        metadata: BTreeMap::from([
            ("k".to_string(), "v w".to_string()),
            ("odd.\"key'".to_string(), "x".to_string()),
        ]),
        limit: Some(2),
        ..SandboxFilter::default()
    };
    let first: Vec<String> = store
        .list_sandboxes(&filter)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(first, ["a", "b"]);
    let next = SandboxFilter {
        after: Some((1, "b".to_string())),
        ..filter.clone()
    };
    let rest: Vec<String> = store
        .list_sandboxes(&next)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(rest, ["c"]);
    let none = SandboxFilter {
        metadata: BTreeMap::from([("k".to_string(), "other".to_string())]),
        ..SandboxFilter::default()
    };
    assert!(store.list_sandboxes(&none).await.unwrap().is_empty());
}

pub async fn teams_scope_keys_and_sandbox_lists(store: &dyn Store) {
    // The migration made the default team.
    let default = store
        .get_team("default")
        .await
        .unwrap()
        .expect("default team");
    assert_eq!(default.id, DEFAULT_TEAM);
    let team = TeamRecord {
        id: "team_b".to_string(),
        name: "b".to_string(),
        max_sandboxes: Some(2),
        max_vcpus: Some(1.5),
        max_memory_mib: None,
        created_at: 5,
    };
    store.insert_team(&team).await.unwrap();
    assert_eq!(store.get_team("b").await.unwrap(), Some(team.clone()));
    assert_eq!(store.get_team("team_b").await.unwrap(), Some(team.clone()));
    assert!(store.insert_team(&team).await.is_err(), "duplicate team");
    assert_eq!(store.list_teams().await.unwrap().len(), 2);
    let mut mine = sandbox("sbx-a", 1);
    mine.team_id = "team_b".to_string();
    store.insert_sandbox(&mine).await.unwrap();
    store.insert_sandbox(&sandbox("sbx-d", 2)).await.unwrap();
    let only_b = store
        .list_sandboxes(&SandboxFilter {
            team_id: Some("team_b".to_string()),
            ..SandboxFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(only_b.len(), 1);
    assert_eq!(only_b[0].id, "sbx-a");
    assert_eq!(only_b[0].team_id, "team_b");
    let all = store
        .list_sandboxes(&SandboxFilter::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 2);
}

pub async fn keys_are_found_by_hash_until_revoked(store: &dyn Store) {
    let key = ApiKeyRecord {
        id: "key_1".to_string(),
        name: "ci".to_string(),
        prefix: "e2b_abc".to_string(),
        secret_hash: "hash".to_string(),
        created_at: 1,
        last_used_at: None,
        revoked_at: None,
        team_id: DEFAULT_TEAM.to_string(),
        admin: false,
    };
    store.insert_api_key(&key).await.unwrap();
    let used = store.use_api_key("hash", 7).await.unwrap().unwrap();
    assert_eq!(used.last_used_at, Some(7));
    let soon = store.use_api_key("hash", 8).await.unwrap().unwrap();
    assert_eq!(soon.last_used_at, Some(7), "not rewritten within a minute");
    let later = store
        .use_api_key("hash", 7 + LAST_USED_RESOLUTION_MS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(later.last_used_at, Some(7 + LAST_USED_RESOLUTION_MS));
    assert_eq!(store.revoke_api_key("ci", 8).await.unwrap(), 1);
    assert_eq!(store.use_api_key("hash", 9).await.unwrap(), None);
    assert_eq!(store.revoke_api_key("ci", 10).await.unwrap(), 0);
    assert_eq!(store.list_api_keys().await.unwrap()[0].revoked_at, Some(8));
}

pub async fn templates_are_found_by_alias(store: &dyn Store) {
    let template = TemplateRecord {
        id: "tpl1".to_string(),
        aliases: vec!["python".to_string()],
        layers: vec![PathBuf::from("/layers/a"), PathBuf::from("/rootfs")],
        build_id: "b".to_string(),
        status: "ready".to_string(),
        vcpus: 1.0,
        memory_mib: 1,
        disk_mib: 1,
        envd_version: "0".to_string(),
        public: false,
        team_id: DEFAULT_TEAM.to_string(),
        spawn_count: 0,
        last_spawned_at: None,
        created_at: 1,
        updated_at: 1,
        policies: Default::default(),
    };
    store.upsert_template(&template).await.unwrap();
    assert_eq!(
        store.get_template("python").await.unwrap(),
        Some(template.clone())
    );
    assert_eq!(
        store.get_template("tpl1").await.unwrap(),
        Some(template.clone())
    );
    assert_eq!(store.get_template("nope").await.unwrap(), None);

    // Settings change what is given; a rebuild (an upsert) keeps the policies.
    let policies = warren_proto::api::SandboxPolicies {
        idle_timeout_secs: Some(30),
        ..Default::default()
    };
    let set = store.update_template_settings("tpl1", None, Some(&policies), 5);
    assert!(set.await.unwrap());
    let public = store.update_template_settings("tpl1", Some(true), None, 6);
    assert!(public.await.unwrap());
    let missing = store.update_template_settings("nope", Some(true), None, 6);
    assert!(!missing.await.unwrap());
    store
        .upsert_template(&TemplateRecord {
            build_id: "b2".to_string(),
            ..template
        })
        .await
        .unwrap();
    let now = store.get_template("tpl1").await.unwrap().unwrap();
    assert_eq!((now.policies, now.build_id.as_str()), (policies, "b2"));
}

fn volume(id: &str, team: &str, name: &str) -> VolumeRecord {
    VolumeRecord {
        id: id.to_string(),
        team_id: team.to_string(),
        name: name.to_string(),
        token: format!("token-{id}"),
        size_mib: 64,
        created_at: 7,
    }
}

pub async fn volume_names_are_unique_per_team_and_rows_round_trip(store: &dyn Store) {
    let first = volume("v1", DEFAULT_TEAM, "data");
    store.insert_volume(&first).await.unwrap();
    let duplicate = store
        .insert_volume(&volume("v2", DEFAULT_TEAM, "data"))
        .await;
    assert!(
        matches!(duplicate, Err(StoreError::Duplicate { ref name, .. }) if name == "data"),
        "{duplicate:?}"
    );
    // Another team may use the same name.
    store
        .insert_volume(&volume("v3", "other", "data"))
        .await
        .unwrap();
    assert_eq!(store.get_volume("v1").await.unwrap(), Some(first.clone()));
    assert_eq!(
        store
            .get_volume_by_name(DEFAULT_TEAM, "data")
            .await
            .unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        store.get_volume_by_name("nobody", "data").await.unwrap(),
        None
    );
    let listed = store.list_volumes(DEFAULT_TEAM).await.unwrap();
    assert_eq!(listed, vec![first]);
    assert_eq!(store.list_volumes("other").await.unwrap().len(), 1);
}

pub async fn a_volume_a_live_sandbox_mounts_is_not_deleted(store: &dyn Store) {
    store
        .insert_volume(&volume("v1", DEFAULT_TEAM, "data"))
        .await
        .unwrap();
    let mut user = sandbox("sb1", 1);
    user.volumes = vec![SandboxVolume {
        volume_id: "v1".to_string(),
        name: "data".to_string(),
        path: "/mnt/data".to_string(),
    }];
    store.insert_sandbox(&user).await.unwrap();
    assert_eq!(
        store.get_sandbox("sb1").await.unwrap().unwrap().volumes,
        user.volumes
    );
    assert_eq!(
        store.delete_volume("v1").await.unwrap(),
        VolumeDeletion::InUse(vec!["sb1".to_string()])
    );
    assert!(store.get_volume("v1").await.unwrap().is_some());
    store
        .transition_sandbox(
            "sb1",
            SandboxState::Creating,
            SandboxState::Killed,
            &TransitionUpdate::default(),
            5,
        )
        .await
        .unwrap();
    assert_eq!(
        store.delete_volume("v1").await.unwrap(),
        VolumeDeletion::Deleted
    );
    assert_eq!(
        store.delete_volume("v1").await.unwrap(),
        VolumeDeletion::NotFound
    );
    assert!(store.get_volume("v1").await.unwrap().is_none());
}

fn build(id: &str, status: BuildState) -> BuildRecord {
    BuildRecord {
        build_id: id.into(),
        template_id: "t1".into(),
        status,
        reason: None,
        created_at: 1,
        updated_at: 1,
    }
}

pub async fn builds_keep_their_state_and_a_restart_fails_unfinished_ones(store: &dyn Store) {
    store
        .upsert_build(&build("b1", BuildState::Waiting))
        .await
        .unwrap();
    store
        .upsert_build(&build("b2", BuildState::Ready))
        .await
        .unwrap();
    // Finished is final for a late `building`.
    store
        .upsert_build(&build("b2", BuildState::Building))
        .await
        .unwrap();
    let b2 = store.get_build("t1", "b2").await.unwrap().unwrap();
    assert_eq!(b2.status, BuildState::Ready);
    store
        .upsert_build(&build("b3", BuildState::Building))
        .await
        .unwrap();

    assert_eq!(
        store
            .fail_unfinished_builds(&[], "restarted", 5)
            .await
            .unwrap(),
        2
    );
    for id in ["b1", "b3"] {
        let b = store.get_build("t1", id).await.unwrap().unwrap();
        assert_eq!(b.status, BuildState::Error, "{id}");
        assert_eq!(b.reason.as_deref(), Some("restarted"));
        assert_eq!((b.created_at, b.updated_at), (1, 5));
    }
    assert_eq!(
        store.get_build("t1", "b2").await.unwrap().unwrap().status,
        BuildState::Ready
    );
    assert_eq!(store.get_build("t2", "b1").await.unwrap(), None);
    assert_eq!(
        store.fail_unfinished_builds(&[], "again", 6).await.unwrap(),
        0
    );
}

pub async fn tags_move_and_go_with_their_template(store: &dyn Store) {
    let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    store
        .assign_template_tags("t1", "b1", &tags(&["v1", "stable"]), 1)
        .await
        .unwrap();
    store
        .assign_template_tags("t1", "b2", &tags(&["stable"]), 2)
        .await
        .unwrap();
    let listed: Vec<(String, String)> = store
        .list_template_tags("t1")
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.tag, t.build_id))
        .collect();
    assert_eq!(
        listed,
        vec![("stable".into(), "b2".into()), ("v1".into(), "b1".into())]
    );
    assert_eq!(
        store
            .remove_template_tags("t1", &tags(&["v1", "nope"]))
            .await
            .unwrap(),
        1
    );
    store.delete_template("t1").await.unwrap();
    assert!(store.list_template_tags("t1").await.unwrap().is_empty());
}

/// Many connections move the same sandbox at once: exactly one wins, the others see the state it
/// moved to, and only the winner's event is stored.
pub async fn racing_transitions_let_exactly_one_win(store: &dyn Store) {
    store.insert_sandbox(&sandbox("race", 1)).await.unwrap();
    let update = TransitionUpdate::default();
    let update = &update;
    let attempts = (0..8).map(|i| {
        store.transition_sandbox(
            "race",
            SandboxState::Creating,
            if i % 2 == 0 {
                SandboxState::Running
            } else {
                SandboxState::Failed
            },
            update,
            10 + i,
        )
    });
    let results = futures_util::future::join_all(attempts).await;
    let won: Vec<usize> = (0..results.len()).filter(|&i| results[i].is_ok()).collect();
    assert_eq!(won.len(), 1, "{results:?}");
    let winner = store.get_sandbox("race").await.unwrap().unwrap().state;
    for result in &results {
        match result {
            Ok(()) => {}
            Err(StoreError::StateConflict {
                expected, actual, ..
            }) => {
                assert_eq!(*expected, SandboxState::Creating);
                assert_eq!(*actual, winner);
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let events = store.sandbox_events("race").await.unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1].to_state, winner);
}

/// Concurrent creates with one idempotency key: one claims it, every other finds the claim.
pub async fn racing_idempotency_claims_give_the_key_once(store: &dyn Store) {
    let hashes: Vec<String> = (0..8).map(|i| format!("hash{}", i % 2)).collect();
    let claims = hashes
        .iter()
        .map(|hash| store.claim_idempotency_key(DEFAULT_TEAM, "k1", hash, 100, 0));
    let results = futures_util::future::join_all(claims).await;
    let claimed = results
        .iter()
        .filter(|r| matches!(r, Ok(IdempotencyClaim::Claimed)))
        .count();
    assert_eq!(claimed, 1, "{results:?}");
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    store
        .finish_idempotency_key(DEFAULT_TEAM, "k1", "sbx-1")
        .await
        .unwrap();
    let held = store
        .claim_idempotency_key(DEFAULT_TEAM, "k1", "other", 101, 0)
        .await
        .unwrap();
    assert!(matches!(
        held,
        IdempotencyClaim::Held { sandbox_id: Some(ref id), .. } if id == "sbx-1"
    ));
    // A finished claim is not released; an expired one goes.
    store
        .release_idempotency_key(DEFAULT_TEAM, "k1")
        .await
        .unwrap();
    let expired = store
        .claim_idempotency_key(DEFAULT_TEAM, "k1", "new", 200, 150)
        .await
        .unwrap();
    assert_eq!(expired, IdempotencyClaim::Claimed);
}

pub async fn lifecycle_events_name_what_e2b_reports(store: &dyn Store) {
    use SandboxState::*;
    store.insert_sandbox(&sandbox("l1", 1)).await.unwrap();
    let steps = [
        (Creating, Running),
        (Running, Pausing),
        (Pausing, Paused),
        (Paused, Resuming),
        (Resuming, Running),
        (Running, Killed),
    ];
    for (at, (from, to)) in steps.into_iter().enumerate() {
        let update = TransitionUpdate {
            took: (from.finishes(to).is_some()).then_some(7),
            ..TransitionUpdate::default()
        };
        store
            .transition_sandbox("l1", from, to, &update, 10 + at as Millis)
            .await
            .unwrap();
    }
    store
        .note_sandbox_event("l1", Killed, "reaped", Some(Policy::Orphans), 30)
        .await
        .unwrap();
    store
        .note_build_sandbox_event(&BuildSandboxEvent {
            sandbox_id: "build-1".into(),
            team_id: DEFAULT_TEAM.into(),
            template_id: "tpl".into(),
            build_id: "b1".into(),
            from_state: Some(Creating),
            to_state: Running,
            reason: "build".into(),
            at: 40,
        })
        .await
        .unwrap();
    let query = EventQuery {
        team_id: DEFAULT_TEAM.into(),
        limit: 100,
        ascending: true,
        ..EventQuery::default()
    };
    let events = store.lifecycle_events(&query).await.unwrap();
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.event.sandbox_id.as_str(), e.kind.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("l1", "sandbox.lifecycle.created"),
            ("l1", "sandbox.lifecycle.paused"),
            ("l1", "sandbox.lifecycle.resumed"),
            ("l1", "sandbox.lifecycle.killed"),
            ("l1", "sandbox.lifecycle.updated"),
            ("build-1", "sandbox.lifecycle.created"),
        ]
    );
    assert_eq!(events[5].build_id.as_deref(), Some("b1"));
    assert_eq!(events[0].template_id, "base");
    let only_killed = EventQuery {
        types: vec!["sandbox.lifecycle.killed".into()],
        ascending: false,
        ..query.clone()
    };
    let killed = store.lifecycle_events(&only_killed).await.unwrap();
    assert_eq!(killed.len(), 1);
    let after = EventQuery {
        after_seq: Some(events[3].event.seq),
        ..query.clone()
    };
    assert_eq!(store.lifecycle_events(&after).await.unwrap().len(), 2);
    let other_team = EventQuery {
        team_id: "team_other".into(),
        ..query
    };
    assert!(store
        .lifecycle_events(&other_team)
        .await
        .unwrap()
        .is_empty());

    let policies = store.policy_events(DEFAULT_TEAM, 10).await.unwrap();
    assert_eq!(policies.len(), 1);
    assert_eq!(policies[0].policy, Policy::Orphans);
    assert_eq!(policies[0].template_id.as_deref(), Some("base"));
    let timings = store.operation_timings(DEFAULT_TEAM, 0, 10).await.unwrap();
    let ops: Vec<Operation> = timings.iter().map(|t| t.operation).collect();
    assert_eq!(
        ops,
        [Operation::Resume, Operation::Pause, Operation::Create]
    );
    assert!(timings.iter().all(|t| t.took == 7));
}

fn snapshot(id: &str, name: Option<&str>, created_at: Millis) -> SnapshotRecord {
    SnapshotRecord {
        id: id.into(),
        team_id: DEFAULT_TEAM.into(),
        name: name.map(str::to_string),
        sandbox_id: "sbx".into(),
        template_id: "base".into(),
        layers: vec![PathBuf::from("/layers/a"), PathBuf::from("/rootfs")],
        dir: PathBuf::from(format!("/snapshots/{id}")),
        size_bytes: 1 << 33,
        checksum_status: ChecksumStatus::Sha256,
        vcpus: 0.5,
        memory_mib: 512,
        disk_mib: 1024,
        envd_access_token: Some("tok".into()),
        created_at,
    }
}

pub async fn snapshots_page_newest_first_and_names_find_the_newest(store: &dyn Store) {
    for (id, at) in [("s1", 1), ("s2", 2), ("s3", 2), ("s4", 4)] {
        store
            .insert_snapshot(&snapshot(id, Some("nightly"), at))
            .await
            .unwrap();
    }
    assert_eq!(
        store.get_snapshot("s2").await.unwrap(),
        Some(snapshot("s2", Some("nightly"), 2))
    );
    assert_eq!(
        store.get_snapshot("nightly").await.unwrap().unwrap().id,
        "s4"
    );
    let page = |after: Option<(Millis, String)>| SnapshotFilter {
        name: Some("nightly".into()),
        after,
        limit: Some(2),
        ..SnapshotFilter::default()
    };
    let ids = |found: Vec<SnapshotRecord>| found.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list_snapshots(&page(None)).await.unwrap()),
        ["s4", "s3"]
    );
    assert_eq!(
        ids(store
            .list_snapshots(&page(Some((2, "s3".into()))))
            .await
            .unwrap()),
        ["s2", "s1"]
    );
    store
        .set_snapshot_checksum_status("s1", ChecksumStatus::Mismatch)
        .await
        .unwrap();
    assert_eq!(
        store
            .get_snapshot("s1")
            .await
            .unwrap()
            .unwrap()
            .checksum_status,
        ChecksumStatus::Mismatch
    );
    assert!(store.delete_snapshot("s1").await.unwrap());
    assert!(!store.delete_snapshot("s1").await.unwrap());
}

pub async fn webhooks_round_trip_and_deliveries_only_move_forward(store: &dyn Store) {
    let hook = WebhookRecord {
        id: "wh1".into(),
        team_id: DEFAULT_TEAM.into(),
        name: "ops".into(),
        url: "http://127.0.0.1:9/hook".into(),
        enabled: true,
        events: vec!["sandbox.lifecycle.created".into()],
        secret: Some("s".into()),
        delivered_seq: 0,
        created_at: 5,
    };
    store.upsert_webhook(&hook).await.unwrap();
    store.set_webhook_delivered("wh1", 9).await.unwrap();
    store.set_webhook_delivered("wh1", 4).await.unwrap();
    let updated = WebhookRecord {
        enabled: false,
        name: "ops2".into(),
        ..hook.clone()
    };
    store.upsert_webhook(&updated).await.unwrap();
    let listed = store.list_webhooks().await.unwrap();
    assert_eq!(
        listed,
        vec![WebhookRecord {
            delivered_seq: 9,
            ..updated
        }]
    );
    assert!(store.delete_webhook("wh1").await.unwrap());
    assert!(store.list_webhooks().await.unwrap().is_empty());
    assert_eq!(store.latest_event_seq().await.unwrap(), 0);
}

pub async fn workspaces_keep_the_current_sandbox_and_every_move(store: &dyn Store) {
    let mut workspace = WorkspaceRecord {
        team_id: DEFAULT_TEAM.into(),
        user_id: "alice".into(),
        template: "base".into(),
        sandbox_id: Some("sbx-1".into()),
        created_at: 1,
        updated_at: 1,
    };
    let first = WorkspaceMove {
        sandbox_id: "sbx-1".into(),
        action: "created".into(),
        reason: None,
        at: 1,
    };
    store
        .record_workspace_move(&workspace, &first)
        .await
        .unwrap();
    workspace.sandbox_id = Some("sbx-2".into());
    workspace.updated_at = 2;
    let second = WorkspaceMove {
        sandbox_id: "sbx-2".into(),
        action: "replaced".into(),
        reason: Some("sbx-1 failed".into()),
        at: 2,
    };
    store
        .record_workspace_move(&workspace, &second)
        .await
        .unwrap();
    assert_eq!(
        store.get_workspace(DEFAULT_TEAM, "alice").await.unwrap(),
        Some(workspace)
    );
    assert_eq!(
        store
            .workspace_history(DEFAULT_TEAM, "alice")
            .await
            .unwrap(),
        vec![first, second]
    );
    assert_eq!(
        store.get_workspace(DEFAULT_TEAM, "bob").await.unwrap(),
        None
    );
}

pub async fn secrets_are_unique_per_team_and_updated_by_version(store: &dyn Store) {
    let record = SecretRecord {
        id: "sec_1".into(),
        team_id: "team_a".into(),
        name: "db-password".into(),
        version: 1,
        sealed: Sealed {
            nonce: vec![0, 1, 2, 255],
            ciphertext: vec![9; 40],
        },
        metadata: BTreeMap::from([("owner".to_string(), "ops".to_string())]),
        created_at: 10,
        updated_at: 10,
    };
    assert!(store.insert_secret(&record).await.unwrap());
    let same_name = SecretRecord {
        id: "sec_2".into(),
        ..record.clone()
    };
    assert!(!store.insert_secret(&same_name).await.unwrap());
    assert_eq!(
        store.get_secret("team_a", "DB-Password").await.unwrap(),
        Some(record.clone())
    );
    assert_eq!(
        store.get_secret("team_a", "sec_1").await.unwrap(),
        Some(record.clone())
    );
    assert!(store.get_secret("team_b", "sec_1").await.unwrap().is_none());
    let next = SecretRecord {
        version: 2,
        updated_at: 11,
        ..record.clone()
    };
    assert!(store.update_secret(&next, 1).await.unwrap());
    assert!(!store.update_secret(&next, 1).await.unwrap());
    let other = SecretRecord {
        id: "sec_3".into(),
        name: "token".into(),
        ..record.clone()
    };
    assert!(store.insert_secret(&other).await.unwrap());
    let listed = store.list_secrets("team_a", None, 10).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|s| (s.id.as_str(), s.version))
            .collect::<Vec<_>>(),
        [("sec_1", 2), ("sec_3", 1)]
    );
    let rest = store
        .list_secrets("team_a", Some((10, "sec_1".into())), 10)
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert!(!store.delete_secret("team_b", "sec_1").await.unwrap());
    assert!(store.delete_secret("team_a", "sec_1").await.unwrap());
}

/// A few thousand rows: listing pages through all of them in order, both ways.
pub async fn long_lists_page_in_order_both_ways(store: &dyn Store) {
    const ROWS: usize = 300;
    for i in 0..ROWS {
        // Ties on started_at are ordered by id.
        let mut record = sandbox(&format!("sbx-{i:04}"), (i / 3) as Millis);
        record.team_id = if i % 2 == 0 { DEFAULT_TEAM } else { "team_b" }.into();
        store.insert_sandbox(&record).await.unwrap();
    }
    for descending in [false, true] {
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = store
                .list_sandboxes(&SandboxFilter {
                    team_id: Some(DEFAULT_TEAM.into()),
                    descending,
                    after: after.clone(),
                    limit: Some(17),
                    ..SandboxFilter::default()
                })
                .await
                .unwrap();
            let Some(last) = page.last() else { break };
            after = Some((last.started_at, last.id.clone()));
            seen.extend(page.into_iter().map(|s| s.id));
        }
        let mut expected: Vec<String> = (0..ROWS)
            .filter(|i| i % 2 == 0)
            .map(|i| format!("sbx-{i:04}"))
            .collect();
        if descending {
            expected.reverse();
        }
        assert_eq!(seen, expected, "descending: {descending}");
    }
    let running = store
        .list_sandboxes(&SandboxFilter {
            states: vec![SandboxState::Running, SandboxState::Paused],
            ..SandboxFilter::default()
        })
        .await
        .unwrap();
    assert!(running.is_empty());
    let creating = store
        .list_sandboxes(&SandboxFilter {
            states: vec![SandboxState::Creating],
            template: Some("base".into()),
            started_after: Some(90),
            ..SandboxFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(creating.len(), ROWS - 270);
}

/// Two servers on one database (`a`, `b`): each one's row lives while renewed, every sandbox row and
/// build remembers which server last wrote it, and what a server not among the live ones left mid
/// transition or unfinished is found by that.
pub async fn servers_share_a_store_by_lease_and_owner(a: &dyn Store, b: &dyn Store) {
    assert_ne!(a.server_id(), b.server_id());
    let (ida, idb) = (a.server_id().to_string(), b.server_id().to_string());
    let (none, building, pool) = (
        Vec::new(),
        vec!["bld-x".to_string()],
        vec!["pool-1".to_string()],
    );
    for (store, address, holds, leading, now) in [
        (a, "127.0.0.1:1", &none, false, 1_000),
        (b, "127.0.0.1:2", &building, false, 1_000),
        (a, "127.0.0.1:1", &pool, true, 5_000),
    ] {
        let renewal = ServerRenewal {
            address,
            holds,
            leading,
            now,
        };
        store.renew_server(&renewal).await.unwrap();
    }
    let live = a.live_servers(2_000).await.unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(
        (live[0].id.as_str(), live[0].started_at, live[0].renewed_at),
        (ida.as_str(), 1_000, 5_000)
    );
    assert_eq!(live[0].holds, ["pool-1"]);
    assert!(live[0].leading);
    let all = b.live_servers(0).await.unwrap();
    assert_eq!(all.len(), 2);
    let row_b = all.iter().find(|s| s.id == idb).unwrap();
    assert_eq!(
        (row_b.address.as_str(), &row_b.holds[..]),
        ("127.0.0.1:2", &["bld-x".to_string()][..])
    );

    // Sandbox rows: the writer of the last change owns the row.
    a.insert_sandbox(&sandbox("sa", 1)).await.unwrap();
    b.insert_sandbox(&sandbox("sb", 2)).await.unwrap();
    let ids = |rows: Vec<SandboxRecord>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let both = [ida.clone(), idb.clone()];
    assert!(ids(a.orphaned_transitions(&both).await.unwrap()).is_empty());
    assert_eq!(
        ids(a
            .orphaned_transitions(std::slice::from_ref(&ida))
            .await
            .unwrap()),
        ["sb"]
    );
    assert_eq!(
        ids(a.orphaned_transitions(&[]).await.unwrap()),
        ["sa", "sb"]
    );
    a.transition_sandbox(
        "sb",
        SandboxState::Creating,
        SandboxState::Running,
        &TransitionUpdate::default(),
        3,
    )
    .await
    .unwrap();
    b.transition_sandbox(
        "sb",
        SandboxState::Running,
        SandboxState::Pausing,
        &TransitionUpdate::default(),
        4,
    )
    .await
    .unwrap();
    // sa is a's (creating), sb b's (pausing).
    assert_eq!(ids(a.own_transitions().await.unwrap()), ["sa"]);
    assert_eq!(ids(b.own_transitions().await.unwrap()), ["sb"]);
    assert_eq!(
        ids(b
            .orphaned_transitions(std::slice::from_ref(&idb))
            .await
            .unwrap()),
        ["sa"]
    );
    assert_eq!(
        ids(b
            .orphaned_transitions(std::slice::from_ref(&ida))
            .await
            .unwrap()),
        ["sb"]
    );

    // Builds: only the dead server's unfinished ones fail.
    a.upsert_build(&build("ba", BuildState::Building))
        .await
        .unwrap();
    b.upsert_build(&build("bb", BuildState::Building))
        .await
        .unwrap();
    assert_eq!(
        a.fail_unfinished_builds(std::slice::from_ref(&ida), "its server died", 7)
            .await
            .unwrap(),
        1
    );
    let status = |id: &'static str| async move { a.get_build("t1", id).await.unwrap().unwrap() };
    assert_eq!(status("ba").await.status, BuildState::Building);
    let bb = status("bb").await;
    assert_eq!(
        (bb.status, bb.reason.as_deref()),
        (BuildState::Error, Some("its server died"))
    );

    // A clean stop removes its own row; the dead are forgotten after a while.
    assert_eq!(a.forget_servers(true, 0).await.unwrap(), 1);
    let left = b.live_servers(0).await.unwrap();
    assert_eq!(
        left.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [idb.as_str()]
    );
    assert_eq!(b.forget_servers(false, 500).await.unwrap(), 0);
    assert_eq!(b.forget_servers(false, 2_000).await.unwrap(), 1);
    assert!(b.live_servers(0).await.unwrap().is_empty());
}
