//! Gives a parsed e2b.Dockerfile its meaning: ARG/ENV scoping and substitution, WORKDIR/USER/SHELL state,
//! COPY/ADD source resolution against the build context, and the layer steps of a [`BuildPlan`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::base_image::{self, BaseChoice, BaseImageError};
use super::context::{hash_entries, BuildContext, ContextError};
use super::dockerfile::{self, Body, DockerfileError, Instruction, Keyword};
use super::e2b_toml::E2bToml;
use super::plan::{
    parse_mode, BaseSource, BuildPlan, ExecState, PlanBuilder, Stage, StepAction, SANDBOX_USER,
    SANDBOX_WORKDIR,
};
use super::words::{expand_word, expand_words, Vars, WordError};
use crate::templates::images::registry::RegistryError;
use crate::templates::images::{ImageResolver, NoRegistry};

#[derive(Debug, thiserror::Error)]
pub enum DockerfilePlanError {
    #[error(transparent)]
    Parse(#[from] DockerfileError),
    #[error("line {line}: {source}")]
    Word {
        line: usize,
        #[source]
        source: WordError,
    },
    #[error("line {line}: {source}")]
    Base {
        line: usize,
        #[source]
        source: BaseImageError,
    },
    #[error("line {line}: {source}")]
    Pull {
        line: usize,
        #[source]
        source: RegistryError,
    },
    #[error("line {line}: {keyword}: {source}")]
    Context {
        line: usize,
        keyword: &'static str,
        #[source]
        source: ContextError,
    },
    #[error("line {line}: {message}")]
    Invalid { line: usize, message: String },
}

/// Everything a Dockerfile build needs besides the text.
pub struct DockerfileInput<'a> {
    pub dockerfile: &'a str,
    pub context: &'a BuildContext,
    /// `--build-arg NAME=VALUE` values.
    pub build_args: &'a BTreeMap<String, String>,
    /// start_cmd, ready_cmd, cpu_count, memory_mb (template name and id are the caller's business).
    pub config: &'a E2bToml,
    /// The Debian 12 base rootfs every supported FROM maps onto.
    pub rootfs: &'a Path,
}

