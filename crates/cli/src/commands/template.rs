//! `warren template list`.

use warren_client::types::{Template, TemplateBuildStatus};

use super::sandbox::format_time;
use super::{api_client, print_json, CommandError};
use crate::args::{GlobalArgs, TemplateCommand};
use crate::exit_code;
use crate::table::Table;

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
    }
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
