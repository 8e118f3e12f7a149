//! `FROM <image>` → the local base root filesystem Warren builds on, plus what must be added to it so the
//! image behaves like the one named (pip for `python:*`, node for `node:*`).
//!
//! The well-known Debian-like names (`debian`, `ubuntu`, `python`, `node`, `e2bdev/*` on Docker Hub)
//! map onto the Debian 12 base rootfs that `scripts/setup.d/40-rootfs.sh` builds once, so the common
//! templates build offline. Every other image — another distribution, a name on an explicit
//! registry, or any image given with credentials — is pulled from its registry
//! ([`choose`] says which; `crate::templates::images` pulls).

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BaseImageError {
    #[error(
        "base image {image:?} is not supported; Warren builds on a Debian 12 root filesystem and accepts: {supported}"
    )]
    Unsupported { image: String, supported: String },
    #[error("base image reference is empty")]
    Empty,
}

/// The image E2B's SDK uses when a template names no base (`Template().from_base_image()`).
pub const E2B_DEFAULT_BASE_IMAGE: &str = "e2bdev/base";

/// Directory name of the Debian 12 base rootfs under `<cache>/rootfs/`.
pub const DEBIAN12_ROOTFS: &str = "debian12-base";

/// Where the base rootfs lives: `$WARREN_CACHE/rootfs/debian12-base` (WARREN_CACHE defaults to
/// `/var/cache/warren`).
pub fn default_rootfs_dir() -> PathBuf {
    let cache = std::env::var_os("WARREN_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/warren"));
    cache.join("rootfs").join(DEBIAN12_ROOTFS)
}

/// Kinds of images Warren knows how to stand in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFamily {
    Debian,
    Ubuntu,
    Python,
    Node,
    E2bBase,
    E2bCodeInterpreter,
}

impl ImageFamily {
    /// Debian packages an image of this family carries that the minimal base rootfs may lack.
    pub fn extra_packages(self) -> &'static [&'static str] {
        match self {
            ImageFamily::Debian | ImageFamily::Ubuntu => &[],
            ImageFamily::Python | ImageFamily::E2bBase | ImageFamily::E2bCodeInterpreter => {
                &["python3-pip", "python3-venv", "python-is-python3"]
            }
            ImageFamily::Node => &["nodejs", "npm"],
        }
    }

    /// Python images let `pip install` write to the system site-packages; Debian blocks that (PEP 668)
    /// unless its EXTERNALLY-MANAGED marker is removed.
    fn allows_system_pip(self) -> bool {
        matches!(
            self,
            ImageFamily::Python | ImageFamily::E2bBase | ImageFamily::E2bCodeInterpreter
        )
    }
}

/// A resolved base: the rootfs directory and the setup that makes it look like the named image.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseImage {
    /// The image as the template named it.
    pub image: String,
    pub family: ImageFamily,
    pub rootfs: PathBuf,
    /// Shown in the build log when the tag names a release other than what Warren provides.
    pub note: Option<String>,
}

impl BaseImage {
    /// Shell script for the base step (run as root in `/`), or None when the rootfs is used unchanged.
    /// Packages already in the rootfs are skipped, so the script needs no network when the base has them.
    pub fn setup_script(&self) -> Option<String> {
        let packages = self.family.extra_packages();
        if packages.is_empty() && !self.family.allows_system_pip() {
            return None;
        }
        let mut script = String::from("set -e\n");
        if !packages.is_empty() {
            script.push_str(&format!(
                "missing=''\nfor p in {}; do\n  dpkg-query -W -f='${{Status}}' \"$p\" 2>/dev/null | grep -q 'ok installed' || missing=\"$missing $p\"\ndone\n\
                 if [ -n \"$missing\" ]; then\n  echo \"installing$missing\"\n  apt-get update -qq\n  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing\n  rm -rf /var/lib/apt/lists/*\nfi\n",
                packages.join(" ")
            ));
        }
        if self.family.allows_system_pip() {
            script.push_str("rm -f /usr/lib/python3*/EXTERNALLY-MANAGED\n");
        }
        Some(script)
    }
}

/// Names accepted in FROM, for error messages and docs.
pub const SUPPORTED: &[&str] = &[
    "debian:*",
    "ubuntu:*",
    "python:*",
    "node:*",
    "e2bdev/base",
    "e2bdev/code-interpreter",
];

/// Where a `FROM` image comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum BaseChoice {
    /// One of the names the local Debian 12 rootfs stands in for.
    Local(BaseImage),
    /// Pulled from its registry.
    Registry(String),
}

/// Local rootfs for the well-known Docker Hub names, the registry for everything else. `credentials`:
/// the template gave a registry login, so it means a real (private) image: always pulled.
pub fn choose(image: &str, rootfs: &Path, credentials: bool) -> Result<BaseChoice, BaseImageError> {
    let trimmed = image.trim();
    if trimmed.is_empty() {
        return Err(BaseImageError::Empty);
    }
    if credentials {
        return Ok(BaseChoice::Registry(trimmed.to_string()));
    }
    match resolve(trimmed, rootfs) {
        Ok(base) => Ok(BaseChoice::Local(base)),
        Err(BaseImageError::Unsupported { .. }) => Ok(BaseChoice::Registry(trimmed.to_string())),
        Err(e) => Err(e),
    }
}

