//! `warren workspace ...`: a user's own sandbox and the history of where they were moved.

use chrono::SecondsFormat;
use warren_client::types::WorkspaceSandboxRequest;

use super::{api_client, print_json, CommandError};
use crate::args::{GlobalArgs, WorkspaceCommand};
use crate::exit_code;
use crate::table::Table;

pub async fn run(global: &GlobalArgs, command: WorkspaceCommand) -> Result<i32, CommandError> {
    let client = api_client(global)?;
    match command {
        WorkspaceCommand::Get {
            user,
            template,
            timeout,
        } => {
            let body = WorkspaceSandboxRequest {
                template_id: template,
                timeout: timeout.map(i64::from),
            };
            let handed = client.workspace_sandbox(&user, &body).await?;
            if global.json {
                print_json(&handed)?;
            } else {
                let mut table = Table::new(["field", "value"]);
                table.row(["user", &handed.user_id]);
                table.row(["sandbox", &handed.sandbox.sandbox_id]);
                table.row(["template", &handed.template_id]);
                table.row(["action", &handed.action]);
                print!("{}", table.render());
            }
        }
        WorkspaceCommand::History { user } => {
            let history = client.workspace_history(&user).await?;
            if global.json {
                print_json(&history)?;
            } else {
                let mut table = Table::new(["at", "action", "sandbox", "reason"]);
                for entry in &history.history {
                    table.row([
                        entry.at.to_rfc3339_opts(SecondsFormat::Secs, true),
                        entry.action.clone(),
                        entry.sandbox_id.clone(),
                        entry.reason.clone().unwrap_or_default(),
                    ]);
                }
                print!("{}", table.render());
            }
        }
    }
    Ok(exit_code::OK)
}
