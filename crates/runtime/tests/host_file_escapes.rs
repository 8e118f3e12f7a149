//! Attacks on host files through paths a sandbox controls, each performed for real from inside a
//! sandbox as its root: symlinks and hard links planted where the host writes (fork's hostname and
//! hosts, the agent's mount point), a moved agent directory, symlinked mount points in a template
//! layer, and a directory swapped for a symlink in a loop while the host commits the layer. After each
//! the host files keep their content and nothing new appears outside the sandbox.

#![allow(clippy::unwrap_used)] // A panic in a test is its failure report.

mod common;

use std::path::{Path, PathBuf};

use warren_runtime::{LinuxRuntime, Runtime};

/// A host directory the sandboxes aim at: `victim` with known content; nothing else may appear.
struct HostTarget(PathBuf);

const VICTIM_TEXT: &str = "host data, must not change\n";

impl HostTarget {
    fn new(name: &str) -> HostTarget {
        let dir = PathBuf::from(format!("/tmp/wt-escape-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("victim"), VICTIM_TEXT).unwrap();
        HostTarget(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }

    fn untouched(&self) {
        assert_eq!(
            std::fs::read_to_string(self.0.join("victim")).unwrap(),
            VICTIM_TEXT,
            "the host file was overwritten"
        );
        let names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["victim"], "a file appeared on the host");
    }
}

impl Drop for HostTarget {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Cleanup<'a>(&'a LinuxRuntime, Vec<&'static str>);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for id in &self.1 {
            let _ = self.0.destroy(id);
        }
    }
}

fn must(sandbox: &warren_runtime::Sandbox, command: &str) -> String {
    let (out, code) = common::exec(sandbox, command);
    assert_eq!(code, 0, "{command}: {out}");
    out
}

#[test]
fn fork_does_not_write_through_planted_symlinks_or_hard_links() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("escape-fork");
    if !runtime.capabilities().checkpoint {
        println!("SKIP: CRIU does not work on this host (run scripts/setup)");
        return;
    }
    let _cleanup = Cleanup(&runtime, vec!["wt-esc-a", "wt-esc-a-fork"]);
    let host = HostTarget::new("fork");
    let spec = common::spec("wt-esc-a", vec![base.clone()], common::resources());
    let a = runtime.create(&spec).expect("create");
    // The reported attack: /etc/hostname at an existing host file, /etc/hosts at a new one; and
    // resolv.conf hard-linked to a file of the sandbox's own, which a write-through would change.
    must(
        &a,
        &format!(
            "ln -sf {victim} /etc/hostname && ln -sf {new} /etc/hosts \
             && echo mine > /root/keep && ln -f /root/keep /etc/resolv.conf",
            victim = host.path("victim"),
            new = host.path("created"),
        ),
    );
    let point = runtime.config().state_dir.join("snapshots/fork");
    runtime
        .checkpoint("wt-esc-a", &point, true)
        .expect("checkpoint");
    let fork_spec = common::spec("wt-esc-a-fork", vec![base], common::resources());
    let fork = runtime.restore(&point, &fork_spec).expect("fork");
    host.untouched();
    assert_eq!(must(&fork, "cat /etc/hostname"), "wt-esc-a-fork\n");
    assert!(must(&fork, "cat /etc/hosts").contains("wt-esc-a-fork"));
    assert_eq!(
        must(&fork, "cat /root/keep"),
        "mine\n",
        "written through a hard link"
    );
    assert!(must(&fork, "test ! -L /etc/hostname && echo plain").contains("plain"));
    // The original keeps its links (its own business).
    assert!(must(&a, "readlink /etc/hostname").contains("victim"));
}