/// Maps an image reference onto the base rootfs at `rootfs` (only the well-known names; see [`choose`]).
pub fn resolve(image: &str, rootfs: &Path) -> Result<BaseImage, BaseImageError> {
    let image = image.trim();
    if image.is_empty() {
        return Err(BaseImageError::Empty);
    }
    let (name, tag) = split_reference(image);
    let family = match name.as_str() {
        "debian" => ImageFamily::Debian,
        "ubuntu" => ImageFamily::Ubuntu,
        "python" => ImageFamily::Python,
        "node" => ImageFamily::Node,
        "e2bdev/base" => ImageFamily::E2bBase,
        "e2bdev/code-interpreter" => ImageFamily::E2bCodeInterpreter,
        _ => {
            return Err(BaseImageError::Unsupported {
                image: image.to_string(),
                supported: SUPPORTED.join(", "),
            })
        }
    };
    let note = release_note(family, tag.as_deref());
    Ok(BaseImage {
        image: image.to_string(),
        family,
        rootfs: rootfs.to_path_buf(),
        note,
    })
}

/// `docker.io/library/python:3.11-slim@sha256:..` → (`python`, Some(`3.11-slim`)).
fn split_reference(image: &str) -> (String, Option<String>) {
    let without_digest = image.split('@').next().unwrap_or(image);
    // A tag is a `:` after the last `/` (a `:` before it belongs to a registry host:port).
    let last_slash = without_digest.rfind('/').map(|i| i + 1).unwrap_or(0);
    let (name, tag) = match without_digest[last_slash..].find(':') {
        Some(pos) => (
            &without_digest[..last_slash + pos],
            Some(without_digest[last_slash + pos + 1..].to_string()),
        ),
        None => (without_digest, None),
    };
    let mut name = name.to_ascii_lowercase();
    for prefix in [
        "docker.io/",
        "index.docker.io/",
        "registry-1.docker.io/",
        "library/",
    ] {
        if let Some(rest) = name.strip_prefix(prefix) {
            name = rest.to_string();
        }
    }
    (name, tag)
}

fn release_note(family: ImageFamily, tag: Option<&str>) -> Option<String> {
    let tag = tag.unwrap_or("latest");
    match family {
        ImageFamily::Debian if !(tag.contains("bookworm") || tag.starts_with("12")) => Some(format!(
            "debian:{tag} is built on Warren's Debian 12 (bookworm) base"
        )),
        ImageFamily::Ubuntu => Some(format!(
            "ubuntu:{tag} is built on Warren's Debian 12 base (apt works, Ubuntu-only packages do not)"
        )),
        ImageFamily::Python if !tag.starts_with("3.11") && tag != "3" && tag != "latest" => {
            Some(format!(
                "python:{tag} is built on Debian 12's Python 3.11"
            ))
        }
        ImageFamily::Node => Some(format!("node:{tag} is built on Debian 12's Node.js 18")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rootfs() -> PathBuf {
        PathBuf::from("/var/cache/warren/rootfs/debian12-base")
    }

    #[test]
    fn known_images_map_to_the_debian_base() {
        for (image, family) in [
            ("debian:bookworm-slim", ImageFamily::Debian),
            ("debian", ImageFamily::Debian),
            ("ubuntu:22.04", ImageFamily::Ubuntu),
            ("python:3.11-slim", ImageFamily::Python),
            ("docker.io/library/python:3.12", ImageFamily::Python),
            ("node:20", ImageFamily::Node),
            (
                "e2bdev/code-interpreter:latest",
                ImageFamily::E2bCodeInterpreter,
            ),
            ("e2bdev/base", ImageFamily::E2bBase),
            (E2B_DEFAULT_BASE_IMAGE, ImageFamily::E2bBase),
            ("E2BDEV/BASE:latest@sha256:abc", ImageFamily::E2bBase),
        ] {
            let base = resolve(image, &rootfs()).unwrap();
            assert_eq!(base.family, family, "{image}");
            assert_eq!(base.rootfs, rootfs());
        }
    }

    #[test]
    fn unknown_image_lists_what_is_supported() {
        let err = resolve("alpine:3.19", &rootfs()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("alpine:3.19"), "{text}");
        assert!(text.contains("python:*"), "{text}");
        assert!(text.contains("e2bdev/code-interpreter"), "{text}");
        assert!(resolve("registry.example:5000/debian:12", &rootfs()).is_err());
        assert_eq!(resolve("  ", &rootfs()), Err(BaseImageError::Empty));
    }

    #[test]
    fn other_images_and_explicit_registries_are_pulled() {
        for image in [
            "alpine:3.19",
            "fedora",
            "registry.example:5000/debian:12",
            "127.0.0.1:5000/busybox:1",
        ] {
            assert_eq!(
                choose(image, &rootfs(), false).unwrap(),
                BaseChoice::Registry(image.to_string()),
                "{image}"
            );
        }
        assert!(matches!(
            choose("python:3.11", &rootfs(), false).unwrap(),
            BaseChoice::Local(_)
        ));
        // A login means a private image, even under a well-known name.
        assert_eq!(
            choose("python:3.11", &rootfs(), true).unwrap(),
            BaseChoice::Registry("python:3.11".into())
        );
        assert_eq!(choose(" ", &rootfs(), false), Err(BaseImageError::Empty));
    }

    #[test]
    fn python_images_get_pip_and_system_installs() {
        let script = resolve("python:3.11", &rootfs())
            .unwrap()
            .setup_script()
            .unwrap();
        assert!(script.contains("python3-pip"));
        assert!(script.contains("EXTERNALLY-MANAGED"));
        assert_eq!(
            resolve("debian:12", &rootfs()).unwrap().setup_script(),
            None
        );
    }

    #[test]
    fn notes_say_when_a_release_is_substituted() {
        assert_eq!(resolve("debian:bookworm", &rootfs()).unwrap().note, None);
        assert!(resolve("debian:trixie", &rootfs()).unwrap().note.is_some());
        assert!(resolve("python:3.12", &rootfs()).unwrap().note.is_some());
        assert_eq!(resolve("python:3.11-slim", &rootfs()).unwrap().note, None);
    }
}
