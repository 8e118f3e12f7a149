//! Sandbox logs: collecting what each sandbox's agent recorded (lines its commands printed,
//! processes starting and ending) into the store, and reading them back merged with the sandbox's
//! lifecycle events.
//!
//! The agent's answer is written by the sandbox, so it is hostile: its size is bounded by the
//! HTTP client, every line is cut to a bounded length with a bounded set of fields, a level the
//! server does not know reads as `info`, and a line stamped before the sandbox was created (the
//! history a template's or a parent's checkpoint carries) is not collected.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::{Lifecycle, LifecycleError};
use crate::lifecycle::now_millis;
use crate::lifecycle::state::SandboxState;
use crate::store::{LogLevel, LogQuery, Millis, SandboxEvent, SandboxLogLine, SandboxRecord};

/// Lines longer than this are cut (the agent cuts at 8 KiB already).
const MAX_MESSAGE: usize = 8 << 10;
/// At most this many fields a line, each name and value at most `MAX_FIELD` bytes.
const MAX_FIELDS: usize = 8;
const MAX_FIELD: usize = 256;
/// Entries asked for in one collection (the agent also bounds a page at 1 MiB).
const PAGE: usize = 5000;

#[derive(Debug, Deserialize)]
struct AgentEntry {
    seq: u64,
    at: i64,
    level: String,
    message: String,
    #[serde(default)]
    fields: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct AgentPage {
    entries: Vec<AgentEntry>,
    oldest: u64,
}

/// One line of `/sandboxes/{id}/logs`: a lifecycle event or a line from the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct LogItem {
    pub source: LogSource,
    pub at: Millis,
    pub level: LogLevel,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

/// Where a [`LogItem`] comes from, with its sequence number there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSource {
    /// A lifecycle event (`sandbox_events.seq`).
    Event(i64),
    /// A line of the agent's log (its own sequence number).
    Line(i64),
}

/// A lifecycle event as a log item.
pub(super) fn event_item(event: SandboxEvent) -> LogItem {
    let from = event
        .from_state
        .map_or("-".to_string(), |state| state.to_string());
    let mut message = format!("sandbox {from} -> {}", event.to_state);
    if let Some(reason) = &event.reason {
        message.push_str(": ");
        message.push_str(reason);
    }
    let level = if event.to_state == SandboxState::Failed {
        LogLevel::Error
    } else {
        LogLevel::Info
    };
    let fields = BTreeMap::from([
        ("event".to_string(), "lifecycle".to_string()),
        ("from".to_string(), from),
        ("to".to_string(), event.to_state.to_string()),
    ]);
    LogItem {
        source: LogSource::Event(event.seq),
        at: event.at,
        level,
        message,
        fields,
    }
}

/// A stored line of the agent's log as a log item.
pub(super) fn line_item(line: SandboxLogLine) -> LogItem {
    LogItem {
        source: LogSource::Line(line.seq),
        at: line.at,
        level: line.level,
        message: line.message,
        fields: line.fields,
    }
}

fn cut(text: &mut String, bound: usize) {
    if text.len() > bound {
        let mut end = bound;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// The agent's entries as lines of sandbox `id` created at `created_at`, collected at `now`.
fn lines_of(id: &str, created_at: Millis, now: Millis, page: AgentPage) -> Vec<SandboxLogLine> {
    page.entries
        .into_iter()
        .filter(|entry| entry.at >= created_at)
        .filter_map(|entry| {
            let seq = i64::try_from(entry.seq).ok()?;
            let mut message = entry.message;
            cut(&mut message, MAX_MESSAGE);
            let fields = entry
                .fields
                .into_iter()
                .take(MAX_FIELDS)
                .map(|(mut name, mut value)| {
                    cut(&mut name, MAX_FIELD);
                    cut(&mut value, MAX_FIELD);
                    (name, value)
                })
                .collect();
            Some(SandboxLogLine {
                sandbox_id: id.to_string(),
                seq,
                at: entry.at.min(now),
                level: LogLevel::parse(&entry.level).unwrap_or(LogLevel::Info),
                message,
                fields,
            })
        })
        .collect()
}

/// Asks the agent at `ip` for its entries after `after` (blocking); with a `wait`, the agent holds
/// the answer up to that long until there is one (an agent from before `wait_ms` answers at once).
fn fetch_page(
    ip: std::net::Ipv4Addr,
    token: Option<&str>,
    after: u64,
    wait: Duration,
) -> Result<AgentPage, String> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout_read(Duration::from_secs(5) + wait)
        .max_idle_connections(0)
        .build();
    let url = format!(
        "http://{ip}:{}/warren/logs?after={after}&limit={PAGE}&wait_ms={}",
        warren_runtime::AGENT_PORT,
        wait.as_millis()
    );
    let mut request = agent.get(&url);
    if let Some(token) = token {
        request = request.set("X-Access-Token", token);
    }
    let response = request.call().map_err(|e| e.to_string())?;
    // ureq reads at most 10 MB into a string; a page is at most about 1 MiB of messages.
    let text = response.into_string().map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("unreadable log page: {e}"))
}

