//! The monitor: every `monitor.interval` it samples each running sandbox's resource use into the
//! store (the series `GET /sandboxes/{id}/metrics?start=&end=` returns) and, with the runaway policy
//! on, lists its processes to find the ones that have held a core for too long: each becomes an
//! event on its sandbox (pid, command, user, CPU %) and, when the policy says so, is killed.
//! docs/operations.md is the operator's view.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;
use warren_proto::api::{RunawayPolicyOverride, SandboxPolicies};
use warren_runtime::{ProcessInfo, Stats};

use super::state::SandboxState;
use super::{now_millis, Lifecycle, LifecycleError};
use crate::config::RunawayPolicy;
use crate::store::{MetricSample, Millis, Policy, SandboxFilter, SandboxRecord};

/// Longest command line an event quotes.
const COMMAND_IN_EVENT: usize = 200;

/// vCPUs as the E2B API counts them: whole cores, at least one.
pub fn cpu_count(vcpus: f64) -> u32 {
    vcpus.ceil().max(1.0) as u32
}

/// The sample of `record` that `stats` make at `at`; limits the runtime does not report fall back to
/// the record's.
pub fn sample_of(record: &SandboxRecord, stats: &Stats, at: Millis) -> MetricSample {
    let or_record = |measured: u64, mib: u64| {
        if measured > 0 {
            measured
        } else {
            mib * 1024 * 1024
        }
    };
    MetricSample {
        sandbox_id: record.id.clone(),
        at,
        cpu_pct: stats.cpu_percent / record.vcpus.max(1.0),
        cpu_count: cpu_count(record.vcpus),
        mem_used: stats.memory_bytes,
        mem_total: or_record(stats.memory_limit_bytes, record.memory_mib),
        disk_used: stats.disk_used_bytes,
        disk_total: or_record(stats.disk_limit_bytes, record.disk_mib),
        pids: stats.pids,
        oom_kills: stats.oom_kills,
        mem_cache: stats.memory_cache_bytes,
        net_rx: stats.net_rx_bytes,
        net_tx: stats.net_tx_bytes,
    }
}

/// A sandbox's policies: its template's (`base`) with every field the sandbox gave over them.
pub fn merge_policies(base: &SandboxPolicies, own: SandboxPolicies) -> SandboxPolicies {
    let runaway = match (base.runaway.clone(), own.runaway) {
        (Some(base), Some(own)) => Some(RunawayPolicyOverride {
            cpu_percent: own.cpu_percent.or(base.cpu_percent),
            seconds: own.seconds.or(base.seconds),
            kill: own.kill.or(base.kill),
        }),
        (base, own) => own.or(base),
    };
    SandboxPolicies {
        runaway,
        memory_alert_percent: own.memory_alert_percent.or(base.memory_alert_percent),
        disk_alert_percent: own.disk_alert_percent.or(base.disk_alert_percent),
        idle_timeout_secs: own.idle_timeout_secs.or(base.idle_timeout_secs),
        reap_orphans_on_resume: own.reap_orphans_on_resume.or(base.reap_orphans_on_resume),
        reap_orphans_every_secs: own.reap_orphans_every_secs.or(base.reap_orphans_every_secs),
    }
}

/// The runaway policy of `record`: the server's `default` with the sandbox's own fields over it.
pub fn runaway_policy(default: &RunawayPolicy, record: &SandboxRecord) -> RunawayPolicy {
    let mut policy = default.clone();
    if let Some(own) = &record.policies.runaway {
        if let Some(percent) = own.cpu_percent {
            policy.cpu_percent = percent;
        }
        if let Some(seconds) = own.seconds {
            policy.after = std::time::Duration::from_secs(seconds);
        }
        if let Some(kill) = own.kill {
            policy.kill = kill;
        }
    }
    policy
}

/// A process found above the runaway threshold for the whole grace period.
#[derive(Debug, Clone, PartialEq)]
pub struct Runaway {
    pub sandbox_id: String,
    pub pid: u32,
    pub user: String,
    pub command: String,
    pub cpu_percent: f64,
    pub seconds: u64,
}

