//! `warren lab start|status|check|reset|stop`: a capture-the-flag course in a running sandbox
//! (docs/lab.md).
//!
//! The course app (`app/lab_app.py`, Python standard library) is built into a template whose start
//! command it is, so sandboxes restore it running. The host keeps a per-lab secret in the lab file;
//! each level's flag is an HMAC of it, and the app only ever holds the flags' SHA-256, so nothing in
//! the sandbox reveals a flag before `warren lab check` (the judge, [`judge`]) has seen the level
//! solved and handed the flag to the app.

mod judge;
mod record;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use warren_client::types::{NewSandbox, SandboxState, TemplateBuildRequest, TemplateBuildStatus};
use warren_client::{ApiClient, ErrorKind, ListQuery, SandboxPortClient};

use super::template::{follow, pack_context};
use super::{api_client, print_json, CommandError};
use crate::args::{GlobalArgs, LabArgs, LabCommand};
use crate::exit_code;
use crate::table::Table;
pub use record::LabRecord;

/// The port the app listens on inside the sandbox.
pub const APP_PORT: u16 = 8080;
/// Metadata every sandbox of a lab carries (forks inherit it): `warren-lab=<lab id>`.
pub const LAB_LABEL: &str = "warren-lab";
/// Seconds the lab sandbox runs from each `start`; it pauses (with its memory) at the end.
const LAB_TIMEOUT_SECS: i64 = 3600;
/// How long to wait for the app to answer after a create or resume.
const APP_WAIT: Duration = Duration::from_secs(120);

const APP_SOURCE: &str = include_str!("app/lab_app.py");
const COURSE_TEXT: &str = include_str!("../../../../../docs/lab.md");
const DOCKERFILE: &str = "FROM debian:bookworm\n\
COPY lab_app.py lab.md template-canary.txt /opt/warren-lab/\n";
const START_CMD: &str = "python3 /opt/warren-lab/lab_app.py";
const READY_CMD: &str = "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8080/api/progress', timeout=2)\"";

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("no lab is running (lab file {0}): run `warren lab start`")]
    NoLab(PathBuf),
    #[error("lab file {path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("lab file {path} is not a lab record")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("writing the lab's build context in {path}")]
    Context {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the lab template's build failed: {0}")]
    Build(String),
    #[error("the lab app in sandbox {0} did not answer within {1:?}")]
    AppSilent(String, Duration),
    #[error("no level {0}: levels are 1 to 12")]
    NoLevel(u32),
}

pub async fn run(global: &GlobalArgs, command: LabCommand) -> Result<i32, CommandError> {
    let client = api_client(global)?;
    match command {
        LabCommand::Start(args) => start(global, &client, &args).await,
        LabCommand::Status(args) => status(global, &client, &args).await,
        LabCommand::Check { level, answer, lab } => {
            check(global, &client, &lab, level, answer.as_deref()).await
        }
        LabCommand::Reset(args) => {
            let path = record::path(&args);
            if let Some(lab) = LabRecord::load(&path)? {
                stop_lab(&client, &lab).await;
                record::remove(&path)?;
            }
            start(global, &client, &args).await
        }
        LabCommand::Stop(args) => stop(global, &client, &args).await,
    }
}

/// Builds (once) the lab template, creates or resumes the player's sandbox, prints its URL.
async fn start(
    global: &GlobalArgs,
    client: &ApiClient,
    args: &LabArgs,
) -> Result<i32, CommandError> {
    let path = record::path(args);
    if let Some(lab) = LabRecord::load(&path)? {
        match client.get_sandbox(&lab.sandbox_id).await {
            Ok(detail) if matches!(detail.state, SandboxState::Running | SandboxState::Paused) => {
                client
                    .connect_sandbox(&lab.sandbox_id, LAB_TIMEOUT_SECS)
                    .await?;
                let app = app_client(global, &lab.sandbox_id)?;
                wait_for_app(&app, &lab.sandbox_id).await?;
                announce(global, &lab, detail.domain.as_deref(), "resumed")?;
                return Ok(exit_code::OK);
            }
            Ok(_) => {}
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(err) => return Err(err.into()),
        }
        if !global.json {
            println!(
                "the lab's sandbox {} is gone: starting a new lab",
                lab.sandbox_id
            );
        }
        stop_lab(client, &lab).await;
        record::remove(&path)?;
    }
    let template_id = ensure_template(client, global.json).await?;
    let mut lab = LabRecord::new(&template_id);
    let body = NewSandbox {
        template_id: template_id.clone(),
        timeout: Some(LAB_TIMEOUT_SECS),
        auto_pause: Some(true),
        metadata: Some([(LAB_LABEL.to_string(), lab.lab_id.clone())].into()),
        ..NewSandbox::default()
    };
    let sandbox = client.create_sandbox(&body).await?;
    lab.sandbox_id = sandbox.sandbox_id.clone();
    lab.save(&path)?;
    let app = app_client(global, &lab.sandbox_id)?;
    wait_for_app(&app, &lab.sandbox_id).await?;
    let hashes: serde_json::Map<String, serde_json::Value> = (1..=judge::LEVELS)
        .map(|n| (n.to_string(), json!(judge::sha256_hex(&lab.flag(n)))))
        .collect();
    let _: serde_json::Value = app
        .post_json(
            "/api/setup",
            &json!({ "labID": lab.lab_id, "sandboxID": lab.sandbox_id, "hashes": hashes }),
        )
        .await?;
    announce(global, &lab, sandbox.domain.as_deref(), "started")?;
    Ok(exit_code::OK)
}