impl Lifecycle {
    /// Collects the new entries of a running sandbox's agent log into the store; returns how many
    /// lines were stored. A sandbox that is not running (or whose agent does not answer) has
    /// nothing new.
    pub async fn collect_logs(&self, record: &SandboxRecord) -> Result<usize, LifecycleError> {
        self.collect_logs_waiting(record, Duration::ZERO).await
    }

    /// [`Lifecycle::collect_logs`], but when the agent has nothing new it is given up to `wait`
    /// to record something (the live tail's long poll).
    pub(super) async fn collect_logs_waiting(
        &self,
        record: &SandboxRecord,
        wait: Duration,
    ) -> Result<usize, LifecycleError> {
        let (SandboxState::Running, Some(ip)) = (record.state, record.ip) else {
            return Ok(0);
        };
        let id = record.id.clone();
        let after = match self.log_cursor(&id) {
            Some(after) => after,
            None => {
                let stored = self.store.last_sandbox_log_seq(&id).await?;
                stored.and_then(|seq| u64::try_from(seq).ok()).unwrap_or(0)
            }
        };
        let token = record.envd_access_token.clone();
        let fetched =
            tokio::task::spawn_blocking(move || fetch_page(ip, token.as_deref(), after, wait))
                .await
                .map_err(|e| e.to_string())
                .and_then(|page| page);
        let page = match fetched {
            Ok(page) => page,
            Err(error) => {
                tracing::debug!(sandbox = %id, %error, "the agent's log was not collected");
                return Ok(0);
            }
        };
        let mut last = after;
        if let Some(entry) = page.entries.last() {
            last = last.max(entry.seq);
        }
        let mut lines = lines_of(
            &id,
            record.started_at,
            now_millis(),
            page_after(page, after),
        );
        if let Some(gap) = lines.first().map(|l| l.seq).filter(|_| after > 0) {
            let missed = u64::try_from(gap).unwrap_or(0).saturating_sub(after + 1);
            if missed > 0 {
                lines.insert(0, dropped_line(&id, gap, lines[0].at, missed));
            }
        }
        let stored = lines.len();
        self.store
            .insert_sandbox_logs(&lines, self.config.monitor.log_lines_per_sandbox)
            .await?;
        self.set_log_cursor(&id, last);
        Ok(stored)
    }

    fn log_cursor(&self, id: &str) -> Option<u64> {
        let cursors = self.log_cursors.lock().unwrap_or_else(|p| p.into_inner());
        cursors.get(id).copied()
    }

    fn set_log_cursor(&self, id: &str, seq: u64) {
        let mut cursors = self.log_cursors.lock().unwrap_or_else(|p| p.into_inner());
        let cursor = cursors.entry(id.to_string()).or_insert(seq);
        *cursor = (*cursor).max(seq);
    }

    /// Forgets the collection cursors of sandboxes for which `keep` is false.
    pub fn retain_log_cursors(&self, keep: impl Fn(&str) -> bool) {
        let mut cursors = self.log_cursors.lock().unwrap_or_else(|p| p.into_inner());
        cursors.retain(|id, _| keep(id));
    }

