//! `warren sandbox ...`: REST calls for the lifecycle, envd calls for `exec` (and `shell`, in shell.rs).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use serde::Serialize;
use warren_client::types::{NewSandbox, SandboxDetail};
use warren_client::{EnvdClient, ListQuery, ProcessOutput, ProcessSpec};

use super::{api_client, print_json, CommandError};
use crate::args::{CreateArgs, ExecArgs, GlobalArgs, ListArgs, SandboxCommand};
use crate::exit_code;
use crate::table::Table;

/// Timeout `resume` gives a sandbox when none is asked for (E2B's default sandbox timeout).
const DEFAULT_RESUME_TIMEOUT_SECS: u64 = 300;

pub async fn run(global: &GlobalArgs, command: SandboxCommand) -> Result<i32, CommandError> {
    match command {
        SandboxCommand::Create(args) => create(global, args).await,
        SandboxCommand::List(args) => list(global, args).await,
        SandboxCommand::Get { id } => get(global, &id).await,
        SandboxCommand::Kill { ids } => kill(global, &ids).await,
        SandboxCommand::Pause { id } => {
            api_client(global)?.pause_sandbox(&id).await?;
            report(global, &id, "paused")
        }
        SandboxCommand::Resume { id, timeout } => {
            let sandbox = api_client(global)?
                .connect_sandbox(&id, timeout.unwrap_or(DEFAULT_RESUME_TIMEOUT_SECS))
                .await?;
            if global.json {
                print_json(&sandbox)?;
                return Ok(exit_code::OK);
            }
            report(global, &id, "running")
        }
        SandboxCommand::Timeout { id, seconds } => {
            api_client(global)?.set_timeout(&id, seconds).await?;
            report(global, &id, &format!("ends in {seconds}s"))
        }
        SandboxCommand::Exec(args) => exec(global, args).await,
        SandboxCommand::Shell(args) => super::shell::run(global, args).await,
    }
}

#[derive(Debug, Serialize)]
struct Outcome<'a> {
    #[serde(rename = "sandboxID")]
    sandbox_id: &'a str,
    result: &'a str,
}

fn report(global: &GlobalArgs, id: &str, result: &str) -> Result<i32, CommandError> {
    if global.json {
        print_json(&Outcome {
            sandbox_id: id,
            result,
        })?;
    } else {
        println!("{id}: {result}");
    }
    Ok(exit_code::OK)
}

async fn create(global: &GlobalArgs, args: CreateArgs) -> Result<i32, CommandError> {
    let body = NewSandbox {
        template_id: args.template,
        timeout: args.timeout,
        auto_pause: args.auto_pause.then_some(true),
        secure: None,
        allow_internet_access: args.no_internet.then_some(false),
        metadata: args.metadata.into_iter().collect(),
        env_vars: args.env.into_iter().collect(),
    };
    let sandbox = api_client(global)?.create_sandbox(&body).await?;
    if global.json {
        print_json(&sandbox)?;
    } else {
        println!("{}", sandbox.sandbox_id);
    }
    Ok(exit_code::OK)
}

async fn list(global: &GlobalArgs, args: ListArgs) -> Result<i32, CommandError> {
    let query = ListQuery {
        states: args.state,
        metadata: args.metadata.into_iter().collect(),
        limit: args.limit,
    };
    let sandboxes = api_client(global)?.list_sandboxes(&query).await?;
    if global.json {
        print_json(&sandboxes)?;
    } else {
        print!("{}", sandboxes_table(&sandboxes).render());
    }
    Ok(exit_code::OK)
}

pub fn sandboxes_table(sandboxes: &[SandboxDetail]) -> Table {
    let mut table = Table::new([
        "id", "template", "state", "cpu", "memory", "started", "ends", "metadata",
    ]);
    for sandbox in sandboxes {
        table.row([
            sandbox.sandbox_id.clone(),
            sandbox
                .alias
                .clone()
                .unwrap_or_else(|| sandbox.template_id.clone()),
            sandbox.state.clone(),
            sandbox.cpu_count.to_string(),
            format!("{} MiB", sandbox.memory_mb),
            sandbox.started_at.clone(),
            sandbox.end_at.clone(),
            format_metadata(sandbox.metadata.as_ref()),
        ]);
    }
    table
}

