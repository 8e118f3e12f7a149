//! `warren template list`, `warren template build DIR` (through the server's build API: the directory
//! is uploaded as the build context, the build is started and its log followed) and `warren template
//! delete`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use warren_client::types::{
    BuildLogEntry, Template, TemplateBuildInfo, TemplateBuildRequest, TemplateBuildStatus,
};
use warren_client::ApiClient;
use warren_server::templates::builder::e2b_toml::{E2bToml, E2bTomlError};

use super::sandbox::format_time;
use super::{api_client, print_json, CommandError};
use crate::args::{GlobalArgs, TemplateBuildArgs, TemplateCommand};
use crate::exit_code;
use crate::table::Table;

/// How often a build's status is polled (as the SDK does).
const POLL_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Toml {
        path: PathBuf,
        #[source]
        source: E2bTomlError,
    },
    #[error("no Dockerfile in {0}: expected e2b.Dockerfile or Dockerfile (or pass --dockerfile)")]
    NoDockerfile(PathBuf),
    #[error("cannot name the template: pass --name")]
    NoName,
    #[error("packing the build context {path}: {source}")]
    Pack {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("build {build_id} of template {template_id} failed: {message}")]
    BuildFailed {
        template_id: String,
        build_id: String,
        message: String,
    },
}

pub async fn run(global: &GlobalArgs, command: TemplateCommand) -> Result<i32, CommandError> {
    match command {
        TemplateCommand::List => {
            let templates = api_client(global)?.list_templates().await?;
            if global.json {
                print_json(&templates)?;
            } else {
                print!("{}", templates_table(&templates).render());
            }
            Ok(exit_code::OK)
        }
        TemplateCommand::Build(args) => build(global, args).await,
        TemplateCommand::Delete { template, force } => {
            api_client(global)?
                .delete_template(&template, force)
                .await?;
            if !global.json {
                println!("deleted template {template}");
            }
            Ok(exit_code::OK)
        }
    }
}

/// The build request a template directory and the command-line overrides make.
pub fn build_request(args: &TemplateBuildArgs) -> Result<TemplateBuildRequest, TemplateError> {
    let toml_path = args.dir.join("e2b.toml");
    let config = match std::fs::read_to_string(&toml_path) {
        Ok(text) => E2bToml::parse(&text).map_err(|source| TemplateError::Toml {
            path: toml_path.clone(),
            source,
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => E2bToml::default(),
        Err(source) => {
            return Err(TemplateError::Read {
                path: toml_path,
                source,
            })
        }
    };
    let candidates: Vec<PathBuf> = match (&args.dockerfile, &config.dockerfile) {
        (Some(path), _) => vec![path.clone()],
        (None, Some(name)) => vec![args.dir.join(name)],
        (None, None) => vec![args.dir.join("e2b.Dockerfile"), args.dir.join("Dockerfile")],
    };
    let dockerfile_path = candidates
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| TemplateError::NoDockerfile(args.dir.clone()))?;
    let dockerfile =
        std::fs::read_to_string(&dockerfile_path).map_err(|source| TemplateError::Read {
            path: dockerfile_path.clone(),
            source,
        })?;
    let dir_name = std::fs::canonicalize(&args.dir)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_lowercase()));
    let name = args
        .name
        .clone()
        .or(config.template_name.clone())
        .or(dir_name)
        .ok_or(TemplateError::NoName)?;
    Ok(TemplateBuildRequest {
        dockerfile,
        alias: Some(name),
        start_cmd: args.start_cmd.clone().or(config.start_cmd),
        ready_cmd: args.ready_cmd.clone().or(config.ready_cmd),
        cpu_count: args.cpu_count.or(config.cpu_count),
        memory_mb: args.memory_mb.or(config.memory_mb),
        context_hash: None,
        privileges: (args.allow_raw_sockets || args.allow_io_uring).then_some(
            warren_client::types::TemplatePrivileges {
                raw_sockets: args.allow_raw_sockets,
                io_uring: args.allow_io_uring,
            },
        ),
    })
}

