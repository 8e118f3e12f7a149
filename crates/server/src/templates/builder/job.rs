//! A build job's live record: status, steps with timestamps, log entries, and the failure reason; shared
//! between the thread running the build and the API/CLI reading it, and shaped as the SDK's
//! `GET /templates/{templateID}/builds/{buildID}/status` returns it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BuildStatus {
    Waiting,
    Building,
    Ready,
    Error,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LogEntry {
    #[serde(with = "rfc3339")]
    pub timestamp: DateTime<Utc>,
    pub level: LogLevel,
    pub message: String,
    /// "base", the step number, or "finalize".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    Pending,
    Running,
    Cached,
    Done,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    pub id: String,
    pub title: String,
    pub status: StepStatus,
    #[serde(with = "rfc3339_opt", skip_serializing_if = "Option::is_none", default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(with = "rfc3339_opt", skip_serializing_if = "Option::is_none", default)]
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildReason {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default)]
    pub log_entries: Vec<LogEntry>,
}

/// Everything known about one build; serialisable so the server can persist it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobState {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: BuildStatus,
    #[serde(with = "rfc3339")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "rfc3339_opt", skip_serializing_if = "Option::is_none", default)]
    pub finished_at: Option<DateTime<Utc>>,
    pub steps: Vec<StepRecord>,
    pub logs: Vec<LogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<BuildReason>,
}

/// `TemplateBuildInfo`, the SDK's build status body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildInfo {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: BuildStatus,
    /// Always empty (E2B's v1 plain-text logs).
    pub logs: Vec<String>,
    pub log_entries: Vec<LogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<BuildReason>,
}

/// The SDK reads at most this many entries per status call and keeps polling while it gets some.
pub const STATUS_PAGE_LIMIT: usize = 100;
/// How many lines of a failed step's output go into the failure reason.
const REASON_TAIL_LINES: usize = 30;

#[derive(Debug)]
struct Shared {
    state: Mutex<JobState>,
    changed: Condvar,
    control: Mutex<Control>,
}

/// What stopping a build needs: the sandbox it works in now, and why it was told to stop.
#[derive(Debug, Default)]
struct Control {
    sandbox: Option<String>,
    stop: Option<String>,
}

/// Handle to a build's record; clones share it.
#[derive(Debug, Clone)]
pub struct BuildJob {
    shared: Arc<Shared>,
}

impl BuildJob {
    pub fn new(template_id: &str, build_id: &str) -> BuildJob {
        BuildJob {
            shared: Arc::new(Shared {
                state: Mutex::new(JobState {
                    template_id: template_id.to_string(),
                    build_id: build_id.to_string(),
                    status: BuildStatus::Waiting,
                    created_at: Utc::now(),
                    finished_at: None,
                    steps: Vec::new(),
                    logs: Vec::new(),
                    reason: None,
                }),
                changed: Condvar::new(),
                control: Mutex::new(Control::default()),
            }),
        }
    }

    fn control(&self) -> MutexGuard<'_, Control> {
        self.shared
            .control
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The build now works in sandbox `id`; Err(reason) when it was told to stop already (the caller
    /// destroys the sandbox and ends).
    pub fn entered_sandbox(&self, id: &str) -> Result<(), String> {
        let mut control = self.control();
        if let Some(reason) = &control.stop {
            return Err(reason.clone());
        }
        control.sandbox = Some(id.to_string());
        Ok(())
    }

    pub fn left_sandbox(&self, id: &str) {
        let mut control = self.control();
        if control.sandbox.as_deref() == Some(id) {
            control.sandbox = None;
        }
    }

    /// Tells a build that has not ended to stop (timeout, cancel); the first reason given sticks.
    /// Returns the sandbox it is working in, for the caller to destroy: whatever step is running
    /// then fails, and the build ends with `reason`. None when the build had ended already.
    pub fn request_stop(&self, reason: &str) -> Option<Option<String>> {
        if !matches!(self.status(), BuildStatus::Waiting | BuildStatus::Building) {
            return None;
        }
        let mut control = self.control();
        control.stop.get_or_insert_with(|| reason.to_string());
        Some(control.sandbox.clone())
    }

    /// The sandbox the build works in now, while it has not ended.
    pub fn current_sandbox(&self) -> Option<String> {
        if !matches!(self.status(), BuildStatus::Waiting | BuildStatus::Building) {
            return None;
        }
        self.control().sandbox.clone()
    }

    /// Why the build was told to stop, if it was.
    pub fn stop_reason(&self) -> Option<String> {
        self.control().stop.clone()
    }

    /// Waits up to `timeout` for the build to end; whether it has.
    pub fn wait_until_finished(&self, timeout: Duration) -> bool {
        let guard = self.lock();
        let (guard, _) = self
            .shared
            .changed
            .wait_timeout_while(guard, timeout, |s| {
                matches!(s.status, BuildStatus::Waiting | BuildStatus::Building)
            })
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        !matches!(guard.status, BuildStatus::Waiting | BuildStatus::Building)
    }

    fn lock(&self) -> MutexGuard<'_, JobState> {
        // A panic while holding the lock leaves a consistent-enough record; keep serving it.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut JobState)) {
        let mut state = self.lock();
        f(&mut state);
        drop(state);
        self.shared.changed.notify_all();
    }

