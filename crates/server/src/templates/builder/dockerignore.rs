//! `.dockerignore`: which build-context files COPY and ADD may not see.
//!
//! Docker's rules: one pattern per line, `#` comments, a leading `/` is dropped, `*`/`?`/`[...]` do not
//! cross `/`, `**` spans directories, a pattern that matches a directory excludes all below it, `!` re-includes,
//! and the last matching pattern wins.

use globset::{GlobBuilder, GlobMatcher};

#[derive(Debug, thiserror::Error)]
pub enum DockerignoreError {
    #[error(".dockerignore line {line}: bad pattern {pattern:?}")]
    BadPattern {
        line: usize,
        pattern: String,
        #[source]
        source: globset::Error,
    },
}

#[derive(Debug, Clone)]
struct Rule {
    matcher: GlobMatcher,
    negated: bool,
}

/// Compiled ignore rules.
#[derive(Debug, Clone, Default)]
pub struct IgnoreRules {
    rules: Vec<Rule>,
}

impl IgnoreRules {
    pub fn parse(text: &str) -> Result<IgnoreRules, DockerignoreError> {
        let lines: Vec<(usize, String)> = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.to_string()))
            .collect();
        Self::from_patterns(lines)
    }

    /// Patterns as the SDK sends them (already one per entry), numbered from 1 for errors.
    pub fn from_list(patterns: &[String]) -> Result<IgnoreRules, DockerignoreError> {
        Self::from_patterns(
            patterns
                .iter()
                .enumerate()
                .map(|(i, p)| (i + 1, p.clone()))
                .collect(),
        )
    }

    fn from_patterns(lines: Vec<(usize, String)>) -> Result<IgnoreRules, DockerignoreError> {
        let mut rules = Vec::new();
        for (line, raw) in lines {
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let (negated, pattern) = match trimmed.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, trimmed),
            };
            let cleaned = clean(pattern);
            if cleaned.is_empty() {
                continue;
            }
            let glob = GlobBuilder::new(&cleaned)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|source| DockerignoreError::BadPattern {
                    line,
                    pattern: raw.clone(),
                    source,
                })?;
            rules.push(Rule {
                matcher: glob.compile_matcher(),
                negated,
            });
        }
        Ok(IgnoreRules { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// True when `relative` (a `/`-separated path inside the context) is excluded.
    pub fn is_ignored(&self, relative: &str) -> bool {
        let relative = relative.trim_start_matches("./").trim_matches('/');
        if relative.is_empty() || relative == "." {
            return false;
        }
        let prefixes: Vec<&str> = relative
            .match_indices('/')
            .map(|(i, _)| &relative[..i])
            .chain(std::iter::once(relative))
            .collect();
        let mut ignored = false;
        for rule in &self.rules {
            if prefixes.iter().any(|p| rule.matcher.is_match(p)) {
                ignored = !rule.negated;
            }
        }
        ignored
    }
}

/// Docker cleans each pattern like a path: drop a leading `/` and `./`, collapse `//`, resolve `.`.
fn clean(pattern: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in pattern.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_exclude_their_contents() {
        let rules = IgnoreRules::parse("node_modules\n# comment\n\n.git/\n").unwrap();
        assert!(rules.is_ignored("node_modules"));
        assert!(rules.is_ignored("node_modules/a/b.js"));
        assert!(rules.is_ignored(".git/HEAD"));
        assert!(!rules.is_ignored("src/node_modules_backup"));
        assert!(!rules.is_ignored("src/node_modules/x"));
    }

    #[test]
    fn star_does_not_cross_slashes_but_double_star_does() {
        let rules = IgnoreRules::parse("*.pyc\n**/__pycache__\ndocs/*.md\n").unwrap();
        assert!(rules.is_ignored("a.pyc"));
        assert!(!rules.is_ignored("pkg/a.pyc"));
        assert!(rules.is_ignored("pkg/sub/__pycache__/x.cpython.pyc"));
        assert!(rules.is_ignored("__pycache__"));
        assert!(rules.is_ignored("docs/readme.md"));
        assert!(!rules.is_ignored("docs/deep/readme.md"));
    }

    #[test]
    fn negation_reincludes_and_last_match_wins() {
        let rules = IgnoreRules::parse("*.md\n!README.md\nREADME*.md\n!README-keep.md\n").unwrap();
        assert!(rules.is_ignored("CHANGES.md"));
        assert!(rules.is_ignored("README.md"));
        assert!(!rules.is_ignored("README-keep.md"));
        let rules = IgnoreRules::parse("data\n!data/keep.txt\n").unwrap();
        assert!(rules.is_ignored("data/other.txt"));
        assert!(!rules.is_ignored("data/keep.txt"));
    }

    #[test]
    fn leading_slash_and_dot_are_cleaned() {
        let rules = IgnoreRules::parse("/secret.env\n./build//out\n").unwrap();
        assert!(rules.is_ignored("secret.env"));
        assert!(rules.is_ignored("build/out/x"));
        assert!(!rules.is_ignored("sub/secret.env"));
    }

    #[test]
    fn question_mark_and_classes() {
        let rules = IgnoreRules::parse("file?.txt\nlog[0-9]\n").unwrap();
        assert!(rules.is_ignored("file1.txt"));
        assert!(!rules.is_ignored("file10.txt"));
        assert!(rules.is_ignored("log7"));
        assert!(!rules.is_ignored("logx"));
    }

    #[test]
    fn context_root_is_never_ignored_and_bad_patterns_fail() {
        let rules = IgnoreRules::parse("*\n").unwrap();
        assert!(!rules.is_ignored("."));
        assert!(rules.is_ignored("anything"));
        assert!(IgnoreRules::parse("a[\n").is_err());
    }
}