/// The build context as a gzipped tar with fixed timestamps and owners (the same files give the same
/// archive, so an unchanged context is not uploaded twice), and its SHA-256.
pub fn pack_context(dir: &Path) -> Result<(Vec<u8>, String), TemplateError> {
    let pack_err = |source| TemplateError::Pack {
        path: dir.to_path_buf(),
        source,
    };
    let encoder = flate2::GzBuilder::new().write(Vec::new(), flate2::Compression::fast());
    let mut archive = tar::Builder::new(encoder);
    archive.mode(tar::HeaderMode::Deterministic);
    archive.follow_symlinks(false);
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(dir.join(&relative))
            .map_err(pack_err)?
            .collect::<Result<_, _>>()
            .map_err(pack_err)?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries.into_iter().rev() {
            let name = relative.join(entry.file_name());
            let kind = entry.file_type().map_err(pack_err)?;
            archive
                .append_path_with_name(entry.path(), &name)
                .map_err(pack_err)?;
            if kind.is_dir() {
                pending.push(name);
            }
        }
    }
    let bytes = archive
        .into_inner()
        .and_then(|gz| gz.finish())
        .map_err(pack_err)?;
    let hash = hex(&Sha256::digest(&bytes));
    Ok((bytes, hash))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn build(global: &GlobalArgs, args: TemplateBuildArgs) -> Result<i32, CommandError> {
    let client = api_client(global)?;
    let mut request = build_request(&args)?;
    let (archive, hash) = pack_context(&args.dir)?;
    request.context_hash = Some(hash.clone());
    let requested = client.request_dockerfile_build(&request).await?;
    let (template_id, build_id) = (requested.template_id, requested.build_id);
    let link = client.template_files_link(&template_id, &hash).await?;
    if let (false, Some(url)) = (link.present, link.url) {
        client.upload_template_files(&url, archive).await?;
    }
    client
        .start_dockerfile_build(&template_id, &build_id)
        .await?;
    if !global.json {
        println!(
            "building template {} ({template_id}), build {build_id}",
            request.alias.as_deref().unwrap_or(&template_id)
        );
    }
    let info = follow(&client, &template_id, &build_id, global.json).await?;
    if global.json {
        print_json(&info)?;
    }
    match info.status {
        TemplateBuildStatus::Ready => Ok(exit_code::OK),
        _ => {
            let reason = info.reason.as_ref();
            if !global.json {
                if let Some(reason) = reason.filter(|r| !r.log_entries.is_empty()) {
                    eprintln!(
                        "output of the failing step{}:",
                        reason
                            .step
                            .as_deref()
                            .map(|s| format!(" {s}"))
                            .unwrap_or_default()
                    );
                    for entry in &reason.log_entries {
                        eprintln!("  | {}", entry.message);
                    }
                }
            }
            Err(TemplateError::BuildFailed {
                template_id,
                build_id,
                message: reason.map_or_else(|| "no reason given".into(), |r| r.message.clone()),
            }
            .into())
        }
    }
}