    pub fn snapshot(&self) -> JobState {
        self.lock().clone()
    }

    /// The template and build this job is for (without copying its log, as `snapshot` does).
    pub fn ids(&self) -> (String, String) {
        let state = self.lock();
        (state.template_id.clone(), state.build_id.clone())
    }

    pub fn status(&self) -> BuildStatus {
        self.lock().status
    }

    /// Declares the steps up front so progress can show "step 3 of 7".
    pub fn set_steps(&self, steps: Vec<(String, String)>) {
        self.update(|s| {
            s.status = BuildStatus::Building;
            s.steps = steps
                .into_iter()
                .map(|(id, title)| StepRecord {
                    id,
                    title,
                    status: StepStatus::Pending,
                    started_at: None,
                    finished_at: None,
                })
                .collect();
        });
    }

    pub fn log(&self, level: LogLevel, step: Option<&str>, message: impl Into<String>) {
        let message = message.into();
        self.update(|s| {
            s.logs.push(LogEntry {
                timestamp: Utc::now(),
                level,
                message,
                step: step.map(String::from),
            })
        });
    }

    pub fn step_started(&self, id: &str) {
        self.set_step(id, StepStatus::Running);
    }

    pub fn step_finished(&self, id: &str, cached: bool) {
        self.set_step(
            id,
            if cached {
                StepStatus::Cached
            } else {
                StepStatus::Done
            },
        );
    }

    fn set_step(&self, id: &str, status: StepStatus) {
        self.update(|s| {
            let now = Utc::now();
            if let Some(step) = s.steps.iter_mut().find(|st| st.id == id) {
                if status == StepStatus::Running || step.started_at.is_none() {
                    step.started_at = Some(now);
                }
                if status != StepStatus::Running {
                    step.finished_at = Some(now);
                }
                step.status = status;
            }
        });
    }

    pub fn ready(&self) {
        self.update(|s| {
            s.status = BuildStatus::Ready;
            s.finished_at = Some(Utc::now());
        });
    }

    /// Marks the build failed; the reason carries the failing step's last output lines.
    pub fn fail(&self, message: impl Into<String>, step: Option<&str>) {
        let message = message.into();
        self.update(|s| {
            let now = Utc::now();
            if let Some(id) = step {
                if let Some(record) = s.steps.iter_mut().find(|st| st.id == id) {
                    record.status = StepStatus::Failed;
                    record.finished_at = Some(now);
                }
            }
            let tail: Vec<LogEntry> = s
                .logs
                .iter()
                .filter(|e| step.is_some() && e.step.as_deref() == step)
                .cloned()
                .collect();
            let tail = tail[tail.len().saturating_sub(REASON_TAIL_LINES)..].to_vec();
            s.logs.push(LogEntry {
                timestamp: now,
                level: LogLevel::Error,
                message: message.clone(),
                step: step.map(String::from),
            });
            s.status = BuildStatus::Error;
            s.finished_at = Some(now);
            s.reason = Some(BuildReason {
                message,
                step: step.map(String::from),
                log_entries: tail,
            });
        });
    }

    /// The SDK's status body: log entries from `logs_offset`, at most `limit` (default and cap 100), at
    /// or above `min_level`.
    pub fn status_response(
        &self,
        logs_offset: usize,
        limit: Option<usize>,
        min_level: Option<LogLevel>,
    ) -> TemplateBuildInfo {
        let s = self.lock();
        let limit = limit.unwrap_or(STATUS_PAGE_LIMIT).min(STATUS_PAGE_LIMIT);
        let min_level = min_level.unwrap_or(LogLevel::Debug);
        let log_entries = s
            .logs
            .iter()
            .filter(|e| e.level >= min_level)
            .skip(logs_offset)
            .take(limit)
            .cloned()
            .collect();
        TemplateBuildInfo {
            template_id: s.template_id.clone(),
            build_id: s.build_id.clone(),
            status: s.status,
            logs: Vec::new(),
            log_entries,
            reason: s.reason.clone(),
        }
    }

    /// Blocks until the record has more than `seen_logs` log entries, the build ends, or `timeout`
    /// passes (for a CLI following a local build). Returns the new snapshot.
    pub fn wait_for_change(&self, seen_logs: usize, timeout: Duration) -> JobState {
        let guard = self.lock();
        let (guard, _) = self
            .shared
            .changed
            .wait_timeout_while(guard, timeout, |s| {
                s.logs.len() <= seen_logs
                    && matches!(s.status, BuildStatus::Waiting | BuildStatus::Building)
            })
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        guard.clone()
    }
}

