//! `warren sandbox logs`: a sandbox's log (lifecycle events and what its commands printed), all of
//! it or the last N lines, and with `--follow` the lines that come after.

use std::collections::HashSet;
use std::time::Duration;

use chrono::SecondsFormat;
use warren_client::types::SandboxLogEntry;

use super::{api_client, print_json, CommandError};
use crate::args::{GlobalArgs, LogsArgs};
use crate::exit_code;

/// How often `--follow` asks for new lines.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);
/// Lines asked for per request.
const PAGE: usize = 1000;

fn print(global: &GlobalArgs, entry: &SandboxLogEntry) -> Result<(), CommandError> {
    if global.json {
        return print_json(entry);
    }
    let stream = entry.fields.get("stream").map_or("", String::as_str);
    let tag = match (entry.fields.get("pid"), stream) {
        (Some(pid), "") => format!("[{pid}]"),
        (Some(pid), stream) => format!("[{pid} {stream}]"),
        (None, _) => "[sandbox]".to_string(),
    };
    println!(
        "{} {:<5} {tag} {}",
        entry.timestamp.to_rfc3339_opts(SecondsFormat::Millis, true),
        entry.level,
        entry.message
    );
    Ok(())
}

/// What tells two entries apart (lines at one millisecond are told apart by content).
fn identity(entry: &SandboxLogEntry) -> String {
    format!(
        "{}|{}|{}|{:?}",
        entry.timestamp.timestamp_millis(),
        entry.level,
        entry.message,
        entry.fields
    )
}

/// Prints the entries of `page` not yet printed; returns the cursor to ask from next.
fn print_new(
    global: &GlobalArgs,
    page: &[SandboxLogEntry],
    cursor: &mut i64,
    printed_at_cursor: &mut HashSet<String>,
) -> Result<usize, CommandError> {
    let mut printed = 0;
    for entry in page {
        let at = entry.timestamp.timestamp_millis();
        let id = identity(entry);
        if at == *cursor && printed_at_cursor.contains(&id) {
            continue;
        }
        if at > *cursor {
            *cursor = at;
            printed_at_cursor.clear();
        }
        printed_at_cursor.insert(id);
        print(global, entry)?;
        printed += 1;
    }
    Ok(printed)
}

pub async fn run(global: &GlobalArgs, args: LogsArgs) -> Result<i32, CommandError> {
    let client = api_client(global)?;
    let mut filters: Vec<(&str, String)> = Vec::new();
    if let Some(level) = &args.level {
        filters.push(("level", level.clone()));
    }
    if let Some(search) = &args.search {
        filters.push(("search", search.clone()));
    }
    let mut cursor = 0i64;
    let mut seen = HashSet::new();
    if let Some(tail) = args.tail {
        let mut query = filters.clone();
        query.push(("direction", "backward".into()));
        query.push(("limit", tail.to_string()));
        let mut last = client.sandbox_logs(&args.id, &query).await?;
        last.reverse();
        print_new(global, &last, &mut cursor, &mut seen)?;
    }
    // Forward from the cursor, page by page; with --follow, again every interval.
    loop {
        let mut query = filters.clone();
        query.push(("cursor", cursor.to_string()));
        query.push(("limit", PAGE.to_string()));
        let page = if args.tail.is_some() && !args.follow {
            Vec::new()
        } else {
            client.sandbox_logs(&args.id, &query).await?
        };
        let printed = print_new(global, &page, &mut cursor, &mut seen)?;
        if page.len() == PAGE && printed > 0 {
            continue;
        }
        if !args.follow {
            return Ok(exit_code::OK);
        }
        tokio::time::sleep(FOLLOW_INTERVAL).await;
    }
}
