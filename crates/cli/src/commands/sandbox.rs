//! `warren sandbox ...`: REST calls for the lifecycle, envd calls for `exec` (and `shell`, in shell.rs).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use warren_client::types::{ListedSandbox, NewSandbox, SandboxDetail};
use warren_client::{EnvdClient, ListQuery, ProcessOutput, ProcessSpec};

use super::{api_client, print_json, CommandError};
use crate::args::{CreateArgs, ExecArgs, GlobalArgs, ListArgs, SandboxCommand};
use crate::exit_code;
use crate::table::Table;

/// Timeout `resume` gives a sandbox when none is asked for (E2B's default sandbox timeout).
const DEFAULT_RESUME_TIMEOUT_SECS: u32 = 300;

pub async fn run(global: &GlobalArgs, command: SandboxCommand) -> Result<i32, CommandError> {
    match command {
        SandboxCommand::Create(args) => create(global, args).await,
        SandboxCommand::List(args) => list(global, args).await,
        SandboxCommand::Get { id } => get(global, &id).await,
        SandboxCommand::Kill { ids } => kill(global, &ids).await,
        SandboxCommand::Pause {
            id,
            files_only,
            strict,
        } => {
            let request = warren_client::types::SandboxPauseRequest {
                memory: files_only.then_some(false),
                require_healthy_guest: strict.then_some(true),
            };
            api_client(global)?.pause_sandbox_as(&id, &request).await?;
            report(global, &id, "paused")
        }
        SandboxCommand::Migrate { id } => {
            let moved = api_client(global)?.migrate_sandbox(&id).await?;
            if global.json {
                print_json(&moved)?;
            } else {
                let text = |key: &str| moved[key].as_str().unwrap_or("?").to_string();
                println!("{id}: moved from {} to {}", text("from"), text("to"));
            }
            Ok(exit_code::OK)
        }
        SandboxCommand::Resume {
            id,
            timeout,
            reboot,
        } => {
            let body = warren_client::types::ConnectSandbox {
                timeout: Some(timeout.unwrap_or(DEFAULT_RESUME_TIMEOUT_SECS).into()),
                memory: reboot.then_some(false),
                ..Default::default()
            };
            let sandbox = api_client(global)?.connect_sandbox_as(&id, &body).await?;
            if global.json {
                print_json(&sandbox)?;
                return Ok(exit_code::OK);
            }
            report(global, &id, "running")
        }
        SandboxCommand::Timeout { id, seconds } => {
            api_client(global)?.set_timeout(&id, seconds.into()).await?;
            report(global, &id, &format!("ends in {seconds}s"))
        }
        SandboxCommand::Exec(args) => exec(global, args).await,
        SandboxCommand::Shell(args) => super::shell::run(global, args).await,
        SandboxCommand::Top { id } => top(global, &id).await,
        SandboxCommand::KillProcess { id, pid, signal } => {
            api_client(global)?
                .signal_process(&id, pid, &signal)
                .await?;
            report(
                global,
                &id,
                &format!("sent SIG{} to pid {pid}", signal.to_uppercase()),
            )
        }
        SandboxCommand::Metrics { id, since } => metrics(global, &id, since).await,
        SandboxCommand::Logs(args) => super::logs::run(global, args).await,
        SandboxCommand::Du { id, count } => du(global, &id, count).await,
        SandboxCommand::Orphans { id, kill } => orphans(global, &id, kill).await,
    }
}

async fn top(global: &GlobalArgs, id: &str) -> Result<i32, CommandError> {
    let processes = api_client(global)?.sandbox_processes(id).await?;
    print_processes(global, &processes)
}

async fn orphans(global: &GlobalArgs, id: &str, kill: bool) -> Result<i32, CommandError> {
    let processes = api_client(global)?.sandbox_orphans(id, kill).await?;
    if kill && !global.json {
        println!("killed {} orphaned process(es)", processes.len());
    }
    print_processes(global, &processes)
}

fn print_processes(
    global: &GlobalArgs,
    processes: &[warren_client::types::SandboxProcess],
) -> Result<i32, CommandError> {
    if global.json {
        print_json(&processes)?;
        return Ok(exit_code::OK);
    }
    let mut table = Table::new(["pid", "ppid", "user", "cpu", "rss", "started", "command"]);
    for p in processes {
        table.row([
            p.pid.to_string(),
            p.ppid.to_string(),
            p.user.clone(),
            format!("{:.1}%", p.cpu_percent),
            format!("{:.1} MiB", p.rss_bytes as f64 / 1048576.0),
            format_time(&p.started_at),
            p.command.clone(),
        ]);
    }
    print!("{}", table.render());
    Ok(exit_code::OK)
}

async fn du(global: &GlobalArgs, id: &str, count: usize) -> Result<i32, CommandError> {
    let usage = api_client(global)?.sandbox_disk_usage(id, count).await?;
    if global.json {
        print_json(&usage)?;
        return Ok(exit_code::OK);
    }
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / 1048576.0);
    println!(
        "{} of {} used",
        mib(usage.used_bytes),
        mib(usage.total_bytes)
    );
    let mut table = Table::new(["size", "path"]);
    for file in &usage.largest {
        table.row([mib(file.bytes), file.path.clone()]);
    }
    print!("{}", table.render());
    Ok(exit_code::OK)
}