impl Runaway {
    /// The event text: what an operator needs to recognise the process.
    pub fn describe(&self) -> String {
        let mut command: String = self.command.chars().take(COMMAND_IN_EVENT).collect();
        if command.len() < self.command.len() {
            command.push('…');
        }
        format!(
            "runaway process: pid {} ({command:?}, user {}) at {:.0}% CPU for {} s",
            self.pid, self.user, self.cpu_percent, self.seconds
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ProcessKey {
    sandbox_id: String,
    pid: u32,
    /// A reused PID is another process.
    started_at: SystemTime,
}

#[derive(Debug, Clone, Copy)]
struct Hot {
    since: Millis,
    reported: bool,
}

/// Which processes have been above the threshold, and since when. A process is reported once per
/// hot spell: it must drop below the threshold before it can be reported again.
#[derive(Debug, Default)]
pub struct RunawayTracker {
    hot: HashMap<ProcessKey, Hot>,
}

impl RunawayTracker {
    /// Takes one listing of sandbox `sandbox_id` at `now`; returns the processes that have just
    /// become runaways under `policy`.
    pub fn observe(
        &mut self,
        policy: &RunawayPolicy,
        sandbox_id: &str,
        processes: &[ProcessInfo],
        now: Millis,
    ) -> Vec<Runaway> {
        let mut seen = HashSet::new();
        let mut found = Vec::new();
        for process in processes {
            let key = ProcessKey {
                sandbox_id: sandbox_id.to_string(),
                pid: process.pid,
                started_at: process.started_at,
            };
            if process.cpu_percent < policy.cpu_percent {
                self.hot.remove(&key);
                continue;
            }
            seen.insert(key.clone());
            let hot = self.hot.entry(key).or_insert(Hot {
                since: now,
                reported: false,
            });
            let held = u64::try_from(now - hot.since).unwrap_or(0);
            if !hot.reported && held >= policy.after.as_millis() as u64 {
                hot.reported = true;
                found.push(Runaway {
                    sandbox_id: sandbox_id.to_string(),
                    pid: process.pid,
                    user: process.user.clone(),
                    command: process.command.clone(),
                    cpu_percent: process.cpu_percent,
                    seconds: held / 1000,
                });
            }
        }
        self.hot
            .retain(|key, _| key.sandbox_id != sandbox_id || seen.contains(key));
        found
    }

    /// Forgets the sandboxes that are not among `running`.
    pub fn retain_sandboxes(&mut self, running: &HashSet<&str>) {
        self.hot
            .retain(|key, _| running.contains(key.sandbox_id.as_str()));
    }
}

/// A level alarm with hysteresis: it fires when a reading reaches the threshold, then stays quiet
/// until readings have fallen [`REARM_POINTS`] below it.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Alarm {
    raised: bool,
}

/// How far below its threshold a reading must fall before an alarm can fire again.
pub const REARM_POINTS: f64 = 10.0;

impl Alarm {
    /// Takes a reading in percent; true when the alarm fires now. A threshold of 0 is off.
    pub fn fires(&mut self, percent: f64, threshold: f64) -> bool {
        if threshold <= 0.0 {
            return false;
        }
        if self.raised {
            if percent < threshold - REARM_POINTS {
                self.raised = false;
            }
            return false;
        }
        self.raised = percent >= threshold;
        self.raised
    }
}

/// OOM kills since the `last` count seen; a count below it means a restore gave the sandbox a new
/// cgroup, whose whole count is new.
pub fn new_oom_kills(last: u64, now: u64) -> u64 {
    if now >= last {
        now - last
    } else {
        now
    }
}

#[derive(Debug, Default)]
struct SandboxAlerts {
    memory: Alarm,
    disk: Alarm,
    /// The OOM count last seen (None: not yet in this server's run).
    oom_kills: Option<u64>,
    /// When this server run first saw the sandbox running, or last found a command running in it:
    /// the idle clock starts no earlier.
    busy_at: Millis,
    /// When this server run first saw the sandbox running, or last reaped its orphans on schedule.
    reaped_at: Millis,
}

/// A period in seconds a sandbox may set for itself (0: off), else the server's default.
fn own_or_default(
    own: Option<u64>,
    default: Option<std::time::Duration>,
) -> Option<std::time::Duration> {
    match own {
        Some(0) => None,
        Some(seconds) => Some(std::time::Duration::from_secs(seconds)),
        None => default,
    }
}

/// The idle timeout that applies to `record`: its own, else the server's; `None` when off.
pub fn idle_timeout(
    default: Option<std::time::Duration>,
    record: &SandboxRecord,
) -> Option<std::time::Duration> {
    own_or_default(record.policies.idle_timeout_secs, default)
}

/// How often `record`'s orphans are reaped: its own period, else the server's; `None` when never.
pub fn orphan_reap_period(
    default: Option<std::time::Duration>,
    record: &SandboxRecord,
) -> Option<std::time::Duration> {
    own_or_default(record.policies.reap_orphans_every_secs, default)
}

/// Whether a sandbox last busy at `busy_at` and used through the proxy as `used` says has been idle
/// for `limit` at `now`.
pub fn idle_for(
    limit: std::time::Duration,
    busy_at: Millis,
    used: Option<super::activity::Use>,
    now: Millis,
) -> bool {
    if used.is_some_and(|u| u.open > 0) {
        return false;
    }
    let last = used.map_or(busy_at, |u| u.last.max(busy_at));
    now.saturating_sub(last) >= limit.as_millis() as Millis
}

/// What the monitor remembers between passes.
#[derive(Debug, Default)]
pub struct MonitorState {
    runaways: RunawayTracker,
    sandboxes: HashMap<String, SandboxAlerts>,
    /// When each sandbox's log was last collected by a pass.
    logs_collected_at: HashMap<String, Millis>,
}

/// A pass collects a sandbox's log at most this often: a read of the log, a pause and a kill collect
/// what is new anyway, so the monitor only keeps the store from lagging far behind (one HTTP request
/// per sandbox every pass was load the host did not need).
const LOG_COLLECTION_PERIOD_MS: Millis = 10_000;

/// What one pass did.
#[derive(Debug, Default, PartialEq)]
pub struct PassReport {
    pub sampled: usize,
    pub runaways: Vec<Runaway>,
    pub killed: Vec<(String, u32)>,
    /// Every event the pass recorded, as (sandbox, text).
    pub events: Vec<(String, String)>,
    /// Sandboxes the idle policy ended.
    pub idle_ended: Vec<String>,
    /// Lines collected from the agents' logs.
    pub log_lines: usize,
    /// Orphaned processes killed by the scheduled reaping.
    pub orphans_reaped: usize,
}

/// Whether the agent of `record` runs a command or PTY for a client (the template's start command
/// does not count). An agent that cannot be asked counts as busy: the sandbox is left alone.
async fn running_commands(record: &SandboxRecord) -> bool {
    match super::operations::agent_processes(record).await {
        Ok(running) => running.iter().any(|p| {
            p.tag.as_deref() != Some(crate::templates::builder::agent_commands::START_CMD_TAG)
        }),
        Err(error) => {
            tracing::debug!(sandbox = %record.id, %error, "cannot ask the agent for its processes");
            true
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / (1024 * 1024))
}

fn percent_of(used: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        used as f64 * 100.0 / total as f64
    }
}

/// Records `text` as an event of sandbox `id` made by `policy`, counts it under `policy`/`action`
/// and logs it.
async fn note(
    lifecycle: &Lifecycle,
    report: &mut PassReport,
    id: &str,
    policy: Policy,
    action: &str,
    text: String,
) {
    tracing::warn!(sandbox = %id, "{text}");
    lifecycle.metrics().policy_action(policy.as_str(), action);
    if let Err(error) = lifecycle
        .store()
        .note_sandbox_event(id, SandboxState::Running, &text, Some(policy), now_millis())
        .await
    {
        tracing::error!(sandbox = %id, %error, "cannot record a monitor event");
    }
    report.events.push((id.to_string(), text));
}

/// One pass over the running sandboxes at `now`.
pub async fn pass(
    lifecycle: &Lifecycle,
    state: &mut MonitorState,
    now: Millis,
) -> Result<PassReport, LifecycleError> {
    let config = &lifecycle.config().monitor;
    let running = lifecycle
        .list(&SandboxFilter {
            states: vec![SandboxState::Running],
            ..SandboxFilter::default()
        })
        .await?;
    let mut report = PassReport::default();
    let mut samples = Vec::new();
    for record in &running {
        let id = record.id.as_str();
        let collected_at = state.logs_collected_at.get(id).copied();
        if collected_at.is_none_or(|at| now - at >= LOG_COLLECTION_PERIOD_MS) {
            state.logs_collected_at.insert(id.to_string(), now);
            match lifecycle.collect_logs(record).await {
                Ok(lines) => report.log_lines += lines,
                Err(error) => {
                    tracing::warn!(sandbox = %id, %error, "cannot store the sandbox's log")
                }
            }
        }
        // A sandbox may end between the listing and here: it is simply not looked at.
        let stats = match lifecycle.stats(id).await {
            Ok(stats) => stats,
            Err(error) => {
                tracing::debug!(sandbox = %id, %error, "no resource sample");
                None
            }
        };
        let policy = runaway_policy(&config.runaway, record);
        let mut processes = None;
        if policy.cpu_percent > 0.0 {
            match lifecycle.processes(id).await {
                Ok(list) => processes = Some(list),
                Err(error) => tracing::debug!(sandbox = %id, %error, "no process listing"),
            }
        }
        let found = processes.as_deref().map_or_else(Vec::new, |list| {
            state.runaways.observe(&policy, id, list, now)
        });
        for runaway in found {
            let mut event = runaway.describe();
            let mut action = "reported";
            if policy.kill {
                match lifecycle
                    .signal_process(id, runaway.pid, libc::SIGKILL)
                    .await
                {
                    Ok(()) => {
                        event.push_str("; killed by the runaway policy");
                        action = "killed";
                        report.killed.push((id.to_string(), runaway.pid));
                    }
                    Err(error) => event.push_str(&format!("; could not kill it: {error}")),
                }
            }
            note(
                lifecycle,
                &mut report,
                id,
                Policy::RunawayCpu,
                action,
                event,
            )
            .await;
            report.runaways.push(runaway);
        }
        let Some(stats) = stats else {
            continue;
        };
        let sample = sample_of(record, &stats, now);
        let alerts = state
            .sandboxes
            .entry(id.to_string())
            .or_insert_with(|| SandboxAlerts {
                busy_at: now,
                reaped_at: now,
                ..SandboxAlerts::default()
            });
        let last_oom = match alerts.oom_kills {
            Some(count) => count,
            None => lifecycle
                .store()
                .latest_metric_samples(&[id.to_string()])
                .await?
                .first()
                .map_or(0, |s| s.oom_kills),
        };
        alerts.oom_kills = Some(stats.oom_kills);
        let own = &record.policies;
        let memory_fires = alerts.memory.fires(
            percent_of(sample.mem_used, sample.mem_total),
            own.memory_alert_percent
                .unwrap_or(config.memory_alert_percent),
        );
        let disk_fires = alerts.disk.fires(
            percent_of(sample.disk_used, sample.disk_total),
            own.disk_alert_percent.unwrap_or(config.disk_alert_percent),
        );
        let oom = new_oom_kills(last_oom, stats.oom_kills);
        if oom > 0 {
            let text = format!(
                "out of memory: the kernel's OOM killer ended {oom} process(es) at the {} limit",
                mib(sample.mem_total)
            );
            note(
                lifecycle,
                &mut report,
                id,
                Policy::OomKill,
                "reported",
                text,
            )
            .await;
        }
        if memory_fires {
            let mut list = match processes.take() {
                Some(list) => list,
                None => lifecycle.processes(id).await.unwrap_or_default(),
            };
            list.sort_by_key(|p| std::cmp::Reverse(p.rss_bytes));
            let largest: Vec<String> = list
                .iter()
                .take(3)
                .map(|p| {
                    let command: String = p.command.chars().take(60).collect();
                    format!("pid {} {command:?} ({})", p.pid, mib(p.rss_bytes))
                })
                .collect();
            let text = format!(
                "memory pressure: {} of {} in use ({:.0}%); largest processes: {}",
                mib(sample.mem_used),
                mib(sample.mem_total),
                percent_of(sample.mem_used, sample.mem_total),
                largest.join(", ")
            );
            note(
                lifecycle,
                &mut report,
                id,
                Policy::MemoryPressure,
                "reported",
                text,
            )
            .await;
        }
        if disk_fires {
            let largest = match lifecycle.largest_files(id, 5).await {
                Ok(files) => files
                    .iter()
                    .map(|f| format!("{} ({})", f.path.display(), mib(f.bytes)))
                    .collect::<Vec<_>>()
                    .join(", "),
                Err(error) => format!("not listed: {error}"),
            };
            let text = format!(
                "disk nearly full: {} of {} used ({:.0}%); largest files: {largest}",
                mib(sample.disk_used),
                mib(sample.disk_total),
                percent_of(sample.disk_used, sample.disk_total),
            );
            note(
                lifecycle,
                &mut report,
                id,
                Policy::DiskFull,
                "reported",
                text,
            )
            .await;
        }
        samples.push(sample);
        if let Some(period) = orphan_reap_period(config.reap_orphans_every, record) {
            if now - alerts.reaped_at >= period.as_millis() as Millis {
                alerts.reaped_at = now;
                match lifecycle.reap_orphans(id, "on schedule").await {
                    Ok(reaped) => report.orphans_reaped += reaped.len(),
                    Err(error) => {
                        tracing::debug!(sandbox = %id, %error, "orphans not reaped on schedule")
                    }
                }
            }
        }
        if let Some(limit) = idle_timeout(config.idle_timeout, record) {
            let used = lifecycle.activity().of(id);
            if idle_for(limit, alerts.busy_at, used, now) {
                if running_commands(record).await {
                    alerts.busy_at = now;
                } else {
                    let reason = format!(
                        "idle for {} s (no request through the proxy, no command running): ended by the idle policy",
                        limit.as_secs()
                    );
                    match lifecycle.end_early(id, &reason).await {
                        Ok(Some(ended)) => {
                            lifecycle.metrics().policy_action("idle", ended.as_str());
                            report.idle_ended.push(id.to_string());
                        }
                        Ok(None) => {}
                        Err(error) => {
                            tracing::warn!(sandbox = %id, %error, "the idle policy could not end the sandbox")
                        }
                    }
                }
            }
        }
    }
    let live: HashSet<&str> = running.iter().map(|r| r.id.as_str()).collect();
    state.runaways.retain_sandboxes(&live);
    state.sandboxes.retain(|id, _| live.contains(id.as_str()));
    state
        .logs_collected_at
        .retain(|id, _| live.contains(id.as_str()));
    lifecycle.activity().retain(|id| live.contains(id));
    lifecycle.retain_log_cursors(|id| live.contains(id));
    report.sampled = samples.len();
    let store = lifecycle.store();
    store.insert_metric_samples(&samples).await?;
    let oldest_kept = now - config.retention.as_millis() as Millis;
    store.prune_metric_samples(oldest_kept).await?;
    store
        .prune_sandbox_logs(now - config.log_retention.as_millis() as Millis)
        .await?;
    store
        .prune_sandbox_events(now - config.event_retention.as_millis() as Millis)
        .await?;
    Ok(report)
}

/// Runs [`pass`] every `monitor.interval` until `shutdown` turns true.
pub async fn run(lifecycle: Arc<Lifecycle>, shutdown: watch::Receiver<bool>) {
    let mut ticker = super::Ticker::new(lifecycle.config().monitor.interval, shutdown);
    let mut state = MonitorState::default();
    while ticker.next().await {
        // With servers sharing the store, one samples and polices the fleet.
        if !lifecycle.leads() {
            state = MonitorState::default();
            continue;
        }
        if let Err(error) = pass(&lifecycle, &mut state, now_millis()).await {
            tracing::error!(%error, "monitor pass failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn process(pid: u32, cpu_percent: f64, started: u64) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid: 1,
            user: "user".into(),
            command: format!("worker {pid}"),
            cpu_percent,
            rss_bytes: 1 << 20,
            started_at: UNIX_EPOCH + Duration::from_secs(started),
        }
    }

    fn policy() -> RunawayPolicy {
        RunawayPolicy {
            cpu_percent: 90.0,
            after: Duration::from_secs(10),
            kill: false,
        }
    }

    #[test]
    fn a_sandboxs_own_policy_fields_go_over_its_templates() {
        let template = SandboxPolicies {
            runaway: Some(RunawayPolicyOverride {
                cpu_percent: Some(50.0),
                seconds: Some(10),
                kill: Some(true),
            }),
            idle_timeout_secs: Some(600),
            reap_orphans_every_secs: Some(60),
            ..SandboxPolicies::default()
        };
        let own = SandboxPolicies {
            runaway: Some(RunawayPolicyOverride {
                kill: Some(false),
                ..RunawayPolicyOverride::default()
            }),
            idle_timeout_secs: Some(0),
            memory_alert_percent: Some(75.0),
            ..SandboxPolicies::default()
        };
        let merged = merge_policies(&template, own);
        assert_eq!(
            merged.runaway,
            Some(RunawayPolicyOverride {
                cpu_percent: Some(50.0),
                seconds: Some(10),
                kill: Some(false),
            })
        );
        assert_eq!(
            merged.idle_timeout_secs,
            Some(0),
            "the sandbox turned it off"
        );
        assert_eq!(merged.memory_alert_percent, Some(75.0));
        assert_eq!(merged.reap_orphans_every_secs, Some(60));
        assert_eq!(
            merge_policies(&SandboxPolicies::default(), template.clone()),
            template
        );
        assert_eq!(
            merge_policies(&template, SandboxPolicies::default()),
            template
        );
    }

    #[test]
    fn a_process_is_a_runaway_once_it_stays_hot_for_the_whole_period_and_is_reported_once() {
        let mut tracker = RunawayTracker::default();
        let hot = [process(7, 99.0, 1), process(8, 5.0, 1)];
        assert!(tracker.observe(&policy(), "a", &hot, 0).is_empty());
        assert!(tracker.observe(&policy(), "a", &hot, 9_999).is_empty());
        let found = tracker.observe(&policy(), "a", &hot, 10_000);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].pid, found[0].seconds), (7, 10));
        assert!(found[0]
            .describe()
            .contains("pid 7 (\"worker 7\", user user) at 99% CPU"));
        assert!(tracker.observe(&policy(), "a", &hot, 60_000).is_empty());
    }

