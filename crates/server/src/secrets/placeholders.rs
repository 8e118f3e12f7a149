//! `${e2b.secrets.<name>}`: the placeholder the SDK's `Secret.fill(name)` writes. It may stand alone
//! or inside a longer string (`"Bearer ${e2b.secrets.openai}"`); each one is replaced by the
//! secret's current value on the host. Names are matched as stored (lower-cased).

use std::collections::{BTreeMap, BTreeSet};

/// What opens a placeholder.
pub const OPEN: &str = "${e2b.secrets.";

/// The names (lower-cased) of the placeholders in `text`, or why one is malformed (the message
/// quotes the placeholder, never anything around it).
pub fn names(text: &str) -> Result<BTreeSet<String>, String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find('}') else {
            return Err(format!("an unterminated {OPEN}...}} placeholder"));
        };
        let name = &after[..end];
        let canonical = super::canonical_name(name)
            .map_err(|reason| format!("placeholder {OPEN}{name}}}: {reason}"))?;
        found.insert(canonical);
        rest = &after[end + 1..];
    }
    Ok(found)
}

/// `text` with every placeholder replaced by `values[name]`; `None` when a name has no value (the
/// caller checked them all with [`names`] first).
pub fn substitute(text: &str, values: &BTreeMap<String, String>) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        let end = after.find('}')?;
        out.push_str(values.get(&after[..end].to_ascii_lowercase())?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// The placeholder for `name`, as the SDK writes it.
pub fn placeholder(name: &str) -> String {
    format!("{OPEN}{name}}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_found_anywhere_in_a_string() {
        assert!(names("plain $HOME ${other}").unwrap().is_empty());
        let found =
            names("Bearer ${e2b.secrets.OpenAI} and ${e2b.secrets.b-2}${e2b.secrets.openai}")
                .unwrap();
        assert_eq!(
            found.into_iter().collect::<Vec<_>>(),
            vec!["b-2".to_string(), "openai".to_string()]
        );
        assert!(names("${e2b.secrets.open").is_err());
        assert!(names("${e2b.secrets.}").is_err());
        let error = names("x ${e2b.secrets.a b} y").unwrap_err();
        assert!(error.contains("${e2b.secrets.a b}"), "{error}");
    }

    #[test]
    fn substitution_replaces_each_placeholder_and_needs_every_value() {
        let values = BTreeMap::from([
            ("openai".to_string(), "sk-1".to_string()),
            ("b".to_string(), "${e2b.secrets.openai}".to_string()),
        ]);
        assert_eq!(
            substitute("Bearer ${e2b.secrets.OpenAI}!", &values).as_deref(),
            Some("Bearer sk-1!")
        );
        // A value that looks like a placeholder is not expanded again.
        assert_eq!(
            substitute("${e2b.secrets.b}", &values).as_deref(),
            Some("${e2b.secrets.openai}")
        );
        assert_eq!(
            substitute("no placeholders", &values).as_deref(),
            Some("no placeholders")
        );
        assert_eq!(substitute("${e2b.secrets.missing}", &values), None);
        assert_eq!(placeholder("openai"), "${e2b.secrets.openai}");
    }
}
