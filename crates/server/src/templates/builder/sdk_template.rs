//! What the SDK's `Template` builder sends (`POST /v2/templates/{templateID}/builds/{buildID}`, body
//! `TemplateBuildStartV2`) mapped onto the same [`BuildPlan`] a Dockerfile produces.
//!
//! COPY steps carry `filesHash`: the SDK uploaded a tar of those files (paths relative to its context
//! directory) beforehand, see [`super::uploads`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::base_image::{self, BaseChoice, BaseImageError, E2B_DEFAULT_BASE_IMAGE};
use super::context::{hash_entries, BuildContext, ContextError};
use super::plan::{parse_mode, BaseSource, BuildPlan, ExecState, PlanBuilder, StepAction};
use crate::templates::images::registry::{RegistryCredentials, RegistryError};
use crate::templates::images::{ImageResolver, NoRegistry};

#[derive(Debug, thiserror::Error)]
pub enum SdkTemplateError {
    #[error("give exactly one of fromImage and fromTemplate")]
    BaseChoice,
    #[error(transparent)]
    Base(#[from] BaseImageError),
    #[error("fromImageRegistry: {0}")]
    Registry(String),
    #[error(transparent)]
    Pull(#[from] RegistryError),
    #[error("base template {0:?} not found or has no ready build")]
    BaseTemplateNotFound(String),
    #[error("step {step}: {message}")]
    Step { step: String, message: String },
    #[error("step {step}: files {hash} were not uploaded")]
    FilesMissing { step: String, hash: String },
    #[error("step {step}: {source}")]
    Context {
        step: String,
        #[source]
        source: ContextError,
    },
}

/// `TemplateBuildStartV2` as the SDK serialises it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildStartV2 {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_image_registry: Option<serde_json::Value>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub steps: Vec<TemplateStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
}

/// `TemplateStep`: `type` is COPY, RUN, ENV, WORKDIR or USER.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateStep {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_hash: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// What the planner needs from the outside world.
pub trait SdkPlanEnv {
    /// The Debian 12 base rootfs.
    fn rootfs(&self) -> PathBuf;
    /// Directory holding the unpacked upload for `files_hash` (its root is the SDK's context dir).
    fn files_dir(&self, files_hash: &str) -> Option<PathBuf>;
    /// A ready template by name or id, for `fromTemplate`.
    fn template_base(&self, name: &str) -> Option<BaseSource>;
    /// Where images that are not stood in for by the local rootfs are resolved (default: nowhere).
    fn images(&self) -> &dyn ImageResolver {
        &NoRegistry
    }
}

/// `fromImageRegistry` as the SDK sends it: `{type: "registry", username, password}` from
/// `from_image(image, username, password)`, `{type: "gcp", serviceAccountJson}` from
/// `from_gcp_registry`, `{type: "aws", awsAccessKeyId, awsSecretAccessKey, awsRegion}` from
/// `from_aws_registry` (exchanged with ECR for a login).
fn registry_credentials(
    value: Option<&serde_json::Value>,
) -> Result<Option<RegistryCredentials>, SdkTemplateError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).unwrap_or("");
    match text("type") {
        "registry" => {
            let (username, password) = (text("username"), text("password"));
            if username.is_empty() || password.is_empty() {
                return Err(SdkTemplateError::Registry(
                    "type registry needs a username and a password".into(),
                ));
            }
            Ok(Some(RegistryCredentials::new(username, password)))
        }
        // Google's registries (Artifact Registry, gcr.io) take a service account key as the
        // password of the user `_json_key` and exchange it for a token themselves.
        "gcp" => {
            let key = text("serviceAccountJson");
            let parsed: serde_json::Value = serde_json::from_str(key).map_err(|e| {
                SdkTemplateError::Registry(format!(
                    "type gcp: serviceAccountJson is not JSON ({e})"
                ))
            })?;
            if parsed.get("type").and_then(|t| t.as_str()) != Some("service_account")
                || parsed.get("private_key").is_none()
            {
                return Err(SdkTemplateError::Registry(
                    "type gcp: serviceAccountJson is not a service account key (type \"service_account\" with a private_key)".into(),
                ));
            }
            Ok(Some(RegistryCredentials::new("_json_key", key)))
        }
        // ECR hands out registry logins to a SigV4-signed GetAuthorizationToken call.
        "aws" => {
            let keys = crate::templates::images::ecr::AwsKeys {
                access_key_id: text("awsAccessKeyId").to_string(),
                secret_access_key: text("awsSecretAccessKey").to_string(),
                region: text("awsRegion").to_string(),
            };
            crate::templates::images::ecr::login(&keys)
                .map(Some)
                .map_err(|e| SdkTemplateError::Registry(format!("type aws: {e}")))
        }
        other => Err(SdkTemplateError::Registry(format!(
            "unknown type {other:?} (supported: registry, aws, gcp)"
        ))),
    }
}

