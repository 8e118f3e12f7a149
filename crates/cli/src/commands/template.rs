//! `warren template list`.

use warren_client::types::Template;

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
            template.build_status.clone(),
            template.cpu_count.to_string(),
            format!("{} MiB", template.memory_mb),
            format!("{} MiB", template.disk_size_mb),
            template.created_at.clone(),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_rows_show_aliases_and_sizes() {
        let template = Template {
            template_id: "base".into(),
            build_id: "b1".into(),
            cpu_count: 1,
            memory_mb: 512,
            disk_size_mb: 2048,
            public: true,
            aliases: vec!["base".into(), "debian".into()],
            created_at: "2026-12-02T12:00:00Z".into(),
            build_status: "ready".into(),
        };
        let text = templates_table(&[template]).render();
        assert_eq!(
            text,
            "ID    ALIASES      STATUS  CPU  MEMORY   DISK      CREATED\n\
             base  base,debian  ready   1    512 MiB  2048 MiB  2026-12-02T12:00:00Z\n"
        );
    }
}
