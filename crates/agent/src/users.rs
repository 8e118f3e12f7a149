//! The sandbox's user database, read straight from `<root>/etc/passwd` and `<root>/etc/group`
//! (a static binary has no NSS, and in host mode the files live under `--root`).

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("user '{0}' does not exist")]
    Unknown(String),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One account, with the supplementary groups it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Home directory as the sandbox sees it (not prefixed with the host-mode root).
    pub home: String,
    pub groups: Vec<u32>,
}

/// Looks up `name` in `<root>/etc/passwd`, with groups from `<root>/etc/group`.
pub fn lookup_user(root: &Path, name: &str) -> Result<User, UserError> {
    let passwd = read(root, "etc/passwd")?;
    let mut user = parse_passwd(&passwd)
        .into_iter()
        .find(|u| u.name == name)
        .ok_or_else(|| UserError::Unknown(name.to_string()))?;
    // A missing group file only loses supplementary groups.
    if let Ok(group) = read(root, "etc/group") {
        user.groups = supplementary_groups(&group, &user.name, user.gid);
    }
    Ok(user)
}

/// Name of the user with `uid`, or the number as text (like `ls -l`).
pub fn user_name(root: &Path, uid: u32) -> String {
    read(root, "etc/passwd")
        .ok()
        .and_then(|text| {
            parse_passwd(&text)
                .into_iter()
                .find(|u| u.uid == uid)
                .map(|u| u.name)
        })
        .unwrap_or_else(|| uid.to_string())
}

/// Name of the group with `gid`, or the number as text.
pub fn group_name(root: &Path, gid: u32) -> String {
    read(root, "etc/group")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let fields: Vec<&str> = line.split(':').collect();
                (fields.len() >= 3 && fields[2].parse() == Ok(gid)).then(|| fields[0].to_string())
            })
        })
        .unwrap_or_else(|| gid.to_string())
}

fn read(root: &Path, rel: &str) -> Result<String, UserError> {
    let path = root.join(rel);
    std::fs::read_to_string(&path).map_err(|source| UserError::Read { path, source })
}

fn parse_passwd(text: &str) -> Vec<User> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 7 {
                return None;
            }
            Some(User {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: f[5].to_string(),
                groups: Vec::new(),
            })
        })
        .collect()
}

fn supplementary_groups(text: &str, name: &str, primary: u32) -> Vec<u32> {
    let mut groups = vec![primary];
    for line in text.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 {
            continue;
        }
        let Ok(gid) = f[2].parse::<u32>() else {
            continue;
        };
        if f[3].split(',').any(|m| m.trim() == name) && !groups.contains(&gid) {
            groups.push(gid);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\n# comment\nbroken line\nuser:x:1000:1000::/home/user:/bin/bash\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("etc/group"),
            "root:x:0:\nsudo:x:27:user\nuser:x:1000:\nbad\n",
        )
        .unwrap();
        dir
    }

    #[test]
    fn users_and_groups_are_parsed() {
        let dir = root();
        let user = lookup_user(dir.path(), "user").unwrap();
        assert_eq!(
            (user.uid, user.gid, user.home.as_str()),
            (1000, 1000, "/home/user")
        );
        assert_eq!(user.groups, vec![1000, 27]);
        assert_eq!(lookup_user(dir.path(), "root").unwrap().uid, 0);
        assert!(matches!(
            lookup_user(dir.path(), "nobody"),
            Err(UserError::Unknown(_))
        ));
        assert_eq!(user_name(dir.path(), 1000), "user");
        assert_eq!(user_name(dir.path(), 4242), "4242");
        assert_eq!(group_name(dir.path(), 27), "sudo");
    }
}