/// Resources and names come with the `POST /v3/templates` request, not with the steps.
pub fn plan_sdk_template(
    request: &TemplateBuildStartV2,
    cpu_count: Option<u32>,
    memory_mb: Option<u64>,
    env: &dyn SdkPlanEnv,
) -> Result<BuildPlan, SdkTemplateError> {
    let credentials = registry_credentials(request.from_image_registry.as_ref())?;
    let from_image = request
        .from_image
        .as_deref()
        .filter(|s| !s.trim().is_empty());
    let from_template = request
        .from_template
        .as_deref()
        .filter(|s| !s.trim().is_empty());
    if credentials.is_some() && from_image.is_none() {
        return Err(SdkTemplateError::Registry(
            "credentials are for fromImage; this template names no image".into(),
        ));
    }
    let mut start = ExecState::sdk_start();
    let base = match (from_image, from_template) {
        (Some(image), None) => {
            match base_image::choose(image, &env.rootfs(), credentials.is_some())? {
                BaseChoice::Local(base) => BaseSource::Image(base),
                BaseChoice::Registry(image) => {
                    let resolved = env.images().resolve(&image, credentials.as_ref())?;
                    start = start.on_image(&resolved.config, false);
                    BaseSource::Registry(Box::new(resolved))
                }
            }
        }
        (None, Some(name)) => env
            .template_base(name)
            .ok_or_else(|| SdkTemplateError::BaseTemplateNotFound(name.to_string()))?,
        (None, None) if request.steps.is_empty() => {
            BaseSource::Image(base_image::resolve(E2B_DEFAULT_BASE_IMAGE, &env.rootfs())?)
        }
        _ => return Err(SdkTemplateError::BaseChoice),
    };
    let mut b = PlanBuilder::new(base, start);
    for (i, step) in request.steps.iter().enumerate() {
        let id = (i + 1).to_string();
        let force = request.force || step.force;
        plan_step(&mut b, id, step, force, env)?;
    }
    let final_state = ExecState {
        build_args: Default::default(),
        ..b.state.clone()
    };
    Ok(b.finish(
        final_state,
        request.start_cmd.clone().filter(|c| !c.trim().is_empty()),
        request.ready_cmd.clone().filter(|c| !c.trim().is_empty()),
        cpu_count,
        memory_mb,
    ))
}

fn plan_step(
    b: &mut PlanBuilder,
    id: String,
    step: &TemplateStep,
    force: bool,
    env: &dyn SdkPlanEnv,
) -> Result<(), SdkTemplateError> {
    let bad = |message: String| SdkTemplateError::Step {
        step: id.clone(),
        message,
    };
    let args = &step.args;
    match step.kind.to_ascii_uppercase().as_str() {
        "RUN" => {
            let command = args
                .first()
                .filter(|c| !c.trim().is_empty())
                .ok_or_else(|| bad("RUN needs a command".into()))?;
            let user = args.get(1).filter(|u| !u.is_empty()).cloned();
            let mut argv = b.state.shell.clone();
            argv.push(command.clone());
            b.run(id, format!("RUN {command}"), argv, user, force);
        }
        "ENV" => {
            if args.len() & 1 == 1 {
                return Err(bad("ENV needs name/value pairs".into()));
            }
            for pair in args.chunks(2) {
                if pair[0].is_empty() {
                    return Err(bad("ENV needs a variable name".into()));
                }
                b.state.env.insert(pair[0].clone(), pair[1].clone());
            }
        }
        "WORKDIR" => {
            let path = args
                .first()
                .filter(|p| !p.is_empty())
                .ok_or_else(|| bad("WORKDIR needs a path".into()))?;
            let path = b.state.absolute(path);
            b.workdir(id, format!("WORKDIR {path}"), path, force);
        }
        "USER" => {
            let user = args
                .first()
                .filter(|u| !u.is_empty())
                .ok_or_else(|| bad("USER needs a user".into()))?;
            b.state.user = user.clone();
        }
        "COPY" => {
            let (src, dest_raw) = match (args.first(), args.get(1)) {
                (Some(s), Some(d)) if !s.is_empty() && !d.is_empty() => (s, d),
                _ => return Err(bad("COPY needs a source and a destination".into())),
            };
            let hash = step
                .files_hash
                .as_deref()
                .ok_or_else(|| bad("COPY without filesHash".into()))?;
            let dir = env
                .files_dir(hash)
                .ok_or_else(|| SdkTemplateError::FilesMissing {
                    step: id.clone(),
                    hash: hash.to_string(),
                })?;
            let owner = args
                .get(2)
                .filter(|u| !u.is_empty())
                .cloned()
                .unwrap_or_else(|| b.state.user.clone());
            let mode = match args.get(3).filter(|m| !m.is_empty()) {
                Some(m) => Some(parse_mode(m).ok_or_else(|| bad(format!("bad mode {m:?}")))?),
                None => None,
            };
            let action =
                copy_action(&dir, src, dest_raw, &b.state, owner, mode).map_err(|source| {
                    SdkTemplateError::Context {
                        step: id.clone(),
                        source,
                    }
                })?;
            b.copy(id, format!("COPY {src} {dest_raw}"), action, force);
        }
        other => return Err(bad(format!("unknown step type {other:?}"))),
    }
    Ok(())
}

