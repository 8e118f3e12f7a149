//! The judge of `warren lab check N`: decides from Warren's API, and from what the lab app reports
//! of the inside of the sandbox, whether a level is solved. The app's report and every file read
//! from a sandbox were written by the player's sandbox: they are compared, never followed or run.

use std::collections::BTreeSet;

use chrono::Utc;
use serde_json::Value;
use sha2::{Digest, Sha256};
use warren_client::types::{NewSandbox, SandboxState, WorkspaceSandboxRequest};
use warren_client::{ApiClient, EnvdClient, ErrorKind, ListQuery, SandboxPortClient};

use super::record::{hex, LabRecord};
use super::{APP_PORT, LAB_LABEL};
use crate::commands::CommandError;

pub const LEVELS: u32 = 12;
/// What the template's canary file holds (level 10).
pub const CANARY_TEXT: &str = "pristine\n";
const CANARY_PATH: &str = "/opt/warren-lab/template-canary.txt";
/// Level 5: "long" and "short" timeouts, in seconds from the check.
const LONG_TIMEOUT_SECS: i64 = 7000;
const SHORT_TIMEOUT_SECS: i64 = 900;
/// Level 8: forks to collect.
const FORKS: usize = 5;
/// Level 11: the only host the token may reach.
pub const ALLOWED_API: &str = "api.lab.test";
/// Level 12: sandboxes the crashed worker leaves.
const LEAKED: usize = 2;

const TITLES: [&str; LEVELS as usize] = [
    "Where am I?",
    "Runaway",
    "Memory hog",
    "Full disk",
    "Lifecycle",
    "Pause and resume",
    "Orphans",
    "Fork",
    "Workspaces",
    "Layers",
    "Secrets and egress",
    "Lost sandboxes",
];

pub fn title(n: u32) -> &'static str {
    TITLES.get(n as usize - 1).copied().unwrap_or("")
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Solved,
    /// The server lacks what the level needs: the level is passed over, saying why.
    Skipped(String),
    NotYet(String),
}

impl Verdict {
    pub fn parts(&self) -> (&'static str, String) {
        match self {
            Verdict::Solved => ("solved", "the flag is on the level's page".to_string()),
            Verdict::Skipped(why) => ("skipped", why.clone()),
            Verdict::NotYet(why) => ("not yet", why.clone()),
        }
    }
}

fn not_yet(why: impl Into<String>) -> Result<Verdict, CommandError> {
    Ok(Verdict::NotYet(why.into()))
}

pub fn sha256_hex(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

/// Level 9's users: per lab, so two labs of one team do not share them.
pub fn workspace_users(lab: &LabRecord) -> Vec<String> {
    ["alice", "bob", "carol"]
        .iter()
        .map(|name| format!("{}-{name}", lab.lab_id))
        .collect()
}

pub struct Judge<'a> {
    pub client: &'a ApiClient,
    pub app: &'a SandboxPortClient,
    pub sandbox_url: &'a str,
    pub answer: Option<&'a str>,
}