/// Splits streamed output into lines, keeping a partial last line until it completes.
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.partial.extend_from_slice(chunk);
        let mut lines = Vec::new();
        while let Some(pos) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=pos).collect();
            lines.push(clean_line(&line[..line.len() - 1]));
        }
        lines
    }

    pub fn finish(&mut self) -> Option<String> {
        if self.partial.is_empty() {
            None
        } else {
            let line = clean_line(&self.partial);
            self.partial.clear();
            Some(line)
        }
    }
}

fn clean_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim_end_matches('\r');
    // Progress bars redraw with \r: keep what the line finally says.
    text.rsplit('\r').next().unwrap_or(text).to_string()
}

mod rfc3339 {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}

mod rfc3339_opt {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| {
            DateTime::parse_from_rfc3339(&t)
                .map(|t| t.with_timezone(&Utc))
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_body_has_the_sdk_shape() {
        let job = BuildJob::new("tmpl", "b1");
        job.set_steps(vec![("1".into(), "RUN echo".into())]);
        job.step_started("1");
        job.log(LogLevel::Info, Some("1"), "hello");
        let body = serde_json::to_value(job.status_response(0, None, None)).unwrap();
        assert_eq!(body["templateID"], "tmpl");
        assert_eq!(body["buildID"], "b1");
        assert_eq!(body["status"], "building");
        assert_eq!(body["logs"], serde_json::json!([]));
        assert_eq!(body["logEntries"][0]["message"], "hello");
        assert_eq!(body["logEntries"][0]["level"], "info");
        assert_eq!(body["logEntries"][0]["step"], "1");
        let ts = body["logEntries"][0]["timestamp"].as_str().unwrap();
        assert!(DateTime::parse_from_rfc3339(ts).is_ok(), "{ts}");
        assert!(body.get("reason").is_none());
    }

    #[test]
    fn offsets_limits_and_levels_page_the_logs() {
        let job = BuildJob::new("t", "b");
        for i in 0..150 {
            job.log(LogLevel::Info, None, format!("line {i}"));
        }
        job.log(LogLevel::Debug, None, "quiet");
        let first = job.status_response(0, None, None);
        assert_eq!(first.log_entries.len(), 100);
        let second = job.status_response(100, None, None);
        assert_eq!(second.log_entries.len(), 51);
        assert_eq!(job.status_response(151, None, None).log_entries.len(), 0);
        assert_eq!(job.status_response(0, Some(5), None).log_entries.len(), 5);
        let info_only = job.status_response(140, None, Some(LogLevel::Info));
        assert_eq!(info_only.log_entries.len(), 10);
    }

    #[test]
    fn failure_names_the_step_and_keeps_its_output() {
        let job = BuildJob::new("t", "b");
        job.set_steps(vec![
            ("1".into(), "RUN ok".into()),
            ("2".into(), "RUN bad".into()),
        ]);
        job.log(LogLevel::Info, Some("1"), "fine");
        job.log(LogLevel::Info, Some("2"), "E: package not found");
        job.fail("step 2 (RUN bad) exited with code 100", Some("2"));
        let s = job.snapshot();
        assert_eq!(s.status, BuildStatus::Error);
        assert_eq!(s.steps[1].status, StepStatus::Failed);
        let reason = s.reason.unwrap();
        assert_eq!(reason.step.as_deref(), Some("2"));
        assert_eq!(reason.log_entries.len(), 1);
        assert_eq!(reason.log_entries[0].message, "E: package not found");
        let json = serde_json::to_string(&job.snapshot()).unwrap();
        let round: JobState = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&round).unwrap(), json);
    }

    #[test]
    fn waiting_returns_on_new_logs_or_end() {
        let job = BuildJob::new("t", "b");
        let writer = job.clone();
        let handle = std::thread::spawn(move || {
            writer.log(LogLevel::Info, None, "x");
            writer.ready();
        });
        let mut seen = 0;
        loop {
            let s = job.wait_for_change(seen, Duration::from_secs(10));
            seen = s.logs.len();
            if s.status == BuildStatus::Ready {
                break;
            }
        }
        handle.join().unwrap();
        assert_eq!(job.status(), BuildStatus::Ready);
    }

    #[test]
    fn lines_are_split_across_chunks() {
        let mut s = LineSplitter::default();
        assert_eq!(s.push(b"hel"), Vec::<String>::new());
        assert_eq!(s.push(b"lo\nwor"), vec!["hello"]);
        assert_eq!(s.push(b"ld\r\n10%\r50%\r100%\n"), vec!["world", "100%"]);
        assert_eq!(s.push(b"tail"), Vec::<String>::new());
        assert_eq!(s.finish().as_deref(), Some("tail"));
        assert_eq!(s.finish(), None);
    }
}