    #[test]
    fn cooling_down_or_a_reused_pid_starts_the_period_again() {
        let mut tracker = RunawayTracker::default();
        tracker.observe(&policy(), "a", &[process(7, 99.0, 1)], 0);
        tracker.observe(&policy(), "a", &[process(7, 10.0, 1)], 5_000);
        assert!(tracker
            .observe(&policy(), "a", &[process(7, 99.0, 1)], 12_000)
            .is_empty());
        // Same PID, another start time: a new process, with a period of its own.
        assert!(tracker
            .observe(&policy(), "a", &[process(7, 99.0, 2)], 21_000)
            .is_empty());
        assert_eq!(
            tracker
                .observe(&policy(), "a", &[process(7, 99.0, 2)], 31_000)
                .len(),
            1
        );
    }

    #[test]
    fn an_alarm_fires_once_per_spell_and_rearms_well_below_its_threshold() {
        let mut alarm = Alarm::default();
        assert!(!alarm.fires(89.0, 90.0));
        assert!(alarm.fires(90.0, 90.0));
        assert!(!alarm.fires(99.0, 90.0), "still raised");
        assert!(!alarm.fires(85.0, 90.0), "not yet rearmed");
        assert!(!alarm.fires(79.0, 90.0), "rearmed, below the line");
        assert!(alarm.fires(95.0, 90.0), "a new spell");
        assert!(!Alarm::default().fires(100.0, 0.0), "0 is off");
    }