fn format_metadata(metadata: Option<&BTreeMap<String, String>>) -> String {
    metadata
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

async fn get(global: &GlobalArgs, id: &str) -> Result<i32, CommandError> {
    let sandbox = api_client(global)?.get_sandbox(id).await?;
    if global.json {
        print_json(&sandbox)?;
    } else {
        print!("{}", sandbox_detail_table(&sandbox).render());
    }
    Ok(exit_code::OK)
}

pub fn sandbox_detail_table(sandbox: &SandboxDetail) -> Table {
    let mut table = Table::new(["field", "value"]);
    table.row(["id", &sandbox.sandbox_id]);
    table.row(["template", &sandbox.template_id]);
    if let Some(alias) = &sandbox.alias {
        table.row(["alias", alias]);
    }
    table.row(["state", &sandbox.state]);
    table.row(["cpu", &sandbox.cpu_count.to_string()]);
    table.row(["memory", &format!("{} MiB", sandbox.memory_mb)]);
    table.row(["disk", &format!("{} MiB", sandbox.disk_size_mb)]);
    table.row(["started", &sandbox.started_at]);
    table.row(["ends", &sandbox.end_at]);
    table.row(["envd", &sandbox.envd_version]);
    table.row(["metadata", &format_metadata(sandbox.metadata.as_ref())]);
    table
}

/// Kills every listed sandbox even when some fail; exits with the first failure's code.
async fn kill(global: &GlobalArgs, ids: &[String]) -> Result<i32, CommandError> {
    let client = api_client(global)?;
    let mut code = exit_code::OK;
    let mut outcomes = Vec::new();
    for id in ids {
        match client.kill_sandbox(id).await {
            Ok(()) => outcomes.push(serde_json::json!({ "sandboxID": id, "result": "killed" })),
            Err(err) => {
                if code == exit_code::OK {
                    code = exit_code::for_kind(err.kind());
                }
                if !global.json {
                    eprintln!("warren: {id}: {err}");
                }
                outcomes.push(serde_json::json!({ "sandboxID": id, "error": err.to_string() }));
                continue;
            }
        }
        if !global.json {
            println!("{id}: killed");
        }
    }
    if global.json {
        print_json(&outcomes)?;
    }
    Ok(code)
}

/// Finds the sandbox's envd access token (present when it was created `secure`) and builds a client.
pub async fn envd_client(
    global: &GlobalArgs,
    id: &str,
    user: &str,
) -> Result<EnvdClient, CommandError> {
    let detail = api_client(global)?.get_sandbox(id).await?;
    Ok(EnvdClient::new(
        &global.sandbox_url,
        id,
        detail.envd_access_token.as_deref(),
        user,
    )?)
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct ExecResult {
    stdout: String,
    stderr: String,
    exit_code: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

async fn exec(global: &GlobalArgs, args: ExecArgs) -> Result<i32, CommandError> {
    let envd = envd_client(global, &args.id, &args.user).await?;
    let mut spec = ProcessSpec::shell_command(&args.command.join(" "));
    spec.cwd = args.cwd;
    spec.envs = args.env.into_iter().collect::<HashMap<_, _>>();
    let mut stream = envd.start(&spec).await?;
    let mut result = ExecResult::default();
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    while let Some(event) = stream.next().await? {
        match event {
            ProcessOutput::Started { .. } => {}
            ProcessOutput::Stdout(bytes) | ProcessOutput::Pty(bytes) if global.json => {
                result.stdout.push_str(&String::from_utf8_lossy(&bytes));
            }
            ProcessOutput::Stderr(bytes) if global.json => {
                result.stderr.push_str(&String::from_utf8_lossy(&bytes))
            }
            ProcessOutput::Stdout(bytes) | ProcessOutput::Pty(bytes) => {
                stdout
                    .write_all(&bytes)
                    .and_then(|()| stdout.flush())
                    .map_err(CommandError::Output)?;
            }
            ProcessOutput::Stderr(bytes) => {
                stderr
                    .write_all(&bytes)
                    .and_then(|()| stderr.flush())
                    .map_err(CommandError::Output)?;
            }
            ProcessOutput::Ended(end) => {
                result.exit_code = end.shell_exit_code();
                result.error = end.error;
                break;
            }
        }
    }
    if global.json {
        print_json(&result)?;
    } else if let Some(error) = &result.error {
        eprintln!("warren: {error}");
    }
    Ok(result.exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(id: &str, state: &str) -> SandboxDetail {
        SandboxDetail {
            template_id: "base".into(),
            sandbox_id: id.into(),
            client_id: String::new(),
            alias: None,
            started_at: "2026-12-02T13:00:00Z".into(),
            end_at: "2026-12-02T13:05:00Z".into(),
            cpu_count: 2,
            memory_mb: 512,
            disk_size_mb: 1024,
            state: state.into(),
            envd_version: "0.6.4".into(),
            envd_access_token: None,
            metadata: Some(BTreeMap::from([
                ("a".into(), "1".into()),
                ("b".into(), "2".into()),
            ])),
        }
    }

    #[test]
    fn list_table_has_one_row_per_sandbox() {
        let text =
            sandboxes_table(&[detail("sbx-a", "running"), detail("sbx-bb", "paused")]).render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("ID      TEMPLATE  STATE"), "{text}");
        assert!(
            lines[1].starts_with("sbx-a   base      running  2    512 MiB"),
            "{text}"
        );
        assert!(
            lines[2].contains("paused") && lines[2].ends_with("a=1,b=2"),
            "{text}"
        );
    }

    #[test]
    fn detail_table_lists_fields() {
        let text = sandbox_detail_table(&detail("sbx-a", "running")).render();
        assert!(text.contains("state     running\n"), "{text}");
        assert!(text.contains("memory    512 MiB\n"), "{text}");
        assert!(!text.contains("alias"), "{text}");
    }
}
