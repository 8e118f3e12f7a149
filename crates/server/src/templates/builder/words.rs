//! Dockerfile word processing: quote removal, escapes and `$VAR` / `${VAR:-default}` substitution, the way
//! Docker applies them to ENV, ARG, WORKDIR, USER, COPY and ADD (RUN is left to the shell).

use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WordError {
    #[error("unterminated quote in {0:?}")]
    UnterminatedQuote(String),
    #[error("unterminated ${{...}} in {0:?}")]
    UnterminatedBrace(String),
    #[error("bad substitution {0:?}")]
    BadSubstitution(String),
    #[error("variable {name} is required: {message}")]
    Required { name: String, message: String },
}

/// Variables visible to word expansion: the build's ENV over its declared ARGs.
pub type Vars = BTreeMap<String, String>;

/// Expands `raw` into one word: quotes removed, escapes applied, variables substituted; whitespace kept.
pub fn expand_word(raw: &str, vars: &Vars, escape: char) -> Result<String, WordError> {
    let words = lex(raw, vars, escape, false)?;
    Ok(words.into_iter().next().unwrap_or_default())
}

/// Expands `raw` and splits it into words at unquoted whitespace (substituted values are not split again).
pub fn expand_words(raw: &str, vars: &Vars, escape: char) -> Result<Vec<String>, WordError> {
    lex(raw, vars, escape, true)
}

fn lex(raw: &str, vars: &Vars, escape: char, split: bool) -> Result<Vec<String>, WordError> {
    let chars: Vec<char> = raw.chars().collect();
    let mut words = Vec::new();
    let mut current = String::new();
    // A word exists even if empty when quotes were seen (`""` is one empty word).
    let mut word_started = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if split && c.is_whitespace() {
            if word_started {
                words.push(std::mem::take(&mut current));
                word_started = false;
            }
            i += 1;
            continue;
        }
        word_started = true;
        if c == escape {
            if let Some(&next) = chars.get(i + 1) {
                current.push(next);
                i += 2;
            } else {
                current.push(c);
                i += 1;
            }
        } else if c == '\'' {
            let end = find_char(&chars, i + 1, '\'')
                .ok_or_else(|| WordError::UnterminatedQuote(raw.to_string()))?;
            current.extend(&chars[i + 1..end]);
            i = end + 1;
        } else if c == '"' {
            i += 1;
            loop {
                let Some(&d) = chars.get(i) else {
                    return Err(WordError::UnterminatedQuote(raw.to_string()));
                };
                if d == '"' {
                    i += 1;
                    break;
                }
                if d == escape && matches!(chars.get(i + 1), Some('"' | '$') | Some('\\')) {
                    current.push(chars[i + 1]);
                    i += 2;
                } else if d == escape && chars.get(i + 1) == Some(&escape) {
                    current.push(escape);
                    i += 2;
                } else if d == '$' {
                    i = substitute(&chars, i, vars, escape, &mut current, raw)?;
                } else {
                    current.push(d);
                    i += 1;
                }
            }
        } else if c == '$' {
            i = substitute(&chars, i, vars, escape, &mut current, raw)?;
        } else {
            current.push(c);
            i += 1;
        }
    }
    if word_started || !split {
        words.push(current);
    }
    Ok(words)
}

