//! A live tail of a sandbox's log (the dashboard's log panel, pushed over server-sent events).
//!
//! A tail is a position: the last agent line and the last lifecycle event it handed out. Each step
//! collects from the agent with a long poll (the agent answers as soon as a command prints, or after
//! [`TAIL_WAIT`] with nothing), then reads from the store whatever is past the position — lines
//! collected by anyone (the monitor, another reader), and events — so two collectors never make a
//! tail miss or repeat a line. The store stays the only place lines are kept.

use std::time::{Duration, Instant};

use super::logs::{event_item, line_item, LogItem, LogSource};
use super::{Lifecycle, LifecycleError};
use crate::store::{LogLevel, LogQuery, SandboxRecord};

/// How long one step waits for something new: the agent's long poll, or a pause between looks at a
/// sandbox that is not running. A lifecycle event reaches a tail at most this late.
pub const TAIL_WAIT: Duration = Duration::from_secs(2);

/// At most this many items in one step (the rest come in the next).
const STEP_LIMIT: u32 = 1000;

/// Where a live tail of a sandbox's log has got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogTail {
    /// The last agent line handed out (its sequence number).
    pub line: i64,
    /// The last lifecycle event handed out (`sandbox_events.seq`).
    pub event: i64,
    /// The last step stopped at [`STEP_LIMIT`] lines: the next one reads on without waiting.
    more: bool,
}

impl LogTail {
    /// The position as text (`<line>.<event>`): the id of a server-sent event, which a browser
    /// sends back as `Last-Event-ID` when it reconnects.
    pub fn token(&self) -> String {
        format!("{}.{}", self.line, self.event)
    }

    pub fn parse(token: &str) -> Option<LogTail> {
        let (line, event) = token.split_once('.')?;
        Some(LogTail {
            line: line.parse().ok()?,
            event: event.parse().ok()?,
            more: false,
        })
    }

    /// Moves the position past `items`.
    fn advance(&mut self, items: &[LogItem]) {
        for item in items {
            match item.source {
                LogSource::Line(seq) => self.line = self.line.max(seq),
                LogSource::Event(seq) => self.event = self.event.max(seq),
            }
        }
    }
}

impl Lifecycle {
    /// The newest `limit` items of the sandbox's log, oldest first, and a tail that continues
    /// after them.
    pub async fn start_log_tail(
        &self,
        record: &SandboxRecord,
        limit: usize,
    ) -> Result<(Vec<LogItem>, LogTail), LifecycleError> {
        // Read before the items: whatever is stored after this is newer and in the items or the
        // next step; whatever is not shown at or below it is older than the items.
        let mut tail = LogTail {
            more: false,
            line: self
                .store
                .last_sandbox_log_seq(&record.id)
                .await?
                .unwrap_or(0),
            event: self
                .store
                .sandbox_events(&record.id)
                .await?
                .last()
                .map_or(0, |event| event.seq),
        };
        let newest_first = LogQuery {
            cursor: None,
            forward: false,
            limit,
            min_level: LogLevel::Debug,
            search: None,
        };
        let mut items = self.sandbox_log(record, &newest_first).await?;
        items.reverse();
        tail.advance(&items);
        Ok((items, tail))
    }

    /// What sandbox `id`'s log gained after `tail`, oldest first, waiting up to about
    /// [`TAIL_WAIT`] for something; moves `tail` past it. `Ok(None)` when the sandbox has ended
    /// (or is gone) and there is nothing more to hand out.
    pub async fn log_tail_step(
        &self,
        id: &str,
        tail: &mut LogTail,
    ) -> Result<Option<Vec<LogItem>>, LifecycleError> {
        let started = Instant::now();
        let Some(record) = self.store.get_sandbox(id).await? else {
            return Ok(None);
        };
        let wait = if tail.more { Duration::ZERO } else { TAIL_WAIT };
        if let Err(error) = self.collect_logs_waiting(&record, wait).await {
            tracing::debug!(sandbox = %id, %error, "no collection for a log tail");
        }
        let (items, more) = self.log_items_after(id, tail).await?;
        tail.more = more;
        if items.is_empty() {
            if record.state.is_terminal() {
                return Ok(None);
            }
            // Nothing new: a sandbox that is not running, an agent that did not wait (one from
            // before the long poll) or did not answer. Never ask again at once.
            tokio::time::sleep(TAIL_WAIT.saturating_sub(started.elapsed())).await;
        }
        tail.advance(&items);
        Ok(Some(items))
    }

    /// The stored lines and events of sandbox `id` past `tail`, merged by time, and whether more
    /// lines are stored than one step takes.
    async fn log_items_after(
        &self,
        id: &str,
        tail: &LogTail,
    ) -> Result<(Vec<LogItem>, bool), LifecycleError> {
        let lines = self
            .store
            .sandbox_logs_after(id, tail.line, STEP_LIMIT)
            .await?;
        let more = lines.len() >= STEP_LIMIT as usize;
        let mut items: Vec<LogItem> = self
            .store
            .sandbox_events(id)
            .await?
            .into_iter()
            .filter(|event| event.seq > tail.event)
            .map(event_item)
            .collect();
        items.extend(lines.into_iter().map(line_item));
        // Stable: an event and a line of one millisecond keep their own order.
        items.sort_by_key(|item| item.at);
        Ok((items, more))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn item(source: LogSource) -> LogItem {
        LogItem {
            source,
            at: 0,
            level: LogLevel::Info,
            message: String::new(),
            fields: BTreeMap::new(),
        }
    }

    #[test]
    fn a_tail_moves_past_what_it_handed_out_and_round_trips_as_an_event_id() {
        let mut tail = LogTail::default();
        tail.advance(&[
            item(LogSource::Line(7)),
            item(LogSource::Event(3)),
            item(LogSource::Line(5)),
        ]);
        assert_eq!((tail.line, tail.event), (7, 3));
        assert_eq!(tail.token(), "7.3");
        assert_eq!(LogTail::parse("7.3"), Some(tail));
        for bad in ["", "7", "7.", ".3", "a.b", "7.3.1"] {
            assert_eq!(LogTail::parse(bad), None, "{bad:?}");
        }
    }
}
