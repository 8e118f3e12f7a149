//! `warren nodes list|drain|undrain` and `warren servers list`: a cluster's nodes and servers,
//! through the API (admin keys).

use super::{api_client, print_json, CommandError};
use crate::args::{GlobalArgs, NodesCommand, ServersCommand};
use crate::exit_code;
use crate::table::Table;

pub async fn run(global: &GlobalArgs, command: NodesCommand) -> Result<i32, CommandError> {
    let client = api_client(global)?;
    match command {
        NodesCommand::List => {
            let nodes = client.list_nodes().await?;
            if global.json {
                print_json(&nodes)?;
                return Ok(exit_code::OK);
            }
            let mut table = Table::new(["NODE", "STATE", "SANDBOXES", "URL"]);
            for node in &nodes {
                let state = match (node["up"].as_bool(), node["draining"].as_bool()) {
                    (Some(false), _) => "down",
                    (_, Some(true)) => "draining",
                    _ => "up",
                };
                table.row([
                    node["nodeID"].as_str().unwrap_or("?").to_string(),
                    state.to_string(),
                    node["sandboxes"].to_string(),
                    node["url"].as_str().unwrap_or("?").to_string(),
                ]);
            }
            print!("{}", table.render());
            Ok(exit_code::OK)
        }
        NodesCommand::Drain { node } => {
            let report = client.drain_node(&node).await?;
            if global.json {
                print_json(&report)?;
            } else {
                for moved in report["moved"].as_array().into_iter().flatten() {
                    println!(
                        "{}: moved to {}",
                        moved["sandboxID"].as_str().unwrap_or("?"),
                        moved["to"].as_str().unwrap_or("?")
                    );
                }
                for failed in report["failed"].as_array().into_iter().flatten() {
                    println!(
                        "{}: not moved: {}",
                        failed["sandboxID"].as_str().unwrap_or("?"),
                        failed["error"].as_str().unwrap_or("?")
                    );
                }
                println!("{node}: draining (no new sandboxes)");
            }
            let failed = report["failed"].as_array().is_some_and(|f| !f.is_empty());
            Ok(if failed {
                exit_code::ERROR
            } else {
                exit_code::OK
            })
        }
        NodesCommand::Undrain { node } => {
            client.undrain_node(&node).await?;
            println!("{node}: takes new sandboxes again");
            Ok(exit_code::OK)
        }
    }
}

pub async fn servers(global: &GlobalArgs, command: ServersCommand) -> Result<i32, CommandError> {
    let client = api_client(global)?;
    match command {
        ServersCommand::List => {
            let servers = client.list_servers().await?;
            if global.json {
                print_json(&servers)?;
                return Ok(exit_code::OK);
            }
            let mut table = Table::new(["SERVER", "ROLE", "ADDRESS", "STARTED", "RENEWED"]);
            for server in &servers {
                let mut role = if server["leader"].as_bool() == Some(true) {
                    "leader".to_string()
                } else {
                    "member".to_string()
                };
                if server["this"].as_bool() == Some(true) {
                    role.push_str(" (this)");
                }
                let text = |field: &str| server[field].as_str().unwrap_or("?").to_string();
                table.row([
                    text("serverID"),
                    role,
                    text("address"),
                    text("startedAt"),
                    text("renewedAt"),
                ]);
            }
            print!("{}", table.render());
            Ok(exit_code::OK)
        }
    }
}