async fn metrics(global: &GlobalArgs, id: &str, since: Option<u64>) -> Result<i32, CommandError> {
    let start = since.map(|s| chrono::Utc::now().timestamp() - s as i64);
    let samples = api_client(global)?.sandbox_metrics(id, start).await?;
    if global.json {
        print_json(&samples)?;
        return Ok(exit_code::OK);
    }
    let mib = |bytes: u64| format!("{:.0} MiB", bytes as f64 / 1048576.0);
    let mut table = Table::new(["time", "cpu", "memory", "cache", "disk", "net in / out"]);
    for s in &samples {
        table.row([
            format_time(&s.timestamp),
            format!("{:.1}% of {}", s.cpu_used_pct, s.cpu_count),
            format!("{} / {}", mib(s.mem_used), mib(s.mem_total)),
            mib(s.mem_cache),
            format!("{} / {}", mib(s.disk_used), mib(s.disk_total)),
            format!("{} / {}", mib(s.net_rx_bytes), mib(s.net_tx_bytes)),
        ]);
    }
    print!("{}", table.render());
    Ok(exit_code::OK)
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
        timeout: args.timeout.map(i64::from),
        auto_pause: args.auto_pause.then_some(true),
        auto_pause_memory: None,
        auto_resume: None,
        secure: None,
        allow_internet_access: args.no_internet.then_some(false),
        metadata: (!args.metadata.is_empty()).then(|| args.metadata.into_iter().collect()),
        env_vars: (!args.env.is_empty()).then(|| args.env.into_iter().collect()),
        ..NewSandbox::default()
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

pub fn sandboxes_table(sandboxes: &[ListedSandbox]) -> Table {
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
            sandbox.state.as_str().to_string(),
            sandbox.cpu_count.to_string(),
            format!("{} MiB", sandbox.memory_mb),
            format_time(&sandbox.started_at),
            format_time(&sandbox.end_at),
            format_metadata(&sandbox.metadata),
        ]);
    }
    table
}

fn format_metadata(metadata: &BTreeMap<String, String>) -> String {
    metadata
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// RFC 3339 in UTC to the second: `2026-12-02T13:00:00Z`.
pub fn format_time(time: &DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Secs, true)
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
    table.row(["state", sandbox.state.as_str()]);
    table.row(["cpu", &sandbox.cpu_count.to_string()]);
    table.row(["memory", &format!("{} MiB", sandbox.memory_mb)]);
    table.row(["disk", &format!("{} MiB", sandbox.disk_size_mb)]);
    table.row(["started", &format_time(&sandbox.started_at)]);
    table.row(["ends", &format_time(&sandbox.end_at)]);
    table.row(["envd", &sandbox.envd_version]);
    table.row(["metadata", &format_metadata(&sandbox.metadata)]);
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
    spec.stdin = args.stdin;
    let mut stream = envd.start(&spec).await?;
    let mut result = ExecResult::default();
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut stdin_task = None;
    while let Some(event) = stream.next().await? {
        match event {
            ProcessOutput::Started { pid } if args.stdin => {
                stdin_task = Some(tokio::spawn(forward_stdin(envd.clone(), pid)));
            }
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
                // envd repeats the status ("exit status 7") as the error of a failed command; only
                // something beyond that (a signal, a failure to start) is worth printing.
                result.error = end.error.filter(|error| *error != end.status);
                break;
            }
        }
    }
    if let Some(task) = stdin_task {
        task.abort();
    }
    if global.json {
        print_json(&result)?;
    } else if let Some(error) = &result.error {
        eprintln!("warren: {error}");
    }
    Ok(result.exit_code)
}

/// Copies local stdin to the process, then closes its stdin. Stops quietly when the process is gone
/// (it may exit before reading everything, like `head`).
async fn forward_stdin(envd: warren_client::EnvdClient, pid: u32) {
    use tokio::io::AsyncReadExt;
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if envd.send_stdin(pid, buf[..n].to_vec()).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = envd.close_stdin(pid).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_client::types::SandboxState;

    fn time(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("valid time")
            .with_timezone(&Utc)
    }

    fn listed(id: &str, state: SandboxState) -> ListedSandbox {
        ListedSandbox {
            template_id: "base".into(),
            sandbox_id: id.into(),
            client_id: String::new(),
            started_at: time("2026-12-02T13:00:00.250Z"),
            end_at: time("2026-12-02T13:05:00Z"),
            cpu_count: 2,
            memory_mb: 512,
            disk_size_mb: 1024,
            state,
            envd_version: "0.6.4".into(),
            alias: None,
            metadata: BTreeMap::from([("a".into(), "1".into()), ("b".into(), "2".into())]),
        }
    }

    #[test]
    fn list_table_has_one_row_per_sandbox() {
        let rows = [
            listed("sbx-a", SandboxState::Running),
            listed("sbx-bb", SandboxState::Paused),
        ];
        let text = sandboxes_table(&rows).render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("ID      TEMPLATE  STATE"), "{text}");
        assert!(
            lines[1].starts_with(
                "sbx-a   base      running  2    512 MiB  2026-12-02T13:00:00Z  2026-12-02T13:05:00Z"
            ),
            "{text}"
        );
        assert!(
            lines[2].contains("paused") && lines[2].ends_with("a=1,b=2"),
            "{text}"
        );
    }

    #[test]
    fn detail_table_lists_fields() {
        let detail: SandboxDetail = serde_json::from_value(serde_json::json!({
            "templateID": "base", "sandboxID": "sbx-a", "clientID": "c",
            "startedAt": "2026-12-02T13:00:00Z", "endAt": "2026-12-02T13:05:00Z",
            "envdVersion": "0.6.4", "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024, "state": "running"
        }))
        .expect("the server's JSON");
        let text = sandbox_detail_table(&detail).render();
        assert!(text.contains("state     running\n"), "{text}");
        assert!(text.contains("memory    512 MiB\n"), "{text}");
        assert!(text.contains("ends      2026-12-02T13:05:00Z\n"), "{text}");
        assert!(!text.contains("alias"), "{text}");
    }
}