    #[test]
    fn oom_kills_count_from_the_last_seen_and_start_over_after_a_restore() {
        assert_eq!(new_oom_kills(0, 0), 0);
        assert_eq!(new_oom_kills(2, 5), 3);
        assert_eq!(new_oom_kills(5, 1), 1, "a new cgroup after a restore");
    }

    #[test]
    fn idle_means_nothing_open_and_nothing_since_the_limit() {
        use super::super::activity::Use;
        let limit = Duration::from_secs(10);
        assert!(!idle_for(limit, 0, None, 9_999));
        assert!(idle_for(limit, 0, None, 10_000));
        let open = Use { open: 1, last: 0 };
        assert!(
            !idle_for(limit, 0, Some(open), 60_000),
            "an open request is use"
        );
        let ended = Use {
            open: 0,
            last: 30_000,
        };
        assert!(!idle_for(limit, 0, Some(ended), 39_999));
        assert!(idle_for(limit, 0, Some(ended), 40_000));
        assert!(
            !idle_for(limit, 35_000, Some(ended), 40_000),
            "busy later than the last request"
        );
    }

    #[test]
    fn sandboxes_are_tracked_apart_and_forgotten_when_they_stop_running() {
        let mut tracker = RunawayTracker::default();
        tracker.observe(&policy(), "a", &[process(7, 99.0, 1)], 0);
        tracker.observe(&policy(), "b", &[process(7, 99.0, 1)], 5_000);
        tracker.retain_sandboxes(&HashSet::from(["b"]));
        assert!(tracker
            .observe(&policy(), "a", &[process(7, 99.0, 1)], 10_000)
            .is_empty());
        assert_eq!(
            tracker
                .observe(&policy(), "b", &[process(7, 99.0, 1)], 15_000)
                .len(),
            1
        );
    }
}