impl Judge<'_> {
    pub async fn check(&self, lab: &mut LabRecord, n: u32) -> Result<Verdict, CommandError> {
        let seen: Value = self.app.get_json(&format!("/api/observe/{n}")).await?;
        let needs_page = matches!(n, 2..=7 | 10 | 11);
        if needs_page && seen["started"].is_null() {
            return not_yet(format!(
                "open the level's page first (/level/{n}): that is where level {n} begins"
            ));
        }
        match n {
            1 => self.where_am_i(lab),
            2 => self.process_gone(lab, &seen, "lab-spinner").await,
            3 => self.memory_hog(lab, &seen).await,
            4 => self.full_disk(lab, &seen).await,
            5 => self.lifecycle(lab, &seen).await,
            6 => self.pause_resume(lab, &seen).await,
            7 => self.orphans(lab, &seen).await,
            8 => self.forks(lab).await,
            9 => self.workspaces(lab).await,
            10 => self.layers(lab, &seen).await,
            11 => self.egress(lab, &seen).await,
            _ => self.lost(lab).await,
        }
    }

    fn where_am_i(&self, lab: &LabRecord) -> Result<Verdict, CommandError> {
        match self.answer.map(str::trim) {
            None => not_yet("report the ID: `warren lab check 1 --answer ID`"),
            Some(id) if id == lab.sandbox_id => Ok(Verdict::Solved),
            Some(_) => not_yet("that is not the ID of the sandbox the lab runs in"),
        }
    }

    async fn running_named(&self, lab: &LabRecord, name: &str) -> Result<usize, CommandError> {
        let processes = self.client.sandbox_processes(&lab.sandbox_id).await?;
        Ok(processes
            .iter()
            .filter(|p| p.command.split_whitespace().next() == Some(name))
            .count())
    }

    async fn process_gone(
        &self,
        lab: &LabRecord,
        seen: &Value,
        name: &str,
    ) -> Result<Verdict, CommandError> {
        let left = self.running_named(lab, name).await?;
        if left > 0 || seen["running"] == Value::Bool(true) {
            return not_yet(format!("`{name}` still runs ({left} seen through the API)"));
        }
        Ok(Verdict::Solved)
    }

    async fn memory_hog(&self, lab: &LabRecord, seen: &Value) -> Result<Verdict, CommandError> {
        if let Verdict::NotYet(why) = self.process_gone(lab, seen, "lab-hog").await? {
            return not_yet(why);
        }
        // The hog must have been stopped by the player, not by the kernel.
        let started = seen["started"].as_f64().unwrap_or(0.0);
        let query = [
            ("search", "OOM killer".to_string()),
            ("limit", "100".to_string()),
        ];
        let oom_since_start = self
            .client
            .sandbox_logs(&lab.sandbox_id, &query)
            .await?
            .iter()
            .any(|line| line.timestamp.timestamp_millis() as f64 / 1000.0 >= started);
        if oom_since_start {
            return not_yet(
                "the OOM killer stopped it before you did: open /level/3?restart=1 for a new hog",
            );
        }
        Ok(Verdict::Solved)
    }

    async fn full_disk(&self, lab: &LabRecord, seen: &Value) -> Result<Verdict, CommandError> {
        let path = seen["path"].as_str().unwrap_or("/tmp/.cache-lab/");
        let usage = self.client.sandbox_disk_usage(&lab.sandbox_id, 50).await?;
        let big = usage
            .largest
            .iter()
            .any(|f| f.path.starts_with("/tmp/.cache-lab/") && f.bytes >= 256 << 20);
        if big || seen["present"] == Value::Bool(true) {
            return not_yet(format!("the 512 MiB file is still there ({path})"));
        }
        Ok(Verdict::Solved)
    }

    async fn lifecycle(&self, lab: &LabRecord, seen: &Value) -> Result<Verdict, CommandError> {
        let detail = self.client.get_sandbox(&lab.sandbox_id).await?;
        let left = (detail.end_at - Utc::now()).num_seconds();
        match seen["phase"].as_str() {
            Some("running") => {
                if left < LONG_TIMEOUT_SECS {
                    return not_yet(format!(
                        "the task runs and the sandbox ends in {left}s: give it two hours or more"
                    ));
                }
                let _: Value = self.app.post_json("/api/phase-a/5", &()).await?;
                not_yet(format!(
                    "step 1 of 2 done: the sandbox ends in {left}s while the task runs; when the \
                     task is done, give it {SHORT_TIMEOUT_SECS}s or less and check again"
                ))
            }
            _ if seen["phaseA"] != Value::Bool(true) => not_yet(
                "the task ended before a check saw a long timeout: open /level/5?restart=1 and \
                 check while it runs",
            ),
            _ if left > SHORT_TIMEOUT_SECS => not_yet(format!(
                "the task is done but the sandbox still ends in {left}s: give it \
                 {SHORT_TIMEOUT_SECS}s or less"
            )),
            _ => Ok(Verdict::Solved),
        }
    }

    async fn pause_resume(&self, lab: &LabRecord, seen: &Value) -> Result<Verdict, CommandError> {
        let started = seen["started"].as_f64().unwrap_or(f64::MAX);
        let events = self
            .client
            .lifecycle_events(Some(&lab.sandbox_id), &[("limit", "100".to_string())])
            .await?;
        let after = |kind: &str| {
            events
                .iter()
                .filter(|e| e.kind.ends_with(kind))
                .filter(|e| e.timestamp.timestamp_millis() as f64 / 1000.0 >= started)
                .map(|e| e.timestamp)
                .max()
        };
        let (Some(paused), Some(resumed)) = (after(".paused"), after(".resumed")) else {
            return not_yet("no pause and resume of the lab sandbox since the level began");
        };
        if resumed < paused {
            return not_yet("the sandbox was paused and not resumed since");
        }
        if seen["memoryKept"] != Value::Bool(true) {
            return not_yet(
                "the app's memory did not survive (a files-only pause reboots the processes): \
                 `warren lab reset` to begin again",
            );
        }
        Ok(Verdict::Solved)
    }

    async fn orphans(&self, lab: &LabRecord, seen: &Value) -> Result<Verdict, CommandError> {
        let left = self.running_named(lab, "orphan-worker").await?;
        if left > 0 || seen["orphanWorkers"].as_u64().unwrap_or(1) > 0 {
            return not_yet(format!("{left} orphan-worker process(es) still run"));
        }
        Ok(Verdict::Solved)
    }

    async fn can_checkpoint(&self) -> Result<bool, CommandError> {
        Ok(self.client.health().await?["checkpoint"] == Value::Bool(true))
    }

    async fn forks(&self, lab: &mut LabRecord) -> Result<Verdict, CommandError> {
        if !self.can_checkpoint().await? {
            return Ok(Verdict::Skipped(
                "this server cannot checkpoint (no CRIU), so it cannot fork".to_string(),
            ));
        }
        let reported: BTreeSet<&str> = self
            .answer
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .collect();
        let query = ListQuery {
            states: vec![SandboxState::Running],
            metadata: [(LAB_LABEL.to_string(), lab.lab_id.clone())].into(),
            ..ListQuery::default()
        };
        let forks: Vec<String> = self
            .client
            .list_sandboxes(&query)
            .await?
            .into_iter()
            .map(|s| s.sandbox_id)
            .filter(|id| *id != lab.sandbox_id)
            .collect();
        // Results are collected over as many checks as the host's room for forks needs: each one
        // the judge got from a running fork itself counts, once per fork.
        for id in &forks {
            let app = SandboxPortClient::new(self.sandbox_url, id, APP_PORT)?;
            let Ok(answer) = app.get_json::<Value>("/api/fork-result").await else {
                continue;
            };
            if let Some(result) = answer["result"].as_str().filter(|r| reported.contains(r)) {
                lab.fork_results.insert(id.clone(), result.to_string());
            }
        }
        let distinct: BTreeSet<&String> = lab.fork_results.values().collect();
        if distinct.len() < FORKS {
            return not_yet(format!(
                "{} fork result(s) collected so far (a result counts when the judge gets the same \
                 from a running fork of the lab sandbox; {} run now); {FORKS} are needed: \
                 `warren lab check 8 --answer R1,R2,...`",
                distinct.len(),
                forks.len()
            ));
        }
        for id in &forks {
            let _ = self.client.kill_sandbox(id).await;
        }
        Ok(Verdict::Solved)
    }

    async fn workspaces(&self, lab: &LabRecord) -> Result<Verdict, CommandError> {
        let mut seen = BTreeSet::new();
        for user in workspace_users(lab) {
            let history = match self.client.workspace_history(&user).await {
                Ok(history) => history,
                Err(err) if err.kind() == ErrorKind::NotFound => {
                    return not_yet(format!("user {user} has no sandbox of their own yet"))
                }
                Err(err) => return Err(err.into()),
            };
            let Some(own) = history.sandbox_id.clone() else {
                return not_yet(format!("user {user} has no sandbox of their own yet"));
            };
            if history.history.is_empty() {
                return not_yet(format!("user {user} has no sandbox of their own yet"));
            }
            // The judge comes back as the user: the same sandbox must answer.
            let back = self
                .client
                .workspace_sandbox(&user, &WorkspaceSandboxRequest::default())
                .await?;
            if back.sandbox.sandbox_id != own {
                return not_yet(format!(
                    "user {user} came back and got sandbox {} instead of {own} ({})",
                    back.sandbox.sandbox_id, back.action
                ));
            }
            seen.insert(own);
        }
        if seen.len() < 3 {
            return not_yet("two users share one sandbox: each needs their own");
        }
        Ok(Verdict::Solved)
    }

    async fn layers(&self, lab: &LabRecord, seen: &Value) -> Result<Verdict, CommandError> {
        let Some(other) = self.answer.map(str::trim).filter(|a| !a.is_empty()) else {
            return not_yet("report the second sandbox: `warren lab check 10 --answer ID`");
        };
        if other == lab.sandbox_id {
            return not_yet("the second sandbox must be another one than the lab's");
        }
        let detail = match self.client.get_sandbox(other).await {
            Ok(detail) => detail,
            Err(err) if err.kind() == ErrorKind::NotFound => {
                return not_yet(format!("no sandbox {other}"))
            }
            Err(err) => return Err(err.into()),
        };
        if detail.template_id != lab.template_id || detail.state != SandboxState::Running {
            return not_yet(format!(
                "sandbox {other} must be running and made from the lab template {}",
                lab.template_id
            ));
        }
        let want = seen["text"].as_str().unwrap_or_default();
        let mine = self.read_canary(&lab.sandbox_id).await?;
        if mine.trim() != want {
            return not_yet(format!(
                "{CANARY_PATH} in the lab sandbox does not hold the level's text"
            ));
        }
        let theirs = self.read_canary(other).await?;
        if theirs != CANARY_TEXT {
            return not_yet(format!(
                "{CANARY_PATH} of sandbox {other} is not the template's"
            ));
        }
        let _ = self.client.kill_sandbox(other).await;
        Ok(Verdict::Solved)
    }

    async fn read_canary(&self, id: &str) -> Result<String, CommandError> {
        let token = self.client.get_sandbox(id).await?.envd_access_token;
        let envd = EnvdClient::new(self.sandbox_url, id, token.as_deref(), "user")?;
        let bytes = envd.read_file(CANARY_PATH).await?;
        Ok(String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]).into_owned())
    }

    async fn egress(&self, lab: &LabRecord, seen: &Value) -> Result<Verdict, CommandError> {
        if seen["tokenFilePresent"] != Value::Bool(false) {
            return not_yet("the token file is still in the sandbox");
        }
        let detail = self.client.get_sandbox(&lab.sandbox_id).await?;
        let network = detail.network.unwrap_or_default();
        let denied = network.deny_out.unwrap_or_default();
        if !denied.iter().any(|d| d == "0.0.0.0/0") {
            return not_yet("everything but the API must be denied: denyOut 0.0.0.0/0");
        }
        let dns = network.dns_servers.unwrap_or_default();
        let allowed = network.allow_out.unwrap_or_default();
        if !allowed.iter().any(|a| a == ALLOWED_API) {
            return not_yet(format!("{ALLOWED_API} must be allowed out"));
        }
        if let Some(other) = allowed
            .iter()
            .find(|a| *a != ALLOWED_API && !dns.contains(a))
        {
            return not_yet(format!("only {ALLOWED_API} may be allowed, not {other}"));
        }
        let rules = network.rules.unwrap_or(Value::Null);
        let authorization = rules[ALLOWED_API]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|rule| rule["transform"]["headers"].as_object())
            .any(|headers| {
                headers
                    .keys()
                    .any(|k| k.eq_ignore_ascii_case("authorization"))
            });
        if !authorization {
            return not_yet(format!(
                "no rule adds an Authorization header to requests for {ALLOWED_API}"
            ));
        }
        Ok(Verdict::Solved)
    }

    async fn lost(&self, lab: &mut LabRecord) -> Result<Verdict, CommandError> {
        if lab.leaked.is_empty() {
            for _ in 0..LEAKED {
                let body = NewSandbox {
                    template_id: "base".to_string(),
                    timeout: Some(3600),
                    metadata: Some(
                        [
                            ("job".to_string(), "nightly-export".to_string()),
                            ("worker".to_string(), "crashed".to_string()),
                        ]
                        .into(),
                    ),
                    ..NewSandbox::default()
                };
                let sandbox = self.client.create_sandbox(&body).await?;
                lab.leaked.push(sandbox.sandbox_id);
            }
            return not_yet(format!(
                "a worker of your team just crashed and left {LEAKED} sandboxes running that \
                 nothing tracks: find them, reclaim them, check again"
            ));
        }
        let mut left = 0;
        for id in &lab.leaked {
            match self.client.get_sandbox(id).await {
                Ok(detail)
                    if matches!(detail.state, SandboxState::Running | SandboxState::Paused) =>
                {
                    left += 1
                }
                Ok(_) => {}
                Err(err) if err.kind() == ErrorKind::NotFound => {}
                Err(err) => return Err(err.into()),
            }
        }
        if left > 0 {
            return not_yet(format!(
                "{left} of the leaked sandboxes still hold resources"
            ));
        }
        Ok(Verdict::Solved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_has_a_title_and_users_are_per_lab() {
        for n in 1..=LEVELS {
            assert!(!title(n).is_empty(), "level {n}");
        }
        let lab = LabRecord::new("t");
        let users = workspace_users(&lab);
        assert_eq!(users.len(), 3);
        assert!(users.iter().all(|u| u.starts_with(&lab.lab_id)));
    }

    #[test]
    fn the_app_gets_the_flag_hash_not_the_flag() {
        let lab = LabRecord::new("t");
        let hash = sha256_hex(&lab.flag(3));
        assert_eq!(hash.len(), 64);
        assert!(!hash.contains(&lab.flag(3)));
    }
}