/// Docker's predefined proxy ARGs may be passed without being declared.
const PREDEFINED_ARGS: &[&str] = &[
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "FTP_PROXY",
    "ftp_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// Plans without registry access: a `FROM` the local rootfs does not stand in for is an error.
pub fn plan_dockerfile(input: &DockerfileInput<'_>) -> Result<BuildPlan, DockerfilePlanError> {
    plan_dockerfile_with(input, &NoRegistry)
}

/// Plans with `images` resolving the `FROM` images that are pulled.
pub fn plan_dockerfile_with(
    input: &DockerfileInput<'_>,
    images: &dyn ImageResolver,
) -> Result<BuildPlan, DockerfilePlanError> {
    let parsed = dockerfile::parse(input.dockerfile)?;
    let escape = parsed.escape;
    let mut used_args: BTreeSet<String> = BTreeSet::new();
    // ARGs declared before FROM: usable in FROM, and as defaults for a re-declaration after it.
    let mut global_args: Vars = BTreeMap::new();
    let mut builder: Option<PlanBuilder> = None;
    let mut set_user = false;
    let mut set_workdir = false;
    let mut index = 0usize;

    let mut stages: Vec<Stage> = Vec::new();
    let mut stage_name: Option<String> = None;

    for ins in &parsed.instructions {
        let line = ins.line;
        let word_err = |source| DockerfilePlanError::Word { line, source };
        if ins.keyword == Keyword::From {
            // A FROM after the first ends the stage before it (multi-stage builds).
            if let Some(done) = builder.take() {
                stages.push(Stage {
                    name: stage_name.take(),
                    plan: finish_stage(done),
                });
            }
            let words = expand_words(text_body(ins)?, &global_args, escape).map_err(word_err)?;
            let (image, name) = from_words(&words, line)?;
            if let Some(name) = &name {
                if stage_index(&stages, name).is_some() {
                    return Err(DockerfilePlanError::Invalid {
                        line,
                        message: format!("a stage named {name:?} already exists"),
                    });
                }
            }
            let (base, start) = match stage_index(&stages, &image) {
                Some(index) => (stage_base(&stages, index), ExecState::dockerfile_start()),
                None => image_base(&image, line, input, images)?,
            };
            builder = Some(PlanBuilder::new(base, start));
            stage_name = name;
            set_user = false;
            set_workdir = false;
            continue;
        }
        let Some(b) = builder.as_mut() else {
            match ins.keyword {
                Keyword::Arg => {
                    for (name, value) in declare_args(ins, &global_args, input.build_args, escape)?
                    {
                        used_args.insert(name.clone());
                        if let Some(value) = value {
                            global_args.insert(name, value);
                        }
                    }
                }
                other => {
                    return Err(DockerfilePlanError::Invalid {
                        line,
                        message: format!("{} before FROM (only ARG may come first)", other.name()),
                    })
                }
            }
            continue;
        };
        index += 1;
        let id = index.to_string();
        match ins.keyword {
            Keyword::From => unreachable!("FROM is handled above"),
            Keyword::Arg => {
                for (name, value) in declare_args(ins, &global_args, input.build_args, escape)? {
                    used_args.insert(name.clone());
                    if let Some(value) = value {
                        b.state.build_args.insert(name, value);
                    }
                }
            }
            Keyword::Env => {
                let vars = b.state.vars();
                for (k, v) in env_pairs(text_body(ins)?, &vars, escape).map_err(word_err)? {
                    if k.is_empty() {
                        return Err(DockerfilePlanError::Invalid {
                            line,
                            message: "ENV needs a variable name".into(),
                        });
                    }
                    b.state.env.insert(k, v);
                }
            }
            Keyword::Workdir => {
                let raw =
                    expand_word(text_body(ins)?, &b.state.vars(), escape).map_err(word_err)?;
                let path = clean_absolute(&b.state.absolute(raw.trim()));
                set_workdir = true;
                b.workdir(id, format!("WORKDIR {path}"), path, false);
            }
            Keyword::User => {
                let user =
                    expand_word(text_body(ins)?, &b.state.vars(), escape).map_err(word_err)?;
                let user = user.trim().to_string();
                if user.is_empty() {
                    return Err(DockerfilePlanError::Invalid {
                        line,
                        message: "USER needs a user name or uid".into(),
                    });
                }
                set_user = true;
                b.state.user = user;
            }
            Keyword::Shell => match &ins.body {
                Body::Json(argv) if !argv.is_empty() => b.state.shell = argv.clone(),
                _ => {
                    return Err(DockerfilePlanError::Invalid {
                        line,
                        message: "SHELL must be a JSON array, e.g. SHELL [\"/bin/bash\", \"-c\"]"
                            .into(),
                    })
                }
            },
            Keyword::Run => {
                for (flag, value) in &ins.flags {
                    b.warnings.push(format!(
                        "line {line}: RUN --{flag}={value} is ignored by Warren"
                    ));
                }
                let (argv, shown) = match &ins.body {
                    Body::Json(argv) => {
                        if argv.is_empty() {
                            return Err(DockerfilePlanError::Invalid {
                                line,
                                message: "RUN [] has no command".into(),
                            });
                        }
                        (argv.clone(), argv.join(" "))
                    }
                    Body::Text(text) => {
                        let mut argv = b.state.shell.clone();
                        argv.push(text.clone());
                        (argv, text.clone())
                    }
                };
                b.run(id, format!("RUN {shown}"), argv, None, false);
            }
            Keyword::Copy | Keyword::Add if ins.flag("from").is_some() => {
                plan_copy_from(b, ins, id, &mut stages, input, images, escape)?
            }
            Keyword::Copy | Keyword::Add => plan_copy(b, ins, id, input.context, escape)?,
            Keyword::Cmd | Keyword::Entrypoint => b.warnings.push(format!(
                "line {line}: {} is ignored; set start_cmd in e2b.toml to run something at start",
                ins.keyword.name()
            )),
            other if other.is_ignored() => {}
            other => {
                return Err(DockerfilePlanError::Invalid {
                    line,
                    message: format!("{} is not supported here", other.name()),
                })
            }
        }
    }

    let Some(mut b) = builder else {
        return Err(DockerfilePlanError::Parse(DockerfileError::NoFrom));
    };
    for name in input.build_args.keys() {
        if !used_args.contains(name) && !PREDEFINED_ARGS.contains(&name.as_str()) {
            b.warnings.push(format!(
                "build arg {name} was given but the Dockerfile declares no ARG {name}"
            ));
        }
    }
    let mut final_state = b.state.clone();
    final_state.build_args.clear();
    if !set_user {
        final_state.user = SANDBOX_USER.into();
    }
    if !set_workdir {
        final_state.workdir = SANDBOX_WORKDIR.into();
    }
    let mut plan = b.finish(
        final_state,
        input.config.start_cmd.clone(),
        input.config.ready_cmd.clone(),
        input.config.cpu_count,
        input.config.memory_mb,
    );
    plan.stages = stages;
    Ok(plan)
}

/// The plan of a stage that is not the last: what it ends with is what a later `FROM <stage>`
/// starts from (its ARGs stay behind, as in Docker).
fn finish_stage(builder: PlanBuilder) -> BuildPlan {
    let mut state = builder.state.clone();
    state.build_args.clear();
    builder.finish(state, None, None, None, None)
}

/// `image [AS name]` of a FROM (flags such as `--platform` are not words here).
fn from_words(
    words: &[String],
    line: usize,
) -> Result<(String, Option<String>), DockerfilePlanError> {
    let invalid = |message: String| DockerfilePlanError::Invalid { line, message };
    match words {
        [image] => Ok((image.clone(), None)),
        [image, as_word, name] if as_word.eq_ignore_ascii_case("as") => {
            let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !valid {
                return Err(invalid(format!(
                    "bad stage name {name:?} (a letter, then letters, digits, '-', '_' or '.')"
                )));
            }
            Ok((image.clone(), Some(name.to_ascii_lowercase())))
        }
        _ => Err(invalid(format!(
            "FROM takes an image and optionally AS <name>, got {:?}",
            words.join(" ")
        ))),
    }
}

/// The earlier stage `reference` names: its name (any case) or its number.
fn stage_index(stages: &[Stage], reference: &str) -> Option<usize> {
    let lower = reference.to_ascii_lowercase();
    stages
        .iter()
        .position(|stage| stage.name.as_deref() == Some(lower.as_str()))
        .or_else(|| {
            reference
                .parse::<usize>()
                .ok()
                .filter(|index| *index < stages.len())
        })
}

fn stage_base(stages: &[Stage], index: usize) -> BaseSource {
    BaseSource::Stage {
        index,
        key: stages[index].plan.final_key(),
        state: stages[index].plan.final_state.clone(),
    }
}

/// The base and starting state of `FROM image`: the local rootfs it maps onto, or the pulled image.
fn image_base(
    image: &str,
    line: usize,
    input: &DockerfileInput<'_>,
    images: &dyn ImageResolver,
) -> Result<(BaseSource, ExecState), DockerfilePlanError> {
    let choice = base_image::choose(image, input.rootfs, false)
        .map_err(|source| DockerfilePlanError::Base { line, source })?;
    Ok(match choice {
        BaseChoice::Local(base) => (BaseSource::Image(base), ExecState::dockerfile_start()),
        BaseChoice::Registry(image) => {
            let resolved = images
                .resolve(&image, None)
                .map_err(|source| DockerfilePlanError::Pull { line, source })?;
            let start = ExecState::dockerfile_start().on_image(&resolved.config, true);
            (BaseSource::Registry(Box::new(resolved)), start)
        }
    })
}

/// `COPY --from=<stage or image> src... dest`: from an earlier stage, or from an image (which
/// becomes a stage of its own with no steps, as Docker does). Sources are paths in that
/// filesystem (relative ones from its root); globs are not supported there.
fn plan_copy_from(
    b: &mut PlanBuilder,
    ins: &Instruction,
    id: String,
    stages: &mut Vec<Stage>,
    input: &DockerfileInput<'_>,
    images: &dyn ImageResolver,
    escape: char,
) -> Result<(), DockerfilePlanError> {
    let line = ins.line;
    let keyword = ins.keyword.name();
    let word_err = |source| DockerfilePlanError::Word { line, source };
    let invalid = |message: String| DockerfilePlanError::Invalid { line, message };
    if ins.keyword == Keyword::Add {
        return Err(invalid(
            "ADD --from is not a Dockerfile instruction; use COPY --from".into(),
        ));
    }
    for (flag, _) in &ins.flags {
        if !["from", "chown", "chmod", "link"].contains(&flag.as_str()) {
            return Err(invalid(format!("{keyword} --{flag} is not supported")));
        }
    }
    let vars = b.state.vars();
    let reference =
        expand_word(ins.flag("from").unwrap_or_default(), &vars, escape).map_err(word_err)?;
    let stage = match stage_index(stages, &reference) {
        Some(index) => index,
        None => {
            let (base, start) = image_base(&reference, line, input, images)?;
            stages.push(Stage {
                name: None,
                plan: finish_stage(PlanBuilder::new(base, start)),
            });
            stages.len() - 1
        }
    };
    let (args, dest_raw) = copy_operands(ins, &vars, escape)?;
    if let Some(glob) = args.iter().find(|s| s.contains(['*', '?', '['])) {
        return Err(invalid(format!(
            "{keyword} --from with a wildcard ({glob}) is not supported; name the paths"
        )));
    }
    let sources: Vec<String> = args
        .iter()
        .map(|s| clean_absolute(&format!("/{s}")))
        .collect();
    let dest_is_dir =
        dest_raw.ends_with('/') || dest_raw == "." || dest_raw.ends_with("/.") || sources.len() > 1;
    if sources.len() > 1 && !(dest_raw.ends_with('/') || dest_raw == ".") {
        return Err(invalid(format!(
            "{keyword} with more than one source needs a destination directory ending in /, got {dest_raw:?}"
        )));
    }
    let dest = clean_absolute(&b.state.absolute(&dest_raw));
    let (owner, mode) = owner_and_mode(ins, &vars, escape)?;
    let shown = stages[stage]
        .name
        .clone()
        .unwrap_or_else(|| reference.clone());
    b.copy(
        id,
        format!("{keyword} --from={shown} {} {dest_raw}", args.join(" ")),
        StepAction::CopyFrom {
            stage,
            stage_key: stages[stage].plan.final_key(),
            sources,
            dest,
            dest_is_dir,
            owner,
            mode,
        },
        false,
    );
    Ok(())
}

fn text_body(ins: &Instruction) -> Result<&str, DockerfilePlanError> {
    match &ins.body {
        Body::Text(text) => Ok(text),
        Body::Json(_) => Err(DockerfilePlanError::Invalid {
            line: ins.line,
            message: format!("{} does not take a JSON array", ins.keyword.name()),
        }),
    }
}

/// `ARG a=1 b` → [(a, value), (b, value)], where value is the --build-arg, else the default, else the
/// global ARG of that name.
fn declare_args(
    ins: &Instruction,
    global_args: &Vars,
    build_args: &BTreeMap<String, String>,
    escape: char,
) -> Result<Vec<(String, Option<String>)>, DockerfilePlanError> {
    let line = ins.line;
    let words = expand_words(text_body(ins)?, global_args, escape)
        .map_err(|source| DockerfilePlanError::Word { line, source })?;
    let mut out = Vec::new();
    for word in words {
        let (name, default) = match word.split_once('=') {
            Some((n, d)) => (n.to_string(), Some(d.to_string())),
            None => (word.clone(), None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(DockerfilePlanError::Invalid {
                line,
                message: format!("bad ARG name {name:?}"),
            });
        }
        let value = build_args
            .get(&name)
            .cloned()
            .or(default)
            .or_else(|| global_args.get(&name).cloned());
        out.push((name, value));
    }
    Ok(out)
}

/// `ENV a=1 b="x y"` or the legacy `ENV a some value`. Substitutions see the environment from before
/// the instruction, as in Docker.
fn env_pairs(text: &str, vars: &Vars, escape: char) -> Result<Vec<(String, String)>, WordError> {
    let first_word_end = text.find(char::is_whitespace).unwrap_or(text.len());
    if text[..first_word_end].contains('=') {
        let mut pairs = Vec::new();
        for word in expand_words(text, vars, escape)? {
            match word.split_once('=') {
                Some((k, v)) => pairs.push((k.to_string(), v.to_string())),
                None => {
                    return Err(WordError::BadSubstitution(format!(
                        "ENV {word} (expected NAME=VALUE)"
                    )))
                }
            }
        }
        Ok(pairs)
    } else {
        let key = text[..first_word_end].to_string();
        let value = expand_word(text[first_word_end..].trim(), vars, escape)?;
        Ok(vec![(key, value)])
    }
}

fn plan_copy(
    b: &mut PlanBuilder,
    ins: &Instruction,
    id: String,
    context: &BuildContext,
    escape: char,
) -> Result<(), DockerfilePlanError> {
    let line = ins.line;
    let keyword = ins.keyword.name();
    let invalid = |message: String| DockerfilePlanError::Invalid { line, message };
    let vars = b.state.vars();
    let allowed: &[&str] = &["chown", "chmod", "link"];
    for (flag, _) in &ins.flags {
        if !allowed.contains(&flag.as_str()) {
            return Err(invalid(format!("{keyword} --{flag} is not supported")));
        }
    }
    let (sources, dest_raw) = copy_operands(ins, &vars, escape)?;
    if let Some(url) = sources
        .iter()
        .find(|s| s.contains("://") || s.starts_with("git@"))
    {
        return Err(invalid(format!(
            "{keyword} from a URL ({url}) is not supported; download it in a RUN step (curl is in the base)"
        )));
    }
    let dest_is_dir = dest_raw.ends_with('/') || dest_raw == "." || dest_raw.ends_with("/.");
    let mut dest = clean_absolute(&b.state.absolute(&dest_raw));
    if dest_is_dir && dest != "/" {
        dest.push('/');
    }
    let count = context
        .count_sources(&sources)
        .map_err(|source| DockerfilePlanError::Context {
            line,
            keyword,
            source,
        })?;
    if count > 1 && !dest_is_dir {
        return Err(invalid(format!(
            "{keyword} with more than one source needs a destination directory ending in /, got {dest_raw:?}"
        )));
    }
    let entries = context
        .entries(&sources, &dest, dest_is_dir, ins.keyword == Keyword::Add)
        .map_err(|source| DockerfilePlanError::Context {
            line,
            keyword,
            source,
        })?;
    let files_hash = hash_entries(&entries).map_err(|source| DockerfilePlanError::Context {
        line,
        keyword,
        source,
    })?;
    let (owner, mode) = owner_and_mode(ins, &vars, escape)?;
    b.copy(
        id,
        format!("{keyword} {} {dest_raw}", sources.join(" ")),
        StepAction::Copy {
            entries,
            files_hash,
            owner,
            mode,
        },
        false,
    );
    Ok(())
}

/// The sources and the destination of a COPY/ADD, words expanded.
fn copy_operands(
    ins: &Instruction,
    vars: &Vars,
    escape: char,
) -> Result<(Vec<String>, String), DockerfilePlanError> {
    let line = ins.line;
    let word_err = |source| DockerfilePlanError::Word { line, source };
    let mut args = match &ins.body {
        Body::Json(list) => list
            .iter()
            .map(|w| expand_word(w, vars, escape))
            .collect::<Result<Vec<_>, _>>()
            .map_err(word_err)?,
        Body::Text(text) => expand_words(text, vars, escape).map_err(word_err)?,
    };
    if args.len() < 2 {
        return Err(DockerfilePlanError::Invalid {
            line,
            message: format!("{} needs a source and a destination", ins.keyword.name()),
        });
    }
    let dest = args.pop().unwrap_or_default();
    Ok((args, dest))
}

/// `--chown` (expanded) and `--chmod` (octal) of a COPY/ADD.
fn owner_and_mode(
    ins: &Instruction,
    vars: &Vars,
    escape: char,
) -> Result<(Option<String>, Option<u32>), DockerfilePlanError> {
    let line = ins.line;
    let owner = match ins.flag("chown") {
        Some(raw) => Some(
            expand_word(raw, vars, escape)
                .map_err(|source| DockerfilePlanError::Word { line, source })?,
        ),
        None => None,
    };
    let mode = match ins.flag("chmod") {
        Some(raw) => Some(parse_mode(raw).ok_or_else(|| DockerfilePlanError::Invalid {
            line,
            message: format!("bad --chmod {raw:?} (octal expected)"),
        })?),
        None => None,
    };
    Ok((owner, mode))
}

/// Resolves `.` and `..` in an absolute path.
fn clean_absolute(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::builder::context::EntryKind;
    use std::fs;

    struct Fixture {
        dir: tempfile::TempDir,
        args: BTreeMap<String, String>,
        config: E2bToml,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join("requirements.txt"), "flask==3.0\n").unwrap();
            fs::create_dir_all(dir.path().join("app")).unwrap();
            fs::write(dir.path().join("app/main.py"), "print('hi')\n").unwrap();
            fs::write(dir.path().join("app/.env"), "SECRET=1\n").unwrap();
            fs::write(dir.path().join(".dockerignore"), "**/.env\n").unwrap();
            Fixture {
                dir,
                args: BTreeMap::new(),
                config: E2bToml::default(),
            }
        }

        fn plan(&self, text: &str) -> Result<BuildPlan, DockerfilePlanError> {
            let context = BuildContext::open(self.dir.path()).unwrap();
            plan_dockerfile(&DockerfileInput {
                dockerfile: text,
                context: &context,
                build_args: &self.args,
                config: &self.config,
                rootfs: Path::new("/nonexistent/rootfs"),
            })
        }
    }

    fn run_argv(plan: &BuildPlan, i: usize) -> Vec<String> {
        match &plan.steps[i].action {
            StepAction::Run { argv } => argv.clone(),
            other => panic!("step {i} is not RUN: {other:?}"),
        }
    }

    #[test]
    fn typical_template_plans_steps_with_state() {
        let mut f = Fixture::new();
        f.config.start_cmd = Some("python3 -m http.server 8000".into());
        let plan = f
            .plan(
                "FROM python:3.11\n\
                 ENV PIP_NO_CACHE_DIR=1 APP_HOME=/app\n\
                 WORKDIR $APP_HOME\n\
                 COPY requirements.txt .\n\
                 RUN pip install -r requirements.txt\n\
                 COPY app/ ./src/\n\
                 USER user\n\
                 RUN [\"python3\", \"-V\"]\n",
            )
            .unwrap();
        let ids: Vec<&str> = plan.steps.iter().map(|s| s.id.as_str()).collect();
        // ENV (2) and USER (6) make no layer but keep the SDK's step numbering.
        assert_eq!(ids, vec!["base", "2", "3", "4", "5", "7"]);
        assert_eq!(plan.steps[1].title, "WORKDIR /app");
        match &plan.steps[2].action {
            StepAction::Copy { entries, .. } => {
                assert_eq!(entries[0].target, "/app/requirements.txt");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            run_argv(&plan, 3),
            vec!["/bin/sh", "-c", "pip install -r requirements.txt"]
        );
        assert_eq!(plan.steps[3].state.user, "root");
        assert_eq!(plan.steps[3].state.workdir, "/app");
        assert_eq!(plan.steps[3].state.env["PIP_NO_CACHE_DIR"], "1");
        match &plan.steps[4].action {
            StepAction::Copy { entries, .. } => {
                let targets: Vec<&str> = entries.iter().map(|e| e.target.as_str()).collect();
                assert_eq!(targets, vec!["/app/src", "/app/src/main.py"]);
                assert_eq!(entries[0].kind, EntryKind::Dir);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(run_argv(&plan, 5), vec!["python3", "-V"]);
        assert_eq!(plan.steps[5].state.user, "user");
        assert_eq!(plan.final_state.user, "user");
        assert_eq!(plan.final_state.workdir, "/app");
        assert_eq!(
            plan.start_cmd.as_deref(),
            Some("python3 -m http.server 8000")
        );
    }

    #[test]
    fn defaults_for_sandboxes_when_dockerfile_sets_no_user_or_workdir() {
        let f = Fixture::new();
        let plan = f
            .plan("FROM e2bdev/code-interpreter:latest\nRUN echo hi\n")
            .unwrap();
        assert_eq!(plan.steps[1].state.user, "root");
        assert_eq!(plan.steps[1].state.workdir, "/");
        assert_eq!(plan.final_state.user, "user");
        assert_eq!(plan.final_state.workdir, "/home/user");
        assert_eq!(
            plan.final_state.env["PATH"],
            crate::templates::builder::plan::DEFAULT_PATH
        );
    }

    #[test]
    fn args_with_defaults_build_args_and_global_scope() {
        let mut f = Fixture::new();
        f.args.insert("PY".into(), "3.11".into());
        f.args.insert("UNUSED".into(), "x".into());
        let plan = f
            .plan(
                "ARG BASE=debian\nARG TAG=bookworm\nFROM ${BASE}:${TAG}\n\
                 ARG PY=3.9\nARG GREETING=\"hello world\"\nARG TAG\n\
                 RUN echo $PY\n",
            )
            .unwrap();
        let run = &plan.steps[0];
        assert_eq!(run.state.build_args["PY"], "3.11");
        assert_eq!(run.state.build_args["GREETING"], "hello world");
        assert_eq!(run.state.build_args["TAG"], "bookworm");
        assert!(plan.final_state.build_args.is_empty());
        assert!(
            plan.warnings.iter().any(|w| w.contains("UNUSED")),
            "{:?}",
            plan.warnings
        );
        match &plan.base {
            BaseSource::Image(image) => assert_eq!(image.image, "debian:bookworm"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn build_arg_values_change_cache_keys() {
        let mut f = Fixture::new();
        let text = "FROM debian\nARG V=1\nRUN echo $V\n";
        let a = f.plan(text).unwrap();
        f.args.insert("V".into(), "2".into());
        let b = f.plan(text).unwrap();
        assert_ne!(a.final_key(), b.final_key());
        f.args.insert("V".into(), "1".into());
        let c = f.plan(text).unwrap();
        assert_eq!(a.final_key(), c.final_key());
    }

    #[test]
    fn copy_keys_follow_file_contents() {
        let f = Fixture::new();
        let text = "FROM debian\nCOPY requirements.txt /r.txt\nRUN cat /r.txt\n";
        let a = f.plan(text).unwrap();
        let again = f.plan(text).unwrap();
        assert_eq!(a.final_key(), again.final_key());
        fs::write(f.dir.path().join("requirements.txt"), "flask==3.1\n").unwrap();
        let b = f.plan(text).unwrap();
        assert_ne!(a.steps[0].cache_key, b.steps[0].cache_key);
        assert_ne!(a.final_key(), b.final_key());
        // A change in an ignored file does not invalidate a directory copy.
        let text = "FROM debian\nCOPY app /app\n";
        let c = f.plan(text).unwrap();
        fs::write(f.dir.path().join("app/.env"), "SECRET=2\n").unwrap();
        let d = f.plan(text).unwrap();
        assert_eq!(c.final_key(), d.final_key());
    }

    #[test]
    fn env_forms_and_substitution_order() {
        let f = Fixture::new();
        let plan = f
            .plan(
                "FROM debian\nENV A=1\nENV B=$A C=\"two words\" A=3\nENV LEGACY value with spaces\nRUN true\n",
            )
            .unwrap();
        let env = &plan.steps[0].state.env;
        assert_eq!(env["A"], "3");
        assert_eq!(env["B"], "1");
        assert_eq!(env["C"], "two words");
        assert_eq!(env["LEGACY"], "value with spaces");
    }

    #[test]
    fn copy_flags_and_errors() {
        let f = Fixture::new();
        let plan = f
            .plan("FROM debian\nCOPY --chown=user:user --chmod=0755 app/main.py /usr/local/bin/main\n")
            .unwrap();
        match &plan.steps[0].action {
            StepAction::Copy {
                owner,
                mode,
                entries,
                ..
            } => {
                assert_eq!(owner.as_deref(), Some("user:user"));
                assert_eq!(*mode, Some(0o755));
                assert_eq!(entries[0].target, "/usr/local/bin/main");
            }
            other => panic!("{other:?}"),
        }
        let err = |text: &str| f.plan(text).unwrap_err().to_string();
        assert!(err("FROM debian\nCOPY --from=builder /a /b\n").contains("builder"));
        assert!(err("FROM debian AS b\nFROM debian AS B\n").contains("already exists"));
        assert!(err("FROM debian AS 1x\n").contains("bad stage name"));
        assert!(
            err("FROM debian AS b\nFROM debian\nCOPY --from=b /a/*.py /x/\n").contains("wildcard")
        );
        assert!(err("FROM debian AS b\nFROM debian\nADD --from=b /a /x\n").contains("COPY --from"));
        assert!(err("FROM debian\nCOPY missing.txt /x\n").contains("missing.txt"));
        assert!(err("FROM debian\nCOPY app/.env /x\n").contains("not found"));
        assert!(err("FROM debian\nCOPY requirements.txt app /dest\n").contains("ending in /"));
        assert!(err("FROM debian\nADD https://example.com/x.tgz /opt/\n").contains("URL"));
        assert!(err("FROM debian\nCOPY --chmod=abc requirements.txt /x\n").contains("chmod"));
        assert!(err("FROM alpine:3\nRUN true\n").contains("no registry access"));
        assert!(err("RUN true\nFROM debian\n").contains("before FROM"));
        assert!(err("FROM debian\nSHELL /bin/bash -c\n").contains("JSON"));
        assert!(err("FROM debian\nENV A=\"open\n").contains("line 2"));
    }

    #[test]
    fn shell_instruction_changes_run_and_ignored_instructions_warn() {
        let f = Fixture::new();
        let plan = f
            .plan("FROM debian\nSHELL [\"/bin/bash\", \"-euo\", \"pipefail\", \"-c\"]\nRUN echo hi | cat\nEXPOSE 8000\nCMD [\"python3\"]\nRUN --mount=type=cache,target=/root/.cache true\n")
            .unwrap();
        assert_eq!(
            run_argv(&plan, 0),
            vec!["/bin/bash", "-euo", "pipefail", "-c", "echo hi | cat"]
        );
        assert!(plan.warnings.iter().any(|w| w.contains("CMD")));
        assert!(plan.warnings.iter().any(|w| w.contains("--mount")));
        assert_eq!(plan.steps[1].id, "5");
    }

    #[test]
    fn workdir_is_relative_to_the_previous_one() {
        let f = Fixture::new();
        let plan = f
            .plan("FROM debian\nWORKDIR /a\nWORKDIR b/../c\nRUN pwd\n")
            .unwrap();
        assert_eq!(plan.steps[1].title, "WORKDIR /a/c");
        assert_eq!(plan.steps[2].state.workdir, "/a/c");
    }

    #[test]
    fn stages_plan_on_their_own_and_the_last_one_is_the_template() {
        let f = Fixture::new();
        let text = "ARG V=1\nFROM debian:12 AS Build\nENV IN_BUILD=$V\nRUN make\n\
                    FROM debian:12\nCOPY --from=build --chown=user /out/app /usr/local/bin/app\n\
                    COPY --from=0 /a /b /opt/\n";
        let plan = f.plan(text).unwrap();
        assert_eq!(plan.stages.len(), 1);
        assert_eq!(plan.stages[0].name.as_deref(), Some("build"));
        assert_eq!(plan.stages[0].plan.final_state.env["IN_BUILD"], "");
        // The template does not inherit the stage's environment; step ids count on across stages.
        assert!(!plan.final_state.env.contains_key("IN_BUILD"));
        assert_eq!(plan.steps[0].id, "3");
        let StepAction::CopyFrom {
            stage,
            stage_key,
            sources,
            dest,
            dest_is_dir,
            owner,
            ..
        } = &plan.steps[0].action
        else {
            panic!("{:?}", plan.steps[0].action)
        };
        assert_eq!(
            (
                *stage,
                stage_key,
                sources,
                dest.as_str(),
                *dest_is_dir,
                owner.as_deref()
            ),
            (
                0,
                &plan.stages[0].plan.final_key(),
                &vec!["/out/app".to_string()],
                "/usr/local/bin/app",
                false,
                Some("user")
            )
        );
        let StepAction::CopyFrom {
            sources,
            dest,
            dest_is_dir,
            ..
        } = &plan.steps[1].action
        else {
            panic!()
        };
        assert_eq!(
            (sources.len(), dest.as_str(), *dest_is_dir),
            (2, "/opt", true)
        );
        assert_eq!(plan.needed_stages(), vec![0]);
        // A change inside the stage changes the template's key through the COPY.
        let changed = f.plan(&text.replace("RUN make", "RUN make all")).unwrap();
        assert_ne!(changed.final_key(), plan.final_key());
        // FROM <stage> starts from the stage, its environment included.
        let from_stage = f
            .plan("FROM debian AS b\nENV X=1\nFROM b\nRUN echo $X\n")
            .unwrap();
        assert!(matches!(
            from_stage.base,
            BaseSource::Stage { index: 0, .. }
        ));
        assert_eq!(from_stage.steps[0].state.env["X"], "1");
    }
}
