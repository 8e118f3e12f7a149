//! Dockerfile text → instructions: line continuations, comments, parser directives, keyword + flags +
//! body (JSON array or raw text). Meaning (variables, state, layers) is given to them by `plan`.

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DockerfileError {
    #[error("line {line}: unknown instruction {keyword:?}")]
    UnknownInstruction { line: usize, keyword: String },
    #[error("line {line}: {keyword} needs arguments")]
    MissingArguments { line: usize, keyword: String },
    #[error("line {line}: {keyword} is not supported by Warren template builds: {why}")]
    Unsupported {
        line: usize,
        keyword: String,
        why: String,
    },
    #[error("line {line}: bad flag {flag:?}")]
    BadFlag { line: usize, flag: String },
    #[error("the Dockerfile has no FROM instruction")]
    NoFrom,
}

/// Instruction keywords Warren understands. `Ignored` ones are accepted and have no effect on the build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyword {
    From,
    Run,
    Env,
    Arg,
    Workdir,
    User,
    Copy,
    Add,
    Shell,
    Cmd,
    Entrypoint,
    Expose,
    Label,
    Maintainer,
    Volume,
    Stopsignal,
    Healthcheck,
    Onbuild,
}

impl Keyword {
    fn parse(word: &str) -> Option<Keyword> {
        Some(match word.to_ascii_uppercase().as_str() {
            "FROM" => Keyword::From,
            "RUN" => Keyword::Run,
            "ENV" => Keyword::Env,
            "ARG" => Keyword::Arg,
            "WORKDIR" => Keyword::Workdir,
            "USER" => Keyword::User,
            "COPY" => Keyword::Copy,
            "ADD" => Keyword::Add,
            "SHELL" => Keyword::Shell,
            "CMD" => Keyword::Cmd,
            "ENTRYPOINT" => Keyword::Entrypoint,
            "EXPOSE" => Keyword::Expose,
            "LABEL" => Keyword::Label,
            "MAINTAINER" => Keyword::Maintainer,
            "VOLUME" => Keyword::Volume,
            "STOPSIGNAL" => Keyword::Stopsignal,
            "HEALTHCHECK" => Keyword::Healthcheck,
            "ONBUILD" => Keyword::Onbuild,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Keyword::From => "FROM",
            Keyword::Run => "RUN",
            Keyword::Env => "ENV",
            Keyword::Arg => "ARG",
            Keyword::Workdir => "WORKDIR",
            Keyword::User => "USER",
            Keyword::Copy => "COPY",
            Keyword::Add => "ADD",
            Keyword::Shell => "SHELL",
            Keyword::Cmd => "CMD",
            Keyword::Entrypoint => "ENTRYPOINT",
            Keyword::Expose => "EXPOSE",
            Keyword::Label => "LABEL",
            Keyword::Maintainer => "MAINTAINER",
            Keyword::Volume => "VOLUME",
            Keyword::Stopsignal => "STOPSIGNAL",
            Keyword::Healthcheck => "HEALTHCHECK",
            Keyword::Onbuild => "ONBUILD",
        }
    }

    /// Keywords that only describe an image for a container engine; a sandbox template has no use for them.
    pub fn is_ignored(self) -> bool {
        matches!(
            self,
            Keyword::Cmd
                | Keyword::Entrypoint
                | Keyword::Expose
                | Keyword::Label
                | Keyword::Maintainer
                | Keyword::Volume
                | Keyword::Stopsignal
                | Keyword::Healthcheck
                | Keyword::Onbuild
        )
    }
}

/// The arguments after the keyword and its flags.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// `["a", "b"]`: exec form, no shell, no substitution.
    Json(Vec<String>),
    /// Everything else, as written (continuations joined).
    Text(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Instruction {
    /// 1-based line where the instruction starts.
    pub line: usize,
    pub keyword: Keyword,
    /// `--name=value` flags before the body (`--link` alone has an empty value).
    pub flags: Vec<(String, String)>,
    pub body: Body,
    /// The instruction as written, continuations joined; shown in build logs.
    pub original: String,
}

impl Instruction {
    pub fn flag(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Dockerfile {
    /// The escape character (`\` unless a `# escape=` directive says otherwise).
    pub escape: char,
    pub instructions: Vec<Instruction>,
}

/// Parses Dockerfile text. Structure only: unknown keywords, missing arguments and heredocs are
/// errors here; everything else (stages among it) is checked by the planner.
pub fn parse(text: &str) -> Result<Dockerfile, DockerfileError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text.lines().collect();
    let escape = directive_escape(&lines);
    let mut instructions = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            i += 1;
            continue;
        }
        let start_line = i + 1;
        let mut joined = String::new();
        loop {
            let piece = lines[i];
            i += 1;
            let piece_trimmed_end = piece.trim_end();
            if let Some(without) = piece_trimmed_end.strip_suffix(escape) {
                joined.push_str(without);
                // Skip comment and blank lines inside a continued instruction, as Docker does.
                while i < lines.len() {
                    let t = lines[i].trim_start();
                    if t.is_empty() || t.starts_with('#') {
                        i += 1;
                    } else {
                        break;
                    }
                }
                if i >= lines.len() {
                    break;
                }
            } else {
                joined.push_str(piece);
                break;
            }
        }
        instructions.push(parse_instruction(start_line, joined.trim())?);
    }
    if !instructions.iter().any(|ins| ins.keyword == Keyword::From) {
        return Err(DockerfileError::NoFrom);
    }
    Ok(Dockerfile {
        escape,
        instructions,
    })
}

/// Parser directives are `# key=value` lines at the very top; only `escape` changes how Warren reads the
/// file (`syntax` and `check` are ignored).
fn directive_escape(lines: &[&str]) -> char {
    for line in lines {
        let Some(rest) = line.trim().strip_prefix('#') else {
            break;
        };
        let Some((key, value)) = rest.split_once('=') else {
            break;
        };
        let key = key.trim().to_ascii_lowercase();
        if key.contains(char::is_whitespace) {
            break;
        }
        if key == "escape" {
            match value.trim() {
                "`" => return '`',
                _ => return '\\',
            }
        }
    }
    '\\'
}

fn parse_instruction(line: usize, text: &str) -> Result<Instruction, DockerfileError> {
    let (word, rest) = match text.find(char::is_whitespace) {
        Some(pos) => (&text[..pos], text[pos..].trim_start()),
        None => (text, ""),
    };
    let keyword = Keyword::parse(word).ok_or_else(|| DockerfileError::UnknownInstruction {
        line,
        keyword: word.to_string(),
    })?;
    let (flags, body_text) = take_flags(line, keyword, rest)?;
    if body_text.is_empty() && !matches!(keyword, Keyword::Cmd | Keyword::Entrypoint) {
        return Err(DockerfileError::MissingArguments {
            line,
            keyword: keyword.name().into(),
        });
    }
    if body_text.starts_with("<<") && matches!(keyword, Keyword::Run | Keyword::Copy | Keyword::Add)
    {
        return Err(DockerfileError::Unsupported {
            line,
            keyword: keyword.name().into(),
            why: "heredocs are not supported; put the script in a file and COPY it".into(),
        });
    }
    let body = if matches!(
        keyword,
        Keyword::Run
            | Keyword::Cmd
            | Keyword::Entrypoint
            | Keyword::Shell
            | Keyword::Copy
            | Keyword::Add
            | Keyword::Volume
    ) {
        parse_json_array(body_text)
            .map(Body::Json)
            .unwrap_or_else(|| Body::Text(body_text.to_string()))
    } else {
        Body::Text(body_text.to_string())
    };
    Ok(Instruction {
        line,
        keyword,
        flags,
        body,
        original: text.to_string(),
    })
}

type Flags = Vec<(String, String)>;

/// Leading `--name=value` flags of RUN, COPY, ADD and FROM.
fn take_flags(
    line: usize,
    keyword: Keyword,
    mut rest: &str,
) -> Result<(Flags, &str), DockerfileError> {
    let mut flags = Vec::new();
    if !matches!(
        keyword,
        Keyword::Run | Keyword::Copy | Keyword::Add | Keyword::From | Keyword::Healthcheck
    ) {
        return Ok((flags, rest));
    }
    while let Some(after) = rest.strip_prefix("--") {
        let end = after.find(char::is_whitespace).unwrap_or(after.len());
        let flag = &after[..end];
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n, v),
            None => (flag, ""),
        };
        if name.is_empty() {
            return Err(DockerfileError::BadFlag {
                line,
                flag: format!("--{flag}"),
            });
        }
        flags.push((name.to_string(), value.to_string()));
        rest = after[end..].trim_start();
    }
    Ok((flags, rest))
}