fn announce(
    global: &GlobalArgs,
    lab: &LabRecord,
    domain: Option<&str>,
    what: &str,
) -> Result<(), CommandError> {
    let urls = lab_urls(&global.sandbox_url, &lab.sandbox_id, domain);
    if global.json {
        return print_json(&json!({
            "labID": lab.lab_id, "sandboxID": lab.sandbox_id, "templateID": lab.template_id,
            "url": urls.0, "proxyURL": global.sandbox_url, "state": what,
        }));
    }
    println!("lab {what}: sandbox {}", lab.sandbox_id);
    println!("  open       {}", urls.0);
    println!("  or         {}", urls.1);
    println!("  then solve a level and run `warren lab check N`");
    Ok(())
}

/// The app's URL by host name through the proxy (`http://<port>-<id>.<domain>[:proxy port]/`) and the
/// header form for clients that cannot resolve that name.
fn lab_urls(sandbox_url: &str, sandbox_id: &str, domain: Option<&str>) -> (String, String) {
    let parsed = url::Url::parse(sandbox_url).ok();
    let scheme = parsed.as_ref().map_or("http", |u| u.scheme()).to_string();
    let port = parsed
        .as_ref()
        .and_then(|u| u.port())
        .map(|p| format!(":{p}"))
        .unwrap_or_default();
    let domain = domain.unwrap_or("localhost");
    (
        format!("{scheme}://{APP_PORT}-{sandbox_id}.{domain}{port}/"),
        format!(
            "curl -H 'E2b-Sandbox-Id: {sandbox_id}' -H 'E2b-Sandbox-Port: {APP_PORT}' {}/",
            sandbox_url.trim_end_matches('/')
        ),
    )
}

fn app_client(global: &GlobalArgs, sandbox_id: &str) -> Result<SandboxPortClient, CommandError> {
    Ok(SandboxPortClient::new(
        &global.sandbox_url,
        sandbox_id,
        APP_PORT,
    )?)
}