    /// A page of sandbox `id`'s log (any sandbox the store still has, ended ones too): its
    /// lifecycle events and its agent's lines, merged by time.
    pub async fn sandbox_log(
        &self,
        record: &SandboxRecord,
        query: &LogQuery,
    ) -> Result<Vec<LogItem>, LifecycleError> {
        // What the agent printed since the last collection is included.
        if let Err(error) = self.collect_logs(record).await {
            tracing::debug!(sandbox = %record.id, %error, "no fresh collection for a log read");
        }
        let lines = self.store.sandbox_logs(&record.id, query).await?;
        let events = self.store.sandbox_events(&record.id).await?;
        let search = query.search.as_deref().map(str::to_lowercase);
        let mut items: Vec<LogItem> = events
            .into_iter()
            .map(event_item)
            .filter(|item| item.level >= query.min_level)
            .filter(|item| match (query.cursor, query.forward) {
                (None, _) => true,
                (Some(cursor), true) => item.at >= cursor,
                (Some(cursor), false) => item.at <= cursor,
            })
            .filter(|item| {
                search
                    .as_deref()
                    .is_none_or(|s| item.message.to_lowercase().contains(s))
            })
            .collect();
        items.extend(lines.into_iter().map(line_item));
        // Stable: events and lines at one millisecond keep their own order.
        if query.forward {
            items.sort_by_key(|item| item.at);
        } else {
            items.sort_by_key(|item| std::cmp::Reverse(item.at));
        }
        items.truncate(query.limit);
        Ok(items)
    }
}

/// The entries of `page` after `after` (an agent answers only those, but its answer is not
/// trusted to).
fn page_after(mut page: AgentPage, after: u64) -> AgentPage {
    page.entries.retain(|entry| entry.seq > after);
    page.oldest = page.oldest.max(after + 1);
    page
}

/// A line saying `missed` lines were dropped by the agent's bounded log before they were
/// collected (the sandbox printed faster than the monitor collected).
fn dropped_line(id: &str, before_seq: i64, at: Millis, missed: u64) -> SandboxLogLine {
    SandboxLogLine {
        sandbox_id: id.to_string(),
        seq: before_seq - 1,
        at,
        level: LogLevel::Warn,
        message: format!(
            "{missed} line(s) were dropped from the sandbox's log before they were collected"
        ),
        fields: BTreeMap::from([("event".to_string(), "dropped".to_string())]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, at: i64, level: &str, message: &str) -> AgentEntry {
        AgentEntry {
            seq,
            at,
            level: level.to_string(),
            message: message.to_string(),
            fields: BTreeMap::new(),
        }
    }

    #[test]
    fn an_agents_page_is_bounded_and_only_the_sandboxs_own_life_is_kept() {
        let huge_fields: BTreeMap<String, String> = (0..20)
            .map(|n| (format!("k{n}"), "v".repeat(1000)))
            .collect();
        let mut long = entry(4, 3_000, "info", &"é".repeat(MAX_MESSAGE));
        long.fields = huge_fields;
        let page = AgentPage {
            entries: vec![
                entry(1, 500, "info", "from the template's build"),
                entry(2, 1_000, "shout", "unknown level"),
                entry(3, 99_999, "error", "stamped in the future"),
                long,
            ],
            oldest: 1,
        };
        let lines = lines_of("sb", 1_000, 5_000, page);
        assert_eq!(lines.iter().map(|l| l.seq).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(lines[0].level, LogLevel::Info);
        assert_eq!((lines[1].level, lines[1].at), (LogLevel::Error, 5_000));
        assert!(lines[2].message.len() <= MAX_MESSAGE);
        assert_eq!(lines[2].fields.len(), MAX_FIELDS);
        assert!(lines[2].fields.values().all(|v| v.len() == MAX_FIELD));
    }

    #[test]
    fn entries_at_or_before_the_cursor_are_not_taken_even_when_the_agent_sends_them() {
        let page = AgentPage {
            entries: vec![entry(3, 1, "info", "old"), entry(5, 2, "info", "new")],
            oldest: 1,
        };
        let page = page_after(page, 4);
        assert_eq!(page.entries.len(), 1);
        assert_eq!(page.entries[0].seq, 5);
        assert_eq!(page.oldest, 5);
        let dropped = dropped_line("sb", 9, 7, 3);
        assert_eq!((dropped.seq, dropped.level), (8, LogLevel::Warn));
        assert!(dropped.message.starts_with("3 line(s)"));
    }
}
