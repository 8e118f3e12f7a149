//! The store's migrations, one source for both back ends (docs/cluster.md, "Database").
//!
//! The files in `crates/server/migrations/` are the source. They are written in the subset of SQL
//! the two databases share, with SQLite's names for column types, and SQLite runs them as they are:
//! sqlx records a checksum of every applied migration and refuses a database whose applied text
//! changed, so these files never change once released. PostgreSQL runs a rendering of the same
//! files made by [`to_postgres`]: the few SQLite type names become PostgreSQL's (64-bit integers,
//! double-precision reals, byte arrays, identity keys) and everything else is kept byte for byte.
//! A construct outside the shared subset (a `PRAGMA`, `INSERT OR IGNORE`, a `json_*` function, …)
//! makes the rendering fail, so a migration that would only work on one back end is caught by this
//! module's tests rather than by an operator's database.
//!
//! Booleans are integers 0/1 in both schemas (SQLite has no boolean type), so a row holds the same
//! values on either back end.

use std::borrow::Cow;

use futures_util::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, Migrator};

/// The migrations as SQLite runs them: the source files, embedded in the binary.
pub(super) static SQLITE: Migrator = sqlx::migrate!("./migrations");

#[derive(Debug, thiserror::Error)]
#[error("migration {version} cannot run on PostgreSQL: {reason}")]
pub struct RenderError {
    pub version: i64,
    pub reason: String,
}

/// Words that only SQLite understands (or understands differently); a migration using one needs a
/// construct both databases share instead.
const SQLITE_ONLY: &[&str] = &[
    "AUTOINCREMENT", // only in `INTEGER PRIMARY KEY AUTOINCREMENT`, which is rendered
    "PRAGMA",
    "ROWID",
    "WITHOUT",
    "STRICT",
    "GLOB",
    "REPLACE",
    "IGNORE",
    "VACUUM",
    "ATTACH",
    "DATETIME",
    "STRFTIME",
    "JULIANDAY",
    "UNIXEPOCH",
    "IFNULL",
];

#[derive(Debug, PartialEq)]
enum Token<'a> {
    Word(&'a str),
    /// Whitespace.
    Space(&'a str),
    /// Comments, literals, quoted names and punctuation: copied as they are.
    Other(&'a str),
}

/// Splits `sql` into words and the text between them, never looking inside comments, string
/// literals or quoted identifiers.
fn tokens(sql: &str) -> Result<Vec<Token<'_>>, String> {
    let bytes = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push(Token::Word(&sql[start..i]));
        } else if c.is_ascii_whitespace() {
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            out.push(Token::Space(&sql[start..i]));
        } else if sql[i..].starts_with("--") {
            i = sql[i..].find('\n').map_or(bytes.len(), |n| i + n);
            out.push(Token::Other(&sql[start..i]));
        } else if sql[i..].starts_with("/*") {
            let end = sql[i + 2..]
                .find("*/")
                .ok_or("a block comment is not closed")?;
            i += 2 + end + 2;
            out.push(Token::Other(&sql[start..i]));
        } else if c == b'\'' || c == b'"' || c == b'`' || c == b'[' {
            let close = if c == b'[' { b']' } else { c };
            if c == b'`' || c == b'[' {
                return Err("names quoted with ` or [] are SQLite's; use double quotes".into());
            }
            i += 1;
            loop {
                match bytes.get(i) {
                    None => return Err("a quoted literal or name is not closed".into()),
                    // A doubled quote stands for itself.
                    Some(&b) if b == close && bytes.get(i + 1) == Some(&close) => i += 2,
                    Some(&b) if b == close => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
            out.push(Token::Other(&sql[start..i]));
        } else {
            // One character (multi-byte ones whole).
            let len = sql[i..].chars().next().map_or(1, char::len_utf8);
            i += len;
            out.push(Token::Other(&sql[start..i]));
        }
    }
    Ok(out)
}

/// The PostgreSQL rendering of one migration (see the module documentation).
pub fn to_postgres(sql: &str) -> Result<String, String> {
    let tokens = tokens(sql)?;
    // The words after position `i`, skipping whitespace.
    let next_words = |i: usize, n: usize| -> Vec<(usize, &str)> {
        tokens[i + 1..]
            .iter()
            .enumerate()
            .filter(|(_, t)| !matches!(t, Token::Space(_)))
            .take(n)
            .map(|(k, t)| match t {
                Token::Word(w) => (i + 1 + k, *w),
                _ => (i + 1 + k, ""),
            })
            .collect()
    };
    let mut out = String::with_capacity(sql.len() + 64);
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Word(word) => {
                let upper = word.to_ascii_uppercase();
                if upper.starts_with("JSON") || upper.starts_with("SQLITE_") {
                    return Err(format!("{word} is SQLite's"));
                }
                match upper.as_str() {
                    "INTEGER" => {
                        let after = next_words(i, 3);
                        let words: Vec<String> =
                            after.iter().map(|(_, w)| w.to_ascii_uppercase()).collect();
                        if words == ["PRIMARY", "KEY", "AUTOINCREMENT"] {
                            // Numbers handed out once, never again after a delete (as
                            // AUTOINCREMENT promises).
                            out.push_str("BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY");
                            i = after[2].0 + 1;
                            continue;
                        }
                        if words.first().map(String::as_str) == Some("PRIMARY") {
                            return Err(
                                "an INTEGER PRIMARY KEY without AUTOINCREMENT reuses numbers on \
                                 SQLite; say AUTOINCREMENT or use another key"
                                    .into(),
                            );
                        }
                        out.push_str("BIGINT");
                    }
                    // Text compares byte by byte, as SQLite's default (BINARY) collation does,
                    // whatever the database's locale.
                    "TEXT" => out.push_str("TEXT COLLATE \"C\""),
                    "REAL" => out.push_str("DOUBLE PRECISION"),
                    "BLOB" => out.push_str("BYTEA"),
                    _ if SQLITE_ONLY.contains(&upper.as_str()) => {
                        return Err(format!("{word} is SQLite's"));
                    }
                    _ => out.push_str(word),
                }
            }
            Token::Space(text) | Token::Other(text) => out.push_str(text),
        }
        i += 1;
    }
    Ok(out)
}