async fn wait_for_app(app: &SandboxPortClient, sandbox_id: &str) -> Result<(), CommandError> {
    let deadline = Instant::now() + APP_WAIT;
    loop {
        if app
            .get_json::<serde_json::Value>("/api/progress")
            .await
            .is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(LabError::AppSilent(sandbox_id.to_string(), APP_WAIT).into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The lab template's ID: built from the context embedded in this binary, named after its hash, so
/// it is built once per version of the lab and found again afterwards.
async fn ensure_template(client: &ApiClient, quiet: bool) -> Result<String, CommandError> {
    let dir = std::env::temp_dir().join(format!("warren-lab-context-{}", std::process::id()));
    let written = write_context(&dir);
    let packed = written.and_then(|()| pack_context(&dir).map_err(CommandError::from));
    let _ = std::fs::remove_dir_all(&dir);
    let (archive, hash) = packed?;
    let alias = format!("warren-lab-{}", &hash[..12]);
    let templates = client.list_templates().await?;
    if let Some(ready) = templates
        .iter()
        .find(|t| t.aliases.contains(&alias) && t.build_status == TemplateBuildStatus::Ready)
    {
        return Ok(ready.template_id.clone());
    }
    let request = TemplateBuildRequest {
        dockerfile: DOCKERFILE.to_string(),
        alias: Some(alias.clone()),
        start_cmd: Some(START_CMD.to_string()),
        ready_cmd: Some(READY_CMD.to_string()),
        cpu_count: None,
        memory_mb: None,
        context_hash: Some(hash.clone()),
        privileges: None,
    };
    let requested = client.request_dockerfile_build(&request).await?;
    let link = client
        .template_files_link(&requested.template_id, &hash)
        .await?;
    if let (false, Some(url)) = (link.present, link.url) {
        client.upload_template_files(&url, archive).await?;
    }
    client
        .start_dockerfile_build(&requested.template_id, &requested.build_id)
        .await?;
    if !quiet {
        println!("building the lab template {alias} (once)");
    }
    let info = follow(client, &requested.template_id, &requested.build_id, quiet).await?;
    if info.status != TemplateBuildStatus::Ready {
        let reason = info
            .reason
            .map_or_else(|| "no reason given".to_string(), |r| r.message);
        return Err(LabError::Build(reason).into());
    }
    Ok(requested.template_id)
}

fn write_context(dir: &Path) -> Result<(), CommandError> {
    let context_err = |source| LabError::Context {
        path: dir.to_path_buf(),
        source,
    };
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(context_err)?;
    for (name, text) in [
        ("e2b.Dockerfile", DOCKERFILE),
        ("lab_app.py", APP_SOURCE),
        ("lab.md", COURSE_TEXT),
        ("template-canary.txt", judge::CANARY_TEXT),
    ] {
        std::fs::write(dir.join(name), text).map_err(context_err)?;
    }
    Ok(())
}

async fn status(
    global: &GlobalArgs,
    client: &ApiClient,
    args: &LabArgs,
) -> Result<i32, CommandError> {
    let path = record::path(args);
    let lab = LabRecord::load(&path)?.ok_or(LabError::NoLab(path))?;
    let state = match client.get_sandbox(&lab.sandbox_id).await {
        Ok(detail) => detail.state.as_str().to_string(),
        Err(err) if err.kind() == ErrorKind::NotFound => "gone".to_string(),
        Err(err) => return Err(err.into()),
    };
    // Progress lives in the sandbox: a paused one is resumed to read it (`warren lab start` does too).
    let progress = if state == "running" {
        let app = app_client(global, &lab.sandbox_id)?;
        Some(app.get_json::<serde_json::Value>("/api/progress").await?)
    } else {
        None
    };
    let levels: Vec<serde_json::Value> = (1..=judge::LEVELS)
        .map(|n| {
            let entry = progress
                .as_ref()
                .and_then(|p| p["levels"].get(n.to_string()))
                .cloned()
                .unwrap_or_default();
            let submitted = entry["solved"].as_str();
            // The sandbox's word is checked against the secret only the host has.
            let verdict = match submitted {
                Some(flag) if flag == lab.flag(n) => "solved",
                Some(_) => "forged",
                None if progress.as_ref().and_then(|p| p["current"].as_u64())
                    == Some(u64::from(n)) =>
                {
                    "open"
                }
                None if progress.is_some() => "locked",
                None => "unknown",
            };
            json!({
                "level": n,
                "title": entry["title"].as_str().unwrap_or(judge::title(n)),
                "state": verdict,
                "skipped": entry["skipped"],
            })
        })
        .collect();
    if global.json {
        print_json(&json!({
            "labID": lab.lab_id, "sandboxID": lab.sandbox_id, "sandboxState": state,
            "levels": levels,
        }))?;
        return Ok(exit_code::OK);
    }
    println!("lab {} in sandbox {} ({state})", lab.lab_id, lab.sandbox_id);
    if progress.is_none() {
        println!("its progress is inside the sandbox: `warren lab start` resumes it");
    }
    let mut table = Table::new(["level", "title", "state"]);
    for level in &levels {
        let mut state = level["state"].as_str().unwrap_or("").to_string();
        if level["skipped"].is_string() {
            state.push_str(" (skipped: the server lacks the feature)");
        }
        table.row([
            level["level"].to_string(),
            level["title"].as_str().unwrap_or("").to_string(),
            state,
        ]);
    }
    print!("{}", table.render());
    Ok(exit_code::OK)
}

async fn check(
    global: &GlobalArgs,
    client: &ApiClient,
    args: &LabArgs,
    level: u32,
    answer: Option<&str>,
) -> Result<i32, CommandError> {
    if !(1..=judge::LEVELS).contains(&level) {
        return Err(LabError::NoLevel(level).into());
    }
    let path = record::path(args);
    let mut lab = LabRecord::load(&path)?.ok_or(LabError::NoLab(path.clone()))?;
    let app = app_client(global, &lab.sandbox_id)?;
    let progress: serde_json::Value = app.get_json("/api/progress").await?;
    let current = progress["current"].as_u64().unwrap_or(0);
    if u64::from(level) > current {
        return finish(
            global,
            level,
            judge::Verdict::NotYet(format!(
                "level {level} is locked: solve level {current} first"
            )),
        );
    }
    let judge = judge::Judge {
        client,
        app: &app,
        sandbox_url: &global.sandbox_url,
        answer,
    };
    let verdict = judge.check(&mut lab, level).await?;
    lab.save(&path)?;
    if let judge::Verdict::Solved | judge::Verdict::Skipped(_) = &verdict {
        let skipped = match &verdict {
            judge::Verdict::Skipped(reason) => Some(reason.clone()),
            _ => None,
        };
        let _: serde_json::Value = app
            .post_json(
                &format!("/api/reveal/{level}"),
                &json!({ "flag": lab.flag(level), "skipped": skipped }),
            )
            .await?;
    }
    let flag = matches!(verdict, judge::Verdict::Solved | judge::Verdict::Skipped(_))
        .then(|| lab.flag(level));
    if global.json {
        let (state, message) = verdict.parts();
        print_json(&json!({ "level": level, "state": state, "message": message, "flag": flag }))?;
        return Ok(if flag.is_some() {
            exit_code::OK
        } else {
            exit_code::ERROR
        });
    }
    let code = finish(global, level, verdict)?;
    if let Some(flag) = flag {
        println!(
            "flag: {flag}  (also on the level's page; submit it there to unlock the next level)"
        );
    }
    Ok(code)
}

fn finish(global: &GlobalArgs, level: u32, verdict: judge::Verdict) -> Result<i32, CommandError> {
    let (state, message) = verdict.parts();
    if global.json {
        print_json(&json!({ "level": level, "state": state, "message": message, "flag": null }))?;
    } else {
        println!("level {level}: {state}: {message}");
    }
    Ok(if state == "not yet" {
        exit_code::ERROR
    } else {
        exit_code::OK
    })
}

async fn stop(
    global: &GlobalArgs,
    client: &ApiClient,
    args: &LabArgs,
) -> Result<i32, CommandError> {
    let path = record::path(args);
    let Some(lab) = LabRecord::load(&path)? else {
        if !global.json {
            println!("no lab to stop");
        }
        return Ok(exit_code::OK);
    };
    let killed = stop_lab(client, &lab).await;
    record::remove(&path)?;
    if global.json {
        print_json(&json!({ "labID": lab.lab_id, "killed": killed }))?;
    } else {
        println!(
            "lab {} stopped: {} sandbox(es) killed; the template stays for the next start",
            lab.lab_id,
            killed.len()
        );
    }
    Ok(exit_code::OK)
}

/// Kills every sandbox the lab made or had made: its own, its forks (they carry its label), the
/// leaked ones of level 12, the workspace users' of level 9, a level-10 second sandbox.
async fn stop_lab(client: &ApiClient, lab: &LabRecord) -> Vec<String> {
    let mut ids = vec![lab.sandbox_id.clone()];
    let query = ListQuery {
        metadata: [(LAB_LABEL.to_string(), lab.lab_id.clone())].into(),
        ..ListQuery::default()
    };
    if let Ok(listed) = client.list_sandboxes(&query).await {
        ids.extend(listed.into_iter().map(|s| s.sandbox_id));
    }
    ids.extend(lab.leaked.iter().cloned());
    for user in judge::workspace_users(lab) {
        if let Ok(history) = client.workspace_history(&user).await {
            ids.extend(history.sandbox_id);
        }
    }
    ids.sort();
    ids.dedup();
    let mut killed = Vec::new();
    for id in ids {
        if client.kill_sandbox(&id).await.is_ok() {
            killed.push(id);
        }
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_app_port_and_keep_the_proxy_port() {
        let (by_name, by_header) = lab_urls("http://127.0.0.1:3001", "abc", None);
        assert_eq!(by_name, "http://8080-abc.localhost:3001/");
        assert!(by_header.contains("E2b-Sandbox-Id: abc"), "{by_header}");
        assert!(by_header.ends_with("http://127.0.0.1:3001/"), "{by_header}");
        let (by_name, _) = lab_urls("https://api.example.com", "abc", Some("example.com"));
        assert_eq!(by_name, "https://8080-abc.example.com/");
    }

    #[test]
    fn the_context_holds_the_app_the_course_and_the_canary() {
        let dir = std::env::temp_dir().join(format!("warren-lab-test-{}", std::process::id()));
        write_context(&dir).expect("writes");
        let (_, first) = pack_context(&dir).expect("packs");
        write_context(&dir).expect("writes again");
        let (_, second) = pack_context(&dir).expect("packs again");
        assert_eq!(first, second, "the template name must be stable");
        assert!(std::fs::read_to_string(dir.join("lab.md"))
            .unwrap()
            .contains("warren lab"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
