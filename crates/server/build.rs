//! Embeds the dashboard's bundle (`dashboard/dist`, made by `scripts/setup` through npm and esbuild)
//! into the server binary. Without a bundle the server still builds, and `/dashboard` answers 503
//! saying how to build it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=WARREN_DASHBOARD_DIST");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let dashboard = manifest.join("../../dashboard");
    let dist = std::env::var_os("WARREN_DASHBOARD_DIST")
        .map(PathBuf::from)
        .unwrap_or_else(|| dashboard.join("dist"));
    let mut files = Vec::new();
    if dist.is_dir() {
        collect(&dist, &dist, &mut files);
        println!("cargo:rerun-if-changed={}", dist.display());
    } else if dashboard.is_dir() {
        // The bundle's directory appearing changes this one's modification time.
        println!("cargo:rerun-if-changed={}", dashboard.display());
    }
    files.sort();
    let mut out = String::from(
        "/// The dashboard bundle: (path relative to the bundle, bytes).\npub static FILES: &[(&str, &[u8])] = &[\n",
    );
    for (name, path) in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        let _ = writeln!(
            out,
            "    ({name:?}, include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    out.push_str("];\n");
    let target =
        PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("dashboard_assets.rs");
    std::fs::write(target, out).expect("write dashboard_assets.rs");
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if let Ok(relative) = path.strip_prefix(root) {
            let name = relative.to_string_lossy().replace('\\', "/");
            let absolute = path.canonicalize().unwrap_or(path);
            files.push((name, absolute));
        }
    }
}
