//! `warren events`: the team's sandbox events, oldest of the latest N first, and with `--follow` the
//! ones that happen after, as they come.

use std::time::Duration;

use chrono::SecondsFormat;
use warren_client::types::SandboxLifecycleEvent;

use super::{api_client, print_json, CommandError};
use crate::args::{EventsArgs, GlobalArgs};
use crate::exit_code;

/// How often `--follow` asks for new events.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);

/// `created` or `sandbox.lifecycle.created` → the API's name.
fn full_type(name: &str) -> String {
    if name.contains('.') {
        name.to_string()
    } else {
        format!("sandbox.lifecycle.{name}")
    }
}

fn line(event: &SandboxLifecycleEvent) -> String {
    let kind = event
        .kind
        .strip_prefix("sandbox.lifecycle.")
        .unwrap_or(&event.kind);
    let data = event.event_data.as_ref();
    let field = |name: &str| data.and_then(|d| d.get(name)).and_then(|v| v.as_str());
    let mut detail = match (field("from"), field("to")) {
        (Some(from), Some(to)) if from != to => format!("{from} -> {to}"),
        _ => String::new(),
    };
    if let Some(reason) = field("reason") {
        if !detail.is_empty() {
            detail.push_str(": ");
        }
        detail.push_str(reason);
    }
    format!(
        "{}  {}  {:<8} {}",
        event.timestamp.to_rfc3339_opts(SecondsFormat::Secs, true),
        event.sandbox_id,
        kind,
        detail
    )
}

fn print(global: &GlobalArgs, events: &[SandboxLifecycleEvent]) -> Result<(), CommandError> {
    for event in events {
        if global.json {
            print_json(event)?;
        } else {
            println!("{}", line(event));
        }
    }
    Ok(())
}

pub async fn run(global: &GlobalArgs, args: EventsArgs) -> Result<i32, CommandError> {
    let client = api_client(global)?;
    let mut query: Vec<(&str, String)> =
        args.types.iter().map(|t| ("types", full_type(t))).collect();
    let mut first = query.clone();
    first.push(("limit", args.limit.clamp(1, 100).to_string()));
    let mut events = client
        .lifecycle_events(args.sandbox.as_deref(), &first)
        .await?;
    // The API answers newest first; a log reads oldest first.
    events.reverse();
    print(global, &events)?;
    if !args.follow {
        return Ok(exit_code::OK);
    }
    let mut last = events
        .last()
        .and_then(|e| e.id.parse::<i64>().ok())
        .unwrap_or(0);
    query.push(("orderAsc", "true".to_string()));
    query.push(("limit", "100".to_string()));
    loop {
        tokio::time::sleep(FOLLOW_INTERVAL).await;
        let mut asked = query.clone();
        asked.push(("after", last.to_string()));
        let new = client
            .lifecycle_events(args.sandbox.as_deref(), &asked)
            .await?;
        print(global, &new)?;
        if let Some(id) = new.last().and_then(|e| e.id.parse::<i64>().ok()) {
            last = id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_type_names_get_the_api_prefix() {
        assert_eq!(full_type("killed"), "sandbox.lifecycle.killed");
        assert_eq!(
            full_type("sandbox.lifecycle.paused"),
            "sandbox.lifecycle.paused"
        );
    }
}