#[test]
fn the_agent_directory_cannot_be_moved_aside() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let runtime = common::runtime("escape-mv");
    let _cleanup = Cleanup(&runtime, vec!["wt-esc-mv"]);
    let sandbox = runtime
        .create(&common::spec("wt-esc-mv", vec![base], common::resources()))
        .expect("create");
    let (out, code) = common::exec(&sandbox, "mv /.warren /moved 2>&1");
    assert_ne!(code, 0, "root inside moved the agent's directory: {out}");
    assert!(out.contains("busy"), "{out}");
    let (out, code) = common::exec(&sandbox, "rm -f /.warren/agent 2>&1");
    assert_ne!(
        code, 0,
        "root inside removed the agent's mount point: {out}"
    );
    must(&sandbox, "test -x /.warren/agent");
}

#[test]
fn symlinked_mount_points_in_a_layer_stay_inside_the_sandbox() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let host = HostTarget::new("layer");
    // A template layer as a build sandbox could have left it: /proc, /dev and /.warren as symlinks
    // to the host directory, /sys as a file.
    let layer_dir = LayerDir::new("symlinked-mounts");
    let layer = layer_dir.0.clone();
    for name in ["proc", "dev", ".warren"] {
        std::os::unix::fs::symlink(&host.0, layer.join(name)).unwrap();
    }
    std::fs::write(layer.join("sys"), b"not a directory").unwrap();
    let runtime = common::runtime("escape-layer");
    let _cleanup = Cleanup(&runtime, vec!["wt-esc-layer"]);
    let sandbox = runtime
        .create(&common::spec(
            "wt-esc-layer",
            vec![layer.clone(), base],
            common::resources(),
        ))
        .expect("create over a layer with symlinked mount points");
    host.untouched();
    must(
        &sandbox,
        "test -r /proc/self/status && test -d /sys/kernel && test -c /dev/null \
         && test -x /.warren/agent && test ! -L /proc",
    );
    runtime.destroy("wt-esc-layer").unwrap();
    host.untouched();
}

#[test]
fn committing_a_layer_while_a_directory_flips_to_a_symlink_copies_no_host_file() {
    let Some(base) = common::base_rootfs() else {
        return;
    };
    let host = HostTarget::new("commit");
    let runtime = common::runtime("escape-commit");
    let _cleanup = Cleanup(&runtime, vec!["wt-esc-commit"]);
    let sandbox = runtime
        .create(&common::spec(
            "wt-esc-commit",
            vec![base],
            common::resources(),
        ))
        .expect("create");
    // /data flips between a directory holding `victim` (sandbox content) and a symlink to the host
    // directory, as fast as the shell can, while the host commits the layer again and again.
    must(
        &sandbox,
        &format!(
            "setsid sh -c 'while :; do rm -rf /data; ln -s {dir} /data; rm /data; mkdir /data; \
             echo sandbox > /data/victim; done' >/dev/null 2>&1 </dev/null &",
            dir = host.0.display()
        ),
    );
    let layers = runtime.config().state_dir.join("layers");
    for round in 0..20 {
        let dest = layers.join(format!("commit-{round}"));
        runtime
            .commit_layer("wt-esc-commit", &dest)
            .expect("commit");
        for entry in walk(&dest) {
            if entry.file_name().is_some_and(|n| n == "victim") && entry.is_file() {
                // The shell may be between creating the file and writing it, so a copy may hold
                // a prefix of the sandbox's text, but never anything else.
                let text = std::fs::read_to_string(&entry).unwrap();
                assert!(
                    "sandbox\n".starts_with(&text),
                    "round {round}: {} holds {text:?}, not the sandbox's text",
                    entry.display()
                );
            }
        }
    }
    host.untouched();
}

/// An empty directory to use as a template layer, under /tmp, removed when dropped.
struct LayerDir(PathBuf);

impl LayerDir {
    fn new(name: &str) -> LayerDir {
        let dir = PathBuf::from(format!(
            "/tmp/wt-escape-layer-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        LayerDir(dir)
    }
}

impl Drop for LayerDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every path below `dir`, not following symlinks.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(next) = todo.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                todo.push(path.clone());
            }
            out.push(path);
        }
    }
    out
}