/// `["a", "b"]` → `Some(vec)`; anything that is not a JSON array of strings → `None` (shell form).
fn parse_json_array(text: &str) -> Option<Vec<String>> {
    if !text.starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_text(ins: &Instruction) -> &str {
        match &ins.body {
            Body::Text(t) => t,
            Body::Json(_) => panic!("expected text body"),
        }
    }

    #[test]
    fn parses_typical_e2b_dockerfile() {
        let df = parse(
            "# syntax=docker/dockerfile:1\n\
             FROM e2bdev/code-interpreter:latest\n\
             \n\
             # install deps\n\
             run apt-get update && \\\n    apt-get install -y curl\n\
             ENV PATH=/opt/bin:$PATH\n\
             COPY --chown=user:user requirements.txt /home/user/\n\
             CMD [\"python3\"]\n",
        )
        .unwrap();
        assert_eq!(df.escape, '\\');
        let kws: Vec<Keyword> = df.instructions.iter().map(|i| i.keyword).collect();
        assert_eq!(
            kws,
            vec![
                Keyword::From,
                Keyword::Run,
                Keyword::Env,
                Keyword::Copy,
                Keyword::Cmd
            ]
        );
        assert_eq!(df.instructions[1].line, 5);
        assert_eq!(
            body_text(&df.instructions[1]),
            "apt-get update &&     apt-get install -y curl"
        );
        assert_eq!(df.instructions[3].flag("chown"), Some("user:user"));
        assert_eq!(
            df.instructions[4].body,
            Body::Json(vec!["python3".to_string()])
        );
    }

    #[test]
    fn comments_and_blank_lines_inside_continuations_are_dropped() {
        let df = parse("FROM debian\nRUN a \\\n# note\n\n  && b\n").unwrap();
        assert_eq!(body_text(&df.instructions[1]), "a   && b");
    }

    #[test]
    fn exec_form_and_shell_form() {
        let df = parse("FROM debian\nRUN [\"echo\", \"a b\"]\nRUN [not json\n").unwrap();
        assert_eq!(
            df.instructions[1].body,
            Body::Json(vec!["echo".into(), "a b".into()])
        );
        assert_eq!(body_text(&df.instructions[2]), "[not json");
    }

    #[test]
    fn escape_directive_changes_continuation() {
        let df = parse("# escape=`\nFROM debian\nRUN echo a `\n  b\n").unwrap();
        assert_eq!(df.escape, '`');
        assert_eq!(body_text(&df.instructions[1]), "echo a   b");
    }

    #[test]
    fn directive_after_instruction_is_a_comment() {
        let df = parse("FROM debian\n# escape=`\nRUN echo `\n").unwrap();
        assert_eq!(df.escape, '\\');
        assert_eq!(body_text(&df.instructions[1]), "echo `");
    }

    #[test]
    fn flags_are_split_off() {
        let df = parse("FROM --platform=linux/amd64 debian\nRUN --mount=type=cache,target=/root/.cache pip install x\nCOPY --link --chmod=755 a /b\n").unwrap();
        assert_eq!(df.instructions[0].flag("platform"), Some("linux/amd64"));
        assert_eq!(body_text(&df.instructions[0]), "debian");
        assert_eq!(body_text(&df.instructions[1]), "pip install x");
        assert_eq!(df.instructions[2].flag("link"), Some(""));
        assert_eq!(df.instructions[2].flag("chmod"), Some("755"));
    }

    #[test]
    fn errors_are_clear() {
        assert_eq!(parse("RUN x\n"), Err(DockerfileError::NoFrom));
        assert!(matches!(
            parse("FROM debian\nFROOM x\n"),
            Err(DockerfileError::UnknownInstruction { line: 2, .. })
        ));
        assert!(matches!(
            parse("FROM debian\nRUN\n"),
            Err(DockerfileError::MissingArguments { line: 2, .. })
        ));
        // Several stages are the planner's business.
        assert_eq!(
            parse("FROM a AS b\nFROM debian\n")
                .unwrap()
                .instructions
                .len(),
            2
        );
        assert!(matches!(
            parse("FROM debian\nRUN <<EOF\necho\nEOF\n"),
            Err(DockerfileError::Unsupported { line: 2, .. })
        ));
    }

    #[test]
    fn keywords_are_case_insensitive_and_crlf_is_fine() {
        let df = parse("from debian\r\nWorkDir /app\r\n").unwrap();
        assert_eq!(df.instructions[1].keyword, Keyword::Workdir);
        assert_eq!(body_text(&df.instructions[1]), "/app");
    }
}