/// Every migration rendered for PostgreSQL, with the versions and descriptions of the source.
pub fn postgres_migrations() -> Result<Vec<Migration>, RenderError> {
    SQLITE
        .iter()
        .map(|m| {
            let sql = to_postgres(&m.sql).map_err(|reason| RenderError {
                version: m.version,
                reason,
            })?;
            Ok(Migration::new(
                m.version,
                m.description.clone(),
                m.migration_type,
                Cow::Owned(sql),
                m.no_tx,
            ))
        })
        .collect()
}

/// [`postgres_migrations`] as a source for [`Migrator::new`].
#[derive(Debug)]
pub(super) struct Postgres;

impl<'s> MigrationSource<'s> for Postgres {
    fn resolve(self) -> BoxFuture<'s, Result<Vec<Migration>, BoxDynError>> {
        Box::pin(async { postgres_migrations().map_err(|e| Box::new(e) as BoxDynError) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_renamed_and_everything_else_is_kept() {
        let sql = "-- INTEGER in a comment stays; so does 'REAL' in a literal\n\
                   CREATE TABLE t (\n    seq INTEGER PRIMARY KEY AUTOINCREMENT,\n    \
                   n   integer NOT NULL DEFAULT 0, -- a REAL comment\n    x REAL,\n    \
                   b BLOB NOT NULL,\n    s TEXT DEFAULT 'it''s INTEGER',\n    \"REAL\" TEXT\n);\n\
                   CREATE INDEX t_n ON t (n) WHERE x IS NOT NULL;\n";
        assert_eq!(
            to_postgres(sql).unwrap(),
            "-- INTEGER in a comment stays; so does 'REAL' in a literal\n\
             CREATE TABLE t (\n    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n    \
             n   BIGINT NOT NULL DEFAULT 0, -- a REAL comment\n    x DOUBLE PRECISION,\n    \
             b BYTEA NOT NULL,\n    s TEXT COLLATE \"C\" DEFAULT 'it''s INTEGER',\n    \"REAL\" TEXT COLLATE \"C\"\n);\n\
             CREATE INDEX t_n ON t (n) WHERE x IS NOT NULL;\n"
        );
    }

    #[test]
    fn sqlite_only_constructs_are_refused() {
        for sql in [
            "INSERT OR IGNORE INTO t VALUES (1)",
            "REPLACE INTO t VALUES (1)",
            "PRAGMA foreign_keys = ON",
            "CREATE TABLE t (a TEXT) WITHOUT ROWID",
            "SELECT json_extract(a, '$.b') FROM t",
            "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT)",
            "CREATE TABLE `t` (a TEXT)",
            "SELECT 'unclosed",
            "/* unclosed",
        ] {
            assert!(to_postgres(sql).is_err(), "{sql}");
        }
        // Words that merely contain a refused one are names like any other.
        assert!(to_postgres("CREATE TABLE ignored_rows (replaced TEXT)").is_ok());
    }

    #[test]
    fn every_migration_renders_and_keeps_its_version() {
        let rendered = postgres_migrations().unwrap();
        assert_eq!(rendered.len(), SQLITE.iter().count());
        for (pg, lite) in rendered.iter().zip(SQLITE.iter()) {
            assert_eq!(
                (pg.version, &pg.description),
                (lite.version, &lite.description)
            );
            // No SQLite type name is left outside comments and literals.
            let words = tokens(&pg.sql).unwrap();
            for word in ["INTEGER", "REAL", "BLOB", "AUTOINCREMENT"] {
                assert!(
                    !words
                        .iter()
                        .any(|t| matches!(t, Token::Word(w) if w.eq_ignore_ascii_case(word))),
                    "{word} in migration {}",
                    pg.version
                );
            }
        }
    }

    /// sqlx refuses a database whose applied migrations changed: the renderings of released
    /// migrations are as fixed as their source. A new migration appends its checksum here.
    #[test]
    fn released_renderings_never_change() {
        let sums: Vec<(i64, String)> = postgres_migrations()
            .unwrap()
            .iter()
            .map(|m| (m.version, hex::encode(&m.checksum)[..16].to_string()))
            .collect();
        let released: &[(i64, &str)] = RELEASED_POSTGRES;
        assert_eq!(
            sums.iter()
                .map(|(v, s)| (*v, s.as_str()))
                .collect::<Vec<_>>(),
            released,
            "the PostgreSQL rendering of a migration changed (or a new one has no entry)"
        );
    }

    /// The SQLite text is the source and is never edited once released (databases that applied it
    /// would refuse to start): its checksums are pinned like the renderings'.
    #[test]
    fn released_sources_never_change() {
        let sums: Vec<(i64, String)> = SQLITE
            .iter()
            .map(|m| (m.version, hex::encode(&m.checksum)[..16].to_string()))
            .collect();
        assert_eq!(
            sums.iter()
                .map(|(v, s)| (*v, s.as_str()))
                .collect::<Vec<_>>(),
            RELEASED_SQLITE,
            "a released migration's text changed (or a new one has no entry)"
        );
    }

    const RELEASED_SQLITE: &[(i64, &str)] = &[
        (1, "c3be513b7df0b83d"),
        (2, "404ff35aef6603ef"),
        (3, "bfb9cef4b67dcccd"),
        (4, "f9e01cf725c48504"),
        (5, "ea8b7460bcb8b8c5"),
        (6, "0c721e6a4e78307b"),
        (7, "1caec6f8cb6f929c"),
        (8, "4469d3b2c167098e"),
        (9, "2123ae1d3a6e48c0"),
        (10, "4e1bc39c3718e01d"),
        (11, "66d66a1ebbf3ccae"),
        (12, "7a911fdb58c5dcdf"),
        (13, "798dee3c7a2216a2"),
        (14, "8f40db5aa4eea1b2"),
        (15, "045741c6dd222638"),
        (16, "79fab64c4a63b0fa"),
        (17, "0cb73bc98fe0ee19"),
        (18, "59efe2bd6512b997"),
        (19, "ebf4ac11c3f389d8"),
        (20, "7b756bc4f652c171"),
        (21, "336f1c65055fdfb1"),
        (22, "63b679eac89f7cf9"),
        (23, "c2eb9958b57378b9"),
    ];

    /// Version and the first 16 hex digits of the SHA-384 sqlx records for each rendering.
    const RELEASED_POSTGRES: &[(i64, &str)] = &[
        (1, "c5e07528a5b960a7"),
        (2, "0da243050a7d19fd"),
        (3, "6bdf3ec3d5f0bf88"),
        (4, "582c88225edb3da8"),
        (5, "e24fb5b6d03b5c0d"),
        (6, "5795877f10802b0a"),
        (7, "9dcab6ea2afa6b10"),
        (8, "eb3a287b9aa796d7"),
        (9, "b89391c15ccc14e6"),
        (10, "a92c797e4b065868"),
        (11, "d8ad5a1e3cf2a7f9"),
        (12, "c6fa200fea0bc531"),
        (13, "7c3f92e7a37abea2"),
        (14, "296e257c7d992187"),
        (15, "045741c6dd222638"),
        (16, "bcaa3ee83b35b25b"),
        (17, "9566634698adc2d0"),
        (18, "cfdeefdb5cb756f8"),
        (19, "e20adfb18b50862f"),
        (20, "1b7f9377135471a4"),
        (21, "8fdf5eb76ccd790d"),
        (22, "78dd86d81e9c2bbb"),
        (23, "331dc7ad6fa6b17d"),
    ];
}
