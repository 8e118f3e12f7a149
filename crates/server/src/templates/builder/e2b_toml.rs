//! `e2b.toml`: the template config the E2B CLI writes next to `e2b.Dockerfile`.

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum E2bTomlError {
    #[error("e2b.toml: {0}")]
    Syntax(#[from] toml::de::Error),
    #[error("e2b.toml: {field} must be {what}, got {value}")]
    Invalid {
        field: &'static str,
        what: &'static str,
        value: String,
    },
}

/// What Warren reads from `e2b.toml`. Unknown keys (team_id, ...) are ignored.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct E2bToml {
    pub template_id: Option<String>,
    /// The template's name; older files call it `alias`.
    #[serde(alias = "alias")]
    pub template_name: Option<String>,
    /// Dockerfile path relative to the directory of e2b.toml (default `e2b.Dockerfile`).
    pub dockerfile: Option<String>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
}

/// Largest values accepted; the scheduler applies the node's own limits on top.
pub const MAX_CPU_COUNT: u32 = 64;
pub const MIN_MEMORY_MB: u64 = 128;

impl E2bToml {
    pub fn parse(text: &str) -> Result<E2bToml, E2bTomlError> {
        let config: E2bToml = toml::from_str(text)?;
        if let Some(cpu) = config.cpu_count {
            if cpu == 0 || cpu > MAX_CPU_COUNT {
                return Err(E2bTomlError::Invalid {
                    field: "cpu_count",
                    what: "between 1 and 64",
                    value: cpu.to_string(),
                });
            }
        }
        if let Some(mem) = config.memory_mb {
            if mem < MIN_MEMORY_MB {
                return Err(E2bTomlError::Invalid {
                    field: "memory_mb",
                    what: "at least 128",
                    value: mem.to_string(),
                });
            }
        }
        for (field, value) in [
            ("start_cmd", &config.start_cmd),
            ("ready_cmd", &config.ready_cmd),
        ] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(E2bTomlError::Invalid {
                    field: if field == "start_cmd" {
                        "start_cmd"
                    } else {
                        "ready_cmd"
                    },
                    what: "a non-empty command",
                    value: "\"\"".into(),
                });
            }
        }
        Ok(config)
    }

    pub fn dockerfile_name(&self) -> &str {
        self.dockerfile.as_deref().unwrap_or("e2b.Dockerfile")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_file_the_e2b_cli_writes() {
        let config = E2bToml::parse(
            r#"
# This is a config for E2B sandbox template.
team_id = "460355b3-4f64-48f9-9a16-4442817f79f5"
memory_mb = 1_024
cpu_count = 2
start_cmd = "cd /home/user && python3 -m http.server 8000"
ready_cmd = "curl -s localhost:8000"
dockerfile = "e2b.Dockerfile"
template_name = "my-agent"
template_id = "1wdqsf9le9gk21ztb4mo"
"#,
        )
        .unwrap();
        assert_eq!(config.template_id.as_deref(), Some("1wdqsf9le9gk21ztb4mo"));
        assert_eq!(config.template_name.as_deref(), Some("my-agent"));
        assert_eq!(config.memory_mb, Some(1024));
        assert_eq!(config.cpu_count, Some(2));
        assert_eq!(config.dockerfile_name(), "e2b.Dockerfile");
        assert_eq!(config.ready_cmd.as_deref(), Some("curl -s localhost:8000"));
    }

    #[test]
    fn alias_is_the_old_name_and_defaults_apply() {
        let config = E2bToml::parse("alias = \"old\"\n").unwrap();
        assert_eq!(config.template_name.as_deref(), Some("old"));
        assert_eq!(config.dockerfile_name(), "e2b.Dockerfile");
        assert_eq!(config.start_cmd, None);
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(E2bToml::parse("cpu_count = 0").is_err());
        assert!(E2bToml::parse("memory_mb = 64").is_err());
        assert!(E2bToml::parse("start_cmd = \"  \"").is_err());
        assert!(E2bToml::parse("cpu_count = \"two\"").is_err());
        assert!(E2bToml::parse("memory_mb = [").is_err());
    }
}
