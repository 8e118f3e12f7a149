//! `warren gc`: what sandboxes of deleted state directories left on this host, listed and removed
//! (docs/operations.md, "Sandboxes outlive the server that started them").

use serde::Serialize;
use warren_runtime::gc::{self, Findings};

use super::{print_json, CommandError};
use crate::args::{GcArgs, GlobalArgs};
use crate::exit_code;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    sandboxes: Vec<SandboxReport>,
    lxcfs_mounts: Vec<String>,
    volume_mounts: Vec<String>,
    /// Sandbox addresses whose firewall entries were removed (their veth was gone).
    firewall_entries: Vec<String>,
    removed: bool,
    problems: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SandboxReport {
    id: String,
    dir: Option<String>,
    supervisors: Vec<u32>,
    mounts: Vec<String>,
    cgroup: bool,
    cgroup_tasks: usize,
}

fn report(
    findings: &Findings,
    removed: bool,
    firewall_entries: Vec<String>,
    problems: Vec<String>,
) -> Report {
    Report {
        sandboxes: findings
            .sandboxes
            .iter()
            .map(|s| SandboxReport {
                id: s.id.clone(),
                dir: s.dir.as_ref().map(|d| d.display().to_string()),
                supervisors: s.supervisors.clone(),
                mounts: s.mounts.iter().map(|m| m.display().to_string()).collect(),
                cgroup: s.cgroup,
                cgroup_tasks: s.cgroup_tasks,
            })
            .collect(),
        lxcfs_mounts: findings
            .lxcfs_mounts
            .iter()
            .map(|m| m.display().to_string())
            .collect(),
        volume_mounts: findings
            .volume_mounts
            .iter()
            .map(|m| m.display().to_string())
            .collect(),
        firewall_entries,
        removed,
        problems,
    }
}

pub fn run(global: &GlobalArgs, args: GcArgs) -> Result<i32, CommandError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(CommandError::Usage(
            "warren gc needs root (it reads every process and cgroup and unmounts)".into(),
        ));
    }
    let findings = gc::find();
    let mut problems = Vec::new();
    let mut cleaned = Vec::new();
    if !args.dry_run {
        problems = gc::remove(&findings);
        match gc::remove_stale_firewall_entries(&findings) {
            Ok(addresses) => cleaned = addresses.iter().map(|ip| ip.to_string()).collect(),
            Err(problem) => problems.push(problem),
        }
    }
    let report = report(&findings, !args.dry_run, cleaned, problems);
    if global.json {
        print_json(&report)?;
    } else {
        let verb = if args.dry_run {
            "would remove"
        } else {
            "removed"
        };
        for s in &report.sandboxes {
            let mut parts = Vec::new();
            if !s.supervisors.is_empty() {
                parts.push(format!("{} supervisor(s)", s.supervisors.len()));
            }
            if s.cgroup {
                parts.push(format!("a cgroup with {} process(es)", s.cgroup_tasks));
            }
            if !s.mounts.is_empty() {
                parts.push(format!("{} mount(s)", s.mounts.len()));
            }
            let place = s.dir.as_deref().unwrap_or("no directory");
            println!("sandbox {} ({place}): {verb} {}", s.id, parts.join(", "));
        }
        for mount in &report.lxcfs_mounts {
            println!("lxcfs mount {mount}: {verb}");
        }
        for mount in &report.volume_mounts {
            println!("volume mount {mount}: {verb}");
        }
        for address in &report.firewall_entries {
            println!("firewall entries of {address} (its sandbox's link is gone): removed");
        }
        if report.sandboxes.is_empty()
            && report.lxcfs_mounts.is_empty()
            && report.volume_mounts.is_empty()
        {
            println!("nothing to remove: every sandbox on this host has its state directory");
        }
        for problem in &report.problems {
            eprintln!("warren gc: {problem}");
        }
    }
    Ok(if report.problems.is_empty() {
        exit_code::OK
    } else {
        exit_code::ERROR
    })
}