fn find_char(chars: &[char], from: usize, wanted: char) -> Option<usize> {
    (from..chars.len()).find(|&j| chars[j] == wanted)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Handles a `$` at `chars[at]`; appends the value to `out` and returns the index after the reference.
fn substitute(
    chars: &[char],
    at: usize,
    vars: &Vars,
    escape: char,
    out: &mut String,
    raw: &str,
) -> Result<usize, WordError> {
    let Some(&next) = chars.get(at + 1) else {
        out.push('$');
        return Ok(at + 1);
    };
    if next == '{' {
        let close = matching_brace(chars, at + 2)
            .ok_or_else(|| WordError::UnterminatedBrace(raw.to_string()))?;
        let inner: String = chars[at + 2..close].iter().collect();
        out.push_str(&braced(&inner, vars, escape)?);
        return Ok(close + 1);
    }
    if is_name_char(next) && !next.is_ascii_digit() {
        let mut end = at + 1;
        while end < chars.len() && is_name_char(chars[end]) {
            end += 1;
        }
        let name: String = chars[at + 1..end].iter().collect();
        out.push_str(vars.get(&name).map(String::as_str).unwrap_or(""));
        return Ok(end);
    }
    out.push('$');
    Ok(at + 1)
}

fn matching_brace(chars: &[char], from: usize) -> Option<usize> {
    let mut depth = 1;
    for (j, &c) in chars.iter().enumerate().skip(from) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

/// `${name}`, `${name:-word}`, `${name-word}`, `${name:+word}`, `${name+word}`, `${name:?msg}`, `${name?msg}`.
fn braced(inner: &str, vars: &Vars, escape: char) -> Result<String, WordError> {
    let name_len = inner.chars().take_while(|&c| is_name_char(c)).count();
    if name_len == 0 {
        return Err(WordError::BadSubstitution(format!("${{{inner}}}")));
    }
    let (name, rest) = inner.split_at(name_len);
    let value = vars.get(name);
    if rest.is_empty() {
        return Ok(value.cloned().unwrap_or_default());
    }
    let (colon, op_and_word) = match rest.strip_prefix(':') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let mut op_chars = op_and_word.chars();
    let op = op_chars.next();
    let word = op_chars.as_str();
    // With a colon, an empty value counts as unset.
    let set = match value {
        Some(v) => !(colon && v.is_empty()),
        None => false,
    };
    match op {
        Some('-') => {
            if set {
                Ok(value.cloned().unwrap_or_default())
            } else {
                expand_word(word, vars, escape)
            }
        }
        Some('+') => {
            if set {
                expand_word(word, vars, escape)
            } else {
                Ok(String::new())
            }
        }
        Some('?') => {
            if set {
                Ok(value.cloned().unwrap_or_default())
            } else {
                Err(WordError::Required {
                    name: name.to_string(),
                    message: expand_word(word, vars, escape)?,
                })
            }
        }
        _ => Err(WordError::BadSubstitution(format!("${{{inner}}}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vars {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn plain_and_braced_variables_are_substituted() {
        let v = vars(&[("HOME", "/home/user"), ("V", "3.11")]);
        assert_eq!(
            expand_word("$HOME/app-${V}", &v, '\\').unwrap(),
            "/home/user/app-3.11"
        );
        assert_eq!(expand_word("$MISSING-x", &v, '\\').unwrap(), "-x");
        assert_eq!(expand_word("cost $5", &v, '\\').unwrap(), "cost $5");
        assert_eq!(expand_word("end$", &v, '\\').unwrap(), "end$");
    }

    #[test]
    fn default_and_alternative_forms() {
        let v = vars(&[("SET", "yes"), ("EMPTY", "")]);
        assert_eq!(expand_word("${UNSET:-def}", &v, '\\').unwrap(), "def");
        assert_eq!(expand_word("${EMPTY:-def}", &v, '\\').unwrap(), "def");
        assert_eq!(expand_word("${EMPTY-def}", &v, '\\').unwrap(), "");
        assert_eq!(expand_word("${SET:-def}", &v, '\\').unwrap(), "yes");
        assert_eq!(expand_word("${SET:+alt}", &v, '\\').unwrap(), "alt");
        assert_eq!(expand_word("${UNSET:+alt}", &v, '\\').unwrap(), "");
        assert_eq!(expand_word("${UNSET:-$SET}", &v, '\\').unwrap(), "yes");
        assert!(matches!(
            expand_word("${UNSET:?must be given}", &v, '\\'),
            Err(WordError::Required { .. })
        ));
        assert!(matches!(
            expand_word("${SET", &v, '\\'),
            Err(WordError::UnterminatedBrace(_))
        ));
        assert!(matches!(
            expand_word("${SET%x}", &v, '\\'),
            Err(WordError::BadSubstitution(_))
        ));
    }

    #[test]
    fn quotes_and_escapes() {
        let v = vars(&[("X", "1")]);
        assert_eq!(expand_word("'$X'", &v, '\\').unwrap(), "$X");
        assert_eq!(expand_word("\"$X y\"", &v, '\\').unwrap(), "1 y");
        assert_eq!(expand_word("\\$X", &v, '\\').unwrap(), "$X");
        assert_eq!(expand_word("\"a\\\"b\"", &v, '\\').unwrap(), "a\"b");
        assert_eq!(expand_word("`$X", &v, '`').unwrap(), "$X");
        assert!(matches!(
            expand_word("\"open", &v, '\\'),
            Err(WordError::UnterminatedQuote(_))
        ));
    }

    #[test]
    fn splitting_keeps_quoted_spaces_and_empty_words() {
        let v = vars(&[("A", "x y")]);
        assert_eq!(
            expand_words("  one \"two three\" $A '' ", &v, '\\').unwrap(),
            vec!["one", "two three", "x y", ""]
        );
        assert_eq!(expand_words("", &v, '\\').unwrap(), Vec::<String>::new());
    }
}