/// Polls the build to its end, showing a spinner on the running step and each log line under it.
pub async fn follow(
    client: &ApiClient,
    template_id: &str,
    build_id: &str,
    quiet: bool,
) -> Result<TemplateBuildInfo, CommandError> {
    let style = ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let mut bar: Option<ProgressBar> = None;
    let mut step: Option<String> = None;
    let mut offset = 0;
    loop {
        let info = client
            .template_build_status(template_id, build_id, offset)
            .await?;
        offset += info.log_entries.len();
        if !quiet {
            for entry in &info.log_entries {
                show(entry, &mut bar, &mut step, &style);
            }
        }
        let finished = matches!(
            info.status,
            TemplateBuildStatus::Ready | TemplateBuildStatus::Error
        );
        if finished && info.log_entries.is_empty() {
            if let Some(bar) = bar.take() {
                let done = if info.status == TemplateBuildStatus::Ready {
                    "done"
                } else {
                    "FAILED"
                };
                bar.finish_with_message(format!("{} {done}", bar.message()));
            }
            return Ok(info);
        }
        if !finished {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

fn show(
    entry: &BuildLogEntry,
    bar: &mut Option<ProgressBar>,
    step: &mut Option<String>,
    style: &ProgressStyle,
) {
    if entry.step.is_some() && entry.step != *step {
        if let Some(done) = bar.take() {
            done.finish();
        }
        *step = entry.step.clone();
        let spinner = ProgressBar::new_spinner().with_style(style.clone());
        spinner.set_message(entry.message.clone());
        spinner.enable_steady_tick(Duration::from_millis(120));
        if spinner.is_hidden() {
            println!("{}", entry.message);
        }
        *bar = Some(spinner);
        return;
    }
    let line = match entry.level.as_str() {
        "warn" => format!("  ! {}", entry.message),
        "error" => format!("  x {}", entry.message),
        _ => format!("  | {}", entry.message),
    };
    match bar {
        Some(bar) => bar.suspend(|| print_line(&line)),
        None => print_line(&line),
    }
}

fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
}

pub fn templates_table(templates: &[Template]) -> Table {
    let mut table = Table::new([
        "id", "aliases", "status", "cpu", "memory", "disk", "created",
    ]);
    for template in templates {
        table.row([
            template.template_id.clone(),
            template.aliases.join(","),
            build_status(template.build_status).to_string(),
            template.cpu_count.to_string(),
            format!("{} MiB", template.memory_mb),
            format!("{} MiB", template.disk_size_mb),
            format_time(&template.created_at),
        ]);
    }
    table
}

fn build_status(status: TemplateBuildStatus) -> &'static str {
    match status {
        TemplateBuildStatus::Building => "building",
        TemplateBuildStatus::Waiting => "waiting",
        TemplateBuildStatus::Ready => "ready",
        TemplateBuildStatus::Error => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dir: &Path) -> TemplateBuildArgs {
        TemplateBuildArgs {
            dir: dir.to_path_buf(),
            name: None,
            dockerfile: None,
            start_cmd: None,
            ready_cmd: None,
            cpu_count: None,
            memory_mb: None,
            allow_raw_sockets: false,
            allow_io_uring: false,
        }
    }

    #[test]
    fn build_request_reads_toml_and_flags_override_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("e2b.toml"),
            "template_name = \"web\"\nstart_cmd = \"python3 app.py\"\ncpu_count = 2\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("e2b.Dockerfile"), "FROM debian:bookworm\n").unwrap();
        let request = build_request(&args(dir.path())).unwrap();
        assert_eq!(request.alias.as_deref(), Some("web"));
        assert_eq!(request.start_cmd.as_deref(), Some("python3 app.py"));
        assert_eq!(request.cpu_count, Some(2));
        assert_eq!(request.dockerfile, "FROM debian:bookworm\n");
        assert_eq!(request.privileges, None, "no privileges unless asked for");

        std::fs::write(dir.path().join("other.Dockerfile"), "FROM ubuntu:22.04\n").unwrap();
        let mut overridden = args(dir.path());
        overridden.name = Some("api".into());
        overridden.start_cmd = Some("serve".into());
        overridden.dockerfile = Some(dir.path().join("other.Dockerfile"));
        overridden.allow_io_uring = true;
        let request = build_request(&overridden).unwrap();
        let privileges = request
            .privileges
            .expect("--allow-io-uring asks for privileges");
        assert!(
            privileges.io_uring && !privileges.raw_sockets,
            "{privileges:?}"
        );
        assert_eq!(request.alias.as_deref(), Some("api"));
        assert_eq!(request.start_cmd.as_deref(), Some("serve"));
        assert!(request.dockerfile.contains("ubuntu"));
    }

    #[test]
    fn build_request_without_a_dockerfile_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            build_request(&args(dir.path())),
            Err(TemplateError::NoDockerfile(_))
        ));
    }

    #[test]
    fn context_archive_is_deterministic_and_holds_every_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("app/sub")).unwrap();
        std::fs::write(dir.path().join("app/sub/b.txt"), "b").unwrap();
        std::fs::write(dir.path().join("a.txt"), "a").unwrap();
        let (first, hash) = pack_context(dir.path()).unwrap();
        // Touching a file changes its mtime but not the archive.
        std::fs::write(dir.path().join("a.txt"), "a").unwrap();
        let (second, again) = pack_context(dir.path()).unwrap();
        assert_eq!(first, second);
        assert_eq!(hash, again);
        assert_eq!(hash.len(), 64);
        let mut names: Vec<String> = tar::Archive::new(flate2::read::GzDecoder::new(&first[..]))
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["a.txt", "app", "app/sub", "app/sub/b.txt"]);
        std::fs::write(dir.path().join("a.txt"), "changed").unwrap();
        assert_ne!(pack_context(dir.path()).unwrap().1, hash);
    }

    #[test]
    fn template_rows_show_aliases_and_sizes() {
        let template: Template = serde_json::from_value(serde_json::json!({
            "templateID": "base", "buildID": "b1", "cpuCount": 1, "memoryMB": 512, "diskSizeMB": 2048,
            "public": true, "aliases": ["base", "debian"], "names": ["base"],
            "createdAt": "2026-12-02T12:00:00Z", "updatedAt": "2026-12-02T12:00:00Z", "createdBy": null,
            "lastSpawnedAt": null, "spawnCount": 0, "buildCount": 1, "envdVersion": "0.6.4",
            "buildStatus": "ready"
        }))
        .expect("the server's JSON");
        let text = templates_table(&[template]).render();
        assert_eq!(
            text,
            "ID    ALIASES      STATUS  CPU  MEMORY   DISK      CREATED\n\
             base  base,debian  ready   1    512 MiB  2048 MiB  2026-12-02T12:00:00Z\n"
        );
    }
}