fn copy_action(
    dir: &Path,
    src: &str,
    dest_raw: &str,
    state: &ExecState,
    owner: String,
    mode: Option<u32>,
) -> Result<StepAction, ContextError> {
    // The SDK applied its ignore patterns when it made the tar; nothing more to exclude here.
    let context = BuildContext::with_rules(dir, Default::default())?;
    let sources = vec![src.to_string()];
    let count = context.count_sources(&sources)?;
    let dest_is_dir = dest_raw.ends_with('/') || dest_raw == "." || count > 1;
    let mut dest = state.absolute(dest_raw);
    if dest_is_dir && !dest.ends_with('/') {
        dest.push('/');
    }
    let entries = context.entries(&sources, &dest, dest_is_dir, false)?;
    let files_hash = hash_entries(&entries)?;
    Ok(StepAction::Copy {
        entries,
        files_hash,
        owner: Some(owner),
        mode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gcp_service_account_key_logs_in_as_json_key() {
        let key = r#"{"type":"service_account","client_email":"b@p.iam.test","private_key":"-----BEGIN PRIVATE KEY-----"}"#;
        let value = serde_json::json!({"type": "gcp", "serviceAccountJson": key});
        let credentials = registry_credentials(Some(&value)).unwrap().unwrap();
        assert_eq!(credentials, RegistryCredentials::new("_json_key", key));
        assert!(!format!("{credentials:?}").contains("PRIVATE KEY"));
    }
    use crate::templates::builder::base_image::ImageFamily;
    use std::collections::HashMap;
    use std::fs;

    struct Env {
        files: HashMap<String, PathBuf>,
    }

    impl SdkPlanEnv for Env {
        fn rootfs(&self) -> PathBuf {
            PathBuf::from("/nonexistent/rootfs")
        }
        fn files_dir(&self, files_hash: &str) -> Option<PathBuf> {
            self.files.get(files_hash).cloned()
        }
        fn template_base(&self, name: &str) -> Option<BaseSource> {
            (name == "parent").then(|| BaseSource::Template {
                name: name.into(),
                layers: vec![PathBuf::from("/l/2"), PathBuf::from("/l/1")],
                key: "k".repeat(64),
                state: ExecState {
                    user: "root".into(),
                    ..ExecState::sdk_start()
                },
            })
        }
    }

    /// The JSON the Python SDK 2.63 sends for
    /// `Template().from_python_image("3.11").copy("app", "/home/user/app").set_envs({"A": "1"})
    ///  .run_cmd("pip install flask").set_workdir("/home/user/app").set_user("root")
    ///  .run_cmd("apt-get update", user="root").set_start_cmd("python3 -m http.server", "sleep 1")`.
    const SDK_BODY: &str = r#"{
      "steps": [
        {"type": "COPY", "args": ["app", "/home/user/app", "", ""], "force": false, "filesHash": "abc"},
        {"type": "ENV", "args": ["A", "1"], "force": false},
        {"type": "RUN", "args": ["pip install flask"], "force": false},
        {"type": "WORKDIR", "args": ["/home/user/app"], "force": false},
        {"type": "USER", "args": ["root"], "force": false},
        {"type": "RUN", "args": ["apt-get update", "root"], "force": true}
      ],
      "force": false,
      "fromImage": "python:3.11",
      "startCmd": "python3 -m http.server",
      "readyCmd": "sleep 1"
    }"#;

    fn env_with_upload() -> (tempfile::TempDir, Env) {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("app")).unwrap();
        fs::write(dir.path().join("app/main.py"), "print(1)").unwrap();
        let env = Env {
            files: HashMap::from([("abc".to_string(), dir.path().to_path_buf())]),
        };
        (dir, env)
    }

    #[test]
    fn sdk_body_maps_onto_plan() {
        let (_dir, env) = env_with_upload();
        let request: TemplateBuildStartV2 = serde_json::from_str(SDK_BODY).unwrap();
        let plan = plan_sdk_template(&request, Some(2), Some(1024), &env).unwrap();
        match &plan.base {
            BaseSource::Image(image) => assert_eq!(image.family, ImageFamily::Python),
            other => panic!("{other:?}"),
        }
        let ids: Vec<&str> = plan.steps.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, vec!["base", "1", "3", "4", "6"]);
        match &plan.steps[1].action {
            StepAction::Copy { entries, owner, .. } => {
                assert_eq!(owner.as_deref(), Some("user"));
                let targets: Vec<&str> = entries.iter().map(|e| e.target.as_str()).collect();
                assert_eq!(targets, vec!["/home/user/app", "/home/user/app/main.py"]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(plan.steps[2].state.user, "user");
        assert_eq!(plan.steps[2].state.env["A"], "1");
        assert_eq!(plan.steps[4].state.user, "root");
        assert!(plan.steps[4].force && !plan.steps[3].force);
        assert_eq!(plan.final_state.user, "root");
        assert_eq!(plan.final_state.workdir, "/home/user/app");
        assert_eq!(plan.start_cmd.as_deref(), Some("python3 -m http.server"));
        assert_eq!(plan.cpu_count, Some(2));
    }

    #[test]
    fn serialisation_round_trips_in_the_sdk_shape() {
        let request: TemplateBuildStartV2 = serde_json::from_str(SDK_BODY).unwrap();
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(json["fromImage"], "python:3.11");
        assert_eq!(json["steps"][0]["filesHash"], "abc");
        assert_eq!(json["steps"][0]["type"], "COPY");
    }

    #[test]
    fn from_template_inherits_layers_and_state() {
        let (_dir, env) = env_with_upload();
        let request = TemplateBuildStartV2 {
            from_template: Some("parent".into()),
            steps: vec![TemplateStep {
                kind: "RUN".into(),
                args: vec!["echo".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let plan = plan_sdk_template(&request, None, None, &env).unwrap();
        assert_eq!(plan.base.layers().len(), 2);
        assert_eq!(plan.steps.len(), 1);
        assert_eq!(plan.steps[0].state.user, "root");
    }

    #[test]
    fn bad_requests_are_clear_errors() {
        let (_dir, env) = env_with_upload();
        let plan = |json: &str| {
            let request: TemplateBuildStartV2 = serde_json::from_str(json).unwrap();
            plan_sdk_template(&request, None, None, &env).map(|_| ())
        };
        assert!(matches!(
            plan(r#"{"fromImage":"debian","fromTemplate":"parent"}"#),
            Err(SdkTemplateError::BaseChoice)
        ));
        assert!(matches!(
            plan(r#"{"fromImage":"alpine:3"}"#),
            Err(SdkTemplateError::Pull(_))
        ));
        assert!(matches!(
            plan(r#"{"fromTemplate":"nope"}"#),
            Err(SdkTemplateError::BaseTemplateNotFound(_))
        ));
        assert!(matches!(
            plan(r#"{"fromImage":"debian","fromImageRegistry":{"type":"registry"}}"#),
            Err(SdkTemplateError::Registry(_))
        ));
        assert!(matches!(
            plan(
                r#"{"fromImage":"debian","steps":[{"type":"COPY","args":["a","/b"],"filesHash":"zzz"}]}"#
            ),
            Err(SdkTemplateError::FilesMissing { .. })
        ));
        let err = plan(r#"{"fromImage":"debian","steps":[{"type":"HEALTHCHECK","args":[]}]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("step 1") && err.contains("HEALTHCHECK"),
            "{err}"
        );
        assert!(plan(r#"{"fromImage":"debian","steps":[{"type":"ENV","args":["A"]}]}"#).is_err());
        assert!(plan(r#"{"fromImage":"debian","steps":[{"type":"COPY","args":["missing","/b"],"filesHash":"abc"}]}"#).is_err());
        assert!(plan(r#"{}"#).is_ok());
    }

    /// Answers every reference with one fixed image and remembers the login it was given.
    struct FakeRegistry {
        seen: std::sync::Mutex<Vec<Option<RegistryCredentials>>>,
    }

    impl ImageResolver for FakeRegistry {
        fn resolve(
            &self,
            image: &str,
            credentials: Option<&RegistryCredentials>,
        ) -> Result<crate::templates::images::registry::ResolvedImage, RegistryError> {
            self.seen.lock().unwrap().push(credentials.cloned());
            Ok(crate::templates::images::registry::ResolvedImage {
                image: image.into(),
                canonical: format!("127.0.0.1:5000/{image}"),
                manifest_digest: format!("sha256:{}", "a".repeat(64)),
                layers: Vec::new(),
                config: crate::templates::images::registry::ImageRunConfig {
                    env: vec!["PATH=/opt/bin:/bin".into(), "LANG=C.UTF-8".into()],
                    user: Some("nobody".into()),
                    working_dir: Some("/srv".into()),
                    entrypoint: Vec::new(),
                    cmd: vec!["sh".into()],
                },
                credentials: credentials.cloned(),
            })
        }
    }

    struct RegistryEnv(FakeRegistry);

    impl SdkPlanEnv for RegistryEnv {
        fn rootfs(&self) -> PathBuf {
            PathBuf::from("/nonexistent/rootfs")
        }
        fn files_dir(&self, _: &str) -> Option<PathBuf> {
            None
        }
        fn template_base(&self, _: &str) -> Option<BaseSource> {
            None
        }
        fn images(&self) -> &dyn ImageResolver {
            &self.0
        }
    }

    #[test]
    fn pulled_images_get_the_setup_step_and_their_env() {
        let env = RegistryEnv(FakeRegistry {
            seen: Default::default(),
        });
        let request: TemplateBuildStartV2 = serde_json::from_str(
            r#"{"fromImage":"127.0.0.1:5000/private/app:1",
                "fromImageRegistry":{"type":"registry","username":"alice","password":"pw"},
                "steps":[{"type":"RUN","args":["echo hi"]}]}"#,
        )
        .unwrap();
        let plan = plan_sdk_template(&request, None, None, &env).unwrap();
        assert!(matches!(plan.base, BaseSource::Registry(_)));
        assert_eq!(plan.steps[0].id, "base");
        assert_eq!(plan.steps[0].state.user, "root");
        // The SDK's steps run as E2B's user, with the image's PATH.
        assert_eq!(plan.steps[1].state.user, "user");
        assert_eq!(plan.steps[1].state.workdir, "/home/user");
        assert_eq!(plan.final_state.env["PATH"], "/opt/bin:/bin");
        assert_eq!(plan.final_state.env["LANG"], "C.UTF-8");
        assert!(
            plan.warnings.iter().any(|w| w.contains("CMD")),
            "{:?}",
            plan.warnings
        );
        let seen = env.0.seen.lock().unwrap().clone();
        assert_eq!(seen, vec![Some(RegistryCredentials::new("alice", "pw"))]);
        // Keys come from the manifest digest, not from the name: the fake gives both the same digest.
        let other = plan_sdk_template(
            &serde_json::from_str(
                r#"{"fromImage":"fedora","steps":[{"type":"RUN","args":["echo hi"]}]}"#,
            )
            .unwrap(),
            None,
            None,
            &env,
        )
        .unwrap();
        assert_eq!(
            other.steps[1].cache_key, plan.steps[1].cache_key,
            "same digest, same keys"
        );
        for bad in [
            r#"{"fromImage":"x","fromImageRegistry":{"type":"aws","awsAccessKeyId":"a"}}"#,
            r#"{"fromImage":"x","fromImageRegistry":{"type":"gcp","serviceAccountJson":"not json"}}"#,
            r#"{"fromImage":"x","fromImageRegistry":{"type":"gcp","serviceAccountJson":"{\"type\":\"user\"}"}}"#,
            r#"{"fromImage":"x","fromImageRegistry":{"type":"registry","username":"a"}}"#,
            r#"{"fromTemplate":"t","fromImageRegistry":{"type":"registry","username":"a","password":"b"}}"#,
        ] {
            let request: TemplateBuildStartV2 = serde_json::from_str(bad).unwrap();
            assert!(
                matches!(
                    plan_sdk_template(&request, None, None, &env),
                    Err(SdkTemplateError::Registry(_))
                ),
                "{bad}"
            );
        }
    }
}
